//! What the daemon checks in a request before it acts on it or logs it.
//!
//! The CLI checks its arguments, but anyone who can connect to the socket can
//! write the JSON by hand (`socat`, a script, another client), so the daemon
//! does not rely on it: every bound the CLI enforces is enforced here too,
//! with the same limits, and whatever a client wrote is escaped before it
//! reaches a log line.

use std::borrow::Cow;
use std::time::Duration;

use super::{ListKind, Request};
use crate::config::MAX_TTL;

/// Shortest `ttl_ms` of a block: one second, as `auto_block.ttl`.
pub const MIN_TTL: Duration = Duration::from_secs(1);

/// Longest reason of a block, in characters, as for a reason in the
/// configuration.
pub const MAX_REASON: usize = 200;

/// Longest VIP name (`[[vip]] name`).
const MAX_VIP_NAME: usize = 64;

/// Longest address or prefix text: `[ffff:…:ffff]:65535` is 47 bytes; a
/// little room for spelling variants, no room for a payload.
const MAX_ADDRESS: usize = 64;

/// Checks a parsed request against the bounds the CLI enforces; the error
/// is the message sent back (it names the field and the bound).
///
/// # Errors
///
/// A TTL out of range, a reason too long, or a string field with
/// control characters or longer than any valid value.
pub fn check_request(req: &Request) -> Result<(), String> {
    match req {
        Request::Status
        | Request::Events { .. }
        | Request::Explain { .. }
        | Request::Reload
        | Request::Blocks => Ok(()),
        // A deadline too far away for the clock is refused where it is
        // applied (`set_drain`).
        Request::Drain { vip, backend, .. }
        | Request::Enable { vip, backend }
        | Request::Weight { vip, backend, .. } => {
            text("vip", vip, MAX_VIP_NAME)?;
            text("backend", backend, MAX_ADDRESS)?;
            check_backend_name(backend)
        }
        Request::Block {
            list,
            prefix,
            vip,
            ttl_ms,
            reason,
            force,
            ..
        } => {
            text("prefix", prefix, MAX_ADDRESS)?;
            // An unparsable prefix is refused by the handler, with its own
            // message.
            if let Ok(p) = prefix.parse::<crate::guard::Prefix>() {
                check_whole_family(*list, &p, vip.as_deref(), *force)?;
            }
            vip.as_deref()
                .map_or(Ok(()), |v| text("vip", v, MAX_VIP_NAME))?;
            ttl_ms.map_or(Ok(()), ttl)?;
            reason.as_deref().map_or(Ok(()), check_reason)
        }
        Request::Unblock { prefix, vip, .. } => {
            text("prefix", prefix, MAX_ADDRESS)?;
            vip.as_deref()
                .map_or(Ok(()), |v| text("vip", v, MAX_VIP_NAME))
        }
        Request::Sources { vip } | Request::Announce { vip } => vip
            .as_deref()
            .map_or(Ok(()), |v| text("vip", v, MAX_VIP_NAME)),
        Request::Withdraw { vip, reason } => {
            vip.as_deref()
                .map_or(Ok(()), |v| text("vip", v, MAX_VIP_NAME))?;
            reason.as_deref().map_or(Ok(()), check_reason)
        }
    }
}

/// A reason: at most [`MAX_REASON`] characters, on one line. Shared with
/// the CLI's `--reason`.
///
/// # Errors
///
/// Too long, or with control characters.
pub fn check_reason(s: &str) -> Result<(), String> {
    let n = s.chars().count();
    if n > MAX_REASON {
        return Err(format!(
            "the reason is {n} characters long; use at most {MAX_REASON}"
        ));
    }
    if s.chars().any(char::is_control) {
        return Err("the reason has control characters (a newline?); write it on one line".into());
    }
    Ok(())
}

