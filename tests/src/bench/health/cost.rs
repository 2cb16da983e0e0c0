//! Figure 2: CPU cost of probing 1,000 backends every second.

use std::{
    collections::{HashMap, HashSet},
    net::{Ipv4Addr, SocketAddr},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context as _, Result, bail, ensure};
use lb_user::health::{
    machine::HealthState,
    probe::Compact,
    scheduler::Scheduler,
    scheduler::{DEFAULT_MAX_CONCURRENT, Report},
    spec::CheckKind,
    spec::CheckSpec,
};
use tokio::{
    io::{AsyncBufReadExt as _, BufReader},
    sync::mpsc::Receiver,
    time::{Instant, timeout, timeout_at},
};

use crate::bench::figures::{Figure, Target};

use super::{
    COST_BACKENDS,
    detection::http_spec,
    report::{Row, Secs, Verdict},
    resources::{CpuTime, cpu_time, rss_kib},
};

/// How far the probe rate may stray from one probe per backend per interval.
const RATE_TOLERANCE: f64 = 0.15;

/// The figure's group in `cargo xtask bench`'s summary.
pub(super) const GROUP: &str = "control plane, 1,000 backends @ 1/s (% of one core)";

/// The most of one core probing 1,000 backends every second may take.
pub(super) const TARGET_PERCENT: f64 = 5.0;

/// How the backends are probed in one case of the figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Case {
    /// The default: a new TCP connection per probe.
    Fresh,
    /// `reuse_connection = true` with this `reopen_every` (the default's
    /// unless `--reopen-every` says otherwise).
    Reuse(u32),
}

impl Case {
    /// The cases of a run, the reused connection reopened every `reopen`
    /// probes.
    pub(super) fn all(reopen: u32) -> [Self; 2] {
        [Self::Fresh, Self::Reuse(reopen)]
    }

    fn label(self) -> String {
        match self {
            Self::Fresh => "HTTP, new connection per probe (default)".to_owned(),
            Self::Reuse(every) => format!("HTTP, reuse_connection (reopen_every {every})"),
        }
    }

    fn spec(self, base: &CheckSpec) -> CheckSpec {
        let mut spec = base.clone();
        if let (Self::Reuse(every), CheckKind::Http(http)) = (self, &mut spec.kind) {
            http.reuse_connection = Some(every);
        }
        spec
    }
}

/// The measured window: 10 s (5 with `--quick`), or `reopen_every`
/// seconds if that is longer. With xlb's default of 10 probes at 1 s, the
/// full window replaces every kept connection once whatever its phase; a
/// longer `reopen_every` must be given a window in which its reopenings
/// happen at all (each window starts a new scheduler).
fn window_for(quick: bool, reopen: u32) -> Duration {
    let base = if quick { 5 } else { 10 };
    Duration::from_secs(base.max(u64::from(reopen)))
}

/// The check every case starts from: the detection figure's HTTP check,
/// probing every second.
fn base_spec() -> CheckSpec {
    http_spec(|s| s.interval = Duration::from_secs(1))
}

/// The figure for every case, or for `only` (when profiling one).
pub(super) async fn cost(quick: bool, only: Option<Case>, reopen: u32) -> Result<Vec<Row>> {
    let n = COST_BACKENDS;
    let rounds = if quick { 3 } else { 6 };
    let window = window_for(quick, reopen);
    let warmup = Duration::from_secs(if quick { 1 } else { 2 });
    let base = base_spec();
    print_method(n, &base, warmup, window, rounds, reopen);

    let mut server = ServerChild::spawn(n).await?;
    let mut windows: Vec<(Case, Measured)> = Vec::new();
    for round in 0..rounds {
        // Alternate which case goes first, so a drift in the machine's
        // load over the run does not favour one of them.
        let mut order = Case::all(reopen);
        if round % 2 == 1 {
            order.reverse();
        }
        for case in order.into_iter().filter(|c| only.is_none_or(|o| o == *c)) {
            let measured = one_window(n, &case.spec(&base), &server.ports, warmup, window).await?;
            println!(
                "  round {}/{rounds}, {}: {:.2}% of one core, {:.0} µs per probe",
                round + 1,
                case.label(),
                measured.cpu_percent(),
                measured.cpu_per_probe_us()
            );
            windows.push((case, measured));
        }
    }
    server.stop().await;
    Ok(summary_rows(&windows, reopen))
}

