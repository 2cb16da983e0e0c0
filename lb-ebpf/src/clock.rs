//! The data plane's clock: CLOCK_MONOTONIC_COARSE, without a helper call
//! on most packets.
//!
//! The coarse clock only moves at a timer tick, the same moment jiffies
//! move (`tick_do_update_jiffies64` bumps jiffies, then updates the
//! timekeeper). `bpf_jiffies64` is inlined by the verifier into one load,
//! while `bpf_ktime_get_coarse_ns` is a call that reads the timekeeper under
//! its seqcount. So each CPU keeps the last (jiffies, coarse ns) pair it
//! read, and calls the helper only when jiffies moved: once per tick and
//! CPU, not once per packet.
//!
//! A kernel before 5.11 has no `bpf_ktime_get_coarse_ns`: the loader says
//! so (`KERNEL_NO_COARSE_CLOCK`) and `bpf_ktime_get_ns` is read instead,
//! still once per tick, a value up to a tick ahead of the coarse clock
//! userspace reads. On newer kernels that branch is dead code.
//!
//! What it can get wrong: a CPU that reads jiffies between their bump and
//! the timekeeper's update on another CPU keeps the old coarse time until
//! the next tick, one tick (1/HZ, 4 ms at HZ=250) behind. Idle timeouts,
//! conntrack refreshes and next-hop expiry are counted in seconds, and the
//! value never goes backwards on a CPU.

use aya_ebpf::helpers::{bpf_ktime_get_coarse_ns, bpf_ktime_get_ns, generated::bpf_jiffies64};
use lb_common::kernel::KERNEL_NO_COARSE_CLOCK;

use crate::{XLB_CLOCK, kernel};

/// The clock helper: the coarse clock, or the fine one where the kernel
/// has no coarse one (read once per tick all the same).
#[inline(always)]
fn read() -> u64 {
    // SAFETY: helpers without arguments.
    unsafe {
        if kernel::lacks(KERNEL_NO_COARSE_CLOCK) {
            bpf_ktime_get_ns()
        } else {
            bpf_ktime_get_coarse_ns()
        }
    }
}

/// Value of `XLB_CLOCK` (per-CPU array of one). Kernel-only: userspace
/// never reads it, and it is not pinned (a cache, rebuilt on the first
/// packet after a load).
#[repr(C)]
pub(crate) struct ClockCache {
    jiffies: u64,
    ns: u64,
}

/// CLOCK_MONOTONIC_COARSE in ns, as `bpf_ktime_get_coarse_ns` returns it.
#[inline(always)]
pub(crate) fn now() -> u64 {
    // SAFETY: helpers without arguments.
    let jiffies = unsafe { bpf_jiffies64() };
    let Some(c) = XLB_CLOCK.get_ptr_mut(0) else {
        return read();
    };
    // SAFETY: per-CPU slot, no concurrent writer on this CPU.
    let c = unsafe { &mut *c };
    if c.jiffies == jiffies && c.ns != 0 {
        return c.ns;
    }
    let ns = read();
    c.jiffies = jiffies;
    c.ns = ns;
    ns
}
