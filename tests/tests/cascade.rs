//! End to end, issue 7: health checking that never causes an outage. The
//! real `xlb` in the namespaced lab, faults switched on the lab's backends,
//! outcomes read from the load client's report (failures, connects that
//! waited on a retransmitted SYN, who answered) and from xlb's status and
//! events.
//!
//! Same rules as `e2e.rs`: each test builds its own lab (own prefix `cas…`,
//! instance and socket) through `LabRun`, whose Drop stops everything and
//! removes the namespaces however the test ends; a passing test checks that
//! nothing is left; one lab at a time (`xlb_tests::lab::serial`); every wait
//! is bounded; traffic stays inside the namespaces.
//!
//! Needs root and the binaries: `cargo build -p lb-user -p xlb-lab` (without
//! AYA_BUILD_SKIP), then
//! `cargo test -p xlb-tests --test cascade -- --test-threads 1 --nocapture`
//! (one test: append its name). `XLB_BIN` points at another `xlb`.
//!
//! `protection_off_reproduces_the_incident` is the control: it also runs
//! against an xlb that predates issue 7 (it then leaves out the keys that
//! xlb does not know, which changes nothing there: a late answer was
//! always a failure and nothing kept a VIP from emptying).

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::{
    net::SocketAddr,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use xlb_lab::{
    Fault,
    client::{LoadOptions, Report, SYN_RETRANSMIT_CONNECT},
    scenario::{Event, Health, LabRun, Protection, Share, XlbConfig},
};
use xlb_tests::lab::{
    DETECTION_MARGIN, MAP_UPDATE_MARGIN_MS, answered_by,
    cascade::{COUNTER_TICK, SEED_SLOW, api, config, seed_003, seed_profile, set_all, watch},
    failure_slices, kill_decap, now_unix_ms, serial, steady, teardown, transitions, up,
    wait_client_ms,
};

/// The drain helper's flow count comes from the periodic conntrack walk
/// (every 10 s) and an entry counts as established until it has been idle
/// for a while (DSR: the LB sees only the client's packets, no FIN state):
/// how long after the last connection closed `drain --wait` may still wait.
const FLOWS_SETTLE: Duration = Duration::from_secs(15);

fn prefix(tag: &str) -> String {
    format!("cas{tag}{}", std::process::id() % 1000)
}

/// `hang_timeout` as xlb resolves it: as set, or 3 × `timeout`.
fn effective_hang_timeout(h: &Health) -> Duration {
    h.hang_timeout.unwrap_or(h.timeout * 3)
}

/// Events of `kind` about VIP `vip`.
fn vip_events<'a>(events: &'a [Event], kind: &str, vip: &str) -> Vec<&'a Event> {
    events
        .iter()
        .filter(|e| e.kind == kind && e.vip.as_deref() == Some(vip))
        .collect()
}

/// Transition events of VIP `vip` that took a backend anywhere but `up`
/// (or a placement that keeps it in the table).
fn exits<'a>(events: &'a [Event], vip: &str) -> Vec<&'a Event> {
    events
        .iter()
        .filter(|e| {
            e.kind == "transition"
                && e.vip.as_deref() == Some(vip)
                && !matches!(
                    e.to.as_deref(),
                    Some("up" | "serving" | "ramping" | "panic_restored")
                )
        })
        .collect()
}

/// Share of `name` among the `ok` answers of slices starting in `[from, to)`.
fn share(report: &Report, name: &str, from: i64, to: i64) -> (f64, u64) {
    let total: u64 = report
        .timeline
        .iter()
        .filter(|s| (from..to).contains(&(s.t_ms as i64)))
        .map(|s| s.per_backend.values().sum::<u64>())
        .sum();
    let mine = answered_by(report, name, from, to);
    (mine as f64 / total.max(1) as f64, total)
}

/// Seconds of the timeline in which some request waited on a SYN
/// retransmit, `(t_ms, count)`.
fn syn_wait_slices(report: &Report) -> Vec<(u64, u64)> {
    report
        .timeline
        .iter()
        .filter(|s| s.syn_retransmit_waits > 0)
        .map(|s| (s.t_ms, s.syn_retransmit_waits))
        .collect()
}

/// Whether the linked xlb's configuration parser knows the issue 7 keys
/// (`hang_timeout`, `[protection]`). The test binary and `xlb` are built
/// from the same tree (`xlb_binary` refuses a stale one).
fn xlb_knows_issue7() -> bool {
    let mut cfg = config("probe", seed_profile(), Protection::off());
    cfg.health.hang_timeout = Some(cfg.health.timeout);
    match lb_user::config::Config::from_str(&cfg.render(), "issue 7 probe") {
        Ok(_) => true,
        Err(e) if e.to_string().contains("unknown field") => false,
        Err(e) => panic!("xlb rejects the issue 7 keys for another reason: {e}"),
    }
}

