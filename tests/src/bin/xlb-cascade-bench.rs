//! `cargo xtask bench`: seed 003 replayed in the lab, with xlb's protection
//! against cascades and without it. A benchmark, not a test: it prints what
//! clients went through, the settings, and the command that reproduces it;
//! it fails only when it cannot measure (the assertions on the same
//! scenario are `tests/tests/cascade.rs`).
//!
//! The scenario is the e2e tests' own (`xlb_tests::lab::cascade::seed_003`):
//! three backends behind one dsr-ipip VIP, 50 new connections per second
//! (one request each, 5 s client timeout), every backend answering 2.5 s
//! late, probes included, from +5 s to +20 s, and serving throughout. Each
//! case builds its own lab (namespaces `cb<tag><pid>-…`) and removes it,
//! checking that nothing is left. Per case:
//!
//! - requests, failed, and connects that waited on a retransmitted SYN
//!   (the first one was dropped: for a VIP, because its table was empty);
//! - `drop_no_backend`: SYNs xlb dropped for want of a backend;
//! - p99 and max latency of the requests that succeeded (2.5 s is the
//!   fleet's own slowness; a failed request is one that hit the client's
//!   5 s timeout);
//! - seconds the table was empty, from `xlb status` polled every 250 ms.
//!
//! Usage: `xlb-cascade-bench [--quick]` (as root, with `xlb` and
//! `xlb-backend` built in release next to it: `cargo xtask bench` does it).

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]
#![allow(clippy::print_stdout, reason = "a benchmark's report goes to stdout")]

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use xlb_lab::scenario::{Health, Protection, Status};
use xlb_tests::{
    bench::print_command,
    lab::{
        cascade::{POLL, SEED_SLOW, config, seed_003, seed_profile},
        teardown, up,
    },
};

const USAGE: &str = "usage: xlb-cascade-bench [--quick]
  --quick   only the seed's own profile (interval 2s, timeout 1s, fall 3),
            with and without protection";

/// How long each case's load runs: the slowdown (+5 s to +20 s) and 6 s of
/// recovery, as in the e2e tests.
const RUN_FOR: Duration = Duration::from_secs(26);

/// One configuration under test.
struct Case {
    /// Namespace tag, two letters.
    tag: &'static str,
    label: &'static str,
    health: Health,
    protection: Protection,
    /// Part of `--quick`.
    quick: bool,
}

/// The two profiles, each with xlb's protection (its defaults) and
/// without it: `hang_timeout = timeout` (a late answer is a failure) and
/// `[protection] min_healthy = 0` (no panic), damping off.
fn cases() -> Vec<Case> {
    let unprotected = |mut h: Health| {
        h.hang_timeout = Some(h.timeout);
        h
    };
    vec![
        Case {
            tag: "pd",
            label: "protected, xlb defaults",
            health: Health::xlb_defaults(),
            protection: Protection::default(),
            quick: false,
        },
        Case {
            tag: "ps",
            label: "protected, 2s/1s/fall 3",
            health: seed_profile(),
            protection: Protection::default(),
            quick: true,
        },
        Case {
            tag: "ud",
            label: "unprotected, xlb defaults",
            health: unprotected(Health::xlb_defaults()),
            protection: Protection::off(),
            quick: false,
        },
        Case {
            tag: "us",
            label: "unprotected, 2s/1s/fall 3",
            health: unprotected(seed_profile()),
            protection: Protection::off(),
            quick: true,
        },
    ]
}

/// What one case measured.
struct Outcome {
    label: &'static str,
    requests: u64,
    failed: u64,
    syn_waits: u64,
    drops: u64,
    p99_ms: f64,
    max_ms: f64,
    empty: Duration,
    /// Backends taken out of the table (transition events to a placement
    /// outside it).
    exits: usize,
    /// Whether xlb reported the fleet as slow (a `fleet_slow` event).
    fleet_slow: bool,
}

/// Whether no backend of `api` is in the table (`up` in the data plane).
fn table_empty(s: &Status) -> bool {
    s.vip("api")
        .is_some_and(|v| v.backends.iter().all(|b| b.state != "up"))
}

/// Time the table was empty, from statuses polled at the client times
/// given: each empty poll counts until the next poll (the last one for one
/// poll period).
fn empty_time(polls: &[(i64, bool)]) -> Duration {
    let ms: i64 = polls
        .iter()
        .enumerate()
        .filter(|(_, (_, empty))| *empty)
        .map(|(i, (t, _))| {
            polls
                .get(i + 1)
                .map_or(POLL.as_millis() as i64, |(next, _)| next - t)
        })
        .sum();
    Duration::from_millis(ms.max(0) as u64)
}

