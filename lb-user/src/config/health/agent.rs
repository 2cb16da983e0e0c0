//! The agent check's fields of a health_check table: `agent_port`,
//! `agent_interval`, `agent_timeout`, `agent_send` (see `health::agent`).
//! Any layer may set them; they merge field by field like the others.

use std::time::Duration;

use serde::Serialize;

use super::{Layer, Problems, RawHealth, duration, pick, place, ser_duration};
use crate::health::agent::{AgentCheck, MAX_SEND};

/// The agent fields of one table, values parsed.
#[derive(Clone, Debug, Default)]
pub(in crate::config) struct AgentLayer {
    port: Option<u16>,
    interval: Option<Duration>,
    timeout: Option<Duration>,
    /// Escapes resolved.
    send: Option<Vec<u8>>,
}

pub(super) fn parse(raw: &RawHealth, ctx: &str, p: &mut Problems<'_>) -> AgentLayer {
    let port = raw.agent_port.and_then(|n| match u16::try_from(n) {
        Ok(port) if port > 0 => Some(port),
        _ => {
            p.error(
                ctx,
                format!("agent_port {n} is out of range; use the agent's TCP port, 1 to 65535"),
            );
            None
        }
    });
    let send = raw.agent_send.as_deref().and_then(|text| {
        unescape(text)
            .map_err(|e| p.error(ctx, format!("agent_send {e}")))
            .ok()
    });
    AgentLayer {
        port,
        interval: duration("agent_interval", &raw.agent_interval, ctx, p),
        timeout: duration("agent_timeout", &raw.agent_timeout, ctx, p),
        send,
    }
}

/// `text` with `\n`, `\r`, `\t` and `\\` resolved; 1 to [`MAX_SEND`] bytes.
fn unescape(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        out.push(match chars.next() {
            Some('n') => b'\n',
            Some('r') => b'\r',
            Some('t') => b'\t',
            Some('\\') => b'\\',
            other => {
                let shown = other.map_or_else(|| "a lone \\ at the end".to_owned(), |c| format!("\\{c}"));
                return Err(format!(
                    "has an unknown escape ({shown}); use \\n, \\r, \\t or \\\\ (in TOML, write \"\\\\n\" or a literal string 'ping\\n')"
                ));
            }
        });
    }
    if out.is_empty() || out.len() > MAX_SEND {
        return Err(format!(
            "must be 1 to {MAX_SEND} bytes (it is {}); remove it to send nothing",
            out.len()
        ));
    }
    Ok(out)
}

/// The agent fields of a check as `ser_check_spec` shows them.
#[derive(Serialize)]
pub(super) struct AgentView {
    agent_port: u16,
    #[serde(serialize_with = "ser_duration")]
    agent_interval: Duration,
    #[serde(serialize_with = "ser_duration")]
    agent_timeout: Duration,
    #[serde(skip_serializing_if = "Option::is_none")]
    agent_send: Option<String>,
}

impl AgentView {
    pub(super) fn of(a: &AgentCheck) -> Self {
        Self {
            agent_port: a.port,
            agent_interval: a.interval,
            agent_timeout: a.timeout,
            agent_send: (!a.send.is_empty()).then(|| show_send(&a.send)),
        }
    }
}

