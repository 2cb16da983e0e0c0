//! End to end, issue 9: abuse control in the real `xlb`, in the namespaced
//! lab.
//!
//! - A flood of new TCP connections, real kernel connects as fast as the
//!   flooding client's namespace opens them (`xlb_lab::connect_flood`), to
//!   a VIP with `new_flows_per_source = { rate = "50/s", burst = 50,
//!   action = "drop" }`: from one IPv4 address
//!   (`flood_from_one_ipv4_is_limited_and_others_do_not_notice`), and from
//!   64 addresses of one IPv6 /64, the source prefix the limit keys
//!   (`flood_from_one_ipv6_64_is_limited_and_others_do_not_notice`). The
//!   XDP counters show the flood limited, the backends accept at most the
//!   configured rate from the flooder (their `/peers` counts), and the
//!   well-behaved client in the other namespace (keep-alive and new
//!   connections) fails nothing, and its p99 while the flood reaches the
//!   VIP stays within 10 % of its p99 while the same flood is dropped at
//!   the flooder's own bridge port (phases alternated in one run; see
//!   [`PAIRS`] for why the attacker's own CPU is on both sides).
//! - `xlb sources` names the flooder within 5 s, a `source` event fires,
//!   and `auto_block` blocks its /32 and the block expires
//!   (`sources_names_the_flooder_and_auto_block_expires`).
//! - `xlb block --action reset`: the blocked client's connect fails with
//!   `ECONNREFUSED` in milliseconds (its IPv4 address, and its IPv6 /64),
//!   `--action drop` makes it time out, `xlb unblock` restores service
//!   (`block_with_reset_fails_connect_fast`).
//! - A conntrack that a flood cannot wash out: 200 long-lived `/stream`
//!   connections through VIP `api` with a small conntrack, one backend
//!   drained, then a flood of spoofed TCP ACKs (random sources in
//!   10.99.128.0/17, inside the lab) many times the conntrack's size. Only a
//!   SYN (or a UDP packet) inserts an entry, so the flood misses without
//!   inserting and the real flows keep their entries: every long connection
//!   keeps its backend, the drained one included
//!   (`spoofed_ack_flood_keeps_long_connections_on_their_backend`). Before
//!   that rule, every miss inserted, the flood evicted the real entries from
//!   the LRU, and the drained backend's connections followed the table to
//!   another backend, which reset them.
//!
//! The floods come from the lab's flooding client, a namespace of its own
//! on the client segment (`{p}-fl`: 10.99.0.9, and fd00:99:0:1::1–::40 of
//! its own /64; see `xlb_lab::topology`), so the well-behaved client
//! (`{p}-cl`, 10.99.0.10 and fd00:99::10) shares neither its sockets nor
//! its source prefix. The spoofed-ACK flood is sent from the client
//! namespace through a raw socket (`xlb_lab::flood`).
//!
//! Same rules as `e2e.rs` and `cascade.rs`: the test builds its own lab
//! (own prefix `abu…`, instance and socket) through `LabRun`, whose Drop
//! stops everything and removes the namespaces however the test ends; a
//! passing test checks that nothing is left; one lab at a time
//! (`xlb_tests::lab::serial`); every wait and every flood is bounded in
//! count and time; traffic stays inside the namespaces.
//!
//! Needs root and the binaries: `cargo build -p lb-user -p xlb-lab` (without
//! AYA_BUILD_SKIP), then
//! `cargo test -p xlb-tests --test abuse -- --nocapture --test-threads=1`.
//! `XLB_BIN` points at another `xlb`.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4},
    thread,
    time::{Duration, Instant},
};

use lb_ctl::{EntryOrigin, ListKind};
use xlb_lab::{
    backend::{PeerCounts, in_prefix, total_peers},
    client::{Latency, LoadOptions, Report, Slice},
    connect_flood::{
        AfterConnect, Connect, ConnectFloodOptions, ConnectFloodReport, connect_flood_in,
        time_connect_in,
    },
    flood::{FloodOptions, flood_in},
    scenario::{Event, EventKind, LabRun, Mode, Status, Vip, XlbConfig},
    topology::{self, FLOOD_NET_V6, FLOOD_NET_V6_PREFIX, WireCounts},
};
use xlb_tests::lab::{
    cascade::COUNTER_TICK, now_unix_ms, serial, teardown, up, up_with_flooder, wait_client_ms,
};

/// Entries of the conntrack LRU: small, so that the flood is many times it.
const CONNTRACK_SIZE: u32 = 4096;
/// Long-lived connections through the VIP.
const LONG: u32 = 200;
/// Spoofed ACKs: over 12 × the conntrack.
const FLOOD: u64 = 50_000;
/// The flood's sources: inside the lab's 10.99.0.0/16, off its segment.
const FLOOD_NET: Ipv4Addr = Ipv4Addr::new(10, 99, 128, 0);
const FLOOD_PREFIX: u8 = 17;
/// Bound on the flood's duration.
const FLOOD_LIMIT: Duration = Duration::from_secs(10);
/// How long the long connections run in all; the flood starts about 3.5 s
/// in and must leave them at least [`AFTER_FLOOD`] to go on.
const RUN_FOR: Duration = Duration::from_secs(12);
const AFTER_FLOOD: Duration = Duration::from_secs(4);
/// The drained backend (1-based) and its name in `X-Backend`.
const DRAINED: usize = 2;
const DRAINED_NAME: &str = "b2";

fn prefix(tag: &str) -> String {
    format!("abu{tag}{}", std::process::id() % 1000)
}

/// Only long connections, each reading a line a second: a flow's conntrack
/// entry is looked up about once a second, so an LRU that the flood churns
/// through in a fraction of that evicts it.
fn long_load(target: SocketAddr) -> LoadOptions {
    LoadOptions {
        duration: RUN_FOR,
        rate: 0,
        keepalive: 0,
        long: LONG,
        stream_interval: Duration::from_secs(1),
        stall_after: Duration::from_secs(3),
        timeout: Duration::from_secs(3),
        slice: Duration::from_millis(500),
        ..LoadOptions::new(target)
    }
}

