//! The `[daemon]` table: [`DaemonConfig`] and the checks that build it, one
//! per setting, in the order the settings are documented.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::raw::RawDaemon;
use super::{Problems, defaults, duration_setting, ser_duration, suggest_prime};
use crate::{guard::Prefix, maglev::is_prime};

/// Shortest non-zero `daemon.udp_timeout`: twice the data plane's
/// last-seen refresh period (`lb_common::CT_TOUCH_INTERVAL_NS`).
pub const MIN_UDP_TIMEOUT: Duration = Duration::from_nanos(2 * lb_common::CT_TOUCH_INTERVAL_NS);

/// Largest `daemon.max_table_size` (the largest prime below 2^20). The ring
/// is preallocated for every VIP: `MAX_VIPS` × 2 halves × stride × 8 B (the
/// kernel stores each 4-byte slot in 8), i.e. 1 GiB of kernel memory at this
/// size (64 MiB at the default).
pub const MAX_RING_STRIDE: u32 = 1_048_573;

/// Smallest `daemon.conntrack_size`. The kernel's LRU hash splits its
/// entries among the CPUs' free lists and evicts in batches of up to 128 per
/// CPU (`LOCAL_FREE_TARGET`, kernel/bpf/bpf_lru_list.c), so a map of a few
/// entries evicts live flows at once, and their next packets may change
/// backend.
pub const MIN_CONNTRACK_SIZE: u32 = 4096;

/// Largest `daemon.conntrack_size`: 2^27 entries, about 16 GiB of kernel
/// memory at [`CT_ENTRY_BYTES`] each (2^32 − 1 would be 512 GiB, and the
/// start would fail deep in map creation instead of here).
pub const MAX_CONNTRACK_SIZE: u32 = 1 << 27;

/// Kernel memory of one conntrack entry, roughly: the 40-byte key, the
/// 24-byte value and the LRU hash element's own header, rounded up.
const CT_ENTRY_BYTES: u64 = 128;

/// A socket path must fit `sockaddr_un.sun_path` (108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Where every message about this table is placed.
const CTX: &str = "daemon";

/// XDP attach mode (`daemon.xdp_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpMode {
    /// In the driver, before an skb exists: the fast path.
    Native,
    /// In the generic (skb) path: works on any interface, much slower; for testing.
    Generic,
}

display_as_toml! {
    XdpMode { Native => "native", Generic => "generic" }
}

/// The `[daemon]` table, grouped by what a change to a setting requires, so
/// a reload compares three groups instead of listing settings. The file
/// keeps one flat table; so does the serialized form.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DaemonConfig {
    #[serde(flatten)]
    pub pinned: PinnedSettings,
    #[serde(flatten)]
    pub restart: RestartSettings,
    #[serde(flatten)]
    pub live: LiveSettings,
}

/// What the pinned state fixes: changing one means `xlb detach` (which drops
/// established flows) and a fresh start.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PinnedSettings {
    /// Interface the XDP program is attached to. Required.
    pub interface: String,
    /// Default [`XdpMode::Native`].
    pub xdp_mode: XdpMode,
    /// Pins live under `/sys/fs/bpf/xlb/<instance>/`; `[a-z0-9_-]{1,32}`.
    /// Default `"default"`.
    pub instance: String,
    /// Conntrack capacity, entries. Default 1048576.
    pub conntrack_size: u32,
    /// Ring stride: the largest `table_size` any VIP may use; a prime.
    /// Default 65537.
    pub max_table_size: u32,
    /// Capacity of each NAT flow map, entries. Default
    /// [`lb_common::nat::DEFAULT_NAT_SIZE`].
    pub nat_size: u32,
}