/// Probes the `n` servers on `ports` with `spec` for one `window` after
/// they are all up and `warmup` has passed; the scheduler (and any kept
/// connection) is gone when this returns.
async fn one_window(
    n: usize,
    spec: &CheckSpec,
    ports: &[u16],
    warmup: Duration,
    window: Duration,
) -> Result<Measured> {
    let rss_before = rss_kib()?;
    let (mut scheduler, mut rx) = Scheduler::new(DEFAULT_MAX_CONCURRENT);
    for (id, port) in (0u64..).zip(ports) {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, *port));
        let spec = CheckSpec {
            port: *port,
            ..spec.clone()
        };
        scheduler.upsert(id, addr, spec, HealthState::Unknown);
    }
    wait_all_up(&mut rx, n, spec).await?;
    let warm_end = Instant::now() + warmup;
    while timeout_at(warm_end, rx.recv()).await.is_ok() {}

    let counts = count_probes(&mut rx, window).await?;
    let rss_after = rss_kib()?;
    drop(scheduler);
    Ok(Measured {
        n,
        spec: spec.clone(),
        window,
        counts,
        rss_before,
        rss_after,
    })
}

fn print_method(
    n: usize,
    spec: &CheckSpec,
    warmup: Duration,
    window: Duration,
    rounds: usize,
    reopen: u32,
) {
    println!();
    println!("figure 2, probe cost: {n} backends probed every second");
    println!(
        "  check:   GET /health, interval {}, timeout {}, rise {}, fall {}, jitter ±{:.0}%, \
         max {DEFAULT_MAX_CONCURRENT} probes in flight",
        Compact(spec.interval),
        Compact(spec.timeout),
        spec.rise,
        spec.fall,
        spec.jitter * 100.0
    );
    println!(
        "  method:  {n} HTTP listeners on 127.0.0.1 in a child process (this binary, --serve \
         {n}); for each case a new scheduler, all Up, then {} of warm-up; CPU = \
         getrusage(RUSAGE_SELF) user+system of this process (prober and report consumer) over \
         a {} window; {rounds} rounds, the cases alternated (and their order swapped) round by \
         round; medians over the rounds",
        Secs(warmup),
        Secs(window)
    );
    println!(
        "  cases:   {}; {}",
        Case::Fresh.label(),
        Case::Reuse(reopen).label()
    );
    println!(
        "  caveat:  on loopback the kernel runs the receive side of a packet in the sender's \
         context, so each process pays for the other's TCP input of what it sends (the \
         servers' handling of SYNs and requests counts here, the prober's handling of \
         responses counts in the server): the system share is loopback's, not a NIC's"
    );
}

/// Every backend is probed once within the first interval (the initial
/// delay is spread over it), which takes it Unknown → Up.
async fn wait_all_up(rx: &mut Receiver<Report>, n: usize, spec: &CheckSpec) -> Result<()> {
    let mut up = HashSet::new();
    let up_limit = spec.interval + spec.timeout + Duration::from_secs(5);
    let deadline = Instant::now() + up_limit;
    while up.len() < n {
        match timeout_at(deadline, rx.recv()).await {
            Ok(Some(report)) => match &report.transition {
                Some(t) if t.to == HealthState::Up => {
                    up.insert(report.id);
                }
                Some(t) => bail!(
                    "backend {} went {} → {} during warm-up: {}",
                    report.addr,
                    t.from,
                    t.to,
                    t.reason
                ),
                None => {}
            },
            Ok(None) => bail!("the scheduler's report channel closed"),
            Err(_) => bail!(
                "only {} of {n} backends came up within {}",
                up.len(),
                Secs(up_limit)
            ),
        }
    }
    Ok(())
}

/// Probes counted over the window, and the CPU they cost.
struct ProbeCounts {
    per_backend: HashMap<u64, u32>,
    /// Failed probes by failure code.
    failed: HashMap<String, u32>,
    cpu: CpuTime,
    wall: Duration,
}

async fn count_probes(rx: &mut Receiver<Report>, window: Duration) -> Result<ProbeCounts> {
    let mut per_backend: HashMap<u64, u32> = HashMap::new();
    let mut failed: HashMap<String, u32> = HashMap::new();
    let cpu_start = cpu_time()?;
    let start = Instant::now();
    let end = start + window;
    while let Ok(received) = timeout_at(end, rx.recv()).await {
        let report = received.context("the scheduler's report channel closed")?;
        // Probes, not reports: an interim Late report is not a probe.
        let Some(result) = &report.result else {
            continue;
        };
        *per_backend.entry(report.id).or_default() += 1;
        if let Err(e) = &result.outcome {
            *failed.entry(e.code().to_owned()).or_default() += 1;
        }
    }
    let cpu = cpu_time()? - cpu_start;
    let wall = start.elapsed();
    Ok(ProbeCounts {
        per_backend,
        failed,
        cpu,
        wall,
    })
}

/// Everything the figure's rows are made of.
struct Measured {
    n: usize,
    spec: CheckSpec,
    window: Duration,
    counts: ProbeCounts,
    /// KiB, before the scheduler existed and at the end of the window.
    rss_before: u64,
    rss_after: u64,
}

