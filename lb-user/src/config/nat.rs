//! NAT mode's settings (issue 27): `daemon.nat_size` and the daemon-wide
//! TCP state timeouts, and on each `mode = "nat"` VIP its source pool
//! (`snat`, `snat_ports`), `preserve_client` and its own timeouts, which
//! override the daemon's one by one.
//!
//! Timeouts live in `[daemon]` because they describe how long a TCP
//! state is worth a port, which rarely differs between services; a VIP
//! whose clients idle longer (a database pool) overrides `tcp_timeout`
//! alone. UDP flows use `daemon.udp_timeout`, as in the DSR modes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use serde::Serialize;

use super::daemon::DaemonConfig;
use super::raw::{RawDaemon, RawVip, ViaName};
use super::vip::{Mode, Protocol};
use super::{Problems, duration_setting, ser_duration, shown};
use lb_common::nat::{DEFAULT_SNAT_PORT_MAX, DEFAULT_SNAT_PORT_MIN, MAX_SNAT_ADDRS};

/// Smallest `daemon.nat_size`: the maps are plain hashes (a live flow is
/// never evicted), so a tiny one refuses new flows early, but nothing
/// breaks; below this it is a typo rather than a plan.
pub const MIN_NAT_SIZE: u32 = 1024;
/// Largest `daemon.nat_size`: 2^26 flows, two entries each (about 16 GiB
/// of kernel memory at [`NAT_FLOW_BYTES`]).
pub const MAX_NAT_SIZE: u32 = 1 << 26;
/// Kernel memory of one NAT flow, roughly: a 40-byte key and 56-byte
/// value in `XLB_NAT_FLOWS`, a 40-byte key and value in `XLB_NAT_REPLY`,
/// and two hash elements' headers.
const NAT_FLOW_BYTES: u64 = 256;

/// Shortest TCP state timeout: twice the data plane's last-seen refresh
/// period, as for `udp_timeout` (a shorter one would reclaim busy flows).
pub(super) const MIN_TCP_TIMEOUT: Duration = super::daemon::MIN_UDP_TIMEOUT;

/// How long each TCP state keeps its flow (and its port) without a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct NatTimeouts {
    /// A SYN sent, no SYN-ACK yet (`tcp_syn_timeout`).
    #[serde(rename = "tcp_syn_timeout", serialize_with = "ser_duration")]
    pub syn: Duration,
    /// Established (`tcp_timeout`).
    #[serde(rename = "tcp_timeout", serialize_with = "ser_duration")]
    pub established: Duration,
    /// After a FIN either way (`tcp_fin_timeout`).
    #[serde(rename = "tcp_fin_timeout", serialize_with = "ser_duration")]
    pub fin: Duration,
    /// After a RST (`tcp_close_timeout`).
    #[serde(rename = "tcp_close_timeout", serialize_with = "ser_duration")]
    pub close: Duration,
}

pub mod defaults {
    use std::time::Duration;

    /// `tcp_syn_timeout`: half of nf_conntrack's SYN_SENT (120 s). A
    /// client's kernel gives up on a SYN after about 127 s (6 retries),
    /// but a backend that has not answered in a minute is not going to,
    /// and a SYN flood should not hold pool ports for two.
    pub const TCP_SYN: Duration = Duration::from_secs(60);
    /// `tcp_timeout`: 2 h, Linux's `tcp_keepalive_time`, so a connection
    /// whose ends use keepalive is refreshed before it expires.
    /// nf_conntrack keeps 5 days, but here every idle entry holds one of a
    /// pool's few thousand ports per backend: a client that vanished
    /// without FIN or RST would pin its port for days.
    pub const TCP_ESTABLISHED: Duration = Duration::from_secs(2 * 3600);
    /// `tcp_fin_timeout`: nf_conntrack's FIN_WAIT and TIME_WAIT (120 s).
    pub const TCP_FIN: Duration = Duration::from_secs(120);
    /// `tcp_close_timeout`: nf_conntrack's CLOSE (10 s): stray segments
    /// after a RST still find the flow.
    pub const TCP_CLOSE: Duration = Duration::from_secs(10);
    /// `daemon.nat_size`.
    pub const NAT_SIZE: u32 = lb_common::nat::DEFAULT_NAT_SIZE;
}

