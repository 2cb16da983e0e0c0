//! The answer to `status`: the daemon, its data plane, every VIP and every
//! backend, and the lookups that readers of a report (the CLI, the lab,
//! tests) share.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Answer to `status`: the daemon, its data plane and every VIP.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// Version of this schema: [`PROTOCOL_VERSION`](crate::PROTOCOL_VERSION).
    pub version: u32,
    /// `daemon.instance`: pins live under `/sys/fs/bpf/xlb/<instance>/`.
    pub instance: String,
    /// Interface the XDP program is attached to.
    pub interface: String,
    /// `"native"` or `"generic"` (`daemon.xdp_mode`).
    pub xdp_mode: String,
    /// When the daemon started, ms since the Unix epoch.
    pub started_unix_ms: u64,
    /// Whether the daemon took over the pinned maps (and so the flows and
    /// backend states) of a previous run at start, instead of starting empty.
    pub adopted: bool,
    /// The configuration file in use.
    pub config_path: String,
    /// Connection tracking table.
    pub conntrack: ConntrackStatus,
    /// Global data-plane counters since the maps were created, keyed by
    /// `lb_common::Stat::label()` (`fwd_tx`, `ct_hit`, `drop_no_backend`, ...).
    pub counters: BTreeMap<String, u64>,
    /// What the tables are built from (`xlb peers` compares nodes by it).
    #[serde(default)]
    pub fingerprint: crate::FingerprintStatus,
    /// `[cluster]`: this node's name and its peers.
    #[serde(default)]
    pub cluster: crate::ClusterStatus,
    /// While frames the data plane forwarded are dropped on transmit (the
    /// interfaces' TX drops grow with `fwd_tx`): the alarm's text; `null`
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_alarm: Option<String>,
    /// In configuration order.
    pub vips: Vec<VipStatus>,
    /// The hand-off to the BGP speaker; `null` without `[announce]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announce: Option<crate::AnnounceStatus>,
    /// The NAT flow maps and their sweep; absent without NAT VIPs. Boxed:
    /// most daemons have none, and `Response` keeps its variants small.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat: Option<Box<NatStatus>>,
}

/// Occupancy of the NAT flow maps (`mode = "nat"` VIPs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NatStatus {
    /// Flows in `XLB_NAT_FLOWS` (expired ones not yet swept included),
    /// counted every second off the main loop; `null` before the first
    /// walk.
    pub entries: Option<u64>,
    /// `daemon.nat_size`: beyond it new NAT flows are refused.
    pub capacity: u64,
    /// Expired flows the daemon's sweep deleted since it started.
    pub swept: u64,
    /// Reply keys left without their flow that the sweep deleted.
    pub orphans_swept: u64,
    /// Embryonic flows (a handshake the client has not completed, a UDP
    /// flow never answered) the sweep deleted while the map was over three
    /// quarters full, since it started.
    #[serde(default)]
    pub embryonic_swept: u64,
    /// New flows refused because no source port was free
    /// (`drop_nat_exhausted` + `reset_nat_exhausted`), since the maps
    /// were created.
    pub exhausted: u64,
}

/// A NAT VIP's translation, in its [`VipStatus`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VipNatStatus {
    /// `preserve_client = true`: destination NAT only.
    pub preserve_client: bool,
    /// Source pool addresses (empty with `preserve_client`).
    pub snat: Vec<String>,
    /// Allocated source ports, `"MIN-MAX"`.
    pub snat_ports: String,
    /// Unexpired NAT flows of the VIP; `null` before the first walk.
    pub flows: Option<u64>,
    /// Those of `flows` still embryonic: a TCP handshake the client has not
    /// completed, or a UDP flow never answered. They give their port up to
    /// a new flow that finds none free. `null` before the first walk.
    #[serde(default)]
    pub embryonic: Option<u64>,
    /// Flows the pool can hold to one backend port at once: addresses ×
    /// ports (each backend has its own; 0 with `preserve_client`).
    pub ports_per_backend: u64,
}

/// Occupancy of the connection tracking table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConntrackStatus {
    /// Entries in the table (including idle ones the LRU has not evicted),
    /// counted every 10 s off the daemon's main loop: walking a million keys
    /// takes a syscall each.
    pub entries: u64,
    /// `daemon.conntrack_size`.
    pub capacity: u64,
    /// Established flows among `entries` (a packet in the last 30 s, UDP:
    /// within `udp_timeout`; closing ones not counted), from the same walk:
    /// what the fill alarms watch. `null` before the first walk.
    #[serde(default)]
    pub established: Option<u64>,
}

