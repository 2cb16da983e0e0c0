//! `cargo xtask bench --bin xlb-lru-bench`: the conntrack LRU on two cores.
//! A single-threaded test run cannot see lock contention, so here both CPUs
//! run `xlb_lb` at once (one pinned thread each, `BPF_PROG_TEST_RUN` in a
//! loop for the same window) and each layout of `XLB_CT` is measured with
//! one core alone and with both (`xlb_tests::bench::twocore`):
//! - the common LRU (`LRU_HASH`, what xlb ships);
//! - a per-CPU LRU (`BPF_F_NO_COMMON_LRU`, one map; created and pinned so
//!   the loader adopts it);
//! - Katran's layout, one ordinary LRU per CPU (played by one world per
//!   core, each with half the entries).
//!
//! 1. Rates per core: new flows (a SYN from a fresh source, one per run,
//!    so every one misses and inserts) and established packets (repeat
//!    mode), on a table kept full (a running LB's state: every insert
//!    evicts); each with one core alone and both at once, and new flows
//!    also on one core while the other floods the map with batched inserts
//!    (`BPF_MAP_UPDATE_BATCH`, the LRU's insert path with no syscall per
//!    entry: the most a neighbour can press, where one SYN per syscall
//!    keeps the two cores' inserts apart most of the time); and the LRU
//!    alone, batched inserts on one core and on both at once, where both
//!    cores spend nearly all their time in the LRU's insert. Rounds rotate
//!    the layouts, flip the cases' order and alternate the core measured
//!    alone; medians with their spread. The rate is 1 / the kernel's time
//!    of the program per packet (what an XDP core doing only this would
//!    reach), so a core waiting on the other's lock shows in it.
//! 2. What each layout does to a full table, in small fresh worlds (moved
//!    here from `xlb-guard-bench`): how many of ¾ × the table's entries,
//!    inserted on one core, stay; how many of 200 flows inserted on core 0
//!    survive a SYN flood of 4 × the table from fresh sources on core 1,
//!    and on core 0 itself (RSS spreads a spoofed flood over every queue).

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]
#![allow(clippy::print_stdout, reason = "a benchmark's report goes to stdout")]

use std::time::Duration;

use anyhow::{Context as _, bail};
use lb_common::Stat;
use xlb_tests::bench::{
    figures::{Figure, median},
    print_command,
    twocore::{Budget, EST_REPEAT, Kind, Layout, Load, Tally},
};

const BENCH: &str = "xlb-lru-bench";
const USAGE: &str = "usage: xlb-lru-bench [--rounds N] [--window-ms MS] [--ct-size ENTRIES] \
                     [--no-table-effects]\n  \
                     --rounds N          alternating rounds (default 7, at least 1)\n  \
                     --window-ms MS      length of each case's run (default 250)\n  \
                     --ct-size ENTRIES   conntrack entries of part 1 (default xlb's, 1048576)\n  \
                     --no-table-effects  skip part 2 (full table, floods)";
/// Part 2's table: small, so that floods of 4 × it are quick.
const EFFECTS_CT: u32 = 32_768;
/// Long-lived flows that should survive a flood.
const LONG_FLOWS: u32 = 200;

struct Args {
    rounds: usize,
    window: Duration,
    ct_size: u32,
    effects: bool,
}

fn parse_args() -> anyhow::Result<Option<Args>> {
    let mut a = Args {
        rounds: 7,
        window: Duration::from_millis(250),
        ct_size: lb_common::DEFAULT_CT_SIZE,
        effects: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .with_context(|| format!("{name} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--rounds" => a.rounds = value("--rounds")?.parse().context("--rounds")?,
            "--window-ms" => {
                a.window =
                    Duration::from_millis(value("--window-ms")?.parse().context("--window-ms")?);
            }
            "--ct-size" => a.ct_size = value("--ct-size")?.parse().context("--ct-size")?,
            "--no-table-effects" => a.effects = false,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            _ => bail!("unknown argument {arg:?}\n{USAGE}"),
        }
    }
    if a.rounds == 0 || a.ct_size < 1024 || a.window.is_zero() {
        bail!("--rounds must be at least 1, --ct-size at least 1024, --window-ms above 0\n{USAGE}");
    }
    Ok(Some(a))
}

fn main() -> anyhow::Result<()> {
    let Some(args) = parse_args()? else {
        return Ok(());
    };
    print_command(BENCH);
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    anyhow::ensure!(cpus >= 2, "two cores needed, this machine has {cpus}");
    rates(&args)?;
    if args.effects {
        println!();
        table_effects()?;
    }
    Ok(())
}

/// How the cores are used in a case.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cores {
    /// One core alone (core 0 and core 1 in turn, by round).
    One,
    /// Both cores, the same load.
    Two,
    /// One core measured while the other floods the conntrack map.
    Pressed,
}

impl Cores {
    fn label(self) -> &'static str {
        match self {
            Cores::One => "one core",
            Cores::Two => "two cores",
            Cores::Pressed => "one, other core flooding",
        }
    }
}

