//! The budget of replies the data plane generates itself: RSTs to refused
//! SYNs (`reset.rs`), echo replies and "fragmentation needed" / "packet too
//! big" (`icmp.rs`). Each costs one received packet and answers it, so
//! without a bound a flood of pings, of SYNs from a denied source under
//! `reset`, or of oversized packets would be answered packet for packet,
//! towards whatever source the flood spoofs. Per CPU, as the kernel keeps
//! its own ICMP budget: no shared cache line, no atomics.

use lb_common::Stat;

use crate::{XLB_GLOBALS, XLB_REPLY_RATE, clock, stats::drop_with};

/// Whether this CPU may generate one more reply now; charges it if so. A
/// GCRA on the CPU's theoretical arrival time: `Globals::reply_interval_ns`
/// per reply, up to `reply_tolerance_ns` ahead of now (the burst).
#[inline(always)]
pub(crate) fn allowed() -> bool {
    let Some(g) = XLB_GLOBALS.get(0) else {
        return true;
    };
    let interval = g.reply_interval_ns;
    if interval == 0 {
        return true;
    }
    let Some(r) = XLB_REPLY_RATE.get_ptr_mut(0) else {
        return true;
    };
    // SAFETY: per-CPU slot, no concurrent writer on this CPU.
    let r = unsafe { &mut *r };
    let now = clock::now();
    let from = if r.tat_ns < now { now } else { r.tat_ns };
    if from - now > g.reply_tolerance_ns {
        return false;
    }
    r.tat_ns = from + interval;
    true
}

/// `XDP_DROP` for a reply over the budget, counted.
#[inline(always)]
pub(crate) fn limited() -> u32 {
    drop_with(Stat::DropReplyLimited)
}
