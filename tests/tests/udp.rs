//! End to end, UDP: the real `xlb` (daemon, CLI, decapsulator, real XDP)
//! balancing UDP in the namespaced lab. Every lab backend answers UDP on
//! ports 5353 and 5354 with an echo that names it (`<name> <payload>`), sent
//! from the address the datagram was sent to, so DSR answers come from the
//! VIP (`xlb_lab::backend::serve_udp`); the client opens many flows, one
//! socket and source port each (`xlb_lab::udp_client`).
//!
//! - `udp_flows_spread_and_stick_in_both_modes`: four UDP VIPs, IPv4 and
//!   IPv6 in `dsr-ipip` and in `dsr-l2`, 200 flows each. Every flow is
//!   answered, in four rounds always by the same backend, the flows spread
//!   over the three backends, and `xlb explain udp` names, for a sample of
//!   flows, the backend that answered (via conntrack).
//! - `udp_timeout_keeps_active_flows_and_moves_idle_ones`: `udp_timeout =
//!   "2s"`, one VIP (IPv4, `dsr-ipip`), 200 flows. Half of them keep
//!   talking (a question every 0.5 s), half fall silent; then the table
//!   changes twice: `xlb reload` with b1's weight 1 → 4 (about half of b2's
//!   and b3's slots go to b1), and `xlb drain` of b3 (its remaining slots go
//!   to b1 and b2). The active flows keep their backend through the changes
//!   and for more than `udp_timeout` after them: those on the drained b3,
//!   and those the new table gives to another backend (counted after they
//!   fall silent, when `xlb explain` reports `via table` and the new
//!   backend; the test requires some of each). The idle flows, silent for
//!   longer than `udp_timeout`, are picked again from the current table:
//!   `xlb explain` reports `via table` and the slot's backend (never b3),
//!   and their next answer comes from that backend; the test requires that
//!   some of them moved. Once the active flows too fall silent past
//!   `udp_timeout`, they follow the table the same way.
//!
//! The client's sockets are connected to the VIP, so the kernel drops any
//! answer from another source address: an answer at all shows the DSR
//! reply came from the VIP.
//!
//! Same rules as `e2e.rs`: each test builds its own lab (own prefix
//! `udp…`, instance and socket) through `LabRun`, whose Drop stops
//! everything and removes the namespaces however the test ends; a passing
//! test checks that nothing is left; one lab at a time
//! (`xlb_tests::lab::serial`); every wait is bounded; traffic stays inside
//! the namespaces.
//!
//! Needs root and the binaries: `cargo build -p lb-user -p xlb-lab` (without
//! AYA_BUILD_SKIP), then
//! `cargo test -p xlb-tests --test udp -- --nocapture --test-threads=1`.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use xlb_lab::{
    scenario::{LabRun, Mode, UDP_PORTS, Vip, XlbConfig},
    topology,
    udp_client::{UdpFlow, ask, open_flows, tally},
};
use xlb_tests::lab::{serial, teardown, up};

/// Flows per VIP.
const FLOWS: usize = 200;

/// Bound on one round of questions (answers take well under a millisecond
/// in the lab; the bound covers a loaded 2-CPU machine).
const ROUND_TIMEOUT: Duration = Duration::from_secs(2);

/// Port of the backends' HTTP service, which the UDP VIPs' probes use.
const HEALTH_PORT: u16 = 80;

/// The short `udp_timeout` of the timeout test.
const UDP_TIMEOUT: Duration = Duration::from_secs(2);

/// Conntrack refreshes a flow's last-seen time at most once a second, so an
/// idle flow expires between `udp_timeout` and `udp_timeout` + 1 s of
/// silence; plus a margin.
const EXPIRY_WAIT: Duration = Duration::from_millis(UDP_TIMEOUT.as_millis() as u64 + 1500);

/// How often an active flow asks in the timeout test.
const ACTIVE_EVERY: Duration = Duration::from_millis(500);

fn prefix(tag: &str) -> String {
    format!("udp{tag}{}", std::process::id() % 1000)
}

