//! Passive detection in NAT mode: seed 000 (one backend hangs; its clients'
//! own unanswered requests take it out long before the next probe) and
//! seed 003 (every backend slower than `response_timeout` together:
//! nobody is ejected, nothing fails).

use std::{thread, time::Duration};

use xlb_lab::{
    Fault,
    client::LoadOptions,
    evidence_attack::{self, AttackOptions, AttackReport},
    scenario::{Health, LabRun, Status},
    topology::in_netns,
};
use xlb_tests::{
    lab::{
        MAP_UPDATE_MARGIN_MS, answered_by, cascade, failure_slices, now_unix_ms, serial, teardown,
        transitions, wait_client_ms,
    },
    nat_lab::{NatConfig, NatLabOptions, NatVip},
};

use super::{assert_stayed_up, prefix, up};

/// `passive.response_timeout` of these tests: the lab's backends answer
/// in about a millisecond, so a quarter second unanswered is a hang.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(250);

/// Seed 000's promise: out within this long of its first unanswered
/// requests (those sent as it hung, unanswered `RESPONSE_TIMEOUT` later).
const PASSIVE_BOUND: Duration = Duration::from_secs(1);

/// Active probes every 10 s (seed 000's setting): a probe cannot be what
/// finds the hang within the bound. Rise 1, so the lab comes up after one
/// probe round rather than two 10 s periods.
fn slow_probes() -> Health {
    Health {
        interval: Duration::from_secs(10),
        timeout: Duration::from_secs(1),
        rise: 1,
        fall: 3,
        ..Health::default()
    }
}

fn config(p: &str, health: Health) -> NatConfig {
    let mut cfg = NatConfig::for_prefix(p);
    cfg.base.health = health;
    cfg.passive = Some(format!(
        "response_timeout = \"{}ms\"\n",
        RESPONSE_TIMEOUT.as_millis()
    ));
    cfg
}

/// Polls `status` every 250 ms until `client` finishes, checking `f` on
/// each.
fn watch(run: &LabRun, client: &xlb_lab::scenario::ClientRun, mut f: impl FnMut(&Status)) {
    while !client.is_finished() {
        f(&run.status().unwrap());
        thread::sleep(cascade::POLL);
    }
}

