//! A lab with xlb running in it: what the end-to-end tests, `cargo xtask lab`
//! and `cargo xtask demo` share.
//!
//! [`LabRun::up`] builds the namespaces ([`Lab::up`]), starts `xlb-backend`
//! and `xlb decap --interface eth0` in every backend namespace,
//! `xlb xdp-pass --interface v-lb` in the bridge namespace and `xlb run` in
//! the LB namespace, and waits until every backend is `up`. Dropping it stops
//! everything, runs `xlb detach --instance` and removes the namespaces.
//!
//! xlb is driven as a subprocess through its command line (this crate does
//! not depend on the rest of xlb): `xlb status --json` and `xlb events
//! --json` are read into the small mirror types below, which keep only the
//! fields the lab uses and ignore the rest.
//!
//! Processes enter their namespace with `setns(2)` between fork and exec
//! rather than through `ip netns exec`: that command also unshares the mount
//! namespace and remounts `/sys`, so the bpffs that `xlb run` mounts and pins
//! into would be private to the daemon and vanish with it (no adoption after
//! a restart, nothing for `xlb detach` to find).

use std::{
    collections::BTreeMap,
    fs::{self, OpenOptions},
    io::{self, Read as _, Write as _},
    net::{IpAddr, SocketAddr},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use nix::{
    sched::{CloneFlags, setns},
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use serde::{Deserialize, Serialize};

use crate::{
    backend::{BackendStats, Fault, remote_set_fault, remote_stats},
    client::{LoadOptions, Report, run_load},
    http,
    topology::{self, HOST_IFNAME, Lab, LabConfig, LabError, in_netns, netns_fd},
};

/// Service ports every backend listens on (v4 and v6): 80 for the main VIPs,
/// 8080 so that one VIP address can be configured twice (e.g. fd00:100::1 in
/// both forwarding modes).
pub const SERVICE_PORTS: [u16; 2] = [80, 8080];

/// Port of each backend's admin listener (fault switches, `/stats`).
pub const ADMIN_PORT: u16 = 9000;

/// How long [`LabRun::up`] waits for the daemon to answer and every backend
/// to be `up`, by default. Backends need `rise` probes; a daemon building
/// its maps on a loaded 2-CPU machine takes a few seconds.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a helper process (decap, xdp-pass, backend) gets to attach or
/// bind before `up` gives up on it.
const HELPER_START_TIMEOUT: Duration = Duration::from_secs(15);

/// Bound on one `xlb` CLI call (status, events, drain, reload...).
const CLI_TIMEOUT: Duration = Duration::from_secs(15);

/// Bound on one call to a backend's admin listener.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

/// How often waits poll.
const POLL: Duration = Duration::from_millis(100);

/// Lines of a log file quoted in errors.
const LOG_TAIL_LINES: usize = 25;

/// Name of the state file in the work directory: what `lab down` needs to
/// stop a lab that `lab up` left running (or that was interrupted).
pub const STATE_FILE: &str = "lab.json";

/// Everything that can go wrong running xlb in the lab.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error(transparent)]
    Lab(#[from] LabError),

    #[error("{what} not found at {path}; {hint}")]
    MissingBinary {
        what: String,
        path: PathBuf,
        hint: String,
    },

    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },

    #[error("{what} exited early ({status}); last lines of {log}:\n{tail}")]
    Exited {
        what: String,
        status: String,
        log: PathBuf,
        tail: String,
    },

    #[error("`{cmd}` failed ({status}): {stderr}")]
    Cli {
        cmd: String,
        status: String,
        stderr: String,
    },

    #[error("timed out after {after:?} waiting for {what}; last seen: {last}")]
    Timeout {
        what: String,
        after: Duration,
        last: String,
    },

    #[error("could not read the output of `{cmd}`: {reason}; output was: {output}")]
    Parse {
        cmd: String,
        reason: String,
        output: String,
    },

    #[error("backend b{backend} admin {addr}: {source}")]
    Admin {
        backend: usize,
        addr: SocketAddr,
        source: io::Error,
    },

    #[error("load client: {0}")]
    Client(String),

    #[error("invalid scenario: {0}")]
    Invalid(String),
}

type Result<T, E = ScenarioError> = std::result::Result<T, E>;

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ScenarioError {
    let what = what.into();
    move |source| ScenarioError::Io { what, source }
}

// ---------------------------------------------------------------------------
// Configuration files for the lab.

/// Forwarding mode of a VIP, spelled as in xlb's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    DsrIpip,
    DsrL2,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::DsrIpip => "dsr-ipip",
            Mode::DsrL2 => "dsr-l2",
        }
    }

    /// The other mode (for a lab that shows both).
    pub fn other(self) -> Mode {
        match self {
            Mode::DsrIpip => Mode::DsrL2,
            Mode::DsrL2 => Mode::DsrIpip,
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "dsr-ipip" => Ok(Mode::DsrIpip),
            "dsr-l2" => Ok(Mode::DsrL2),
            _ => Err(format!("unknown mode {s:?}; use dsr-ipip or dsr-l2")),
        }
    }
}

/// The health-check settings the lab varies (`[health_check]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    /// `"http"` or `"tcp"`.
    pub kind: String,
    pub interval: Duration,
    pub timeout: Duration,
    /// Also used as `fast_interval` and `down_interval`, so that detection
    /// and recovery times follow from `interval` alone.
    pub rise: u32,
    pub fall: u32,
    /// `hang_timeout`: how long a probe may go on past `timeout` before it
    /// counts as no response. `None`: not written (xlb's default).
    pub hang_timeout: Option<Duration>,
    /// Write only `kind` (and `hang_timeout` when set), leaving every other
    /// key to xlb's defaults; see [`Health::xlb_defaults`].
    pub xlb_defaults: bool,
}

impl Health {
    /// xlb's own defaults: only `kind = "http"` is written. The fields hold
    /// the values xlb then uses (interval 2 s, timeout 1 s, rise 2, fall 3;
    /// also `fast_interval` 500 ms, `down_interval` 5 s and 10 % jitter,
    /// which the fields do not show), so tests can compute bounds.
    pub fn xlb_defaults() -> Self {
        Self {
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            rise: 2,
            fall: 3,
            xlb_defaults: true,
            ..Self::default()
        }
    }
}

impl Default for Health {
    /// HTTP `/health` every 500 ms, 500 ms timeout, rise 2, fall 2: the
    /// tests' settings, fast enough to keep each test short.
    fn default() -> Self {
        Self {
            kind: "http".to_string(),
            interval: Duration::from_millis(500),
            timeout: Duration::from_millis(500),
            rise: 2,
            fall: 2,
            hang_timeout: None,
            xlb_defaults: false,
        }
    }
}

/// A count or a share of a VIP's backends (`max_ejected`, `min_healthy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// Written as a bare integer: `min_healthy = 2`.
    Count(u32),
    /// Written as a string: `max_ejected = "10%"`.
    Percent(u32),
}

impl Share {
    fn toml(self) -> String {
        match self {
            Share::Count(n) => n.to_string(),
            Share::Percent(p) => format!("\"{p}%\""),
        }
    }
}

/// The cascade protections of a `[protection]` table (global) or a
/// `[vip.protection]` table (per VIP, merged with the global one field by
/// field). Only the fields that are set are written; xlb's defaults apply
/// to the rest.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Protection {
    /// Most backends out as slow outliers at once.
    pub max_ejected: Option<Share>,
    /// Fewer backends than this in the table: panic (0 disables).
    pub min_healthy: Option<Share>,
    /// An outlier's latency is more than this × its peers' median...
    pub outlier_factor: Option<f64>,
    /// ...and more than the median + this.
    pub outlier_margin: Option<Duration>,
    /// Weight ramp of a backend that enters the table (0: off).
    pub slow_start: Option<Duration>,
    pub flap_damping: Option<bool>,
    pub flap_half_life: Option<Duration>,
    pub flap_limit: Option<u32>,
}

