//! The backend's side of a NAT flow: its answers, addressed to a pool
//! address and allocated port (or to the client, with `preserve_client`),
//! translated back to VIP → client and routed towards the client; and the
//! packets to a pool address's port range that are no flow's answer.

use aya_ebpf::{
    bindings::{BPF_FIB_LKUP_RET_NOT_FWDED, BPF_FIB_LKUP_RET_SUCCESS, bpf_fib_lookup as FibParams},
    programs::XdpContext,
};
use lb_common::{
    FAMILY_V6, FlowKey, NEXTHOP_TTL_NS, Stat, VIP_ADDR_BALANCED, VipAddrKey,
    nat::{ClientHop, client_hop_slot, vip_addr_nat_vip},
    trace::VERDICT_BACKEND_SHIFT,
};

use crate::{
    XLB_BE_STATS, XLB_NAT_BEADDR, XLB_NAT_FLOWS, XLB_NAT_HOPS, XLB_NAT_POOL, XLB_NAT_REPLY,
    XLB_NAT_SPORTS, XLB_VIP_STATS, clock,
    forward::{account, egress_mtu, fib_lookup, send, sent, set_macs},
    key::{WordKey, Zeroed, addr_eq, addr_key, addr_words},
    parse::Packet,
    stats::{aborted, count, drop_with, pass},
};

/// Whether the packet's source port is some NAT backend's: one array read
/// for the host's own traffic.
#[inline(always)]
pub(crate) fn from_backend_port(pkt: &Packet) -> bool {
    let port = lb_common::port_index(pkt.flow.proto, u16::from_be(pkt.flow.sport));
    XLB_NAT_SPORTS.get(port).is_some_and(|n| *n != 0)
}

/// The verdict for `pkt` if it answers a NAT flow (`None`: it does not;
/// the caller goes on as for any packet).
// Not inlined: its own stack frame and verifier state.
#[inline(never)]
pub(crate) fn answer(ctx: &XdpContext, pkt: &Packet) -> Option<u32> {
    // SAFETY: a hash map value, valid for the program's run (RCU); a
    // racing rewrite by another CPU changes whole fields.
    let client = unsafe { XLB_NAT_REPLY.get(&pkt.flow) }?;
    // SAFETY: as above.
    let f = unsafe { &mut *XLB_NAT_FLOWS.get_ptr_mut(client)? };
    // An orphan (the client's flow now holds another port): not its answer.
    if f.nat_port != pkt.flow.dport || !addr_eq(&f.nat_addr, &pkt.flow.dst) {
        return None;
    }
    // An ICMP error quoting the flow (`super::icmp`) is no packet of it:
    // it tells nothing of the backend's state.
    let now = clock::now();
    if !pkt.icmp {
        let ev = f.backend_packet(
            pkt.tcp_flags,
            || super::payload(ctx, pkt),
            || super::tcp_number(ctx, pkt, false),
            now,
        );
        super::passive(f.backend_id, &ev);
    }
    let (vip_id, id) = (f.vip_id, f.backend_id);
    Some(to_client(ctx, pkt, client, (vip_id, id), now) | id << VERDICT_BACKEND_SHIFT)
}

/// The verdict for an ICMP error to an address that is no VIP's, quoting a
/// packet from it (`icmp::TRANSIT`): about a `preserve_client` flow's leg
/// LB → backend (client → backend, as the LB sent it), a router between
/// the LB and the backend tells the client, whose answers' way back
/// passes here. Translated like the backend's answers (VIP → client,
/// quoting client → VIP), so the client's stack finds its connection;
/// anything else passes as the host's traffic did (`pass_not_vip`).
#[inline(always)]
pub(crate) fn transit(ctx: &XdpContext, pkt: &Packet) -> u32 {
    if from_backend_port(pkt)
        && let Some(verdict) = answer(ctx, pkt)
    {
        count(Stat::IcmpQuoted);
        return verdict;
    }
    pass(Stat::PassNotVip)
}

