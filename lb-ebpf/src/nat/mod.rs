//! NAT mode (issue 27): both directions of a flow cross the load balancer.
//! A client's packet to a NAT VIP leaves from a pool address and an
//! allocated port (`MODE_NAT`), or from the client's own (`MODE_NAT_PRESERVE`),
//! to the backend's address and port; the backend's answer is translated
//! back (`reply.rs`). The flow's state lives in `XLB_NAT_FLOWS` (by the
//! client's key) and `XLB_NAT_REPLY` (by the reply's), never in `XLB_CT`,
//! so DSR's established path pays nothing for it.
//!
//! Policy (tested by `tests/tests/fixtures/nat*.rs`):
//! - a TCP SYN or any UDP packet of no flow starts one: judged by the
//!   guard, a backend picked from the table as in DSR modes, a source
//!   allocated (`alloc.rs`). Nothing free: a SYN is answered with a RST
//!   (`reset_nat_exhausted`), UDP dropped (`drop_nat_exhausted`);
//! - a TCP packet without SYN of no flow is dropped (`drop_nat_no_flow`):
//!   it has no port to leave from;
//! - a flow keeps its backend while the backend's id and generation hold,
//!   whatever its health (like `down_policy = "keep"`: a NAT flow cannot
//!   move without breaking); a recycled id makes it stale (`nat_stale`);
//! - a SYN on a closed or expired flow starts it again; on a live one it
//!   follows the flow (a retransmit);
//! - TTL / hop limit ≤ 1: passed to the host (`pass_nat_ttl`), larger than
//!   the egress MTU: dropped (`drop_nat_too_big`), either way;
//! - ICMP errors quoting a NAT flow are dropped (`drop_nat_icmp`): not
//!   translated yet.

mod alloc;
pub(crate) mod reply;
mod rewrite;

use aya_ebpf::programs::XdpContext;
use lb_common::{
    BackendInfo, FAMILY_V4, Globals, PROTO_TCP, Stat, VipInfo,
    nat::{
        Evidence, MODE_NAT_PRESERVE, NAT_TCP_CLOSED, NAT_TCP_CLOSING, NAT_TCP_SYN_SENT, NAT_UDP,
        NatFlow, NatPool, is_nat, reply_key,
    },
    trace::VERDICT_BACKEND_SHIFT,
};

use crate::{
    XLB_BACKENDS, XLB_BE_STATS, XLB_GUARD, XLB_NAT_FLOWS, XLB_NAT_POOL, XLB_NAT_REPLY,
    XLB_PASSIVE, XLB_VIP_STATS,
    forward::{account, nexthop, send, sent, set_macs},
    guard,
    packet::{IPV4_LEN, IPV6_LEN, TcpHdr, ptr_at},
    parse::Packet,
    reset, select,
    stats::{aborted, count, drop_with},
};

/// The verdict for a packet to a port some NAT VIP listens on, if its VIP
/// is a NAT VIP (`None`: a DSR VIP on the same port; the caller goes on).
#[inline(always)]
pub(crate) fn client(ctx: &XdpContext, pkt: &Packet, g: &Globals, now: u64) -> Option<u32> {
    let (vip_id, vip) = select::vip(&pkt.flow)?;
    if !is_nat(vip.mode) {
        return None;
    }
    if pkt.icmp {
        return Some(drop_with(Stat::DropNatIcmp));
    }
    let Some(pool) = XLB_NAT_POOL.get(vip_id) else {
        return Some(aborted());
    };
    if let Some(f) = XLB_NAT_FLOWS.get_ptr_mut(&pkt.flow) {
        // SAFETY: a hash map value, valid for the program's run (RCU);
        // racing writers store whole fields.
        let f = unsafe { &mut *f };
        if let Some(be) = usable(pkt, f, pool, now) {
            return Some(translate(ctx, pkt, f, be, pool, now, false));
        }
    }
    Some(new_flow(ctx, pkt, vip_id, &vip, pool, g, now))
}

/// The backend of existing flow `f`, or `None` once the flow is removed
/// (its backend recycled, or a SYN on a closed or expired flow).
#[inline(always)]
fn usable(
    pkt: &Packet,
    f: &NatFlow,
    pool: &NatPool,
    now: u64,
) -> Option<&'static BackendInfo> {
    let be = XLB_BACKENDS.get(f.backend_id);
    let stale = match be {
        Some(be) => be.state == 0 || be.generation != f.generation,
        None => true,
    };
    if stale {
        count(Stat::NatStale);
    } else if !pkt.syn()
        || (now < f.expires(pool) && f.state != NAT_TCP_CLOSED && f.state != NAT_TCP_CLOSING)
    {
        return be;
    }
    // The flow ends here: its port goes back to the pool.
    passive(f.backend_id, &f.reclaimed(pool, now));
    if let Some(be) = be {
        let _ = XLB_NAT_REPLY.remove(&reply_key(&pkt.flow, f, &be.addr));
    }
    let _ = XLB_NAT_FLOWS.remove(&pkt.flow);
    None
}