impl Protection {
    /// The protections switched off as far as configuration allows: no
    /// panic (`min_healthy = 0`), no flap damping. With `hang_timeout =
    /// timeout` this is the behaviour before issue 7.
    pub fn off() -> Self {
        Self {
            min_healthy: Some(Share::Count(0)),
            flap_damping: Some(false),
            ..Self::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `key = value` lines for the fields that are set.
    fn render_keys(&self) -> String {
        let ms = |d: Duration| format!("\"{}ms\"", d.as_millis());
        let mut out = String::new();
        let mut line = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                out.push_str(&format!("{k} = {v}\n"));
            }
        };
        line("max_ejected", self.max_ejected.map(Share::toml));
        line("min_healthy", self.min_healthy.map(Share::toml));
        // `{:?}` keeps the decimal point TOML needs for a float (3.0).
        line(
            "outlier_factor",
            self.outlier_factor.map(|f| format!("{f:?}")),
        );
        line("outlier_margin", self.outlier_margin.map(ms));
        line("slow_start", self.slow_start.map(ms));
        line("flap_damping", self.flap_damping.map(|b| b.to_string()));
        line("flap_half_life", self.flap_half_life.map(ms));
        line("flap_limit", self.flap_limit.map(|n| n.to_string()));
        out
    }
}

/// One `[[vip]]` of a lab configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Vip {
    pub name: String,
    pub address: IpAddr,
    pub port: u16,
    pub mode: Mode,
    /// Backend numbers (1-based); their v4 or v6 address per the VIP's family.
    pub backends: Vec<usize>,
    /// `[vip.protection]`, written when set and not empty.
    pub protection: Option<Protection>,
}

impl Vip {
    pub fn new(name: &str, address: IpAddr, port: u16, mode: Mode, backends: usize) -> Self {
        Self {
            name: name.to_string(),
            address,
            port,
            mode,
            backends: (1..=backends).collect(),
            protection: None,
        }
    }

    /// Where a client connects.
    pub fn target(&self) -> SocketAddr {
        SocketAddr::new(self.address, self.port)
    }

    /// The `address:port` xlb shows for backend `i` of this VIP.
    pub fn backend_addr(&self, i: usize) -> SocketAddr {
        backend_addr(self.address, self.port, i)
    }
}

/// Backend `i`'s address in the family of `vip`, with `port`.
pub fn backend_addr(vip: IpAddr, port: u16, i: usize) -> SocketAddr {
    let ip: IpAddr = match vip {
        IpAddr::V4(_) => topology::backend_v4(i).into(),
        IpAddr::V6(_) => topology::backend_v6(i).into(),
    };
    SocketAddr::new(ip, port)
}

/// A configuration file for xlb in a lab, rendered by [`XlbConfig::render`].
#[derive(Debug, Clone, PartialEq)]
pub struct XlbConfig {
    pub instance: String,
    pub control_socket: PathBuf,
    /// `"native"` (works on veth) or `"generic"`.
    pub xdp_mode: String,
    pub health: Health,
    /// `[protection]`, written when not empty.
    pub protection: Protection,
    pub vips: Vec<Vip>,
}

/// The instance name `cargo xtask lab` and the tests use for a prefix:
/// `lab-<prefix>`, lowercased (instances allow only `[a-z0-9_-]`).
pub fn instance_for(prefix: &str) -> String {
    format!("lab-{}", prefix.to_ascii_lowercase())
}

/// The control socket `cargo xtask lab` and the tests use for a prefix.
pub fn socket_for(prefix: &str) -> PathBuf {
    PathBuf::from(format!("/run/xlb/lab-{prefix}.sock"))
}

impl XlbConfig {
    /// Instance and socket named after `prefix`, test health settings, and
    /// one VIP: `api`, 10.100.0.1:80, dsr-ipip, backends b1..b3.
    pub fn for_prefix(prefix: &str) -> Self {
        Self {
            instance: instance_for(prefix),
            control_socket: socket_for(prefix),
            xdp_mode: "native".to_string(),
            health: Health::default(),
            protection: Protection::default(),
            vips: vec![Vip::new(
                "api",
                topology::VIP_V4.into(),
                80,
                Mode::DsrIpip,
                3,
            )],
        }
    }

    /// What `cargo xtask lab up --mode M` runs: `api` (10.100.0.1:80) and
    /// `api6` ([fd00:100::1]:80) in mode `M`, `api2` (10.100.0.2:80) in the
    /// other mode, all on every backend, with 1 s probes.
    pub fn lab_default(prefix: &str, mode: Mode, backends: usize) -> Self {
        Self {
            health: Health {
                interval: Duration::from_secs(1),
                timeout: Duration::from_secs(1),
                ..Health::default()
            },
            vips: vec![
                Vip::new("api", topology::VIP_V4.into(), 80, mode, backends),
                Vip::new("api6", topology::VIP_V6.into(), 80, mode, backends),
                Vip::new("api2", topology::VIP2_V4.into(), 80, mode.other(), backends),
            ],
            ..Self::for_prefix(prefix)
        }
    }

    pub fn vip(&self, name: &str) -> Option<&Vip> {
        self.vips.iter().find(|v| v.name == name)
    }

    /// The TOML text.
    pub fn render(&self) -> String {
        let ms = |d: Duration| format!("\"{}ms\"", d.as_millis());
        let h = &self.health;
        let mut out = format!(
            "# Written by xlb_lab::scenario for a namespaced lab.\n\
             [daemon]\n\
             interface = \"{HOST_IFNAME}\"\n\
             xdp_mode = \"{}\"\n\
             instance = \"{}\"\n\
             control_socket = \"{}\"\n\
             metrics_address = \"\"\n\
             # Small maps: a lab has a handful of flows, and each test builds them anew.\n\
             conntrack_size = 65536\n\
             max_table_size = {LAB_TABLE_SIZE}\n\
             \n\
             [health_check]\n\
             kind = \"{}\"\n",
            self.xdp_mode,
            self.instance,
            self.control_socket.display(),
            h.kind,
        );
        if !h.xlb_defaults {
            out.push_str(&format!(
                "interval = {}\n\
                 timeout = {}\n\
                 fast_interval = {}\n\
                 down_interval = {}\n\
                 rise = {}\n\
                 fall = {}\n\
                 jitter = 0\n",
                ms(h.interval),
                ms(h.timeout),
                ms(h.interval),
                ms(h.interval),
                h.rise,
                h.fall,
            ));
        }
        if let Some(hang) = h.hang_timeout {
            out.push_str(&format!("hang_timeout = {}\n", ms(hang)));
        }
        if !self.protection.is_empty() {
            out.push_str("\n[protection]\n");
            out.push_str(&self.protection.render_keys());
        }
        for v in &self.vips {
            out.push_str(&format!(
                "\n[[vip]]\nname = \"{}\"\naddress = \"{}\"\nport = {}\nmode = \"{}\"\n",
                v.name,
                v.address,
                v.port,
                v.mode.as_str()
            ));
            if let Some(p) = v.protection.as_ref().filter(|p| !p.is_empty()) {
                out.push_str("\n[vip.protection]\n");
                out.push_str(&p.render_keys());
            }
            for &i in &v.backends {
                out.push_str(&format!(
                    "\n[[vip.backend]]\naddress = \"{}\"\n",
                    v.backend_addr(i).ip()
                ));
            }
        }
        out
    }
}

/// `daemon.max_table_size` of lab configurations: a prime ≥ 10 × the lab's
/// backends per VIP, and small, so that maps are quick to build.
pub const LAB_TABLE_SIZE: u32 = 1009;

/// The value of `key` in `[table]` of a TOML text, unquoted (`"1s"` → `1s`,
/// `2` → `2`), or `None` when absent. Enough for the lab's own files (one
/// key per line, no nesting); xlb itself validates the file.
pub fn setting(config: &str, table: &str, key: &str) -> Option<String> {
    let header = format!("[{table}]");
    let mut in_table = false;
    for line in config.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_table = line == header;
            continue;
        }
        if !in_table {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        if k.trim() != key {
            continue;
        }
        let v = v.trim();
        return match v.strip_prefix('"') {
            Some(rest) => rest.find('"').map(|end| rest[..end].to_string()),
            None => Some(v.split('#').next().unwrap_or("").trim().to_string()),
        };
    }
    None
}

