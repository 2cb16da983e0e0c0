//! `cargo xtask bench`: several xlb nodes behind a BIRD router (issue 26),
//! in the two-node lab. A benchmark, not a test: it prints what it
//! measured, the settings and the command that reproduces it; it fails
//! only when it cannot measure (the assertions are `tests/tests/cluster.rs`).
//!
//! - Convergence: held connections (a keep-alive request and answer every
//!   20 ms each, through the VIP) run through both nodes; node A dies
//!   (killed, its link silenced, or `xlb withdraw --all`); the figure is
//!   the time from the death to the last held connection answering again,
//!   on its backend. With BIRD's default timers (hold 240 s) and with BFD
//!   at 100 ms × 3; a silent link with the defaults is not run: the hold
//!   time it waits is computed.
//! - Announcement latency: VIP api2's only backend fails and heals, a few
//!   times; per node, from the backend transition that makes the VIP
//!   (un)servable (the daemon's event time) to the router's route losing or
//!   gaining the node (`ip monitor route` in the router's namespace).
//!
//! Each lab is its own (namespaces `cb<tag><pid>-…`) and is removed after.
//!
//! Usage: `xlb-cluster-bench [--quick] [--rounds N] [--connections N]
//! [--cycles N]` (as root, with `xlb` and `xlb-backend` built in release
//! next to it: `cargo xtask bench` does it).

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]
#![allow(clippy::print_stdout, reason = "a benchmark's report goes to stdout")]

use anyhow::{Result, bail};
use xlb_tests::bench::{
    arg,
    cluster::{BIRD_DEFAULT_HOLD_S, Death, Timers, cases, convergence_figure, latency_figures},
    cluster_lab::{self, Round, WAITED},
    figures::{self, Figure},
    print_command,
};

const USAGE: &str =
    "usage: xlb-cluster-bench [--quick] [--rounds N] [--connections N] [--cycles N] [--timers T]
  --quick          BFD only, process death and silent link, one round, 3 cycles
  --rounds N       deaths per case (default 3)
  --connections N  held connections (default 100)
  --cycles N       fail/heal cycles for the announcement latency (default 5)
  --timers T       the labs to run: bfd, defaults or both (default)";

/// A number after `--name`, or `default`.
fn num(name: &str, default: usize) -> Result<usize> {
    match arg(name) {
        None => Ok(default),
        Some(v) => match v.parse() {
            Ok(n) if n >= 1 => Ok(n),
            _ => bail!("{name} {v:?}: a number >= 1 expected\n{USAGE}"),
        },
    }
}

struct Settings {
    quick: bool,
    rounds: usize,
    connections: u32,
    cycles: usize,
    /// `bfd`, `defaults` or `both`: the labs to run.
    timers: String,
}

fn settings() -> Result<Option<Settings>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            "--quick" => {}
            "--rounds" | "--connections" | "--cycles" | "--timers" => i += 1,
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
        i += 1;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let timers = arg("--timers").unwrap_or_else(|| "both".to_string());
    if !["bfd", "defaults", "both"].contains(&timers.as_str()) {
        bail!("--timers {timers:?}: bfd, defaults or both\n{USAGE}");
    }
    Ok(Some(Settings {
        quick,
        rounds: num("--rounds", if quick { 1 } else { 3 })?,
        connections: u32::try_from(num("--connections", 100)?)?,
        cycles: num("--cycles", if quick { 3 } else { 5 })?,
        timers,
    }))
}

fn print_round(death: Death, n: usize, r: &Round) {
    let c = r.report.convergence(r.death_ms, WAITED);
    let back = r.report.convergence(r.back_ms, WAITED);
    println!(
        "  {} #{n}: router switched in {} ms; held {}, waited {}, lost {}; last back after {}; \
         node A's return: waited {}, lost {}; kept to the end {} of {}",
        death.name(),
        r.router_ms,
        c.held,
        c.waited,
        c.lost,
        c.last_back_ms
            .map_or("-".to_string(), |ms| format!("{ms} ms")),
        back.waited,
        back.lost,
        r.report.kept(),
        r.report.conns.len()
    );
}

/// Every case of `timers`, in one lab.
fn run_lab(timers: Timers, tag: &str, s: &Settings, figs: &mut Vec<Figure>) -> Result<()> {
    let prefix = format!("cb{tag}{}", std::process::id() % 1000);
    println!("\nlab {prefix}: {}", timers.name());
    let mut c = cluster_lab::up(&prefix, timers)?;
    for (death, t) in cases() {
        if t != timers || (s.quick && death == Death::Graceful) {
            continue;
        }
        let mut ms = Vec::new();
        for n in 1..=s.rounds {
            let r = cluster_lab::round(&mut c, timers, death, s.connections)?;
            print_round(death, n, &r);
            if let Some(v) = r.report.convergence(r.death_ms, WAITED).last_back_ms {
                ms.push(v as f64);
            }
        }
        if !ms.is_empty() {
            figs.push(convergence_figure(death, timers, &ms));
        }
    }
    if timers == Timers::Bfd {
        let l = cluster_lab::latency_cycles(&c, s.cycles)?;
        println!(
            "  announcement latency, ms: withdraw {:?}, announce {:?}; node changes the router \
             never showed: {}",
            l.withdraw_ms, l.announce_ms, l.unseen
        );
        figs.extend(latency_figures(&l));
    }
    drop(c);
    Ok(())
}

fn main() -> Result<()> {
    let Some(s) = settings()? else {
        return Ok(());
    };
    println!("xlb cluster benchmark: two xlb nodes behind a BIRD router (ECMP, L4 hash)");
    print_command("xlb-cluster-bench");
    println!(
        "held:      {} connections to VIP {} (dsr-ipip), a keep-alive exchange every 20 ms \
         each; a connection waited if its next answer came > {} ms after the death",
        s.connections,
        cluster_lab::HELD_VIP,
        WAITED.as_millis()
    );
    println!(
        "rounds:    {} per case; latency: {} fail/heal cycles of VIP {}'s only backend",
        s.rounds,
        s.cycles,
        cluster_lab::LATENCY_VIP
    );
    let mut figs = Vec::new();
    if s.timers != "defaults" {
        run_lab(Timers::Bfd, "bf", &s, &mut figs)?;
    }
    if !s.quick && s.timers != "bfd" {
        run_lab(Timers::BirdDefaults, "bd", &s, &mut figs)?;
    }
    println!(
        "\nsilent link, {}: not run; computed: the router notices at the BGP hold time, \
         {BIRD_DEFAULT_HOLD_S} s (plus the retransmission back-off of the connections)",
        Timers::BirdDefaults.name()
    );
    println!();
    figures::print(&figs);
    for f in &figs {
        f.record();
    }
    Ok(())
}
