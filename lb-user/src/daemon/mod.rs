//! `xlb run`: the daemon. Loads and attaches the data plane (adopting what a
//! previous run pinned), probes every backend, rewrites the maps when health
//! changes, and answers the control socket.
//!
//! Everything that touches the maps runs on one task (the main loop); the
//! control socket and the metrics endpoint talk to it over channels, so no
//! lock is ever held across a map write and the packet path never waits.
//!
//! This file holds [`Daemon`], the state the main loop owns, and what every
//! part of it uses (install a VIP, record an event, save the state file).
//! The parts, each an `impl Daemon` of its own:
//!
//! - `start`: `xlb run` up to the main loop: host, maps, globals, model.
//! - `links`: attaching the programs, adopting pinned links; `xlb detach`.
//! - `main_loop`: going live and the loop itself (reports, requests,
//!   signals, the 1 s tick).
//! - `evaluate`: health reports through the VIP policy into the maps, with
//!   one log line and one event per change.
//! - `drain`: `xlb drain`/`enable`, drain deadlines, flows per backend.
//! - `reload`: SIGHUP and `xlb reload`: apply only what changed.
//! - `status`, `explain`: the views served to operators and metrics.
//! - `control`: the control socket's and the metrics endpoint's bridges.
//! - `model`, `persist`, `conntrack`: VIPs and backends and their map
//!   writes, the state file, the conntrack walk.
//! - `passive`: NAT VIPs' per-backend traffic counters, sampled every
//!   100 ms and judged into passive evidence for the health machines.

pub mod alarms;
mod announce;
mod chance;
mod cluster;
mod conntrack;
mod control;
mod drain;
mod evaluate;
mod event_seq;
mod explain;
mod guard;
mod links;
mod main_loop;
pub mod model;
pub mod nat;
mod nat_purge;
mod nat_sweep;
mod notify;
mod passive;
pub mod persist;
pub mod pin_sizes;
mod purge;
mod reload;
mod sources;
mod start;
mod status;
mod tx_watch;
pub mod weight;

use std::{
    collections::{HashMap, VecDeque},
    path::PathBuf,
    sync::{Arc, Mutex, atomic::AtomicU64},
    time::{Duration, Instant, SystemTime},
};

use lb_common::LAYOUT_VERSION;
use tokio::sync::{broadcast, mpsc};
use tracing::warn;

use self::{
    model::{Ids, Rebuild, Vip},
    persist::Saved,
    status::Rate,
};
use crate::{
    config::Config,
    ctl::{self, Event, EventKind, StatusReport},
    dataplane::Dataplane,
    health::scheduler::{Report, Scheduler},
    metrics::{LatencyHistogram, MetricsExtra, ProbeFailures},
};

pub use self::{
    links::detach,
    sources::walk_sources,
    start::{run, start},
};
/// Kept where the health benchmark finds it.
pub use crate::host::raise_nofile_to;