/// Every backend answers 2.5 s late, probes included, for 15 s: with the
/// defaults and with the seed's `interval 2s, timeout 1s, fall 3`, no
/// backend leaves the table, no SYN is dropped, no request fails or waits
/// on a SYN retransmit, and xlb says the fleet is slow.
#[test]
fn fleet_slowdown_ejects_nobody() {
    let _serial = serial();
    for (tag, health) in [("fsd", Health::xlb_defaults()), ("fss", seed_profile())] {
        let p = prefix(tag);
        let run = up(&p, &config(&p, health.clone(), Protection::default()));
        eprintln!(
            "[{p}] health: {}",
            if health.xlb_defaults {
                "xlb defaults".to_string()
            } else {
                format!("{health:?}")
            }
        );
        let r = seed_003(&run, Duration::from_secs(26));
        let vip = api();
        let not_in: Vec<(i64, String)> = r
            .polls
            .iter()
            .filter(|(_, s)| {
                s.vip("api")
                    .is_none_or(|v| v.backends.iter().any(|b| b.state != "up"))
            })
            .map(|(t, s)| (*t, s.summary()))
            .collect();
        let fleet_slow_seen = r
            .polls
            .iter()
            .filter(|(_, s)| s.vip("api").is_some_and(|v| v.fleet_slow.is_some()))
            .count();
        let fleet = vip_events(&r.events, "fleet_slow", "api");
        eprintln!(
            "[{p}] drop_no_backend {} → {}; {} of {} polls saw fleet_slow; fleet_slow events: {:?}",
            r.drops_before,
            r.drops_after,
            fleet_slow_seen,
            r.polls.len(),
            fleet
                .iter()
                .map(|e| (&e.reason, e.at_unix_ms))
                .collect::<Vec<_>>()
        );
        assert!(
            not_in.is_empty(),
            "[{p}] backends left the table: {not_in:?}"
        );
        let out = exits(&r.events, "api");
        assert!(out.is_empty(), "[{p}] backends were taken out: {out:?}");
        assert_eq!(
            r.drops_after, r.drops_before,
            "[{p}] SYNs dropped: no backend"
        );
        assert_eq!(
            r.report.summary.failures,
            0,
            "[{p}] requests failed, by slice: {:?}",
            failure_slices(&r.report)
        );
        assert_eq!(
            r.report.summary.syn_retransmit_waits,
            0,
            "[{p}] connects waited on a SYN retransmit (> {SYN_RETRANSMIT_CONNECT:?}), by slice: {:?}",
            syn_wait_slices(&r.report)
        );
        // The fault took: requests in the slow window were 2.5 s late, and
        // every backend answered some of them.
        assert!(
            r.report.summary.latency.p90_ms >= SEED_SLOW.as_millis() as f64,
            "[{p}] requests were not slow: {:?}",
            r.report.summary.latency
        );
        for i in 1..=3 {
            assert!(
                answered_by(&r.report, &format!("b{i}"), 6000, 19_000) > 0,
                "[{p}] b{i} answered nothing during the slowdown"
            );
        }
        assert!(
            !fleet.is_empty(),
            "[{p}] no fleet_slow event for api: {:?}",
            r.events
        );
        assert!(
            fleet[0].reason.contains("slow"),
            "[{p}] fleet_slow event says {:?}",
            fleet[0].reason
        );
        assert!(fleet_slow_seen > 0, "[{p}] status never showed fleet_slow");
        for i in 1..=3 {
            assert!(
                transitions(&r.events, "api", vip.backend_addr(i))
                    .iter()
                    .all(|e| e.to.as_deref() != Some("down")),
                "[{p}] b{i} went down"
            );
        }
        teardown(run);
    }
}

/// The control: the same slowdown with the protection switched off
/// (`hang_timeout = timeout`: a late answer is a failure; `min_healthy =
/// 0`: no panic; no damping) empties the table, as in seed 003. Passes on
/// xlb before issue 7 too.
#[test]
fn protection_off_reproduces_the_incident() {
    let _serial = serial();
    let p = prefix("ctl");
    let mut health = seed_profile();
    let mut protection = Protection::off();
    if xlb_knows_issue7() {
        health.hang_timeout = Some(health.timeout);
    } else {
        eprintln!(
            "[{p}] this xlb predates issue 7 (no hang_timeout, no [protection]): \
             running the control with its fixed behaviour"
        );
        protection = Protection::default();
    }
    let run = up(&p, &config(&p, health.clone(), protection));
    let vip = api();
    let r = seed_003(&run, Duration::from_secs(26));
    let empty: Vec<i64> = r
        .polls
        .iter()
        .filter(|(_, s)| {
            s.vip("api")
                .is_some_and(|v| v.backends.iter().all(|b| b.state != "up"))
        })
        .map(|(t, _)| *t)
        .collect();
    eprintln!(
        "[{p}] table empty in {} polls, from {:?} to {:?} ms; drop_no_backend {} → {}; \
         {} requests failed, {} waited on a SYN retransmit",
        empty.len(),
        empty.first(),
        empty.last(),
        r.drops_before,
        r.drops_after,
        r.report.summary.failures,
        r.report.summary.syn_retransmit_waits
    );
    for i in 1..=3 {
        let t = transitions(&r.events, "api", vip.backend_addr(i));
        assert!(
            t.iter().any(|e| e.to.as_deref() == Some("down")),
            "b{i} never went down: {t:?}"
        );
    }
    assert!(!empty.is_empty(), "the table never emptied");
    assert!(
        r.drops_after > r.drops_before,
        "no SYN was dropped for want of a backend"
    );
    assert!(
        r.report.summary.syn_retransmit_waits + r.report.summary.failures > 0,
        "no client noticed the empty table"
    );
    assert!(
        vip_events(&r.events, "panic", "api").is_empty(),
        "panic with min_healthy = 0"
    );
    // And it comes back once the fleet is fast again.
    run.wait_all_up(
        health.interval * (health.rise + 2) + DETECTION_MARGIN + Duration::from_secs(5),
    )
    .unwrap_or_else(|e| panic!("the fleet did not come back: {e}"));
    teardown(run);
}

