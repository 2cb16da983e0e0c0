//! `xlb trace`: a record per sampled packet of `xlb_lb` (verdict, reason,
//! addresses, backend) into the ring buffer `XLB_TRACE`, only while a trace
//! is on. With none on, a packet pays one load and one test of the flag
//! [`XLB_TRACE_ON`] at the program's entry, and nothing else: `xlb_lb`
//! tests it first, and runs its stages either inlined without the hook
//! (`lb::run::<false>`, where the reasons and backend the stages put in the
//! verdict word fold away, as nothing reads them) or in [`run_traced`], a
//! function of its own with the hook (`lb::run::<true>`, which hands the
//! verdict word to `emit`).
//!
//! The flag is a global, not a map entry: the program reads a global as a
//! direct value (an address the loader patches in, one load), where an
//! array entry costs a lookup (a key on the stack, a call the verifier
//! inlines, a null test) before the load. aya makes its section a one-entry
//! array map of its own (named after the section), which the daemon pins
//! beside the others so that `xlb trace` can set it
//! (`lb_common::trace::MAP_TRACE_ON`).
//!
//! Why not aya-log: its records are format strings for a logger that the
//! loading process (the daemon) drains into its own log, every call site
//! pays for its argument copies whether anyone listens or not, and it has
//! no filter in the kernel. A trace is read by another process (`xlb
//! trace`), filtered here by VIP, source and verdict before anything is
//! copied, and rendered by userspace as lines or JSON: a ring buffer of
//! fixed records does that, and costs nothing while unread.

use core::{
    cell::UnsafeCell,
    intrinsics::{AtomicOrdering, atomic_xadd},
    num::NonZeroU32,
    ptr::{read_volatile, write_volatile},
};

use aya_ebpf::{
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::{map, xdp},
    maps::{Array, RingBuf},
    programs::XdpContext,
};
use lb_common::trace::{
    TRACE_FLAG_ICMP_ERROR, TRACE_RING_BYTES, TraceConfig, TraceEvent, VERDICT_ACTION_MASK,
    VERDICT_BACKEND_SHIFT, VERDICT_FLAGS_SHIFT, VERDICT_REASON_SHIFT, trace_matches,
};

use crate::parse::Packet;

/// A `u32` the kernel and userspace both write, read whole.
#[repr(transparent)]
pub(crate) struct TraceFlag(UnsafeCell<u32>);

// SAFETY: a u32 read and written whole (BPF loads and stores of 4 aligned
// bytes are single instructions); a stale read costs one packet's record.
unsafe impl Sync for TraceFlag {}

/// Non-zero while a trace is on: `xlb trace` sets it after writing
/// `XLB_TRACE_CFG` and clears it when it ends; `emit` clears it when
/// `until_ns` has passed (a trace whose process died). Alone in its section,
/// whose size (4 bytes) is the pinned map's value size: a daemon that
/// adopts the pin keeps the map (aya writes the initial 0 into it).
// Read with a volatile load, so that LLVM does not fold the initial value
// (nothing in this program stores 1 to it).
#[unsafe(link_section = ".data.TRACE_ON")]
#[unsafe(no_mangle)]
static XLB_TRACE_ON: TraceFlag = TraceFlag(UnsafeCell::new(0));

/// Whether a trace is on (the flag test of every packet).
#[inline(always)]
pub(crate) fn tracing() -> bool {
    // SAFETY: a static's address, valid for the program's run.
    unsafe { read_volatile(XLB_TRACE_ON.0.get()) != 0 }
}

/// One entry: whether a trace is on, until when, and its filters.
#[map(name = "XLB_TRACE_CFG")]
pub(crate) static XLB_TRACE_CFG: Array<TraceConfig> = Array::with_max_entries(1, 0);

/// Traced packets, read by `xlb trace`.
#[map(name = "XLB_TRACE")]
pub(crate) static XLB_TRACE: RingBuf = RingBuf::with_byte_size(TRACE_RING_BYTES, 0);

/// `xlb_lb` while a trace is on: the stages with the hook.
// verifier: not inlined, so that the untraced path carries no verdict-word
// bits; the verifier walks the stages once more through here.
#[inline(never)]
pub(crate) fn run_traced(ctx: XdpContext) -> u32 {
    crate::lb::run::<true>(&ctx)
}

/// `xlb_lb` while no trace is on: the stages without the hook.
// verifier: not inlined either: the entry that calls one or the other keeps
// no frame of its own, so the stages' frames add up as they did before
// (the kernel's 512 bytes for the whole call chain; inlined here, this
// path's frame would sit under `run_traced`'s).
#[inline(never)]
pub(crate) fn run_untraced(ctx: XdpContext) -> u32 {
    crate::lb::run::<false>(&ctx)
}

/// Records `pkt` with verdict word `verdict` if the trace wants it (only
/// under [`run_traced`]: the flag is set).
#[inline(always)]
pub(crate) fn after(ctx: &XdpContext, pkt: &Packet, verdict: u32) {
    emit(pkt, verdict, ctx.ingress_ifindex() as u32);
}

/// [`after`] once a trace is on: expiry, filters, sampling, the record.
// verifier: not inlined, so the filters and the record's copies are
// verified once and take their own stack frame, not the parser's.
#[inline(never)]
fn emit(pkt: &Packet, verdict: u32, ifindex: u32) {
    let Some(cfg) = XLB_TRACE_CFG.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a map value, valid for the program's run.
    let c = unsafe { &*cfg };
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    // A trace whose `xlb trace` died stops here, and turns the flag off so
    // that the next packets pay the one test again.
    if now > c.until_ns {
        // SAFETY: a static's address, valid for the program's run.
        unsafe { write_volatile(XLB_TRACE_ON.0.get(), 0) };
        return;
    }
    let action = verdict & VERDICT_ACTION_MASK;
    // A frame the parser gave up on before the IP header has no address
    // to show.
    if pkt.flow.family == 0 || !trace_matches(c, &pkt.flow, action) {
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

/// `xlb_lb` without the trace hook and its flag test: what the data plane
/// costs with no `xlb trace` in it at all, beside which `xlb-bench`
/// measures `xlb_lb` with tracing off (`lb_common::trace::PROG_LB_UNTRACED`).
/// Bench-only, as `xlb_bench_gen`: loaded by the benchmark, never by the
/// daemon; the same maps, so it runs in the benchmark's world unchanged.
#[xdp]
pub(crate) fn xlb_lb_untraced(ctx: XdpContext) -> u32 {
    crate::lb::run::<false>(&ctx)
}
