//! Fuzzing `xlb_lb` through `BPF_PROG_TEST_RUN`: random and mutated frames
//! (Ethernet, 802.1Q and QinQ, IPv4 with options and fragments, IPv6 with
//! extension headers, cut at every byte, TCP/UDP, ICMP and ICMPv6 echo and
//! errors quoting VIP flows, IPIP) sent into the fixture world (its VIPs
//! and backends, `fixtures/world.rs`), each checked against the README's
//! packet policy ([`model`]):
//!
//! - never `XDP_ABORTED`;
//! - the verdict is the policy's: nothing that is not addressed to a VIP
//!   address is dropped, what the policy drops is dropped, a passed frame is
//!   unchanged;
//! - a forwarded frame goes to one of its VIP's backends and carries the
//!   client's IP packet intact, and that packet is well-formed (whole
//!   TCP/UDP header, or an ICMP message with a whole quote) and to a VIP;
//! - every frame moves exactly the counter its verdict implies: counters are
//!   read once per batch and compared, counter by counter, with the sum of
//!   what each frame's verdict implies; a batch that differs is replayed one
//!   frame at a time to name the frame.
//!
//! A violation prints the frame in hex, its index and the seed
//! (`XLB_FUZZ_SEED=<seed>` replays the run). The short run is a normal test;
//! `cargo xtask fuzz --frames N [--seed S]` runs [`xdp_fuzz_long`].

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]
#![allow(
    clippy::print_stdout,
    reason = "the run's figures (frames, seconds, seed) are printed for the log"
)]

mod frames;
mod model;
#[allow(
    dead_code,
    reason = "the fixtures' world, shared with them: the fuzzer needs only its base state"
)]
#[path = "../fixtures/world.rs"]
mod world;

use std::{collections::HashMap, time::Instant};

use lb_common::Stat;
use xlb_tests::{harness::World, packet::addr16};

use crate::world::{XDP_ABORTED, base, hex, world};

/// Frames per counter snapshot: reading every counter costs a syscall per
/// counter, a frame one syscall.
const BATCH: usize = 2048;

/// A long run says how far it is every this many frames.
const PROGRESS_EVERY: u64 = 10_000_000;

/// Violations reported before a run stops.
const MAX_VIOLATIONS: usize = 10;

/// Counters that name a verdict; each run moves exactly one of them. The
/// others (conntrack, `icmp_quoted`, `allow_listed`, ...) say more about a
/// run that already has one.
const VERDICT_STATS: &[Stat] = &[
    Stat::FwdTx,
    Stat::FwdRedirect,
    Stat::PassNotIp,
    Stat::PassNotVip,
    Stat::PassTruncatedL2,
    Stat::PassTruncatedL3,
    Stat::PassQinQ,
    Stat::PassIpv6Ext,
    Stat::DropVipUnbalanced,
    Stat::PassVipHost,
    Stat::DropBadIhl,
    Stat::DropBadLength,
    Stat::DropIpOptions,
    Stat::DropFragment,
    Stat::DropBadL4,
    Stat::DropBadTcpFlags,
    Stat::DropNoBackend,
    Stat::DropNoRoute,
    Stat::DropTooBig,
    Stat::DropNoHeadroom,
    Stat::DropDenied,
    Stat::ResetDenied,
    Stat::DropRateLimited,
    Stat::ResetRateLimited,
    Stat::IcmpEchoReply,
    Stat::PassIcmp,
    Stat::IcmpTooBig,
    Stat::Aborted,
];

/// What a run found.
struct Report {
    seed: u64,
    frames: u64,
    secs: f64,
    violations: Vec<String>,
    /// Verdict counters the run never moved.
    unreached: Vec<&'static str>,
}

impl Report {
    fn summary(&self) -> String {
        format!(
            "xdp fuzz: seed {} ({} frames in {:.1} s, {:.0} frames/s): {} violations",
            self.seed,
            self.frames,
            self.secs,
            self.frames as f64 / self.secs,
            self.violations.len()
        )
    }
}

