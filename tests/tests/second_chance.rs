//! Second chance end to end, in the one-node lab: 200 long-lived `/stream`
//! connections through a `dsr-ipip` VIP, then the backend set changes
//! while they live (a reload adds b4 and takes b3 out of the table with
//! weight 0) and the load balancer forgets every flow as a second node
//! would (its conntrack map emptied under the running daemon). Each
//! client ACK then misses conntrack and goes to its slot's current owner;
//! for the flows whose slot moved, that owner has no socket. With second
//! chance every connection keeps flowing (the lab client's own counts);
//! with `second_chance = false` the test counts how many reset (> 0). With
//! one table change (b3 out alone) and with the two (b4 in, b3
//! out) all 200 continue.
//!
//! Needs root and fresh binaries: `cargo build -p lb-user -p xlb-lab`, then
//! `cargo test -p xlb-tests --test second_chance -- --test-threads 1 --nocapture`.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::{path::Path, time::Duration};

use aya::maps::{HashMap, Map, MapData};
use lb_common::{CtEntry, FlowKey};
use xlb_lab::{
    client::{LoadOptions, Report},
    scenario::{self, Health, Mode, Vip, XlbConfig},
    topology::{self, Lab},
};
use xlb_tests::lab::{serial, teardown, wait_client_ms, xlb_binary};

fn prefix(tag: &str) -> String {
    format!("sc{tag}{}", std::process::id() % 1000)
}

/// The lab's VIP with b1–b3, and its file with `second_chance` as given
/// (`None`: the default).
fn file(cfg: &XlbConfig, second_chance: Option<bool>) -> String {
    let text = cfg.render();
    let Some(on) = second_chance else {
        return text;
    };
    let api = "name = \"api\"\n";
    assert!(text.contains(api), "{text}");
    text.replacen(api, &format!("{api}second_chance = {on}\n"), 1)
}

