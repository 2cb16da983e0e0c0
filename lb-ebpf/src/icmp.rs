//! ICMP about VIPs, as Katran handles it:
//!
//! - errors a router sends about a packet a backend sent from a VIP (DSR
//!   replies leave from the VIP): IPv4 "destination unreachable" (among
//!   them "fragmentation needed", path-MTU discovery) and "time exceeded",
//!   ICMPv6 "destination unreachable", "packet too big" and "time
//!   exceeded". The quoted header is the backend's packet (VIP → client), so
//!   the flow is its reverse (client → VIP): found in conntrack, else in the
//!   table, and the ICMP message goes to that backend like the flow's own
//!   packets. Never inserted, never judged by the guard.
//! - echo requests to a VIP address are answered here (`XDP_TX`), so a
//!   VIP answers ping wherever its address is configured; unless their
//!   source is on the global deny list, or this CPU's reply budget is spent
//!   (`reply.rs`, which also bounds "fragmentation needed").
//! - any other ICMP to a VIP address (neighbour discovery, redirects, an
//!   error about no VIP flow, ...) is unbalanced: dropped
//!   (`drop_vip_unbalanced`), since the host would route it back to the
//!   router, or passed to the host's stack (`pass_icmp`) where a VIP at the
//!   address sets `host_services`.
//! - a client packet too large to encapsulate is answered with
//!   "fragmentation needed" (IPv4 with DF) or "packet too big" (IPv6)
//!   carrying the largest inner packet that fits, so the client's path-MTU
//!   discovery shrinks its packets instead of retrying into a silent drop;
//!   so is a NAT packet, either way, too large for its next hop (`nat`).
//! - an error to an address that is no VIP's, quoting a TCP/UDP packet
//!   from that address, may be about a `preserve_client` NAT flow
//!   ([`TRANSIT`]); otherwise it is the host's traffic (`pass_not_vip`).

use aya_ebpf::{
    helpers::{bpf_xdp_adjust_head, bpf_xdp_adjust_tail},
    programs::XdpContext,
};
use lb_common::{ENCAP_TTL, FAMILY_V4, FAMILY_V6, PROTO_TCP, PROTO_UDP, SCOPE_GLOBAL, Stat};

use crate::{
    checksum, guard,
    packet::{
        ETH_LEN, ICMP_DEST_UNREACH, ICMP_ECHO, ICMP_ECHO_REPLY, ICMP_FRAG_NEEDED, ICMP_LEN,
        ICMP_TIME_EXCEEDED, ICMP6_DEST_UNREACH, ICMP6_ECHO_REPLY, ICMP6_ECHO_REQUEST,
        ICMP6_PACKET_TOO_BIG, ICMP6_TIME_EXCEEDED, IPV4_LEN, IPV4_VERSION_IHL, IPV6_LEN, IcmpHdr,
        Ipv4Hdr, Ipv6Hdr, VLAN_LEN, copy_l2, len, ptr_at, swap_macs,
    },
    parse::{Packet, unbalanced, unbalanced_at},
    reply,
    select::vip_addr,
    stats::{count, drop_with, pass, tx},
};

pub(crate) const PROTO_ICMP: u8 = 1;
pub(crate) const PROTO_ICMP6: u8 = 58;

/// Bytes of the offending packet quoted in the errors xlb sends: its IP
/// header and the first 8 bytes behind it (RFC 792; RFC 4443 asks for as
/// much as fits in 1280 bytes, and these are the bytes a stack matches on).
const QUOTE4: usize = IPV4_LEN + 8;
const QUOTE6: usize = IPV6_LEN + 8;

/// [`v4`]/[`v6`]'s answer for an error about a VIP flow: `pkt.flow` now
/// holds that flow (not an XDP action).
pub(crate) const QUOTED: u32 = u32::MAX;
/// [`v4`]/[`v6`]'s answer for an error to an address that is no VIP's,
/// quoting a TCP/UDP packet from that address: `pkt.flow` holds the quoted
/// packet reversed, maybe a `preserve_client` NAT flow's answer
/// (`nat::reply::transit`); not an XDP action.
pub(crate) const TRANSIT: u32 = u32::MAX - 1;