/// One of three backends answers 10× slower than its peers (they are a
/// little slow, it is beyond `timeout` but within `hang_timeout`): it is
/// ejected as an outlier (at most `max_ejected` = 1 at a time), its peers
/// stay, clients stop reaching it; it returns when it is fast again.
#[test]
fn one_slow_outlier_is_ejected_within_max_ejected() {
    let _serial = serial();
    let p = prefix("out");
    let health = Health {
        interval: Duration::from_secs(1),
        timeout: Duration::from_millis(500),
        fall: 3,
        ..Health::default()
    };
    let (peer_ms, slow_ms) = (100, 1000);
    let vip = api();
    let b3 = vip.backend_addr(3);
    let run = up(&p, &config(&p, health.clone(), Protection::default()));
    let client = run
        .start_client(LoadOptions {
            // New connections only: an ejected backend keeps its
            // established flows, so keep-alive requests would still reach it.
            keepalive: 0,
            timeout: Duration::from_secs(3),
            ..steady(vip.target(), Duration::from_secs(14))
        })
        .unwrap();
    wait_client_ms(&client, 1000);
    run.set_fault(1, Fault::Slow { ms: peer_ms }).unwrap();
    run.set_fault(2, Fault::Slow { ms: peer_ms }).unwrap();
    run.set_fault(3, Fault::Slow { ms: slow_ms }).unwrap();
    let slow_ms_t = client.timeline_ms(now_unix_ms());
    let bound = health.interval * health.fall + health.timeout + DETECTION_MARGIN * 2;
    let mut ejected_at: Option<i64> = None;
    let mut over_limit = Vec::new();
    let mut others_out = Vec::new();
    let mut seen_limit = 0;
    watch(&run, &client, |t, s| {
        let v = s.vip("api").expect("api in status");
        seen_limit = seen_limit.max(v.max_ejected);
        let ejected: Vec<&str> = v
            .backends
            .iter()
            .filter(|b| b.placement == "ejected_slow")
            .map(|b| b.placement.as_str())
            .collect();
        if ejected.len() > 1 || v.ejected_slow > 1 {
            over_limit.push((t, s.summary()));
        }
        if v.backends
            .iter()
            .any(|b| b.address != b3.to_string() && b.state != "up")
        {
            others_out.push((t, s.summary()));
        }
        if ejected_at.is_none()
            && s.backend("api", b3)
                .is_some_and(|b| b.placement == "ejected_slow")
        {
            let b = s.backend("api", b3).unwrap();
            eprintln!(
                "[{p}] b3 ejected at {t} ms: state {}, latency {:?} ms, reason {:?}",
                b.state, b.latency_ms, b.placement_reason
            );
            assert_eq!(b.state, "draining", "an ejected backend keeps its flows");
            ejected_at = Some(t);
        }
    });
    let report = client.join().unwrap();
    eprintln!("{}", report.render_text());
    let ejected_at = ejected_at.unwrap_or_else(|| {
        panic!(
            "b3 was never ejected; status: {}",
            run.status().map(|s| s.summary()).unwrap_or_default()
        )
    });
    eprintln!(
        "[{p}] slowed at {slow_ms_t} ms, b3 ejected at ≤ {ejected_at} ms (bound {bound:?}); max_ejected {seen_limit}"
    );
    assert!(
        over_limit.is_empty(),
        "more than max_ejected out: {over_limit:?}"
    );
    assert!(
        others_out.is_empty(),
        "b1 or b2 left the table: {others_out:?}"
    );
    assert!(
        ejected_at - slow_ms_t <= bound.as_millis() as i64,
        "b3 ejected {} ms after the slowdown; bound {bound:?}",
        ejected_at - slow_ms_t
    );
    assert_eq!(seen_limit, 1, "max_ejected default for 3 backends");
    assert_eq!(report.summary.failures, 0, "{}", report.render_text());
    assert_eq!(
        answered_by(&report, "b3", ejected_at + MAP_UPDATE_MARGIN_MS, i64::MAX),
        0,
        "new connections reached b3 after its ejection"
    );
    let events = run.events().unwrap();
    for i in [1, 2] {
        let t = transitions(&events, "api", vip.backend_addr(i));
        assert!(
            t.iter().all(|e| e.to.as_deref() == Some("up")),
            "b{i} changed: {t:?}"
        );
    }
    // Fast again: it comes back.
    set_all(&run, Fault::None);
    run.wait_until(
        "b3 back in the table",
        health.interval * (health.rise + 2) + DETECTION_MARGIN * 3,
        |s| s.backend("api", b3).is_some_and(|b| b.state == "up"),
    )
    .unwrap();
    teardown(run);
}

/// Fast profile (interval 200 ms, timeout 100 ms, fall 2): a hung backend
/// (no answer at all) is still out within the detection bound, and clients
/// fail only between the hang and its detection.
#[test]
fn hung_backend_is_out_fast() {
    let _serial = serial();
    let p = prefix("hng");
    let health = Health {
        interval: Duration::from_millis(200),
        timeout: Duration::from_millis(100),
        fall: 2,
        ..Health::default()
    };
    let vip = api();
    let b2 = vip.backend_addr(2);
    let run = up(&p, &config(&p, health.clone(), Protection::default()));
    // The bound of old (fall × interval + timeout = 0.5 s) still holds: a
    // hung backend among answering peers is a slow outlier after `fall`
    // late probes, and leaves the table then (`ejected_slow`); its hard
    // `down` follows when those probes reach hang_timeout.
    let target = health.interval * health.fall + health.timeout;
    let bound = target + DETECTION_MARGIN;
    let hard_bound =
        health.interval * health.fall + effective_hang_timeout(&health) + DETECTION_MARGIN;
    let client = run
        .start_client(steady(vip.target(), Duration::from_secs(6)))
        .unwrap();
    wait_client_ms(&client, 2000);
    run.set_fault(2, Fault::Hang).unwrap();
    let hang_unix = now_unix_ms();
    let hang_ms = client.timeline_ms(hang_unix);
    run.wait_backend_state("api", b2, "down", hard_bound + Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("b2 was not taken out: {e}"));
    let events = run.events().unwrap();
    let down = *exits(&events, "api")
        .iter()
        .find(|e| e.backend.as_deref() == Some(b2.to_string().as_str()))
        .unwrap_or_else(|| panic!("no exit event for b2: {events:?}"));
    let detection = Duration::from_millis(down.at_unix_ms.saturating_sub(hang_unix));
    let detect_ms = client.timeline_ms(down.at_unix_ms);
    let report = client.join().unwrap();
    eprintln!("{}", report.render_text());
    eprintln!(
        "[{p}] b2 hung at {hang_ms} ms, out ({}) at {detect_ms} ms: {} ms (issue target {} ms, bound {} ms): {}",
        down.to.as_deref().unwrap_or("?"),
        detection.as_millis(),
        target.as_millis(),
        bound.as_millis(),
        down.reason
    );
    assert!(
        detection <= bound,
        "b2 out {detection:?} after the hang; bound {bound:?}"
    );
    let window = (hang_ms - 1000 - 100, detect_ms + MAP_UPDATE_MARGIN_MS);
    let outside: Vec<(u64, u64)> = failure_slices(&report)
        .into_iter()
        .filter(|(t, _)| !(window.0..=window.1).contains(&(*t as i64)))
        .collect();
    assert!(
        outside.is_empty(),
        "requests failed outside the detection window {window:?}: {outside:?}"
    );
    assert!(
        report.summary.failures > 0,
        "no request failed: did the hang take?"
    );
    assert_eq!(
        answered_by(&report, "b2", detect_ms + MAP_UPDATE_MARGIN_MS, i64::MAX),
        0,
        "b2 answered after it was taken out"
    );
    assert!(
        vip_events(&events, "panic", "api").is_empty(),
        "one hung backend of three is no reason to panic: {events:#?}"
    );
    teardown(run);
}