/// What the running process holds: a change takes effect at the next
/// restart.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RestartSettings {
    /// Unix socket of the control API. Default `/run/xlb/xlb.sock`.
    pub control_socket: PathBuf,
    /// Group given the control socket with mode 0660; `None` (the default) =
    /// mode 0600, root only.
    pub socket_group: Option<String>,
    /// Where Prometheus metrics are served; `None` = disabled (`""` in the
    /// file). Default `127.0.0.1:9813`.
    pub metrics_address: Option<SocketAddr>,
    /// Health probes in flight at once. Default 256.
    pub probe_concurrency: u32,
}

/// What the data plane reads from its globals map: a reload applies a change
/// at once.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LiveSettings {
    /// Idle time after which a UDP flow may be re-balanced; 0 = never.
    /// Default 30 s.
    #[serde(serialize_with = "ser_duration")]
    pub udp_timeout: Duration,
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
    /// Outer IPv4 sources spread over a prefix (/16 to /32), the host bits
    /// taken from each flow, so a backend NIC's RSS spreads one LB's flows
    /// over its queues (as Katran does); replaces `encap_source_v4`.
    pub encap_source_v4_prefix: Option<Prefix>,
    /// Replies the data plane generates itself (RSTs to refused SYNs, echo
    /// replies, "fragmentation needed" / "packet too big"), per second and
    /// CPU; above it the packet is dropped (`drop_reply_limited`). Default
    /// [`lb_common::DEFAULT_REPLY_RATE`].
    pub reply_rate: u32,
    /// How long a Maglev slot remembers its previous owner for second
    /// chance; 0 = never (no VIP gets a second chance). Default 10 min.
    #[serde(serialize_with = "ser_duration")]
    pub second_chance_window: Duration,
    /// NAT VIPs' TCP state timeouts, which each VIP may override.
    #[serde(flatten)]
    pub nat_timeouts: super::nat::NatTimeouts,
}

/// Checks every setting and resolves its default. Settings are checked in
/// the order of the documentation, so errors come in that order.
pub(super) fn validate(raw: &RawDaemon, p: &mut Problems<'_>) -> DaemonConfig {
    let interface = interface(raw, p);
    let xdp_mode = xdp_mode(raw, p);
    let instance = instance(raw, p);
    let control_socket = control_socket(raw, p);
    let socket_group = socket_group(raw, p);
    let metrics_address = metrics_address(raw, p);
    let conntrack_size = conntrack_size(raw, p);
    let udp_timeout = udp_timeout(raw, p);
    let max_table_size = max_table_size(raw, p);
    let hash_seed = hash_seed(raw, p);
    let encap_source_v4 = encap_source_v4(raw, p);
    let encap_source_v6 = encap_source_v6(raw, p);
    let encap_source_v4_prefix = encap_source_v4_prefix(raw, p);
    let probe_concurrency = probe_concurrency(raw, p);
    let reply_rate = reply_rate(raw, p);
    let second_chance_window = super::chance::window(raw, CTX, p);
    let nat_size = super::nat::nat_size(raw, CTX, p);
    let nat_timeouts = super::nat::daemon_timeouts(raw, CTX, p);
    DaemonConfig {
        pinned: PinnedSettings {
            interface,
            xdp_mode,
            instance,
            conntrack_size,
            max_table_size,
            nat_size,
        },
        restart: RestartSettings {
            control_socket,
            socket_group,
            metrics_address,
            probe_concurrency,
        },
        live: LiveSettings {
            udp_timeout,
            hash_seed,
            encap_source_v4,
            encap_source_v6,
            encap_source_v4_prefix,
            reply_rate,
            second_chance_window,
            nat_timeouts,
        },
    }
}

/// The kernel's dev_valid_name(): shorter than IFNAMSIZ (16), no '/', ':'
/// or whitespace, not "." or "..".
fn interface(raw: &RawDaemon, p: &mut Problems<'_>) -> String {
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
    ifname.clone()
}

fn xdp_mode(raw: &RawDaemon, p: &mut Problems<'_>) -> XdpMode {
    let xdp_mode = raw.xdp_mode.unwrap_or(defaults::XDP_MODE);
    if xdp_mode == XdpMode::Generic {
        p.warn(
            CTX,
            "xdp_mode = \"generic\" runs XDP after the kernel has built an skb: \
             much slower than \"native\"; use it for testing only",
        );
    }
    xdp_mode
}