/// The cases of every layout, in the order of even rounds (odd rounds run
/// them backwards).
const CASES: [(Load, Cores); 7] = [
    (Load::NewFlows, Cores::One),
    (Load::NewFlows, Cores::Two),
    (Load::NewFlows, Cores::Pressed),
    (Load::Established, Cores::One),
    (Load::Established, Cores::Two),
    (Load::Flood, Cores::One),
    (Load::Flood, Cores::Two),
];

/// One case's rounds: per-core figures (the mean of the measured cores),
/// the share of the loop's time in the program, and a flooding core's
/// inserts per second.
#[derive(Default)]
struct Samples {
    rate: Vec<f64>,
    ns: Vec<f64>,
    busy: Vec<f64>,
    flood: Vec<f64>,
}

impl Samples {
    fn push(&mut self, measured: &[Tally], flood: Option<&Tally>) {
        let n = measured.len() as f64;
        let mean = |f: &dyn Fn(&Tally) -> f64| measured.iter().map(f).sum::<f64>() / n;
        self.rate.push(mean(&Tally::rate));
        self.ns.push(mean(&Tally::ns));
        self.busy
            .push(mean(&|t| t.kernel.as_secs_f64() / t.wall.as_secs_f64()));
        if let Some(f) = flood {
            self.flood.push(f.wall_rate());
        }
    }
}

/// Part 1.
fn rates(args: &Args) -> anyhow::Result<()> {
    let mut layouts = Vec::new();
    for kind in Kind::ALL {
        let mut l = Layout::new(kind, args.ct_size)?;
        // Fill: each core inserts more than half the table, so every layout
        // is full (a per-CPU share or a per-CPU map is half of it).
        let fill = Budget::packets(u64::from(args.ct_size) * 6 / 10);
        l.run(&[(0, Load::NewFlows), (1, Load::NewFlows)], fill)?;
        layouts.push(l);
    }
    let fails_before: Vec<u64> = layouts
        .iter()
        .map(|l| l.stat(Stat::CtInsertFail))
        .collect::<anyhow::Result<_>>()?;
    let mut results: Vec<Vec<Samples>> = Kind::ALL
        .iter()
        .map(|_| CASES.iter().map(|_| Samples::default()).collect())
        .collect();
    let budget = Budget::window(args.window);
    for round in 0..args.rounds {
        for i in 0..layouts.len() {
            // The layouts' order rotates, the cases' order flips, and the
            // core measured alone alternates.
            let li = (i + round) % layouts.len();
            for ci in 0..CASES.len() {
                let ci = if round % 2 == 0 {
                    ci
                } else {
                    CASES.len() - 1 - ci
                };
                let (load, cores) = CASES[ci];
                let (a, b) = (round % 2, 1 - round % 2);
                let jobs = match cores {
                    Cores::One => vec![(a, load)],
                    Cores::Two => vec![(a, load), (b, load)],
                    Cores::Pressed => vec![(a, load), (b, Load::Flood)],
                };
                let t = layouts[li].run(&jobs, budget)?;
                match cores {
                    Cores::Pressed => results[li][ci].push(&t[..1], Some(&t[1])),
                    Cores::One | Cores::Two => results[li][ci].push(&t, None),
                }
            }
        }
    }
    println!(
        "conntrack on two cores (BPF_PROG_TEST_RUN, one pinned thread per core; table of {} \
         entries, kept full; {} ms per case; median [min–max] of {} rounds alternating layouts, \
         cases, and the core measured alone; rate = 1 / the kernel's time per packet; busy = \
         share of the test loop's time in the program; flooding = the other core writes fresh \
         entries with BPF_MAP_UPDATE_BATCH, at the M/s of the last column)",
        args.ct_size,
        args.window.as_millis(),
        args.rounds,
    );
    for load in [Load::NewFlows, Load::Established, Load::Flood] {
        println!();
        report(load, &results);
    }
    println!();
    for (l, before) in layouts.iter().zip(fails_before) {
        let fails = l.stat(Stat::CtInsertFail)? - before;
        println!(
            "{:<30} ct_insert_fail during the rounds: {fails}",
            l.kind.name()
        );
    }
    Ok(())
}

fn spread(v: &[f64]) -> String {
    let f = Figure::median_of("", "", "", v, "");
    let (lo, hi) = f.spread.unwrap_or((f.value, f.value));
    format!("{:.2} [{lo:.2}–{hi:.2}]", f.value)
}

