//! The per-backend health state machine: pure, no I/O, no clock of its own
//! (every time is passed in), so it is tested with a mocked clock.
//!
//! Hysteresis as in HAProxy: one failed probe does not take a backend down,
//! `fall` consecutive failures do; `rise` consecutive successes bring it back.
//! A new backend is `Unknown` and takes no new flows until a probe passes.
//!
//! Hung versus slow: only [`ProbeClass::Failed`] results count toward `fall`.
//! A slow answer (`Slow`) counts toward `rise`, since it proves the
//! application is alive; an interim `Late` report and an error of the load
//! balancer's own (`Local`) move neither streak. Slowness is tracked on the
//! side (`consecutive_slow`, latencies) for the per-VIP policy to judge
//! against the backend's peers, so a fleet slowed down by load is never
//! taken down probe by probe (seed 003).

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use rand::Rng;

use super::agent::AgentStatus;
use super::probe::{FailReason, ProbeClass, ProbeResult};
use super::spec::CheckSpec;

/// Ok and Slow latencies kept for [`HealthSnapshot::recent_latency`].
pub const RECENT_LATENCIES: usize = 5;

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
    /// The last final probe result (any class; an interim `Late` is not one).
    pub last_result: Option<ProbeResult>,
    /// When `last_result` came.
    pub last_probe_at: Option<Instant>,
    /// Late reports since the last `Ok` (a `Slow` final adds nothing: its
    /// `Late` already did; a `Failed` one does not reset it).
    pub consecutive_slow: u32,
    /// The greatest latency observed over the current slow streak (a `Late`
    /// counts as `timeout` until its answer comes, a `Slow` as its latency,
    /// no complete answer as the probe's latency, about `hang_timeout`);
    /// `None` when `consecutive_slow` is 0. The greatest, so that a streak
    /// of answers 2.5 s late reads 2.5 s, not the 1 s bound every streak
    /// starts with.
    pub streak_latency: Option<Duration>,
    /// Whether `streak_latency` is the latency of an answer; `false` when
    /// it is only a wait that saw none (a late probe's `timeout`, a probe
    /// that failed without one at its `hang_timeout`): "no answer within
    /// 3s", not "answers in 3.001s".
    pub streak_answered: bool,
    /// Median of the last [`RECENT_LATENCIES`] `Ok`/`Slow` latencies; `None`
    /// before the first.
    pub recent_latency: Option<Duration>,
    /// [`FailReason::code`](super::probe::FailReason::code) of the last
    /// `Failed` result (kept after later successes); `None` before the first.
    pub last_fail_code: Option<&'static str>,
    /// Probes that failed because of the load balancer itself (`Local`),
    /// since the backend was added.
    pub local_errors: u64,
    /// The text of the last of them.
    pub last_local_error: Option<String>,
    /// Probes past `timeout` still waiting for an answer (at most
    /// `CheckSpec::max_in_flight`).
    pub late_pending: u32,
    /// What the backend's agent says (`agent_port`); `None` without one or
    /// before its first poll.
    pub agent: Option<AgentStatus>,
    /// Set while passive evidence stands against the backend (its real
    /// traffic failed while its peers' succeeded: `health::passive`):
    /// why. Cleared by `rise` consecutive passing probes after it.
    pub passive: Option<String>,
}

impl HealthSnapshot {
    /// The latency the per-VIP policy compares with the backend's peers:
    /// `streak_latency` while a slow streak lasts, else `recent_latency`.
    pub fn current_latency(&self) -> Option<Duration> {
        if self.consecutive_slow > 0 {
            self.streak_latency
        } else {
            self.recent_latency
        }
    }
}

/// The bound a failure without an answer waited for (its `hang_timeout`).
fn no_answer_bound(fail: &FailReason) -> Option<Duration> {
    match fail {
        FailReason::ConnectTimeout { timeout }
        | FailReason::NoResponse { timeout }
        | FailReason::Incomplete { timeout, .. }
        | FailReason::NoDatagram { timeout } => Some(*timeout),
        _ => None,
    }
}