impl Default for NatTimeouts {
    fn default() -> Self {
        Self {
            syn: defaults::TCP_SYN,
            established: defaults::TCP_ESTABLISHED,
            fin: defaults::TCP_FIN,
            close: defaults::TCP_CLOSE,
        }
    }
}

/// A NAT VIP's resolved settings ([`super::VipConfig::nat`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NatConfig {
    /// Destination NAT only: the backend sees the client's address and
    /// must route its answers through this host. Default false.
    pub preserve_client: bool,
    /// Source addresses of the VIP's family; empty with `preserve_client`.
    pub snat: Vec<IpAddr>,
    /// Allocated source ports, inclusive. Default
    /// [`DEFAULT_SNAT_PORT_MIN`]..=[`DEFAULT_SNAT_PORT_MAX`].
    pub port_min: u16,
    pub port_max: u16,
    /// `[daemon]`'s timeouts overridden by the VIP's own.
    #[serde(flatten)]
    pub timeouts: NatTimeouts,
}

/// `daemon.nat_size`: entries of each NAT flow map.
pub(super) fn nat_size(raw: &RawDaemon, ctx: &str, p: &mut Problems<'_>) -> u32 {
    let size = raw.nat_size.unwrap_or(defaults::NAT_SIZE);
    let gib = |n: u32| (u64::from(n) * NAT_FLOW_BYTES) >> 30;
    if size < MIN_NAT_SIZE {
        p.error(
            ctx,
            format!(
                "nat_size {size} is too small: each NAT flow takes one entry, and a full map \
                 refuses new flows; use at least {MIN_NAT_SIZE} (default {})",
                defaults::NAT_SIZE
            ),
        );
    } else if size > MAX_NAT_SIZE {
        p.error(
            ctx,
            format!(
                "nat_size {size} is too large: the NAT maps would take about {} GiB of kernel \
                 memory; use at most {MAX_NAT_SIZE} (about {} GiB), a few times the NAT flows \
                 you expect at once",
                gib(size),
                gib(MAX_NAT_SIZE)
            ),
        );
    }
    size
}

/// The four TCP timeouts as written in a table (`[daemon]` or a VIP),
/// each over `base`.
fn timeouts(
    written: [&Option<String>; 4],
    base: NatTimeouts,
    ctx: &str,
    p: &mut Problems<'_>,
) -> NatTimeouts {
    let [syn, est, fin, close] = written;
    let mut one = |name: &str, text: &Option<String>, base: Duration| {
        let Some(text) = text.as_deref() else {
            return base;
        };
        match duration_setting(name, text, ctx, p) {
            Some(d) if d < MIN_TCP_TIMEOUT => {
                p.error(
                    ctx,
                    format!(
                        "{name} {text:?} is too short: the data plane refreshes a flow's \
                         last-seen time once a second, so a shorter timeout would reclaim \
                         busy flows; use at least {}",
                        shown::duration(MIN_TCP_TIMEOUT)
                    ),
                );
                base
            }
            Some(d) => d,
            None => base,
        }
    };
    NatTimeouts {
        syn: one("tcp_syn_timeout", syn, base.syn),
        established: one("tcp_timeout", est, base.established),
        fin: one("tcp_fin_timeout", fin, base.fin),
        close: one("tcp_close_timeout", close, base.close),
    }
}