impl Measured {
    fn probes(&self) -> u32 {
        self.counts.per_backend.values().sum()
    }

    fn cpu_percent(&self) -> f64 {
        let ProbeCounts { cpu, wall, .. } = self.counts;
        100.0 * cpu.total().as_secs_f64() / wall.as_secs_f64()
    }

    fn cpu_per_probe_us(&self) -> f64 {
        self.counts.cpu.total().as_secs_f64() * 1e6 / f64::from(self.probes().max(1))
    }

    fn rss_row(&self, case: Case) -> Row {
        Row {
            figure: format!("prober RSS, {}", case.label()),
            value: format!(
                "{:.1} MiB ({:+.1} MiB with the {} backends)",
                self.rss_after as f64 / 1024.0,
                (self.rss_after as f64 - self.rss_before as f64) / 1024.0,
                self.n
            ),
            target: "none set (reported)".to_owned(),
            verdict: Verdict::Info,
        }
    }

    /// The probe rate's row of this window.
    fn rate_row(&self, case: Case) -> Row {
        let ProbeCounts {
            per_backend,
            failed,
            wall,
            ..
        } = &self.counts;
        let probes: u32 = per_backend.values().sum();
        let probes_per_s = f64::from(probes) / wall.as_secs_f64();
        let expected_rate = self.n as f64 / self.spec.interval.as_secs_f64();
        let failures: u32 = failed.values().sum();
        let failed_text = if failed.is_empty() {
            "0 failed".to_owned()
        } else {
            let mut codes: Vec<_> = failed.iter().map(|(c, k)| format!("{k} {c}")).collect();
            codes.sort();
            format!("{failures} failed ({})", codes.join(", "))
        };
        let rate_ok = (probes_per_s - expected_rate).abs() <= expected_rate * RATE_TOLERANCE;
        Row {
            figure: format!(
                "probe rate, {} backends @ {}, {}",
                self.n,
                Compact(self.spec.interval),
                case.label()
            ),
            value: format!("{probes_per_s:.0} probes/s, {failed_text}"),
            target: format!(
                "{:.0} ± {:.0}%, 0 failed",
                expected_rate,
                RATE_TOLERANCE * 100.0
            ),
            verdict: Verdict::of(rate_ok && failures == 0),
        }
    }

    fn per_backend_row(&self, case: Case) -> Row {
        let Self {
            n, spec, window, ..
        } = self;
        let per_backend = &self.counts.per_backend;
        // Each backend should have been probed window/interval times, give or
        // take the tolerance and one probe at either edge of the window.
        let per_expected = window.as_secs_f64() / spec.interval.as_secs_f64();
        let per_low = (per_expected * (1.0 - RATE_TOLERANCE) - 1.0)
            .floor()
            .max(1.0) as u32;
        let per_high = (per_expected * (1.0 + RATE_TOLERANCE) + 1.0).ceil() as u32;
        let per_min = (0u64..*n as u64)
            .map(|id| per_backend.get(&id).copied().unwrap_or(0))
            .min()
            .unwrap_or(0);
        let per_max = per_backend.values().copied().max().unwrap_or(0);
        let per_ok = (per_low..=per_high).contains(&per_min) && per_max <= per_high;
        Row {
            figure: format!("probes per backend in {}, {}", Secs(*window), case.label()),
            value: format!("min {per_min} / max {per_max}"),
            target: format!("each in {per_low}..={per_high}"),
            verdict: Verdict::of(per_ok),
        }
    }
}

