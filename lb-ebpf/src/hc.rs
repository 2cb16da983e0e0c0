//! `xlb_hc`: tc egress classifier that sends data-path health probes the
//! way `xlb_lb` sends client packets.
//!
//! A probe is an ordinary socket on the LB host connecting to the VIP's
//! address and port, with `SO_MARK` = `lb_common::hc_mark(backend id)`. Its
//! packets leave by the route to the VIP, through this interface's egress,
//! where this program finds the mark and:
//! - `dsr-ipip`: adds an outer IPv4 (IPv6) header from the daemon's encap
//!   source (`Globals`) to the backend, TTL [`ENCAP_TTL`], exactly as
//!   `encap::encap` writes it for `xlb_lb`, and redirects it to the
//!   backend's next hop;
//! - `dsr-l2`: redirects it unchanged to the backend's next hop (its MAC);
//! - `nat` (either variant): rewrites its destination address to the
//!   backend's and redirects it to the backend's next hop
//!   (`hc_nat`); the daemon has written the probe's NAT flow, so the
//!   backend's answer comes back through `xlb_lb`'s NAT reply path.
//!
//! The backend then answers from the VIP, straight to the LB host's address,
//! only if the whole client path works: decapsulation, the VIP on `lo`, the
//! service bound to the VIP. Katran's healthchecker does the same, with a
//! tunnel device instead of writing the header itself.
//!
//! Verdicts: packets without a mark of ours (all the host's other traffic)
//! pass untouched after one compare (`TC_ACT_OK`, not counted); a mark in our
//! range without an entry passes (counted); a marked packet that cannot be
//! sent is dropped (counted): the probe fails, as a client would.
//!
//! The next hop comes from `bpf_fib_lookup` towards the backend, the same
//! input lookup `xlb_lb` makes (so the same route, gateway included), but the
//! frame leaves with `bpf_redirect_neigh`: unlike XDP, tc may wait for a
//! neighbour, so a backend nobody has talked to yet gets resolved rather
//! than reported as unreachable. (Since kernel 6.3, "bpf: Add
//! BPF_FIB_LOOKUP_SKIP_NEIGH", the lookup sets the egress ifindex and the
//! gateway before its neighbour check, so both are valid with
//! `BPF_FIB_LKUP_RET_NO_NEIGH` too; before, the ifindex stayed the input
//! one, this interface.)

use aya_ebpf::{
    bindings::{
        BPF_F_ADJ_ROOM_ENCAP_L3_IPV4, BPF_F_ADJ_ROOM_ENCAP_L3_IPV6, BPF_FIB_LKUP_RET_NO_NEIGH,
        BPF_FIB_LKUP_RET_SUCCESS, TC_ACT_OK, TC_ACT_SHOT, bpf_adj_room_mode::BPF_ADJ_ROOM_MAC,
        bpf_fib_lookup as FibParams, bpf_redir_neigh,
    },
    helpers::{bpf_fib_lookup, bpf_redirect_neigh},
    programs::TcContext,
};
use lb_common::{
    FAMILY_V6, HC_MARK_BASE, HC_MARK_MASK, HcReal, HcStat, IPIP4_OVERHEAD, IPIP6_OVERHEAD,
    MODE_DSR_IPIP, nat::is_nat,
};

use crate::{
    XLB_GLOBALS, XLB_HC_REALS, XLB_HC_STATS,
    encap::{ipip4_header, ipip6_header},
    forward::{AF_INET, AF_INET6, fib_params},
    hc_nat,
    key::{Zeroed, word},
    packet::{ETH_LEN, ETH_P_IP, ETH_P_IPV6, IPV6_LEN, Ipv4Hdr, Ipv6Hdr},
    stats::bump,
};

#[inline(always)]
fn count(stat: HcStat) {
    bump(&XLB_HC_STATS, stat as u32);
}

#[inline(always)]
fn shot(stat: HcStat) -> i32 {
    count(stat);
    TC_ACT_SHOT
}

pub(crate) fn run(ctx: &TcContext) -> i32 {
    // SAFETY: reading a field of the context the kernel passed.
    let mark = unsafe { (*ctx.skb.skb).mark };
    if mark & HC_MARK_MASK != HC_MARK_BASE {
        return TC_ACT_OK;
    }
    // SAFETY: a 20-byte value copied out at once.
    let Some(&real) = (unsafe { XLB_HC_REALS.get(&mark) }) else {
        count(HcStat::PassUnknownMark);
        return TC_ACT_OK;
    };
    let v6 = real.family == FAMILY_V6;
    let Ok(ethertype) = ctx.load::<[u8; 2]>(12) else {
        return shot(HcStat::DropFamily);
    };
    if u16::from_be_bytes(ethertype) != if v6 { ETH_P_IPV6 } else { ETH_P_IP } {
        return shot(HcStat::DropFamily);
    }
    if is_nat(real.mode) {
        return nat(ctx, &real, v6);
    }
    let Some(g) = XLB_GLOBALS.get(0) else {
        return shot(HcStat::DropEncap);
    };
    let ipip = real.mode == MODE_DSR_IPIP;
    // The same source `xlb_lb` uses in its route lookup: the encap source
    // for dsr-ipip, none for dsr-l2.
    let mut none = Zeroed::<[u8; 16]>::uninit();
    let src: &[u8; 16] = match (ipip, v6) {
        (false, _) => none.zero(),
        (true, false) => &g.encap_src_v4,
        (true, true) => &g.encap_src_v6,
    };
    if ipip {
        let written = if v6 {
            encap_v6(ctx, src, &real.addr)
        } else {
            encap_v4(ctx, src, &real.addr)
        };
        if written.is_none() {
            return shot(HcStat::DropEncap);
        }
    }
    // The redirected frame comes back through this egress hook: without
    // its mark it passes, instead of being encapsulated again (Katran
    // clears it for the same reason).
    ctx.set_mark(0);
    let fwd = if ipip { HcStat::FwdIpip } else { HcStat::FwdL2 };
    redirect(ctx, &real, src, fwd)
}

