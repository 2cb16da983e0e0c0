//! ICMP errors about a NAT flow, translated like the flow's own packets
//! (issue 27): IPv4 "destination unreachable" (with "fragmentation
//! needed") and "time exceeded", ICMPv6 "destination unreachable",
//! "packet too big" and "time exceeded", as `crate::icmp` parses them.
//!
//! - From the client's side (a router between the client and the LB, to
//!   the VIP, quoting the answer the LB sent, VIP → client): sent to the
//!   flow's backend as if about the backend's own packet, from the pool
//!   address (or the client's, `preserve_client`) to the backend, the
//!   quote backend:port → pool:port.
//! - From the backend's side (to a pool address, quoting the client's
//!   packet as the LB sent it, pool:port → backend:port): found by the
//!   quote in `XLB_NAT_REPLY` and sent to the client, from the VIP, the
//!   quote client → VIP. With `preserve_client` the LB's packet left from
//!   the client's own address, so such an error is addressed to the
//!   client and only passes through (`icmp::TRANSIT`, `reply::transit`):
//!   found and translated the same way.
//!
//! In both the outer and the quoted addresses and ports are rewritten, with
//! the outer IPv4 header's checksum, the quoted IPv4 header's, and the
//! ICMP / ICMPv6 checksum (over the changed quote, and for ICMPv6 the
//! pseudo-header's addresses) updated incrementally. The quoted TCP/UDP
//! checksum is left as quoted: the quote may cut it off, and no stack
//! checks it (RFC 1122, 3.2.2; Linux and the BSDs match on addresses and
//! ports). An MTU in the message is passed on as is (the LB adds no
//! header to a NAT packet), but one from the client's side is raised to
//! the least a path may have ([`raise_mtu`]).

use aya_ebpf::programs::XdpContext;
use lb_common::{FAMILY_V4, Stat};

use super::rewrite::{OK, To, apply, diff16, diff32};
use crate::{
    key::{copy_addr, word},
    packet::{ICMP_LEN, IPV4_LEN, IPV6_LEN, IcmpHdr, Ipv4Hdr, Ipv6Hdr, ptr_at},
    parse::Packet,
    stats::{aborted, count, pass},
};

/// Rewrites the quote of the ICMP error `pkt` (parsed: `pkt.flow` is the
/// quoted packet reversed) to the packet `to.dst:to.dport` →
/// `to.src:to.sport`, with the ICMP checksum, ICMPv6's over the
/// pseudo-header as [`super::rewrite::rewrite`] then rewrites the outer
/// header to `to` (which it does next, and its TTL check first: a
/// message it would pass to the host is left whole). `to` is what a
/// packet of the same direction is rewritten to.
// verifier: not inlined, and called before the outer rewrite, not by it:
// the two frames never add up on the 512-byte stack.
#[inline(never)]
pub(crate) fn rewrite(ctx: &XdpContext, pkt: &Packet, to: &To) -> u32 {
    let v4 = pkt.flow.family == FAMILY_V4;
    let l4off = pkt.l3off + if v4 { IPV4_LEN } else { IPV6_LEN };
    let (quote, outer) = if v4 {
        (quote4(ctx, l4off + ICMP_LEN, to), ttl4(ctx, pkt.l3off))
    } else {
        (
            quote6(ctx, l4off + ICMP_LEN, to),
            pseudo6(ctx, pkt.l3off, to),
        )
    };
    let Some(d) = outer else {
        return pass(Stat::PassNatTtl);
    };
    let (Some(q), Some(h)) = (quote, ptr_at::<IcmpHdr>(ctx, l4off)) else {
        return aborted();
    };
    // SAFETY: bounds checked by ptr_at.
    let h = unsafe { &mut *h };
    h.check = apply(u16::from_ne_bytes(h.check), q + d).to_ne_bytes();
    OK
}

/// For the ICMP error `pkt` from a NAT flow's client side: an MTU below
/// the least a path may have (IPv4 552, Linux's `min_pmtu`; IPv6 1280) is
/// raised to it (`nat_icmp_mtu_raised`), with the checksum: the backend's
/// route towards the pool address is every client's, and one client must
/// not make it smaller for all.
// verifier: inlined into the top frame, before `nat::send` (the frames
// under it are at 6.1's limit; the top one has room within its rounding).
#[inline(always)]
pub(crate) fn raise_mtu(ctx: &XdpContext, pkt: &Packet) {
    let v4 = pkt.flow.family == FAMILY_V4;
    let l4off = pkt.l3off + if v4 { IPV4_LEN } else { IPV6_LEN };
    let Some(h) = ptr_at::<IcmpHdr>(ctx, l4off) else {
        return;
    };
    // SAFETY: bounds checked by ptr_at.
    let h = unsafe { &mut *h };
    let m = mtu_floor(h, v4);
    if m != 0 {
        h.check = apply(u16::from_ne_bytes(h.check), m).to_ne_bytes();
    }
}

