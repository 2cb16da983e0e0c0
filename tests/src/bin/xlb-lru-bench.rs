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
//!    evicts). Rounds alternate the layouts and which of one core / two
//!    cores goes first; medians with their spread. The rate is 1 / the
//!    kernel's time of the program per packet (what an XDP core doing only
//!    this would reach); the loop rate with syscalls is printed beside it.
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
    figures::Figure,
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

/// One case's rounds: per-core rates (mean of the cores that ran), ns,
/// loop rates.
#[derive(Default)]
struct Samples {
    rate: Vec<f64>,
    ns: Vec<f64>,
    wall: Vec<f64>,
}

impl Samples {
    fn push(&mut self, cores: &[Tally]) {
        let n = cores.len() as f64;
        self.rate
            .push(cores.iter().map(Tally::rate).sum::<f64>() / n);
        self.ns.push(cores.iter().map(Tally::ns).sum::<f64>() / n);
        self.wall
            .push(cores.iter().map(Tally::wall_rate).sum::<f64>() / n);
    }
}

/// Samples by layout, load (new, established), one core / two cores.
type Results = Vec<[[Samples; 2]; 2]>;

const LOADS: [Load; 2] = [Load::NewFlows, Load::Established];

/// Part 1.
fn rates(args: &Args) -> anyhow::Result<()> {
    let mut layouts = Vec::new();
    for kind in Kind::ALL {
        let mut l = Layout::new(kind, args.ct_size)?;
        // Fill: each core inserts more than half the table, so every layout
        // is full (a per-CPU share or a per-CPU map is half of it).
        let fill = u64::from(args.ct_size) * 6 / 10;
        l.run(&[0, 1], Load::NewFlows, Budget::packets(fill))?;
        layouts.push(l);
    }
    let fails_before: Vec<u64> = layouts
        .iter()
        .map(|l| l.stat(Stat::CtInsertFail))
        .collect::<anyhow::Result<_>>()?;
    let mut results: Results = Kind::ALL.iter().map(|_| Default::default()).collect();
    let budget = Budget::window(args.window);
    for round in 0..args.rounds {
        for i in 0..layouts.len() {
            // The layouts' order rotates, and one core / two cores swap.
            let li = (i + round) % layouts.len();
            for (ld, load) in LOADS.into_iter().enumerate() {
                for both in [round % 2 == 1, round % 2 == 0] {
                    let cpus: &[usize] = if both { &[0, 1] } else { &[0] };
                    let cores = layouts[li].run(cpus, load, budget)?;
                    results[li][ld][usize::from(both)].push(&cores);
                }
            }
        }
    }
    println!(
        "conntrack on two cores (BPF_PROG_TEST_RUN, one pinned thread per core; table of {} \
         entries, kept full; {} ms per case; median [min–max] of {} rounds alternating layouts \
         and one/two cores; rate = 1 / the kernel's time per packet; loop = the test loop's \
         own rate, syscalls included)",
        args.ct_size,
        args.window.as_millis(),
        args.rounds
    );
    for (ld, load) in LOADS.into_iter().enumerate() {
        println!();
        report(load, &mut results, ld);
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

fn median(v: &[f64]) -> f64 {
    Figure::median_of("", "", "", v, "").value
}

fn spread(v: &[f64]) -> String {
    let f = Figure::median_of("", "", "", v, "");
    let (lo, hi) = f.spread.unwrap_or((f.value, f.value));
    format!("{:.2} [{lo:.2}–{hi:.2}]", f.value)
}

/// One load's table and figures.
fn report(load: Load, results: &mut Results, ld: usize) {
    let (what, group, unit) = match load {
        Load::NewFlows => (
            "new flows (SYN from a fresh source, dsr-l2, one per run), per core, M/s".to_string(),
            "conntrack, two cores (new flows/s per core)",
            "M/s",
        ),
        Load::Established => (
            format!("established (dsr-l2 ACK, repeat {EST_REPEAT}), per core, Mpps"),
            "conntrack, two cores (established packets/s per core)",
            "Mpps",
        ),
    };
    println!("{what}");
    println!(
        "{:<30} {:>22} {:>7} {:>22} {:>7} {:>7} {:>8} {:>10}",
        "layout", "one core", "ns", "two cores", "ns", "2÷1", "÷common", "loop k/s"
    );
    let mega = |v: &[f64]| v.iter().map(|r| r / 1e6).collect::<Vec<f64>>();
    let common = [0, 1].map(|b| median(&mega(&results[0][ld][b].rate)));
    for (li, kind) in Kind::ALL.into_iter().enumerate() {
        let [one, two] = &results[li][ld];
        let (r1, r2) = (mega(&one.rate), mega(&two.rate));
        println!(
            "{:<30} {:>22} {:>7.0} {:>22} {:>7.0} {:>7.2} {:>8.2} {:>10.0}",
            kind.name(),
            spread(&r1),
            median(&one.ns),
            spread(&r2),
            median(&two.ns),
            median(&r2) / median(&r1),
            median(&r2) / common[1],
            median(&two.wall) / 1e3
        );
        let case = |n: &str| format!("{}, {n}", kind.name());
        let f1 = Figure::median_of(BENCH, group, &case("one core"), &r1, unit);
        let f2 = Figure::median_of(BENCH, group, &case("two cores"), &r2, unit);
        if kind == Kind::Common {
            f1.record();
            f2.against("common LRU, one core", common[0]).record();
        } else {
            f1.against("common LRU, one core", common[0]).record();
            f2.against("common LRU, two cores", common[1]).record();
        }
    }
}

/// Part 2: what each layout keeps of a full table and through floods, in
/// fresh small worlds.
fn table_effects() -> anyhow::Result<()> {
    println!(
        "what a full table keeps ({EFFECTS_CT} entries; one run each; flows inserted by SYNs \
         on the core named, from fresh sources)"
    );
    println!(
        "{:<30} {:>20} {:>22} {:>22}",
        "layout",
        format!("kept of {} on 1 core", EFFECTS_CT / 4 * 3),
        format!("{LONG_FLOWS} kept, flood core 1"),
        format!("{LONG_FLOWS} kept, flood core 0")
    );
    for kind in Kind::ALL {
        let mut l = Layout::new(kind, EFFECTS_CT)?;
        let capacity = inserted_kept(&mut l, 0, EFFECTS_CT / 4 * 3)?;
        let other = survivors(&mut l, 1)?;
        let same = survivors(&mut l, 0)?;
        println!("{:<30} {capacity:>20} {other:>22} {same:>22}", kind.name());
    }
    Ok(())
}

/// Inserts `count` new flows on core `cpu` into an empty table; how many
/// are still there.
fn inserted_kept(l: &mut Layout, cpu: usize, count: u32) -> anyhow::Result<u32> {
    l.clear()?;
    let from = l.position(cpu);
    l.run(&[cpu], Load::NewFlows, Budget::packets(u64::from(count)))?;
    l.kept(cpu, from, l.position(cpu))
}

/// Inserts [`LONG_FLOWS`] on core 0 into an empty table, floods it with
/// 4 × the table's SYNs from core `flood_cpu`; how many long flows stay.
fn survivors(l: &mut Layout, flood_cpu: usize) -> anyhow::Result<u32> {
    l.clear()?;
    let from = l.position(0);
    l.run(&[0], Load::NewFlows, Budget::packets(u64::from(LONG_FLOWS)))?;
    let to = l.position(0);
    l.run(
        &[flood_cpu],
        Load::NewFlows,
        Budget::packets(4 * u64::from(EFFECTS_CT)),
    )?;
    l.kept(0, from, to)
}
