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
//! - a flow keeps its backend while the backend's id and generation hold
//!   and it is up or draining; a recycled id makes it stale (`nat_stale`);
//! - a flow whose backend is down follows the VIP's `down_policy`, as
//!   conntrack does: `keep` stays (`down_keep`); `rehash` (the default)
//!   ends it (`down_rehash`), since a NAT flow cannot move without
//!   breaking: a TCP packet without SYN is answered with a RST
//!   (`reset_nat_down`) so the client reconnects at once, a SYN or UDP
//!   packet starts a new flow on a backend that is up;
//! - a SYN on a closed or expired flow starts it again; on a live one it
//!   follows the flow (a retransmit);
//! - TTL / hop limit ≤ 1: passed to the host (`pass_nat_ttl`), either way;
//! - larger than the egress MTU, either way: answered as a router answers,
//!   with "fragmentation needed" (IPv4 with DF) or "packet too big" (IPv6)
//!   carrying the MTU, to the packet's sender from the address it sent to
//!   (the VIP for a client, the pool address for a backend), quoting the
//!   packet as it arrived (`icmp_too_big`, within the reply budget:
//!   `drop_reply_limited`). IPv4 without DF, or an ICMP error: dropped
//!   (`drop_nat_too_big`). The answer is built by the caller ([`TOO_BIG`]);
//! - ICMP errors quoting a NAT flow are translated both ways (`icmp.rs`);
//!   from the client's side quoting no live flow, dropped (`drop_nat_icmp`).

pub(crate) mod alloc;
mod icmp;
pub(crate) use icmp::raise_mtu;
pub(crate) mod reply;
mod rewrite;

use aya_ebpf::programs::XdpContext;
use lb_common::{
    BACKEND_DOWN, BackendInfo, DOWN_POLICY_KEEP, FAMILY_V4, FlowKey, PROTO_TCP, Stat,
    nat::{
        EV_ESTABLISHED, Evidence, MODE_NAT_PRESERVE, NAT_TCP_CLOSED, NAT_TCP_CLOSING,
        NAT_TCP_SYN_SENT, NAT_UDP, NatFlow, NatPool, is_nat, reply_key,
    },
    trace::VERDICT_BACKEND_SHIFT,
};

use crate::{
    XLB_BACKENDS, XLB_BE_STATS, XLB_GUARD, XLB_NAT_FLOWS, XLB_NAT_POOL, XLB_NAT_REPLY,
    XLB_NAT_SCRATCH, XLB_PASSIVE, XLB_VIP_INFO, XLB_VIP_STATS,
    forward::{account, nexthop, send as send_out, sent, set_macs},
    guard,
    key::{addr_eq, copy_addr},
    packet::{IPV4_LEN, IPV6_LEN, TcpHdr, ptr_at},
    parse::Packet,
    reset, select,
    stats::{aborted, count, drop_with},
};

/// [`client`]'s answer for a packet to a DSR VIP (on a port a NAT VIP
/// shares): the caller goes on.
pub(crate) const NOT_NAT: u32 = u32::MAX - 1;
/// [`client`]'s and [`new_flow`]'s answer for a packet to translate and
/// send: [`send`].
pub(crate) const SEND: u32 = u32::MAX;
/// [`client`]'s answer for a packet of no flow (or of one just ended):
/// [`new_flow`].
pub(crate) const NEW: u32 = u32::MAX - 2;
/// [`send`]'s (so [`start`]'s) and `reply::answer`'s answer for a packet
/// larger than the egress MTU whose sender may be told ([`too_big`]): the
/// caller at the top of the chain answers it with `icmp::too_big`, saying
/// [`too_big_mtu`]. Not answered from here: `icmp::too_big`'s frame on
/// top of this chain's would pass the 512-byte stack.
pub(crate) const TOO_BIG: u32 = u32::MAX - 3;
// `reply::answer` adds the backend id above `VERDICT_BACKEND_SHIFT` to
// whatever its translation returns: those bits of TOO_BIG are all ones, so
// it stays TOO_BIG.
const _: () = assert!(TOO_BIG | (lb_common::BACKEND_IDS - 1) << VERDICT_BACKEND_SHIFT == TOO_BIG);

/// What [`send`] needs of the flow whose packet it sends, left by
/// [`client`] in the per-CPU scratch entry: a call's frames stay apart
/// (the 512-byte stack is shared by the calls in one chain, and the next
/// hop's refresh is the deepest).
#[repr(C)]
pub(crate) struct Out {
    pub nat_addr: [u8; 16],
    pub id: u32,
    pub vip_id: u32,
    pub nat_port: u16,
    pub backend_port: u16,
    pub new_flow: u8,
    /// Set by [`client`] when it ended the packet's flow because its
    /// backend is down (`down_policy = "rehash"`): [`start`] then resets a
    /// TCP packet without SYN instead of dropping it.
    pub rehashed: u8,
    pub _pad: [u8; 2],
}