/// One VIP in a [`StatusReport`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VipStatus {
    /// VIP name, as in the configuration.
    pub name: String,
    /// VIP address, e.g. `"10.100.0.1"` or `"2001:db8::100"`.
    pub address: String,
    pub port: u16,
    /// `"tcp"` or `"udp"`.
    pub protocol: String,
    /// `"dsr-ipip"`, `"dsr-l2"` or `"nat"`.
    pub mode: String,
    /// `"rehash"` or `"keep"`.
    pub down_policy: String,
    /// `vip.second_chance`: packets that miss conntrack also name their
    /// slot's previous owner (see the README, "Second chance").
    #[serde(default)]
    pub second_chance: bool,
    /// Maglev table size (slots).
    pub table_size: u32,
    /// Fingerprint of this VIP's table inputs, without the hash key (16
    /// hex digits; empty from an older daemon).
    #[serde(default)]
    pub fingerprint: String,
    /// Backends in the table (taking new flows).
    pub backends_up: u32,
    /// Backends configured.
    pub backends_total: u32,
    /// Forwarded packets per second over the last 1 s sample.
    pub packets_per_sec: f64,
    /// Flows given a backend from the table per second (last 1 s sample).
    pub new_flows_per_sec: f64,
    /// Packets forwarded since the maps were created, read when the status
    /// was asked for.
    pub packets: u64,
    /// Bytes forwarded (frame length as received).
    pub bytes: u64,
    /// Flows given a backend from the table.
    pub new_flows: u64,
    /// Whether the VIP is in panic: fewer than `min_healthy` backends were
    /// healthy, so the least-bad failing ones were kept in the table.
    #[serde(default)]
    pub panic: bool,
    /// Which backends panic kept and why; `null` outside panic.
    #[serde(default)]
    pub panic_reason: Option<String>,
    /// Set while at least half of the backends answer slower than their
    /// timeout (e.g. `"all 3 backends slow, median 2.5s; not ejecting …"`).
    #[serde(default)]
    pub fleet_slow: Option<String>,
    /// Backends out of the table as slow outliers now.
    #[serde(default)]
    pub ejected_slow: u32,
    /// Most backends that may be out as slow outliers at once (resolved
    /// from `max_ejected`).
    #[serde(default)]
    pub max_ejected: u32,
    /// Fewest backends in the table before panic (resolved from
    /// `min_healthy`; 0 = panic disabled).
    #[serde(default)]
    pub min_healthy: u32,
    /// The deadline its `timeout = "auto"` checks use now, ms (the 95th
    /// percentile of recent answers × 3, within bounds); `null` if none is
    /// automatic or before the first tick.
    #[serde(default)]
    pub auto_timeout_ms: Option<f64>,
    /// `mode = "nat"`: its pool and flows; absent for DSR VIPs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat: Option<VipNatStatus>,
    /// In configuration order.
    pub backends: Vec<BackendStatus>,
    /// Its announce state and why; absent from daemons that predate it.
    #[serde(default)]
    pub announce: Option<crate::VipAnnounce>,
}

/// Every value of [`BackendStatus::placement`], as spelled in JSON:
/// - `serving`: in the table with its weight;
/// - `ramping`: in the table, weight ramping up (slow start);
/// - `ejected_slow`: out, a slow outlier against its peers (flows continue);
/// - `down`: out, failing health checks (flows follow `down_policy`);
/// - `held_down`: out, passing probes but flapping (flows continue);
/// - `panic_restored`: in the table although failing, kept by panic;
/// - `draining`: out, drained by an operator;
/// - `unknown`: not probed yet;
/// - `agent_down`: out, its agent says `down`/`fail`/`stopped` (flows
///   follow `down_policy`);
/// - `agent_drain`: out, its agent says `drain` or 0 % (flows continue);
/// - `agent_maint`: out, its agent says `maint` (flows continue).
pub const PLACEMENTS: [&str; 11] = [
    "serving",
    "ramping",
    "ejected_slow",
    "down",
    "held_down",
    "panic_restored",
    "draining",
    "unknown",
    "agent_down",
    "agent_drain",
    "agent_maint",
];

/// Every value of [`BackendStatus::state`], as spelled in JSON:
/// - `up`: in the table, takes new flows;
/// - `down`: out of the table, its flows follow the VIP's `down_policy`;
/// - `draining`: out of the table, its existing flows continue;
/// - `unknown`: not probed yet, takes no new flows.
pub const BACKEND_STATES: [&str; 4] = ["up", "down", "draining", "unknown"];

