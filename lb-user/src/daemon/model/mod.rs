//! The daemon's model of VIPs and backends, and every write it makes to the
//! maps: backend states, Maglev tables (written into the inactive half, then
//! made live by one `VipInfo` write), VIP entries. What a restart adopts
//! from the previous run is in `adopt`.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant, SystemTime},
};

use anyhow::Context as _;
use lb_common::{
    BACKEND_DOWN, BACKEND_DRAINING, BACKEND_IDS, BACKEND_UP, BackendInfo, HcReal, MAX_VIPS,
    RingSlot, VipInfo, VipKey, addr16, family_of,
};
use tracing::{info, warn};

use crate::{
    chance,
    config::{BackendConfig, VipConfig},
    dataplane::Dataplane,
    health::{
        datapath::{DatapathTarget, NatPath},
        machine::{HealthSnapshot, HealthState},
        policy::{self, Member, MemberState, Placement, RAMP_STEPS, VipState},
        scheduler::{AutoTimeout, Scheduler},
        spec::{AUTO_SAMPLES, Via, auto_timeout},
    },
    maglev,
};

mod adopt;

pub use self::adopt::{adopt_all, adopt_or_create_vip, to_saved};

/// The map key of VIP `cfg`.
pub fn vip_key(cfg: &VipConfig) -> VipKey {
    VipKey::new(cfg.addr, cfg.port, crate::config::ip_proto(cfg.protocol))
}

/// One backend of one VIP.
#[derive(Debug)]
pub struct Backend {
    pub cfg: BackendConfig,
    /// Index in `XLB_BACKENDS`; also the health scheduler's id.
    pub id: u32,
    pub generation: u32,
    pub health: HealthState,
    pub admin_drained: bool,
    /// When an admin drain ends with the backend `down` (`xlb drain
    /// --deadline`): wall-clock time, as it survives restarts.
    pub drain_deadline: Option<SystemTime>,
    /// The drain's deadline has passed: the data plane has the backend
    /// `down`, so its remaining flows follow the VIP's `down_policy`.
    pub drain_expired: bool,
    /// When this process drained it (`None` for a drain adopted from the
    /// previous run): flow counts from walks that began earlier may miss
    /// connections, so a drain is judged by later ones only.
    pub drained_at: Option<Instant>,
    /// The latest health snapshot from the scheduler (None until its first report).
    pub snapshot: Option<HealthSnapshot>,
    /// When the data-plane state last changed (for "time in state").
    pub since: Instant,
    /// What the VIP policy decided for it, and what it remembers (ramp,
    /// flap penalty).
    pub policy: MemberState,
    /// Its `max_flows` alarm.
    pub flows_alarm: crate::daemon::alarms::Level,
}

/// A placement's name in events and logs: `up` for serving (as before the
/// policy existed, so `up`/`down`/`draining`/`unknown` keep their meaning),
/// else the placement's own name.
pub fn placement_label(p: Placement) -> &'static str {
    match p {
        Placement::Serving => "up",
        other => other.as_str(),
    }
}

impl Backend {
    /// What the data plane does with this backend. Slow outliers and
    /// held-down backends take no new flows but keep their established ones
    /// (they answer, only slowly or unsteadily); hard failures are `down`,
    /// so the VIP's `down_policy` applies to their flows.
    pub fn dp_state(&self) -> u8 {
        match self.policy.placement {
            Placement::Serving | Placement::Ramping | Placement::PanicRestored => BACKEND_UP,
            // Out on passive evidence alone, its probes passing (issue
            // 38): evidence is made by clients, so it moves new flows and
            // keeps established ones until probes confirm (`fall`).
            Placement::Down if self.passive_only() => BACKEND_DRAINING,
            // The application said so: as a failed check.
            Placement::Down | Placement::AgentDown => BACKEND_DOWN,
            // A drain whose deadline passed: its flows follow down_policy.
            Placement::Draining if self.drain_expired => BACKEND_DOWN,
            // Never probed: no new flows, and no flows to move either.
            Placement::EjectedSlow
            | Placement::HeldDown
            | Placement::Draining
            // The agent drains as an admin drain does.
            | Placement::AgentDrain
            | Placement::AgentMaint
            | Placement::Unknown => BACKEND_DRAINING,
        }
    }

