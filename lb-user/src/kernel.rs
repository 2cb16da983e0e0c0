//! The running kernel: the oldest xlb runs on, and what it probes for at
//! start. A feature a kernel lacks is found by a probe (a program that
//! uses it, or the attach that needs it), never from the version number,
//! so a distribution kernel with a backport gets the feature; each
//! fallback is logged once, with the feature and what it costs.
//!
//! The data-plane fallbacks reach the programs as bits of the object's
//! read-only data (`lb_common::kernel`), set before the programs load: the
//! verifier drops the branches a kernel does not need.

use aya::{
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported},
    util::KernelVersion,
};

/// The oldest kernel line xlb is tested on (`cargo xtask test` boots it),
/// and the README's "Supported kernels" first row.
pub const MINIMUM: (u8, u8) = (5, 10);

/// Why nothing older runs: what the oldest tested kernel has that the
/// data plane needs and older ones lack.
pub const MINIMUM_WHY: &str = "xlb_lb is attached through a BPF link (5.9) that a restart \
     replaces in place, its ring buffer of traced packets needs 5.8, and nothing older is \
     tested (cargo xtask test boots 5.10, 6.1 and 6.12)";

/// Refuses a kernel older than [`MINIMUM`], naming it, the minimum and why.
pub fn check_minimum() -> anyhow::Result<()> {
    let v = KernelVersion::current()
        .map_err(|e| anyhow::anyhow!("reading the kernel's version (uname): {e}"))?;
    check_version(v)
}

fn check_version(v: KernelVersion) -> anyhow::Result<()> {
    let (major, minor) = MINIMUM;
    if v < KernelVersion::new(major, minor, 0) {
        anyhow::bail!(
            "kernel {v} is older than {major}.{minor}, the oldest kernel xlb runs on: {MINIMUM_WHY}; \
             run xlb on Linux {major}.{minor} or later (see README, \"Supported kernels\")"
        );
    }
    Ok(())
}

/// A kernel feature the probes found missing, and what xlb does instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fallback {
    /// The feature, as the kernel names it, with the release that has it.
    pub feature: &'static str,
    /// What xlb does instead and what that costs.
    pub instead: &'static str,
}

/// The fallback for a kernel without `bpf_fib_lookup`'s `mtu_result`.
pub const FIB_MTU_FALLBACK: Fallback = Fallback {
    feature: "bpf_fib_lookup's mtu_result (5.12)",
    instead: "a next hop's egress MTU is the largest of 9000, 1500, 1480, 1280 and 576 \
              that a route lookup passes (up to 5 more lookups when a next hop is refreshed, \
              once a second per next hop and CPU); on a link of another MTU, packets above \
              that figure are answered \"too big\"",
};

/// The fallback for a kernel without `bpf_ktime_get_coarse_ns`.
pub const COARSE_CLOCK_FALLBACK: Fallback = Fallback {
    feature: "bpf_ktime_get_coarse_ns (5.11)",
    instead: "xlb_lb reads bpf_ktime_get_ns instead, still once per tick and CPU: the same \
              cost, a value up to a tick ahead of the coarse clock userspace reads",
};

/// The fallback for a kernel that charges BPF memory to `RLIMIT_MEMLOCK`.
pub const MEMLOCK_FALLBACK: Fallback = Fallback {
    feature: "memcg accounting of BPF memory (5.11)",
    instead: "the maps are charged to RLIMIT_MEMLOCK, which xlb raises to unlimited for \
              itself (it needs CAP_SYS_RESOURCE or LimitMEMLOCK=infinity, as the packaged \
              unit sets)",
};

/// The fallback for a kernel without tcx links (`xlb_hc`).
pub const TCX_FALLBACK: Fallback = Fallback {
    feature: "tcx links (6.6)",
    instead: "xlb_hc is a filter on a clsact qdisc of the interface (netlink), which outlives \
              the daemon: a restart replaces it, and `xlb detach` leaves it (it passes every \
              unmarked packet)",
};

/// What the kernel offers the data plane, probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// `bpf_fib_lookup` reports the egress MTU. Probed through
    /// `bpf_check_mtu`, which came with it (5.12).
    pub fib_mtu: bool,
    /// `bpf_ktime_get_coarse_ns` (5.11), the clock `xlb_lb` reads once per
    /// tick. BPF memory charged to the memory cgroup instead of
    /// `RLIMIT_MEMLOCK` came in the same release: libbpf probes that
    /// through this helper too.
    pub coarse_clock: bool,
}