/// The ICMP message of the IPv4 packet `pkt` (its destination parsed):
/// [`QUOTED`] with `pkt.flow` the quoted flow reversed and `pkt.icmp` set,
/// or the verdict, counted (echo answered, anything else passed).
// verifier: not inlined into the parser, so its branches add to the
// verifier's work instead of multiplying the main path's; it forwards
// nothing itself, so its frame never sits between the main one and
// `nexthop`'s.
#[inline(never)]
pub(crate) fn v4(ctx: &XdpContext, pkt: &mut Packet) -> u32 {
    let l4off = pkt.l3off + IPV4_LEN;
    let end = pkt.l3off + pkt.ip_len;
    let kind = kind_at(ctx, l4off, end);
    let handled = kind == Some(ICMP_ECHO)
        || kind == Some(ICMP_DEST_UNREACH)
        || kind == Some(ICMP_TIME_EXCEEDED);
    if !handled {
        return unbalanced(&pkt.flow.dst, FAMILY_V4, Stat::PassIcmp);
    }
    let bits = vip_addr(&pkt.flow.dst, FAMILY_V4);
    if kind == Some(ICMP_ECHO) {
        return match bits {
            Some(_) => echo4(ctx, pkt, l4off),
            None => pass(Stat::PassNotVip),
        };
    }
    if l4off + ICMP_LEN + IPV4_LEN + 4 > end {
        return not_quoted(bits);
    }
    let Some(q) = ptr_at::<Ipv4Hdr>(ctx, l4off + ICMP_LEN) else {
        return not_quoted(bits);
    };
    let Some(ports) = ptr_at::<[[u8; 2]; 2]>(ctx, l4off + ICMP_LEN + IPV4_LEN) else {
        return not_quoted(bits);
    };
    // SAFETY: bounds checked by ptr_at.
    let (q, ports) = unsafe { (&*q, &*ports) };
    let proto = q.protocol;
    if q.version_ihl != IPV4_VERSION_IHL
        || (proto != PROTO_TCP && proto != PROTO_UDP)
        || q.saddr != pkt.flow.dst[..4]
    {
        return not_quoted(bits);
    }
    pkt.flow.src[..4].copy_from_slice(&q.daddr);
    quoted(pkt, proto, ports, bits.is_none())
}

/// The ICMPv6 message of the IPv6 packet `pkt`, as [`v4`].
#[inline(never)]
pub(crate) fn v6(ctx: &XdpContext, pkt: &mut Packet) -> u32 {
    let l4off = pkt.l3off + IPV6_LEN;
    let end = pkt.l3off + pkt.ip_len;
    let kind = kind_at(ctx, l4off, end);
    let handled = kind == Some(ICMP6_DEST_UNREACH)
        || kind == Some(ICMP6_PACKET_TOO_BIG)
        || kind == Some(ICMP6_TIME_EXCEEDED)
        || kind == Some(ICMP6_ECHO_REQUEST);
    if !handled {
        return unbalanced(&pkt.flow.dst, FAMILY_V6, Stat::PassIcmp);
    }
    let bits = vip_addr(&pkt.flow.dst, FAMILY_V6);
    if kind == Some(ICMP6_ECHO_REQUEST) {
        return match bits {
            Some(_) => echo6(ctx, pkt, l4off),
            None => pass(Stat::PassNotVip),
        };
    }
    if l4off + ICMP_LEN + IPV6_LEN + 4 > end {
        return not_quoted(bits);
    }
    let Some(q) = ptr_at::<Ipv6Hdr>(ctx, l4off + ICMP_LEN) else {
        return not_quoted(bits);
    };
    let Some(ports) = ptr_at::<[[u8; 2]; 2]>(ctx, l4off + ICMP_LEN + IPV6_LEN) else {
        return not_quoted(bits);
    };
    // SAFETY: bounds checked by ptr_at.
    let (q, ports) = unsafe { (&*q, &*ports) };
    let proto = q.nexthdr;
    if (proto != PROTO_TCP && proto != PROTO_UDP) || q.saddr != pkt.flow.dst {
        return not_quoted(bits);
    }
    pkt.flow.src = q.daddr;
    quoted(pkt, proto, ports, bits.is_none())
}

