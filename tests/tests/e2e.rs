//! End to end: the real `xlb` binary (daemon, CLI, decapsulator, real XDP)
//! in the namespaced lab, with the lab's backends and load client.
//!
//! Each test builds its own lab (own namespace prefix, xlb instance and
//! control socket) through `xlb_lab::scenario::LabRun`, whose Drop stops
//! every process, runs `xlb detach` and removes the namespaces however the
//! test ends; a passing test also checks that nothing is left. Tests run one
//! at a time (`xlb_tests::lab::serial`): each lab runs a daemon, four XDP programs and a
//! load, and the machine may have two CPUs.
//!
//! Needs root and the binaries: `cargo build -p lb-user -p xlb-lab` (without
//! AYA_BUILD_SKIP: `xlb` embeds the XDP object), then
//! `cargo test -p xlb-tests --test e2e -- --test-threads 1 --nocapture`.
//! `XLB_BIN` points at another `xlb` (with `xlb-backend` next to it).

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    thread,
    time::{Duration, Instant},
};

use lb_user::health::spec;
use xlb_lab::{
    Fault,
    client::LoadOptions,
    scenario::{self, Event, Health, Mode, Status, Vip, XlbConfig},
    topology,
};
use xlb_tests::lab::{
    CLIENT_TIMEOUT, DETECTION_MARGIN, MAP_UPDATE_MARGIN_MS, answered_by, failure_slices,
    now_unix_ms, serial, steady, teardown, transitions, up, wait_client_ms, xlb_binary,
};

/// How stale `xlb status` counters may be: the daemon samples the data
/// plane's per-CPU counters once per tick (1 s), plus a margin.
const COUNTER_TICK: Duration = Duration::from_millis(1500);

fn prefix(tag: &str) -> String {
    format!("e2e{tag}{}", std::process::id() % 1000)
}

fn config(prefix: &str, health: Health, vips: Vec<Vip>) -> XlbConfig {
    XlbConfig {
        health,
        vips,
        ..XlbConfig::for_prefix(prefix)
    }
}

fn api() -> Vip {
    Vip::new("api", topology::VIP_V4.into(), 80, Mode::DsrIpip, 3)
}

/// Asserts backends `which` of `vip` only ever went to `up`.
fn assert_stayed_up(events: &[Event], vip: &Vip, which: impl IntoIterator<Item = usize>) {
    for i in which {
        let t = transitions(events, "api", vip.backend_addr(i));
        assert!(
            t.iter().all(|e| e.to.as_deref() == Some("up")),
            "b{i} changed state: {t:?}"
        );
    }
}

fn new_flows(status: &Status, vip: &str, backend: SocketAddr) -> u64 {
    status
        .backend(vip, backend)
        .unwrap_or_else(|| panic!("{vip} has no backend {backend}: {}", status.summary()))
        .new_flows
}