/// Flows VIP `api` has given its backends from the table (a SYN each).
fn new_flows(s: &Status) -> u64 {
    s.vip("api")
        .map_or(0, |v| v.backends.iter().map(|b| b.new_flows).sum())
}

/// The data plane's figures the test compares before and after the flood.
#[derive(Debug, Clone, Copy)]
struct Counters {
    ct_miss: u64,
    ct_insert: u64,
    /// Packets forwarded to the drained backend.
    drained_packets: u64,
}

fn counters(run: &LabRun, drained: SocketAddr) -> Counters {
    let s = run.status().unwrap();
    let c = |name: &str| s.counters.get(name).copied().unwrap_or(0);
    Counters {
        ct_miss: c("ct_miss"),
        ct_insert: c("ct_insert"),
        drained_packets: s.backend("api", drained).map_or(0, |b| b.packets),
    }
}

/// Per backend: `name kept/total`, e.g. `b1 62/62, b2 75/75, b3 63/63`.
fn kept_by_backend(report: &Report) -> String {
    let mut by: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for l in &report.long {
        let name = l.backend.clone().unwrap_or_else(|| "none".to_string());
        let e = by.entry(name).or_default();
        e.0 += usize::from(l.kept_flowing);
        e.1 += 1;
    }
    let parts: Vec<String> = by
        .iter()
        .map(|(name, (kept, total))| format!("{name} {kept}/{total}"))
        .collect();
    parts.join(", ")
}

/// How the long connections fared: (on the drained backend, broken, the
/// broken ones' descriptions).
fn long_outcome(report: &Report) -> (usize, usize, Vec<String>) {
    let on_drained = report
        .long
        .iter()
        .filter(|l| l.backend.as_deref() == Some(DRAINED_NAME))
        .count();
    let broken: Vec<String> = report
        .long
        .iter()
        .filter(|l| !l.kept_flowing || l.backend.is_none())
        .map(|l| {
            format!(
                "#{} on {:?}: end {}, ended at {:?} ms, first stall at {:?} ms",
                l.id, l.backend, l.end, l.ended_ms, l.first_stall_ms
            )
        })
        .collect();
    (on_drained, broken.len(), broken)
}

