//! Where the CPU goes during a wrk run of `xlb-lab-bench`: the run time of
//! each of xlb's programs in the lab (kernel BPF run-time statistics), the
//! machine's CPU split as `/proc/stat` counts it (user, system, softirq,
//! idle), and the CPU time of the lab's processes (wrk, the backends,
//! HAProxy, xlb's own user-space processes), all over the same window.
//!
//! Everything is a difference of two [`Sample`]s taken around one run;
//! [`Usage`] adds them up over several runs and turns them into shares.

use std::{
    collections::BTreeMap,
    fs,
    os::{fd::OwnedFd, unix::fs::MetadataExt as _},
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use xlb_lab::{Lab, topology::NETNS_RUN_DIR};

/// The CPU time of one kind of process, by `/proc/<pid>/comm`.
const GROUPS: [(&str, &str); 3] = [
    ("xlb-backend", "backends"),
    ("haproxy", "haproxy"),
    ("xlb", "xlb (user space)"),
];

/// What wrk's CPU time is reported as (it is this process's child).
pub const WRK_GROUP: &str = "wrk";

/// Turns the kernel's BPF run-time statistics on until the returned fd is
/// dropped (`BPF_ENABLE_STATS`, Linux 5.8).
///
/// Not the `kernel.bpf_stats_enabled` sysctl: the syscall's enable is
/// counted per holder, so another user of the statistics on this machine
/// (another benchmark, `bpftool prog profile`) keeps them on after us, and a
/// crash of this process closes the fd and turns them off: nothing to
/// restore, nothing to leave behind. Statistics cost two clock reads per
/// program run, so the benchmark turns them on only for its profile pass.
pub fn enable_run_time_stats() -> anyhow::Result<OwnedFd> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("enabling BPF run-time statistics (BPF_ENABLE_STATS needs Linux 5.8+ and root)")
}

/// A BPF program of the lab: where it is attached and its kernel id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    /// The kernel's name of the program (`xlb_lb`).
    pub name: String,
    /// `xlbw-lb eth0 xdp`.
    pub place: String,
    pub id: u32,
}

/// The id of the program after `marker` (`prog/xdp id 42` in `ip -d link`).
fn prog_id_after(text: &str, marker: &str) -> Option<u32> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let mut words = rest.split_whitespace();
    while let Some(w) = words.next() {
        if w == "id" {
            return words.next()?.parse().ok();
        }
    }
    None
}

/// The programs attached in `lab`: XDP on the LB's eth0, on every backend's
/// eth0 and on the LB's bridge-side peer, found by attachment (`ip -d
/// link`), not by name: other labs on the machine may run programs of the
/// same names. Plus the LB's `xlb_hc` (TC egress, where every packet the
/// LB host sends passes): attached as a TCX link, which `tc filter show`
/// does not list, so it is found as the `xlb_hc` that shares maps with this
/// lab's `xlb_lb` (one object, one set of maps per instance).
pub fn lab_programs(lab: &Lab) -> anyhow::Result<Vec<Program>> {
    let mut places: Vec<(String, String)> = vec![(lab.ns_lb(), lab.lb_ifname().to_string())];
    places.extend(
        lab.backend_namespaces()
            .into_iter()
            .map(|ns| (ns, xlb_lab::topology::BACKEND_IFNAME.to_string())),
    );
    places.push((lab.ns_bridge(), lab.lb_peer_ifname().to_string()));
    let mut ids = Vec::new();
    for (ns, ifname) in &places {
        let link = crate::netns::run(&["ip", "-n", ns, "-d", "-o", "link", "show", "dev", ifname])?;
        let id = prog_id_after(&link, "prog/xdp")
            .with_context(|| format!("no XDP program attached to {ifname} in {ns}: {link}"))?;
        ids.push((format!("{ns} {ifname} xdp"), id));
    }
    let loaded: Vec<aya::programs::ProgramInfo> = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .collect();
    let maps_of = |id: u32| -> Vec<u32> {
        loaded
            .iter()
            .find(|p| p.id() == id)
            .and_then(|p| p.map_ids().ok().flatten())
            .unwrap_or_default()
    };
    let lb_maps = maps_of(ids[0].1);
    for p in &loaded {
        if p.name_as_str() == Some("xlb_hc") && maps_of(p.id()).iter().any(|m| lb_maps.contains(m))
        {
            ids.push((
                format!("{} {} tc egress", lab.ns_lb(), lab.lb_ifname()),
                p.id(),
            ));
        }
    }
    let name_of = |id: u32| {
        loaded
            .iter()
            .find(|p| p.id() == id)
            .and_then(|p| p.name_as_str().map(str::to_string))
            .unwrap_or_else(|| format!("prog {id}"))
    };
    Ok(ids
        .into_iter()
        .map(|(place, id)| Program {
            name: name_of(id),
            place,
            id,
        })
        .collect())
}