/// Backend 2's application hangs under steady load; HTTP health checks mark
/// it down within `fall` periods and one `hang_timeout` (+ margin), after
/// which no new connection reaches it and no client request fails; when it
/// recovers it comes back after `rise` probes.
#[test]
fn hung_application_is_taken_out_and_back() {
    let _serial = serial();
    let p = prefix("hang");
    let health = Health::default();
    let vip = api();
    let b2 = vip.backend_addr(2);
    let run = up(&p, &config(&p, health.clone(), vec![vip.clone()]));
    // A probe to a hung application counts toward `fall` only when its
    // `hang_timeout` runs out (README, "Hung versus slow"), and each period
    // is drawn within ± the default jitter: the worst case is `fall`
    // periods, then the last probe's `hang_timeout`.
    let hang = health
        .hang_timeout
        .unwrap_or_else(|| spec::default_hang_timeout(health.timeout));
    let period = health.interval.mul_f64(1.0 + spec::defaults::JITTER);
    let bound = period * health.fall + hang + DETECTION_MARGIN;
    let return_bound = health.interval * health.rise + health.timeout + DETECTION_MARGIN;

    let client = run
        .start_client(steady(vip.target(), Duration::from_secs(11)))
        .unwrap();
    wait_client_ms(&client, 2000);
    run.set_fault(2, Fault::Hang).unwrap();
    let hang_unix = now_unix_ms();
    let hang_ms = client.timeline_ms(hang_unix);

    let (_, waited) = run
        .wait_backend_state("api", b2, "down", bound + Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("b2 was not marked down: {e}"));
    let events = run.events().unwrap();
    let down = *transitions(&events, "api", b2)
        .iter()
        .rfind(|e| e.to.as_deref() == Some("down"))
        .unwrap_or_else(|| panic!("no down event for {b2}: {events:?}"));
    let detection = Duration::from_millis(down.at_unix_ms.saturating_sub(hang_unix));
    let detect_ms = client.timeline_ms(down.at_unix_ms);
    eprintln!(
        "[{p}] b2 hung at {hang_ms} ms; marked down at {detect_ms} ms ({} ms later; status showed it after {} ms): {}",
        detection.as_millis(),
        waited.as_millis(),
        down.reason
    );
    assert!(
        detection <= bound,
        "b2 marked down {detection:?} after the hang; bound fall × interval × (1 + jitter) + hang_timeout + {DETECTION_MARGIN:?} = {bound:?}"
    );
    assert!(!down.reason.is_empty(), "the down event gives no reason");

    // Out of the table for 3.5 s: no new flow may reach it. The daemon
    // samples the data plane's counters once per tick, so the first sample
    // is taken a tick after detection.
    thread::sleep(COUNTER_TICK);
    let after_detect = run.status().unwrap();
    thread::sleep(Duration::from_secs(2));
    let before_recover = run.status().unwrap();
    run.set_fault(2, Fault::None).unwrap();
    let recover_unix = now_unix_ms();
    let recover_ms = client.timeline_ms(recover_unix);
    let (_, back_after) = run
        .wait_backend_state("api", b2, "up", return_bound + Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("b2 did not come back: {e}"));
    let events = run.events().unwrap();
    let back = transitions(&events, "api", b2)
        .into_iter()
        .rfind(|e| e.to.as_deref() == Some("up"))
        .cloned()
        .expect("an up event for b2");
    let back_ms = client.timeline_ms(back.at_unix_ms);
    let report = client.join().unwrap();
    eprintln!("{}", report.render_text());
    eprintln!(
        "[{p}] recovered at {recover_ms} ms, up again at {back_ms} ms ({} ms; status after {} ms): {}",
        back_ms - recover_ms,
        back_after.as_millis(),
        back.reason
    );

    let b2_flows = (
        new_flows(&after_detect, "api", b2),
        new_flows(&before_recover, "api", b2),
    );
    let others = |s: &Status| {
        new_flows(s, "api", vip.backend_addr(1)) + new_flows(s, "api", vip.backend_addr(3))
    };
    eprintln!(
        "[{p}] new flows to b2 a tick after detection / before recovery: {b2_flows:?}; to b1+b3: {} → {}",
        others(&after_detect),
        others(&before_recover)
    );
    assert_eq!(
        b2_flows.0, b2_flows.1,
        "new flows reached b2 while it was down"
    );
    assert!(
        others(&before_recover) > others(&after_detect),
        "b1 and b3 took no new flows while b2 was down: is the load running?"
    );

    // Failures only between (hang − client timeout) and detection.
    let window = (
        hang_ms - CLIENT_TIMEOUT.as_millis() as i64 - 100,
        detect_ms + MAP_UPDATE_MARGIN_MS,
    );
    let outside: Vec<(u64, u64)> = failure_slices(&report)
        .into_iter()
        .filter(|(t, _)| !(window.0..=window.1).contains(&(*t as i64)))
        .collect();
    eprintln!(
        "[{p}] failures {} of {} requests, by slice start: {:?}; allowed window {window:?} ms",
        report.summary.failures,
        report.summary.requests,
        failure_slices(&report)
    );
    assert!(
        outside.is_empty(),
        "requests failed outside the detection window {window:?}: {outside:?}"
    );
    assert!(
        report.summary.failures > 0,
        "no request failed at all: did the hang take effect?"
    );
    assert!(
        answered_by(&report, "b2", 0, hang_ms) > 0,
        "b2 answered nothing before the hang: {}",
        report.render_text()
    );
    // Slices are counted by their start: the one holding the recovery also
    // holds requests started after b2 was back, which b2 may answer.
    let slice_ms = steady(vip.target(), Duration::ZERO).slice.as_millis() as i64;
    let last_out = recover_ms - recover_ms.rem_euclid(slice_ms);
    assert_eq!(
        answered_by(&report, "b2", detect_ms + MAP_UPDATE_MARGIN_MS, last_out),
        0,
        "b2 answered while out of the table"
    );
    assert!(
        answered_by(&report, "b2", back_ms + MAP_UPDATE_MARGIN_MS, i64::MAX) > 0,
        "b2 answered nothing after it came back"
    );
    assert!(
        back_ms - recover_ms <= return_bound.as_millis() as i64,
        "b2 came back {} ms after recovering; bound rise × interval + timeout + margin = {return_bound:?}",
        back_ms - recover_ms
    );
    // b1 and b3 never left.
    let events = run.events().unwrap();
    assert_stayed_up(&events, &vip, [1, 3]);
    teardown(run);
}