    /// Out of the table on passive evidence while its probes pass: its
    /// hard state is up and evidence stands against it.
    pub fn passive_only(&self) -> bool {
        self.health == HealthState::Up
            && self.snapshot.as_ref().is_some_and(|s| s.passive.is_some())
    }

    /// Whether the Maglev table includes it.
    pub fn in_table(&self) -> bool {
        self.policy.placement.in_table() && self.cfg.weight > 0
    }

    /// The data-plane state's name (`xlb status` STATE): one of
    /// `ctl::BACKEND_STATES`.
    pub fn state_name(&self) -> &'static str {
        match self.dp_state() {
            BACKEND_UP => "up",
            BACKEND_DOWN => "down",
            _ if self.policy.placement == Placement::Unknown => "unknown",
            // Out on passive evidence: down for new flows.
            _ if self.policy.placement == Placement::Down => "down",
            _ => "draining",
        }
    }

    /// The placement's name, for events and logs.
    pub fn placement_name(&self) -> &'static str {
        placement_label(self.policy.placement)
    }

    /// What the VIP policy needs to know of this backend now.
    pub fn member(&self) -> Member {
        Member::from_snapshot(
            self.cfg.socket_addr().to_string(),
            self.cfg.weight,
            self.admin_drained,
            self.health,
            &self.cfg.health,
            self.snapshot.as_ref(),
        )
    }

    pub fn info(&self) -> BackendInfo {
        BackendInfo {
            addr: addr16(self.cfg.addr),
            generation: self.generation,
            state: self.dp_state(),
            family: family_of(self.cfg.addr),
            port: self.cfg.port.to_be(),
        }
    }
}

/// What `XLB_HC_REALS` must hold: for every backend of every VIP, the mark
/// of its data-path probes → its address and the VIP's mode. Written whole
/// at start and after each reload (ids are recycled only by a reload).
pub fn hc_reals(vips: &[Vip]) -> HashMap<u32, HcReal> {
    vips.iter()
        .flat_map(|v| {
            v.backends.iter().map(|b| {
                (
                    lb_common::hc_mark(b.id),
                    HcReal {
                        addr: addr16(b.cfg.addr),
                        family: family_of(b.cfg.addr),
                        mode: v.cfg.raw_mode(),
                        _pad: [0; 2],
                    },
                )
            })
        })
        .collect()
}

/// One VIP and its double-buffered table.
#[derive(Debug)]
pub struct Vip {
    pub cfg: VipConfig,
    pub id: u32,
    pub key: VipKey,
    /// Live ring half.
    pub active: u32,
    /// What each ring half holds, as far as this process knows (`None`:
    /// unknown, rewrite it whole before use).
    pub halves: [Option<Vec<u32>>; 2],
    /// The previous owners each half holds (second chance).
    pub chance: chance::Halves,
    pub backends: Vec<Backend>,
    /// Panic and fleet-slow state of the VIP policy.
    pub policy: VipState,
    /// The deadline of its `timeout = "auto"` checks, shared with their
    /// probe tasks (see [`Vip::update_auto_timeout`]).
    pub auto_timeout: AutoTimeout,
    /// Latencies of its backends' recent passing answers, newest last (at
    /// most [`AUTO_SAMPLES`]).
    pub answers: VecDeque<Duration>,
}

impl Vip {
    /// The entry for the live half: its size is the live table's (which
    /// differs from the configured one between a reload that resizes the
    /// table and the flip to the new half).
    pub fn info(&self) -> VipInfo {
        VipInfo {
            table_size: self.halves[self.active as usize & 1]
                .as_ref()
                .map_or(self.cfg.table_size, |t| t.len() as u32),
            active: self.active,
            vip_id: self.id,
            mode: self.cfg.raw_mode(),
            down_policy: self.cfg.down_policy.as_raw(),
            host_services: u8::from(self.cfg.host_services),
            second_chance: u8::from(self.cfg.second_chance),
            key: self.key,
        }
    }

