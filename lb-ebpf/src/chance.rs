//! Second chance, the load balancer's half: a TCP packet without SYN that
//! missed conntrack (its flow was balanced by another node, or by this one
//! before a restart) goes to its slot's current owner, as without second
//! chance, but with a second tunnel header inside the first addressed to
//! the slot's previous owner (`lb_common::RingSlot::prev_id`). The current
//! owner's decapsulator (`decap.rs`) keeps the packet if it has the
//! connection and otherwise passes it on to the previous owner, which may.
//!
//! Only the miss path reads any of this: a conntrack hit returns before
//! the table is read, so established flows pay nothing for it.

use aya_ebpf::{helpers::bpf_xdp_adjust_head, programs::XdpContext};
use lb_common::{
    BACKEND_DRAINING, BACKEND_UP, BackendInfo, FAMILY_V6, Globals, IPIP4_OVERHEAD, IPIP6_OVERHEAD,
    MODE_DSR_IPIP, PROTO_TCP, Stat, VipInfo, encap_hash, encap_hash_v4,
    trace::{TRACE_FLAG_CHANCE, VERDICT_BACKEND_SHIFT, flag_bits},
};

use crate::{
    XLB_BACKENDS, XLB_BE_STATS, XLB_VIP_STATS,
    conntrack::Target,
    encap::{self, ipip4_header, ipip6_header, spread_v4, vlan_tci, write_l2},
    forward::{account, nexthop, send, sent},
    key::word,
    packet::{ETH_P_IP, ETH_P_IPV6, Ipv4Hdr, Ipv6Hdr, len, ptr_at},
    parse::Packet,
    stats::{aborted, count, drop_with},
};

/// The previous owner `prev` of a missed TCP packet's slot, if the packet
/// gets a second chance: the VIP has it on (`dsr-ipip` only), and `prev`
/// is another backend that still takes its flows (up or draining), of the
/// current owner `be`'s family.
#[inline(always)]
pub(crate) fn previous(
    pkt: &Packet,
    vip: &VipInfo,
    id: u32,
    be: &BackendInfo,
    prev: u32,
) -> Option<&'static BackendInfo> {
    if prev == 0
        || prev == id
        || vip.second_chance == 0
        || vip.mode != MODE_DSR_IPIP
        || pkt.icmp
        || pkt.flow.proto != PROTO_TCP
    {
        return None;
    }
    let p = XLB_BACKENDS.get(prev)?;
    (p.family == be.family && (p.state == BACKEND_UP || p.state == BACKEND_DRAINING)).then_some(p)
}

/// Sends `pkt` to `t`'s backend inside two tunnel headers, the inner one
/// to `prev`, and counts it as `forward` does.
#[inline(always)]
pub(crate) fn forward(
    ctx: &XdpContext,
    pkt: &Packet,
    t: &Target,
    prev: &BackendInfo,
    g: &Globals,
    now: u64,
) -> u32 {
    let bytes = len(ctx) as u64;
    let verdict = if pkt.flow.family == FAMILY_V6 {
        encap_twice::<true>(ctx, pkt, t, prev, g, now)
    } else {
        encap_twice::<false>(ctx, pkt, t, prev, g, now)
    };
    if sent(verdict) {
        account(XLB_VIP_STATS.get_ptr_mut(t.vip_id), bytes, true);
        account(XLB_BE_STATS.get_ptr_mut(t.id), bytes, true);
    }
    verdict | t.id << VERDICT_BACKEND_SHIFT | flag_bits(TRACE_FLAG_CHANCE)
}

/// Outer, middle and the inner IPv4 header (its TOS is carried out).
#[repr(C)]
struct Ipip4Twice {
    outer: Ipv4Hdr,
    middle: Ipv4Hdr,
    inner: Ipv4Hdr,
}

/// Outer and middle IPv6 headers and the first word of the inner one.
#[repr(C)]
struct Ip6ip6Twice {
    outer: Ipv6Hdr,
    middle: Ipv6Hdr,
    inner_version_tc_flow: [u8; 4],
}