/// Empties the running daemon's conntrack map: the load balancer forgets
/// every flow, as a node that never saw them would.
fn forget_flows(instance: &str) -> usize {
    let path = Path::new("/sys/fs/bpf/xlb")
        .join(instance)
        .join(lb_common::MAP_CT);
    let data = MapData::from_pin(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut ct: HashMap<_, FlowKey, CtEntry> =
        HashMap::try_from(Map::LruHashMap(data)).expect("XLB_CT is an LRU hash");
    let keys: Vec<FlowKey> = ct.keys().filter_map(Result::ok).collect();
    for k in &keys {
        let _ = ct.remove(k);
    }
    keys.len()
}

/// Runs the scenario with `second_chance` and returns the client's report
/// and the load balancer's `second_chance` counter.
fn scenario(tag: &str, second_chance: Option<bool>, add_b4: bool) -> (Report, u64) {
    let _serial = serial();
    let p = prefix(tag);
    let vip = Vip::new("api", topology::VIP_V4.into(), 80, Mode::DsrIpip, 3);
    let mut cfg = XlbConfig {
        health: Health::default(),
        vips: vec![vip.clone()],
        ..XlbConfig::for_prefix(&p)
    };
    let run = scenario::LabRun::up_with(scenario::RunOptions {
        backends: 4,
        ..scenario::RunOptions::new(&p, &xlb_binary(), &file(&cfg, second_chance))
    })
    .unwrap_or_else(|e| panic!("lab up: {e}"));
    // Relaying needs forwarding on the backends' decap interface (see the
    // README, "Second chance").
    for i in 1..=4 {
        let ns = run.lab().ns_backend(i);
        let out = Lab::exec(&ns, ["sysctl", "-qw", "net.ipv4.conf.eth0.forwarding=1"])
            .output()
            .expect("sysctl");
        assert!(out.status.success(), "{ns}: {out:?}");
        // veth delivers a frame sent with XDP_TX only to a peer that runs
        // an XDP program: the relay leaves the backend that way.
        let bridge = run.lab().ns_bridge();
        let peer = run.lab().backend_peer_ifname(i);
        let xlb = xlb_binary();
        let cmd = Lab::exec(
            &bridge,
            [
                xlb.as_os_str(),
                "xdp-pass".as_ref(),
                "--interface".as_ref(),
                peer.as_ref(),
            ],
        );
        run.lab()
            .spawn(cmd)
            .expect("xlb xdp-pass on a backend's peer");
    }
    std::thread::sleep(Duration::from_millis(1500));
    let client = run
        .start_client(LoadOptions {
            duration: Duration::from_secs(9),
            rate: 0,
            keepalive: 0,
            long: 200,
            stream_interval: Duration::from_millis(100),
            stall_after: Duration::from_secs(3),
            timeout: Duration::from_secs(3),
            slice: Duration::from_millis(500),
            ..LoadOptions::new(vip.target())
        })
        .unwrap();
    wait_client_ms(&client, 2500);
    if add_b4 {
        cfg.vips[0].backends = vec![1, 2, 3, 4];
    }
    cfg.vips[0].weights.insert(3, 0);
    let out = run.reload(&file(&cfg, second_chance)).unwrap();
    eprintln!("[{p}] xlb reload: {}", out.trim());
    wait_client_ms(&client, 3500);
    let forgotten = forget_flows(run.instance());
    eprintln!("[{p}] conntrack emptied: {forgotten} flows forgotten");
    let report = client.join().unwrap();
    let sent = run.counter("second_chance").unwrap();
    let status = run.status().unwrap();
    let moved: Vec<String> = status
        .counters
        .iter()
        .filter(|(k, v)| {
            **v > 0 && (k.starts_with("drop") || k.starts_with("ct_") || k.starts_with("second"))
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    eprintln!("[{p}] counters: {}", moved.join(" "));
    let mut broken: std::collections::BTreeMap<(String, String), usize> = Default::default();
    for l in report.long.iter().filter(|l| !l.kept_flowing) {
        *broken
            .entry((l.backend.clone().unwrap_or_default(), l.end.clone()))
            .or_default() += 1;
    }
    eprintln!("[{p}] broken by (backend, end): {broken:?}");
    eprintln!(
        "[{p}] second_chance {second_chance:?}: {} of {} long connections kept flowing; \
         reset {}, counter second_chance = {sent}",
        report.summary.long_total - report.summary.long_broken,
        report.summary.long_total,
        resets(&report)
    );
    teardown(run);
    (report, sent)
}

fn resets(r: &Report) -> usize {
    r.long.iter().filter(|l| !l.kept_flowing).count()
}

/// The scenario on one node: a reload that adds b4 and takes b3
/// out, then the LB forgets every flow (as a second node would know none).
/// One reload is several rebuilds (b3 out at once, b4 in once probed up,
/// then its slow start); the daemon counts them as one change of each slot
/// (`chance::SETTLE_NS`), so each slot still names the owner from before
/// the reload. Before that rule: 118–139 of 200 kept.
#[test]
fn every_connection_continues_with_second_chance() {
    let (report, sent) = scenario("on", None, true);
    assert_eq!(report.summary.long_total, 200);
    let broken: Vec<_> = report.long.iter().filter(|l| !l.kept_flowing).collect();
    assert!(broken.is_empty(), "connections broke: {broken:?}");
    assert!(sent > 0, "no packet was given a second chance");
}

#[test]
fn without_second_chance_connections_reset() {
    let (report, sent) = scenario("off", Some(false), true);
    assert_eq!(report.summary.long_total, 200);
    assert_eq!(sent, 0, "second chance off, yet packets went twice");
    assert!(
        resets(&report) > 0,
        "no connection broke without second chance: the scenario moved no flow"
    );
}

/// One change of the table (b3 out, weight 0), the LB's conntrack
/// emptied: every connection continues, b3's through their slots' new
/// owners' decapsulators.
#[test]
fn one_table_change_loses_no_connection() {
    let (report, sent) = scenario("one", None, false);
    assert_eq!(report.summary.long_total, 200);
    let broken: Vec<_> = report.long.iter().filter(|l| !l.kept_flowing).collect();
    assert!(broken.is_empty(), "connections broke: {broken:?}");
    assert!(sent > 0, "no packet was given a second chance");
}
