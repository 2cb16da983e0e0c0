//! Each `[[vip]]` and its `[[vip.backend]]`s: [`VipConfig`],
//! [`BackendConfig`] and the checks that build them, in file order.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

use super::daemon::DaemonConfig;
use super::guard::{self as guard_cfg, VipGuardConfig};
use super::health::{self, HealthLayer, Layer};
use super::nat::{self, NatConfig};
use super::raw::{RawBackend, RawGuard, RawProtection, RawVip};
use super::{PassiveConfig, Problems, defaults, protection, suggest_prime};
use crate::health::policy::Policy;
use crate::health::spec::CheckSpec;
use crate::maglev::is_prime;

/// Largest `vip.backend.weight`. Weights are relative, so 1000 steps are
/// plenty, and the bound keeps the Maglev build short (a backend of weight 1
/// next to one of 1000 claims a slot every 1000 rounds).
pub const MAX_WEIGHT: u32 = 1000;

/// Transport protocol of a VIP (`vip.protocol`): the control protocol's
/// type, so the configuration and `xlb explain` spell it alike.
pub use lb_ctl::Protocol;

/// The IANA protocol number of `protocol`, as stored in map keys.
pub fn ip_proto(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => lb_common::PROTO_TCP,
        Protocol::Udp => lb_common::PROTO_UDP,
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
    /// Full NAT both ways (`config::nat`): backends need no change; with
    /// `preserve_client`, destination NAT only.
    Nat,
}

impl Mode {
    /// `lb_common::MODE_*`, as stored in `VipInfo::mode` (a NAT VIP with
    /// `preserve_client` stores [`lb_common::nat::MODE_NAT_PRESERVE`]: see
    /// [`VipConfig::raw_mode`]).
    pub fn as_raw(self) -> u8 {
        match self {
            Mode::DsrIpip => lb_common::MODE_DSR_IPIP,
            Mode::DsrL2 => lb_common::MODE_DSR_L2,
            Mode::Nat => lb_common::nat::MODE_NAT,
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

display_as_toml! {
    Mode { DsrIpip => "dsr-ipip", DsrL2 => "dsr-l2", Nat => "nat" }
    DownPolicy { Rehash => "rehash", Keep => "keep" }
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
    /// `host_services = true`: the host runs services of its own on this
    /// VIP's address (which it then holds), so packets to the address that
    /// no VIP balances go to its stack instead of being dropped. It applies
    /// to the address: every VIP there must say the same. Default false.
    pub host_services: bool,
    /// Second chance (`dsr-ipip` only; default on there): a TCP packet
    /// that misses conntrack is also addressed to its slot's previous
    /// owner, which keeps connections alive when a flow moves to another
    /// node after the backend set changed (see `config::chance`).
    pub second_chance: bool,
    /// `mode = "nat"`: its pool, port range and timeouts; `None` for the
    /// DSR modes.
    pub nat: Option<NatConfig>,
    /// What the VIP does when backends are slow or failing: `[protection]`
    /// merged with `[vip.protection]`.
    #[serde(serialize_with = "protection::ser_policy")]
    pub protection: Policy,
    /// Passive detection (NAT VIPs): `[passive]` merged with `[vip.passive]`.
    pub passive: PassiveConfig,
    /// Abuse control: `[guard]` merged under `[vip.guard]`, and the VIP's
    /// own deny and allow lists.
    pub guard: VipGuardConfig,
    /// In file order.
    pub backends: Vec<BackendConfig>,
}

/// One `[[vip.backend]]`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BackendConfig {
    pub addr: IpAddr,
    /// The VIP's port in the DSR modes (which do not translate ports);
    /// the backend's own `port` in NAT mode.
    pub port: u16,
    /// 0..=[`MAX_WEIGHT`], default 1; 0 = no new flows.
    pub weight: u32,
    /// The merged health check; `health.port` is the backend's `health_port`
    /// (default: `port`).
    #[serde(serialize_with = "health::ser_check_spec")]
    pub health: CheckSpec,
    /// Established flows above which an `alarm` event says the backend may
    /// run out of connection slots (its own `max_flows`, else its VIP's);
    /// `None` = no alarm.
    pub max_flows: Option<u64>,
}

impl VipConfig {
    /// `VipInfo::mode`: [`Mode::as_raw`], or
    /// [`lb_common::nat::MODE_NAT_PRESERVE`] for a NAT VIP with
    /// `preserve_client`.
    pub fn raw_mode(&self) -> u8 {
        match &self.nat {
            Some(nat) if nat.preserve_client => lb_common::nat::MODE_NAT_PRESERVE,
            _ => self.mode.as_raw(),
        }
    }
}

impl BackendConfig {
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.addr, self.port)
    }
}