/// `send` written back as the file would write it.
fn show_send(send: &[u8]) -> String {
    let mut out = String::new();
    for chunk in send.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => out.extend(c.escape_default()),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// The merged agent check of a backend probed on `port` (0: a table
/// checked on its own, not a backend's), with the check's `interval` and
/// `timeout` as defaults; `None` without `agent_port`.
pub(super) fn resolve(
    layers: &[Layer<'_>],
    port: u16,
    interval: Duration,
    timeout: Duration,
    p: &mut Problems<'_>,
) -> Option<AgentCheck> {
    let agent_port = pick(layers, |l| &l.agent.port).0;
    let (a_interval, interval_src) = pick(layers, |l| &l.agent.interval);
    let (a_timeout, timeout_src) = pick(layers, |l| &l.agent.timeout);
    let Some(agent_port) = agent_port else {
        if port != 0 {
            no_port(layers, p);
        }
        return None;
    };
    let interval = a_interval.unwrap_or(interval);
    let timeout = a_timeout.unwrap_or(timeout.min(interval));
    if timeout > interval {
        p.error(
            place(layers, interval_src.max(timeout_src)),
            format!(
                "agent_timeout {timeout:?} is longer than agent_interval {interval:?}; a poll \
                 must end before the next one starts: shorten agent_timeout or lengthen \
                 agent_interval"
            ),
        );
    }
    Some(AgentCheck {
        port: agent_port,
        interval,
        timeout,
        send: pick(layers, |l| &l.agent.send).0.unwrap_or_default(),
    })
}

/// Agent settings where no agent is polled. The daemon-wide table may set
/// them as defaults for the VIPs that set `agent_port`; a VIP's or a
/// backend's own table that sets them without one is a mistake.
fn no_port(layers: &[Layer<'_>], p: &mut Problems<'_>) {
    for (layer, ctx) in layers.iter().skip(1) {
        let fields = [
            ("agent_interval", layer.agent.interval.is_some()),
            ("agent_timeout", layer.agent.timeout.is_some()),
            ("agent_send", layer.agent.send.is_some()),
        ];
        for (field, set) in fields {
            if set {
                p.error(
                    ctx,
                    format!(
                        "{field} is set but no agent_port is; set agent_port to poll the \
                         backend's agent, or remove {field}"
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::tests::{DAEMON, api_vip, assert_rejected, ok};
    use crate::health::agent::AgentCheck;

    /// VIP "api" with `vip` in its health_check table and one backend
    /// with `backend` in its own.
    fn agent_config(daemon: &str, vip: &str, backend: &str) -> String {
        api_vip(&format!(
            "[vip.health_check]\n{vip}\n[[vip.backend]]\naddress = \"10.0.0.11\"\n\
             [vip.backend.health_check]\n{backend}\n"
        ))
        .replacen(DAEMON, &format!("{DAEMON}\n[health_check]\n{daemon}\n"), 1)
    }

    fn agent_of(text: &str) -> Option<AgentCheck> {
        ok("agent", text).vips[0].backends[0].health.agent.clone()
    }

    #[test]
    fn agent_fields_merge_with_defaults_from_the_check() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let cases = [
            ("no agent", "", "", "", None),
            (
                "port alone: the check's interval and timeout",
                "",
                "agent_port = 5555",
                "",
                Some(AgentCheck {
                    port: 5555,
                    interval: s(2),
                    timeout: s(1),
                    send: Vec::new(),
                }),
            ),
            (
                "daemon-wide defaults, port per VIP, send per backend",
                "agent_interval = \"500ms\"\ninterval = \"4s\"",
                "agent_port = 5555",
                r#"agent_send = "ping\\r\\n\\t\\\\x""#,
                Some(AgentCheck {
                    port: 5555,
                    interval: ms(500),
                    // The check's 1 s, cut to the agent's interval.
                    timeout: ms(500),
                    send: b"ping\r\n\t\\x".to_vec(),
                }),
            ),
            (
                "backend overrides",
                "",
                "agent_port = 5555\nagent_timeout = \"300ms\"",
                "agent_port = 6000\nagent_interval = \"3s\"",
                Some(AgentCheck {
                    port: 6000,
                    interval: s(3),
                    timeout: ms(300),
                    send: Vec::new(),
                }),
            ),
        ];
        for (name, daemon, vip, backend, want) in cases {
            assert_eq!(
                agent_of(&agent_config(daemon, vip, backend)),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn agent_fields_are_refused_with_named_errors() {
        let cases: [(&str, &str, &str, &[&str]); 6] = [
            (
                "",
                "agent_port = 0",
                "agent_port = 70000",
                &[
                    r#"xlb.toml: vip "api": health_check: agent_port 0 is out of range; use the agent's TCP port, 1 to 65535"#,
                    r#"xlb.toml: vip "api": backend 10.0.0.11:80: health_check: agent_port 70000 is out of range; use the agent's TCP port, 1 to 65535"#,
                ],
            ),
            (
                "",
                "agent_interval = \"1s\"",
                "agent_send = \"x\"",
                &[
                    r#"xlb.toml: vip "api": health_check: agent_interval is set but no agent_port is; set agent_port to poll the backend's agent, or remove agent_interval"#,
                    r#"xlb.toml: vip "api": backend 10.0.0.11:80: health_check: agent_send is set but no agent_port is; set agent_port to poll the backend's agent, or remove agent_send"#,
                ],
            ),
            (
                "",
                "agent_port = 5555\nagent_interval = \"1s\"",
                "agent_timeout = \"2s\"",
                &[
                    r#"xlb.toml: vip "api": backend 10.0.0.11:80: health_check: agent_timeout 2s is longer than agent_interval 1s; a poll must end before the next one starts: shorten agent_timeout or lengthen agent_interval"#,
                ],
            ),
            (
                "agent_interval = \"0s\"",
                "agent_port = 5555\nagent_timeout = \"soon\"",
                "",
                &[
                    r#"xlb.toml: health_check: agent_interval must be longer than 0"#,
                    r#"xlb.toml: vip "api": health_check: agent_timeout "soon" is not a duration; write a number and a unit (ms, s, m, h or d), e.g. "500ms", "2s", "1.5s", "1m""#,
                ],
            ),
            (
                "",
                "agent_port = 5555\nagent_send = 'ping\\x'",
                "",
                &[
                    r#"xlb.toml: vip "api": health_check: agent_send has an unknown escape (\x); use \n, \r, \t or \\ (in TOML, write "\\n" or a literal string 'ping\n')"#,
                ],
            ),
            (
                "",
                "agent_port = 5555\nagent_send = \"\"",
                "",
                &[
                    r#"xlb.toml: vip "api": health_check: agent_send must be 1 to 256 bytes (it is 0); remove it to send nothing"#,
                ],
            ),
        ];
        for (daemon, vip, backend, want) in cases {
            assert_rejected(&agent_config(daemon, vip, backend), want);
        }
        let long = format!("agent_port = 5555\nagent_send = \"{}\"", "x".repeat(257));
        assert_rejected(
            &agent_config("", &long, ""),
            &[
                r#"xlb.toml: vip "api": health_check: agent_send must be 1 to 256 bytes (it is 257); remove it to send nothing"#,
            ],
        );
    }

    #[test]
    fn the_serialized_check_shows_the_agent() {
        let with = ok(
            "agent",
            &agent_config("", "agent_port = 5555\nagent_send = 'ping\\n'", ""),
        );
        let json = serde_json::to_value(&with.vips[0].backends[0]).unwrap();
        let h = &json["health"];
        assert_eq!(h["agent_port"], 5555);
        assert_eq!(h["agent_interval"], "2s");
        assert_eq!(h["agent_timeout"], "1s");
        assert_eq!(h["agent_send"], "ping\\n");
        let without = ok("no agent", &agent_config("", "", ""));
        let json = serde_json::to_value(&without.vips[0].backends[0]).unwrap();
        assert!(json["health"].get("agent_port").is_none(), "{json}");
    }

    #[test]
    fn show_send_writes_the_escapes_back() {
        assert_eq!(
            super::show_send(b"PING\r\n\t\\\x01\xff"),
            "PING\\r\\n\\t\\\\\\u{1}\\xff"
        );
        assert_eq!(
            super::unescape(&super::show_send(b"a\r\n\\")).unwrap(),
            b"a\r\n\\"
        );
    }
}
