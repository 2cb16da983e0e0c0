//! What a VIP does with the health of its backends: which of them take new
//! flows, with what weight, and why. Pure: no I/O and no clock of its own, so
//! it is tested with a mocked clock, like the per-backend machine.
//!
//! The per-backend machine (`machine`) says what probes saw: hard failures
//! (refused, reset, no answer within `hang_timeout`, a bad status) and
//! slowness (answers later than `timeout`). This module decides what the
//! table does with that, with the whole VIP in view, because one backend's
//! probe cannot tell "this node is hung" from "every node is slow at peak"
//! (seed 003: strict checks ejected a serving fleet node by node):
//!
//! - **Hard failures** take a backend out (`down`), as `fall` says.
//! - **Slowness** takes a backend out only when it is an **outlier** against
//!   its peers (Envoy's outlier detection, on probe latency), and never more
//!   than `max_ejected` at once. A VIP that is slow as a whole is reported
//!   (`fleet_slow`), not emptied.
//! - **Passive evidence** (NAT VIPs: real requests unanswered while the
//!   peers' are answered, `health::passive`) takes a backend out at once,
//!   `down` with its reason, within the same `max_ejected` as slowness
//!   (both are judged against the peers); `rise` passing probes after it
//!   bring the backend back.
//! - **Panic** (`min_healthy`, Envoy's panic threshold): when fewer backends
//!   than that would be left, the least-bad ones are put back. Timeouts and
//!   slowness may be overload; a refused or reset connection or a bad status
//!   is a definite answer, so those never come back this way.
//! - **Slow start** (HAProxy's `slowstart`): a backend that returns to a
//!   serving VIP ramps its weight in [`RAMP_STEPS`] steps.
//! - **Flap damping** (BGP route-flap damping): every exit from the table
//!   adds a penalty that halves every `flap_half_life`; at `flap_limit` the
//!   backend is held down until the penalty has decayed below half of it.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use super::agent::AgentStatus;
use super::machine::{HealthSnapshot, HealthState};
use super::probe::Compact;
use super::spec::CheckSpec;

mod agent;
mod panic;
mod passive;
mod path;
mod slowness;

use self::{
    panic::panic,
    passive::eject_passive,
    path::shared_path_failure,
    slowness::{eject_outliers, fleet_slow},
};

/// Steps of a slow-start ramp: the weight goes 1/10, 2/10, … 10/10.
pub const RAMP_STEPS: u32 = 10;

/// Failure codes that may be overload rather than death: a backend failing
/// only with these can be put back in panic (so can one out on passive
/// evidence: unanswered requests are timeouts too).
const TIMEOUT_CODES: [&str; 4] = [
    "no_response",
    "response_incomplete",
    "connect_timeout",
    "no_answer",
];

/// Exits remembered for the "N transitions in T" text of a held-down backend.
const EXITS_KEPT: usize = 32;

/// A limit given as a count or a percentage of a VIP's backends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    Count(u32),
    /// 0–100.
    Percent(f64),
}

impl Limit {
    /// `max_ejected` of `n` backends: a percentage rounds down, but is at
    /// least 1 unless it is 0 (Envoy ejects one host whatever the percentage).
    pub fn max_of(self, n: usize) -> usize {
        match self {
            Self::Count(c) => c as usize,
            Self::Percent(p) if p <= 0.0 => 0,
            Self::Percent(p) => ((n as f64 * p / 100.0).floor() as usize).max(1),
        }
    }

    /// `min_healthy` of `n` backends: a percentage rounds up.
    pub fn min_of(self, n: usize) -> usize {
        match self {
            Self::Count(c) => c as usize,
            Self::Percent(p) => (n as f64 * p / 100.0).ceil() as usize,
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Count(c) => write!(f, "{c}"),
            Self::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// A VIP's protection settings (`[protection]`, `[vip.protection]`).
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// Most backends out for slowness at once. Default 10 %, at least 1.
    pub max_ejected: Limit,
    /// Fewest backends in the table before panic. Default 1; 0 disables panic.
    pub min_healthy: Limit,
    /// A slow backend is an outlier above this × its peers' median latency.
    pub outlier_factor: f64,
    /// … and above the median plus this.
    pub outlier_margin: Duration,
    /// Ramp of a returning backend's weight; zero = off.
    pub slow_start: Duration,
    pub flap_damping: bool,
    pub flap_half_life: Duration,
    /// Penalty (about one per exit from the table) at which a backend is held down.
    pub flap_limit: f64,
}

/// Defaults (documented in the README and `examples/xlb.toml`).
pub mod defaults {
    use super::Limit;
    use std::time::Duration;
    pub const MAX_EJECTED: Limit = Limit::Percent(10.0);
    pub const MIN_HEALTHY: Limit = Limit::Count(1);
    pub const OUTLIER_FACTOR: f64 = 3.0;
    pub const OUTLIER_MARGIN: Duration = Duration::from_millis(50);
    pub const SLOW_START: Duration = Duration::ZERO;
    pub const FLAP_DAMPING: bool = true;
    pub const FLAP_HALF_LIFE: Duration = Duration::from_secs(60);
    pub const FLAP_LIMIT: f64 = 4.0;
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            max_ejected: defaults::MAX_EJECTED,
            min_healthy: defaults::MIN_HEALTHY,
            outlier_factor: defaults::OUTLIER_FACTOR,
            outlier_margin: defaults::OUTLIER_MARGIN,
            slow_start: defaults::SLOW_START,
            flap_damping: defaults::FLAP_DAMPING,
            flap_half_life: defaults::FLAP_HALF_LIFE,
            flap_limit: defaults::FLAP_LIMIT,
        }
    }
}

/// What the table does with a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// In the table with its full weight.
    Serving,
    /// In the table, weight ramping up (slow start).
    Ramping,
    /// Out: slower than its peers by far (an outlier).
    EjectedSlow,
    /// Out: hard failures (`fall` of them).
    Down,
    /// Out: passing probes, but it flapped too often (damping).
    HeldDown,
    /// In the table although failing: panic put it back.
    PanicRestored,
    /// Out: drained by an operator.
    Draining,
    /// Out: not probed yet.
    Unknown,
    /// Out: its agent says `down`, `fail` or `stopped`.
    AgentDown,
    /// Out for new flows, established ones continue: its agent says
    /// `drain` (or a weight of 0 %).
    AgentDrain,
    /// As `AgentDrain`: its agent says `maint`.
    AgentMaint,
}

