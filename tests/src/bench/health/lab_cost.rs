//! Figure 2, in the lab: the cost of probing 1,000 backends every second
//! as the daemon does it, through the data path (`via = "vip"`, the
//! default) and straight to the backends, with and without
//! `reuse_connection`, in the same run.
//!
//! The real daemon (`xlb run`) probes: its prober thread, its report path,
//! its marks, and `xlb_hc` attached to the LB's interface, in a lab the
//! figure builds and removes ([`LabRun`]). The 1,000 backend addresses are
//! spread over [`BACKEND_NAMESPACES`] backend namespaces (on `lo`, beside
//! the VIP; `xlb_decap` on `eth0` as the lab runs it) and reached through
//! each namespace's lab address as a gateway: the LB resolves four
//! neighbours, not 1,000 (the kernel's neighbour table is global and holds
//! 1,024 by default). Cases are switched with `xlb reload`, alternated
//! round by round.
//!
//! What counts: the daemon process's CPU time (every thread: the prober
//! and the main loop that consumes its reports, as `getrusage` counts the
//! loopback figure's process) plus the run time of `xlb_hc` (kernel BPF
//! statistics), in % of one core over each window.

use std::{
    fmt::Write as _,
    net::Ipv4Addr,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use lb_user::health::spec::DEFAULT_REOPEN_EVERY;
use xlb_lab::{
    Lab,
    scenario::{LabRun, RunOptions, XlbConfig, find_xlb, xdp_attached},
    topology::{BACKEND_IFNAME, LB_V4, VIP_V4},
};

use super::{
    COST_BACKENDS,
    lab_sample::{Sample, Sampler},
    report::{Row, Secs, Verdict},
};
use crate::bench::{
    figures::{Figure, median},
    lab_cpu::pids_in_netns,
};

/// The lab's namespace prefix.
const PREFIX: &str = "xlbhcc";

/// Backend namespaces the 1,000 addresses are spread over.
pub(super) const BACKEND_NAMESPACES: usize = 4;

/// `daemon.max_table_size` here: a prime ≥ 10 × the backends.
const TABLE_SIZE: u32 = 10_007;

/// The probe rate may stray this far from one per backend per second.
const RATE_TOLERANCE: f64 = 0.15;

/// The same group and unit as the loopback cases.
use super::cost::GROUP;

/// Why the lab cases carry no target: the targets are multiples of
/// HAProxy's CPU per check measured in the same run (`cost.rs`), and
/// HAProxy is measured on loopback only. A lab peer would need HAProxy
/// probing the same 1,000 addresses through the same veths, and has no
/// counterpart of a data-path probe (it cannot mark its checks for
/// `xlb_hc`); holding the lab's daemon, whose process also pays softirq
/// work on veths, to the loopback HAProxy's figure would judge the lab,
/// not the prober. Its rows are reported against the direct
/// new-connection case of the same run.
const LAB_TARGET: &str = "none: HAProxy is measured on loopback only (see its rows)";

/// How the daemon probes the 1,000 backends in one case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LabCase {
    /// `via = "vip"` (through `xlb_hc`), else `via = "direct"`.
    pub(super) via_vip: bool,
    /// `reuse_connection = true`.
    pub(super) reuse: bool,
}

impl LabCase {
    pub(super) const ALL: [Self; 4] = [
        Self {
            via_vip: true,
            reuse: false,
        },
        Self {
            via_vip: true,
            reuse: true,
        },
        Self {
            via_vip: false,
            reuse: false,
        },
        Self {
            via_vip: false,
            reuse: true,
        },
    ];

    /// The case `--case` names: `vip`, `vip-reuse`, `direct`, `direct-reuse`.
    pub(super) fn named(name: &str) -> Option<Self> {
        let (via, reuse) = match name.strip_suffix("-reuse") {
            Some(via) => (via, true),
            None => (name, false),
        };
        let via_vip = match via {
            "vip" => true,
            "direct" => false,
            _ => return None,
        };
        Some(Self { via_vip, reuse })
    }

    pub(super) fn label(self) -> String {
        let via = if self.via_vip {
            "via VIP (dsr-ipip, xlb_hc), new connection per probe (default)"
        } else {
            "direct, new connection per probe"
        };
        if self.reuse {
            let via = if self.via_vip {
                "via VIP (dsr-ipip, xlb_hc)"
            } else {
                "direct"
            };
            format!(
                "lab daemon, HTTP {via}, reuse_connection (reopen_every {DEFAULT_REOPEN_EVERY})"
            )
        } else {
            format!("lab daemon, HTTP {via}")
        }
    }