/// The instance and control socket a configuration names (xlb's defaults
/// when absent).
pub fn instance_and_socket(config: &str) -> (String, PathBuf) {
    (
        setting(config, "daemon", "instance").unwrap_or_else(|| "default".to_string()),
        PathBuf::from(
            setting(config, "daemon", "control_socket")
                .unwrap_or_else(|| "/run/xlb/xlb.sock".to_string()),
        ),
    )
}

// ---------------------------------------------------------------------------
// Mirrors of `xlb status --json` and `xlb events --json`.

/// The parts of xlb's status report the lab reads.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Status {
    pub instance: String,
    /// The daemon took over the pinned maps of a previous run.
    #[serde(default)]
    pub adopted: bool,
    /// Global data-plane counters (`drop_no_backend`, `fwd_tx`...).
    #[serde(default)]
    pub counters: BTreeMap<String, u64>,
    #[serde(default)]
    pub vips: Vec<VipStatus>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct VipStatus {
    pub name: String,
    pub address: IpAddr,
    pub port: u16,
    #[serde(default)]
    pub mode: String,
    #[serde(default)]
    pub packets: u64,
    #[serde(default)]
    pub new_flows: u64,
    /// Backends in the table.
    #[serde(default)]
    pub backends_up: u32,
    /// The VIP is in panic: fewer than `min_healthy` backends would be in
    /// the table, so some unhealthy ones were kept (issue 7; `false` from a
    /// daemon that predates it).
    #[serde(default)]
    pub panic: bool,
    /// Which backends panic kept and why.
    #[serde(default)]
    pub panic_reason: Option<String>,
    /// Set while at least half of the VIP's backends are slow (and so none
    /// is ejected for it), e.g. `all 3 backends slow, median 2.5s; not ejecting`.
    #[serde(default)]
    pub fleet_slow: Option<String>,
    /// Backends out as slow outliers now.
    #[serde(default)]
    pub ejected_slow: u32,
    /// `max_ejected` and `min_healthy` resolved to counts.
    #[serde(default)]
    pub max_ejected: u32,
    #[serde(default)]
    pub min_healthy: u32,
    #[serde(default)]
    pub backends: Vec<BackendStatus>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BackendStatus {
    pub address: SocketAddr,
    /// `up`, `down`, `draining` or `unknown`.
    pub state: String,
    #[serde(default)]
    pub last_transition_reason: Option<String>,
    #[serde(default)]
    pub since_unix_ms: u64,
    #[serde(default)]
    pub packets: u64,
    #[serde(default)]
    pub new_flows: u64,
    /// Configured weight.
    #[serde(default)]
    pub weight: u32,
    /// What health checks alone say: `up`, `down`, `unknown`.
    #[serde(default)]
    pub health: String,
    #[serde(default)]
    pub in_table: bool,
    #[serde(default)]
    pub admin_drained: bool,
    #[serde(default)]
    pub consecutive_fail: u32,
    #[serde(default)]
    pub last_probe: Option<ProbeStatus>,
    /// Where the VIP's policy put it: `serving`, `ramping`, `ejected_slow`,
    /// `down`, `held_down`, `panic_restored`, `draining`, `unknown`; empty
    /// from a daemon that predates issue 7.
    #[serde(default)]
    pub placement: String,
    #[serde(default)]
    pub placement_reason: Option<String>,
    /// Table weight now (below the configured one while ramping).
    #[serde(default)]
    pub effective_weight: f64,
    /// Consecutive probes past `timeout` (reset by an answer in time).
    #[serde(default)]
    pub consecutive_slow: u32,
    /// Current probe latency the policy uses, ms.
    #[serde(default)]
    pub latency_ms: Option<f64>,
    /// Established conntrack flows (from the periodic walk; `None` before
    /// the first walk).
    #[serde(default)]
    pub flows: Option<u64>,
    /// When a `drain --deadline` sets it `down`, ms since the epoch.
    #[serde(default)]
    pub drain_deadline_unix_ms: Option<u64>,
}

/// The latest probe of a backend.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ProbeStatus {
    pub ok: bool,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub latency_ms: f64,
}

impl Status {
    pub fn vip(&self, name: &str) -> Option<&VipStatus> {
        self.vips.iter().find(|v| v.name == name)
    }

    /// Backend `addr` of VIP `vip`.
    pub fn backend(&self, vip: &str, addr: SocketAddr) -> Option<&BackendStatus> {
        self.vip(vip)?.backends.iter().find(|b| b.address == addr)
    }

    /// Whether every backend of every VIP is `up`.
    pub fn all_up(&self) -> bool {
        !self.vips.is_empty()
            && self
                .vips
                .iter()
                .all(|v| v.backends.iter().all(|b| b.state == "up"))
    }

    /// One line per backend that is not up, for messages.
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
            "no VIPs".to_string()
        } else {
            parts.join(" ")
        }
    }
}

/// One event of `xlb events --json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Event {
    pub seq: u64,
    pub at_unix_ms: u64,
    /// `transition` (state and placement changes), `table`, `admin`,
    /// `reload`, `start`, and since issue 7 `fleet_slow`, `panic`, `alarm`,
    /// `drain`.
    pub kind: String,
    #[serde(default)]
    pub vip: Option<String>,
    #[serde(default)]
    pub backend: Option<String>,
    #[serde(default)]
    pub from: Option<String>,
    #[serde(default)]
    pub to: Option<String>,
    #[serde(default)]
    pub reason: String,
}

/// Unwraps `{"version":1,"response":...,"data":X}` to `X`; anything else is
/// returned as it is.
fn unwrap_envelope(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(mut m)
            if m.contains_key("response") && m.contains_key("data") =>
        {
            m.remove("data").unwrap_or_default()
        }
        other => other,
    }
}

/// Parses `xlb status --json` output (the report, or the protocol envelope).
pub fn parse_status(text: &str) -> Result<Status, String> {
    let v: serde_json::Value = serde_json::from_str(text.trim()).map_err(|e| e.to_string())?;
    serde_json::from_value(unwrap_envelope(v)).map_err(|e| e.to_string())
}

/// Parses `xlb events --json` output: a JSON array of events, or one event
/// (or protocol envelope around one event or an array) per line.
pub fn parse_events(text: &str) -> Result<Vec<Event>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let whole: Result<serde_json::Value, _> = serde_json::from_str(text);
    let values: Vec<serde_json::Value> = match whole {
        Ok(v) => vec![v],
        Err(_) => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).map_err(|e| format!("{e} in line {l:?}")))
            .collect::<Result<_, _>>()?,
    };
    let mut events = Vec::new();
    for v in values {
        match unwrap_envelope(v) {
            serde_json::Value::Array(items) => {
                for item in items {
                    events.push(serde_json::from_value(item).map_err(|e| e.to_string())?);
                }
            }
            one => events.push(serde_json::from_value(one).map_err(|e| e.to_string())?),
        }
    }
    Ok(events)
}

// ---------------------------------------------------------------------------
// Processes.

/// A `Command` for `program` that runs inside network namespace `ns` (and
/// nowhere else: same mount namespace, see the module docs).
pub fn command_in(ns: &str, program: impl AsRef<Path>) -> Result<Command> {
    let fd = netns_fd(ns)?;
    let mut cmd = Command::new(program.as_ref());
    // SAFETY: the hook runs in the forked child before exec and only calls
    // setns(2), which is async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || setns(&fd, CloneFlags::CLONE_NEWNET).map_err(io::Error::from));
    }
    Ok(cmd)
}

/// Runs `cmd` to completion within `timeout` (killed after it); returns
/// stdout, or an error carrying stderr.
fn run_bounded(mut cmd: Command, timeout: Duration) -> Result<String> {
    let line = describe(&cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io_err(format!("starting `{line}`")))?;
    // Drained on threads so a large output cannot fill the pipe and stall
    // the child while we wait for it.
    let drain = |mut r: Box<dyn io::Read + Send>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout is piped")));
    let err = drain(Box::new(child.stderr.take().expect("stderr is piped")));
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child
            .try_wait()
            .map_err(io_err(format!("waiting for `{line}`")))?
        {
            Some(s) => break s,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ScenarioError::Timeout {
                    what: format!("`{line}` to finish"),
                    after: timeout,
                    last: "still running; killed".to_string(),
                });
            }
            None => thread::sleep(Duration::from_millis(5)),
        }
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    if !status.success() {
        return Err(ScenarioError::Cli {
            cmd: line,
            status: status.to_string(),
            stderr: if stderr.trim().is_empty() {
                stdout.trim().to_string()
            } else {
                stderr.trim().to_string()
            },
        });
    }
    Ok(stdout)
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// The last lines of a log file, for error messages.
pub fn log_tail(path: &Path) -> String {
    match fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(LOG_TAIL_LINES);
            let tail = lines[from..].join("\n");
            if tail.is_empty() {
                "(empty)".to_string()
            } else {
                tail
            }
        }
        Err(e) => format!("(cannot read: {e})"),
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `xlb` and `xlb-backend`, found next to each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    pub xlb: PathBuf,
    pub backend: PathBuf,
}