/// `encap::encap` with two headers: outer LB → current owner, middle LB →
/// previous owner, both from the LB's encapsulation source (the flow's
/// spread of it). A packet that fits the next hop's MTU with one header but
/// not with two goes with one (`second_chance_too_big`): the current owner
/// may have the connection, and the client is not told a smaller MTU for
/// the sake of a path it may not need.
#[inline(always)]
fn encap_twice<const V6: bool>(
    ctx: &XdpContext,
    pkt: &Packet,
    t: &Target,
    prev: &BackendInfo,
    g: &Globals,
    now: u64,
) -> u32 {
    let overhead = if V6 { IPIP6_OVERHEAD } else { IPIP4_OVERHEAD } as usize;
    let base = if V6 { &g.encap_src_v6 } else { &g.encap_src_v4 };
    // SAFETY: null or a per-CPU map value, valid for this run.
    let Some(nh) = (unsafe { nexthop(ctx, t.id, t.be, base, now).as_ref() }) else {
        return drop_with(Stat::DropNoRoute);
    };
    let outer_len = pkt.ip_len + 2 * overhead;
    if outer_len as u32 > nh.mtu {
        count(Stat::SecondChanceTooBig);
        return encap::encap::<V6>(ctx, pkt, t.id, t.be, g, now);
    }
    let Some(tci) = vlan_tci(ctx, pkt) else {
        return drop_with(Stat::DropNoHeadroom);
    };
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(2 * overhead as i32)) } != 0 {
        return drop_with(Stat::DropNoHeadroom);
    }
    let ethertype = if V6 { ETH_P_IPV6 } else { ETH_P_IP }.to_be_bytes();
    let Some(off) = write_l2(ctx, nh, ethertype, tci) else {
        return aborted();
    };
    let written = if V6 {
        let spread = encap_hash(&pkt.flow.src, pkt.flow.sport);
        headers6(ctx, off, pkt.ip_len, spread, g, &t.be.addr, &prev.addr)
    } else {
        let spread = encap_hash_v4(&pkt.flow.src, pkt.flow.sport);
        let src = spread_v4(word(&g.encap_src_v4, 0), g.encap_v4_host_bits, spread);
        headers4(
            ctx,
            off,
            pkt.ip_len,
            src,
            word(&t.be.addr, 0),
            word(&prev.addr, 0),
        )
    };
    if written.is_none() {
        return aborted();
    }
    count(Stat::SecondChance);
    send(ctx, nh)
}

/// The two IPv4 headers at `off`, in front of an inner packet of `inner`
/// bytes: outer `src` → `cur`, middle `src` → `prev` (words in memory order).
#[inline(always)]
fn headers4(
    ctx: &XdpContext,
    off: usize,
    inner: usize,
    src: u32,
    cur: u32,
    prev: u32,
) -> Option<()> {
    let h = ptr_at::<Ipip4Twice>(ctx, off)?;
    // SAFETY: bounds checked by ptr_at; written in place.
    let h = unsafe { &mut *h };
    let tos = h.inner.tos;
    let middle = inner + IPIP4_OVERHEAD as usize;
    ipip4_header(&mut h.middle, tos, middle as u16, src, prev);
    let outer = middle + IPIP4_OVERHEAD as usize;
    ipip4_header(&mut h.outer, tos, outer as u16, src, cur);
    Some(())
}

/// The two IPv6 headers at `off`, as [`headers4`]; both carry the inner
/// header's version and traffic class and the flow's label (`spread`).
#[inline(always)]
fn headers6(
    ctx: &XdpContext,
    off: usize,
    inner: usize,
    spread: u32,
    g: &Globals,
    cur: &[u8; 16],
    prev: &[u8; 16],
) -> Option<()> {
    let h = ptr_at::<Ip6ip6Twice>(ctx, off)?;
    // SAFETY: bounds checked by ptr_at; written in place.
    let h = unsafe { &mut *h };
    let i = h.inner_version_tc_flow;
    let first = [
        i[0],
        (i[1] & 0xf0) | ((spread >> 16) & 0x0f) as u8,
        (spread >> 8) as u8,
        spread as u8,
    ];
    ipip6_header(&mut h.middle, first, inner as u16, &g.encap_src_v6, prev);
    let outer = inner + IPIP6_OVERHEAD as usize;
    ipip6_header(&mut h.outer, first, outer as u16, &g.encap_src_v6, cur);
    Some(())
}