    /// The `[health_check]` keys of this case after `kind`.
    fn health_keys(self) -> String {
        format!(
            "interval = \"1s\"\nvia = \"{}\"\nreuse_connection = {}\n",
            if self.via_vip { "vip" } else { "direct" },
            self.reuse
        )
    }
}

/// Backend `k` (0-based) of the 1,000: `10.98.<namespace>.<host>`, in
/// backend namespace `k % BACKEND_NAMESPACES + 1`.
pub(super) fn backend_addr(k: usize) -> Ipv4Addr {
    let ns = k % BACKEND_NAMESPACES + 1;
    let host = k / BACKEND_NAMESPACES + 1;
    Ipv4Addr::new(10, 98, ns as u8, host as u8)
}

/// The configuration of `case`: the lab's daemon section (instance,
/// socket, interface) with xlb's health defaults but for the interval,
/// `via` and `reuse_connection`, and one dsr-ipip VIP of `n` backends.
pub(super) fn config_text(n: usize, case: LabCase) -> String {
    let mut base = XlbConfig {
        vips: Vec::new(),
        ..XlbConfig::for_prefix(PREFIX)
    };
    base.health.xlb_defaults = true;
    let mut out = base.render().replace(
        &format!("max_table_size = {}", xlb_lab::scenario::LAB_TABLE_SIZE),
        &format!("max_table_size = {TABLE_SIZE}"),
    );
    out.push_str(&case.health_keys());
    let _ = write!(
        out,
        "\n[[vip]]\nname = \"fleet\"\naddress = \"{VIP_V4}\"\nport = 80\nmode = \"dsr-ipip\"\n"
    );
    for k in 0..n {
        let _ = write!(
            out,
            "\n[[vip.backend]]\naddress = \"{}\"\n",
            backend_addr(k)
        );
    }
    out
}

/// Puts the backend addresses on the backend namespaces' `lo` and routes
/// each namespace's /24 through its lab address from the LB.
fn add_addresses(lab: &Lab, n: usize) -> Result<()> {
    for i in 1..=BACKEND_NAMESPACES {
        let mut batch = String::new();
        for k in (0..n).filter(|k| k % BACKEND_NAMESPACES + 1 == i) {
            let _ = writeln!(batch, "address add {}/32 dev lo", backend_addr(k));
        }
        ip_batch(&lab.ns_backend(i), &batch)?;
        let net = format!("10.98.{i}.0/24");
        let gw = lab.backend_v4(i).to_string();
        crate::netns::run(&["ip", "-n", &lab.ns_lb(), "route", "add", &net, "via", &gw])?;
    }
    Ok(())
}

/// Replaces the lab's decapsulator in every backend namespace by one that
/// also takes tunnels to the added addresses: `xlb decap` learns the
/// interface's addresses when it starts, before they were added.
fn replace_decaps(run: &mut LabRun, n: usize) -> Result<()> {
    let xlb = run.xlb_path().to_path_buf();
    for i in 1..=BACKEND_NAMESPACES {
        let ns = run.lab().ns_backend(i);
        let pid = decap_pid(&ns)?;
        // SAFETY: kill(2) with a pid this run started and a valid signal.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            bail!(
                "stopping the decapsulator {pid} in {ns}: {}",
                std::io::Error::last_os_error()
            );
        }
        wait_for(&format!("the decapsulator in {ns} to detach"), || {
            !xdp_attached(&ns, BACKEND_IFNAME)
        })?;
        let mut args: Vec<String> = [
            "decap",
            "--interface",
            BACKEND_IFNAME,
            "--allow-source",
            &LB_V4.to_string(),
            "--vip",
            &VIP_V4.to_string(),
            "--address",
            &run.lab().backend_v4(i).to_string(),
        ]
        .map(str::to_owned)
        .into();
        for k in (0..n).filter(|k| k % BACKEND_NAMESPACES + 1 == i) {
            args.extend(["--address".to_owned(), backend_addr(k).to_string()]);
        }
        run.spawn_in(&format!("decap-fleet-b{i}"), &ns, &xlb, &args)?;
        wait_for(&format!("the fleet's decapsulator in {ns}"), || {
            xdp_attached(&ns, BACKEND_IFNAME)
        })?;
    }
    Ok(())
}

