//! Translating a NAT packet in place: addresses, ports and TTL / hop
//! limit, with every checksum that covers them updated incrementally
//! (RFC 1624): the IPv4 header's, and the TCP/UDP checksum's pseudo-header
//! and ports, so the payload is never summed.

use aya_ebpf::programs::XdpContext;
use lb_common::{FAMILY_V4, PROTO_TCP, Stat};

use crate::{
    checksum,
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

/// Rewrites `pkt` (parsed, TCP or UDP) to `to` and decrements its TTL /
/// hop limit. `Err` holds the verdict when it may not be sent: a TTL that
/// would reach 0 is passed to the host (counted `pass_nat_ttl`), which
/// answers "time exceeded" as any router on the path would.
#[inline(always)]
pub(crate) fn rewrite(ctx: &XdpContext, pkt: &Packet, to: &To) -> Result<(), u32> {
    let v4 = pkt.flow.family == FAMILY_V4;
    // The pseudo-header's part of the change: both addresses.
    let addrs = if v4 {
        ipv4(ctx, pkt.l3off, to)?
    } else {
        ipv6(ctx, pkt.l3off, to)?
    };
    let l4off = pkt.l3off + if v4 { IPV4_LEN } else { IPV6_LEN };
    let tcp = pkt.flow.proto == PROTO_TCP;
    // verifier: one bounds check covers the ports and the checksum of
    // either header.
    let ports = if tcp {
        ptr_at::<TcpHdr>(ctx, l4off).map(|p| p.cast::<u8>())
    } else {
        ptr_at::<UdpHdr>(ctx, l4off).map(|p| p.cast::<u8>())
    };
    let Some(l4) = ports else {
        return Err(aborted());
    };
    let at = if tcp { TCP_CHECK } else { UDP_CHECK };
    // SAFETY: bounds checked by ptr_at: 20 (TCP) or 8 (UDP) bytes from l4.
    unsafe {
        let old_sport = l4.cast::<u16>().read_unaligned();
        let old_dport = l4.add(2).cast::<u16>().read_unaligned();
        l4.cast::<u16>().write_unaligned(to.sport);
        l4.add(2).cast::<u16>().write_unaligned(to.dport);
        let check = l4.add(at).cast::<[u8; 2]>();
        let old = u16::from_be_bytes(*check);
        // RFC 768: an IPv4 UDP checksum of 0 means none; it stays none.
        if !tcp && v4 && old == 0 {
            return Ok(());
        }
        let d = addrs
            + diff16(u16::from_be(old_sport), u16::from_be(to.sport))
            + diff16(u16::from_be(old_dport), u16::from_be(to.dport));
        let mut new = apply(old, d);
        // RFC 768: a computed UDP checksum of 0 is sent as all ones.
        if !tcp && new == 0 {
            new = 0xffff;
        }
        *check = new.to_be_bytes();
    }
    Ok(())
}

/// The IPv4 header: addresses, TTL, header checksum. Returns the address
/// change as a checksum difference.
#[inline(always)]
fn ipv4(ctx: &XdpContext, l3off: usize, to: &To) -> Result<u32, u32> {
    let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, l3off) else {
        return Err(aborted());
    };
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &mut *ip };
    if ip.ttl <= 1 {
        return Err(pass(Stat::PassNatTtl));
    }
    let src = v4(to.src);
    let dst = v4(to.dst);
    let addrs = diff(&ip.saddr, &src) + diff(&ip.daddr, &dst);
    let old_ttl = u16::from_be_bytes([ip.ttl, ip.protocol]);
    ip.ttl -= 1;
    let new_ttl = u16::from_be_bytes([ip.ttl, ip.protocol]);
    let check = u16::from_be_bytes(ip.check);
    ip.check = apply(check, addrs + diff16(old_ttl, new_ttl)).to_be_bytes();
    ip.saddr = src;
    ip.daddr = dst;
    Ok(addrs)
}

/// The IPv6 header: addresses and hop limit (no header checksum).
#[inline(always)]
fn ipv6(ctx: &XdpContext, l3off: usize, to: &To) -> Result<u32, u32> {
    let Some(ip) = ptr_at::<Ipv6Hdr>(ctx, l3off) else {
        return Err(aborted());
    };
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &mut *ip };
    if ip.hop_limit <= 1 {
        return Err(pass(Stat::PassNatTtl));
    }
    let addrs = diff(&ip.saddr, to.src) + diff(&ip.daddr, to.dst);
    ip.hop_limit -= 1;
    ip.saddr = *to.src;
    ip.daddr = *to.dst;
    Ok(addrs)
}

/// The first 4 bytes of an address: its IPv4 form.
#[inline(always)]
fn v4(a: &[u8; 16]) -> [u8; 4] {
    [a[0], a[1], a[2], a[3]]
}

/// The checksum difference of `N` bytes changing from `old` to `new`:
/// the sum of each old word's complement and each new word (RFC 1624).
#[inline(always)]
fn diff<const N: usize>(old: &[u8; N], new: &[u8; N]) -> u32 {
    let mut s = 0;
    let mut i = 0;
    while i + 1 < N {
        s += diff16(
            u16::from_be_bytes([old[i], old[i + 1]]),
            u16::from_be_bytes([new[i], new[i + 1]]),
        );
        i += 2;
    }
    s
}

/// The checksum difference of one 16-bit word changing.
#[inline(always)]
fn diff16(old: u16, new: u16) -> u32 {
    u32::from(!old) + u32::from(new)
}

/// `check` (host order) after a change whose difference is `d`:
/// HC' = ~(~HC + Σ~m + Σm') (RFC 1624, eqn. 3).
#[inline(always)]
fn apply(check: u16, d: u32) -> u16 {
    checksum::fold(u32::from(!check) + d)
}
