//! Several xlb nodes behind an ECMP router (issue 26), end to end in the
//! two-node lab (`xlb_lab::scenario::ClusterRun`): a router running BIRD
//! with `merge paths` and the L4 multipath hash, node A and node B each
//! running `xlb run` and BIRD, the same backends. Every verdict comes from
//! the lab client's own counts (each long connection's end and bytes) or
//! from the router's kernel routes.
//!
//! Each test builds its own lab under its own prefix, so they run in
//! parallel; every wait is bounded. Needs root and BIRD 2 (`bird2`).

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    thread,
    time::{Duration, Instant},
};

use xlb_lab::{
    client::{LoadOptions, Report},
    scenario::{ClusterOptions, ClusterRun, SERVICE_PORTS, Speaker},
    topology::{self, Node},
};
use xlb_tests::lab::xlb_binary;

/// Long-lived connections each death scenario keeps open.
const LONG_CONNS: u32 = 200;

/// Without BFD the router notices a silent node after the 3 s hold time;
/// a connection may go that long (and a TCP retransmission more) without
/// data and still count as kept.
const STALL_ALLOWED: Duration = Duration::from_secs(8);

/// Bound on the router reaching the expected next hops.
const ROUTE_TIMEOUT: Duration = Duration::from_secs(10);

/// Unique per test process and test, so parallel runs do not collide.
fn prefix(tag: &str) -> String {
    format!("xc{}{tag}", std::process::id() % 1000)
}

fn vips() -> [IpAddr; 2] {
    [topology::VIP_V4.into(), topology::VIP_V6.into()]
}

