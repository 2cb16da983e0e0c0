//! The control protocol: how `xlb status`, `xlb drain` and friends talk to a
//! running daemon.
//!
//! A Unix stream socket (default `/run/xlb/xlb.sock`) carries one JSON object
//! per line each way: a [`Request`] from the client, a [`Response`] from the
//! daemon, on the same connection as many times as the client likes. `events`
//! with `follow` turns the connection into a stream of [`Response::Event`]
//! lines that ends when the client closes it.
//!
//! Every line carries `"version": 1` ([`PROTOCOL_VERSION`]):
//!
//! ```text
//! → {"version":1,"command":"drain","vip":"api","backend":"10.99.0.12:80"}
//! ← {"version":1,"response":"ok","data":{"message":"drained 10.99.0.12:80 of vip api"}}
//! ```
//!
//! The types below are also the `--json` output of the CLI, so their field
//! names and spellings are a stable interface: add fields, never rename or
//! remove one without bumping [`PROTOCOL_VERSION`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::Protocol;
use crate::health::probe::ProbeResult;

mod client;
mod server;

pub use client::{CONNECT_TIMEOUT, Client, REQUEST_TIMEOUT, request};
pub use server::{
    Handler, HandlerFuture, IDLE_TIMEOUT, MAX_CONNECTIONS, MAX_LINE, WRITE_TIMEOUT, bind, serve,
};

/// Version of the wire format and of every type in this module. A daemon
/// answers a request of another version with an [`Response::Error`] naming
/// the versions it supports.
pub const PROTOCOL_VERSION: u32 = 1;

/// Versions this build accepts.
pub const SUPPORTED_VERSIONS: &[u32] = &[PROTOCOL_VERSION];

/// The `command` of every [`Request`], as spelled on the wire.
pub const COMMANDS: &[&str] = &["status", "events", "explain", "drain", "enable", "reload"];

/// An example request, quoted in error messages about malformed ones.
const EXAMPLE_REQUEST: &str = r#"{"version":1,"command":"status"}"#;

/// What a client asks the daemon. On the wire the variant is the `command`
/// field, next to `version`: `{"version":1,"command":"events","follow":true}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Everything about the daemon, its VIPs and backends: a [`StatusReport`].
    Status,
    /// Recent events (state changes, table rebuilds, admin actions, reloads):
    /// [`Response::Events`]. With `follow`, the events retained so far and
    /// then each new one as it happens, one [`Response::Event`] per line,
    /// until the client closes the connection.
    Events {
        /// Only events with `seq` greater than this (the `seq` of the last
        /// event the client saw); `null` = every event the daemon retains.
        #[serde(default)]
        since_seq: Option<u64>,
        /// Keep the connection open and stream new events.
        #[serde(default)]
        follow: bool,
    },
    /// Which backend a flow goes to, and why: an [`ExplainReport`].
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
}

impl Request {
    /// Whether the request changes the daemon's state (to be logged with who
    /// asked, and refused by read-only front ends).
    pub fn is_mutating(&self) -> bool {
        match self {
            Request::Status | Request::Events { .. } | Request::Explain { .. } => false,
            Request::Drain { .. } | Request::Enable { .. } | Request::Reload => true,
        }
    }

    /// The request as one line of the wire format, newline included.
    pub fn to_line(&self) -> String {
        to_line(self)
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
        }
    }
}

/// What the daemon answers. On the wire the variant is the `response` field
/// and its content is `data`:
/// `{"version":1,"response":"error","data":{"message":"..."}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "response", content = "data", rename_all = "snake_case")]
pub enum Response {
    /// Answer to `status`.
    Status(StatusReport),
    /// Answer to `events` without `follow`, oldest first.
    Events(Vec<Event>),
    /// One event of an `events` stream (`follow`).
    Event(Event),
    /// Answer to `explain`.
    Explain(ExplainReport),
    /// A change was made (`drain`, `enable`, `reload`).
    Ok {
        /// What was done, for the operator.
        message: String,
    },
    /// The request failed or was not understood; nothing changed.
    Error {
        /// What was wrong and what to do, for the operator.
        message: String,
    },
}

impl Response {
    /// An [`Response::Error`] with `message`.
    pub fn error(message: impl Into<String>) -> Self {
        Response::Error {
            message: message.into(),
        }
    }