/// A probe of a NAT VIP's backend (`hc_nat`): destination address
/// rewritten to the backend's, then sent to it unencapsulated. The route
/// lookup has no source, as for `dsr-l2`: the backend's route does not
/// depend on which of the LB's addresses the probe leaves from.
#[inline(always)]
fn nat(ctx: &TcContext, real: &HcReal, v6: bool) -> i32 {
    if hc_nat::rewrite(ctx, &real.addr, v6).is_none() {
        return shot(HcStat::DropNatRewrite);
    }
    ctx.set_mark(0);
    let mut none = Zeroed::<[u8; 16]>::uninit();
    redirect(ctx, real, none.zero(), HcStat::FwdNat)
}

/// Prepends an outer IPv4 header (backend as destination) after the
/// Ethernet header; the inner packet is untouched.
#[inline(always)]
fn encap_v4(ctx: &TcContext, src: &[u8; 16], dst: &[u8; 16]) -> Option<()> {
    // The inner TOS is carried out, as `xlb_lb` does.
    let [_, tos] = ctx.load::<[u8; 2]>(ETH_LEN).ok()?;
    ctx.adjust_room(
        IPIP4_OVERHEAD as i32,
        BPF_ADJ_ROOM_MAC,
        u64::from(BPF_F_ADJ_ROOM_ENCAP_L3_IPV4),
    )
    .ok()?;
    let total = (ctx.len() as usize - ETH_LEN) as u16;
    let mut h = Ipv4Hdr::default();
    ipip4_header(&mut h, tos, total, word(src, 0), word(dst, 0));
    ctx.store(ETH_LEN, &h, 0).ok()
}

/// Prepends an outer IPv6 header; version, traffic class and flow label are
/// copied from the inner header, as `xlb_lb` does (ECMP keeps the flow).
#[inline(always)]
fn encap_v6(ctx: &TcContext, src: &[u8; 16], dst: &[u8; 16]) -> Option<()> {
    let first = ctx.load::<[u8; 4]>(ETH_LEN).ok()?;
    ctx.adjust_room(
        IPIP6_OVERHEAD as i32,
        BPF_ADJ_ROOM_MAC,
        u64::from(BPF_F_ADJ_ROOM_ENCAP_L3_IPV6),
    )
    .ok()?;
    let payload = (ctx.len() as usize - ETH_LEN - IPV6_LEN) as u16;
    let mut h = Ipv6Hdr::default();
    ipip6_header(&mut h, first, payload, src, dst);
    ctx.store(ETH_LEN, &h, 0).ok()
}

/// Looks up the route to the backend and redirects to its next hop.
// verifier: not inlined, so the 64-byte fib parameters get their own frame.
#[inline(never)]
fn redirect(ctx: &TcContext, real: &HcReal, src: &[u8; 16], fwd: HcStat) -> i32 {
    // An all-zero bpf_fib_lookup is a valid input.
    let mut slot = Zeroed::<FibParams>::uninit();
    let p = slot.zero();
    // SAFETY: reading a field of the context the kernel passed.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    fib_params(p, ifindex, real.family == FAMILY_V6, src, &real.addr, 0);
    // An input lookup from this interface, as `forward::fib` makes it for
    // `xlb_lb` (the daemon turns forwarding on for the interface, which it
    // requires).
    // SAFETY: the helper reads and writes `p` only.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.skb.skb as *mut _,
            p,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    };
    if rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) && rc != i64::from(BPF_FIB_LKUP_RET_NO_NEIGH) {
        return shot(HcStat::DropNoRoute);
    }
    // The next hop: the gateway the lookup wrote over the destination, or
    // the backend itself on-link. An IPv4 route may have an IPv6 gateway
    // (RFC 5549): the lookup then says AF_INET6.
    // An all-zero bpf_redir_neigh is a valid value.
    let mut nh_slot = Zeroed::<bpf_redir_neigh>::uninit();
    let nh = nh_slot.zero();
    // SAFETY: reading and writing union fields of C structs.
    unsafe {
        if p.family == AF_INET6 {
            nh.nh_family = u32::from(AF_INET6);
            nh.__bindgen_anon_1.ipv6_nh = p.__bindgen_anon_4.ipv6_dst;
        } else {
            nh.nh_family = u32::from(AF_INET);
            nh.__bindgen_anon_1.ipv4_nh = p.__bindgen_anon_4.ipv4_dst;
        }
    }
    count(fwd);
    // SAFETY: `nh` lives across the call; the helper only reads it.
    unsafe {
        bpf_redirect_neigh(
            p.ifindex,
            nh,
            core::mem::size_of::<bpf_redir_neigh>() as i32,
            0,
        ) as i32
    }
}