/// 200 long connections, one backend drained, 50,000 spoofed ACKs from
/// random sources to the VIP: every connection keeps its backend, and the
/// flood goes through the data plane as misses that insert nothing.
#[test]
fn spoofed_ack_flood_keeps_long_connections_on_their_backend() {
    let _serial = serial();
    let t0 = Instant::now();
    let p = prefix("ack");
    let cfg = XlbConfig {
        conntrack_size: CONNTRACK_SIZE,
        ..XlbConfig::for_prefix(&p)
    };
    let vip = cfg.vip("api").unwrap().clone();
    let drained = vip.backend_addr(DRAINED);
    let run = up(&p, &cfg);

    // 1. 200 long connections, all established (a SYN each through the table).
    let base = new_flows(&run.status().unwrap());
    let client = run.start_client(long_load(vip.target())).unwrap();
    let (_, took) = run
        .wait_until("the long connections' SYNs", Duration::from_secs(15), |s| {
            new_flows(s) >= base + u64::from(LONG)
        })
        .unwrap();
    // Their requests and response heads, one round trip after the SYNs.
    wait_client_ms(&client, took.as_millis() as u64 + 1500);

    // 2. Drain one backend: its connections stay on it through conntrack.
    run.drain("api", drained).unwrap();
    run.wait_backend_state("api", drained, "draining", Duration::from_secs(3))
        .unwrap();
    thread::sleep(COUNTER_TICK);
    let before = counters(&run, drained);

    // 3. The flood, from the client namespace.
    let IpAddr::V4(vip_v4) = vip.address else {
        panic!("api is not an IPv4 VIP: {}", vip.address)
    };
    let opts = FloodOptions::new(
        SocketAddrV4::new(vip_v4, vip.port),
        FLOOD_NET,
        FLOOD_PREFIX,
        FLOOD,
        FLOOD_LIMIT,
    );
    let flood_at = client.elapsed();
    let flood = flood_in(&run.lab().ns_client(), &opts).unwrap();
    let flood_end = client.elapsed();
    thread::sleep(COUNTER_TICK);
    let after = counters(&run, drained);

    // 4. The connections go on; the drained backend still gets their packets.
    thread::sleep(Duration::from_secs(2));
    let end = counters(&run, drained);
    let report = client.join().unwrap();
    let status = run.status().unwrap();
    let (on_drained, broken, broken_list) = long_outcome(&report);
    let miss = after.ct_miss - before.ct_miss;
    let insert = after.ct_insert - before.ct_insert;
    let to_drained = end.drained_packets - after.drained_packets;
    eprintln!(
        "[{p}] conntrack_size {CONNTRACK_SIZE}; {LONG} long connections established in {took:?}, \
         {on_drained} on the drained {DRAINED_NAME}; flood {FLOOD} ACKs from {FLOOD_NET}/{FLOOD_PREFIX}: \
         {flood:?}, {:.0} packets/s, from {flood_at:?} to {flood_end:?} of the run; \
         over the flood: ct_miss +{miss}, ct_insert +{insert}; packets to {DRAINED_NAME} in the 2 s \
         after: {to_drained}; long connections broken: {broken}; kept flowing per backend: {}\n\
         status: {}",
        flood.sent as f64 / flood.elapsed.as_secs_f64().max(1e-9),
        kept_by_backend(&report),
        status.summary(),
    );

    assert_eq!(flood.sent, FLOOD, "the flood was cut short: {flood:?}");
    assert!(
        flood_end + AFTER_FLOOD <= RUN_FOR,
        "the flood ended at {flood_end:?}, too late in a {RUN_FOR:?} run to watch the connections"
    );
    assert_eq!(report.long.len(), LONG as usize);
    assert!(on_drained > 0, "no long connection on {DRAINED_NAME}");
    assert_eq!(
        broken,
        0,
        "long connections broke or moved (kept flowing per backend: {}):\n{}",
        kept_by_backend(&report),
        broken_list.join("\n")
    );
    assert!(
        to_drained > 0,
        "{DRAINED_NAME} got no packets after the flood: its connections left it"
    );
    assert!(
        miss >= FLOOD * 9 / 10,
        "the flood should miss conntrack: ct_miss +{miss} for {FLOOD} packets"
    );
    assert!(
        insert < u64::from(LONG) / 10,
        "the flood inserted conntrack entries: ct_insert +{insert}"
    );
    teardown(run);
    eprintln!("[{p}] done in {:.1} s", t0.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------
// Floods of new connections against new_flows_per_source.

/// The per-source limit of the flood tests: 50 new flows/s, a burst of 50,
/// excess SYNs dropped.
const LIMIT_RATE: u64 = 50;
const LIMIT_BURST: u64 = 50;

/// `[vip.guard]` of the flood tests.
fn limit_guard() -> String {
    format!(
        "new_flows_per_source = {{ rate = \"{LIMIT_RATE}/s\", burst = {LIMIT_BURST}, \
         action = \"drop\" }}"
    )
}

/// Over the limit's burst, at most one flow per CPU at the instant the
/// bucket runs out can be admitted by CPUs racing on the same source's
/// arrival time; each such admission is still charged, so the excess does
/// not accumulate (lb-ebpf/src/guard.rs). The lab machine has 2 CPUs; one
/// more for the flood's clock and the data plane's starting at slightly
/// different instants.
const LIMIT_SLACK: u64 = 3;

/// The flood comes in phases into one run of the well-behaved load, [`PAIRS`]
/// pairs of them. In every phase the flooding client floods alike; what
/// differs is its wire: the switch at its bridge port
/// (`xlb_lab::topology::WireSwitch`) drops its TCP right there in the
/// phase *off*, and forwards it to the VIP in the phase *on*. In a 2-CPU
/// lab the flooder's own kernel work (its sockets, SYNs and timers) shares
/// the CPUs with the well-behaved client and the backends, as a real
/// attacker, on another machine, cannot. Measured 2026-12-01 with the
/// earlier form of this test (four bursts against the pauses between
/// them), runs side by side at a load average of 2–3: with every SYN
/// dropped at the flooder's wire the well-behaved p99 rose 75 % and 52 %,
/// with the flood through xlb 55 % and 39 %, and with no flood at all
/// (the same split of the timeline) 2 % and 27 %: the attacker's own CPU
/// was the whole effect. So it is on both sides here, and the comparison
/// is what the flood costs the service: the segment, xlb's verdicts, the
/// connections the limit admits. The phases of a pair come off-on, then
/// on-off in the next pair, so that the machine's drift weighs on both
/// alike.
const PAIRS: usize = 12;
/// Each phase starts connects for this long at most, then waits for its
/// last ones (the connect timeout).
const FLOOD_FOR: Duration = Duration::from_millis(1000);
/// Room for a phase's last connects (the 500 ms connect timeout, the
/// admitted ones' request) and the switch.
const PHASE_TAIL: Duration = Duration::from_millis(700);
/// Before the first phase: the well-behaved client's connections open.
const WARMUP: Duration = Duration::from_millis(1500);
/// At most this many connects per phase.
const FLOOD_COUNT: u64 = 100_000;
/// How long the well-behaved load runs: every phase, and 1 s to spare; the
/// test checks that the schedule fitted.
const POLITE_FOR: Duration = Duration::from_millis(
    WARMUP.as_millis() as u64
        + 2 * PAIRS as u64 * (FLOOD_FOR.as_millis() + PHASE_TAIL.as_millis()) as u64
        + 1000,
);
/// Slices of the client's timeline.
const SLICE: Duration = Duration::from_millis(100);
/// Connects of the flood open at once: a dropped SYN holds its slot for
/// the connect timeout (500 ms), so this bounds the flood to about 8,000
/// connects/s, 160 times the limit; the flood's single thread is the
/// other bound (it reaches about 8,000/s on the lab machine).
const FLOOD_IN_FLIGHT: usize = 4096;
/// Fewest well-behaved requests in a phase for its p99 to count.
const MIN_PHASE_REQUESTS: usize = 1000;

/// The well-behaved client: 25 new connections/s (half the per-source
/// limit, so it is never limited itself) and 48 keep-alive connections, a
/// request every 25 ms each: about 1,900 requests/s, so that each phase's
/// p99 rests on about 20 requests of some 2,000.
fn polite(target: SocketAddr) -> LoadOptions {
    LoadOptions {
        duration: POLITE_FOR,
        rate: 25,
        keepalive: 48,
        keepalive_interval: Duration::from_millis(25),
        timeout: Duration::from_secs(1),
        slice: SLICE,
        ..LoadOptions::new(target)
    }
}

/// A flood of connects from `sources` to `target`, as fast as it goes.
fn connect_flood(target: SocketAddr, sources: Vec<IpAddr>) -> ConnectFloodOptions {
    ConnectFloodOptions {
        in_flight: FLOOD_IN_FLIGHT,
        idle_priority: true,
        ..ConnectFloodOptions::new(target, sources, FLOOD_COUNT, FLOOD_FOR)
    }
}

/// One flood case: the VIP, the flood's sources and the prefix the limit
/// keys them by.
struct FloodCase {
    tag: &'static str,
    vip: Vip,
    sources: Vec<IpAddr>,
    net: IpAddr,
    len: u8,
}

/// The data plane's counters the flood tests read.
fn guard_counters(run: &LabRun) -> BTreeMap<String, u64> {
    let s = run.status().unwrap();
    [
        "drop_rate_limited",
        "reset_rate_limited",
        "drop_denied",
        "reset_denied",
    ]
    .into_iter()
    .map(|k| (k.to_string(), s.counters.get(k).copied().unwrap_or(0)))
    .collect()
}

fn delta(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>, key: &str) -> u64 {
    after[key] - before[key]
}

/// Connections the backends accepted per peer address since `before`.
fn accepted_since(run: &LabRun, before: &[PeerCounts]) -> PeerCounts {
    let now = run.peers().unwrap();
    let diffs: Vec<PeerCounts> = now.iter().zip(before).map(|(n, b)| n.since(b)).collect();
    total_peers(&diffs)
}

fn failures_of(r: &Report) -> String {
    format!(
        "{} failures ({:?}); timeline of failures: {:?}",
        r.summary.failures,
        r.summary.counts,
        xlb_tests::lab::failure_slices(r)
    )
}

/// One phase of the flood, on the well-behaved client's timeline.
struct Phase {
    /// Whether the flood reached the VIP (else it was dropped at its wire).
    on: bool,
    report: ConnectFloodReport,
    /// The wire switch's TCP counts during the phase.
    wire: WireCounts,
    /// When the phase started and when its last connect had ended, ms.
    from_ms: u64,
    to_ms: u64,
}

impl Phase {
    /// What the limit lets through during a phase *on*: its burst (the
    /// bucket holds no more however long the pause before) + rate × the
    /// phase's SYN window + [`LIMIT_SLACK`]; nothing in a phase *off*.
    fn bound(&self) -> u64 {
        if !self.on {
            return 0;
        }
        LIMIT_BURST
            + (LIMIT_RATE as f64 * self.report.syn_window.as_secs_f64()).ceil() as u64
            + LIMIT_SLACK
    }

    /// Whether slice `s` lies inside this phase.
    fn holds(&self, s: &Slice) -> bool {
        s.t_ms >= self.from_ms && s.t_ms + SLICE.as_millis() as u64 <= self.to_ms
    }

    fn line(&self) -> String {
        let f = &self.report;
        format!(
            "{} {}–{} ms: {} connects in {:.2} s ({:.0}/s), SYNs over {:.2} s: {} connected, \
             {} timed out, {} refused, {} errors; at the wire {} TCP frames forwarded, {} dropped \
             (bound {})",
            if self.on { "on " } else { "off" },
            self.from_ms,
            self.to_ms,
            f.started,
            f.sending.as_secs_f64(),
            f.started_per_s(),
            f.syn_window.as_secs_f64(),
            f.connected,
            f.timed_out,
            f.refused,
            f.errors,
            self.wire.passed,
            self.wire.dropped,
            self.bound(),
        )
    }
}

/// What a flood test measured.
struct Flooded {
    client: Report,
    phases: Vec<Phase>,
    /// `drop_rate_limited` over the whole run.
    limited: u64,
    /// Connections the backends accepted from the flooding prefix...
    from_flooder: u64,
    /// ... from this many of its addresses.
    flooder_addresses: usize,
}

impl Flooded {
    /// The sum of `f` over the phases *on* (`on`) or *off*.
    fn sum(&self, on: bool, f: impl Fn(&ConnectFloodReport) -> u64) -> u64 {
        self.phases
            .iter()
            .filter(|p| p.on == on)
            .map(|p| f(&p.report))
            .sum()
    }

    fn bound(&self) -> u64 {
        self.phases.iter().map(Phase::bound).sum()
    }

    /// The well-behaved latency over every phase *on* or *off*.
    fn latency(&self, on: bool) -> (Latency, usize) {
        self.client
            .latency_where(|s| self.phases.iter().any(|p| p.on == on && p.holds(s)))
    }

    /// Each pair's well-behaved p99, off and on, ms, with their request
    /// counts.
    fn pairs(&self) -> Vec<PhasePair> {
        self.phases
            .chunks(2)
            .map(|pair| {
                let of = |on: bool| {
                    let p = pair.iter().find(|p| p.on == on).expect("a pair has both");
                    let (l, n) = self.client.latency_where(|s| p.holds(s));
                    (l.p99_ms, n)
                };
                let ((off, n_off), (on, n_on)) = (of(false), of(true));
                PhasePair {
                    off,
                    on,
                    n_off,
                    n_on,
                }
            })
            .collect()
    }
}

/// The well-behaved p99 in the two phases of one pair.
struct PhasePair {
    off: f64,
    on: f64,
    n_off: usize,
    n_on: usize,
}

impl PhasePair {
    fn ratio(&self) -> f64 {
        self.on / self.off
    }
}

/// The well-behaved load with [`PAIRS`] pairs of flood phases into it.
fn flood_in_phases(run: &LabRun, case: &FloodCase) -> Flooded {
    let target = case.vip.target();
    let flood_ns = run.flood_ns().unwrap();
    let wire = run.lab().flood_wire().unwrap();
    let opts = connect_flood(target, case.sources.clone());
    let peers_before = run.peers().unwrap();
    let before = guard_counters(run);
    let client = run.start_client(polite(target)).unwrap();
    thread::sleep(WARMUP);
    let mut phases = Vec::new();
    for i in 0..2 * PAIRS {
        // off, on | on, off | off, on …
        let on = (i % 2 == 1) == (i / 2 % 2 == 0);
        wire.set_dropping(!on).unwrap();
        let counts_before = wire.counts().unwrap();
        let from_ms = client.elapsed().as_millis() as u64;
        let report = connect_flood_in(&flood_ns, &opts).unwrap();
        let to_ms = client.elapsed().as_millis() as u64;
        phases.push(Phase {
            on,
            report,
            wire: wire.counts().unwrap().since(&counts_before),
            from_ms,
            to_ms,
        });
    }
    drop(wire);
    let schedule_end = client.elapsed();
    let client = client.join().unwrap();
    assert!(
        schedule_end + Duration::from_millis(500) <= POLITE_FOR,
        "the phases ended at {schedule_end:?}, too late in a {POLITE_FOR:?} run"
    );
    thread::sleep(COUNTER_TICK);
    let after = guard_counters(run);
    let accepted = accepted_since(run, &peers_before);
    Flooded {
        client,
        phases,
        limited: delta(&after, &before, "drop_rate_limited"),
        from_flooder: accepted.from_prefix(case.net, case.len),
        flooder_addresses: accepted
            .peers
            .keys()
            .filter(|a| in_prefix(**a, case.net, case.len))
            .count(),
    }
}

/// How much worse the well-behaved p99 may get while the flood reaches
/// the VIP: the 10 %, judged on the median over [`PAIRS`] of the
/// ratio p99 *on* ÷ p99 *off* of each pair, as the benchmarks judge their
/// ratios: one pair that a stall of the machine hits does not decide. On
/// a quiet machine (2026-12-01) the medians were 0.79–1.12 × in 18 runs of
/// 6 to 12 pairs (0.87–1.12 × with 12), while single pairs ranged from
/// 0.48 to 1.70 × and the p99 over all phases from −27 % to +7 %. A median
/// over the bound is measured again, [`PAIRS`] more pairs in the same lab,
/// and judged on the median of all of them, up to [`MAX_SETS`] sets: a
/// flood that costs the service more than 10 % fails them all, one unlucky
/// set does not fail the test. Under
/// other load (builds, a neighbour's benchmarks) single phases stall for
/// milliseconds and the median moves too (0.53 × and 1.31 × at a load
/// average of 4–5): run this test on a quiet machine, as CI does.
const P99_FACTOR: f64 = 1.10;
/// Sets of [`PAIRS`] pairs measured at most (see [`P99_FACTOR`]). Quiet,
/// a set's median was 0.87–1.12 × (mean 1.02): the flood's admitted
/// connections, a full burst at the start of every phase *on* and then
/// 50/s, are real work for the backends.
const MAX_SETS: usize = 3;

fn flood_is_limited_and_others_do_not_notice(case: FloodCase) {
    let _serial = serial();
    let t0 = Instant::now();
    let p = prefix(case.tag);
    let cfg = XlbConfig {
        vips: vec![case.vip.clone()],
        ..XlbConfig::for_prefix(&p)
    };
    let run = up_with_flooder(&p, &cfg);
    let mut ratios = measure(&run, &case, &p);
    let mut median_ratio = xlb_tests::bench::figures::median(&ratios);
    for _ in 1..MAX_SETS {
        if median_ratio <= P99_FACTOR {
            break;
        }
        eprintln!(
            "[{p}] p99 on ÷ off, median of {} pairs: {median_ratio:.2} ×, over {P99_FACTOR:.2}: \
             {PAIRS} more pairs, judged with these",
            ratios.len()
        );
        ratios.extend(measure(&run, &case, &p));
        median_ratio = xlb_tests::bench::figures::median(&ratios);
    }
    eprintln!(
        "[{p}] p99 on ÷ off, median of {} pairs: {median_ratio:.2} × (bound {P99_FACTOR:.2})",
        ratios.len()
    );
    assert!(
        median_ratio <= P99_FACTOR,
        "the well-behaved p99 while the flood reached the VIP was {median_ratio:.2} × the p99 \
         while it was dropped at its own wire (median of {} pairs: {ratios:.2?}; bound \
         {P99_FACTOR:.2} ×)",
        ratios.len()
    );
    teardown(run);
    eprintln!("[{p}] done in {:.1} s", t0.elapsed().as_secs_f64());
}

/// One run of the well-behaved load with the flood in phases: prints and
/// checks everything but the p99, and returns each pair's p99 ratio, on ÷
/// off.
fn measure(run: &LabRun, case: &FloodCase, p: &str) -> Vec<f64> {
    let m = flood_in_phases(run, case);
    for (i, ph) in m.phases.iter().enumerate() {
        eprintln!(
            "[{p}] phase {:2} from {}/{}: {}",
            i + 1,
            case.net,
            case.len,
            ph.line()
        );
    }
    let pairs = m.pairs();
    for (i, pp) in pairs.iter().enumerate() {
        eprintln!(
            "[{p}] pair {}: well-behaved p99 {:.2} ms off ({} requests), {:.2} ms on ({}): {:.2} ×",
            i + 1,
            pp.off,
            pp.n_off,
            pp.on,
            pp.n_on,
            pp.ratio()
        );
    }
    let ((off, n_off), (on, n_on)) = (m.latency(false), m.latency(true));
    eprintln!(
        "[{p}] flood: {} connects reached the VIP, {} connected, {} timed out; {} more dropped \
         at the flooder's wire; drop_rate_limited +{}; backends accepted {} from {} addresses of \
         {}/{} (bound {}); well-behaved: {} requests, {} failures; over all phases p99 {:.2} ms \
         off ({n_off} requests), {:.2} ms on ({n_on}); p50 {:.2} → {:.2} ms; max {:.2} → {:.2} ms",
        m.sum(true, |f| f.started),
        m.sum(true, |f| f.connected),
        m.sum(true, |f| f.timed_out),
        m.sum(false, |f| f.started),
        m.limited,
        m.from_flooder,
        m.flooder_addresses,
        case.net,
        case.len,
        m.bound(),
        m.client.summary.requests,
        m.client.summary.failures,
        off.p99_ms,
        on.p99_ms,
        off.p50_ms,
        on.p50_ms,
        off.max_ms,
        on.max_ms,
    );
    assert_eq!(m.client.summary.failures, 0, "{}", failures_of(&m.client));
    assert_eq!(
        m.client.summary.skipped, 0,
        "the well-behaved client skipped starts"
    );
    for (i, pp) in pairs.iter().enumerate() {
        assert!(
            pp.n_off >= MIN_PHASE_REQUESTS && pp.n_on >= MIN_PHASE_REQUESTS,
            "pair {}: too few requests to compare: {} off, {} on",
            i + 1,
            pp.n_off,
            pp.n_on
        );
    }
    assert_flood_held(&m, case);
    pairs.iter().map(PhasePair::ratio).collect()
}

/// The flood was one, it reached xlb only in the phases *on*, and the
/// limit held it there.
fn assert_flood_held(m: &Flooded, case: &FloodCase) {
    for (i, ph) in m.phases.iter().enumerate() {
        let f = &ph.report;
        assert_eq!(f.errors, 0, "phase {}: flood connects failed", i + 1);
        // One SYN per connect (the connect timeout is under the 1 s
        // retransmission): all of them at the wire, by the phase's kind.
        let (at_wire, elsewhere) = if ph.on {
            (ph.wire.passed, ph.wire.dropped)
        } else {
            (ph.wire.dropped, ph.wire.passed)
        };
        assert!(
            at_wire >= f.started && elsewhere == 0,
            "phase {}: {}",
            i + 1,
            ph.line()
        );
        if !ph.on {
            assert_eq!(f.timed_out, f.started, "phase {}: {}", i + 1, ph.line());
        }
    }
    let on_started = m.sum(true, |f| f.started);
    assert!(
        on_started > 10 * m.bound(),
        "the flood was no flood: {on_started} connects reached the VIP for a bound of {}",
        m.bound()
    );
    assert!(
        m.from_flooder <= m.bound(),
        "the backends accepted {} connections from {}/{}; the limit allows {}",
        m.from_flooder,
        case.net,
        case.len,
        m.bound()
    );
    assert!(
        m.from_flooder >= LIMIT_BURST,
        "the limit let less than its burst through: {}",
        m.from_flooder
    );
    // The /64 case: what got through came from all over the /64, so the
    // limit held the prefix, not each address.
    assert!(
        m.flooder_addresses >= case.sources.len() / 2,
        "connections from {} of the flood's {} addresses",
        m.flooder_addresses,
        case.sources.len()
    );
    // Every SYN the limit dropped is one flood connect that timed out in a
    // phase *on*; the phases *off* never reached it.
    let timed_out = m.sum(true, |f| f.timed_out);
    assert!(
        m.limited >= timed_out * 9 / 10 && m.limited <= on_started && timed_out > 0,
        "drop_rate_limited +{} for {timed_out} timed-out connects of {on_started} that reached \
         the VIP",
        m.limited
    );
}

/// A VIP of the flood tests, limited per source.
fn limited_vip(name: &str, address: IpAddr) -> Vip {
    Vip {
        guard: Some(limit_guard()),
        ..Vip::new(name, address, 80, Mode::DsrIpip, 3)
    }
}

/// One IPv4 address floods `api` with connects; the limit holds it to
/// 50/s, and the client next to it notices nothing.
#[test]
fn flood_from_one_ipv4_is_limited_and_others_do_not_notice() {
    flood_is_limited_and_others_do_not_notice(FloodCase {
        tag: "f4",
        vip: limited_vip("api", topology::VIP_V4.into()),
        sources: vec![topology::FLOOD_V4.into()],
        net: topology::FLOOD_V4.into(),
        len: 32,
    });
}

/// 64 addresses of one IPv6 /64 flood `api6` in turn; the limit is keyed by
/// the /64, so together they get 50/s, not 64 × 50/s.
#[test]
fn flood_from_one_ipv6_64_is_limited_and_others_do_not_notice() {
    flood_is_limited_and_others_do_not_notice(FloodCase {
        tag: "f6",
        vip: limited_vip("api6", topology::VIP_V6.into()),
        sources: topology::flood_v6_sources()
            .into_iter()
            .map(IpAddr::from)
            .collect(),
        net: FLOOD_NET_V6.into(),
        len: FLOOD_NET_V6_PREFIX,
    });
}

// ---------------------------------------------------------------------------
// Heavy hitters: `xlb sources`, the `source` alert, `auto_block`.

/// The flooder as `xlb sources` and `xlb blocks` key it.
const FLOODER_V4: &str = "10.99.0.9/32";

/// `[vip.guard]` of the sources test: no limit, an alert at 100 new
/// flows/s from one source, an automatic 5 s block above 300/s for 2 s.
const HEAVY_GUARD: &str = "source_alert = { rate = \"100/s\" }\n\
     auto_block = { above = \"300/s\", for = \"2s\", ttl = \"5s\", action = \"drop\" }";

/// The sources test's flood: 1,000 connects/s (over the auto_block
/// threshold whatever the machine's speed), each closed at once.
const HEAVY_RATE: u32 = 1000;
/// Long enough for the alert (1 s ticks) and the block (2 s sustained,
/// then a tick); it ends before the block's 5 s TTL, so the expired block
/// is not renewed by a flood that goes on.
const HEAVY_FOR: Duration = Duration::from_secs(6);

/// How soon `xlb sources` must name the flooder after the flood starts.
const NAMED_WITHIN: Duration = Duration::from_secs(5);

fn heavy_flood(target: SocketAddr) -> ConnectFloodOptions {
    ConnectFloodOptions {
        rate: Some(HEAVY_RATE),
        then: AfterConnect::Close,
        ..ConnectFloodOptions::new(
            target,
            vec![topology::FLOOD_V4.into()],
            u64::from(HEAVY_RATE) * HEAVY_FOR.as_secs(),
            HEAVY_FOR,
        )
    }
}

/// Events of `kind` about `prefix` (named in any field) after `seq`.
fn events_about<'a>(
    events: &'a [Event],
    kind: EventKind,
    prefix: &str,
    seq: u64,
) -> Vec<&'a Event> {
    events
        .iter()
        .filter(|e| e.seq > seq && e.kind == kind)
        .filter(|e| {
            [
                e.backend.as_deref(),
                Some(e.reason.as_str()),
                e.to.as_deref(),
                e.from.as_deref(),
            ]
            .into_iter()
            .flatten()
            .any(|f| f.contains(prefix))
        })
        .collect()
}