/// The figure's rows from every window, case by case, and its headline
/// figures recorded for `cargo xtask bench`.
fn summary_rows(windows: &[(Case, Measured)], reopen: u32) -> Vec<Row> {
    let of = |case: Case| -> Vec<&Measured> {
        windows
            .iter()
            .filter(|(c, _)| *c == case)
            .map(|(_, m)| m)
            .collect()
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let fresh_percents: Vec<f64> = of(Case::Fresh).iter().map(|m| m.cpu_percent()).collect();
    // The same median as the default's own figure (mean of the middle two).
    let fresh_percent = Figure::median_of("", "", "", &fresh_percents, "%").value;
    let fresh_us = median(
        of(Case::Fresh)
            .iter()
            .map(|m| m.cpu_per_probe_us())
            .collect(),
    );
    let mut rows = Vec::new();
    for case in Case::all(reopen) {
        let measured = of(case);
        let Some(last) = measured.last() else {
            continue;
        };
        let percents: Vec<f64> = measured.iter().map(|m| m.cpu_percent()).collect();
        let mut figure =
            Figure::median_of("xlb-health-bench", GROUP, &case.label(), &percents, "%")
                .target(Target::AtMost(TARGET_PERCENT));
        if case != Case::Fresh && fresh_percent.is_finite() {
            figure = figure.against(&Case::Fresh.label(), fresh_percent);
        }
        figure.record();
        rows.push(cpu_row(case, &measured, figure.value, fresh_us));
        // A window that missed its rate or per-backend count is the one
        // shown; otherwise the last.
        let pick = |row: fn(&Measured, Case) -> Row| {
            let all: Vec<Row> = measured.iter().map(|m| row(m, case)).collect();
            all.iter()
                .find(|r| r.verdict == Verdict::Missed)
                .or(all.last())
                .cloned()
        };
        rows.extend(pick(Measured::rate_row));
        rows.extend(pick(Measured::per_backend_row));
        rows.push(last.rss_row(case));
    }
    rows
}

/// The CPU row of `case`: the median share of one core over its windows
/// (`median`), their spread, and the CPU per probe (against the default's,
/// `fresh_us`, for the other cases).
fn cpu_row(case: Case, measured: &[&Measured], median: f64, fresh_us: f64) -> Row {
    let percents: Vec<f64> = measured.iter().map(|m| m.cpu_percent()).collect();
    let (lo, hi) = percents
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let mut per_probe: Vec<f64> = measured.iter().map(|m| m.cpu_per_probe_us()).collect();
    per_probe.sort_by(f64::total_cmp);
    let us = per_probe
        .get(per_probe.len() / 2)
        .copied()
        .unwrap_or(f64::NAN);
    let (user, total) = measured.iter().fold((0.0, 0.0), |(u, t), m| {
        let cpu = m.counts.cpu;
        (u + cpu.user.as_secs_f64(), t + cpu.total().as_secs_f64())
    });
    // Without the default's windows (`--case reuse`) there is no ratio.
    let against = if case == Case::Fresh || !fresh_us.is_finite() {
        String::new()
    } else {
        format!(", {:.2}× the default's", us / fresh_us)
    };
    Row {
        figure: format!("probe CPU, {}", case.label()),
        value: format!(
            "{median:.1}% of one core (median of {}; {lo:.1}–{hi:.1}%; {us:.0} µs per \
             probe{against}; {:.0}% user)",
            measured.len(),
            100.0 * user / total.max(1e-9)
        ),
        target: format!("≤ {TARGET_PERCENT}% of one core"),
        verdict: Verdict::of(median <= TARGET_PERCENT),
    }
}

/// The cost figure's server process; killed when dropped.
struct ServerChild {
    child: tokio::process::Child,
    ports: Vec<u16>,
}

impl ServerChild {
    async fn spawn(n: usize) -> Result<Self> {
        let exe = std::env::current_exe().context("finding this benchmark's own executable")?;
        let mut child = tokio::process::Command::new(&exe)
            .arg("--serve")
            .arg(n.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} --serve {n}", exe.display()))?;
        let stdout = child.stdout.take().context("server child has no stdout")?;
        let mut line = String::new();
        let wait = Duration::from_secs(20);
        timeout(wait, BufReader::new(stdout).read_line(&mut line))
            .await
            .with_context(|| format!("server child did not list its ports within {}", Secs(wait)))?
            .context("reading the server child's ports")?;
        let ports = line
            .strip_prefix("ports ")
            .with_context(|| format!("server child said {line:?}, expected \"ports …\""))?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<Vec<u16>, _>>()
            .with_context(|| format!("server child's port list {line:?}"))?;
        ensure!(
            ports.len() == n,
            "server child listed {} ports, expected {n}",
            ports.len()
        );
        Ok(Self { child, ports })
    }

    /// Closes the child's stdin (its signal to exit) and waits for it a
    /// little; kills it if it lingers.
    async fn stop(&mut self) {
        drop(self.child.stdin.take());
        if timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_holds_a_reopening_of_every_connection() {
        assert_eq!(window_for(false, 10), Duration::from_secs(10));
        assert_eq!(window_for(true, 10), Duration::from_secs(10));
        assert_eq!(window_for(true, 2), Duration::from_secs(5));
        assert_eq!(window_for(false, 30), Duration::from_secs(30));
    }

    #[test]
    fn reuse_case_carries_its_reopen_every() {
        let base = base_spec();
        let CheckKind::Http(http) = Case::Reuse(30).spec(&base).kind else {
            panic!("an HTTP check");
        };
        assert_eq!(http.reuse_connection, Some(30));
        let CheckKind::Http(http) = Case::Fresh.spec(&base).kind else {
            panic!("an HTTP check");
        };
        assert_eq!(http.reuse_connection, None);
        assert_eq!(
            Case::Reuse(30).label(),
            "HTTP, reuse_connection (reopen_every 30)"
        );
    }
}
