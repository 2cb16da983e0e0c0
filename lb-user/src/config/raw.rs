//! The file as written: serde structs that mirror the TOML document.
//!
//! `deny_unknown_fields` everywhere, so a typo is an error rather than a
//! silently ignored setting. Every optional setting is an `Option` so that
//! validation can tell "not set" from "set to the default" (health checks and
//! protection merge field by field), and values with a unit stay strings until
//! validation parses them with a message that says where they are.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use lb_ctl::GuardAction;

use super::{DownPolicy, Mode, Protocol, XdpMode};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) daemon: RawDaemon,
    pub(super) health_check: Option<RawHealth>,
    pub(super) protection: Option<RawProtection>,
    pub(super) passive: Option<super::passive::RawPassive>,
    pub(super) guard: Option<RawGuard>,
    pub(super) cluster: Option<super::cluster::RawCluster>,
    pub(super) announce: Option<super::announce::RawAnnounce>,
    #[serde(default)]
    pub(super) vip: Vec<RawVip>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDaemon {
    pub(super) interface: String,
    pub(super) xdp_mode: Option<XdpMode>,
    pub(super) instance: Option<String>,
    pub(super) control_socket: Option<PathBuf>,
    pub(super) socket_group: Option<String>,
    /// A string rather than a `SocketAddr` so that `""` can disable metrics.
    pub(super) metrics_address: Option<String>,
    pub(super) conntrack_size: Option<u32>,
    pub(super) udp_timeout: Option<String>,
    pub(super) max_table_size: Option<u32>,
    pub(super) hash_seed: Option<String>,
    pub(super) encap_source_v4: Option<Ipv4Addr>,
    pub(super) encap_source_v6: Option<Ipv6Addr>,
    pub(super) encap_source_v4_prefix: Option<String>,
    pub(super) probe_concurrency: Option<u32>,
    pub(super) reply_rate: Option<String>,
    pub(super) second_chance_window: Option<String>,
    /// NAT mode (`config::nat`): flow map capacity and TCP timeouts.
    pub(super) nat_size: Option<u32>,
    pub(super) tcp_syn_timeout: Option<String>,
    pub(super) tcp_timeout: Option<String>,
    pub(super) tcp_fin_timeout: Option<String>,
    pub(super) tcp_close_timeout: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVip {
    pub(super) name: String,
    pub(super) address: IpAddr,
    pub(super) port: u16,
    pub(super) protocol: Option<Protocol>,
    pub(super) mode: Option<Mode>,
    pub(super) down_policy: Option<DownPolicy>,
    pub(super) table_size: Option<u32>,
    pub(super) host_services: Option<bool>,
    pub(super) second_chance: Option<bool>,
    pub(super) health_check: Option<RawHealth>,
    pub(super) protection: Option<RawProtection>,
    pub(super) passive: Option<super::passive::RawPassive>,
    pub(super) guard: Option<RawGuard>,
    pub(super) max_flows: Option<u64>,
    /// Overrides `announce.min_up`; i64 for a message of ours on 0 or -1.
    pub(super) announce_min_up: Option<i64>,
    /// NAT mode (`config::nat`): the source pool, and the daemon's TCP
    /// timeouts overridden for this VIP.
    pub(super) preserve_client: Option<bool>,
    pub(super) snat: Option<Vec<IpAddr>>,
    pub(super) snat_ports: Option<String>,
    pub(super) tcp_syn_timeout: Option<String>,
    pub(super) tcp_timeout: Option<String>,
    pub(super) tcp_fin_timeout: Option<String>,
    pub(super) tcp_close_timeout: Option<String>,
    #[serde(default)]
    pub(super) backend: Vec<RawBackend>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackend {
    pub(super) address: IpAddr,
    pub(super) port: Option<u16>,
    pub(super) weight: Option<u32>,
    pub(super) health_port: Option<u16>,
    pub(super) health_check: Option<RawHealth>,
    pub(super) max_flows: Option<u64>,
}

/// `kind = "http"`, `"https"`, `"grpc"`, `"tcp"`, `"udp"` or `"dns"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum KindName {
    Http,
    Https,
    Grpc,
    Tcp,
    Udp,
    Dns,
}

/// `via = "vip"` or `via = "direct"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum ViaName {
    Direct,
    Vip,
}

