//! NAT mode in `xlb-tput-bench` (issue 27: live frames on the LB's CPU,
//! NAT against nftables DNAT + masquerade doing the same job).
//!
//! xlb's half: a NAT VIP (10.100.0.3, on a port of its own so the DSR
//! cases' port carries no NAT mark) over the lab's three backends, its
//! pool and marks written into the maps as the daemon writes them
//! (`daemon::nat`), and an established flow: the generator's SYN opens it,
//! then its state is set to established (the backend's SYN-ACK never comes
//! back through this program in a live run).
//!
//! The kernel reference translates both addresses as xlb's NAT mode does:
//! the `numgen random mod 3` DNAT of the VIP that the DSR comparison
//! already installs (`tput::topo::NatTable`), plus this table's
//! masquerade of what was DNATed, so the backends answer the LB, not the
//! client. Masquerade rather than SNAT to a fixed address: it is what an
//! operator writes, and it picks the outgoing interface's address, the
//! LB's own.

use crate::bench::tput::nft;
use crate::harness::World;
use aya::maps::{Array, HashMap, Map, MapData};
use lb_common::{
    BACKEND_UP, BackendInfo, DOWN_POLICY_REHASH, FlowKey, PROTO_TCP, VipAddrKey, addr16, family_of,
    nat::{MODE_NAT, NAT_TCP_ESTABLISHED, NatFlow, NatPool, VIP_PORT_NAT, vip_addr_nat_pool},
    port_index,
};

/// The cases' names in the report.
pub const NFT_MASQ: &str = "nftables DNAT + masquerade (full NAT)";
pub const XLB_NAT_EST: &str = "xlb nat, established";

/// The NAT VIP: an address of the lab's VIP range no other case uses, a
/// port of its own, and its VIP id (after the two DSR VIPs).
pub const NAT_VIP: &str = "10.100.0.3";
pub const NAT_VIP_PORT: u16 = 81;
const NAT_VIP_ID: u32 = 2;
/// Where the backends listen, and the pool address (`nat_lab::POOL_V4`).
const BACKEND_PORT: u16 = 80;
const POOL: &str = "10.99.0.4";
/// Every timeout of the pool: longer than any run.
const TIMEOUT_NS: u64 = 3600 * 1_000_000_000;

/// Writes the NAT VIP over backends `1..=n` (`table`: its Maglev ring),
/// its pool and its marks.
///
/// # Errors
///
/// A map write failed, or the object lacks a NAT map (build mismatch).
pub fn configure_xlb_nat(w: &mut World, table: &[u32]) -> anyhow::Result<()> {
    for b in w.backends.clone() {
        w.dp.set_backend(
            b.id,
            &BackendInfo {
                addr: addr16(b.addr),
                generation: 0,
                state: BACKEND_UP,
                family: family_of(b.addr),
                // DSR ignores it; the NAT VIP sends its flows there.
                port: BACKEND_PORT.to_be(),
            },
        )?;
    }
    w.add_vip(
        NAT_VIP_ID,
        NAT_VIP,
        NAT_VIP_PORT,
        PROTO_TCP,
        MODE_NAT,
        DOWN_POLICY_REHASH,
        table,
    )?;
    let mut pool = NatPool {
        count: 1,
        port_min: lb_common::nat::DEFAULT_SNAT_PORT_MIN,
        port_max: lb_common::nat::DEFAULT_SNAT_PORT_MAX,
        tcp_syn_timeout_ns: TIMEOUT_NS,
        tcp_established_timeout_ns: TIMEOUT_NS,
        tcp_fin_timeout_ns: TIMEOUT_NS,
        tcp_close_timeout_ns: TIMEOUT_NS,
        udp_timeout_ns: TIMEOUT_NS,
        ..NatPool::default()
    };
    pool.addrs[0] = addr16(POOL.parse()?);
    let mut pools: Array<MapData, NatPool> = map(w, lb_common::nat::MAP_NAT_POOL, Map::Array)?;
    pools.set(NAT_VIP_ID, pool, 0)?;
    let mut ports: Array<MapData, u32> = map(w, lb_common::MAP_VIP_PORTS, Map::Array)?;
    let idx = port_index(PROTO_TCP, NAT_VIP_PORT);
    let n = ports.get(&idx, 0)?;
    ports.set(idx, n | VIP_PORT_NAT, 0)?;
    let mut sports: Array<MapData, u32> = map(w, lb_common::nat::MAP_NAT_SPORTS, Map::Array)?;
    sports.set(
        port_index(PROTO_TCP, BACKEND_PORT),
        w.backends.len() as u32,
        0,
    )?;
    let a: std::net::IpAddr = POOL.parse()?;
    let mut addrs: HashMap<MapData, VipAddrKey, u32> =
        map(w, lb_common::MAP_VIP_ADDRS, Map::HashMap)?;
    let key = VipAddrKey {
        addr: addr16(a),
        family: family_of(a),
        _pad: [0; 3],
    };
    addrs.insert(key, vip_addr_nat_pool(NAT_VIP_ID), 0)?;
    let mut index: Array<MapData, u32> = map(w, lb_common::MAP_VIP_ADDR_INDEX, Map::Array)?;
    let slot = lb_common::vip_addr_slot(&addr16(a));
    if index.get(&slot, 0)? == 0 {
        index.set(slot, 1, 0)?;
    }
    Ok(())
}

