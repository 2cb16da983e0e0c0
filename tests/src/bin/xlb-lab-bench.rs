//! `cargo xtask bench`: HTTP through the lab with real TCP, measured with
//! wrk from the client namespace, the same run going round by round to:
//! one backend directly (no LB), xlb (`dsr-ipip`), HAProxy in `mode tcp` and
//! nftables DNAT (both full proxies in the LB namespace, over the same three
//! backends) and xlb's NAT mode (full NAT, the same job: issue 27); plus
//! xlb's `dsr-l2` and IPv6 VIPs. After the HTTP runs, NAT mode's detection
//! of a hung backend, passive against active probes alone
//! (`bench::nat_detect`, a lab of its own). Then a profile pass with
//! the kernel's BPF run-time statistics on: where the CPU goes (xlb's
//! programs, softirq, wrk, the backends, HAProxy). A benchmark, not a test.
//!
//! Everything (wrk, three backends, the LB, the bridge) shares this
//! machine's CPUs, so the figures say what the whole lab sustains and how
//! much each hop changes it, not the LB's own ceiling: that is
//! `xlb-bench`'s per-packet cost.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]
#![allow(clippy::print_stdout, reason = "a benchmark's report goes to stdout")]

use std::{net::Ipv4Addr, time::Duration};

use anyhow::{Context as _, bail};
use xlb_lab::{
    Lab,
    scenario::{LabRun, Mode, RunOptions, XlbConfig, find_xlb, log_tail, set_tx_checksum_offload},
    topology::HOST_IFNAME,
};
use xlb_tests::bench::{
    figures::{Figure, median},
    lab_cpu::{Sampler, Usage, WRK_GROUP, enable_run_time_stats},
    lab_proxies::{self, HAPROXY_PORT, NFT_LISTEN, NftDnat},
    lab_wrk::{self, WrkLoad, WrkResult},
    nat_detect, print_command,
};
use xlb_tests::nat_lab::{self, NatVip};

const BENCH: &str = "xlb-lab-bench";
const PREFIX: &str = "xlbw";

const USAGE: &str = "usage: xlb-lab-bench [--rounds N] [--duration SECS] [--profile-rounds N] \
                     [--detection-rounds N] [--compare-only]
  --rounds N            alternating rounds of every case (default 5)
  --duration SECS       length of each wrk run (default 8)
  --profile-rounds N    rounds of the profile pass, BPF statistics on (default 1; 0: none)
  --detection-rounds N  hangs of a backend behind NAT VIPs, passive against active only \
                        (default 3; 0: none)
  --compare-only        only direct, xlb dsr-ipip, xlb nat, HAProxy and nftables (no dsr-l2, IPv6)";

/// How long a case waits for every backend to be up before it starts.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The backends' service port, where every path ends.
const BACKEND_PORT: u16 = 80;

/// Where a case's requests go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// Straight to backend b1: no LB.
    Direct,
    XlbIpip,
    XlbL2,
    XlbIpipV6,
    /// xlb's NAT mode: full NAT, as HAProxy and nftables do it.
    XlbNat,
    Haproxy,
    Nft,
}