impl Placement {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Serving => "serving",
            Self::Ramping => "ramping",
            Self::EjectedSlow => "ejected_slow",
            Self::Down => "down",
            Self::HeldDown => "held_down",
            Self::PanicRestored => "panic_restored",
            Self::Draining => "draining",
            Self::Unknown => "unknown",
            Self::AgentDown => "agent_down",
            Self::AgentDrain => "agent_drain",
            Self::AgentMaint => "agent_maint",
        }
    }

    /// What a backend's drain and hard health alone make it, before
    /// outliers, damping, ramps and panic: where a restart starts an
    /// adopted backend, and where every evaluation starts.
    pub fn of(admin_drained: bool, health: HealthState) -> Self {
        match (admin_drained, health) {
            (true, _) => Self::Draining,
            (false, HealthState::Unknown) => Self::Unknown,
            (false, HealthState::Down) => Self::Down,
            (false, HealthState::Up) => Self::Serving,
        }
    }

    /// Whether the backend holds slots in the table (if its weight is above 0).
    pub fn in_table(self) -> bool {
        matches!(self, Self::Serving | Self::Ramping | Self::PanicRestored)
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One backend as the policy sees it: what probes say now.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    /// `ip:port`, for reasons.
    pub name: String,
    pub weight: u32,
    pub admin_drained: bool,
    /// The hard state (failures that count toward `fall`).
    pub health: HealthState,
    pub rise: u32,
    pub fall: u32,
    /// Probe interval while up: at start every backend is probed within one.
    pub interval: Duration,
    pub consecutive_ok: u32,
    pub consecutive_fail: u32,
    /// Consecutive probes that took longer than `timeout`.
    pub consecutive_slow: u32,
    /// Latency now: the slow streak's, else the recent median.
    pub latency: Option<Duration>,
    /// Whether `latency` is an answer's; `false` when the slow streak saw
    /// no answer at all (its latency is only how long it waited).
    pub answered: bool,
    /// Code and text of the last failure that counted toward `fall`.
    pub last_fail: Option<(&'static str, String)>,
    /// Failing, or down, only through the data path: its last failure was
    /// `no_answer_via_vip` (the direct probe passed) and it is failing now
    /// or still down for it. See `policy::path`.
    pub via_vip_only: bool,
    /// What its agent says (`agent_port`); `None` without one.
    pub agent: Option<AgentStatus>,
    /// Passive evidence against it, standing until `rise` probes pass
    /// (`policy::passive`): why.
    pub passive: Option<String>,
}

impl Member {
    fn eligible(&self) -> bool {
        self.weight > 0 && !self.admin_drained && self.health != HealthState::Unknown
    }

    fn slow(&self) -> bool {
        self.consecutive_slow >= self.fall.max(1)
    }
}

impl Member {
    /// Backend `name` as the policy sees it: its configured `weight` and
    /// check `spec`, its hard state `health` (adopted before any probe) and
    /// its latest probe snapshot (`None` before the first). One function, so
    /// the daemon and the benchmarks that replay its policy build the same
    /// member from the same report.
    pub fn from_snapshot(
        name: String,
        weight: u32,
        admin_drained: bool,
        health: HealthState,
        spec: &CheckSpec,
        snap: Option<&HealthSnapshot>,
    ) -> Self {
        Self {
            name,
            weight,
            admin_drained,
            health,
            rise: spec.rise,
            fall: spec.fall,
            interval: spec.interval,
            consecutive_ok: snap.map_or(0, |s| s.consecutive_ok),
            consecutive_fail: snap.map_or(0, |s| s.consecutive_fail),
            consecutive_slow: snap.map_or(0, |s| s.consecutive_slow),
            latency: snap.and_then(HealthSnapshot::current_latency),
            answered: snap.is_none_or(|s| s.consecutive_slow == 0 || s.streak_answered),
            last_fail: snap.and_then(|s| {
                let code = s.last_fail_code?;
                let text = s.last_transition_reason.clone().unwrap_or_default();
                Some((code, text))
            }),
            via_vip_only: snap.is_some_and(|s| {
                s.last_fail_code == Some("no_answer_via_vip")
                    && (s.consecutive_fail > 0 || health == HealthState::Down)
            }),
            agent: snap.and_then(|s| s.agent.clone()),
            passive: snap.and_then(|s| s.passive.clone()),
        }
    }
}

/// What the policy remembers of one backend between evaluations.
#[derive(Clone, Debug)]
pub struct MemberState {
    pub placement: Placement,
    /// Why it is placed so (for everything but `Serving`).
    pub reason: Option<String>,
    /// When `placement` last changed.
    pub since: Instant,
    /// Start of the slow-start ramp, while ramping.
    pub ramp_start: Option<Instant>,
    /// Flap penalty at `penalty_at`.
    pub penalty: f64,
    pub penalty_at: Instant,
    /// Recent exits from the table for health reasons.
    pub exits: VecDeque<Instant>,
    pub held: bool,
    /// [`Self::table_weight`] as of the last evaluation (`u32::MAX` before
    /// the first), so a ramp step taken between evaluations is seen.
    pub last_weight: u32,
    /// The agent's weight percentage as of the last evaluation (100
    /// without an agent).
    pub agent_percent: u32,
}

impl MemberState {
    /// A backend new to the policy. `placement` is what it had before (a
    /// restart adopts it, so a serving backend does not ramp again).
    pub fn new(placement: Placement, now: Instant) -> Self {
        Self {
            placement,
            reason: None,
            since: now,
            ramp_start: None,
            penalty: 0.0,
            penalty_at: now,
            exits: VecDeque::new(),
            held: false,
            last_weight: u32::MAX,
            agent_percent: 100,
        }
    }

    /// The Maglev weight: `weight × RAMP_STEPS` when serving, the ramp's
    /// step when ramping, 0 when out. Every member of a VIP uses the same
    /// scale, so shares are as configured (Maglev uses weight ratios).
    /// An agent's weight percentage scales it (`policy::agent::scale`).
    pub fn table_weight(&self, policy: &Policy, weight: u32, now: Instant) -> u32 {
        let w = match self.placement {
            Placement::Serving | Placement::PanicRestored => weight * RAMP_STEPS,
            Placement::Ramping => weight * ramp_step(policy, self.ramp_start, now),
            _ => 0,
        };
        agent::scale(w, self.agent_percent)
    }

    /// The weight as a fraction of the configured one (1.0 when serving).
    pub fn weight_fraction(&self, policy: &Policy, now: Instant) -> f64 {
        f64::from(self.agent_percent) / 100.0 * self.ramp_fraction(policy, now)
    }

    fn ramp_fraction(&self, policy: &Policy, now: Instant) -> f64 {
        match self.placement {
            Placement::Serving | Placement::PanicRestored => 1.0,
            Placement::Ramping => {
                f64::from(ramp_step(policy, self.ramp_start, now)) / f64::from(RAMP_STEPS)
            }
            _ => 0.0,
        }
    }

    fn decay(&mut self, policy: &Policy, now: Instant) {
        let dt = now.saturating_duration_since(self.penalty_at).as_secs_f64();
        let half = policy.flap_half_life.as_secs_f64();
        if half > 0.0 {
            self.penalty *= 0.5f64.powf(dt / half);
        }
        self.penalty_at = now;
    }
}

/// Step (1..=RAMP_STEPS) of a ramp started at `start`.
fn ramp_step(policy: &Policy, start: Option<Instant>, now: Instant) -> u32 {
    let (Some(start), false) = (start, policy.slow_start.is_zero()) else {
        return RAMP_STEPS;
    };
    let frac = now.saturating_duration_since(start).as_secs_f64() / policy.slow_start.as_secs_f64();
    ((frac * f64::from(RAMP_STEPS)).floor() as u32 + 1).clamp(1, RAMP_STEPS)
}

/// What the policy remembers of a VIP.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VipState {
    /// Set while in panic: which backends were put back and why.
    pub panic: Option<String>,
    /// Set while at least half of the backends are slow.
    pub fleet_slow: Option<String>,
    /// Set while most backends fail only through the data path (the LB's
    /// fault, `policy::path`): why.
    pub path_fault: Option<String>,
    /// Since when some backend has been in the table without a break.
    pub serving_since: Option<Instant>,
}

