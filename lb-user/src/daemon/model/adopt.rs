//! Carrying on where the previous run stopped: the state file says which
//! VIP and backend had which id, the pinned maps say whether each entry is
//! still theirs; what both agree on is adopted (ids, generations, health,
//! drains, the live table), so a restart moves no flow. [`to_saved`] writes
//! the state file's side.

use std::{
    collections::{BTreeMap, VecDeque},
    time::{Duration, Instant, UNIX_EPOCH},
};

use lb_common::{BackendInfo, VipInfo, addr16};

use super::{Backend, Ids, Vip, new_backend, vip_key};
use crate::{
    config::{BackendConfig, VipConfig},
    daemon::persist::{Saved, SavedBackend, SavedHealth},
    dataplane::Dataplane,
    health::{
        machine::HealthState,
        policy::{MemberState, Placement, VipState},
        scheduler::AutoTimeout,
    },
};

/// The pinned entry of VIP `cfg`, if the previous run's state file gave it
/// the id the entry still holds (else the key now belongs to another VIP,
/// or the entry was not ours).
fn pinned_vip(
    dp: &Dataplane,
    cfg: &VipConfig,
    saved: Option<&Saved>,
) -> anyhow::Result<Option<VipInfo>> {
    let Some(&id) = saved.and_then(|s| s.vips.get(&cfg.name)) else {
        return Ok(None);
    };
    Ok(dp.vip(&vip_key(cfg))?.filter(|info| info.vip_id == id))
}

/// The previous run's record of backend `bcfg` of VIP `vip` and its pinned
/// entry, if that entry is still in use at the same address.
fn pinned_backend<'s>(
    dp: &Dataplane,
    saved: Option<&'s Saved>,
    vip: &str,
    bcfg: &BackendConfig,
) -> anyhow::Result<Option<(&'s SavedBackend, BackendInfo)>> {
    let Some(prev) = saved.and_then(|s| {
        s.backends
            .iter()
            .find(|b| b.vip == vip && b.addr == bcfg.socket_addr())
    }) else {
        return Ok(None);
    };
    let info = dp.backend(prev.id)?;
    Ok((info.addr == addr16(bcfg.addr) && info.state != 0).then_some((prev, info)))
}

/// What `adopt_or_create_vip` will adopt for `cfg`: its pinned VIP id (if the
/// saved id still holds its key) and the saved backend ids whose pinned
/// address still matches. Reserving all of these before any new id is handed
/// out keeps a new VIP from taking an id a later VIP is about to adopt.
pub fn reserve_adoptable(
    dp: &Dataplane,
    ids: &mut Ids,
    cfg: &VipConfig,
    saved: Option<&Saved>,
) -> anyhow::Result<()> {
    let Some(info) = pinned_vip(dp, cfg, saved)? else {
        return Ok(());
    };
    ids.take_vip(info.vip_id);
    if info.table_size != cfg.table_size {
        return Ok(());
    }
    for bcfg in &cfg.backends {
        if let Some((prev, _)) = pinned_backend(dp, saved, &cfg.name, bcfg)? {
            ids.take_backend(prev.id);
        }
    }
    Ok(())
}

/// Builds the VIP model from configuration, adopting ids, states and the
/// live table from a previous run where `saved` and the maps have them.
pub fn adopt_or_create_vip(
    dp: &mut Dataplane,
    ids: &mut Ids,
    cfg: VipConfig,
    saved: Option<&Saved>,
) -> anyhow::Result<(Vip, bool)> {
    let key = vip_key(&cfg);
    let pinned = pinned_vip(dp, &cfg, saved)?;
    // Backends are adopted only with their table, when its size is still
    // the configured one.
    let adopted = pinned.is_some_and(|info| info.table_size == cfg.table_size);
    let (id, active, halves) = match pinned {
        Some(info) => {
            // Same VIP (with a new table size, the new table goes into the
            // spare half; the live one keeps serving until the flip).
            ids.take_vip(info.vip_id);
            let live = info.active & 1;
            let mut halves = [None, None];
            halves[live as usize] = Some(dp.ring_half(info.vip_id, live, info.table_size)?);
            (info.vip_id, live, halves)
        }
        None => {
            let id = ids.alloc_vip()?;
            dp.reset_vip_stats(id)?;
            (id, 0, [None, None])
        }
    };
    let mut backends = Vec::new();
    for bcfg in cfg.backends.clone() {
        let pinned = if adopted {
            pinned_backend(dp, saved, &cfg.name, &bcfg)?
        } else {
            None
        };
        let b = match pinned {
            Some((prev, info)) => adopt_backend(dp, ids, bcfg, prev, &info)?,
            None => new_backend(dp, ids, bcfg)?,
        };
        backends.push(b);
    }
    let vip = Vip {
        cfg,
        id,
        key,
        active,
        halves,
        backends,
        policy: VipState::default(),
        auto_timeout: AutoTimeout::default(),
        answers: VecDeque::new(),
    };
    Ok((vip, adopted))
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
    }
}