    /// An [`Response::Ok`] with `message`.
    pub fn ok(message: impl Into<String>) -> Self {
        Response::Ok {
            message: message.into(),
        }
    }

    /// The response as one line of the wire format, newline included.
    pub fn to_line(&self) -> String {
        to_line(self)
    }
}

/// Answer to `status`: the daemon, its data plane and every VIP.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// Version of this schema: [`PROTOCOL_VERSION`].
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
    /// In configuration order.
    pub vips: Vec<VipStatus>,
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
}

/// One VIP in a [`StatusReport`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VipStatus {
    /// VIP name, as in the configuration.
    pub name: String,
    /// VIP address, e.g. `"10.100.0.1"` or `"2001:db8::100"`.
    pub address: String,
    pub port: u16,
    /// `"tcp"` or `"udp"`.
    pub protocol: String,
    /// `"dsr-ipip"` or `"dsr-l2"`.
    pub mode: String,
    /// `"rehash"` or `"keep"`.
    pub down_policy: String,
    /// Maglev table size (slots).
    pub table_size: u32,
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
    /// In configuration order.
    pub backends: Vec<BackendStatus>,
}

/// Every value of [`BackendStatus::placement`], as spelled in JSON:
/// - `serving`: in the table with its weight;
/// - `ramping`: in the table, weight ramping up (slow start);
/// - `ejected_slow`: out, a slow outlier against its peers (flows continue);
/// - `down`: out, failing health checks (flows follow `down_policy`);
/// - `held_down`: out, passing probes but flapping (flows continue);
/// - `panic_restored`: in the table although failing, kept by panic;
/// - `draining`: out, drained by an operator;
/// - `unknown`: not probed yet.
pub const PLACEMENTS: [&str; 8] = [
    "serving",
    "ramping",
    "ejected_slow",
    "down",
    "held_down",
    "panic_restored",
    "draining",
    "unknown",
];

/// Every value of [`BackendStatus::state`], as spelled in JSON:
/// - `up`: in the table, takes new flows;
/// - `down`: out of the table, its flows follow the VIP's `down_policy`;
/// - `draining`: out of the table, its existing flows continue;
/// - `unknown`: not probed yet, takes no new flows.
pub const BACKEND_STATES: [&str; 4] = ["up", "down", "draining", "unknown"];

/// One backend of a [`VipStatus`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackendStatus {
    /// `"ip:port"`, or `"[v6]:port"`.
    pub address: String,
    /// Configured weight; 0 = no new flows.
    pub weight: u32,
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
    /// When its drain's deadline passes (or passed), ms since the Unix
    /// epoch: then it becomes `down` and its remaining flows follow the
    /// VIP's `down_policy`. `null` = not draining, or no deadline.
    pub drain_deadline_unix_ms: Option<u64>,
}

/// The outcome of one health probe.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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

impl ProbeStatus {
    /// The status of probe `result`, finished at `at_unix_ms`.
    pub fn from_result(result: &ProbeResult, at_unix_ms: u64) -> Self {
        let (ok, reason, code, status) = match &result.outcome {
            Ok(ok) => (true, "ok".to_owned(), "ok".to_owned(), ok.status),
            Err(fail) => {
                let status = match fail {
                    crate::health::probe::FailReason::UnexpectedStatus { status } => Some(*status),
                    _ => None,
                };
                (false, fail.to_string(), fail.code().to_owned(), status)
            }
        };
        ProbeStatus {
            ok,
            reason,
            code,
            status,
            latency_ms: result.latency.as_secs_f64() * 1000.0,
            at_unix_ms,
        }
    }
}

/// Every value of [`Event::kind`], as spelled in JSON:
/// - `transition`: a backend changed state (health or data plane);
/// - `table`: a VIP's Maglev table was rebuilt;
/// - `admin`: an operator drained or enabled a backend;
/// - `reload`: the configuration was reloaded;
/// - `start`: the daemon started;
/// - `drain`: a drain's deadline passed (the backend went `down`);
/// - `panic`: a VIP entered (`to` = `panic`) or left (`to` = `normal`) panic;
/// - `fleet_slow`: at least half of a VIP's backends became slow (`to` =
///   `slow`), or recovered (`to` = `normal`);
/// - `alarm`: a probe failed for the load balancer's own reason.
pub const EVENT_KINDS: [&str; 9] = [
    "transition",
    "table",
    "admin",
    "reload",
    "start",
    "drain",
    "panic",
    "fleet_slow",
    "alarm",
];