/// The daemon-wide `[health_check]`, `[protection]` and `[guard]` tables,
/// which each VIP's own tables override field by field.
pub(super) struct Globals<'a> {
    pub(super) health: &'a HealthLayer,
    pub(super) protection: Option<&'a RawProtection>,
    pub(super) passive: Option<&'a super::passive::RawPassive>,
    pub(super) guard: Option<&'a RawGuard>,
}

/// What must be unique across VIPs: names, and address/port/protocol.
#[derive(Default)]
struct Seen<'a> {
    names: HashSet<&'a str>,
    services: HashMap<(IpAddr, u16, Protocol), &'a str>,
    /// Per VIP address: the first VIP's `host_services` and its name.
    host_services: HashMap<IpAddr, (bool, &'a str)>,
}

/// Every VIP, in file order.
pub(super) fn validate_all(
    raw: &[RawVip],
    daemon: &DaemonConfig,
    globals: &Globals<'_>,
    p: &mut Problems<'_>,
) -> Vec<VipConfig> {
    let mut seen = Seen::default();
    let vips = raw
        .iter()
        .map(|v| validate(v, daemon, globals, &mut seen, p))
        .collect::<Vec<VipConfig>>();
    super::address::check_backends_are_not_vips(raw, p);
    let pools: Vec<_> = vips
        .iter()
        .map(|v| (v.name.clone(), v.addr, v.nat.as_ref()))
        .collect();
    nat::check_pools_across_vips(&pools, p);
    vips
}

/// One VIP: its own settings, its health_check layer, its backends, then
/// its protection.
fn validate<'a>(
    raw: &'a RawVip,
    daemon: &DaemonConfig,
    globals: &Globals<'_>,
    seen: &mut Seen<'a>,
    p: &mut Problems<'_>,
) -> VipConfig {
    let ctx = format!("vip {:?}", raw.name);
    check_name(raw, &ctx, seen, p);
    check_address(raw, &ctx, p);
    let protocol = raw.protocol.unwrap_or(defaults::PROTOCOL);
    check_unique_service(raw, protocol, seen, p);
    let host_services = check_host_services(raw, seen, p);
    let table_size = table_size(raw, daemon, &ctx, p);
    let mode = raw.mode.unwrap_or(defaults::MODE);
    let second_chance = super::chance::second_chance(raw, mode, &ctx, p);
    let nat = nat::resolve(raw, mode, protocol, daemon, &ctx, p);

    let vip_hctx = format!("{ctx}: health_check");
    let vip_health = health::parse(
        raw.health_check.as_ref(),
        &vip_hctx,
        "each [[vip.backend]]",
        p,
    );
    let layers: [Layer<'_>; 2] = [(globals.health, "health_check"), (&vip_health, &vip_hctx)];
    // Checks this VIP's layer even if it has no backends.
    health::resolve(&layers, 0, p);

    warn_no_usable_backend(raw, &ctx, p);
    let mut backends = validate_backends(raw, &ctx, &layers, p);
    if mode == Mode::Nat {
        for (i, b) in backends.iter_mut().enumerate() {
            if !nat::probes_via_vip(raw, i) {
                b.health.via = crate::health::spec::Via::Direct;
            }
        }
    }

    VipConfig {
        name: raw.name.clone(),
        addr: raw.address,
        port: raw.port,
        protocol,
        mode,
        down_policy: raw.down_policy.unwrap_or(defaults::DOWN_POLICY),
        table_size,
        host_services,
        second_chance,
        nat,
        protection: protection::resolve(
            &[
                (globals.protection, "protection"),
                (raw.protection.as_ref(), &format!("{ctx}: protection")),
            ],
            p,
        ),
        passive: super::passive::resolve(globals.passive, raw.passive.as_ref(), mode, &ctx, p),
        guard: guard_cfg::resolve_vip(globals.guard, raw.guard.as_ref(), &ctx, p),
        backends,
    }
}

/// Names key the control API and metrics, so they are unique and safe in a
/// label.
fn check_name<'a>(raw: &'a RawVip, ctx: &str, seen: &mut Seen<'a>, p: &mut Problems<'_>) {
    let name = &raw.name;
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    {
        p.error(
            ctx,
            "name is invalid; use 1 to 64 characters from A-Z a-z 0-9 _ . -",
        );
    }
    if !seen.names.insert(name) {
        p.error(
            "",
            format!("vip {name:?} is defined twice; VIP names must be unique"),
        );
    }
}

