//! Health, from probe reports to the maps: each report is recorded, the
//! VIP policy decides placements, and every change is applied (backend
//! state, then table) and told once (one log line, one event).

use crate::ctl::EventKind;
use std::time::{Duration, Instant};

use super::{
    Daemon,
    alarms::Edge,
    model::{self, Rebuild},
};
use crate::health::{
    agent::AgentChange,
    machine::HealthState,
    policy::{self, Change},
    probe::{FailReason, ProbeClass},
    scheduler::{Report, Scheduler},
};
use tracing::{info, warn};

/// Least time between two `alarm` events (each local error is still logged).
const ALARM_PERIOD: Duration = Duration::from_secs(10);

impl Daemon {
    /// Starts probing every backend; adopted states stand until probes say otherwise.
    pub(super) fn start_probes(&mut self) {
        let (mut sched, rx) = Scheduler::new(self.cfg.daemon.restart.probe_concurrency as usize);
        for v in &self.vips {
            for b in &v.backends {
                model::upsert_probe(&mut sched, &self.cfg.daemon.pinned, v, b);
                if b.admin_drained {
                    sched.set_admin_drained(u64::from(b.id), true);
                }
            }
        }
        self.sched = Some(sched);
        self.reports = Some(rx);
    }

    /// Applies a batch of probe reports: records each backend's health,
    /// then lets the VIP policy decide what the table does with it, each
    /// VIP they touch once: a mass flap (thousands of backends changing in a second)
    /// rebuilds each VIP's table once per batch, not once per backend, and
    /// the main loop gets back to control requests between batches.
    pub(super) fn on_reports(&mut self, batch: Vec<Report>) -> anyhow::Result<()> {
        let mut touched: Vec<usize> = Vec::new();
        for r in batch {
            if let Some(vi) = self.record_report(r)
                && !touched.contains(&vi)
            {
                touched.push(vi);
            }
        }
        for vi in touched {
            self.evaluate_vip(vi)?;
        }
        Ok(())
    }

    /// Records a report's result and health; the VIP to evaluate, if the
    /// report may change what its policy decides.
    fn record_report(&mut self, r: Report) -> Option<usize> {
        let id = r.id as u32;
        let &(vi, bi) = self.index.get(&id)?; // removed while its probe ran
        if r.addr != self.vips[vi].backends[bi].cfg.socket_addr() {
            return None; // about the id's previous holder, queued before a reload
        }
        // An interim Late report has no result (and no latency) yet.
        if let Some(result) = &r.result {
            self.histograms
                .entry(id)
                .or_default()
                .observe(result.latency);
            if let ProbeClass::Failed(fail) = &r.class {
                self.probe_failures
                    .entry(id)
                    .or_default()
                    .count(fail.code());
            }
            // Passing answers only: a hung backend must not drag the
            // VIP's automatic timeout up.
            if matches!(r.class, ProbeClass::Ok | ProbeClass::Slow { .. }) {
                self.vips[vi].record_answer(result.latency);
            }
            self.check_path(vi, bi, result);
        }
        if let ProbeClass::Local(e) = &r.class {
            self.local_alarm(vi, bi, e, r.snapshot.local_errors);
        }
        let b = &mut self.vips[vi].backends[bi];
        // The snapshot's state is authoritative: a transition report lost on
        // the way (a task restarted while its report waited for room in the
        // channel) is caught up by the next report.
        let hard_changed = r.snapshot.state != b.health;
        // What the agent says is the policy's to judge (`policy::agent`).
        let old_agent = b.snapshot.as_ref().and_then(|s| s.agent.as_ref());
        let agent_change = AgentChange::between(old_agent, r.snapshot.agent.as_ref());
        b.health = r.snapshot.state;
        b.snapshot = Some(r.snapshot);
        let agent_changed = agent_change.is_some();
        if let Some(change) = agent_change {
            self.tell_agent(vi, bi, change);
        }
        // A fast answer from a serving backend of a calm VIP changes nothing:
        // skip the evaluation (the 1 s tick still runs it for every VIP).
        let v = &self.vips[vi];
        let b = &v.backends[bi];
        let calm = !hard_changed
            && !agent_changed
            && b.policy.placement == policy::Placement::Serving
            && b.snapshot.as_ref().is_none_or(|s| s.consecutive_slow == 0)
            && v.policy.panic.is_none()
            && v.policy.fleet_slow.is_none();
        // Nor does another failure of a backend already out for failing
        // (during a mass outage, thousands a second).
        let still_down = !hard_changed
            && !agent_changed
            && b.health == HealthState::Down
            && b.policy.placement == policy::Placement::Down;
        (!calm && !still_down).then_some(vi)
    }

    /// Logs and records a change of what backend `bi`'s agent says.
    fn tell_agent(&mut self, vi: usize, bi: usize, change: AgentChange) {
        let addr = self.vips[vi].backends[bi].cfg.socket_addr();
        let vip = self.vips[vi].cfg.name.clone();
        info!(event = "agent", vip = %vip, backend = %addr, from = change.from, to = change.to, "{}", change.text);
        self.event(
            EventKind::Agent,
            Some(&vip),
            Some(addr.to_string()),
            Some(change.from),
            Some(change.to),
            change.text,
            None,
        );
    }