/// Two of three backends hang with `min_healthy = 2`: the policy keeps one
/// of them (a timeout-kind failure, the least bad) rather than leave one
/// backend in the table; panic is entered with one event naming it and
/// why, shown in `status`, and exited with one event when they recover.
#[test]
fn two_hung_with_min_healthy_two_enter_panic() {
    let _serial = serial();
    let p = prefix("pan");
    let health = Health {
        interval: Duration::from_millis(500),
        timeout: Duration::from_millis(250),
        fall: 2,
        ..Health::default()
    };
    let protection = Protection {
        min_healthy: Some(Share::Count(2)),
        ..Protection::default()
    };
    let vip = api();
    let (b1, b2, b3) = (
        vip.backend_addr(1),
        vip.backend_addr(2),
        vip.backend_addr(3),
    );
    let run = up(&p, &config(&p, health.clone(), protection));
    let drops_before = run.counter("drop_no_backend").unwrap();
    let client = run
        .start_client(LoadOptions {
            keepalive: 0,
            rate: 50,
            ..steady(vip.target(), Duration::from_secs(12))
        })
        .unwrap();
    wait_client_ms(&client, 1500);
    run.set_fault(2, Fault::Hang).unwrap();
    run.set_fault(3, Fault::Hang).unwrap();
    let bound = health.interval * (health.fall + 1)
        + effective_hang_timeout(&health)
        + DETECTION_MARGIN * 2;
    let (s, after) = run
        .wait_until("api to enter panic", bound, |s| {
            s.vip("api").is_some_and(|v| v.panic)
        })
        .unwrap_or_else(|e| panic!("no panic: {e}"));
    let v = s.vip("api").unwrap();
    let restored: Vec<SocketAddr> = v
        .backends
        .iter()
        .filter(|b| b.placement == "panic_restored")
        .map(|b| b.address.parse().unwrap())
        .collect();
    eprintln!(
        "[{p}] panic after {after:?}: {:?}; {}; restored {restored:?}",
        v.panic_reason,
        s.summary()
    );
    assert_eq!(
        restored.len(),
        1,
        "panic keeps exactly one more: {}",
        s.summary()
    );
    assert!(
        restored[0] == b2 || restored[0] == b3,
        "restored {restored:?}"
    );
    assert_eq!(s.backend("api", restored[0]).unwrap().state, "up");
    assert_eq!(s.backend("api", b1).unwrap().state, "up");
    assert!(v.panic_reason.is_some(), "panic without a reason");
    assert_eq!(v.backends_up, 2, "{}", s.summary());
    // Held for a while: the restored one stays in while both hang.
    wait_client_ms(&client, 7000);
    let held = run.status().unwrap();
    assert!(held.vip("api").unwrap().panic, "{}", held.summary());
    set_all(&run, Fault::None);
    run.wait_until(
        "api to leave panic",
        health.interval * (health.rise + 2) + DETECTION_MARGIN * 3,
        |s| s.vip("api").is_some_and(|v| !v.panic) && s.all_up(),
    )
    .unwrap_or_else(|e| panic!("panic did not end: {e}"));
    let report = client.join().unwrap();
    thread::sleep(COUNTER_TICK);
    let drops_after = run.counter("drop_no_backend").unwrap();
    let events = run.events().unwrap();
    eprintln!("{}", report.render_text());
    let panics = vip_events(&events, "panic", "api");
    eprintln!(
        "[{p}] panic events: {:?}",
        panics.iter().map(|e| &e.reason).collect::<Vec<_>>()
    );
    assert_eq!(
        panics.len(),
        2,
        "one event on entry, one on exit: {panics:?}"
    );
    let kept = restored[0].to_string();
    let kept_ip = restored[0].ip().to_string();
    assert!(
        panics[0].reason.contains(&kept) || panics[0].reason.contains(&kept_ip),
        "the entry event does not name the kept backend {kept}: {:?}",
        panics[0].reason
    );
    assert_eq!(drops_after, drops_before, "the table emptied");
    assert!(
        answered_by(&report, "b1", 0, i64::MAX) > 0,
        "b1 answered nothing"
    );
    let b1_exits: Vec<_> = transitions(&events, "api", b1)
        .into_iter()
        .filter(|e| e.to.as_deref() != Some("up"))
        .collect();
    assert!(b1_exits.is_empty(), "b1 left: {b1_exits:?}");
    teardown(run);
}