/// The type of the ICMP message at `l4off`, if its header lies inside the
/// IP packet (which ends at `end`: bytes behind it, padding or junk, are no
/// part of the message even where the frame has them).
#[inline(always)]
fn kind_at(ctx: &XdpContext, l4off: usize, end: usize) -> Option<u8> {
    if l4off + ICMP_LEN > end {
        return None;
    }
    let h = ptr_at::<IcmpHdr>(ctx, l4off)?;
    // SAFETY: bounds checked by ptr_at.
    Some(unsafe { (*h).kind })
}

/// Completes `pkt.flow` (its client address already set) as the quoted
/// packet's reverse, and marks `pkt` an error about that flow: counted
/// [`QUOTED`] when it is to a VIP address, [`TRANSIT`] (not yet counted)
/// when `transit`.
#[inline(always)]
fn quoted(pkt: &mut Packet, proto: u8, ports: &[[u8; 2]; 2], transit: bool) -> u32 {
    let f = &mut pkt.flow;
    f.proto = proto;
    f.sport = u16::from_ne_bytes(ports[1]);
    f.dport = u16::from_ne_bytes(ports[0]);
    pkt.icmp = true;
    if transit {
        return TRANSIT;
    }
    count(Stat::IcmpQuoted);
    QUOTED
}

/// The verdict for an ICMP error whose quote is no TCP/UDP packet from its
/// destination: to a VIP address (`bits`), unbalanced; to another, passed
/// as the host's traffic.
#[inline(always)]
fn not_quoted(bits: Option<u32>) -> u32 {
    match bits {
        Some(bits) => unbalanced_at(bits, Stat::PassIcmp),
        None => pass(Stat::PassNotVip),
    }
}

/// Whether the echo request `pkt` (its source set) may be answered: not
/// from a source on the global deny list (unless allowed), and within this
/// CPU's reply budget. `None`: yes; else the verdict, counted. The VIP
/// lists are not consulted: an echo request is to the address, which
/// several VIPs (each with its own list) may share.
#[inline(always)]
fn echo_refused(pkt: &Packet) -> Option<u32> {
    if guard::denied(pkt, SCOPE_GLOBAL).is_some() {
        return Some(drop_with(Stat::DropDenied));
    }
    if !reply::allowed() {
        return Some(reply::limited());
    }
    None
}

/// Answers the IPv4 echo request at `l4off` in place.
#[inline(always)]
fn echo4(ctx: &XdpContext, pkt: &mut Packet, l4off: usize) -> u32 {
    let (Some(ip), Some(h)) = (
        ptr_at::<Ipv4Hdr>(ctx, pkt.l3off),
        ptr_at::<IcmpHdr>(ctx, l4off),
    ) else {
        return drop_with(Stat::DropBadL4);
    };
    // SAFETY: bounds checked by ptr_at; the headers do not overlap.
    let (ip, h) = unsafe { (&mut *ip, &mut *h) };
    pkt.flow.src[..4].copy_from_slice(&ip.saddr);
    if let Some(v) = echo_refused(pkt) {
        return v;
    }
    core::mem::swap(&mut ip.saddr, &mut ip.daddr);
    ip.ttl = ENCAP_TTL;
    ip.check = [0; 2];
    ip.check = checksum::ipv4_header(ip).to_be_bytes();
    let old = u16::from_be_bytes([h.kind, h.code]);
    h.kind = ICMP_ECHO_REPLY;
    let new = u16::from_be_bytes([h.kind, h.code]);
    h.check = checksum::replace(u16::from_be_bytes(h.check), old, new).to_be_bytes();
    reply(ctx, Stat::IcmpEchoReply)
}

