//! What a client asks the daemon.

use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::wire::to_line;
use crate::{GuardAction, ListKind};

/// Transport protocol of the flow an `explain` asks about, spelled as in the
/// configuration's `vip.protocol`.
///
/// The daemon's configuration has its own `Protocol`, which also knows the
/// IANA number the data plane keys on; this crate has no access to those
/// numbers (it depends on serde only), and the daemon reads this one by its
/// spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    /// The spelling on the wire and in the configuration: `tcp` or `udp`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a client asks the daemon. On the wire the variant is the `command`
/// field, next to `version`: `{"version":2,"command":"events","follow":true}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Everything about the daemon, its VIPs and backends: a
    /// [`StatusReport`](crate::StatusReport).
    Status,
    /// Recent events (state changes, table rebuilds, admin actions, reloads):
    /// [`Response::Events`](crate::Response::Events). With `follow`, the
    /// events retained so far and then each new one as it happens, one
    /// [`Response::Event`](crate::Response::Event) per line, until the client
    /// closes the connection.
    Events {
        /// Only events with `seq` greater than this (the `seq` of the last
        /// event the client saw); `null` = every event the daemon retains.
        #[serde(default)]
        since_seq: Option<u64>,
        /// Keep the connection open and stream new events.
        #[serde(default)]
        follow: bool,
    },
    /// Which backend a flow goes to, and why: an
    /// [`ExplainReport`](crate::ExplainReport).
    Explain {
        /// `"tcp"` or `"udp"`.
        protocol: Protocol,
        /// The client's address and port, e.g. `"192.0.2.10:51234"`.
        client: SocketAddr,
        /// The VIP address and port, e.g. `"10.100.0.1:80"`.
        vip: SocketAddr,
    },
    /// Stop sending new flows to a backend (existing flows continue) until
    /// `enable`, whatever its health checks say.
    Drain {
        /// VIP name, as in the configuration.
        vip: String,
        /// `"addr:port"` or `"[v6]:port"`.
        backend: String,
        /// Milliseconds from now after which the backend becomes `down`:
        /// its remaining flows then follow the VIP's `down_policy`. Absent =
        /// no deadline (a drain already under way keeps its deadline).
        /// Left out of the line when absent, so a request without one reads
        /// the same to daemons that predate it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline_ms: Option<u64>,
    },
    /// Undo a `drain`: the backend takes new flows again once healthy.
    Enable {
        /// VIP name, as in the configuration.
        vip: String,
        /// `"addr:port"` or `"[v6]:port"`.
        backend: String,
    },
    /// Re-read the configuration file and apply the difference.
    Reload,
    /// Add a runtime entry to a deny (`xlb block`) or allow (`xlb allow`)
    /// list: pinned, kept across restarts, removed at its TTL.
    Block {
        list: ListKind,
        /// `"192.0.2.7"`, `"192.0.2.0/24"`, `"2001:db8:1:2::/64"` (a bare
        /// address is its /32 or /128).
        prefix: String,
        /// VIP name; absent = the global list (every VIP).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vip: Option<String>,
        /// Milliseconds until the entry is removed; absent = until `unblock`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ttl_ms: Option<u64>,
        /// Why, shown by `xlb blocks` and in the event.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// Deny entries: drop (default) or reset.
        #[serde(default)]
        action: GuardAction,
        /// `--force`: a /0 (every address of a family) is refused without.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
    },
    /// Remove a runtime entry (`xlb unblock`, `xlb unblock --allow`).
    Unblock {
        list: ListKind,
        prefix: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vip: Option<String>,
    },
    /// Every deny and allow entry, with its hits:
    /// [`Response::Blocks`](crate::Response::Blocks).
    Blocks,
    /// The heaviest sources per VIP:
    /// [`Response::Sources`](crate::Response::Sources).
    Sources {
        /// Only this VIP; absent = every VIP.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vip: Option<String>,
    },
    /// Stop announcing a VIP (`xlb withdraw`), or every VIP: kept in the
    /// state file across restarts until `announce`.
    Withdraw {
        /// VIP name; absent = every VIP.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vip: Option<String>,
        /// Why, shown by `status` and in the event.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Undo `withdraw` (`xlb announce`): the VIP is announced again when
    /// its backends allow.
    Announce {
        /// VIP name; absent = every VIP.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vip: Option<String>,
    },
    /// Change a backend's weight live (`xlb weight`): the VIP's table is
    /// rebuilt at once, and the weight is kept across restarts until the
    /// configuration changes that backend's weight. A weight equal to the
    /// configured one removes the override.
    /// [`Response::Weight`](crate::Response::Weight).
    Weight {
        /// VIP name, as in the configuration.
        vip: String,
        /// `"addr:port"` or `"[v6]:port"` (or just the address).
        backend: String,
        /// The new weight, in the range the configuration allows.
        weight: u32,
    },
}

