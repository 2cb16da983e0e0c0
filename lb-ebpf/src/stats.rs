//! Reason counters: every outcome of `xlb_lb` that is not a forward bumps a
//! named per-CPU counter (`lb_common::Stat`), and so does every verdict of
//! `xlb_decap` and `xlb_hc` (their own maps). The verdict helpers here pair
//! a verdict with its counter so that neither is forgotten, and put the
//! counter's index into the verdict word as its reason for `xlb trace`
//! (`lb_common::trace`: a constant OR, masked off at the program's entry).

use aya_ebpf::{bindings::xdp_action, maps::PerCpuArray};
use lb_common::{Stat, trace::reason_bits};

use crate::XLB_STATS;

/// Adds one to slot `index` of a per-CPU counter array.
#[inline(always)]
pub(crate) fn bump(map: &PerCpuArray<u64>, index: u32) {
    if let Some(p) = map.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *p += 1 };
    }
}

/// Counts `stat` in `XLB_STATS`.
#[inline(always)]
pub(crate) fn count(stat: Stat) {
    bump(&XLB_STATS, stat as u32);
}

/// Counts `stat` and says whether this was one of every `every` counts on
/// this CPU (`every` a power of two): a sample that costs one branch.
#[inline(always)]
pub(crate) fn count_sampled(stat: Stat, every: u64) -> bool {
    match XLB_STATS.get_ptr_mut(stat as u32) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        Some(p) => unsafe {
            *p += 1;
            *p & (every - 1) == 0
        },
        None => false,
    }
}

/// `XDP_TX` (a reply sent back out), counted as `stat`.
#[inline(always)]
pub(crate) fn tx(stat: Stat) -> u32 {
    count(stat);
    xdp_action::XDP_TX | reason_bits(stat)
}

/// `XDP_PASS`, counted as `stat`.
#[inline(always)]
pub(crate) fn pass(stat: Stat) -> u32 {
    count(stat);
    xdp_action::XDP_PASS | reason_bits(stat)
}

/// `XDP_DROP`, counted as `stat`.
#[inline(always)]
pub(crate) fn drop_with(stat: Stat) -> u32 {
    count(stat);
    xdp_action::XDP_DROP | reason_bits(stat)
}

/// `XDP_ABORTED`, for a broken invariant only (a map entry that must exist,
/// a header just checked that is no longer there).
#[inline(always)]
pub(crate) fn aborted() -> u32 {
    count(Stat::Aborted);
    xdp_action::XDP_ABORTED | reason_bits(Stat::Aborted)
}