/// The pid of the `xlb decap` running in namespace `ns`.
fn decap_pid(ns: &str) -> Result<libc::pid_t> {
    for pid in pids_in_netns(ns)? {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        if args.get(1) == Some(&&b"decap"[..]) {
            return libc::pid_t::try_from(pid).context("pid out of range");
        }
    }
    bail!("no `xlb decap` running in {ns}")
}

/// Polls `done` every 50 ms for at most 10 s.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        if Instant::now() > deadline {
            bail!("timed out after 10 s waiting for {what}");
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// `ip -n ns -batch` of `commands`.
fn ip_batch(ns: &str, commands: &str) -> Result<()> {
    let file = std::env::temp_dir().join(format!("xlb-hc-cost-{}-{ns}.ip", std::process::id()));
    std::fs::write(&file, commands).with_context(|| format!("writing {}", file.display()))?;
    let path = file.to_string_lossy().into_owned();
    let result = crate::netns::run(&["ip", "-n", ns, "-batch", &path]);
    let _ = std::fs::remove_file(&file);
    result.map(drop)
}

/// One window of one case.
pub(super) struct Window {
    pub(super) case: LabCase,
    pub(super) usage: super::lab_sample::Usage,
}

/// Timing of the figure.
#[derive(Clone, Copy, Debug)]
pub(super) struct Timing {
    pub(super) rounds: usize,
    pub(super) warmup: Duration,
    pub(super) window: Duration,
}

impl Timing {
    pub(super) fn new(quick: bool) -> Self {
        Self {
            rounds: if quick { 3 } else { 6 },
            warmup: Duration::from_secs(if quick { 2 } else { 3 }),
            // A multiple of reopen_every probes at 1 s: every kept
            // connection is replaced once per window, whatever its phase.
            window: Duration::from_secs(if quick { 5 } else { 10 }),
        }
    }
}

/// The figure: builds the lab, measures every case round by round, removes
/// the lab. Blocking (the lab's calls are), so run it off the runtime.
pub(super) fn lab_cost(quick: bool, only: Option<LabCase>) -> Result<Vec<Row>> {
    let n = COST_BACKENDS;
    let timing = Timing::new(quick);
    print_method(n, timing);
    let xlb = find_xlb()?;
    let cases: Vec<LabCase> = LabCase::ALL
        .into_iter()
        .filter(|c| only.is_none_or(|o| o == *c))
        .collect();
    let first = cases[0];
    let opts = RunOptions {
        backends: BACKEND_NAMESPACES,
        start_daemon: false,
        ready_timeout: Duration::from_secs(60),
        rust_log: "warn".to_owned(),
        ..RunOptions::new(PREFIX, &xlb, &config_text(n, first))
    };
    let mut run = LabRun::up_with(opts).context("bringing the lab up")?;
    let measured = measure(&mut run, n, timing, &cases);
    let down = run.shutdown().context("removing the lab");
    let windows = measured?;
    down?;
    Ok(rows(&windows, n, timing))
}

fn measure(run: &mut LabRun, n: usize, timing: Timing, cases: &[LabCase]) -> Result<Vec<Window>> {
    add_addresses(run.lab(), n)?;
    replace_decaps(run, n)?;
    run.start_daemon().context("starting xlb run")?;
    if let Err(e) = run.wait_all_up(Duration::from_secs(60)) {
        let e = e.to_string();
        let first = run
            .status_json()
            .ok()
            .and_then(|s| s.pointer("/vips/0/backends/0").cloned())
            .unwrap_or_default();
        bail!(
            "not every backend came up: {}…; the first backend's status: {first}",
            e.chars().take(400).collect::<String>()
        );
    }
    let _stats = crate::bench::lab_cpu::enable_run_time_stats()?;
    let pid = run.daemon_pid().context("the daemon has no pid")?;
    let sampler = Sampler::new(run.lab(), pid)?;
    let mut current = cases[0];
    let mut windows = Vec::new();
    for round in 0..timing.rounds {
        let mut order = cases.to_vec();
        if round % 2 == 1 {
            order.reverse();
        }
        for case in order {
            if case != current {
                run.reload(&config_text(n, case))
                    .with_context(|| format!("reloading for {}", case.label()))?;
                current = case;
            }
            let usage = one_window(run, &sampler, timing)
                .with_context(|| format!("round {}, {}", round + 1, case.label()))?;
            println!(
                "  round {}/{}, {}: {:.2}% of one core ({:.2}% daemon, {:.2}% xlb_hc), {:.0} \
                 probes/s",
                round + 1,
                timing.rounds,
                case.label(),
                usage.percent(),
                usage.daemon_percent(),
                usage.hc_percent(),
                usage.probes_per_s()
            );
            windows.push(Window { case, usage });
        }
    }
    Ok(windows)
}