/// Least MTU a client's "fragmentation needed" (IPv4) or "packet too big"
/// (IPv6) may pass on to a backend.
const MIN_MTU4: u16 = 552;
const MIN_MTU6: u32 = 1280;

/// Raises the MTU of `h` (an error from the client's side) to the least a
/// path may have, if it is lower; the checksum difference (0: unchanged).
#[inline(always)]
fn mtu_floor(h: &mut IcmpHdr, v4: bool) -> u64 {
    let old = u32::from_ne_bytes(h.rest);
    if v4 {
        // Type 3 code 4: "fragmentation needed", the MTU in the low half.
        if h.kind != 3 || h.code != 4 || u16::from_be_bytes([h.rest[2], h.rest[3]]) >= MIN_MTU4 {
            return 0;
        }
        let m = MIN_MTU4.to_be_bytes();
        h.rest[2] = m[0];
        h.rest[3] = m[1];
    } else {
        // Type 2: "packet too big", the MTU in all four bytes.
        if h.kind != 2 || u32::from_be(old) >= MIN_MTU6 {
            return 0;
        }
        h.rest = MIN_MTU6.to_be_bytes();
    }
    count(Stat::NatIcmpMtuRaised);
    diff32(old, u32::from_ne_bytes(h.rest))
}

/// `Some(0)` (ICMP sums no pseudo-header) if the outer IPv4 header's TTL
/// lets the message be forwarded, `None` if not.
#[inline(always)]
fn ttl4(ctx: &XdpContext, l3off: usize) -> Option<u64> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, l3off)?;
    // SAFETY: bounds checked by ptr_at.
    (unsafe { (*ip).ttl } > 1).then_some(0)
}

/// The ICMPv6 pseudo-header's change once the outer header's addresses
/// are `to`'s, if its hop limit lets the message be forwarded.
#[inline(always)]
fn pseudo6(ctx: &XdpContext, l3off: usize, to: &To) -> Option<u64> {
    let ip = ptr_at::<Ipv6Hdr>(ctx, l3off)?;
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &*ip };
    if ip.hop_limit <= 1 {
        return None;
    }
    let mut d = 0;
    let mut i = 0;
    while i < 4 {
        d += diff32(word(&ip.saddr, i), word(to.src, i));
        d += diff32(word(&ip.daddr, i), word(to.dst, i));
        i += 1;
    }
    Some(d)
}

/// The quoted IPv4 header at `off` and the ports behind it (the parser
/// checked both lie inside the packet) rewritten to `to` reversed, the
/// header's checksum updated. Returns the ICMP checksum's difference.
#[inline(always)]
fn quote4(ctx: &XdpContext, off: usize, to: &To) -> Option<u64> {
    let q = ptr_at::<Ipv4Hdr>(ctx, off)?;
    // SAFETY: bounds checked by ptr_at.
    let q = unsafe { &mut *q };
    let (src, dst) = (word(to.dst, 0), word(to.src, 0));
    let addrs = diff32(word(&q.saddr, 0), src) + diff32(word(&q.daddr, 0), dst);
    let old = u16::from_ne_bytes(q.check);
    let new = apply(old, addrs);
    q.check = new.to_ne_bytes();
    q.saddr = src.to_ne_bytes();
    q.daddr = dst.to_ne_bytes();
    Some(addrs + diff16(old, new) + ports(ctx, off + IPV4_LEN, to)?)
}

/// The quoted IPv6 header at `off` and the ports behind it rewritten to
/// `to` reversed. Returns the ICMPv6 checksum's difference for the quote.
#[inline(always)]
fn quote6(ctx: &XdpContext, off: usize, to: &To) -> Option<u64> {
    let q = ptr_at::<Ipv6Hdr>(ctx, off)?;
    // SAFETY: bounds checked by ptr_at.
    let q = unsafe { &mut *q };
    let mut d = 0;
    let mut i = 0;
    while i < 4 {
        d += diff32(word(&q.saddr, i), word(to.dst, i));
        d += diff32(word(&q.daddr, i), word(to.src, i));
        i += 1;
    }
    copy_addr(&mut q.saddr, to.dst);
    copy_addr(&mut q.daddr, to.src);
    Some(d + ports(ctx, off + IPV6_LEN, to)?)
}

/// The quoted ports at `off` set to `to.dport` → `to.sport`; returns
/// their checksum difference.
#[inline(always)]
fn ports(ctx: &XdpContext, off: usize, to: &To) -> Option<u64> {
    let p = ptr_at::<[u16; 2]>(ctx, off)?.cast::<u16>();
    // SAFETY: bounds checked by ptr_at: two u16, maybe unaligned.
    unsafe {
        let d = diff16(p.read_unaligned(), to.dport) + diff16(p.add(1).read_unaligned(), to.sport);
        p.write_unaligned(to.dport);
        p.add(1).write_unaligned(to.sport);
        Some(d)
    }
}
