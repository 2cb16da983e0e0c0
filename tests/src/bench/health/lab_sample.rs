//! What the lab cost figure reads at either end of a window: the daemon's
//! CPU time (the whole process, and its prober thread), the run time of
//! `xlb_hc` and `xlb_lb` on the LB, and the requests and connections the
//! backends answered.

use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use xlb_lab::{Lab, scenario::LabRun};

use crate::bench::{
    lab_cpu::{lab_programs, run_stats},
    process_cpu,
};

/// The daemon's probing thread (`health::scheduler`).
const PROBER_COMM: &str = "xlb-prober";

/// Reads [`Sample`]s of one lab's daemon.
pub(super) struct Sampler {
    pid: u32,
    /// Kernel ids of the LB's `xlb_hc` and `xlb_lb`.
    hc: u32,
    lb: u32,
    backends: usize,
}

impl Sampler {
    /// Finds the programs of `lab` and the daemon `pid`.
    pub(super) fn new(lab: &Lab, pid: u32) -> Result<Self> {
        let programs = lab_programs(lab)?;
        let id_of = |name: &str| {
            programs
                .iter()
                .find(|p| p.name == name && p.place.starts_with(&lab.ns_lb()))
                .map(|p| p.id)
                .with_context(|| format!("no {name} of this lab's LB among {programs:?}"))
        };
        Ok(Self {
            pid,
            hc: id_of("xlb_hc")?,
            lb: id_of("xlb_lb")?,
            backends: lab.backend_count(),
        })
    }

    pub(super) fn sample(&self, run: &LabRun) -> Result<Sample> {
        let mut requests = 0;
        let mut connections = 0;
        for i in 1..=self.backends {
            let s = run.backend_stats(i)?;
            requests += s.requests;
            connections += s.connections;
        }
        let stats = run_stats();
        let of = |id| stats.get(&id).copied().unwrap_or_default();
        Ok(Sample {
            at: Instant::now(),
            daemon_ns: process_cpu(self.pid)?.as_nanos() as u64,
            prober_ns: thread_cpu_ns(self.pid, PROBER_COMM)?,
            hc: of(self.hc),
            lb_ns: of(self.lb).0,
            requests,
            connections,
        })
    }
}

/// Counters at one instant.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sample {
    at: Instant,
    daemon_ns: u64,
    prober_ns: u64,
    /// `xlb_hc`'s run time (ns) and run count.
    hc: (u64, u64),
    lb_ns: u64,
    requests: u64,
    connections: u64,
}

impl Sample {
    /// What the window from `before` to `after` used.
    pub(super) fn usage(before: &Self, after: &Self) -> Usage {
        Usage {
            wall_ns: after.at.saturating_duration_since(before.at).as_nanos() as f64,
            daemon_ns: after.daemon_ns.saturating_sub(before.daemon_ns) as f64,
            prober_ns: after.prober_ns.saturating_sub(before.prober_ns) as f64,
            hc_ns: after.hc.0.saturating_sub(before.hc.0) as f64,
            hc_runs: after.hc.1.saturating_sub(before.hc.1) as f64,
            lb_ns: after.lb_ns.saturating_sub(before.lb_ns) as f64,
            probes: after.requests.saturating_sub(before.requests) as f64,
            connections: after.connections.saturating_sub(before.connections) as f64,
        }
    }
}

/// One window's use, in ns and counts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Usage {
    pub(super) wall_ns: f64,
    pub(super) daemon_ns: f64,
    pub(super) prober_ns: f64,
    pub(super) hc_ns: f64,
    pub(super) hc_runs: f64,
    pub(super) lb_ns: f64,
    /// Requests the backends answered: the probes.
    pub(super) probes: f64,
    pub(super) connections: f64,
}

impl Usage {
    fn share(&self, ns: f64) -> f64 {
        100.0 * ns / self.wall_ns.max(1.0)
    }

    /// The figure: the daemon and `xlb_hc`, in % of one core.
    pub(super) fn percent(&self) -> f64 {
        self.share(self.daemon_ns + self.hc_ns)
    }

    pub(super) fn daemon_percent(&self) -> f64 {
        self.share(self.daemon_ns)
    }

    pub(super) fn prober_percent(&self) -> f64 {
        self.share(self.prober_ns)
    }

    pub(super) fn hc_percent(&self) -> f64 {
        self.share(self.hc_ns)
    }

    pub(super) fn lb_percent(&self) -> f64 {
        self.share(self.lb_ns)
    }

    pub(super) fn hc_ns_per_run(&self) -> f64 {
        self.hc_ns / self.hc_runs.max(1.0)
    }

    pub(super) fn hc_runs_per_probe(&self) -> f64 {
        self.hc_runs / self.probes.max(1.0)
    }

    /// CPU of the figure per probe, in µs.
    pub(super) fn us_per_probe(&self) -> f64 {
        (self.daemon_ns + self.hc_ns) / 1e3 / self.probes.max(1.0)
    }

    pub(super) fn probes_per_s(&self) -> f64 {
        self.probes * 1e9 / self.wall_ns.max(1.0)
    }

    pub(super) fn connections_per_s(&self) -> f64 {
        self.connections * 1e9 / self.wall_ns.max(1.0)
    }
}

/// CPU time of the thread of `pid` named `comm`, in ns: the first field of
/// its `schedstat` (time on CPU).
pub(super) fn thread_cpu_ns(pid: u32, comm: &str) -> Result<u64> {
    let dir = format!("/proc/{pid}/task");
    for entry in std::fs::read_dir(&dir).with_context(|| format!("listing {dir}"))? {
        let path = entry?.path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if name.trim() != comm {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("schedstat"))
            .with_context(|| format!("reading {}/schedstat", path.display()))?;
        return parse_schedstat(&stat)
            .with_context(|| format!("{}/schedstat: {stat:?}", path.display()));
    }
    bail!("no thread {comm:?} in process {pid}")
}

/// The time on CPU (ns) of a `schedstat` line: `run wait slices`.
fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat() {
        assert_eq!(parse_schedstat("123456 789 10\n"), Some(123_456));
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
    }

    #[test]
    fn usage_shares() {
        let u = Usage {
            wall_ns: 1e9,
            daemon_ns: 40e6,
            prober_ns: 30e6,
            hc_ns: 10e6,
            hc_runs: 5_000.0,
            lb_ns: 2e6,
            probes: 1_000.0,
            connections: 1_000.0,
        };
        assert_eq!(u.percent(), 5.0);
        assert_eq!(u.hc_ns_per_run(), 2_000.0);
        assert_eq!(u.hc_runs_per_probe(), 5.0);
        assert_eq!(u.us_per_probe(), 50.0);
        assert_eq!(u.probes_per_s(), 1_000.0);
    }

    #[test]
    fn own_cpu_clock() {
        let a = process_cpu(std::process::id()).unwrap();
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_add(std::hint::black_box(i));
        }
        std::hint::black_box(x);
        assert!(process_cpu(std::process::id()).unwrap() > a);
    }
}