/// A backend as `xlb drain` and `xlb enable` name it: `IP:PORT`,
/// `[IPv6]:PORT` or the IP alone (`daemon::model::names_backend`). Shared
/// with the CLI, which checks before sending.
///
/// # Errors
///
/// Anything else, with what to write.
pub fn check_backend_name(s: &str) -> Result<(), String> {
    if s.parse::<std::net::SocketAddr>().is_ok() || s.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    Err(format!(
        "backend {} is not an address; write IP:PORT, [IPv6]:PORT or just the IP, as \
         `xlb status` lists the VIP's backends",
        escape(&format!("{s:?}"))
    ))
}

/// A deny or allow entry for every address of a family (`0.0.0.0/0`,
/// `::/0`) needs `force`: one typo would refuse every client, or exempt
/// every client from every deny entry. Shared with the CLI (`--force`).
///
/// # Errors
///
/// A /0 without `force`, saying what it would do.
pub fn check_whole_family(
    list: ListKind,
    prefix: &crate::guard::Prefix,
    vip: Option<&str>,
    force: bool,
) -> Result<(), String> {
    if prefix.len > 0 || force {
        return Ok(());
    }
    let family = if prefix.addr.is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    };
    let scope = vip.map_or_else(|| "every VIP".to_owned(), |v| format!("VIP {v:?}"));
    let effect = match list {
        ListKind::Deny => format!("refuses every {family} client of {scope}"),
        ListKind::Allow => {
            format!("exempts every {family} client of {scope} from every deny entry")
        }
    };
    Err(format!(
        "{prefix} is every {family} address: this {effect}; add --force (\"force\": true) \
         if that is what you mean"
    ))
}

/// A block's TTL: [`MIN_TTL`] to [`MAX_TTL`]. Shared with the CLI's `--ttl`.
///
/// # Errors
///
/// Out of range; the message says the range and how to ask for no TTL.
pub fn check_ttl(d: Duration, spelled: &str) -> Result<(), String> {
    if d < MIN_TTL || d > MAX_TTL {
        return Err(format!(
            "a TTL of {spelled} is out of range; use {} to {}, or leave the TTL out for an \
             entry that stays until `xlb unblock`",
            crate::config::shown_duration(MIN_TTL),
            crate::config::shown_duration(MAX_TTL)
        ));
    }
    Ok(())
}

fn ttl(ms: u64) -> Result<(), String> {
    check_ttl(Duration::from_millis(ms), &format!("{ms} ms")).map_err(|e| format!("ttl_ms: {e}"))
}

/// A name or an address: no control characters (it is echoed into logs,
/// events and answers), and no longer than any valid value.
fn text(field: &str, s: &str, max: usize) -> Result<(), String> {
    if s.chars().any(char::is_control) {
        return Err(format!(
            "{field} {} has control characters; no {field} has any",
            escape(s)
        ));
    }
    if s.len() > max {
        return Err(format!(
            "{field} is {} bytes long; no valid {field} is longer than {max}",
            s.len()
        ));
    }
    Ok(())
}

