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
    model::{self, Backend, Rebuild},
};
use crate::config::{Config, DaemonConfig, VipConfig};
use anyhow::Context as _;

impl Daemon {
    /// [`Daemon::reload`] asked by `by` (`SIGHUP`, `xlb reload`), with one
    /// log line and one `reload` event for its outcome, whoever asked:
    /// `applied` (with every note, such as a setting that takes effect at
    /// the next restart) or `rejected` (with the error).
    pub(super) fn reload_by(&mut self, by: &str) -> anyhow::Result<String> {
        let result = self.reload();
        let (to, text) = match &result {
            Ok(message) => {
                let text = one_line(message);
                if message.lines().count() > 1 {
                    warn!(
                        event = "reload",
                        to = "applied",
                        by,
                        "reload applied, with notes: {text}"
                    );
                } else {
                    info!(
                        event = "reload",
                        to = "applied",
                        by,
                        "reload applied: {text}"
                    );
                }
                ("applied", text)
            }
            Err(e) => {
                let text = one_line(&format!("{e:#}"));
                error!(
                    event = "reload",
                    to = "rejected",
                    by,
                    "reload rejected: {text}"
                );
                ("rejected", text)
            }
        };
        let reason = format!("{by}: {text}");
        self.event(EventKind::Reload, None, None, None, Some(to), reason, None);
        result
    }

