//! Passive evidence, judged against the VIP: a backend whose real traffic
//! fails while its peers' succeeds (`health::passive`) is taken out at
//! once, `down` with the evidence as its reason, before its next probe.
//! Like a slow outlier it is judged against its peers, so it shares
//! `max_ejected` with them; panic (`min_healthy`) may put it back, and
//! every exit counts toward flap damping like any other.

use super::{Member, MemberState, Placement, Policy};

/// Takes out, within `max_ejected`, the members placed `Serving` that
/// passive evidence stands against: those already out for it keep their
/// place in the budget, then the others in VIP order. Members held down by
/// flap damping take their places first (issue 38): evidence is made by
/// clients, and one client that got a backend ejected until it was held
/// down must not go on to the next with a budget that no longer counts
/// the first. Returns how many places of the budget it used.
pub(super) fn eject_passive(
    policy: &Policy,
    members: &[Member],
    states: &[MemberState],
    next: &mut [(Placement, Option<String>)],
) -> usize {
    let eligible = members.iter().filter(|m| m.eligible()).count();
    let held = next
        .iter()
        .filter(|(p, _)| *p == Placement::HeldDown)
        .count();
    let budget = policy.max_ejected.max_of(eligible).saturating_sub(held);
    let mut out: Vec<(bool, usize)> = (0..members.len())
        .filter(|&i| next[i].0 == Placement::Serving && members[i].passive.is_some())
        .map(|i| (states[i].placement.in_table(), i))
        .collect();
    // Already out first (false < true), then in VIP order.
    out.sort();
    let mut used = 0;
    for (_, i) in out.into_iter().take(budget) {
        next[i] = (Placement::Down, members[i].passive.clone());
        used += 1;
    }
    used
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::{Change, Limit, VipState, evaluate};
    use super::*;
    use crate::config::PassiveConfig;
    use crate::health::machine::{HealthMachine, HealthState};
    use crate::health::passive::{History, PassiveStats, SAMPLE_PERIOD, Verdict, Window, judge};
    use crate::health::probe::{ProbeClass, ProbeOk, ProbeResult};
    use crate::health::spec::CheckSpec;
    use crate::health::testutil::http_spec;

    fn spec() -> CheckSpec {
        http_spec(80, Duration::from_secs(1))
    }

    fn ok() -> ProbeResult {
        ProbeResult {
            outcome: Ok(ProbeOk { status: Some(200) }),
            latency: Duration::from_millis(3),
            path_fault: None,
        }
    }

    /// Backend `i` of a VIP whose probes all pass, with `passive` evidence.
    fn member(i: usize, passive: Option<&str>) -> Member {
        let mut m = HealthMachine::adopted(HealthState::Up, 2, 3, Instant::now());
        if let Some(why) = passive {
            m.observe_passive(why.to_owned());
        }
        let snap = m.snapshot();
        Member::from_snapshot(
            format!("10.0.0.{}:80", 11 + i),
            1,
            false,
            HealthState::Up,
            &spec(),
            Some(&snap),
        )
    }

    /// Issue 38: one client got b1 ejected over and over until flap
    /// damping held it down; the held-down backend still takes its place in
    /// `max_ejected`, so the client cannot go on to b2 with the budget.
    #[test]
    fn a_held_down_backend_takes_its_place_in_the_passive_budget() {
        let policy = Policy {
            max_ejected: Limit::Count(1),
            ..Policy::default()
        };
        let members: Vec<Member> = (0..4)
            .map(|i| member(i, (i == 1).then_some("passive: 13 of 43 unanswered")))
            .collect();
        let t0 = Instant::now();
        let states: Vec<MemberState> = (0..4)
            .map(|_| MemberState::new(Placement::Serving, t0))
            .collect();
        let mut next: Vec<(Placement, Option<String>)> = vec![(Placement::Serving, None); 4];
        next[0] = (Placement::HeldDown, Some("held down".to_owned()));
        assert_eq!(eject_passive(&policy, &members, &states, &mut next), 0);
        assert_eq!(next[1].0, Placement::Serving, "b2 ejected past the budget");
        // Without the held-down one, b2 goes.
        next[0] = (Placement::Serving, None);
        assert_eq!(eject_passive(&policy, &members, &states, &mut next), 1);
        assert_eq!(next[1].0, Placement::Down);
    }

    /// Counters of a backend taking 100 requests a second (one connection
    /// each), answered in 10 ms until `hung_at` (ms), never after.
    fn counters(t_ms: u64, hung_at: Option<u64>) -> PassiveStats {
        let requests = t_ms / 10;
        let answered_until = hung_at.map_or(t_ms, |h| h.min(t_ms));
        PassiveStats {
            connects: requests,
            connected: requests,
            requests,
            responses: answered_until.saturating_sub(10) / 10,
            ..PassiveStats::default()
        }
    }

    /// The daemon's loop in miniature: samples every 100 ms, judges each
    /// backend against its peers, feeds failing verdicts to the machines
    /// and runs the VIP policy. The changes, each with its time (ms).
    fn run(hung_at: &[Option<u64>], until_ms: u64, policy: &Policy) -> Vec<(u64, Change)> {
        let cfg = PassiveConfig::default();
        let th = cfg.thresholds();
        let t0 = Instant::now();
        let n = hung_at.len();
        let mut hist = vec![History::new(); n];
        let mut machines: Vec<HealthMachine> = (0..n)
            .map(|_| HealthMachine::adopted(HealthState::Up, 2, 3, t0))
            .collect();
        let mut states: Vec<MemberState> = (0..n)
            .map(|_| MemberState::new(Placement::Serving, t0))
            .collect();
        let mut vip = VipState::default();
        let mut changes = Vec::new();
        let step = SAMPLE_PERIOD.as_millis() as u64;
        for t in (0..=until_ms).step_by(step as usize) {
            let now = t0 + Duration::from_millis(t);
            let windows: Vec<Window> = (0..n)
                .map(|i| {
                    hist[i].push(now, counters(t, hung_at[i]), cfg.history());
                    hist[i].window(now, &th)
                })
                .collect();
            for (i, v) in judge(&windows, &th).into_iter().enumerate() {
                if let Verdict::Failing(why) = v {
                    machines[i].observe_passive(why);
                    hist[i].restart();
                }
            }
            let members: Vec<Member> = machines
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let s = m.snapshot();
                    Member::from_snapshot(format!("b{i}"), 1, false, s.state, &spec(), Some(&s))
                })
                .collect();
            let out = evaluate(policy, &members, &mut states, &mut vip, now);
            changes.extend(out.changes.into_iter().map(|c| (t, c)));
        }
        // Two probes pass on every backend: passive evidence yields to them.
        for (k, m) in machines.iter_mut().enumerate() {
            let at = t0 + Duration::from_millis(until_ms + 1000 * (k as u64 + 1));
            m.observe(&ok(), &ProbeClass::Ok, false, at);
            m.observe(&ok(), &ProbeClass::Ok, false, at + Duration::from_secs(1));
        }
        let members: Vec<Member> = machines
            .iter()
            .map(|m| {
                let s = m.snapshot();
                Member::from_snapshot("b".into(), 1, false, s.state, &spec(), Some(&s))
            })
            .collect();
        let now = t0 + Duration::from_millis(until_ms + 10_000);
        let out = evaluate(policy, &members, &mut states, &mut vip, now);
        changes.extend(out.changes.into_iter().map(|c| (until_ms + 10_000, c)));
        changes
    }

    #[test]
    fn a_hung_backend_is_out_at_once_with_its_reason_and_probes_bring_it_back() {
        let policy = Policy::default();
        let changes = run(&[None, Some(3000), None, None], 6000, &policy);
        let [(t, out), (_, back)] = changes.as_slice() else {
            panic!("{changes:?}")
        };
        let Change::Placement {
            member: 1,
            from: Placement::Serving,
            to: Placement::Down,
            reason,
        } = out
        else {
            panic!("{out:?}")
        };
        assert!(reason.starts_with("passive: "), "{reason}");
        assert!(
            reason.ends_with("in the last 2s; peers answered 100%"),
            "{reason}"
        );
        // Its first requests were due 1 s after it hung: out within 1 s of that.
        assert!(*t > 4000 && *t <= 5000, "out at {t} ms");
        assert!(
            matches!(back, Change::Placement { member: 1, from: Placement::Down, to: Placement::Serving, reason } if reason == "passed 2 consecutive checks"),
            "{back:?}"
        );
    }

    #[test]
    fn a_fleet_failing_together_ejects_nobody() {
        let changes = run(&[Some(3000); 4], 8000, &Policy::default());
        assert!(changes.is_empty(), "{changes:?}");
    }

    #[test]
    fn min_healthy_keeps_the_last_backend() {
        let policy = Policy::default();
        let mut down = member(0, None);
        down.health = HealthState::Down;
        down.last_fail = Some(("connection_refused", "connection refused".into()));
        let members = vec![
            down,
            member(1, Some("passive: 20 of 20 requests unanswered")),
        ];
        let now = Instant::now();
        let mut states = vec![MemberState::new(Placement::Serving, now); 2];
        let mut vip = VipState::default();
        evaluate(&policy, &members, &mut states, &mut vip, now);
        assert_eq!(states[0].placement, Placement::Down);
        assert_eq!(states[1].placement, Placement::PanicRestored);
        let why = states[1].reason.as_deref().unwrap_or_default();
        assert!(why.contains("although passive: 20 of 20"), "{why}");
        assert!(vip.panic.is_some());
    }

    #[test]
    fn max_ejected_caps_passive_and_slow_ejections_together() {
        let why = Some("passive: 30 of 30 requests unanswered");
        let mut members: Vec<Member> = (0..10).map(|i| member(i, None)).collect();
        for i in [2, 5, 7] {
            members[i] = member(i, why);
        }
        let mut slow = member(9, None);
        slow.consecutive_slow = slow.fall;
        slow.latency = Some(Duration::from_secs(2));
        for m in members.iter_mut().take(9) {
            m.latency = Some(Duration::from_millis(2));
        }
        members[9] = slow;
        let now = Instant::now();
        let out = |max: Limit| {
            let policy = Policy {
                max_ejected: max,
                ..Policy::default()
            };
            let mut states = vec![MemberState::new(Placement::Serving, now); 10];
            evaluate(
                &policy,
                &members,
                &mut states,
                &mut VipState::default(),
                now,
            );
            states.iter().map(|s| s.placement).collect::<Vec<_>>()
        };
        // 10 % of 10: one place, taken by the first passive one; the slow
        // outlier finds none left.
        let one = out(Limit::Percent(10.0));
        let down: Vec<usize> = (0..10).filter(|&i| one[i] != Placement::Serving).collect();
        assert_eq!(down, [2]);
        let four = out(Limit::Count(4));
        assert_eq!(
            (four[2], four[5], four[7], four[9]),
            (
                Placement::Down,
                Placement::Down,
                Placement::Down,
                Placement::EjectedSlow
            )
        );
    }

    #[test]
    fn passive_evidence_restarts_the_rise_streak_and_probes_come_faster() {
        let spec = spec();
        let t0 = Instant::now();
        let mut m = HealthMachine::adopted(HealthState::Up, 2, 3, t0);
        m.observe(&ok(), &ProbeClass::Ok, false, t0);
        m.observe(&ok(), &ProbeClass::Ok, false, t0 + Duration::from_secs(2));
        assert_eq!(m.period(&spec), spec.interval);
        assert!(m.observe_passive("passive: x".into()));
        assert!(!m.observe_passive("passive: y".into()), "already standing");
        assert_eq!(m.consecutive_ok(), 0);
        assert_eq!(m.period(&spec), spec.fast_interval);
        m.observe(&ok(), &ProbeClass::Ok, false, t0 + Duration::from_secs(3));
        assert_eq!(m.snapshot().passive.as_deref(), Some("passive: y"));
        m.observe(&ok(), &ProbeClass::Ok, false, t0 + Duration::from_secs(4));
        assert_eq!(m.snapshot().passive, None);
        assert_eq!(m.state(), HealthState::Up);
    }
}