/// One backend of a [`VipStatus`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BackendStatus {
    /// `"ip:port"`, or `"[v6]:port"`.
    pub address: String,
    /// Weight; 0 = no new flows. The configured one, unless `xlb weight`
    /// overrides it (then `configured_weight` says what the file has).
    pub weight: u32,
    /// The configuration's weight while `xlb weight` overrides it (then
    /// `weight` is the override); `null` without an override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configured_weight: Option<u32>,
    /// What the data plane does with it: one of [`BACKEND_STATES`].
    pub state: String,
    /// What health checks say, regardless of drains: `"up"`, `"down"` or
    /// `"unknown"` (not probed yet).
    pub health: String,
    /// Drained with `xlb drain` (until `xlb enable`).
    pub admin_drained: bool,
    /// Whether it holds slots in the VIP's Maglev table now.
    pub in_table: bool,
    /// When it entered `state`, ms since the Unix epoch.
    pub since_unix_ms: u64,
    /// Why the last state change happened; `null` before the first.
    pub last_transition_reason: Option<String>,
    /// The latest health probe; `null` before the first.
    pub last_probe: Option<ProbeStatus>,
    /// Consecutive passed probes (0 after a failure).
    pub consecutive_ok: u32,
    /// Consecutive failed probes (0 after a success).
    pub consecutive_fail: u32,
    /// Flows given to it from the table per second (last 1 s sample).
    pub new_flows_per_sec: f64,
    /// Packets forwarded to it per second (last 1 s sample).
    pub packets_per_sec: f64,
    /// Packets forwarded to it since it was added.
    pub packets: u64,
    /// Bytes forwarded to it (frame length as received).
    pub bytes: u64,
    /// Flows given to it from the table.
    pub new_flows: u64,
    /// What the VIP's health policy does with it: one of [`PLACEMENTS`].
    #[serde(default)]
    pub placement: String,
    /// Why (for every placement but `serving`).
    #[serde(default)]
    pub placement_reason: Option<String>,
    /// Weight in the table now: `weight` while serving, less while ramping
    /// up (slow start), 0 when out.
    #[serde(default)]
    pub effective_weight: f64,
    /// Consecutive probes slower than `timeout` (answered late or not yet).
    #[serde(default)]
    pub consecutive_slow: u32,
    /// Probe latency now, ms: over the current slow streak if any, else the
    /// median of the recent answers. `null` before the first answer.
    #[serde(default)]
    pub latency_ms: Option<f64>,
    /// Probes that failed for the load balancer's own reason (out of
    /// descriptors or buffers, no route from this host); never counted
    /// against the backend.
    #[serde(default)]
    pub probe_local_errors: u64,
    /// Established flows it holds: conntrack entries that carried a packet
    /// in the last 30 s (UDP: within `udp_timeout`), from the periodic walk
    /// of the table (every 10 s, every 2 s while a drain has a deadline or
    /// is watched); `null` before the first walk.
    pub flows: Option<u64>,
    /// Established flows above which an `alarm` event says it may run out of
    /// connection slots (`max_flows`); `null` = no such alarm.
    #[serde(default)]
    pub max_flows: Option<u64>,
    /// When its drain's deadline passes (or passed), ms since the Unix
    /// epoch: then it becomes `down` and its remaining flows follow the
    /// VIP's `down_policy`. `null` = not draining, or no deadline.
    pub drain_deadline_unix_ms: Option<u64>,
    /// What its agent says (`agent_port`); `null` without one, or before
    /// its first poll.
    #[serde(default)]
    pub agent: Option<crate::AgentStatus>,
    /// What its real traffic says (passive detection, NAT VIPs with it
    /// on); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passive: Option<crate::PassiveStatus>,
}

/// The outcome of one health probe.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeStatus {
    /// Whether it passed.
    pub ok: bool,
    /// For the operator: `"ok"` (possibly with the status, `"ok 200"`), or
    /// why it failed, e.g. `"connection refused"`.
    pub reason: String,
    /// Stable identifier: `"ok"`, or a failure code such as
    /// `"connection_refused"`, `"no_response"`, `"unexpected_status"`.
    pub code: String,
    /// The HTTP status, when a response was parsed.
    pub status: Option<u16>,
    /// How long the probe took, ms.
    pub latency_ms: f64,
    /// When it finished, ms since the Unix epoch.
    pub at_unix_ms: u64,
}