    /// Re-reads the configuration and applies only what changed. An
    /// unchanged VIP is not touched at all: same table, same flows.
    pub fn reload(&mut self) -> anyhow::Result<String> {
        // Its rebuilds count as one change for second chance.
        crate::chance::mark_reload();
        let result = self.apply_reload();
        // Whatever was applied, even if a step failed part-way.
        self.index = model::backend_index(&self.vips);
        if let Err(e) = self.dp.sync_hc_reals(&model::hc_reals(&self.vips)) {
            error!("updating the data-path probe map: {e:#}");
        }
        if let Err(e) = self.sync_nat() {
            error!("updating the NAT maps: {e:#}");
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
        self.check_host(&new)?;
        // Counted before anything changes: a reload either has every id it
        // needs or is refused whole.
        self.ids.check(&ids_needed(&self.cfg, &new)).map_err(|e| {
            anyhow::anyhow!("{e}\nconfiguration rejected: still running the previous one")
        })?;
        // Before any comparison: a VIP whose only difference is an
        // override that still holds is unchanged.
        let (weights, dropped) = self.weights.apply_to(&mut new);
        let mut notes = daemon_changes(&self.cfg.daemon, &new.daemon);
        notes.extend(super::announce::keep_running_table(
            self.cfg.announce.as_ref(),
            &mut new.announce,
        ));
        // The VIPs first, as one step: if one cannot be changed, those
        // changed before it are put back, and nothing else is done.
        // The tables this reload builds remember previous owners for the
        // new window; a failed reload puts the old one back.
        let window = crate::chance::StagedWindow::stage(new.daemon.live.second_chance_window);
        self.release_moved_keys(&new)?;
        let applied = self.add_or_change_vips(&new)?;
        let (added, changed, guarded) = self.finish_vips(applied)?;
        if self.cfg.daemon.live != new.daemon.live {
            let mut d = new.daemon.clone();
            d.pinned = self.cfg.daemon.pinned.clone();
            super::start::write_globals(&mut self.dp, &d, &new.vips)?;
            notes.push("daemon settings updated".to_string());
        }
        // Last: a VIP added in place of a removed one may have taken its
        // key, which the removal then leaves alone.
        let removed = self.remove_vips_gone(&new)?;
        let guard_changed = self.cfg.guard != new.guard;
        // Keep file order.
        let order: Vec<String> = new.vips.iter().map(|v| v.name.clone()).collect();
        self.vips
            .sort_by_key(|v| order.iter().position(|n| *n == v.cfg.name));
        // Settings not applied live keep their running values, so status and
        // the state file describe what is really in force.
        new.daemon.pinned = self.cfg.daemon.pinned.clone();
        new.daemon.restart = self.cfg.daemon.restart.clone();
        if self.cfg.cluster != new.cluster {
            notes.push("cluster settings updated ([cluster])".to_string());
        }
        self.cfg = new;
        notes.extend(self.keep_weights(weights, dropped));
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
        self.announce_after_reload();
        window.keep();
        self.save();
        let summary = format!(
            "reloaded: {added} VIPs added, {changed} changed, {removed} removed, {} unchanged",
            self.vips.len() - added - changed
        );
        notes.insert(0, summary);
        Ok(notes.join("\n"))
    }

    /// What the file alone cannot tell: DSR backends on the link, and
    /// announced addresses that are this host's own.
    fn check_host(&self, new: &Config) -> anyhow::Result<()> {
        let off_link = crate::route::dsr_l2_off_link(&new.vips);
        if !off_link.is_empty() {
            anyhow::bail!(
                "{}\nconfiguration rejected: still running the previous one",
                off_link.join("\n")
            );
        }
        let origin = self.config_path.display().to_string();
        if let Err(lines) = crate::announce::check_local_addresses(new, &origin)
            .and_then(|()| crate::config::check_pools_local(&new.vips, &origin))
        {
            anyhow::bail!(
                "{}\nconfiguration rejected: still running the previous one",
                lines.join("\n")
            );
        }
        Ok(())
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
            if self.dp.vip(&v.key)?.map(|i| i.vip_id) != Some(v.id) {
                // Its key went to a VIP this reload added or moved: only
                // its own id's entry goes.
                self.dp.set_vip_info(&lb_common::VipInfo {
                    vip_id: v.id,
                    ..lb_common::VipInfo::default()
                })?;
                for b in &v.backends {
                    model::retire_backend(&mut self.dp, &mut self.ids, b)?;
                }
                self.ids.free_vip(v.id);
            } else {
                model::remove_vip(&mut self.dp, &mut self.ids, &v)?;
            }
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
    /// ones, each live at once; if one fails, puts back every one applied
    /// before it (tables flipped back, backends, entries) and fails. What
    /// was applied, for [`Daemon::finish_vips`].
    fn add_or_change_vips(&mut self, new: &Config) -> anyhow::Result<Vec<Applied>> {
        let mut applied = Vec::new();
        for ncfg in new.vips.iter().cloned() {
            let step = match self.vips.iter().position(|v| v.cfg.name == ncfg.name) {
                Some(vi) if self.vips[vi].cfg == ncfg => continue, // untouched
                Some(vi) if same_but_guard(&self.vips[vi].cfg, &ncfg) => {
                    let old = std::mem::replace(&mut self.vips[vi].cfg.guard, ncfg.guard);
                    Ok(Applied::Guard(vi, old))
                }
                Some(vi) => self
                    .change_vip(vi, ncfg)
                    .map(|u| Applied::Changed(Box::new(u))),
                None => self.add_vip(ncfg).map(|(vi, r)| Applied::Added(vi, r)),
            };
            match step {
                Ok(a) => applied.push(a),
                Err(e) => {
                    self.undo_vips(applied);
                    return Err(e);
                }
            }
        }
        Ok(applied)
    }

    /// Puts back, newest first, the VIP changes of a reload that failed
    /// part-way, then rewrites every VIP's entry (a key released for a move
    /// that did not happen comes back).
    fn undo_vips(&mut self, applied: Vec<Applied>) {
        for a in applied.into_iter().rev() {
            match a {
                Applied::Guard(vi, old) => self.vips[vi].cfg.guard = old,
                Applied::Changed(u) => {
                    let name = self.vips[u.vi].cfg.name.clone();
                    warn!(vip = %name, "reload failed: putting the VIP back as it was");
                    // `install_vip` in `restore_vip` flips back to this half.
                    self.vips[u.vi].active = u.active;
                    self.restore_vip(u.vi, (u.old_cfg, u.old_key), u.old, &u.origin);
                }
                Applied::Added(vi, _) => {
                    let v = self.vips.remove(vi);
                    warn!(vip = %v.cfg.name, "reload failed: removing the VIP it added");
                    if let Err(e) = model::remove_vip(&mut self.dp, &mut self.ids, &v) {
                        error!(vip = %v.cfg.name, "removing it: {e:#}");
                    }
                }
            }
        }
        for v in &self.vips {
            if let Err(e) = model::install_vip(&mut self.dp, v) {
                error!(vip = %v.cfg.name, "rewriting the VIP's entry: {e:#}");
            }
        }
    }

    /// Once every VIP change is live: probes for the VIPs' backends, the
    /// removed backends retired (the live tables no longer point at them),
    /// one log line and one event per VIP. How many added, changed, and
    /// changed in `[vip.guard]` only (applied by `reload_lists`).
    fn finish_vips(&mut self, applied: Vec<Applied>) -> anyhow::Result<(usize, usize, usize)> {
        let (mut added, mut changed, mut guarded) = (0, 0, 0);
        for a in applied {
            let (vi, why, r) = match a {
                Applied::Guard(..) => {
                    guarded += 1;
                    continue;
                }
                Applied::Changed(u) => {
                    for b in u.old.into_iter().flatten() {
                        self.forget_backend(b.id);
                        model::retire_backend(&mut self.dp, &mut self.ids, &b)?;
                    }
                    changed += 1;
                    (u.vi, "vip changed by reload", u.rebuild)
                }
                Applied::Added(vi, r) => {
                    added += 1;
                    (vi, "vip added by reload", r)
                }
            };
            if let Some(s) = self.sched.as_mut() {
                let v = &self.vips[vi];
                for b in &v.backends {
                    // For a kept backend, a no-op unless the check or the
                    // VIP's path to it changed.
                    model::upsert_probe(s, &self.cfg.daemon.pinned, v, b);
                }
            }
            info!(
                event = "table",
                vip = %self.vips[vi].cfg.name,
                rebuilt = r.is_some(),
                table_build_ms = r.map(|r| r.took.as_secs_f64() * 1e3),
                slots_changed = r.map(|r| r.slots_changed),
                "{}",
                why.replace(" by reload", "")
            );
            self.table_event(vi, why, r);
        }
        Ok((added, changed, guarded))
    }

    /// A VIP the configuration did not have: new ids, its table (live at
    /// once); its probes start in `finish_vips`. If its table cannot be
    /// written, it is removed again (ids freed). Its index and rebuild.
    fn add_vip(&mut self, cfg: VipConfig) -> anyhow::Result<(usize, Option<Rebuild>)> {
        let (vip, _) = model::adopt_or_create_vip(&mut self.dp, &mut self.ids, cfg, None)?;
        self.vips.push(vip);
        let vi = self.vips.len() - 1;
        match self.install(vi) {
            Ok(r) => Ok((vi, r)),
            Err(e) => {
                let v = self.vips.remove(vi);
                if let Err(undo) = model::remove_vip(&mut self.dp, &mut self.ids, &v) {
                    error!(vip = %v.cfg.name, "removing a VIP that failed to go live: {undo:#}");
                }
                Err(e.context(format!("vip {:?}: not added", v.cfg.name)))
            }
        }
    }

    /// Stops probing a backend that leaves the configuration and forgets
    /// what was recorded of it (its id may go to another backend).
    fn forget_backend(&mut self, id: u32) {
        if let Some(s) = self.sched.as_mut() {
            s.remove(u64::from(id));
        }
        self.histograms.remove(&id);
        self.probe_failures.remove(&id);
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

    /// Applies a changed VIP configuration, live at once: backends kept
    /// where address and port are the same (with their health), others
    /// added; the removed ones are retired by `finish_vips`. Staged: the
    /// added backends get their ids first, and the VIP is changed only once
    /// they all have one; if writing its table then fails, the VIP is put
    /// back as it was (backends, probes, table, entry) and the added ids
    /// are retired.
    fn change_vip(&mut self, vi: usize, ncfg: VipConfig) -> anyhow::Result<Undo> {
        let fresh = self.stage_new_backends(vi, &ncfg)?;
        let old_key = self.vips[vi].key;
        let new_key = model::vip_key(&ncfg);
        // Normally removed already by `reload` (before any VIP took a new
        // key); never remove a key that another VIP has since taken.
        if old_key != new_key && self.dp.vip(&old_key)?.map(|i| i.vip_id) == Some(self.vips[vi].id)
        {
            self.dp.remove_vip(&old_key)?;
        }
        let vip = &mut self.vips[vi];
        let active = vip.active;
        let old_cfg = std::mem::replace(&mut vip.cfg, ncfg);
        let mut old: Vec<Option<Backend>> = std::mem::take(&mut vip.backends)
            .into_iter()
            .map(Some)
            .collect();
        // For each backend of the new list: the index it had, or None.
        let mut origin = Vec::new();
        let mut fresh = fresh.into_iter();
        for bcfg in vip.cfg.backends.clone() {
            let kept = old.iter().position(|b| {
                b.as_ref()
                    .is_some_and(|b| b.cfg.socket_addr() == bcfg.socket_addr())
            });
            let b = match kept.and_then(|pos| old[pos].take()) {
                Some(mut b) => {
                    b.cfg = bcfg;
                    b
                }
                None => fresh
                    .next()
                    .context("a staged backend for each new address")?,
            };
            origin.push(kept);
            vip.backends.push(b);
        }
        // A new table size is handled by `rebuild`: the resized table goes
        // into the spare half, and one write switches size and half together.
        vip.key = new_key;
        match self.commit_vip(vi) {
            Ok(rebuild) => Ok(Undo {
                vi,
                old_cfg,
                old_key,
                old,
                origin,
                active,
                rebuild,
            }),
            Err(e) => {
                let name = self.vips[vi].cfg.name.clone();
                self.restore_vip(vi, (old_cfg, old_key), old, &origin);
                Err(e.context(format!(
                    "vip {name:?}: change not applied; it keeps its previous backends, \
                     probes and table"
                )))
            }
        }
    }

    /// Gives each backend `ncfg` adds to VIP `vi` an id, in file order;
    /// nothing else changes. If one cannot have one, those given are
    /// retired again.
    fn stage_new_backends(&mut self, vi: usize, ncfg: &VipConfig) -> anyhow::Result<Vec<Backend>> {
        let mut fresh = Vec::new();
        for bcfg in &ncfg.backends {
            let kept = self.vips[vi]
                .backends
                .iter()
                .any(|b| b.cfg.socket_addr() == bcfg.socket_addr());
            if kept {
                continue;
            }
            match model::new_backend(&mut self.dp, &mut self.ids, bcfg.clone()) {
                Ok(b) => fresh.push(b),
                Err(e) => {
                    self.discard_staged(fresh);
                    return Err(e.context(format!(
                        "vip {:?}: adding backend {}; the VIP is unchanged",
                        ncfg.name,
                        bcfg.socket_addr()
                    )));
                }
            }
        }
        Ok(fresh)
    }

    /// Writes VIP `vi`'s backend entries and makes its table live.
    fn commit_vip(&mut self, vi: usize) -> anyhow::Result<Option<Rebuild>> {
        for b in &self.vips[vi].backends {
            self.dp.set_backend(b.id, &b.info())?;
        }
        self.install(vi)
    }

    /// Puts VIP `vi` back as it was before a change that failed to go
    /// live: its configuration, key, backends (in their order, with their
    /// configuration) and map entries; retires the backends the change
    /// added. The live table was never switched (`rebuild` flips last).
    fn restore_vip(
        &mut self,
        vi: usize,
        (old_cfg, old_key): (VipConfig, lb_common::VipKey),
        mut old: Vec<Option<Backend>>,
        origin: &[Option<usize>],
    ) {
        let vip = &mut self.vips[vi];
        let mut added = Vec::new();
        for (b, from) in std::mem::take(&mut vip.backends).into_iter().zip(origin) {
            match from {
                Some(pos) => old[*pos] = Some(b),
                None => added.push(b),
            }
        }
        let new_key = vip.key;
        vip.key = old_key;
        vip.backends = old.into_iter().flatten().collect();
        for (b, bcfg) in vip.backends.iter_mut().zip(&old_cfg.backends) {
            b.cfg = bcfg.clone();
        }
        vip.cfg = old_cfg;
        let mut undo = || -> anyhow::Result<()> {
            let vip = &self.vips[vi];
            if new_key != old_key && self.dp.vip(&new_key)?.map(|i| i.vip_id) == Some(vip.id) {
                self.dp.remove_vip(&new_key)?;
            }
            for b in &vip.backends {
                self.dp.set_backend(b.id, &b.info())?;
            }
            model::install_vip(&mut self.dp, vip)
        };
        if let Err(e) = undo() {
            error!(vip = %self.vips[vi].cfg.name, "putting the VIP's map entries back: {e:#}");
        }
        self.discard_staged(added);
    }

    /// Retires backends staged by a change that was not applied.
    fn discard_staged(&mut self, staged: Vec<Backend>) {
        for b in staged {
            if let Err(e) = model::retire_backend(&mut self.dp, &mut self.ids, &b) {
                error!(backend = %b.cfg.socket_addr(), "retiring an unused backend id {}: {e:#}", b.id);
            }
        }
    }
}

/// The new ids a reload from `old` to `new` takes: a VIP `new` adds takes
/// a VIP id and one backend id per backend; a changed VIP one per backend
/// it did not have. Removed VIPs and backends keep theirs until the new
/// tables are live (a reload removes VIPs last).
pub(super) fn ids_needed(old: &Config, new: &Config) -> model::IdsNeeded {
    let mut need = model::IdsNeeded::default();
    for n in &new.vips {
        match old.vip(&n.name) {
            None => {
                need.vips += 1;
                need.backends += n.backends.len();
            }
            Some(o) => {
                need.backends += n
                    .backends
                    .iter()
                    .filter(|b| {
                        !o.backends
                            .iter()
                            .any(|ob| ob.socket_addr() == b.socket_addr())
                    })
                    .count();
            }
        }
    }
    need
}

/// A multi-line message (a summary and its notes, or every problem of a
/// rejected file) as one line for the log and the event log, whose readers
/// take one line per entry.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// One VIP step of a reload, live but not final until every VIP's is.
enum Applied {
    /// `[vip.guard]` changed only: the guard it had.
    Guard(usize, crate::config::VipGuardConfig),
    Changed(Box<Undo>),
    /// A VIP added (its index), and its table's build.
    Added(usize, Option<Rebuild>),
}

/// What putting a changed VIP back needs: its configuration, key, previous
/// live half, and its backends as they were (`old`: those the change
/// dropped, still `Some`; `origin`: for each backend now, its index in
/// `old`, or `None` if the change added it).
struct Undo {
    vi: usize,
    old_cfg: VipConfig,
    old_key: lb_common::VipKey,
    old: Vec<Option<Backend>>,
    origin: Vec<Option<usize>>,
    active: u32,
    rebuild: Option<Rebuild>,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration of VIPs `(name, address, backend addresses)`.
    fn config(vips: &[(&str, &str, &[&str])]) -> Config {
        let mut text = "[daemon]\ninterface = \"eth0\"\nmax_table_size = 1009\n".to_string();
        for (name, addr, backends) in vips {
            text += &format!(
                "[[vip]]\nname = \"{name}\"\naddress = \"{addr}\"\nport = 80\ntable_size = 1009\n"
            );
            for b in *backends {
                text += &format!("[[vip.backend]]\naddress = \"{b}\"\n");
            }
        }
        Config::from_str(&text, "xlb.toml").unwrap()
    }

    #[test]
    fn ids_needed_counts_only_what_is_new() {
        let old = config(&[
            ("api", "10.100.0.1", &["10.0.0.1", "10.0.0.2"]),
            ("web", "10.100.0.2", &["10.0.0.3"]),
        ]);
        let need = |vips, backends| model::IdsNeeded { vips, backends };
        // (name, new configuration, ids needed)
        let cases = [
            ("unchanged", old.clone(), need(0, 0)),
            (
                "one backend replaced: the old id stays until the table is live",
                config(&[
                    ("api", "10.100.0.1", &["10.0.0.1", "10.0.0.9"]),
                    ("web", "10.100.0.2", &["10.0.0.3"]),
                ]),
                need(0, 1),
            ),
            (
                "every backend replaced",
                config(&[
                    ("api", "10.100.0.1", &["10.0.0.7", "10.0.0.8"]),
                    ("web", "10.100.0.2", &["10.0.0.9"]),
                ]),
                need(0, 3),
            ),
            (
                "a VIP removed, one added with the same backends: removed last",
                config(&[
                    ("api", "10.100.0.1", &["10.0.0.1", "10.0.0.2"]),
                    ("new", "10.100.0.3", &["10.0.0.3"]),
                ]),
                need(1, 1),
            ),
        ];
        for (name, new, want) in cases {
            assert_eq!(ids_needed(&old, &new), want, "{name}");
        }
    }

    #[test]
    fn a_change_needing_more_ids_than_are_free_is_refused() {
        let mut ids = model::Ids::default();
        for id in 1..lb_common::BACKEND_IDS - 2 {
            ids.take_backend(id);
        }
        let need = |backends| model::IdsNeeded { vips: 0, backends };
        assert!(ids.check(&need(2)).is_ok());
        let err = ids.check(&need(3)).unwrap_err().to_string();
        assert!(
            err.starts_with("3 new backend ids needed but 2 free of 8191"),
            "{err}"
        );
    }
}