/// `b<i>` for backend address `addr` of a VIP (`10.99.0.1<i>`,
/// `fd00:99::1<i>`).
fn backend_name(vip: &Vip, addr: &str) -> String {
    let addr: SocketAddr = addr
        .parse()
        .unwrap_or_else(|e| panic!("explain named backend {addr:?}: {e}"));
    let i = (1..=3)
        .find(|&i| vip.backend_addr(i) == addr)
        .unwrap_or_else(|| panic!("{addr} is no backend of {}", vip.name));
    format!("b{i}")
}

/// Asks on every flow and requires an answer from each.
fn ask_all(vip: &Vip, flows: &[&UdpFlow]) -> Vec<String> {
    let answers = ask(flows, ROUND_TIMEOUT, 3);
    let missing: Vec<SocketAddr> = flows
        .iter()
        .zip(&answers)
        .filter(|(_, a)| a.is_none())
        .map(|(f, _)| f.local)
        .collect();
    assert!(
        missing.is_empty(),
        "vip {} ({}): {} of {} flows got no answer within {ROUND_TIMEOUT:?}, e.g. from {:?}; answers {:?}",
        vip.name,
        vip.target(),
        missing.len(),
        flows.len(),
        missing.first(),
        tally(&answers)
    );
    answers.into_iter().flatten().collect()
}

/// `xlb explain udp` for `flow`: (via, backend name).
fn explain(run: &LabRun, vip: &Vip, flow: &UdpFlow) -> (String, String, u32) {
    let r = run
        .explain("udp", flow.local, vip.target())
        .unwrap_or_else(|e| panic!("xlb explain udp {} {}: {e}", flow.local, vip.target()));
    let backend = r
        .backend
        .as_deref()
        .unwrap_or_else(|| panic!("explain gives no backend: {r:?}"));
    let slot = r
        .slot
        .unwrap_or_else(|| panic!("explain gives no slot: {r:?}"));
    (r.via.clone(), backend_name(vip, backend), slot)
}

fn udp_vips() -> Vec<Vip> {
    let [p1, p2] = UDP_PORTS;
    let v4: IpAddr = topology::VIP_V4.into();
    let v4b: IpAddr = topology::VIP2_V4.into();
    let v6: IpAddr = topology::VIP_V6.into();
    vec![
        Vip::udp("dns", v4, p1, Mode::DsrIpip, 3, HEALTH_PORT),
        Vip::udp("dns-l2", v4b, p1, Mode::DsrL2, 3, HEALTH_PORT),
        Vip::udp("dns6", v6, p1, Mode::DsrIpip, 3, HEALTH_PORT),
        Vip::udp("dns6-l2", v6, p2, Mode::DsrL2, 3, HEALTH_PORT),
    ]
}

#[test]
fn udp_flows_spread_and_stick_in_both_modes() {
    let _serial = serial();
    let p = prefix("mode");
    let cfg = XlbConfig {
        vips: udp_vips(),
        ..XlbConfig::for_prefix(&p)
    };
    let run = up(&p, &cfg);
    let ns = run.lab().ns_client();
    for vip in &cfg.vips {
        let flows = open_flows(&ns, vip.target(), FLOWS).unwrap();
        let refs: Vec<&UdpFlow> = flows.iter().collect();
        let t0 = Instant::now();
        let first = ask_all(vip, &refs);
        let took = t0.elapsed();
        let mut per_backend: BTreeMap<&str, usize> = BTreeMap::new();
        for a in &first {
            *per_backend.entry(a.as_str()).or_default() += 1;
        }
        eprintln!(
            "[{p}] vip {} {} ({}): {FLOWS} flows answered in {:.0} ms, by backend {per_backend:?}",
            vip.name,
            vip.target(),
            vip.mode.as_str(),
            took.as_secs_f64() * 1000.0
        );
        // 200 flows over 3 equal backends: 66.7 each, σ ≈ 6.7.
        for b in ["b1", "b2", "b3"] {
            let n = per_backend.get(b).copied().unwrap_or(0);
            assert!(
                n >= FLOWS / 6,
                "vip {}: {b} answered {n} of {FLOWS} flows; expected about a third: {per_backend:?}",
                vip.name
            );
        }
        for round in 2..=4 {
            let again = ask_all(vip, &refs);
            let moved: Vec<(SocketAddr, &String, &String)> = flows
                .iter()
                .zip(first.iter().zip(&again))
                .filter(|(_, (a, b))| a != b)
                .map(|(f, (a, b))| (f.local, a, b))
                .collect();
            assert!(
                moved.is_empty(),
                "vip {} round {round}: {} flows answered by another backend than in round 1, e.g. {:?}",
                vip.name,
                moved.len(),
                moved.first()
            );
        }
        for (f, want) in flows.iter().zip(&first).step_by(FLOWS / 20) {
            let (via, backend, _) = explain(&run, vip, f);
            assert_eq!(
                (via.as_str(), &backend),
                ("conntrack", want),
                "vip {}: explain udp {} disagrees with the backend that answered",
                vip.name,
                f.local
            );
        }
    }
    teardown(run);
}