/// A change the caller logs, records as an event and applies to the maps.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Placement {
        member: usize,
        from: Placement,
        to: Placement,
        reason: String,
    },
    PanicEnter(String),
    PanicExit(String),
    FleetSlow(String),
    FleetRecovered(String),
    /// Most backends fail only through the data path: the LB's fault.
    PathFault(String),
    PathRecovered(String),
}

/// The result of one evaluation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub changes: Vec<Change>,
    /// Whether a member's table weight differs from the last evaluation's
    /// (a placement change, or a slow-start step): rebuild the table.
    pub weights_changed: bool,
}

/// Decides every member's placement. `states` is the memory of each member
/// (same order as `members`), `vip` the VIP's; both are updated.
pub fn evaluate(
    policy: &Policy,
    members: &[Member],
    states: &mut [MemberState],
    vip: &mut VipState,
    now: Instant,
) -> Outcome {
    assert_eq!(members.len(), states.len(), "one state per member");
    let mut next: Vec<(Placement, Option<String>)> = members
        .iter()
        .zip(states.iter_mut())
        .map(|(m, s)| base_placement(policy, m, s, now))
        .collect();
    let mut changes = Vec::new();
    let passive_out = eject_passive(policy, members, states, &mut next);
    eject_outliers(policy, members, states, &mut next, passive_out);
    shared_path_failure(members, &mut next, vip, &mut changes);
    fleet_slow(members, &next, vip, &mut changes);
    panic(policy, members, states, &mut next, vip, &mut changes);
    apply(
        policy,
        members,
        states,
        next,
        vip.serving_since,
        now,
        &mut changes,
    );
    let serving = states
        .iter()
        .zip(members)
        .any(|(s, m)| s.placement.in_table() && m.weight > 0);
    vip.serving_since = match (serving, vip.serving_since) {
        (true, Some(t)) => Some(t),
        (true, None) => Some(now),
        (false, _) => None,
    };
    let mut weights_changed = false;
    for (s, m) in states.iter_mut().zip(members) {
        let w = s.table_weight(policy, m.weight, now);
        weights_changed |= std::mem::replace(&mut s.last_weight, w) != w;
    }
    Outcome {
        changes,
        weights_changed,
    }
}

/// Placement from this member alone: drains, hard state, damping.
fn base_placement(
    policy: &Policy,
    m: &Member,
    s: &mut MemberState,
    now: Instant,
) -> (Placement, Option<String>) {
    s.decay(policy, now);
    if s.held && (!policy.flap_damping || s.penalty < policy.flap_limit / 2.0) {
        s.held = false;
    }
    match Placement::of(m.admin_drained, m.health) {
        Placement::Draining => (Placement::Draining, Some("admin drain".to_owned())),
        Placement::Unknown => (Placement::Unknown, Some("not probed yet".to_owned())),
        Placement::Down => (
            Placement::Down,
            Some(m.last_fail.as_ref().map_or_else(
                || "failed health checks".to_owned(),
                |(_, text)| text.clone(),
            )),
        ),
        p => match agent::placement(m) {
            Some((placement, why)) => (placement, Some(why)),
            None if s.held => (Placement::HeldDown, Some(held_text(policy, s, now))),
            None => (p, None),
        },
    }
}

fn held_text(policy: &Policy, s: &MemberState, now: Instant) -> String {
    let n = s.exits.len();
    let span = s
        .exits
        .front()
        .map_or(Duration::ZERO, |&t| now.saturating_duration_since(t));
    // Time until penalty × 2^(−t/h) < limit / 2.
    let ratio = s.penalty / (policy.flap_limit / 2.0);
    let left = if ratio > 1.0 {
        policy.flap_half_life.mul_f64(ratio.log2())
    } else {
        Duration::ZERO
    };
    format!(
        "held down: {n} transition{} in {}; back in about {} if it stays healthy",
        if n == 1 { "" } else { "s" },
        Compact(round_secs(span)),
        Compact(round_secs(left)),
    )
}

fn round_secs(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs_f64().round() as u64)
}

/// Records the new placements: slow-start ramps, flap penalties, changes.
fn apply(
    policy: &Policy,
    members: &[Member],
    states: &mut [MemberState],
    next: Vec<(Placement, Option<String>)>,
    serving_since: Option<Instant>,
    now: Instant,
    changes: &mut Vec<Change>,
) {
    // Whether some other weighted member is in the table, for each member:
    // counted once (a scan per member was quadratic, 16 M steps per
    // evaluation of a VIP of 4,000 backends when none was in the table).
    let serving = |j: usize| states[j].placement.in_table() && members[j].weight > 0;
    let in_table = (0..members.len()).filter(|&j| serving(j)).count();
    let others_in: Vec<bool> = (0..members.len())
        .map(|i| in_table - usize::from(serving(i)) > 0)
        .collect();
    for (i, (to, reason)) in next.into_iter().enumerate() {
        let m = &members[i];
        let s = &mut states[i];
        let from = s.placement;
        // Not the first probes after a start, when backends come up one by
        // one within one interval.
        let settled = serving_since.is_some_and(|t| now.saturating_duration_since(t) >= m.interval);
        let to = slow_start(policy, s, to, others_in[i] && settled, now);
        let reason = match to {
            Placement::Ramping => Some(format!(
                "slow start: weight at {}/{RAMP_STEPS} for {}",
                ramp_step(policy, s.ramp_start, now),
                Compact(policy.slow_start)
            )),
            _ => reason,
        };
        count_exit(policy, s, from, to, now);
        if from != to {
            s.since = now;
            changes.push(Change::Placement {
                member: i,
                from,
                to,
                reason: reason.clone().unwrap_or_else(|| return_text(from, m)),
            });
        }
        s.placement = to;
        s.reason = reason;
        s.agent_percent = agent::percent(m.agent.as_ref());
    }
}