    /// The previous owners of table `want` once it replaces the live one
    /// at `now` (none without second chance).
    pub fn next_history(&self, want: &[u32], now: u64) -> chance::History {
        let live = self.active as usize & 1;
        let (Some(old), true) = (&self.halves[live], self.cfg.second_chance) else {
            return chance::History::empty(want.len());
        };
        let empty = chance::History::default();
        let hist = self.chance.0[live].as_ref().unwrap_or(&empty);
        let members: HashSet<u32> = self.backends.iter().map(|b| b.id).collect();
        chance::next(
            old,
            want,
            hist,
            now,
            chance::window_ns(),
            chance::reload_ns(),
            |id| members.contains(&id),
        )
    }

    /// The table this VIP should have now (slow-start ramps included).
    pub fn wanted_table(&self) -> Vec<u32> {
        let now = Instant::now();
        let mut members: Vec<maglev::MaglevBackend> = self
            .backends
            .iter()
            .filter(|b| b.in_table())
            .map(|b| maglev::MaglevBackend {
                id: b.id,
                addr: b.cfg.addr,
                port: b.cfg.port,
                weight: b
                    .policy
                    .table_weight(&self.cfg.protection, b.cfg.weight, now),
            })
            .collect();
        // Outside ramps every weight is the configured one × RAMP_STEPS:
        // build with the configured weights, so the table is exactly the one
        // every node (and a restart) computes from the configuration.
        if members.iter().all(|m| m.weight % RAMP_STEPS == 0) {
            for m in &mut members {
                m.weight /= RAMP_STEPS;
            }
        }
        maglev::build(&members, self.cfg.table_size)
    }

    /// Runs the VIP policy over its backends as they are now and records
    /// each one's new placement; the caller applies the outcome (maps,
    /// table, events).
    pub fn run_policy(&mut self, now: Instant) -> policy::Outcome {
        let members: Vec<Member> = self.backends.iter().map(Backend::member).collect();
        let mut states: Vec<MemberState> = self.backends.iter().map(|b| b.policy.clone()).collect();
        let outcome = policy::evaluate(
            &self.cfg.protection,
            &members,
            &mut states,
            &mut self.policy,
            now,
        );
        for (b, st) in self.backends.iter_mut().zip(states) {
            b.policy = st;
        }
        outcome
    }

    /// Records a passing answer's latency for `timeout = "auto"`.
    pub fn record_answer(&mut self, latency: Duration) {
        if self.answers.len() == AUTO_SAMPLES {
            self.answers.pop_front();
        }
        self.answers.push_back(latency);
    }