/// A backend whose fault goes on and off every 0.7 s is held down by flap
/// damping (short half-life, low limit) even while its probes pass, with a
/// reason that counts transitions, and returns once the penalty decays.
#[test]
fn flapping_backend_is_held_down_then_returns() {
    let _serial = serial();
    let p = prefix("flp");
    let health = Health {
        interval: Duration::from_millis(200),
        timeout: Duration::from_millis(100),
        fall: 2,
        rise: 2,
        ..Health::default()
    };
    let half_life = Duration::from_secs(5);
    let limit = 3;
    let protection = Protection {
        flap_damping: Some(true),
        flap_half_life: Some(half_life),
        flap_limit: Some(limit),
        ..Protection::default()
    };
    let vip = api();
    let b2 = vip.backend_addr(2);
    let run = up(&p, &config(&p, health.clone(), protection));
    let half = Duration::from_millis(700);
    let mut held = None;
    for cycle in 0..12 {
        run.set_fault(2, Fault::Error503).unwrap();
        thread::sleep(half);
        run.set_fault(2, Fault::None).unwrap();
        thread::sleep(half);
        let s = run.status().unwrap();
        let b = s.backend("api", b2).unwrap().clone();
        if b.placement == "held_down" {
            eprintln!(
                "[{p}] held down after {} cycles: {:?}",
                cycle + 1,
                b.placement_reason
            );
            held = Some(b);
            break;
        }
    }
    let held = held.unwrap_or_else(|| {
        panic!(
            "b2 was never held down: {}",
            run.status().map(|s| s.summary()).unwrap_or_default()
        )
    });
    let calm = Instant::now();
    let reason = held.placement_reason.clone().unwrap_or_default();
    assert!(reason.contains("transitions"), "reason {reason:?}");
    assert_eq!(held.state, "draining", "held down keeps established flows");
    // Probes pass, it stays held for a while: damping, not health.
    thread::sleep(Duration::from_secs(1));
    let s = run.status().unwrap();
    let b = s.backend("api", b2).unwrap();
    assert_eq!(b.health, "up", "{}", s.summary());
    assert_eq!(b.placement, "held_down", "{}", s.summary());
    let no_b2 = run
        .run_client(steady(vip.target(), Duration::from_secs(1)))
        .unwrap();
    assert_eq!(
        no_b2.summary.per_backend.get("b2"),
        None,
        "held-down b2 answered"
    );
    assert_eq!(no_b2.summary.failures, 0, "{}", no_b2.render_text());
    // The penalty is at most limit + 1 and must fall below limit / 2.
    let decay = half_life.mul_f64(((f64::from(limit) + 1.0) / (f64::from(limit) / 2.0)).log2());
    let (_, back_after) = run
        .wait_backend_state("api", b2, "up", decay + DETECTION_MARGIN * 3)
        .unwrap_or_else(|e| panic!("b2 did not return: {e}"));
    eprintln!(
        "[{p}] back {:?} after the flapping stopped ({back_after:?} of waiting; decay bound {decay:?})",
        calm.elapsed()
    );
    let again = run
        .run_client(steady(vip.target(), Duration::from_secs(1)))
        .unwrap();
    assert!(
        again.summary.per_backend.get("b2").copied().unwrap_or(0) > 0,
        "b2 takes nothing after it returned: {:?}",
        again.summary.per_backend
    );
    teardown(run);
}

/// `slow_start = "10s"`: a backend that comes back ramps; its share of new
/// connections is well below a third in the first seconds and about a
/// third at the end of the ramp.
#[test]
fn slow_start_ramps_new_flows() {
    let _serial = serial();
    let p = prefix("ssr");
    let ramp = Duration::from_secs(10);
    let protection = Protection {
        slow_start: Some(ramp),
        ..Protection::default()
    };
    let health = Health::default();
    let vip = api();
    let b2 = vip.backend_addr(2);
    let run = up(&p, &config(&p, health.clone(), protection));
    run.set_fault(2, Fault::Crash).unwrap();
    run.wait_backend_state("api", b2, "down", Duration::from_secs(5))
        .unwrap();
    let client = run
        .start_client(LoadOptions {
            keepalive: 0,
            rate: 150,
            slice: Duration::from_millis(500),
            ..steady(vip.target(), Duration::from_secs(15))
        })
        .unwrap();
    wait_client_ms(&client, 1000);
    run.set_fault(2, Fault::None).unwrap();
    let (s, _) = run
        .wait_backend_state("api", b2, "up", Duration::from_secs(5))
        .unwrap();
    let b = s.backend("api", b2).unwrap();
    eprintln!(
        "[{p}] b2 back: placement {}, effective weight {} of {}",
        b.placement, b.effective_weight, b.weight
    );
    assert_eq!(b.placement, "ramping", "{}", s.summary());
    assert!(
        b.effective_weight < 0.5 * f64::from(b.weight),
        "starts low: {} of {}",
        b.effective_weight,
        b.weight
    );
    let events = run.events().unwrap();
    let entered = transitions(&events, "api", b2)
        .into_iter()
        .rfind(|e| e.to.as_deref() == Some("ramping"))
        .map_or_else(
            || panic!("no ramping event for b2: {events:?}"),
            |e| client.timeline_ms(e.at_unix_ms),
        );
    let report = client.join().unwrap();
    eprintln!("{}", report.render_text());
    let r = ramp.as_millis() as i64;
    let early = share(&report, "b2", entered, entered + r / 5);
    let late = share(&report, "b2", entered + r * 4 / 5, entered + r);
    eprintln!(
        "[{p}] entered at {entered} ms; b2's share: first fifth {:.3} of {}, last fifth {:.3} of {}",
        early.0, early.1, late.0, late.1
    );
    assert!(early.1 > 50 && late.1 > 50, "too few answers to judge");
    assert!(
        early.0 < 0.2,
        "b2 got {:.3} of new connections at once",
        early.0
    );
    assert!(
        (0.22..0.45).contains(&late.0),
        "b2's share at the end of the ramp: {:.3}",
        late.0
    );
    assert!(late.0 > early.0 * 2.0, "no ramp: {early:?} → {late:?}");
    assert_eq!(report.summary.failures, 0, "{}", report.render_text());
    teardown(run);
}

/// Starts `xlb ARGS --socket S` as a child (for a command that blocks, run
/// alongside the test).
fn spawn_ctl(run: &LabRun, args: &[&str]) -> Child {
    Command::new(run.xlb_path())
        .args(args)
        .arg("--socket")
        .arg(run.socket())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting xlb {args:?}: {e}"))
}