/// A `[health_check]`, `[vip.health_check]` or `[vip.backend.health_check]`
/// table.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealth {
    pub(super) kind: Option<KindName>,
    pub(super) method: Option<String>,
    pub(super) path: Option<String>,
    pub(super) host: Option<String>,
    pub(super) expect_status: Option<Vec<RawStatus>>,
    pub(super) body_contains: Option<String>,
    pub(super) interval: Option<String>,
    pub(super) timeout: Option<String>,
    pub(super) hang_timeout: Option<String>,
    pub(super) rise: Option<u32>,
    pub(super) fall: Option<u32>,
    pub(super) fast_interval: Option<String>,
    pub(super) down_interval: Option<String>,
    pub(super) jitter: Option<RawJitter>,
    pub(super) via: Option<ViaName>,
    pub(super) reuse_connection: Option<bool>,
    pub(super) reopen_every: Option<u32>,
    /// The agent check (`config::health::agent`); a port as i64, so that
    /// 0 or 70000 gets a message of ours.
    pub(super) agent_port: Option<i64>,
    pub(super) agent_interval: Option<String>,
    pub(super) agent_timeout: Option<String>,
    pub(super) agent_send: Option<String>,
    pub(super) dns_name: Option<String>,
    pub(super) dns_type: Option<String>,
    pub(super) dns_rcodes: Option<Vec<String>>,
    /// Send/expect (kind tcp and udp): see `config::health::expect`.
    pub(super) send: Option<String>,
    pub(super) send_hex: Option<String>,
    pub(super) expect_prefix: Option<String>,
    pub(super) expect_contains: Option<String>,
    pub(super) expect_regex: Option<String>,
    pub(super) expect_max: Option<i64>,
    /// `kind = "grpc"`: the service asked about, and HTTP/2 over TLS.
    pub(super) service: Option<String>,
    pub(super) tls: Option<bool>,
    pub(super) tls_verify: Option<bool>,
    pub(super) ca_file: Option<String>,
    /// Accepted by the parser only to answer with a useful message: the
    /// probed port belongs to each backend (`health_port`).
    pub(super) port: Option<toml::Value>,
}

/// A `[protection]` or `[vip.protection]` table.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProtection {
    pub(super) max_ejected: Option<RawLimit>,
    pub(super) min_healthy: Option<RawLimit>,
    pub(super) outlier_factor: Option<f64>,
    pub(super) outlier_margin: Option<String>,
    pub(super) slow_start: Option<String>,
    pub(super) flap_damping: Option<bool>,
    pub(super) flap_half_life: Option<String>,
    pub(super) flap_limit: Option<f64>,
}

/// A `[guard]` or `[vip.guard]` table (`ct_insert_cap` is daemon-wide: the
/// VIP's table refuses it with a message).
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGuard {
    pub(super) ct_insert_cap: Option<String>,
    pub(super) track_sources: Option<bool>,
    pub(super) source_v4_prefix: Option<i64>,
    pub(super) source_v6_prefix: Option<i64>,
    pub(super) new_flows_per_source: Option<RawSourceLimit>,
    pub(super) source_alert: Option<RawSourceAlert>,
    pub(super) auto_block: Option<RawAutoBlock>,
    #[serde(default)]
    pub(super) deny: Vec<RawListRule>,
    #[serde(default)]
    pub(super) allow: Vec<RawListRule>,
}

/// `new_flows_per_source = { rate = "200/s", burst = 400, action = "drop" }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSourceLimit {
    pub(super) rate: String,
    pub(super) burst: Option<i64>,
    pub(super) action: Option<GuardAction>,
}

/// `source_alert = { rate = "500/s", share = "50%", min_rate = "20/s" }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSourceAlert {
    pub(super) rate: Option<String>,
    pub(super) share: Option<RawShare>,
    pub(super) min_rate: Option<String>,
}

/// `auto_block = { above = "1000/s", for = "10s", ttl = "15m", action = "drop" }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAutoBlock {
    pub(super) above: String,
    #[serde(rename = "for")]
    pub(super) sustained: Option<String>,
    pub(super) ttl: Option<String>,
    pub(super) action: Option<GuardAction>,
}

/// One `[[guard.deny]]`, `[[guard.allow]]`, `[[vip.guard.deny]]` or
/// `[[vip.guard.allow]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListRule {
    pub(super) prefix: String,
    pub(super) action: Option<GuardAction>,
    pub(super) reason: Option<String>,
}

