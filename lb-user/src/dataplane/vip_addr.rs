//! The VIP addresses: `XLB_VIP_ADDRS` (each address that carries a VIP,
//! with its `VIP_ADDR_*` bits) and `XLB_VIP_AINDEX`, the direct-mapped
//! filter the data plane reads before it. Both follow the VIPs in
//! `XLB_VIPS` and their `VipInfo::host_services`.

use std::collections::HashSet;

use aya::maps::MapError;
use lb_common::{
    VIP_ADDR_BALANCED, VIP_ADDR_HOST_SERVICES, VipAddrKey, VipInfo, VipKey, vip_addr_slot,
};

use super::{Dataplane, Result, map_err};

/// The `XLB_VIP_ADDRS` bits of an address carried by the VIPs `infos`
/// (none: no entry).
pub(super) fn addr_bits<'a>(infos: impl IntoIterator<Item = &'a VipInfo>) -> Option<u32> {
    infos.into_iter().fold(None, |bits, info| {
        let host = if info.host_services != 0 {
            VIP_ADDR_HOST_SERVICES
        } else {
            0
        };
        Some(bits.unwrap_or(VIP_ADDR_BALANCED) | host)
    })
}

impl Dataplane {
    /// Writes the `XLB_VIP_ADDRS` entry and the `XLB_VIP_AINDEX` slot of
    /// `key`'s address from the VIPs now in `XLB_VIPS`. An address gets
    /// its entry before its slot counts it, and loses its slot's count
    /// before its entry: in between the data plane passes its packets, as
    /// it did before either existed.
    pub(super) fn sync_vip_addr(&mut self, key: &VipKey) -> Result<()> {
        let entries = self.vip_entries()?;
        let addr = VipAddrKey {
            addr: key.addr,
            family: key.family,
            _pad: [0; 3],
        };
        let bits = addr_bits(
            entries
                .iter()
                .filter(|(k, _)| k.addr == key.addr && k.family == key.family)
                .map(|(_, info)| info),
        );
        let slot = vip_addr_slot(&key.addr);
        let in_slot = self.addrs_in_slot(&entries, slot);
        match bits {
            Some(bits) => {
                self.vip_addrs
                    .insert(addr, bits, 0)
                    .map_err(map_err(lb_common::MAP_VIP_ADDRS))?;
                self.set_vip_addr_slot(slot, in_slot)
            }
            None => {
                self.set_vip_addr_slot(slot, in_slot)?;
                match self.vip_addrs.remove(&addr) {
                    Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
                    Err(e) => Err(map_err(lb_common::MAP_VIP_ADDRS)(e)),
                }
            }
        }
    }

    /// Distinct addresses in `slot`: VIP addresses and NAT pool addresses
    /// (the families of one address form can differ only in theory: IPv4
    /// keys end in 12 zero bytes).
    fn addrs_in_slot(&self, entries: &[(VipKey, VipInfo)], slot: u32) -> u32 {
        entries
            .iter()
            .map(|(k, _)| (k.addr, k.family))
            .filter(|(a, _)| vip_addr_slot(a) == slot)
            .chain(self.pool_addrs_in_slot(slot))
            .collect::<HashSet<_>>()
            .len() as u32
    }

    /// Rewrites the count of `slot` from the VIPs and pool addresses.
    pub(super) fn refresh_vip_addr_slot(&mut self, slot: u32) -> Result<()> {
        let entries = self.vip_entries()?;
        let n = self.addrs_in_slot(&entries, slot);
        self.set_vip_addr_slot(slot, n)
    }

    fn set_vip_addr_slot(&mut self, slot: u32, n: u32) -> Result<()> {
        self.vip_addr_index
            .set(slot, n, 0)
            .map_err(map_err(lb_common::MAP_VIP_ADDR_INDEX))
    }

    /// The `XLB_VIP_ADDRS` bits of `addr`, if it has an entry.
    pub fn vip_addr_bits(&self, addr: std::net::IpAddr) -> Result<Option<u32>> {
        let key = VipAddrKey {
            addr: lb_common::addr16(addr),
            family: lb_common::family_of(addr),
            _pad: [0; 3],
        };
        match self.vip_addrs.get(&key, 0) {
            Ok(bits) => Ok(Some(bits)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(map_err(lb_common::MAP_VIP_ADDRS)(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_has_host_services_if_any_of_its_vips_does() {
        let plain = VipInfo::default();
        let host = VipInfo {
            host_services: 1,
            ..VipInfo::default()
        };
        assert_eq!(addr_bits([]), None);
        assert_eq!(addr_bits([&plain]), Some(VIP_ADDR_BALANCED));
        assert_eq!(
            addr_bits([&plain, &host]),
            Some(VIP_ADDR_BALANCED | VIP_ADDR_HOST_SERVICES)
        );
    }
}
