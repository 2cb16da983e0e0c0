//! `xlb trace`: a record per sampled packet of `xlb_lb` (verdict, reason,
//! addresses, backend) into the ring buffer `XLB_TRACE`, only while a trace
//! is on. With none on, a packet pays one array read and one test of
//! `TraceConfig::until_ns` (`after`); everything else is in `emit`, a
//! function of its own that no untraced packet calls.
//!
//! Why not aya-log: its records are format strings for a logger that the
//! loading process (the daemon) drains into its own log, every call site
//! pays for its argument copies whether anyone listens or not, and it has
//! no filter in the kernel. A trace is read by another process (`xlb
//! trace`), filtered here by VIP, source and verdict before anything is
//! copied, and rendered by userspace as lines or JSON: a ring buffer of
//! fixed records does that, and costs nothing while unread.

use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    num::NonZeroU32,
};

use aya_ebpf::{
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::map,
    maps::{Array, RingBuf},
    programs::XdpContext,
};
use lb_common::trace::{
    TRACE_FLAG_ICMP_ERROR, TRACE_RING_BYTES, TraceConfig, TraceEvent, VERDICT_ACTION_MASK,
    VERDICT_BACKEND_SHIFT, VERDICT_FLAGS_SHIFT, VERDICT_REASON_SHIFT, trace_matches,
};

use crate::parse::Packet;

/// One entry: whether a trace is on, until when, and its filters.
#[map(name = "XLB_TRACE_CFG")]
pub(crate) static XLB_TRACE_CFG: Array<TraceConfig> = Array::with_max_entries(1, 0);

/// Traced packets, read by `xlb trace`.
#[map(name = "XLB_TRACE")]
pub(crate) static XLB_TRACE: RingBuf = RingBuf::with_byte_size(TRACE_RING_BYTES, 0);

/// Records `pkt` with verdict word `verdict` if a trace is on and wants it.
#[inline(always)]
pub(crate) fn after(ctx: &XdpContext, pkt: &Packet, verdict: u32) {
    let Some(cfg) = XLB_TRACE_CFG.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a map value, valid for the program's run; a u64 written whole.
    if unsafe { (*cfg).until_ns } == 0 {
        return;
    }
    emit(pkt, verdict, cfg, ctx.ingress_ifindex() as u32);
}

/// [`after`] once a trace is on: expiry, filters, sampling, the record.
// verifier: not inlined, so the filters and the record's copies are
// verified once and take their own stack frame, not the parser's.
#[inline(never)]
fn emit(pkt: &Packet, verdict: u32, cfg: *mut TraceConfig, ifindex: u32) {
    // SAFETY: a map value, valid for the program's run.
    let c = unsafe { &*cfg };
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let action = verdict & VERDICT_ACTION_MASK;
    // A trace whose `xlb trace` died stops here by itself; a frame the
    // parser gave up on before the IP header has no address to show.
    if now > c.until_ns || pkt.flow.family == 0 || !trace_matches(c, &pkt.flow, action) {
        return;
    }
    // A `NonZeroU32` divisor: no division-by-zero panic path, which the
    // loader would refuse.
    if let Some(every) = NonZeroU32::new(c.sample)
        && every.get() > 1
        // SAFETY: a helper without arguments.
        && unsafe { bpf_get_prandom_u32() } % every != 0
    {
        return;
    }
    let Some(mut e) = XLB_TRACE.reserve::<TraceEvent>(0) else {
        // SAFETY: an aligned u64 of a map value; other CPUs add atomically.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(&raw mut (*cfg).lost, 1) };
        return;
    };
    let p = e.as_mut_ptr();
    let f = &pkt.flow;
    // SAFETY: `p` is the reserved record, valid until submitted; every
    // field is written.
    unsafe {
        (*p).ktime_ns = now;
        (*p).src = f.src;
        (*p).dst = f.dst;
        (*p).sport = f.sport;
        (*p).dport = f.dport;
        (*p).action = action as u8;
        (*p).reason = (verdict >> VERDICT_REASON_SHIFT) as u8;
        (*p).flags = ((verdict >> VERDICT_FLAGS_SHIFT) & 0x1f) as u8
            | if pkt.icmp { TRACE_FLAG_ICMP_ERROR } else { 0 };
        (*p).family = f.family;
        (*p).proto = f.proto;
        (*p).tcp_flags = pkt.tcp_flags;
        (*p).backend = (verdict >> VERDICT_BACKEND_SHIFT) as u16;
        (*p).ifindex = ifindex;
    }
    e.submit(0);
}
