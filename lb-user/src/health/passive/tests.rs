//! The estimator on simulated traffic: counters computed from a stream of
//! requests (one connection each) with known outcomes, sampled every
//! 100 ms as the daemon samples them.

use std::time::{Duration, Instant};

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn th() -> Thresholds {
    Thresholds {
        window: ms(2000),
        response_timeout: ms(1000),
        connect_timeout: ms(1000),
        min_requests: 10,
        failure_threshold: 0.2,
        peer_factor: 5.0,
    }
}

/// One backend's traffic: `rate` new connections a second, each sending
/// one request answered after `latency`, until `hang_at` (requests whose
/// answer would come later get none; the client gives up after `give_up`,
/// which the data plane counts as unanswered).
#[derive(Clone, Copy)]
struct Sim {
    rate: f64,
    latency: Duration,
    hang_at: Option<Duration>,
    /// No SYN-ACK at all from this time.
    dead_at: Option<Duration>,
    give_up: Duration,
}

impl Sim {
    fn healthy(rate: f64, latency: Duration) -> Self {
        Self {
            rate,
            latency,
            hang_at: None,
            dead_at: None,
            give_up: ms(5000),
        }
    }

    fn hung_at(self, at: Duration) -> Self {
        Self {
            hang_at: Some(at),
            ..self
        }
    }

    fn dead_at(self, at: Duration) -> Self {
        Self {
            dead_at: Some(at),
            ..self
        }
    }

    /// The counters as of `t` since the start.
    fn counters(&self, t: Duration, response_timeout: Duration) -> PassiveStats {
        let mut c = PassiveStats::default();
        let step = Duration::from_secs_f64(1.0 / self.rate);
        let mut s = Duration::ZERO;
        while s <= t {
            c.connects += 1;
            let dead = self.dead_at.is_some_and(|d| s >= d);
            if dead {
                s += step;
                continue;
            }
            let syn_ack = s + ms(1);
            if syn_ack <= t {
                c.connected += 1;
                c.requests += 1;
                let answer = s + self.latency;
                let answered = self.hang_at.is_none_or(|h| answer < h);
                if answered && answer <= t {
                    c.responses += 1;
                    c.response_ns += self.latency.as_nanos() as u64;
                } else if !answered && s + self.give_up <= t {
                    if self.give_up >= response_timeout {
                        c.unanswered += 1;
                    } else {
                        c.abandoned += 1;
                    }
                }
            }
            s += step;
        }
        c
    }
}

/// Feeds `sims` sampled every 100 ms up to `until`; the histories.
fn run(sims: &[Sim], until: Duration, base: Instant) -> Vec<History> {
    let th = th();
    let keep = th.window + th.response_timeout + SAMPLE_PERIOD;
    let mut hs: Vec<History> = sims.iter().map(|_| History::new()).collect();
    let mut t = Duration::ZERO;
    while t <= until {
        for (h, sim) in hs.iter_mut().zip(sims) {
            h.push(base + t, sim.counters(t, th.response_timeout), keep);
        }
        t += SAMPLE_PERIOD;
    }
    hs
}

fn verdicts(hs: &[History], now: Instant) -> Vec<Verdict> {
    let windows: Vec<Window> = hs.iter().map(|h| h.window(now, &th())).collect();
    judge(&windows, &th())
}

fn failing(v: &Verdict) -> bool {
    matches!(v, Verdict::Failing(_))
}

#[test]
fn a_healthy_backend_under_load_answers_everything() {
    let base = Instant::now();
    let sims = [Sim::healthy(200.0, ms(5)); 4];
    let hs = run(&sims, ms(6000), base);
    let w = hs[0].window(base + ms(6000), &th());
    assert!(w.requests_due >= 390 && w.requests_due <= 410, "{w:?}");
    assert_eq!((w.unanswered, w.connect_failures), (0, 0), "{w:?}");
    assert_eq!(w.mean_response, Some(ms(5)));
    assert!(
        verdicts(&hs, base + ms(6000))
            .iter()
            .all(|v| *v == Verdict::Healthy)
    );
}