/// Waits for every backend to be up and `warmup` to pass, then measures
/// one window; every backend must still be up at its end.
fn one_window(run: &LabRun, sampler: &Sampler, timing: Timing) -> Result<super::lab_sample::Usage> {
    run.wait_all_up(Duration::from_secs(30))?;
    thread::sleep(timing.warmup);
    let before = sampler.sample(run)?;
    let start = Instant::now();
    thread::sleep(timing.window);
    let after = sampler.sample(run)?;
    let status = run.status()?;
    ensure!(
        status.all_up(),
        "a backend left Up during the window: {}",
        status.summary()
    );
    ensure!(
        start.elapsed() < timing.window * 3,
        "the window took {} (the machine is overloaded)",
        Secs(start.elapsed())
    );
    Ok(Sample::usage(&before, &after))
}

fn print_method(n: usize, timing: Timing) {
    println!();
    println!(
        "figure 2, probe cost in the lab: the daemon probing {n} backends every second, \
         through the data path and directly"
    );
    println!(
        "  method:  xlb run in a lab of {BACKEND_NAMESPACES} backend namespaces holding {} \
         addresses each (on lo, reached through the namespace's address as gateway), one \
         dsr-ipip VIP of {n} backends, xlb's health defaults but interval 1s; cases switched \
         by xlb reload; after all Up and {} of warm-up, a {} window; CPU = the daemon \
         process's CPU time (all threads, CLOCK_PROCESS_CPUTIME of its pid) + xlb_hc's run \
         time (BPF_ENABLE_STATS); probes = requests the backends answered; {} rounds, cases \
         alternated (order reversed every other round); medians over the rounds",
        n.div_ceil(BACKEND_NAMESPACES),
        Secs(timing.warmup),
        Secs(timing.window),
        timing.rounds
    );
    println!(
        "  caveat:  veths, not loopback: the daemon's process pays for the TCP input of \
         what it sends only when the softirq runs in its context; xlb_lb's run time on the \
         probes' replies is shown, not counted"
    );
}

/// The rows of every case and the recorded figures.
fn rows(windows: &[Window], n: usize, timing: Timing) -> Vec<Row> {
    let baseline_case = LabCase::ALL[2];
    let of = |case: LabCase| -> Vec<&super::lab_sample::Usage> {
        windows
            .iter()
            .filter(|w| w.case == case)
            .map(|w| &w.usage)
            .collect()
    };
    let direct: Vec<f64> = of(baseline_case).iter().map(|u| u.percent()).collect();
    let direct_median = median(&direct);
    let mut rows = Vec::new();
    for case in LabCase::ALL {
        let usages = of(case);
        if usages.is_empty() {
            continue;
        }
        let percents: Vec<f64> = usages.iter().map(|u| u.percent()).collect();
        let mut figure =
            Figure::median_of("xlb-health-bench", GROUP, &case.label(), &percents, "%");
        if case != baseline_case && direct_median.is_finite() {
            figure = figure.against(&baseline_case.label(), direct_median);
        }
        figure.record();
        rows.push(cpu_row(case, &usages, &figure));
        rows.push(rate_row(case, &usages, n, timing));
    }
    rows
}

