//! Checksums of the headers the programs write: the outer IPv4 header of
//! `dsr-ipip` (the inner packet is untouched, IPv6 has no header checksum,
//! and `dsr-l2` changes only MACs), and the IPv4 header and TCP segment of
//! a RST built by `reset.rs`, and the ICMP messages of `icmp.rs`.

use crate::packet::{ICMP_LEN, IcmpHdr, Ipv4Hdr, TcpHdr};

/// The checksum of `h` (its `check` field zero), host order: the one's
/// complement of the one's complement sum of its ten 16-bit words (RFC 791).
#[inline(always)]
pub(crate) fn ipv4_header(h: &Ipv4Hdr) -> u16 {
    // SAFETY: `Ipv4Hdr` is `repr(C)`, 20 bytes of byte fields, alignment 1.
    fold(sum(unsafe { &*(h as *const Ipv4Hdr as *const [u8; 20]) }))
}

/// The checksum of the option-less TCP header `t` (its `check` field zero,
/// no payload), given the sum of the pseudo-header's two addresses
/// ([`sum`] of each): RFC 9293, 3.1.
#[inline(always)]
pub(crate) fn tcp(addrs: u32, t: &TcpHdr) -> u16 {
    const LEN: usize = core::mem::size_of::<TcpHdr>();
    // SAFETY: `TcpHdr` is `repr(C)`, 20 bytes of byte fields, alignment 1.
    let bytes = unsafe { &*(t as *const TcpHdr as *const [u8; LEN]) };
    fold(addrs + u32::from(lb_common::PROTO_TCP) + LEN as u32 + sum(bytes))
}

/// The checksum of the ICMP(v6) header `h` (its `check` zero) and the
/// `N` bytes `data` behind it, plus `pseudo` (the ICMPv6 pseudo-header's
/// sum; 0 for ICMP).
#[inline(always)]
pub(crate) fn icmp<const N: usize>(pseudo: u32, h: &IcmpHdr, data: &[u8; N]) -> u16 {
    // SAFETY: `IcmpHdr` is `repr(C)`, 8 bytes of byte fields, alignment 1.
    let hb = unsafe { &*(h as *const IcmpHdr as *const [u8; ICMP_LEN]) };
    fold(pseudo + sum(hb) + sum(data))
}

/// `check` after one 16-bit word it covers changed from `old` to `new`
/// (RFC 1624: HC' = ~(~HC + ~m + m')).
#[inline(always)]
pub(crate) fn replace(check: u16, old: u16, new: u16) -> u16 {
    fold(u32::from(!check) + u32::from(!old) + u32::from(new))
}

/// The one's complement sum (not yet folded) of `b`'s 16-bit words, `N` even.
#[inline(always)]
pub(crate) fn sum<const N: usize>(b: &[u8; N]) -> u32 {
    let mut s: u32 = 0;
    let mut i = 0;
    while i + 1 < N {
        s += u32::from(u16::from_be_bytes([b[i], b[i + 1]]));
        i += 2;
    }
    s
}

/// Folds a 32-bit one's complement sum to 16 bits and complements it.
#[inline(always)]
pub(crate) fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}