#[test]
fn a_hung_backend_is_failing_within_a_second_of_its_first_unanswered_request() {
    let base = Instant::now();
    let hang = ms(5000);
    let mut sims = [Sim::healthy(100.0, ms(10)); 4];
    sims[1] = sims[1].hung_at(hang);
    // Not before its first requests are T old: nothing is unanswered yet.
    let first_unanswered = hang + th().response_timeout;
    let hs = run(&sims, first_unanswered - SAMPLE_PERIOD, base);
    let v = verdicts(&hs, base + first_unanswered - SAMPLE_PERIOD);
    assert!(!v.iter().any(failing), "{v:?}");
    let at = first_unanswered + ms(600);
    let hs = run(&sims, at, base);
    let v = verdicts(&hs, base + at);
    let Verdict::Failing(why) = &v[1] else {
        panic!("the hung backend is not failing: {v:?}")
    };
    assert!(
        why.starts_with("passive: ")
            && why.contains("requests unanswered within 1s in the last 2s; peers answered 100%"),
        "{why}"
    );
    assert!([0, 2, 3].iter().all(|&i| v[i] == Verdict::Healthy), "{v:?}");
}

#[test]
fn a_fleet_slow_together_or_hung_together_ejects_nobody() {
    let base = Instant::now();
    // Slower than response_timeout, answering within the window: answered.
    let slow = [Sim::healthy(100.0, ms(1500)); 4];
    let hs = run(&slow, ms(8000), base);
    let v = verdicts(&hs, base + ms(8000));
    assert!(!v.iter().any(failing), "{v:?}");
    // Every backend stops answering at once (seed 003 at its worst).
    let hung = [Sim::healthy(100.0, ms(10)).hung_at(ms(4000)); 4];
    let hs = run(&hung, ms(8000), base);
    let v = verdicts(&hs, base + ms(8000));
    assert!(v.iter().all(|v| *v == Verdict::FailingWithPeers), "{v:?}");
}

#[test]
fn evidence_from_fewer_than_min_requests_is_ignored() {
    let base = Instant::now();
    // Two a second: 4 requests and 4 connections in a 2 s window.
    let mut sims = [Sim::healthy(2.0, ms(10)); 3];
    sims[0] = sims[0].hung_at(ms(2000));
    let hs = run(&sims, ms(8000), base);
    let v = verdicts(&hs, base + ms(8000));
    assert_eq!(v[0], Verdict::TooFew);
    assert!(hs[0].window(base + ms(8000), &th()).unanswered > 0);
}

#[test]
fn a_backend_alone_has_no_peers_to_compare_with() {
    let base = Instant::now();
    let sims = [Sim::healthy(100.0, ms(10)).hung_at(ms(3000))];
    let hs = run(&sims, ms(6000), base);
    assert_eq!(verdicts(&hs, base + ms(6000)), vec![Verdict::NoPeers]);
}

#[test]
fn connections_that_get_no_syn_ack_fail() {
    let base = Instant::now();
    let mut sims = [Sim::healthy(100.0, ms(10)); 3];
    sims[2] = sims[2].dead_at(ms(3000));
    let hs = run(&sims, ms(6000), base);
    let v = verdicts(&hs, base + ms(6000));
    let Verdict::Failing(why) = &v[2] else {
        panic!("{v:?}")
    };
    assert!(
        why.contains("of 200 connections not accepted within 1s"),
        "{why}"
    );
}