impl Binaries {
    /// `xlb` at `xlb`, `xlb-backend` in the same directory (both are built
    /// into `target/<profile>/`).
    pub fn next_to(xlb: &Path) -> Result<Self> {
        let backend = xlb
            .parent()
            .map(|d| d.join("xlb-backend"))
            .unwrap_or_else(|| PathBuf::from("xlb-backend"));
        let b = Self {
            xlb: xlb.to_path_buf(),
            backend,
        };
        b.check()?;
        Ok(b)
    }

    fn check(&self) -> Result<()> {
        let dir = self
            .xlb
            .parent()
            .map_or_else(|| ".".to_string(), |d| d.display().to_string());
        let release = if dir.ends_with("release") {
            " --release"
        } else {
            ""
        };
        for (what, path, pkg, skip) in [
            (
                "xlb",
                &self.xlb,
                "lb-user",
                " (without AYA_BUILD_SKIP: it embeds the XDP object)",
            ),
            ("xlb-backend", &self.backend, "xlb-lab", ""),
        ] {
            if !path.is_file() {
                return Err(ScenarioError::MissingBinary {
                    what: what.to_string(),
                    path: path.clone(),
                    hint: format!("build it with `cargo build{release} -p {pkg}`{skip}"),
                });
            }
        }
        Ok(())
    }
}

/// Finds the `xlb` binary for a test or task: `$XLB_BIN` if set, else
/// `xlb` in the directory of the running executable or its parent (a test
/// binary runs from `target/<profile>/deps/`).
pub fn find_xlb() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("XLB_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(io_err("finding the running executable"))?;
    let mut candidates = Vec::new();
    if let Some(dir) = exe.parent() {
        candidates.push(dir.join("xlb"));
        if let Some(up) = dir.parent() {
            candidates.push(up.join("xlb"));
        }
    }
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| ScenarioError::MissingBinary {
            what: "xlb".to_string(),
            path: candidates.last().cloned().unwrap_or_default(),
            hint: "build it with `cargo build -p lb-user -p xlb-lab` (without AYA_BUILD_SKIP: \
                   it embeds the XDP object), or point XLB_BIN at it"
                .to_string(),
        })
}

/// One process a lab run started, as recorded in the state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcRecord {
    /// `backend-b1`, `decap-b1`, `xdp-pass`, `daemon`...
    pub role: String,
    pub pid: u32,
    /// The binary, to recognise the process (pids are reused).
    pub exe: PathBuf,
}

/// `lab.json` in the work directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFile {
    pub prefix: String,
    pub backends: usize,
    pub instance: String,
    pub socket: PathBuf,
    pub xlb: PathBuf,
    pub config: PathBuf,
    pub procs: Vec<ProcRecord>,
}

impl StateFile {
    pub fn load(dir: &Path) -> Result<Option<StateFile>> {
        let path = dir.join(STATE_FILE);
        match fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| ScenarioError::Parse {
                    cmd: format!("reading {}", path.display()),
                    reason: e.to_string(),
                    output: text,
                }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(format!("reading {}", path.display()))(e)),
        }
    }

    fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(STATE_FILE);
        let text = serde_json::to_string_pretty(self).expect("plain data serializes");
        fs::write(&path, text).map_err(io_err(format!("writing {}", path.display())))
    }
}

// ---------------------------------------------------------------------------
// The run.

/// How to bring a lab with xlb up.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Namespace prefix (see [`LabConfig::prefix`]).
    pub prefix: String,
    pub backends: usize,
    /// The `xlb` binary; `xlb-backend` is looked for next to it.
    pub xlb: PathBuf,
    /// The configuration file's text; its `[daemon]` must say
    /// `interface = "eth0"` and name the instance and control socket.
    pub config: String,
    /// Where the configuration, logs and state file go. `None`: a fresh
    /// temporary directory, removed on a clean teardown.
    pub work_dir: Option<PathBuf>,
    /// Start `xlb run` (false: only the lab, backends, decap and xdp-pass).
    pub start_daemon: bool,
    /// Bound on the daemon answering and every backend becoming `up`.
    pub ready_timeout: Duration,
    /// `RUST_LOG` of the xlb processes.
    pub rust_log: String,
}

impl RunOptions {
    pub fn new(prefix: &str, xlb: &Path, config: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
            backends: 3,
            xlb: xlb.to_path_buf(),
            config: config.to_string(),
            work_dir: None,
            start_daemon: true,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            rust_log: std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_string()),
        }
    }
}

/// A lab with xlb running in it. Dropping it stops every process, detaches
/// xlb's instance and removes the namespaces (unless [`LabRun::keep`]).
pub struct LabRun {
    lab: Option<Lab>,
    /// Also kept here: the prefix is needed after the `Lab` is dropped.
    prefix: String,
    bins: Binaries,
    work_dir: PathBuf,
    temp_dir: bool,
    config_path: PathBuf,
    instance: String,
    socket: PathBuf,
    backends: usize,
    rust_log: String,
    ready_timeout: Duration,
    daemon: Option<u32>,
    procs: Vec<ProcRecord>,
    kept: bool,
}

impl LabRun {
    /// Brings the lab up with three backends and xlb running `config`,
    /// and waits for every backend to be up.
    pub fn up(prefix: &str, xlb: &Path, config: &str) -> Result<LabRun> {
        Self::up_with(RunOptions::new(prefix, xlb, config))
    }

    pub fn up_with(opts: RunOptions) -> Result<LabRun> {
        let bins = Binaries::next_to(&opts.xlb)?;
        let cfg = LabConfig {
            prefix: opts.prefix.clone(),
            backends: opts.backends,
        };
        cfg.validate()?;
        let (instance, socket) = instance_and_socket(&opts.config);
        let (work_dir, temp_dir) = match &opts.work_dir {
            Some(d) => (d.clone(), false),
            None => (
                std::env::temp_dir().join(format!(
                    "xlb-lab-{}-{}",
                    opts.prefix,
                    std::process::id()
                )),
                true,
            ),
        };
        // Whatever a previous run of this prefix left (interrupted, kept).
        stop_recorded(&work_dir);
        detach(&bins.xlb, &instance)?;
        fs::create_dir_all(&work_dir)
            .map_err(io_err(format!("creating {}", work_dir.display())))?;
        let config_path = work_dir.join("xlb.toml");
        fs::write(&config_path, &opts.config)
            .map_err(io_err(format!("writing {}", config_path.display())))?;
        if let Some(dir) = socket.parent() {
            fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
        }

        let lab = Lab::up(&cfg)?;
        // The client sends on a veth, which leaves TCP checksums to "the
        // hardware" (CHECKSUM_PARTIAL) as long as the packet stays an skb;
        // XDP_TX on the LB turns it into a raw frame and the backend then
        // drops it as corrupt (TcpInCsumErrors). Real NICs deliver complete
        // checksums, so the client computes its own, as a real one's sender
        // would have.
        set_tx_checksum_offload(&lab.ns_client(), HOST_IFNAME, false)?;
        // From here on an error drops `run`, which tears everything down.
        let mut run = LabRun {
            lab: Some(lab),
            prefix: opts.prefix.clone(),
            bins,
            work_dir,
            temp_dir,
            config_path,
            instance,
            socket,
            backends: opts.backends,
            rust_log: opts.rust_log,
            ready_timeout: opts.ready_timeout,
            daemon: None,
            procs: Vec::new(),
            kept: false,
        };
        run.save_state()?;
        run.start_helpers()?;
        if opts.start_daemon {
            run.start_daemon()?;
            run.wait_all_up(run.ready_timeout)?;
        }
        Ok(run)
    }

