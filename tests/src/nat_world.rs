//! NAT state in a [`World`] (issue 27), written straight into the maps as
//! the daemon would (the daemon's own writer is `lb-user`'s): NAT VIPs with
//! their pools, NAT backends, routes to the clients, and the flow maps.
//! Shared by the byte-exact NAT fixtures (`tests/fixtures/nat*.rs`) and
//! `xlb-bench`'s per-packet NAT cases (`bench::nat_packet`).

use std::net::IpAddr;

use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray};
use lb_common::{
    BACKEND_UP, BackendInfo, FlowKey, PROTO_TCP, PROTO_UDP, VipAddrKey, addr16, family_of,
    nat::{NatFlow, NatPool, PassiveStats, VIP_PORT_NAT, vip_addr_nat_pool},
    port_index,
};

use crate::harness::{GW_MAC, World};

const SEC: u64 = 1_000_000_000;
/// Clients, routed through the router (10.0.0.254 / fd00::fe, `GW_MAC`) by
/// [`routes_to_clients`].
pub const CLIENT4: &str = "198.18.0.1";
pub const CLIENT6: &str = "2001:db8:18::1";
/// The pools' timeouts that cases move a flow's clock past.
pub const SYN_TIMEOUT_NS: u64 = 5 * SEC;
pub const RESPONSE_TIMEOUT_NS: u64 = SEC;

/// A NAT VIP as [`add_nat_vip`] writes it.
pub struct NatVip<'a> {
    pub vip_id: u32,
    pub addr: &'a str,
    pub port: u16,
    pub proto: u8,
    /// `MODE_NAT` or `MODE_NAT_PRESERVE`.
    pub mode: u8,
    pub down_policy: u8,
    /// The live table (half 0): backend ids.
    pub table: &'a [u32],
    /// The pool's one address; empty for `preserve_client` (no pool).
    pub pool: &'a str,
    /// Allocated ports, inclusive, host order.
    pub ports: (u16, u16),
}

/// Opens the loaded map `name` as a `T`.
pub fn map<T: TryFrom<Map, Error = aya::maps::MapError>>(
    w: &mut World,
    name: &str,
    wrap: fn(MapData) -> Map,
) -> anyhow::Result<T> {
    let data = MapData::from_id(w.lb_map_id(name)?)?;
    Ok(T::try_from(wrap(data))?)
}

/// `XLB_NAT_FLOWS`: client key → flow.
pub fn flows(w: &mut World) -> anyhow::Result<HashMap<MapData, FlowKey, NatFlow>> {
    map(w, lb_common::nat::MAP_NAT_FLOWS, Map::HashMap)
}

/// `XLB_NAT_REPLY`: reply key → client key.
pub fn replies(w: &mut World) -> anyhow::Result<HashMap<MapData, FlowKey, FlowKey>> {
    map(w, lb_common::nat::MAP_NAT_REPLY, Map::HashMap)
}

/// Writes VIP `v`: its table and info, its pool, the NAT bit of its
/// (protocol, port), and its pool address as the daemon marks it.
pub fn add_nat_vip(w: &mut World, v: &NatVip) -> anyhow::Result<()> {
    w.add_vip(
        v.vip_id,
        v.addr,
        v.port,
        v.proto,
        v.mode,
        v.down_policy,
        v.table,
    )?;
    set_nat_pool(w, v.vip_id, v.pool, v.ports)?;
    let mut ports: Array<MapData, u32> = map(w, lb_common::MAP_VIP_PORTS, Map::Array)?;
    let idx = port_index(v.proto, v.port);
    let n = ports.get(&idx, 0)?;
    ports.set(idx, n | VIP_PORT_NAT, 0)?;
    if !v.pool.is_empty() {
        pool_addr(w, v.pool, v.vip_id)?;
    }
    Ok(())
}

/// Makes backend `id` (of the world's backends) a NAT backend listening on
/// `port` (TCP and UDP): its port in `XLB_BACKENDS`, the port in
/// `XLB_NAT_SPORTS`, its address in `XLB_NAT_BEADDR`.
pub fn add_nat_backend(w: &mut World, id: u32, port: u16) -> anyhow::Result<()> {
    let b = w.backend(id);
    w.dp.set_backend(
        id,
        &BackendInfo {
            addr: addr16(b.addr),
            generation: 0,
            state: BACKEND_UP,
            family: family_of(b.addr),
            port: port.to_be(),
        },
    )?;
    let mut sports: Array<MapData, u32> = map(w, lb_common::nat::MAP_NAT_SPORTS, Map::Array)?;
    for proto in [PROTO_TCP, PROTO_UDP] {
        sports.set(port_index(proto, port), 1, 0)?;
    }
    let mut be_addrs: HashMap<MapData, VipAddrKey, u32> =
        map(w, lb_common::nat::MAP_NAT_BACKEND_ADDRS, Map::HashMap)?;
    be_addrs.insert(addr_key(b.addr), 1, 0)?;
    Ok(())
}

