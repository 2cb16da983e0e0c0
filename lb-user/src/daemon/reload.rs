//! Reload (SIGHUP, `xlb reload`): re-reads the configuration and applies
//! only what changed. Settings the pinned state or the running process fix
//! are kept and reported; an unchanged VIP is not touched at all (same
//! table, same flows); a changed one keeps the backends it still lists,
//! with their health.

use crate::ctl::EventKind;
use serde::Serialize;
use serde_json::Value;
use tracing::{error, info, warn};

use super::{
    Daemon,
    model::{self, Rebuild},
};
use crate::config::{Config, DaemonConfig, VipConfig};

impl Daemon {
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
        let mut new = Config::from_file(&self.config_path).map_err(|e| {
            anyhow::anyhow!("{e}\nconfiguration rejected: still running the previous one")
        })?;
        for w in &new.warnings {
            warn!("{w}");
        }
        let mut notes = daemon_changes(&self.cfg.daemon, &new.daemon);
        if self.cfg.daemon.live != new.daemon.live {
            let mut d = new.daemon.clone();
            d.pinned = self.cfg.daemon.pinned.clone();
            super::start::write_globals(&mut self.dp, &d, &new.vips)?;
            notes.push("daemon settings updated".to_string());
        }
        let removed = self.remove_vips_gone(&new)?;
        self.release_moved_keys(&new)?;
        let guard_changed = self.cfg.guard != new.guard;
        let (added, changed, guarded) = self.add_or_change_vips(&new)?;
        // Keep file order.
        let order: Vec<String> = new.vips.iter().map(|v| v.name.clone()).collect();
        self.vips
            .sort_by_key(|v| order.iter().position(|n| *n == v.cfg.name));
        // Settings not applied live keep their running values, so status and
        // the state file describe what is really in force.
        new.daemon.pinned = self.cfg.daemon.pinned.clone();
        new.daemon.restart = self.cfg.daemon.restart.clone();
        self.cfg = new;
        let lists_note = self.reload_lists()?;
        if guard_changed || guarded > 0 {
            notes.push(format!(
                "guard settings updated ([guard]{}; {guarded} VIPs' [vip.guard])",
                if guard_changed {
                    " changed"
                } else {
                    " unchanged"
                }
            ));
        }
        notes.extend(lists_note);
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

    /// Removes the VIPs `new` no longer lists; how many.
    fn remove_vips_gone(&mut self, new: &Config) -> anyhow::Result<usize> {
        let mut removed = 0;
        let mut i = 0;
        while i < self.vips.len() {
            if new.vip(&self.vips[i].cfg.name).is_some() {
                i += 1;
                continue;
            }
            let v = self.vips.remove(i);
            // Its id may go to another VIP: that one starts unguarded
            // until its own guard is written.
            self.dp.set_guard(v.id, &lb_common::VipGuard::default())?;
            for b in &v.backends {
                self.forget_backend(b.id);
            }
            model::remove_vip(&mut self.dp, &mut self.ids, &v)?;
            info!(vip = %v.cfg.name, "vip removed");
            removed += 1;
        }
        Ok(removed)
    }

    /// VIPs moving to another (address, port, protocol) give up their old
    /// key first, so one VIP taking another's old key is never undone.
    fn release_moved_keys(&mut self, new: &Config) -> anyhow::Result<()> {
        for v in &self.vips {
            if let Some(n) = new.vip(&v.cfg.name)
                && model::vip_key(n) != v.key
                && self.dp.vip(&v.key)?.map(|i| i.vip_id) == Some(v.id)
            {
                self.dp.remove_vip(&v.key)?;
            }
        }
        Ok(())
    }

    /// Adds the VIPs `new` lists for the first time and applies the changed
    /// ones; how many added, changed, and changed in `[vip.guard]` only
    /// (applied by `reload_lists` without touching the VIP).
    fn add_or_change_vips(&mut self, new: &Config) -> anyhow::Result<(usize, usize, usize)> {
        let (mut added, mut changed, mut guarded) = (0, 0, 0);
        for ncfg in new.vips.iter().cloned() {
            match self.vips.iter().position(|v| v.cfg.name == ncfg.name) {
                Some(vi) if self.vips[vi].cfg == ncfg => {} // untouched
                Some(vi) if same_but_guard(&self.vips[vi].cfg, &ncfg) => {
                    self.vips[vi].cfg.guard = ncfg.guard;
                    guarded += 1;
                }
                Some(vi) => {
                    let r = self.change_vip(vi, ncfg)?;
                    self.table_event(vi, "vip changed by reload", r);
                    changed += 1;
                }
                None => {
                    self.add_vip(ncfg)?;
                    added += 1;
                }
            }
        }
        Ok((added, changed, guarded))
    }