/// What the active flows saw while the table changed.
#[derive(Debug, Default)]
struct KeeperReport {
    rounds: usize,
    /// (round, flow, backend that answered) for answers from another backend
    /// than the flow's first.
    moved: Vec<(usize, SocketAddr, String)>,
    /// Questions without an answer in their round.
    missed: usize,
}

/// Asks on `flows` every [`ACTIVE_EVERY`] until `stop`, comparing each
/// answer with `want`.
fn keep_asking(flows: &[&UdpFlow], want: &[String], stop: &AtomicBool) -> KeeperReport {
    let mut r = KeeperReport::default();
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let answers = ask(flows, ACTIVE_EVERY - Duration::from_millis(100), 1);
        r.rounds += 1;
        for ((f, a), w) in flows.iter().zip(answers).zip(want) {
            match a {
                None => r.missed += 1,
                Some(a) if &a != w => r.moved.push((r.rounds, f.local, a)),
                Some(_) => {}
            }
        }
        thread::sleep(ACTIVE_EVERY.saturating_sub(t.elapsed()));
    }
    r
}

#[test]
fn udp_timeout_keeps_active_flows_and_moves_idle_ones() {
    let _serial = serial();
    let p = prefix("idle");
    let vip = udp_vips().remove(0);
    let mut cfg = XlbConfig {
        vips: vec![vip.clone()],
        udp_timeout: Some(UDP_TIMEOUT),
        ..XlbConfig::for_prefix(&p)
    };
    let run = up(&p, &cfg);
    let flows = open_flows(&run.lab().ns_client(), vip.target(), FLOWS).unwrap();
    let all: Vec<&UdpFlow> = flows.iter().collect();
    let first = ask_all(&vip, &all);
    let silent_since = Instant::now();
    let (active, idle): (Vec<usize>, Vec<usize>) = (0..FLOWS).partition(|i| i % 2 == 0);
    let pick = |which: &[usize]| -> (Vec<&UdpFlow>, Vec<String>) {
        which.iter().map(|&i| (&flows[i], first[i].clone())).unzip()
    };
    let (active_flows, active_want) = pick(&active);
    let (idle_flows, idle_was) = pick(&idle);

    let stop = Arc::new(AtomicBool::new(false));
    let report = thread::scope(|s| {
        let keeper = s.spawn(|| keep_asking(&active_flows, &active_want, &stop));
        // The table change, while the active flows talk.
        thread::sleep(Duration::from_secs(1));
        cfg.vips[0].weights.insert(1, 4);
        let out = run.reload(&cfg.render());
        eprintln!("[{p}] xlb reload (b1 weight 1 → 4): {out:?}");
        // And a drain: b3 keeps its flows but gets no new ones.
        thread::sleep(ACTIVE_EVERY);
        let drained = run.drain(&vip.name, vip.backend_addr(3));
        let reloaded_at = Instant::now();
        eprintln!("[{p}] xlb drain {} b3: {drained:?}", vip.name);
        let idle_for = silent_since.elapsed();

        // Idle flows: past udp_timeout, each follows the current table.
        thread::sleep(EXPIRY_WAIT.saturating_sub(silent_since.elapsed()));
        let mut idle_moved = 0;
        let mut idle_expect = Vec::new();
        for (f, was) in idle_flows.iter().zip(&idle_was) {
            let (via, backend, slot) = explain(&run, &vip, f);
            assert_eq!(
                via,
                "table",
                "idle flow {} (silent {:?}, udp_timeout {UDP_TIMEOUT:?}) is still in conntrack",
                f.local,
                silent_since.elapsed()
            );
            if &backend != was {
                idle_moved += 1;
                if idle_moved <= 3 {
                    eprintln!(
                        "[{p}] idle flow {}: was on {was}; table slot {slot} now holds {backend}",
                        f.local
                    );
                }
            }
            assert_ne!(
                backend, "b3",
                "idle flow {}: the table still gives it the drained b3",
                f.local
            );
            idle_expect.push(backend);
        }
        let idle_now = ask_all(&vip, &idle_flows);
        let wrong: Vec<(SocketAddr, String, String)> = idle_flows
            .iter()
            .zip(idle_expect.into_iter().zip(idle_now))
            .filter(|(_, (e, n))| e != n)
            .map(|(f, (e, n))| (f.local, e, n))
            .collect();
        // Active flows: still talking past udp_timeout after the change.
        thread::sleep((UDP_TIMEOUT + ACTIVE_EVERY).saturating_sub(reloaded_at.elapsed()));
        stop.store(true, Ordering::Relaxed);
        let active_report = keeper.join().expect("the asking thread does not panic");
        (out, drained, idle_for, idle_moved, wrong, active_report)
    });
    let (out, drained, idle_for, idle_moved, wrong, active_report) = report;
    out.unwrap_or_else(|e| panic!("xlb reload: {e}"));
    drained.unwrap_or_else(|e| panic!("xlb drain: {e}"));
    eprintln!(
        "[{p}] idle flows (silent {idle_for:?} at the table changes): {idle_moved} of {} moved to the backend the new table gives them; active flows: {} rounds, {} answers from another backend, {} missed",
        idle_flows.len(),
        active_report.rounds,
        active_report.moved.len(),
        active_report.missed
    );
    assert!(
        wrong.is_empty(),
        "{} idle flows were not answered by the backend `xlb explain` named, e.g. (flow, named, answered) {:?}",
        wrong.len(),
        wrong.first()
    );
    assert!(
        idle_moved > 0,
        "no idle flow moved: did the reload change the table?"
    );
    assert!(
        active_report.moved.is_empty(),
        "active flows changed backend while talking, e.g. (round, flow, backend) {:?}",
        active_report.moved.first()
    );
    let on_drained = active_want.iter().filter(|w| *w == "b3").count();
    eprintln!("[{p}] {on_drained} active flows stayed on the drained b3 while talking");
    assert!(
        on_drained > 0,
        "no active flow was on b3: the drain shows nothing"
    );
    let asked = active_report.rounds * active_flows.len();
    assert!(
        active_report.rounds >= 4 && active_report.missed * 20 <= asked,
        "active flows: {} rounds, {} of {asked} questions unanswered",
        active_report.rounds,
        active_report.missed
    );

    // The active flows the new table gives to another backend: they stayed
    // only through conntrack. Once silent past udp_timeout they move too.
    thread::sleep(EXPIRY_WAIT);
    let mut would_move = 0;
    let mut expect = Vec::new();
    for (f, was) in active_flows.iter().zip(&active_want) {
        let (via, backend, _) = explain(&run, &vip, f);
        assert_eq!(via, "table", "flow {} silent past udp_timeout", f.local);
        assert_ne!(
            backend, "b3",
            "flow {}: the table gives it the drained b3",
            f.local
        );
        would_move += usize::from(&backend != was);
        expect.push(backend);
    }
    let now = ask_all(&vip, &active_flows);
    eprintln!(
        "[{p}] {would_move} of {} active flows kept their backend through the change although the new table gives them another; silent, they follow it",
        active_flows.len()
    );
    assert!(
        would_move > 0,
        "no active flow's table slot changed: the test shows nothing"
    );
    assert_eq!(now, expect, "once idle, the active flows follow the table");
    // The sockets would keep the client's namespace alive past teardown.
    drop(flows);
    teardown(run);
}