/// `[daemon]`'s TCP timeouts for NAT VIPs.
pub(super) fn daemon_timeouts(raw: &RawDaemon, ctx: &str, p: &mut Problems<'_>) -> NatTimeouts {
    let written = [
        &raw.tcp_syn_timeout,
        &raw.tcp_timeout,
        &raw.tcp_fin_timeout,
        &raw.tcp_close_timeout,
    ];
    timeouts(written, NatTimeouts::default(), ctx, p)
}

fn vip_timeouts_written(raw: &RawVip) -> [&Option<String>; 4] {
    [
        &raw.tcp_syn_timeout,
        &raw.tcp_timeout,
        &raw.tcp_fin_timeout,
        &raw.tcp_close_timeout,
    ]
}

/// VIP `raw`'s NAT settings: `Some` for `mode = "nat"`; for a DSR mode,
/// each NAT key it sets is an error (it would do nothing).
pub(super) fn resolve(
    raw: &RawVip,
    mode: Mode,
    protocol: Protocol,
    daemon: &DaemonConfig,
    ctx: &str,
    p: &mut Problems<'_>,
) -> Option<NatConfig> {
    if mode != Mode::Nat {
        refuse_nat_keys(raw, mode, ctx, p);
        return None;
    }
    let preserve_client = raw.preserve_client.unwrap_or(false);
    let snat = raw.snat.clone().unwrap_or_default();
    check_pool(raw, preserve_client, &snat, ctx, p);
    let (port_min, port_max) = snat_ports(raw, ctx, p);
    if protocol == Protocol::Udp && daemon.live.udp_timeout.is_zero() {
        p.error(
            ctx,
            "daemon.udp_timeout = 0 (never expire) cannot apply to a NAT VIP: each flow holds \
             a pool port until it expires, so the pool would run dry; set udp_timeout \
             (e.g. \"30s\")",
        );
    }
    Some(NatConfig {
        preserve_client,
        snat,
        port_min,
        port_max,
        timeouts: timeouts(vip_timeouts_written(raw), daemon.live.nat_timeouts, ctx, p),
    })
}

fn refuse_nat_keys(raw: &RawVip, mode: Mode, ctx: &str, p: &mut Problems<'_>) {
    let set = [
        ("snat", raw.snat.is_some()),
        ("snat_ports", raw.snat_ports.is_some()),
        ("preserve_client", raw.preserve_client.is_some()),
        ("tcp_syn_timeout", raw.tcp_syn_timeout.is_some()),
        ("tcp_timeout", raw.tcp_timeout.is_some()),
        ("tcp_fin_timeout", raw.tcp_fin_timeout.is_some()),
        ("tcp_close_timeout", raw.tcp_close_timeout.is_some()),
    ];
    for (key, _) in set.iter().filter(|(_, on)| *on) {
        p.error(
            ctx,
            format!(
                "{key} applies to mode = \"nat\" only, and this VIP is {mode}; remove {key} \
                 or set mode = \"nat\""
            ),
        );
    }
}

/// The pool: present unless `preserve_client` (then absent), of the VIP's
/// family, unicast, not the VIP, no repeats, at most [`MAX_SNAT_ADDRS`].
fn check_pool(
    raw: &RawVip,
    preserve_client: bool,
    snat: &[IpAddr],
    ctx: &str,
    p: &mut Problems<'_>,
) {
    match (preserve_client, snat.is_empty()) {
        (false, true) => p.error(
            ctx,
            format!(
                "mode = \"nat\" needs a source pool: set snat = [\"{}\"] to an address of this \
                 host that the backends can answer to, or set preserve_client = true if the \
                 backends route their answers through this host",
                if raw.address.is_ipv4() {
                    "10.0.0.2"
                } else {
                    "fd00::2"
                }
            ),
        ),
        (true, false) => p.error(
            ctx,
            "snat and preserve_client = true exclude each other: with preserve_client the \
             backend sees the client's own address, so no pool is used; remove snat, or \
             remove preserve_client",
        ),
        _ => {}
    }
    if snat.len() > MAX_SNAT_ADDRS {
        p.error(
            ctx,
            format!(
                "snat has {} addresses; a pool holds at most {MAX_SNAT_ADDRS} (each gives \
                 {} ports per backend): remove some",
                snat.len(),
                u32::from(DEFAULT_SNAT_PORT_MAX - DEFAULT_SNAT_PORT_MIN) + 1
            ),
        );
    }
    let mut seen = Vec::new();
    for &a in snat {
        check_pool_address(raw, a, ctx, p);
        if seen.contains(&a) {
            p.error(ctx, format!("snat {a} is listed twice; list it once"));
        }
        seen.push(a);
    }
}