    /// A VIP the configuration did not have: new ids, probes, its table.
    fn add_vip(&mut self, cfg: VipConfig) -> anyhow::Result<()> {
        let (vip, _) = model::adopt_or_create_vip(&mut self.dp, &mut self.ids, cfg, None)?;
        self.vips.push(vip);
        let vi = self.vips.len() - 1;
        if let Some(s) = self.sched.as_mut() {
            let v = &self.vips[vi];
            for b in &v.backends {
                model::upsert_probe(
                    s,
                    &self.cfg.daemon.pinned.interface,
                    &v.cfg,
                    &v.auto_timeout,
                    b,
                );
            }
        }
        let r = self.install(vi)?;
        info!(vip = %self.vips[vi].cfg.name, "vip added");
        self.table_event(vi, "vip added by reload", r);
        Ok(())
    }

    /// Stops probing a backend that leaves the configuration and forgets
    /// what was recorded of it (its id may go to another backend).
    fn forget_backend(&mut self, id: u32) {
        if let Some(s) = self.sched.as_mut() {
            s.remove(u64::from(id));
        }
        self.histograms.remove(&id);
        self.transitions.remove(&id);
    }

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

    /// Applies a changed VIP configuration: backends kept where address and
    /// port are the same (with their health), others added or retired.
    fn change_vip(&mut self, vi: usize, ncfg: VipConfig) -> anyhow::Result<Option<Rebuild>> {
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
            let kept = old_backends
                .iter()
                .position(|b| b.cfg.socket_addr() == bcfg.socket_addr());
            let b = match kept {
                Some(pos) => {
                    let mut b = old_backends.remove(pos);
                    b.cfg = bcfg;
                    b
                }
                None => model::new_backend(&mut self.dp, &mut self.ids, bcfg)?,
            };
            // For a kept backend, a no-op unless the check or the VIP's path
            // to it changed.
            if let Some(s) = self.sched.as_mut() {
                model::upsert_probe(s, &self.cfg.daemon.pinned.interface, &ncfg, &auto, &b);
            }
            backends.push(b);
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
            self.forget_backend(b.id);
            model::retire_backend(&mut self.dp, &mut self.ids, &b)?;
        }
        info!(vip = %self.vips[vi].cfg.name, rebuilt = r.is_some(), "vip changed");
        Ok(r)
    }
}

/// Whether `a` and `b` differ in their guard at most: the VIP itself (its
/// table, backends, probes) is untouched by such a change.
fn same_but_guard(a: &VipConfig, b: &VipConfig) -> bool {
    let mut b = b.clone();
    b.guard = a.guard.clone();
    *a == b
}

/// One note for each daemon setting that changed but is not applied now.
fn daemon_changes(old: &DaemonConfig, new: &DaemonConfig) -> Vec<String> {
    let pinned = changed_settings(&old.pinned, &new.pinned);
    let restart = changed_settings(&old.restart, &new.restart);
    let mut notes = Vec::new();
    for what in pinned {
        notes.push(format!(
            "daemon.{what} changed: not applied; it is fixed by the pinned state until \
             `xlb detach --instance {}` (drops established flows) and a new start",
            old.pinned.instance
        ));
    }
    for what in restart {
        notes.push(format!(
            "daemon.{what} changed: takes effect at the next restart"
        ));
    }
    notes
}

/// The settings (as named in the file) whose values differ between `old` and
/// `new`, in alphabetical order.
fn changed_settings<T: Serialize>(old: &T, new: &T) -> Vec<String> {
    let (Ok(Value::Object(old)), Ok(Value::Object(new))) =
        (serde_json::to_value(old), serde_json::to_value(new))
    else {
        unreachable!("settings serialize to a JSON object");
    };
    old.into_iter()
        .filter(|(name, value)| new.get(name) != Some(value))
        .map(|(name, _)| name)
        .collect()
}
