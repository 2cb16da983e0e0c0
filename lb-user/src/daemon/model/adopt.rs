//! Carrying on where the previous run stopped: the state file says which
//! VIP and backend had which id, the pinned maps say whether each entry is
//! still theirs; what both agree on is adopted (ids, generations, health,
//! drains, the live table), so a restart moves no flow. Without a usable
//! state file, the pinned maps alone are read ([`plan_from_pins`]): VIPs by
//! their key, backends by address. [`to_saved`] writes the state file's
//! side.

use std::{
    collections::{BTreeMap, HashSet, VecDeque},
    time::{Duration, Instant, UNIX_EPOCH},
};

use anyhow::Context as _;
use lb_common::{BACKEND_DOWN, BACKEND_UP, BackendInfo, MAX_VIPS, VipInfo, addr16};
use tracing::{info, warn};

use super::{Backend, Ids, IdsNeeded, Vip, new_backend, vip_key};
use crate::{
    config::{BackendConfig, Config, VipConfig},
    daemon::persist::{Saved, SavedBackend, SavedHealth},
    dataplane::Dataplane,
    health::{
        machine::HealthState,
        policy::{MemberState, Placement, VipState},
        scheduler::AutoTimeout,
    },
};

/// What a restart adopts of one VIP: its pinned entry, if it is still the
/// VIP's, and for each configured backend (in order) the previous run's
/// record of it and its pinned entry, or `None` for a backend that starts
/// afresh.
#[derive(Debug)]
pub(super) struct Plan {
    pub vip: Option<VipInfo>,
    pub backends: Vec<Option<(SavedBackend, BackendInfo)>>,
}

impl Plan {
    /// Nothing adopted: a new VIP with `n` new backends.
    fn fresh(n: usize) -> Self {
        Self {
            vip: None,
            backends: (0..n).map(|_| None).collect(),
        }
    }
}

/// Decides what a restart adopts of VIP `cfg` from the state file and the
/// pinned entries (`pinned_vip`: the entry at the VIP's key; `pinned_backend`
/// reads backend `id`'s entry). Whenever the VIP is ours, every backend the
/// state file recorded for it at the same address, whose entry is still in
/// use at that address, is adopted: its id, generation and health. What
/// else changed (table size, weights, backends added or removed, mode) is
/// applied the way a reload applies it, by rebuilding the table only.
pub(super) fn plan(
    cfg: &VipConfig,
    saved: Option<&Saved>,
    pinned_vip: Option<VipInfo>,
    mut pinned_backend: impl FnMut(u32) -> anyhow::Result<BackendInfo>,
) -> anyhow::Result<Plan> {
    let saved_id = saved.and_then(|s| s.vips.get(&cfg.name));
    let vip = pinned_vip.filter(|info| Some(&info.vip_id) == saved_id);
    let mut backends = Vec::with_capacity(cfg.backends.len());
    for bcfg in &cfg.backends {
        let prev = vip.and(saved).and_then(|s| {
            s.backends
                .iter()
                .find(|b| b.vip == cfg.name && b.addr == bcfg.socket_addr())
        });
        let adopt = match prev {
            Some(prev) => {
                let info = pinned_backend(prev.id)?;
                (info.addr == addr16(bcfg.addr) && info.state != 0).then(|| (prev.clone(), info))
            }
            None => None,
        };
        backends.push(adopt);
    }
    Ok(Plan { vip, backends })
}

/// What the pinned maps hold, for a start without a usable state file.
#[derive(Debug, Default)]
pub(super) struct Pins {
    /// Backend ids in use (state not 0) and their entries.
    pub backends: BTreeMap<u32, BackendInfo>,
    /// Every backend id some VIP's live table points at.
    pub in_tables: HashSet<u32>,
}

impl Pins {
    fn read(dp: &Dataplane) -> anyhow::Result<Self> {
        let mut pins = Self::default();
        for id in super::pinned_backend_ids(dp)? {
            pins.backends.insert(id, dp.backend(id)?);
        }
        for (_, info) in dp.vip_entries()? {
            pins.in_tables.extend(live_half(dp, &info)?);
        }
        Ok(pins)
    }
}

/// The live half of the table of the pinned VIP entry `info`.
fn live_half(dp: &Dataplane, info: &VipInfo) -> anyhow::Result<Vec<u32>> {
    Ok(dp.ring_half(info.vip_id, info.active & 1, info.table_size)?)
}

