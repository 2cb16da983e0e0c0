//! The VIP addresses as the data plane tells them apart: the value bits of
//! `XLB_VIP_ADDRS` and the direct-mapped filter `XLB_VIP_AINDEX` read
//! before it.

use crate::{Addr, MAX_VIPS};

/// `XLB_VIP_ADDRS` value bit: some VIP has this address (always set).
pub const VIP_ADDR_BALANCED: u32 = 1;
/// `XLB_VIP_ADDRS` value bit: some VIP at this address sets
/// `host_services` ([`crate::VipInfo::host_services`]), so packets to it that no
/// VIP balances are passed to the host. Without it they are dropped
/// (`drop_vip_unbalanced`): the host does not hold a VIP address, and with
/// forwarding on (which `bpf_fib_lookup` needs) it would route them back
/// to the router they came from, which sends them here again until their
/// TTL runs out.
pub const VIP_ADDR_HOST_SERVICES: u32 = 2;

/// Entries of `XLB_VIP_AINDEX`: a direct-mapped filter of the VIP
/// addresses (a power of two, ≥ 16 × [`MAX_VIPS`] so that few share a
/// slot), which the data plane reads before the `XLB_VIP_ADDRS` hash
/// lookup. It spares the host's own traffic (to no VIP address) that
/// lookup: an array read, which the kernel inlines, and a multiply.
pub const VIP_ADDR_INDEX_LEN: u32 = 1024;
const _: () = assert!(VIP_ADDR_INDEX_LEN.is_power_of_two() && VIP_ADDR_INDEX_LEN >= 16 * MAX_VIPS);

/// The `XLB_VIP_AINDEX` slot of an address: an unkeyed multiplicative
/// hash, as [`crate::vip_index_slot`]'s. Two VIP addresses in one slot, or a
/// client's packet to another address in a VIP address's slot, only cost
/// the hash lookup that decides.
/// It reads the address as two 8-byte words, which the eBPF build loads in
/// one instruction each: this runs for the host's own traffic, where a
/// byte-wise fold cost some thirty instructions.
#[inline(always)]
pub fn vip_addr_slot(addr: &Addr) -> u32 {
    let lo = u64::from_ne_bytes(addr.first_chunk::<8>().copied().unwrap_or_default());
    let hi = u64::from_ne_bytes(addr.last_chunk::<8>().copied().unwrap_or_default());
    let x = lo ^ hi;
    let x = (x ^ (x >> 32)) as u32;
    // No fold of the high half first (as `vip_index_slot` has): the key is
    // the address alone, and addresses that differ in their last byte
    // (the high one of an IPv4 word) already differ in the product's top
    // bits, the factor being odd.
    x.wrapping_mul(0x9e37_79b1) >> (32 - VIP_ADDR_INDEX_LEN.trailing_zeros())
}