/// The incident, reproduced: with `kind = "tcp"` the hung backend still
/// completes handshakes, so it stays up while its clients time out.
#[test]
fn tcp_check_keeps_a_hung_application_in() {
    let _serial = serial();
    let p = prefix("tcp");
    let health = Health {
        kind: "tcp".to_string(),
        ..Health::default()
    };
    let vip = api();
    let b2 = vip.backend_addr(2);
    let run = up(&p, &config(&p, health.clone(), vec![vip.clone()]));
    // Longer than the HTTP check needed (fall × interval + timeout + margin).
    let hang_for = health.interval * health.fall + health.timeout + DETECTION_MARGIN * 2;

    let client = run
        .start_client(steady(vip.target(), Duration::from_millis(1500) + hang_for))
        .unwrap();
    wait_client_ms(&client, 1000);
    run.set_fault(2, Fault::Hang).unwrap();
    let hang_ms = client.timeline_ms(now_unix_ms());
    let until = Instant::now() + hang_for;
    let mut polls = 0;
    while Instant::now() < until {
        let s = run.status().unwrap();
        let state = &s.backend("api", b2).unwrap().state;
        assert_eq!(state, "up", "tcp check took b2 out: {}", s.summary());
        polls += 1;
        thread::sleep(Duration::from_millis(200));
    }
    let report = client.join().unwrap();
    run.set_fault(2, Fault::None).unwrap();
    let end_ms = report.duration_ms as i64;
    let late_failures: u64 = report
        .timeline
        .iter()
        .filter(|s| s.t_ms as i64 >= end_ms - 1500 && (s.t_ms as i64) < end_ms - 500)
        .map(|s| s.counts.failures())
        .sum();
    eprintln!("{}", report.render_text());
    eprintln!(
        "[{p}] tcp check: b2 up in all {polls} polls over {hang_for:?} of hang (from {hang_ms} ms); \
         failures {} of {}, {late_failures} started in the last second before the end",
        report.summary.failures, report.summary.requests
    );
    let before: Vec<(u64, u64)> = failure_slices(&report)
        .into_iter()
        .filter(|(t, _)| (*t as i64) < hang_ms - CLIENT_TIMEOUT.as_millis() as i64 - 100)
        .collect();
    assert!(
        before.is_empty(),
        "requests failed before the hang: {before:?}"
    );
    assert!(
        answered_by(&report, "b1", 0, hang_ms) > 0 && answered_by(&report, "b2", 0, hang_ms) > 0,
        "the VIP did not work before the hang: {}",
        report.render_text()
    );
    assert!(
        answered_by(&report, "b1", hang_ms, end_ms) + answered_by(&report, "b3", hang_ms, end_ms)
            > 0,
        "b1 and b3 stopped answering too"
    );
    assert!(
        late_failures > 0,
        "clients stopped failing: the tcp check should not have protected them"
    );
    teardown(run);
}

/// Every backend answers in half the probe timeout, under load: slow but
/// healthy, so nothing is ejected and no request fails.
#[test]
fn slow_but_healthy_backends_stay_in() {
    let _serial = serial();
    let p = prefix("slow");
    let health = Health {
        interval: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
        ..Health::default()
    };
    let vip = api();
    let run = up(&p, &config(&p, health.clone(), vec![vip.clone()]));
    let slow_ms = health.timeout.as_millis() as u64 / 2;
    for i in 1..=3 {
        run.set_fault(i, Fault::Slow { ms: slow_ms }).unwrap();
    }
    let load = LoadOptions {
        duration: Duration::from_secs(6),
        rate: 40,
        keepalive: 4,
        keepalive_interval: Duration::from_millis(100),
        timeout: Duration::from_secs(2),
        slice: Duration::from_millis(500),
        ..LoadOptions::new(vip.target())
    };
    let client = run.start_client(load).unwrap();
    let mut polls = 0;
    while !client.is_finished() {
        let s = run.status().unwrap();
        assert!(s.all_up(), "a slow backend was taken out: {}", s.summary());
        polls += 1;
        thread::sleep(Duration::from_millis(250));
    }
    let report = client.join().unwrap();
    let raw = run.status_json().unwrap();
    let probe_ms: Vec<f64> = raw["vips"][0]["backends"]
        .as_array()
        .expect("backends in status")
        .iter()
        .map(|b| b["last_probe"]["latency_ms"].as_f64().unwrap_or(0.0))
        .collect();
    let events = run.events().unwrap();
    eprintln!(
        "[{p}] slow {slow_ms} ms: {} requests, {} failed, p50 {:.0} ms, p99 {:.0} ms; last probe latencies {probe_ms:?} ms; {polls} polls all up",
        report.summary.requests,
        report.summary.failures,
        report.summary.latency.p50_ms,
        report.summary.latency.p99_ms
    );
    assert_eq!(report.summary.failures, 0, "{}", report.render_text());
    assert!(
        report.summary.latency.p50_ms >= slow_ms as f64,
        "requests were not slow (p50 {} ms): the fault did not take",
        report.summary.latency.p50_ms
    );
    assert!(
        probe_ms.iter().all(|&l| l >= slow_ms as f64 * 0.9),
        "probes were not slow: {probe_ms:?}"
    );
    assert_stayed_up(&events, &vip, 1..=3);
    teardown(run);
}