/// Seed 000 in NAT mode: under steady client load, b2's application hangs
/// (accepts, never answers). Its clients' unanswered requests take it out
/// within a second of the first of them going unanswered, by passive
/// evidence (the event's reason says so), long before the next 10 s probe;
/// fewer than 1 % of all requests fail, and b2 gets no request afterwards.
#[test]
fn seed_000_hung_backend_is_out_by_passive_evidence() {
    let _serial = serial();
    let p = prefix("s000");
    let mut cfg = config(&p, slow_probes());
    // A 1 s window: 20 % of it (the default failure_threshold) is 200 ms of
    // unanswered requests, which leaves the bound room for a loaded
    // machine's scheduling (with the default 2 s window: 0.9–1.3 s seen).
    if let Some(passive) = &mut cfg.passive {
        passive.push_str("window = \"1s\"\n");
    }
    let vip: NatVip = cfg.vips[0].clone();
    let b2 = vip.backend_addr(2);
    let run = up(&p, &cfg, NatLabOptions::default());
    // Many clients, as in seed 000: a verdict needs failing flows from
    // `min_sources` (3) client prefixes.
    let sources = run.lab().add_client_sources(8).unwrap();
    let load = LoadOptions {
        sources,
        duration: Duration::from_secs(30),
        rate: 100,
        keepalive: 6,
        keepalive_interval: Duration::from_millis(50),
        timeout: Duration::from_secs(1),
        slice: Duration::from_millis(100),
        ..LoadOptions::new(vip.target())
    };
    let client = run.start_client(load).unwrap();
    wait_client_ms(&client, 5000);
    run.set_fault(2, Fault::Hang).unwrap();
    let hang_unix = now_unix_ms();
    let hang_ms = client.timeline_ms(hang_unix);
    run.wait_backend_state(
        &vip.name,
        b2,
        "down",
        RESPONSE_TIMEOUT + PASSIVE_BOUND + Duration::from_secs(3),
    )
    .unwrap_or_else(|e| panic!("b2 was not taken out: {e}"));
    let events = run.events().unwrap();
    let down = transitions(&events, &vip.name, b2)
        .into_iter()
        .find(|e| e.to.as_deref() != Some("up"))
        .cloned()
        .unwrap_or_else(|| panic!("no transition of {b2} out of up: {events:?}"));
    let detection = Duration::from_millis(down.at_unix_ms.saturating_sub(hang_unix));
    let detect_ms = client.timeline_ms(down.at_unix_ms);
    eprintln!(
        "[{p}] b2 hung at {hang_ms} ms; {} at {detect_ms} ms ({} ms later): {}",
        down.to.as_deref().unwrap_or("?"),
        detection.as_millis(),
        down.reason
    );
    assert!(
        down.reason.starts_with("passive"),
        "b2 was taken out, but not by passive evidence: {down:?}"
    );
    assert!(
        detection <= RESPONSE_TIMEOUT + PASSIVE_BOUND,
        "b2 out {detection:?} after the hang; its first requests went unanswered \
         {RESPONSE_TIMEOUT:?} after it, and the bound is {PASSIVE_BOUND:?} from there"
    );
    let report = client.join().unwrap();
    eprintln!("{}", report.render_text());
    let (failures, requests) = (report.summary.failures, report.summary.requests);
    eprintln!(
        "[{p}] failures {failures} of {requests} requests ({:.2} %), by slice: {:?}",
        100.0 * failures as f64 / requests.max(1) as f64,
        failure_slices(&report)
    );
    assert!(requests > 3000, "too little load: {requests} requests");
    assert!(
        failures * 100 < requests,
        "{failures} of {requests} requests failed: 1 % or more"
    );
    assert!(
        answered_by(&report, "b2", 0, hang_ms) > 0,
        "b2 answered nothing before the hang"
    );
    assert_eq!(
        answered_by(&report, "b2", detect_ms + MAP_UPDATE_MARGIN_MS, i64::MAX),
        0,
        "b2 answered after it was taken out"
    );
    assert_stayed_up(&events, &vip, [1, 3]);
    teardown(run);
}

/// Seed 003 in NAT mode: every backend answers 600 ms late (beyond
/// `passive.response_timeout`, within the probes' timeout) for 7 s under
/// new connections. Slow together is load, not failure: nobody leaves,
/// no request fails.
#[test]
fn seed_003_slow_fleet_is_not_ejected() {
    let _serial = serial();
    let p = prefix("s003");
    let health = Health {
        interval: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
        ..Health::default()
    };
    let cfg = config(&p, health);
    let vip = cfg.vips[0].clone();
    let run = up(&p, &cfg, NatLabOptions::default());
    let slow = Fault::Slow { ms: 600 };
    let client = run
        .start_client(cascade::seed_load(vip.target(), Duration::from_secs(13)))
        .unwrap();
    let (mut slowed, mut recovered, mut polls) = (false, false, 0);
    watch(&run, &client, |s| {
        let t = client.elapsed().as_millis();
        if !slowed && t >= 3000 {
            cascade::set_all(&run, slow);
            eprintln!("[{p}] every backend 600 ms late at {t} ms");
            slowed = true;
        }
        if slowed && !recovered && t >= 10_000 {
            cascade::set_all(&run, Fault::None);
            eprintln!("[{p}] back to normal at {t} ms");
            recovered = true;
        }
        assert!(
            s.all_up(),
            "a backend left while the fleet was slow: {}",
            s.summary()
        );
        polls += 1;
    });
    assert!(
        slowed && recovered,
        "the load ended before the slowdown did"
    );
    let report = client.join().unwrap();
    let events = run.events().unwrap();
    eprintln!("{}", report.render_text());
    let (slow_latency, slow_requests) = report.latency_where(|s| (4000..9000).contains(&s.t_ms));
    eprintln!(
        "[{p}] {polls} polls, all up; {} requests, {} failed; while slow: {slow_requests} \
         requests, p50 {:.0} ms",
        report.summary.requests, report.summary.failures, slow_latency.p50_ms
    );
    assert_eq!(report.summary.failures, 0, "{}", report.render_text());
    assert!(
        slow_requests > 0 && slow_latency.p50_ms >= 600.0,
        "requests were not slow while the fleet was (p50 {:.0} ms of {slow_requests}): the fault did not take",
        slow_latency.p50_ms
    );
    assert_stayed_up(&events, &vip, 1..=3);
    teardown(run);
}

