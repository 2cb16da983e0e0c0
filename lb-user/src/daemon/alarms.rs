//! Capacity alarms, from the periodic conntrack walk (issue 9, seed 001: the
//! proxy ran out of connection slots and nobody knew for 41 minutes):
//! - the connection tracking table holding established flows for 80 % and
//!   then 95 % of `daemon.conntrack_size`: past that, new flows evict live
//!   ones (the least recently used) and an evicted flow loses its backend
//!   when the table changes. Idle entries do not count: the LRU keeps them
//!   until it needs the room, so a table full of them is normal;
//! - a backend holding more established flows than its `max_flows` (the
//!   maxconn alarm of the seed);
//! - new flows forwarded without a conntrack entry because a CPU went over
//!   `guard.ct_insert_cap` (the `ct_insert_capped` counter grows): a flood
//!   of new flows, or a cap too low for the load. Those flows follow the
//!   table, so they lose their backend when it changes.
//!
//! - data-path probes of a VIP failing by this host's fault (no route to the
//!   VIP out of the interface through a gateway, a neighbour that never
//!   resolves: issue 24): the backends are judged by their direct probes
//!   meanwhile, so the operator must hear of it from here.
//!
//! Each is an `alarm` event and a warning when raised, and an event when it
//! clears, with hysteresis so a value hovering at a threshold does not
//! repeat itself.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::Daemon;
use crate::ctl::EventKind;
use crate::health::{probe::ProbeResult, spec::Via};

/// The data plane's reason counters, summed over CPUs: read once a tick
/// (`on_tick`) for every alarm that watches one.
pub(super) type Counters = HashMap<lb_common::Stat, u64>;

/// While data-path probes of a VIP keep failing by this host's fault, at
/// most one event per this long (every probe of every backend sees it).
pub(super) const PATH_REPEAT: Duration = Duration::from_secs(60);

/// The data-path alarm of each VIP (by name): raised by the first probe
/// that failed by this host's fault, told again at most every
/// [`PATH_REPEAT`] while it lasts, cleared by the first data-path probe of
/// the VIP that passes.
#[derive(Debug, Default)]
pub(super) struct PathAlarms {
    /// VIP → when its alarm was last told.
    raised: HashMap<String, Instant>,
}

impl PathAlarms {
    /// A data-path probe of `vip` failed by this host's fault at `now`:
    /// whether to tell (raised, or due again).
    pub(super) fn fault(&mut self, vip: &str, now: Instant) -> bool {
        match self.raised.get_mut(vip) {
            Some(told) if now.saturating_duration_since(*told) < PATH_REPEAT => false,
            Some(told) => {
                *told = now;
                true
            }
            None => {
                self.raised.insert(vip.to_owned(), now);
                true
            }
        }
    }

    /// A data-path probe of `vip` passed: whether that clears its alarm.
    pub(super) fn passed(&mut self, vip: &str) -> bool {
        self.raised.remove(vip).is_some()
    }
}

/// Fill levels of the conntrack table that raise an alarm, % of capacity.
pub(super) const FILL_LEVELS: [u64; 2] = [80, 95];
/// How far below its level a fill alarm clears, percentage points.
const FILL_HYSTERESIS: u64 = 5;
/// A `max_flows` alarm clears below this share of `max_flows`, %.
const FLOWS_CLEAR_PERCENT: u64 = 90;

/// One alarm with hysteresis: raised when a value reaches `on`, cleared
/// when it falls below `off` (`off` ≤ `on`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Level {
    raised: bool,
}

/// What [`Level::update`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edge {
    Raised,
    Cleared,
}

impl Level {
    /// Feeds the latest `value`; the edge, if it crossed one.
    pub fn update(&mut self, value: u64, on: u64, off: u64) -> Option<Edge> {
        if !self.raised && value >= on {
            self.raised = true;
            Some(Edge::Raised)
        } else if self.raised && value < off {
            self.raised = false;
            Some(Edge::Cleared)
        } else {
            None
        }
    }
}

/// The fill alarms of the conntrack table, one [`Level`] per
/// [`FILL_LEVELS`] entry.
#[derive(Debug, Default)]
pub(super) struct FillAlarms {
    levels: [Level; FILL_LEVELS.len()],
}

