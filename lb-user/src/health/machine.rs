//! The per-backend health state machine: pure, no I/O, no clock of its own
//! (every time is passed in), so it is tested with a mocked clock.
//!
//! Hysteresis as in HAProxy: one failed probe does not take a backend down,
//! `fall` consecutive failures do; `rise` consecutive successes bring it back.
//! A new backend is `Unknown` and takes no new flows until a probe passes.

use std::fmt;
use std::time::{Duration, Instant};

use rand::Rng;

use super::probe::ProbeResult;
use super::spec::CheckSpec;

/// The health of a backend as probes see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HealthState {
    /// Not probed yet (new backend): takes no new flows. The first probe
    /// decides: success → `Up`, failure → `Down`.
    Unknown,
    Up,
    Down,
}

impl HealthState {
    /// Lowercase name, for logs, JSON and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Up => "up",
            Self::Down => "down",
        }
    }
}

impl fmt::Display for HealthState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A change of health state, with the reason shown to operators: the probe's
/// failure text, or "passed N consecutive checks".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub from: HealthState,
    pub to: HealthState,
    pub reason: String,
}

/// Everything known about one backend's health, as shown by the CLI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthSnapshot {
    pub state: HealthState,
    /// Drained by an operator: takes no new flows whatever `state` says.
    pub admin_drained: bool,
    /// Whether the data plane should send new flows here: `Up` and not drained.
    pub serving: bool,
    pub consecutive_ok: u32,
    pub consecutive_fail: u32,
    /// When `state` was entered (or adopted, or the backend added).
    pub since: Instant,
    /// Why the last transition happened; `None` before the first one.
    pub last_transition_reason: Option<String>,
    pub last_result: Option<ProbeResult>,
    pub last_probe_at: Option<Instant>,
}

/// Reason recorded for a state taken over from a previous daemon run.
pub const ADOPTED_REASON: &str = "adopted from the previous run";

#[derive(Clone, Debug)]
pub struct HealthMachine {
    state: HealthState,
    /// Consecutive successes that take `Down` to `Up` (at least 1).
    rise: u32,
    /// Consecutive failures that take `Up` to `Down` (at least 1).
    fall: u32,
    consecutive_ok: u32,
    consecutive_fail: u32,
    since: Instant,
    last_transition_reason: Option<String>,
    last_result: Option<ProbeResult>,
    last_probe_at: Option<Instant>,
    admin_drained: bool,
}

impl HealthMachine {
    /// A new backend: `Unknown` until its first probe.
    pub fn new(rise: u32, fall: u32, now: Instant) -> Self {
        Self::adopted(HealthState::Unknown, rise, fall, now)
    }

    /// Starts from a state known before (e.g. read back from the data plane
    /// after a daemon restart): it stands until probes say otherwise, so an
    /// adopted `Up` needs `fall` failures to go down, not one.
    pub fn adopted(state: HealthState, rise: u32, fall: u32, now: Instant) -> Self {
        Self {
            state,
            // 0 would mean "transition without evidence"; config rejects it,
            // and this keeps the machine sane if it slips through.
            rise: rise.max(1),
            fall: fall.max(1),
            consecutive_ok: 0,
            consecutive_fail: 0,
            since: now,
            last_transition_reason: (state != HealthState::Unknown)
                .then(|| ADOPTED_REASON.to_owned()),
            last_result: None,
            last_probe_at: None,
            admin_drained: false,
        }
    }

    /// New thresholds (the spec changed). Streaks are kept: a `Down` backend
    /// with 2 successes and a new `rise` of 2 comes up on the next success.
    pub fn set_thresholds(&mut self, rise: u32, fall: u32) {
        self.rise = rise.max(1);
        self.fall = fall.max(1);
    }

    /// Feeds one probe result; returns the transition it caused, if any.
    pub fn observe(&mut self, result: &ProbeResult, now: Instant) -> Option<Transition> {
        self.last_result = Some(result.clone());
        self.last_probe_at = Some(now);
        let to = match &result.outcome {
            Ok(_) => {
                self.consecutive_ok = self.consecutive_ok.saturating_add(1);
                self.consecutive_fail = 0;
                match self.state {
                    HealthState::Unknown => Some(HealthState::Up),
                    HealthState::Down if self.consecutive_ok >= self.rise => Some(HealthState::Up),
                    HealthState::Up | HealthState::Down => None,
                }
            }
            Err(_) => {
                self.consecutive_fail = self.consecutive_fail.saturating_add(1);
                self.consecutive_ok = 0;
                match self.state {
                    HealthState::Unknown => Some(HealthState::Down),
                    HealthState::Up if self.consecutive_fail >= self.fall => {
                        Some(HealthState::Down)
                    }
                    HealthState::Up | HealthState::Down => None,
                }
            }
        }?;
        let reason = match &result.outcome {
            Ok(_) => {
                let n = self.consecutive_ok;
                format!(
                    "passed {n} consecutive check{}",
                    if n == 1 { "" } else { "s" }
                )
            }
            Err(fail) => fail.to_string(),
        };
        let from = self.state;
        self.state = to;
        self.since = now;
        self.last_transition_reason = Some(reason.clone());
        Some(Transition { from, to, reason })
    }

