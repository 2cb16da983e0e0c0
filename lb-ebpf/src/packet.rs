//! The one bounds-checked accessor for packet memory, and header helpers.

use aya_ebpf::programs::XdpContext;

/// A pointer to a `T` at byte `offset` of the packet, or `None` if any byte
/// of it lies past the end. Every packet access goes through here.
#[inline(always)]
pub fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Option<*mut T> {
    let start = ctx.data();
    let end = ctx.data_end();
    // verifier: compare the computed end against data_end before any access.
    if start + offset + core::mem::size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *mut T)
}

/// Length of the packet in bytes.
#[inline(always)]
pub fn len(ctx: &XdpContext) -> usize {
    ctx.data_end() - ctx.data()
}

pub const ETH_LEN: usize = 14;
pub const VLAN_LEN: usize = 4;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88a8;

#[inline(always)]
pub fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}

/// The checksum of the IPv4 header in the first 20 bytes of `h` (checksum
/// field zero); `h` may go on past the header (an outer header written in
/// place before the inner one).
#[inline(always)]
pub fn ipv4_csum<const N: usize>(h: &[u8; N]) -> u16 {
    const { assert!(N >= 20, "an IPv4 header is 20 bytes") };
    let mut sum: u32 = 0;
    let mut i = 0;
    while i < 20 {
        sum += u16::from_be_bytes([h[i], h[i + 1]]) as u32;
        i += 2;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}