/// Part of the bpffs pin path, so kept to characters safe in any path.
fn instance(raw: &RawDaemon, p: &mut Problems<'_>) -> String {
    let instance = raw
        .instance
        .clone()
        .unwrap_or_else(|| defaults::INSTANCE.to_owned());
    if let Err(e) = check_instance(&instance) {
        p.error(CTX, e);
    }
    instance
}

/// Whether `instance` can name an instance: 1 to 32 characters from
/// `a-z 0-9 _ -`, so it stays one component of the pin and state paths
/// (no `/`, no `..`). Shared by the configuration and `xlb detach
/// --instance`.
pub fn check_instance(instance: &str) -> Result<(), String> {
    if instance.is_empty()
        || instance.len() > 32
        || !instance
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    {
        return Err(format!(
            "instance {instance:?} is invalid; use 1 to 32 characters from a-z 0-9 _ -"
        ));
    }
    Ok(())
}

/// The socket of an instance whose configuration does not set
/// `control_socket`: [`defaults::CONTROL_SOCKET`] for the default instance
/// (and an unset one), `/run/xlb/<instance>.sock` for the others, so two
/// instances on one host do not fight over one socket, and `xlb status
/// --instance NAME` finds it.
pub fn default_control_socket(instance: &str) -> PathBuf {
    if instance.is_empty() || instance == defaults::INSTANCE {
        PathBuf::from(defaults::CONTROL_SOCKET)
    } else {
        std::path::Path::new(defaults::CONTROL_SOCKET).with_file_name(format!("{instance}.sock"))
    }
}

fn control_socket(raw: &RawDaemon, p: &mut Problems<'_>) -> PathBuf {
    let control_socket = raw
        .control_socket
        .clone()
        .unwrap_or_else(|| default_control_socket(raw.instance.as_deref().unwrap_or_default()));
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
    control_socket
}

fn socket_group(raw: &RawDaemon, p: &mut Problems<'_>) -> Option<String> {
    if raw.socket_group.as_deref() == Some("") {
        p.error(
            CTX,
            "socket_group is empty; name a group, or remove socket_group to keep \
             the control socket root-only (mode 0600)",
        );
    }
    raw.socket_group.clone()
}