fn cpu_row(case: LabCase, usages: &[&super::lab_sample::Usage], figure: &Figure) -> Row {
    let m = |f: fn(&super::lab_sample::Usage) -> f64| {
        median(&usages.iter().map(|u| f(u)).collect::<Vec<_>>())
    };
    let (lo, hi) = figure.spread.unwrap_or((figure.value, figure.value));
    let ratio = figure
        .ratio()
        .map_or_else(String::new, |r| format!("; {r:.2}× direct new-connection"));
    Row {
        figure: format!("probe CPU, {}", case.label()),
        value: format!(
            "{:.1}% of one core (median of {}; {lo:.1}–{hi:.1}%; daemon {:.2}% of which \
             prober thread {:.2}%, xlb_hc {:.2}% ({:.1} runs/probe, {:.0} ns/run); {:.0} µs \
             per probe{ratio}; xlb_lb on replies {:.2}%, not counted)",
            figure.value,
            usages.len(),
            m(super::lab_sample::Usage::daemon_percent),
            m(super::lab_sample::Usage::prober_percent),
            m(super::lab_sample::Usage::hc_percent),
            m(super::lab_sample::Usage::hc_runs_per_probe),
            m(super::lab_sample::Usage::hc_ns_per_run),
            m(super::lab_sample::Usage::us_per_probe),
            m(super::lab_sample::Usage::lb_percent),
        ),
        target: LAB_TARGET.to_owned(),
        verdict: Verdict::Info,
    }
}

fn rate_row(case: LabCase, usages: &[&super::lab_sample::Usage], n: usize, timing: Timing) -> Row {
    let rates: Vec<f64> = usages.iter().map(|u| u.probes_per_s()).collect();
    let conns: Vec<f64> = usages.iter().map(|u| u.connections_per_s()).collect();
    let expected = n as f64;
    let ok = rates
        .iter()
        .all(|r| (r - expected).abs() <= expected * RATE_TOLERANCE);
    let (lo, hi) = rates
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    Row {
        figure: format!("probe rate, {}", case.label()),
        value: format!(
            "{:.0} probes/s ({lo:.0}–{hi:.0}) over {} windows of {}, {:.0} connections/s, \
             every backend Up throughout",
            median(&rates),
            usages.len(),
            Secs(timing.window),
            median(&conns)
        ),
        target: format!(
            "{expected:.0} ± {:.0}% in every window",
            RATE_TOLERANCE * 100.0
        ),
        verdict: Verdict::of(ok),
    }
}

/// Refuses to run where the lab cannot (not root): a clear error rather
/// than one from `ip netns add`.
pub(super) fn check_can_run() -> Result<()> {
    if !xlb_lab::topology::is_root() {
        bail!(
            "the lab cost figure builds network namespaces: run as root (or --only cost-loopback)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_addresses_are_distinct_and_spread() {
        let n = COST_BACKENDS;
        let all: std::collections::HashSet<Ipv4Addr> = (0..n).map(backend_addr).collect();
        assert_eq!(all.len(), n);
        for i in 1..=BACKEND_NAMESPACES {
            let here = all.iter().filter(|a| a.octets()[2] == i as u8).count();
            assert_eq!(here, n / BACKEND_NAMESPACES, "namespace {i}");
        }
        assert!(
            all.iter()
                .all(|a| a.octets()[3] != 0 && a.octets()[3] != 255)
        );
    }

    #[test]
    fn case_names() {
        let names = ["vip", "vip-reuse", "direct", "direct-reuse"];
        let named: Vec<LabCase> = names.iter().filter_map(|n| LabCase::named(n)).collect();
        assert_eq!(named, LabCase::ALL);
        for bad in ["", "reuse", "vip-", "direct-reuse-reuse", "VIP"] {
            assert_eq!(LabCase::named(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn config_of_each_case() {
        for case in LabCase::ALL {
            let text = config_text(3, case);
            let via = if case.via_vip { "vip" } else { "direct" };
            let want = [
                format!("via = \"{via}\"\n"),
                format!("reuse_connection = {}\n", case.reuse),
                "interval = \"1s\"\n".to_owned(),
                format!("max_table_size = {TABLE_SIZE}\n"),
                "address = \"10.98.3.1\"\n".to_owned(),
            ];
            for w in want {
                assert!(text.contains(&w), "{case:?}: {w:?} missing from\n{text}");
            }
            assert_eq!(text.matches("[[vip.backend]]").count(), 3, "{case:?}");
            // The case's keys belong to [health_check], before any VIP.
            let hc = text.find("[health_check]").unwrap();
            assert!(hc < text.find("via = ").unwrap());
            assert!(text.find("via = ").unwrap() < text.find("[[vip]]").unwrap());
        }
    }
}
