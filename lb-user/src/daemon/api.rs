//! The running daemon: the main loop, health reports, admin commands,
//! reload, and the views served over the control socket and metrics.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use anyhow::Context as _;
use lb_common::{CtEntry, FlowKey, Stat, TrafficStats};
use tokio::sync::{broadcast, mpsc, oneshot};
use tracing::{error, info, warn};

use super::{
    conntrack,
    model::{self, Backend, Ids, Rebuild, Vip},
    persist::{self, Saved},
};
use crate::{
    config::{Config, Protocol},
    ctl::{
        self, BackendStatus, Event, EventKind, ExplainReport, ProbeStatus, Request, Response,
        StatusReport, VipStatus, unix_ms,
    },
    dataplane::Dataplane,
    health::{
        policy::{self, Change},
        probe::ProbeClass,
        scheduler::{Report, Scheduler, effective_timeout},
    },
    metrics::{self, LatencyHistogram, MetricsExtra},
};

/// Events kept for `xlb events`.
const EVENT_LOG: usize = 1000;

/// Least time between two `alarm` events (each local error is still logged).
const ALARM_PERIOD: Duration = Duration::from_secs(10);

/// Converts a monotonic instant to wall-clock milliseconds.
fn instant_ms(t: Instant) -> u64 {
    let now = Instant::now();
    let wall = SystemTime::now();
    let wall = if t <= now {
        wall - (now - t)
    } else {
        wall + (t - now)
    };
    unix_ms(wall)
}

#[derive(Default, Clone, Copy)]
struct Rate {
    last: TrafficStats,
    pps: f64,
    nfps: f64,
}

impl Rate {
    fn update(&mut self, now: TrafficStats, secs: f64) {
        if secs > 0.0 {
            self.pps = now.packets.saturating_sub(self.last.packets) as f64 / secs;
            self.nfps = now.new_flows.saturating_sub(self.last.new_flows) as f64 / secs;
        }
        self.last = now;
    }
}

type Call = (Request, oneshot::Sender<Response>);

/// The daemon state, owned by the main loop.
pub struct Daemon {
    config_path: PathBuf,
    cfg: Config,
    dp: Dataplane,
    ids: Ids,
    vips: Vec<Vip>,
    sched: Option<Scheduler>,
    reports: Option<mpsc::Receiver<Report>>,
    events: VecDeque<Event>,
    next_seq: u64,
    events_tx: broadcast::Sender<Event>,
    started: SystemTime,
    adopted: bool,
    link_id: u32,
    vip_rates: HashMap<u32, Rate>,
    be_rates: HashMap<u32, Rate>,
    last_sample: Instant,
    /// When the last `alarm` event about local probe errors was recorded.
    last_alarm: Option<Instant>,
    histograms: HashMap<u32, LatencyHistogram>,
    transitions: HashMap<u32, u64>,
    /// Backend id → (VIP index, backend index); rebuilt whenever `vips`
    /// changes shape (start, reload), not per health report.
    index: HashMap<u32, (usize, usize)>,
    /// Conntrack entries, counted off the main loop (see `conntrack::spawn`).
    ct_entries: Arc<AtomicU64>,
    /// Established flows per backend from the same walk, and its pace.
    flows: Arc<conntrack::Shared>,
    /// When `status` was last asked for: someone polling it (`xlb drain
    /// --wait`) wants fresh flow counts of the backends being drained.
    status_asked: Option<Instant>,
    /// What the metrics endpoint serves, refreshed every tick.
    published: Arc<Mutex<(StatusReport, MetricsExtra)>>,
}

impl Daemon {
    /// Builds the model, adopting ids, states and tables from a previous run.
    pub fn new(
        config_path: PathBuf,
        cfg: Config,
        mut dp: Dataplane,
        saved: Option<Saved>,
    ) -> anyhow::Result<Self> {
        let saved = saved.filter(|s| s.layout_version == lb_common::LAYOUT_VERSION);
        let mut ids = Ids::default();
        for vcfg in &cfg.vips {
            model::reserve_adoptable(&dp, &mut ids, vcfg, saved.as_ref())?;
        }
        let mut vips = Vec::new();
        let mut adopted = false;
        for vcfg in cfg.vips.clone() {
            let (vip, a) = model::adopt_or_create_vip(&mut dp, &mut ids, vcfg, saved.as_ref())?;
            adopted |= a;
            vips.push(vip);
        }
        // Pinned entries of VIPs and backends no longer configured (removed
        // while no daemon ran): remove them, so their conntrack entries are
        // stale rather than forwarded to a backend nobody probes.
        let keep: Vec<_> = vips.iter().map(|v| v.key).collect();
        for (key, _) in dp.vip_entries()? {
            if !keep.contains(&key) {
                dp.remove_vip(&key)?;
            }
        }
        model::retire_orphans(&mut dp, &vips)?;
        let events_tx = broadcast::channel(256).0;
        let index = model::backend_index(&vips);
        let mut d = Self {
            config_path,
            cfg,
            dp,
            ids,
            vips,
            sched: None,
            reports: None,
            events: VecDeque::new(),
            next_seq: 1,
            events_tx,
            started: SystemTime::now(),
            adopted,
            link_id: 0,
            vip_rates: HashMap::new(),
            be_rates: HashMap::new(),
            last_sample: Instant::now(),
            last_alarm: None,
            histograms: HashMap::new(),
            index,
            ct_entries: Arc::new(AtomicU64::new(0)),
            flows: Arc::default(),
            status_asked: None,
            transitions: HashMap::new(),
            published: Arc::new(Mutex::new((
                StatusReport::default(),
                MetricsExtra::default(),
            ))),
        };
        for vi in 0..d.vips.len() {
            d.install(vi)?;
        }
        d.dp.sync_hc_reals(&model::hc_reals(&d.vips))?;
        Ok(d)
    }