/// Decides what a start without a usable state file adopts of VIP `cfg`
/// from the pinned maps alone: the VIP entry at its key (`pinned_vip`,
/// whose live table is `live`), and for each configured backend, in file
/// order, an id in use at its address that no earlier backend `claimed`:
/// first one that `live` points at (it was serving), then one no table
/// points at (down or draining when the previous run stopped). The port is
/// not in the pinned entry; two backends of one VIP at one address may
/// swap ids, which moves no packet (the data plane forwards by address).
/// Health is what the data plane had: `up` serving, `down` down, else
/// `unknown` (no new flows until probed, established ones kept).
pub(super) fn plan_from_pins(
    cfg: &VipConfig,
    pinned_vip: Option<VipInfo>,
    live: &[u32],
    pins: &Pins,
    claimed: &mut HashSet<u32>,
) -> Plan {
    let Some(vip) = pinned_vip.filter(|info| info.mode != 0) else {
        return Plan::fresh(cfg.backends.len());
    };
    let in_live: HashSet<u32> = live.iter().copied().collect();
    let mut backends = Vec::with_capacity(cfg.backends.len());
    for bcfg in &cfg.backends {
        let addr = addr16(bcfg.addr);
        let usable = |id: &u32, info: &BackendInfo| info.addr == addr && !claimed.contains(id);
        let found = pins
            .backends
            .iter()
            .find(|(id, info)| in_live.contains(id) && usable(id, info))
            .or_else(|| {
                pins.backends
                    .iter()
                    .find(|(id, info)| !pins.in_tables.contains(id) && usable(id, info))
            });
        backends.push(found.map(|(&id, &info)| {
            claimed.insert(id);
            let health = match info.state {
                BACKEND_UP => SavedHealth::Up,
                BACKEND_DOWN => SavedHealth::Down,
                _ => SavedHealth::Unknown,
            };
            let prev = SavedBackend {
                vip: cfg.name.clone(),
                addr: bcfg.socket_addr(),
                id,
                health,
                admin_drained: false,
                drain_deadline_unix_ms: None,
                drain_expired: false,
            };
            (prev, info)
        }));
    }
    Plan {
        vip: Some(vip),
        backends,
    }
}

/// What a start adopts of every configured VIP: from the state file if
/// there is one, else from the pinned maps alone.
fn plans(dp: &Dataplane, cfg: &Config, saved: Option<&Saved>) -> anyhow::Result<Vec<Plan>> {
    let Some(saved) = saved else {
        let pins = Pins::read(dp)?;
        if pins.backends.is_empty() {
            return Ok(cfg
                .vips
                .iter()
                .map(|v| Plan::fresh(v.backends.len()))
                .collect());
        }
        let mut claimed = HashSet::new();
        let mut plans = Vec::new();
        for vcfg in &cfg.vips {
            let pinned = dp.vip(&vip_key(vcfg))?;
            let live = match &pinned {
                Some(info) => live_half(dp, info)?,
                None => Vec::new(),
            };
            plans.push(plan_from_pins(vcfg, pinned, &live, &pins, &mut claimed));
        }
        let adopted = plans.iter().filter(|p| p.vip.is_some()).count();
        let backends: usize = plans
            .iter()
            .map(|p| p.backends.iter().flatten().count())
            .sum();
        warn!(
            "no usable state file: adopted {adopted} VIPs and {backends} backends from the \
             pinned maps by VIP key and backend address"
        );
        return Ok(plans);
    };
    cfg.vips
        .iter()
        .map(|vcfg| {
            let pinned_vip = match saved.vips.get(&vcfg.name) {
                Some(_) => dp.vip(&vip_key(vcfg))?,
                None => None,
            };
            plan(vcfg, Some(saved), pinned_vip, |id| Ok(dp.backend(id)?))
        })
        .collect()
}

/// Builds the VIP model of `cfg` with nothing adopted: a new VIP id, new
/// backends (a VIP a reload adds). Returns whether the VIP was adopted
/// (always false; kept for the benchmarks' calls).
pub fn adopt_or_create_vip(
    dp: &mut Dataplane,
    ids: &mut Ids,
    cfg: VipConfig,
    saved: Option<&Saved>,
) -> anyhow::Result<(Vip, bool)> {
    let plan = match saved {
        Some(saved) => {
            let pinned = dp.vip(&vip_key(&cfg))?;
            plan(&cfg, Some(saved), pinned, |id| Ok(dp.backend(id)?))?
        }
        None => Plan::fresh(cfg.backends.len()),
    };
    build_vip(dp, ids, cfg, plan)
}