/// For a packet to a port some NAT VIP listens on: [`NOT_NAT`] if its VIP
/// is none, [`SEND`] once its flow is found or made and updated, else the
/// verdict.
// Not inlined: its own stack frame and verifier state, off DSR's path.
#[inline(never)]
pub(crate) fn client(ctx: &XdpContext, pkt: &Packet, now: u64) -> u32 {
    let Some((vip_id, vip)) = select::vip(&pkt.flow) else {
        return NOT_NAT;
    };
    if !is_nat(vip.mode) {
        return NOT_NAT;
    }
    let (Some(pool), Some(s)) = (XLB_NAT_POOL.get(vip_id), XLB_NAT_SCRATCH.get_ptr_mut(0)) else {
        return aborted();
    };
    // SAFETY: per-CPU slot, no concurrent writer on this CPU.
    let s = unsafe { &mut *s };
    if pkt.icmp {
        return quoted(pkt, &mut s.out);
    }
    s.out.rehashed = 0;
    if let Some(f) = XLB_NAT_FLOWS.get_ptr_mut(&pkt.flow) {
        // SAFETY: a hash map value, valid for the program's run (RCU);
        // racing writers store whole fields.
        let f = unsafe { &mut *f };
        if usable(pkt, f, pool, vip.down_policy, now, &mut s.out.rehashed).is_some() {
            update(ctx, pkt, f, pool, now, &mut s.out);
            s.out.new_flow = 0;
            return SEND;
        }
    }
    s.out.vip_id = vip_id;
    NEW
}

/// For an ICMP error from the client's side about flow `pkt.flow`:
/// [`SEND`] with what [`send`] needs in `out` if the flow lives and its
/// backend still holds it (the flow's state is not touched: an error is
/// no packet of the flow's), else dropped (`drop_nat_icmp`).
#[inline(always)]
fn quoted(pkt: &Packet, out: &mut Out) -> u32 {
    let Some(f) = XLB_NAT_FLOWS.get_ptr(&pkt.flow) else {
        return drop_with(Stat::DropNatIcmp);
    };
    // SAFETY: as in `client`.
    let f = unsafe { &*f };
    let live = XLB_BACKENDS
        .get(f.backend_id)
        .is_some_and(|be| be.state != 0 && be.generation == f.generation);
    if !live {
        return drop_with(Stat::DropNatIcmp);
    }
    copy_addr(&mut out.nat_addr, &f.nat_addr);
    out.id = f.backend_id;
    out.vip_id = f.vip_id;
    out.nat_port = f.nat_port;
    out.backend_port = f.backend_port;
    out.new_flow = 0;
    SEND
}

/// The backend of existing flow `f`, or `None` once the flow is removed:
/// its backend recycled, or down on a VIP whose `policy` is not `keep`
/// (`rehashed` set), or a SYN on a closed or expired flow.
#[inline(always)]
fn usable(
    pkt: &Packet,
    f: &NatFlow,
    pool: &NatPool,
    policy: u8,
    now: u64,
    rehashed: &mut u8,
) -> Option<&'static BackendInfo> {
    let be = XLB_BACKENDS.get(f.backend_id);
    let (stale, down) = match be {
        Some(be) => (
            be.state == 0 || be.generation != f.generation,
            be.state == BACKEND_DOWN,
        ),
        None => (true, false),
    };
    if stale {
        count(Stat::NatStale);
    } else if down && policy != DOWN_POLICY_KEEP {
        // As conntrack does for DSR flows; a NAT flow cannot move to
        // another backend, so it ends here (`start` resets TCP).
        count(Stat::DownRehash);
        *rehashed = 1;
    } else if !pkt.syn()
        || (now < f.expires(pool) && f.state != NAT_TCP_CLOSED && f.state != NAT_TCP_CLOSING)
    {
        if down {
            count(Stat::DownKeep);
        }
        return be;
    }
    // The flow ends here: its port goes back to the pool.
    passive(f.backend_id, &f.reclaimed(pool, now));
    if let Some(be) = be {
        remove_reply(&reply_key(&pkt.flow, f, &be.addr), &pkt.flow);
    }
    let _ = XLB_NAT_FLOWS.remove(&pkt.flow);
    None
}