/// The seed from `XLB_FUZZ_SEED`, else from the clock (printed, so any
/// failure can be replayed).
fn seed() -> u64 {
    match std::env::var("XLB_FUZZ_SEED") {
        Ok(s) => s.parse().expect("XLB_FUZZ_SEED: a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    }
}

/// Each backend's address as the wire carries it and its MAC.
type Backends = HashMap<u32, (Vec<u8>, [u8; 6])>;

fn backends(w: &World) -> Backends {
    w.backends
        .iter()
        .map(|b| {
            let a = addr16(b.addr);
            let bytes = if b.addr.is_ipv4() {
                a[..4].to_vec()
            } else {
                a.to_vec()
            };
            (b.id, (bytes, b.mac.unwrap_or_default()))
        })
        .collect()
}

fn violation(seed: u64, index: u64, frame: &[u8], what: &str) -> String {
    format!("seed {seed}, frame {index}: {what}\n  frame {}", hex(frame))
}

/// The fixtures' base state, with `host_services` on the VIPs of
/// [`model::HOST_SERVICES`], so that the passes it allows are reached.
fn fuzz_base(w: &mut World) -> anyhow::Result<()> {
    base(w)?;
    for addr in [world::VIP4_NONEIGH, world::VIP6_L2] {
        world::host_services(w, addr)?;
    }
    Ok(())
}

/// Sends `n` frames from `seed` through `xlb_lb` in the base state.
fn fuzz(w: &mut World, seed: u64, n: u64) -> anyhow::Result<Report> {
    fuzz_base(w)?;
    let be = backends(w);
    let first = w.stats()?;
    let lookup = |id: u32| be.get(&id).cloned().unwrap_or_default();
    let mut frames = frames::Frames::new(seed);
    let mut violations = Vec::new();
    let start = Instant::now();
    let mut done = 0u64;
    let mut in_run = std::time::Duration::ZERO;
    while done < n && violations.len() < MAX_VIOLATIONS {
        let batch: Vec<Vec<u8>> = (0..(n - done).min(BATCH as u64))
            .map(|_| frames.next_frame())
            .collect();
        let before = w.stats()?;
        let mut want: HashMap<Stat, u64> = HashMap::new();
        let reported = violations.len();
        for (i, f) in batch.iter().enumerate() {
            let t = Instant::now();
            let (verdict, out) = w.run(lb_common::PROG_LB, f)?;
            in_run += t.elapsed();
            let judged = if verdict == XDP_ABORTED {
                Err("XDP_ABORTED".to_string())
            } else {
                model::check(&model::expect(f), f, verdict, &out, &lookup)
            };
            match judged {
                Ok(stat) => *want.entry(stat).or_default() += 1,
                Err(e) => violations.push(violation(seed, done + i as u64, f, &e)),
            }
        }
        let after = w.stats()?;
        // A frame already reported has no counter to expect: its batch's
        // counters are not compared.
        let compare = violations.len() == reported;
        if let Some(e) = counters_differ(&before, &after, &want, batch.len()).filter(|_| compare) {
            let blame = blame(w, &batch, &lookup)?;
            violations.push(format!("seed {seed}, batch at frame {done}: {e}; {blame}"));
        }
        done += batch.len() as u64;
        if done % PROGRESS_EVERY < BATCH as u64 && done < n {
            println!(
                "xdp fuzz: {done} frames, {:.0} s, {} violations so far",
                start.elapsed().as_secs_f64(),
                violations.len()
            );
        }
    }
    println!(
        "xdp fuzz: {:.1} s in BPF_PROG_TEST_RUN",
        in_run.as_secs_f64()
    );
    let last = w.stats()?;
    Ok(Report {
        unreached: VERDICT_STATS
            .iter()
            .filter(|&&s| delta(&first, &last, s) == 0)
            .map(|s| s.label())
            .collect(),
        seed,
        frames: done,
        secs: start.elapsed().as_secs_f64(),
        violations,
    })
}

fn delta(before: &HashMap<Stat, u64>, after: &HashMap<Stat, u64>, s: Stat) -> u64 {
    after.get(&s).copied().unwrap_or(0) - before.get(&s).copied().unwrap_or(0)
}

/// Whether the verdict counters moved by exactly `want`, and all counters
/// together by at least one per frame.
fn counters_differ(
    before: &HashMap<Stat, u64>,
    after: &HashMap<Stat, u64>,
    want: &HashMap<Stat, u64>,
    frames: usize,
) -> Option<String> {
    let total: u64 = Stat::ALL.iter().map(|&s| delta(before, after, s)).sum();
    if total < frames as u64 {
        return Some(format!(
            "{frames} frames moved the counters by {total} only"
        ));
    }
    let wrong: Vec<String> = VERDICT_STATS
        .iter()
        .filter_map(|&s| {
            let (got, want) = (delta(before, after, s), want.get(&s).copied().unwrap_or(0));
            (got != want).then(|| format!("{} moved {got}, verdicts imply {want}", s.label()))
        })
        .collect();
    (!wrong.is_empty()).then(|| wrong.join(", "))
}

/// Replays `batch` one frame at a time, counters read around each, and
/// names the first frame whose counters are not what its verdict implies.
fn blame(
    w: &mut World,
    batch: &[Vec<u8>],
    lookup: &dyn Fn(u32) -> (Vec<u8>, [u8; 6]),
) -> anyhow::Result<String> {
    for f in batch {
        let before = w.stats()?;
        let (verdict, out) = w.run(lb_common::PROG_LB, f)?;
        let after = w.stats()?;
        let Ok(stat) = model::check(&model::expect(f), f, verdict, &out, lookup) else {
            continue;
        };
        let want = HashMap::from([(stat, 1)]);
        if let Some(e) = counters_differ(&before, &after, &want, 1) {
            return Ok(format!(
                "replayed alone, verdict {verdict}: {e}\n  frame {}",
                hex(f)
            ));
        }
    }
    Ok("no single frame reproduces it when replayed alone".into())
}

/// Verdict counters the fixture world's base state cannot move: no guard
/// is configured, there is always headroom, nothing aborts.
const UNREACHABLE: [&str; 6] = [
    "drop_no_headroom",
    "drop_denied",
    "reset_denied",
    "drop_rate_limited",
    "reset_rate_limited",
    "aborted",
];

fn run_and_report(n: u64) {
    let seed = seed();
    println!("xdp fuzz: seed {seed}, {n} frames (XLB_FUZZ_SEED={seed} replays this run)");
    let report = world().run(|w| fuzz(w, seed, n)).unwrap();
    println!("{}", report.summary());
    assert!(
        report.violations.is_empty(),
        "{}:\n{}",
        report.summary(),
        report.violations.join("\n")
    );
    // The frames must reach every verdict, or some invariants go unchecked.
    let missing: Vec<&str> = report
        .unreached
        .iter()
        .copied()
        .filter(|l| !UNREACHABLE.contains(l))
        .collect();
    assert!(missing.is_empty(), "the run never reached {missing:?}");
}

/// The short run, part of the test suite: a million frames.
#[test]
fn xdp_fuzz_short() {
    run_and_report(1_000_000);
}

/// The long run: `XLB_FUZZ_FRAMES` frames (`cargo xtask fuzz --frames N`).
#[test]
#[ignore = "long: run with `cargo xtask fuzz --frames N`"]
fn xdp_fuzz_long() {
    let n = std::env::var("XLB_FUZZ_FRAMES").map_or(10_000_000, |s| {
        s.parse().expect("XLB_FUZZ_FRAMES: a number")
    });
    run_and_report(n);
}

/// The committed corpus (`tests/fuzz-corpus/xdp.txt`): frames that once
/// broke an invariant, each checked alone, counters included.
#[test]
fn xdp_corpus() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz-corpus/xdp.txt");
    let text = std::fs::read_to_string(path).expect("reading the XDP corpus");
    let frames: Vec<Vec<u8>> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            (0..l.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&l[i..i + 2], 16).expect("hex"))
                .collect()
        })
        .collect();
    assert!(!frames.is_empty(), "{path}: no frames");
    let failures = world()
        .run(|w| {
            fuzz_base(w)?;
            let be = backends(w);
            let lookup = |id: u32| be.get(&id).cloned().unwrap_or_default();
            let mut failures = Vec::new();
            for (i, f) in frames.iter().enumerate() {
                let before = w.stats()?;
                let (verdict, out) = w.run(lb_common::PROG_LB, f)?;
                let after = w.stats()?;
                let judged =
                    model::check(&model::expect(f), f, verdict, &out, &lookup).and_then(|stat| {
                        let want = HashMap::from([(stat, 1)]);
                        counters_differ(&before, &after, &want, 1).map_or(Ok(()), Err)
                    });
                if let Err(e) = judged {
                    failures.push(format!("corpus frame {i}: {e}\n  frame {}", hex(f)));
                }
            }
            Ok(failures)
        })
        .unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