impl Path {
    fn label(self) -> &'static str {
        match self {
            Self::Direct => "direct to b1",
            Self::XlbIpip => "xlb dsr-ipip",
            Self::XlbL2 => "xlb dsr-l2",
            Self::XlbIpipV6 => "xlb dsr-ipip IPv6",
            Self::XlbNat => "xlb nat",
            Self::Haproxy => "HAProxy mode tcp",
            Self::Nft => "nftables DNAT",
        }
    }

    fn url(self, lab: &Lab) -> String {
        match self {
            Self::Direct => format!("http://{}/api", lab.backend_v4(1)),
            // `lab_default`: api on VIP_V4 in the given mode, api2 on VIP2_V4
            // in the other one, api6 on VIP_V6.
            Self::XlbIpip => format!("http://{}/api", lab.vip_v4()),
            Self::XlbL2 => format!("http://{}/api", lab.vip2_v4()),
            Self::XlbIpipV6 => format!("http://[{}]/api", lab.vip_v6()),
            Self::XlbNat => format!("http://{}/api", nat_vip().target()),
            Self::Haproxy => format!("http://{}/api", lab_proxies::on_lb(lab, HAPROXY_PORT)),
            Self::Nft => format!("http://{NFT_LISTEN}/api"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Case {
    path: Path,
    /// `Connection: close`: a new connection per request.
    close: bool,
}

impl Case {
    fn label(self) -> String {
        let conn = if self.close { "close" } else { "keep-alive" };
        format!("{}, {conn}", self.path.label())
    }

    /// The direct case with the same connection handling: the baseline.
    fn baseline(self) -> Case {
        Case {
            path: Path::Direct,
            close: self.close,
        }
    }
}

/// The cases of a run: the four compared paths with and without
/// keep-alive, then (unless `compare_only`) xlb's other VIPs.
fn cases(compare_only: bool) -> Vec<Case> {
    let compared = [
        Path::Direct,
        Path::XlbIpip,
        Path::XlbNat,
        Path::Haproxy,
        Path::Nft,
    ];
    let mut v: Vec<Case> = [false, true]
        .into_iter()
        .flat_map(|close| compared.map(|path| Case { path, close }))
        .collect();
    if !compare_only {
        for path in [Path::XlbL2, Path::XlbIpipV6] {
            v.push(Case { path, close: false });
        }
    }
    v
}

#[derive(Debug, PartialEq)]
struct Args {
    rounds: usize,
    profile_rounds: usize,
    detection_rounds: usize,
    load: WrkLoad,
    compare_only: bool,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> anyhow::Result<Args> {
    let mut out = Args {
        rounds: 5,
        profile_rounds: 1,
        detection_rounds: 3,
        load: WrkLoad::default(),
        compare_only: false,
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> anyhow::Result<u64> {
            let v = args
                .next()
                .with_context(|| format!("{name} needs a value\n{USAGE}"))?;
            v.parse()
                .with_context(|| format!("{name} {v:?}: not a whole number\n{USAGE}"))
        };
        match arg.as_str() {
            "--rounds" => out.rounds = usize::try_from(number("--rounds")?)?,
            "--profile-rounds" => {
                out.profile_rounds = usize::try_from(number("--profile-rounds")?)?;
            }
            "--detection-rounds" => {
                out.detection_rounds = usize::try_from(number("--detection-rounds")?)?;
            }
            "--duration" => out.load.duration = Duration::from_secs(number("--duration")?),
            "--compare-only" => out.compare_only = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => bail!("unknown argument {arg:?}\n{USAGE}"),
        }
    }
    if out.rounds == 0 || out.load.duration.is_zero() {
        bail!("--rounds and --duration must be at least 1\n{USAGE}");
    }
    Ok(out)
}

/// The lab, with HAProxy started in it; nftables' table is installed only
/// around its own runs.
struct Bench {
    run: LabRun,
    load: WrkLoad,
}

impl Bench {
    /// Runs `case` once: installs the DNAT table around an nftables run, so
    /// that conntrack's hooks never touch the other cases; `around` is
    /// called just before and just after wrk, for the profile's samples.
    fn run_case(
        &self,
        case: Case,
        mut around: impl FnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<WrkResult> {
        let lab = self.run.lab();
        // A case starts on a healthy lab: the previous one may have loaded
        // the machine enough that probes timed out and backends went down.
        self.run
            .wait_all_up(READY_TIMEOUT)
            .with_context(|| format!("before case {:?}", case.label()))?;
        let _dnat = match case.path {
            Path::Nft => Some(NftDnat::up(
                &lab.ns_lb(),
                &lab.ns_client(),
                self.run.work_dir(),
                NFT_LISTEN,
                &lab_proxies::backend_addrs(lab, BACKEND_PORT),
            )?),
            _ => None,
        };
        around()?;
        let r = lab_wrk::run(
            &lab.ns_client(),
            &case.path.url(lab),
            case.close,
            &self.load,
        )
        .with_context(|| format!("case {:?}", case.label()))?;
        around()?;
        Ok(r)
    }
}

/// Every case once per round, each round starting one case later, so that
/// no case always runs first (or right after the same neighbour).
fn rounds(bench: &Bench, cases: &[Case], n: usize) -> anyhow::Result<Vec<Vec<WrkResult>>> {
    let mut results: Vec<Vec<WrkResult>> = vec![Vec::new(); cases.len()];
    for round in 0..n {
        for k in 0..cases.len() {
            let i = (round + k) % cases.len();
            let r = bench.run_case(cases[i], || Ok(()))?;
            println!(
                "round {}/{n}: {:<34} {:>9.0} req/s",
                round + 1,
                cases[i].label(),
                r.rps
            );
            results[i].push(r);
        }
    }
    Ok(results)
}

/// The profile pass: each case `n` times with BPF run-time statistics on
/// (only for this pass: they cost two clock reads per program run).
fn profile(bench: &Bench, cases: &[Case], n: usize) -> anyhow::Result<(Sampler, Vec<Usage>)> {
    let sampler = Sampler::new(bench.run.lab())?;
    let mut usage = vec![Usage::default(); cases.len()];
    let stats = enable_run_time_stats()?;
    for _ in 0..n {
        for (i, case) in cases.iter().enumerate() {
            let mut samples = Vec::new();
            let r = bench.run_case(*case, || {
                samples.push(sampler.sample()?);
                Ok(())
            })?;
            if let [before, after] = &samples[..] {
                usage[i].add(before, after, r.requests);
            }
        }
    }
    drop(stats);
    Ok((sampler, usage))
}

fn main() -> anyhow::Result<()> {
    xlb_tests::require_root();
    let args = parse_args(std::env::args().skip(1))?;
    println!("xlb lab HTTP benchmark");
    print_command(BENCH);
    let xlb = find_xlb()?;
    let mut run = start_lab(&xlb)?;
    let (listen, backends) = {
        let lab = run.lab();
        let backends = lab_proxies::backend_addrs(lab, BACKEND_PORT);
        (lab_proxies::on_lb(lab, HAPROXY_PORT), backends)
    };
    lab_proxies::start_haproxy(&mut run, listen, &backends)?;
    let bench = Bench {
        run,
        load: args.load,
    };
    let cases = cases(args.compare_only);
    let measured = rounds(&bench, &cases, args.rounds).map(|results| {
        // The throughput figures stand without the profile: a profile that
        // fails (statistics unavailable, say) is reported, not fatal.
        let profiled = (args.profile_rounds > 0)
            .then(|| profile(&bench, &cases, args.profile_rounds))
            .and_then(|r| {
                r.map_err(|e| eprintln!("xlb-lab-bench: profile pass failed: {e:#}"))
                    .ok()
            });
        (results, profiled)
    });
    let status = bench.run.status_text().unwrap_or_default();
    if measured.is_err() {
        // The lab's logs go with it: quote what explains a failure.
        let log = bench.run.daemon_log();
        eprintln!("xlb status:\n{status}\nxlb daemon log:\n{}", log_tail(&log));
    }
    bench.run.shutdown()?;
    let (results, profiled) = measured?;

    report::throughput(&args, &cases, &results);
    if let Some((sampler, usage)) = &profiled {
        report::programs(sampler, &cases, usage);
        report::cpu(&cases, usage);
    }
    println!("\nxlb status after the runs:\n{status}");
    if args.detection_rounds > 0 {
        let rounds = nat_detect::run(&xlb, args.detection_rounds)?;
        nat_detect::report(BENCH, &rounds);
    }
    Ok(())
}

/// The NAT VIP: 10.100.0.3:80, which no backend holds, over the same
/// backends and port as HAProxy and nftables.
fn nat_vip() -> NatVip {
    NatVip {
        backend_port: BACKEND_PORT,
        ..NatVip::tcp("apinat", Ipv4Addr::new(10, 100, 0, 3).into(), 80, 3)
    }
}

/// The lab with `lab_default`'s VIPs and [`nat_vip`], its pool address on
/// the LB before xlb starts (xlb refuses a pool on no interface), every
/// backend up. The backends compute their own TCP checksums, as the
/// client does: NAT's answers cross the LB's XDP program, which would
/// pass a veth's partial checksum on as a corrupt one (every case runs
/// so, for the same comparison).
fn start_lab(xlb: &std::path::Path) -> anyhow::Result<LabRun> {
    let cfg = XlbConfig::lab_default(PREFIX, Mode::DsrIpip, 3);
    let text = format!("{}{}", cfg.render(), nat_vip().render());
    let mut run = LabRun::up_with(RunOptions {
        start_daemon: false,
        ..RunOptions::new(PREFIX, xlb, &text)
    })?;
    nat_lab::add_pool_addresses(&run)?;
    for ns in run.lab().backend_namespaces() {
        set_tx_checksum_offload(&ns, HOST_IFNAME, false)?;
    }
    run.start_daemon()?;
    run.wait_all_up(READY_TIMEOUT)?;
    Ok(run)
}

/// The report: tables on stdout and the figures for `cargo xtask bench`.
mod report {
    use super::{Args, BENCH, Case, Figure, Sampler, Usage, WRK_GROUP, WrkResult, median};

    /// `min–max` of `v` with `decimals` decimals.
    fn spread(v: &[f64], decimals: usize) -> String {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{min:.decimals$}–{max:.decimals$}")
    }

    /// The median of one field over a case's rounds (`None` values left out).
    fn values(rs: &[WrkResult], f: impl Fn(&WrkResult) -> Option<f64>) -> Vec<f64> {
        rs.iter().filter_map(f).collect()
    }

    fn index_of(cases: &[Case], case: Case) -> Option<usize> {
        cases.iter().position(|c| *c == case)
    }

    /// Medians over rounds with their spread, the ratio to the direct case
    /// of the same connection handling, and the figures.
    pub(super) fn throughput(args: &Args, cases: &[Case], results: &[Vec<WrkResult>]) {
        println!(
            "\nxlb lab HTTP: wrk {} --latency from the client namespace; rounds: {}, the cases \
             alternating; medians (min–max over rounds); ×direct: against the direct case of the \
             same connection handling; every process shares this machine's CPUs",
            args.load.describe(),
            args.rounds
        );
        println!(
            "{:<30} {:>7} {:>13} {:>7} {:>7} {:>7} {:>11} {:>7}  errors/requests",
            "case", "req/s", "min–max", "×direct", "p50 ms", "p99 ms", "min–max", "×direct"
        );
        let mut figures: [Vec<Figure>; 2] = [Vec::new(), Vec::new()];
        for (i, case) in cases.iter().enumerate() {
            let rps = values(&results[i], |r| Some(r.rps));
            let p50 = values(&results[i], |r| r.p50_ms);
            let p99 = values(&results[i], |r| r.p99_ms);
            let base = index_of(cases, case.baseline()).filter(|&b| b != i);
            let base_rps = base.map(|b| median(&values(&results[b], |r| Some(r.rps))));
            let base_p99 = base.map(|b| median(&values(&results[b], |r| r.p99_ms)));
            let ratio =
                |v: f64, b: Option<f64>| b.map_or("-".to_string(), |b| format!("{:.2}", v / b));
            let errors: u64 = results[i].iter().map(|r| r.errors).sum();
            let requests: u64 = results[i].iter().map(|r| r.requests).sum();
            println!(
                "{:<30} {:>7.0} {:>13} {:>7} {:>7.2} {:>7.2} {:>11} {:>7}  {errors}/{requests}",
                case.label(),
                median(&rps),
                spread(&rps, 0),
                ratio(median(&rps), base_rps),
                median(&p50),
                median(&p99),
                spread(&p99, 2),
                ratio(median(&p99), base_p99),
            );
            let figure = |group: &str, v: &[f64], unit: &str, b: Option<f64>| {
                let f = Figure::median_of(BENCH, group, &case.label(), v, unit);
                match b {
                    Some(b) => f.against(&case.baseline().label(), b),
                    None => f,
                }
            };
            figures[0].push(figure("lab HTTP (req/s)", &rps, "req/s", base_rps));
            figures[1].push(figure("lab HTTP p99 (ms)", &p99, "ms", base_p99));
        }
        // One group after the other: the summary prints groups as recorded.
        figures.iter().flatten().for_each(Figure::record);
    }

    /// A figure of the profile pass: a total over its runs (no spread).
    fn profiled(u: &Usage, group: &str, case: &str, value: f64, unit: &str) -> Figure {
        Figure {
            runs: u.runs,
            ..Figure::new(BENCH, group, case, value, unit)
        }
    }

    /// Program names in the order of the data path.
    const PROGRAMS: [&str; 4] = ["xlb_lb", "xlb_hc", "xlb_decap", "xlb_pass"];

    pub(super) fn programs(sampler: &Sampler, cases: &[Case], usage: &[Usage]) {
        println!(
            "\nwhere the CPU goes, 1/2: xlb's programs (BPF run-time statistics on; {} profiled \
             run(s) per case): ns per run, runs per request, % of all CPU time; then all of \
             them per request (µs) and as % of the busy CPU time per request",
            usage.first().map_or(0, |u| u.runs)
        );
        for p in sampler.programs() {
            println!("  {:<10} id {:<6} {}", p.name, p.id, p.place);
        }
        print!("{:<30}", "case");
        for name in PROGRAMS {
            print!(" {:>26}", format!("{name} ns, /req, %"));
        }
        println!(" {:>8} {:>7}", "µs/req", "% busy");
        for (case, u) in cases.iter().zip(usage) {
            print!("{:<30}", case.label());
            for name in PROGRAMS {
                let cell = u
                    .program(name)
                    .map_or("-".to_string(), |(ns, per_req, pct)| {
                        format!("{ns:.0}, {per_req:.1}, {pct:.2}%")
                    });
                print!(" {cell:>26}");
            }
            let ours = u.programs_us_per_request();
            println!(
                " {ours:>8.2} {:>6.1}%",
                100.0 * ours / u.busy_us_per_request().max(f64::MIN_POSITIVE)
            );
            if *case == super::compared_xlb() {
                for name in PROGRAMS {
                    // Programs that saw this case's traffic, not only
                    // the health probes (xlb_hc, outside the VIP's path).
                    if let Some((ns, per_req, _)) = u.program(name)
                        && per_req >= 0.5
                    {
                        profiled(u, "lab xlb programs (ns per run)", name, ns, "ns").record();
                    }
                }
                // All programs' run time per request: what xlb adds.
                let name = "all of them, per request";
                profiled(u, "lab xlb programs (ns per run)", name, ours * 1e3, "ns").record();
            }
        }
    }

    /// Groups of processes, in the order of the table.
    const GROUPS: [&str; 5] = [
        WRK_GROUP,
        "backends",
        "haproxy",
        "xlb (user space)",
        "other (lab)",
    ];

    pub(super) fn cpu(cases: &[Case], usage: &[Usage]) {
        println!(
            "\nwhere the CPU goes, 2/2: % of all CPU time (every CPU, /proc/stat) in the same \
             runs; irq = hard + soft interrupts (XDP, veth, TCP receive); the process columns are \
             the lab's processes' own time (user + system)"
        );
        print!(
            "{:<30} {:>9} {:>6} {:>6} {:>6} {:>6} {:>6}",
            "case", "µs/req", "user", "sys", "irq", "steal", "idle"
        );
        for g in GROUPS {
            print!(" {:>9}", g.split(' ').next().unwrap_or(g));
        }
        println!();
        for (case, u) in cases.iter().zip(usage) {
            let c = &u.cpu;
            print!(
                "{:<30} {:>9.1} {:>6.1} {:>6.1} {:>6.1} {:>6.1} {:>6.1}",
                case.label(),
                u.busy_us_per_request(),
                u.pct_ticks(c.user),
                u.pct_ticks(c.system),
                u.pct_ticks(c.irq),
                u.pct_ticks(c.steal),
                u.pct_ticks(c.idle),
            );
            for g in GROUPS {
                print!(
                    " {:>9.1}",
                    u.pct_ticks(u.groups.get(g).copied().unwrap_or(0))
                );
            }
            println!();
            let base = index_of(cases, case.baseline()).map(|b| usage[b].busy_us_per_request());
            let group = "lab busy CPU per request (µs)";
            let f = profiled(u, group, &case.label(), u.busy_us_per_request(), "µs");
            match base.filter(|_| case.path != super::Path::Direct) {
                Some(b) => f.against(&case.baseline().label(), b),
                None => f,
            }
            .record();
        }
    }
}

/// The xlb case whose programs' figures are recorded.
fn compared_xlb() -> Case {
    Case {
        path: Path::XlbIpip,
        close: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments() {
        let parse = |s: &str| parse_args(s.split_whitespace().map(str::to_owned));
        let d = parse("").unwrap();
        assert_eq!((d.rounds, d.profile_rounds, d.compare_only), (5, 1, false));
        assert_eq!(d.detection_rounds, 3);
        assert_eq!(d.load, WrkLoad::default());
        let a =
            parse("--rounds 2 --duration 3 --profile-rounds 0 --detection-rounds 0 --compare-only")
                .unwrap();
        assert_eq!(a.detection_rounds, 0);
        assert_eq!((a.rounds, a.profile_rounds, a.compare_only), (2, 0, true));
        assert_eq!(a.load.duration, Duration::from_secs(3));
        for bad in [
            "--rounds",
            "--rounds x",
            "--rounds 0",
            "--duration 0",
            "--fast",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_compared_path_runs_both_ways_against_direct() {
        let all = cases(false);
        for path in [
            Path::Direct,
            Path::XlbIpip,
            Path::XlbNat,
            Path::Haproxy,
            Path::Nft,
        ] {
            for close in [false, true] {
                assert!(
                    all.contains(&Case { path, close }),
                    "{path:?} close={close}"
                );
            }
        }
        assert!(all.iter().all(|c| all.contains(&c.baseline())));
        assert_eq!(cases(true).len(), 10);
        assert_eq!(all.len(), 12);
    }
}