/// Something that happened in the daemon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Increases by one per event, from 1 at daemon start.
    pub seq: u64,
    /// When it happened, ms since the Unix epoch.
    pub at_unix_ms: u64,
    /// One of [`EVENT_KINDS`].
    pub kind: String,
    /// VIP name, if about one VIP.
    pub vip: Option<String>,
    /// `"ip:port"` of the backend, if about one backend.
    pub backend: Option<String>,
    /// Previous state (`"up"`, `"down"`, `"draining"`, `"unknown"`), for
    /// `transition` and `admin` events.
    pub from: Option<String>,
    /// New state.
    pub to: Option<String>,
    /// Why, for the operator, e.g. `"connected, no HTTP response within 1s"`.
    pub reason: String,
    /// How long the table rebuild this caused took, µs.
    pub table_build_us: Option<u64>,
    /// How many table slots changed backend.
    pub table_slots_changed: Option<u32>,
}

/// Every value of [`ExplainReport::via`], as spelled in JSON:
/// - `conntrack`: an existing conntrack entry;
/// - `table`: the VIP's Maglev table (a new flow, or no usable entry);
/// - `none`: no backend, the table slot is empty: the packet is dropped.
pub const VIA: [&str; 3] = ["conntrack", "table", "none"];

/// Answer to `explain`: the backend a flow goes to and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExplainReport {
    /// `"tcp"` or `"udp"`.
    pub protocol: String,
    /// The client's address and port.
    pub client: String,
    /// The VIP's address and port.
    pub vip: String,
    /// The VIP's name.
    pub vip_name: String,
    /// `"ip:port"` of the backend packets of this flow go to; `null` =
    /// dropped (no backend).
    pub backend: Option<String>,
    /// Where that choice comes from: one of [`VIA`].
    pub via: String,
    /// The flow's slot in the Maglev table (also shown for conntrack hits).
    pub slot: Option<u32>,
    /// The VIP's table size.
    pub table_size: u32,
    /// The keyed flow hash, 16 hex digits.
    pub flow_hash: String,
    /// State of `backend`: one of [`BACKEND_STATES`].
    pub backend_state: Option<String>,
    /// One sentence for the operator: why this backend.
    pub detail: String,
}

/// A flow hash as shown in [`ExplainReport::flow_hash`].
pub fn flow_hash_hex(hash: u64) -> String {
    format!("{hash:016x}")
}

/// Now, ms since the Unix epoch.
pub fn now_unix_ms() -> u64 {
    unix_ms(SystemTime::now())
}

/// `t` as ms since the Unix epoch (0 before it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `{"version":1, ...body}` plus a newline. The version goes first so a
/// human reading the socket with `socat` sees it at once.
fn to_line<T: Serialize>(body: &T) -> String {
    #[derive(Serialize)]
    struct Envelope<'a, T> {
        version: u32,
        #[serde(flatten)]
        body: &'a T,
    }
    let mut line = serde_json::to_string(&Envelope {
        version: PROTOCOL_VERSION,
        body,
    })
    // Every type here is plain data with string keys: serialization cannot fail.
    .expect("protocol types serialize to JSON");
    line.push('\n');
    line
}

/// Parses one request line. The error is the message sent back: what was
/// wrong (with the column of a JSON syntax error) and how a request looks.
pub fn parse_request(line: &[u8]) -> Result<Request, String> {
    let map = envelope(line, "request", "daemon")?;
    if let Some(command) = map.get("command") {
        match command.as_str() {
            Some(c) if COMMANDS.contains(&c) => {}
            Some(c) => {
                return Err(format!(
                    "unknown command {c:?}; this daemon knows {}",
                    COMMANDS.join(", ")
                ));
            }
            None => return Err(format!("\"command\" must be a string, got {command}")),
        }
    }
    serde_json::from_value(Value::Object(map))
        .map_err(|e| format!("bad request: {e}; e.g. {EXAMPLE_REQUEST}"))
}

/// Parses one response line.
pub fn parse_response(line: &[u8]) -> Result<Response, String> {
    let map = envelope(line, "response", "xlb CLI")?;
    serde_json::from_value(Value::Object(map)).map_err(|e| format!("bad response: {e}"))
}