/// Builds the VIP model from configuration, adopting ids, states and the
/// live table where `plan` says. Returns whether the VIP was adopted. On
/// failure, the ids it took are given back.
fn build_vip(
    dp: &mut Dataplane,
    ids: &mut Ids,
    cfg: VipConfig,
    plan: Plan,
) -> anyhow::Result<(Vip, bool)> {
    let key = vip_key(&cfg);
    let mut chance = crate::chance::Halves::default();
    let (id, active, halves) = match plan.vip {
        Some(info) => {
            // Same VIP: the live half keeps serving; the wanted table (of
            // the configured size, with the configured weights) goes into
            // the spare half and one write flips to it (`Daemon::install`).
            ids.take_vip(info.vip_id);
            let live = info.active & 1;
            let mut halves = [None, None];
            let slots = dp.ring_slots(info.vip_id, live, info.table_size)?;
            halves[live as usize] = Some(slots.iter().map(|s| s.backend_id).collect());
            // The previous owners the data plane uses now stay in force,
            // for one window from this start at most.
            chance.0[live as usize] = Some(crate::chance::History::adopted(
                slots.iter().map(|s| s.prev_id).collect(),
                crate::chance::now_ns(),
            ));
            (info.vip_id, live, halves)
        }
        None => {
            let id = ids.alloc_vip()?;
            dp.reset_vip_stats(id)?;
            (id, 0, [None, None])
        }
    };
    let adopted_ids: Vec<u32> = plan.backends.iter().flatten().map(|(p, _)| p.id).collect();
    let mut backends = Vec::new();
    for (bcfg, adopt) in cfg.backends.clone().into_iter().zip(plan.backends) {
        let b = match adopt {
            Some((prev, info)) => adopt_backend(dp, ids, bcfg, &prev, &info),
            None => new_backend(dp, ids, bcfg),
        };
        match b {
            Ok(b) => backends.push(b),
            Err(e) => {
                // Nothing points at what was given so far: give it back.
                // An adopted backend's entry stays as the last run left it.
                for b in backends.iter().filter(|b| !adopted_ids.contains(&b.id)) {
                    let _ = super::retire_backend(dp, ids, b);
                }
                if plan.vip.is_none() {
                    ids.free_vip(id);
                }
                return Err(e.context(format!("vip {:?}", cfg.name)));
            }
        }
    }
    let adopted = plan.vip.is_some();
    let vip = Vip {
        cfg,
        id,
        key,
        active,
        halves,
        chance,
        backends,
        policy: VipState::default(),
        auto_timeout: AutoTimeout::default(),
        answers: VecDeque::new(),
    };
    Ok((vip, adopted))
}

/// The model of every VIP of `cfg` at start, adopting what the previous
/// run left: from the state file (see [`plan`]), or without one from the
/// pinned maps alone (see [`plan_from_pins`]); also whether anything was
/// adopted. The tables are not written yet (`Daemon::install`), nor
/// orphans retired (`retire_orphans`, after the tables).
pub fn adopt_all(
    dp: &mut Dataplane,
    cfg: &Config,
    saved: Option<&Saved>,
) -> anyhow::Result<(Ids, Vec<Vip>, bool)> {
    let mut ids = Ids::default();
    // Ids the pinned maps still use stay out of reach of new backends and
    // VIPs until the tables no longer point at them (`retire_orphans`,
    // after `install`): a removed backend's id handed to an added one would
    // send the removed one's table slots to a backend not yet probed, and a
    // VIP id still behind a pinned key would put a new VIP's table in the
    // ring that key's traffic reads.
    for id in super::pinned_backend_ids(dp)? {
        ids.take_backend(id);
    }
    for id in 0..MAX_VIPS {
        if dp.vip_info(id)?.mode != 0 {
            ids.take_vip(id);
        }
    }
    for (_, info) in dp.vip_entries()? {
        ids.take_vip(info.vip_id);
    }
    let plans = plans(dp, cfg, saved)?;
    // Counted before any id is handed out: a start with an edited file
    // keeps the previous run's ids until the new tables are live, so the
    // ones it adds come on top of every pinned one.
    let mut need = IdsNeeded::default();
    for p in &plans {
        if let Some(info) = p.vip {
            ids.take_vip(info.vip_id);
        } else {
            need.vips += 1;
        }
        for (prev, _) in p.backends.iter().flatten() {
            ids.take_backend(prev.id);
        }
        need.backends += p.backends.iter().filter(|b| b.is_none()).count();
    }
    ids.check(&need)
        .context("configured VIPs and backends beside the ids the pinned maps still use")?;
    let mut vips = Vec::new();
    let mut adopted = false;
    for (vcfg, plan) in cfg.vips.clone().into_iter().zip(plans) {
        let (vip, a) = build_vip(dp, &mut ids, vcfg, plan)?;
        adopted |= a;
        vips.push(vip);
    }
    // Pinned entries of VIPs no longer configured (removed while no
    // daemon ran): remove them, so their traffic is not balanced by a
    // table nobody maintains.
    let keep: Vec<_> = vips.iter().map(|v| v.key).collect();
    for (key, _) in dp.vip_entries()? {
        if !keep.contains(&key) {
            info!(
                ?key,
                "removing the pinned entry of a VIP no longer configured"
            );
            dp.remove_vip(&key)?;
        }
    }
    Ok((ids, vips, adopted))
}

