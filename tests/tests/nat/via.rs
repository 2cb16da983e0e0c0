//! Data-path probes of NAT VIPs (`via = "vip"`): the probe leaves from the
//! pool address, `xlb_hc` rewrites its destination to the backend, and the
//! backend's answer comes back through the NAT reply path to the LB itself
//! (`pass_nat_local`). Unlike a direct probe, it fails when the backend's
//! way back to the pool address is broken while its service still answers
//! the LB's own address.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHash, Map, MapData};
use lb_common::{FlowKey, addr16, nat::NatFlow};
use xlb_lab::{
    backend::PeerCounts,
    scenario::{LabRun, Protocol},
    topology::{LB_V4, LB_V6, VIP_V4, VIP_V6, VIP2_V4},
};
use xlb_tests::{
    lab::{serial, teardown, transitions},
    nat_lab::{NatConfig, NatLabOptions, NatVip, POOL_V4, POOL_V6, POOL2_V4, pool_of},
};

use super::{assert_stayed_up, prefix, short_load, up};

/// Bound on a backend going down (fall 2 at 500 ms, plus the direct probe
/// that tells whose fault it is) or coming back.
const STATE_TIMEOUT: Duration = Duration::from_secs(15);

/// Connections the backends accepted between two reads, by peer.
fn accepted_since(before: &[PeerCounts], after: &[PeerCounts]) -> BTreeMap<IpAddr, u64> {
    let mut sum = BTreeMap::new();
    for (b, a) in before.iter().zip(after) {
        for (peer, n) in a.since(b).peers {
            *sum.entry(peer).or_default() += n;
        }
    }
    sum
}

/// `ip -n NS ARGS`, failing the test with its error.
fn ip(ns: &str, args: &[&str]) {
    let mut full = vec!["ip", "-n", ns];
    full.extend_from_slice(args);
    xlb_tests::netns::run(&full).unwrap_or_else(|e| panic!("{full:?}: {e:#}"));
}

/// Adds (`add`) or removes (`del`) blackhole routes to both pool addresses
/// in backend `i`'s namespace: its answers to the pool go nowhere, its
/// answers to the LB's own address still go out.
fn blackhole_pool(run: &LabRun, i: usize, op: &str) {
    let ns = run.lab().ns_backend(i);
    ip(&ns, &["route", op, "blackhole", &format!("{POOL_V4}/32")]);
    ip(
        &ns,
        &["-6", "route", op, "blackhole", &format!("{POOL_V6}/128")],
    );
}