/// Builds the two-node lab and announces the VIPs from both nodes.
fn up(tag: &str, bfd: bool) -> ClusterRun {
    xlb_tests::require_root();
    let t0 = Instant::now();
    let mut opts = ClusterOptions::new(&prefix(tag), &xlb_binary());
    opts.bfd = bfd;
    let c = ClusterRun::up(&opts).unwrap_or_else(|e| panic!("cluster up: {e}"));
    for node in Node::ALL {
        for vip in vips() {
            c.inject_route(node, vip).unwrap();
        }
    }
    for vip in vips() {
        c.wait_router(vip, &[Node::A, Node::B], ROUTE_TIMEOUT)
            .unwrap_or_else(|e| panic!("both nodes announce {vip}: {e}"));
    }
    eprintln!(
        "[{tag}] two-node lab up, both nodes announced, in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    c
}

fn new_flows(c: &ClusterRun, node: Node, vip: &str) -> u64 {
    let s = c.status(node).unwrap();
    s.vips
        .iter()
        .find(|v| v.name == vip)
        .unwrap_or_else(|| panic!("no vip {vip} on node {node:?}"))
        .new_flows
}

/// 200 long connections to `target`, run for `run_for`.
fn long_load(target: SocketAddr, run_for: Duration) -> LoadOptions {
    LoadOptions {
        duration: run_for,
        rate: 0,
        keepalive: 0,
        long: LONG_CONNS,
        stream_interval: Duration::from_millis(200),
        stall_after: STALL_ALLOWED,
        timeout: Duration::from_secs(2),
        ..LoadOptions::new(target)
    }
}

/// Every long connection of `report` got its stream, and was still open
/// and flowing at the end of the run: none reset, none stalled past
/// [`STALL_ALLOWED`].
fn assert_all_kept(what: &str, report: &Report) {
    assert_eq!(
        report.long.len(),
        LONG_CONNS as usize,
        "{what}: connections"
    );
    let mut ends: BTreeMap<&str, u64> = BTreeMap::new();
    for l in &report.long {
        *ends.entry(l.end.as_str()).or_default() += 1;
    }
    let broken: Vec<_> = report
        .long
        .iter()
        .filter(|l| !l.kept_flowing || l.end != "open")
        .collect();
    assert!(
        broken.is_empty(),
        "{what}: {} of {LONG_CONNS} connections broke (ends {ends:?}); first: {:?}",
        broken.len(),
        broken.first()
    );
}

/// The nodes' `new_flows` on `api` and `api6` since `before`.
fn flows_by_node(c: &ClusterRun) -> BTreeMap<Node, u64> {
    Node::ALL
        .into_iter()
        .map(|n| (n, new_flows(c, n, "api") + new_flows(c, n, "api6")))
        .collect()
}

#[test]
fn both_nodes_announce_and_new_connections_spread() {
    let c = up("s", false);
    for vip in vips() {
        assert_eq!(
            c.lab().router_nodes(vip).unwrap(),
            [Node::A, Node::B],
            "{vip}"
        );
    }
    for vip in vips() {
        let target = SocketAddr::new(vip, SERVICE_PORTS[0]);
        let report = c
            .run()
            .run_client(LoadOptions {
                duration: Duration::from_secs(2),
                rate: 100,
                keepalive: 0,
                ..LoadOptions::new(target)
            })
            .unwrap();
        assert!(
            report.summary.counts.ok >= 150,
            "{vip}: {:?}",
            report.summary.counts
        );
        assert_eq!(
            report.summary.failures, 0,
            "{vip}: {:?}",
            report.summary.counts
        );
    }
    // Counters are sampled once a second.
    thread::sleep(Duration::from_millis(1500));
    for (node, vip) in [
        (Node::A, "api"),
        (Node::B, "api"),
        (Node::A, "api6"),
        (Node::B, "api6"),
    ] {
        let n = new_flows(&c, node, vip);
        assert!(
            n > 0,
            "node {node:?} took no new flow of {vip}: the router does not spread"
        );
    }
}

/// How a node dies in [`one_death`].
#[derive(Debug, Clone, Copy)]
enum Death {
    /// (a) daemon and BIRD killed, XDP detached.
    Killed,
    /// (b) its link to the router dropped on the bridge.
    Silenced,
}

/// 200 long connections over both nodes; node A dies `how`; every one
/// continues through node B.
fn one_death(tag: &str, how: Death, bfd: bool) {
    let mut c = up(tag, bfd);
    let target = SocketAddr::new(topology::VIP_V4.into(), SERVICE_PORTS[0]);
    let client = c
        .run()
        .start_client(long_load(target, Duration::from_secs(14)))
        .unwrap();
    // Let every connection set up and spread.
    thread::sleep(Duration::from_secs(3));
    let spread = flows_by_node(&c);
    assert!(
        spread.values().all(|&n| n > 0),
        "connections did not spread: {spread:?}"
    );
    let t = Instant::now();
    let silencer = match how {
        Death::Killed => {
            c.kill_node(Node::A).unwrap();
            None
        }
        Death::Silenced => Some(c.lab().silence_link(Node::A).unwrap()),
    };
    let converged = c
        .wait_router(topology::VIP_V4.into(), &[Node::B], ROUTE_TIMEOUT)
        .unwrap();
    eprintln!(
        "[{tag}] {how:?}: the router sends to node B only after {:.0} ms",
        converged.as_secs_f64() * 1e3
    );
    let report = client.join().unwrap();
    if let Some(s) = &silencer {
        assert!(
            s.dropped().unwrap() > 0,
            "the silenced link carried nothing to drop"
        );
    }
    eprintln!(
        "[{tag}] {how:?}: flows before the death {spread:?}; report {:?} in {:?}",
        report.summary.long_broken,
        t.elapsed()
    );
    assert_all_kept(&format!("{how:?}"), &report);
    drop(silencer);
}

#[test]
fn node_killed_connections_continue_through_the_other() {
    one_death("k", Death::Killed, false);
}

#[test]
fn node_link_silenced_connections_continue_with_bfd() {
    one_death("b", Death::Silenced, true);
}

#[test]
fn bird_down_on_a_node_takes_only_its_routes() {
    let mut c = up("d", false);
    c.kill_bird(Speaker::Node(Node::B)).unwrap();
    for vip in vips() {
        c.wait_router(vip, &[Node::A], ROUTE_TIMEOUT).unwrap();
    }
    // Forwarding untouched on node B: xlb still runs and serves.
    let s = c.status(Node::B).unwrap();
    assert!(s.all_up(), "{}", s.summary());
    c.start_bird(Speaker::Node(Node::B)).unwrap();
    for vip in vips() {
        c.wait_router(vip, &[Node::A, Node::B], ROUTE_TIMEOUT)
            .unwrap();
    }
}
