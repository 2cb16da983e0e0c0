//! `xlb withdraw` and `xlb announce`: an operator takes VIPs out of (and
//! back into) the routers' ECMP sets, e.g. for maintenance of this node.

use std::time::Duration;

use clap::Subcommand;

use super::blocks::{parse_reason, parse_vip};
use crate::ctl::{Request, StatusReport, VipStatus};

/// `--withdraw-wait`: a duration up to 10 minutes.
pub fn parse_withdraw_wait(s: &str) -> Result<Duration, String> {
    let d = crate::config::parse_duration(s)?;
    if d > Duration::from_secs(600) {
        return Err(format!(
            "{s:?} is longer than 10m; routers move flows within seconds (BGP hold time at \
             most), use e.g. 3s"
        ));
    }
    Ok(d)
}

#[derive(Debug, PartialEq, Subcommand)]
pub enum AnnounceCommand {
    /// Stop announcing a VIP's address (or every VIP's) to the routers.
    ///
    /// The routers move new and established flows to the other nodes; this
    /// node keeps forwarding whatever still reaches it. Kept across
    /// restarts until `xlb announce`. An address stays announced while
    /// another VIP on it is announced.
    Withdraw {
        /// VIP name, as in the configuration.
        #[arg(value_parser = parse_vip, required_unless_present = "all", conflicts_with = "all")]
        vip: Option<String>,
        /// Every VIP.
        #[arg(long)]
        all: bool,
        /// Why, shown by `xlb status` and in the event.
        #[arg(long, value_name = "TEXT", value_parser = parse_reason)]
        reason: Option<String>,
        /// Print the daemon's answer as JSON.
        #[arg(long)]
        json: bool,
        /// Which daemon.
        #[command(flatten)]
        target: super::target::ClientTarget,
    },
    /// Undo `xlb withdraw`: announce again once enough backends are up.
    Announce {
        /// VIP name, as in the configuration.
        #[arg(value_parser = parse_vip, required_unless_present = "all", conflicts_with = "all")]
        vip: Option<String>,
        /// Every VIP.
        #[arg(long)]
        all: bool,
        /// Print the daemon's answer as JSON.
        #[arg(long)]
        json: bool,
        /// Which daemon.
        #[command(flatten)]
        target: super::target::ClientTarget,
    },
}

impl AnnounceCommand {
    pub fn request(&self) -> Request {
        match self {
            AnnounceCommand::Withdraw { vip, reason, .. } => Request::Withdraw {
                vip: vip.clone(),
                reason: reason.clone(),
            },
            AnnounceCommand::Announce { vip, .. } => Request::Announce { vip: vip.clone() },
        }
    }

    pub fn json(&self) -> bool {
        match self {
            AnnounceCommand::Withdraw { json, .. } | AnnounceCommand::Announce { json, .. } => {
                *json
            }
        }
    }
}

/// The daemon's announce line for `xlb status`: the table, the routes in
/// it, the speaker check and any write error; empty without `[announce]`.
pub fn status_lines(report: &StatusReport) -> String {
    let Some(a) = &report.announce else {
        return String::new();
    };
    let mut out = format!(
        "announce: table {} proto {}, {} route{}{}",
        a.table,
        a.protocol,
        a.routes.len(),
        if a.routes.len() == 1 { "" } else { "s" },
        if a.adopting {
            " (adopted, kept until the first probe round is done)"
        } else {
            ""
        }
    );
    if let Some(s) = &a.speaker {
        out.push_str(&format!("; {s}"));
    }
    out.push('\n');
    if let Some(e) = &a.error {
        out.push_str(&format!("announce error: {e}\n"));
    }
    out
}

/// A VIP's announce state under its line, e.g. `  announce: withdrawn
/// (too_few_up: 0 of 3 backends up, announce_min_up = 1)`; `None` when off.
pub fn vip_line(vip: &VipStatus) -> Option<String> {
    let a = vip.announce.as_ref().filter(|a| a.state != "off")?;
    Some(format!("  announce: {} ({})\n", a.state, a.reason))
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    fn request(args: &[&str]) -> Result<Request, String> {
        let cli = Cli::try_parse_from(std::iter::once("xlb").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        match cli.command {
            Command::Announce(c) => Ok(c.request()),
            other => Err(format!("not an announce command: {other:?}")),
        }
    }

    #[test]
    fn status_text() {
        let mut r = StatusReport::default();
        assert_eq!(status_lines(&r), "");
        r.announce = Some(crate::ctl::AnnounceStatus {
            table: 100,
            protocol: 252,
            routes: vec!["10.100.0.1".into()],
            adopting: true,
            speaker: Some("speaker: not running (/run/bird/bird.ctl: No such file)".into()),
            error: None,
        });
        assert_eq!(
            status_lines(&r),
            "announce: table 100 proto 252, 1 route (adopted, kept until the first probe round \
             is done); speaker: not running (/run/bird/bird.ctl: No such file)\n"
        );
        let mut v = VipStatus::default();
        assert_eq!(vip_line(&v), None);
        v.announce = Some(crate::ctl::VipAnnounce {
            state: "withdrawn".into(),
            reason: "operator: rack 4".into(),
            code: "operator".into(),
        });
        assert_eq!(
            vip_line(&v).unwrap(),
            "  announce: withdrawn (operator: rack 4)\n"
        );
    }

    #[test]
    fn commands() {
        assert_eq!(
            request(&["withdraw", "api", "--reason", "rack 4 maintenance"]),
            Ok(Request::Withdraw {
                vip: Some("api".into()),
                reason: Some("rack 4 maintenance".into())
            })
        );
        assert_eq!(
            request(&["withdraw", "--all"]),
            Ok(Request::Withdraw {
                vip: None,
                reason: None
            })
        );
        assert_eq!(
            request(&["announce", "--all", "--json"]),
            Ok(Request::Announce { vip: None })
        );
        assert_eq!(
            request(&["announce", "web"]),
            Ok(Request::Announce {
                vip: Some("web".into())
            })
        );
        assert_eq!(parse_withdraw_wait("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(
            parse_withdraw_wait("11m").unwrap_err(),
            "\"11m\" is longer than 10m; routers move flows within seconds (BGP hold time at \
             most), use e.g. 3s"
        );
        for bad in [
            &["withdraw"][..],
            &["withdraw", "api", "--all"],
            &["announce"],
            &["withdraw", "api", "--reason", "a\nb"],
            &["withdraw", "bad name"],
        ] {
            assert!(request(bad).is_err(), "{bad:?} accepted");
        }
    }
}