fn run_case(case: &Case) -> Outcome {
    let prefix = format!("cb{}{}", case.tag, std::process::id() % 1000);
    let run = up(
        &prefix,
        &config(&prefix, case.health.clone(), case.protection.clone()),
    );
    let r = seed_003(&run, RUN_FOR);
    let polls: Vec<(i64, bool)> = r.polls.iter().map(|(t, s)| (*t, table_empty(s))).collect();
    let outside = ["up", "serving", "ramping", "panic_restored"];
    let exits = r
        .events
        .iter()
        .filter(|e| {
            e.kind == "transition"
                && e.vip.as_deref() == Some("api")
                && !e.to.as_deref().is_some_and(|to| outside.contains(&to))
        })
        .count();
    let fleet_slow = r
        .events
        .iter()
        .any(|e| e.kind == "fleet_slow" && e.vip.as_deref() == Some("api"));
    teardown(run);
    let s = &r.report.summary;
    Outcome {
        label: case.label,
        requests: s.requests,
        failed: s.failures,
        syn_waits: s.syn_retransmit_waits,
        drops: r.drops_after.saturating_sub(r.drops_before),
        p99_ms: s.latency.p99_ms,
        max_ms: s.latency.max_ms,
        empty: empty_time(&polls),
        exits,
        fleet_slow,
    }
}

fn print_table(rows: &[Outcome]) {
    let w = rows
        .iter()
        .map(|r| r.label.chars().count())
        .chain(["case".len()])
        .max()
        .unwrap_or(0);
    println!();
    println!(
        "{:<w$}  {:>8}  {:>6}  {:>9}  {:>15}  {:>8}  {:>8}  {:>11}  {:>5}  {:>10}",
        "case",
        "requests",
        "failed",
        "SYN waits",
        "drop_no_backend",
        "p99 ok",
        "max ok",
        "table empty",
        "exits",
        "fleet_slow"
    );
    println!("{}", "-".repeat(w + 107));
    for r in rows {
        println!(
            "{:<w$}  {:>8}  {:>6}  {:>9}  {:>15}  {:>6.2} s  {:>6.2} s  {:>9.2} s  {:>5}  {:>10}",
            r.label,
            r.requests,
            r.failed,
            r.syn_waits,
            r.drops,
            r.p99_ms / 1e3,
            r.max_ms / 1e3,
            r.empty.as_secs_f64(),
            r.exits,
            if r.fleet_slow { "reported" } else { "-" }
        );
    }
}

fn main() -> Result<()> {
    let mut quick = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--quick" => quick = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            _ => bail!("unknown argument {arg:?}\n{USAGE}"),
        }
    }
    println!("xlb cascade benchmark: seed 003 replayed in the lab");
    print_command("xlb-cascade-bench");
    println!(
        "scenario:  3 backends behind VIP api (dsr-ipip), 50 new connections/s for {} s, one \
         request each, 5 s client timeout; every backend {} ms late, probes included, from +5 s \
         to +20 s",
        RUN_FOR.as_secs(),
        SEED_SLOW.as_millis()
    );
    println!(
        "profiles:  xlb defaults (interval 2s, timeout 1s, fall 3, rise 2, hang_timeout 3s, \
         jitter 10%); 2s/1s/fall 3 = the lab's interval 2s, timeout 1s, fall 3, rise 2, \
         fast/down interval 2s, no jitter"
    );
    println!(
        "protection: protected = [protection] defaults (max_ejected 10%, min_healthy 1, \
         damping on) and hang_timeout 3 × timeout; unprotected = hang_timeout = timeout, \
         min_healthy = 0, flap_damping = false"
    );
    println!(
        "columns:   SYN waits = connects slower than a SYN retransmit (first SYN dropped); \
         p99/max ok = latency of the requests that succeeded (the others hit the 5 s \
         client timeout); table empty = time no backend was up, from status polled every {} ms; \
         exits = backends taken out of the table",
        POLL.as_millis()
    );
    let mut rows = Vec::new();
    for case in cases().into_iter().filter(|c| !quick || c.quick) {
        println!();
        println!("case: {}: health {:?}", case.label, case.health);
        let t0 = Instant::now();
        let row = run_case(&case);
        println!(
            "case: {} done in {:.0} s",
            case.label,
            t0.elapsed().as_secs_f64()
        );
        rows.push(row);
    }
    print_table(&rows);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_time_counts_until_the_next_poll() {
        let cases = [
            ("never empty", vec![(0, false), (250, false)], 0),
            ("one gap", vec![(0, false), (250, true), (510, false)], 260),
            ("empty to the end", vec![(0, true), (250, true)], 250 + 250),
            ("no polls", Vec::new(), 0),
            (
                "two stretches",
                vec![(0, true), (300, false), (600, true), (850, false)],
                300 + 250,
            ),
        ];
        for (name, polls, want) in cases {
            assert_eq!(empty_time(&polls), Duration::from_millis(want), "{name}");
        }
    }

    #[test]
    fn cases_render_valid_configurations() {
        for case in cases() {
            let text = config("cbv", case.health.clone(), case.protection.clone()).render();
            let parsed = lb_user::config::Config::from_str(&text, case.label)
                .unwrap_or_else(|e| panic!("{}: {e}\n{text}", case.label));
            let spec = &parsed.vips[0].backends[0].health;
            let protected = case.label.starts_with("protected");
            assert_eq!(
                spec.hang_timeout > spec.timeout,
                protected,
                "{}: hang_timeout {:?}, timeout {:?}",
                case.label,
                spec.hang_timeout,
                spec.timeout
            );
            let min_healthy = parsed.vips[0].protection.min_healthy;
            assert_eq!(
                min_healthy == lb_user::health::policy::Limit::Count(0),
                !protected,
                "{}: min_healthy {min_healthy}",
                case.label
            );
        }
    }
}