    /// Sets the deadline of its `timeout = "auto"` checks from its recent
    /// answers; `None` if none of its checks is automatic.
    pub fn update_auto_timeout(&self) -> Option<Duration> {
        let autos = || {
            self.backends
                .iter()
                .map(|b| &b.cfg.health)
                .filter(|s| s.auto_timeout)
        };
        let start = autos().map(|s| s.timeout).min()?;
        let ceiling = autos().map(|s| s.interval.min(s.hang_timeout)).min()?;
        let samples: Vec<Duration> = self.answers.iter().copied().collect();
        let t = auto_timeout(&samples, start, ceiling);
        self.auto_timeout
            .store(t.as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
        Some(t)
    }

    /// Backends the policy's limits count: weight above 0, not drained,
    /// probed at least once.
    pub fn eligible_count(&self) -> usize {
        self.backends
            .iter()
            .filter(|b| b.cfg.weight > 0 && !b.admin_drained && b.health != HealthState::Unknown)
            .count()
    }

    pub fn up_count(&self) -> usize {
        self.backends.iter().filter(|b| b.in_table()).count()
    }
}

/// What a table rebuild did.
#[derive(Clone, Copy, Debug)]
pub struct Rebuild {
    pub took: Duration,
    pub slots_changed: u32,
}

/// Makes `vip`'s wanted table live: writes the slots that differ into the
/// inactive half, then flips `active` with one `VipInfo` write. Packets see
/// either the old table or the new one, never a mix. `None` if the live table
/// is already the wanted one (nothing written).
pub fn rebuild(dp: &mut Dataplane, vip: &mut Vip) -> anyhow::Result<Option<Rebuild>> {
    let start = Instant::now();
    let want = vip.wanted_table();
    let live = vip.active as usize & 1;
    let hist = vip.next_history(&want, chance::now_ns());
    if vip.halves[live].as_deref() == Some(want.as_slice())
        && vip.chance.0[live].as_ref().map(|h| &h.prev) == Some(&hist.prev)
    {
        return Ok(None);
    }
    let spare = 1 - live;
    let writes = spare_writes(vip, spare, &want, &hist.prev);
    // Unknown until the writes succeed: a failure part-way must not leave a
    // stale copy that later diffs trust.
    vip.halves[spare] = None;
    vip.chance.0[spare] = None;
    dp.write_ring_slots(vip.id, spare as u32, &writes)
        .with_context(|| format!("vip {:?}: writing table", vip.cfg.name))?;
    // A new table size changes `table_size` in the same write that flips
    // `active`. Should a packet read one without the other, every slot it can
    // index must still hold a backend of this VIP: pad both halves past their
    // own size with entries of the new table (slots a reader of the live
    // half never indexes with its current size).
    if let Some(cur) = vip.halves[live].as_deref()
        && cur.len() != want.len()
        && !want.is_empty()
    {
        let longest = cur.len().max(want.len());
        let pad = |from: usize| -> Vec<(u32, u32)> {
            (from..longest)
                .map(|i| (i as u32, want[i % want.len()]))
                .collect()
        };
        dp.write_ring(vip.id, spare as u32, &pad(want.len()))?;
        dp.write_ring(vip.id, live as u32, &pad(cur.len()))?;
    }
    let changed = match &vip.halves[live] {
        Some(cur) if cur.len() == want.len() => maglev::diff(cur, &want).len() as u32,
        _ => want.len() as u32,
    };
    let mut info = vip.info();
    info.active = spare as u32;
    info.table_size = want.len() as u32;
    dp.set_vip_info(&info)
        .with_context(|| format!("vip {:?}: switching tables", vip.cfg.name))?;
    vip.halves[spare] = Some(want);
    vip.chance.0[spare] = Some(hist);
    vip.active = spare as u32;
    Ok(Some(Rebuild {
        took: start.elapsed(),
        slots_changed: changed,
    }))
}

/// The ring writes that make half `spare` hold `want` with previous owners
/// `prev`: the slots that differ from what it is known to hold, or all.
fn spare_writes(vip: &Vip, spare: usize, want: &[u32], prev: &[u32]) -> Vec<(u32, RingSlot)> {
    let slot = |i: usize| RingSlot {
        backend_id: want[i],
        prev_id: prev[i],
    };
    match (&vip.halves[spare], &vip.chance.0[spare]) {
        (Some(old), Some(h)) if old.len() == want.len() && h.prev.len() == want.len() => (0..want
            .len())
            .filter(|&i| old[i] != want[i] || h.prev[i] != prev[i])
            .map(|i| (i as u32, slot(i)))
            .collect(),
        _ => (0..want.len()).map(|i| (i as u32, slot(i))).collect(),
    }
}

/// Starts or updates the probes of backend `b` of the VIP `vip`: through the
/// data path (to the VIP, marked for `xlb_hc` on `pinned.interface`) when its
/// check says `via = "vip"`, else straight to the backend. A NAT VIP's
/// data-path probe leaves from the VIP's first pool address (or, with
/// `preserve_client`, the LB's own) with its NAT flow written into the maps
/// pinned for `pinned.instance` (`dataplane::nat_probe`).
pub fn upsert_probe(
    sched: &mut Scheduler,
    pinned: &crate::config::PinnedSettings,
    vip: &Vip,
    b: &Backend,
) {
    let spec = b.cfg.health.clone();
    let auto = spec.auto_timeout.then(|| vip.auto_timeout.clone());
    let cfg = &vip.cfg;
    let path = (spec.via == Via::Vip).then(|| {
        let target = DatapathTarget::new(
            SocketAddr::new(cfg.addr, cfg.port),
            b.id,
            &pinned.interface,
            cfg.mode,
        );
        match &cfg.nat {
            None => target,
            Some(nat) => target.with_nat(NatPath {
                source: (!nat.preserve_client)
                    .then(|| {
                        nat.snat
                            .iter()
                            .copied()
                            .find(|a| a.is_ipv4() == cfg.addr.is_ipv4())
                    })
                    .flatten(),
                backend: b.cfg.addr,
                backend_id: b.id,
                generation: b.generation,
                vip_id: vip.id,
                flows: crate::dataplane::nat_probe::NatProbeMaps::shared(
                    &crate::daemon::persist::pin_dir(&pinned.instance),
                ),
            }),
        }
    });
    sched.upsert_via(
        u64::from(b.id),
        b.cfg.socket_addr(),
        spec,
        b.health,
        path,
        auto,
    );
}

/// New ids a change of configuration takes. What it gives back (removed
/// VIPs and backends) comes free only once it is live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdsNeeded {
    pub vips: usize,
    pub backends: usize,
}

