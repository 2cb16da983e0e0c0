//! `xlb block`, `xlb allow`, `xlb unblock` and `xlb blocks`: their
//! arguments, checked before anything is sent, and the table of `xlb
//! blocks`.

use std::time::Duration;

use clap::Subcommand;

use super::{Cell, Style, table};
use crate::config;
use crate::ctl::{
    BlockEntry, EntryOrigin, GuardAction, ListKind, Request, check_reason, check_ttl,
};
use crate::guard::Prefix;

#[derive(Debug, PartialEq, Subcommand)]
pub enum GuardCommand {
    /// Refuse new flows from a source prefix (add it to a deny list).
    ///
    /// Applies at once in XDP: new flows from the prefix are dropped, or
    /// answered with a TCP RST (--action reset); its established flows are
    /// cut. Survives restarts; `xlb unblock` removes it.
    Block {
        /// An address (192.0.2.7, 2001:db8::1) or a prefix (192.0.2.0/24,
        /// 2001:db8:1:2::/64).
        #[arg(value_parser = parse_prefix)]
        prefix: Prefix,
        /// Only this VIP (default: every VIP).
        #[arg(long, value_name = "NAME", value_parser = parse_vip)]
        vip: Option<String>,
        /// Remove the entry after this long (e.g. 10m, 1h); default: never.
        #[arg(long, value_name = "DURATION", value_parser = parse_ttl)]
        ttl: Option<Duration>,
        /// Why, shown by `xlb blocks` and in the event.
        #[arg(long, value_name = "TEXT", value_parser = parse_reason)]
        reason: Option<String>,
        /// drop (the client retries into silence) or reset (a TCP SYN gets a
        /// RST: the client fails at once).
        #[arg(long, value_name = "drop|reset", value_parser = parse_action, default_value = "drop")]
        action: GuardAction,
        /// Needed for a /0 (0.0.0.0/0, ::/0): every address of a family.
        #[arg(long)]
        force: bool,
        /// Which daemon.
        #[command(flatten)]
        target: super::target::ClientTarget,
    },
    /// Never refuse a source prefix by a deny entry (add it to an allow list).
    ///
    /// For your own monitoring: an allow entry wins over any deny entry.
    /// Rate limits still apply.
    Allow {
        /// An address or a prefix, as for `xlb block`.
        #[arg(value_parser = parse_prefix)]
        prefix: Prefix,
        /// Only this VIP (default: every VIP).
        #[arg(long, value_name = "NAME", value_parser = parse_vip)]
        vip: Option<String>,
        /// Remove the entry after this long (e.g. 10m, 1h); default: never.
        #[arg(long, value_name = "DURATION", value_parser = parse_ttl)]
        ttl: Option<Duration>,
        /// Why, shown by `xlb blocks` and in the event.
        #[arg(long, value_name = "TEXT", value_parser = parse_reason)]
        reason: Option<String>,
        /// Needed for a /0 (0.0.0.0/0, ::/0): every address of a family.
        #[arg(long)]
        force: bool,
        /// Which daemon.
        #[command(flatten)]
        target: super::target::ClientTarget,
    },
    /// Remove an entry added by `xlb block` (or `xlb allow`, with --allow).
    ///
    /// Entries of the configuration file are changed by editing it and
    /// reloading.
    Unblock {
        /// The prefix as it was blocked.
        #[arg(value_parser = parse_prefix)]
        prefix: Prefix,
        /// The VIP it was blocked at (default: the entry of every VIP).
        #[arg(long, value_name = "NAME", value_parser = parse_vip)]
        vip: Option<String>,
        /// Remove an allow entry instead of a deny entry.
        #[arg(long)]
        allow: bool,
        /// Which daemon.
        #[command(flatten)]
        target: super::target::ClientTarget,
    },
    /// List the deny and allow entries, with their hits.
    Blocks {
        /// Print the entries as JSON.
        #[arg(long)]
        json: bool,
        /// Which daemon.
        #[command(flatten)]
        target: super::target::ClientTarget,
    },
}