/// Draining a backend keeps its long-lived connections flowing and sends it
/// no new connection; enabling it brings it back.
/// Polls `status` every 250 ms until `tx_alarm` is as `raised` says, at
/// most `bound`; how long it took.
fn wait_tx_alarm(run: &scenario::LabRun, raised: bool, bound: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let s = run.status().unwrap();
        if s.tx_alarm.is_some() == raised {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < bound,
            "tx_alarm still {:?} after {bound:?}",
            s.tx_alarm
        );
        thread::sleep(Duration::from_millis(250));
    }
}

/// Issue 39: the by-hand deployment's black hole. With `xlb xdp-pass` on
/// the LB's veth peer, traffic flows and no alarm stands; without it, every
/// frame the LB forwards (`XDP_TX`) is dropped by the veth while every
/// backend stays `up` (the data-path probes leave through tc): the TX alarm
/// is raised within seconds, in `status` and as an event, and it clears
/// once xdp-pass is back.
#[test]
fn forwarded_frames_that_do_not_leave_raise_an_alarm() {
    let _serial = serial();
    let p = prefix("txal");
    let vip = api();
    let mut run = up(&p, &config(&p, Health::default(), vec![vip.clone()]));
    let before = run
        .run_client(steady(vip.target(), Duration::from_secs(3)))
        .unwrap();
    assert_eq!(before.summary.failures, 0, "{}", before.render_text());
    assert_eq!(run.status().unwrap().tx_alarm, None);

    run.stop_lb_xdp_pass().unwrap();
    let lost = run
        .start_client(steady(vip.target(), Duration::from_secs(8)))
        .unwrap();
    let raised_after = wait_tx_alarm(&run, true, Duration::from_secs(6));
    let status = run.status().unwrap();
    eprintln!(
        "[{p}] raised {} ms after xdp-pass stopped: {:?}",
        raised_after.as_millis(),
        status.tx_alarm
    );
    for v in &status.vips {
        assert!(
            v.backends.iter().all(|b| b.state == "up"),
            "the backends stay up (the probes do not take XDP_TX): {:?}",
            v.backends
        );
    }
    let lost = lost.join().unwrap();
    assert!(
        lost.summary.failures * 2 > lost.summary.requests,
        "the clients were not cut off: {}",
        lost.render_text()
    );

    run.start_lb_xdp_pass().unwrap();
    let after = run
        .start_client(steady(vip.target(), Duration::from_secs(10)))
        .unwrap();
    let cleared_after = wait_tx_alarm(&run, false, Duration::from_secs(10));
    eprintln!(
        "[{p}] cleared {} ms after xdp-pass started again",
        cleared_after.as_millis()
    );
    let after = after.join().unwrap();
    assert_eq!(after.summary.failures, 0, "{}", after.render_text());
    let alarms: Vec<String> = run
        .events()
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == scenario::EventKind::Alarm)
        .map(|e| e.reason)
        .collect();
    assert!(
        alarms
            .iter()
            .any(|r| r.starts_with("forwarded frames are not leaving")),
        "{alarms:?}"
    );
    assert!(
        alarms
            .iter()
            .any(|r| r.starts_with("forwarded frames leave again")),
        "{alarms:?}"
    );
    teardown(run);
}