/// `/proc/stat`'s first line, in clock ticks summed over every CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTicks {
    pub user: u64,
    pub system: u64,
    /// Hard and soft interrupts: where XDP and the TCP receive paths run
    /// (when the kernel accounts interrupt time; otherwise in system).
    pub irq: u64,
    pub idle: u64,
    pub steal: u64,
}

impl CpuTicks {
    /// Reads the `cpu ` line: user nice system idle iowait irq softirq steal.
    fn parse(stat: &str) -> anyhow::Result<Self> {
        let line = stat
            .lines()
            .find(|l| l.starts_with("cpu "))
            .context("/proc/stat has no `cpu ` line")?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .with_context(|| format!("reading /proc/stat's {line:?}"))?;
        if v.len() < 8 {
            bail!("/proc/stat's `cpu ` line has {} fields, want 8+", v.len());
        }
        Ok(Self {
            user: v[0] + v[1],
            system: v[2],
            irq: v[5] + v[6],
            idle: v[3] + v[4],
            steal: v[7],
        })
    }

    pub fn total(&self) -> u64 {
        self.user + self.system + self.irq + self.idle + self.steal
    }

    fn minus(&self, o: &Self) -> Self {
        Self {
            user: self.user.saturating_sub(o.user),
            system: self.system.saturating_sub(o.system),
            irq: self.irq.saturating_sub(o.irq),
            idle: self.idle.saturating_sub(o.idle),
            steal: self.steal.saturating_sub(o.steal),
        }
    }

    fn plus(&self, o: &Self) -> Self {
        Self {
            user: self.user + o.user,
            system: self.system + o.system,
            irq: self.irq + o.irq,
            idle: self.idle + o.idle,
            steal: self.steal + o.steal,
        }
    }
}

/// utime + stime (or, with `children`, cutime + cstime) of
/// `/proc/<pid>/stat`, in clock ticks.
fn process_ticks(pid: &str, children: bool) -> Option<u64> {
    process_user_system_ticks(pid, children).map(|(user, system)| user + system)
}

/// utime and stime (or, with `children`, cutime and cstime) of
/// `/proc/<pid>/stat`, in clock ticks ([`clock_ticks_per_second`]).
pub fn process_user_system_ticks(pid: &str, children: bool) -> Option<(u64, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    user_system_ticks(&stat, children)
}

/// [`process_user_system_ticks`] of the text of a `/proc/<pid>/stat`.
fn user_system_ticks(stat: &str, children: bool) -> Option<(u64, u64)> {
    // The command name may hold spaces and parentheses: fields start after
    // the last `)`, with the state (field 3) first.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let first = if children { 13 } else { 11 };
    let a: u64 = fields.get(first)?.parse().ok()?;
    let b: u64 = fields.get(first + 1)?.parse().ok()?;
    Some((a, b))
}

/// The pids of every process in network namespace `ns`.
pub fn pids_in_netns(ns: &str) -> anyhow::Result<Vec<u32>> {
    let ns_path = Path::new(NETNS_RUN_DIR).join(ns);
    let want = fs::metadata(&ns_path).with_context(|| format!("stat {}", ns_path.display()))?;
    let mut out = Vec::new();
    for entry in fs::read_dir("/proc").context("listing /proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(m) = fs::metadata(format!("/proc/{pid}/ns/net")) else {
            continue;
        };
        if (m.dev(), m.ino()) == (want.dev(), want.ino()) {
            out.push(pid);
        }
    }
    Ok(out)
}