    /// Writes VIP `vi`'s entries and makes its wanted table live.
    fn install(&mut self, vi: usize) -> anyhow::Result<Option<Rebuild>> {
        let vip = &mut self.vips[vi];
        // A VIP whose live half is unknown gets its table before its entry:
        // the entry then points at a complete table.
        let r = if vip.halves[vip.active as usize & 1].is_none() {
            let want = vip.wanted_table();
            let writes: Vec<(u32, u32)> = want
                .iter()
                .enumerate()
                .map(|(i, &id)| (i as u32, id))
                .collect();
            let t = Instant::now();
            self.dp.write_ring(vip.id, vip.active, &writes)?;
            vip.halves[vip.active as usize & 1] = Some(want);
            model::install_vip(&mut self.dp, vip)?;
            Some(Rebuild {
                took: t.elapsed(),
                slots_changed: writes.len() as u32,
            })
        } else {
            model::install_vip(&mut self.dp, vip)?;
            model::rebuild(&mut self.dp, vip)?
        };
        model::warn_if_empty(vip);
        Ok(r)
    }

    /// Records an event for `xlb events` and its followers.
    #[expect(
        clippy::too_many_arguments,
        reason = "one call site per event kind, each reads best flat"
    )]
    fn event(
        &mut self,
        kind: EventKind,
        vip: Option<&str>,
        backend: Option<String>,
        from: Option<&str>,
        to: Option<&str>,
        reason: String,
        r: Option<Rebuild>,
    ) {
        let ev = Event {
            seq: self.next_seq,
            at_unix_ms: unix_ms(SystemTime::now()),
            kind,
            vip: vip.map(str::to_string),
            backend,
            from: from.map(str::to_string),
            to: to.map(str::to_string),
            reason,
            table_build_us: r.map(|r| r.took.as_micros() as u64),
            table_slots_changed: r.map(|r| r.slots_changed),
        };
        self.next_seq += 1;
        if self.events.len() == EVENT_LOG {
            self.events.pop_front();
        }
        self.events.push_back(ev.clone());
        let _ = self.events_tx.send(ev);
    }

    fn save(&self) {
        let path = persist::state_path(&self.cfg.daemon.instance);
        if let Err(e) = model::to_saved(&self.vips).store(&path) {
            warn!("{e:#}");
        }
    }

    /// Starts probing every backend; adopted states stand until probes say otherwise.
    fn start_probes(&mut self) {
        let (mut sched, rx) = Scheduler::new(self.cfg.daemon.probe_concurrency as usize);
        for v in &self.vips {
            for b in &v.backends {
                model::upsert_probe(
                    &mut sched,
                    &self.cfg.daemon.interface,
                    &v.cfg,
                    &v.auto_timeout,
                    b,
                );
                if b.admin_drained {
                    sched.set_admin_drained(b.id as u64, true);
                }
            }
        }
        self.sched = Some(sched);
        self.reports = Some(rx);
    }

    /// Applies a probe report: records the backend's health, then lets the
    /// VIP policy decide what the table does with it.
    fn on_report(&mut self, r: Report) -> anyhow::Result<()> {
        let id = r.id as u32;
        let Some(&(vi, bi)) = self.index.get(&id) else {
            return Ok(()); // removed while its probe ran
        };
        if r.addr != self.vips[vi].backends[bi].cfg.socket_addr() {
            return Ok(()); // about the id's previous holder, queued before a reload
        }
        // An interim Late report has no result (and no latency) yet.
        if let Some(result) = &r.result {
            self.histograms
                .entry(id)
                .or_default()
                .observe(result.latency);
            // Passing answers only: a hung backend must not drag the
            // VIP's automatic timeout up.
            if matches!(r.class, ProbeClass::Ok | ProbeClass::Slow { .. }) {
                self.vips[vi].record_answer(result.latency);
            }
        }
        if let ProbeClass::Local(e) = &r.class {
            self.local_alarm(vi, bi, e, r.snapshot.local_errors);
        }
        let b = &mut self.vips[vi].backends[bi];
        // The snapshot's state is authoritative: a transition report lost on
        // the way (a task restarted while its report waited for room in the
        // channel) is caught up by the next report.
        let hard_changed = r.snapshot.state != b.health;
        b.health = r.snapshot.state;
        b.snapshot = Some(r.snapshot);
        // A fast answer from a serving backend of a calm VIP changes nothing:
        // skip the evaluation (the 1 s tick still runs it for every VIP).
        let v = &self.vips[vi];
        let b = &v.backends[bi];
        let calm = !hard_changed
            && b.policy.placement == policy::Placement::Serving
            && b.snapshot.as_ref().is_none_or(|s| s.consecutive_slow == 0)
            && v.policy.panic.is_none()
            && v.policy.fleet_slow.is_none();
        if calm {
            return Ok(());
        }
        self.evaluate_vip(vi)
    }

    /// A probe failed for the load balancer's own reason (out of
    /// descriptors, buffers, no route from this host): never the backend's
    /// fault, so it does not count toward `fall`, but the operator must
    /// know. One `alarm` event per [`ALARM_PERIOD`] at most; every one is
    /// logged.
    fn local_alarm(&mut self, vi: usize, bi: usize, e: &crate::health::probe::FailReason, n: u64) {
        let vip = self.vips[vi].cfg.name.clone();
        let addr = self.vips[vi].backends[bi].cfg.socket_addr().to_string();
        let text = format!(
            "probe of {addr} failed on this host: {e}; not counted against the backend \
             ({n} local error{} for it so far)",
            if n == 1 { "" } else { "s" }
        );
        warn!(vip = %vip, backend = %addr, "{text}");
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
    fn evaluate_vip(&mut self, vi: usize) -> anyhow::Result<()> {
        let now = Instant::now();
        let vip = &mut self.vips[vi];
        let outcome = vip.run_policy(now);
        let mut moved = false;
        for change in &outcome.changes {
            if let Change::Placement { member, .. } = change {
                let b = &mut vip.backends[*member];
                b.since = now;
                self.dp.set_backend(b.id, &b.info())?;
                moved = true;
            }
        }
        let mut rebuild = if outcome.weights_changed || moved {
            model::rebuild(&mut self.dp, &mut self.vips[vi])?
        } else {
            None
        };
        if outcome.changes.is_empty() {
            return Ok(());
        }
        let name = self.vips[vi].cfg.name.clone();
        for change in outcome.changes {
            match change {
                Change::Placement {
                    member,
                    from,
                    to,
                    reason,
                } => {
                    // Drain and enable are an operator's doing, not health's.
                    let admin =
                        to == policy::Placement::Draining || from == policy::Placement::Draining;
                    let b = &self.vips[vi].backends[member];
                    let from = model::placement_label(from);
                    model::log_transition(&name, b, from, &reason, rebuild);
                    let (id, addr, to) =
                        (b.id, b.cfg.socket_addr().to_string(), b.placement_name());
                    *self.transitions.entry(id).or_default() += 1;
                    self.event(
                        if admin {
                            EventKind::Admin
                        } else {
                            EventKind::Transition
                        },
                        Some(&name),
                        Some(addr),
                        Some(from),
                        Some(to),
                        reason,
                        rebuild.take(),
                    );
                }
                Change::PanicEnter(text) => {
                    warn!(vip = %name, "vip {name:?} enters panic: {text}");
                    let r = rebuild.take();
                    self.event(
                        EventKind::Panic,
                        Some(&name),
                        None,
                        Some("normal"),
                        Some("panic"),
                        text,
                        r,
                    );
                }
                Change::PanicExit(text) => {
                    info!(vip = %name, "vip {name:?} leaves panic: {text}");
                    let r = rebuild.take();
                    self.event(
                        EventKind::Panic,
                        Some(&name),
                        None,
                        Some("panic"),
                        Some("normal"),
                        text,
                        r,
                    );
                }
                Change::FleetSlow(text) => {
                    warn!(vip = %name, "vip {name:?}: {text}");
                    self.event(
                        EventKind::FleetSlow,
                        Some(&name),
                        None,
                        Some("normal"),
                        Some("slow"),
                        text,
                        None,
                    );
                }
                Change::FleetRecovered(text) => {
                    info!(vip = %name, "vip {name:?}: {text}");
                    self.event(
                        EventKind::FleetSlow,
                        Some(&name),
                        None,
                        Some("slow"),
                        Some("normal"),
                        text,
                        None,
                    );
                }
            }
        }
        if moved {
            model::warn_if_empty(&self.vips[vi]);
            self.save();
        }
        Ok(())
    }

    /// `xlb drain` (`drained`, with an optional deadline after which the
    /// backend goes `down`) and `xlb enable` (clears any deadline).
    fn set_drain(
        &mut self,
        vip: &str,
        backend: &str,
        drained: bool,
        deadline: Option<Duration>,
    ) -> anyhow::Result<String> {
        let (vi, bi) = model::find_backend(&mut self.vips, vip, backend)?;
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
        let b = &mut self.vips[vi].backends[bi];
        let addr = b.cfg.socket_addr();
        if b.admin_drained == drained {
            if !drained {
                return Ok(format!("{addr} of vip {vip:?} is already enabled"));
            }
            let Some((at, note)) = deadline_at.zip(note) else {
                let note = match b.drain_deadline {
                    Some(_) if b.drain_expired => {
                        "; its deadline has passed, it is down".to_string()
                    }
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
            // A new deadline for a drain under way replaces the old one.
            b.drain_deadline = Some(at);
            let reason = format!("drain deadline set: {note}");
            info!(vip, backend = %addr, "{reason}");
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
            return Ok(format!("{addr} of vip {vip:?}: already draining; {reason}"));
        }
        let from = b.placement_name();
        b.admin_drained = drained;
        b.drain_deadline = if drained { deadline_at } else { None };
        b.drain_expired = false;
        b.drained_at = drained.then(Instant::now);
        let id = b.id;
        if let Some(s) = self.sched.as_mut() {
            s.set_admin_drained(id as u64, drained);
        }
        // The policy records the drain (placement `draining`, always a
        // change), writes the maps, rebuilds, records the `admin` event and
        // saves the state with the deadline.
        self.evaluate_vip(vi)?;
        let to = self.vips[vi].backends[bi].placement_name();
        let note = note.map_or(String::new(), |n| format!("; {n}"));
        Ok(format!("{addr} of vip {vip:?}: {from} -> {to}{note}"))
    }

    /// Established flows of `b` at the last conntrack walk; `None` before
    /// the first.
    fn flows_of(&self, b: &Backend) -> Option<u64> {
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
    fn check_drains(&mut self) {
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
        self.flows.set_udp_timeout(self.cfg.daemon.udp_timeout);
        for (vi, bi) in due {
            if let Err(e) = self.expire_drain(vi, bi) {
                error!("applying a drain deadline: {e:#}");
            }
        }
    }

    /// A drain's deadline passed: the backend goes `down` in the data
    /// plane, so its remaining flows follow the VIP's `down_policy`.
    fn expire_drain(&mut self, vi: usize, bi: usize) -> anyhow::Result<()> {
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
        model::log_transition(&v.cfg.name, b, from, &reason, rebuild);
        let (name, addr, to) = (
            v.cfg.name.clone(),
            b.cfg.socket_addr().to_string(),
            b.state_name(),
        );
        self.event(
            EventKind::Drain,
            Some(&name),
            Some(addr),
            Some(from),
            Some(to),
            reason,
            rebuild,
        );
        self.save();
        Ok(())
    }

    /// Re-reads the configuration and applies only what changed. An
    /// unchanged VIP is not touched at all: same table, same flows.
    pub fn reload(&mut self) -> anyhow::Result<String> {
        let result = self.apply_reload();
        // Whatever was applied, even if a step failed part-way.
        self.index = model::backend_index(&self.vips);
        if let Err(e) = self.dp.sync_hc_reals(&model::hc_reals(&self.vips)) {
            error!("updating the data-path probe map: {e:#}");
        }
        result
    }

    fn apply_reload(&mut self) -> anyhow::Result<String> {
        let new = Config::from_file(&self.config_path).map_err(|e| {
            anyhow::anyhow!("{e}\nconfiguration rejected: still running the previous one")
        })?;
        for w in &new.warnings {
            warn!("{w}");
        }
        let mut notes = Vec::new();
        let old_d = &self.cfg.daemon;
        let new_d = &new.daemon;
        // What the pinned state fixes: changing it means `xlb detach` (which
        // drops established flows) and a fresh start.
        for (what, changed) in [
            ("interface", old_d.interface != new_d.interface),
            ("instance", old_d.instance != new_d.instance),
            (
                "conntrack_size",
                old_d.conntrack_size != new_d.conntrack_size,
            ),
            (
                "max_table_size",
                old_d.max_table_size != new_d.max_table_size,
            ),
            ("xdp_mode", old_d.xdp_mode != new_d.xdp_mode),
        ] {
            if changed {
                notes.push(format!(
                    "daemon.{what} changed: not applied; it is fixed by the pinned state until \
                     `xlb detach --instance {}` (drops established flows) and a new start",
                    old_d.instance
                ));
            }
        }
        // What the running process holds: applied at the next restart.
        for (what, changed) in [
            (
                "control_socket",
                old_d.control_socket != new_d.control_socket,
            ),
            ("socket_group", old_d.socket_group != new_d.socket_group),
            (
                "metrics_address",
                old_d.metrics_address != new_d.metrics_address,
            ),
            (
                "probe_concurrency",
                old_d.probe_concurrency != new_d.probe_concurrency,
            ),
        ] {
            if changed {
                notes.push(format!(
                    "daemon.{what} changed: takes effect at the next restart"
                ));
            }
        }
        if old_d.udp_timeout != new_d.udp_timeout
            || old_d.hash_seed != new_d.hash_seed
            || old_d.encap_source_v4 != new_d.encap_source_v4
            || old_d.encap_source_v6 != new_d.encap_source_v6
        {
            let mut d = new_d.clone();
            d.interface = old_d.interface.clone();
            super::write_globals(&mut self.dp, &d, &new.vips)?;
            notes.push("daemon settings updated".to_string());
        }
        let (mut added, mut changed, mut removed) = (0, 0, 0);
        // Removed VIPs.
        let mut i = 0;
        while i < self.vips.len() {
            if new.vip(&self.vips[i].cfg.name).is_none() {
                let v = self.vips.remove(i);
                if let Some(s) = self.sched.as_mut() {
                    for b in &v.backends {
                        s.remove(b.id as u64);
                    }
                }
                model::remove_vip(&mut self.dp, &mut self.ids, &v)?;
                for b in &v.backends {
                    self.histograms.remove(&b.id);
                    self.transitions.remove(&b.id);
                }
                info!(vip = %v.cfg.name, "vip removed");
                removed += 1;
            } else {
                i += 1;
            }
        }
        // VIPs moving to another (address, port, protocol) give up their old
        // key first, so one VIP taking another's old key is never undone.
        for v in &self.vips {
            if let Some(n) = new.vip(&v.cfg.name)
                && model::vip_key(n) != v.key
                && self.dp.vip(&v.key)?.map(|i| i.vip_id) == Some(v.id)
            {
                self.dp.remove_vip(&v.key)?;
            }
        }
        for ncfg in new.vips.iter().cloned() {
            match self.vips.iter().position(|v| v.cfg.name == ncfg.name) {
                Some(vi) if self.vips[vi].cfg == ncfg => {} // untouched
                Some(vi) => {
                    let r = self.change_vip(vi, ncfg)?;
                    self.table_event(vi, "vip changed by reload", r);
                    changed += 1;
                }
                None => {
                    let (vip, _) =
                        model::adopt_or_create_vip(&mut self.dp, &mut self.ids, ncfg, None)?;
                    self.vips.push(vip);
                    let vi = self.vips.len() - 1;
                    if let Some(s) = self.sched.as_mut() {
                        let v = &self.vips[vi];
                        for b in &v.backends {
                            model::upsert_probe(
                                s,
                                &self.cfg.daemon.interface,
                                &v.cfg,
                                &v.auto_timeout,
                                b,
                            );
                        }
                    }
                    let r = self.install(vi)?;
                    info!(vip = %self.vips[vi].cfg.name, "vip added");
                    self.table_event(vi, "vip added by reload", r);
                    added += 1;
                }
            }
        }
        // Keep file order.
        let order: Vec<String> = new.vips.iter().map(|v| v.name.clone()).collect();
        self.vips
            .sort_by_key(|v| order.iter().position(|n| *n == v.cfg.name));
        // Settings not applied live keep their running values, so status
        // and the state file describe what is really in force.
        let mut new = new;
        let old = &self.cfg.daemon;
        new.daemon.interface = old.interface.clone();
        new.daemon.instance = old.instance.clone();
        new.daemon.conntrack_size = old.conntrack_size;
        new.daemon.max_table_size = old.max_table_size;
        new.daemon.xdp_mode = old.xdp_mode;
        new.daemon.control_socket = old.control_socket.clone();
        new.daemon.socket_group = old.socket_group.clone();
        new.daemon.metrics_address = old.metrics_address;
        new.daemon.probe_concurrency = old.probe_concurrency;
        self.cfg = new;
        self.save();
        let summary = format!(
            "reloaded: {added} VIPs added, {changed} changed, {removed} removed, {} unchanged",
            self.vips.len() - added - changed
        );
        self.event(
            EventKind::Reload,
            None,
            None,
            None,
            None,
            summary.clone(),
            None,
        );
        notes.insert(0, summary);
        Ok(notes.join("\n"))
    }

    /// Applies a changed VIP configuration: backends kept where address and
    /// port are the same (with their health), others added or retired.
    /// Records a table rebuild that no backend transition caused.
    fn table_event(&mut self, vi: usize, why: &str, r: Option<Rebuild>) {
        let Some(r) = r else { return };
        let name = self.vips[vi].cfg.name.clone();
        let up = self.vips[vi].up_count();
        let total = self.vips[vi].backends.len();
        let reason = format!("{why}: table rebuilt with {up}/{total} backends up");
        self.event(
            EventKind::Table,
            Some(&name),
            None,
            None,
            None,
            reason,
            Some(r),
        );
    }

    fn change_vip(
        &mut self,
        vi: usize,
        ncfg: crate::config::VipConfig,
    ) -> anyhow::Result<Option<Rebuild>> {
        let old_key = self.vips[vi].key;
        let new_key = model::vip_key(&ncfg);
        // Normally removed already by `reload` (before any VIP took a new
        // key); never remove a key that another VIP has since taken.
        if old_key != new_key && self.dp.vip(&old_key)?.map(|i| i.vip_id) == Some(self.vips[vi].id)
        {
            self.dp.remove_vip(&old_key)?;
        }
        let mut old_backends = std::mem::take(&mut self.vips[vi].backends);
        let auto = self.vips[vi].auto_timeout.clone();
        let mut backends = Vec::new();
        for bcfg in ncfg.backends.iter().cloned() {
            if let Some(pos) = old_backends
                .iter()
                .position(|b| b.cfg.socket_addr() == bcfg.socket_addr())
            {
                let mut b = old_backends.remove(pos);
                b.cfg = bcfg;
                // A no-op unless the check or the VIP's path to it changed.
                if let Some(s) = self.sched.as_mut() {
                    model::upsert_probe(s, &self.cfg.daemon.interface, &ncfg, &auto, &b);
                }
                backends.push(b);
            } else {
                let b = model::new_backend(&mut self.dp, &mut self.ids, bcfg)?;
                if let Some(s) = self.sched.as_mut() {
                    model::upsert_probe(s, &self.cfg.daemon.interface, &ncfg, &auto, &b);
                }
                backends.push(b);
            }
        }
        let vip = &mut self.vips[vi];
        // A new table size is handled by `rebuild`: the resized table goes
        // into the spare half, and one write switches size and half together.
        vip.key = new_key;
        vip.cfg = ncfg;
        vip.backends = backends;
        for b in &vip.backends {
            self.dp.set_backend(b.id, &b.info())?;
        }
        let r = self.install(vi)?;
        // Retired only once the live table no longer points at them.
        for b in old_backends {
            if let Some(s) = self.sched.as_mut() {
                s.remove(b.id as u64);
            }
            model::retire_backend(&mut self.dp, &mut self.ids, &b)?;
            self.histograms.remove(&b.id);
            self.transitions.remove(&b.id);
        }
        info!(vip = %self.vips[vi].cfg.name, rebuilt = r.is_some(), "vip changed");
        Ok(r)
    }

    /// `xlb explain`: which backend the data plane would choose, and why.
    fn explain(
        &self,
        protocol: &str,
        client: SocketAddr,
        vipaddr: SocketAddr,
    ) -> anyhow::Result<ExplainReport> {
        let proto = match protocol {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            other => anyhow::bail!("protocol {other:?}: use tcp or udp"),
        };
        if client.is_ipv4() != vipaddr.is_ipv4() {
            anyhow::bail!("client {client} and VIP {vipaddr} are of different address families");
        }
        let vip = self
            .vips
            .iter()
            .find(|v| {
                v.cfg.addr == vipaddr.ip()
                    && v.cfg.port == vipaddr.port()
                    && v.cfg.protocol == proto
            })
            .with_context(|| format!("no VIP serves {vipaddr}/{protocol}"))?;
        let flow = FlowKey::new(client, vipaddr, proto.as_raw());
        let g = self.dp.globals()?;
        let hash = lb_common::flow_hash(&g.hash_key, &flow);
        let slot = flow.slot(&g.hash_key, vip.cfg.table_size);
        let by_id = |id: u32| vip.backends.iter().find(|b| b.id == id);
        let ct: Option<CtEntry> = self.dp.ct_get(&flow)?;
        let mut report = ExplainReport {
            protocol: protocol.to_string(),
            client: client.to_string(),
            vip: vipaddr.to_string(),
            vip_name: vip.cfg.name.clone(),
            backend: None,
            via: "none".to_string(),
            slot: Some(slot),
            table_size: vip.cfg.table_size,
            flow_hash: format!("{hash:016x}"),
            backend_state: None,
            detail: String::new(),
        };
        if let Some(e) = ct {
            let live = self.dp.backend(e.backend_id)?;
            // The kernel's UDP idle test, on the same clock.
            let expired = proto == Protocol::Udp
                && g.udp_timeout_ns != 0
                && coarse_now_ns().saturating_sub(e.last_seen_ns) > g.udp_timeout_ns;
            if let Some(b) = by_id(e.backend_id)
                && !expired
                && live.generation == e.generation
                && e.vip_id == vip.id
                && (b.dp_state() != lb_common::BACKEND_DOWN
                    || vip.cfg.down_policy == crate::config::DownPolicy::Keep)
            {
                report.backend = Some(b.cfg.socket_addr().to_string());
                report.via = "conntrack".into();
                report.backend_state = Some(b.state_name().into());
                report.detail = format!(
                    "established flow: its conntrack entry holds {} ({}); a SYN would instead take table slot {slot}",
                    b.cfg.socket_addr(),
                    b.state_name()
                );
                return Ok(report);
            }
            report.detail = "its conntrack entry is stale (backend replaced, down with policy rehash, or expired); ".into();
        }
        let table = vip.halves[vip.active as usize & 1]
            .as_deref()
            .unwrap_or(&[]);
        match table
            .get(slot as usize)
            .copied()
            .filter(|&id| id != 0)
            .and_then(by_id)
        {
            Some(b) => {
                report.backend = Some(b.cfg.socket_addr().to_string());
                report.via = "table".into();
                report.backend_state = Some(b.state_name().into());
                report.detail += &format!(
                    "new flow: flow hash {hash:016x} scaled to {} slots = slot {slot}, which holds {}",
                    vip.cfg.table_size,
                    b.cfg.socket_addr()
                );
            }
            None => {
                report.detail += &format!(
                    "slot {slot} is empty: no backend of vip {:?} is up, the packet is dropped",
                    vip.cfg.name
                );
            }
        }
        Ok(report)
    }

    fn sample(&mut self) {
        let secs = self.last_sample.elapsed().as_secs_f64();
        self.last_sample = Instant::now();
        for v in &self.vips {
            if let Ok(s) = self.dp.vip_stats(v.id) {
                self.vip_rates.entry(v.id).or_default().update(s, secs);
            }
            for b in &v.backends {
                if let Ok(s) = self.dp.backend_stats(b.id) {
                    self.be_rates.entry(b.id).or_default().update(s, secs);
                }
            }
        }
        let status = self.status();
        let extra = self.metrics_extra();
        if let Ok(mut p) = self.published.lock() {
            *p = (status, extra);
        }
    }

    fn metrics_extra(&self) -> MetricsExtra {
        let mut extra = MetricsExtra::default();
        for v in &self.vips {
            for b in &v.backends {
                let h = self.histograms.get(&b.id).cloned().unwrap_or_default();
                let t = self.transitions.get(&b.id).copied().unwrap_or(0);
                extra.per_backend.insert(
                    (v.cfg.name.clone(), b.cfg.socket_addr().to_string()),
                    (h, t),
                );
            }
        }
        extra
    }

    pub fn status(&self) -> StatusReport {
        let counters: BTreeMap<String, u64> = self
            .dp
            .stats()
            .map(|m| {
                Stat::ALL
                    .iter()
                    .map(|s| (s.label().to_string(), m.get(s).copied().unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default();
        let vips = self
            .vips
            .iter()
            .map(|v| {
                let vr = self.vip_rates.get(&v.id).copied().unwrap_or_default();
                let live = self.dp.vip_stats(v.id).unwrap_or(vr.last);
                VipStatus {
                    name: v.cfg.name.clone(),
                    address: v.cfg.addr.to_string(),
                    port: v.cfg.port,
                    protocol: v.cfg.protocol.to_string(),
                    mode: v.cfg.mode.to_string(),
                    down_policy: v.cfg.down_policy.to_string(),
                    table_size: v.cfg.table_size,
                    backends_up: v.up_count() as u32,
                    backends_total: v.backends.len() as u32,
                    packets_per_sec: vr.pps,
                    new_flows_per_sec: vr.nfps,
                    packets: live.packets,
                    bytes: live.bytes,
                    new_flows: live.new_flows,
                    panic: v.policy.panic.is_some(),
                    panic_reason: v.policy.panic.clone(),
                    fleet_slow: v.policy.fleet_slow.clone(),
                    ejected_slow: v
                        .backends
                        .iter()
                        .filter(|b| b.policy.placement == policy::Placement::EjectedSlow)
                        .count() as u32,
                    max_ejected: v.cfg.protection.max_ejected.max_of(v.eligible_count()) as u32,
                    min_healthy: v.cfg.protection.min_healthy.min_of(v.eligible_count()) as u32,
                    auto_timeout_ms: v
                        .backends
                        .iter()
                        .any(|b| b.cfg.health.auto_timeout)
                        .then(|| v.auto_timeout.load(Ordering::Relaxed) as f64 / 1e6)
                        .filter(|&ms| ms > 0.0),
                    backends: v
                        .backends
                        .iter()
                        .map(|b| self.backend_status(v, b))
                        .collect(),
                }
            })
            .collect();
        StatusReport {
            version: ctl::PROTOCOL_VERSION,
            instance: self.cfg.daemon.instance.clone(),
            interface: self.cfg.daemon.interface.clone(),
            xdp_mode: self.cfg.daemon.xdp_mode.to_string(),
            started_unix_ms: unix_ms(self.started),
            adopted: self.adopted,
            config_path: self.config_path.display().to_string(),
            conntrack: ctl::ConntrackStatus {
                entries: self.ct_entries.load(Ordering::Relaxed),
                capacity: self.cfg.daemon.conntrack_size as u64,
            },
            counters,
            vips,
        }
    }

    fn backend_status(&self, v: &Vip, b: &Backend) -> BackendStatus {
        let member = b.member();
        let r = self.be_rates.get(&b.id).copied().unwrap_or_default();
        // Totals read now (one lookup), rates from the last 1 s sample.
        let live = self.dp.backend_stats(b.id).unwrap_or(r.last);
        let snap = b.snapshot.as_ref();
        BackendStatus {
            address: b.cfg.socket_addr().to_string(),
            weight: b.cfg.weight,
            state: b.state_name().to_string(),
            health: b.health.as_str().to_string(),
            admin_drained: b.admin_drained,
            in_table: b.in_table(),
            since_unix_ms: instant_ms(b.since),
            last_transition_reason: snap.and_then(|s| s.last_transition_reason.clone()),
            last_probe: snap.and_then(|s| {
                let res = s.last_result.as_ref()?;
                let class = res.class(effective_timeout(&b.cfg.health, Some(&v.auto_timeout)));
                Some(ProbeStatus {
                    ok: res.outcome.is_ok(),
                    reason: match (&res.outcome, &class) {
                        // "answered in 2.5s (slower than timeout 1s)"
                        (Ok(_), ProbeClass::Slow { .. }) => class.to_string(),
                        (Ok(ok), _) => match ok.status {
                            Some(code) => format!("ok {code}"),
                            None => "ok".to_string(),
                        },
                        (Err(e), _) => e.to_string(),
                    },
                    code: class.code().to_string(),
                    status: res.outcome.as_ref().ok().and_then(|o| o.status),
                    latency_ms: res.latency.as_secs_f64() * 1e3,
                    at_unix_ms: s.last_probe_at.map(instant_ms).unwrap_or(0),
                })
            }),
            consecutive_ok: snap.map(|s| s.consecutive_ok).unwrap_or(0),
            consecutive_fail: snap.map(|s| s.consecutive_fail).unwrap_or(0),
            new_flows_per_sec: r.nfps,
            packets_per_sec: r.pps,
            packets: live.packets,
            bytes: live.bytes,
            new_flows: live.new_flows,
            placement: b.policy.placement.as_str().to_string(),
            placement_reason: b.policy.reason.clone(),
            effective_weight: f64::from(b.cfg.weight)
                * b.policy.weight_fraction(&v.cfg.protection, Instant::now()),
            consecutive_slow: member.consecutive_slow,
            latency_ms: member.latency.map(|d| d.as_secs_f64() * 1e3),
            probe_local_errors: snap.map_or(0, |s| s.local_errors),
            flows: self.flows_of(b),
            drain_deadline_unix_ms: b.drain_deadline.filter(|_| b.admin_drained).map(unix_ms),
        }
    }

    async fn handle(&mut self, req: Request) -> Response {
        let res: anyhow::Result<Response> = match req {
            Request::Status => {
                self.status_asked = Some(Instant::now());
                Ok(Response::Status(self.status()))
            }
            Request::Events { since_seq, .. } => {
                let since = since_seq.unwrap_or(0);
                Ok(Response::Events(
                    self.events
                        .iter()
                        .filter(|e| e.seq > since)
                        .cloned()
                        .collect(),
                ))
            }
            Request::Explain {
                protocol,
                client,
                vip,
            } => self
                .explain(&protocol.to_string(), client, vip)
                .map(Response::Explain),
            Request::Drain {
                vip,
                backend,
                deadline_ms,
            } => self
                .set_drain(&vip, &backend, true, deadline_ms.map(Duration::from_millis))
                .map(|m| Response::Ok { message: m }),
            Request::Enable { vip, backend } => self
                .set_drain(&vip, &backend, false, None)
                .map(|m| Response::Ok { message: m }),
            Request::Reload => self.reload().map(|m| Response::Ok { message: m }),
        };
        res.unwrap_or_else(|e| Response::Error {
            message: format!("{e:#}"),
        })
    }

    /// Attaches, starts probes, the control socket and metrics, and runs the
    /// main loop until SIGTERM/SIGINT. On exit nothing is detached: the data
    /// plane keeps forwarding with the last written state.
    pub async fn serve(mut self, listener: tokio::net::UnixListener) -> anyhow::Result<()> {
        let (link_id, adopted_link) = super::attach_lb(&mut self.dp, &self.cfg.daemon)?;
        super::attach_hc(&mut self.dp, &self.cfg.daemon)?;
        self.link_id = link_id;
        self.adopted |= adopted_link;
        let vcount = self.vips.len();
        let bcount: usize = self.vips.iter().map(|v| v.backends.len()).sum();
        let msg = format!(
            "xlb started on {} (link {link_id}, {}): {vcount} VIPs, {bcount} backends",
            self.cfg.daemon.interface,
            if adopted_link {
                "adopted the pinned link and maps"
            } else {
                "attached"
            }
        );
        info!("{msg}");
        self.event(EventKind::Start, None, None, None, None, msg, None);
        self.save();
        self.start_probes();

        let (call_tx, mut call_rx) = mpsc::channel::<Call>(64);
        let handler = Arc::new(Bridge {
            calls: call_tx,
            events: self.events_tx.clone(),
        });
        tokio::spawn(ctl::serve(listener, handler));
        if let Some(addr) = self.cfg.daemon.metrics_address {
            let source = Arc::new(Published(self.published.clone()));
            tokio::spawn(async move {
                if let Err(e) = metrics::serve(addr, source).await {
                    error!("metrics on {addr}: {e:#}");
                }
            });
        }
        conntrack::spawn(
            super::persist::pin_dir(&self.cfg.daemon.instance).join(lb_common::MAP_CT),
            self.cfg.daemon.conntrack_size,
            self.ct_entries.clone(),
            self.flows.clone(),
        );
        // Deadlines that passed while no daemon ran apply now.
        self.check_drains();
        self.sample();

        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut tick = tokio::time::interval(super::TICK);
        let mut reports = self.reports.take().context("probes not started")?;
        loop {
            tokio::select! {
                Some(r) = reports.recv() => {
                    if let Err(e) = self.on_report(r) {
                        error!("applying a health report: {e:#}");
                    }
                }
                Some((req, reply)) = call_rx.recv() => {
                    let resp = self.handle(req).await;
                    let _ = reply.send(resp);
                }
                _ = hup.recv() => {
                    match self.reload() {
                        Ok(m) => info!("SIGHUP: {m}"),
                        Err(e) => error!("SIGHUP: {e:#}"),
                    }
                }
                _ = tick.tick() => {
                    self.check_drains();
                    // Slow-start steps and flap-penalty decay move with time,
                    // and automatic timeouts follow the VIPs' latency.
                    for v in &self.vips {
                        v.update_auto_timeout();
                    }
                    for vi in 0..self.vips.len() {
                        if let Err(e) = self.evaluate_vip(vi) {
                            error!("applying the health policy: {e:#}");
                        }
                    }
                    self.sample();
                }
                _ = term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        info!(
            "xlb stopping; the XDP program stays attached with the last state (xlb detach removes it)"
        );
        self.save();
        let _ = std::fs::remove_file(&self.cfg.daemon.control_socket);
        Ok(())
    }

    /// The link id of the attached program.
    pub fn link_id(&self) -> u32 {
        self.link_id
    }

    pub fn dataplane(&mut self) -> &mut Dataplane {
        &mut self.dp
    }

    pub fn vips(&self) -> &[Vip] {
        &self.vips
    }
}

/// The control socket's side: forwards each request to the main loop.
struct Bridge {
    calls: mpsc::Sender<Call>,
    events: broadcast::Sender<Event>,
}

impl ctl::Handler for Bridge {
    fn handle(
        &self,
        req: Request,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send + '_>> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            if self.calls.send((req, tx)).await.is_err() {
                return Response::Error {
                    message: "the daemon is shutting down".into(),
                };
            }
            match tokio::time::timeout(Duration::from_secs(30), rx).await {
                Ok(Ok(r)) => r,
                _ => Response::Error {
                    message: "the daemon did not answer within 30 s".into(),
                },
            }
        })
    }

    fn subscribe_events(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }
}

/// The metrics endpoint's view: refreshed by the main loop every tick.
struct Published(Arc<Mutex<(StatusReport, MetricsExtra)>>);

impl metrics::MetricsSource for Published {
    fn snapshot(&self) -> (StatusReport, MetricsExtra) {
        self.0.lock().map(|p| p.clone()).unwrap_or_default()
    }
}

/// `bpf_ktime_get_coarse_ns()` as userspace reads it.
pub(super) fn coarse_now_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write to.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) } != 0 {
        return 0;
    }
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
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