/// Checks the JSON syntax and version of a line and returns its other fields.
/// `what` is "request" or "response"; `us` is who is checking.
fn envelope(line: &[u8], what: &str, us: &str) -> Result<serde_json::Map<String, Value>, String> {
    let value: Value = serde_json::from_slice(line).map_err(|e| {
        format!("malformed {what}: {e}; send one JSON object per line, e.g. {EXAMPLE_REQUEST}")
    })?;
    let Value::Object(mut map) = value else {
        return Err(format!(
            "malformed {what}: expected a JSON object, got {}; e.g. {EXAMPLE_REQUEST}",
            json_type(&value)
        ));
    };
    let supported = SUPPORTED_VERSIONS
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    match map.remove("version") {
        None => Err(format!(
            "{what} has no \"version\"; this {us} supports protocol version {supported}: \
             add \"version\":{PROTOCOL_VERSION}"
        )),
        Some(v)
            if v.as_u64()
                .is_some_and(|v| SUPPORTED_VERSIONS.iter().any(|&s| u64::from(s) == v)) =>
        {
            Ok(map)
        }
        Some(v) => Err(format!(
            "unsupported protocol version {v}: this {us} ({}) supports version {supported}; \
             use the xlb CLI and daemon of the same release",
            env!("CARGO_PKG_VERSION")
        )),
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Errors of the control socket, on either end.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error(
        "no xlb daemon listening on {}: is `xlb run` running? (--socket to choose another)",
        path.display()
    )]
    NotRunning { path: PathBuf },
    #[error(
        "permission denied on {}: run as root, or as a member of the daemon's socket_group",
        path.display()
    )]
    PermissionDenied { path: PathBuf },
    #[error(
        "another xlb is running on {}; stop it, or give this one another daemon.control_socket",
        path.display()
    )]
    AlreadyRunning { path: PathBuf },
    #[error(
        "{} exists and is not a socket; remove it, or set daemon.control_socket to another path",
        path.display()
    )]
    NotASocket { path: PathBuf },
    #[error(
        "socket_group {group:?} does not exist; create it (groupadd {group}), or remove \
         daemon.socket_group to keep the control socket root-only"
    )]
    NoSuchGroup { group: String },
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done, e.g. "connecting to".
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the xlb daemon on {} did not answer within {}s", path.display(), timeout.as_secs())]
    Timeout {
        path: PathBuf,
        timeout: std::time::Duration,
    },
    #[error("the xlb daemon on {} closed the connection without answering", path.display())]
    Closed { path: PathBuf },
    #[error("the xlb daemon on {} sent a bad response: {reason}", path.display())]
    BadResponse { path: PathBuf, reason: String },
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::health::probe::{FailReason, ProbeOk};
    use std::time::Duration;

    /// A report with one VIP of three backends in different states, used by
    /// the CLI and metrics tests too.
    pub(crate) fn sample_report() -> StatusReport {
        let backend = |addr: &str, state: &str, health: &str, drained, in_table| BackendStatus {
            address: addr.to_owned(),
            weight: 1,
            state: state.to_owned(),
            health: health.to_owned(),
            admin_drained: drained,
            in_table,
            since_unix_ms: 0,
            last_transition_reason: None,
            last_probe: None,
            consecutive_ok: 0,
            consecutive_fail: 0,
            new_flows_per_sec: 0.0,
            packets_per_sec: 0.0,
            packets: 0,
            bytes: 0,
            new_flows: 0,
            placement: match state {
                "up" => "serving",
                other => other,
            }
            .to_owned(),
            placement_reason: None,
            effective_weight: if in_table { 1.0 } else { 0.0 },
            consecutive_slow: 0,
            latency_ms: Some(1.0),
            probe_local_errors: 0,
            flows: None,
            drain_deadline_unix_ms: None,
        };
        let now = 1_800_000_000_000;
        StatusReport {
            version: PROTOCOL_VERSION,
            instance: "default".to_owned(),
            interface: "eth0".to_owned(),
            xdp_mode: "native".to_owned(),
            started_unix_ms: now - 3 * 3600 * 1000 - 120_000,
            adopted: true,
            config_path: "/etc/xlb/xlb.toml".into(),
            conntrack: ConntrackStatus {
                entries: 1234,
                capacity: 1_048_576,
            },
            counters: lb_common::Stat::ALL
                .iter()
                .enumerate()
                .map(|(i, s)| (s.label().to_owned(), i as u64 * 10))
                .collect(),
            vips: vec![VipStatus {
                name: "api".to_owned(),
                address: "10.100.0.1".to_owned(),
                port: 80,
                protocol: "tcp".to_owned(),
                mode: "dsr-ipip".to_owned(),
                down_policy: "rehash".to_owned(),
                table_size: 65537,
                backends_up: 2,
                backends_total: 3,
                packets_per_sec: 1234.0,
                new_flows_per_sec: 35.0,
                packets: 1_000_000,
                bytes: 900_000_000,
                new_flows: 50_000,
                panic: false,
                panic_reason: None,
                fleet_slow: None,
                ejected_slow: 0,
                max_ejected: 1,
                min_healthy: 1,
                auto_timeout_ms: None,
                backends: vec![
                    BackendStatus {
                        since_unix_ms: now - (12 * 60 + 4) * 1000,
                        last_transition_reason: Some("passed 2 consecutive checks".to_owned()),
                        last_probe: Some(ProbeStatus {
                            ok: true,
                            reason: "ok".to_owned(),
                            code: "ok".to_owned(),
                            status: Some(200),
                            latency_ms: 1.2,
                            at_unix_ms: now - 500,
                        }),
                        consecutive_ok: 41,
                        flows: Some(3712),
                        new_flows_per_sec: 12.0,
                        packets_per_sec: 400.0,
                        packets: 600_000,
                        bytes: 500_000_000,
                        new_flows: 30_000,
                        ..backend("10.99.0.11:80", "up", "up", false, true)
                    },
                    BackendStatus {
                        since_unix_ms: now - 35_000,
                        last_transition_reason: Some(
                            "connected, no HTTP response within 1s".to_owned(),
                        ),
                        last_probe: Some(ProbeStatus {
                            ok: false,
                            reason: "connected, no HTTP response within 1s".to_owned(),
                            code: "no_response".to_owned(),
                            status: None,
                            latency_ms: 1000.4,
                            at_unix_ms: now - 1500,
                        }),
                        consecutive_fail: 7,
                        packets: 400_000,
                        bytes: 400_000_000,
                        new_flows: 20_000,
                        ..backend("10.99.0.12:80", "down", "down", false, false)
                    },
                    BackendStatus {
                        weight: 2,
                        since_unix_ms: now - 120_000,
                        last_transition_reason: Some("drained by an operator".to_owned()),
                        last_probe: Some(ProbeStatus {
                            ok: true,
                            reason: "ok".to_owned(),
                            code: "ok".to_owned(),
                            status: Some(200),
                            latency_ms: 0.9,
                            at_unix_ms: now - 700,
                        }),
                        consecutive_ok: 60,
                        packets_per_sec: 834.0,
                        flows: Some(37),
                        drain_deadline_unix_ms: Some(now + 240_000),
                        ..backend("10.99.0.13:80", "draining", "up", true, false)
                    },
                ],
            }],
        }
    }

    pub(crate) const SAMPLE_NOW_MS: u64 = 1_800_000_000_000;

    pub(crate) fn sample_event(seq: u64) -> Event {
        Event {
            seq,
            at_unix_ms: 1_796_000_000_000 + seq,
            kind: "transition".to_owned(),
            vip: Some("api".to_owned()),
            backend: Some("10.99.0.12:80".to_owned()),
            from: Some("up".to_owned()),
            to: Some("down".to_owned()),
            reason: "connected, no HTTP response within 1s".to_owned(),
            table_build_us: Some(400),
            table_slots_changed: Some(1312),
        }
    }

    fn sample_explain() -> ExplainReport {
        ExplainReport {
            protocol: "tcp".to_owned(),
            client: "192.0.2.10:51234".to_owned(),
            vip: "10.100.0.1:80".to_owned(),
            vip_name: "api".to_owned(),
            backend: Some("10.99.0.11:80".to_owned()),
            via: "table".to_owned(),
            slot: Some(4242),
            table_size: 65537,
            flow_hash: flow_hash_hex(0x0123_4567_89ab_cdef),
            backend_state: Some("up".to_owned()),
            detail: "no conntrack entry; slot 4242 of the table holds 10.99.0.11:80".to_owned(),
        }
    }

    #[test]
    fn requests_round_trip() {
        let cases = [
            (
                "status",
                Request::Status,
                r#"{"version":1,"command":"status"}"#,
            ),
            (
                "events",
                Request::Events {
                    since_seq: Some(7),
                    follow: true,
                },
                r#"{"version":1,"command":"events","since_seq":7,"follow":true}"#,
            ),
            (
                "explain v6",
                Request::Explain {
                    protocol: Protocol::Udp,
                    client: "[2001:db8::1]:5353".parse().unwrap(),
                    vip: "[2001:db8::100]:53".parse().unwrap(),
                },
                r#"{"version":1,"command":"explain","protocol":"udp","client":"[2001:db8::1]:5353","vip":"[2001:db8::100]:53"}"#,
            ),
            (
                "drain",
                Request::Drain {
                    vip: "api".to_owned(),
                    backend: "10.99.0.12:80".to_owned(),
                    deadline_ms: None,
                },
                r#"{"version":1,"command":"drain","vip":"api","backend":"10.99.0.12:80"}"#,
            ),
            (
                "drain with a deadline",
                Request::Drain {
                    vip: "api".to_owned(),
                    backend: "10.99.0.12:80".to_owned(),
                    deadline_ms: Some(300_000),
                },
                r#"{"version":1,"command":"drain","vip":"api","backend":"10.99.0.12:80","deadline_ms":300000}"#,
            ),
            (
                "enable",
                Request::Enable {
                    vip: "api".to_owned(),
                    backend: "[fd00::2]:80".to_owned(),
                },
                r#"{"version":1,"command":"enable","vip":"api","backend":"[fd00::2]:80"}"#,
            ),
            (
                "reload",
                Request::Reload,
                r#"{"version":1,"command":"reload"}"#,
            ),
        ];
        for (name, req, wire) in cases {
            let line = req.to_line();
            assert_eq!(line, format!("{wire}\n"), "{name}");
            assert_eq!(parse_request(line.as_bytes()), Ok(req), "{name}");
        }
    }

    #[test]
    fn every_command_is_listed() {
        let reqs = [
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
        ];
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
        assert_eq!(mutating, [false, false, false, true, true, true]);
    }

    #[test]
    fn events_defaults() {
        assert_eq!(
            parse_request(br#"{"version":1,"command":"events"}"#),
            Ok(Request::Events {
                since_seq: None,
                follow: false
            })
        );
    }

    #[test]
    fn responses_round_trip() {
        let cases = [
            ("status", Response::Status(sample_report())),
            (
                "events",
                Response::Events(vec![sample_event(1), sample_event(2)]),
            ),
            ("event", Response::Event(sample_event(3))),
            ("explain", Response::Explain(sample_explain())),
            ("ok", Response::ok("drained")),
            ("error", Response::error("no such vip")),
        ];
        for (name, resp) in cases {
            let line = resp.to_line();
            assert!(
                line.ends_with('\n') && !line[..line.len() - 1].contains('\n'),
                "{name}"
            );
            assert!(
                line.starts_with(r#"{"version":1,"response":""#),
                "{name}: {line}"
            );
            assert_eq!(parse_response(line.as_bytes()), Ok(resp), "{name}");
        }
        assert_eq!(
            Response::error("no such vip").to_line(),
            "{\"version\":1,\"response\":\"error\",\"data\":{\"message\":\"no such vip\"}}\n"
        );
    }

    /// Pins the `StatusReport` schema (the `xlb status --json` output): every
    /// key, its JSON type and spelling.
    #[test]
    fn status_report_schema() {
        use serde_json::json;
        let v = serde_json::to_value(sample_report()).unwrap();
        let keys = |v: &Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(
            keys(&v),
            [
                "adopted",
                "config_path",
                "conntrack",
                "counters",
                "instance",
                "interface",
                "started_unix_ms",
                "version",
                "vips",
                "xdp_mode"
            ]
        );
        assert_eq!(v["version"], json!(1));
        assert_eq!(v["instance"], json!("default"));
        assert_eq!(v["interface"], json!("eth0"));
        assert_eq!(v["xdp_mode"], json!("native"));
        assert_eq!(v["started_unix_ms"], json!(1_799_989_080_000_u64));
        assert_eq!(v["adopted"], json!(true));
        assert_eq!(v["config_path"], json!("/etc/xlb/xlb.toml"));
        assert_eq!(
            v["conntrack"],
            json!({"entries": 1234, "capacity": 1_048_576})
        );
        let counters = v["counters"].as_object().unwrap();
        assert_eq!(counters.len(), lb_common::Stat::ALL.len());
        assert_eq!(counters["fwd_tx"], json!(0));
        assert_eq!(counters["ct_hit"], json!(20));
        assert!(counters.values().all(Value::is_u64));

        let vip = &v["vips"][0];
        assert_eq!(
            keys(vip),
            [
                "address",
                "auto_timeout_ms",
                "backends",
                "backends_total",
                "backends_up",
                "bytes",
                "down_policy",
                "ejected_slow",
                "fleet_slow",
                "max_ejected",
                "min_healthy",
                "mode",
                "name",
                "new_flows",
                "new_flows_per_sec",
                "packets",
                "packets_per_sec",
                "panic",
                "panic_reason",
                "port",
                "protocol",
                "table_size"
            ]
        );
        let want_vip = [
            ("name", json!("api")),
            ("address", json!("10.100.0.1")),
            ("port", json!(80)),
            ("protocol", json!("tcp")),
            ("mode", json!("dsr-ipip")),
            ("down_policy", json!("rehash")),
            ("table_size", json!(65537)),
            ("backends_up", json!(2)),
            ("backends_total", json!(3)),
            ("packets_per_sec", json!(1234.0)),
            ("new_flows_per_sec", json!(35.0)),
            ("packets", json!(1_000_000)),
            ("bytes", json!(900_000_000)),
            ("new_flows", json!(50_000)),
        ];
        for (key, want) in want_vip {
            assert_eq!(vip[key], want, "vip.{key}");
        }
        assert!(vip["packets_per_sec"].is_f64());

        let b = &vip["backends"][1];
        assert_eq!(
            keys(b),
            [
                "address",
                "admin_drained",
                "bytes",
                "consecutive_fail",
                "consecutive_ok",
                "consecutive_slow",
                "drain_deadline_unix_ms",
                "effective_weight",
                "flows",
                "health",
                "in_table",
                "last_probe",
                "last_transition_reason",
                "latency_ms",
                "new_flows",
                "new_flows_per_sec",
                "packets",
                "packets_per_sec",
                "placement",
                "placement_reason",
                "probe_local_errors",
                "since_unix_ms",
                "state",
                "weight"
            ]
        );
        let want_backend = [
            ("address", json!("10.99.0.12:80")),
            ("weight", json!(1)),
            ("state", json!("down")),
            ("health", json!("down")),
            ("admin_drained", json!(false)),
            ("in_table", json!(false)),
            ("since_unix_ms", json!(1_799_999_965_000_u64)),
            (
                "last_transition_reason",
                json!("connected, no HTTP response within 1s"),
            ),
            ("consecutive_ok", json!(0)),
            ("consecutive_fail", json!(7)),
            ("new_flows_per_sec", json!(0.0)),
            ("packets_per_sec", json!(0.0)),
            ("packets", json!(400_000)),
            ("bytes", json!(400_000_000)),
            ("new_flows", json!(20_000)),
            ("flows", Value::Null),
            ("drain_deadline_unix_ms", Value::Null),
        ];
        for (key, want) in want_backend {
            assert_eq!(b[key], want, "backend.{key}");
        }
        assert_eq!(
            b["last_probe"],
            json!({
                "ok": false,
                "reason": "connected, no HTTP response within 1s",
                "code": "no_response",
                "status": null,
                "latency_ms": 1000.4,
                "at_unix_ms": 1_799_999_998_500_u64,
            })
        );
        let states: Vec<&Value> = vip["backends"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| &b["state"])
            .collect();
        assert_eq!(states, [&json!("up"), &json!("down"), &json!("draining")]);
        assert_eq!(vip["backends"][2]["admin_drained"], json!(true));
        assert_eq!(vip["backends"][2]["flows"], json!(37));
        assert_eq!(
            vip["backends"][2]["drain_deadline_unix_ms"],
            json!(1_800_000_240_000_u64)
        );
    }

    #[test]
    fn event_and_explain_schema() {
        use serde_json::json;
        assert_eq!(
            serde_json::to_value(sample_event(5)).unwrap(),
            json!({
                "seq": 5,
                "at_unix_ms": 1_796_000_000_005_u64,
                "kind": "transition",
                "vip": "api",
                "backend": "10.99.0.12:80",
                "from": "up",
                "to": "down",
                "reason": "connected, no HTTP response within 1s",
                "table_build_us": 400,
                "table_slots_changed": 1312,
            })
        );
        assert_eq!(
            serde_json::to_value(sample_explain()).unwrap(),
            json!({
                "protocol": "tcp",
                "client": "192.0.2.10:51234",
                "vip": "10.100.0.1:80",
                "vip_name": "api",
                "backend": "10.99.0.11:80",
                "via": "table",
                "slot": 4242,
                "table_size": 65537,
                "flow_hash": "0123456789abcdef",
                "backend_state": "up",
                "detail": "no conntrack entry; slot 4242 of the table holds 10.99.0.11:80",
            })
        );
        let none = ExplainReport {
            via: "none".to_owned(),
            backend: None,
            ..sample_explain()
        };
        let v = serde_json::to_value(&none).unwrap();
        assert_eq!(v["via"], json!("none"));
        assert_eq!(v["backend"], Value::Null);
    }

    #[test]
    fn malformed_requests_say_what_is_wrong() {
        let cases: &[(&str, &[u8], &[&str])] = &[
            ("not json", b"status", &["malformed request", "column 1"]),
            (
                "truncated json",
                br#"{"version":1,"command":"status""#,
                &["malformed request", "column 31", r#"{"version":1,"command":"status"}"#],
            ),
            ("not an object", b"[1,2]", &["expected a JSON object, got an array"]),
            (
                "no version",
                br#"{"command":"status"}"#,
                &["no \"version\"", "supports protocol version 1"],
            ),
            (
                "other version",
                br#"{"version":2,"command":"status"}"#,
                &["unsupported protocol version 2", "supports version 1"],
            ),
            (
                "version as string",
                br#"{"version":"1","command":"status"}"#,
                &["unsupported protocol version \"1\""],
            ),
            ("no command", br#"{"version":1}"#, &["missing field `command`"]),
            (
                "unknown command",
                br#"{"version":1,"command":"restart"}"#,
                &[
                    "unknown command \"restart\"",
                    "status, events, explain, drain, enable, reload",
                ],
            ),
            (
                "command not a string",
                br#"{"version":1,"command":3}"#,
                &["\"command\" must be a string, got 3"],
            ),
            (
                "missing field",
                br#"{"version":1,"command":"drain","vip":"api"}"#,
                &["bad request", "missing field `backend`"],
            ),
            (
                "negative deadline",
                br#"{"version":1,"command":"drain","vip":"api","backend":"10.0.0.1:80","deadline_ms":-5}"#,
                &["bad request", "invalid value: integer `-5`"],
            ),
            (
                "unknown field",
                br#"{"version":1,"command":"events","since":3}"#,
                &["bad request", "unknown field `since`"],
            ),
            (
                "bad address",
                br#"{"version":1,"command":"explain","protocol":"tcp","client":"1.2.3.4","vip":"10.0.0.1:80"}"#,
                &["bad request", "invalid socket address syntax"],
            ),
            (
                "bad protocol",
                br#"{"version":1,"command":"explain","protocol":"sctp","client":"1.2.3.4:1","vip":"10.0.0.1:80"}"#,
                &["bad request", "unknown variant `sctp`"],
            ),
            ("not utf-8", b"\xff\xfe", &["malformed request"]),
        ];
        for (name, line, want) in cases {
            let err = parse_request(line).expect_err(name);
            for w in *want {
                assert!(err.contains(w), "{name}: {w:?} not in {err:?}");
            }
        }
    }

    #[test]
    fn probe_status_from_result() {
        let ok = ProbeResult {
            outcome: Ok(ProbeOk { status: Some(204) }),
            latency: Duration::from_micros(1500),
        };
        assert_eq!(
            ProbeStatus::from_result(&ok, 7),
            ProbeStatus {
                ok: true,
                reason: "ok".to_owned(),
                code: "ok".to_owned(),
                status: Some(204),
                latency_ms: 1.5,
                at_unix_ms: 7,
            }
        );
        let bad = ProbeResult {
            outcome: Err(FailReason::UnexpectedStatus { status: 503 }),
            latency: Duration::from_millis(3),
        };
        let s = ProbeStatus::from_result(&bad, 9);
        assert_eq!(
            (s.ok, s.reason.as_str(), s.code.as_str(), s.status),
            (
                false,
                "unexpected status 503",
                "unexpected_status",
                Some(503)
            )
        );
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
        ];
        for (req, want) in cases {
            assert_eq!(req.to_string(), want);
        }
    }
}