/// Events kept for `xlb events`: a mass flap of a few thousand backends
/// fits (one event per transition; about 3 MB at most).
const EVENT_LOG: usize = 10_000;

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
    /// No event has a number at or above this; the state file holds it
    /// (`event_seq`).
    seq_reserved: u64,
    /// What `GET /events` serves.
    events_shared: event_seq::SharedEvents,
    /// Weights changed by `xlb weight` (`weight`).
    weights: weight::Overrides,
    events_tx: broadcast::Sender<Event>,
    started: SystemTime,
    adopted: bool,
    link_id: u32,
    vip_rates: HashMap<u32, Rate>,
    be_rates: HashMap<u32, Rate>,
    last_sample: Instant,
    /// When the last `alarm` event about local probe errors was recorded.
    last_alarm: Option<Instant>,
    /// The conntrack table's fill alarms.
    fill_alarms: alarms::FillAlarms,
    /// The conntrack insert cap's alarm.
    capped_alarm: alarms::CappedAlarm,
    /// Each VIP's alarm about data-path probes failing by this host's fault.
    path_alarms: alarms::PathAlarms,
    /// Forwarded frames against the interfaces' TX drops, and the alarm's
    /// text while it stands.
    tx_watch: tx_watch::TxWatch,
    tx_alarm: Option<String>,
    /// Heavy hitters: rates, alerts, auto_block (`sources`).
    sources: sources::Watch,
    histograms: HashMap<u32, LatencyHistogram>,
    /// Failed probes per backend, by reason code (`xlb_backend_probe_failures_total`).
    probe_failures: HashMap<u32, ProbeFailures>,
    transitions: HashMap<u32, u64>,
    /// Backend id → (VIP index, backend index); rebuilt whenever `vips`
    /// changes shape (start, reload), not per health report.
    index: HashMap<u32, (usize, usize)>,
    /// Conntrack entries, counted off the main loop (see `conntrack::spawn`).
    ct_entries: Arc<AtomicU64>,
    /// Established flows per backend from the same walk, and its pace.
    flows: Arc<conntrack::Shared>,
    /// The NAT sweep's latest walk (`nat_sweep`).
    nat_flows: Arc<nat_sweep::Shared>,
    /// The NAT maps' fill and port-exhaustion alarms.
    nat_alarms: nat::NatAlarms,
    /// When `status` was last asked for: someone polling it (`xlb drain
    /// --wait`) wants fresh flow counts of the backends being drained.
    status_asked: Option<Instant>,
    /// What the metrics endpoint serves, refreshed every tick.
    published: Arc<Mutex<(StatusReport, MetricsExtra)>>,
    /// The deny and allow lists (`guard`).
    lists: crate::guard::lists::Lists,
    /// Conntrack purges of new deny entries, finished off the main loop.
    purges: Arc<guard::Purges>,
    /// Sysctls changed by this run or an earlier one, with their values
    /// before: kept in the state file for `xlb detach`.
    forwarding: Vec<crate::host::SysctlChange>,
    /// Those this process changed: put back if it fails to go live.
    forwarding_changed: Vec<crate::host::SysctlChange>,
    /// The globals (hash key, encapsulation sources) this start writes
    /// when it goes live, not before (`go_live`).
    globals: lb_common::Globals,
    /// Announcements: decisions, the route writer, withdrawals (`announce`).
    announcing: announce::Announcing,
    /// What systemd has been told (`notify`).
    notify: notify::Notify,
    /// Passive detection's histories and verdicts (`passive`).
    passive: passive::Passive,
}

/// Whether the state file describes maps of this binary's layout; if not,
/// it is ignored (with a warning) and the pinned maps alone are adopted.
fn state_of_this_layout(s: &Saved) -> bool {
    let ours = s.layout_version == LAYOUT_VERSION;
    if !ours {
        warn!(
            "the state file describes maps of layout version {}, these are version \
             {LAYOUT_VERSION}: ignoring it and adopting from the pinned maps alone",
            s.layout_version
        );
    }
    ours
}