/// `share = 0.5` or `share = "50%"`.
pub(super) enum RawShare {
    Fraction(f64),
    Text(String),
}

/// `jitter = 0.1` or `jitter = "10%"`.
pub(super) enum RawJitter {
    Fraction(f64),
    Text(String),
}

/// An `expect_status` item: `200` or `"200"` or `"200-299"`.
pub(super) enum RawStatus {
    Code(i64),
    Text(String),
}

/// `max_ejected = 2` or `max_ejected = "10%"` (and `min_healthy`).
#[derive(Clone)]
pub(super) enum RawLimit {
    Count(i64),
    Text(String),
}

/// Implements `Deserialize` for an enum of a number variant and a
/// `Text(String)` variant: a value the file may write either way. The
/// `expecting` text ends up in the TOML error of a value of the wrong type.
macro_rules! number_or_text {
    ($ty:ident, $expecting:literal, $number:ident {
        $($visit:ident($arg:ty) => $convert:expr),* $(,)?
    }) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl Visitor<'_> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expecting)
                    }
                    $(fn $visit<E: de::Error>(self, v: $arg) -> Result<$ty, E> {
                        let convert: fn($arg) -> _ = $convert;
                        Ok($ty::$number(convert(v)))
                    })*
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<$ty, E> {
                        Ok($ty::Text(v.to_owned()))
                    }
                }
                d.deserialize_any(V)
            }
        }

        impl $ty {
            /// The value as the file wrote it, for messages.
            pub(super) fn shown(&self) -> String {
                match self {
                    $ty::$number(n) => n.to_string(),
                    $ty::Text(t) => format!("{t:?}"),
                }
            }
        }
    };
}

number_or_text!(RawJitter, "a fraction such as 0.1 or a percentage such as \"10%\"", Fraction {
    visit_f64(f64) => |v| v,
    visit_i64(i64) => |v| v as f64,
    visit_u64(u64) => |v| v as f64,
});
number_or_text!(RawShare, "a fraction such as 0.5 or a percentage such as \"50%\"", Fraction {
    visit_f64(f64) => |v| v,
    visit_i64(i64) => |v| v as f64,
    visit_u64(u64) => |v| v as f64,
});
number_or_text!(RawStatus, "a status code such as 200 or a range such as \"200-299\"", Code {
    visit_i64(i64) => |v| v,
    visit_u64(u64) => |v| i64::try_from(v).unwrap_or(i64::MAX),
});
number_or_text!(RawLimit, "a number of backends or a percentage such as \"10%\"", Count {
    visit_i64(i64) => |v| v,
    visit_u64(u64) => |v| i64::try_from(v).unwrap_or(i64::MAX),
});

#[cfg(test)]
mod tests {
    use crate::config::tests::{DAEMON, api_vip, api_with_backend, parse};

    /// The message comes from the toml crate, so this checks the parts a
    /// user relies on rather than the crate's exact wording: the file, the
    /// line of `place` (the first line of `text` containing it) and `what`.
    /// (`config::collect` has the exact text, and several errors at once.)
    #[track_caller]
    fn assert_toml_error(text: &str, place: Option<&str>, what: &str) {
        let e = parse(text)
            .err()
            .unwrap_or_else(|| panic!("accepted:\n{text}"));
        assert_eq!(e.problems.len(), 1, "{e}");
        let msg = &e.problems[0];
        assert!(msg.starts_with("xlb.toml:"), "{msg}");
        if let Some(place) = place {
            let line = 1 + text
                .lines()
                .position(|l| l.contains(place))
                .unwrap_or_else(|| panic!("no {place:?} in the test's text"));
            // A syntax error in the toml crate's layout, the others as
            // `file:line:column: path: message`.
            let at = format!("line {line}, column");
            let prefix = format!("xlb.toml:{line}:");
            assert!(
                msg.contains(&at) || msg.starts_with(&prefix),
                "not at line {line}: {msg}"
            );
        }
        assert!(msg.contains(what), "no {what:?} in {msg}");
    }

    /// One `#[test]` per file serde refuses: `name: text, at place, what;`.
    macro_rules! toml_errors {
        ($($name:ident: $text:expr, at $place:expr, $what:expr;)*) => {$(
            #[test]
            fn $name() {
                assert_toml_error(&$text, $place, $what);
            }
        )*};
    }