impl FillAlarms {
    /// Feeds `flows` established flows of `capacity`; one line per level
    /// that was raised or cleared.
    pub(super) fn update(&mut self, flows: u64, capacity: u64) -> Vec<(Edge, String)> {
        if capacity == 0 {
            return Vec::new();
        }
        // Rounded down, so 79.9 % does not raise the 80 % alarm.
        let pct = flows.saturating_mul(100) / capacity;
        let mut out = Vec::new();
        for (level, &at) in self.levels.iter_mut().zip(&FILL_LEVELS) {
            match level.update(pct, at, at - FILL_HYSTERESIS) {
                Some(Edge::Raised) => out.push((
                    Edge::Raised,
                    format!(
                        "conntrack {pct}% full (at least {at}%): {flows} established flows of \
                         daemon.conntrack_size {capacity}; beyond it new flows evict live ones. \
                         Look for a flood or a client opening too many connections \
                         (xlb status, per-backend FLOWS), or raise conntrack_size \
                         (fixed at pin time: xlb detach and a new start drop flows)"
                    ),
                )),
                Some(Edge::Cleared) => out.push((
                    Edge::Cleared,
                    format!(
                        "conntrack back below {}% full: {flows} established flows of {capacity}",
                        at - FILL_HYSTERESIS
                    ),
                )),
                None => {}
            }
        }
        out
    }
}

/// The line of a backend's `max_flows` alarm that `edge` raised or cleared.
pub fn max_flows_text(edge: Edge, addr: &str, flows: u64, max: u64) -> String {
    match edge {
        Edge::Raised => format!(
            "backend {addr} holds {flows} established flows, more than its max_flows {max}: \
             it may run out of connection slots; drain it, add backends, or find the \
             client opening them"
        ),
        Edge::Cleared => format!(
            "backend {addr} back to {flows} established flows (below {FLOWS_CLEAR_PERCENT}% of \
             max_flows {max})"
        ),
    }
}

/// Where a `max_flows` alarm clears.
pub fn max_flows_off(max: u64) -> u64 {
    max.saturating_mul(FLOWS_CLEAR_PERCENT) / 100
}

/// While `ct_insert_capped` keeps growing, at most one event per this long.
pub(super) const CAPPED_REPEAT: Duration = Duration::from_secs(10);
/// `ct_insert_capped` unchanged for this long: the alarm clears (one quiet
/// second of a bursty flood does not clear and raise it again).
pub(super) const CAPPED_QUIET: Duration = Duration::from_secs(3);

/// The insert-cap alarm: raised when `ct_insert_capped` grows, repeated at
/// most every [`CAPPED_REPEAT`] while it keeps growing, cleared once it
/// stays put for [`CAPPED_QUIET`].
#[derive(Debug, Default)]
pub(super) struct CappedAlarm {
    /// The counter at the last sample, and when it last grew.
    last: Option<u64>,
    grew_at: Option<Instant>,
    /// Since when it is raised, the counter then, and the last event.
    raised: Option<(Instant, u64)>,
    told_at: Option<Instant>,
}

impl CappedAlarm {
    /// Feeds the counter's value at `now`; the event to record, if any.
    /// The first value is the baseline: what grew before the daemon
    /// started is not news.
    pub(super) fn update(
        &mut self,
        value: u64,
        now: Instant,
        cap: Option<u64>,
    ) -> Option<(Edge, String)> {
        let last = self.last.replace(value)?;
        // A smaller value: the maps were re-created; a new baseline.
        let grew = value.saturating_sub(last);
        let cap = cap.map_or_else(|| "not set".to_owned(), |c| format!("{c}/s per CPU"));
        if grew > 0 {
            self.grew_at = Some(now);
            let (since, at_raise) = *self.raised.get_or_insert((now, last));
            let due = self
                .told_at
                .is_none_or(|t| now.duration_since(t) >= CAPPED_REPEAT);
            if !due {
                return None;
            }
            self.told_at = Some(now);
            let total = value - at_raise;
            let secs = now.duration_since(since).as_secs();
            return Some((
                Edge::Raised,
                format!(
                    "conntrack insert cap reached: {grew} new flows in the last sample forwarded \
                     without a conntrack entry ({total} in {secs} s; guard.ct_insert_cap {cap}). \
                     A flood of new flows, or a cap too low for the load: such flows lose their \
                     backend when the table changes. Look for the source (xlb sources) or raise \
                     the cap"
                ),
            ));
        }
        let (since, at_raise) = self.raised?;
        if self
            .grew_at
            .is_some_and(|t| now.duration_since(t) < CAPPED_QUIET)
        {
            return None;
        }
        self.raised = None;
        self.told_at = None;
        let secs = self
            .grew_at
            .map_or(0, |t| t.duration_since(since).as_secs());
        Some((
            Edge::Cleared,
            format!(
                "conntrack insert cap no longer reached: {} new flows went untracked over {secs} s",
                value - at_raise
            ),
        ))
    }
}