impl StatusReport {
    /// VIP `name`.
    pub fn vip(&self, name: &str) -> Option<&VipStatus> {
        self.vips.iter().find(|v| v.name == name)
    }

    /// Backend `addr` of VIP `vip`; `addr` as xlb spells it (`ip:port`,
    /// `[v6]:port`): a `SocketAddr` or a string.
    pub fn backend(&self, vip: &str, addr: impl fmt::Display) -> Option<&BackendStatus> {
        let addr = addr.to_string();
        self.vip(vip)?.backends.iter().find(|b| b.address == addr)
    }

    /// Whether there is a VIP and every backend of every VIP is `up`.
    pub fn all_up(&self) -> bool {
        !self.vips.is_empty()
            && self
                .vips
                .iter()
                .all(|v| v.backends.iter().all(|b| b.state == "up"))
    }

    /// Every backend's state on one line, for messages:
    /// `api/10.99.0.11:80=draining(ejected_slow) api/10.99.0.12:80=up api:panic`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        for v in &self.vips {
            for b in &v.backends {
                // The placement says more than the state when it differs
                // (`draining` may be an ejection or a damping hold).
                if b.placement.is_empty() || b.placement == b.state {
                    parts.push(format!("{}/{}={}", v.name, b.address, b.state));
                } else {
                    parts.push(format!(
                        "{}/{}={}({})",
                        v.name, b.address, b.state, b.placement
                    ));
                }
            }
            if v.panic {
                parts.push(format!("{}:panic", v.name));
            }
        }
        if parts.is_empty() {
            "no VIPs".to_owned()
        } else {
            parts.join(" ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn backend(address: &str, state: &str, placement: &str) -> BackendStatus {
        BackendStatus {
            address: address.to_owned(),
            state: state.to_owned(),
            placement: placement.to_owned(),
            ..BackendStatus::default()
        }
    }

    fn report(panic: bool, backends: Vec<BackendStatus>) -> StatusReport {
        StatusReport {
            vips: vec![VipStatus {
                name: "api".to_owned(),
                panic,
                backends,
                ..VipStatus::default()
            }],
            ..StatusReport::default()
        }
    }

    #[test]
    fn lookups_find_vips_and_backends_by_name_and_address() {
        let r = report(
            false,
            vec![
                backend("10.99.0.11:80", "up", "serving"),
                backend("[fd00:99::12]:80", "down", "down"),
            ],
        );
        let v6: SocketAddr = "[fd00:99::12]:80".parse().unwrap();
        assert_eq!(r.vip("api").map(|v| v.backends.len()), Some(2));
        assert!(r.vip("web").is_none());
        assert_eq!(r.backend("api", v6).unwrap().state, "down");
        assert_eq!(r.backend("api", "10.99.0.11:80").unwrap().state, "up");
        assert!(r.backend("api", "10.99.0.13:80").is_none());
        assert!(r.backend("web", v6).is_none());
    }

    #[test]
    fn all_up_needs_a_vip_and_every_backend_up() {
        let cases = [
            ("no VIP", StatusReport::default(), false),
            ("a VIP without backends", report(false, vec![]), true),
            (
                "every backend up",
                report(false, vec![backend("10.99.0.11:80", "up", "serving")]),
                true,
            ),
            (
                "one draining",
                report(
                    false,
                    vec![
                        backend("10.99.0.11:80", "up", "serving"),
                        backend("10.99.0.12:80", "draining", "draining"),
                    ],
                ),
                false,
            ),
        ];
        for (name, r, want) in cases {
            assert_eq!(r.all_up(), want, "{name}");
        }
    }

    #[test]
    fn summary_shows_placements_that_say_more_and_panic() {
        let cases = [
            ("no VIP", StatusReport::default(), "no VIPs"),
            (
                "placement differs",
                report(
                    true,
                    vec![
                        backend("10.99.0.11:80", "draining", "ejected_slow"),
                        backend("10.99.0.12:80", "up", ""),
                    ],
                ),
                "api/10.99.0.11:80=draining(ejected_slow) api/10.99.0.12:80=up api:panic",
            ),
            (
                "placement as state",
                report(false, vec![backend("10.99.0.12:80", "down", "down")]),
                "api/10.99.0.12:80=down",
            ),
        ];
        for (name, r, want) in cases {
            assert_eq!(r.summary(), want, "{name}");
        }
    }
}