    toml_errors! {
        syntax_error: format!("{DAEMON}[[vip]\n"), at Some("[[vip]"), "";
        unknown_top_level_table: format!(r#"{DAEMON}
[[vips]]
name = "a"
"#), at Some("[[vips]]"), "unknown field `vips`";
        unknown_daemon_field: r#"
[daemon]
interface = "eth0"
xdp = "native"
"#, at Some("xdp ="), "unknown field `xdp`";
        unknown_vip_field: api_with_backend("weight = 3"), at Some("weight = 3"), "unknown field `weight`";
        unknown_backend_field: api_vip(r#"
[[vip.backend]]
address = "10.0.0.1"
healthport = 1
"#), at Some("healthport"), "unknown field `healthport`";
        unknown_health_field: format!(r#"{DAEMON}
[health_check]
retries = 3
"#), at Some("retries"), "unknown field `retries`";
        missing_interface: "[daemon]\n", at None, "missing field `interface`";
        missing_daemon: r#"
[[vip]]
name = "api"
address = "10.100.0.1"
port = 80
[[vip.backend]]
address = "10.0.0.11"
"#, at None, "missing field `daemon`";
        missing_vip_port: format!(r#"{DAEMON}
[[vip]]
name = "a"
address = "10.1.0.1"
"#), at None, "missing field `port`";
        bad_mode: api_with_backend(r#"mode = "fullnat""#), at Some("fullnat"),
            "unknown variant `fullnat`, expected one of `dsr-ipip`, `dsr-l2`, `nat`";
        bad_protocol: api_with_backend(r#"protocol = "sctp""#), at Some("sctp"),
            "unknown variant `sctp`, expected `tcp` or `udp`";
        bad_address: api_vip(r#"
[[vip.backend]]
address = "10.0.0.300"
"#), at Some("10.0.0.300"), "invalid IP address syntax";
        encap_source_of_the_wrong_family: r#"
[daemon]
interface = "eth0"
encap_source_v4 = "fd00::2"
"#, at Some("encap_source_v4"), "invalid IPv4 address syntax";
        negative_weight: api_vip(r#"
[[vip.backend]]
address = "10.0.0.1"
weight = -1
"#), at Some("weight = -1"), "weight";
        jitter_of_the_wrong_type: format!(r#"{DAEMON}
[health_check]
jitter = true
"#), at Some("jitter"), "a fraction such as 0.1 or a percentage such as \"10%\"";
        duration_as_a_number: format!(r#"{DAEMON}
[health_check]
interval = 2
"#), at Some("interval"), "expected a string";
        unknown_guard_field: format!(r#"{DAEMON}
[guard]
rate_limit = 5
"#), at Some("rate_limit"), "unknown field `rate_limit`";
        insert_cap_as_a_number: format!(r#"{DAEMON}
[guard]
ct_insert_cap = 250000
"#), at Some("ct_insert_cap"), "expected a string";
        unknown_list_action: format!(r#"{DAEMON}
[[guard.deny]]
prefix = "192.0.2.7"
action = "reject"
"#), at Some("reject"), "unknown variant `reject`, expected `drop` or `reset`";
        list_entry_without_a_prefix: format!(r#"{DAEMON}
[[guard.allow]]
reason = "monitoring"
"#), at None, "missing field `prefix`";
        unknown_limit_field: format!(r#"{DAEMON}
[guard]
new_flows_per_source = {{ rate = "1/s", per = "s" }}
"#), at Some("new_flows_per_source"), "unknown field `per`";
        limit_without_a_rate: format!(r#"{DAEMON}
[guard]
new_flows_per_source = {{ burst = 10 }}
"#), at Some("new_flows_per_source"), "missing field `rate`";
        auto_block_without_above: format!(r#"{DAEMON}
[guard]
auto_block = {{ ttl = "1m" }}
"#), at Some("auto_block"), "missing field `above`";
        share_of_the_wrong_type: format!(r#"{DAEMON}
[guard]
source_alert = {{ share = true }}
"#), at Some("share"), "a fraction such as 0.5 or a percentage such as \"50%\"";
        unknown_vip_guard_field: api_with_backend(r#"
[vip.guard]
limit = 1
"#), at Some("limit = 1"), "unknown field `limit`";
    }
}
