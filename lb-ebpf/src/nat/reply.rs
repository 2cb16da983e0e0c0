//! The backend's side of a NAT flow: its answers, addressed to a pool
//! address and allocated port (or to the client, with `preserve_client`),
//! translated back to VIP → client and routed towards the client; and the
//! packets to a pool address's port range that are no flow's answer.

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_NOT_FWDED, BPF_FIB_LKUP_RET_SUCCESS,
        bpf_fib_lookup as FibParams,
    },
    helpers::bpf_fib_lookup,
    programs::XdpContext,
};
use lb_common::{
    FAMILY_V6, FlowKey, NextHop, Stat, VIP_ADDR_BALANCED, VipAddrKey, nat::vip_addr_nat_vip,
    trace::VERDICT_BACKEND_SHIFT,
};

use crate::{
    XLB_BE_STATS, XLB_NAT_BEADDR, XLB_NAT_FLOWS, XLB_NAT_POOL, XLB_NAT_REPLY, XLB_NAT_SCRATCH,
    XLB_NAT_SPORTS, XLB_VIP_STATS, clock,
    forward::{account, fib_params, send, sent, set_macs},
    key::{WordKey, Zeroed, addr_eq, addr_key, addr_words},
    parse::Packet,
    stats::{aborted, drop_with, pass},
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
    if !pkt.icmp {
        let now = clock::now();
        let ev = f.backend_packet(pkt.tcp_flags, super::payload(ctx, pkt), now);
        super::passive(f.backend_id, &ev);
    }
    Some(
        to_client(ctx, pkt, client, f.vip_id, f.backend_id) | f.backend_id << VERDICT_BACKEND_SHIFT,
    )
}

/// Translates the answer `pkt` (or an ICMP error quoting the flow) back to
/// the flow of `client` (VIP → client) and sends it towards the client,
/// counted in VIP `vip_id`'s and backend `id`'s traffic like the flow's
/// forwarded packets.
#[inline(always)]
fn to_client(ctx: &XdpContext, pkt: &Packet, client: &FlowKey, vip_id: u32, id: u32) -> u32 {
    let Some(s) = XLB_NAT_SCRATCH.get_ptr_mut(0) else {
        return aborted();
    };
    // SAFETY: per-CPU slot, no concurrent writer on this CPU.
    let nh = unsafe { &mut (*s).hop };
    let v6 = u32::from(client.family == FAMILY_V6);
    let rc = route(
        ctx,
        nh,
        &client.src,
        &client.dst,
        v6 << 16 | pkt.ip_len as u32,
    );
    if rc == i64::from(BPF_FIB_LKUP_RET_FRAG_NEEDED) {
        // The backend is told, as a router on its path tells it.
        return super::too_big(ctx, pkt, nh.mtu);
    }
    // The client is one of the LB's own addresses: a data-path probe's
    // flow (`via = "vip"`), whose socket is here. Translated, then passed.
    let local = rc == i64::from(BPF_FIB_LKUP_RET_NOT_FWDED);
    if rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) && !local {
        return drop_with(Stat::DropNoRoute);
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
    if set_macs(ctx, nh).is_none() {
        return aborted();
    }
    let bytes = crate::packet::len(ctx) as u64;
    let verdict = send(ctx, nh);
    if sent(verdict) {
        account(XLB_VIP_STATS.get_ptr_mut(vip_id), bytes, false);
        account(XLB_BE_STATS.get_ptr_mut(id), bytes, false);
    }
    verdict
}

/// `bpf_fib_lookup` towards the client `dst` from the VIP `src`, for an
/// IP packet of `v6_len`'s low 16 bits (so the kernel checks the egress
/// MTU), IPv6 if bit 16 is set; fills `nh`'s MACs and interface, and its
/// MTU on `BPF_FIB_LKUP_RET_FRAG_NEEDED`. Returns the lookup's answer. A
/// lookup per answer, not a cache: clients are many, and the kernel's FIB
/// lookup is what a cache would save.
// verifier: not inlined, so the 64-byte fib parameters get their own
// frame; BPF calls take at most 5 register arguments.
#[inline(never)]
fn route(ctx: &XdpContext, nh: &mut NextHop, dst: &[u8; 16], src: &[u8; 16], v6_len: u32) -> i64 {
    let mut slot = Zeroed::<FibParams>::uninit();
    let p = slot.zero();
    let v6 = v6_len >> 16 != 0;
    fib_params(p, ctx.ingress_ifindex() as u32, v6, src, dst, v6_len as u16);
    // SAFETY: a helper call with the program's context and a parameter
    // struct of the size given.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.ctx as *mut _,
            p,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    };
    nh.dmac = p.dmac;
    nh.smac = p.smac;
    nh.ifindex = p.ifindex;
    // SAFETY: reading the union member the kernel wrote (on FRAG_NEEDED,
    // the egress MTU; else the length given or the MTU: not read then).
    nh.mtu = u32::from(unsafe { p.__bindgen_anon_1.mtu_result });
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