impl GuardCommand {
    pub fn request(&self) -> Request {
        let ms = |d: &Option<Duration>| d.map(|d| d.as_millis() as u64);
        match self {
            GuardCommand::Block {
                prefix,
                vip,
                ttl,
                reason,
                action,
                force,
                ..
            } => Request::Block {
                list: ListKind::Deny,
                prefix: prefix.to_string(),
                vip: vip.clone(),
                ttl_ms: ms(ttl),
                reason: reason.clone(),
                action: *action,
                force: *force,
            },
            GuardCommand::Allow {
                prefix,
                vip,
                ttl,
                reason,
                force,
                ..
            } => Request::Block {
                list: ListKind::Allow,
                prefix: prefix.to_string(),
                vip: vip.clone(),
                ttl_ms: ms(ttl),
                reason: reason.clone(),
                action: GuardAction::Drop,
                force: *force,
            },
            GuardCommand::Unblock {
                prefix, vip, allow, ..
            } => Request::Unblock {
                list: if *allow {
                    ListKind::Allow
                } else {
                    ListKind::Deny
                },
                prefix: prefix.to_string(),
                vip: vip.clone(),
            },
            GuardCommand::Blocks { .. } => Request::Blocks,
        }
    }
}

pub fn parse_prefix(s: &str) -> Result<Prefix, String> {
    s.parse()
        .map_err(|e: crate::guard::PrefixError| e.to_string())
}

/// A VIP name as the configuration allows it.
pub fn parse_vip(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is not a VIP name (1 to 64 characters from A-Z a-z 0-9 _ . -); \
             `xlb status` lists the VIPs"
        ))
    }
}

/// A TTL: a duration as in the configuration, 1s to 30 days (the daemon
/// checks the same bounds, `ctl::check_ttl`).
pub fn parse_ttl(s: &str) -> Result<Duration, String> {
    let d = config::parse_duration(s)?;
    check_ttl(d, s)?;
    Ok(d)
}

/// A reason: on one line, at most 200 characters (checked by the daemon
/// too, `ctl::check_reason`).
pub fn parse_reason(s: &str) -> Result<String, String> {
    check_reason(s)?;
    Ok(s.to_owned())
}

pub fn parse_action(s: &str) -> Result<GuardAction, String> {
    match s.to_ascii_lowercase().as_str() {
        "drop" => Ok(GuardAction::Drop),
        "reset" => Ok(GuardAction::Reset),
        _ => Err(format!(
            "{s:?} is not an action; use drop (silently) or reset (a TCP RST to each SYN)"
        )),
    }
}

/// `5s`, `59m`, `1h30m`.
fn remaining(ms: u64) -> String {
    crate::guard::short_duration(Duration::from_secs(ms.div_ceil(1000)))
}