/// Issue 38: one client (one address) makes passive evidence against b1
/// for 30 s, then b2 for 30 s, with the passive defaults: it learns which
/// of 240 source ports reach each (one full request each), then sends 10
/// half requests a second on them (headers never finished, held 3 s past
/// the 1 s `response_timeout`, then reset). Before `min_sources`, b1 went
/// down on its evidence again and again, then b2. Now the counters say
/// failing (the test sees `few_sources`, so the attack did make its
/// evidence), the verdict does not stand, nobody leaves, and a good
/// client loses nothing.
#[test]
fn one_client_cannot_eject_backends_with_its_own_failures() {
    let _serial = serial();
    let p = prefix("p1c");
    let mut cfg = NatConfig::for_prefix(&p);
    cfg.base.health = slow_probes();
    let vip: NatVip = cfg.vips[0].clone();
    let run = up(&p, &cfg, NatLabOptions::default());
    let attacker = run.lab().add_client_sources(1).unwrap()[0];
    let opts = AttackOptions {
        target: vip.target(),
        source: attacker,
        rate: 10,
        hold: Duration::from_secs(3),
    };
    let ns = run.lab().ns_client();
    let learnt = {
        let opts = opts.clone();
        in_netns(&ns, move || evidence_attack::learn(&opts, 40_000..40_240)).unwrap()
    };
    eprintln!(
        "[{p}] source ports by backend: {:?}",
        learnt.iter().map(|(b, v)| (b, v.len())).collect::<Vec<_>>()
    );
    let good = run
        .start_client(LoadOptions {
            duration: Duration::from_secs(62),
            rate: 30,
            keepalive: 0,
            timeout: Duration::from_secs(2),
            slice: Duration::from_secs(1),
            ..LoadOptions::new(vip.target())
        })
        .unwrap();
    let attack = thread::spawn(move || {
        let mut total = AttackReport::default();
        for b in ["b1", "b2"] {
            let ports = learnt.get(b).cloned().unwrap_or_default();
            assert!(ports.len() >= 40, "{b}: only {} source ports", ports.len());
            let (opts, ports) = (opts.clone(), ports.clone());
            let r = in_netns(&ns, move || {
                evidence_attack::attack(&opts, &ports, Duration::from_secs(30))
            })
            .unwrap();
            total.held += r.held;
            total.failed += r.failed;
        }
        total
    });
    let mut few_sources = Vec::new();
    while !attack.is_finished() {
        let s = run.status().unwrap();
        for v in s.vips.iter().filter(|v| v.name == vip.name) {
            for b in &v.backends {
                if let Some(ps) = b.passive.as_ref().filter(|ps| ps.verdict == "few_sources") {
                    few_sources.push((b.address.clone(), ps.sources.clone()));
                }
            }
        }
        thread::sleep(cascade::POLL);
    }
    let attacked = attack.join().unwrap();
    let report = good.join().unwrap();
    eprintln!(
        "[{p}] attack: {attacked:?}; few_sources seen {} times, e.g. {:?}",
        few_sources.len(),
        few_sources.first()
    );
    eprintln!("{}", report.render_text());
    assert!(attacked.held >= 500, "the attack ran short: {attacked:?}");
    assert!(
        !few_sources.is_empty(),
        "the counters never said failing: the attack made no evidence, so this proves nothing"
    );
    let events = run.events().unwrap();
    assert_stayed_up(&events, &vip, [1, 2, 3]);
    let (failures, requests) = (report.summary.failures, report.summary.requests);
    assert!(requests > 1500, "too little load: {requests} requests");
    assert!(
        failures * 100 <= requests,
        "the good client lost {failures} of {requests} requests"
    );
    teardown(run);
}
