//! The configuration file: one TOML document.
//!
//! Parsing happens in two steps. serde reads the file into raw structs that
//! mirror it (`deny_unknown_fields` everywhere, so a typo is an error rather
//! than a silently ignored setting; optional fields are `Option` so health
//! checks can be merged field by field). Validation then checks everything it
//! can, collecting every problem instead of stopping at the first, and
//! resolves defaults into the structs the daemon uses ([`Config`]).
//!
//! Every default is a constant in [`defaults`] (or in
//! [`crate::health::spec::defaults`] for health checks) and is shown with a
//! comment in `examples/xlb.toml`.
//!
//! Health-check settings merge field by field, later winning:
//! built-in defaults ← `[health_check]` ← `[vip.health_check]` ←
//! `[vip.backend.health_check]`.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::health::policy::Policy;
use crate::health::spec::{self, CheckKind, CheckSpec, HttpCheck};
use crate::maglev::is_prime;

mod protection;

/// Defaults of the `[daemon]`, `[[vip]]` and `[[vip.backend]]` settings.
/// Health-check defaults are in [`crate::health::spec::defaults`].
pub mod defaults {
    use super::{DownPolicy, Mode, Protocol, XdpMode};
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    use std::time::Duration;

    /// `daemon.xdp_mode`: native (driver) XDP.
    pub const XDP_MODE: XdpMode = XdpMode::Native;
    /// `daemon.instance`: pins live under `/sys/fs/bpf/xlb/default/`.
    pub const INSTANCE: &str = "default";
    /// `daemon.control_socket`.
    pub const CONTROL_SOCKET: &str = "/run/xlb/xlb.sock";
    /// `daemon.metrics_address`: Prometheus metrics on localhost only, since
    /// they name every VIP and backend.
    pub const METRICS_ADDRESS: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9813);
    /// `daemon.conntrack_size` (entries).
    pub const CONNTRACK_SIZE: u32 = lb_common::DEFAULT_CT_SIZE;
    /// `daemon.udp_timeout`.
    pub const UDP_TIMEOUT: Duration = Duration::from_nanos(lb_common::DEFAULT_UDP_TIMEOUT_NS);
    /// `daemon.max_table_size`: the ring stride.
    pub const MAX_TABLE_SIZE: u32 = lb_common::DEFAULT_TABLE_SIZE;
    /// `daemon.probe_concurrency`: health probes in flight at once.
    pub const PROBE_CONCURRENCY: u32 = 256;
    /// `vip.protocol`.
    pub const PROTOCOL: Protocol = Protocol::Tcp;
    /// `vip.mode`.
    pub const MODE: Mode = Mode::DsrIpip;
    /// `vip.down_policy`.
    pub const DOWN_POLICY: DownPolicy = DownPolicy::Rehash;
    /// `vip.table_size`, lowered to `daemon.max_table_size` when that is smaller.
    pub const TABLE_SIZE: u32 = lb_common::DEFAULT_TABLE_SIZE;
    /// `vip.backend.weight`.
    pub const WEIGHT: u32 = 1;
}

/// Largest `vip.backend.weight`. Weights are relative, so 1000 steps are
/// plenty, and the bound keeps the Maglev build short (a backend of weight 1
/// next to one of 1000 claims a slot every 1000 rounds).
pub const MAX_WEIGHT: u32 = 1000;

/// Shortest non-zero `daemon.udp_timeout`: twice the data plane's
/// last-seen refresh period (`lb_common::CT_TOUCH_INTERVAL_NS`).
pub const MIN_UDP_TIMEOUT: Duration = Duration::from_nanos(2 * lb_common::CT_TOUCH_INTERVAL_NS);

/// Largest `daemon.max_table_size` (the largest prime below 2^20). The ring
/// is preallocated for every VIP: `MAX_VIPS` × 2 halves × stride × 8 B (the
/// kernel stores each 4-byte slot in 8), i.e. 1 GiB of kernel memory at this
/// size (64 MiB at the default).
pub const MAX_RING_STRIDE: u32 = 1_048_573;

/// Longest `body_contains`: the prober reads only the first 4 KiB of a body.
const MAX_BODY_CONTAINS: usize = 4096;

/// A socket path must fit `sockaddr_un.sun_path` (108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// XDP attach mode (`daemon.xdp_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpMode {
    /// In the driver, before an skb exists: the fast path.
    Native,
    /// In the generic (skb) path: works on any interface, much slower; for testing.
    Generic,
}

/// Transport protocol of a VIP (`vip.protocol`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    /// The IANA protocol number stored in map keys.
    pub fn as_raw(self) -> u8 {
        match self {
            Protocol::Tcp => lb_common::PROTO_TCP,
            Protocol::Udp => lb_common::PROTO_UDP,
        }
    }
}

/// Forwarding mode of a VIP (`vip.mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Direct server return, the packet encapsulated in IPIP (IPv4 in IPv4 or
    /// IPv6 in IPv6) to the backend, which decapsulates it.
    DsrIpip,
    /// Direct server return by rewriting the destination MAC: the backend must
    /// be on the same L2 segment and hold the VIP on a local interface.
    DsrL2,
}

impl Mode {
    /// `lb_common::MODE_*`, as stored in `VipInfo::mode`.
    pub fn as_raw(self) -> u8 {
        match self {
            Mode::DsrIpip => lb_common::MODE_DSR_IPIP,
            Mode::DsrL2 => lb_common::MODE_DSR_L2,
        }
    }
}

/// What happens to established flows of a backend that goes down (`vip.down_policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DownPolicy {
    /// Pick a live backend from the table: the client gets an RST and reconnects at once.
    Rehash,
    /// Keep sending to the down backend (it may recover before the client gives up).
    Keep,
}

impl DownPolicy {
    /// `lb_common::DOWN_POLICY_*`, as stored in `VipInfo::down_policy`.
    pub fn as_raw(self) -> u8 {
        match self {
            DownPolicy::Rehash => lb_common::DOWN_POLICY_REHASH,
            DownPolicy::Keep => lb_common::DOWN_POLICY_KEEP,
        }
    }
}

macro_rules! display_as_toml {
    ($($ty:ty { $($variant:ident => $text:literal),* })*) => {$(
        impl fmt::Display for $ty {
            /// The spelling used in the configuration file.
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self { $(Self::$variant => $text),* })
            }
        }
    )*};
}
display_as_toml! {
    XdpMode { Native => "native", Generic => "generic" }
    Protocol { Tcp => "tcp", Udp => "udp" }
    Mode { DsrIpip => "dsr-ipip", DsrL2 => "dsr-l2" }
    DownPolicy { Rehash => "rehash", Keep => "keep" }
}

/// A validated configuration with every default resolved.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Config {
    pub daemon: DaemonConfig,
    /// In file order.
    pub vips: Vec<VipConfig>,
    /// Problems that do not stop xlb but that the operator should see (log
    /// them at start and reload), e.g. a VIP without backends.
    pub warnings: Vec<String>,
}

/// The `[daemon]` table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DaemonConfig {
    /// Interface the XDP program is attached to. Required.
    pub interface: String,
    /// Default [`XdpMode::Native`].
    pub xdp_mode: XdpMode,
    /// Pins live under `/sys/fs/bpf/xlb/<instance>/`; `[a-z0-9_-]{1,32}`.
    /// Default `"default"`.
    pub instance: String,
    /// Unix socket of the control API. Default `/run/xlb/xlb.sock`.
    pub control_socket: PathBuf,
    /// Group given the control socket with mode 0660; `None` (the default) =
    /// mode 0600, root only.
    pub socket_group: Option<String>,
    /// Where Prometheus metrics are served; `None` = disabled (`""` in the
    /// file). Default `127.0.0.1:9813`.
    pub metrics_address: Option<SocketAddr>,
    /// Conntrack capacity, entries. Default 1048576.
    pub conntrack_size: u32,
    /// Idle time after which a UDP flow may be re-balanced; 0 = never.
    /// Default 30 s.
    #[serde(serialize_with = "ser_duration")]
    pub udp_timeout: Duration,
    /// Ring stride: the largest `table_size` any VIP may use; a prime.
    /// Default 65537.
    pub max_table_size: u32,
    /// Flow hash key; `None` = random on first start, then kept in the pinned
    /// maps. Set it (the same on every node) so several xlb nodes send a flow
    /// to the same backend. Secret, so never serialized.
    #[serde(skip_serializing)]
    pub hash_seed: Option<[u64; 2]>,
    /// Outer source of IPv4-in-IPv4 packets; `None` = the interface's first
    /// IPv4 address.
    pub encap_source_v4: Option<Ipv4Addr>,
    /// Outer source of IPv6-in-IPv6 packets; `None` = the interface's first
    /// global IPv6 address.
    pub encap_source_v6: Option<Ipv6Addr>,
    /// Health probes in flight at once. Default 256.
    pub probe_concurrency: u32,
}

/// One `[[vip]]`: a service address, port and protocol.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VipConfig {
    /// Unique name, `[A-Za-z0-9_.-]{1,64}`.
    pub name: String,
    pub addr: IpAddr,
    pub port: u16,
    /// Default [`Protocol::Tcp`].
    pub protocol: Protocol,
    /// Default [`Mode::DsrIpip`].
    pub mode: Mode,
    /// Default [`DownPolicy::Rehash`].
    pub down_policy: DownPolicy,
    /// Maglev table size, a prime ≤ `daemon.max_table_size`. Default 65537
    /// (or `max_table_size` if that is smaller).
    pub table_size: u32,
    /// What the VIP does when backends are slow or failing: `[protection]`
    /// merged with `[vip.protection]`.
    #[serde(serialize_with = "protection::ser_policy")]
    pub protection: Policy,
    /// In file order.
    pub backends: Vec<BackendConfig>,
}

/// One `[[vip.backend]]`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BackendConfig {
    pub addr: IpAddr,
    /// Always the VIP's port: DSR does not translate ports.
    pub port: u16,
    /// 0..=[`MAX_WEIGHT`], default 1; 0 = no new flows.
    pub weight: u32,
    /// The merged health check; `health.port` is the backend's `health_port`
    /// (default: `port`).
    #[serde(serialize_with = "ser_check_spec")]
    pub health: CheckSpec,
}

impl BackendConfig {
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.addr, self.port)
    }
}

/// Every problem found in a configuration, one line each, each naming the
/// file and where in it.
#[derive(Debug, thiserror::Error)]
#[error("{}", problems.join("\n"))]
pub struct ConfigErrors {
    pub problems: Vec<String>,
}

impl Config {
    /// Reads and validates the configuration file at `path`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, ConfigErrors> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigErrors {
            problems: vec![format!(
                "{}: cannot read the configuration: {e}",
                path.display()
            )],
        })?;
        Config::from_str(&text, &path.display().to_string())
    }

    /// Parses and validates configuration `text`; `origin` (usually the file
    /// name) prefixes every message.
    pub fn from_str(text: &str, origin: &str) -> Result<Config, ConfigErrors> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigErrors {
            problems: vec![format!("{origin}: {}", e.to_string().trim_end())],
        })?;
        let mut p = Problems {
            origin,
            errors: Vec::new(),
            warnings: Vec::new(),
        };
        let config = validate(&raw, &mut p);
        if p.errors.is_empty() {
            Ok(Config {
                warnings: p.warnings,
                ..config
            })
        } else {
            Err(ConfigErrors { problems: p.errors })
        }
    }

    /// The VIP called `name`.
    pub fn vip(&self, name: &str) -> Option<&VipConfig> {
        self.vips.iter().find(|v| v.name == name)
    }
}