/// Removes reply key `key` if it is still `client`'s. A stale flow's
/// backend id may now be another backend's (`be` above is the new holder),
/// whose own live flow may hold the same pool port: its key would be the
/// one computed here, and it is not this flow's to remove. A stale flow's
/// own reply key (the old backend's address) is the daemon's orphan sweep's.
#[inline(always)]
fn remove_reply(key: &FlowKey, client: &FlowKey) {
    // SAFETY: a map value read at once.
    let ours = unsafe { XLB_NAT_REPLY.get(key) }.is_some_and(|c| {
        c.sport == client.sport
            && c.dport == client.dport
            && c.proto == client.proto
            && addr_eq(&c.src, &client.src)
            && addr_eq(&c.dst, &client.dst)
    });
    if ours {
        let _ = XLB_NAT_REPLY.remove(key);
    }
}

/// For a packet of no flow, to the NAT VIP [`client`] found: a TCP packet
/// without SYN is dropped; the rest is judged by the VIP's guard, then
/// starts a flow ([`new_flow`]) and is sent. Inlined into the caller of
/// [`client`], so each call here starts from its frame (see [`Out`]).
#[inline(always)]
pub(crate) fn start(ctx: &XdpContext, pkt: &Packet, now: u64) -> u32 {
    let (vip_id, rehashed) = XLB_NAT_SCRATCH
        .get(0)
        .map_or((0, false), |s| (s.out.vip_id, s.out.rehashed != 0));
    if pkt.flow.proto == PROTO_TCP && !pkt.syn() {
        // A flow `client` just ended for its down backend: the client
        // learns now, not after its own timeout.
        if rehashed {
            return reset::reply(ctx, pkt, Stat::ResetNatDown, Stat::DropNatNoFlow);
        }
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
    // The daemon-wide insert cap, with a budget of its own: a NAT flow
    // cannot go untracked as a DSR one does, so past it the packet is
    // dropped (no RST: a flood's sources are forged).
    let cap = gd.ct_insert_cap;
    if cap != 0 && !crate::conntrack::under_cap(lb_common::guard::CT_RATE_NAT, cap, now) {
        return drop_with(Stat::DropNatInsertCapped);
    }
    // The candidates are searched from this frame, not from under
    // `new_flow`'s: each of the three calls starts from the caller's frame,
    // so the deepest chain is the caller's and one of them (see [`Out`]).
    let claimed = match new_flow(ctx, pkt, now) {
        CLAIMED => true,
        SEARCH => alloc::search(),
        verdict => return verdict,
    };
    match finish_flow(ctx, pkt, now, claimed) {
        SEND => send(ctx, pkt, now),
        verdict => verdict,
    }
}

/// [`new_flow`]'s answer when the flow's source is taken: a
/// `preserve_client` flow keeps the client's own.
const CLAIMED: u32 = u32::MAX - 4;
/// [`new_flow`]'s answer when the flow's source is to be searched among
/// the pool's candidates ([`alloc::search`]).
const SEARCH: u32 = u32::MAX - 5;

/// A packet that may start a flow, to the NAT VIP [`client`] found: picks
/// its backend and builds the flow in the scratch entry, then [`CLAIMED`]
/// (a `preserve_client` flow's own source was free) or [`SEARCH`] (a
/// source is to be found in the pool), else the verdict.
// Not inlined, and called by the caller of `client`, not by it: see [`Out`].
#[inline(never)]
pub(crate) fn new_flow(ctx: &XdpContext, pkt: &Packet, now: u64) -> u32 {
    let Some(s) = XLB_NAT_SCRATCH.get_ptr_mut(0) else {
        return aborted();
    };
    // SAFETY: per-CPU slot, no concurrent writer on this CPU.
    let s = unsafe { &mut *s };
    let vip_id = s.out.vip_id;
    let Some(vip) = XLB_VIP_INFO.get(vip_id) else {
        return aborted();
    };
    let tcp = pkt.flow.proto == PROTO_TCP;
    let Some(g) = crate::XLB_GLOBALS.get(0) else {
        return aborted();
    };
    let Some((id, be, _)) = select::pick(&pkt.flow, vip, g) else {
        return drop_with(Stat::DropNoBackend);
    };
    let preserve = vip.mode == MODE_NAT_PRESERVE;
    let f = &mut s.flow;
    f.backend_id = id;
    f.generation = be.generation;
    f.vip_id = vip_id;
    f.state = if tcp { NAT_TCP_SYN_SENT } else { NAT_UDP };
    f.flags = 0;
    f.nat_port = if preserve { pkt.flow.sport } else { 0 };
    f.nat_addr = if preserve { pkt.flow.src } else { [0; 16] };
    // 0: the daemon set no port; the VIP's.
    f.backend_port = if be.port != 0 {
        be.port
    } else {
        pkt.flow.dport
    };
    f._pad = [0; 2];
    f.backend_isn = 0;
    f.last_seen_ns = now;
    f.request_ns = 0;
    s.client = pkt.flow;
    s.seq = if tcp { tcp_number(ctx, pkt, false) } else { 0 };
    s.proof = 0;
    alloc::prepare(s, &be.addr);
    if !preserve {
        return SEARCH;
    }
    if alloc::claim_own(s) {
        CLAIMED
    } else {
        exhausted(ctx, pkt)
    }
}

/// The end of [`new_flow`] once the search is over: with the flow's source
/// `claimed`, inserts the flow and leaves what [`send`] needs ([`SEND`]);
/// without, the pool is exhausted for it (a TCP client is reset).
#[inline(never)]
fn finish_flow(ctx: &XdpContext, pkt: &Packet, now: u64, claimed: bool) -> u32 {
    let Some(s) = XLB_NAT_SCRATCH.get_ptr_mut(0) else {
        return aborted();
    };
    // SAFETY: per-CPU slot, no concurrent writer on this CPU.
    let s = unsafe { &mut *s };
    if !claimed {
        // Held partly by embryonic flows, and this flow is new: dropped
        // and remembered, so that only a client that sends again (a real
        // one) takes an embryonic flow's port. No RST: a forged source.
        if s.proof == alloc::PROOF_FIRST {
            alloc::remember(s);
            return drop_with(Stat::DropNatUnproven);
        }
        return exhausted(ctx, pkt);
    }
    let Some(pool) = XLB_NAT_POOL.get(s.flow.vip_id) else {
        return aborted();
    };
    let id = s.flow.backend_id;
    let tcp = pkt.flow.proto == PROTO_TCP;
    if XLB_NAT_FLOWS.insert(&pkt.flow, &s.flow, 0).is_err() {
        let _ = XLB_NAT_REPLY.remove(&s.key);
        return drop_with(Stat::DropNatInsertFail);
    }
    count(Stat::NatNew);
    if tcp
        && pool.passive_on()
        && let Some(s) = XLB_PASSIVE.get_ptr_mut(id)
    {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { (*s).connects += 1 };
    }
    let Some(e) = XLB_NAT_FLOWS.get_ptr_mut(&pkt.flow) else {
        return aborted();
    };
    // SAFETY: as in `client`.
    update(ctx, pkt, unsafe { &mut *e }, pool, now, &mut s.out);
    s.out.new_flow = 1;
    SEND
}

/// No source left for a new flow of `pkt`: a TCP client is reset, a UDP
/// packet dropped (`reset_nat_exhausted`, `drop_nat_exhausted`).
#[inline(always)]
fn exhausted(ctx: &XdpContext, pkt: &Packet) -> u32 {
    if pkt.flow.proto == PROTO_TCP {
        reset::reply(ctx, pkt, Stat::ResetNatExhausted, Stat::DropNatExhausted)
    } else {
        drop_with(Stat::DropNatExhausted)
    }
}

/// Updates flow `f` with the client's packet (state, passive evidence)
/// and leaves what [`send`] needs in `out`.
#[inline(always)]
fn update(
    ctx: &XdpContext,
    pkt: &Packet,
    f: &mut NatFlow,
    pool: &NatPool,
    now: u64,
    out: &mut Out,
) {
    let ev = f.client_packet(
        pool,
        pkt.tcp_flags,
        || payload(ctx, pkt),
        || tcp_number(ctx, pkt, true),
        now,
    );
    if ev.events & EV_ESTABLISHED != 0 {
        guard::established(pkt, f.vip_id);
    }
    passive(f.backend_id, &ev);
    copy_addr(&mut out.nat_addr, &f.nat_addr);
    out.id = f.backend_id;
    out.vip_id = f.vip_id;
    out.nat_port = f.nat_port;
    out.backend_port = f.backend_port;
}

/// Translates the client's packet `pkt` of the flow [`client`] left in the
/// scratch entry towards its backend, and sends it.
// Not inlined: see [`Out`].
#[inline(never)]
pub(crate) fn send(ctx: &XdpContext, pkt: &Packet, now: u64) -> u32 {
    let Some(s) = XLB_NAT_SCRATCH.get(0) else {
        return aborted();
    };
    let o = &s.out;
    let id = o.id;
    let Some(be) = XLB_BACKENDS.get(id) else {
        return aborted();
    };
    // SAFETY: null or a per-CPU map value, valid for this run.
    let Some(nh) = (unsafe { nexthop(ctx, id, be, &o.nat_addr, now).as_ref() }) else {
        return drop_with(Stat::DropNoRoute);
    };
    if pkt.ip_len > nh.mtu as usize {
        return too_big(ctx, pkt, nh.mtu);
    }
    let to = rewrite::To {
        src: &o.nat_addr,
        dst: &be.addr,
        sport: o.nat_port,
        dport: o.backend_port,
    };
    let v = if pkt.icmp {
        icmp::rewrite(ctx, pkt, &to)
    } else {
        rewrite::OK
    };
    let v = if v == rewrite::OK {
        rewrite::rewrite(ctx, pkt, &to)
    } else {
        v
    };
    if v != rewrite::OK {
        return v;
    }
    if set_macs(ctx, nh).is_none() {
        return aborted();
    }
    let bytes = crate::packet::len(ctx) as u64;
    let verdict = send_out(ctx, nh);
    if sent(verdict) {
        let new_flow = o.new_flow != 0;
        account(XLB_VIP_STATS.get_ptr_mut(o.vip_id), bytes, new_flow);
        account(XLB_BE_STATS.get_ptr_mut(id), bytes, new_flow);
    }
    verdict | id << VERDICT_BACKEND_SHIFT
}

/// For `pkt` (either way, not yet translated) larger than the egress MTU
/// `mtu`: [`TOO_BIG`], `mtu` left for [`too_big_mtu`], if its sender may be
/// told (`icmp::may_tell`); else dropped (`drop_nat_too_big`): an ICMP
/// error (never answered with another, RFC 1122 3.2.2), or an IPv4 packet
/// without DF. XDP cannot fragment, and the host's forwarding cannot take
/// a client's packet over in full NAT: translated, its source is the
/// host's own pool address, which Linux refuses on input as a martian
/// (`__fib_validate_source`, net/ipv4/fib_frontend.c, unless
/// `accept_local`). One rule both ways: such senders are rare (Linux sets
/// DF on TCP).
#[inline(always)]
pub(crate) fn too_big(ctx: &XdpContext, pkt: &Packet, mtu: u32) -> u32 {
    if pkt.icmp || !crate::icmp::may_tell(ctx, pkt) {
        return drop_with(Stat::DropNatTooBig);
    }
    let Some(s) = XLB_NAT_SCRATCH.get_ptr_mut(0) else {
        return aborted();
    };
    // SAFETY: per-CPU slot, no concurrent writer on this CPU.
    unsafe { (*s).too_big_mtu = mtu };
    TOO_BIG
}

/// The MTU [`too_big`] left for the answer to a [`TOO_BIG`] packet.
#[inline(always)]
pub(crate) fn too_big_mtu() -> u32 {
    XLB_NAT_SCRATCH.get(0).map_or(0, |s| s.too_big_mtu)
}

/// The length of `pkt`'s IP header (a NAT packet has no options or
/// extension headers).
#[inline(always)]
fn ip_hdr_len(pkt: &Packet) -> usize {
    if pkt.flow.family == FAMILY_V4 {
        IPV4_LEN
    } else {
        IPV6_LEN
    }
}

/// Whether `pkt` (TCP or UDP, parsed) carries payload.
#[inline(always)]
pub(crate) fn payload(ctx: &XdpContext, pkt: &Packet) -> bool {
    let ip_hdr = ip_hdr_len(pkt);
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

/// The sequence number (`ack` false) or acknowledgment number of TCP
/// packet `pkt`, host order (0 if unreadable: no handshake completes
/// with it).
#[inline(always)]
pub(crate) fn tcp_number(ctx: &XdpContext, pkt: &Packet, ack: bool) -> u32 {
    match ptr_at::<TcpHdr>(ctx, pkt.l3off + ip_hdr_len(pkt)) {
        // SAFETY: bounds checked by ptr_at.
        Some(t) => u32::from_be_bytes(unsafe { if ack { (*t).ack_seq } else { (*t).seq } }),
        None => 0,
    }
}

/// Adds `ev` to backend `id`'s passive counters (nothing to write for a
/// packet that tells nothing: the established path's common case).
#[inline(always)]
pub(crate) fn passive(id: u32, ev: &Evidence) {
    if ev.events & !EV_ESTABLISHED == 0 {
        return;
    }
    if let Some(s) = XLB_PASSIVE.get_ptr_mut(id) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        ev.add_to(unsafe { &mut *s });
    }
}