/// Whether a `block` event adds an entry (`to` = `added`).
fn adds(e: &Event) -> bool {
    e.to.as_deref() == Some("added")
}

/// Whether a `block` event removes an entry (`to` = `removed` or
/// `expired`). A third kind (`flows_cut`) reports the established flows a
/// new entry cut.
fn removes(e: &Event) -> bool {
    matches!(e.to.as_deref(), Some("removed" | "expired"))
}

/// What the sources test saw while the flood ran, timed from its start.
#[derive(Debug, Default)]
struct HeavyWatch {
    named_at: Option<Duration>,
    named_row: Option<String>,
    blocked_at: Option<Duration>,
    block_entry: Option<String>,
}

/// Polls `xlb sources` and `xlb blocks` every 250 ms until the flood ends.
fn watch_heavy(
    run: &LabRun,
    started: Instant,
    flood: &thread::JoinHandle<ConnectFloodReport>,
) -> HeavyWatch {
    let mut w = HeavyWatch::default();
    while !flood.is_finished() && started.elapsed() < HEAVY_FOR + Duration::from_secs(5) {
        if w.named_at.is_none() {
            let sources = run.sources(Some("api")).unwrap();
            if let Some(row) = sources
                .iter()
                .flat_map(|v| &v.sources)
                .find(|r| r.prefix == FLOODER_V4)
            {
                w.named_at = Some(started.elapsed());
                w.named_row = Some(format!("{row:?}"));
            }
        }
        if w.blocked_at.is_none()
            && let Some(b) = run
                .blocks()
                .unwrap()
                .into_iter()
                .find(|b| b.prefix == FLOODER_V4 && b.origin == EntryOrigin::Auto)
        {
            w.blocked_at = Some(started.elapsed());
            w.block_entry = Some(format!("{b:?}"));
        }
        thread::sleep(Duration::from_millis(250));
    }
    w
}