fn check_address(raw: &RawVip, ctx: &str, p: &mut Problems<'_>) {
    let addr = raw.address;
    if addr.is_unspecified() || addr.is_multicast() || is_v4_broadcast(addr) {
        p.error(
            ctx,
            format!("address {addr} cannot be a VIP; use a unicast address"),
        );
    } else if let Some(why) = super::address::unroutable(addr) {
        p.error(ctx, format!("address {addr} cannot be a VIP: {why}"));
    }
    if raw.port == 0 {
        p.error(ctx, "port 0 is invalid; use 1 to 65535");
    }
}

/// Address, port and protocol are the data plane's lookup key.
fn check_unique_service<'a>(
    raw: &'a RawVip,
    protocol: Protocol,
    seen: &mut Seen<'a>,
    p: &mut Problems<'_>,
) {
    let name = &raw.name;
    let key = (raw.address, raw.port, protocol);
    if let Some(other) = seen.services.insert(key, name) {
        let service = SocketAddr::new(raw.address, raw.port);
        p.error(
            "",
            format!("vip {name:?} address {service}/{protocol} is also used by vip {other:?}"),
        );
    }
}

/// `host_services`, the same on every VIP of one address: the data plane
/// applies it to the address (what no VIP there balances), so VIPs that
/// disagreed would leave the outcome to the order of the file.
fn check_host_services<'a>(raw: &'a RawVip, seen: &mut Seen<'a>, p: &mut Problems<'_>) -> bool {
    let this = raw.host_services.unwrap_or(false);
    let (first, other) = *seen
        .host_services
        .entry(raw.address)
        .or_insert((this, &raw.name));
    if first != this {
        p.error(
            &format!("vip {:?}", raw.name),
            format!(
                "host_services = {this}, but vip {other:?} at the same address {} has \
                 host_services = {first}; it applies to the whole address (what no VIP there \
                 balances goes to the host, or is dropped), so set it alike on every VIP at {}",
                raw.address, raw.address
            ),
        );
    }
    this
}

/// A prime (Maglev), within the ring stride, and large enough for the
/// backends to get even shares.
fn table_size(raw: &RawVip, daemon: &DaemonConfig, ctx: &str, p: &mut Problems<'_>) -> u32 {
    let n = raw.backend.len();
    let table_size = raw
        .table_size
        .unwrap_or(defaults::TABLE_SIZE.min(daemon.pinned.max_table_size));
    if !is_prime(table_size) {
        p.error(
            ctx,
            format!(
                "table_size {table_size} is not prime; use a prime such as {}",
                suggest_prime(table_size, daemon.pinned.max_table_size)
            ),
        );
    } else if table_size > daemon.pinned.max_table_size {
        p.error(
            ctx,
            format!(
                "table_size {table_size} is larger than daemon.max_table_size {}; \
                 use a smaller prime or raise max_table_size",
                daemon.pinned.max_table_size
            ),
        );
    } else if (table_size as usize) < n {
        p.error(
            ctx,
            format!(
                "table_size {table_size} is smaller than its {n} backends, so some would get \
                 no slot; use a prime of at least {} (10 × backends), such as {}",
                10 * n,
                suggest_prime(10 * n as u32, u32::MAX)
            ),
        );
    } else if (table_size as usize) < 10 * n {
        p.warn(
            ctx,
            format!(
                "table_size {table_size} is less than 10 × its {n} backends, so their shares \
                 of flows will be uneven; use a prime of at least {}, such as {}",
                10 * n,
                suggest_prime(10 * n as u32, u32::MAX)
            ),
        );
    }
    table_size
}