/// The pids of every process in network namespace `ns`, each with its
/// group name ([`GROUPS`], `other` otherwise).
fn processes_in(ns: &str) -> anyhow::Result<Vec<(String, &'static str)>> {
    Ok(pids_in_netns(ns)?
        .into_iter()
        .map(|pid| {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let group = GROUPS
                .iter()
                .find(|(c, _)| *c == comm.trim())
                .map_or("other (lab)", |(_, g)| *g);
            (pid.to_string(), group)
        })
        .collect())
}

/// Run time (ns) and run count of every loaded program, by kernel id
/// (counted while [`enable_run_time_stats`]'s descriptor is held).
pub fn run_stats() -> BTreeMap<u32, (u64, u64)> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| {
            let ns = u64::try_from(p.run_time().as_nanos()).unwrap_or(u64::MAX);
            (p.id(), (ns, p.run_count()))
        })
        .collect()
}

/// Counters at one instant.
#[derive(Clone, Debug)]
pub struct Sample {
    at: Instant,
    cpu: CpuTicks,
    /// Run time (ns) and run count by program name, summed over places.
    progs: BTreeMap<String, (u64, u64)>,
    /// CPU ticks by process group; wrk's is this process's reaped children.
    groups: BTreeMap<&'static str, u64>,
}

/// Takes [`Sample`]s of a lab's programs and processes.
pub struct Sampler {
    programs: Vec<Program>,
    pids: Vec<(String, &'static str)>,
}

impl Sampler {
    /// Finds the lab's programs and the processes now running in its
    /// namespaces (start HAProxy first).
    pub fn new(lab: &Lab) -> anyhow::Result<Self> {
        let mut pids = Vec::new();
        for ns in lab.namespaces() {
            pids.extend(processes_in(&ns)?);
        }
        Ok(Self {
            programs: lab_programs(lab)?,
            pids,
        })
    }

    pub fn programs(&self) -> &[Program] {
        &self.programs
    }

    pub fn sample(&self) -> anyhow::Result<Sample> {
        let stat = fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        let stats = run_stats();
        let mut progs: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for ours in &self.programs {
            if let Some((ns, runs)) = stats.get(&ours.id) {
                let e = progs.entry(ours.name.clone()).or_default();
                e.0 += ns;
                e.1 += runs;
            }
        }
        let mut groups = BTreeMap::new();
        for (pid, group) in &self.pids {
            *groups.entry(*group).or_default() += process_ticks(pid, false).unwrap_or(0);
        }
        groups.insert(WRK_GROUP, process_ticks("self", true).unwrap_or(0));
        Ok(Sample {
            at: Instant::now(),
            cpu: CpuTicks::parse(&stat)?,
            progs,
            groups,
        })
    }
}

/// What the window between two samples used, summed over runs.
#[derive(Clone, Debug, Default)]
pub struct Usage {
    pub runs: usize,
    pub wall: Duration,
    pub requests: u64,
    pub cpu: CpuTicks,
    /// Run time (ns) and run count by program name.
    pub progs: BTreeMap<String, (u64, u64)>,
    pub groups: BTreeMap<&'static str, u64>,
}

impl Usage {
    /// Adds the window from `before` to `after`, in which `requests`
    /// requests completed.
    pub fn add(&mut self, before: &Sample, after: &Sample, requests: u64) {
        self.runs += 1;
        self.wall += after.at.saturating_duration_since(before.at);
        self.requests += requests;
        self.cpu = self.cpu.plus(&after.cpu.minus(&before.cpu));
        for (name, (ns, cnt)) in &after.progs {
            let (ns0, cnt0) = before.progs.get(name).copied().unwrap_or_default();
            let e = self.progs.entry(name.clone()).or_default();
            e.0 += ns.saturating_sub(ns0);
            e.1 += cnt.saturating_sub(cnt0);
        }
        for (group, t) in &after.groups {
            let t0 = before.groups.get(group).copied().unwrap_or_default();
            *self.groups.entry(group).or_default() += t.saturating_sub(t0);
        }
    }

    /// Nanoseconds of CPU time in the window (every CPU).
    fn total_ns(&self) -> f64 {
        self.cpu.total() as f64 * 1e9 / clock_ticks_per_second()
    }

    /// A share of the window's CPU time, in percent.
    pub fn pct_ticks(&self, ticks: u64) -> f64 {
        100.0 * ticks as f64 / self.cpu.total().max(1) as f64
    }