    fn lab_ref(&self) -> &Lab {
        self.lab.as_ref().expect("the lab exists until teardown")
    }

    pub fn lab(&self) -> &Lab {
        self.lab_ref()
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }

    pub fn xlb_path(&self) -> &Path {
        &self.bins.xlb
    }

    pub fn backend_count(&self) -> usize {
        self.backends
    }

    /// The daemon's log (stdout and stderr of every `xlb run`, appended).
    pub fn daemon_log(&self) -> PathBuf {
        self.work_dir.join("xlb-run.log")
    }

    /// The daemon's pid, while one runs.
    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon
    }

    fn save_state(&self) -> Result<()> {
        StateFile {
            prefix: self.prefix().to_string(),
            backends: self.backends,
            instance: self.instance.clone(),
            socket: self.socket.clone(),
            xlb: self.bins.xlb.clone(),
            config: self.config_path.clone(),
            procs: self.procs.clone(),
        }
        .save(&self.work_dir)
    }

    /// Starts `program args` in `ns` with output appended to `log`.
    fn spawn(
        &mut self,
        role: &str,
        ns: &str,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<u32> {
        let mut cmd = command_in(ns, program)?;
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(io_err(format!("opening {}", log.display())))?;
        let _ = writeln!(
            file,
            "--- {} {role}: {} {}",
            now_unix_ms(),
            program.display(),
            args.join(" ")
        );
        let err = file
            .try_clone()
            .map_err(io_err(format!("opening {}", log.display())))?;
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .env("RUST_LOG", &self.rust_log);
        let pid = self.lab_ref().spawn(cmd)?;
        self.procs.push(ProcRecord {
            role: role.to_string(),
            pid,
            exe: program.to_path_buf(),
        });
        self.save_state()?;
        Ok(pid)
    }

    fn check_alive(&self, role: &str, pid: u32, log: &Path) -> Result<()> {
        if self.lab_ref().is_running(pid) {
            return Ok(());
        }
        Err(ScenarioError::Exited {
            what: format!("{role} (pid {pid})"),
            status: "see its log".to_string(),
            log: log.to_path_buf(),
            tail: log_tail(log),
        })
    }

    /// Backends, decapsulators and the XDP_PASS program on the LB's peer.
    fn start_helpers(&mut self) -> Result<()> {
        let lab = self.lab_ref();
        let (bridge, peer) = (lab.ns_bridge(), lab.lb_peer_ifname().to_string());
        let backend_ns: Vec<String> = lab.backend_namespaces();
        let xlb = self.bins.xlb.clone();
        let backend_bin = self.bins.backend.clone();
        let mut started = Vec::new();
        for (idx, ns) in backend_ns.iter().enumerate() {
            let i = idx + 1;
            let mut args = vec!["--name".to_string(), format!("b{i}")];
            for port in SERVICE_PORTS {
                args.extend(["--listen".to_string(), format!("0.0.0.0:{port}")]);
                args.extend(["--listen".to_string(), format!("[::]:{port}")]);
            }
            args.extend(["--admin".to_string(), format!("0.0.0.0:{ADMIN_PORT}")]);
            let log = self.work_dir.join(format!("backend-b{i}.log"));
            let pid = self.spawn(&format!("backend-b{i}"), ns, &backend_bin, &args, &log)?;
            started.push((format!("backend b{i}"), pid, log));

            let log = self.work_dir.join(format!("decap-b{i}.log"));
            let args = ["decap", "--interface", HOST_IFNAME].map(String::from);
            let pid = self.spawn(&format!("decap-b{i}"), ns, &xlb, &args, &log)?;
            started.push((format!("xlb decap in {ns}"), pid, log));
        }
        let log = self.work_dir.join("xdp-pass.log");
        let args = [
            "xdp-pass".to_string(),
            "--interface".to_string(),
            peer.clone(),
        ];
        let pid = self.spawn("xdp-pass", &bridge, &xlb, &args, &log)?;
        started.push((format!("xlb xdp-pass in {bridge}"), pid, log));

        // Ready means: every XDP program attached, every admin port answering.
        let deadline = Instant::now() + HELPER_START_TIMEOUT;
        let mut waiting: Vec<(String, String)> = backend_ns
            .iter()
            .map(|ns| (ns.clone(), HOST_IFNAME.to_string()))
            .collect();
        waiting.push((bridge.clone(), peer));
        let mut admins_pending: Vec<usize> = (1..=self.backends).collect();
        loop {
            for (what, pid, log) in &started {
                self.check_alive(what, *pid, log)?;
            }
            waiting.retain(|(ns, ifname)| !xdp_attached(ns, ifname));
            admins_pending.retain(|&i| self.backend_stats(i).is_err());
            if waiting.is_empty() && admins_pending.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let last = format!(
                    "no XDP program yet on {:?}; admin not answering for backends {:?}",
                    waiting, admins_pending
                );
                return Err(ScenarioError::Timeout {
                    what: "the backends, decapsulators and xdp-pass to start".to_string(),
                    after: HELPER_START_TIMEOUT,
                    last,
                });
            }
            thread::sleep(POLL);
        }
    }

    /// Starts `xlb run` and waits until it answers `status` (not for the
    /// backends; see [`LabRun::wait_all_up`]).
    pub fn start_daemon(&mut self) -> Result<()> {
        if let Some(pid) = self.daemon
            && self.lab_ref().is_running(pid)
        {
            return Err(ScenarioError::Invalid(format!(
                "xlb run already runs (pid {pid})"
            )));
        }
        let ns = self.lab_ref().ns_lb();
        let args = vec![
            "run".to_string(),
            "--config".to_string(),
            self.config_path.display().to_string(),
        ];
        let log = self.daemon_log();
        let xlb = self.bins.xlb.clone();
        let pid = self.spawn("daemon", &ns, &xlb, &args, &log)?;
        self.daemon = Some(pid);
        let timeout = self.ready_timeout;
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive("xlb run", pid, &log)?;
            let last = match self.status() {
                Ok(_) => return Ok(()),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(ScenarioError::Timeout {
                    what: format!("xlb run to answer on {}", self.socket.display()),
                    after: timeout,
                    last: format!("{last}; daemon log:\n{}", log_tail(&log)),
                });
            }
            thread::sleep(POLL);
        }
    }

    /// SIGTERM to the daemon (SIGKILL after 2 s); XDP stays attached.
    pub fn stop_daemon(&mut self) -> Result<()> {
        if let Some(pid) = self.daemon.take() {
            self.lab_ref().kill(pid)?;
        }
        Ok(())
    }

    /// SIGKILL to the daemon, as a crash would; XDP stays attached and the
    /// maps stay pinned.
    pub fn kill9_daemon(&mut self) -> Result<()> {
        let pid = self
            .daemon
            .take()
            .ok_or_else(|| ScenarioError::Invalid("no xlb run to kill".to_string()))?;
        kill(Pid::from_raw(pid as i32), Signal::SIGKILL).map_err(|e| ScenarioError::Io {
            what: format!("kill -9 {pid}"),
            source: e.into(),
        })?;
        // Reaps it (the SIGTERM that `kill` sends first finds it dead).
        self.lab_ref().kill(pid)?;
        Ok(())
    }

    /// Stops the daemon if it runs, starts it again and waits until it answers.
    pub fn restart_daemon(&mut self) -> Result<()> {
        self.stop_daemon()?;
        self.start_daemon()
    }

    /// Runs `xlb ARGS --socket <socket>` (a control command) and returns stdout.
    pub fn ctl(&self, args: &[&str]) -> Result<String> {
        self.ctl_within(args, CLI_TIMEOUT)
    }

    /// [`LabRun::ctl`] for a command that may take longer than a status
    /// call (e.g. `drain --wait`), killed after `timeout`.
    pub fn ctl_within(&self, args: &[&str], timeout: Duration) -> Result<String> {
        let mut cmd = Command::new(&self.bins.xlb);
        cmd.args(args).arg("--socket").arg(&self.socket);
        run_bounded(cmd, timeout)
    }

    /// A data-plane counter from `status` (0 when absent).
    pub fn counter(&self, name: &str) -> Result<u64> {
        Ok(self.status()?.counters.get(name).copied().unwrap_or(0))
    }

    /// `xlb status --json`, raw.
    pub fn status_json(&self) -> Result<serde_json::Value> {
        let out = self.ctl(&["status", "--json"])?;
        serde_json::from_str::<serde_json::Value>(out.trim())
            .map(unwrap_envelope)
            .map_err(|e| ScenarioError::Parse {
                cmd: "xlb status --json".to_string(),
                reason: e.to_string(),
                output: out,
            })
    }

    /// `xlb status --json`, the parts the lab reads.
    pub fn status(&self) -> Result<Status> {
        let out = self.ctl(&["status", "--json"])?;
        parse_status(&out).map_err(|reason| ScenarioError::Parse {
            cmd: "xlb status --json".to_string(),
            reason,
            output: out,
        })
    }

    /// `xlb status` as printed for an operator.
    pub fn status_text(&self) -> Result<String> {
        self.ctl(&["status"])
    }

    /// `xlb events --json`: every event the daemon retains.
    pub fn events(&self) -> Result<Vec<Event>> {
        let out = self.ctl(&["events", "--json"])?;
        parse_events(&out).map_err(|reason| ScenarioError::Parse {
            cmd: "xlb events --json".to_string(),
            reason,
            output: out,
        })
    }

    /// `xlb drain VIP BACKEND`.
    pub fn drain(&self, vip: &str, backend: SocketAddr) -> Result<String> {
        self.ctl(&["drain", vip, &backend.to_string()])
    }

    /// `xlb drain VIP BACKEND EXTRA...` (e.g. `--wait --deadline 20s`),
    /// bounded by `timeout`.
    pub fn drain_with(
        &self,
        vip: &str,
        backend: SocketAddr,
        extra: &[&str],
        timeout: Duration,
    ) -> Result<String> {
        let addr = backend.to_string();
        let mut args = vec!["drain", vip, addr.as_str()];
        args.extend_from_slice(extra);
        self.ctl_within(&args, timeout)
    }

    /// `xlb enable VIP BACKEND`.
    pub fn enable(&self, vip: &str, backend: SocketAddr) -> Result<String> {
        self.ctl(&["enable", vip, &backend.to_string()])
    }

    /// Writes `config` over the configuration file and runs `xlb reload`.
    pub fn reload(&self, config: &str) -> Result<String> {
        fs::write(&self.config_path, config)
            .map_err(io_err(format!("writing {}", self.config_path.display())))?;
        self.ctl(&["reload"])
    }

    /// Polls `status` until `done` holds, for at most `timeout`. Returns the
    /// status that satisfied it and when (time since the call).
    pub fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&Status) -> bool,
    ) -> Result<(Status, Duration)> {
        let start = Instant::now();
        loop {
            if let Some(pid) = self.daemon {
                self.check_alive("xlb run", pid, &self.daemon_log())?;
            }
            let last = match self.status() {
                Ok(s) if done(&s) => return Ok((s, start.elapsed())),
                Ok(s) => s.summary(),
                Err(e) => e.to_string(),
            };
            if start.elapsed() >= timeout {
                return Err(ScenarioError::Timeout {
                    what: what.to_string(),
                    after: timeout,
                    last,
                });
            }
            thread::sleep(POLL);
        }
    }

    /// Waits until every backend of every VIP is `up`.
    pub fn wait_all_up(&self, timeout: Duration) -> Result<Status> {
        self.wait_until("every backend to be up", timeout, Status::all_up)
            .map(|(s, _)| s)
    }

    /// Waits until backend `addr` of `vip` is in `state`.
    pub fn wait_backend_state(
        &self,
        vip: &str,
        addr: SocketAddr,
        state: &str,
        timeout: Duration,
    ) -> Result<(Status, Duration)> {
        self.wait_until(
            &format!("{vip} backend {addr} to be {state}"),
            timeout,
            |s| s.backend(vip, addr).is_some_and(|b| b.state == state),
        )
    }

    /// Backend `i`'s admin listener (reachable from the client namespace).
    pub fn backend_admin(&self, i: usize) -> SocketAddr {
        SocketAddr::new(self.lab_ref().backend_v4(i).into(), ADMIN_PORT)
    }

    /// Runs `f` (async) on a runtime inside the client namespace.
    fn in_client<F, T>(&self, f: F) -> Result<T>
    where
        F: std::future::Future<Output = T> + Send,
        T: Send,
    {
        let ns = self.lab_ref().ns_client();
        in_netns(&ns, move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(io_err("building a tokio runtime"))?;
            Ok(rt.block_on(f))
        })?
    }

    /// Switches backend `i`'s fault through its admin listener.
    pub fn set_fault(&self, i: usize, fault: Fault) -> Result<BackendStats> {
        let addr = self.backend_admin(i);
        self.in_client(remote_set_fault(addr, fault, ADMIN_TIMEOUT))?
            .map_err(|source| ScenarioError::Admin {
                backend: i,
                addr,
                source,
            })
    }

    /// Backend `i`'s `/stats`.
    pub fn backend_stats(&self, i: usize) -> Result<BackendStats> {
        let addr = self.backend_admin(i);
        self.in_client(remote_stats(addr, ADMIN_TIMEOUT))?
            .map_err(|source| ScenarioError::Admin {
                backend: i,
                addr,
                source,
            })
    }

    /// One HTTP GET from the client namespace, `Connection: close`; returns
    /// the status and body.
    pub fn http_get(
        &self,
        addr: SocketAddr,
        path: &str,
        timeout: Duration,
    ) -> Result<(u16, String)> {
        let resp = self
            .in_client(http::request(addr, "GET", path, timeout))?
            .map_err(io_err(format!(
                "GET http://{addr}{path} from the client namespace"
            )))?;
        Ok((
            resp.head.status,
            String::from_utf8_lossy(&resp.body).into_owned(),
        ))
    }

    /// Runs the load client in the client namespace until it is done.
    pub fn run_client(&self, opts: LoadOptions) -> Result<Report> {
        self.start_client(opts)?.join()
    }

    /// Starts the load client in the client namespace on a thread of its
    /// own; returns once it has started.
    pub fn start_client(&self, opts: LoadOptions) -> Result<ClientRun> {
        start_client_in(&self.lab_ref().ns_client(), opts)
    }

    /// Starts a process (e.g. a server) inside namespace `ns`, owned by the
    /// lab: stopped at teardown. Output goes to `<work dir>/<role>.log`.
    pub fn spawn_in(
        &mut self,
        role: &str,
        ns: &str,
        program: &Path,
        args: &[String],
    ) -> Result<u32> {
        let log = self.work_dir.join(format!("{role}.log"));
        let pid = self.spawn(role, ns, program, args, &log)?;
        Ok(pid)
    }

    /// Path of `xlb-backend` (also handy as a plain HTTP server).
    pub fn backend_bin(&self) -> &Path {
        &self.bins.backend
    }

    /// Leaves everything running when dropped; `lab down` (or
    /// [`LabRun::down`]) removes it later, using the state file.
    pub fn keep(mut self) -> PathBuf {
        self.kept = true;
        if let Some(lab) = self.lab.as_mut() {
            lab.keep();
        }
        self.work_dir.clone()
    }

    /// Tears down now and reports what failed (Drop does the same silently).
    pub fn shutdown(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        // Done already (`shutdown`, then Drop).
        if self.lab.is_none() {
            return Ok(());
        }
        let mut first_err = None;
        if let Err(e) = self.stop_daemon() {
            first_err.get_or_insert(e);
        }
        if let Err(e) = detach(&self.bins.xlb, &self.instance) {
            first_err.get_or_insert(e);
        }
        // Stops the backends, decap and xdp-pass, removes the namespaces.
        if let Some(lab) = self.lab.take() {
            drop(lab);
            if let Err(e) = Lab::down(&self.prefix) {
                first_err.get_or_insert(e.into());
            }
        }
        // A daemon that died by SIGKILL leaves its socket behind.
        let _ = fs::remove_file(&self.socket);
        if self.temp_dir && first_err.is_none() && !thread::panicking() {
            let _ = fs::remove_dir_all(&self.work_dir);
        } else {
            let _ = fs::remove_file(self.work_dir.join(STATE_FILE));
            if thread::panicking() || first_err.is_some() {
                eprintln!(
                    "xlb-lab: logs of lab {:?} kept in {}",
                    self.prefix,
                    self.work_dir.display()
                );
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Stops a lab left running by [`LabRun::keep`] (or by an interrupted
    /// run): the processes recorded in `work_dir`'s state file, then `xlb
    /// detach --instance`, then every namespace of `prefix`. Fine if nothing
    /// is left. `xlb` and `instance` are used when there is no state file.
    pub fn down(prefix: &str, work_dir: &Path, xlb: &Path, instance: &str) -> Result<()> {
        let state = StateFile::load(work_dir)?;
        stop_recorded(work_dir);
        let (xlb, instance) = match &state {
            Some(s) => (s.xlb.clone(), s.instance.clone()),
            None => (xlb.to_path_buf(), instance.to_string()),
        };
        let mut result = Ok(());
        if xlb.is_file() {
            result = detach(&xlb, &instance);
        }
        Lab::down(prefix)?;
        if let Some(s) = &state {
            let _ = fs::remove_file(&s.socket);
        }
        let _ = fs::remove_file(work_dir.join(STATE_FILE));
        result
    }
}

impl Drop for LabRun {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        if let Err(e) = self.teardown() {
            eprintln!("xlb-lab: tearing down lab {:?}: {e}", self.prefix);
        }
    }
}

/// SIGTERM to the processes a state file in `work_dir` records that are
/// still ours (same binary), SIGKILL to those alive 3 s later.
fn stop_recorded(work_dir: &Path) {
    let Ok(Some(state)) = StateFile::load(work_dir) else {
        return;
    };
    let ours = |p: &ProcRecord| {
        fs::read_link(format!("/proc/{}/exe", p.pid)).is_ok_and(|exe| {
            // A rebuilt binary shows as "<path> (deleted)".
            exe.to_string_lossy().starts_with(&*p.exe.to_string_lossy())
        })
    };
    let live: Vec<&ProcRecord> = state.procs.iter().filter(|p| ours(p)).collect();
    // The daemon first, so that it does not probe backends that are going.
    for p in live.iter().filter(|p| p.role == "daemon") {
        let _ = kill(Pid::from_raw(p.pid as i32), Signal::SIGTERM);
    }
    for p in &live {
        let _ = kill(Pid::from_raw(p.pid as i32), Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && live.iter().any(|p| ours(p) && !is_zombie(p.pid)) {
        thread::sleep(Duration::from_millis(20));
    }
    for p in &live {
        if ours(p) {
            let _ = kill(Pid::from_raw(p.pid as i32), Signal::SIGKILL);
        }
    }
}

fn is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// `xlb detach --instance NAME`: unpins and detaches whatever `xlb run` of
/// that instance left.
pub fn detach(xlb: &Path, instance: &str) -> Result<()> {
    let mut cmd = Command::new(xlb);
    cmd.args(["detach", "--instance", instance]);
    run_bounded(cmd, CLI_TIMEOUT).map(drop)
}

/// `SIOCETHTOOL` commands for the TX checksum offload flag
/// (include/uapi/linux/ethtool.h); `ethtool` itself may not be installed.
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_STXCSUM: u32 = 0x17;

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// `struct ifreq` with the `ifr_data` member of its union (the union is 24
/// bytes on 64-bit Linux; the padding keeps the kernel's copy in bounds).
#[repr(C)]
struct IfreqData {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut EthtoolValue,
    _pad: [u8; 16],
}

fn ethtool_value(sock: &socket2::Socket, ifname: &str, cmd: u32, data: u32) -> io::Result<u32> {
    use std::os::fd::AsRawFd as _;
    let mut value = EthtoolValue { cmd, data };
    let mut req = IfreqData {
        name: [0; libc::IFNAMSIZ],
        data: &mut value,
        _pad: [0; 16],
    };
    if ifname.len() >= libc::IFNAMSIZ {
        return Err(io::Error::other(format!(
            "interface name {ifname:?} is too long"
        )));
    }
    for (dst, src) in req.name.iter_mut().zip(ifname.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq whose data pointer points at `value`,
    // both alive for the call; the kernel reads and writes only those.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value.data)
}

/// Turns TX checksum offload of `ifname` in `ns` on or off (`ethtool -K
/// IF tx on|off`) and checks that it took.
pub fn set_tx_checksum_offload(ns: &str, ifname: &str, on: bool) -> Result<()> {
    let what = format!("setting tx checksum offload of {ifname} in {ns} to {on}");
    in_netns(ns, || {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
        ethtool_value(&sock, ifname, ETHTOOL_STXCSUM, u32::from(on))?;
        ethtool_value(&sock, ifname, ETHTOOL_GTXCSUM, 0)
    })?
    .map_err(io_err(what.clone()))
    .and_then(|now| {
        if (now != 0) == on {
            Ok(())
        } else {
            Err(ScenarioError::Invalid(format!(
                "{what}: the kernel kept it at {now}"
            )))
        }
    })
}

/// Whether an XDP program is attached to `ifname` in `ns`.
pub fn xdp_attached(ns: &str, ifname: &str) -> bool {
    Command::new("ip")
        .args(["-n", ns, "-d", "-o", "link", "show", "dev", ifname])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| {
            let s = String::from_utf8_lossy(&o.stdout);
            s.contains("prog/xdp") || s.contains(" xdp ") || s.contains(" xdpgeneric ")
        })
}

/// A load client running on its own thread in the client namespace.
pub struct ClientRun {
    started: Instant,
    started_unix_ms: u64,
    handle: thread::JoinHandle<Result<Report>>,
}

impl ClientRun {
    /// When the client's clock started (its timeline's 0), ms since the epoch.
    pub fn started_unix_ms(&self) -> u64 {
        self.started_unix_ms
    }

    /// Time since the client's timeline began.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Milliseconds on the client's timeline for a wall-clock time.
    pub fn timeline_ms(&self, unix_ms: u64) -> i64 {
        unix_ms as i64 - self.started_unix_ms as i64
    }

    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Waits for the report.
    pub fn join(self) -> Result<Report> {
        match self.handle.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Starts [`run_load`] on a thread inside namespace `ns`.
pub fn start_client_in(ns: &str, opts: LoadOptions) -> Result<ClientRun> {
    let ns = ns.to_string();
    let (tx, rx) = mpsc::channel::<(Instant, u64)>();
    let handle = thread::spawn(move || -> Result<Report> {
        in_netns(&ns, move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(io_err("building the client's tokio runtime"))?;
            // run_load's clock starts right after this (it validates first).
            let _ = tx.send((Instant::now(), now_unix_ms()));
            rt.block_on(run_load(opts))
                .map_err(|e| ScenarioError::Client(e.to_string()))
        })?
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok((started, started_unix_ms)) => Ok(ClientRun {
            started,
            started_unix_ms,
            handle,
        }),
        Err(_) => match handle.join() {
            Ok(Err(e)) => Err(e),
            Ok(Ok(_)) => Err(ScenarioError::Client("finished before starting".into())),
            Err(panic) => std::panic::resume_unwind(panic),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_read_from_their_table_only() {
        let text = "# comment\n[daemon]\ninterface = \"eth0\"\n\
                    instance = \"lab-x\"  # trailing comment\n\
                    control_socket=\"/run/xlb/lab-x.sock\"\n\
                    [health_check]\ninstance = \"not-this\"\nfall = 2 # why\n";
        let cases = [
            ("string", "daemon", "instance", Some("lab-x")),
            (
                "no spaces around =",
                "daemon",
                "control_socket",
                Some("/run/xlb/lab-x.sock"),
            ),
            ("absent", "daemon", "metrics_address", None),
            ("other table's key is ignored", "daemon", "fall", None),
            (
                "same key in another table",
                "health_check",
                "instance",
                Some("not-this"),
            ),
            ("number", "health_check", "fall", Some("2")),
        ];
        for (name, table, key, want) in cases {
            assert_eq!(setting(text, table, key).as_deref(), want, "{name}");
        }
        assert_eq!(
            instance_and_socket("[daemon]\ninterface = \"eth0\"\n"),
            ("default".to_string(), PathBuf::from("/run/xlb/xlb.sock")),
            "xlb's defaults"
        );
    }

    #[test]
    fn rendered_config_names_what_the_run_reads() {
        let cfg = XlbConfig::lab_default("Demo_1", Mode::DsrL2, 2);
        let text = cfg.render();
        assert_eq!(
            instance_and_socket(&text),
            (
                "lab-demo_1".to_string(),
                PathBuf::from("/run/xlb/lab-Demo_1.sock")
            )
        );
        for want in [
            "interface = \"eth0\"",
            "interval = \"1000ms\"",
            "fall = 2",
            "name = \"api\"\naddress = \"10.100.0.1\"\nport = 80\nmode = \"dsr-l2\"",
            "name = \"api6\"\naddress = \"fd00:100::1\"",
            "name = \"api2\"\naddress = \"10.100.0.2\"\nport = 80\nmode = \"dsr-ipip\"",
            "address = \"fd00:99::12\"",
            "address = \"10.99.0.12\"",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        assert!(!text.contains("10.99.0.13"), "only two backends:\n{text}");
    }

    #[test]
    fn protection_and_hang_timeout_are_written_only_when_set() {
        let plain = XlbConfig::for_prefix("p").render();
        for absent in ["hang_timeout", "[protection]", "[vip.protection]"] {
            assert!(!plain.contains(absent), "{absent} in:\n{plain}");
        }

        let mut cfg = XlbConfig::for_prefix("p");
        cfg.health = Health {
            hang_timeout: Some(Duration::from_secs(1)),
            ..Health::xlb_defaults()
        };
        cfg.protection = Protection {
            max_ejected: Some(Share::Percent(10)),
            outlier_factor: Some(3.0),
            slow_start: Some(Duration::from_secs(10)),
            flap_damping: Some(false),
            ..Protection::default()
        };
        cfg.vips[0].protection = Some(Protection {
            min_healthy: Some(Share::Count(2)),
            flap_limit: Some(4),
            ..Protection::default()
        });
        let text = cfg.render();
        for want in [
            "[health_check]\nkind = \"http\"\nhang_timeout = \"1000ms\"\n",
            "\n[protection]\nmax_ejected = \"10%\"\noutlier_factor = 3.0\n\
             slow_start = \"10000ms\"\nflap_damping = false\n",
            "mode = \"dsr-ipip\"\n\n[vip.protection]\nmin_healthy = 2\nflap_limit = 4\n\n[[vip.backend]]",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        for absent in ["interval", "\ntimeout = ", "fall", "min_healthy = 0"] {
            assert!(!text.contains(absent), "{absent:?} in:\n{text}");
        }
        let off = Protection::off().render_keys();
        assert_eq!(off, "min_healthy = 0\nflap_damping = false\n");
    }

    #[test]
    fn status_reads_the_cascade_fields_and_defaults_them() {
        let text = r#"{"instance":"lab-x","counters":{"drop_no_backend":7},
            "vips":[{"name":"api","address":"10.100.0.1","port":80,
            "panic":true,"panic_reason":"kept b2: no_response","fleet_slow":null,
            "ejected_slow":1,"backends":[
              {"address":"10.99.0.11:80","state":"draining","placement":"ejected_slow",
               "placement_reason":"outlier","effective_weight":0.0,"consecutive_slow":3,
               "latency_ms":2500.5,"flows":4,"drain_deadline_unix_ms":null},
              {"address":"10.99.0.12:80","state":"up"}]}]}"#;
        let s = parse_status(text).unwrap();
        assert_eq!(s.counters.get("drop_no_backend"), Some(&7));
        let v = s.vip("api").unwrap();
        assert!(v.panic);
        assert_eq!(v.ejected_slow, 1);
        let b1 = &v.backends[0];
        assert_eq!(b1.placement, "ejected_slow");
        assert_eq!(b1.latency_ms, Some(2500.5));
        assert_eq!(b1.flows, Some(4));
        let b2 = &v.backends[1];
        assert_eq!(
            (b2.placement.as_str(), b2.flows, b2.consecutive_slow),
            ("", None, 0)
        );
        assert_eq!(
            s.summary(),
            "api/10.99.0.11:80=draining(ejected_slow) api/10.99.0.12:80=up api:panic"
        );
    }

    #[test]
    fn status_parses_report_and_envelope() {
        let report = r#"{"version":1,"instance":"lab-x","adopted":true,"extra":1,
            "vips":[{"name":"api","address":"10.100.0.1","port":80,"mode":"dsr-ipip",
            "packets":5,"new_flows":2,"backends":[
              {"address":"10.99.0.11:80","state":"up","new_flows":1,"packets":3,
               "last_transition_reason":null,"since_unix_ms":7},
              {"address":"10.99.0.12:80","state":"down","new_flows":1,
               "last_transition_reason":"connected, no HTTP response within 1s"}]}]}"#;
        let envelope = format!(r#"{{"version":1,"response":"status","data":{report}}}"#);
        for (name, text) in [("report", report.to_string()), ("envelope", envelope)] {
            let s = parse_status(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(s.adopted, "{name}");
            assert!(!s.all_up(), "{name}");
            let b2 = s.backend("api", "10.99.0.12:80".parse().unwrap()).unwrap();
            assert_eq!(b2.state, "down", "{name}");
            assert_eq!(
                b2.last_transition_reason.as_deref(),
                Some("connected, no HTTP response within 1s"),
                "{name}"
            );
            assert_eq!(
                s.summary(),
                "api/10.99.0.11:80=up api/10.99.0.12:80=down",
                "{name}"
            );
        }
        assert!(parse_status("not json").is_err());
        assert!(
            parse_status(r#"{"vips":[]}"#).is_err(),
            "instance is required"
        );
    }

    #[test]
    fn events_parse_in_every_shape() {
        let e1 = r#"{"seq":1,"at_unix_ms":10,"kind":"start","vip":null,"backend":null,"from":null,"to":null,"reason":"started"}"#;
        let e2 = r#"{"seq":2,"at_unix_ms":20,"kind":"transition","vip":"api","backend":"10.99.0.12:80","from":"up","to":"down","reason":"timeout"}"#;
        let cases = [
            ("array", format!("[{e1},{e2}]")),
            ("json lines", format!("{e1}\n{e2}\n")),
            (
                "envelope with array",
                format!(r#"{{"version":1,"response":"events","data":[{e1},{e2}]}}"#),
            ),
            (
                "envelope per line",
                format!(
                    "{{\"version\":1,\"response\":\"event\",\"data\":{e1}}}\n\
                     {{\"version\":1,\"response\":\"event\",\"data\":{e2}}}"
                ),
            ),
        ];
        for (name, text) in cases {
            let ev = parse_events(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(ev.len(), 2, "{name}");
            assert_eq!(ev[1].to.as_deref(), Some("down"), "{name}");
            assert_eq!(ev[1].backend.as_deref(), Some("10.99.0.12:80"), "{name}");
        }
        assert_eq!(parse_events("  \n").unwrap(), Vec::new(), "empty");
        assert!(parse_events("{\"seq\":1}\n").is_err(), "missing fields");
    }

    #[test]
    fn backend_addresses_follow_the_vip_family() {
        let cases = [
            ("v4", "10.100.0.1", 80, 2, "10.99.0.12:80"),
            ("v6", "fd00:100::1", 8080, 3, "[fd00:99::13]:8080"),
        ];
        for (name, vip, port, i, want) in cases {
            assert_eq!(
                backend_addr(vip.parse().unwrap(), port, i).to_string(),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn modes_parse_and_flip() {
        assert_eq!("dsr-ipip".parse::<Mode>(), Ok(Mode::DsrIpip));
        assert_eq!("dsr-l2".parse::<Mode>(), Ok(Mode::DsrL2));
        assert!("nat".parse::<Mode>().is_err());
        assert_eq!(Mode::DsrIpip.other(), Mode::DsrL2);
    }

    #[test]
    fn missing_binaries_say_how_to_build_them() {
        let err = Binaries::next_to(Path::new("/nonexistent/target/release/xlb")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("cargo build --release -p lb-user"), "{msg}");
    }
}