fn check_pool_address(raw: &RawVip, a: IpAddr, ctx: &str, p: &mut Problems<'_>) {
    if a.is_ipv4() != raw.address.is_ipv4() {
        let (have, want) = if raw.address.is_ipv4() {
            ("IPv6", "IPv4")
        } else {
            ("IPv4", "IPv6")
        };
        p.error(
            ctx,
            format!(
                "snat {a} is {have} but the VIP is {want}; NAT translates within one family, \
                 so use an {want} address of this host"
            ),
        );
    } else if a == raw.address {
        p.error(
            ctx,
            format!(
                "snat {a} is the VIP address itself; backends' answers to it would be taken \
                 for clients' packets: use another address of this host"
            ),
        );
    } else if a.is_unspecified() || a.is_multicast() || a.is_loopback() {
        p.error(
            ctx,
            format!(
                "snat {a} cannot be a source address: backends cannot answer to it; use a \
                 unicast address of this host"
            ),
        );
    }
}

/// `snat_ports = "MIN-MAX"`.
fn snat_ports(raw: &RawVip, ctx: &str, p: &mut Problems<'_>) -> (u16, u16) {
    let default = (DEFAULT_SNAT_PORT_MIN, DEFAULT_SNAT_PORT_MAX);
    let Some(text) = raw.snat_ports.as_deref() else {
        return default;
    };
    match parse_port_range(text) {
        Ok(range) => range,
        Err(why) => {
            p.error(
                ctx,
                format!(
                    "snat_ports {text:?} {why}; write \"MIN-MAX\" with 1 ≤ MIN ≤ MAX ≤ 65535, \
                     e.g. \"{DEFAULT_SNAT_PORT_MIN}-{DEFAULT_SNAT_PORT_MAX}\" (the default, \
                     below Linux's ephemeral ports)"
                ),
            );
            default
        }
    }
}

/// `"MIN-MAX"` as an inclusive range of ports.
///
/// # Errors
/// What is wrong, to follow the setting's name.
pub fn parse_port_range(text: &str) -> Result<(u16, u16), String> {
    let (lo, hi) = text
        .split_once('-')
        .ok_or_else(|| "is not a range".to_owned())?;
    let port = |s: &str| {
        s.trim()
            .parse::<u16>()
            .map_err(|_| format!("has {:?}, which is not a port", s.trim()))
    };
    let (lo, hi) = (port(lo)?, port(hi)?);
    if lo == 0 {
        return Err("starts at port 0, which no packet carries".to_owned());
    }
    if lo > hi {
        return Err(format!("is empty ({lo} is above {hi})"));
    }
    Ok((lo, hi))
}

/// `second_chance` for a NAT VIP: refused when set to true (no backend
/// decapsulator hands packets on, and a NAT flow's state is in the
/// pinned maps, not in the backend's routing), else off.
pub(super) fn refuse_second_chance(raw: &RawVip, ctx: &str, p: &mut Problems<'_>) {
    if raw.second_chance == Some(true) {
        p.error(
            ctx,
            "second_chance = true needs mode = \"dsr-ipip\": a NAT flow's state lives in \
             this host's NAT maps, kept across restarts and reloads, and no decapsulator on \
             the backends could pass a packet on; remove second_chance",
        );
    }
}