/// `s` with its control characters escaped (`\n`, `\u{1b}`), for a log line:
/// a client's text must not start a line of its own or drive the terminal
/// of whoever reads the log. Everything else, Unicode included, is kept.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::{GuardAction, ListKind};

    fn block(ttl_ms: Option<u64>, reason: Option<&str>) -> Request {
        Request::Block {
            list: ListKind::Deny,
            prefix: "192.0.2.7".into(),
            vip: Some("api".into()),
            ttl_ms,
            reason: reason.map(str::to_owned),
            action: GuardAction::Drop,
            force: false,
        }
    }

    fn drain(vip: &str, backend: &str) -> Request {
        Request::Drain {
            vip: vip.into(),
            backend: backend.into(),
            deadline_ms: None,
        }
    }

    #[test]
    fn requests_out_of_bounds_are_refused() {
        let long_reason = "x".repeat(201);
        let max_ttl_ms = u64::try_from(MAX_TTL.as_millis()).unwrap();
        // (name, request, None = accepted / Some(start of the error))
        let cases = [
            (
                "block, bounds kept",
                block(Some(3_600_000), Some("seed 001")),
                None,
            ),
            ("block, 1 s", block(Some(1000), None), None),
            ("block, 30 days", block(Some(max_ttl_ms), None), None),
            (
                "block, ttl 0",
                block(Some(0), None),
                Some("ttl_ms: a TTL of 0 ms is out of range; use 1s to 30d"),
            ),
            (
                "block, ttl 999 ms",
                block(Some(999), None),
                Some("ttl_ms: a TTL of 999 ms is out of range"),
            ),
            (
                "block, ttl past 30 days",
                block(Some(max_ttl_ms + 1), None),
                Some("ttl_ms: a TTL of 2592000001 ms is out of range"),
            ),
            (
                "block, ttl u64::MAX",
                block(Some(u64::MAX), None),
                Some("ttl_ms: a TTL of 18446744073709551615 ms is out of range"),
            ),
            (
                "block, reason of 201 characters",
                block(None, Some(&long_reason)),
                Some("the reason is 201 characters long; use at most 200"),
            ),
            (
                "block, reason with a newline",
                block(None, Some("ok\n2026-12-01 INFO forged line")),
                Some("the reason has control characters"),
            ),
            (
                "block, reason with an escape sequence",
                block(None, Some("\u{1b}[2J")),
                Some("the reason has control characters"),
            ),
            ("drain, no deadline", drain("api", "10.0.0.1:80"), None),
            ("drain, an address alone", drain("api", "10.0.0.1"), None),
            ("drain, IPv6 and port", drain("api", "[fd00::1]:80"), None),
            (
                "drain, not an address",
                drain("api", "notanip"),
                Some(
                    "backend \"notanip\" is not an address; write IP:PORT, [IPv6]:PORT or just \
                     the IP, as `xlb status` lists the VIP's backends",
                ),
            ),
            (
                "enable, IPv6 without brackets",
                Request::Enable {
                    vip: "api".into(),
                    backend: "fd00::1:80:x".into(),
                },
                Some("backend \"fd00::1:80:x\" is not an address"),
            ),
            (
                "block 0.0.0.0/0 without force",
                Request::Block {
                    list: ListKind::Deny,
                    prefix: "0.0.0.0/0".into(),
                    vip: None,
                    ttl_ms: None,
                    reason: None,
                    action: GuardAction::Drop,
                    force: false,
                },
                Some(
                    "0.0.0.0/0 is every IPv4 address: this refuses every IPv4 client of every VIP",
                ),
            ),
            (
                "block ::/0 with force",
                Request::Block {
                    list: ListKind::Deny,
                    prefix: "::/0".into(),
                    vip: None,
                    ttl_ms: None,
                    reason: None,
                    action: GuardAction::Drop,
                    force: true,
                },
                None,
            ),
            (
                "drain, vip with a newline",
                drain("api\nforged", "10.0.0.1:80"),
                Some(r#"vip api\nforged has control characters"#),
            ),
            (
                "drain, backend of 10 kB",
                drain("api", &"1".repeat(10_000)),
                Some("backend is 10000 bytes long; no valid backend is longer than 64"),
            ),
            (
                "sources, vip with a bell",
                Request::Sources {
                    vip: Some("a\u{7}".into()),
                },
                Some(r"vip a\u{7} has control characters"),
            ),
        ];
        for (name, req, want) in cases {
            let got = check_request(&req);
            match want {
                None => assert_eq!(got, Ok(()), "{name}"),
                Some(w) => {
                    let e = got.expect_err(name);
                    assert!(e.starts_with(w), "{name}: {e}");
                }
            }
        }
    }

    #[test]
    fn escape_keeps_text_and_escapes_control_characters() {
        let cases = [
            ("plain", "drain api 10.0.0.1:80", "drain api 10.0.0.1:80"),
            ("unicode kept", "raison: café ✓", "raison: café ✓"),
            ("newline", "a\nb", r"a\nb"),
            ("escape sequence", "\u{1b}[2J", r"\u{1b}[2J"),
            ("carriage return", "a\rb", r"a\rb"),
        ];
        for (name, input, want) in cases {
            assert_eq!(escape(input), want, "{name}");
        }
    }
}