    /// Drains (or undrains) the backend for the data plane. Health keeps
    /// being tracked. Returns whether this changed anything.
    pub fn set_admin_drained(&mut self, drained: bool) -> bool {
        std::mem::replace(&mut self.admin_drained, drained) != drained
    }

    pub fn state(&self) -> HealthState {
        self.state
    }

    pub fn admin_drained(&self) -> bool {
        self.admin_drained
    }

    /// Whether the data plane should send new flows to this backend.
    pub fn serving(&self) -> bool {
        self.state == HealthState::Up && !self.admin_drained
    }

    pub fn consecutive_ok(&self) -> u32 {
        self.consecutive_ok
    }

    pub fn consecutive_fail(&self) -> u32 {
        self.consecutive_fail
    }

    pub fn since(&self) -> Instant {
        self.since
    }

    pub fn last_transition_reason(&self) -> Option<&str> {
        self.last_transition_reason.as_deref()
    }

    pub fn last_result(&self) -> Option<&ProbeResult> {
        self.last_result.as_ref()
    }

    pub fn snapshot(&self) -> HealthSnapshot {
        HealthSnapshot {
            state: self.state,
            admin_drained: self.admin_drained,
            serving: self.serving(),
            consecutive_ok: self.consecutive_ok,
            consecutive_fail: self.consecutive_fail,
            since: self.since,
            last_transition_reason: self.last_transition_reason.clone(),
            last_result: self.last_result.clone(),
            last_probe_at: self.last_probe_at,
        }
    }

    /// The un-jittered period until the next probe: `interval` while steadily
    /// up, `down_interval` while steadily down, `fast_interval` while between
    /// states (so a change is confirmed or refuted quickly).
    pub fn period(&self, spec: &CheckSpec) -> Duration {
        match self.state {
            HealthState::Up if self.consecutive_fail == 0 => spec.interval,
            HealthState::Down if self.consecutive_ok == 0 => spec.down_interval,
            HealthState::Unknown | HealthState::Up | HealthState::Down => spec.fast_interval,
        }
    }

    /// The delay until the next probe: [`Self::period`] with jitter.
    pub fn next_delay(&self, spec: &CheckSpec, rng: &mut impl Rng) -> Duration {
        jittered(self.period(spec), spec.jitter, rng)
    }
}

/// `period` scaled by a factor drawn uniformly from `[1 − jitter, 1 + jitter]`
/// (jitter clamped to `[0, 1]`; NaN counts as 0).
pub fn jittered(period: Duration, jitter: f64, rng: &mut impl Rng) -> Duration {
    let jitter = if jitter.is_nan() {
        0.0
    } else {
        jitter.clamp(0.0, 1.0)
    };
    if jitter == 0.0 {
        return period;
    }
    let factor = rng.gen_range((1.0 - jitter)..=(1.0 + jitter));
    // Only an absurd period (centuries) could overflow; then skip the jitter.
    Duration::try_from_secs_f64(period.as_secs_f64() * factor).unwrap_or(period)
}

