//! The Maglev ring (`XLB_RING`): its value and its index.

/// Value of `XLB_RING`: one slot of a VIP's Maglev table. The kernel
/// rounds array values up to 8 bytes, so the previous owner next to the
/// backend id costs no memory over the `u32` ring of layout 4.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RingSlot {
    /// Backend id that takes new flows hashed to this slot; 0 = none.
    pub backend_id: u32,
    /// Backend id that held this slot before it last changed, if that
    /// change is younger than `daemon.second_chance_window`; 0 = none (or
    /// expired). Written by the daemon with the table, cleared when it
    /// expires or the id leaves the VIP.
    pub prev_id: u32,
}
const _: () = assert!(core::mem::size_of::<RingSlot>() == 8);

/// Ring index of `slot` in half `half` of VIP `vip_id`'s table.
#[inline(always)]
pub fn ring_index(vip_id: u32, half: u32, stride: u32, slot: u32) -> u32 {
    (vip_id * 2 + half) * stride + slot
}

#[cfg(feature = "user")]
// SAFETY: repr(C), Copy, two u32: every byte pattern is a valid value.
unsafe impl aya::Pod for RingSlot {}
