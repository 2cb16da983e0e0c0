//! Translating a NAT packet in place: addresses, ports and TTL / hop
//! limit, with every checksum that covers them updated incrementally
//! (RFC 1624): the IPv4 header's, and the TCP/UDP checksum's pseudo-header
//! and ports, so the payload is never summed.

use aya_ebpf::programs::XdpContext;
use lb_common::{FAMILY_V4, PROTO_TCP, Stat};

use crate::{
    key::{copy_addr, word},
    packet::{IPV4_LEN, IPV6_LEN, Ipv4Hdr, Ipv6Hdr, TcpHdr, UdpHdr, ptr_at},
    parse::Packet,
    stats::{aborted, pass},
};

/// Offset of the checksum in the TCP and the UDP header.
const TCP_CHECK: usize = 16;
const UDP_CHECK: usize = 6;

/// Where a translated packet goes: addresses (network order, IPv4 in the
/// first 4 bytes) and ports (network order, as in keys).
pub(crate) struct To<'a> {
    pub src: &'a [u8; 16],
    pub dst: &'a [u8; 16],
    pub sport: u16,
    pub dport: u16,
}

/// Rewrites `pkt` (parsed, TCP or UDP, or an ICMP error whose message
/// `super::icmp::rewrite` did) to `to` and decrements its TTL /
/// hop limit. `Err` holds the verdict when it may not be sent: a TTL that
/// would reach 0 is passed to the host (counted `pass_nat_ttl`), which
/// answers "time exceeded" as any router on the path would.
///
/// The sums run on words in memory order, not network order: a one's
/// complement sum is the same either way when the result is stored in
/// the order its words were read (RFC 1071, 2(B)), and it takes a load
/// per word instead of a byte swap per half-word.
// Not inlined: its frame (the sums' spills) is not added to its callers'.
#[inline(never)]
pub(crate) fn rewrite(ctx: &XdpContext, pkt: &Packet, to: &To) -> u32 {
    let v4 = pkt.flow.family == FAMILY_V4;
    // The pseudo-header's part of the change: both addresses.
    let addrs = if v4 {
        ipv4(ctx, pkt.l3off, to)
    } else {
        ipv6(ctx, pkt.l3off, to)
    };
    let addrs = match addrs {
        Ok(d) => d,
        Err(v) => return v,
    };
    // An ICMP error's message was rewritten first (`super::icmp`).
    if pkt.icmp {
        return OK;
    }
    let l4off = pkt.l3off + if v4 { IPV4_LEN } else { IPV6_LEN };
    let tcp = pkt.flow.proto == PROTO_TCP;
    // verifier: one bounds check covers the ports and the checksum of
    // either header.
    let ports = if tcp {
        ptr_at::<TcpHdr>(ctx, l4off).map(<*mut TcpHdr>::cast::<u8>)
    } else {
        ptr_at::<UdpHdr>(ctx, l4off).map(<*mut UdpHdr>::cast::<u8>)
    };
    let Some(l4) = ports else {
        return aborted();
    };
    let at = if tcp { TCP_CHECK } else { UDP_CHECK };
    // SAFETY: bounds checked by ptr_at: 20 (TCP) or 8 (UDP) bytes from l4.
    unsafe {
        let p = l4.cast::<u16>();
        let old_sport = p.read_unaligned();
        let old_dport = p.add(1).read_unaligned();
        p.write_unaligned(to.sport);
        p.add(1).write_unaligned(to.dport);
        let check = l4.add(at).cast::<u16>();
        let old = check.read_unaligned();
        // RFC 768: an IPv4 UDP checksum of 0 means none; it stays none.
        if !tcp && v4 && old == 0 {
            return OK;
        }
        let d = addrs + diff16(old_sport, to.sport) + diff16(old_dport, to.dport);
        let mut new = apply(old, d);
        // RFC 768: a computed UDP checksum of 0 is sent as all ones.
        if !tcp && new == 0 {
            new = 0xffff;
        }
        check.write_unaligned(new);
    }
    OK
}

/// [`rewrite`]'s answer when the packet may be sent: no verdict word is
/// all ones (a BPF call returns one register, so not a `Result`).
pub(crate) const OK: u32 = u32::MAX;

/// The IPv4 header: addresses, TTL, header checksum. Returns the address
/// change as a checksum difference.
#[inline(always)]
fn ipv4(ctx: &XdpContext, l3off: usize, to: &To) -> Result<u64, u32> {
    let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, l3off) else {
        return Err(aborted());
    };
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &mut *ip };
    if ip.ttl <= 1 {
        return Err(pass(Stat::PassNatTtl));
    }
    let (src, dst) = (word(to.src, 0), word(to.dst, 0));
    let addrs = diff32(word(&ip.saddr, 0), src) + diff32(word(&ip.daddr, 0), dst);
    // TTL and protocol share a 16-bit word.
    let ttl = &raw mut ip.ttl;
    // SAFETY: two bytes of the header, read as one word.
    let old_ttl = unsafe { ttl.cast::<u16>().read_unaligned() };
    ip.ttl -= 1;
    // SAFETY: as above.
    let new_ttl = unsafe { ttl.cast::<u16>().read_unaligned() };
    let check = u16::from_ne_bytes(ip.check);
    ip.check = apply(check, addrs + diff16(old_ttl, new_ttl)).to_ne_bytes();
    ip.saddr = src.to_ne_bytes();
    ip.daddr = dst.to_ne_bytes();
    Ok(addrs)
}

/// The IPv6 header: addresses and hop limit (no header checksum).
#[inline(always)]
fn ipv6(ctx: &XdpContext, l3off: usize, to: &To) -> Result<u64, u32> {
    let Some(ip) = ptr_at::<Ipv6Hdr>(ctx, l3off) else {
        return Err(aborted());
    };
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &mut *ip };
    if ip.hop_limit <= 1 {
        return Err(pass(Stat::PassNatTtl));
    }
    let mut addrs = 0;
    let mut i = 0;
    while i < 4 {
        addrs += diff32(word(&ip.saddr, i), word(to.src, i));
        addrs += diff32(word(&ip.daddr, i), word(to.dst, i));
        i += 1;
    }
    ip.hop_limit -= 1;
    copy_addr(&mut ip.saddr, to.src);
    copy_addr(&mut ip.daddr, to.dst);
    Ok(addrs)
}

/// The checksum difference of a 32-bit word changing: the old word's
/// complement plus the new word (RFC 1624).
#[inline(always)]
pub(super) fn diff32(old: u32, new: u32) -> u64 {
    u64::from(!old) + u64::from(new)
}

/// The checksum difference of a 16-bit word changing.
#[inline(always)]
pub(super) fn diff16(old: u16, new: u16) -> u64 {
    u64::from(!old) + u64::from(new)
}

/// `check` after a change whose difference is `d`, both in memory order:
/// HC' = ~(~HC + Σ~m + Σm') (RFC 1624, eqn. 3), folded to 16 bits.
#[inline(always)]
pub(super) fn apply(check: u16, d: u64) -> u16 {
    let mut s = u64::from(!check) + d;
    s = (s & 0xffff_ffff) + (s >> 32);
    s = (s & 0xffff_ffff) + (s >> 32);
    let mut t = (s & 0xffff) + (s >> 16);
    t = (t & 0xffff) + (t >> 16);
    t = (t & 0xffff) + (t >> 16);
    !(t as u16)
}
