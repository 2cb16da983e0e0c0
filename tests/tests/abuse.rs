//! End to end, issue 9: a conntrack that a flood cannot wash out. The real
//! `xlb` in the namespaced lab with a small conntrack, 200 long-lived
//! `/stream` connections through VIP `api`, one backend drained, then a
//! flood of spoofed TCP ACKs (random sources in 10.99.128.0/17, inside the
//! lab) to the VIP from the client namespace, many times the conntrack's
//! size. Only a SYN (or a UDP packet) inserts an entry, so the flood misses
//! without inserting and the real flows keep their entries: every long
//! connection keeps its backend, the drained one included. Before that
//! rule, every miss inserted, the flood evicted the real entries from the
//! LRU, and the drained backend's connections followed the table to
//! another backend, which reset them.
//!
//! Same rules as `e2e.rs` and `cascade.rs`: the test builds its own lab
//! (own prefix `abu…`, instance and socket) through `LabRun`, whose Drop
//! stops everything and removes the namespaces however the test ends; a
//! passing test checks that nothing is left; one lab at a time
//! (`xlb_tests::lab::serial`); every wait and the flood are bounded; traffic
//! stays inside the namespaces.
//!
//! Needs root and the binaries: `cargo build -p lb-user -p xlb-lab` (without
//! AYA_BUILD_SKIP), then
//! `cargo test -p xlb-tests --test abuse -- --nocapture`. `XLB_BIN` points
//! at another `xlb`.

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

use xlb_lab::{
    client::{LoadOptions, Report},
    flood::{FloodOptions, flood_in},
    scenario::{LabRun, Status, XlbConfig},
};
use xlb_tests::lab::{cascade::COUNTER_TICK, serial, teardown, up, wait_client_ms};

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