/// Delay before a backend's first probe, uniform in `[0, interval)`, so that
/// backends added together (1,000 at daemon start) are not probed in lockstep.
pub fn initial_delay(spec: &CheckSpec, rng: &mut impl Rng) -> Duration {
    let nanos = u64::try_from(spec.interval.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(rng.gen_range(0..nanos))
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng as _;
    use rand::rngs::StdRng;

    use super::super::probe::{FailReason, ProbeOk};
    use super::super::spec::{CheckKind, defaults};
    use super::*;
    use HealthState::{Down, Unknown, Up};

    fn ok() -> ProbeResult {
        ProbeResult {
            outcome: Ok(ProbeOk { status: Some(200) }),
            latency: Duration::from_millis(3),
        }
    }

    fn fail() -> ProbeResult {
        ProbeResult {
            outcome: Err(FailReason::UnexpectedStatus { status: 503 }),
            latency: Duration::from_millis(3),
        }
    }

    fn test_spec() -> CheckSpec {
        CheckSpec {
            kind: CheckKind::Tcp,
            port: 80,
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            rise: 2,
            fall: 3,
            fast_interval: Duration::from_millis(500),
            down_interval: Duration::from_secs(5),
            jitter: 0.1,
        }
    }

    /// Feeds `probes` ('+' success, '-' failure), one per mocked second after
    /// `t0`, and returns (probe index, transition) for each transition.
    fn run(machine: &mut HealthMachine, t0: Instant, probes: &str) -> Vec<(usize, Transition)> {
        let mut transitions = Vec::new();
        for (i, c) in probes.chars().enumerate() {
            let result = match c {
                '+' => ok(),
                '-' => fail(),
                other => panic!("bad probe {other:?}"),
            };
            let now = t0 + Duration::from_secs(i as u64 + 1);
            if let Some(t) = machine.observe(&result, now) {
                assert_eq!(machine.since(), now, "since is the transition time");
                transitions.push((i, t));
            }
            assert_eq!(machine.snapshot().last_probe_at, Some(now));
        }
        transitions
    }

    const FAILED: &str = "unexpected status 503";

    #[test]
    fn transitions() {
        struct Case {
            name: &'static str,
            start: HealthState,
            rise: u32,
            fall: u32,
            probes: &'static str,
            /// (probe index, from, to, reason)
            want: &'static [(usize, HealthState, HealthState, &'static str)],
            end: HealthState,
        }
        let flapping = "+-".repeat(20);
        let flapping: &'static str = flapping.leak();
        let cases = [
            Case {
                name: "unknown, first success",
                start: Unknown,
                rise: 3,
                fall: 3,
                probes: "+",
                want: &[(0, Unknown, Up, "passed 1 consecutive check")],
                end: Up,
            },
            Case {
                name: "unknown, first failure",
                start: Unknown,
                rise: 3,
                fall: 3,
                probes: "-",
                want: &[(0, Unknown, Down, FAILED)],
                end: Down,
            },
            Case {
                name: "unknown stays until probed",
                start: Unknown,
                rise: 2,
                fall: 2,
                probes: "",
                want: &[],
                end: Unknown,
            },
            Case {
                name: "up, fewer than fall failures",
                start: Up,
                rise: 2,
                fall: 3,
                probes: "--",
                want: &[],
                end: Up,
            },
            Case {
                name: "up, fall failures",
                start: Up,
                rise: 2,
                fall: 3,
                probes: "---",
                want: &[(2, Up, Down, FAILED)],
                end: Down,
            },
            Case {
                name: "up, success resets the failure streak",
                start: Up,
                rise: 2,
                fall: 3,
                probes: "--+--+--",
                want: &[],
                end: Up,
            },
            Case {
                name: "down, fewer than rise successes",
                start: Down,
                rise: 2,
                fall: 3,
                probes: "+",
                want: &[],
                end: Down,
            },
            Case {
                name: "down, rise successes",
                start: Down,
                rise: 2,
                fall: 3,
                probes: "++",
                want: &[(1, Down, Up, "passed 2 consecutive checks")],
                end: Up,
            },
            Case {
                name: "down, failure resets the success streak",
                start: Down,
                rise: 3,
                fall: 3,
                probes: "++-++-++",
                want: &[],
                end: Down,
            },
            Case {
                name: "flapping from up, rise=fall=2",
                start: Up,
                rise: 2,
                fall: 2,
                probes: flapping,
                want: &[],
                end: Up,
            },
            Case {
                name: "flapping from down, rise=fall=2",
                start: Down,
                rise: 2,
                fall: 2,
                probes: flapping,
                want: &[],
                end: Down,
            },
            Case {
                name: "flapping from up, rise=fall=3",
                start: Up,
                rise: 3,
                fall: 3,
                probes: flapping,
                want: &[],
                end: Up,
            },
            Case {
                name: "flapping after unknown",
                start: Unknown,
                rise: 2,
                fall: 2,
                probes: flapping,
                want: &[(0, Unknown, Up, "passed 1 consecutive check")],
                end: Up,
            },
            Case {
                name: "full cycle",
                start: Unknown,
                rise: 2,
                fall: 3,
                probes: "+---+++",
                want: &[
                    (0, Unknown, Up, "passed 1 consecutive check"),
                    (3, Up, Down, FAILED),
                    (5, Down, Up, "passed 2 consecutive checks"),
                ],
                end: Up,
            },
            Case {
                name: "rise=fall=1 follows every probe",
                start: Up,
                rise: 1,
                fall: 1,
                probes: "-+",
                want: &[
                    (0, Up, Down, FAILED),
                    (1, Down, Up, "passed 1 consecutive check"),
                ],
                end: Up,
            },
            Case {
                name: "zero thresholds act as 1",
                start: Up,
                rise: 0,
                fall: 0,
                probes: "-+",
                want: &[
                    (0, Up, Down, FAILED),
                    (1, Down, Up, "passed 1 consecutive check"),
                ],
                end: Up,
            },
            Case {
                name: "long outage, one transition",
                start: Up,
                rise: 2,
                fall: 3,
                probes: "----------",
                want: &[(2, Up, Down, FAILED)],
                end: Down,
            },
        ];
        for case in cases {
            let t0 = Instant::now();
            let mut machine = HealthMachine::adopted(case.start, case.rise, case.fall, t0);
            let got = run(&mut machine, t0, case.probes);
            let want: Vec<_> = case
                .want
                .iter()
                .map(|&(i, from, to, reason)| {
                    (
                        i,
                        Transition {
                            from,
                            to,
                            reason: reason.to_owned(),
                        },
                    )
                })
                .collect();
            assert_eq!(got, want, "case {:?}", case.name);
            assert_eq!(machine.state(), case.end, "case {:?}", case.name);
            if let Some((_, last)) = got.last() {
                assert_eq!(
                    machine.last_transition_reason(),
                    Some(last.reason.as_str()),
                    "case {:?}",
                    case.name
                );
            }
        }
    }

    #[test]
    fn new_backend_is_unknown_and_not_serving() {
        let t0 = Instant::now();
        let machine = HealthMachine::new(2, 3, t0);
        assert_eq!(machine.state(), Unknown);
        assert!(!machine.serving());
        assert_eq!(machine.last_transition_reason(), None);
        assert_eq!(machine.since(), t0);
    }

    #[test]
    fn adopted_state_stands_until_probes_say_otherwise() {
        let t0 = Instant::now();
        let mut machine = HealthMachine::adopted(Up, 2, 3, t0);
        assert!(machine.serving(), "adopted up serves at once");
        assert_eq!(machine.last_transition_reason(), Some(ADOPTED_REASON));
        assert_eq!(run(&mut machine, t0, "--"), vec![]);
        assert!(machine.serving(), "two failures are fewer than fall=3");
        assert_eq!(run(&mut machine, t0, "-").len(), 1);
        assert_eq!(machine.state(), Down);
    }

    #[test]
    fn tracks_streaks_and_last_result() {
        let t0 = Instant::now();
        let mut machine = HealthMachine::adopted(Up, 2, 5, t0);
        run(&mut machine, t0, "++--");
        let snap = machine.snapshot();
        assert_eq!((snap.consecutive_ok, snap.consecutive_fail), (0, 2));
        assert_eq!(snap.last_result, Some(fail()));
        assert_eq!(snap.since, t0, "no transition yet");
        run(&mut machine, t0, "+");
        assert_eq!(
            (machine.consecutive_ok(), machine.consecutive_fail()),
            (1, 0)
        );
        assert_eq!(machine.last_result(), Some(&ok()));
    }

    #[test]
    fn admin_drain_overrides_health_for_the_data_plane() {
        let t0 = Instant::now();
        // (name, state, drained, serving)
        let cases = [
            ("up", Up, false, true),
            ("up, drained", Up, true, false),
            ("down", Down, false, false),
            ("down, drained", Down, true, false),
            ("unknown", Unknown, false, false),
            ("unknown, drained", Unknown, true, false),
        ];
        for (name, state, drained, serving) in cases {
            let mut machine = HealthMachine::adopted(state, 2, 2, t0);
            assert!(
                !machine.set_admin_drained(false),
                "{name}: undrained by default"
            );
            assert_eq!(
                machine.set_admin_drained(drained),
                drained,
                "{name}: changed"
            );
            assert_eq!(machine.serving(), serving, "{name}");
            assert_eq!(machine.snapshot().serving, serving, "{name}");
            assert_eq!(machine.snapshot().admin_drained, drained, "{name}");
        }

        // Health keeps being tracked while drained, and undraining serves
        // only what is healthy.
        let mut machine = HealthMachine::adopted(Up, 2, 2, t0);
        machine.set_admin_drained(true);
        let got = run(&mut machine, t0, "--");
        assert_eq!(got.len(), 1, "transitions still happen while drained");
        assert_eq!(machine.state(), Down);
        machine.set_admin_drained(false);
        assert!(!machine.serving(), "undrained but down");
        run(&mut machine, t0, "++");
        assert!(machine.serving());
    }

    #[test]
    fn period_per_state() {
        let spec = test_spec();
        let (interval, fast, down) = (spec.interval, spec.fast_interval, spec.down_interval);
        let cases = [
            ("unknown", Unknown, "", fast),
            ("steady up", Up, "", interval),
            ("up after a success", Up, "++", interval),
            ("up with one failure", Up, "-", fast),
            ("up with two failures", Up, "--", fast),
            ("just went down", Up, "---", down),
            ("steady down", Down, "", down),
            ("down with one success", Down, "+", fast),
            ("just came up", Down, "++", interval),
            ("first probe failed", Unknown, "-", down),
            ("first probe passed", Unknown, "+", interval),
        ];
        let t0 = Instant::now();
        for (name, start, probes, want) in cases {
            let mut machine = HealthMachine::adopted(start, spec.rise, spec.fall, t0);
            run(&mut machine, t0, probes);
            assert_eq!(machine.period(&spec), want, "{name}");
            let mut no_jitter = spec.clone();
            no_jitter.jitter = 0.0;
            assert_eq!(
                machine.next_delay(&no_jitter, &mut StdRng::seed_from_u64(1)),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn jitter_bounds() {
        let mut rng = StdRng::seed_from_u64(7);
        let period = Duration::from_secs(2);
        // (name, jitter, low, high)
        let cases = [
            (
                "10 %",
                0.1,
                Duration::from_millis(1800),
                Duration::from_millis(2200),
            ),
            ("50 %", 0.5, Duration::from_secs(1), Duration::from_secs(3)),
            (
                "clamped to 100 %",
                1.5,
                Duration::ZERO,
                Duration::from_secs(4),
            ),
        ];
        for (name, jitter, low, high) in cases {
            let draws: Vec<Duration> = (0..10_000)
                .map(|_| jittered(period, jitter, &mut rng))
                .collect();
            let (min, max) = (draws.iter().min().unwrap(), draws.iter().max().unwrap());
            assert!(
                *min >= low && *max <= high,
                "{name}: draws in [{min:?}, {max:?}]"
            );
            // Spread over the range, not clustered (uniform: ~1/10,000 gaps).
            let span = (high - low).as_secs_f64();
            assert!(
                (*min - low).as_secs_f64() < span * 0.01,
                "{name}: min {min:?}"
            );
            assert!(
                (high - *max).as_secs_f64() < span * 0.01,
                "{name}: max {max:?}"
            );
        }
        for (name, jitter) in [("none", 0.0), ("negative", -0.2), ("NaN", f64::NAN)] {
            assert!(
                (0..100).all(|_| jittered(period, jitter, &mut rng) == period),
                "{name}"
            );
        }
    }

    #[test]
    fn next_delay_is_jittered() {
        let spec = test_spec();
        let machine = HealthMachine::adopted(Up, spec.rise, spec.fall, Instant::now());
        let mut rng = StdRng::seed_from_u64(11);
        let draws: Vec<Duration> = (0..10_000)
            .map(|_| machine.next_delay(&spec, &mut rng))
            .collect();
        assert!(
            draws
                .iter()
                .all(|d| (Duration::from_millis(1800)..=Duration::from_millis(2200)).contains(d))
        );
        assert!(draws.iter().any(|d| *d != draws[0]), "all draws equal");
    }

    #[test]
    fn initial_delay_spreads_over_the_interval() {
        let spec = CheckSpec {
            interval: defaults::INTERVAL,
            ..test_spec()
        };
        let mut rng = StdRng::seed_from_u64(3);
        let mut buckets = [0u32; 10];
        for _ in 0..10_000 {
            let d = initial_delay(&spec, &mut rng);
            assert!(d < spec.interval, "{d:?} not below the interval");
            let bucket = (d.as_secs_f64() / spec.interval.as_secs_f64() * 10.0) as usize;
            buckets[bucket] += 1;
        }
        for (i, &n) in buckets.iter().enumerate() {
            assert!(
                (500..=1500).contains(&n),
                "bucket {i} got {n} of 10,000: {buckets:?}"
            );
        }
        let zero = CheckSpec {
            interval: Duration::ZERO,
            ..test_spec()
        };
        assert_eq!(initial_delay(&zero, &mut rng), Duration::ZERO);
    }
}