/// `xlb blocks`: one table, deny entries first; `now_unix_ms` dates the
/// EXPIRES column.
pub fn render_blocks(entries: &[BlockEntry], now_unix_ms: u64, color: bool) -> String {
    if entries.is_empty() {
        return "no deny or allow entries\n".to_owned();
    }
    let mut rows = vec![
        [
            "LIST", "PREFIX", "VIP", "ACTION", "ORIGIN", "HITS", "EXPIRES", "REASON",
        ]
        .map(Cell::plain)
        .into(),
    ];
    for e in entries {
        let (list, style) = match e.list {
            ListKind::Deny => ("deny", Style::Red),
            ListKind::Allow => ("allow", Style::Green),
        };
        let action = match e.list {
            ListKind::Deny => e.action.as_str(),
            ListKind::Allow => "-",
        };
        let origin = match e.origin {
            EntryOrigin::Config => "config",
            EntryOrigin::Runtime => "runtime",
            EntryOrigin::Auto => "auto",
        };
        let expires = match e.expires_unix_ms {
            None => "never".to_owned(),
            Some(t) => format!("in {}", remaining(t.saturating_sub(now_unix_ms))),
        };
        rows.push(vec![
            Cell::styled(list, style),
            Cell::plain(e.prefix.clone()),
            Cell::plain(e.vip.clone().unwrap_or_else(|| "all".to_owned())),
            Cell::plain(action),
            Cell::plain(origin),
            Cell::plain(e.hits.to_string()),
            Cell::plain(expires),
            Cell::plain(e.reason.clone()),
        ]);
    }
    let mut out = String::new();
    table(&mut out, "", &rows, color);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser as _;

    fn parse(args: &[&str]) -> Result<Command, String> {
        Cli::try_parse_from(std::iter::once("xlb").chain(args.iter().copied()))
            .map(|c| c.command)
            .map_err(|e| e.to_string())
    }

    fn request(args: &[&str]) -> Request {
        parse(args)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
            .request()
            .expect("a control request")
    }

    #[test]
    fn commands_make_requests() {
        let cases = [
            (
                "block with everything",
                vec![
                    "block",
                    "2001:db8:1:2::/64",
                    "--vip",
                    "api",
                    "--ttl",
                    "1h",
                    "--reason",
                    "seed 001",
                    "--action",
                    "reset",
                ],
                Request::Block {
                    list: ListKind::Deny,
                    prefix: "2001:db8:1:2::/64".into(),
                    vip: Some("api".into()),
                    ttl_ms: Some(3_600_000),
                    reason: Some("seed 001".into()),
                    action: GuardAction::Reset,
                    force: false,
                },
            ),
            (
                "block a bare address",
                vec!["block", "192.0.2.7"],
                Request::Block {
                    list: ListKind::Deny,
                    prefix: "192.0.2.7/32".into(),
                    vip: None,
                    ttl_ms: None,
                    reason: None,
                    action: GuardAction::Drop,
                    force: false,
                },
            ),
            (
                "allow",
                vec!["allow", "10.0.0.0/8", "--reason", "monitoring"],
                Request::Block {
                    list: ListKind::Allow,
                    prefix: "10.0.0.0/8".into(),
                    vip: None,
                    ttl_ms: None,
                    reason: Some("monitoring".into()),
                    action: GuardAction::Drop,
                    force: false,
                },
            ),
            (
                "unblock",
                vec!["unblock", "192.0.2.7", "--vip", "api"],
                Request::Unblock {
                    list: ListKind::Deny,
                    prefix: "192.0.2.7/32".into(),
                    vip: Some("api".into()),
                },
            ),
            (
                "unblock --allow",
                vec!["unblock", "10.0.0.0/8", "--allow"],
                Request::Unblock {
                    list: ListKind::Allow,
                    prefix: "10.0.0.0/8".into(),
                    vip: None,
                },
            ),
            ("blocks", vec!["blocks", "--json"], Request::Blocks),
        ];
        for (name, args, want) in cases {
            assert_eq!(request(&args), want, "{name}");
        }
    }

    #[test]
    fn bad_arguments_are_refused_before_sending() {
        let cases = [
            (
                "host bits",
                vec!["block", "192.0.2.7/24"],
                r#"has host bits set; write "192.0.2.0/24" for the network, or "192.0.2.7/32" for the one address"#,
            ),
            (
                "not an address",
                vec!["block", "example.com"],
                "is not an IP address or prefix",
            ),
            (
                "zero TTL",
                vec!["block", "192.0.2.7", "--ttl", "0s"],
                "a TTL of 0s is out of range; use 1s to 30d",
            ),
            (
                "TTL under a second",
                vec!["block", "192.0.2.7", "--ttl", "500ms"],
                "a TTL of 500ms is out of range; use 1s to 30d",
            ),
            (
                "TTL without unit",
                vec!["allow", "192.0.2.7", "--ttl", "10"],
                "is not a duration",
            ),
            (
                "unknown action",
                vec!["block", "192.0.2.7", "--action", "reject"],
                "\"reject\" is not an action; use drop (silently) or reset",
            ),
            (
                "bad VIP name",
                vec!["unblock", "192.0.2.7", "--vip", "my api"],
                "\"my api\" is not a VIP name",
            ),
            (
                "allow has no action",
                vec!["allow", "192.0.2.7", "--action", "reset"],
                "unexpected argument '--action'",
            ),
        ];
        for (name, args, want) in cases {
            let e = parse(&args).expect_err(name);
            assert!(e.contains(want), "{name}: {e}");
        }
        let long = "x".repeat(201);
        let e = parse(&["block", "192.0.2.7", "--reason", &long]).unwrap_err();
        assert!(
            e.contains("the reason is 201 characters long; use at most 200"),
            "{e}"
        );
    }

    /// A /0 is every address of a family: refused without --force, by the
    /// check the CLI runs before sending (the daemon's own).
    #[test]
    fn a_whole_family_needs_force() {
        let cases = [
            (
                "block 0.0.0.0/0",
                vec!["block", "0.0.0.0/0"],
                Err(
                    "0.0.0.0/0 is every IPv4 address: this refuses every IPv4 client of every \
                     VIP; add --force (\"force\": true) if that is what you mean",
                ),
            ),
            (
                "block ::/0 on a VIP",
                vec!["block", "::/0", "--vip", "api"],
                Err(
                    "::/0 is every IPv6 address: this refuses every IPv6 client of VIP \"api\"; \
                     add --force (\"force\": true) if that is what you mean",
                ),
            ),
            (
                "allow 0.0.0.0/0",
                vec!["allow", "0.0.0.0/0"],
                Err(
                    "0.0.0.0/0 is every IPv4 address: this exempts every IPv4 client of every \
                     VIP from every deny entry; add --force (\"force\": true) if that is what \
                     you mean",
                ),
            ),
            (
                "block ::/0 --force",
                vec!["block", "::/0", "--force"],
                Ok(()),
            ),
            ("block 0.0.0.0/1", vec!["block", "0.0.0.0/1"], Ok(())),
        ];
        for (name, args, want) in cases {
            let req = request(&args);
            assert_eq!(
                crate::ctl::check_request(&req),
                want.map_err(str::to_owned),
                "{name}"
            );
        }
    }

    #[test]
    fn a_ttl_in_days() {
        let ttl_ms = |args: &[&str]| match request(args) {
            Request::Block { ttl_ms, .. } => ttl_ms,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            ttl_ms(&["block", "192.0.2.7", "--ttl", "7d"]),
            Some(604_800_000)
        );
        assert_eq!(
            ttl_ms(&["allow", "192.0.2.7", "--ttl", "30d"]),
            Some(2_592_000_000)
        );
        let e = parse(&["block", "192.0.2.7", "--ttl", "60d"]).unwrap_err();
        assert!(
            e.contains("a TTL of 60d is out of range; use 1s to 30d, or leave the TTL out"),
            "{e}"
        );
    }

    #[test]
    fn blocks_table() {
        let now = 1_800_000_000_000;
        let entry = |list, prefix: &str, vip: Option<&str>, origin, expires, hits| BlockEntry {
            list,
            prefix: prefix.into(),
            vip: vip.map(str::to_owned),
            action: GuardAction::Reset,
            origin,
            reason: if origin == EntryOrigin::Config {
                "seed 001".into()
            } else {
                String::new()
            },
            created_unix_ms: now - 1000,
            expires_unix_ms: expires,
            hits,
        };
        let entries = [
            entry(
                ListKind::Deny,
                "192.0.2.7/32",
                None,
                EntryOrigin::Config,
                None,
                1234,
            ),
            entry(
                ListKind::Deny,
                "2001:db8:1:2::/64",
                Some("api"),
                EntryOrigin::Auto,
                Some(now + 3_540_000),
                7,
            ),
            entry(
                ListKind::Allow,
                "10.0.0.0/8",
                None,
                EntryOrigin::Runtime,
                Some(now + 90_500),
                0,
            ),
        ];
        assert_eq!(
            render_blocks(&entries, now, false),
            "\
LIST   PREFIX             VIP  ACTION  ORIGIN   HITS  EXPIRES   REASON
deny   192.0.2.7/32       all  reset   config   1234  never     seed 001
deny   2001:db8:1:2::/64  api  reset   auto     7     in 59m
allow  10.0.0.0/8         all  -       runtime  0     in 1m31s
"
        );
        assert_eq!(render_blocks(&[], now, false), "no deny or allow entries\n");
    }
}