impl Features {
    /// Probes the running kernel. A probe that cannot tell (a failed
    /// syscall) counts as the feature missing: the fallback works on any
    /// kernel, the feature only where it exists.
    pub fn probe() -> Self {
        let helper = |h| is_helper_supported(ProgramType::Xdp, h).unwrap_or(false);
        Self {
            fib_mtu: helper(BpfHelper::BPF_FUNC_check_mtu),
            coarse_clock: helper(BpfHelper::BPF_FUNC_ktime_get_coarse_ns),
        }
    }

    /// Everything present: what this machine's kernel gives, for tests.
    pub const ALL: Self = Self {
        fib_mtu: true,
        coarse_clock: true,
    };

    /// The bits for the programs (`lb_common::kernel`).
    pub fn bits(self) -> u32 {
        let mut bits = 0;
        if !self.fib_mtu {
            bits |= lb_common::kernel::KERNEL_NO_FIB_MTU;
        }
        if !self.coarse_clock {
            bits |= lb_common::kernel::KERNEL_NO_COARSE_CLOCK;
        }
        bits
    }

    /// The data-plane fallbacks in force.
    pub fn fallbacks(self) -> Vec<Fallback> {
        let mut v = Vec::new();
        if !self.fib_mtu {
            v.push(FIB_MTU_FALLBACK);
        }
        if !self.coarse_clock {
            v.push(COARSE_CLOCK_FALLBACK);
            v.push(MEMLOCK_FALLBACK);
        }
        v
    }
}

/// Raises `RLIMIT_MEMLOCK` to unlimited, for a kernel that charges BPF
/// maps to it (before 5.11, see [`Features::coarse_clock`]): a conntrack of a million entries
/// is 128 MiB, far over the usual 8 MiB.
///
/// # Errors
///
/// `setrlimit` refused (no `CAP_SYS_RESOURCE` and a lower hard limit).
pub fn raise_memlock() -> std::io::Result<()> {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: `unlimited` is a valid rlimit for the duration of the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What a load tells the programs: `given` (tests), else the running
/// kernel probed. Takes the fallbacks that are userspace's (the memlock
/// limit) and logs each fallback in force.
pub fn prepare(given: Option<Features>) -> Features {
    let features = given.unwrap_or_else(Features::probe);
    if !features.coarse_clock
        && let Err(e) = raise_memlock()
    {
        // The maps may still fit; if not, their creation says EPERM.
        tracing::warn!(
            "kernel charges BPF maps to RLIMIT_MEMLOCK and raising it failed ({e}): run xlb \
             with CAP_SYS_RESOURCE or LimitMEMLOCK=infinity"
        );
    }
    if given.is_none() {
        for f in features.fallbacks() {
            log_fallback(&f);
        }
    }
    features
}

/// Logs one line for `f`, once it is taken.
pub fn log_fallback(f: &Fallback) {
    tracing::warn!(
        "kernel {} lacks {}: {}",
        KernelVersion::current().map_or_else(|_| "?".to_string(), |v| v.to_string()),
        f.feature,
        f.instead
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimum_cases() {
        let cases = [
            ("5.4 refused", KernelVersion::new(5, 4, 0), false),
            ("5.9 refused", KernelVersion::new(5, 9, 255), false),
            ("5.10.0 runs", KernelVersion::new(5, 10, 0), true),
            ("6.1 runs", KernelVersion::new(6, 1, 176), true),
            ("6.18 runs", KernelVersion::new(6, 18, 44), true),
        ];
        for (name, v, ok) in cases {
            assert_eq!(check_version(v).is_ok(), ok, "case {name}");
        }
        let e = check_version(KernelVersion::new(5, 4, 0))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("kernel 5.4.0") && e.contains("5.10") && e.contains("BPF link"),
            "{e}"
        );
    }

    #[test]
    fn bits_say_what_is_missing() {
        assert_eq!(Features::ALL.bits(), 0);
        assert!(Features::ALL.fallbacks().is_empty());
        let old = Features {
            fib_mtu: false,
            coarse_clock: false,
        };
        assert_eq!(
            old.bits(),
            lb_common::kernel::KERNEL_NO_FIB_MTU | lb_common::kernel::KERNEL_NO_COARSE_CLOCK
        );
        assert_eq!(
            old.fallbacks(),
            vec![FIB_MTU_FALLBACK, COARSE_CLOCK_FALLBACK, MEMLOCK_FALLBACK]
        );
    }

    /// The fallback's text names the MTUs the programs really try.
    #[test]
    fn fib_mtu_fallback_names_the_programs_mtus() {
        let named: Vec<String> = lb_common::kernel::FALLBACK_MTUS
            .iter()
            .map(u16::to_string)
            .collect();
        for mtu in &named {
            assert!(
                FIB_MTU_FALLBACK.instead.contains(mtu.as_str()),
                "{mtu} not named"
            );
        }
    }
}