#[test]
fn drain_keeps_established_connections() {
    let _serial = serial();
    let p = prefix("drain");
    let vip = api();
    let b2 = vip.backend_addr(2);
    let run = up(&p, &config(&p, Health::default(), vec![vip.clone()]));
    let long = run
        .start_client(LoadOptions {
            duration: Duration::from_secs(9),
            rate: 0,
            keepalive: 0,
            long: 24,
            stream_interval: Duration::from_millis(100),
            stall_after: Duration::from_secs(1),
            timeout: Duration::from_secs(2),
            slice: Duration::from_millis(500),
            ..LoadOptions::new(vip.target())
        })
        .unwrap();
    wait_client_ms(&long, 1500);
    let out = run.drain("api", b2).unwrap();
    eprintln!("[{p}] xlb drain: {}", out.trim());
    run.wait_backend_state("api", b2, "draining", Duration::from_secs(2))
        .unwrap();
    // Counters in `status` are a tick old; no new connection starts meanwhile.
    thread::sleep(COUNTER_TICK);
    let flows_at_drain = new_flows(&run.status().unwrap(), "api", b2);
    let shorts = run
        .run_client(steady(vip.target(), Duration::from_secs(3)))
        .unwrap();
    thread::sleep(COUNTER_TICK);
    let after = run.status().unwrap();
    let report = long.join().unwrap();

    let on_b2: Vec<_> = report
        .long
        .iter()
        .filter(|l| l.backend.as_deref() == Some("b2"))
        .collect();
    eprintln!(
        "[{p}] long connections: {} of {} kept flowing, {} on b2 (lines {:?}); new connections after drain: {} ok, {} failed, per backend {:?}; b2 new flows {} → {}",
        report.summary.long_total - report.summary.long_broken,
        report.summary.long_total,
        on_b2.len(),
        on_b2.iter().map(|l| l.lines).collect::<Vec<_>>(),
        shorts.summary.counts.ok,
        shorts.summary.failures,
        shorts.summary.per_backend,
        flows_at_drain,
        new_flows(&after, "api", b2)
    );
    assert!(
        !on_b2.is_empty(),
        "no long connection landed on b2: {:?}",
        report.long
    );
    assert_eq!(report.summary.long_broken, 0, "{}", report.render_text());
    // 9 s at 10 lines/s: lines kept coming long after the drain at 1.5 s.
    assert!(on_b2.iter().all(|l| l.lines >= 50), "{on_b2:?}");
    assert_eq!(shorts.summary.failures, 0, "{}", shorts.render_text());
    assert_eq!(
        shorts.summary.per_backend.get("b2"),
        None,
        "a new connection reached drained b2"
    );
    assert_eq!(
        new_flows(&after, "api", b2),
        flows_at_drain,
        "new flows reached drained b2"
    );
    assert_eq!(after.backend("api", b2).unwrap().state, "draining");

    run.enable("api", b2).unwrap();
    run.wait_backend_state("api", b2, "up", Duration::from_secs(3))
        .unwrap();
    let again = run
        .run_client(steady(vip.target(), Duration::from_secs(1)))
        .unwrap();
    assert!(
        again.summary.per_backend.get("b2").copied().unwrap_or(0) > 0,
        "enabled b2 takes no new connections: {:?}",
        again.summary.per_backend
    );
    teardown(run);
}

/// The file a restart finds after `kill -9` (the usual edit, then
/// `systemctl restart`): VIP `api` with a new table size (1009 → 997), b1's
/// weight 1 → 3 and b4 added; VIP `other` as `cfg` has it.
fn changed_file(cfg: &XlbConfig) -> String {
    let mut changed = cfg.clone();
    changed.vips[0].backends = vec![1, 2, 3, 4];
    let text = changed.render();
    let api = "name = \"api\"\n";
    assert!(text.contains(api), "{text}");
    let text = text.replacen(api, &format!("{api}table_size = 997\n"), 1);
    // The first backend listed is api's b1.
    let b1 = format!("address = \"{}\"\n", changed.vips[0].backend_addr(1).ip());
    assert!(text.contains(&b1), "{text}");
    text.replacen(&b1, &format!("{b1}weight = 3\n"), 1)
}