    /// Busy CPU time (all but idle) per completed request, in µs; on a
    /// machine that runs nothing else, the whole lab's cost of a request.
    pub fn busy_us_per_request(&self) -> f64 {
        let busy = self.cpu.total() - self.cpu.idle;
        busy as f64 * 1e6 / clock_ticks_per_second() / self.requests.max(1) as f64
    }

    /// For program `name`: ns per run, runs per request, and percent of the
    /// window's CPU time.
    pub fn program(&self, name: &str) -> Option<(f64, f64, f64)> {
        let &(ns, cnt) = self.progs.get(name)?;
        Some((
            ns as f64 / cnt.max(1) as f64,
            cnt as f64 / self.requests.max(1) as f64,
            100.0 * ns as f64 / self.total_ns().max(1.0),
        ))
    }

    /// Run time of every program per completed request, in µs: xlb's own
    /// cost of a request, to set against [`Usage::busy_us_per_request`].
    pub fn programs_us_per_request(&self) -> f64 {
        let ns: u64 = self.progs.values().map(|(ns, _)| ns).sum();
        ns as f64 / 1e3 / self.requests.max(1) as f64
    }
}

/// `sysconf(_SC_CLK_TCK)`: the unit of `/proc/stat` and `/proc/<pid>/stat`.
pub fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the C library; no pointers.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as f64 } else { 100.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_ids_from_ip_link() {
        let cases = [
            (
                "ip -d link, xdp",
                "7: eth0@if8: <BROADCAST> mtu 1600 xdp qdisc noqueue \\    prog/xdp id 412 \
                 name xlb_lb tag 0123 jited",
                "prog/xdp",
                Some(412),
            ),
            (
                "id of another attachment first",
                "7: eth0: mtu 1600 xdp link-netns x id 9 prog/xdp id 412 name xlb_lb",
                "prog/xdp",
                Some(412),
            ),
            (
                "nothing attached",
                "7: eth0@if8: <BROADCAST> mtu 1600",
                "prog/xdp",
                None,
            ),
        ];
        for (name, text, marker, want) in cases {
            assert_eq!(prog_id_after(text, marker), want, "{name}");
        }
    }

    #[test]
    fn pid_stat_user_and_system() {
        // A command name with spaces and a parenthesis, as the kernel prints it.
        let stat = "4242 (ha (proxy) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 7 3 20 0 \
                    1 0 100 1000 100 18446744073709551615";
        assert_eq!(user_system_ticks(stat, false), Some((250, 50)));
        assert_eq!(user_system_ticks(stat, true), Some((7, 3)));
        assert_eq!(user_system_ticks("4242 (x", false), None);
    }

    #[test]
    fn proc_stat_cpu_line() {
        let t =
            CpuTicks::parse("cpu  10 1 20 300 4 5 6 7 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n").unwrap();
        let want = CpuTicks {
            user: 11,
            system: 20,
            irq: 11,
            idle: 304,
            steal: 7,
        };
        assert_eq!(t, want);
        assert_eq!(t.total(), 353);
        assert!(CpuTicks::parse("cpu0 1 2 3").is_err());
    }

    #[test]
    fn usage_of_a_window() {
        let at = Instant::now();
        let sample = |ticks: u64, run_ns: u64, runs: u64, wrk: u64| Sample {
            at,
            cpu: CpuTicks {
                user: ticks,
                idle: ticks,
                ..CpuTicks::default()
            },
            progs: BTreeMap::from([("xlb_lb".to_string(), (run_ns, runs))]),
            groups: BTreeMap::from([(WRK_GROUP, wrk)]),
        };
        let mut u = Usage::default();
        u.add(&sample(100, 1_000, 10, 5), &sample(200, 5_000, 30, 55), 10);
        let (ns_per_run, runs_per_req, _) = u.program("xlb_lb").unwrap();
        assert_eq!((ns_per_run, runs_per_req), (200.0, 2.0));
        assert_eq!(u.pct_ticks(u.groups[WRK_GROUP]), 25.0);
        assert_eq!(u.pct_ticks(u.cpu.idle), 50.0);
        assert!(u.program("xlb_decap").is_none());
        assert_eq!(u.programs_us_per_request(), 0.4);
    }
}