/// A source at 1,000 new flows/s: `xlb sources` names it within 5 s, a
/// `source` event fires, `auto_block` blocks its /32 (one `block` event,
/// listed by `xlb blocks` as `auto`), and 5 s later the block expires (a
/// second `block` event; gone from `xlb blocks`).
#[test]
fn sources_names_the_flooder_and_auto_block_expires() {
    let _serial = serial();
    let t0 = Instant::now();
    let p = prefix("src");
    let vip = Vip {
        guard: Some(HEAVY_GUARD.to_string()),
        ..Vip::new("api", topology::VIP_V4.into(), 80, Mode::DsrIpip, 3)
    };
    let cfg = XlbConfig {
        vips: vec![vip.clone()],
        ..XlbConfig::for_prefix(&p)
    };
    let run = up_with_flooder(&p, &cfg);
    let seq0 = run
        .events()
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .max()
        .unwrap_or(0);
    let flood_ns = run.flood_ns().unwrap();
    let opts = heavy_flood(vip.target());
    let started = Instant::now();
    let started_unix_ms = now_unix_ms();
    let flood = thread::spawn(move || connect_flood_in(&flood_ns, &opts).unwrap());
    let w = watch_heavy(&run, started, &flood);
    let flood = flood.join().unwrap();
    let flood_end = started.elapsed();

    // The block expires 5 s after it was made.
    let expiry_wait = Duration::from_secs(10);
    let mut expired_at = None;
    while started.elapsed() < HEAVY_FOR + expiry_wait {
        let listed = run.blocks().unwrap().iter().any(|b| b.prefix == FLOODER_V4);
        if !listed {
            expired_at = Some(started.elapsed());
            break;
        }
        thread::sleep(Duration::from_millis(250));
    }
    thread::sleep(COUNTER_TICK);
    let events = run.events().unwrap();
    let source_events = events_about(&events, EventKind::Source, FLOODER_V4, seq0);
    let block_events = events_about(&events, EventKind::Block, FLOODER_V4, seq0);
    let heavy_after = source_events
        .iter()
        .find(|e| e.to.as_deref() == Some("heavy"))
        .map(|e| e.at_unix_ms.saturating_sub(started_unix_ms));
    eprintln!(
        "[{p}] flood {flood:?} ({:.0}/s) ended at {flood_end:?}; named by xlb sources at {:?}: \
         {}; auto-blocked at {:?}: {}; left xlb blocks at {expired_at:?}; `source` event {heavy_after:?} ms after the start\n\
         source events: {source_events:#?}\nblock events: {block_events:#?}",
        flood.started_per_s(),
        w.named_at,
        w.named_row.as_deref().unwrap_or("-"),
        w.blocked_at,
        w.block_entry.as_deref().unwrap_or("-"),
    );

    let named_at = w.named_at.expect("xlb sources never named the flooder");
    assert!(named_at <= NAMED_WITHIN, "named after {named_at:?}");
    let alert_after =
        heavy_after.unwrap_or_else(|| panic!("no `source` event says {FLOODER_V4} went heavy"));
    assert!(
        alert_after <= NAMED_WITHIN.as_millis() as u64,
        "the `source` event came {alert_after} ms after the flood started"
    );
    let blocked_at = w.blocked_at.expect("auto_block never blocked the flooder");
    assert!(
        flood.timed_out > 0,
        "the block should have dropped the flood's SYNs: {flood:?}"
    );
    let blocked: Vec<_> = block_events.iter().filter(|e| adds(e)).collect();
    let unblocked: Vec<_> = block_events.iter().filter(|e| removes(e)).collect();
    assert_eq!(
        blocked.len(),
        1,
        "one `block` event blocks it: {block_events:#?}"
    );
    assert_eq!(
        unblocked.len(),
        1,
        "one `block` event says it expired: {block_events:#?}"
    );
    let expired_at = expired_at.expect("the auto block did not expire");
    let held = expired_at.saturating_sub(blocked_at);
    assert!(
        held >= Duration::from_secs(4) && held <= Duration::from_secs(8),
        "the 5 s block was listed for {held:?}"
    );
    assert!(
        unblocked[0].at_unix_ms - blocked[0].at_unix_ms >= 4_500,
        "expired {} ms after it was made",
        unblocked[0].at_unix_ms - blocked[0].at_unix_ms
    );
    teardown(run);
    eprintln!("[{p}] done in {:.1} s", t0.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------
// `xlb block` with reset and with drop.

/// A connect refused by a RST from XDP must fail within this; one that is
/// answered or dropped behaves nothing like it (a dropped SYN is retried
/// after 1 s).
const RESET_FAILS_WITHIN: Duration = Duration::from_millis(200);
/// Timeout of the connects of the drop case.
const DROP_TIMEOUT: Duration = Duration::from_millis(1500);

/// `xlb block` of the client's address on `api` with `--action reset`: its
/// connects fail with ECONNREFUSED in milliseconds; with `--action drop`
/// they time out; `xlb unblock` lets it connect again. The same with reset
/// for the client's IPv6 /64 on `api6`.
#[test]
fn block_with_reset_fails_connect_fast() {
    let _serial = serial();
    let t0 = Instant::now();
    let p = prefix("rst");
    let vip = Vip::new("api", topology::VIP_V4.into(), 80, Mode::DsrIpip, 3);
    let vip6 = Vip::new("api6", topology::VIP_V6.into(), 80, Mode::DsrIpip, 3);
    let cfg = XlbConfig {
        vips: vec![vip.clone(), vip6.clone()],
        ..XlbConfig::for_prefix(&p)
    };
    let run = up(&p, &cfg);
    let ns = run.lab().ns_client();
    let client = run.lab().client_v4().to_string();
    let connect = |timeout| time_connect_in(&ns, vip.target(), timeout).unwrap();
    let (how, took) = connect(DROP_TIMEOUT);
    assert_eq!(how, Connect::Connected, "before any block ({took:?})");

    // Reset: every connect refused at once.
    let before = guard_counters(&run);
    run.block(
        &client,
        &[
            "--vip",
            "api",
            "--action",
            "reset",
            "--reason",
            "abuse test",
        ],
    )
    .unwrap();
    let entry = run.blocks().unwrap();
    let mut times = Vec::new();
    for _ in 0..10 {
        let (how, took) = connect(DROP_TIMEOUT);
        assert_eq!(
            how,
            Connect::Refused,
            "blocked with reset ({took:?}); blocks: {entry:?}"
        );
        times.push(took);
    }
    let worst = times.iter().max().copied().unwrap_or_default();
    let mean = times.iter().sum::<Duration>() / times.len() as u32;
    thread::sleep(COUNTER_TICK);
    let after = guard_counters(&run);
    let hits = run
        .blocks()
        .unwrap()
        .into_iter()
        .find(|b| b.list == ListKind::Deny && b.prefix == format!("{client}/32"))
        .map(|b| b.hits);
    run.unblock(&client, &["--vip", "api"]).unwrap();
    let (how, took) = connect(DROP_TIMEOUT);
    assert_eq!(how, Connect::Connected, "after unblock ({took:?})");

    // Drop: the SYN is lost, the connect waits for its retransmissions.
    run.block(&client, &["--vip", "api", "--action", "drop"])
        .unwrap();
    let (dropped, drop_took) = connect(DROP_TIMEOUT);
    run.unblock(&client, &["--vip", "api"]).unwrap();
    let (how, took) = connect(DROP_TIMEOUT);

    // IPv6: the client's /64 on api6, reset (the RST built for IPv6).
    let net6 = "fd00:99::/64";
    let connect6 = |timeout| time_connect_in(&ns, vip6.target(), timeout).unwrap();
    run.block(net6, &["--vip", "api6", "--action", "reset"])
        .unwrap();
    let (refused6, took6) = connect6(DROP_TIMEOUT);
    run.unblock(net6, &["--vip", "api6"]).unwrap();
    let (how6, after6) = connect6(DROP_TIMEOUT);
    eprintln!(
        "[{p}] reset: 10 connects refused in {times:?} (mean {mean:?}, worst {worst:?}); \
         reset_denied +{}, the entry's hits {hits:?}; drop: {dropped:?} after {drop_took:?}; \
         after unblock: {how:?} in {took:?}; IPv6 /64 with reset: {refused6:?} in {took6:?}, \
         after unblock: {how6:?} in {after6:?}",
        delta(&after, &before, "reset_denied"),
    );
    assert!(
        worst < RESET_FAILS_WITHIN,
        "a refused connect took {worst:?}"
    );
    assert!(
        delta(&after, &before, "reset_denied") >= 10,
        "reset_denied +{}",
        delta(&after, &before, "reset_denied")
    );
    assert!(hits.unwrap_or(0) >= 10, "the entry's hits: {hits:?}");
    assert_eq!(
        dropped,
        Connect::TimedOut,
        "blocked with drop ({drop_took:?})"
    );
    assert_eq!(
        how,
        Connect::Connected,
        "after the second unblock ({took:?})"
    );
    assert_eq!(
        refused6,
        Connect::Refused,
        "IPv6 /64 blocked with reset ({took6:?})"
    );
    assert!(
        took6 < RESET_FAILS_WITHIN,
        "a refused IPv6 connect took {took6:?}"
    );
    assert_eq!(how6, Connect::Connected, "IPv6 after unblock ({after6:?})");
    teardown(run);
    eprintln!("[{p}] done in {:.1} s", t0.elapsed().as_secs_f64());
}

/// The configurations these tests run are ones xlb accepts (no root
/// needed).
#[test]
fn abuse_configurations_are_valid() {
    let p = "cfg";
    let with = |vip: Vip| {
        XlbConfig {
            vips: vec![vip],
            ..XlbConfig::for_prefix(p)
        }
        .render()
    };
    let cases = [
        (
            "limited v4",
            with(limited_vip("api", topology::VIP_V4.into())),
        ),
        (
            "limited v6",
            with(limited_vip("api6", topology::VIP_V6.into())),
        ),
        (
            "heavy",
            with(Vip {
                guard: Some(HEAVY_GUARD.to_string()),
                ..Vip::new("api", topology::VIP_V4.into(), 80, Mode::DsrIpip, 3)
            }),
        ),
    ];
    for (name, text) in cases {
        let cfg = lb_user::config::Config::from_str(&text, name)
            .unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        assert_eq!(cfg.warnings, Vec::<String>::new(), "{name}");
    }
}