/// 200 long-lived connections survive `kill -9` of the daemon and a restart
/// with a changed file (table size, a weight, a backend added to their VIP,
/// one removed from another VIP), which adopts the pinned maps and the
/// backends' ids, generations and health as a reload would: no SYN is
/// dropped for want of a backend, no backend goes through `unknown`. Then a
/// reload that changes another VIP.
#[test]
fn restart_and_reload_lose_nothing() {
    let _serial = serial();
    let p = prefix("rst");
    let vip = api();
    let other = Vip::new("other", topology::VIP2_V4.into(), 80, Mode::DsrL2, 3);
    let mut cfg = config(&p, Health::default(), vec![vip.clone(), other.clone()]);
    // A fourth backend for the restart to add.
    let mut run = scenario::LabRun::up_with(scenario::RunOptions {
        backends: 4,
        ..scenario::RunOptions::new(&p, &xlb_binary(), &cfg.render())
    })
    .unwrap_or_else(|e| panic!("lab up: {e}"));
    let client = run
        .start_client(LoadOptions {
            duration: Duration::from_secs(10),
            rate: 20,
            keepalive: 0,
            long: 200,
            stream_interval: Duration::from_millis(200),
            stall_after: Duration::from_millis(1500),
            timeout: Duration::from_secs(3),
            slice: Duration::from_millis(500),
            ..LoadOptions::new(vip.target())
        })
        .unwrap();
    wait_client_ms(&client, 2000);
    let drops_before = run.counter("drop_no_backend").unwrap();
    let old_pid = run.daemon_pid();
    run.kill9_daemon().unwrap();
    let killed_ms = client.elapsed().as_millis();
    cfg.vips[1].backends = vec![1, 2];
    std::fs::write(run.config_path(), changed_file(&cfg)).unwrap();
    thread::sleep(Duration::from_millis(500));
    run.start_daemon().unwrap();
    let restarted_ms = client.elapsed().as_millis();
    let status = run.status().unwrap();
    eprintln!(
        "[{p}] daemon {old_pid:?} killed at {killed_ms} ms, restarted with a changed file (pid {:?}) answering at {restarted_ms} ms; adopted = {}",
        run.daemon_pid(),
        status.adopted
    );
    assert!(
        status.adopted,
        "the restarted daemon did not adopt the pinned maps"
    );
    let api_now = status.vip("api").unwrap();
    assert_eq!(api_now.table_size, 997, "{}", status.summary());
    for i in 1..=3 {
        let b = status.backend("api", vip.backend_addr(i)).unwrap();
        assert_eq!(b.state, "up", "b{i} not adopted up: {}", status.summary());
        assert!(b.in_table, "b{i} not in the table: {}", status.summary());
    }
    assert_eq!(
        status.backend("api", vip.backend_addr(1)).unwrap().weight,
        3
    );
    assert_eq!(status.vip("other").unwrap().backends.len(), 2);
    run.wait_all_up(Duration::from_secs(5)).unwrap();

    wait_client_ms(&client, 5000);
    // Another VIP changes: b2 leaves it.
    cfg.vips[1].backends = vec![1];
    let out = run.reload(&changed_file(&cfg)).unwrap();
    eprintln!("[{p}] xlb reload: {}", out.trim());
    let (reloaded, _) = run
        .wait_until("other to have 1 backend", Duration::from_secs(3), |s| {
            s.vip("other").is_some_and(|v| v.backends.len() == 1)
        })
        .unwrap();
    let report = client.join().unwrap();
    assert_eq!(reloaded.vip("api").unwrap().backends.len(), 4);
    let events = run.events().unwrap();
    assert_stayed_up(&events, &vip, [1, 2, 3]);
    let drops_after = run.counter("drop_no_backend").unwrap();

    let spread: BTreeSet<&str> = report
        .long
        .iter()
        .filter_map(|l| l.backend.as_deref())
        .collect();
    eprintln!(
        "[{p}] long connections: {} of {} kept flowing (backends {spread:?}), longest gap {} ms; new connections {} ok, {} failed; drop_no_backend {drops_before} -> {drops_after}",
        report.summary.long_total - report.summary.long_broken,
        report.summary.long_total,
        report
            .long
            .iter()
            .map(|l| l.longest_gap_ms)
            .max()
            .unwrap_or(0),
        report.summary.counts.ok,
        report.summary.failures
    );
    assert_eq!(report.summary.long_total, 200);
    let broken: Vec<_> = report.long.iter().filter(|l| !l.kept_flowing).collect();
    assert!(broken.is_empty(), "connections broke: {broken:?}");
    assert!(spread.len() >= 2, "connections all on {spread:?}");
    assert_eq!(report.summary.failures, 0, "{}", report.render_text());
    assert_eq!(
        drops_after, drops_before,
        "SYNs dropped for want of a backend"
    );
    teardown(run);
}