/// `""` disables metrics, hence a string rather than an address in the file.
/// Every address (`0.0.0.0`, `[::]`) is allowed, with a warning: the
/// endpoint is unauthenticated and names VIPs, backends and heavy sources,
/// but a firewall may well keep it to a management network.
fn metrics_address(raw: &RawDaemon, p: &mut Problems<'_>) -> Option<SocketAddr> {
    match raw.metrics_address.as_deref() {
        None => Some(defaults::METRICS_ADDRESS),
        Some("") => None,
        Some(text) => match text.parse::<SocketAddr>() {
            Ok(addr) => {
                if addr.ip().is_unspecified() {
                    p.warn(
                        CTX,
                        format!(
                            "metrics_address {addr} listens on every address of this host: \
                             the metrics are unauthenticated and name every VIP, backend and \
                             heavy source; use 127.0.0.1 or a management address, or keep \
                             the port behind a firewall"
                        ),
                    );
                }
                Some(addr)
            }
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
    }
}

fn conntrack_size(raw: &RawDaemon, p: &mut Problems<'_>) -> u32 {
    let conntrack_size = raw.conntrack_size.unwrap_or(defaults::CONNTRACK_SIZE);
    if conntrack_size < MIN_CONNTRACK_SIZE {
        p.error(
            CTX,
            format!(
                "conntrack_size {conntrack_size} is too small: the kernel's LRU evicts in \
                 batches per CPU, so a smaller map evicts live flows; use at least \
                 {MIN_CONNTRACK_SIZE} (default {})",
                defaults::CONNTRACK_SIZE
            ),
        );
    } else if conntrack_size > MAX_CONNTRACK_SIZE {
        let gib = |n: u32| (u64::from(n) * CT_ENTRY_BYTES) >> 30;
        p.error(
            CTX,
            format!(
                "conntrack_size {conntrack_size} is too large: the map would take about {} GiB \
                 of kernel memory; use at most {MAX_CONNTRACK_SIZE} (about {} GiB), a few \
                 times the flows you expect at once",
                gib(conntrack_size),
                gib(MAX_CONNTRACK_SIZE)
            ),
        );
    }
    conntrack_size
}

/// 0 is meaningful here: UDP flows never expire.
fn udp_timeout(raw: &RawDaemon, p: &mut Problems<'_>) -> Duration {
    let Some(text) = raw.udp_timeout.as_deref() else {
        return defaults::UDP_TIMEOUT;
    };
    match duration_setting("udp_timeout", text, CTX, p) {
        Some(d) if !d.is_zero() && d < MIN_UDP_TIMEOUT => {
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
        Some(d) => d,
        None => defaults::UDP_TIMEOUT,
    }
}

/// Maglev needs a prime, and the ring is preallocated at this stride for
/// every VIP, so it is bounded by kernel memory.
fn max_table_size(raw: &RawDaemon, p: &mut Problems<'_>) -> u32 {
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
    max_table_size
}

fn hash_seed(raw: &RawDaemon, p: &mut Problems<'_>) -> Option<[u64; 2]> {
    let text = raw.hash_seed.as_deref()?;
    let seed = parse_hash_seed(text);
    if seed == Some([0, 0]) {
        // The data plane and the start read a zero key as "none set yet".
        p.error(
            CTX,
            "hash_seed is all zeros, which xlb reads as \"no key set\" (and which anyone \
             could guess); generate one with `openssl rand -hex 16`, or remove hash_seed to \
             get a random one on first start",
        );
        return None;
    }
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

fn encap_source_v4(raw: &RawDaemon, p: &mut Problems<'_>) -> Option<Ipv4Addr> {
    let a = raw.encap_source_v4?;
    if a.is_unspecified() || a.is_multicast() || a.is_broadcast() || a.is_loopback() {
        not_a_source(p, "encap_source_v4", &a);
    }
    Some(a)
}

fn encap_source_v4_prefix(raw: &RawDaemon, p: &mut Problems<'_>) -> Option<Prefix> {
    let text = raw.encap_source_v4_prefix.as_deref()?;
    let min = 32 - lb_common::MAX_ENCAP_HOST_BITS;
    let prefix = match text.parse::<Prefix>() {
        Ok(pf) if pf.addr.is_ipv4() && pf.len >= min => pf,
        Ok(_) => {
            p.error(
                CTX,
                format!(
                    "encap_source_v4_prefix {text:?} must be an IPv4 prefix of length {min} to 32 \
                     (e.g. \"10.255.0.0/24\": 256 outer sources)"
                ),
            );
            return None;
        }
        Err(e) => {
            p.error(CTX, format!("encap_source_v4_prefix: {e}"));
            return None;
        }
    };
    if raw.encap_source_v4.is_some() {
        p.error(
            CTX,
            "set encap_source_v4 (one outer source) or encap_source_v4_prefix (a source per \
             flow within the prefix), not both",
        );
    }
    if let IpAddr::V4(a) = prefix.addr
        && (a.is_unspecified() || a.is_multicast() || a.is_broadcast() || a.is_loopback())
    {
        not_a_source(p, "encap_source_v4_prefix", &prefix);
    }
    Some(prefix)
}

fn encap_source_v6(raw: &RawDaemon, p: &mut Problems<'_>) -> Option<Ipv6Addr> {
    let a = raw.encap_source_v6?;
    if a.is_unspecified() || a.is_multicast() || a.is_loopback() {
        not_a_source(p, "encap_source_v6", &a);
    }
    Some(a)
}

fn not_a_source(p: &mut Problems<'_>, field: &str, a: &dyn std::fmt::Display) {
    p.error(
        CTX,
        format!(
            "{field} {a} cannot be a packet's source; use an address of this host \
             that backends can reach, or remove it to use the interface's address"
        ),
    );
}

/// More probes than backends can never be in flight at once.
fn probe_concurrency(raw: &RawDaemon, p: &mut Problems<'_>) -> u32 {
    let probe_concurrency = raw.probe_concurrency.unwrap_or(defaults::PROBE_CONCURRENCY);
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
    probe_concurrency
}

/// Largest `daemon.reply_rate`, per second and CPU: far above any useful
/// budget, and its interval (100 ns) still a whole number of ns.
const MAX_REPLY_RATE: u32 = 10_000_000;

/// `daemon.reply_rate`: a rate (`"1000/s"`, `"600/min"`) of at least one
/// reply per second, whole replies per second.
fn reply_rate(raw: &RawDaemon, p: &mut Problems<'_>) -> u32 {
    let Some(text) = raw.reply_rate.as_deref() else {
        return defaults::REPLY_RATE;
    };
    match super::guard::parse_rate(text) {
        Ok(r) if (1.0..=f64::from(MAX_REPLY_RATE)).contains(&r) => r.round() as u32,
        Ok(_) => {
            p.error(
                CTX,
                format!(
                    "reply_rate {text:?} is out of range; use {} to {} \
                     (replies each CPU may generate per second; default {})",
                    super::shown::rate(1.0),
                    super::shown::rate(f64::from(MAX_REPLY_RATE)),
                    super::shown::rate(f64::from(defaults::REPLY_RATE))
                ),
            );
            defaults::REPLY_RATE
        }
        Err(e) => {
            p.error(CTX, format!("reply_rate {e}"));
            defaults::REPLY_RATE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{DAEMON, ONE_BACKEND, ok};

    #[test]
    fn reply_rate_is_per_second_and_defaults_to_1000() {
        let rate = |extra: &str| {
            ok("reply_rate", &format!("{DAEMON}{extra}\n{}", api()))
                .daemon
                .live
                .reply_rate
        };
        assert_eq!(rate(""), 1000);
        assert_eq!(rate(r#"reply_rate = "250/s""#), 250);
        assert_eq!(rate(r#"reply_rate = "600/min""#), 10);
        assert_eq!(lb_common::reply_limit(1000), (1_000_000, 99_000_000));
        assert_eq!(lb_common::reply_limit(5), (200_000_000, 0));
    }

    /// A VIP, so that a configuration with only `[daemon]` settings is whole.
    fn api() -> String {
        format!("[[vip]]\nname = \"api\"\naddress = \"10.100.0.1\"\nport = 80\n{ONE_BACKEND}")
    }

    rejects! {
        /// Every setting wrong at once: one error each, in documentation order.
        every_daemon_field_is_checked: r#"
[daemon]
interface = "eth0:1"
instance = "Prod"
control_socket = "xlb.sock"
socket_group = ""
metrics_address = "localhost"
conntrack_size = 0
udp_timeout = "30"
max_table_size = 65536
hash_seed = "abc"
encap_source_v4 = "0.0.0.0"
encap_source_v6 = "::1"
probe_concurrency = 0
"# => [
            r#"xlb.toml: daemon: interface "eth0:1" is not a valid interface name; use the name `ip link` shows, e.g. "eth0" (1 to 15 characters)"#,
            r#"xlb.toml: daemon: instance "Prod" is invalid; use 1 to 32 characters from a-z 0-9 _ -"#,
            r#"xlb.toml: daemon: control_socket "xlb.sock" is not an absolute path; use e.g. "/run/xlb/xlb.sock""#,
            r"xlb.toml: daemon: socket_group is empty; name a group, or remove socket_group to keep the control socket root-only (mode 0600)",
            r#"xlb.toml: daemon: metrics_address "localhost" is not an address:port; use e.g. "127.0.0.1:9813" or "[::1]:9813", or "" to disable metrics"#,
            r"xlb.toml: daemon: conntrack_size 0 is too small: the kernel's LRU evicts in batches per CPU, so a smaller map evicts live flows; use at least 4096 (default 1048576)",
            r#"xlb.toml: daemon: udp_timeout "30" is not a duration; write a number and a unit (ms, s, m, h or d), e.g. "500ms", "2s", "1.5s", "1m""#,
            r"xlb.toml: daemon: max_table_size 65536 is not prime; use a prime such as 65537",
            r"xlb.toml: daemon: hash_seed must be 32 hexadecimal digits (128 bits), got 3 characters; generate one with `openssl rand -hex 16`, or remove hash_seed to get a random one on first start",
            r"xlb.toml: daemon: encap_source_v4 0.0.0.0 cannot be a packet's source; use an address of this host that backends can reach, or remove it to use the interface's address",
            r"xlb.toml: daemon: encap_source_v6 ::1 cannot be a packet's source; use an address of this host that backends can reach, or remove it to use the interface's address",
            r"xlb.toml: daemon: probe_concurrency 0 is out of range; use 1 to 4096 (default 256)",
        ];
        reply_rate_zero: format!(r#"{DAEMON}reply_rate = "0/s""#) => [
            r#"xlb.toml: daemon: reply_rate "0/s" is out of range; use "1/s" to "10000000/s" (replies each CPU may generate per second; default "1000/s")"#,
        ];
        reply_rate_not_a_rate: format!(r#"{DAEMON}reply_rate = 1000"#) => [
            "xlb.toml:4:14: daemon: reply_rate: invalid type: integer `1000`, expected a string",
        ];
        reply_rate_without_a_unit: format!(r#"{DAEMON}reply_rate = "1000""#) => [
            r#"xlb.toml: daemon: reply_rate "1000" is not a rate; write a number per second or per minute, e.g. "200/s", "30/min""#,
        ];
        udp_timeout_shorter_than_the_conntrack_refresh: format!(r#"{DAEMON}udp_timeout = "500ms""#) => [
            r"xlb.toml: daemon: udp_timeout 500ms is too short: conntrack refreshes a flow's last-seen time once a second, so use 0 (never expire) or at least 2s",
        ];
        encap_source_v4_prefix_too_wide: format!(r#"{DAEMON}encap_source_v4_prefix = "10.0.0.0/8""#) => [
            r#"xlb.toml: daemon: encap_source_v4_prefix "10.0.0.0/8" must be an IPv4 prefix of length 16 to 32 (e.g. "10.255.0.0/24": 256 outer sources)"#,
        ];
        encap_source_v4_prefix_of_ipv6: format!(r#"{DAEMON}encap_source_v4_prefix = "fd00::/112""#) => [
            r#"xlb.toml: daemon: encap_source_v4_prefix "fd00::/112" must be an IPv4 prefix of length 16 to 32 (e.g. "10.255.0.0/24": 256 outer sources)"#,
        ];
        encap_source_v4_prefix_with_host_bits: format!(r#"{DAEMON}encap_source_v4_prefix = "10.0.0.7/24""#) => [
            r#"xlb.toml: daemon: encap_source_v4_prefix: "10.0.0.7/24" has host bits set; write "10.0.0.0/24" for the network, or "10.0.0.7/32" for the one address"#,
        ];
        encap_source_v4_and_its_prefix: format!(r#"{DAEMON}encap_source_v4 = "10.0.0.2"
    encap_source_v4_prefix = "10.255.0.0/24""#) => [
            r"xlb.toml: daemon: set encap_source_v4 (one outer source) or encap_source_v4_prefix (a source per flow within the prefix), not both",
        ];
        hash_seed_of_zeros: format!(r#"{DAEMON}hash_seed = "00000000000000000000000000000000""#) => [
            r#"xlb.toml: daemon: hash_seed is all zeros, which xlb reads as "no key set" (and which anyone could guess); generate one with `openssl rand -hex 16`, or remove hash_seed to get a random one on first start"#,
        ];
        conntrack_size_of_one: format!("{DAEMON}conntrack_size = 1") => [
            r"xlb.toml: daemon: conntrack_size 1 is too small: the kernel's LRU evicts in batches per CPU, so a smaller map evicts live flows; use at least 4096 (default 1048576)",
        ];
        conntrack_size_of_512_gib: format!("{DAEMON}conntrack_size = 4294967295") => [
            r"xlb.toml: daemon: conntrack_size 4294967295 is too large: the map would take about 511 GiB of kernel memory; use at most 134217728 (about 16 GiB), a few times the flows you expect at once",
        ];
        max_table_size_too_large: format!("{DAEMON}max_table_size = 2097143") => [
            r"xlb.toml: daemon: max_table_size 2097143 is too large: the ring would take 2047 MiB of kernel memory; use a prime of at most 1048573",
        ];
    }

    #[test]
    fn metrics_can_be_disabled_and_max_table_size_lowers_the_default() {
        let config = ok(
            "metrics off",
            &format!(
                r#"
[daemon]
interface = "eth0"
metrics_address = ""
max_table_size = 1009

[[vip]]
name = "a"
address = "10.1.0.1"
port = 80
{ONE_BACKEND}"#
            ),
        );
        assert_eq!(config.daemon.restart.metrics_address, None);
        assert_eq!(config.vips[0].table_size, 1009);
    }

    #[test]
    fn encap_source_v4_prefix_is_read() {
        let config = ok(
            "prefix",
            &format!(
                r#"{DAEMON}encap_source_v4_prefix = "10.255.0.0/24"

[[vip]]
name = "a"
address = "10.1.0.1"
port = 80
{ONE_BACKEND}"#
            ),
        );
        let pf = config.daemon.live.encap_source_v4_prefix.expect("set");
        assert_eq!(pf.to_string(), "10.255.0.0/24");
    }

    #[test]
    fn conntrack_size_bounds_are_accepted() {
        for size in [MIN_CONNTRACK_SIZE, MAX_CONNTRACK_SIZE] {
            let config = ok("bound", &format!("{DAEMON}conntrack_size = {size}"));
            assert_eq!(config.daemon.pinned.conntrack_size, size);
        }
    }

    #[test]
    fn metrics_on_every_address_is_a_warning() {
        let warning = |addr: &str| {
            format!(
                "xlb.toml: daemon: metrics_address {addr} listens on every address of this \
                 host: the metrics are unauthenticated and name every VIP, backend and heavy \
                 source; use 127.0.0.1 or a management address, or keep the port behind a \
                 firewall"
            )
        };
        // (name, metrics_address, warnings)
        let cases = [
            (
                "every IPv4 address",
                "0.0.0.0:9813",
                vec![warning("0.0.0.0:9813")],
            ),
            (
                "every IPv6 address",
                "[::]:9813",
                vec![warning("[::]:9813")],
            ),
            ("loopback", "127.0.0.1:9813", vec![]),
            ("a management address", "192.0.2.5:9813", vec![]),
        ];
        for (name, addr, want) in cases {
            let text = format!("{DAEMON}metrics_address = \"{addr}\"\n");
            let config = ok(name, &text);
            let got: Vec<&String> = config
                .warnings
                .iter()
                .filter(|w| w.contains("metrics_address"))
                .collect();
            assert_eq!(got, want.iter().collect::<Vec<_>>(), "{name}");
        }
    }

    #[test]
    fn max_ring_stride_is_prime() {
        assert!(is_prime(MAX_RING_STRIDE));
        assert!(!(MAX_RING_STRIDE + 1..1 << 20).any(is_prime));
    }
}