/// Answers the ICMPv6 echo request at `l4off` in place (the pseudo-header's
/// addresses only trade places: the checksum changes with the type alone).
#[inline(always)]
fn echo6(ctx: &XdpContext, pkt: &mut Packet, l4off: usize) -> u32 {
    let (Some(ip), Some(h)) = (
        ptr_at::<Ipv6Hdr>(ctx, pkt.l3off),
        ptr_at::<IcmpHdr>(ctx, l4off),
    ) else {
        return drop_with(Stat::DropBadL4);
    };
    // SAFETY: bounds checked by ptr_at; the headers do not overlap.
    let (ip, h) = unsafe { (&mut *ip, &mut *h) };
    pkt.flow.src = ip.saddr;
    if let Some(v) = echo_refused(pkt) {
        return v;
    }
    core::mem::swap(&mut ip.saddr, &mut ip.daddr);
    ip.hop_limit = ENCAP_TTL;
    let old = u16::from_be_bytes([h.kind, h.code]);
    h.kind = ICMP6_ECHO_REPLY;
    let new = u16::from_be_bytes([h.kind, h.code]);
    h.check = checksum::replace(u16::from_be_bytes(h.check), old, new).to_be_bytes();
    reply(ctx, Stat::IcmpEchoReply)
}

/// Sends the frame back where it came from, counted as `stat`.
#[inline(always)]
fn reply(ctx: &XdpContext, stat: Stat) -> u32 {
    if swap_macs(ctx).is_none() {
        return drop_with(Stat::DropBadL4);
    }
    tx(stat)
}

/// The packet `pkt` does not fit its next hop (a client's once
/// encapsulated, or a NAT packet either way, `nat::TOO_BIG`): answers its
/// sender with "fragmentation needed" (IPv4, DF set) or "packet too big"
/// (IPv6) saying `mtu`, built in place, from the address the packet was
/// sent to; an IPv4 packet without DF cannot be told and is dropped
/// (`drop_too_big`).
// verifier: a function of its own, so its headers are built on its own
// stack frame, not on the 512 bytes the parser and forwarding share.
#[inline(never)]
pub(crate) fn too_big(ctx: &XdpContext, pkt: &Packet, mtu: u32) -> u32 {
    let v4 = pkt.flow.family == FAMILY_V4;
    let room = if v4 { IPV4_LEN } else { IPV6_LEN } + ICMP_LEN;
    if !may_tell(ctx, pkt) {
        return drop_with(Stat::DropTooBig);
    }
    if !reply::allowed() {
        return reply::limited();
    }
    // Room for the new IP and ICMP headers in front of the offending
    // packet, the L2 header moved to the new front, the rest trimmed to
    // the quote.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(room as i32)) } != 0 {
        return drop_with(Stat::DropNoHeadroom);
    }
    let moved = if pkt.l3off == ETH_LEN {
        copy_l2::<ETH_LEN>(ctx, room, 0)
    } else {
        copy_l2::<{ ETH_LEN + VLAN_LEN }>(ctx, room, 0)
    };
    let quote = if v4 { QUOTE4 } else { QUOTE6 };
    let want = pkt.l3off + room + quote;
    let have = len(ctx);
    if moved.is_none() || have < want {
        return drop_with(Stat::DropTooBig);
    }
    if unsafe { bpf_xdp_adjust_tail(ctx.ctx, -((have - want) as i32)) } != 0 {
        return drop_with(Stat::DropTooBig);
    }
    let written = if v4 {
        too_big4(ctx, pkt.l3off, mtu)
    } else {
        too_big6(ctx, pkt.l3off, mtu)
    };
    if written.is_none() {
        return drop_with(Stat::DropTooBig);
    }
    reply(ctx, Stat::IcmpTooBig)
}