/// Parses a duration such as `"500ms"`, `"2s"`, `"1.5s"`, `"1m"` or `"1h"`:
/// one decimal number and one unit (`ms`, `s`, `m`, `h`). The error says
/// what was wrong, without saying where.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "{text:?} is not a duration; write a number and a unit (ms, s, m or h), \
             e.g. \"500ms\", \"2s\", \"1.5s\", \"1m\""
        )
    };
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .ok_or_else(bad)?;
    let (number, unit) = t.split_at(split);
    let unit_ns: u128 = match unit {
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return Err(bad()),
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    // "1." and ".5" are fine, "." and "1.2.3" are not; more than nine
    // decimals is below a nanosecond at any unit.
    if (int.is_empty() && frac.is_empty()) || !digits_ok(int) || !digits_ok(frac) || frac.len() > 9
    {
        return Err(bad());
    }
    let int: u128 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| bad())?
    };
    let frac_value: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| bad())?
    };
    let nanos = int
        .checked_mul(unit_ns)
        .and_then(|n| n.checked_add(frac_value * unit_ns / 10u128.pow(frac.len() as u32)))
        .filter(|&n| n <= u128::from(u64::MAX))
        .ok_or_else(|| format!("{text:?} is too long a duration"))?;
    Ok(Duration::from_nanos(nanos as u64))
}

/// `"10%"` (spaces allowed around the number) → 10.0; `None` if not that
/// form. Ranges are the caller's.
fn parse_percent(text: &str) -> Option<f64> {
    text.trim()
        .strip_suffix('%')
        .and_then(|n| n.trim().parse::<f64>().ok())
}

fn ser_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    // Debug prints "2s", "500ms", "1.5s": readable and parseable back.
    s.collect_str(&format_args!("{d:?}"))
}

fn ser_check_spec<S: Serializer>(spec: &CheckSpec, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct View<'a> {
        kind: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        method: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        path: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        host: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        expect_status: Option<Vec<String>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        body_contains: Option<&'a str>,
        port: u16,
        #[serde(serialize_with = "ser_duration")]
        interval: Duration,
        #[serde(serialize_with = "ser_duration")]
        timeout: Duration,
        #[serde(serialize_with = "ser_duration")]
        hang_timeout: Duration,
        rise: u32,
        fall: u32,
        #[serde(serialize_with = "ser_duration")]
        fast_interval: Duration,
        #[serde(serialize_with = "ser_duration")]
        down_interval: Duration,
        jitter: f64,
        via: &'static str,
        auto_timeout: bool,
    }
    let http = match &spec.kind {
        CheckKind::Http(h) => Some(h),
        CheckKind::Tcp => None,
    };
    View {
        kind: if http.is_some() { "http" } else { "tcp" },
        method: http.map(|h| h.method.as_str()),
        path: http.map(|h| h.path.as_str()),
        host: http.and_then(|h| h.host.as_deref()),
        expect_status: http.map(|h| {
            h.expect_status
                .iter()
                .map(|&(lo, hi)| {
                    if lo == hi {
                        lo.to_string()
                    } else {
                        format!("{lo}-{hi}")
                    }
                })
                .collect()
        }),
        body_contains: http.and_then(|h| h.body_contains.as_deref()),
        port: spec.port,
        interval: spec.interval,
        timeout: spec.timeout,
        hang_timeout: spec.hang_timeout,
        rise: spec.rise,
        fall: spec.fall,
        fast_interval: spec.fast_interval,
        down_interval: spec.down_interval,
        jitter: spec.jitter,
        via: spec.via.as_str(),
        auto_timeout: spec.auto_timeout,
    }
    .serialize(s)
}