    /// A probe failed for the load balancer's own reason (out of
    /// descriptors, buffers, no route from this host): never the backend's
    /// fault, so it does not count toward `fall`, but the operator must
    /// know. One `alarm` event per [`ALARM_PERIOD`] at most; every one is
    /// logged.
    fn local_alarm(&mut self, vi: usize, bi: usize, e: &FailReason, n: u64) {
        let vip = self.vips[vi].cfg.name.clone();
        let addr = self.vips[vi].backends[bi].cfg.socket_addr().to_string();
        let text = format!(
            "probe of {addr} failed on this host: {e}; not counted against the backend \
             ({n} local error{} for it so far)",
            if n == 1 { "" } else { "s" }
        );
        warn!(event = "alarm", vip = %vip, backend = %addr, "{text}");
        let now = Instant::now();
        if self
            .last_alarm
            .is_some_and(|t| now.duration_since(t) < ALARM_PERIOD)
        {
            return;
        }
        self.last_alarm = Some(now);
        self.event(
            EventKind::Alarm,
            Some(&vip),
            Some(addr),
            None,
            None,
            text,
            None,
        );
    }

    /// Runs the VIP policy over VIP `vi` and applies what changed: backend
    /// states in the maps, then the table, then one log line and one event
    /// per change (the first carries the table rebuild).
    pub(super) fn evaluate_vip(&mut self, vi: usize) -> anyhow::Result<()> {
        let now = Instant::now();
        let outcome = self.vips[vi].run_policy(now);
        let moved = self.write_placements(vi, &outcome.changes, now)?;
        let mut rebuild = if outcome.weights_changed || moved {
            model::rebuild(&mut self.dp, &mut self.vips[vi])?
        } else {
            None
        };
        if outcome.changes.is_empty() {
            return Ok(());
        }
        for change in outcome.changes {
            self.tell_change(vi, change, &mut rebuild);
        }
        if moved {
            model::warn_if_empty(&self.vips[vi]);
            self.save();
        }
        Ok(())
    }

    /// Writes the data-plane state of every backend whose placement
    /// changed; whether there was one.
    fn write_placements(
        &mut self,
        vi: usize,
        changes: &[Change],
        now: Instant,
    ) -> anyhow::Result<bool> {
        let vip = &mut self.vips[vi];
        let mut moved = false;
        for change in changes {
            if let Change::Placement { member, .. } = change {
                let b = &mut vip.backends[*member];
                b.since = now;
                self.dp.set_backend(b.id, &b.info())?;
                moved = true;
            }
        }
        Ok(moved)
    }

    /// Logs one change of VIP `vi` and records its event. The first event
    /// that changes the table takes the rebuild; fleet slowness does not
    /// change it.
    fn tell_change(&mut self, vi: usize, change: Change, rebuild: &mut Option<Rebuild>) {
        let name = self.vips[vi].cfg.name.clone();
        let (kind, from, to, text, r) = match change {
            Change::Placement {
                member,
                from,
                to,
                reason,
            } => return self.tell_placement(vi, member, (from, to), reason, rebuild.take()),
            Change::PanicEnter(text) => {
                warn!(event = "panic", vip = %name, from = "normal", to = "panic", "vip {name:?} enters panic: {text}");
                (EventKind::Panic, "normal", "panic", text, rebuild.take())
            }
            Change::PanicExit(text) => {
                info!(event = "panic", vip = %name, from = "panic", to = "normal", "vip {name:?} leaves panic: {text}");
                (EventKind::Panic, "panic", "normal", text, rebuild.take())
            }
            Change::FleetSlow(text) => {
                warn!(event = "fleet_slow", vip = %name, from = "normal", to = "slow", "vip {name:?}: {text}");
                (EventKind::FleetSlow, "normal", "slow", text, None)
            }
            Change::FleetRecovered(text) => {
                info!(event = "fleet_slow", vip = %name, from = "slow", to = "normal", "vip {name:?}: {text}");
                (EventKind::FleetSlow, "slow", "normal", text, None)
            }
            // The LB's own fault: an alarm, with whatever table change the
            // backends put back made.
            Change::PathFault(text) => {
                let text = format!("vip {name:?}: {text}");
                return self.tell_alarm(Edge::Raised, Some(&name), None, text);
            }
            Change::PathRecovered(text) => {
                let text = format!("vip {name:?}: {text}");
                return self.tell_alarm(Edge::Cleared, Some(&name), None, text);
            }
        };
        self.event(kind, Some(&name), None, Some(from), Some(to), text, r);
    }

    /// Logs a backend's move from one placement to another and records it
    /// (`admin` for a drain or enable, else `transition`).
    fn tell_placement(
        &mut self,
        vi: usize,
        member: usize,
        (from, to): (policy::Placement, policy::Placement),
        reason: String,
        rebuild: Option<Rebuild>,
    ) {
        let name = self.vips[vi].cfg.name.clone();
        // Drain and enable are an operator's doing, not health's.
        let admin = to == policy::Placement::Draining || from == policy::Placement::Draining;
        let b = &self.vips[vi].backends[member];
        let from = model::placement_label(from);
        let kind = if admin {
            EventKind::Admin
        } else {
            EventKind::Transition
        };
        model::log_transition(kind, &name, b, from, &reason, rebuild);
        let (id, to) = (b.id, b.placement_name());
        *self.transitions.entry(id).or_default() += 1;
        self.backend_event(kind, (vi, member), (from, to), reason, rebuild);
    }
}