/// Whether the sender of `pkt` may be told its packet is too big: IPv6,
/// or IPv4 with DF set (without DF it asked routers to fragment, which
/// XDP cannot do; RFC 1191 sends "fragmentation needed" only with DF).
#[inline(always)]
pub(crate) fn may_tell(ctx: &XdpContext, pkt: &Packet) -> bool {
    if pkt.flow.family != FAMILY_V4 {
        return true;
    }
    // SAFETY: bounds checked by ptr_at.
    ptr_at::<Ipv4Hdr>(ctx, pkt.l3off)
        .is_some_and(|ip| unsafe { u16::from_be_bytes((*ip).frag_off) } & 0x4000 != 0)
}

/// The IPv4 header, ICMP header and quote of "fragmentation needed".
#[inline(always)]
fn too_big4(ctx: &XdpContext, l3off: usize, mtu: u32) -> Option<()> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, l3off)?;
    let h = ptr_at::<IcmpHdr>(ctx, l3off + IPV4_LEN)?;
    let q = ptr_at::<[u8; QUOTE4]>(ctx, l3off + IPV4_LEN + ICMP_LEN)?;
    // SAFETY: bounds checked by ptr_at; the three do not overlap.
    let (ip, h, q) = unsafe { (&mut *ip, &mut *h, &*q) };
    *ip = Ipv4Hdr {
        version_ihl: IPV4_VERSION_IHL,
        tot_len: ((IPV4_LEN + ICMP_LEN + QUOTE4) as u16).to_be_bytes(),
        ttl: ENCAP_TTL,
        protocol: PROTO_ICMP,
        // From the VIP the packet was sent to, back to its sender.
        saddr: [q[16], q[17], q[18], q[19]],
        daddr: [q[12], q[13], q[14], q[15]],
        ..Ipv4Hdr::default()
    };
    ip.check = checksum::ipv4_header(ip).to_be_bytes();
    let mtu = (mtu.min(u32::from(u16::MAX)) as u16).to_be_bytes();
    *h = IcmpHdr {
        kind: ICMP_DEST_UNREACH,
        code: ICMP_FRAG_NEEDED,
        check: [0; 2],
        rest: [0, 0, mtu[0], mtu[1]],
    };
    h.check = checksum::icmp(0, h, q).to_be_bytes();
    Some(())
}

/// The IPv6 header, ICMPv6 header and quote of "packet too big".
#[inline(always)]
fn too_big6(ctx: &XdpContext, l3off: usize, mtu: u32) -> Option<()> {
    let ip = ptr_at::<Ipv6Hdr>(ctx, l3off)?;
    let h = ptr_at::<IcmpHdr>(ctx, l3off + IPV6_LEN)?;
    let q = ptr_at::<[u8; QUOTE6]>(ctx, l3off + IPV6_LEN + ICMP_LEN)?;
    // SAFETY: bounds checked by ptr_at; the three do not overlap.
    let (ip, h, q) = unsafe { (&mut *ip, &mut *h, &*q) };
    let mut saddr = [0u8; 16];
    let mut daddr = [0u8; 16];
    saddr.copy_from_slice(&q[24..40]);
    daddr.copy_from_slice(&q[8..24]);
    let payload = (ICMP_LEN + QUOTE6) as u16;
    *ip = Ipv6Hdr {
        version_tc_flow: [0x60, 0, 0, 0],
        payload_len: payload.to_be_bytes(),
        nexthdr: PROTO_ICMP6,
        hop_limit: ENCAP_TTL,
        saddr,
        daddr,
    };
    *h = IcmpHdr {
        kind: ICMP6_PACKET_TOO_BIG,
        code: 0,
        check: [0; 2],
        rest: mtu.to_be_bytes(),
    };
    let pseudo = checksum::sum(&ip.saddr)
        + checksum::sum(&ip.daddr)
        + u32::from(payload)
        + u32::from(PROTO_ICMP6);
    h.check = checksum::icmp(pseudo, h, q).to_be_bytes();
    Some(())
}
