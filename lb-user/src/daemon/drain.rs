//! Admin drains: `xlb drain` (with an optional deadline after which the
//! backend goes `down`) and `xlb enable`, the deadlines applied every tick,
//! and the established flows per backend that `xlb drain --wait` watches.

use crate::ctl::EventKind;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use tracing::{error, info};

use super::{
    Daemon,
    model::{self, Backend},
};

impl Daemon {
    /// `xlb drain` (`drained`, with an optional deadline after which the
    /// backend goes `down`) and `xlb enable` (clears any deadline).
    pub(super) fn set_drain(
        &mut self,
        vip: &str,
        backend: &str,
        drained: bool,
        deadline: Option<Duration>,
    ) -> anyhow::Result<String> {
        let (vi, bi) = model::find_backend(&self.vips, vip, backend)?;
        let deadline_at = match deadline {
            None => None,
            Some(d) => Some(SystemTime::now().checked_add(d).with_context(|| {
                format!("a drain deadline {} from now is too far away", human(d))
            })?),
        };
        let policy = self.vips[vi].cfg.down_policy;
        let note = deadline.filter(|_| drained).map(|d| {
            format!(
                "down in {}, remaining flows then follow down_policy {policy}",
                human(d)
            )
        });
        if self.vips[vi].backends[bi].admin_drained == drained {
            return self.drain_again(vi, bi, vip, deadline_at.zip(note));
        }
        let b = &mut self.vips[vi].backends[bi];
        let addr = b.cfg.socket_addr();
        let from = b.placement_name();
        b.admin_drained = drained;
        b.drain_deadline = if drained { deadline_at } else { None };
        b.drain_expired = false;
        b.drained_at = drained.then(Instant::now);
        let id = b.id;
        if let Some(s) = self.sched.as_mut() {
            s.set_admin_drained(u64::from(id), drained);
        }
        // The policy records the drain (placement `draining`, always a
        // change), writes the maps, rebuilds, records the `admin` event and
        // saves the state with the deadline.
        self.evaluate_vip(vi)?;
        let to = self.vips[vi].backends[bi].placement_name();
        let note = note.map_or(String::new(), |n| format!("; {n}"));
        Ok(format!("{addr} of vip {vip:?}: {from} -> {to}{note}"))
    }

    /// `xlb enable` of an enabled backend (nothing to do), or `xlb drain` of
    /// one already draining: with `deadline` (when, and what it means) a
    /// new deadline replaces the old one, else nothing changes.
    fn drain_again(
        &mut self,
        vi: usize,
        bi: usize,
        vip: &str,
        deadline: Option<(SystemTime, String)>,
    ) -> anyhow::Result<String> {
        let b = &mut self.vips[vi].backends[bi];
        let addr = b.cfg.socket_addr();
        if !b.admin_drained {
            return Ok(format!("{addr} of vip {vip:?} is already enabled"));
        }
        let Some((at, note)) = deadline else {
            let note = match b.drain_deadline {
                Some(_) if b.drain_expired => "; its deadline has passed, it is down".to_string(),
                Some(at) => format!("; down in {}", human(until(at))),
                None => String::new(),
            };
            return Ok(format!("{addr} of vip {vip:?} is already draining{note}"));
        };
        if b.drain_expired {
            anyhow::bail!(
                "{addr} of vip {vip:?} is already past its drain deadline (down); \
                 `xlb enable` it first to drain it again"
            );
        }
        b.drain_deadline = Some(at);
        let reason = format!("drain deadline set: {note}");
        info!(event = "admin", vip, backend = %addr, "{reason}");
        self.event(
            EventKind::Admin,
            Some(vip),
            Some(addr.to_string()),
            None,
            None,
            reason.clone(),
            None,
        );
        self.save();
        Ok(format!("{addr} of vip {vip:?}: already draining; {reason}"))
    }

    /// Established flows of `b` at the last conntrack walk; `None` before
    /// the first.
    pub(super) fn flows_of(&self, b: &Backend) -> Option<u64> {
        let walk = self.flows.latest()?;
        // A drain is judged by walks that began after it did: one from
        // before may have missed connections opened since (up to a walk
        // period), and `drain --wait` would stop at a stale 0.
        let before_drain = b.admin_drained && b.drained_at.is_some_and(|t| walk.started < t);
        (!before_drain).then(|| walk.counts.flows(b.id, b.generation))
    }

    /// Every tick: applies drain deadlines that have passed, and walks
    /// conntrack faster while a drain with flows left has a deadline or is
    /// watched, so what `xlb drain --wait` prints (and the count in the
    /// deadline's event) is at most `conntrack::PERIOD_DRAINING` old.
    pub(super) fn check_drains(&mut self) {
        // `drain --wait` polls every second; a few missed polls still count.
        const WATCHED: Duration = Duration::from_secs(5);
        let watched = self.status_asked.is_some_and(|t| t.elapsed() < WATCHED);
        let now = SystemTime::now();
        let mut fast = false;
        let mut due = Vec::new();
        for (vi, v) in self.vips.iter().enumerate() {
            for (bi, b) in v.backends.iter().enumerate() {
                if !b.admin_drained || b.drain_expired {
                    continue;
                }
                match b.drain_deadline {
                    Some(at) if at <= now => due.push((vi, bi)),
                    pending => {
                        let busy = self.flows_of(b) != Some(0);
                        fast |= busy && (watched || pending.is_some());
                    }
                }
            }
        }
        self.flows.set_fast(fast);
        self.flows.set_udp_timeout(self.cfg.daemon.live.udp_timeout);
        for (vi, bi) in due {
            if let Err(e) = self.expire_drain(vi, bi) {
                error!("applying a drain deadline: {e:#}");
            }
        }
    }

    /// A drain's deadline passed: the backend goes `down` in the data
    /// plane, so its remaining flows follow the VIP's `down_policy`.
    pub(super) fn expire_drain(&mut self, vi: usize, bi: usize) -> anyhow::Result<()> {
        let flows = self.flows_of(&self.vips[vi].backends[bi]);
        let started = self.started;
        let b = &mut self.vips[vi].backends[bi];
        let from = b.state_name();
        let while_stopped = b.drain_deadline.is_some_and(|at| at < started);
        b.drain_expired = true;
        b.since = Instant::now();
        let (id, info) = (b.id, b.info());
        self.dp.set_backend(id, &info)?;
        let rebuild = model::rebuild(&mut self.dp, &mut self.vips[vi])?;
        let v = &self.vips[vi];
        let b = &v.backends[bi];
        let left = match (while_stopped, flows) {
            (true, _) => " while xlb was stopped".to_string(),
            (false, Some(1)) => " with 1 flow left".to_string(),
            (false, Some(n)) => format!(" with {n} flows left"),
            (false, None) => " before its flows were counted".to_string(),
        };
        let reason = format!(
            "drain deadline passed{left}; remaining flows follow down_policy {}",
            v.cfg.down_policy
        );
        model::log_transition(EventKind::Drain, &v.cfg.name, b, from, &reason, rebuild);
        let to = b.state_name();
        self.backend_event(EventKind::Drain, (vi, bi), (from, to), reason, rebuild);
        self.save();
        Ok(())
    }
}

/// How long until `t` (zero if past).
fn until(t: SystemTime) -> Duration {
    t.duration_since(SystemTime::now()).unwrap_or_default()
}

/// A drain deadline for operators: `5m`, `1h`, `90s`, `1.5s`.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    if d.subsec_nanos() == 0 && s >= 3600 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if d.subsec_nanos() == 0 && s >= 60 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        crate::health::probe::Compact(d).to_string()
    }
}