/// Free-list allocation of VIP and backend ids.
#[derive(Debug, Default)]
pub struct Ids {
    used_vips: HashSet<u32>,
    used_backends: HashSet<u32>,
}

impl Ids {
    pub fn take_vip(&mut self, id: u32) {
        self.used_vips.insert(id);
    }
    pub fn take_backend(&mut self, id: u32) {
        self.used_backends.insert(id);
    }
    pub fn alloc_vip(&mut self) -> anyhow::Result<u32> {
        alloc(&mut self.used_vips, 0..MAX_VIPS)
            .context("no free VIP id: at most lb_common::MAX_VIPS VIPs")
    }
    /// Backend id 0 means "none" in the ring.
    pub fn alloc_backend(&mut self) -> anyhow::Result<u32> {
        alloc(&mut self.used_backends, 1..BACKEND_IDS)
            .context("no free backend id: at most lb_common::BACKEND_IDS - 1 in use at once")
    }
    /// Whether `need` fits in the ids free now; if not, what is short.
    pub fn check(&self, need: &IdsNeeded) -> anyhow::Result<()> {
        let backend_ids = BACKEND_IDS as usize - 1;
        let free = backend_ids - self.used_backends.len();
        if need.backends > free {
            anyhow::bail!(
                "{} new backend ids needed but {free} free of {backend_ids}: a changed VIP \
                 keeps the ids of the backends it drops until its new table is live, so \
                 old and new ids are in use at once; apply the change in smaller steps",
                need.backends
            );
        }
        let free = MAX_VIPS as usize - self.used_vips.len();
        if need.vips > free {
            anyhow::bail!(
                "{} new VIP ids needed but {free} free of {MAX_VIPS}: a removed VIP gives \
                 its id back only once the change is live; remove VIPs in one reload and \
                 add the new ones in the next",
                need.vips
            );
        }
        Ok(())
    }
    pub fn free_vip(&mut self, id: u32) {
        self.used_vips.remove(&id);
    }
    pub fn free_backend(&mut self, id: u32) {
        self.used_backends.remove(&id);
    }
}

/// The lowest id of `range` not in `used`, now in it.
fn alloc(used: &mut HashSet<u32>, mut range: std::ops::Range<u32>) -> Option<u32> {
    let id = range.find(|i| !used.contains(i))?;
    used.insert(id);
    Some(id)
}

/// Brings a backend into service under a fresh id: a new generation, so any
/// conntrack entry left by a previous holder of the id is stale.
pub fn new_backend(
    dp: &mut Dataplane,
    ids: &mut Ids,
    cfg: BackendConfig,
) -> anyhow::Result<Backend> {
    let id = ids.alloc_backend()?;
    let old = dp.backend(id)?;
    let b = Backend {
        cfg,
        id,
        generation: old.generation.wrapping_add(1),
        health: HealthState::Unknown,
        admin_drained: false,
        drain_deadline: None,
        drain_expired: false,
        drained_at: None,
        snapshot: None,
        since: Instant::now(),
        policy: MemberState::new(Placement::Unknown, Instant::now()),
        flows_alarm: Default::default(),
    };
    dp.set_backend(id, &b.info())?;
    dp.reset_backend_stats(id)?;
    Ok(b)
}