/// One load's table and figures.
fn report(load: Load, results: &[Vec<Samples>]) {
    let (what, group, unit) = match load {
        Load::Established => (
            format!("established (dsr-l2 ACK, repeat {EST_REPEAT}), per core"),
            "conntrack, two cores (established packets/s per core)",
            "Mpps",
        ),
        Load::NewFlows => (
            "new flows (SYN from a fresh source, dsr-l2, one per run), per core".to_string(),
            "conntrack, two cores (new flows/s per core)",
            "M/s",
        ),
        Load::Flood => (
            "the LRU alone: fresh entries written from userspace (BPF_MAP_UPDATE_BATCH, 1024 a \
             call; rate by the thread's CPU time in the calls), per core"
                .to_string(),
            "conntrack, two cores (batched inserts/s per core)",
            "M/s",
        ),
    };
    println!("{what}");
    println!(
        "{:<28} {:<25} {:>20} {:>6} {:>8} {:>8} {:>5} {:>9}",
        "layout", "cores", unit, "ns", "÷1 core", "÷common", "busy", "flooding"
    );
    let mega = |v: &[f64]| v.iter().map(|r| r / 1e6).collect::<Vec<f64>>();
    let cases: Vec<usize> = (0..CASES.len()).filter(|&c| CASES[c].0 == load).collect();
    let one = cases[0];
    for (li, kind) in Kind::ALL.into_iter().enumerate() {
        for (k, &ci) in cases.iter().enumerate() {
            let cores = CASES[ci].1;
            let s = &results[li][ci];
            let r = mega(&s.rate);
            let vs_one = median(&r) / median(&mega(&results[li][one].rate));
            let common = median(&mega(&results[0][ci].rate));
            let flood = if s.flood.is_empty() {
                "-".to_string()
            } else {
                format!("{:.2}", median(&mega(&s.flood)))
            };
            println!(
                "{:<28} {:<25} {:>20} {:>6.0} {vs_one:>8.2} {:>8.2} {:>4.0}% {flood:>9}",
                if k == 0 { kind.name() } else { "" },
                cores.label(),
                spread(&r),
                median(&s.ns),
                median(&r) / common,
                median(&s.busy) * 100.0,
            );
            let case = format!("{}, {}", kind.name(), cores.label());
            let f = Figure::median_of(BENCH, group, &case, &r, unit);
            let f = match (kind, cores) {
                (Kind::Common, Cores::One) => f,
                (Kind::Common, _) => {
                    f.against("common LRU, one core", median(&mega(&results[0][one].rate)))
                }
                (_, c) => f.against(&format!("common LRU, {}", c.label()), common),
            };
            f.record();
        }
    }
    println!(
        "(Katran's layout on one core is a common LRU of half the entries: its ÷common there is \
         the table size's effect, not a lock's; under contention compare the ÷1 core columns.)"
    );
}

/// Part 2: what each layout keeps of a full table and through floods, in
/// fresh small worlds.
fn table_effects() -> anyhow::Result<()> {
    println!(
        "what a full table keeps ({EFFECTS_CT} entries; one run each; flows inserted by SYNs \
         on the core named, from fresh sources)"
    );
    let columns = [
        format!("kept of {} on 1 core", EFFECTS_CT / 4 * 3),
        format!("{LONG_FLOWS} kept, flood core 1"),
        format!("{LONG_FLOWS} kept, flood core 0"),
    ];
    println!(
        "{:<30} {:>20} {:>22} {:>22}",
        "layout", columns[0], columns[1], columns[2]
    );
    for kind in Kind::ALL {
        let mut l = Layout::new(kind, EFFECTS_CT)?;
        let kept = [
            inserted_kept(&mut l, 0, EFFECTS_CT / 4 * 3)?,
            survivors(&mut l, 1)?,
            survivors(&mut l, 0)?,
        ];
        println!(
            "{:<30} {:>20} {:>22} {:>22}",
            kind.name(),
            kept[0],
            kept[1],
            kept[2]
        );
        for (column, kept) in columns.iter().zip(kept) {
            let case = format!("{}, {column}", kind.name());
            let group = format!("conntrack, full table of {EFFECTS_CT} (flows kept)");
            Figure::new(BENCH, &group, &case, f64::from(kept), "flows").record();
        }
    }
    Ok(())
}

/// Inserts `count` new flows on core `cpu` into an empty table; how many
/// are still there.
fn inserted_kept(l: &mut Layout, cpu: usize, count: u32) -> anyhow::Result<u32> {
    l.clear()?;
    let from = l.position(cpu);
    l.run(&[(cpu, Load::NewFlows)], Budget::packets(u64::from(count)))?;
    l.kept(cpu, from, l.position(cpu))
}

/// Inserts [`LONG_FLOWS`] on core 0 into an empty table, floods it with
/// 4 × the table's SYNs from core `flood_cpu`; how many long flows stay.
fn survivors(l: &mut Layout, flood_cpu: usize) -> anyhow::Result<u32> {
    l.clear()?;
    let from = l.position(0);
    l.run(
        &[(0, Load::NewFlows)],
        Budget::packets(u64::from(LONG_FLOWS)),
    )?;
    let to = l.position(0);
    let flood = Budget::packets(4 * u64::from(EFFECTS_CT));
    l.run(&[(flood_cpu, Load::NewFlows)], flood)?;
    l.kept(0, from, to)
}
