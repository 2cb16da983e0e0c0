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
    Fault,
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

/// Builds the two-node lab and waits until both nodes' xlb announced the
/// VIPs and the router installed them.
fn up(tag: &str, bfd: bool) -> ClusterRun {
    let mut opts = options(tag);
    opts.bfd = bfd;
    up_with(tag, &opts)
}

fn options(tag: &str) -> ClusterOptions {
    xlb_tests::require_root();
    ClusterOptions::new(&prefix(tag), &xlb_binary())
}

fn up_with(tag: &str, opts: &ClusterOptions) -> ClusterRun {
    let t0 = Instant::now();
    let c = ClusterRun::up(opts).unwrap_or_else(|e| panic!("cluster up: {e}"));
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
/// [`STALL_ALLOWED`]. A connection that reached another backend after the
/// death would have been reset by it (no socket there), so open and
/// flowing also means: the same backend as before.
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
    /// (c) `xlb withdraw --all` on it.
    Withdrawn,
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
        Death::Withdrawn => {
            c.ctl(Node::A, &["withdraw", "--all", "--reason", "cluster test"])
                .unwrap();
            None
        }
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
fn node_link_silenced_connections_continue_after_the_hold_time() {
    one_death("h", Death::Silenced, false);
}

#[test]
fn node_withdrawn_connections_continue_through_the_other() {
    one_death("w", Death::Withdrawn, false);
}

#[test]
fn bird_down_on_a_node_takes_only_its_routes() {
    let mut c = up("d", false);
    c.kill_bird(Speaker::Node(Node::B)).unwrap();
    for vip in vips() {
        c.wait_router(vip, &[Node::A], ROUTE_TIMEOUT).unwrap();
    }
    // Node B says why nothing of it is announced, and keeps forwarding:
    // its VIPs stay announced as far as xlb knows (the routes are in its
    // table for a speaker that comes back), every backend up.
    let s = c
        .wait_status(
            Node::B,
            "the speaker check to notice BIRD is gone",
            ROUTE_TIMEOUT,
            |s| {
                s.announce
                    .as_ref()
                    .and_then(|a| a.speaker.as_deref())
                    .is_some_and(|sp| sp.contains("not running"))
            },
        )
        .unwrap();
    let announce = s.announce.as_ref().unwrap();
    let speaker = announce.speaker.as_deref().unwrap();
    assert!(
        speaker.contains("bird-b.ctl"),
        "names the socket: {speaker}"
    );
    assert_eq!(
        announce.routes,
        ["10.100.0.1", "10.100.0.2", "fd00:100::1"],
        "{announce:?}"
    );
    assert!(s.all_up(), "{}", s.summary());
    let flows = new_flows(&c, Node::B, "api");
    let report = c
        .run()
        .run_client(LoadOptions {
            duration: Duration::from_secs(1),
            rate: 50,
            keepalive: 0,
            ..LoadOptions::new(SocketAddr::new(topology::VIP_V4.into(), SERVICE_PORTS[0]))
        })
        .unwrap();
    assert_eq!(report.summary.failures, 0, "{:?}", report.summary.counts);
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        new_flows(&c, Node::B, "api"),
        flows,
        "the router sent node B new flows"
    );
    c.start_bird(Speaker::Node(Node::B)).unwrap();
    for vip in vips() {
        c.wait_router(vip, &[Node::A, Node::B], ROUTE_TIMEOUT)
            .unwrap();
    }
}

#[test]
fn a_vip_with_every_backend_down_is_withdrawn_by_both_nodes() {
    let c = up("z", false);
    let [v4, v6] = vips();
    for i in 1..=3 {
        c.run().set_fault(i, Fault::Error503).unwrap();
    }
    for vip in [v4, v6] {
        c.wait_router(vip, &[], ROUTE_TIMEOUT)
            .unwrap_or_else(|e| panic!("{vip} withdrawn by both nodes: {e}"));
    }
    for node in Node::ALL {
        let s = c.status(node).unwrap();
        let api = s.vips.iter().find(|v| v.name == "api").unwrap();
        let a = api.announce.as_ref().expect("an announce state");
        assert_eq!(a.state, "withdrawn", "node {node:?}: {a:?}");
    }
    c.run().set_fault(2, Fault::None).unwrap();
    for vip in [v4, v6] {
        c.wait_router(vip, &[Node::A, Node::B], ROUTE_TIMEOUT)
            .unwrap_or_else(|e| panic!("{vip} announced again by both nodes: {e}"));
    }
    let report = c
        .run()
        .run_client(LoadOptions {
            duration: Duration::from_secs(1),
            rate: 50,
            keepalive: 0,
            ..LoadOptions::new(SocketAddr::new(v4, SERVICE_PORTS[0]))
        })
        .unwrap();
    assert_eq!(report.summary.failures, 0, "{:?}", report.summary.counts);
    assert_eq!(
        report.summary.per_backend.keys().collect::<Vec<_>>(),
        ["b2"]
    );
}

