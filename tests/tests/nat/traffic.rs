//! Traffic through NAT VIPs: TCP and UDP, IPv4 and IPv6, a backend port
//! other than the VIP's, and the peer address the backends see.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use xlb_lab::{
    backend::PeerCounts,
    scenario::{LabRun, Protocol},
    topology::{CLIENT_V4, CLIENT_V6, VIP_V4, VIP_V6, VIP2_V4},
    udp_client::{UdpFlow, ask, open_flows, tally},
};
use xlb_tests::{
    lab::{serial, teardown},
    nat_lab::{NatConfig, NatLabOptions, NatVip, POOL_V4, POOL_V6, pool_of},
};

use super::{assert_clean, prefix, short_load, up};

/// UDP flows per VIP: enough that three backends each get some.
const UDP_FLOWS: usize = 60;
/// How long a round of UDP questions waits for every answer.
const UDP_ROUND: Duration = Duration::from_secs(3);

/// Connections each backend accepted between two reads, summed by peer.
fn accepted_since(before: &[PeerCounts], after: &[PeerCounts]) -> BTreeMap<IpAddr, u64> {
    let mut sum = BTreeMap::new();
    for (b, a) in before.iter().zip(after) {
        for (peer, n) in a.since(b).peers {
            *sum.entry(peer).or_default() += n;
        }
    }
    sum
}

/// Asks on every flow of a UDP VIP and requires an answer from each; then
/// asks again and requires the same backends (NAT state keeps the flow).
fn udp_round_trip(run: &LabRun, vip: &NatVip) -> BTreeMap<Option<String>, usize> {
    let flows = open_flows(&run.lab().ns_client(), vip.target(), UDP_FLOWS)
        .unwrap_or_else(|e| panic!("{}: opening UDP flows: {e}", vip.name));
    let refs: Vec<&UdpFlow> = flows.iter().collect();
    let first = ask(&refs, UDP_ROUND, 3);
    let t = tally(&first);
    assert!(
        first.iter().all(Option::is_some),
        "{} ({}): flows without an answer within {UDP_ROUND:?}: {t:?}",
        vip.name,
        vip.target()
    );
    assert!(
        t.len() >= 2,
        "{}: every flow answered by one backend: {t:?}",
        vip.name
    );
    let again = ask(&refs, UDP_ROUND, 3);
    let moved: Vec<(SocketAddr, &Option<String>, &Option<String>)> = flows
        .iter()
        .zip(first.iter().zip(&again))
        .filter(|(_, (a, b))| a != b)
        .map(|(f, (a, b))| (f.local, a, b))
        .collect();
    assert!(
        moved.is_empty(),
        "{}: {} flows answered by another backend (or not at all) the second time, e.g. {:?}",
        vip.name,
        moved.len(),
        moved.first()
    );
    t
}

/// TCP (HTTP) and UDP (echo) through NAT VIPs in both families, each VIP's
/// backends on another port than the VIP's. The backends hold no VIP and
/// run no decapsulator, so only full NAT can carry this; they accept every
/// connection from the pool address, none from the client.
#[test]
fn tcp_and_udp_through_nat_vips_in_both_families() {
    let _serial = serial();
    let p = prefix("tr");
    let cfg = NatConfig {
        vips: vec![
            NatVip::tcp("web4", VIP_V4.into(), 80, 3),
            NatVip::tcp("web6", VIP_V6.into(), 80, 3),
            NatVip::udp("dns4", VIP2_V4.into(), 53, 3),
            NatVip::udp("dns6", VIP_V6.into(), 53, 3),
        ],
        ..NatConfig::for_prefix(&p)
    };
    let run = up(&p, &cfg, NatLabOptions::default());
    let before = run.peers().unwrap();
    for vip in cfg.vips.iter().filter(|v| v.protocol == Protocol::Tcp) {
        let report = run
            .run_client(short_load(vip, Duration::from_secs(2)))
            .unwrap();
        let s = run.status().unwrap();
        let vs = s
            .vip(&vip.name)
            .unwrap_or_else(|| panic!("{} not in status: {}", vip.name, s.summary()));
        eprintln!(
            "[{p}] {} {} → port {}: {} requests, {} failed, per backend {:?}; xlb mode {}, {} packets, {} new flows; counters {}",
            vip.name,
            vip.target(),
            vip.backend_port,
            report.summary.requests,
            report.summary.failures,
            report.summary.per_backend,
            vs.mode,
            vs.packets,
            vs.new_flows,
            super::counters(&run)
        );
        assert_clean(&vip.name, &report, 50);
        assert_eq!(vs.mode, "nat", "{}", vip.name);
    }
    for vip in cfg.vips.iter().filter(|v| v.protocol == Protocol::Udp) {
        let t = udp_round_trip(&run, vip);
        eprintln!(
            "[{p}] {} {} → port {}: {UDP_FLOWS} flows answered twice by the same backends, {t:?}",
            vip.name,
            vip.target(),
            vip.backend_port
        );
    }
    let seen = accepted_since(&before, &run.peers().unwrap());
    eprintln!("[{p}] connections the backends accepted, by peer: {seen:?}");
    eprintln!("[{p}] xlb counters: {}", super::counters(&run));
    let from = |a: IpAddr| seen.get(&a).copied().unwrap_or(0);
    assert!(
        from(POOL_V4.into()) > 0 && from(POOL_V6.into()) > 0,
        "the backends saw no connection from the pool addresses {POOL_V4} and {POOL_V6}: {seen:?}"
    );
    assert_eq!(
        (from(CLIENT_V4.into()), from(CLIENT_V6.into())),
        (0, 0),
        "full NAT showed the client's address to the backends: {seen:?}"
    );
    teardown(run);
}

/// `preserve_client = true`: destination NAT only. The backends route the
/// client's address through the LB (the mode's one requirement) and accept
/// every connection from the client itself, none from the pool; traffic
/// flows in both families.
#[test]
fn preserve_client_shows_the_client_to_the_backend() {
    let _serial = serial();
    let p = prefix("pc");
    let cfg = NatConfig {
        vips: vec![
            NatVip::tcp("keep4", VIP_V4.into(), 80, 3).preserving(),
            NatVip::tcp("keep6", VIP_V6.into(), 80, 3).preserving(),
        ],
        ..NatConfig::for_prefix(&p)
    };
    let opts = NatLabOptions {
        route_via_lb: true,
        ..NatLabOptions::default()
    };
    let run = up(&p, &cfg, opts);
    for vip in &cfg.vips {
        let before = run.peers().unwrap();
        let report = run
            .run_client(short_load(vip, Duration::from_secs(2)))
            .unwrap();
        let seen = accepted_since(&before, &run.peers().unwrap());
        let client: IpAddr = match vip.address {
            IpAddr::V4(_) => CLIENT_V4.into(),
            IpAddr::V6(_) => CLIENT_V6.into(),
        };
        let from = |a: IpAddr| seen.get(&a).copied().unwrap_or(0);
        eprintln!(
            "[{p}] {}: {} requests, {} failed; connections accepted by peer {seen:?}; xlb counters: {}",
            vip.name,
            report.summary.requests,
            report.summary.failures,
            super::counters(&run)
        );
        assert_clean(&vip.name, &report, 50);
        assert!(
            from(client) > 0,
            "{}: the backends saw no connection from the client {client}: {seen:?}",
            vip.name
        );
        assert_eq!(
            from(pool_of(vip.address)),
            0,
            "{}: preserve_client still translated the source to the pool: {seen:?}",
            vip.name
        );
    }
    teardown(run);
}