/// Slow start: entering the table of a VIP that others have served for a
/// while (`may_ramp`) starts a ramp; a ramp in progress goes on until it
/// ends. Returns the placement with the ramp applied.
fn slow_start(
    policy: &Policy,
    s: &mut MemberState,
    to: Placement,
    may_ramp: bool,
    now: Instant,
) -> Placement {
    if to == Placement::Serving {
        if !s.placement.in_table() && may_ramp && !policy.slow_start.is_zero() {
            s.ramp_start = Some(now);
        }
        if ramp_step(policy, s.ramp_start, now) < RAMP_STEPS {
            return Placement::Ramping;
        }
        s.ramp_start = None;
    } else if !to.in_table() {
        s.ramp_start = None;
    }
    to
}

/// Flap damping: counts an exit from the table for health reasons (not a
/// drain, nor the end of a panic's reprieve: the backend was failing all
/// along), holds the backend down past `flap_limit`, and forgets exits the
/// penalty has forgotten.
fn count_exit(policy: &Policy, s: &mut MemberState, from: Placement, to: Placement, now: Instant) {
    if matches!(from, Placement::Serving | Placement::Ramping)
        && (matches!(to, Placement::Down | Placement::EjectedSlow) || agent::is_agent(to))
    {
        s.exits.push_back(now);
        while s.exits.len() > EXITS_KEPT {
            s.exits.pop_front();
        }
        if policy.flap_damping {
            s.penalty += 1.0;
            if s.penalty >= policy.flap_limit {
                s.held = true;
            }
        }
    }
    // Below 1/16 of one.
    let horizon = policy.flap_half_life * 4;
    while s
        .exits
        .front()
        .is_some_and(|&t| now.saturating_duration_since(t) > horizon)
    {
        s.exits.pop_front();
    }
}