/// Writes VIP `vip_id`'s pool: one address (none: `preserve_client`).
pub fn set_nat_pool(
    w: &mut World,
    vip_id: u32,
    addr: &str,
    (port_min, port_max): (u16, u16),
) -> anyhow::Result<()> {
    let mut pool = NatPool {
        count: u32::from(!addr.is_empty()),
        port_min,
        port_max,
        tcp_syn_timeout_ns: SYN_TIMEOUT_NS,
        tcp_established_timeout_ns: 600 * SEC,
        tcp_fin_timeout_ns: 10 * SEC,
        tcp_close_timeout_ns: 2 * SEC,
        udp_timeout_ns: 30 * SEC,
        response_timeout_ns: RESPONSE_TIMEOUT_NS,
        connect_timeout_ns: SEC,
        ..Default::default()
    };
    if !addr.is_empty() {
        pool.addrs[0] = addr16(addr.parse()?);
    }
    let mut pools: Array<MapData, NatPool> = map(w, lb_common::nat::MAP_NAT_POOL, Map::Array)?;
    pools.set(vip_id, pool, 0)?;
    Ok(())
}

fn addr_key(a: IpAddr) -> VipAddrKey {
    VipAddrKey {
        addr: addr16(a),
        family: family_of(a),
        _pad: [0; 3],
    }
}

/// Marks `addr` as VIP `vip_id`'s pool address, as the daemon would.
fn pool_addr(w: &mut World, addr: &str, vip_id: u32) -> anyhow::Result<()> {
    let a: IpAddr = addr.parse()?;
    let mut addrs: HashMap<MapData, VipAddrKey, u32> =
        map(w, lb_common::MAP_VIP_ADDRS, Map::HashMap)?;
    addrs.insert(addr_key(a), vip_addr_nat_pool(vip_id), 0)?;
    let mut index: Array<MapData, u32> = map(w, lb_common::MAP_VIP_ADDR_INDEX, Map::Array)?;
    let slot = lb_common::vip_addr_slot(&addr16(a));
    if index.get(&slot, 0)? == 0 {
        index.set(slot, 1, 0)?;
    }
    Ok(())
}

/// Empties both flow maps and zeroes the passive counters of backends
/// `ids`.
pub fn clear_flows(w: &mut World, ids: &[u32]) -> anyhow::Result<()> {
    let mut f = flows(w)?;
    for k in f.keys().collect::<Result<Vec<_>, _>>()? {
        f.remove(&k)?;
    }
    let mut r = replies(w)?;
    for k in r.keys().collect::<Result<Vec<_>, _>>()? {
        r.remove(&k)?;
    }
    let mut p: PerCpuArray<MapData, PassiveStats> =
        map(w, lb_common::nat::MAP_PASSIVE, Map::PerCpuArray)?;
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
    for &id in ids {
        p.set(
            id,
            aya::maps::PerCpuValues::try_from(vec![PassiveStats::default(); cpus])?,
            0,
        )?;
    }
    Ok(())
}

/// Routes to the clients' networks ([`CLIENT4`], [`CLIENT6`]) through the
/// router, so answers are sent to `GW_MAC` (idempotent). Run on the
/// world's thread (its namespace).
pub fn routes_to_clients(_w: &mut World) -> anyhow::Result<()> {
    let gw = "10.0.0.254";
    let mac = GW_MAC.map(|b| format!("{b:02x}")).join(":");
    for args in [
        vec!["route", "replace", "198.18.0.0/24", "via", gw, "dev", "xf0"],
        vec![
            "-6",
            "neigh",
            "replace",
            "fd00::fe",
            "lladdr",
            &mac,
            "dev",
            "xf0",
            "nud",
            "permanent",
        ],
        vec![
            "-6",
            "route",
            "replace",
            "2001:db8:18::/64",
            "via",
            "fd00::fe",
            "dev",
            "xf0",
        ],
    ] {
        let out = std::process::Command::new("ip").args(&args).output()?;
        anyhow::ensure!(
            out.status.success(),
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
