//! Forward: send a packet to its backend's next hop. The next hop (egress
//! interface, MACs, MTU) comes from `bpf_fib_lookup`, cached per backend
//! and CPU; `dsr-l2` rewrites the MACs, `dsr-ipip` first encapsulates
//! (`encap.rs`). Forwarded packets are counted per VIP and per backend.

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_SUCCESS, bpf_fib_lookup as FibParams,
        xdp_action,
    },
    helpers::{bpf_fib_lookup, bpf_redirect},
    programs::XdpContext,
};
use lb_common::{
    BackendInfo, FAMILY_V4, FAMILY_V6, Globals, MODE_DSR_IPIP, NEXTHOP_TTL_NS, NextHop, Stat,
    TrafficStats,
    kernel::{FALLBACK_MTUS, KERNEL_NO_FIB_MTU},
    trace::{VERDICT_ACTION_MASK, VERDICT_BACKEND_SHIFT, reason_bits},
};

use crate::{
    XLB_BE_STATS, XLB_NEXTHOP, XLB_VIP_STATS,
    conntrack::Target,
    encap, kernel,
    key::{Zeroed, addr_words, word},
    packet::{EthHdr, len, ptr_at},
    parse::Packet,
    stats::{aborted, count, drop_with},
};

/// `AF_INET` and `AF_INET6`, as `bpf_fib_lookup` takes and returns them.
pub(crate) const AF_INET: u8 = 2;
pub(crate) const AF_INET6: u8 = 10;

/// Sends `pkt` to `t`'s backend as its VIP's mode says, and counts it. The
/// verdict word carries the backend id for `xlb trace`.
#[inline(always)]
pub(crate) fn forward(
    ctx: &XdpContext,
    pkt: &Packet,
    t: &Target,
    g: &Globals,
    now: u64,
    new_flow: bool,
) -> u32 {
    let bytes = len(ctx) as u64;
    let verdict = if t.mode != MODE_DSR_IPIP {
        rewrite_l2(ctx, t.id, t.be, now)
    } else if pkt.flow.family == FAMILY_V6 {
        encap::encap::<true>(ctx, pkt, t.id, t.be, g, now)
    } else {
        encap::encap::<false>(ctx, pkt, t.id, t.be, g, now)
    };
    if sent(verdict) {
        account(XLB_VIP_STATS.get_ptr_mut(t.vip_id), bytes, new_flow);
        account(XLB_BE_STATS.get_ptr_mut(t.id), bytes, new_flow);
    }
    verdict | t.id << VERDICT_BACKEND_SHIFT
}

/// Whether verdict word `verdict` sends the packet out (`XDP_TX` or
/// `XDP_REDIRECT`).
#[inline(always)]
pub(crate) fn sent(verdict: u32) -> bool {
    let action = verdict & VERDICT_ACTION_MASK;
    action == xdp_action::XDP_TX || action == xdp_action::XDP_REDIRECT
}

#[inline(always)]
pub(crate) fn account(stats: Option<*mut TrafficStats>, bytes: u64, new_flow: bool) {
    if let Some(s) = stats {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe {
            (*s).packets += 1;
            (*s).bytes += bytes;
            if new_flow {
                (*s).new_flows += 1;
            }
        }
    }
}

/// `dsr-l2`: the frame goes unchanged to the backend's MAC.
#[inline(always)]
fn rewrite_l2(ctx: &XdpContext, id: u32, be: &BackendInfo, now: u64) -> u32 {
    // SAFETY: null or a per-CPU map value, valid for this run.
    let Some(nh) = (unsafe { nexthop(ctx, id, be, &[0; 16], now).as_ref() }) else {
        return drop_with(Stat::DropNoRoute);
    };
    if nh.on_link == 0 {
        return drop_with(Stat::DropNotOnLink);
    }
    if set_macs(ctx, nh).is_none() {
        return aborted();
    }
    send(ctx, nh)
}

/// The next hop towards backend `id` (`be`): the cached answer, or a fresh
/// `bpf_fib_lookup` when it is missing, expired or for another generation.
/// Null when there is no route or neighbour (not cached: the next packet
/// looks again).
// The cache hit is inlined: a BPF-to-BPF call on every forwarded packet
// costs more than the check.
#[inline(always)]
pub(crate) fn nexthop(
    ctx: &XdpContext,
    id: u32,
    be: &BackendInfo,
    src: &[u8; 16],
    now: u64,
) -> *const NextHop {
    if let Some(nh) = XLB_NEXTHOP.get_ptr(id) {
        // SAFETY: per-CPU slot, only this CPU reads or writes it.
        let cached = unsafe { &*nh };
        if cached.generation_plus_one == be.generation.wrapping_add(1) && now < cached.expires_ns {
            return nh;
        }
    }
    refresh_nexthop(ctx, id, be, src, now)
}