impl Daemon {
    /// Checks the conntrack insert cap's counter (every tick).
    pub(super) fn check_insert_cap(&mut self, stats: &Counters) {
        let n = stats
            .get(&lb_common::Stat::CtInsertCapped)
            .copied()
            .unwrap_or(0);
        let cap = self.cfg.guard.ct_insert_cap;
        if let Some((edge, text)) = self.capped_alarm.update(n, Instant::now(), cap) {
            self.tell_alarm(edge, None, None, text);
        }
    }

    /// Checks the capacity alarms against the latest conntrack walk (a new
    /// one every 10 s, every 2 s while a drain is watched).
    pub(super) fn check_alarms(&mut self) {
        let Some(walk) = self.flows.latest() else {
            return;
        };
        let flows = walk.counts.established();
        let capacity = u64::from(self.cfg.daemon.pinned.conntrack_size);
        for (edge, text) in self.fill_alarms.update(flows, capacity) {
            self.tell_alarm(edge, None, None, text);
        }
        for vi in 0..self.vips.len() {
            for bi in 0..self.vips[vi].backends.len() {
                let b = &mut self.vips[vi].backends[bi];
                let Some(max) = b.cfg.max_flows else { continue };
                let n = walk.counts.flows(b.id, b.generation);
                // "More than max_flows": raised at max + 1.
                let on = max.saturating_add(1);
                let Some(edge) = b.flows_alarm.update(n, on, max_flows_off(max)) else {
                    continue;
                };
                let addr = b.cfg.socket_addr().to_string();
                let text = max_flows_text(edge, &addr, n, max);
                let vip = self.vips[vi].cfg.name.clone();
                self.tell_alarm(edge, Some(&vip), Some(addr), text);
            }
        }
    }

    /// Raises or clears VIP `vi`'s data-path alarm on a probe result of its
    /// backend `bi`: a probe that failed by this host's fault (its result's
    /// `path_fault`) raises it, a data-path probe that passed clears it.
    pub(super) fn check_path(&mut self, vi: usize, bi: usize, result: &ProbeResult) {
        let b = &self.vips[vi].backends[bi];
        if b.cfg.health.via != Via::Vip {
            return;
        }
        let addr = b.cfg.socket_addr().to_string();
        let vip = self.vips[vi].cfg.name.clone();
        match &result.path_fault {
            Some(fault) if self.path_alarms.fault(&vip, Instant::now()) => {
                let text = format!(
                    "data-path probes of vip {vip:?} fail by this host's fault, not the \
                     backends' (seen probing {addr}): {fault}. Until it is fixed, backends keep \
                     the state their direct probes give"
                );
                self.tell_alarm(Edge::Raised, Some(&vip), Some(addr), text);
            }
            None if result.is_ok() && self.path_alarms.passed(&vip) => {
                let text = format!("data-path probes of vip {vip:?} reach the backends again");
                self.tell_alarm(Edge::Cleared, Some(&vip), Some(addr), text);
            }
            _ => {}
        }
    }

    /// Established flows in the conntrack table, from the latest walk.
    pub(super) fn established_flows(&self) -> Option<u64> {
        self.flows.latest().map(|w| w.counts.established())
    }