/// Whether backend `backend` of NAT VIP `raw` probes through the data path:
/// only when `via = "vip"` is set on the VIP's or the backend's own
/// `health_check`. A NAT VIP's default is `direct`, whatever
/// `[health_check]` says: a data-path probe of a NAT VIP writes a flow into
/// the NAT maps for each probe and needs the backend to route its answers
/// to the pool address back through the LB, so it is asked for by name,
/// and a configuration written before NAT VIPs could probe this way keeps
/// probing as it did.
pub(super) fn probes_via_vip(raw: &RawVip, backend: usize) -> bool {
    let vip = raw.health_check.as_ref().and_then(|h| h.via);
    let own = raw.backend[backend]
        .health_check
        .as_ref()
        .and_then(|h| h.via);
    own.or(vip) == Some(ViaName::Vip)
}

/// Pools that share an address with overlapping port ranges, or that use
/// another VIP's address: one error each, naming both VIPs. Disjoint
/// ranges on one address are refused too: the data plane finds the VIP of
/// a packet to a pool address by the address alone (nat-dp's
/// `vip_addr_nat_pool`), so it could not tell whose range a port is in.
pub(super) fn check_pools_across_vips(
    vips: &[(String, IpAddr, Option<&NatConfig>)],
    p: &mut Problems<'_>,
) {
    let mut owners: HashMap<IpAddr, (&str, u16, u16)> = HashMap::new();
    for (name, _, nat) in vips {
        let Some(nat) = nat else { continue };
        let ctx = format!("vip {name:?}");
        for &a in &nat.snat {
            if let Some((other, _, _)) = vips
                .iter()
                .find(|(other, addr, _)| *addr == a && other != name)
            {
                p.error(
                    &ctx,
                    format!(
                        "snat {a} is the address of vip {other:?}; a pool address must be \
                         no VIP's (its answers would be balanced): use another address"
                    ),
                );
            }
            let (lo, hi) = (nat.port_min, nat.port_max);
            match owners.get(&a) {
                None => {
                    owners.insert(a, (name, lo, hi));
                }
                Some(&(other, ..)) if other == name => {}
                Some(&(other, olo, ohi)) if olo <= hi && lo <= ohi => p.error(
                    &ctx,
                    format!(
                        "snat {a} ports {lo}-{hi} overlap vip {other:?}'s ports {olo}-{ohi} \
                         on the same address; give each VIP its own pool address"
                    ),
                ),
                Some(&(other, ..)) => p.error(
                    &ctx,
                    format!(
                        "snat {a} is also in vip {other:?}'s pool; the data plane finds a \
                         pool address's VIP by the address alone, so two VIPs cannot share \
                         one even with disjoint snat_ports: give each VIP its own pool address"
                    ),
                ),
            }
        }
    }
}

/// Every pool address of `vips` that is no address of this host (`local`:
/// interface, address), one line each: the backends answer to it, and
/// the host must own it for the answers to reach the interface.
pub fn pool_not_local_errors(vips: &[super::VipConfig], local: &[(String, IpAddr)]) -> Vec<String> {
    let mut out = Vec::new();
    for v in vips {
        let Some(nat) = &v.nat else { continue };
        for a in &nat.snat {
            if !local.iter().any(|(_, l)| l == a) {
                out.push(format!(
                    "vip {:?}: snat {a} is not an address of any interface on this host; the \
                     backends answer to it, so the host must hold it: add it (ip addr add \
                     {a}/{} dev IFACE) or fix snat",
                    v.name,
                    if a.is_ipv4() { 32 } else { 128 }
                ));
            }
        }
    }
    out
}

