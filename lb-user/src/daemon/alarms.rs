//! Capacity alarms, from the periodic conntrack walk (issue 9, seed 001: the
//! proxy ran out of connection slots and nobody knew for 41 minutes):
//! - the connection tracking table holding established flows for 80 % and
//!   then 95 % of `daemon.conntrack_size`: past that, new flows evict live
//!   ones (the least recently used) and an evicted flow loses its backend
//!   when the table changes. Idle entries do not count: the LRU keeps them
//!   until it needs the room, so a table full of them is normal;
//! - a backend holding more established flows than its `max_flows` (the
//!   maxconn alarm of the seed).
//!
//! Each is an `alarm` event and a warning when raised, and an event when it
//! clears, with hysteresis so a value hovering at a threshold does not
//! repeat itself.

use tracing::{info, warn};

use super::Daemon;
use crate::ctl::EventKind;

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

impl Daemon {
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

    /// Established flows in the conntrack table, from the latest walk.
    pub(super) fn established_flows(&self) -> Option<u64> {
        self.flows.latest().map(|w| w.counts.established())
    }

    /// Logs an alarm's edge and records it as an `alarm` event.
    fn tell_alarm(&mut self, edge: Edge, vip: Option<&str>, backend: Option<String>, text: String) {
        match edge {
            Edge::Raised => warn!("{text}"),
            Edge::Cleared => info!("{text}"),
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