#[test]
fn a_recycled_id_starts_with_no_evidence() {
    let base = Instant::now();
    let mut sims = [Sim::healthy(100.0, ms(10)); 3];
    sims[0] = sims[0].hung_at(ms(2000));
    let mut hs = run(&sims, ms(5000), base);
    assert!(failing(&verdicts(&hs, base + ms(5000))[0]));
    // The id now names another backend: what its predecessor did is gone.
    hs[0].restart();
    let w = hs[0].window(base + ms(5000), &th());
    assert_eq!(w, Window::default());
    assert_eq!(verdicts(&hs, base + ms(5000))[0], Verdict::TooFew);
}

#[test]
fn counters_that_go_back_restart_the_history() {
    let base = Instant::now();
    let th = th();
    let keep = th.window + th.response_timeout;
    let mut h = History::new();
    let busy = PassiveStats {
        connects: 5000,
        connected: 5000,
        requests: 5000,
        responses: 4000,
        ..PassiveStats::default()
    };
    assert!(h.push(base, busy, keep));
    // A new program (maps made anew after a restart): counters from 0.
    let fresh = PassiveStats {
        requests: 3,
        responses: 3,
        connects: 3,
        connected: 3,
        ..PassiveStats::default()
    };
    assert!(!h.push(base + ms(100), fresh, keep));
    assert_eq!(h.totals(), Some(&fresh));
    let w = h.window(base + ms(3200), &th);
    assert_eq!((w.requests_due, w.unanswered), (0, 0), "{w:?}");
}

#[test]
fn old_samples_are_forgotten_but_the_window_start_is_kept() {
    let base = Instant::now();
    let keep = ms(3000);
    let mut h = History::new();
    for i in 0..100u64 {
        let c = PassiveStats {
            requests: i,
            ..PassiveStats::default()
        };
        h.push(base + SAMPLE_PERIOD * i as u32, c, keep);
    }
    // 9.9 s: samples from 6.9 s on, and the one at 6.9 s itself.
    assert_eq!(h.samples.len(), 31);
    assert_eq!(h.samples.front().map(|(_, c)| c.requests), Some(69));
}

#[test]
fn the_reason_says_what_failed_and_what_the_peers_did() {
    let own = Window {
        requests_due: 14,
        unanswered: 12,
        ..Window::default()
    };
    let peer = Window {
        requests_due: 50,
        unanswered: 1,
        ..Window::default()
    };
    let v = judge(&[own, peer, peer], &th());
    assert_eq!(
        v[0],
        Verdict::Failing(
            "passive: 12 of 14 requests unanswered within 1s in the last 2s; peers answered 98%"
                .to_owned()
        )
    );
    let resets = Window {
        requests_due: 20,
        reset_requests: 9,
        connects_due: 20,
        connect_failures: 3,
        ..Window::default()
    };
    let Verdict::Failing(why) = &judge(&[resets, peer, peer], &th())[0] else {
        panic!()
    };
    assert_eq!(
        why,
        "passive: 9 of 20 requests reset by the backend in the last 2s; peers answered 98%"
    );
}

#[test]
fn judged_leaves_abandoned_requests_out() {
    let w = Window {
        requests_due: 30,
        abandoned: 10,
        unanswered: 5,
        connects_due: 30,
        connect_failures: 1,
        ..Window::default()
    };
    assert_eq!((w.judged(), w.failed()), (50, 6));
}

#[test]
fn a_backend_ahead_of_a_fleet_slowing_down_is_not_an_outlier() {
    // Seed 003 in the lab: the fleet slowed beyond response_timeout one
    // backend after another; the first to cross it showed 10 of 28
    // unanswered while its peers already failed 7 % of theirs.
    let first = Window {
        requests_due: 28,
        unanswered: 10,
        ..Window::default()
    };
    let peer = Window {
        requests_due: 28,
        unanswered: 2,
        ..Window::default()
    };
    let v = judge(&[first, peer, peer], &th());
    assert_eq!(v[0], Verdict::FailingWithPeers);
    // The same backend hung among peers that answer: failing.
    let answering = Window {
        requests_due: 28,
        ..Window::default()
    };
    assert!(failing(&judge(&[first, answering, answering], &th())[0]));
}