/// [`nexthop`] on a cache miss: the route lookups, cached.
// verifier: not inlined, so the 64-byte fib parameters get their own frame
// instead of adding to the 512-byte stack of the parser. BPF calls take at
// most 5 register arguments, hence the raw pointer result.
#[inline(never)]
fn refresh_nexthop(
    ctx: &XdpContext,
    id: u32,
    be: &BackendInfo,
    src: &[u8; 16],
    now: u64,
) -> *const NextHop {
    let Some(nh) = XLB_NEXTHOP.get_ptr_mut(id) else {
        return core::ptr::null();
    };
    // SAFETY: per-CPU slot, only this CPU reads or writes it.
    let nh = unsafe { &mut *nh };
    // An all-zero bpf_fib_lookup is a valid input.
    let mut slot = Zeroed::<FibParams>::uninit();
    let p = slot.zero();
    let rc = fib(ctx, p, be, src, 0);
    if rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        return core::ptr::null();
    }
    nh.dmac = p.dmac;
    nh.smac = p.smac;
    nh.ifindex = p.ifindex;
    // The kernel replaces the destination by the gateway when the route
    // has one: the backend is on-link only if it is still the backend.
    nh.on_link = u8::from(lookup_dst_is(p, be));
    nh.mtu = egress_mtu(ctx, &mut slot, be.family != FAMILY_V4, src, &be.addr);
    nh.generation_plus_one = be.generation.wrapping_add(1);
    nh.expires_ns = now + NEXTHOP_TTL_NS;
    nh
}

/// Whether the destination `bpf_fib_lookup` left in `p` is `be` itself
/// (no gateway on the route).
#[inline(always)]
fn lookup_dst_is(p: &FibParams, be: &BackendInfo) -> bool {
    // Compared as words, as the kernel's union holds them (see `key.rs`).
    // SAFETY: reading the union members the kernel wrote.
    unsafe {
        if be.family == FAMILY_V4 {
            p.__bindgen_anon_4.ipv4_dst == word(&be.addr, 0)
        } else {
            p.__bindgen_anon_4.ipv6_dst == addr_words(&be.addr)
        }
    }
}

/// `bpf_fib_lookup` towards `be` from `src` (a v4 address in the first 4
/// bytes for IPv4); `tot_len` > 0 also checks it against the egress MTU.
#[inline(always)]
fn fib(ctx: &XdpContext, p: &mut FibParams, be: &BackendInfo, src: &[u8; 16], tot_len: u16) -> i64 {
    fib_lookup(ctx, p, be.family != FAMILY_V4, src, &be.addr, tot_len)
}