/// A packet of no flow: starts one if it may.
#[inline(always)]
fn new_flow(
    ctx: &XdpContext,
    pkt: &Packet,
    vip_id: u32,
    vip: &VipInfo,
    pool: &NatPool,
    g: &Globals,
    now: u64,
) -> u32 {
    let tcp = pkt.flow.proto == PROTO_TCP;
    if tcp && !pkt.syn() {
        return drop_with(Stat::DropNatNoFlow);
    }
    let Some(gd) = XLB_GUARD.get(vip_id) else {
        return aborted();
    };
    if guard::active(gd) {
        let judged = guard::judge(ctx, pkt, vip_id, gd, now);
        if judged != guard::ADMITTED {
            return judged;
        }
    }
    let Some((id, be, _)) = select::pick(&pkt.flow, vip, g) else {
        return drop_with(Stat::DropNoBackend);
    };
    let preserve = vip.mode == MODE_NAT_PRESERVE;
    let mut f = NatFlow {
        backend_id: id,
        generation: be.generation,
        vip_id,
        state: if tcp { NAT_TCP_SYN_SENT } else { NAT_UDP },
        flags: 0,
        nat_port: if preserve { pkt.flow.sport } else { 0 },
        nat_addr: if preserve { pkt.flow.src } else { [0; 16] },
        // 0: the daemon set no port; the VIP's.
        backend_port: if be.port != 0 { be.port } else { pkt.flow.dport },
        _pad: [0; 6],
        last_seen_ns: now,
        request_ns: 0,
    };
    let hash = lb_common::flow_hash(&g.hash_key, &pkt.flow);
    if alloc::allocate(&pkt.flow, &mut f, pool, hash, preserve).is_err() {
        return if tcp {
            reset::reply(ctx, pkt, Stat::ResetNatExhausted, Stat::DropNatExhausted)
        } else {
            drop_with(Stat::DropNatExhausted)
        };
    }
    if XLB_NAT_FLOWS.insert(&pkt.flow, &f, 0).is_err() {
        let _ = XLB_NAT_REPLY.remove(&reply_key(&pkt.flow, &f, &be.addr));
        return drop_with(Stat::DropNatInsertFail);
    }
    count(Stat::NatNew);
    if tcp && let Some(s) = XLB_PASSIVE.get_ptr_mut(id) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { (*s).connects += 1 };
    }
    let Some(e) = XLB_NAT_FLOWS.get_ptr_mut(&pkt.flow) else {
        return aborted();
    };
    // SAFETY: as in `client`.
    translate(ctx, pkt, unsafe { &mut *e }, be, pool, now, true)
}

/// Updates flow `f` with the client's packet, translates it towards the
/// backend `be` and sends it.
#[inline(always)]
fn translate(
    ctx: &XdpContext,
    pkt: &Packet,
    f: &mut NatFlow,
    be: &BackendInfo,
    pool: &NatPool,
    now: u64,
    new_flow: bool,
) -> u32 {
    let ev = f.client_packet(pool, pkt.tcp_flags, payload(ctx, pkt), now);
    passive(f.backend_id, &ev);
    let id = f.backend_id;
    // SAFETY: null or a per-CPU map value, valid for this run.
    let Some(nh) = (unsafe { nexthop(ctx, id, be, &f.nat_addr, now).as_ref() }) else {
        return drop_with(Stat::DropNoRoute);
    };
    if pkt.ip_len > nh.mtu as usize {
        return drop_with(Stat::DropNatTooBig);
    }
    let to = rewrite::To {
        src: &f.nat_addr,
        dst: &be.addr,
        sport: f.nat_port,
        dport: f.backend_port,
    };
    if let Err(v) = rewrite::rewrite(ctx, pkt, &to) {
        return v;
    }
    if set_macs(ctx, nh).is_none() {
        return aborted();
    }
    let bytes = crate::packet::len(ctx) as u64;
    let verdict = send(ctx, nh);
    if sent(verdict) {
        account(XLB_VIP_STATS.get_ptr_mut(f.vip_id), bytes, new_flow);
        account(XLB_BE_STATS.get_ptr_mut(id), bytes, new_flow);
    }
    verdict | id << VERDICT_BACKEND_SHIFT
}

/// Whether `pkt` (TCP or UDP, parsed) carries payload.
#[inline(always)]
pub(crate) fn payload(ctx: &XdpContext, pkt: &Packet) -> bool {
    let ip_hdr = if pkt.flow.family == FAMILY_V4 {
        IPV4_LEN
    } else {
        IPV6_LEN
    };
    let l4 = if pkt.flow.proto != PROTO_TCP {
        // The parser checked the UDP length against the packet's.
        8
    } else {
        match ptr_at::<TcpHdr>(ctx, pkt.l3off + ip_hdr) {
            // SAFETY: bounds checked by ptr_at.
            Some(t) => unsafe { (*t).header_len() },
            None => return false,
        }
    };
    pkt.ip_len > ip_hdr + l4
}

/// Adds `ev` to backend `id`'s passive counters (nothing to write for a
/// packet that tells nothing: the established path's common case).
#[inline(always)]
pub(crate) fn passive(id: u32, ev: &Evidence) {
    if ev.events == 0 {
        return;
    }
    if let Some(s) = XLB_PASSIVE.get_ptr_mut(id) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        ev.add_to(unsafe { &mut *s });
    }
}