/// The state file lost (deleted, then unreadable) and the daemon killed
/// with `kill -9` under 200 long-lived connections and 50 new connections a
/// second, then started again each time: it adopts from the pinned maps by
/// VIP key and backend address, so all 200 keep flowing without a stall,
/// no new connection fails or waits on a SYN retransmit (the client's
/// timeout is under the 1 s retransmit), and `drop_no_backend` does not
/// move. Before, a start without the file adopted nothing: 1,016
/// `drop_no_backend`, 16 new connections waited on a retransmit and every
/// long connection stalled about 460 ms; an unreadable file stopped the
/// start.
#[test]
fn restart_without_the_state_file_loses_nothing() {
    let _serial = serial();
    let p = prefix("nst");
    let vip = api();
    let mut run = up(&p, &config(&p, Health::default(), vec![vip.clone()]));
    let state = lb_user::daemon::persist::state_path(run.instance());
    assert!(state.exists(), "no state file at {}", state.display());
    let client = run
        .start_client(LoadOptions {
            duration: Duration::from_secs(9),
            rate: 50,
            keepalive: 0,
            long: 200,
            stream_interval: Duration::from_millis(100),
            stall_after: Duration::from_millis(400),
            timeout: Duration::from_millis(900),
            slice: Duration::from_millis(500),
            ..LoadOptions::new(vip.target())
        })
        .unwrap();
    wait_client_ms(&client, 2000);
    let drops_before = run.counter("drop_no_backend").unwrap();
    for (at_ms, what) in [(2000, "deleted"), (5000, "unreadable")] {
        wait_client_ms(&client, at_ms);
        run.kill9_daemon().unwrap();
        if what == "deleted" {
            std::fs::remove_file(&state).unwrap();
        } else {
            std::fs::write(&state, b"{\"layout_version\": 4, \"vips\"").unwrap();
        }
        run.start_daemon().unwrap();
        let status = run.status().unwrap();
        eprintln!(
            "[{p}] state file {what}, kill -9 at {at_ms} ms, restarted answering at {} ms; adopted = {}",
            client.elapsed().as_millis(),
            status.adopted
        );
        for i in 1..=3 {
            let b = status.backend("api", vip.backend_addr(i)).unwrap();
            assert_eq!(
                b.state,
                "up",
                "state file {what}: b{i}: {}",
                status.summary()
            );
            assert!(b.in_table, "state file {what}: b{i}: {}", status.summary());
        }
    }
    let report = client.join().unwrap();
    let drops_after = run.counter("drop_no_backend").unwrap();
    let longest = report
        .long
        .iter()
        .map(|l| l.longest_gap_ms)
        .max()
        .unwrap_or(0);
    eprintln!(
        "[{p}] long connections: {} of {} kept flowing, longest gap {longest} ms; new \
         connections {} ok, {} failed; drop_no_backend {drops_before} -> {drops_after}",
        report.summary.long_total - report.summary.long_broken,
        report.summary.long_total,
        report.summary.counts.ok,
        report.summary.failures
    );
    let state_dir = state.parent().unwrap().to_path_buf();
    let aside = format!("{}.json.bad-", run.instance());
    for entry in std::fs::read_dir(&state_dir).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(&aside))
        {
            std::fs::remove_file(path).unwrap();
        }
    }
    assert_eq!(report.summary.long_total, 200);
    let broken: Vec<_> = report.long.iter().filter(|l| !l.kept_flowing).collect();
    assert!(
        broken.is_empty(),
        "connections broke or stalled: {broken:?}"
    );
    assert_eq!(report.summary.failures, 0, "{}", report.render_text());
    assert_eq!(
        drops_after, drops_before,
        "SYNs dropped for want of a backend"
    );
    teardown(run);
}

/// Traffic to the LB host's own addresses passes while xlb is attached.
#[test]
fn lb_host_stays_reachable() {
    let _serial = serial();
    let p = prefix("host");
    let vip = api();
    let mut run = up(&p, &config(&p, Health::default(), vec![vip.clone()]));
    let lb_ns = run.lab().ns_lb();
    assert!(
        scenario::xdp_attached(&lb_ns, topology::HOST_IFNAME),
        "no XDP program on the LB's eth0"
    );
    let v4 = SocketAddr::new(topology::LB_V4.into(), 8000);
    let v6 = SocketAddr::new(topology::LB_V6.into(), 8000);
    let backend_bin = run.backend_bin().to_path_buf();
    let args: Vec<String> = [
        "--name",
        "lbhost",
        "--listen",
        &v4.to_string(),
        "--listen",
        &v6.to_string(),
        "--admin",
        "127.0.0.1:9001",
    ]
    .map(String::from)
    .to_vec();
    run.spawn_in("lbhost", &lb_ns, &backend_bin, &args).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    for addr in [v4, v6] {
        loop {
            let last = match run.http_get(addr, "/api", Duration::from_secs(1)) {
                Ok((200, body)) => {
                    assert_eq!(body, "lbhost", "{addr}");
                    break;
                }
                Ok(other) => format!("{other:?}"),
                Err(e) => e.to_string(),
            };
            assert!(Instant::now() < deadline, "GET http://{addr}/api: {last}");
            thread::sleep(Duration::from_millis(100));
        }
    }
    let client_ns = run.lab().ns_client();
    for dst in [IpAddr::from(topology::LB_V4), IpAddr::from(topology::LB_V6)] {
        let rtt = topology::ping(&client_ns, dst, Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("ping {dst}: {e}"));
        eprintln!("[{p}] ping {dst}: {rtt:?}");
    }
    // The host and the VIP at once.
    let quick = |target| LoadOptions {
        duration: Duration::from_secs(2),
        rate: 50,
        keepalive: 2,
        keepalive_interval: Duration::from_millis(100),
        timeout: CLIENT_TIMEOUT,
        ..LoadOptions::new(target)
    };
    let to_vip = run.start_client(quick(vip.target())).unwrap();
    let to_host = run.run_client(quick(v4)).unwrap();
    let to_host6 = run.run_client(quick(v6)).unwrap();
    let to_vip = to_vip.join().unwrap();
    for (what, r) in [
        ("host v4", &to_host),
        ("host v6", &to_host6),
        ("VIP", &to_vip),
    ] {
        eprintln!(
            "[{p}] {what}: {} requests, {} failed, per backend {:?}",
            r.summary.requests, r.summary.failures, r.summary.per_backend
        );
        assert!(r.summary.requests > 0, "{what}: no requests");
        assert_eq!(r.summary.failures, 0, "{what}: {}", r.render_text());
    }
    assert_eq!(
        to_host.summary.per_backend.keys().collect::<Vec<_>>(),
        ["lbhost"]
    );
    assert!(
        scenario::xdp_attached(&lb_ns, topology::HOST_IFNAME),
        "XDP left the LB's eth0 during the test"
    );
    teardown(run);
}