impl Daemon {
    /// Builds the model, adopting ids, states and tables from a previous run.
    pub fn new(
        config_path: PathBuf,
        mut cfg: Config,
        mut dp: Dataplane,
        saved: Option<Saved>,
    ) -> anyhow::Result<Self> {
        let next_seq = event_seq::first_seq(saved.as_ref());
        let (weights, dropped) = weight::from_saved(saved.as_ref()).apply_to(&mut cfg);
        let saved = saved.filter(state_of_this_layout);
        let (ids, vips, adopted) = model::adopt_all(&mut dp, &cfg, saved.as_ref())?;
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
            next_seq,
            seq_reserved: next_seq + event_seq::SEQ_BLOCK,
            weights: weight::Overrides::default(),
            events_shared: event_seq::SharedEvents::default(),
            events_tx,
            started: SystemTime::now(),
            adopted,
            link_id: 0,
            vip_rates: HashMap::new(),
            be_rates: HashMap::new(),
            last_sample: Instant::now(),
            last_alarm: None,
            fill_alarms: alarms::FillAlarms::default(),
            capped_alarm: alarms::CappedAlarm::default(),
            path_alarms: alarms::PathAlarms::default(),
            tx_watch: tx_watch::TxWatch::default(),
            tx_alarm: None,
            sources: sources::Watch::default(),
            histograms: HashMap::new(),
            passive: passive::Passive::default(),
            probe_failures: HashMap::new(),
            index,
            ct_entries: Arc::new(AtomicU64::new(0)),
            flows: Arc::default(),
            nat_flows: Arc::default(),
            nat_alarms: nat::NatAlarms::default(),
            status_asked: None,
            transitions: HashMap::new(),
            published: Arc::new(Mutex::new((
                StatusReport::default(),
                MetricsExtra::default(),
            ))),
            lists: crate::guard::lists::Lists::default(),
            purges: Arc::default(),
            forwarding: Vec::new(),
            forwarding_changed: Vec::new(),
            globals: lb_common::Globals::default(),
            announcing: announce::Announcing::from_saved(
                saved.as_ref().and_then(|s| s.announce.as_ref()),
            ),
            notify: notify::Notify::default(),
        };
        d.keep_weights(weights, dropped);
        // Guards and lists before the VIPs go live: a VIP's first packet
        // is judged by its configuration.
        d.init_lists(saved.as_ref())?;
        for vi in 0..d.vips.len() {
            d.install(vi)?;
        }
        // As a reload retires a removed backend: only once the live tables
        // no longer point at it. Its conntrack entries are then stale
        // rather than forwarded to a backend nobody probes.
        model::retire_orphans(&mut d.dp, &mut d.ids, &d.vips)?;
        d.dp.sync_hc_reals(&model::hc_reals(&d.vips))?;
        Ok(d)
    }

    /// Writes VIP `vi`'s entries and makes its wanted table live.
    fn install(&mut self, vi: usize) -> anyhow::Result<Option<Rebuild>> {
        // A NAT VIP's pool, reply filter and marks before its entry, so its
        // first packet takes the NAT path with everything it needs, never
        // the DSR path (`sync_nat` writes what every VIP in `self.vips`,
        // this one included, needs; the reload's last sync removes what a
        // change left over).
        if self.vips[vi].cfg.nat.is_some() {
            self.sync_nat()?;
        }
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
            vip.chance.0[vip.active as usize & 1] = Some(crate::chance::History::empty(want.len()));
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
            at_unix_ms: ctl::now_unix_ms(),
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
        self.seq_taken();
        if self.events.len() == EVENT_LOG {
            self.events.pop_front();
        }
        self.events.push_back(ev.clone());
        self.events_shared.push(&ev);
        let _ = self.events_tx.send(ev);
    }

    /// Records an event about backend `bi` of VIP `vi` going `from` → `to`.
    fn backend_event(
        &mut self,
        kind: EventKind,
        (vi, bi): (usize, usize),
        (from, to): (&str, &str),
        reason: String,
        r: Option<Rebuild>,
    ) {
        let vip = self.vips[vi].cfg.name.clone();
        let addr = self.vips[vi].backends[bi].cfg.socket_addr().to_string();
        self.event(
            kind,
            Some(&vip),
            Some(addr),
            Some(from),
            Some(to),
            reason,
            r,
        );
    }

    fn save(&self) {
        let path = persist::state_path(&self.cfg.daemon.pinned.instance);
        let mut saved = self.state_but_lists();
        saved.lists = self.saved_lists();
        // In order with the saves made off the loop (`sources::block`).
        self.sources.saves.store_now(&saved, &path);
    }

    /// What the state file holds, but the list entries (empty).
    fn state_but_lists(&self) -> persist::Saved {
        let mut saved = model::to_saved(&self.vips);
        saved.forwarding = self.forwarding.clone();
        saved.announce = self.announce_saved();
        saved.weights = self.weights.to_saved();
        saved.next_event_seq = self.seq_reserved;
        saved
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

/// How often rates are sampled and the state file is refreshed.
pub const TICK: Duration = Duration::from_secs(1);
