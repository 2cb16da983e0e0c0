//! The decapsulator's maps: the outer destinations it strips tunnels to,
//! the outer sources (load balancers) it accepts, the inner destinations
//! (VIP addresses) it accepts, and its counters.

use std::net::IpAddr;

use aya::maps::lpm_trie::Key;
use lb_common::{
    DECAP_ADDR_ACCEPT, DECAP_ADDR_SECOND_CHANCE, DECAP_STATS_LEN, DecapAddrKey, DecapStat, addr16,
    family_of,
};

use super::{Dataplane, Result, map_err, sum_counter};

/// `addr` as a key of `XLB_DECAP_ADDR` / `XLB_DECAP_VIP`.
fn addr_key(addr: IpAddr) -> DecapAddrKey {
    DecapAddrKey {
        addr: addr16(addr),
        family: family_of(addr),
        _pad: [0; 3],
    }
}

impl Dataplane {
    /// Accept tunnels whose outer destination is `addr` (one of ours);
    /// a tunnel inside the tunnel is dropped.
    pub fn add_decap_addr(&mut self, addr: IpAddr) -> Result<()> {
        self.add_decap_addr_with(addr, false)
    }

    /// [`Self::add_decap_addr`], with second chance on (`second_chance`):
    /// a load balancer's tunnel inside the tunnel is kept or relayed.
    pub fn add_decap_addr_with(&mut self, addr: IpAddr, second_chance: bool) -> Result<()> {
        let flags = if second_chance {
            DECAP_ADDR_ACCEPT | DECAP_ADDR_SECOND_CHANCE
        } else {
            DECAP_ADDR_ACCEPT
        };
        self.decap_addrs
            .insert(addr_key(addr), flags, 0)
            .map_err(map_err(lb_common::MAP_DECAP_ADDRS))
    }

    /// Accept tunnels whose outer source is in `addr`/`len` (a load
    /// balancer's encapsulation source). `addr`'s host bits must be zero
    /// (as `guard::Prefix` keeps them).
    pub fn add_decap_source(&mut self, addr: IpAddr, len: u8) -> Result<()> {
        let len = u32::from(len);
        match addr {
            IpAddr::V4(a) => self
                .decap_src_v4
                .insert(&Key::new(len, a.octets()), 1, 0)
                .map_err(map_err(lb_common::MAP_DECAP_SRC_V4)),
            IpAddr::V6(a) => self
                .decap_src_v6
                .insert(&Key::new(len, a.octets()), 1, 0)
                .map_err(map_err(lb_common::MAP_DECAP_SRC_V6)),
        }
    }

    /// Accept tunnels whose inner destination is `vip` (a VIP address this
    /// backend serves).
    pub fn add_decap_vip(&mut self, vip: IpAddr) -> Result<()> {
        self.decap_vips
            .insert(addr_key(vip), 1, 0)
            .map_err(map_err(lb_common::MAP_DECAP_VIPS))
    }

    /// `xlb_decap` counters summed over CPUs, indexed by [`DecapStat`].
    pub fn decap_stats(&self) -> Result<[u64; DECAP_STATS_LEN as usize]> {
        let mut out = [0u64; DECAP_STATS_LEN as usize];
        for s in DecapStat::ALL {
            out[s as usize] = sum_counter(&self.decap_stats, s as u32, lb_common::MAP_DECAP_STATS)?;
        }
        Ok(out)
    }
}