/// Entries of the pinned `XLB_NAT_FLOWS` whose client is a pool address:
/// the flows of data-path probes (a real client is never a pool address).
fn probe_flows(instance: &str) -> usize {
    let path = Path::new("/sys/fs/bpf/xlb")
        .join(instance)
        .join(lb_common::nat::MAP_NAT_FLOWS);
    let data = MapData::from_pin(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let map: BpfHash<MapData, FlowKey, NatFlow> = Map::HashMap(data).try_into().unwrap();
    let pools = [
        addr16(POOL_V4.into()),
        addr16(POOL_V6.into()),
        addr16(POOL2_V4.into()),
    ];
    map.keys()
        .filter_map(Result::ok)
        .filter(|k| pools.contains(&k.src))
        .count()
}

/// A NAT VIP per family with two backends probed through the data path
/// (and a UDP one probed over HTTP on its `health_port`):
/// both come up through it (the backends see the probes come from the pool
/// address, none from the LB's own; `pass_nat_local` counts the answers).
/// Then backend 1's route back to the pool is blackholed while its service
/// still answers direct probes: it goes down through the data-path probe
/// (`no answer via VIP …; direct probe ok`), backend 2 stays up, and
/// clients keep being served by backend 2. With the route back, backend 1
/// comes back, and no probe leaves its NAT flow behind.
#[test]
fn data_path_probes_of_nat_vips_check_the_way_back() {
    let _serial = serial();
    let p = prefix("via");
    let via = |v: NatVip| NatVip {
        health_check: Some("via = \"vip\"\n".to_string()),
        ..v
    };
    let cfg = NatConfig {
        vips: vec![
            via(NatVip::tcp("web4", VIP_V4.into(), 80, 2)),
            via(NatVip::tcp("web6", VIP_V6.into(), 80, 2)),
            // UDP, probed over HTTP on `health_port` 80 (not its port 5354):
            // the probe keeps its own protocol and port.
            via(NatVip::udp("dns4", VIP2_V4.into(), 53, 2)),
        ],
        ..NatConfig::for_prefix(&p)
    };
    let opts = NatLabOptions {
        backends: 2,
        ..NatLabOptions::default()
    };
    let run = up(&p, &cfg, opts);

    // Up through the data path: probes from the pool, answers passed to
    // the LB by the NAT reply path.
    let before = run.peers().unwrap();
    let local_before = run.counter("pass_nat_local").unwrap();
    thread::sleep(Duration::from_secs(2));
    let seen = accepted_since(&before, &run.peers().unwrap());
    let local = run.counter("pass_nat_local").unwrap() - local_before;
    eprintln!(
        "[{p}] 2 s of probes: connections by peer {seen:?}, pass_nat_local +{local}; counters {}",
        super::counters(&run)
    );
    let from = |a: IpAddr| seen.get(&a).copied().unwrap_or(0);
    assert!(
        from(POOL_V4.into()) >= 4 && from(POOL_V6.into()) >= 4 && from(POOL2_V4.into()) >= 4,
        "the backends saw too few probes from the pool addresses: {seen:?}"
    );
    assert_eq!(
        (from(LB_V4.into()), from(LB_V6.into())),
        (0, 0),
        "backends probed directly from the LB's own address: {seen:?}"
    );
    assert!(local >= 8, "pass_nat_local +{local} in 2 s of probes");

    // Backend 1 can no longer answer the pool; its direct probe still passes.
    blackhole_pool(&run, 1, "add");
    let web = || cfg.vips.iter().filter(|v| v.protocol == Protocol::Tcp);
    for vip in web() {
        let (s, after) = run
            .wait_backend_state(&vip.name, vip.backend_addr(1), "down", STATE_TIMEOUT)
            .unwrap_or_else(|e| panic!("[{p}] {} b1 down: {e}", vip.name));
        let b = s.backend(&vip.name, vip.backend_addr(1)).unwrap();
        let reason = b.last_transition_reason.clone().unwrap_or_default();
        eprintln!("[{p}] {} b1 down after {after:?}: {reason}", vip.name);
        assert!(
            reason.contains(&format!("via VIP {} through nat", vip.target()))
                && reason.contains("direct probe ok"),
            "{} b1: {reason}",
            vip.name
        );
    }
    for vip in web() {
        let report = run
            .run_client(short_load(vip, Duration::from_secs(2)))
            .unwrap();
        eprintln!(
            "[{p}] {} with b1 down: {} requests, {} failed, per backend {:?}",
            vip.name, report.summary.requests, report.summary.failures, report.summary.per_backend
        );
        assert!(report.summary.requests >= 50, "{}", report.render_text());
        assert_eq!(report.summary.failures, 0, "{}", report.render_text());
        assert_eq!(
            report.summary.per_backend.len(),
            1,
            "{}: served by {:?}",
            vip.name,
            report.summary.per_backend
        );
    }

    // The way back restored: backend 1 up again through the data path.
    blackhole_pool(&run, 1, "del");
    for vip in web() {
        run.wait_backend_state(&vip.name, vip.backend_addr(1), "up", STATE_TIMEOUT)
            .unwrap_or_else(|e| panic!("[{p}] {} b1 back up: {e}", vip.name));
    }
    let events = run.events().unwrap();
    for vip in web() {
        assert_stayed_up(&events, vip, [2]);
        let t = transitions(&events, &vip.name, vip.backend_addr(1));
        eprintln!("[{p}] {} b1 transitions: {t:?}", vip.name);
    }
    // Its own pool was never blackholed.
    assert_stayed_up(&events, cfg.vip("dns4"), [1, 2]);

    // Probes delete their flows: while six backends are probed every
    // 500 ms, a probe takes a millisecond or so, so the probe flows in the
    // map are mostly none and never more than the probes in flight; a
    // leak would grow by six every half second.
    let (mut least, mut most) = (usize::MAX, 0);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        let n = probe_flows(run.instance());
        (least, most) = (least.min(n), most.max(n));
        thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "[{p}] probe flows in XLB_NAT_FLOWS over 3 s: {least}..={most} (pool {} / {})",
        pool_of(VIP_V4.into()),
        pool_of(VIP_V6.into())
    );
    assert!(
        least == 0 && most <= 6,
        "probe flows {least}..={most}: probes leave them behind"
    );
    teardown(run);
}