/// 200 long connections over both nodes; then, in one reload on both,
/// backend b4 joins and b1 leaves the table (weight 0: a backend deleted
/// from the configuration is retired at once and can be nobody's previous
/// owner, second chance's documented limit); then node A dies. Returns the
/// connections that broke.
fn backends_change_then_death(tag: &str, second_chance: bool) -> (u64, BTreeMap<Node, u64>) {
    let mut opts = options(tag);
    opts.backends = 4;
    opts.config
        .vips
        .retain(|v| v.name == "api" || v.name == "api6");
    if !second_chance {
        opts.extra_daemon = "second_chance_window = \"0s\"".to_string();
    }
    let mut c = up_with(tag, &opts);
    let target = SocketAddr::new(topology::VIP_V4.into(), SERVICE_PORTS[0]);
    let client = c
        .run()
        .start_client(long_load(target, Duration::from_secs(16)))
        .unwrap();
    thread::sleep(Duration::from_secs(3));
    let spread = flows_by_node(&c);
    assert!(
        spread.values().all(|&n| n > 0),
        "connections did not spread: {spread:?}"
    );
    for v in &mut opts.config.vips {
        v.backends = vec![1, 2, 3, 4];
        v.weights.insert(1, 0);
    }
    c.reload(&opts).unwrap();
    // Both tables rebuilt before node A goes.
    thread::sleep(Duration::from_secs(2));
    c.kill_node(Node::A).unwrap();
    c.wait_router(target.ip(), &[Node::B], ROUTE_TIMEOUT)
        .unwrap();
    let report = client.join().unwrap();
    let broken = report
        .long
        .iter()
        .filter(|l| !l.kept_flowing || l.end != "open")
        .count() as u64;
    // Packets node B sent with a second header to a slot's previous owner.
    let sent = c.status(Node::B).unwrap().counters["second_chance"];
    eprintln!(
        "[{tag}] second_chance {second_chance}: {broken} of {LONG_CONNS} connections broke \
         (spread before {spread:?}); node B sent {sent} packets with a second chance"
    );
    if second_chance {
        assert_all_kept("backends changed, then node A died", &report);
        assert!(
            sent > 0,
            "node B kept every connection without a second chance: the scenario moved no flow"
        );
    } else {
        assert_eq!(
            sent, 0,
            "second_chance_window = 0s, yet node B sent second chances"
        );
    }
    (broken, spread)
}

#[test]
fn backends_changed_and_node_died_second_chance_keeps_every_connection() {
    backends_change_then_death("c", true);
}

#[test]
fn backends_changed_and_node_died_without_second_chance_some_reset() {
    let (broken, _) = backends_change_then_death("n", false);
    assert!(
        broken > 0,
        "without second chance no connection broke: the scenario does not move any flow"
    );
}

/// Starts node B's daemon, which must refuse to run; returns what it said.
fn refused_start(c: &mut ClusterRun) -> String {
    let err = c
        .start_daemon(Node::B)
        .expect_err("xlb run in node B started despite the bad input")
        .to_string();
    // Node A kept the VIPs and serves alone.
    for vip in vips() {
        assert_eq!(c.lab().router_nodes(vip).unwrap(), [Node::A], "{vip}");
    }
    let report = c
        .run()
        .run_client(LoadOptions {
            duration: Duration::from_secs(1),
            rate: 50,
            keepalive: 0,
            ..LoadOptions::new(SocketAddr::new(topology::VIP_V4.into(), SERVICE_PORTS[0]))
        })
        .unwrap();
    assert_eq!(report.summary.failures, 0, "{:?}", report.summary.counts);
    err
}

#[test]
fn bad_input_on_a_node_is_refused_and_the_other_keeps_serving() {
    let mut opts = options("x");
    opts.start_daemons = false;
    let mut c = up_with_daemons_off(&opts);
    c.start_daemon(Node::A).unwrap();
    for vip in vips() {
        c.wait_router(vip, &[Node::A], ROUTE_TIMEOUT).unwrap();
    }
    let ns_b = c.lab().ns_node(Node::B);
    // The announce table already used by another program.
    ip(
        &ns_b,
        &["route", "add", "10.1.2.3/32", "dev", "lo", "table", "100"],
    );
    let err = refused_start(&mut c);
    assert!(
        err.contains("routing table 100 holds 1 route that xlb did not write"),
        "{err}"
    );
    ip(&ns_b, &["route", "flush", "table", "100"]);
    // A VIP address that is also an address of the node.
    ip(&ns_b, &["addr", "add", "10.100.0.1/32", "dev", "lo"]);
    let err = refused_start(&mut c);
    assert!(
        err.contains("address 10.100.0.1 is an address of interface lo on this host"),
        "{err}"
    );
    ip(&ns_b, &["addr", "del", "10.100.0.1/32", "dev", "lo"]);
    // Fixed: node B joins.
    c.start_daemon(Node::B).unwrap();
    for vip in vips() {
        c.wait_router(vip, &[Node::A, Node::B], ROUTE_TIMEOUT)
            .unwrap();
    }
}

fn up_with_daemons_off(opts: &ClusterOptions) -> ClusterRun {
    ClusterRun::up(opts).unwrap_or_else(|e| panic!("cluster up: {e}"))
}

/// `ip ARGS` inside `ns`; panics with its error.
fn ip(ns: &str, args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(["-n", ns])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip -n {ns} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