/// Sets every NAT flow's state to established, as the backend's SYN-ACK
/// would have.
///
/// # Errors
///
/// The flow map cannot be read or written, or holds no flow.
pub fn mark_established(w: &mut World) -> anyhow::Result<()> {
    let mut flows: HashMap<MapData, FlowKey, NatFlow> =
        map(w, lb_common::nat::MAP_NAT_FLOWS, Map::HashMap)?;
    let keys = flows.keys().collect::<Result<Vec<_>, _>>()?;
    anyhow::ensure!(!keys.is_empty(), "the NAT SYN opened no flow");
    for k in keys {
        let mut f = flows.get(&k, 0)?;
        f.state = NAT_TCP_ESTABLISHED;
        flows.insert(k, f, 0)?;
    }
    Ok(())
}

/// The map `name` that `xlb_lb` uses, typed.
fn map<T: TryFrom<Map, Error = aya::maps::MapError>>(
    w: &mut World,
    name: &str,
    wrap: fn(MapData) -> Map,
) -> anyhow::Result<T> {
    let data = MapData::from_id(w.lb_map_id(name)?)?;
    Ok(T::try_from(wrap(data))?)
}

/// The masquerade table's name (family `ip`), apart from the DNAT one.
const TABLE: &str = "xlb_tput_masq";

/// The table: masquerade every connection that conntrack DNATed, on its
/// way out (postrouting, source-NAT priority).
pub fn masquerade_ruleset(table: &str) -> String {
    format!(
        "table ip {table} {{\n\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tct status dnat masquerade\n\
         \t}}\n\
         }}\n"
    )
}

/// The masquerade table in namespace `ns`, deleted on drop.
pub struct Masquerade {
    ns: String,
}

impl Masquerade {
    /// Installs the table in `ns` (one `nft -f` transaction).
    ///
    /// # Errors
    ///
    /// `nft` is missing or refuses the table.
    pub fn add(ns: &str) -> anyhow::Result<Self> {
        nft(ns, &["-f", "-"], Some(&masquerade_ruleset(TABLE)))?;
        Ok(Self { ns: ns.to_string() })
    }
}

impl Drop for Masquerade {
    fn drop(&mut self) {
        if let Err(e) = nft(&self.ns, &["delete", "table", "ip", TABLE], None) {
            eprintln!("xlb-tput-bench: {e:#}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masquerade_takes_only_what_was_dnated() {
        let rules = masquerade_ruleset("t");
        for want in [
            "table ip t {",
            "type nat hook postrouting priority srcnat; policy accept;",
            "ct status dnat masquerade",
        ] {
            assert!(rules.contains(want), "{want:?} missing from:\n{rules}");
        }
    }
}