/// Writes a VIP's entry (key → id, info) to the maps.
pub fn install_vip(dp: &mut Dataplane, vip: &Vip) -> anyhow::Result<()> {
    // The daemon syncs the NAT maps before a NAT VIP's entry (`install`):
    // an entry without its pool would send its first packets down the DSR
    // path. Checked in tests (debug builds), never a refusal in production.
    debug_assert!(
        vip.cfg.nat.is_none()
            || dp
                .nat_pool(vip.id)
                .is_ok_and(|p| p != lb_common::nat::NatPool::default()),
        "vip {:?}: its entry written before its NAT pool",
        vip.cfg.name
    );
    dp.set_vip(&vip.key, &vip.info())
        .with_context(|| format!("vip {:?}: writing its map entries", vip.cfg.name))
}

/// Removes a VIP and its backends from the maps and frees their ids.
pub fn remove_vip(dp: &mut Dataplane, ids: &mut Ids, vip: &Vip) -> anyhow::Result<()> {
    dp.remove_vip(&vip.key)?;
    for b in &vip.backends {
        retire_backend(dp, ids, b)?;
    }
    ids.free_vip(vip.id);
    Ok(())
}

/// Backend ids whose pinned entry is in use (state not 0): tables and
/// conntrack entries may point at them.
pub fn pinned_backend_ids(dp: &Dataplane) -> anyhow::Result<Vec<u32>> {
    let mut out = Vec::new();
    for id in 1..BACKEND_IDS {
        if dp.backend(id)?.state != 0 {
            out.push(id);
        }
    }
    Ok(out)
}

/// Marks every backend id and VIP id the model does not own as unused, and
/// frees them in `ids`, so state left in pinned maps by configuration
/// removed while no daemon ran serves nothing. Call it once the tables are
/// installed: until then the live tables may still point at those ids.
pub fn retire_orphans(dp: &mut Dataplane, ids: &mut Ids, vips: &[Vip]) -> anyhow::Result<()> {
    let owned_backends: HashSet<u32> = vips
        .iter()
        .flat_map(|v| v.backends.iter().map(|b| b.id))
        .collect();
    for id in 1..BACKEND_IDS {
        if owned_backends.contains(&id) {
            continue;
        }
        ids.free_backend(id);
        let mut info = dp.backend(id)?;
        if info.state != 0 {
            info.state = 0;
            dp.set_backend(id, &info)?;
        }
    }
    let owned_vips: HashSet<u32> = vips.iter().map(|v| v.id).collect();
    for id in 0..MAX_VIPS {
        if owned_vips.contains(&id) {
            continue;
        }
        // Reserved at start while a pinned key or table might use it.
        ids.free_vip(id);
        if dp.vip_info(id)?.mode != 0 {
            dp.set_vip_info(&VipInfo {
                vip_id: id,
                ..VipInfo::default()
            })?;
        }
    }
    Ok(())
}

/// Marks a backend's id unused (state 0): its conntrack entries are stale.
pub fn retire_backend(dp: &mut Dataplane, ids: &mut Ids, b: &Backend) -> anyhow::Result<()> {
    let mut info = b.info();
    info.state = 0;
    dp.set_backend(b.id, &info)?;
    ids.free_backend(b.id);
    Ok(())
}

/// Whether `name`, as an operator names a backend (`xlb drain VIP BACKEND`:
/// "addr:port", or just the address), names the backend at `addr`.
/// Shared by the daemon and `xlb drain --wait`, so both find the same one.
pub fn names_backend(name: &str, addr: SocketAddr) -> bool {
    match name.parse::<SocketAddr>() {
        Ok(sock) => sock == addr,
        Err(_) => name.parse::<IpAddr>().is_ok_and(|ip| ip == addr.ip()),
    }
}

/// Finds a backend of VIP `vip_name` by "addr:port" (or just the address).
pub fn find_backend(vips: &[Vip], vip_name: &str, backend: &str) -> anyhow::Result<(usize, usize)> {
    let vi = vips
        .iter()
        .position(|v| v.cfg.name == vip_name)
        .with_context(|| {
            let names: Vec<&str> = vips.iter().map(|v| v.cfg.name.as_str()).collect();
            format!(
                "no VIP named {vip_name:?}; configured: {}",
                names.join(", ")
            )
        })?;
    let bi = vips[vi]
        .backends
        .iter()
        .position(|b| names_backend(backend, b.cfg.socket_addr()))
        .with_context(|| {
            let list: Vec<String> = vips[vi]
                .backends
                .iter()
                .map(|b| b.cfg.socket_addr().to_string())
                .collect();
            format!(
                "vip {vip_name:?} has no backend {backend:?}; its backends: {}",
                list.join(", ")
            )
        })?;
    Ok((vi, bi))
}