/// Takes a backend over from the previous run: its id and generation (so
/// its established flows stay), health, drain and deadline.
fn adopt_backend(
    dp: &mut Dataplane,
    ids: &mut Ids,
    cfg: BackendConfig,
    prev: &SavedBackend,
    pinned: &BackendInfo,
) -> anyhow::Result<Backend> {
    ids.take_backend(prev.id);
    let health = HealthState::from(prev.health);
    let placement = Placement::of(prev.admin_drained, health);
    let b = Backend {
        cfg,
        id: prev.id,
        generation: pinned.generation,
        health,
        admin_drained: prev.admin_drained,
        drain_deadline: prev
            .drain_deadline_unix_ms
            .filter(|_| prev.admin_drained)
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
        drain_expired: prev.admin_drained && prev.drain_expired,
        drained_at: None,
        snapshot: None,
        since: Instant::now(),
        policy: MemberState::new(placement, Instant::now()),
        flows_alarm: Default::default(),
    };
    dp.set_backend(b.id, &b.info())?;
    Ok(b)
}

/// The state file's view of `vips`.
pub fn to_saved(vips: &[Vip]) -> Saved {
    Saved {
        layout_version: lb_common::LAYOUT_VERSION,
        vips: vips
            .iter()
            .map(|v| (v.cfg.name.clone(), v.id))
            .collect::<BTreeMap<_, _>>(),
        backends: vips
            .iter()
            .flat_map(|v| {
                v.backends.iter().map(|b| SavedBackend {
                    vip: v.cfg.name.clone(),
                    addr: b.cfg.socket_addr(),
                    id: b.id,
                    health: SavedHealth::from(b.health),
                    admin_drained: b.admin_drained,
                    drain_deadline_unix_ms: b.drain_deadline.map(crate::ctl::unix_ms),
                    drain_expired: b.drain_expired,
                })
            })
            .collect(),
        lists: Vec::new(),
        forwarding: Vec::new(),
        announce: None,
        weights: Vec::new(),
        next_event_seq: 0,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use lb_common::{BACKEND_DOWN, BACKEND_UP, FAMILY_V4};

    use super::*;

    /// VIP "api" on 10.100.0.1:80 with `table_size` and backends `addrs`
    /// (with weight 1 unless `heavy` names one, which gets 3).
    fn vip(table_size: u32, addrs: &[&str], heavy: Option<&str>) -> VipConfig {
        let mut text = format!(
            "[daemon]\ninterface = \"eth0\"\nmax_table_size = 1009\n\
             [[vip]]\nname = \"api\"\naddress = \"10.100.0.1\"\nport = 80\n\
             table_size = {table_size}\n"
        );
        for a in addrs {
            let w = if heavy == Some(*a) { 3 } else { 1 };
            text += &format!("[[vip.backend]]\naddress = \"{a}\"\nweight = {w}\n");
        }
        let cfg = Config::from_str(&text, "xlb.toml").unwrap();
        cfg.vip("api").unwrap().clone()
    }

    /// The previous run: VIP api had id 5, backends .11 (id 1, up), .12 (id
    /// 2, down), .13 (id 3, up), all on port 80.
    fn saved() -> Saved {
        let b = |last: u8, id, health| SavedBackend {
            vip: "api".into(),
            addr: format!("10.0.0.{last}:80").parse().unwrap(),
            id,
            health,
            admin_drained: false,
            drain_deadline_unix_ms: None,
            drain_expired: false,
        };
        Saved {
            layout_version: lb_common::LAYOUT_VERSION,
            vips: [("api".to_string(), 5)].into(),
            backends: vec![
                b(11, 1, SavedHealth::Up),
                b(12, 2, SavedHealth::Down),
                b(13, 3, SavedHealth::Up),
            ],
            lists: Vec::new(),
            forwarding: Vec::new(),
            announce: None,
            weights: Vec::new(),
            next_event_seq: 0,
        }
    }

    /// The pinned entries of the previous run: VIP id 5 with a table of
    /// 1009 slots, backends 1..=3 at .11..=.13 with generations 7, 8, 9.
    fn pinned() -> (VipInfo, HashMap<u32, BackendInfo>) {
        let vip = VipInfo {
            table_size: 1009,
            active: 1,
            vip_id: 5,
            mode: lb_common::MODE_DSR_IPIP,
            ..VipInfo::default()
        };
        let backends = (1..=3u32)
            .map(|id| {
                let addr = format!("10.0.0.{}", 10 + id).parse().unwrap();
                let state = if id == 2 { BACKEND_DOWN } else { BACKEND_UP };
                let info = BackendInfo {
                    addr: addr16(addr),
                    generation: 6 + id,
                    state,
                    family: FAMILY_V4,
                    port: 0,
                };
                (id, info)
            })
            .collect();
        (vip, backends)
    }

    /// (id, generation) adopted for each configured backend; None = new.
    fn adopted(plan: &Plan) -> Vec<Option<(u32, u32)>> {
        plan.backends
            .iter()
            .map(|a| a.as_ref().map(|(prev, info)| (prev.id, info.generation)))
            .collect()
    }

    #[test]
    fn a_changed_vip_keeps_its_backends_ids_generations_and_health() {
        let saved = saved();
        let (pvip, pbackends) = pinned();
        let read = |id: u32| -> anyhow::Result<BackendInfo> {
            Ok(pbackends.get(&id).copied().unwrap_or_default())
        };
        let all = ["10.0.0.11", "10.0.0.12", "10.0.0.13"];
        // (name, configuration, what is adopted)
        let cases = [
            (
                "unchanged",
                vip(1009, &all, None),
                vec![Some((1, 7)), Some((2, 8)), Some((3, 9))],
            ),
            (
                "table size 1009 -> 997",
                vip(997, &all, None),
                vec![Some((1, 7)), Some((2, 8)), Some((3, 9))],
            ),
            (
                "a weight changed",
                vip(1009, &all, Some("10.0.0.12")),
                vec![Some((1, 7)), Some((2, 8)), Some((3, 9))],
            ),
            (
                "a backend added",
                vip(
                    1009,
                    &["10.0.0.11", "10.0.0.14", "10.0.0.12", "10.0.0.13"],
                    None,
                ),
                vec![Some((1, 7)), None, Some((2, 8)), Some((3, 9))],
            ),
            (
                "a backend removed",
                vip(1009, &["10.0.0.11", "10.0.0.13"], None),
                vec![Some((1, 7)), Some((3, 9))],
            ),
            (
                "all at once",
                vip(
                    997,
                    &["10.0.0.13", "10.0.0.14", "10.0.0.11"],
                    Some("10.0.0.11"),
                ),
                vec![Some((3, 9)), None, Some((1, 7))],
            ),
        ];
        for (name, cfg, want) in cases {
            let p = super::plan(&cfg, Some(&saved), Some(pvip), read).unwrap();
            assert_eq!(p.vip.map(|v| v.vip_id), Some(5), "{name}");
            assert_eq!(adopted(&p), want, "{name}");
            // Health comes with the record: .12 stays down.
            for (prev, _) in p.backends.iter().flatten() {
                let want = if prev.id == 2 {
                    SavedHealth::Down
                } else {
                    SavedHealth::Up
                };
                assert_eq!(prev.health, want, "{name}");
            }
        }
    }

    #[test]
    fn nothing_is_adopted_that_is_not_ours() {
        let saved = saved();
        let (pvip, pbackends) = pinned();
        let all = ["10.0.0.11", "10.0.0.12", "10.0.0.13"];
        let cfg = vip(997, &all, None);
        let read = |id: u32| -> anyhow::Result<BackendInfo> {
            Ok(pbackends.get(&id).copied().unwrap_or_default())
        };
        // No state file, no pinned VIP, a pinned VIP of another id.
        let other = VipInfo { vip_id: 6, ..pvip };
        for (name, s, p) in [
            ("no state file", None, Some(pvip)),
            ("no pinned entry", Some(&saved), None),
            ("key held by another id", Some(&saved), Some(other)),
        ] {
            let p = super::plan(&cfg, s, p, read).unwrap();
            assert!(p.vip.is_none(), "{name}");
            assert_eq!(adopted(&p), vec![None, None, None], "{name}");
        }
        // A backend whose id was retired, or now holds another address.
        let mut moved = pbackends.clone();
        moved.get_mut(&1).unwrap().state = 0;
        moved.get_mut(&3).unwrap().addr = addr16("10.0.0.99".parse().unwrap());
        let p = super::plan(&cfg, Some(&saved), Some(pvip), |id: u32| {
            Ok(moved.get(&id).copied().unwrap_or_default())
        })
        .unwrap();
        assert_eq!(adopted(&p), vec![None, Some((2, 8)), None]);
        // A backend on another port is another backend.
        let mut other_port = saved.clone();
        other_port.backends[1].addr = "10.0.0.12:8080".parse().unwrap();
        let p = super::plan(&cfg, Some(&other_port), Some(pvip), read).unwrap();
        assert_eq!(adopted(&p), vec![Some((1, 7)), None, Some((3, 9))]);
    }

    /// The pinned maps of a previous run whose state file is gone: VIP api
    /// (id 5) serving .11 (id 1) and .13 (id 3), .12 (id 2) down; VIP web
    /// (id 6) with the same addresses under ids 4..=6, .12 (id 5) down.
    fn pins() -> (VipInfo, VipInfo, Pins) {
        let (api, mut backends) = pinned();
        let web = VipInfo { vip_id: 6, ..api };
        for id in 4..=6u32 {
            let mut info = backends[&(id - 3)];
            info.generation = 20 + id;
            backends.insert(id, info);
        }
        let in_tables = [1, 3, 4, 6].into();
        let pins = Pins {
            backends: backends.into_iter().collect(),
            in_tables,
        };
        (api, web, pins)
    }

    #[test]
    fn without_a_state_file_backends_are_found_by_address_in_the_vips_table() {
        let (api_info, web_info, pins) = pins();
        let all = ["10.0.0.11", "10.0.0.12", "10.0.0.13"];
        let api = vip(1009, &all, None);
        let mut web = api.clone();
        web.name = "web".into();
        let mut claimed = HashSet::new();
        // (name, configuration, pinned entry, its live table, adopted)
        let cases = [
            (
                "api: .11 and .13 from its table, .12 (down) from no table",
                api.clone(),
                Some(api_info),
                vec![1, 3, 1, 3],
                vec![Some((1, 7)), Some((2, 8)), Some((3, 9))],
            ),
            (
                "web, same addresses: its own ids, not api's",
                web.clone(),
                Some(web_info),
                vec![4, 6],
                vec![Some((4, 24)), Some((5, 25)), Some((6, 26))],
            ),
        ];
        for (name, cfg, pinned, live, want) in cases {
            let p = plan_from_pins(&cfg, pinned, &live, &pins, &mut claimed);
            assert_eq!(p.vip.map(|v| v.vip_id), pinned.map(|v| v.vip_id), "{name}");
            assert_eq!(adopted(&p), want, "{name}");
            let health: Vec<_> = p.backends.iter().flatten().map(|(b, _)| b.health).collect();
            assert_eq!(
                health,
                [SavedHealth::Up, SavedHealth::Down, SavedHealth::Up],
                "{name}"
            );
        }
        // A VIP with no pinned entry adopts nothing; nor does one whose
        // addresses are all claimed already.
        let mut other = api.clone();
        other.name = "other".into();
        let p = plan_from_pins(&other, None, &[], &pins, &mut claimed);
        assert!(p.vip.is_none());
        assert_eq!(adopted(&p), vec![None, None, None]);
        let p = plan_from_pins(
            &other,
            Some(VipInfo {
                vip_id: 7,
                ..api_info
            }),
            &[1],
            &pins,
            &mut claimed,
        );
        assert_eq!(adopted(&p), vec![None, None, None]);
        // A backend added while no daemon ran starts afresh.
        let added = vip(1009, &["10.0.0.11", "10.0.0.14"], None);
        let p = plan_from_pins(&added, Some(api_info), &[1, 3], &pins, &mut HashSet::new());
        assert_eq!(adopted(&p), vec![Some((1, 7)), None]);
    }
}