/// Successes that arrive closer together than this count once toward
/// `rise`: they are late probes answered together (scheduled probes are at
/// least half a `fast_interval` apart).
pub const SIMULTANEOUS: Duration = Duration::from_millis(10);

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
    /// When the last success counted toward `rise` arrived.
    last_success_at: Option<Instant>,
    admin_drained: bool,
    consecutive_slow: u32,
    streak_latency: Option<Duration>,
    streak_answered: bool,
    /// Oldest first, at most `RECENT_LATENCIES`.
    recent: VecDeque<Duration>,
    last_fail_code: Option<&'static str>,
    local_errors: u64,
    last_local_error: Option<String>,
    late_pending: u32,
    agent: Option<AgentStatus>,
    passive: Option<String>,
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
            last_success_at: None,
            admin_drained: false,
            consecutive_slow: 0,
            streak_latency: None,
            streak_answered: false,
            recent: VecDeque::with_capacity(RECENT_LATENCIES),
            last_fail_code: None,
            local_errors: 0,
            last_local_error: None,
            late_pending: 0,
            agent: None,
            passive: None,
        }
    }

    /// New thresholds (the spec changed). Streaks are kept: a `Down` backend
    /// with 2 successes and a new `rise` of 2 comes up on the next success.
    pub fn set_thresholds(&mut self, rise: u32, fall: u32) {
        self.rise = rise.max(1);
        self.fall = fall.max(1);
    }

    /// Forgets the probes reported late and still waiting: the scheduler
    /// aborted them (the backend's task restarted).
    pub fn clear_late_pending(&mut self) {
        self.late_pending = 0;
    }

    /// Feeds an interim report: a probe passed `timeout` without a complete
    /// answer and is still waiting. Not evidence of a failure yet: the hard
    /// state and its streaks are untouched (an `Unknown` backend stays
    /// `Unknown` until the final report).
    pub fn observe_late(&mut self, timeout: Duration) {
        self.late_pending = self.late_pending.saturating_add(1);
        self.add_slow(timeout, false);
    }

    fn add_slow(&mut self, latency: Duration, answered: bool) {
        self.consecutive_slow = self.consecutive_slow.saturating_add(1);
        self.fold_streak_latency(latency, answered);
    }

    /// Keeps the greatest latency of the streak, and whether it is an
    /// answer's (`answered`) or only a wait that saw none.
    fn fold_streak_latency(&mut self, latency: Duration, answered: bool) {
        match self.streak_latency {
            Some(l) if l > latency => {}
            Some(l) if l == latency => self.streak_answered |= answered,
            _ => {
                self.streak_latency = Some(latency);
                self.streak_answered = answered;
            }
        }
    }

    fn add_recent(&mut self, latency: Duration) {
        if self.recent.len() == RECENT_LATENCIES {
            self.recent.pop_front();
        }
        self.recent.push_back(latency);
    }

    /// Feeds a probe's final result, classified by
    /// [`ProbeResult::class`] (never `Late`: that is not a final result, see
    /// [`Self::observe_late`]). `after_late` says whether this probe was
    /// reported late before. Returns the transition it caused, if any.
    pub fn observe(
        &mut self,
        result: &ProbeResult,
        class: &ProbeClass,
        after_late: bool,
        now: Instant,
    ) -> Option<Transition> {
        if after_late {
            self.late_pending = self.late_pending.saturating_sub(1);
        }
        self.last_result = Some(result.clone());
        self.last_probe_at = Some(now);
        let to = match class {
            ProbeClass::Late { .. } => unreachable!("Late is not a final result"),
            ProbeClass::Local(fail) => {
                self.local_errors = self.local_errors.saturating_add(1);
                self.last_local_error = Some(fail.to_string());
                None
            }
            ProbeClass::Ok | ProbeClass::Slow { .. } => {
                if matches!(class, ProbeClass::Ok) {
                    self.consecutive_slow = 0;
                    self.streak_latency = None;
                    self.streak_answered = false;
                } else if after_late {
                    self.fold_streak_latency(result.latency, true);
                } else {
                    // Finished just past `timeout`, before the interim
                    // report could go out: it is its own late report.
                    self.add_slow(result.latency, true);
                }
                self.add_recent(result.latency);
                // Probes that lingered while the application was stuck all
                // answer the moment it recovers: one observation, not
                // `rise` of them.
                let piled_up = self
                    .last_success_at
                    .is_some_and(|t| now.saturating_duration_since(t) < SIMULTANEOUS);
                if !piled_up || self.consecutive_ok == 0 {
                    self.consecutive_ok = self.consecutive_ok.saturating_add(1);
                }
                if self.consecutive_ok >= self.rise {
                    self.passive = None;
                }
                self.last_success_at = Some(now);
                self.consecutive_fail = 0;
                match self.state {
                    HealthState::Unknown => Some(HealthState::Up),
                    HealthState::Down if self.consecutive_ok >= self.rise => Some(HealthState::Up),
                    HealthState::Up | HealthState::Down => None,
                }
            }
            ProbeClass::Failed(fail) => self.observe_failure(result, fail, after_late),
        }?;
        let reason = match class {
            ProbeClass::Failed(fail) => fail.to_string(),
            _ => {
                let n = self.consecutive_ok;
                format!(
                    "passed {n} consecutive check{}",
                    if n == 1 { "" } else { "s" }
                )
            }
        };
        let from = self.state;
        self.state = to;
        self.since = now;
        self.last_transition_reason = Some(reason.clone());
        Some(Transition { from, to, reason })
    }

    /// A final failure that counts toward `fall`: the state it leads to.
    fn observe_failure(
        &mut self,
        result: &ProbeResult,
        fail: &FailReason,
        after_late: bool,
    ) -> Option<HealthState> {
        self.last_fail_code = Some(fail.code());
        if after_late {
            // No answer: what it waited for is the bound it failed at
            // (`hang_timeout`), not the few ms past it.
            self.fold_streak_latency(no_answer_bound(fail).unwrap_or(result.latency), false);
        }
        self.consecutive_fail = self.consecutive_fail.saturating_add(1);
        self.consecutive_ok = 0;
        match self.state {
            HealthState::Unknown => Some(HealthState::Down),
            HealthState::Up if self.consecutive_fail >= self.fall => Some(HealthState::Down),
            HealthState::Up | HealthState::Down => None,
        }
    }

    /// Feeds passive evidence: the backend's real traffic failed while its
    /// peers' succeeded (`reason`, from `health::passive`). The hard state
    /// is untouched (the VIP policy takes the backend out, within its
    /// protections); the success streak starts again, so `rise` probes
    /// passing after the evidence, not before it, bring the backend back.
    /// Returns whether the evidence is new (none stood).
    pub fn observe_passive(&mut self, reason: String) -> bool {
        self.consecutive_ok = 0;
        self.last_success_at = None;
        self.passive.replace(reason).is_none()
    }

    /// Drains (or undrains) the backend for the data plane. Health keeps
    /// being tracked. Returns whether this changed anything.
    pub fn set_admin_drained(&mut self, drained: bool) -> bool {
        std::mem::replace(&mut self.admin_drained, drained) != drained
    }

    /// The agent's status, kept here so that it is in every snapshot and
    /// goes with the backend's address (a new address starts without it).
    pub fn agent_mut(&mut self) -> &mut Option<AgentStatus> {
        &mut self.agent
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
            consecutive_slow: self.consecutive_slow,
            streak_latency: self.streak_latency.filter(|_| self.consecutive_slow > 0),
            streak_answered: self.streak_answered && self.consecutive_slow > 0,
            recent_latency: super::median(self.recent.iter().copied()),
            last_fail_code: self.last_fail_code,
            local_errors: self.local_errors,
            last_local_error: self.last_local_error.clone(),
            late_pending: self.late_pending,
            agent: self.agent.clone(),
            passive: self.passive.clone(),
        }
    }

    /// The un-jittered period until the next probe: `interval` while steadily
    /// up, `down_interval` while steadily down, `fast_interval` while between
    /// states or under passive evidence (so a change is confirmed or
    /// refuted quickly).
    pub fn period(&self, spec: &CheckSpec) -> Duration {
        match self.state {
            // Out on passive evidence: probes decide its return quickly.
            HealthState::Up if self.consecutive_fail == 0 && self.passive.is_none() => {
                spec.interval
            }
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
            path_fault: None,
        }
    }

    fn fail() -> ProbeResult {
        ProbeResult {
            outcome: Err(FailReason::UnexpectedStatus { status: 503 }),
            latency: Duration::from_millis(3),
            path_fault: None,
        }
    }

    fn test_spec() -> CheckSpec {
        CheckSpec {
            kind: CheckKind::Tcp,
            port: 80,
            interval: Duration::from_secs(2),
            timeout: TIMEOUT,
            hang_timeout: HANG,
            rise: 2,
            fall: 3,
            fast_interval: Duration::from_millis(500),
            down_interval: Duration::from_secs(5),
            jitter: 0.1,
            via: crate::health::spec::Via::Direct,
            auto_timeout: false,
            agent: None,
        }
    }

    const TIMEOUT: Duration = Duration::from_secs(1);
    const HANG: Duration = Duration::from_secs(3);

    fn ok_in(latency: Duration) -> ProbeResult {
        ProbeResult {
            outcome: Ok(ProbeOk { status: Some(200) }),
            latency,
            path_fault: None,
        }
    }

    /// The hung application: no response within `HANG`.
    fn hung() -> ProbeResult {
        ProbeResult {
            outcome: Err(FailReason::NoResponse { timeout: HANG }),
            latency: HANG,
            path_fault: None,
        }
    }

    fn local() -> ProbeResult {
        ProbeResult {
            outcome: Err(FailReason::Local {
                during: "creating a socket",
                error: "Too many open files (os error 24)".into(),
            }),
            latency: Duration::from_micros(20),
            path_fault: None,
        }
    }

    /// One report, as the scheduler sends them with `TIMEOUT` and `HANG`:
    /// '+' passed in 3 ms, '-' failed (503) in 3 ms, 'L' interim late,
    /// 's' a late probe answered in 2.5 s, 'h' a late probe with no response
    /// by `HANG`, 'x' a local error. Returns the transition.
    fn feed(machine: &mut HealthMachine, c: char, now: Instant) -> Option<Transition> {
        let (result, after_late) = match c {
            '+' => (ok(), false),
            '-' => (fail(), false),
            'L' => {
                let before = machine.snapshot().last_probe_at;
                machine.observe_late(TIMEOUT);
                assert_eq!(
                    machine.snapshot().last_probe_at,
                    before,
                    "late is not a result"
                );
                return None;
            }
            's' => (ok_in(Duration::from_millis(2500)), true),
            'h' => (hung(), true),
            'x' => (local(), false),
            other => panic!("bad probe {other:?}"),
        };
        let class = result.class(TIMEOUT);
        let transition = machine.observe(&result, &class, after_late, now);
        assert_eq!(machine.snapshot().last_probe_at, Some(now));
        transition
    }

    /// Feeds `probes` (see [`feed`]), one per mocked second after `t0`, and
    /// returns (probe index, transition) for each transition.
    fn run(machine: &mut HealthMachine, t0: Instant, probes: &str) -> Vec<(usize, Transition)> {
        let mut transitions = Vec::new();
        for (i, c) in probes.chars().enumerate() {
            let now = t0 + Duration::from_secs(i as u64 + 1);
            if let Some(t) = feed(machine, c, now) {
                assert_eq!(machine.since(), now, "since is the transition time");
                transitions.push((i, t));
            }
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

    /// Hung versus slow versus local: which reports move the hard state.
    #[test]
    fn slow_hung_local_and_late() {
        struct Case {
            name: &'static str,
            start: HealthState,
            rise: u32,
            fall: u32,
            probes: &'static str,
            /// (probe index, from, to, reason)
            want: &'static [(usize, HealthState, HealthState, &'static str)],
            end: HealthState,
            /// (consecutive_ok, consecutive_fail, consecutive_slow, late_pending)
            streaks: (u32, u32, u32, u32),
        }
        const HUNG: &str = "connected, no HTTP response within 3s";
        let fleet = "Ls".repeat(50);
        let fleet: &'static str = fleet.leak();
        let cases = [
            Case {
                name: "fleet slower than timeout: Late+Slow never takes an Up backend down",
                start: Up,
                rise: 2,
                fall: 3,
                probes: fleet,
                want: &[],
                end: Up,
                streaks: (50, 0, 50, 0),
            },
            Case {
                name: "fleet slow with rise=fall=1",
                start: Up,
                rise: 1,
                fall: 1,
                probes: fleet,
                want: &[],
                end: Up,
                streaks: (50, 0, 50, 0),
            },
            Case {
                name: "late then no response within hang_timeout is one failure",
                start: Up,
                rise: 2,
                fall: 3,
                probes: "Lh",
                want: &[],
                end: Up,
                streaks: (0, 1, 1, 0),
            },
            Case {
                name: "hung: fall failures, each late first",
                start: Up,
                rise: 2,
                fall: 3,
                probes: "LhLhLh",
                want: &[(5, Up, Down, HUNG)],
                end: Down,
                streaks: (0, 3, 3, 0),
            },
            Case {
                name: "hung with lingering probes: lates interleave with finals",
                start: Up,
                rise: 2,
                fall: 3,
                probes: "LLhLhLhh",
                want: &[(6, Up, Down, HUNG)],
                end: Down,
                streaks: (0, 4, 4, 0),
            },
            Case {
                name: "a late answer is a failure with hang_timeout = timeout (no Late sent)",
                start: Up,
                rise: 2,
                fall: 2,
                probes: "--",
                want: &[(1, Up, Down, FAILED)],
                end: Down,
                streaks: (0, 2, 0, 0),
            },
            Case {
                name: "local errors never count",
                start: Up,
                rise: 1,
                fall: 1,
                probes: "xxxxxxxxxx",
                want: &[],
                end: Up,
                streaks: (0, 0, 0, 0),
            },
            Case {
                name: "local errors neither count nor reset the failure streak",
                start: Up,
                rise: 2,
                fall: 3,
                probes: "--xx-",
                want: &[(4, Up, Down, FAILED)],
                end: Down,
                streaks: (0, 3, 0, 0),
            },
            Case {
                name: "local errors do not bring a down backend up",
                start: Down,
                rise: 1,
                fall: 1,
                probes: "xxx",
                want: &[],
                end: Down,
                streaks: (0, 0, 0, 0),
            },
            Case {
                name: "unknown stays unknown on late and local, a slow answer decides",
                start: Unknown,
                rise: 3,
                fall: 3,
                probes: "LxLs",
                want: &[(3, Unknown, Up, "passed 1 consecutive check")],
                end: Up,
                streaks: (1, 0, 2, 1),
            },
            Case {
                name: "unknown, late then hung",
                start: Unknown,
                rise: 3,
                fall: 3,
                probes: "Lh",
                want: &[(1, Unknown, Down, HUNG)],
                end: Down,
                streaks: (0, 1, 1, 0),
            },
            Case {
                name: "slow answers bring a down backend up",
                start: Down,
                rise: 2,
                fall: 3,
                probes: "LsLs",
                want: &[(3, Down, Up, "passed 2 consecutive checks")],
                end: Up,
                streaks: (2, 0, 2, 0),
            },
            Case {
                name: "a slow answer resets the failure streak",
                start: Up,
                rise: 2,
                fall: 3,
                probes: "--Ls--",
                want: &[],
                end: Up,
                streaks: (0, 2, 1, 0),
            },
            Case {
                name: "late resets nothing: failures go on counting",
                start: Up,
                rise: 2,
                fall: 3,
                probes: "--L-",
                want: &[(3, Up, Down, FAILED)],
                end: Down,
                streaks: (0, 3, 1, 1),
            },
            Case {
                name: "late resets nothing: successes go on counting",
                start: Down,
                rise: 2,
                fall: 3,
                probes: "+L+",
                want: &[(2, Down, Up, "passed 2 consecutive checks")],
                end: Up,
                streaks: (2, 0, 0, 1),
            },
            Case {
                name: "an ok resets the slow streak, a failure does not",
                start: Up,
                rise: 2,
                fall: 3,
                probes: "LsLs+Ls-",
                want: &[],
                end: Up,
                streaks: (0, 1, 1, 0),
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
            let snap = machine.snapshot();
            assert_eq!(
                (
                    snap.consecutive_ok,
                    snap.consecutive_fail,
                    snap.consecutive_slow,
                    snap.late_pending
                ),
                case.streaks,
                "case {:?}: (ok, fail, slow, late_pending)",
                case.name
            );
            let locals = case.probes.matches('x').count() as u64;
            assert_eq!(snap.local_errors, locals, "case {:?}", case.name);
        }
    }

    /// Late probes that lingered through a hang answer together when it
    /// ends: one success toward `rise`, not three.
    #[test]
    fn late_answers_that_arrive_together_count_once() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(1);
        let mut m = HealthMachine::adopted(Down, 2, 3, t0);
        for _ in 0..3 {
            m.observe_late(timeout);
        }
        let slow = ok_in(Duration::from_millis(2500));
        let class = slow.class(timeout);
        let at = t0 + Duration::from_secs(5);
        for i in 0..3 {
            let t = m.observe(&slow, &class, true, at + Duration::from_millis(i));
            assert_eq!(t, None, "answer {i} of the pile-up");
        }
        assert_eq!((m.state(), m.consecutive_ok()), (Down, 1));
        // The next scheduled probe is a second observation: up.
        let t = m.observe(
            &ok(),
            &ProbeClass::Ok,
            false,
            at + Duration::from_millis(500),
        );
        assert_eq!(t.map(|t| t.to), Some(Up));
    }

    #[test]
    fn latencies_and_codes() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut clock = t0;
        let mut tick = || {
            clock += Duration::from_secs(1);
            clock
        };
        let mut m = HealthMachine::adopted(Up, 2, 3, t0);
        let empty = m.snapshot();
        assert_eq!(
            (
                empty.recent_latency,
                empty.streak_latency,
                empty.current_latency()
            ),
            (None, None, None),
            "nothing measured yet"
        );
        let mut observe = |m: &mut HealthMachine, result: ProbeResult, after_late: bool| {
            let class = result.class(TIMEOUT);
            m.observe(&result, &class, after_late, tick())
        };

        for latency in [ms(10), ms(30), ms(20)] {
            observe(&mut m, ok_in(latency), false);
        }
        let s = m.snapshot();
        assert_eq!(s.recent_latency, Some(ms(20)), "median of three");
        assert_eq!(s.current_latency(), Some(ms(20)), "no slow streak: recent");
        assert_eq!(s.streak_latency, None);

        m.observe_late(TIMEOUT);
        let s = m.snapshot();
        assert_eq!((s.consecutive_slow, s.late_pending), (1, 1));
        assert_eq!(
            s.streak_latency,
            Some(TIMEOUT),
            "a Late counts as the timeout"
        );
        assert_eq!(
            s.current_latency(),
            Some(TIMEOUT),
            "slow streak: streak latency"
        );
        assert_eq!(
            s.recent_latency,
            Some(ms(20)),
            "a Late is not a latency yet"
        );

        observe(&mut m, ok_in(ms(2500)), true);
        let s = m.snapshot();
        assert_eq!(
            (s.consecutive_slow, s.late_pending),
            (1, 0),
            "a Slow adds nothing"
        );
        assert_eq!(s.streak_latency, Some(ms(2500)), "the most over the streak");
        assert_eq!(
            s.recent_latency,
            Some(ms(25)),
            "median of 10, 20, 30, 2500 ms"
        );
        assert_eq!(
            s.last_result.as_ref().map(|r| r.class(TIMEOUT).to_string()),
            Some("answered in 2.5s (slower than timeout 1s)".to_owned())
        );

        // Finished past the timeout before the Late could be sent: it is
        // its own late report.
        observe(&mut m, ok_in(ms(1200)), false);
        let s = m.snapshot();
        assert_eq!((s.consecutive_slow, s.late_pending), (2, 0));
        assert_eq!(s.streak_latency, Some(ms(2500)));

        observe(&mut m, ok_in(ms(5)), false);
        let s = m.snapshot();
        assert_eq!(
            (s.consecutive_slow, s.streak_latency),
            (0, None),
            "an Ok ends the streak"
        );
        // The last five: 30, 20, 2500, 1200, 5 ms.
        assert_eq!(s.recent_latency, Some(ms(30)));
        assert_eq!(s.current_latency(), Some(ms(30)));
        assert_eq!(s.last_fail_code, None);

        // A streak that starts with a slow answer measures its latency.
        observe(&mut m, ok_in(ms(1500)), false);
        assert_eq!(m.snapshot().streak_latency, Some(ms(1500)));

        observe(&mut m, fail(), false);
        observe(&mut m, ok(), false);
        let s = m.snapshot();
        assert_eq!(
            s.last_fail_code,
            Some("unexpected_status"),
            "kept after a success"
        );
        m.observe_late(TIMEOUT);
        observe(&mut m, hung(), true);
        let s = m.snapshot();
        assert_eq!(s.last_fail_code, Some("no_response"));
        assert_eq!(s.consecutive_fail, 1);
        // The last five Ok/Slow: 2500, 1200, 5, 1500, 3 ms; failures add none.
        assert_eq!(
            s.recent_latency,
            Some(ms(1200)),
            "failures are not latencies"
        );

        observe(&mut m, local(), false);
        let s = m.snapshot();
        assert_eq!(s.local_errors, 1);
        assert_eq!(
            s.last_local_error.as_deref(),
            Some(
                "local error, not the backend's fault: Too many open files (os error 24) \
                 while creating a socket"
            )
        );
        assert_eq!(
            s.last_fail_code,
            Some("no_response"),
            "local errors are not failures"
        );
        assert_eq!(s.consecutive_fail, 1, "local errors are not failures");

        // A restarted task's lingering probes are forgotten.
        m.observe_late(TIMEOUT);
        m.observe_late(TIMEOUT);
        assert_eq!(m.snapshot().late_pending, 2);
        m.clear_late_pending();
        assert_eq!(m.snapshot().late_pending, 0);
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