impl Request {
    /// Whether the request changes the daemon's state (to be logged with who
    /// asked, and refused by read-only front ends).
    pub fn is_mutating(&self) -> bool {
        match self {
            Request::Status
            | Request::Events { .. }
            | Request::Explain { .. }
            | Request::Blocks
            | Request::Sources { .. } => false,
            Request::Drain { .. }
            | Request::Enable { .. }
            | Request::Reload
            | Request::Block { .. }
            | Request::Unblock { .. }
            | Request::Withdraw { .. }
            | Request::Announce { .. }
            | Request::Weight { .. } => true,
        }
    }

    /// The request as one line of the wire format, newline included.
    pub fn to_line(&self) -> String {
        to_line(self)
    }

    /// `weight api 10.99.0.12:80 3` (nothing for another request).
    fn fmt_weight(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Request::Weight {
            vip,
            backend,
            weight,
        } = self
        else {
            return Ok(());
        };
        write!(f, "weight {vip} {backend} {weight}")
    }
}

impl fmt::Display for Request {
    /// A short description for logs, e.g. `drain api 10.99.0.12:80`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Status => f.write_str("status"),
            Request::Events { since_seq, follow } => {
                f.write_str("events")?;
                if let Some(seq) = since_seq {
                    write!(f, " since {seq}")?;
                }
                if *follow {
                    f.write_str(" (follow)")?;
                }
                Ok(())
            }
            Request::Explain {
                protocol,
                client,
                vip,
            } => write!(f, "explain {protocol} {client} {vip}"),
            Request::Drain {
                vip,
                backend,
                deadline_ms: None,
            } => write!(f, "drain {vip} {backend}"),
            Request::Drain {
                vip,
                backend,
                deadline_ms: Some(ms),
            } => write!(f, "drain {vip} {backend} (deadline in {ms} ms)"),
            Request::Enable { vip, backend } => write!(f, "enable {vip} {backend}"),
            Request::Reload => f.write_str("reload"),
            Request::Block {
                list,
                prefix,
                vip,
                ttl_ms,
                action,
                ..
            } => {
                let verb = match list {
                    ListKind::Deny => "block",
                    ListKind::Allow => "allow",
                };
                write!(f, "{verb} {prefix}")?;
                if let Some(v) = vip {
                    write!(f, " on {v}")?;
                }
                if *list == ListKind::Deny {
                    write!(f, " ({})", action.as_str())?;
                }
                if let Some(ms) = ttl_ms {
                    write!(f, " for {ms} ms")?;
                }
                Ok(())
            }
            Request::Unblock { list, prefix, vip } => {
                write!(f, "unblock {} {prefix}", list.as_str())?;
                if let Some(v) = vip {
                    write!(f, " on {v}")?;
                }
                Ok(())
            }
            Request::Blocks => f.write_str("blocks"),
            Request::Sources { vip: None } => f.write_str("sources"),
            Request::Sources { vip: Some(v) } => write!(f, "sources of {v}"),
            Request::Withdraw { vip, reason } => {
                write!(f, "withdraw {}", vip.as_deref().unwrap_or("--all"))?;
                if let Some(r) = reason {
                    write!(f, " ({r})")?;
                }
                Ok(())
            }
            Request::Announce { vip } => {
                write!(f, "announce {}", vip.as_deref().unwrap_or("--all"))
            }
            Request::Weight { .. } => self.fmt_weight(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{COMMANDS, parse_request};

    #[test]
    fn requests_round_trip() {
        let cases = [
            (
                "status",
                Request::Status,
                r#"{"version":2,"command":"status"}"#,
            ),
            (
                "events",
                Request::Events {
                    since_seq: Some(7),
                    follow: true,
                },
                r#"{"version":2,"command":"events","since_seq":7,"follow":true}"#,
            ),
            (
                "explain v6",
                Request::Explain {
                    protocol: Protocol::Udp,
                    client: "[2001:db8::1]:5353".parse().unwrap(),
                    vip: "[2001:db8::100]:53".parse().unwrap(),
                },
                r#"{"version":2,"command":"explain","protocol":"udp","client":"[2001:db8::1]:5353","vip":"[2001:db8::100]:53"}"#,
            ),
            (
                "drain",
                Request::Drain {
                    vip: "api".to_owned(),
                    backend: "10.99.0.12:80".to_owned(),
                    deadline_ms: None,
                },
                r#"{"version":2,"command":"drain","vip":"api","backend":"10.99.0.12:80"}"#,
            ),
            (
                "drain with a deadline",
                Request::Drain {
                    vip: "api".to_owned(),
                    backend: "10.99.0.12:80".to_owned(),
                    deadline_ms: Some(300_000),
                },
                r#"{"version":2,"command":"drain","vip":"api","backend":"10.99.0.12:80","deadline_ms":300000}"#,
            ),
            (
                "enable",
                Request::Enable {
                    vip: "api".to_owned(),
                    backend: "[fd00::2]:80".to_owned(),
                },
                r#"{"version":2,"command":"enable","vip":"api","backend":"[fd00::2]:80"}"#,
            ),
            (
                "reload",
                Request::Reload,
                r#"{"version":2,"command":"reload"}"#,
            ),
            (
                "block",
                Request::Block {
                    list: ListKind::Deny,
                    prefix: "2001:db8:1:2::/64".to_owned(),
                    vip: Some("api".to_owned()),
                    ttl_ms: Some(3_600_000),
                    reason: Some("seed 001".to_owned()),
                    action: GuardAction::Reset,
                    force: false,
                },
                r#"{"version":2,"command":"block","list":"deny","prefix":"2001:db8:1:2::/64","vip":"api","ttl_ms":3600000,"reason":"seed 001","action":"reset"}"#,
            ),
            (
                "unblock",
                Request::Unblock {
                    list: ListKind::Allow,
                    prefix: "192.0.2.0/24".to_owned(),
                    vip: None,
                },
                r#"{"version":2,"command":"unblock","list":"allow","prefix":"192.0.2.0/24"}"#,
            ),
            (
                "blocks",
                Request::Blocks,
                r#"{"version":2,"command":"blocks"}"#,
            ),
            (
                "sources",
                Request::Sources {
                    vip: Some("api".to_owned()),
                },
                r#"{"version":2,"command":"sources","vip":"api"}"#,
            ),
            (
                "weight",
                Request::Weight {
                    vip: "api".to_owned(),
                    backend: "10.99.0.12:80".to_owned(),
                    weight: 3,
                },
                r#"{"version":2,"command":"weight","vip":"api","backend":"10.99.0.12:80","weight":3}"#,
            ),
        ];
        for (name, req, wire) in cases {
            let line = req.to_line();
            assert_eq!(line, format!("{wire}\n"), "{name}");
            assert_eq!(parse_request(line.as_bytes()), Ok(req), "{name}");
        }
    }

    /// One of each request, in the order of [`COMMANDS`]. The match makes a
    /// new variant a compile error here until it is added to the list (and
    /// so to `COMMANDS`, and to the README, which `tests/tests/docs.rs`
    /// checks against `COMMANDS`).
    fn one_of_each() -> Vec<Request> {
        let reqs = vec![
            Request::Status,
            Request::Events {
                since_seq: None,
                follow: false,
            },
            Request::Explain {
                protocol: Protocol::Tcp,
                client: "192.0.2.1:1".parse().unwrap(),
                vip: "192.0.2.2:2".parse().unwrap(),
            },
            Request::Drain {
                vip: "a".to_owned(),
                backend: "b".to_owned(),
                deadline_ms: None,
            },
            Request::Enable {
                vip: "a".to_owned(),
                backend: "b".to_owned(),
            },
            Request::Reload,
            Request::Block {
                list: ListKind::Deny,
                prefix: "192.0.2.7".to_owned(),
                vip: None,
                ttl_ms: None,
                reason: None,
                action: GuardAction::Drop,
                force: true,
            },
            Request::Unblock {
                list: ListKind::Deny,
                prefix: "192.0.2.7".to_owned(),
                vip: None,
            },
            Request::Blocks,
            Request::Sources { vip: None },
            Request::Withdraw {
                vip: None,
                reason: None,
            },
            Request::Announce { vip: None },
            Request::Weight {
                vip: "a".to_owned(),
                backend: "b".to_owned(),
                weight: 0,
            },
        ];
        for r in &reqs {
            match r {
                Request::Status
                | Request::Events { .. }
                | Request::Explain { .. }
                | Request::Drain { .. }
                | Request::Enable { .. }
                | Request::Reload
                | Request::Block { .. }
                | Request::Unblock { .. }
                | Request::Blocks
                | Request::Sources { .. }
                | Request::Withdraw { .. }
                | Request::Announce { .. }
                | Request::Weight { .. } => {}
            }
        }
        reqs
    }

    #[test]
    fn every_command_is_listed() {
        let reqs = one_of_each();
        let names: Vec<String> = reqs
            .iter()
            .map(|r| {
                serde_json::to_value(r).unwrap()["command"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(names, COMMANDS);
        let mutating: Vec<bool> = reqs.iter().map(Request::is_mutating).collect();
        assert_eq!(
            mutating,
            [
                false, false, false, true, true, true, true, true, false, false, true, true, true
            ]
        );
    }

    #[test]
    fn events_defaults() {
        assert_eq!(
            parse_request(br#"{"version":2,"command":"events"}"#),
            Ok(Request::Events {
                since_seq: None,
                follow: false
            })
        );
    }

    #[test]
    fn protocols_are_spelled_as_in_the_configuration() {
        for (p, want) in [(Protocol::Tcp, "tcp"), (Protocol::Udp, "udp")] {
            assert_eq!(p.to_string(), want);
            assert_eq!(serde_json::to_value(p).unwrap(), want);
        }
    }

    #[test]
    fn request_display() {
        let cases = [
            (Request::Status, "status"),
            (
                Request::Events {
                    since_seq: Some(3),
                    follow: true,
                },
                "events since 3 (follow)",
            ),
            (
                Request::Explain {
                    protocol: Protocol::Udp,
                    client: "192.0.2.1:1".parse().unwrap(),
                    vip: "192.0.2.2:2".parse().unwrap(),
                },
                "explain udp 192.0.2.1:1 192.0.2.2:2",
            ),
            (
                Request::Drain {
                    vip: "api".to_owned(),
                    backend: "10.99.0.12:80".to_owned(),
                    deadline_ms: None,
                },
                "drain api 10.99.0.12:80",
            ),
            (
                Request::Drain {
                    vip: "api".to_owned(),
                    backend: "10.99.0.12:80".to_owned(),
                    deadline_ms: Some(300_000),
                },
                "drain api 10.99.0.12:80 (deadline in 300000 ms)",
            ),
            (
                Request::Weight {
                    vip: "api".to_owned(),
                    backend: "10.99.0.12:80".to_owned(),
                    weight: 3,
                },
                "weight api 10.99.0.12:80 3",
            ),
        ];
        for (req, want) in cases {
            assert_eq!(req.to_string(), want);
        }
    }
}