/// Allowed (backends can be added at run time), but the VIP drops new flows.
fn warn_no_usable_backend(raw: &RawVip, ctx: &str, p: &mut Problems<'_>) {
    if raw.backend.is_empty() {
        p.warn(
            "",
            format!(
                "vip {:?} has no backends; it will drop new flows until backends are added",
                raw.name
            ),
        );
    } else if raw.backend.iter().all(|b| b.weight == Some(0)) {
        p.warn(
            ctx,
            "every backend has weight 0, so the VIP takes no new flows and will drop them",
        );
    }
}

/// Each backend of `vip`, in file order; `layers` are the health_check
/// layers above the backends' own.
fn validate_backends(
    vip: &RawVip,
    ctx: &str,
    layers: &[Layer<'_>],
    p: &mut Problems<'_>,
) -> Vec<BackendConfig> {
    let mut seen: HashSet<(IpAddr, u16)> = HashSet::new();
    if vip.max_flows == Some(0) {
        // Named where it is written (once), not on each backend inheriting it.
        p.error(ctx, MAX_FLOWS_ZERO);
    }
    vip.backend
        .iter()
        .map(|b| {
            let port = b.port.unwrap_or(vip.port);
            let bctx = format!("{ctx}: backend {}", SocketAddr::new(b.address, port));
            check_backend_port(vip, port, &bctx, p);
            if !seen.insert((b.address, port)) {
                p.error(
                    ctx,
                    format!("backend {} listed twice", SocketAddr::new(b.address, port)),
                );
            }
            check_backend_address(vip, b, port, (ctx, &bctx), p);
            BackendConfig {
                addr: b.address,
                port,
                weight: weight(b, &bctx, p),
                health: backend_health(b, port, layers, &bctx, p),
                max_flows: max_flows(vip, b, &bctx, p),
            }
        })
        .collect()
}

/// DSR leaves the destination port as the client sent it; NAT translates
/// it.
fn check_backend_port(vip: &RawVip, port: u16, bctx: &str, p: &mut Problems<'_>) {
    if port == 0 {
        p.error(bctx, "port 0 is invalid; use 1 to 65535");
    } else if port != vip.port && vip.mode != Some(Mode::Nat) {
        p.error(
            bctx,
            format!(
                "port {port} differs from the VIP port {}; DSR modes do not translate \
                 ports, so the backend must serve port {} itself (remove port or set \
                 it to {}, or use mode = \"nat\")",
                vip.port, vip.port, vip.port
            ),
        );
    }
}

/// The backend's address: of the VIP's family (the only one its mode can
/// reach), not the VIP itself, and unicast. `ctxs` are the VIP's and the
/// backend's places.
fn check_backend_address(
    vip: &RawVip,
    b: &RawBackend,
    port: u16,
    (ctx, bctx): (&str, &str),
    p: &mut Problems<'_>,
) {
    let addr = vip.address;
    if b.address.is_ipv4() != addr.is_ipv4() {
        let (have, want) = if addr.is_ipv4() {
            ("IPv6", "IPv4")
        } else {
            ("IPv4", "IPv6")
        };
        let why = match vip.mode.unwrap_or(defaults::MODE) {
            Mode::DsrIpip => {
                format!("dsr-ipip encapsulates in the VIP's family ({want} in {want})")
            }
            Mode::DsrL2 => format!(
                "dsr-l2 finds the backend's MAC address by a route lookup in the \
                 VIP's family ({want})"
            ),
            Mode::Nat => format!("nat translates within the VIP's family ({want})"),
        };
        p.error(
            ctx,
            format!(
                "backend {} is {have} but the VIP is {want}; {why}, so use an {want} \
                 backend address",
                SocketAddr::new(b.address, port)
            ),
        );
    } else if b.address == addr {
        p.error(
            bctx,
            "the backend address is the VIP address itself; name a real server",
        );
    }
    if b.address.is_unspecified() || b.address.is_multicast() || is_v4_broadcast(b.address) {
        p.error(
            bctx,
            "address cannot be a backend; use the server's unicast address",
        );
    } else if let Some(why) = super::address::unroutable(b.address) {
        p.error(
            bctx,
            format!("address {} cannot be a backend: {why}", b.address),
        );
    }
}

fn weight(b: &RawBackend, bctx: &str, p: &mut Problems<'_>) -> u32 {
    let weight = b.weight.unwrap_or(defaults::WEIGHT);
    if let Err(problem) = check_weight(weight) {
        p.error(bctx, problem);
    }
    weight
}

const MAX_FLOWS_ZERO: &str = "max_flows 0 would raise its alarm for every flow; use at least 1, \
                              or leave it out for no alarm";

/// Whether `weight` is one a backend may have, in the configuration or
/// from `xlb weight` (which words its refusal the same way).
///
/// # Errors
/// Above [`MAX_WEIGHT`]: what is wrong and the range to use.
pub fn check_weight(weight: u32) -> Result<(), String> {
    if weight > MAX_WEIGHT {
        return Err(format!(
            "weight {weight} is too large; use 0 to {MAX_WEIGHT} \
             (weights are relative; 0 takes no new flows)"
        ));
    }
    Ok(())
}

/// The backend's `max_flows`, else its VIP's; at least 1 when set (the
/// VIP's own is checked with the VIP).
fn max_flows(vip: &RawVip, b: &RawBackend, bctx: &str, p: &mut Problems<'_>) -> Option<u64> {
    if b.max_flows == Some(0) {
        p.error(bctx, MAX_FLOWS_ZERO);
    }
    b.max_flows.or(vip.max_flows)
}

/// The backend's own health_check layer over the VIP's, probed on its
/// `health_port` (default: the service port).
fn backend_health(
    b: &RawBackend,
    port: u16,
    layers: &[Layer<'_>],
    bctx: &str,
    p: &mut Problems<'_>,
) -> CheckSpec {
    let health_port = b.health_port.unwrap_or(port);
    if health_port == 0 {
        p.error(
            bctx,
            "health_port 0 is invalid; use 1 to 65535, \
             or remove it to probe the service port",
        );
    }
    let be_hctx = format!("{bctx}: health_check");
    let be_health = health::parse(b.health_check.as_ref(), &be_hctx, "this backend", p);
    let mut layers = layers.to_vec();
    layers.push((&be_health, &be_hctx));
    health::resolve(&layers, health_port, p)
}

fn is_v4_broadcast(a: IpAddr) -> bool {
    matches!(a, IpAddr::V4(v4) if v4.is_broadcast())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{DAEMON, ONE_BACKEND, api_vip, api_with_backend, ok};

    #[test]
    fn max_flows_is_the_backends_own_else_its_vips() {
        let config = ok(
            "max_flows",
            &api_vip(
                r#"
max_flows = 5000
[[vip.backend]]
address = "10.0.0.1"
[[vip.backend]]
address = "10.0.0.2"
max_flows = 200
"#,
            ),
        );
        let max: Vec<_> = config.vips[0]
            .backends
            .iter()
            .map(|b| b.max_flows)
            .collect();
        assert_eq!(max, [Some(5000), Some(200)]);
        let config = ok("no max_flows", &api_with_backend(""));
        assert_eq!(config.vips[0].backends[0].max_flows, None);
    }

    #[test]
    fn host_services_is_off_unless_set_and_per_vip_address() {
        assert!(!ok("default", &api_with_backend("")).vips[0].host_services);
        let config = ok(
            "host_services on two VIPs of one address, not a third",
            &format!(
                r#"{}
[[vip]]
name = "dns"
address = "10.100.0.1"
port = 53
protocol = "udp"
host_services = true
{ONE_BACKEND}
[[vip]]
name = "web"
address = "10.100.0.2"
port = 80
{ONE_BACKEND}"#,
                api_with_backend("host_services = true")
            ),
        );
        let set: Vec<bool> = config.vips.iter().map(|v| v.host_services).collect();
        assert_eq!(set, [true, true, false]);
    }

    rejects! {
        max_flows_zero: api_vip(r#"
[[vip.backend]]
address = "10.0.0.1"
max_flows = 0
"#) => [
            r#"xlb.toml: vip "api": backend 10.0.0.1:80: max_flows 0 would raise its alarm for every flow; use at least 1, or leave it out for no alarm"#,
        ];
        vip_max_flows_zero_names_the_vip: api_vip(r#"max_flows = 0
[[vip.backend]]
address = "10.0.0.1"
[[vip.backend]]
address = "10.0.0.2"
"#) => [
            r#"xlb.toml: vip "api": max_flows 0 would raise its alarm for every flow; use at least 1, or leave it out for no alarm"#,
        ];

        backend_listed_twice: api_vip(r#"
[[vip.backend]]
address = "10.0.0.12"
[[vip.backend]]
address = "10.0.0.12"
port = 80
"#) => [r#"xlb.toml: vip "api": backend 10.0.0.12:80 listed twice"#];

        table_size_not_prime: api_with_backend("table_size = 65536") => [
            r#"xlb.toml: vip "api": table_size 65536 is not prime; use a prime such as 65537"#,
        ];
        /// The suggestion stays within daemon.max_table_size.
        table_size_not_prime_next_prime_above_the_max: api_with_backend("table_size = 65538") => [
            r#"xlb.toml: vip "api": table_size 65538 is not prime; use a prime such as 65537"#,
        ];
        table_size_zero: api_with_backend("table_size = 0") => [
            r#"xlb.toml: vip "api": table_size 0 is not prime; use a prime such as 2"#,
        ];
        table_size_above_max: api_with_backend("table_size = 131071") => [
            r#"xlb.toml: vip "api": table_size 131071 is larger than daemon.max_table_size 65537; use a smaller prime or raise max_table_size"#,
        ];
        table_smaller_than_backends: api_vip(r#"
table_size = 2
[[vip.backend]]
address = "10.0.0.1"
[[vip.backend]]
address = "10.0.0.2"
[[vip.backend]]
address = "10.0.0.3"
"#) => [
            r#"xlb.toml: vip "api": table_size 2 is smaller than its 3 backends, so some would get no slot; use a prime of at least 30 (10 × backends), such as 31"#,
        ];

        vip_address_reused: format!(r#"{}
[[vip]]
name = "web"
address = "10.100.0.1"
port = 80
{ONE_BACKEND}"#, api_vip(ONE_BACKEND)) => [
            r#"xlb.toml: vip "web" address 10.100.0.1:80/tcp is also used by vip "api""#,
        ];
        host_services_differ_on_one_address: format!(r#"{}
[[vip]]
name = "dns"
address = "10.100.0.1"
port = 53
protocol = "udp"
{ONE_BACKEND}"#, api_with_backend("host_services = true")) => [
            r#"xlb.toml: vip "dns": host_services = false, but vip "api" at the same address 10.100.0.1 has host_services = true; it applies to the whole address (what no VIP there balances goes to the host, or is dropped), so set it alike on every VIP at 10.100.0.1"#,
        ];
        host_services_not_a_bool: api_with_backend(r#"host_services = "yes""#) => [
            r#"xlb.toml:9:17: vip "api": host_services: invalid type: string "yes", expected a boolean"#,
        ];
        vip_name_reused: format!(r#"{}
[[vip]]
name = "api"
address = "10.100.0.2"
port = 80
{ONE_BACKEND}"#, api_vip(ONE_BACKEND)) => [
            r#"xlb.toml: vip "api" is defined twice; VIP names must be unique"#,
        ];
        bad_vip_name: format!(r#"{DAEMON}
[[vip]]
name = "my api"
address = "10.100.0.1"
port = 80
{ONE_BACKEND}"#) => [
            r#"xlb.toml: vip "my api": name is invalid; use 1 to 64 characters from A-Z a-z 0-9 _ . -"#,
        ];
        vip_port_zero_and_multicast_address: format!(r#"{DAEMON}
[[vip]]
name = "api"
address = "224.0.0.1"
port = 0
"#) => [
            r#"xlb.toml: vip "api": address 224.0.0.1 cannot be a VIP; use a unicast address"#,
            r#"xlb.toml: vip "api": port 0 is invalid; use 1 to 65535"#,
        ];

        ipv6_backend_of_an_ipv4_dsr_ipip_vip: api_vip(r#"
[[vip.backend]]
address = "fd00::1"
"#) => [
            r#"xlb.toml: vip "api": backend [fd00::1]:80 is IPv6 but the VIP is IPv4; dsr-ipip encapsulates in the VIP's family (IPv4 in IPv4), so use an IPv4 backend address"#,
        ];
        ipv4_backend_of_an_ipv6_dsr_l2_vip: format!(r#"{DAEMON}
[[vip]]
name = "v6"
address = "fd00:100::1"
port = 80
mode = "dsr-l2"
{ONE_BACKEND}"#) => [
            r#"xlb.toml: vip "v6": backend 10.0.0.11:80 is IPv4 but the VIP is IPv6; dsr-l2 finds the backend's MAC address by a route lookup in the VIP's family (IPv6), so use an IPv6 backend address"#,
        ];
        backend_port_differs: api_vip(r#"
[[vip.backend]]
address = "10.0.0.11"
port = 8080
"#) => [
            r#"xlb.toml: vip "api": backend 10.0.0.11:8080: port 8080 differs from the VIP port 80; DSR modes do not translate ports, so the backend must serve port 80 itself (remove port or set it to 80, or use mode = "nat")"#,
        ];
        backend_is_the_vip: api_vip(r#"
[[vip.backend]]
address = "10.100.0.1"
"#) => [
            r#"xlb.toml: vip "api": backend 10.100.0.1:80: the backend address is the VIP address itself; name a real server"#,
        ];
        backend_weight_and_health_port: api_vip(r#"
[[vip.backend]]
address = "0.0.0.0"
weight = 1001
health_port = 0
"#) => [
            r#"xlb.toml: vip "api": backend 0.0.0.0:80: address cannot be a backend; use the server's unicast address"#,
            r#"xlb.toml: vip "api": backend 0.0.0.0:80: weight 1001 is too large; use 0 to 1000 (weights are relative; 0 takes no new flows)"#,
            r#"xlb.toml: vip "api": backend 0.0.0.0:80: health_port 0 is invalid; use 1 to 65535, or remove it to probe the service port"#,
        ];
    }

    #[test]
    fn warnings() {
        let cases = [
            (
                "VIP without backends",
                api_vip(""),
                vec![
                    "xlb.toml: vip \"api\" has no backends; it will drop new flows until backends are added",
                ],
            ),
            (
                "every backend weight 0",
                api_vip(
                    r#"
[[vip.backend]]
address = "10.0.0.1"
weight = 0
"#,
                ),
                vec![
                    "xlb.toml: vip \"api\": every backend has weight 0, so the VIP takes no new flows and will drop them",
                ],
            ),
            (
                "small table",
                api_vip(
                    r#"
table_size = 13
[[vip.backend]]
address = "10.0.0.1"
[[vip.backend]]
address = "10.0.0.2"
"#,
                ),
                vec![
                    "xlb.toml: vip \"api\": table_size 13 is less than 10 × its 2 backends, so their shares of flows will be uneven; use a prime of at least 20, such as 23",
                ],
            ),
            ("none", api_vip(ONE_BACKEND), vec![]),
        ];
        for (name, text, want) in cases {
            assert_eq!(ok(name, &text).warnings, want, "{name}");
        }
    }

    #[test]
    fn raw_values_match_lb_common() {
        let cases = [
            ("tcp", ip_proto(Protocol::Tcp), lb_common::PROTO_TCP),
            ("udp", ip_proto(Protocol::Udp), lb_common::PROTO_UDP),
            ("dsr-ipip", Mode::DsrIpip.as_raw(), lb_common::MODE_DSR_IPIP),
            ("dsr-l2", Mode::DsrL2.as_raw(), lb_common::MODE_DSR_L2),
            ("nat", Mode::Nat.as_raw(), lb_common::nat::MODE_NAT),
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
        assert_eq!(Mode::Nat.to_string(), "nat");
    }
}