    /// Logs an alarm's edge and records it as an `alarm` event.
    pub(super) fn tell_alarm(
        &mut self,
        edge: Edge,
        vip: Option<&str>,
        backend: Option<String>,
        text: String,
    ) {
        let backend_field = backend.as_deref();
        match edge {
            Edge::Raised => {
                warn!(
                    event = "alarm",
                    to = "raised",
                    vip,
                    backend = backend_field,
                    "{text}"
                );
            }
            Edge::Cleared => {
                info!(
                    event = "alarm",
                    to = "cleared",
                    vip,
                    backend = backend_field,
                    "{text}"
                );
            }
        }
        self.event(EventKind::Alarm, vip, backend, None, None, text, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_is_raised_once_and_clears_below_its_off_value() {
        let mut l = Level::default();
        let seen: Vec<_> = [10, 80, 90, 78, 75, 74, 80]
            .into_iter()
            .map(|v| l.update(v, 80, 75))
            .collect();
        assert_eq!(
            seen,
            [
                None,
                Some(Edge::Raised),
                None,
                None,
                None,
                Some(Edge::Cleared),
                Some(Edge::Raised)
            ]
        );
    }

    #[test]
    fn fill_alarms_rise_and_clear_level_by_level() {
        let mut a = FillAlarms::default();
        assert!(a.update(799, 1000).is_empty(), "79.9% is below 80%");
        let up = a.update(960, 1000);
        assert_eq!(up.len(), 2, "{up:?}");
        assert!(up[0].1.starts_with("conntrack 96% full (at least 80%): 960 established flows of daemon.conntrack_size 1000"), "{}", up[0].1);
        assert!(up[1].1.contains("(at least 95%)"), "{}", up[1].1);
        assert!(a.update(950, 1000).is_empty(), "no repeat while above");
        assert!(
            a.update(900, 1000).is_empty(),
            "95% clears below 90%, not at it"
        );
        let down = a.update(899, 1000);
        assert_eq!(down.len(), 1);
        assert_eq!(down[0].0, Edge::Cleared);
        assert_eq!(
            down[0].1,
            "conntrack back below 90% full: 899 established flows of 1000"
        );
        let down = a.update(10, 1000);
        assert_eq!(down.len(), 1);
        assert!(
            down[0].1.starts_with("conntrack back below 75% full"),
            "{}",
            down[0].1
        );
        assert!(a.update(0, 0).is_empty(), "no capacity, no alarm");
    }

    #[test]
    fn insert_cap_alarm_is_rate_limited_and_clears_when_quiet() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut a = CappedAlarm::default();
        assert_eq!(
            a.update(500, at(0), Some(1000)),
            None,
            "history is the baseline"
        );
        assert_eq!(a.update(500, at(1), Some(1000)), None, "no growth");
        let (edge, text) = a.update(800, at(2), Some(1000)).unwrap();
        assert_eq!(edge, Edge::Raised);
        assert!(
            text.starts_with(
                "conntrack insert cap reached: 300 new flows in the last sample forwarded \
                 without a conntrack entry (300 in 0 s; guard.ct_insert_cap 1000/s per CPU)"
            ),
            "{text}"
        );
        // Growing every second: told again 10 s after the first time.
        let told: Vec<u64> = (3..25)
            .filter(|&s| a.update(800 + s * 100, at(s), Some(1000)).is_some())
            .collect();
        assert_eq!(told, [12, 22]);
        // Two quiet seconds are not the end yet; the third is.
        assert_eq!(a.update(3200, at(25), Some(1000)), None);
        assert_eq!(a.update(3200, at(26), Some(1000)), None);
        let (edge, text) = a.update(3200, at(27), Some(1000)).unwrap();
        assert_eq!(edge, Edge::Cleared);
        assert_eq!(
            text,
            "conntrack insert cap no longer reached: 2700 new flows went untracked over 22 s"
        );
        assert_eq!(a.update(3200, at(40), Some(1000)), None, "once");
        // It grows again: a new alarm at once.
        let (edge, _) = a.update(3300, at(41), None).unwrap();
        assert_eq!(edge, Edge::Raised);
        // Maps re-created under us (a smaller value): nothing to tell.
        let mut b = CappedAlarm::default();
        let _ = b.update(500, at(0), None);
        assert_eq!(b.update(10, at(1), None), None);
    }

    #[test]
    fn path_alarm_is_told_once_a_period_and_cleared_by_a_pass() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut a = PathAlarms::default();
        assert!(!a.passed("api"), "nothing to clear");
        assert!(a.fault("api", at(0)), "raised");
        assert!(a.fault("web", at(1)), "per VIP");
        let told: Vec<u64> = (1..130).filter(|&s| a.fault("api", at(s))).collect();
        assert_eq!(told, [60, 120], "repeated every PATH_REPEAT while it lasts");
        assert!(a.passed("api"), "a passing data-path probe clears it");
        assert!(!a.passed("api"), "once");
        assert!(a.fault("api", at(131)), "a new episode is told at once");
    }

    #[test]
    fn max_flows_alarm_text_and_clear_point() {
        assert_eq!(max_flows_off(1000), 900);
        assert_eq!(
            max_flows_text(Edge::Raised, "10.0.0.1:80", 1200, 1000),
            "backend 10.0.0.1:80 holds 1200 established flows, more than its max_flows 1000: \
             it may run out of connection slots; drain it, add backends, or find the client \
             opening them"
        );
        assert_eq!(
            max_flows_text(Edge::Cleared, "10.0.0.1:80", 800, 1000),
            "backend 10.0.0.1:80 back to 800 established flows (below 90% of max_flows 1000)"
        );
    }
}