// ---------------------------------------------------------------------------
// The file as written.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    daemon: RawDaemon,
    health_check: Option<RawHealth>,
    protection: Option<protection::RawProtection>,
    #[serde(default)]
    vip: Vec<RawVip>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDaemon {
    interface: String,
    xdp_mode: Option<XdpMode>,
    instance: Option<String>,
    control_socket: Option<PathBuf>,
    socket_group: Option<String>,
    /// A string rather than a `SocketAddr` so that `""` can disable metrics.
    metrics_address: Option<String>,
    conntrack_size: Option<u32>,
    udp_timeout: Option<String>,
    max_table_size: Option<u32>,
    hash_seed: Option<String>,
    encap_source_v4: Option<Ipv4Addr>,
    encap_source_v6: Option<Ipv6Addr>,
    probe_concurrency: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVip {
    name: String,
    address: IpAddr,
    port: u16,
    protocol: Option<Protocol>,
    mode: Option<Mode>,
    down_policy: Option<DownPolicy>,
    table_size: Option<u32>,
    health_check: Option<RawHealth>,
    protection: Option<protection::RawProtection>,
    #[serde(default)]
    backend: Vec<RawBackend>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    address: IpAddr,
    port: Option<u16>,
    weight: Option<u32>,
    health_port: Option<u16>,
    health_check: Option<RawHealth>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum KindName {
    Http,
    Tcp,
}

/// `via = "vip"` or `via = "direct"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ViaName {
    Direct,
    Vip,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    kind: Option<KindName>,
    method: Option<String>,
    path: Option<String>,
    host: Option<String>,
    expect_status: Option<Vec<RawStatus>>,
    body_contains: Option<String>,
    interval: Option<String>,
    timeout: Option<String>,
    hang_timeout: Option<String>,
    rise: Option<u32>,
    fall: Option<u32>,
    fast_interval: Option<String>,
    down_interval: Option<String>,
    jitter: Option<RawJitter>,
    via: Option<ViaName>,
    /// Accepted by the parser only to answer with a useful message: the
    /// probed port belongs to each backend (`health_port`).
    port: Option<toml::Value>,
}

/// `jitter = 0.1` or `jitter = "10%"`.
enum RawJitter {
    Fraction(f64),
    Text(String),
}

/// An `expect_status` item: `200` or `"200"` or `"200-299"`.
enum RawStatus {
    Code(i64),
    Text(String),
}

impl<'de> Deserialize<'de> for RawJitter {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawJitter;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a fraction such as 0.1 or a percentage such as \"10%\"")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawJitter, E> {
                Ok(RawJitter::Fraction(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawJitter, E> {
                Ok(RawJitter::Fraction(v as f64))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawJitter, E> {
                Ok(RawJitter::Fraction(v as f64))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawJitter, E> {
                Ok(RawJitter::Text(v.to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for RawStatus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawStatus;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a status code such as 200 or a range such as \"200-299\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawStatus, E> {
                Ok(RawStatus::Code(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawStatus, E> {
                Ok(RawStatus::Code(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawStatus, E> {
                Ok(RawStatus::Text(v.to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}

// ---------------------------------------------------------------------------
// Validation.

struct Problems<'a> {
    origin: &'a str,
    errors: Vec<String>,
    warnings: Vec<String>,
}

impl Problems<'_> {
    fn line(&self, ctx: &str, msg: &dyn fmt::Display) -> String {
        if ctx.is_empty() {
            format!("{}: {msg}", self.origin)
        } else {
            format!("{}: {ctx}: {msg}", self.origin)
        }
    }

    /// Records an error once: a daemon-wide health setting is checked again
    /// for every backend that inherits it.
    fn error(&mut self, ctx: &str, msg: impl fmt::Display) {
        let line = self.line(ctx, &msg);
        if !self.errors.contains(&line) {
            self.errors.push(line);
        }
    }

    fn warn(&mut self, ctx: &str, msg: impl fmt::Display) {
        let line = self.line(ctx, &msg);
        if !self.warnings.contains(&line) {
            self.warnings.push(line);
        }
    }
}

fn validate(raw: &RawConfig, p: &mut Problems<'_>) -> Config {
    let daemon = validate_daemon(&raw.daemon, p);

    let global_health = raw
        .health_check
        .as_ref()
        .map(|h| parse_health(h, "health_check", "each [[vip.backend]]", p))
        .unwrap_or_default();
    // Checks the daemon-wide defaults even if no backend inherits them.
    resolve_health(&[(&global_health, "health_check")], 0, p);

    if raw.vip.is_empty() {
        p.warn(
            "",
            "no [[vip]] configured; xlb will pass all traffic to the host",
        );
    }
    let count = raw.vip.len();
    if count > lb_common::MAX_VIPS as usize {
        p.error(
            "",
            format!(
                "{count} VIPs configured, but xlb supports at most {}; \
                 remove VIPs or run another xlb instance",
                lb_common::MAX_VIPS
            ),
        );
    }
    let total: usize = raw.vip.iter().map(|v| v.backend.len()).sum();
    let max_backends = lb_common::MAX_BACKENDS as usize - 1;
    if total > max_backends {
        p.error(
            "",
            format!(
                "{total} backends in total across all VIPs, but xlb supports at most \
                 {max_backends}; remove backends or split the VIPs across instances"
            ),
        );
    }

    let mut names: HashSet<&str> = HashSet::new();
    let mut services: HashMap<(IpAddr, u16, Protocol), &str> = HashMap::new();
    let vips = raw
        .vip
        .iter()
        .map(|v| {
            let globals = (&global_health, raw.protection.as_ref());
            validate_vip(v, &daemon, globals, &mut names, &mut services, p)
        })
        .collect();

    Config {
        daemon,
        vips,
        warnings: Vec::new(),
    }
}

fn validate_daemon(raw: &RawDaemon, p: &mut Problems<'_>) -> DaemonConfig {
    const CTX: &str = "daemon";

    // The kernel's dev_valid_name(): shorter than IFNAMSIZ (16), no '/', ':'
    // or whitespace, not "." or "..".
    let ifname = &raw.interface;
    if ifname.is_empty()
        || ifname.len() > 15
        || ifname == "."
        || ifname == ".."
        || ifname
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        p.error(
            CTX,
            format!(
                "interface {ifname:?} is not a valid interface name; \
                 use the name `ip link` shows, e.g. \"eth0\" (1 to 15 characters)"
            ),
        );
    }

    let xdp_mode = raw.xdp_mode.unwrap_or(defaults::XDP_MODE);
    if xdp_mode == XdpMode::Generic {
        p.warn(
            CTX,
            "xdp_mode = \"generic\" runs XDP after the kernel has built an skb: \
             much slower than \"native\"; use it for testing only",
        );
    }

    let instance = raw
        .instance
        .clone()
        .unwrap_or_else(|| defaults::INSTANCE.to_owned());
    if instance.is_empty()
        || instance.len() > 32
        || !instance
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    {
        p.error(
            CTX,
            format!("instance {instance:?} is invalid; use 1 to 32 characters from a-z 0-9 _ -"),
        );
    }

    let control_socket = raw
        .control_socket
        .clone()
        .unwrap_or_else(|| PathBuf::from(defaults::CONTROL_SOCKET));
    if !control_socket.is_absolute() {
        p.error(
            CTX,
            format!(
                "control_socket {:?} is not an absolute path; use e.g. {:?}",
                control_socket.display().to_string(),
                defaults::CONTROL_SOCKET
            ),
        );
    } else if control_socket.as_os_str().len() > MAX_SOCKET_PATH {
        p.error(
            CTX,
            format!(
                "control_socket is {} bytes long, but a Unix socket path may have at most \
                 {MAX_SOCKET_PATH}; use a shorter path",
                control_socket.as_os_str().len()
            ),
        );
    }

    if raw.socket_group.as_deref() == Some("") {
        p.error(
            CTX,
            "socket_group is empty; name a group, or remove socket_group to keep \
             the control socket root-only (mode 0600)",
        );
    }

    let metrics_address = match raw.metrics_address.as_deref() {
        None => Some(defaults::METRICS_ADDRESS),
        Some("") => None,
        Some(text) => match text.parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(_) => {
                p.error(
                    CTX,
                    format!(
                        "metrics_address {text:?} is not an address:port; use e.g. \
                         \"127.0.0.1:9813\" or \"[::1]:9813\", or \"\" to disable metrics"
                    ),
                );
                None
            }
        },
    };

    let conntrack_size = raw.conntrack_size.unwrap_or(defaults::CONNTRACK_SIZE);
    if conntrack_size == 0 {
        p.error(
            CTX,
            format!(
                "conntrack_size must be at least 1 (default {})",
                defaults::CONNTRACK_SIZE
            ),
        );
    }

    // 0 is meaningful here: UDP flows never expire.
    let udp_timeout = match raw.udp_timeout.as_deref().map(parse_duration) {
        None => defaults::UDP_TIMEOUT,
        Some(Ok(d)) if !d.is_zero() && d < MIN_UDP_TIMEOUT => {
            // The data plane refreshes an entry's last-seen time once a
            // second; a shorter timeout would expire busy flows.
            p.error(
                CTX,
                format!(
                    "udp_timeout {d:?} is too short: conntrack refreshes a flow's last-seen time \
                     once a second, so use 0 (never expire) or at least {MIN_UDP_TIMEOUT:?}"
                ),
            );
            defaults::UDP_TIMEOUT
        }
        Some(Ok(d)) => d,
        Some(Err(e)) => {
            p.error(CTX, format!("udp_timeout {e}"));
            defaults::UDP_TIMEOUT
        }
    };

    let max_table_size = raw.max_table_size.unwrap_or(defaults::MAX_TABLE_SIZE);
    if !is_prime(max_table_size) {
        p.error(
            CTX,
            format!(
                "max_table_size {max_table_size} is not prime; use a prime such as {}",
                suggest_prime(max_table_size, MAX_RING_STRIDE)
            ),
        );
    } else if max_table_size > MAX_RING_STRIDE {
        p.error(
            CTX,
            format!(
                "max_table_size {max_table_size} is too large: the ring would take \
                 {} MiB of kernel memory; use a prime of at most {MAX_RING_STRIDE}",
                (u64::from(lb_common::MAX_VIPS) * 2 * u64::from(max_table_size) * 8) >> 20
            ),
        );
    }

    let hash_seed = raw.hash_seed.as_deref().and_then(|text| {
        let seed = parse_hash_seed(text);
        if seed.is_none() {
            p.error(
                CTX,
                format!(
                    "hash_seed must be 32 hexadecimal digits (128 bits), got {} characters; \
                     generate one with `openssl rand -hex 16`, or remove hash_seed to get a \
                     random one on first start",
                    text.chars().count()
                ),
            );
        }
        seed
    });

    if let Some(a) = raw.encap_source_v4
        && (a.is_unspecified() || a.is_multicast() || a.is_broadcast() || a.is_loopback())
    {
        p.error(
            CTX,
            format!(
                "encap_source_v4 {a} cannot be a packet's source; use an address of this host \
                 that backends can reach, or remove it to use the interface's address"
            ),
        );
    }
    if let Some(a) = raw.encap_source_v6
        && (a.is_unspecified() || a.is_multicast() || a.is_loopback())
    {
        p.error(
            CTX,
            format!(
                "encap_source_v6 {a} cannot be a packet's source; use an address of this host \
                 that backends can reach, or remove it to use the interface's address"
            ),
        );
    }

    let probe_concurrency = raw.probe_concurrency.unwrap_or(defaults::PROBE_CONCURRENCY);
    // More probes than backends can never be in flight at once.
    if probe_concurrency == 0 || probe_concurrency > lb_common::MAX_BACKENDS {
        p.error(
            CTX,
            format!(
                "probe_concurrency {probe_concurrency} is out of range; use 1 to {} (default {})",
                lb_common::MAX_BACKENDS,
                defaults::PROBE_CONCURRENCY
            ),
        );
    }

    DaemonConfig {
        interface: raw.interface.clone(),
        xdp_mode,
        instance,
        control_socket,
        socket_group: raw.socket_group.clone(),
        metrics_address,
        conntrack_size,
        udp_timeout,
        max_table_size,
        hash_seed,
        encap_source_v4: raw.encap_source_v4,
        encap_source_v6: raw.encap_source_v6,
        probe_concurrency,
    }
}

/// 32 hex digits: the first 16 are key word 0, the next 16 word 1, each
/// read as a big-endian hexadecimal number.
fn parse_hash_seed(text: &str) -> Option<[u64; 2]> {
    if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let word = |s: &str| u64::from_str_radix(s, 16).ok();
    Some([word(&text[..16])?, word(&text[16..])?])
}

/// A prime near `n` to suggest: the next one up, or the previous one if the
/// next is above `max`.
fn suggest_prime(n: u32, max: u32) -> u32 {
    let up = (n.max(2)..=u32::MAX)
        .find(|&c| is_prime(c))
        .unwrap_or(u32::MAX);
    if up <= max {
        return up;
    }
    (2..=n.min(max)).rev().find(|&c| is_prime(c)).unwrap_or(2)
}

/// `globals`: the daemon-wide `[health_check]` and `[protection]` tables,
/// which this VIP's own tables override field by field.
fn validate_vip<'a>(
    raw: &'a RawVip,
    daemon: &DaemonConfig,
    (global_health, global_protection): (&HealthLayer, Option<&protection::RawProtection>),
    names: &mut HashSet<&'a str>,
    services: &mut HashMap<(IpAddr, u16, Protocol), &'a str>,
    p: &mut Problems<'_>,
) -> VipConfig {
    let ctx = format!("vip {:?}", raw.name);
    let name = &raw.name;
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    {
        p.error(
            &ctx,
            "name is invalid; use 1 to 64 characters from A-Z a-z 0-9 _ . -",
        );
    }
    if !names.insert(name) {
        p.error(
            "",
            format!("vip {name:?} is defined twice; VIP names must be unique"),
        );
    }

    let addr = raw.address;
    if addr.is_unspecified() || addr.is_multicast() || is_v4_broadcast(addr) {
        p.error(
            &ctx,
            format!("address {addr} cannot be a VIP; use a unicast address"),
        );
    }
    if raw.port == 0 {
        p.error(&ctx, "port 0 is invalid; use 1 to 65535");
    }
    let protocol = raw.protocol.unwrap_or(defaults::PROTOCOL);
    let mode = raw.mode.unwrap_or(defaults::MODE);
    let service = SocketAddr::new(addr, raw.port);
    if let Some(other) = services.insert((addr, raw.port, protocol), name) {
        p.error(
            "",
            format!("vip {name:?} address {service}/{protocol} is also used by vip {other:?}"),
        );
    }

    let n = raw.backend.len();
    let table_size = raw
        .table_size
        .unwrap_or(defaults::TABLE_SIZE.min(daemon.max_table_size));
    if !is_prime(table_size) {
        p.error(
            &ctx,
            format!(
                "table_size {table_size} is not prime; use a prime such as {}",
                suggest_prime(table_size, daemon.max_table_size)
            ),
        );
    } else if table_size > daemon.max_table_size {
        p.error(
            &ctx,
            format!(
                "table_size {table_size} is larger than daemon.max_table_size {}; \
                 use a smaller prime or raise max_table_size",
                daemon.max_table_size
            ),
        );
    } else if (table_size as usize) < n {
        p.error(
            &ctx,
            format!(
                "table_size {table_size} is smaller than its {n} backends, so some would get \
                 no slot; use a prime of at least {} (10 × backends), such as {}",
                10 * n,
                suggest_prime(10 * n as u32, u32::MAX)
            ),
        );
    } else if (table_size as usize) < 10 * n {
        p.warn(
            &ctx,
            format!(
                "table_size {table_size} is less than 10 × its {n} backends, so their shares \
                 of flows will be uneven; use a prime of at least {}, such as {}",
                10 * n,
                suggest_prime(10 * n as u32, u32::MAX)
            ),
        );
    }

    let vip_hctx = format!("{ctx}: health_check");
    let vip_health = raw
        .health_check
        .as_ref()
        .map(|h| parse_health(h, &vip_hctx, "each [[vip.backend]]", p))
        .unwrap_or_default();
    resolve_health(
        &[(global_health, "health_check"), (&vip_health, &vip_hctx)],
        0,
        p,
    );

    if n == 0 {
        p.warn(
            "",
            format!(
                "vip {name:?} has no backends; it will drop new flows until backends are added"
            ),
        );
    } else if raw.backend.iter().all(|b| b.weight == Some(0)) {
        p.warn(
            &ctx,
            "every backend has weight 0, so the VIP takes no new flows and will drop them",
        );
    }

    let mut seen: HashSet<(IpAddr, u16)> = HashSet::new();
    let backends = raw
        .backend
        .iter()
        .map(|b| {
            let port = b.port.unwrap_or(raw.port);
            let bctx = format!("{ctx}: backend {}", SocketAddr::new(b.address, port));
            if port != raw.port {
                p.error(
                    &bctx,
                    format!(
                        "port {port} differs from the VIP port {}; DSR modes do not translate \
                         ports, so the backend must serve port {} itself (remove port or set \
                         it to {})",
                        raw.port, raw.port, raw.port
                    ),
                );
            }
            if !seen.insert((b.address, port)) {
                p.error(
                    &ctx,
                    format!("backend {} listed twice", SocketAddr::new(b.address, port)),
                );
            }
            if b.address.is_ipv4() != addr.is_ipv4() {
                let (have, want) = if addr.is_ipv4() {
                    ("IPv6", "IPv4")
                } else {
                    ("IPv4", "IPv6")
                };
                let why = match mode {
                    Mode::DsrIpip => {
                        format!("dsr-ipip encapsulates in the VIP's family ({want} in {want})")
                    }
                    Mode::DsrL2 => format!(
                        "dsr-l2 finds the backend's MAC address by a route lookup in the \
                         VIP's family ({want})"
                    ),
                };
                p.error(
                    &ctx,
                    format!(
                        "backend {} is {have} but the VIP is {want}; {why}, so use an {want} \
                         backend address",
                        SocketAddr::new(b.address, port)
                    ),
                );
            } else if b.address == addr {
                p.error(
                    &bctx,
                    "the backend address is the VIP address itself; name a real server",
                );
            }
            if b.address.is_unspecified() || b.address.is_multicast() || is_v4_broadcast(b.address)
            {
                p.error(
                    &bctx,
                    "address cannot be a backend; use the server's unicast address",
                );
            }
            let weight = b.weight.unwrap_or(defaults::WEIGHT);
            if weight > MAX_WEIGHT {
                p.error(
                    &bctx,
                    format!(
                        "weight {weight} is too large; use 0 to {MAX_WEIGHT} \
                         (weights are relative; 0 takes no new flows)"
                    ),
                );
            }
            let health_port = b.health_port.unwrap_or(port);
            if health_port == 0 {
                p.error(
                    &bctx,
                    "health_port 0 is invalid; use 1 to 65535, \
                     or remove it to probe the service port",
                );
            }
            let be_hctx = format!("{bctx}: health_check");
            let be_health = b
                .health_check
                .as_ref()
                .map(|h| parse_health(h, &be_hctx, "this backend", p))
                .unwrap_or_default();
            let health = resolve_health(
                &[
                    (global_health, "health_check"),
                    (&vip_health, &vip_hctx),
                    (&be_health, &be_hctx),
                ],
                health_port,
                p,
            );
            BackendConfig {
                addr: b.address,
                port,
                weight,
                health,
            }
        })
        .collect();

    VipConfig {
        name: raw.name.clone(),
        addr,
        port: raw.port,
        protocol,
        mode,
        down_policy: raw.down_policy.unwrap_or(defaults::DOWN_POLICY),
        table_size,
        protection: protection::resolve(
            &[
                (global_protection, "protection"),
                (raw.protection.as_ref(), &format!("{ctx}: protection")),
            ],
            p,
        ),
        backends,
    }
}

fn is_v4_broadcast(a: IpAddr) -> bool {
    matches!(a, IpAddr::V4(v4) if v4.is_broadcast())
}

// ---------------------------------------------------------------------------
// Health checks.

/// One health_check table, values parsed, fields absent stay `None`.
#[derive(Clone, Debug, Default)]
struct HealthLayer {
    kind: Option<KindName>,
    method: Option<String>,
    path: Option<String>,
    host: Option<String>,
    expect_status: Option<Vec<(u16, u16)>>,
    body_contains: Option<String>,
    interval: Option<Duration>,
    timeout: Option<Duration>,
    /// `Some(true)` for `timeout = "auto"`, `Some(false)` for a duration.
    timeout_auto: Option<bool>,
    hang_timeout: Option<Duration>,
    rise: Option<u32>,
    fall: Option<u32>,
    fast_interval: Option<Duration>,
    down_interval: Option<Duration>,
    jitter: Option<f64>,
    via: Option<spec::Via>,
}

/// Checks the values of one table on their own; cross-field rules need the
/// merged result (see [`resolve_health`]).
fn parse_health(raw: &RawHealth, ctx: &str, port_owner: &str, p: &mut Problems<'_>) -> HealthLayer {
    if raw.port.is_some() {
        p.error(
            ctx,
            format!("port is not allowed in a health_check table; set health_port on {port_owner}"),
        );
    }

    let mut duration = |field: &str, value: &Option<String>| -> Option<Duration> {
        match parse_duration(value.as_deref()?) {
            Ok(d) if d.is_zero() => {
                p.error(ctx, format!("{field} must be longer than 0"));
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                p.error(ctx, format!("{field} {e}"));
                None
            }
        }
    };
    let interval = duration("interval", &raw.interval);
    let timeout_auto = raw.timeout.as_deref().map(|t| t.trim() == "auto");
    let timeout = if timeout_auto == Some(true) {
        None
    } else {
        duration("timeout", &raw.timeout)
    };
    let hang_timeout = duration("hang_timeout", &raw.hang_timeout);
    let fast_interval = duration("fast_interval", &raw.fast_interval);
    let down_interval = duration("down_interval", &raw.down_interval);

    for (field, value) in [("rise", raw.rise), ("fall", raw.fall)] {
        if value == Some(0) {
            p.error(ctx, format!("{field} must be at least 1"));
        }
    }

    let jitter = raw.jitter.as_ref().and_then(|j| {
        let (value, shown) = match j {
            RawJitter::Fraction(f) => (Some(*f), f.to_string()),
            RawJitter::Text(t) => (parse_percent(t).map(|v| v / 100.0), format!("{t:?}")),
        };
        match value {
            Some(v) if (0.0..=0.5).contains(&v) => Some(v),
            _ => {
                p.error(
                    ctx,
                    format!(
                        "jitter {shown} is out of range; use a fraction from 0 to 0.5 \
                         or a percentage from \"0%\" to \"50%\""
                    ),
                );
                None
            }
        }
    });

    // The same rules as `HttpCheck::validate` (which the prober applies
    // again), with messages that say where and what to write instead. An
    // invalid value is dropped after its error so the merged spec does not
    // report it a second time.
    let is_tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    let is_visible = |b: u8| (0x21..=0x7e).contains(&b);
    let method = raw.method.clone().filter(|m| {
        let ok = !m.is_empty() && m.bytes().all(is_tchar);
        if !ok {
            p.error(
                ctx,
                format!("method {m:?} is not an HTTP method; use e.g. \"GET\" or \"HEAD\""),
            );
        }
        ok
    });
    let path = raw.path.clone().filter(|path| {
        let ok = path.starts_with('/') && path.bytes().all(is_visible);
        if !ok {
            p.error(
                ctx,
                format!(
                    "path {path:?} is invalid; use a request target starting with '/', \
                     in visible ASCII without spaces (percent-encode others), e.g. \"/health\""
                ),
            );
        }
        ok
    });
    let host = raw.host.clone().filter(|host| {
        let ok = !host.is_empty() && host.bytes().all(is_visible);
        if !ok {
            p.error(
                ctx,
                format!(
                    "host {host:?} is invalid; use a host name in visible ASCII without spaces, \
                     or remove host to send the backend's address"
                ),
            );
        }
        ok
    });
    let body_contains = raw.body_contains.clone().filter(|body| {
        let ok = !body.is_empty() && body.len() <= MAX_BODY_CONTAINS;
        if !ok {
            p.error(
                ctx,
                format!(
                    "body_contains must be 1 to {MAX_BODY_CONTAINS} bytes (only the start of the \
                     body is read); remove it to accept any body"
                ),
            );
        }
        ok
    });

    let expect_status = raw.expect_status.as_ref().and_then(|items| {
        if items.is_empty() {
            p.error(
                ctx,
                "expect_status is empty; list at least one code or range, e.g. [\"200-299\"]",
            );
            return None;
        }
        let mut ranges = Vec::new();
        for item in items {
            match parse_status(item) {
                Some(r) => ranges.push(r),
                None => {
                    let shown = match item {
                        RawStatus::Code(c) => c.to_string(),
                        RawStatus::Text(t) => format!("{t:?}"),
                    };
                    p.error(
                        ctx,
                        format!(
                            "expect_status {shown} is not a status code or range; \
                             write e.g. \"200\" or \"200-299\" (codes 100 to 599)"
                        ),
                    );
                }
            }
        }
        (ranges.len() == items.len()).then_some(ranges)
    });

    HealthLayer {
        kind: raw.kind,
        method,
        path,
        host,
        expect_status,
        body_contains,
        interval,
        timeout,
        timeout_auto,
        hang_timeout,
        rise: raw.rise.filter(|&r| r > 0),
        fall: raw.fall.filter(|&f| f > 0),
        fast_interval,
        down_interval,
        jitter,
        via: raw.via.map(|v| match v {
            ViaName::Direct => spec::Via::Direct,
            ViaName::Vip => spec::Via::Vip,
        }),
    }
}

fn parse_status(item: &RawStatus) -> Option<(u16, u16)> {
    let code = |v: i64| u16::try_from(v).ok().filter(|c| (100..=599).contains(c));
    let (lo, hi) = match item {
        RawStatus::Code(c) => (code(*c)?, code(*c)?),
        RawStatus::Text(t) => {
            let num = |s: &str| code(s.trim().parse::<i64>().ok()?);
            match t.split_once('-') {
                Some((lo, hi)) => (num(lo)?, num(hi)?),
                None => (num(t)?, num(t)?),
            }
        }
    };
    (lo <= hi).then_some((lo, hi))
}

/// Merges `layers` (least specific first) over the built-in defaults, checks
/// the rules that involve several fields, and returns the spec for a backend
/// probed on `port`. A problem is reported against the most specific layer
/// that set one of the fields involved, so it is reported once.
fn resolve_health(layers: &[(&HealthLayer, &str)], port: u16, p: &mut Problems<'_>) -> CheckSpec {
    /// The value from the most specific layer that sets it, and that layer.
    fn pick<T: Clone>(
        layers: &[(&HealthLayer, &str)],
        field: impl Fn(&HealthLayer) -> &Option<T>,
    ) -> (Option<T>, Option<usize>) {
        layers
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, (l, _))| field(l).clone().map(|v| (Some(v), Some(i))))
            .unwrap_or((None, None))
    }
    let ctx_of = |i: Option<usize>| i.map_or("health_check", |i| layers[i].1);

    let (interval, interval_src) = pick(layers, |l| &l.interval);
    let (timeout, timeout_src) = pick(layers, |l| &l.timeout);
    let interval = interval.unwrap_or(spec::defaults::INTERVAL);
    // `timeout = "auto"` in the most specific layer that sets a timeout:
    // the default is where the deadline starts (never past the interval).
    let auto_timeout = pick(layers, |l| &l.timeout_auto).0.unwrap_or(false);
    let timeout = if auto_timeout {
        spec::defaults::TIMEOUT.min(interval)
    } else {
        timeout.unwrap_or(spec::defaults::TIMEOUT)
    };
    if timeout > interval {
        p.error(
            ctx_of(interval_src.max(timeout_src)),
            format!(
                "timeout {timeout:?} is longer than interval {interval:?}; the timeout must be \
                 at most the interval, so a probe ends before the next one starts"
            ),
        );
    }

    let (hang_timeout, hang_src) = pick(layers, |l| &l.hang_timeout);
    let hang_timeout = match hang_timeout {
        None => spec::default_hang_timeout(timeout),
        Some(hang) if hang < timeout => {
            p.error(
                ctx_of(hang_src.max(timeout_src)),
                format!(
                    "hang_timeout {hang:?} is shorter than timeout {timeout:?}; use at least the \
                     timeout (equal to it makes a late answer a failure, as without hang_timeout)"
                ),
            );
            timeout
        }
        Some(hang) if hang > spec::MAX_HANG_TIMEOUT => {
            p.error(
                ctx_of(hang_src),
                format!(
                    "hang_timeout {hang:?} is longer than {:?}; a backend that has not answered \
                     in a minute is hung, and each waiting probe holds a socket: use at most \"{}s\"",
                    spec::MAX_HANG_TIMEOUT,
                    spec::MAX_HANG_TIMEOUT.as_secs()
                ),
            );
            spec::MAX_HANG_TIMEOUT
        }
        Some(hang) => hang,
    };

    let (kind, kind_src) = pick(layers, |l| &l.kind);
    let kind = kind.unwrap_or(KindName::Http);
    if kind == KindName::Tcp {
        // HTTP settings inherited from a less specific layer are simply not
        // used; ones set alongside or below `kind = "tcp"` are a mistake.
        let from = kind_src.unwrap_or(0);
        for (layer, ctx) in &layers[from..] {
            let http_fields = [
                ("method", layer.method.is_some()),
                ("path", layer.path.is_some()),
                ("host", layer.host.is_some()),
                ("expect_status", layer.expect_status.is_some()),
                ("body_contains", layer.body_contains.is_some()),
            ];
            for (field, set) in http_fields {
                if set {
                    p.error(
                        ctx,
                        format!(
                            "{field} applies only to kind = \"http\", but this check's kind is \
                             \"tcp\"; remove {field} or set kind = \"http\""
                        ),
                    );
                }
            }
        }
    }

    let kind = match kind {
        KindName::Tcp => CheckKind::Tcp,
        KindName::Http => CheckKind::Http(http_check(layers, p)),
    };
    CheckSpec {
        kind,
        port,
        interval,
        timeout,
        hang_timeout,
        rise: pick(layers, |l| &l.rise).0.unwrap_or(spec::defaults::RISE),
        fall: pick(layers, |l| &l.fall).0.unwrap_or(spec::defaults::FALL),
        // Never slower than `interval`: a fast profile (interval 200ms) must
        // not confirm a failure more slowly than its steady probing.
        fast_interval: pick(layers, |l| &l.fast_interval)
            .0
            .unwrap_or(spec::defaults::FAST_INTERVAL.min(interval)),
        down_interval: pick(layers, |l| &l.down_interval)
            .0
            .unwrap_or(spec::defaults::DOWN_INTERVAL),
        jitter: pick(layers, |l| &l.jitter)
            .0
            .unwrap_or(spec::defaults::JITTER),
        via: pick(layers, |l| &l.via).0.unwrap_or(spec::defaults::VIA),
        auto_timeout,
    }
}

/// The merged HTTP settings of `layers`, checked once more as the prober
/// will check them.
fn http_check(layers: &[(&HealthLayer, &str)], p: &mut Problems<'_>) -> HttpCheck {
    let last = |field: fn(&HealthLayer) -> &Option<String>| {
        layers.iter().rev().find_map(|(l, _)| field(l).clone())
    };
    let check = HttpCheck {
        method: last(|l| &l.method).unwrap_or_else(|| spec::defaults::HTTP_METHOD.to_owned()),
        path: last(|l| &l.path).unwrap_or_else(|| spec::defaults::HTTP_PATH.to_owned()),
        host: last(|l| &l.host),
        expect_status: layers
            .iter()
            .rev()
            .find_map(|(l, _)| l.expect_status.clone())
            .unwrap_or_else(|| vec![spec::defaults::EXPECT_STATUS]),
        body_contains: last(|l| &l.body_contains),
    };
    // Unreachable while `parse_health` is at least as strict; kept so a rule
    // added to the prober cannot let a config through that every probe fails.
    if let Err(e) = check.validate() {
        p.error(
            layers.last().map_or("health_check", |l| l.1),
            format!("{e}"),
        );
    }
    check
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGIN: &str = "xlb.toml";
    const DAEMON: &str = "[daemon]\ninterface = \"eth0\"\n";

    fn parse(text: &str) -> Result<Config, ConfigErrors> {
        Config::from_str(text, ORIGIN)
    }

    fn ok(name: &str, text: &str) -> Config {
        parse(text).unwrap_or_else(|e| panic!("{name}: unexpected errors:\n{e}"))
    }

    fn default_http() -> CheckKind {
        CheckKind::Http(HttpCheck {
            method: spec::defaults::HTTP_METHOD.to_owned(),
            path: spec::defaults::HTTP_PATH.to_owned(),
            host: None,
            expect_status: vec![spec::defaults::EXPECT_STATUS],
            body_contains: None,
        })
    }

    fn default_check(port: u16) -> CheckSpec {
        CheckSpec {
            kind: default_http(),
            port,
            interval: spec::defaults::INTERVAL,
            timeout: spec::defaults::TIMEOUT,
            hang_timeout: spec::defaults::TIMEOUT * spec::defaults::HANG_TIMEOUT_FACTOR,
            rise: spec::defaults::RISE,
            fall: spec::defaults::FALL,
            fast_interval: spec::defaults::FAST_INTERVAL,
            down_interval: spec::defaults::DOWN_INTERVAL,
            jitter: spec::defaults::JITTER,
            via: spec::defaults::VIA,
            auto_timeout: false,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn minimal_config_resolves_every_default() {
        let config = ok(
            "minimal",
            r#"
            [daemon]
            interface = "eth0"

            [[vip]]
            name = "api"
            address = "10.100.0.1"
            port = 80

            [[vip.backend]]
            address = "10.0.0.11"
            "#,
        );
        let want = Config {
            daemon: DaemonConfig {
                interface: "eth0".into(),
                xdp_mode: XdpMode::Native,
                instance: "default".into(),
                control_socket: PathBuf::from("/run/xlb/xlb.sock"),
                socket_group: None,
                metrics_address: Some("127.0.0.1:9813".parse().unwrap()),
                conntrack_size: 1_048_576,
                udp_timeout: Duration::from_secs(30),
                max_table_size: 65_537,
                hash_seed: None,
                encap_source_v4: None,
                encap_source_v6: None,
                probe_concurrency: 256,
            },
            vips: vec![VipConfig {
                name: "api".into(),
                addr: ip("10.100.0.1"),
                port: 80,
                protocol: Protocol::Tcp,
                mode: Mode::DsrIpip,
                down_policy: DownPolicy::Rehash,
                table_size: 65_537,
                protection: Policy::default(),
                backends: vec![BackendConfig {
                    addr: ip("10.0.0.11"),
                    port: 80,
                    weight: 1,
                    health: default_check(80),
                }],
            }],
            warnings: vec![],
        };
        assert_eq!(config, want);
        // The health defaults themselves (owned by health::spec), as documented.
        let h = &config.vips[0].backends[0].health;
        assert_eq!(
            (
                h.interval,
                h.timeout,
                h.hang_timeout,
                h.rise,
                h.fall,
                h.fast_interval,
                h.down_interval,
                h.jitter
            ),
            (
                Duration::from_secs(2),
                Duration::from_secs(1),
                Duration::from_secs(3),
                2,
                3,
                Duration::from_millis(500),
                Duration::from_secs(5),
                0.1
            )
        );
    }

    #[test]
    fn full_config() {
        let config = ok(
            "full",
            r#"
            [daemon]
            interface = "ens5f0"
            xdp_mode = "generic"
            instance = "edge_1"
            control_socket = "/run/xlb-edge/ctl.sock"
            socket_group = "xlbops"
            metrics_address = "[::1]:9900"
            conntrack_size = 4096
            udp_timeout = "1m"
            max_table_size = 131071
            hash_seed = "000102030405060708090a0b0c0d0e0F"
            encap_source_v4 = "10.0.0.2"
            encap_source_v6 = "fd00::2"
            probe_concurrency = 16

            [health_check]
            kind = "http"
            method = "HEAD"
            path = "/ready"
            host = "svc.internal"
            expect_status = ["200-299", "404", 302]
            body_contains = "ok"
            interval = "3s"
            timeout = "1.5s"
            hang_timeout = "2s"
            rise = 1
            fall = 5
            fast_interval = "250ms"
            down_interval = "10s"
            jitter = 0.25

            [[vip]]
            name = "web.v6"
            address = "fd00:100::1"
            port = 443
            protocol = "udp"
            mode = "dsr-l2"
            down_policy = "keep"
            table_size = 131071

            [[vip.backend]]
            address = "fd00::11"
            port = 443
            weight = 0
            health_port = 8443

            [[vip.backend]]
            address = "fd00::12"
            weight = 1000
            "#,
        );
        let check = |port| CheckSpec {
            kind: CheckKind::Http(HttpCheck {
                method: "HEAD".into(),
                path: "/ready".into(),
                host: Some("svc.internal".into()),
                expect_status: vec![(200, 299), (404, 404), (302, 302)],
                body_contains: Some("ok".into()),
            }),
            port,
            interval: Duration::from_secs(3),
            timeout: Duration::from_millis(1500),
            hang_timeout: Duration::from_secs(2),
            rise: 1,
            fall: 5,
            fast_interval: Duration::from_millis(250),
            down_interval: Duration::from_secs(10),
            jitter: 0.25,
            via: spec::defaults::VIA,
            auto_timeout: false,
        };
        let want = Config {
            daemon: DaemonConfig {
                interface: "ens5f0".into(),
                xdp_mode: XdpMode::Generic,
                instance: "edge_1".into(),
                control_socket: PathBuf::from("/run/xlb-edge/ctl.sock"),
                socket_group: Some("xlbops".into()),
                metrics_address: Some("[::1]:9900".parse().unwrap()),
                conntrack_size: 4096,
                udp_timeout: Duration::from_secs(60),
                max_table_size: 131_071,
                hash_seed: Some([0x0001_0203_0405_0607, 0x0809_0a0b_0c0d_0e0f]),
                encap_source_v4: Some(Ipv4Addr::new(10, 0, 0, 2)),
                encap_source_v6: Some("fd00::2".parse().unwrap()),
                probe_concurrency: 16,
            },
            vips: vec![VipConfig {
                name: "web.v6".into(),
                addr: ip("fd00:100::1"),
                port: 443,
                protocol: Protocol::Udp,
                mode: Mode::DsrL2,
                down_policy: DownPolicy::Keep,
                table_size: 131_071,
                protection: Policy::default(),
                backends: vec![
                    BackendConfig {
                        addr: ip("fd00::11"),
                        port: 443,
                        weight: 0,
                        health: check(8443),
                    },
                    BackendConfig {
                        addr: ip("fd00::12"),
                        port: 443,
                        weight: 1000,
                        health: check(443),
                    },
                ],
            }],
            warnings: vec![
                "xlb.toml: daemon: xdp_mode = \"generic\" runs XDP after the kernel has built an \
                 skb: much slower than \"native\"; use it for testing only"
                    .into(),
            ],
        };
        assert_eq!(config, want);
    }

    #[test]
    fn health_merges_field_by_field() {
        let config = ok(
            "merge",
            r#"
            [daemon]
            interface = "eth0"

            [health_check]
            path = "/daemon"
            interval = "4s"
            rise = 4
            jitter = "20%"

            [[vip]]
            name = "api"
            address = "10.100.0.1"
            port = 80
            [vip.health_check]
            path = "/vip"
            timeout = "3s"
            fall = 7

            [[vip.backend]]
            address = "10.0.0.11"

            [[vip.backend]]
            address = "10.0.0.12"
            health_port = 9000
            [vip.backend.health_check]
            rise = 1
            host = "be2"
            expect_status = ["204"]
            hang_timeout = "4s"

            [[vip]]
            name = "other"
            address = "10.100.0.2"
            port = 80
            [[vip.backend]]
            address = "10.0.0.13"
            "#,
        );
        let http = |path: &str, host: Option<&str>, status: (u16, u16)| {
            CheckKind::Http(HttpCheck {
                method: "GET".into(),
                path: path.into(),
                host: host.map(Into::into),
                expect_status: vec![status],
                body_contains: None,
            })
        };
        let base = CheckSpec {
            interval: Duration::from_secs(4),
            rise: 4,
            jitter: 0.2,
            via: spec::defaults::VIA,
            auto_timeout: false,
            ..default_check(80)
        };
        let cases = [
            (
                "vip overrides daemon, daemon overrides defaults",
                &config.vips[0].backends[0].health,
                CheckSpec {
                    kind: http("/vip", None, spec::defaults::EXPECT_STATUS),
                    timeout: Duration::from_secs(3),
                    // Derived from the merged timeout, not the default one.
                    hang_timeout: Duration::from_secs(9),
                    fall: 7,
                    ..base.clone()
                },
            ),
            (
                "backend overrides vip and daemon",
                &config.vips[0].backends[1].health,
                CheckSpec {
                    kind: http("/vip", Some("be2"), (204, 204)),
                    port: 9000,
                    timeout: Duration::from_secs(3),
                    hang_timeout: Duration::from_secs(4),
                    fall: 7,
                    rise: 1,
                    ..base.clone()
                },
            ),
            (
                "another vip sees only the daemon layer",
                &config.vips[1].backends[0].health,
                CheckSpec {
                    kind: http("/daemon", None, spec::defaults::EXPECT_STATUS),
                    ..base.clone()
                },
            ),
        ];
        for (name, got, want) in cases {
            assert_eq!(got, &want, "{name}");
        }
    }

    #[test]
    fn tcp_kind_at_each_level() {
        let cases = [
            (
                "daemon tcp",
                "[health_check]\nkind = \"tcp\"\n",
                "",
                "",
                CheckKind::Tcp,
            ),
            (
                "vip tcp over daemon http path",
                "[health_check]\npath = \"/d\"\n",
                "[vip.health_check]\nkind = \"tcp\"\n",
                "",
                CheckKind::Tcp,
            ),
            (
                "backend http over vip tcp",
                "",
                "[vip.health_check]\nkind = \"tcp\"\n",
                "[vip.backend.health_check]\nkind = \"http\"\npath = \"/b\"\n",
                CheckKind::Http(HttpCheck {
                    path: "/b".into(),
                    ..http_defaults()
                }),
            ),
        ];
        fn http_defaults() -> HttpCheck {
            match default_http() {
                CheckKind::Http(h) => h,
                CheckKind::Tcp => unreachable!(),
            }
        }
        for (name, daemon_hc, vip_hc, backend_hc, want) in cases {
            let text = format!(
                "{DAEMON}{daemon_hc}[[vip]]\nname = \"a\"\naddress = \"10.1.0.1\"\nport = 80\n\
                 {vip_hc}[[vip.backend]]\naddress = \"10.0.0.1\"\n{backend_hc}"
            );
            let config = ok(name, &text);
            assert_eq!(config.vips[0].backends[0].health.kind, want, "{name}");
        }
    }

    /// `hang_timeout`: derived from the merged `timeout` unless set, merged
    /// field by field, `timeout` ≤ it ≤ 60 s.
    #[test]
    fn auto_timeout_resolution() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // (name, [health_check], [vip.health_check], backend's,
        //  want (auto, starting timeout, hang_timeout))
        let cases = [
            ("fixed by default", "", "", "", (false, s(1), s(3))),
            (
                "auto: starts at the default, hang_timeout from it",
                "timeout = \"auto\"",
                "",
                "",
                (true, s(1), s(3)),
            ),
            (
                "auto never starts past the interval",
                "timeout = \"auto\"\ninterval = \"500ms\"",
                "",
                "",
                (true, ms(500), ms(1500)),
            ),
            (
                "a fixed timeout below overrides auto above",
                "timeout = \"auto\"",
                "timeout = \"300ms\"",
                "",
                (false, ms(300), ms(900)),
            ),
            (
                "auto below overrides a fixed timeout above",
                "timeout = \"2s\"",
                "",
                "timeout = \"auto\"\nhang_timeout = \"5s\"",
                (true, s(1), s(5)),
            ),
        ];
        for (name, daemon, vip_layer, backend, want) in cases {
            let text = format!(
                "{DAEMON}[health_check]\n{daemon}\n[[vip]]\nname = \"a\"\naddress = \"10.1.0.1\"\n\
                 port = 80\n[vip.health_check]\n{vip_layer}\n[[vip.backend]]\naddress = \"10.0.0.1\"\n\
                 [vip.backend.health_check]\n{backend}\n"
            );
            let h = ok(name, &text).vips[0].backends[0].health.clone();
            assert_eq!((h.auto_timeout, h.timeout, h.hang_timeout), want, "{name}");
        }
    }

    #[test]
    fn hang_timeout_resolution() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // (name, [health_check], [vip.health_check], backend's, want)
        let good = [
            ("default: 3 × the default timeout", "", "", "", s(3)),
            (
                "derived from a merged timeout",
                "",
                "timeout = \"500ms\"",
                "",
                ms(1500),
            ),
            (
                "derived default capped at 60s",
                "interval = \"1m\"\ntimeout = \"30s\"",
                "",
                "",
                s(60),
            ),
            (
                "equal to the timeout: strict",
                "hang_timeout = \"1s\"",
                "",
                "",
                s(1),
            ),
            ("the maximum", "hang_timeout = \"60s\"", "", "", s(60)),
            (
                "above the interval is fine",
                "hang_timeout = \"10s\"",
                "",
                "",
                s(10),
            ),
            (
                "vip overrides daemon",
                "hang_timeout = \"5s\"",
                "hang_timeout = \"2s\"",
                "",
                s(2),
            ),
            (
                "backend overrides vip, with the vip's timeout",
                "",
                "timeout = \"2s\"\nhang_timeout = \"8s\"",
                "hang_timeout = \"2s\"",
                s(2),
            ),
            (
                "an explicit value survives a lower timeout below it",
                "hang_timeout = \"4s\"",
                "timeout = \"200ms\"",
                "",
                s(4),
            ),
        ];
        for (name, daemon, vip_layer, backend, want) in good {
            let text = format!(
                "{DAEMON}[health_check]\n{daemon}\n[[vip]]\nname = \"a\"\naddress = \"10.1.0.1\"\n\
                 port = 80\n[vip.health_check]\n{vip_layer}\n[[vip.backend]]\naddress = \"10.0.0.1\"\n\
                 [vip.backend.health_check]\n{backend}\n"
            );
            let config = ok(name, &text);
            assert_eq!(
                config.vips[0].backends[0].health.hang_timeout, want,
                "{name}"
            );
        }

        let bad = [
            (
                "shorter than the timeout",
                "hang_timeout = \"500ms\"",
                "",
                vec![
                    r#"xlb.toml: health_check: hang_timeout 500ms is shorter than timeout 1s; use at least the timeout (equal to it makes a late answer a failure, as without hang_timeout)"#,
                ],
            ),
            (
                "shorter than a timeout set below it, reported where the timeout is",
                "hang_timeout = \"2s\"",
                "timeout = \"3s\"\ninterval = \"5s\"",
                vec![
                    r#"xlb.toml: vip "a": health_check: hang_timeout 2s is shorter than timeout 3s; use at least the timeout (equal to it makes a late answer a failure, as without hang_timeout)"#,
                ],
            ),
            (
                "longer than a minute",
                "hang_timeout = \"2m\"",
                "",
                vec![
                    r#"xlb.toml: health_check: hang_timeout 120s is longer than 60s; a backend that has not answered in a minute is hung, and each waiting probe holds a socket: use at most "60s""#,
                ],
            ),
            (
                "zero",
                "hang_timeout = \"0s\"",
                "",
                vec![r#"xlb.toml: health_check: hang_timeout must be longer than 0"#],
            ),
            (
                "not a duration",
                "hang_timeout = \"3\"",
                "",
                vec![
                    r#"xlb.toml: health_check: hang_timeout "3" is not a duration; write a number and a unit (ms, s, m or h), e.g. "500ms", "2s", "1.5s", "1m""#,
                ],
            ),
        ];
        for (name, daemon, vip_layer, want) in bad {
            let text = format!(
                "{DAEMON}[health_check]\n{daemon}\n[[vip]]\nname = \"a\"\naddress = \"10.1.0.1\"\n\
                 port = 80\n[vip.health_check]\n{vip_layer}\n[[vip.backend]]\naddress = \"10.0.0.1\"\n"
            );
            let errors = parse(&text).expect_err(name);
            assert_eq!(errors.problems, want, "{name}");
        }
    }

    #[test]
    fn value_forms() {
        type Check = fn(&CheckSpec) -> bool;
        let cases: [(&str, &str, Check); 9] = [
            ("jitter as percentage", "jitter = \"10%\"", |c| {
                c.jitter == 0.1
            }),
            ("jitter as fraction", "jitter = 0.5", |c| c.jitter == 0.5),
            ("jitter as integer zero", "jitter = 0", |c| c.jitter == 0.0),
            ("duration in minutes", "interval = \"1m\"", |c| {
                c.interval == Duration::from_secs(60)
            }),
            ("fractional seconds", "timeout = \".25s\"", |c| {
                c.timeout == Duration::from_millis(250)
            }),
            (
                "status as integer",
                "expect_status = [200]",
                |c| matches!(&c.kind, CheckKind::Http(h) if h.expect_status == [(200, 200)]),
            ),
            (
                "status range with spaces",
                "expect_status = [\"200 - 204\"]",
                |c| matches!(&c.kind, CheckKind::Http(h) if h.expect_status == [(200, 204)]),
            ),
            (
                "several ranges",
                "expect_status = [\"200-299\", \"301\", \"404\"]",
                |c| matches!(&c.kind, CheckKind::Http(h) if h.expect_status == [(200, 299), (301, 301), (404, 404)]),
            ),
            (
                "custom method",
                "method = \"OPTIONS\"",
                |c| matches!(&c.kind, CheckKind::Http(h) if h.method == "OPTIONS"),
            ),
        ];
        for (name, line, check) in cases {
            let text = format!(
                "{DAEMON}[health_check]\n{line}\n[[vip]]\nname = \"a\"\naddress = \"10.1.0.1\"\n\
                 port = 80\n[[vip.backend]]\naddress = \"10.0.0.1\"\n"
            );
            let config = ok(name, &text);
            assert!(
                check(&config.vips[0].backends[0].health),
                "{name}: {:?}",
                config.vips[0].backends[0].health
            );
        }
    }

    #[test]
    fn parse_duration_cases() {
        let good = [
            ("milliseconds", "500ms", Duration::from_millis(500)),
            ("seconds", "2s", Duration::from_secs(2)),
            ("decimal seconds", "1.5s", Duration::from_millis(1500)),
            ("minutes", "1m", Duration::from_secs(60)),
            ("hours", "2h", Duration::from_secs(7200)),
            ("zero", "0s", Duration::ZERO),
            ("leading dot", ".5s", Duration::from_millis(500)),
            ("trailing dot", "3.s", Duration::from_secs(3)),
            (
                "nanosecond precision",
                "0.000000001s",
                Duration::from_nanos(1),
            ),
            ("surrounding spaces", " 3s ", Duration::from_secs(3)),
        ];
        for (name, text, want) in good {
            assert_eq!(parse_duration(text), Ok(want), "{name}");
        }
        let bad = [
            ("no unit", "5"),
            ("no number", "s"),
            ("empty", ""),
            ("unknown unit", "5d"),
            ("space before unit", "5 s"),
            ("negative", "-1s"),
            ("two dots", "1.2.3s"),
            ("lone dot", ".s"),
            ("compound", "1m30s"),
            ("too precise", "0.0000000001s"),
        ];
        for (name, text) in bad {
            assert_eq!(
                parse_duration(text),
                Err(format!(
                    "{text:?} is not a duration; write a number and a unit (ms, s, m or h), \
                     e.g. \"500ms\", \"2s\", \"1.5s\", \"1m\""
                )),
                "{name}"
            );
        }
        assert_eq!(
            parse_duration("9999999999h"),
            Err("\"9999999999h\" is too long a duration".to_owned())
        );
    }

    /// A VIP "api" on 10.100.0.1:80 with `extra` added to its table and the
    /// given backends section.
    fn vip(extra: &str, backends: &str) -> String {
        format!(
            "{DAEMON}[[vip]]\nname = \"api\"\naddress = \"10.100.0.1\"\nport = 80\n{extra}\n{backends}"
        )
    }

    const ONE_BACKEND: &str = "[[vip.backend]]\naddress = \"10.0.0.11\"\n";

    #[test]
    fn invalid_configs_report_exact_errors() {
        let many_vips: String = (0..=lb_common::MAX_VIPS)
            .map(|i| format!("[[vip]]\nname = \"v{i}\"\naddress = \"10.100.0.{i}\"\nport = 80\n"))
            .collect();
        let many_backends: String = (0..lb_common::MAX_BACKENDS)
            .map(|i| {
                format!(
                    "[[vip.backend]]\naddress = \"10.1.{}.{}\"\n",
                    i / 256,
                    i % 256
                )
            })
            .collect();
        let cases: Vec<(&str, String, Vec<&str>)> = vec![
            (
                "backend listed twice",
                vip(
                    "",
                    "[[vip.backend]]\naddress = \"10.0.0.12\"\n\
                     [[vip.backend]]\naddress = \"10.0.0.12\"\nport = 80\n",
                ),
                vec![r#"xlb.toml: vip "api": backend 10.0.0.12:80 listed twice"#],
            ),
            (
                "table size not prime",
                vip("table_size = 65536", ONE_BACKEND),
                vec![r#"xlb.toml: vip "api": table_size 65536 is not prime; use a prime such as 65537"#],
            ),
            (
                "table size not prime, next prime above the max",
                vip("table_size = 65538", ONE_BACKEND),
                vec![r#"xlb.toml: vip "api": table_size 65538 is not prime; use a prime such as 65537"#],
            ),
            (
                "udp timeout shorter than the conntrack refresh",
                format!("{DAEMON}udp_timeout = \"500ms\"\n"),
                vec![r#"xlb.toml: daemon: udp_timeout 500ms is too short: conntrack refreshes a flow's last-seen time once a second, so use 0 (never expire) or at least 2s"#],
            ),
            (
                "table size zero",
                vip("table_size = 0", ONE_BACKEND),
                vec![r#"xlb.toml: vip "api": table_size 0 is not prime; use a prime such as 2"#],
            ),
            (
                "table size above max",
                vip("table_size = 131071", ONE_BACKEND),
                vec![
                    r#"xlb.toml: vip "api": table_size 131071 is larger than daemon.max_table_size 65537; use a smaller prime or raise max_table_size"#,
                ],
            ),
            (
                "table smaller than backends",
                vip(
                    "table_size = 2",
                    "[[vip.backend]]\naddress = \"10.0.0.1\"\n[[vip.backend]]\naddress = \"10.0.0.2\"\n\
                     [[vip.backend]]\naddress = \"10.0.0.3\"\n",
                ),
                vec![
                    r#"xlb.toml: vip "api": table_size 2 is smaller than its 3 backends, so some would get no slot; use a prime of at least 30 (10 × backends), such as 31"#,
                ],
            ),
            (
                "vip address reused",
                format!(
                    "{}[[vip]]\nname = \"web\"\naddress = \"10.100.0.1\"\nport = 80\n{ONE_BACKEND}",
                    vip("", ONE_BACKEND)
                ),
                vec![r#"xlb.toml: vip "web" address 10.100.0.1:80/tcp is also used by vip "api""#],
            ),
            (
                "vip name reused",
                format!(
                    "{}[[vip]]\nname = \"api\"\naddress = \"10.100.0.2\"\nport = 80\n{ONE_BACKEND}",
                    vip("", ONE_BACKEND)
                ),
                vec![r#"xlb.toml: vip "api" is defined twice; VIP names must be unique"#],
            ),
            (
                "bad vip name",
                format!(
                    "{DAEMON}[[vip]]\nname = \"my api\"\naddress = \"10.100.0.1\"\nport = 80\n{ONE_BACKEND}"
                ),
                vec![
                    r#"xlb.toml: vip "my api": name is invalid; use 1 to 64 characters from A-Z a-z 0-9 _ . -"#,
                ],
            ),
            (
                "vip port zero and multicast address",
                format!("{DAEMON}[[vip]]\nname = \"api\"\naddress = \"224.0.0.1\"\nport = 0\n"),
                vec![
                    r#"xlb.toml: vip "api": address 224.0.0.1 cannot be a VIP; use a unicast address"#,
                    r#"xlb.toml: vip "api": port 0 is invalid; use 1 to 65535"#,
                ],
            ),
            (
                "IPv6 backend of an IPv4 dsr-ipip VIP",
                vip("", "[[vip.backend]]\naddress = \"fd00::1\"\n"),
                vec![
                    r#"xlb.toml: vip "api": backend [fd00::1]:80 is IPv6 but the VIP is IPv4; dsr-ipip encapsulates in the VIP's family (IPv4 in IPv4), so use an IPv4 backend address"#,
                ],
            ),
            (
                "IPv4 backend of an IPv6 dsr-l2 VIP",
                format!(
                    "{DAEMON}[[vip]]\nname = \"v6\"\naddress = \"fd00:100::1\"\nport = 80\nmode = \"dsr-l2\"\n{ONE_BACKEND}"
                ),
                vec![
                    r#"xlb.toml: vip "v6": backend 10.0.0.11:80 is IPv4 but the VIP is IPv6; dsr-l2 finds the backend's MAC address by a route lookup in the VIP's family (IPv6), so use an IPv6 backend address"#,
                ],
            ),
            (
                "backend port differs",
                vip("", "[[vip.backend]]\naddress = \"10.0.0.11\"\nport = 8080\n"),
                vec![
                    r#"xlb.toml: vip "api": backend 10.0.0.11:8080: port 8080 differs from the VIP port 80; DSR modes do not translate ports, so the backend must serve port 80 itself (remove port or set it to 80)"#,
                ],
            ),
            (
                "backend is the VIP",
                vip("", "[[vip.backend]]\naddress = \"10.100.0.1\"\n"),
                vec![
                    r#"xlb.toml: vip "api": backend 10.100.0.1:80: the backend address is the VIP address itself; name a real server"#,
                ],
            ),
            (
                "backend weight and health port",
                vip("", "[[vip.backend]]\naddress = \"0.0.0.0\"\nweight = 1001\nhealth_port = 0\n"),
                vec![
                    r#"xlb.toml: vip "api": backend 0.0.0.0:80: address cannot be a backend; use the server's unicast address"#,
                    r#"xlb.toml: vip "api": backend 0.0.0.0:80: weight 1001 is too large; use 0 to 1000 (weights are relative; 0 takes no new flows)"#,
                    r#"xlb.toml: vip "api": backend 0.0.0.0:80: health_port 0 is invalid; use 1 to 65535, or remove it to probe the service port"#,
                ],
            ),
            (
                "rise and fall zero",
                vip("[vip.health_check]\nrise = 0\nfall = 0", ONE_BACKEND),
                vec![
                    r#"xlb.toml: vip "api": health_check: rise must be at least 1"#,
                    r#"xlb.toml: vip "api": health_check: fall must be at least 1"#,
                ],
            ),
            (
                "timeout longer than interval, reported once at the daemon level",
                format!(
                    "{DAEMON}[health_check]\ntimeout = \"3s\"\n[[vip]]\nname = \"a\"\naddress = \"10.100.0.1\"\n\
                     port = 80\n[[vip.backend]]\naddress = \"10.0.0.1\"\n[[vip.backend]]\naddress = \"10.0.0.2\"\n"
                ),
                vec![
                    r#"xlb.toml: health_check: timeout 3s is longer than interval 2s; the timeout must be at most the interval, so a probe ends before the next one starts"#,
                ],
            ),
            (
                "timeout longer than an interval set on a backend",
                vip(
                    "[vip.health_check]\ntimeout = \"1.5s\"",
                    "[[vip.backend]]\naddress = \"10.0.0.11\"\n[vip.backend.health_check]\ninterval = \"1s\"\n",
                ),
                vec![
                    r#"xlb.toml: vip "api": backend 10.0.0.11:80: health_check: timeout 1.5s is longer than interval 1s; the timeout must be at most the interval, so a probe ends before the next one starts"#,
                ],
            ),
            (
                "jitter out of range, both forms",
                format!(
                    "{DAEMON}[health_check]\njitter = 0.6\n{}",
                    vip(
                        "[vip.health_check]\njitter = \"60%\"",
                        "[[vip.backend]]\naddress = \"10.0.0.11\"\n[vip.backend.health_check]\njitter = -0.1\n",
                    )
                    .replace(DAEMON, "")
                ),
                vec![
                    r#"xlb.toml: health_check: jitter 0.6 is out of range; use a fraction from 0 to 0.5 or a percentage from "0%" to "50%""#,
                    r#"xlb.toml: vip "api": health_check: jitter "60%" is out of range; use a fraction from 0 to 0.5 or a percentage from "0%" to "50%""#,
                    r#"xlb.toml: vip "api": backend 10.0.0.11:80: health_check: jitter -0.1 is out of range; use a fraction from 0 to 0.5 or a percentage from "0%" to "50%""#,
                ],
            ),
            (
                "bad durations",
                format!("{DAEMON}[health_check]\ninterval = \"2x\"\nfast_interval = \"0ms\"\n"),
                vec![
                    r#"xlb.toml: health_check: interval "2x" is not a duration; write a number and a unit (ms, s, m or h), e.g. "500ms", "2s", "1.5s", "1m""#,
                    r#"xlb.toml: health_check: fast_interval must be longer than 0"#,
                ],
            ),
            (
                "bad status codes",
                vip("[vip.health_check]\nexpect_status = [\"2xx\", 600, \"299-200\"]", ONE_BACKEND),
                vec![
                    r#"xlb.toml: vip "api": health_check: expect_status "2xx" is not a status code or range; write e.g. "200" or "200-299" (codes 100 to 599)"#,
                    r#"xlb.toml: vip "api": health_check: expect_status 600 is not a status code or range; write e.g. "200" or "200-299" (codes 100 to 599)"#,
                    r#"xlb.toml: vip "api": health_check: expect_status "299-200" is not a status code or range; write e.g. "200" or "200-299" (codes 100 to 599)"#,
                ],
            ),
            (
                "empty status list",
                vip("[vip.health_check]\nexpect_status = []", ONE_BACKEND),
                vec![
                    r#"xlb.toml: vip "api": health_check: expect_status is empty; list at least one code or range, e.g. ["200-299"]"#,
                ],
            ),
            (
                "bad http fields",
                format!(
                    "{DAEMON}[health_check]\nmethod = \"GE T\"\npath = \"health\"\nhost = \"a b\"\nbody_contains = \"\"\n"
                ),
                vec![
                    r#"xlb.toml: health_check: method "GE T" is not an HTTP method; use e.g. "GET" or "HEAD""#,
                    r#"xlb.toml: health_check: path "health" is invalid; use a request target starting with '/', in visible ASCII without spaces (percent-encode others), e.g. "/health""#,
                    r#"xlb.toml: health_check: host "a b" is invalid; use a host name in visible ASCII without spaces, or remove host to send the backend's address"#,
                    r#"xlb.toml: health_check: body_contains must be 1 to 4096 bytes (only the start of the body is read); remove it to accept any body"#,
                ],
            ),
            (
                "non-ASCII path, reported once for two backends",
                vip(
                    "[vip.health_check]\npath = \"/sant\u{e9}\"",
                    "[[vip.backend]]\naddress = \"10.0.0.1\"\n[[vip.backend]]\naddress = \"10.0.0.2\"\n",
                ),
                vec![
                    "xlb.toml: vip \"api\": health_check: path \"/sant\u{e9}\" is invalid; use a request target starting with '/', in visible ASCII without spaces (percent-encode others), e.g. \"/health\"",
                ],
            ),
            (
                "http fields with kind tcp",
                vip(
                    "[vip.health_check]\nkind = \"tcp\"\npath = \"/x\"",
                    "[[vip.backend]]\naddress = \"10.0.0.11\"\n[vip.backend.health_check]\nexpect_status = [\"200\"]\n",
                ),
                vec![
                    r#"xlb.toml: vip "api": health_check: path applies only to kind = "http", but this check's kind is "tcp"; remove path or set kind = "http""#,
                    r#"xlb.toml: vip "api": backend 10.0.0.11:80: health_check: expect_status applies only to kind = "http", but this check's kind is "tcp"; remove expect_status or set kind = "http""#,
                ],
            ),
            (
                "port in health_check tables",
                vip(
                    "[vip.health_check]\nport = 8081",
                    "[[vip.backend]]\naddress = \"10.0.0.11\"\n[vip.backend.health_check]\nport = 8081\n",
                ),
                vec![
                    r#"xlb.toml: vip "api": health_check: port is not allowed in a health_check table; set health_port on each [[vip.backend]]"#,
                    r#"xlb.toml: vip "api": backend 10.0.0.11:80: health_check: port is not allowed in a health_check table; set health_port on this backend"#,
                ],
            ),
            (
                "daemon fields",
                "[daemon]\ninterface = \"eth0:1\"\ninstance = \"Prod\"\ncontrol_socket = \"xlb.sock\"\n\
                 socket_group = \"\"\nmetrics_address = \"localhost\"\nconntrack_size = 0\n\
                 udp_timeout = \"30\"\nmax_table_size = 65536\nhash_seed = \"abc\"\n\
                 encap_source_v4 = \"0.0.0.0\"\nencap_source_v6 = \"::1\"\nprobe_concurrency = 0\n"
                    .to_owned(),
                vec![
                    r#"xlb.toml: daemon: interface "eth0:1" is not a valid interface name; use the name `ip link` shows, e.g. "eth0" (1 to 15 characters)"#,
                    r#"xlb.toml: daemon: instance "Prod" is invalid; use 1 to 32 characters from a-z 0-9 _ -"#,
                    r#"xlb.toml: daemon: control_socket "xlb.sock" is not an absolute path; use e.g. "/run/xlb/xlb.sock""#,
                    r#"xlb.toml: daemon: socket_group is empty; name a group, or remove socket_group to keep the control socket root-only (mode 0600)"#,
                    r#"xlb.toml: daemon: metrics_address "localhost" is not an address:port; use e.g. "127.0.0.1:9813" or "[::1]:9813", or "" to disable metrics"#,
                    r#"xlb.toml: daemon: conntrack_size must be at least 1 (default 1048576)"#,
                    r#"xlb.toml: daemon: udp_timeout "30" is not a duration; write a number and a unit (ms, s, m or h), e.g. "500ms", "2s", "1.5s", "1m""#,
                    r#"xlb.toml: daemon: max_table_size 65536 is not prime; use a prime such as 65537"#,
                    r#"xlb.toml: daemon: hash_seed must be 32 hexadecimal digits (128 bits), got 3 characters; generate one with `openssl rand -hex 16`, or remove hash_seed to get a random one on first start"#,
                    r#"xlb.toml: daemon: encap_source_v4 0.0.0.0 cannot be a packet's source; use an address of this host that backends can reach, or remove it to use the interface's address"#,
                    r#"xlb.toml: daemon: encap_source_v6 ::1 cannot be a packet's source; use an address of this host that backends can reach, or remove it to use the interface's address"#,
                    r#"xlb.toml: daemon: probe_concurrency 0 is out of range; use 1 to 4096 (default 256)"#,
                ],
            ),
            (
                "max table size too large",
                "[daemon]\ninterface = \"eth0\"\nmax_table_size = 2097143\n".to_owned(),
                vec![
                    r#"xlb.toml: daemon: max_table_size 2097143 is too large: the ring would take 2047 MiB of kernel memory; use a prime of at most 1048573"#,
                ],
            ),
            (
                "too many VIPs",
                format!("{DAEMON}{many_vips}"),
                vec!["xlb.toml: 65 VIPs configured, but xlb supports at most 64; remove VIPs or run another xlb instance"],
            ),
            (
                "too many backends",
                vip("", &many_backends),
                vec![
                    "xlb.toml: 4096 backends in total across all VIPs, but xlb supports at most 4095; remove backends or split the VIPs across instances",
                ],
            ),
        ];
        for (name, text, want) in cases {
            match parse(&text) {
                Ok(_) => panic!("{name}: accepted"),
                Err(e) => assert_eq!(e.problems, want, "{name}"),
            }
        }
    }

    #[test]
    fn errors_display_one_per_line() {
        let e = parse(&vip(
            "table_size = 4\n[vip.health_check]\nrise = 0",
            ONE_BACKEND,
        ))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "xlb.toml: vip \"api\": table_size 4 is not prime; use a prime such as 5\n\
             xlb.toml: vip \"api\": health_check: rise must be at least 1"
        );
    }

    /// serde/toml stop at the first such error; the message comes from the
    /// toml crate (with a source excerpt), so the test checks the parts a
    /// user relies on rather than the crate's exact layout.
    #[test]
    fn toml_errors_name_the_file_and_place() {
        let cases = [
            (
                "syntax error",
                format!("{DAEMON}[[vip]\n"),
                "line 3, column",
                "",
            ),
            (
                "unknown top-level table",
                format!("{DAEMON}[[vips]]\nname = \"a\"\n"),
                "line 3",
                "unknown field `vips`",
            ),
            (
                "unknown daemon field",
                "[daemon]\ninterface = \"eth0\"\nxdp = \"native\"\n".to_owned(),
                "line 3",
                "unknown field `xdp`",
            ),
            (
                "unknown vip field",
                vip("weight = 3", ONE_BACKEND),
                "line 7",
                "unknown field `weight`",
            ),
            (
                "unknown backend field",
                vip(
                    "",
                    "[[vip.backend]]\naddress = \"10.0.0.1\"\nhealthport = 1\n",
                ),
                "line 10",
                "unknown field `healthport`",
            ),
            (
                "unknown health field",
                format!("{DAEMON}[health_check]\nretries = 3\n"),
                "line 4",
                "unknown field `retries`",
            ),
            (
                "missing interface",
                "[daemon]\n".to_owned(),
                "",
                "missing field `interface`",
            ),
            (
                "missing daemon",
                vip("", ONE_BACKEND).replace(DAEMON, ""),
                "",
                "missing field `daemon`",
            ),
            (
                "missing vip port",
                format!("{DAEMON}[[vip]]\nname = \"a\"\naddress = \"10.1.0.1\"\n"),
                "",
                "missing field `port`",
            ),
            (
                "bad mode",
                vip("mode = \"nat\"", ONE_BACKEND),
                "line 7",
                "unknown variant `nat`, expected `dsr-ipip` or `dsr-l2`",
            ),
            (
                "bad protocol",
                vip("protocol = \"sctp\"", ONE_BACKEND),
                "line 7",
                "unknown variant `sctp`, expected `tcp` or `udp`",
            ),
            (
                "bad address",
                vip("", "[[vip.backend]]\naddress = \"10.0.0.300\"\n"),
                "line 9",
                "invalid IP address syntax",
            ),
            (
                "encap source of the wrong family",
                "[daemon]\ninterface = \"eth0\"\nencap_source_v4 = \"fd00::2\"\n".to_owned(),
                "line 3",
                "invalid IPv4 address syntax",
            ),
            (
                "negative weight",
                vip("", "[[vip.backend]]\naddress = \"10.0.0.1\"\nweight = -1\n"),
                "line 10",
                "weight",
            ),
            (
                "jitter of the wrong type",
                format!("{DAEMON}[health_check]\njitter = true\n"),
                "line 4",
                "a fraction such as 0.1 or a percentage such as \"10%\"",
            ),
            (
                "duration as a number",
                format!("{DAEMON}[health_check]\ninterval = 2\n"),
                "line 4",
                "expected a string",
            ),
        ];
        for (name, text, place, what) in cases {
            let e = parse(&text)
                .err()
                .unwrap_or_else(|| panic!("{name}: accepted"));
            assert_eq!(e.problems.len(), 1, "{name}: {e}");
            let msg = &e.problems[0];
            assert!(
                msg.starts_with("xlb.toml: TOML parse error at "),
                "{name}: {msg}"
            );
            assert!(msg.contains(place), "{name}: no {place:?} in {msg}");
            assert!(msg.contains(what), "{name}: no {what:?} in {msg}");
        }
    }

    #[test]
    fn warnings() {
        let cases = [
            (
                "no VIPs",
                DAEMON.to_owned(),
                vec!["xlb.toml: no [[vip]] configured; xlb will pass all traffic to the host"],
            ),
            (
                "VIP without backends",
                vip("", ""),
                vec![
                    "xlb.toml: vip \"api\" has no backends; it will drop new flows until backends are added",
                ],
            ),
            (
                "every backend weight 0",
                vip("", "[[vip.backend]]\naddress = \"10.0.0.1\"\nweight = 0\n"),
                vec![
                    "xlb.toml: vip \"api\": every backend has weight 0, so the VIP takes no new flows and will drop them",
                ],
            ),
            (
                "small table",
                vip(
                    "table_size = 13",
                    "[[vip.backend]]\naddress = \"10.0.0.1\"\n[[vip.backend]]\naddress = \"10.0.0.2\"\n",
                ),
                vec![
                    "xlb.toml: vip \"api\": table_size 13 is less than 10 × its 2 backends, so their shares of flows will be uneven; use a prime of at least 20, such as 23",
                ],
            ),
            ("none", vip("", ONE_BACKEND), vec![]),
        ];
        for (name, text, want) in cases {
            assert_eq!(ok(name, &text).warnings, want, "{name}");
        }
    }

    #[test]
    fn metrics_can_be_disabled_and_max_table_size_lowers_the_default() {
        let config = ok(
            "metrics off",
            &format!(
                "[daemon]\ninterface = \"eth0\"\nmetrics_address = \"\"\nmax_table_size = 1009\n\
                 [[vip]]\nname = \"a\"\naddress = \"10.1.0.1\"\nport = 80\n{ONE_BACKEND}"
            ),
        );
        assert_eq!(config.daemon.metrics_address, None);
        assert_eq!(config.vips[0].table_size, 1009);
    }

    #[test]
    fn raw_values_match_lb_common() {
        let cases = [
            ("tcp", Protocol::Tcp.as_raw(), lb_common::PROTO_TCP),
            ("udp", Protocol::Udp.as_raw(), lb_common::PROTO_UDP),
            ("dsr-ipip", Mode::DsrIpip.as_raw(), lb_common::MODE_DSR_IPIP),
            ("dsr-l2", Mode::DsrL2.as_raw(), lb_common::MODE_DSR_L2),
            (
                "rehash",
                DownPolicy::Rehash.as_raw(),
                lb_common::DOWN_POLICY_REHASH,
            ),
            (
                "keep",
                DownPolicy::Keep.as_raw(),
                lb_common::DOWN_POLICY_KEEP,
            ),
        ];
        for (name, got, want) in cases {
            assert_eq!(got, want, "{name}");
        }
        assert_eq!(Mode::DsrIpip.to_string(), "dsr-ipip");
        assert_eq!(Mode::DsrL2.to_string(), "dsr-l2");
    }

    #[test]
    fn max_ring_stride_is_prime() {
        assert!(is_prime(MAX_RING_STRIDE));
        assert!(!(MAX_RING_STRIDE + 1..1 << 20).any(is_prime));
    }

    #[test]
    fn serialized_config_hides_the_hash_seed() {
        let config = ok(
            "seeded",
            &format!(
                "[daemon]\ninterface = \"eth0\"\nhash_seed = \"00000000000000ff00000000000000ee\"\n\
                 [[vip]]\nname = \"a\"\naddress = \"10.1.0.1\"\nport = 80\n{ONE_BACKEND}"
            ),
        );
        assert_eq!(config.daemon.hash_seed, Some([0xff, 0xee]));
        let json = serde_json::to_value(&config).unwrap();
        assert!(json["daemon"].get("hash_seed").is_none(), "{json}");
        assert_eq!(json["daemon"]["udp_timeout"], "30s");
        let health = &json["vips"][0]["backends"][0]["health"];
        assert_eq!(health["kind"], "http");
        assert_eq!(health["fast_interval"], "500ms");
        assert_eq!(health["hang_timeout"], "3s");
        assert_eq!(health["port"], 80);
        assert_eq!(json["vips"][0]["mode"], "dsr-ipip");
    }

    #[test]
    fn example_file_parses() {
        let config = ok("examples/xlb.toml", include_str!("../../examples/xlb.toml"));
        assert_eq!(config.warnings, Vec::<String>::new());
        let names: Vec<&str> = config.vips.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["api", "dns", "api-v6"]);
        let api = config.vip("api").unwrap();
        assert_eq!(api.backends[1].weight, 2);
        assert_eq!(api.backends[1].health.timeout, Duration::from_millis(1500));
        assert_eq!(api.backends[0].health.port, 8080);
        assert_eq!(
            config.vip("dns").unwrap().backends[0].health.kind,
            CheckKind::Tcp
        );
    }

    #[test]
    fn from_file() {
        let dir = std::env::temp_dir().join(format!("xlb-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("xlb.toml");
        std::fs::write(&path, vip("table_size = 10", ONE_BACKEND)).unwrap();
        let e = Config::from_file(&path).unwrap_err();
        assert_eq!(
            e.problems,
            [format!(
                "{}: vip \"api\": table_size 10 is not prime; use a prime such as 11",
                path.display()
            )]
        );
        std::fs::write(&path, vip("", ONE_BACKEND)).unwrap();
        assert_eq!(Config::from_file(&path).unwrap().vips.len(), 1);
        let missing = dir.join("missing.toml");
        let e = Config::from_file(&missing).unwrap_err();
        assert_eq!(
            e.problems,
            [format!(
                "{}: cannot read the configuration: No such file or directory (os error 2)",
                missing.display()
            )]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
