//! The one bounds-checked accessor for packet memory, and header helpers.

use aya_ebpf::{bindings::bpf_fib_lookup as FibParams, programs::XdpContext};
use lb_common::{ENCAP_TTL, PROTO_IPIP, PROTO_IPV6};

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

/// Writes the outer IPv4 header of IPv4-in-IPv4 into the first 20 bytes of
/// `h`, every byte of them (a header written in place over old bytes
/// leaves none behind): version 4 and 5 words, the inner packet's `tos`,
/// total length `total`, id 0 and no fragment flags (the outer header is
/// never fragmented), TTL [`ENCAP_TTL`], protocol IPIP, `src` and `dst`
/// (IPv4 in their first 4 bytes), and the checksum. Shared by `xlb_lb` and
/// `xlb_hc`, so a probe is encapsulated exactly as clients' packets are.
#[inline(always)]
pub fn ipip4_header<const N: usize>(
    h: &mut [u8; N],
    tos: u8,
    total: u16,
    src: &[u8; 16],
    dst: &[u8; 16],
) {
    const { assert!(N >= 20, "an IPv4 header is 20 bytes") };
    let len = total.to_be_bytes();
    h[0] = 0x45;
    h[1] = tos;
    h[2] = len[0];
    h[3] = len[1];
    h[4] = 0;
    h[5] = 0;
    h[6] = 0;
    h[7] = 0;
    h[8] = ENCAP_TTL;
    h[9] = PROTO_IPIP;
    h[10] = 0;
    h[11] = 0;
    h[12] = src[0];
    h[13] = src[1];
    h[14] = src[2];
    h[15] = src[3];
    h[16] = dst[0];
    h[17] = dst[1];
    h[18] = dst[2];
    h[19] = dst[3];
    let c = ipv4_csum(h).to_be_bytes();
    h[10] = c[0];
    h[11] = c[1];
}

/// Writes the outer IPv6 header of IPv6-in-IPv6 into the first 40 bytes of
/// `h`: `first` (version, traffic class and flow label copied from the
/// inner header, so ECMP on the way keeps the flow on one path), payload
/// length `payload`, next header IPv6, hop limit [`ENCAP_TTL`], `src`,
/// `dst`. Shared by `xlb_lb` and `xlb_hc`.
#[inline(always)]
pub fn ipip6_header<const N: usize>(
    h: &mut [u8; N],
    first: [u8; 4],
    payload: u16,
    src: &[u8; 16],
    dst: &[u8; 16],
) {
    const { assert!(N >= 40, "an IPv6 header is 40 bytes") };
    h[0] = first[0];
    h[1] = first[1];
    h[2] = first[2];
    h[3] = first[3];
    let plen = payload.to_be_bytes();
    h[4] = plen[0];
    h[5] = plen[1];
    h[6] = PROTO_IPV6;
    h[7] = ENCAP_TTL;
    let mut i = 0;
    while i < 16 {
        h[8 + i] = src[i];
        h[24 + i] = dst[i];
        i += 1;
    }
}

/// `AF_INET` and `AF_INET6`, as `bpf_fib_lookup` takes and returns them.
pub const AF_INET: u8 = 2;
pub const AF_INET6: u8 = 10;

/// Fills `p` (zeroed by the caller) for an input route lookup from
/// `ifindex` towards `dst` from `src` (IPv4 in the first 4 bytes unless
/// `v6`): the same lookup for `xlb_lb`'s packets and `xlb_hc`'s probes.
/// The caller runs `bpf_fib_lookup` with its own context.
#[inline(always)]
pub fn fib_params(
    p: &mut FibParams,
    ifindex: u32,
    v6: bool,
    src: &[u8; 16],
    dst: &[u8; 16],
    tot_len: u16,
) {
    p.ifindex = ifindex;
    p.__bindgen_anon_1.tot_len = tot_len;
    // The union fields are plain byte arrays in network order: copy bytes.
    // verifier: constant lengths in two arms, not one copy of a variable
    // length (which the compiler turns into a loop the verifier walks).
    // SAFETY: writing union fields of a C struct, within their 16 bytes.
    unsafe {
        let s = &mut p.__bindgen_anon_3.ipv6_src as *mut [u32; 4] as *mut u8;
        let d = &mut p.__bindgen_anon_4.ipv6_dst as *mut [u32; 4] as *mut u8;
        if v6 {
            p.family = AF_INET6;
            core::ptr::copy_nonoverlapping(src.as_ptr(), s, 16);
            core::ptr::copy_nonoverlapping(dst.as_ptr(), d, 16);
        } else {
            p.family = AF_INET;
            core::ptr::copy_nonoverlapping(src.as_ptr(), s, 4);
            core::ptr::copy_nonoverlapping(dst.as_ptr(), d, 4);
        }
    }
}