/// Translates the answer `pkt` (or an ICMP error quoting the flow) back to
/// the flow of `client` (VIP → client) and sends it towards the client,
/// counted in VIP `vip_id`'s and backend `id`'s traffic like the flow's
/// forwarded packets.
#[inline(always)]
fn to_client(
    ctx: &XdpContext,
    pkt: &Packet,
    client: &FlowKey,
    (vip_id, id): (u32, u32),
    now: u64,
) -> u32 {
    let Some(c) = XLB_NAT_HOPS.get_ptr_mut(client_hop_slot(&client.src)) else {
        return aborted();
    };
    // SAFETY: per-CPU slot, only this CPU reads or writes it.
    let c = unsafe { &mut *c };
    // The client is one of the LB's own addresses: a data-path probe's
    // flow (`via = "vip"`), whose socket is here. Translated, then passed.
    let mut local = false;
    if !hop_cached(ctx, c, client, now) {
        let rc = refresh_hop(ctx, c, client, now);
        local = rc == i64::from(BPF_FIB_LKUP_RET_NOT_FWDED);
        if rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) && !local {
            return drop_with(Stat::DropNoRoute);
        }
    }
    if !local && pkt.ip_len as u32 > c.hop.mtu {
        // The backend is told, as a router on its path tells it.
        return super::too_big(ctx, pkt, c.hop.mtu);
    }
    let to = super::rewrite::To {
        src: &client.dst,
        dst: &client.src,
        sport: client.dport,
        dport: client.sport,
    };
    let v = if pkt.icmp {
        super::icmp::rewrite(ctx, pkt, &to)
    } else {
        super::rewrite::OK
    };
    let v = if v == super::rewrite::OK {
        super::rewrite::rewrite(ctx, pkt, &to)
    } else {
        v
    };
    if v != super::rewrite::OK {
        return v;
    }
    if local {
        return pass(Stat::PassNatLocal);
    }
    if set_macs(ctx, &c.hop).is_none() {
        return aborted();
    }
    let bytes = crate::packet::len(ctx) as u64;
    let verdict = send(ctx, &c.hop);
    if sent(verdict) {
        account(XLB_VIP_STATS.get_ptr_mut(vip_id), bytes, false);
        account(XLB_BE_STATS.get_ptr_mut(id), bytes, false);
    }
    verdict
}

/// Whether `c` holds a live answer for `client`'s address, looked up for
/// this packet's ingress interface.
#[inline(always)]
fn hop_cached(ctx: &XdpContext, c: &ClientHop, client: &FlowKey, now: u64) -> bool {
    c.hop.generation_plus_one != 0
        && now < c.hop.expires_ns
        && c.iif == ctx.ingress_ifindex() as u32
        && c.family == client.family
        && addr_eq(&c.addr, &client.src)
}

/// `bpf_fib_lookup` towards `client`'s address from its VIP, cached in `c`
/// for [`NEXTHOP_TTL_NS`] when it succeeds (MACs, interface, and the
/// egress MTU from a second lookup claiming the largest packet, as
/// `forward::nexthop` does); `c` is left empty otherwise. Returns the
/// first lookup's answer. A route or neighbour change reaches a client
/// within the TTL, as it reaches a backend.
// verifier: not inlined, so the 64-byte fib parameters get their own
// frame.
#[inline(never)]
fn refresh_hop(ctx: &XdpContext, c: &mut ClientHop, client: &FlowKey, now: u64) -> i64 {
    c.hop.generation_plus_one = 0;
    let v6 = client.family == FAMILY_V6;
    let mut slot = Zeroed::<FibParams>::uninit();
    let p = slot.zero();
    let rc = fib_lookup(ctx, p, v6, &client.dst, &client.src, 0);
    if rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        return rc;
    }
    c.hop.dmac = p.dmac;
    c.hop.smac = p.smac;
    c.hop.ifindex = p.ifindex;
    c.hop.mtu = egress_mtu(ctx, &mut slot, v6, &client.dst, &client.src);
    c.addr = client.src;
    c.family = client.family;
    c.iif = ctx.ingress_ifindex() as u32;
    c.hop.expires_ns = now + NEXTHOP_TTL_NS;
    c.hop.generation_plus_one = 1;
    rc
}

/// The verdict for a TCP/UDP packet to a pool address (`bits`: its
/// `XLB_VIP_ADDRS` value) that answers no flow: in the pool's port range,
/// passed to the host if it comes from a NAT backend (a late answer of a
/// flow gone, counted), dropped as spoofed if not; outside it, the host's
/// own traffic.
#[inline(always)]
pub(crate) fn stray(pkt: &Packet, bits: u32) -> u32 {
    let pool = vip_addr_nat_vip(bits).and_then(|id| XLB_NAT_POOL.get(id));
    let port = u16::from_be(pkt.flow.dport);
    let in_range = pool.is_some_and(|p| port >= p.port_min && port <= p.port_max);
    if bits & VIP_ADDR_BALANCED != 0 || pkt.icmp || !in_range {
        return pass(Stat::PassNotVip);
    }
    let mut key = WordKey::uninit();
    let key: &VipAddrKey = addr_key(&mut key, addr_words(&pkt.flow.src), pkt.flow.family);
    // SAFETY: a u32 copied out at once.
    if unsafe { XLB_NAT_BEADDR.get(key) }.is_some_and(|n| *n != 0) {
        pass(Stat::PassNatUnknownPort)
    } else {
        drop_with(Stat::DropNatSpoofed)
    }
}