/// `bpf_fib_lookup` into `p` (zeroed) from `src` to `dst` (IPv4 in the
/// first 4 bytes unless `v6`); `tot_len` > 0 also checks it against the
/// egress MTU. Shared by the backends' next hops and the NAT clients'
/// (`nat::reply`).
#[inline(always)]
pub(crate) fn fib_lookup(
    ctx: &XdpContext,
    p: &mut FibParams,
    v6: bool,
    src: &[u8; 16],
    dst: &[u8; 16],
    tot_len: u16,
) -> i64 {
    fib_params(p, ctx.ingress_ifindex() as u32, v6, src, dst, tot_len);
    // An input lookup, as if the packet were being forwarded from the
    // ingress interface: any route to the destination is found, through
    // this interface (XDP_TX) or another (redirect). BPF_FIB_LOOKUP_OUTPUT
    // would pin the lookup to the ingress interface as output device.
    // Either way the kernel requires forwarding on the ingress device
    // (checked on 6.18); the daemon sets it.
    // SAFETY: a helper call with the program's context and a parameter
    // struct of the size given.
    unsafe {
        bpf_fib_lookup(
            ctx.ctx as *mut _,
            p,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    }
}

/// The egress MTU towards `dst` from `src`: a lookup claiming the largest
/// packet makes the kernel report it (it only does on
/// `BPF_FIB_LKUP_RET_FRAG_NEEDED`); 65,535 when nothing is smaller. `slot`
/// is the caller's, free again (a second 64-byte block would add to the
/// frame).
///
/// A kernel before 5.12 answers `FRAG_NEEDED` without the MTU
/// (`KERNEL_NO_FIB_MTU`): the largest of `FALLBACK_MTUS` that a packet
/// passes is taken, at most five more lookups on a next hop's refresh
/// (once a second per next hop and CPU). Dead code on newer kernels.
#[inline(always)]
pub(crate) fn egress_mtu(
    ctx: &XdpContext,
    slot: &mut Zeroed<FibParams>,
    v6: bool,
    src: &[u8; 16],
    dst: &[u8; 16],
) -> u32 {
    let m = slot.zero();
    let rc = fib_lookup(ctx, m, v6, src, dst, u16::MAX);
    if rc != i64::from(BPF_FIB_LKUP_RET_FRAG_NEEDED) {
        return u32::from(u16::MAX);
    }
    if !kernel::lacks(KERNEL_NO_FIB_MTU) {
        // SAFETY: reading the union member the kernel wrote.
        return u32::from(unsafe { m.__bindgen_anon_1.mtu_result });
    }
    let mut i = 0;
    while i < FALLBACK_MTUS.len() {
        let mtu = FALLBACK_MTUS[i];
        let m = slot.zero();
        if fib_lookup(ctx, m, v6, src, dst, mtu) != i64::from(BPF_FIB_LKUP_RET_FRAG_NEEDED) {
            return u32::from(mtu);
        }
        i += 1;
    }
    // Below IPv4's minimum: nothing the LB sends fits; what it sends is
    // answered "too big" rather than lost.
    u32::from(FALLBACK_MTUS[FALLBACK_MTUS.len() - 1])
}

/// Fills `p` (zeroed by the caller) for an input route lookup from
/// `ifindex` towards `dst` from `src` (IPv4 in the first 4 bytes unless
/// `v6`): the same lookup for `xlb_lb`'s packets and `xlb_hc`'s probes.
/// The caller runs `bpf_fib_lookup` with its own context.
#[inline(always)]
pub(crate) fn fib_params(
    p: &mut FibParams,
    ifindex: u32,
    v6: bool,
    src: &[u8; 16],
    dst: &[u8; 16],
    tot_len: u16,
) {
    p.ifindex = ifindex;
    p.__bindgen_anon_1.tot_len = tot_len;
    // The union fields are plain byte arrays in network order: copy bytes.
    // verifier: constant lengths in two arms, not one copy of a variable
    // length (which the compiler turns into a loop the verifier walks).
    // SAFETY: writing union fields of a C struct, within their 16 bytes.
    unsafe {
        let s = &mut p.__bindgen_anon_3.ipv6_src as *mut [u32; 4] as *mut u8;
        let d = &mut p.__bindgen_anon_4.ipv6_dst as *mut [u32; 4] as *mut u8;
        if v6 {
            p.family = AF_INET6;
            core::ptr::copy_nonoverlapping(src.as_ptr(), s, 16);
            core::ptr::copy_nonoverlapping(dst.as_ptr(), d, 16);
        } else {
            p.family = AF_INET;
            core::ptr::copy_nonoverlapping(src.as_ptr(), s, 4);
            core::ptr::copy_nonoverlapping(dst.as_ptr(), d, 4);
        }
    }
}

/// Writes the next hop's destination and source MACs at the start of the
/// frame.
#[inline(always)]
pub(crate) fn set_macs(ctx: &XdpContext, nh: &NextHop) -> Option<()> {
    let eth = ptr_at::<EthHdr>(ctx, 0)?;
    // SAFETY: bounds checked by ptr_at.
    copy_macs(unsafe { &mut *eth }, nh);
    Some(())
}

/// Writes the next hop's destination and source MACs into `eth`.
#[inline(always)]
pub(crate) fn copy_macs(eth: &mut EthHdr, nh: &NextHop) {
    const _: () = assert!(core::mem::offset_of!(NextHop, smac) == 6);
    // Both MACs are 12 contiguous bytes in the frame and in `nh`: copied as
    // one 8-byte and one 4-byte word (misaligned access is allowed, see
    // `key.rs`), not as a `memcpy` LLVM lowers byte by byte.
    // SAFETY: `nh` is a map value of at least 12 bytes from `dmac`, `eth`
    // a header of 14; distinct.
    unsafe {
        let src = nh.dmac.as_ptr();
        let dst = eth.dst.as_mut_ptr();
        let a = src.cast::<u64>().read_unaligned();
        let b = src.add(8).cast::<u32>().read_unaligned();
        dst.cast::<u64>().write_unaligned(a);
        dst.add(8).cast::<u32>().write_unaligned(b);
    }
}

/// Out through the next hop's interface: back where it came from
/// (`XDP_TX`) or redirected to another.
#[inline(always)]
pub(crate) fn send(ctx: &XdpContext, nh: &NextHop) -> u32 {
    if nh.ifindex as usize == ctx.ingress_ifindex() {
        count(Stat::FwdTx);
        xdp_action::XDP_TX | reason_bits(Stat::FwdTx)
    } else {
        count(Stat::FwdRedirect);
        unsafe { bpf_redirect(nh.ifindex, 0) as u32 | reason_bits(Stat::FwdRedirect) }
    }
}
