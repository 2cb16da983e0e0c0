//! `xlb_bench_gen`: the frame generator of `xlb-tput-bench`, never loaded by
//! the daemon.
//!
//! In `BPF_PROG_TEST_RUN`'s live-frames mode the kernel resets a recycled
//! page's data pointers but does not copy the frame again
//! (`net/bpf/test_run.c`, `reset_ctx`), so a program under test that
//! rewrites or encapsulates would be handed its own output the next time.
//! This program writes the template back first (one `bpf_xdp_store_bytes`),
//! optionally gives the frame a source never seen before, and tail-calls the
//! program under test in slot 0 of `XLB_BENCH_PROG`. Every mode of the
//! benchmark pays the same restore and tail call.

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_xdp_adjust_tail, bpf_xdp_store_bytes},
    macros::map,
    maps::{Array, PerCpuArray, ProgramArray},
    programs::XdpContext,
};
use lb_common::bench::{
    BENCH_FRAME_LEN, BenchGen, GEN_MANY_SOURCES, GEN_OFF_IP_CHECK, GEN_OFF_SPORT, GEN_OFF_SRC_LOW,
    GEN_OFF_TCP_CHECK, gen_source,
};

use crate::{checksum, packet};

/// The template and flags (`lb_common::bench::MAP_BENCH_GEN`).
#[map(name = "XLB_BENCH_GEN")]
static XLB_BENCH_GEN: Array<BenchGen> = Array::with_max_entries(1, 0);

/// Slot 0: the program under test (`lb_common::bench::MAP_BENCH_PROG`).
#[map(name = "XLB_BENCH_PROG")]
static XLB_BENCH_PROG: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Frames given a new source on this CPU (`lb_common::bench::MAP_BENCH_SEQ`).
#[map(name = "XLB_BENCH_SEQ")]
static XLB_BENCH_SEQ: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub(crate) fn run(ctx: &XdpContext) -> u32 {
    if restore(ctx).is_none() {
        return xdp_action::XDP_ABORTED;
    }
    // SAFETY: control leaves for the program in slot 0 and does not return.
    unsafe { XLB_BENCH_PROG.tail_call(ctx, 0) };
    // An empty slot: the benchmark did not set up its program.
    xdp_action::XDP_ABORTED
}

/// The frame becomes the template, with a new source if asked.
#[inline(always)]
fn restore(ctx: &XdpContext) -> Option<()> {
    let g = XLB_BENCH_GEN.get(0)?;
    let len = packet::len(ctx);
    // Live frames come back at their first length; a plain test run of a
    // program's output (encapsulated, say) needs the tail moved.
    if len != BENCH_FRAME_LEN {
        let delta = BENCH_FRAME_LEN as i32 - len as i32;
        // SAFETY: the helper checks the new length against the buffer.
        if unsafe { bpf_xdp_adjust_tail(ctx.ctx, delta) } != 0 {
            return None;
        }
    }
    let src = g.frame.as_ptr() as *mut core::ffi::c_void;
    // SAFETY: `src` is the map value's BENCH_FRAME_LEN bytes; the helper
    // checks the packet's length.
    if unsafe { bpf_xdp_store_bytes(ctx.ctx, 0, src, BENCH_FRAME_LEN as u32) } != 0 {
        return None;
    }
    if g.flags & GEN_MANY_SOURCES != 0 {
        new_source(ctx)?;
    }
    Some(())
}

/// Writes this CPU's next source (`lb_common::bench::gen_source`) and
/// updates both checksums for the two changed words (RFC 1624): the TCP
/// checksum covers the source address through the pseudo-header.
#[inline(always)]
fn new_source(ctx: &XdpContext) -> Option<()> {
    let seq = XLB_BENCH_SEQ.get_ptr_mut(0)?;
    // SAFETY: a per-CPU value, only this CPU's program touches it.
    let n = unsafe {
        let n = *seq;
        *seq = n + 1;
        n as u32
    };
    let (word, port) = gen_source(n);
    let old_word = swap_word(ctx, GEN_OFF_SRC_LOW, word)?;
    let old_port = swap_word(ctx, GEN_OFF_SPORT, port)?;
    let ip_check = read_word(ctx, GEN_OFF_IP_CHECK)?;
    swap_word(
        ctx,
        GEN_OFF_IP_CHECK,
        checksum::replace(ip_check, old_word, word),
    )?;
    let tcp_check = read_word(ctx, GEN_OFF_TCP_CHECK)?;
    let tcp_check = checksum::replace(tcp_check, old_word, word);
    swap_word(
        ctx,
        GEN_OFF_TCP_CHECK,
        checksum::replace(tcp_check, old_port, port),
    )?;
    Some(())
}

/// The 16-bit word at `off`, host order.
#[inline(always)]
fn read_word(ctx: &XdpContext, off: usize) -> Option<u16> {
    let p = packet::ptr_at::<[u8; 2]>(ctx, off)?;
    // SAFETY: bounds checked by ptr_at.
    Some(u16::from_be_bytes(unsafe { *p }))
}

/// Writes `new` (host order) at `off`; returns the word it replaced.
#[inline(always)]
fn swap_word(ctx: &XdpContext, off: usize, new: u16) -> Option<u16> {
    let p = packet::ptr_at::<[u8; 2]>(ctx, off)?;
    // SAFETY: bounds checked by ptr_at.
    let old = unsafe { core::mem::replace(&mut *p, new.to_be_bytes()) };
    Some(u16::from_be_bytes(old))
}