/// [`pool_not_local_errors`] on this host, each prefixed with `origin`.
///
/// # Errors
/// One line per missing pool address, or why the host's addresses could
/// not be read.
pub fn check_pools_local(vips: &[super::VipConfig], origin: &str) -> Result<(), Vec<String>> {
    if vips
        .iter()
        .all(|v| v.nat.as_ref().is_none_or(|n| n.snat.is_empty()))
    {
        return Ok(());
    }
    crate::host::check_addresses(origin, |local| pool_not_local_errors(vips, local))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::tests::{DAEMON, ONE_BACKEND, api_vip, ip, ok};

    /// VIP "api" (10.100.0.1:80) in NAT mode with `settings` and one
    /// backend on port 8080.
    fn nat_vip(settings: &str) -> String {
        api_vip(&format!(
            "mode = \"nat\"\n{settings}\n[[vip.backend]]\naddress = \"10.0.0.11\"\nport = 8080\n"
        ))
    }

    #[test]
    fn a_nat_vip_resolves_its_pool_ports_and_timeouts() {
        let config = ok(
            "nat",
            &format!(
                "{DAEMON}tcp_timeout = \"1h\"\ntcp_fin_timeout = \"30s\"\n[[vip]]\nname = \
                 \"api\"\naddress = \"10.100.0.1\"\nport = 80\nmode = \"nat\"\nsnat = \
                 [\"10.0.0.2\", \"10.0.0.3\"]\nsnat_ports = \"20000-20999\"\ntcp_timeout = \
                 \"3h\"\n[[vip.backend]]\naddress = \"10.0.0.11\"\nport = 8080\n"
            ),
        );
        let v = &config.vips[0];
        let want = NatConfig {
            preserve_client: false,
            snat: vec![ip("10.0.0.2"), ip("10.0.0.3")],
            port_min: 20_000,
            port_max: 20_999,
            timeouts: NatTimeouts {
                syn: defaults::TCP_SYN,
                established: Duration::from_secs(3 * 3600),
                fin: Duration::from_secs(30),
                close: defaults::TCP_CLOSE,
            },
        };
        assert_eq!(v.nat.as_ref(), Some(&want));
        assert_eq!(v.raw_mode(), lb_common::nat::MODE_NAT);
        assert_eq!(v.backends[0].port, 8080, "a NAT backend keeps its own port");
        assert!(!v.second_chance, "no second chance in NAT mode");
        assert_eq!(
            v.backends[0].health.via,
            crate::health::spec::Via::Direct,
            "NAT VIPs probe directly by default"
        );
        assert_eq!(config.daemon.pinned.nat_size, defaults::NAT_SIZE);
    }

    /// `via = "vip"` on a NAT VIP or one of its backends is taken as written;
    /// `[health_check]`'s does not reach NAT VIPs (their default is direct).
    #[test]
    fn data_path_probes_on_nat_vips_are_asked_for_by_name() {
        use crate::health::spec::Via;
        let two = "[[vip.backend]]\naddress = \"10.0.0.12\"\nport = 8080\n";
        let own = "[vip.backend.health_check]\nvia = \"vip\"\n";
        let cases = [
            (
                "on the VIP",
                nat_vip(&format!(
                    "snat = [\"10.0.0.2\"]\n[vip.health_check]\nvia = \"vip\"\n{two}"
                )),
                [Via::Vip, Via::Vip],
            ),
            (
                "on one backend",
                nat_vip(&format!("snat = [\"10.0.0.2\"]\n{two}{own}")),
                [Via::Vip, Via::Direct],
            ),
            (
                "in [health_check] only",
                format!(
                    "{DAEMON}[health_check]\nvia = \"vip\"\n[[vip]]\nname = \"api\"\naddress = \
                     \"10.100.0.1\"\nport = 80\nmode = \"nat\"\nsnat = [\"10.0.0.2\"]\n\
                     [[vip.backend]]\naddress = \"10.0.0.11\"\nport = 8080\n{two}"
                ),
                [Via::Direct, Via::Direct],
            ),
        ];
        for (name, text, want) in cases {
            let config = ok(name, &text);
            let got: Vec<Via> = config.vips[0]
                .backends
                .iter()
                .map(|b| b.health.via)
                .collect();
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn preserve_client_needs_no_pool_and_has_its_own_raw_mode() {
        let config = ok("preserve", &nat_vip("preserve_client = true"));
        let v = &config.vips[0];
        assert_eq!(v.raw_mode(), lb_common::nat::MODE_NAT_PRESERVE);
        let nat = v.nat.as_ref().unwrap();
        assert!(nat.preserve_client && nat.snat.is_empty());
        assert_eq!(
            (nat.port_min, nat.port_max),
            (DEFAULT_SNAT_PORT_MIN, DEFAULT_SNAT_PORT_MAX)
        );
        assert_eq!(nat.timeouts, NatTimeouts::default());
    }

    #[test]
    fn port_ranges() {
        let cases = [
            ("10000-32767", Ok((10_000, 32_767))),
            (" 1 - 1 ", Ok((1, 1))),
            ("1-65535", Ok((1, 65_535))),
            ("10000", Err("is not a range".to_owned())),
            (
                "0-10",
                Err("starts at port 0, which no packet carries".to_owned()),
            ),
            ("20-10", Err("is empty (20 is above 10)".to_owned())),
            (
                "10-70000",
                Err("has \"70000\", which is not a port".to_owned()),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse_port_range(text), want, "{text}");
        }
    }

    #[test]
    fn pool_addresses_must_be_on_this_host() {
        let config = ok("two pools", &nat_vip("snat = [\"10.0.0.2\", \"10.0.0.3\"]"));
        let local = vec![
            ("lo".to_owned(), ip("127.0.0.1")),
            ("eth0".to_owned(), ip("10.0.0.2")),
        ];
        assert_eq!(
            pool_not_local_errors(&config.vips, &local),
            [
                "vip \"api\": snat 10.0.0.3 is not an address of any interface on this host; \
                 the backends answer to it, so the host must hold it: add it (ip addr add \
                 10.0.0.3/32 dev IFACE) or fix snat"
            ]
        );
        let all = vec![("eth0".to_owned(), ip("10.0.0.3")), local[1].clone()];
        assert!(pool_not_local_errors(&config.vips, &all).is_empty());
    }

    fn two_nat_vips(first: &str, second: &str) -> String {
        format!(
            "{}\n[[vip]]\nname = \"web\"\naddress = \"10.100.0.2\"\nport = 80\nmode = \"nat\"\n\
             {second}\n{ONE_BACKEND}",
            nat_vip(first)
        )
    }

    rejects! {
        nat_vip_without_a_pool: nat_vip("") => [
            r#"xlb.toml: vip "api": mode = "nat" needs a source pool: set snat = ["10.0.0.2"] to an address of this host that the backends can answer to, or set preserve_client = true if the backends route their answers through this host"#,
        ];
        pool_and_preserve_client: nat_vip("snat = [\"10.0.0.2\"]\npreserve_client = true") => [
            r#"xlb.toml: vip "api": snat and preserve_client = true exclude each other: with preserve_client the backend sees the client's own address, so no pool is used; remove snat, or remove preserve_client"#,
        ];
        pool_of_the_wrong_family_repeated_and_the_vip: nat_vip(
            "snat = [\"fd00::2\", \"10.0.0.2\", \"10.0.0.2\", \"10.100.0.1\", \"127.0.0.1\"]"
        ) => [
            r#"xlb.toml: vip "api": snat fd00::2 is IPv6 but the VIP is IPv4; NAT translates within one family, so use an IPv4 address of this host"#,
            r#"xlb.toml: vip "api": snat 10.0.0.2 is listed twice; list it once"#,
            r#"xlb.toml: vip "api": snat 10.100.0.1 is the VIP address itself; backends' answers to it would be taken for clients' packets: use another address of this host"#,
            r#"xlb.toml: vip "api": snat 127.0.0.1 cannot be a source address: backends cannot answer to it; use a unicast address of this host"#,
        ];
        bad_port_range: nat_vip("snat = [\"10.0.0.2\"]\nsnat_ports = \"30000-20000\"") => [
            r#"xlb.toml: vip "api": snat_ports "30000-20000" is empty (30000 is above 20000); write "MIN-MAX" with 1 ≤ MIN ≤ MAX ≤ 65535, e.g. "10000-32767" (the default, below Linux's ephemeral ports)"#,
        ];
        overlapping_pools_name_both_vips: two_nat_vips(
            "snat = [\"10.0.0.2\"]\nsnat_ports = \"10000-20000\"",
            "snat = [\"10.0.0.2\"]\nsnat_ports = \"20000-30000\"",
        ) => [
            r#"xlb.toml: vip "web": snat 10.0.0.2 ports 20000-30000 overlap vip "api"'s ports 10000-20000 on the same address; give each VIP its own pool address"#,
        ];
        pools_sharing_an_address_with_disjoint_ports: two_nat_vips(
            "snat = [\"10.0.0.2\"]\nsnat_ports = \"10000-19999\"",
            "snat = [\"10.0.0.2\"]\nsnat_ports = \"20000-30000\"",
        ) => [
            r#"xlb.toml: vip "web": snat 10.0.0.2 is also in vip "api"'s pool; the data plane finds a pool address's VIP by the address alone, so two VIPs cannot share one even with disjoint snat_ports: give each VIP its own pool address"#,
        ];
        pool_address_of_another_vip: two_nat_vips(
            "snat = [\"10.100.0.2\"]",
            "snat = [\"10.0.0.2\"]",
        ) => [
            r#"xlb.toml: vip "api": snat 10.100.0.2 is the address of vip "web"; a pool address must be no VIP's (its answers would be balanced): use another address"#,
        ];
        nat_keys_on_a_dsr_vip: api_vip(&format!("snat = [\"10.0.0.2\"]\ntcp_timeout = \"1h\"\n{ONE_BACKEND}")) => [
            r#"xlb.toml: vip "api": snat applies to mode = "nat" only, and this VIP is dsr-ipip; remove snat or set mode = "nat""#,
            r#"xlb.toml: vip "api": tcp_timeout applies to mode = "nat" only, and this VIP is dsr-ipip; remove tcp_timeout or set mode = "nat""#,
        ];
        second_chance_on_a_nat_vip: nat_vip("snat = [\"10.0.0.2\"]\nsecond_chance = true") => [
            r#"xlb.toml: vip "api": second_chance = true needs mode = "dsr-ipip": a NAT flow's state lives in this host's NAT maps, kept across restarts and reloads, and no decapsulator on the backends could pass a packet on; remove second_chance"#,
        ];
        udp_nat_vip_that_never_expires: format!(
            "{DAEMON}udp_timeout = \"0s\"\n[[vip]]\nname = \"dns\"\naddress = \"10.100.0.1\"\n\
             port = 53\nprotocol = \"udp\"\nmode = \"nat\"\nsnat = [\"10.0.0.2\"]\n{ONE_BACKEND}"
        ) => [
            r#"xlb.toml: vip "dns": daemon.udp_timeout = 0 (never expire) cannot apply to a NAT VIP: each flow holds a pool port until it expires, so the pool would run dry; set udp_timeout (e.g. "30s")"#,
        ];
        nat_size_and_short_timeouts: format!(
            "{DAEMON}nat_size = 10\ntcp_close_timeout = \"1s\"\n"
        ) => [
            r"xlb.toml: daemon: nat_size 10 is too small: each NAT flow takes one entry, and a full map refuses new flows; use at least 1024 (default 262144)",
            r#"xlb.toml: daemon: tcp_close_timeout "1s" is too short: the data plane refreshes a flow's last-seen time once a second, so a shorter timeout would reclaim busy flows; use at least 2s"#,
        ];
    }
}
