//! The budget of replies the data plane generates itself (RSTs, echo
//! replies, "too big" answers): its default, its `Globals` fields, and the
//! per-CPU state of `XLB_REPLY_RATE`.

/// Default `daemon.reply_rate`: generated replies per second and CPU.
/// Linux answers ICMP at 1000 per second (`net.ipv4.icmp_msgs_per_sec`)
/// for the whole host; per CPU it is the same order for a small LB, and a
/// flood that triggers replies (SYNs from denied sources under `reset`,
/// pings, oversized packets) then costs the uplink at most this many
/// small frames per second and CPU, instead of one per packet received.
pub const DEFAULT_REPLY_RATE: u32 = 1000;

/// The [`crate::Globals::reply_interval_ns`] and [`crate::Globals::reply_tolerance_ns`] of
/// `rate` replies per second and CPU (0 = no limit), with a burst of a tenth
/// of a second's worth (at least 1).
pub fn reply_limit(rate: u32) -> (u64, u64) {
    if rate == 0 {
        return (0, 0);
    }
    let interval = 1_000_000_000 / u64::from(rate);
    let burst = u64::from(rate / 10).max(1);
    (interval.max(1), (burst - 1) * interval.max(1))
}

/// Value of `XLB_REPLY_RATE` (per-CPU array of one): this CPU's budget of
/// generated replies, a GCRA as the per-source limit's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplyRate {
    /// Theoretical arrival time of the next reply: `bpf_ktime_get_coarse_ns`
    /// clock (CLOCK_MONOTONIC_COARSE, ns).
    pub tat_ns: u64,
}
const _: () = assert!(core::mem::size_of::<ReplyRate>() == 8);