/// Logs a backend state change: one line, with the reason; `kind` is the
/// event it is recorded as (`event` in JSON logs).
pub fn log_transition(
    kind: crate::ctl::EventKind,
    vip: &str,
    b: &Backend,
    from: &str,
    reason: &str,
    rebuild: Option<Rebuild>,
) {
    let to = b.placement_name();
    let event = kind.as_str();
    match rebuild {
        Some(r) => info!(
            event,
            vip,
            backend = %b.cfg.socket_addr(),
            from,
            to,
            reason,
            table_build_ms = r.took.as_secs_f64() * 1e3,
            slots_changed = r.slots_changed,
            "backend {from} -> {to}: {reason}; table rebuilt in {:.2} ms ({} slots changed)",
            r.took.as_secs_f64() * 1e3,
            r.slots_changed
        ),
        None => info!(
            event,
            vip,
            backend = %b.cfg.socket_addr(),
            from,
            to,
            reason,
            "backend {from} -> {to}: {reason}"
        ),
    }
}

/// Warns about VIPs with no backend in their table.
pub fn warn_if_empty(vip: &Vip) {
    if vip.up_count() == 0 && !vip.backends.is_empty() {
        warn!(vip = %vip.cfg.name, "no backend of vip {:?} is up: new flows are dropped", vip.cfg.name);
    }
}

/// Index of backends by scheduler id.
pub fn backend_index(vips: &[Vip]) -> HashMap<u32, (usize, usize)> {
    let mut m = HashMap::new();
    for (vi, v) in vips.iter().enumerate() {
        for (bi, b) in v.backends.iter().enumerate() {
            m.insert(b.id, (vi, bi));
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use lb_common::{BACKEND_DOWN, BACKEND_DRAINING, BACKEND_UP};

    use super::*;
    use crate::health::machine::HealthMachine;
    use crate::health::testutil::http_spec;

    fn backend(health: HealthState, placement: Placement, passive: Option<&str>) -> Backend {
        let mut m = HealthMachine::adopted(health, 2, 3, Instant::now());
        if let Some(why) = passive {
            m.observe_passive(why.to_owned());
        }
        Backend {
            cfg: BackendConfig {
                addr: "10.0.0.11".parse().unwrap(),
                port: 80,
                weight: 1,
                health: http_spec(80, Duration::from_secs(1)),
                max_flows: None,
            },
            id: 1,
            generation: 1,
            health,
            admin_drained: false,
            drain_deadline: None,
            drain_expired: false,
            drained_at: None,
            snapshot: Some(m.snapshot()),
            since: Instant::now(),
            policy: MemberState::new(placement, Instant::now()),
            flows_alarm: Default::default(),
        }
    }

    /// Issue 38: clients make passive evidence, so a backend out on it
    /// alone takes no new flows but keeps its established ones (draining
    /// in the data plane, `down` to the operator); once its probes fail
    /// too, `down_policy` applies.
    #[test]
    fn a_passive_only_ejection_keeps_established_flows_until_probes_confirm() {
        let out = backend(HealthState::Up, Placement::Down, Some("passive: 13 of 43"));
        assert!(out.passive_only());
        assert_eq!(out.dp_state(), BACKEND_DRAINING);
        assert_eq!(out.state_name(), "down");
        assert!(!out.in_table());
        let confirmed = backend(
            HealthState::Down,
            Placement::Down,
            Some("passive: 13 of 43"),
        );
        assert!(!confirmed.passive_only());
        assert_eq!(confirmed.dp_state(), BACKEND_DOWN);
        let probes_only = backend(HealthState::Down, Placement::Down, None);
        assert_eq!(probes_only.dp_state(), BACKEND_DOWN);
        let serving = backend(HealthState::Up, Placement::Serving, None);
        assert_eq!(
            (serving.dp_state(), serving.state_name()),
            (BACKEND_UP, "up")
        );
    }
}