/// IPv4 and IPv6 VIPs, each in both forwarding modes, carry traffic to
/// every backend.
#[test]
fn ipv6_and_both_modes_end_to_end() {
    let _serial = serial();
    let p = prefix("v6");
    let vips = vec![
        Vip::new("v4-ipip", topology::VIP_V4.into(), 80, Mode::DsrIpip, 3),
        Vip::new("v6-ipip", topology::VIP_V6.into(), 80, Mode::DsrIpip, 3),
        Vip::new("v4-l2", topology::VIP2_V4.into(), 80, Mode::DsrL2, 3),
        Vip::new("v6-l2", topology::VIP_V6.into(), 8080, Mode::DsrL2, 3),
    ];
    let run = up(&p, &config(&p, Health::default(), vips.clone()));
    for v in &vips {
        let report = run
            .run_client(LoadOptions {
                duration: Duration::from_secs(2),
                rate: 50,
                keepalive: 2,
                keepalive_interval: Duration::from_millis(100),
                timeout: CLIENT_TIMEOUT,
                ..LoadOptions::new(v.target())
            })
            .unwrap();
        let s = run.status().unwrap();
        let vs = s.vip(&v.name).unwrap();
        eprintln!(
            "[{p}] {} {} ({}): {} requests, {} failed, per backend {:?}; xlb: {} packets, {} new flows",
            v.name,
            v.target(),
            v.mode.as_str(),
            report.summary.requests,
            report.summary.failures,
            report.summary.per_backend,
            vs.packets,
            vs.new_flows
        );
        assert!(report.summary.requests > 50, "{}: too few requests", v.name);
        assert_eq!(
            report.summary.failures,
            0,
            "{}: {}",
            v.name,
            report.render_text()
        );
        assert!(
            report.summary.per_backend.len() >= 2,
            "{}: answered only by {:?}",
            v.name,
            report.summary.per_backend
        );
        assert_eq!(vs.mode, v.mode.as_str(), "{}", v.name);
        assert!(
            vs.packets > 0 && vs.new_flows > 0,
            "{}: xlb counted nothing",
            v.name
        );
    }
    teardown(run);
}

/// Every configuration these tests and the demo run is one xlb accepts
/// (no root needed).
#[test]
fn lab_configurations_are_valid() {
    let p = "cfg";
    let mut cases: Vec<(&str, String)> = vec![
        ("for_prefix", XlbConfig::for_prefix(p).render()),
        (
            "lab up dsr-ipip",
            XlbConfig::lab_default(p, Mode::DsrIpip, 3).render(),
        ),
        (
            "lab up dsr-l2",
            XlbConfig::lab_default(p, Mode::DsrL2, 3).render(),
        ),
        (
            "tcp health",
            config(
                p,
                Health {
                    kind: "tcp".into(),
                    ..Health::default()
                },
                vec![api()],
            )
            .render(),
        ),
        (
            "examples/lab.toml",
            include_str!("../../examples/lab.toml").to_string(),
        ),
    ];
    cases.push((
        "both families and modes",
        config(
            p,
            Health::default(),
            vec![
                api(),
                Vip::new("v6-l2", topology::VIP_V6.into(), 8080, Mode::DsrL2, 3),
            ],
        )
        .render(),
    ));
    for (name, text) in cases {
        let cfg = lb_user::config::Config::from_str(&text, name)
            .unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        assert_eq!(cfg.warnings, Vec::<String>::new(), "{name}");
        let (instance, socket) = scenario::instance_and_socket(&text);
        assert_eq!(cfg.daemon.pinned.instance, instance, "{name}");
        assert_eq!(cfg.daemon.restart.control_socket, socket, "{name}");
    }
    // The demo's file names its instance and socket after the default prefix.
    let demo = include_str!("../../examples/lab.toml");
    assert_eq!(
        scenario::instance_and_socket(demo),
        (
            scenario::instance_for(topology::DEFAULT_PREFIX),
            scenario::socket_for(topology::DEFAULT_PREFIX)
        )
    );
}