/// Why a member leaving placement `from` without a reason of its own is
/// back in the table.
fn return_text(from: Placement, m: &Member) -> String {
    match from {
        Placement::Ramping => "slow start complete".to_owned(),
        Placement::EjectedSlow => "answers within timeout again".to_owned(),
        Placement::HeldDown => "flap penalty decayed".to_owned(),
        Placement::PanicRestored => "panic over".to_owned(),
        Placement::Draining => "admin enable".to_owned(),
        p if agent::is_agent(p) => agent::return_text(m),
        _ => {
            let n = m.consecutive_ok;
            format!(
                "passed {n} consecutive check{}",
                if n == 1 { "" } else { "s" }
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HealthState::{Down, Unknown, Up};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn member(i: usize) -> Member {
        Member {
            name: format!("10.0.0.{}:80", 11 + i),
            weight: 1,
            admin_drained: false,
            health: Up,
            rise: 2,
            fall: 3,
            interval: Duration::from_secs(2),
            consecutive_ok: 5,
            consecutive_fail: 0,
            consecutive_slow: 0,
            latency: Some(ms(2)),
            answered: true,
            last_fail: None,
            via_vip_only: false,
            agent: None,
            passive: None,
        }
    }

    fn slow(mut m: Member, lat: Duration) -> Member {
        m.consecutive_slow = m.fall;
        m.consecutive_ok = 0;
        m.latency = Some(lat);
        m
    }

    fn hung(mut m: Member) -> Member {
        m.health = Down;
        m.consecutive_ok = 0;
        m.consecutive_fail = 3;
        m.last_fail = Some((
            "no_response",
            "connected, no HTTP response within 3s".into(),
        ));
        m
    }

    fn refused(mut m: Member) -> Member {
        m.health = Down;
        m.consecutive_ok = 0;
        m.consecutive_fail = 3;
        m.last_fail = Some(("connection_refused", "connection refused".into()));
        m
    }

    /// A VIP under test: members, their states and a mocked clock.
    struct Vip {
        policy: Policy,
        members: Vec<Member>,
        states: Vec<MemberState>,
        vip: VipState,
        t0: Instant,
        now: Instant,
    }

    impl Vip {
        fn new(policy: Policy, n: usize) -> Self {
            let t0 = Instant::now();
            Self {
                policy,
                members: (0..n).map(member).collect(),
                states: (0..n)
                    .map(|_| MemberState::new(Placement::Serving, t0))
                    .collect(),
                vip: VipState::default(),
                t0,
                now: t0,
            }
        }

        fn at(&mut self, secs: f64) -> Outcome {
            self.now = self.t0 + Duration::from_secs_f64(secs);
            evaluate(
                &self.policy,
                &self.members,
                &mut self.states,
                &mut self.vip,
                self.now,
            )
        }

        fn placements(&self) -> Vec<Placement> {
            self.states.iter().map(|s| s.placement).collect()
        }

        fn weights(&self) -> Vec<u32> {
            self.states
                .iter()
                .zip(&self.members)
                .map(|(s, m)| s.table_weight(&self.policy, m.weight, self.now))
                .collect()
        }
    }

    use Placement::{
        Down as PDown, EjectedSlow, HeldDown, PanicRestored, Ramping, Serving, Unknown as PUnknown,
    };

    #[test]
    fn limits() {
        let cases = [
            (Limit::Percent(10.0), 3, 1, 1),
            (Limit::Percent(10.0), 30, 3, 3),
            (Limit::Percent(50.0), 3, 1, 2),
            (Limit::Percent(0.0), 10, 0, 0),
            (Limit::Count(2), 3, 2, 2),
            (Limit::Count(0), 3, 0, 0),
        ];
        for (limit, n, max, min) in cases {
            assert_eq!(limit.max_of(n), max, "{limit} of {n} as max_ejected");
            assert_eq!(limit.min_of(n), min, "{limit} of {n} as min_healthy");
        }
    }

    /// Table: members in, placements out, with the default policy.
    #[test]
    fn placements_by_case() {
        struct Case {
            name: &'static str,
            members: Vec<Member>,
            want: Vec<Placement>,
            panic: bool,
            fleet_slow: bool,
        }
        let m = member;
        let cases = [
            Case {
                name: "all fast",
                members: vec![m(0), m(1), m(2)],
                want: vec![Serving, Serving, Serving],
                panic: false,
                fleet_slow: false,
            },
            Case {
                name: "seed 003: all slow, none ejected",
                members: vec![
                    slow(m(0), ms(2500)),
                    slow(m(1), ms(2500)),
                    slow(m(2), ms(2600)),
                ],
                want: vec![Serving, Serving, Serving],
                panic: false,
                fleet_slow: true,
            },
            Case {
                name: "one hung-slow outlier among fast peers is ejected",
                members: vec![m(0), slow(m(1), ms(100)), m(2)],
                want: vec![Serving, EjectedSlow, Serving],
                panic: false,
                fleet_slow: false,
            },
            Case {
                name: "slow but within factor of peers stays",
                members: vec![slow(m(0), ms(1000)), slow(m(1), ms(1500)), m(2)],
                want: vec![Serving, Serving, Serving],
                panic: false,
                fleet_slow: true,
            },
            Case {
                name: "two outliers, max_ejected 10% of 3 = 1: the slowest goes",
                members: vec![slow(m(0), ms(1200)), slow(m(1), ms(3000)), m(2), m(3), m(4)],
                want: vec![Serving, EjectedSlow, Serving, Serving, Serving],
                panic: false,
                fleet_slow: false,
            },
            Case {
                name: "below the absolute margin is no outlier",
                members: vec![slow(m(0), ms(30)), m(1), m(2)],
                want: vec![Serving, Serving, Serving],
                panic: false,
                fleet_slow: false,
            },
            Case {
                name: "one hard down is simply down",
                members: vec![m(0), hung(m(1)), m(2)],
                want: vec![Serving, PDown, Serving],
                panic: false,
                fleet_slow: false,
            },
            Case {
                name: "all hung: panic keeps the least-bad one (min_healthy 1)",
                members: vec![
                    {
                        let mut h = hung(m(0));
                        h.consecutive_fail = 9;
                        h
                    },
                    hung(m(1)),
                    {
                        let mut h = hung(m(2));
                        h.consecutive_fail = 5;
                        h
                    },
                ],
                want: vec![PDown, PanicRestored, PDown],
                panic: true,
                fleet_slow: false,
            },
            Case {
                name: "all refused: panic cannot put any back, table empty",
                members: vec![refused(m(0)), refused(m(1))],
                want: vec![PDown, PDown],
                panic: true,
                fleet_slow: false,
            },
            Case {
                name: "unknown and drained are not counted",
                members: vec![
                    {
                        let mut u = m(0);
                        u.health = Unknown;
                        u
                    },
                    {
                        let mut d = m(1);
                        d.admin_drained = true;
                        d
                    },
                    m(2),
                ],
                want: vec![PUnknown, Placement::Draining, Serving],
                panic: false,
                fleet_slow: false,
            },
        ];
        for case in cases {
            let n = case.members.len();
            let mut vip = Vip::new(Policy::default(), n);
            vip.members = case.members;
            vip.at(1.0);
            assert_eq!(vip.placements(), case.want, "{}", case.name);
            assert_eq!(vip.vip.panic.is_some(), case.panic, "{}: panic", case.name);
            assert_eq!(
                vip.vip.fleet_slow.is_some(),
                case.fleet_slow,
                "{}: fleet slow {:?}",
                case.name,
                vip.vip.fleet_slow
            );
        }
    }

    #[test]
    fn fleet_slow_is_one_event_each_way() {
        let mut vip = Vip::new(Policy::default(), 3);
        assert!(vip.at(1.0).changes.is_empty());
        vip.members = (0..3).map(|i| slow(member(i), ms(2500))).collect();
        let out = vip.at(2.0);
        assert_eq!(out.changes.len(), 1, "{out:?}");
        let Change::FleetSlow(text) = &out.changes[0] else {
            panic!("{out:?}")
        };
        assert_eq!(
            text,
            "all 3 backends slow, median 2.5s; not ejecting (slowness shared by the VIP is load, \
             not failure)"
        );
        assert!(!out.weights_changed);
        assert!(vip.at(3.0).changes.is_empty(), "no repeat while it lasts");
        vip.members = (0..3).map(member).collect();
        let out = vip.at(4.0);
        assert!(
            matches!(&out.changes[..], [Change::FleetRecovered(_)]),
            "{out:?}"
        );
    }

    #[test]
    fn ejected_outlier_returns_after_rise_fast_answers() {
        let mut vip = Vip::new(Policy::default(), 3);
        vip.members[1] = slow(member(1), ms(2000));
        vip.at(1.0);
        assert_eq!(vip.placements()[1], EjectedSlow);
        let reason = vip.states[1].reason.clone().unwrap();
        assert!(
            reason.starts_with("slow outlier: answers in 2s against a median of 2ms"),
            "{reason}"
        );
        // One fast answer: not yet (rise 2).
        vip.members[1] = member(1);
        vip.members[1].consecutive_ok = 1;
        vip.at(2.0);
        assert_eq!(vip.placements()[1], EjectedSlow);
        vip.members[1].consecutive_ok = 2;
        let out = vip.at(3.0);
        assert_eq!(vip.placements()[1], Serving);
        assert!(out.weights_changed);
    }

    #[test]
    fn panic_enter_and_exit() {
        let policy = Policy {
            min_healthy: Limit::Count(2),
            ..Policy::default()
        };
        let mut vip = Vip::new(policy, 3);
        vip.members[0] = hung(member(0));
        vip.members[1] = hung(member(1));
        vip.members[1].consecutive_fail = 7;
        let out = vip.at(1.0);
        assert_eq!(vip.placements(), vec![PanicRestored, PDown, Serving]);
        let enter: Vec<_> = out
            .changes
            .iter()
            .filter_map(|c| match c {
                Change::PanicEnter(t) => Some(t.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            enter,
            vec![
                "1 of 3 backends healthy (min_healthy 2); keeping 10.0.0.11:80 (connected, no HTTP \
                 response within 3s) in the table (timeouts and slowness may be overload)"
                    .to_owned()
            ]
        );
        assert!(vip.at(2.0).changes.is_empty(), "panic is reported once");
        vip.members[0] = member(0);
        let out = vip.at(3.0);
        assert!(
            out.changes
                .iter()
                .any(|c| matches!(c, Change::PanicExit(_))),
            "{out:?}"
        );
        assert!(vip.vip.panic.is_none());
        assert_eq!(vip.placements()[0], Serving);
    }

    /// Issue 24: a backend whose probes all passed `timeout` and one of
    /// which then failed at `hang_timeout` without an answer was "slow
    /// outlier: answers in 3.001s". It never answered: say so, with the
    /// bound it waited for.
    #[test]
    fn an_outlier_that_never_answered_says_so() {
        use crate::health::machine::HealthMachine;
        use crate::health::probe::{FailReason, ProbeResult};
        let (timeout, hang) = (Duration::from_secs(1), Duration::from_secs(3));
        let spec = crate::health::testutil::http_spec_hang(80, timeout, hang);
        let t0 = Instant::now();
        let mut machine = HealthMachine::adopted(Up, spec.rise, spec.fall, t0);
        for _ in 0..spec.fall {
            machine.observe_late(timeout);
        }
        let hung = ProbeResult {
            outcome: Err(FailReason::NoResponse { timeout: hang }),
            latency: hang + ms(1),
            path_fault: None,
        };
        machine.observe(&hung, &hung.class(timeout), true, t0);
        let snap = machine.snapshot();
        let mut vip = Vip::new(Policy::default(), 3);
        vip.members[2] =
            Member::from_snapshot("10.0.0.13:80".into(), 1, false, Up, &spec, Some(&snap));
        vip.at(1.0);
        assert_eq!(vip.placements()[2], EjectedSlow);
        let reason = vip.states[2].reason.clone().unwrap();
        assert!(
            reason.starts_with("slow outlier: no answer within 3s against a median of 2ms"),
            "{reason}"
        );
        // A late answer in the same streak, quicker than the wait: the
        // streak's greatest latency is still one that saw no answer.
        let late = ProbeResult {
            outcome: Ok(crate::health::probe::ProbeOk { status: Some(200) }),
            latency: Duration::from_millis(2500),
            path_fault: None,
        };
        machine.observe_late(timeout);
        machine.observe(&late, &late.class(timeout), true, t0);
        let snap = machine.snapshot();
        assert_eq!(
            (snap.streak_latency, snap.streak_answered),
            (Some(hang), false)
        );
    }

    /// A member whose data-path probes fail while its direct probes pass,
    /// down for it (`down`) or still within `fall`.
    fn via_vip_only(mut m: Member, down: bool) -> Member {
        if down {
            m.health = Down;
            m.consecutive_ok = 0;
        }
        m.consecutive_fail = if down { 3 } else { 1 };
        m.via_vip_only = true;
        m.last_fail = Some((
            "no_answer_via_vip",
            "no answer via VIP 10.100.0.1:80 through dsr-ipip (connect timeout after 3s); \
             direct probe ok"
                .into(),
        ));
        m
    }

    fn path_changes(out: &Outcome) -> Vec<&Change> {
        out.changes
            .iter()
            .filter(|c| matches!(c, Change::PathFault(_) | Change::PathRecovered(_)))
            .collect()
    }

    /// Issue 24: most of a VIP failing only through the data path is the
    /// LB's fault; the backends stay as their direct probes say, the VIP
    /// is not emptied, and the change is told once each way. One backend
    /// alone failing so (a stopped decapsulator) is still taken out.
    #[test]
    fn shared_data_path_failure_keeps_the_backends() {
        let mut vip = Vip::new(Policy::default(), 3);
        vip.members = vec![
            via_vip_only(member(0), true),
            via_vip_only(member(1), true),
            via_vip_only(member(2), false),
        ];
        let out = vip.at(1.0);
        assert_eq!(vip.placements(), vec![Serving, Serving, Serving]);
        assert!(vip.vip.panic.is_none());
        let told = path_changes(&out);
        assert!(
            matches!(told[..], [Change::PathFault(t)] if t.starts_with(
                "data-path probes fail for 3 of 3 backends while their direct probes pass"
            )),
            "{told:?}"
        );
        assert!(path_changes(&vip.at(2.0)).is_empty(), "told once");
        // The path is fixed: passing again, two still short of `rise`.
        vip.members[0] = member(0);
        for i in [1, 2] {
            vip.members[i].consecutive_fail = 0;
            vip.members[i].consecutive_ok = 1;
        }
        vip.members[2].health = Down;
        let out = vip.at(3.0);
        assert_eq!(
            vip.placements(),
            vec![Serving, Serving, Serving],
            "recovering backends do not drop out"
        );
        assert!(path_changes(&out).is_empty(), "{out:?}");
        vip.members = (0..3).map(member).collect();
        let out = vip.at(4.0);
        assert!(
            matches!(path_changes(&out)[..], [Change::PathRecovered(_)]),
            "{out:?}"
        );
        assert!(vip.vip.path_fault.is_none());
        // One of three: that backend's own path.
        let mut one = Vip::new(Policy::default(), 3);
        one.members[1] = via_vip_only(member(1), true);
        let out = one.at(1.0);
        assert_eq!(one.placements(), vec![Serving, PDown, Serving]);
        assert!(path_changes(&out).is_empty(), "{out:?}");
        // A VIP of one backend cannot tell its path from the LB's.
        let mut single = Vip::new(Policy::default(), 1);
        single.members[0] = via_vip_only(member(0), true);
        single.at(1.0);
        assert_eq!(single.placements(), vec![PDown]);
    }

    /// The data-path wait of a backend failing only through the data path
    /// is not its slowness: it is never taken for a slow outlier (nor
    /// counted as fleet slowness), and one ejected as slow before the VIP's
    /// shared path failure was recognised comes back with the others.
    #[test]
    fn data_path_waits_are_not_slowness() {
        let waited = |i: usize| {
            let mut m = slow(via_vip_only(member(i), false), ms(750));
            m.answered = false;
            m
        };
        let mut vip = Vip::new(Policy::default(), 4);
        vip.members[3] = waited(3);
        let out = vip.at(1.0);
        assert_eq!(vip.placements()[3], Serving, "{out:?}");
        assert!(vip.vip.fleet_slow.is_none());
        // Ejected as slow before its first data-path verdict, then most of
        // the VIP fails the same way: back in.
        vip.states[3].placement = EjectedSlow;
        vip.members = (0..4).map(waited).collect();
        vip.at(2.0);
        assert_eq!(vip.placements(), vec![Serving; 4]);
        assert!(vip.vip.path_fault.is_some());
        assert!(vip.vip.fleet_slow.is_none(), "{:?}", vip.vip.fleet_slow);
    }

    /// Issue 24: two backends, one failing only through the data path, the
    /// other not probed yet. Panic said "0 of 1 backends healthy … every
    /// failing backend refused, reset or answered wrongly": the count left
    /// out the unprobed one and the cause was made up.
    #[test]
    fn panic_states_true_counts_and_causes() {
        let mut vip = Vip::new(Policy::default(), 3);
        vip.members[0] = refused(member(0));
        vip.members[1] = refused(member(1));
        vip.members[1].last_fail = Some((
            "no_answer_via_vip",
            "no answer via VIP 10.100.0.1:80 through dsr-ipip (connect timeout after 3s); \
             direct probe ok"
                .into(),
        ));
        vip.members[2].health = Unknown;
        vip.states[2] = MemberState::new(Placement::Unknown, vip.t0);
        let out = vip.at(1.0);
        let enter: Vec<_> = out
            .changes
            .iter()
            .filter_map(|c| match c {
                Change::PanicEnter(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(
            enter,
            [
                "0 of 3 backends healthy (min_healthy 1; 1 not probed yet); none can be put \
                 back: 1 connection_refused, 1 no_answer_via_vip (only timeouts and slowness \
                 may be overload); the table is empty"
            ]
        );
    }

    #[test]
    fn no_panic_before_anything_is_probed_and_min_is_capped() {
        let mut vip = Vip::new(Policy::default(), 3);
        vip.states = (0..3)
            .map(|_| MemberState::new(Placement::Unknown, vip.t0))
            .collect();
        for m in &mut vip.members {
            m.health = Unknown;
        }
        let out = vip.at(0.0);
        assert!(out.changes.is_empty(), "{out:?}");
        assert!(vip.vip.panic.is_none());
        // min_healthy 3 with only one backend probed (and serving): no panic.
        vip.policy.min_healthy = Limit::Count(3);
        vip.members[0] = member(0);
        vip.at(1.0);
        assert!(vip.vip.panic.is_none(), "{:?}", vip.vip.panic);
    }

    #[test]
    fn panic_keeps_its_choice_and_does_not_feed_damping() {
        let policy = Policy {
            min_healthy: Limit::Count(2),
            flap_limit: 2.0,
            ..Policy::default()
        };
        let mut vip = Vip::new(policy, 3);
        vip.members[1] = hung(member(1));
        vip.members[2] = hung(member(2));
        vip.members[2].consecutive_fail = 4;
        vip.at(1.0);
        assert_eq!(vip.placements(), vec![Serving, PanicRestored, PDown]);
        // Failure counts move past each other: panic keeps 1, it does not swap.
        for (t, f1, f2) in [(2.0, 6, 5), (3.0, 9, 6), (4.0, 12, 7)] {
            vip.members[1].consecutive_fail = f1;
            vip.members[2].consecutive_fail = f2;
            let out = vip.at(t);
            assert!(out.changes.is_empty(), "t={t}: {out:?}");
        }
        // Both recover: out of panic, nobody held down.
        vip.members = (0..3).map(member).collect();
        vip.at(5.0);
        assert_eq!(vip.placements(), vec![Serving, Serving, Serving]);
        assert!(vip.vip.panic.is_none());
        // One exit each (when they hung), none for panic's choices.
        assert!(
            vip.states.iter().all(|s| s.penalty <= 1.0 && !s.held),
            "{:?}",
            vip.states
        );
    }

    #[test]
    fn panic_off_lets_the_table_empty() {
        let policy = Policy {
            min_healthy: Limit::Count(0),
            ..Policy::default()
        };
        let mut vip = Vip::new(policy, 2);
        vip.members = vec![hung(member(0)), hung(member(1))];
        vip.at(1.0);
        assert_eq!(vip.placements(), vec![PDown, PDown]);
        assert!(vip.vip.panic.is_none());
    }

    #[test]
    fn slow_start_ramps_in_steps() {
        let policy = Policy {
            slow_start: Duration::from_secs(10),
            ..Policy::default()
        };
        let mut vip = Vip::new(policy, 3);
        vip.members[2] = hung(member(2));
        vip.at(0.0);
        assert_eq!(vip.weights(), vec![10, 10, 0]);
        vip.members[2] = member(2);
        let out = vip.at(3.0);
        assert!(out.weights_changed);
        assert_eq!(vip.placements()[2], Ramping);
        let mut seen = Vec::new();
        for t in [3.0, 4.0, 7.5, 12.9, 13.0, 14.0] {
            vip.at(t);
            seen.push(vip.weights()[2]);
        }
        assert_eq!(seen, vec![1, 2, 5, 10, 10, 10]);
        assert_eq!(vip.placements()[2], Serving);
        assert_eq!(vip.weights(), vec![10, 10, 10]);
    }

    #[test]
    fn no_ramp_for_the_first_probes_after_a_start() {
        let policy = Policy {
            slow_start: Duration::from_secs(10),
            ..Policy::default()
        };
        let mut vip = Vip::new(policy, 3);
        vip.states = (0..3)
            .map(|_| MemberState::new(Placement::Unknown, vip.t0))
            .collect();
        vip.members = (0..3)
            .map(|i| {
                let mut m = member(i);
                m.health = Unknown;
                m
            })
            .collect();
        // Backends come up one by one within the first interval (2 s).
        for (i, t) in [(0, 0.3), (1, 1.1), (2, 1.9)] {
            vip.members[i] = member(i);
            vip.at(t);
        }
        assert_eq!(vip.placements(), vec![Serving, Serving, Serving]);
    }

    #[test]
    fn no_ramp_when_nothing_else_serves() {
        let policy = Policy {
            slow_start: Duration::from_secs(10),
            ..Policy::default()
        };
        let mut vip = Vip::new(policy, 2);
        vip.members = vec![hung(member(0)), refused(member(1))];
        vip.policy.min_healthy = Limit::Count(0);
        vip.at(0.0);
        vip.members[0] = member(0);
        vip.at(1.0);
        assert_eq!(
            vip.placements()[0],
            Serving,
            "the only backend takes all at once"
        );
    }

    #[test]
    fn flapping_is_held_down_then_released() {
        let policy = Policy {
            flap_half_life: Duration::from_secs(10),
            flap_limit: 2.5,
            ..Policy::default()
        };
        let mut vip = Vip::new(policy, 3);
        let mut t = 0.0;
        for _ in 0..3 {
            vip.members[0] = refused(member(0));
            vip.at(t);
            assert_eq!(vip.placements()[0], PDown);
            vip.members[0] = member(0);
            vip.at(t + 0.5);
            t += 1.0;
        }
        assert_eq!(vip.placements()[0], HeldDown);
        let reason = vip.states[0].reason.clone().unwrap();
        assert!(
            reason.starts_with("held down: 3 transitions in 3s"),
            "{reason}"
        );
        // Penalty ≈ 2.7 at t = 2.5; below half the limit (1.25) after about
        // 11.2 s more.
        vip.at(13.0);
        assert_eq!(vip.placements()[0], HeldDown);
        let out = vip.at(14.0);
        assert_eq!(vip.placements()[0], Serving);
        assert!(out.changes.iter().any(|c| matches!(
            c,
            Change::Placement { from: HeldDown, to: Serving, reason, .. } if reason == "flap penalty decayed"
        )));
    }

    #[test]
    fn damping_off_never_holds() {
        let policy = Policy {
            flap_damping: false,
            ..Policy::default()
        };
        let mut vip = Vip::new(policy, 2);
        for i in 0..10 {
            vip.members[0] = refused(member(0));
            vip.at(f64::from(i));
            vip.members[0] = member(0);
            vip.at(f64::from(i) + 0.5);
            assert_eq!(vip.placements()[0], Serving);
        }
    }

    #[test]
    fn max_ejected_zero_disables_outliers() {
        let policy = Policy {
            max_ejected: Limit::Count(0),
            ..Policy::default()
        };
        let mut vip = Vip::new(policy, 3);
        vip.members[1] = slow(member(1), ms(2000));
        vip.at(1.0);
        assert_eq!(vip.placements(), vec![Serving, Serving, Serving]);
    }

    /// `m` with an agent that last answered `line`.
    fn agent_says(mut m: Member, line: &[u8]) -> Member {
        let mut a = m.agent.take().unwrap_or_default();
        a.record(crate::health::agent::parse(line), Instant::now());
        m.agent = Some(a);
        m
    }

    use Placement::{AgentDown, AgentDrain, AgentMaint};

    #[test]
    fn agent_words_place_the_backend() {
        let cases: [(&[u8], Placement, Option<&str>); 8] = [
            (b"up", Serving, None),
            (b"ready 100%", Serving, None),
            (
                b"down#disk full",
                AgentDown,
                Some("agent says \"down\" (disk full)"),
            ),
            (b"FAIL", AgentDown, Some("agent says \"fail\"")),
            (b"stopped", AgentDown, Some("agent says \"stopped\"")),
            (
                b"75%, drain #deploy",
                AgentDrain,
                Some("agent says \"drain\" (deploy)"),
            ),
            (b"maint", AgentMaint, Some("agent says \"maint\"")),
            (b"0%", AgentDrain, Some("agent set weight 0%")),
        ];
        for (line, want, reason) in cases {
            let mut vip = Vip::new(Policy::default(), 3);
            vip.members[0] = agent_says(member(0), line);
            let out = vip.at(1.0);
            let shown = String::from_utf8_lossy(line);
            assert_eq!(vip.placements(), vec![want, Serving, Serving], "{shown}");
            assert_eq!(vip.states[0].reason.as_deref(), reason, "{shown}");
            assert_eq!(out.changes.is_empty(), want == Serving, "{shown}");
            assert_eq!(want.in_table(), want == Serving, "{shown}");
        }
    }

    #[test]
    fn agent_weight_scales_the_table_weight() {
        let mut vip = Vip::new(Policy::default(), 3);
        vip.members[0].weight = 3;
        vip.members[0] = agent_says(vip.members[0].clone(), b"50%");
        vip.members[1] = agent_says(member(1), b"1%");
        vip.members[2] = agent_says(member(2), b"999%");
        let out = vip.at(1.0);
        assert!(out.weights_changed);
        assert_eq!(vip.placements(), vec![Serving, Serving, Serving]);
        // 3 × 10 × 50 % = 15; 10 × 1 % = 0.1, kept at 1; capped at 256 %.
        assert_eq!(vip.weights(), vec![15, 1, 26]);
        assert!((vip.states[0].weight_fraction(&vip.policy, vip.now) - 0.5).abs() < 1e-9);
        // Back to 100 %: the weight changes, nothing else.
        vip.members[0] = agent_says(vip.members[0].clone(), b"up 100%");
        let out = vip.at(2.0);
        assert!(out.weights_changed && out.changes.is_empty());
        assert_eq!(vip.weights()[0], 30);
        assert_eq!(agent::scale(10, 33), 3);
        assert_eq!(agent::scale(10, 35), 4, "rounded");
        assert_eq!(agent::scale(0, 50), 0);
    }

    #[test]
    fn agent_drain_is_undone_by_ready_and_ramps_back() {
        let policy = Policy {
            slow_start: Duration::from_secs(10),
            ..Policy::default()
        };
        let mut vip = Vip::new(policy, 3);
        vip.at(0.0);
        vip.members[2] = agent_says(member(2), b"drain #deploy");
        vip.at(3.0);
        assert_eq!(vip.placements()[2], AgentDrain);
        assert_eq!(vip.weights(), vec![10, 10, 0]);
        // A weight alone does not undo the drain (the word is sticky).
        vip.members[2] = agent_says(vip.members[2].clone(), b"80%");
        vip.at(4.0);
        assert_eq!(vip.placements()[2], AgentDrain);
        vip.members[2] = agent_says(vip.members[2].clone(), b"ready");
        let out = vip.at(5.0);
        assert_eq!(vip.placements()[2], Ramping);
        assert_eq!(vip.weights()[2], 1, "first step of 10, at 80 %: 0.8 → 1");
        assert!(out.changes.iter().any(|c| matches!(
            c,
            Change::Placement {
                member: 2,
                from: AgentDrain,
                to: Ramping,
                ..
            }
        )));
        vip.at(15.0);
        assert_eq!(vip.placements()[2], Serving);
        assert_eq!(vip.weights()[2], 8);
    }

    #[test]
    fn agent_return_says_its_words() {
        let mut vip = Vip::new(Policy::default(), 2);
        vip.members[1] = agent_says(member(1), b"maint");
        vip.at(1.0);
        vip.members[1] = agent_says(vip.members[1].clone(), b"UP #done");
        let out = vip.at(2.0);
        assert_eq!(
            out.changes,
            vec![Change::Placement {
                member: 1,
                from: AgentMaint,
                to: Serving,
                reason: "agent says \"up\" (done)".to_owned(),
            }]
        );
    }

    #[test]
    fn agent_exits_count_toward_flap_damping() {
        let mut vip = Vip::new(Policy::default(), 3);
        let mut t = 0.0;
        // The penalty decays meanwhile: 5 exits reach the limit of 4.
        for _ in 0..5 {
            vip.members[0] = agent_says(member(0), b"down");
            t += 1.0;
            vip.at(t);
            assert_eq!(vip.placements()[0], AgentDown);
            vip.members[0] = agent_says(member(0), b"up");
            t += 1.0;
            vip.at(t);
        }
        assert_eq!(vip.placements()[0], HeldDown, "5 exits in 10 s");
    }

    #[test]
    fn panic_puts_agent_down_back_last() {
        // All three say down: panic keeps one rather than empty the VIP.
        let mut vip = Vip::new(Policy::default(), 3);
        for i in 0..3 {
            vip.members[i] = agent_says(member(i), b"down #rollout");
        }
        let out = vip.at(1.0);
        assert!(
            out.changes
                .iter()
                .any(|c| matches!(c, Change::PanicEnter(_)))
        );
        let placements = vip.placements();
        assert_eq!(
            placements.iter().filter(|p| **p == PanicRestored).count(),
            1
        );
        assert_eq!(placements.iter().filter(|p| **p == AgentDown).count(), 2);
        assert!(vip.weights().iter().sum::<u32>() > 0, "the VIP serves");
        let text = vip.vip.panic.clone().unwrap();
        assert!(
            text.contains("agent says \"down\" (rollout)")
                && text.ends_with("; agents that take every backend out are overruled"),
            "{text}"
        );

        // Others first: a hung (timeouts only) backend is put back before
        // an agent-drained one, which goes before an agent-down one.
        let mut vip = Vip::new(Policy::default(), 3);
        vip.members[0] = agent_says(member(0), b"down");
        vip.members[1] = hung(member(1));
        vip.members[2] = agent_says(member(2), b"drain");
        vip.at(1.0);
        assert_eq!(vip.placements(), vec![AgentDown, PanicRestored, AgentDrain]);
        let mut vip = Vip::new(Policy::default(), 2);
        vip.members[0] = agent_says(member(0), b"down");
        vip.members[1] = agent_says(member(1), b"maint");
        vip.at(1.0);
        assert_eq!(vip.placements(), vec![AgentDown, PanicRestored]);
    }

    #[test]
    fn a_failing_probe_outranks_the_agent() {
        let mut vip = Vip::new(Policy::default(), 3);
        vip.members[0] = agent_says(refused(member(0)), b"up");
        vip.members[1] = agent_says(refused(member(1)), b"drain");
        vip.at(1.0);
        assert_eq!(vip.placements(), vec![PDown, PDown, Serving]);
    }
}