/// Waits for `child` at most `timeout` (killed after it); returns its
/// output, whether it succeeded, and when it ended.
fn finish(mut child: Child, timeout: Duration) -> (String, bool, Instant) {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait().expect("waiting for xlb") {
            Some(_) => break,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("reaping xlb");
                panic!(
                    "xlb did not return within {timeout:?}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            None => thread::sleep(Duration::from_millis(20)),
        }
    }
    let ended = Instant::now();
    let out = child.wait_with_output().expect("reading xlb's output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (text, out.status.success(), ended)
}

/// Long-lived connections whose backend's flows the tests watch.
fn long_load(target: SocketAddr, duration: Duration) -> LoadOptions {
    LoadOptions {
        duration,
        rate: 0,
        keepalive: 0,
        // Enough that b2 surely gets some: with 12, one run in 130 put none
        // there ((2/3)^12); with 32, one in 400,000.
        long: 32,
        stream_interval: Duration::from_millis(100),
        stall_after: Duration::from_secs(1),
        timeout: Duration::from_secs(2),
        slice: Duration::from_millis(500),
        ..LoadOptions::new(target)
    }
}

/// `xlb drain api B --wait --deadline 20s` returns once B's long-lived
/// connections have closed (not before, and not at the deadline); with a
/// deadline shorter than the connections, it returns at the deadline and
/// the remaining flows follow `down_policy` (rehash: they break).
#[test]
fn drain_wait_returns_when_flows_close() {
    let _serial = serial();
    let p = prefix("drw");
    let vip = api();
    let b2 = vip.backend_addr(2);
    let run = up(&p, &config(&p, Health::default(), Protection::default()));

    // 1. The connections close 4 s in; the deadline is far.
    let long = run
        .start_client(long_load(vip.target(), Duration::from_secs(4)))
        .unwrap();
    wait_client_ms(&long, 1500);
    let started = Instant::now();
    let drain = spawn_ctl(
        &run,
        &[
            "drain",
            "api",
            &b2.to_string(),
            "--wait",
            "--deadline",
            "20s",
        ],
    );
    let (s, _) = run
        .wait_backend_state("api", b2, "draining", Duration::from_secs(3))
        .unwrap();
    let deadline_shown = s.backend("api", b2).unwrap().drain_deadline_unix_ms;
    let report = long.join().unwrap();
    let closed = Instant::now();
    let (out, ok, ended) = finish(drain, Duration::from_secs(40));
    eprintln!(
        "[{p}] drain --wait returned after {:?} ({:?} after the connections closed), ok {ok}; deadline shown {deadline_shown:?}; output:\n{out}",
        ended - started,
        ended.saturating_duration_since(closed)
    );
    let on_b2 = report
        .long
        .iter()
        .filter(|l| l.backend.as_deref() == Some("b2"))
        .count();
    assert!(on_b2 > 0, "no long connection on b2: {:?}", report.long);
    assert_eq!(report.summary.long_broken, 0, "{}", report.render_text());
    assert!(ok, "drain --wait failed: {out}");
    assert!(deadline_shown.is_some(), "status shows no drain deadline");
    assert!(
        ended + Duration::from_millis(200) >= closed,
        "drain --wait returned while b2 still had {on_b2} open connections"
    );
    assert!(
        ended - closed <= FLOWS_SETTLE,
        "drain --wait returned {:?} after the connections closed",
        ended - closed
    );
    assert!(!out.trim().is_empty(), "drain --wait printed nothing");
    run.enable("api", b2).unwrap();
    run.wait_backend_state("api", b2, "up", Duration::from_secs(3))
        .unwrap();

    // 2. The connections outlive a 5 s deadline.
    let drain_deadline = Duration::from_secs(5);
    let long = run
        .start_client(long_load(vip.target(), Duration::from_secs(12)))
        .unwrap();
    wait_client_ms(&long, 1500);
    let drain_ms = long.elapsed().as_millis() as u64;
    let started = Instant::now();
    let drain = spawn_ctl(
        &run,
        &[
            "drain",
            "api",
            &b2.to_string(),
            "--wait",
            "--deadline",
            "5s",
        ],
    );
    let (out, ok, ended) = finish(drain, drain_deadline + Duration::from_secs(10));
    let waited = ended - started;
    let s = run.status().unwrap();
    let report = long.join().unwrap();
    thread::sleep(COUNTER_TICK);
    let events = run.events().unwrap();
    eprintln!(
        "[{p}] drain --wait --deadline 5s returned after {waited:?}, ok {ok}: {out}\nstatus: {}\n{}",
        s.summary(),
        report.render_text()
    );
    assert!(
        waited + Duration::from_millis(200) >= drain_deadline
            && waited <= drain_deadline + Duration::from_secs(3),
        "returned after {waited:?}, deadline {drain_deadline:?}"
    );
    assert_eq!(
        s.backend("api", b2).unwrap().state,
        "down",
        "after the deadline"
    );
    let cut = drain_ms + drain_deadline.as_millis() as u64;
    for l in &report.long {
        let ended_or_stalled = l.ended_ms.or(l.first_stall_ms);
        if l.backend.as_deref() == Some("b2") {
            assert!(
                !l.kept_flowing,
                "b2's connection #{} outlived the deadline",
                l.id
            );
            assert!(
                ended_or_stalled.is_some_and(|t| t + 200 >= cut),
                "b2's connection #{} broke before the deadline: {l:?}",
                l.id
            );
        } else {
            assert!(
                l.kept_flowing,
                "connection #{} on {:?} broke: {l:?}",
                l.id, l.backend
            );
        }
    }
    assert!(
        report
            .long
            .iter()
            .any(|l| l.backend.as_deref() == Some("b2")),
        "no long connection on b2"
    );
    assert!(
        !vip_events(&events, "drain", "api").is_empty(),
        "no drain event at the deadline: {events:?}"
    );
    teardown(run);
}

/// Every configuration these tests render is one xlb accepts (no root
/// needed): catches a key name that differs from xlb's parser.
#[test]
fn cascade_configurations_are_valid() {
    let p = "cfg";
    let all = Protection {
        max_ejected: Some(Share::Percent(10)),
        min_healthy: Some(Share::Count(2)),
        outlier_factor: Some(3.0),
        outlier_margin: Some(Duration::from_millis(50)),
        slow_start: Some(Duration::from_secs(10)),
        flap_damping: Some(true),
        flap_half_life: Some(Duration::from_secs(5)),
        flap_limit: Some(3),
    };
    let mut per_vip = config(p, Health::default(), Protection::default());
    per_vip.vips[0].protection = Some(Protection {
        max_ejected: Some(Share::Count(1)),
        ..all.clone()
    });
    let cases: Vec<(&str, XlbConfig)> = vec![
        (
            "defaults",
            config(p, Health::xlb_defaults(), Protection::default()),
        ),
        (
            "control",
            config(
                p,
                Health {
                    hang_timeout: Some(Duration::from_secs(1)),
                    ..seed_profile()
                },
                Protection::off(),
            ),
        ),
        ("every key", config(p, Health::default(), all)),
        ("per VIP", per_vip),
    ];
    for (name, cfg) in cases {
        let text = cfg.render();
        let parsed = lb_user::config::Config::from_str(&text, name)
            .unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        assert_eq!(parsed.warnings, Vec::<String>::new(), "{name}");
    }
    // The rendered xlb_defaults leaves the timing to xlb, whose defaults the
    // struct mirrors for bounds.
    let d = Health::xlb_defaults();
    let spec_defaults = (
        lb_user::health::spec::defaults::INTERVAL,
        lb_user::health::spec::defaults::TIMEOUT,
        lb_user::health::spec::defaults::RISE,
        lb_user::health::spec::defaults::FALL,
    );
    assert_eq!((d.interval, d.timeout, d.rise, d.fall), spec_defaults);
}

/// Backend 1's decapsulator stops while its application still answers
/// direct probes: every client flow it gets is blackholed. xlb's default
/// data-path probes (to the VIP, encapsulated to that backend as clients'
/// packets are) fail, so it is taken out with the data-path reason, and
/// clients stop failing.
#[test]
fn datapath_check_catches_a_stopped_decap() {
    let _serial = serial();
    let p = prefix("dpc");
    let health = Health {
        interval: Duration::from_millis(500),
        timeout: Duration::from_millis(250),
        fall: 2,
        ..Health::default()
    };
    let vip = api();
    let b1 = vip.backend_addr(1);
    let run = up(&p, &config(&p, health.clone(), Protection::default()));
    let client = run
        .start_client(steady(vip.target(), Duration::from_secs(10)))
        .unwrap();
    wait_client_ms(&client, 2000);
    kill_decap(&run, 1);
    let stopped_ms = client.timeline_ms(now_unix_ms());
    // Its application still answers on its own address.
    let direct = run
        .http_get(b1, "/health", Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("direct GET of b1 after its decap stopped: {e}"));
    eprintln!("[{p}] decap of b1 stopped at {stopped_ms} ms; direct GET still answers: {direct:?}");
    // Out by the hard path: fall failures, each within hang_timeout.
    let bound =
        health.interval * health.fall + effective_hang_timeout(&health) * 2 + DETECTION_MARGIN;
    let (s, _) = run
        .wait_backend_state("api", b1, "down", bound + Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("b1 was not taken out: {e}"));
    let b = s.backend("api", b1).unwrap();
    eprintln!("[{p}] b1: {} ({:?})", b.placement, b.placement_reason);
    let events = run.events().unwrap();
    let down = *transitions(&events, "api", b1)
        .iter()
        .rfind(|e| e.to.as_deref() == Some("down"))
        .unwrap_or_else(|| panic!("no down event for b1: {events:?}"));
    let out_ms = client.timeline_ms(down.at_unix_ms);
    let report = client.join().unwrap();
    eprintln!("{}", report.render_text());
    assert!(
        down.reason
            .starts_with("no answer via VIP 10.100.0.1:80 through dsr-ipip")
            && down.reason.ends_with("; direct probe ok"),
        "b1's reason: {:?}",
        down.reason
    );
    // Clients stop failing once it is down (its share fails until then:
    // while it is only a slow outlier its established flows stay on it,
    // and its decapsulator is gone; `down` re-hashes them).
    let late: Vec<(u64, u64)> = failure_slices(&report)
        .into_iter()
        .filter(|(t, _)| *t as i64 > out_ms + MAP_UPDATE_MARGIN_MS + 1000)
        .collect();
    assert!(
        late.is_empty(),
        "requests failed after b1 went down at {out_ms} ms: {late:?}"
    );
    assert!(
        report.summary.failures > 0,
        "no request failed: did stopping the decapsulator take?"
    );
    teardown(run);
}

/// Issue 24: the LB host deployed without a route to the VIPs out of its
/// XDP interface. Its data-path probes are bound to that interface, so the
/// kernel takes the VIP for a neighbour and ARPs for it, and nobody answers:
/// before, every backend went `down` with `direct probe ok` and the VIP was
/// emptied. That is the LB's fault, not the backends': they must stay up
/// (their direct probes pass), clients must not notice, and an `alarm` must
/// name the route to add.
#[test]
fn missing_vip_route_keeps_backends_up_and_raises_an_alarm() {
    let _serial = serial();
    let p = prefix("vrt");
    let health = Health {
        interval: Duration::from_millis(500),
        timeout: Duration::from_millis(250),
        fall: 2,
        ..Health::default()
    };
    let vip = api();
    let run = up(&p, &config(&p, health.clone(), Protection::default()));
    let client = run
        .start_client(steady(vip.target(), Duration::from_secs(8)))
        .unwrap();
    wait_client_ms(&client, 1000);
    let lb = run.lab().ns_lb();
    let out = xlb_lab::topology::Lab::exec(&lb, ["ip", "-4", "route", "del", "10.100.0.0/24"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "removing the LB's route to the VIPs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let removed_ms = client.timeline_ms(now_unix_ms());
    eprintln!("[{p}] LB's route to 10.100.0.0/24 removed at {removed_ms} ms");
    // Time for `fall` data-path failures of every backend, and more.
    let bound = health.interval * (health.fall + 4)
        + effective_hang_timeout(&health) * 2
        + DETECTION_MARGIN;
    let t0 = Instant::now();
    let alarm = loop {
        let events = run.events().unwrap();
        if let Some(e) = vip_events(&events, "alarm", "api")
            .into_iter()
            .find(|e| e.reason.contains("fail by this host's fault"))
        {
            break e.clone();
        }
        assert!(
            t0.elapsed() < bound,
            "no data-path alarm within {bound:?}: {events:?}"
        );
        thread::sleep(Duration::from_millis(100));
    };
    eprintln!("[{p}] alarm: {}", alarm.reason);
    assert!(
        alarm
            .reason
            .contains("no route to 10.100.0.1 through a gateway out of eth0")
            && alarm
                .reason
                .contains("ip route add 10.100.0.1 via ROUTER dev eth0"),
        "the alarm names the route to add: {:?}",
        alarm.reason
    );
    thread::sleep(bound.saturating_sub(t0.elapsed()));
    let status = run.status().unwrap();
    for i in 1..=run.backend_count() {
        let addr = vip.backend_addr(i);
        let b = status.backend("api", addr).unwrap();
        assert_eq!(
            (b.state.as_str(), b.in_table),
            ("up", true),
            "backend {addr} after the route went: {:?}",
            b.last_transition_reason
        );
    }
    let events = run.events().unwrap();
    let out = exits(&events, "api");
    assert!(out.is_empty(), "backends taken out: {out:?}");
    let report = client.join().unwrap();
    assert_eq!(
        report.summary.failures,
        0,
        "clients noticed: {:?}",
        failure_slices(&report)
    );
    // A restart without the route: `xlb run` says so at start.
    let mut run = run;
    run.stop_daemon().unwrap();
    run.start_daemon().unwrap();
    let log = std::fs::read_to_string(run.daemon_log()).unwrap();
    assert!(
        log.contains(
            "vip \"api\": this host has no route to 10.100.0.1 through a gateway out of eth0"
        ),
        "no start-up warning about the route in the daemon's log:\n{log}"
    );
    run.wait_all_up(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("after the restart without the route: {e}"));
    teardown(run);
}

/// Issue 24: the LB's own side of the data path breaks in a way its route
/// check cannot see (here nftables on the LB host drops the replies from
/// the VIP, as a wrong `rp_filter` would): every backend fails data-path
/// probes while direct probes pass. Most of a VIP failing that way is the
/// LB's fault: every backend stays in the table, clients do not notice,
/// an `alarm` says so, and it clears when the path works again.
#[test]
fn shared_data_path_failure_keeps_every_backend() {
    let _serial = serial();
    let p = prefix("spf");
    let health = Health {
        interval: Duration::from_millis(500),
        timeout: Duration::from_millis(250),
        fall: 2,
        ..Health::default()
    };
    let vip = api();
    let run = up(&p, &config(&p, health.clone(), Protection::default()));
    let client = run
        .start_client(steady(vip.target(), Duration::from_secs(10)))
        .unwrap();
    wait_client_ms(&client, 1000);
    let lb = run.lab().ns_lb();
    let nft = |script: &str| {
        let out = xlb_lab::topology::Lab::exec(&lb, ["nft", script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "nft {script:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // Only the probes' replies: clients' replies go straight from the
    // backends to the client (DSR), never through the LB host. What came
    // before (the start's first probes) is not this test's.
    let broken_at = now_unix_ms();
    nft("add table inet xlbt_spf");
    nft("add chain inet xlbt_spf input { type filter hook input priority 0 ; }");
    nft("add rule inet xlbt_spf input ip saddr 10.100.0.1 tcp sport 80 drop");
    let bound = health.interval * (health.fall + 4)
        + effective_hang_timeout(&health) * 2
        + DETECTION_MARGIN;
    let wait_alarm = |what: &str| {
        let t0 = Instant::now();
        loop {
            let events = run.events().unwrap();
            if let Some(e) = vip_events(&events, "alarm", "api")
                .into_iter()
                .find(|e| e.at_unix_ms >= broken_at && e.reason.contains(what))
            {
                break e.clone();
            }
            assert!(
                t0.elapsed() < bound,
                "no alarm {what:?} within {bound:?}: {events:?}"
            );
            thread::sleep(Duration::from_millis(100));
        }
    };
    let alarm = wait_alarm("backends while their direct probes pass");
    eprintln!("[{p}] alarm: {}", alarm.reason);
    thread::sleep(bound);
    let status = run.status().unwrap();
    for i in 1..=run.backend_count() {
        let addr = vip.backend_addr(i);
        let b = status.backend("api", addr).unwrap();
        eprintln!("[{p}] {addr}: {} in table {}", b.state, b.in_table);
        assert!(b.in_table, "backend {addr} out of the table: {b:?}");
    }
    nft("delete table inet xlbt_spf");
    let cleared = wait_alarm("data-path probes pass again");
    eprintln!("[{p}] cleared: {}", cleared.reason);
    run.wait_all_up(bound)
        .unwrap_or_else(|e| panic!("after the path came back: {e}"));
    let events = run.events().unwrap();
    let out: Vec<_> = exits(&events, "api")
        .into_iter()
        .filter(|e| e.at_unix_ms >= broken_at)
        .collect();
    assert!(out.is_empty(), "backends taken out: {out:?}");
    let report = client.join().unwrap();
    assert_eq!(
        report.summary.failures,
        0,
        "clients noticed: {:?}",
        failure_slices(&report)
    );
    teardown(run);
}
