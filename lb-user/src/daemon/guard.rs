//! Abuse control on the main loop: the deny and allow lists in the tries
//! and every VIP's `XLB_GUARD` entry.
//!
//! The model is [`Lists`] (pure, `guard::lists`); this file writes it.
//! At start the pinned tries already hold what the previous run wrote:
//! entries still wanted keep their rule ids (and hit counters), strays are
//! removed. Runtime entries (`xlb block`, `auto_block`) are also kept in
//! the state file with their wall-clock expiry, which is what a restart
//! reads them back from. A new deny entry cuts the established flows of
//! its sources: their conntrack entries are removed on a thread of its own
//! (the walk reads the whole table), so their next packet misses and is
//! judged; a `block` event says how many flows were cut.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::bail;
use lb_common::{ListEntry, VipGuard};
use lb_ctl::{BlockEntry, EntryOrigin, GuardAction, ListKind};
use tracing::{info, warn};

use super::{
    Daemon,
    persist::{self, Saved, SavedListEntry},
    purge::PurgeTargets,
};
use crate::{
    config::{Config, VipGuardConfig},
    ctl::{self, EventKind},
    guard::{
        Prefix,
        lists::{self, Entry, EntryKey, Lists, NewEntry, Scope, Slot},
    },
};

/// What purge threads found, for the tick to turn into events.
#[derive(Debug, Default)]
pub(super) struct Purges {
    done: Mutex<Vec<Purged>>,
}

#[derive(Debug)]
struct Purged {
    what: String,
    vip: Option<String>,
    cut: Result<u64, String>,
}

/// `XLB_GUARD` of a VIP whose guard is `g` and whose deny lists (its own or
/// the global one) have entries if `lists`.
pub(super) fn vip_guard(g: &VipGuardConfig, lists: bool, ct_insert_cap: Option<u64>) -> VipGuard {
    let mut flags = 0;
    if lists {
        flags |= lb_common::GUARD_LISTS;
    }
    if g.track_sources {
        flags |= lb_common::GUARD_TRACK;
    }
    let mut v = VipGuard {
        flags,
        limit_action: lb_common::ACTION_DROP,
        v4_prefix: g.v4_prefix,
        v6_prefix: g.v6_prefix,
        ct_insert_cap: ct_insert_cap.unwrap_or(0),
        ..VipGuard::default()
    };
    if let Some(l) = &g.limit {
        v.flags |= lb_common::GUARD_LIMIT;
        v.limit_action = lists::raw_action(l.action);
        v.interval_ns = ((1e9 / l.rate_per_s).round() as u64).max(1);
        v.tolerance_ns = l.burst.saturating_sub(1).saturating_mul(v.interval_ns);
    }
    v
}

/// The file's entries, each with its key.
fn config_rules(cfg: &Config) -> Vec<(EntryKey, GuardAction, String)> {
    let mut out = Vec::new();
    let mut push = |list, scope: &Scope, rules: &[crate::config::ListRule]| {
        for r in rules {
            let key = EntryKey {
                list,
                scope: scope.clone(),
                prefix: r.prefix,
            };
            out.push((key, r.action, r.reason.clone()));
        }
    };
    push(ListKind::Deny, &Scope::Global, &cfg.guard.deny);
    push(ListKind::Allow, &Scope::Global, &cfg.guard.allow);
    for v in &cfg.vips {
        let scope = Scope::Vip(v.name.clone());
        push(ListKind::Deny, &scope, &v.guard.deny);
        push(ListKind::Allow, &scope, &v.guard.allow);
    }
    out
}

/// `in 1h`, `in 90s`, `never`.
fn expiry_text(expires_unix_ms: Option<u64>, now: u64) -> String {
    match expires_unix_ms {
        None => "no expiry".into(),
        Some(t) => {
            let left = Duration::from_secs(t.saturating_sub(now).div_ceil(1000));
            format!("expires in {}", crate::guard::short_duration(left))
        }
    }
}

impl Daemon {
    /// A VIP name given to `block`/`unblock` is one of ours.
    fn check_vip(&self, vip: Option<&str>) -> anyhow::Result<()> {
        if let Some(name) = vip
            && self.vip_id_of(name).is_none()
        {
            bail!("no VIP named {name:?}; `xlb status` lists them");
        }
        Ok(())
    }

    /// The VIP id of the VIP called `name`.
    fn vip_id_of(&self, name: &str) -> Option<u32> {
        self.vips.iter().find(|v| v.cfg.name == name).map(|v| v.id)
    }

    /// What the tries hold now.
    fn present_lists(
        &self,
    ) -> anyhow::Result<HashMap<(ListKind, crate::dataplane::ListKey), Slot>> {
        let mut out = HashMap::new();
        for list in [ListKind::Deny, ListKind::Allow] {
            for (k, e) in self.dp.list_entries(list)? {
                let slot = Slot {
                    rule: e.rule,
                    action: e.action,
                };
                out.insert((list, k), slot);
            }
        }
        Ok(out)
    }

    /// At start: the file's entries and the saved runtime ones, on the rule
    /// ids the pinned tries hold for them; strays removed.
    pub(super) fn init_lists(&mut self, saved: Option<&Saved>) -> anyhow::Result<()> {
        let present = self.present_lists()?;
        let names: HashMap<u32, String> = self
            .vips
            .iter()
            .map(|v| (v.id, v.cfg.name.clone()))
            .collect();
        let hints = present.iter().filter_map(|((list, k), slot)| {
            let scope = if k.scope == lb_common::SCOPE_GLOBAL {
                Scope::Global
            } else {
                Scope::Vip(names.get(&k.scope)?.clone())
            };
            let prefix = Prefix::of(k.addr, k.len);
            Some((
                EntryKey {
                    list: *list,
                    scope,
                    prefix,
                },
                slot.rule,
            ))
        });
        let mut lists = Lists::default();
        lists.set_hints(hints);
        lists.set_config(config_rules(&self.cfg), ctl::now_unix_ms())?;
        let saved_entries = saved.map_or(&[][..], |s| &s.lists[..]);
        for s in saved_entries {
            let Some(e) = s.to_entry() else { continue };
            if e.key
                .scope
                .vip()
                .is_some_and(|v| self.vip_id_of(v).is_none())
            {
                continue;
            }
            if let Err(err) = lists.restore(e) {
                warn!("runtime list entries not restored: {err}");
                break;
            }
        }
        lists.drop_hints();
        self.lists = lists;
        // Slots of VIP ids not in use (VIPs removed while no daemon ran):
        // a VIP given such an id later starts from nothing.
        for id in 0..lb_common::MAX_VIPS {
            if self.vips.iter().all(|v| v.id != id) {
                self.dp.set_guard(id, &VipGuard::default())?;
            }
        }
        let (written, removed) = self.sync_lists(&present)?;
        if written + removed > 0 || !self.lists.is_empty() {
            info!(
                entries = self.lists.len(),
                written, removed, "deny and allow lists ready"
            );
        }
        self.write_guards()
    }

    /// Makes the tries hold exactly the model; (entries written, removed).
    fn sync_lists(
        &mut self,
        present: &HashMap<(ListKind, crate::dataplane::ListKey), Slot>,
    ) -> anyhow::Result<(usize, usize)> {
        let ids: HashMap<String, u32> = self
            .vips
            .iter()
            .map(|v| (v.cfg.name.clone(), v.id))
            .collect();
        let wanted = self.lists.wanted(|n| ids.get(n).copied());
        let d = lists::diff(&wanted, present);
        for (list, key) in &d.remove {
            self.dp.list_remove(*list, key)?;
        }
        for (list, key, slot, fresh) in &d.upsert {
            if *fresh {
                self.dp.reset_list_hits(slot.rule)?;
            }
            self.dp.list_insert(*list, key, list_entry(*slot))?;
        }
        Ok((d.upsert.len(), d.remove.len()))
    }

    /// Writes every VIP's `XLB_GUARD` entry.
    pub(super) fn write_guards(&mut self) -> anyhow::Result<()> {
        let denying = self.lists.scopes_with(ListKind::Deny);
        let global = denying.contains(&Scope::Global);
        let cap = self.cfg.guard.ct_insert_cap;
        let guards: Vec<(u32, VipGuard)> = self
            .vips
            .iter()
            .map(|v| {
                let own = denying.contains(&Scope::Vip(v.cfg.name.clone()));
                (v.id, vip_guard(&v.cfg.guard, global || own, cap))
            })
            .collect();
        for (id, g) in guards {
            self.dp.set_guard(id, &g)?;
        }
        Ok(())
    }

    /// After a reload (`self.cfg` and the VIPs are the new ones): the file's
    /// entries replace the old ones, entries of removed VIPs go, the tries
    /// follow and new deny entries cut their flows. One note for the answer.
    pub(super) fn reload_lists(&mut self) -> anyhow::Result<Option<String>> {
        let names: Vec<String> = self.vips.iter().map(|v| v.cfg.name.clone()).collect();
        let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let before: HashSet<EntryKey> = self.lists.sorted().iter().map(|e| e.key.clone()).collect();
        let mut removed = self.lists.retain_vips(&name_refs);
        removed.extend(
            self.lists
                .set_config(config_rules(&self.cfg), ctl::now_unix_ms())?,
        );
        let present = self.present_lists()?;
        self.sync_lists(&present)?;
        self.write_guards()?;
        for e in removed.iter().filter(|e| e.origin != EntryOrigin::Config) {
            let why = format!("{} removed by reload", describe_entry(e));
            self.event(
                EventKind::Block,
                e.key.scope.vip(),
                None,
                None,
                Some("removed"),
                why,
                None,
            );
        }
        let added: Vec<Entry> = self
            .lists
            .sorted()
            .into_iter()
            .filter(|e| e.key.list == ListKind::Deny && !before.contains(&e.key))
            .cloned()
            .collect();
        let targets = self.purge_targets(&added);
        let note = (!added.is_empty() || !removed.is_empty()).then(|| {
            format!(
                "guard lists: {} entries added, {} removed",
                added.len(),
                removed.len()
            )
        });
        self.spawn_purge(targets);
        Ok(note)
    }

    /// Adds (or replaces) a runtime/auto entry; records one `block` event;
    /// saves state; purges the conntrack entries of a deny entry's flows.
    /// Err: bad VIP name, a config entry with the same key exists, the list
    /// is full.
    #[expect(
        clippy::too_many_arguments,
        reason = "the API agreed with the sources helper: one call per entry, flat"
    )]
    pub(super) fn add_list_entry(
        &mut self,
        list: ListKind,
        vip: Option<&str>,
        prefix: Prefix,
        action: GuardAction,
        origin: EntryOrigin,
        ttl: Option<Duration>,
        reason: String,
    ) -> anyhow::Result<String> {
        self.check_vip(vip)?;
        if ttl.is_some_and(|t| t.is_zero()) {
            bail!(
                "a TTL of 0 would remove the entry at once; give a TTL such as 10m or 1h, or none"
            );
        }
        let now = ctl::now_unix_ms();
        let key = EntryKey {
            list,
            scope: Scope::of(vip),
            prefix,
        };
        let new = NewEntry {
            key: key.clone(),
            action: if list == ListKind::Deny {
                action
            } else {
                GuardAction::Drop
            },
            origin,
            reason,
            now_unix_ms: now,
            expires_unix_ms: ttl.map(|t| now.saturating_add(t.as_millis() as u64)),
        };
        let (e, fresh) = self.lists.add(new)?;
        if let Err(err) = self.write_entry(&e, fresh) {
            let _ = self.lists.remove(&key);
            return Err(err);
        }
        self.write_guards()?;
        let mut msg = format!("{} added: {}", describe_entry(&e), entry_detail(&e, now));
        self.event(
            EventKind::Block,
            vip,
            None,
            None,
            Some("added"),
            msg.clone(),
            None,
        );
        self.save();
        if list == ListKind::Deny && self.allowed_anyway(vip, prefix) {
            msg.push_str(&format!(
                "\nnote: an allow entry covers {}, so those sources are still let through \
                 (allow wins over deny); `xlb blocks` lists them",
                prefix.addr
            ));
        }
        if list == ListKind::Deny {
            let targets = self.purge_targets(std::slice::from_ref(&e));
            if self.spawn_purge(targets) {
                msg.push_str(
                    "\ncutting the established flows of its sources in the background; \
                     a block event says how many",
                );
            }
        }
        info!("{msg}");
        Ok(msg)
    }

    /// The list entry (any scope that applies to VIP id `vip_id`) covering
    /// `addr`, if any.
    pub(super) fn list_covers(&self, list: ListKind, vip_id: u32, addr: IpAddr) -> bool {
        let Some(v) = self.vips.iter().find(|v| v.id == vip_id) else {
            return false;
        };
        self.lists.covering(list, &v.cfg.name, addr).is_some()
    }

    /// Whether an allow entry covers the first address of `prefix` at the
    /// VIP `vip` (or at any VIP).
    fn allowed_anyway(&self, vip: Option<&str>, prefix: Prefix) -> bool {
        self.vips
            .iter()
            .filter(|v| vip.is_none_or(|n| v.cfg.name == n))
            .any(|v| self.list_covers(ListKind::Allow, v.id, prefix.addr))
    }

    /// `xlb unblock`: removes a runtime or automatic entry.
    pub(super) fn remove_list_entry(
        &mut self,
        list: ListKind,
        vip: Option<&str>,
        prefix: Prefix,
    ) -> anyhow::Result<String> {
        self.check_vip(vip)?;
        let key = EntryKey {
            list,
            scope: Scope::of(vip),
            prefix,
        };
        let hits = self
            .lists
            .get(&key)
            .map(|e| self.dp.list_hits(e.rule).unwrap_or(0));
        let e = self
            .lists
            .remove(&key)
            .map_err(|err| self.other_scopes(err, &key))?;
        self.erase_entry(&e)?;
        self.write_guards()?;
        let msg = format!(
            "{} removed ({} hits)",
            describe_entry(&e),
            hits.unwrap_or(0)
        );
        self.event(
            EventKind::Block,
            vip,
            None,
            None,
            Some("removed"),
            msg.clone(),
            None,
        );
        self.save();
        info!("{msg}");
        Ok(msg)
    }

    /// An unblock of an absent entry whose prefix is listed in another
    /// scope says where (the operator left out or added `--vip`).
    fn other_scopes(&self, err: lists::ListError, key: &EntryKey) -> anyhow::Error {
        let elsewhere: Vec<String> = self
            .lists
            .sorted()
            .into_iter()
            .filter(|e| e.key.list == key.list && e.key.prefix == key.prefix)
            .map(|e| match e.key.scope.vip() {
                Some(v) => format!("--vip {v}"),
                None => "no --vip (every VIP)".to_owned(),
            })
            .collect();
        if elsewhere.is_empty() || !matches!(err, lists::ListError::NotFound { .. }) {
            return err.into();
        }
        anyhow::anyhow!("{err}; it is listed with {}", elsewhere.join(", "))
    }

    /// `xlb blocks`: every entry with its hits.
    pub(super) fn blocks(&self) -> Vec<BlockEntry> {
        self.lists
            .sorted()
            .into_iter()
            .map(|e| BlockEntry {
                list: e.key.list,
                prefix: e.key.prefix.to_string(),
                vip: e.key.scope.vip().map(str::to_owned),
                action: e.action,
                origin: e.origin,
                reason: e.reason.clone(),
                created_unix_ms: e.created_unix_ms,
                expires_unix_ms: e.expires_unix_ms,
                hits: self.dp.list_hits(e.rule).unwrap_or(0),
            })
            .collect()
    }

    /// Every tick: entries whose TTL passed go, and finished purges are
    /// reported.
    pub(super) fn guard_tick(&mut self) {
        let now = ctl::now_unix_ms();
        let expired = self.lists.expire(now);
        for e in &expired {
            let hits = self.dp.list_hits(e.rule).unwrap_or(0);
            if let Err(err) = self.erase_entry(e) {
                warn!("removing expired {}: {err:#}", describe_entry(e));
            }
            let msg = format!("{} expired ({hits} hits)", describe_entry(e));
            info!("{msg}");
            self.event(
                EventKind::Block,
                e.key.scope.vip(),
                None,
                None,
                Some("expired"),
                msg,
                None,
            );
        }
        if !expired.is_empty() {
            if let Err(err) = self.write_guards() {
                warn!("writing the VIP guards: {err:#}");
            }
            self.save();
        }
        let done = std::mem::take(
            &mut *self
                .purges
                .done
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for p in done {
            let msg = match p.cut {
                Ok(n) => format!("{}: {n} established flows cut", p.what),
                Err(e) => format!("{}: established flows not cut: {e}", p.what),
            };
            info!("{msg}");
            self.event(
                EventKind::Block,
                p.vip.as_deref(),
                None,
                None,
                Some("flows_cut"),
                msg,
                None,
            );
        }
    }

    /// The runtime and automatic entries, for the state file.
    pub(super) fn saved_lists(&self) -> Vec<SavedListEntry> {
        self.lists
            .sorted()
            .into_iter()
            .filter(|e| e.origin != EntryOrigin::Config)
            .map(SavedListEntry::from_entry)
            .collect()
    }

    pub(super) fn write_entry(&mut self, e: &Entry, fresh: bool) -> anyhow::Result<()> {
        let Some(key) = lists::list_key(&e.key, |n| self.vip_id_of(n)) else {
            bail!("no VIP named {:?}", e.key.scope.vip().unwrap_or_default());
        };
        if fresh {
            self.dp.reset_list_hits(e.rule)?;
        }
        let slot = Slot {
            rule: e.rule,
            action: e.raw_action(),
        };
        self.dp.list_insert(e.key.list, &key, list_entry(slot))?;
        Ok(())
    }

    fn erase_entry(&mut self, e: &Entry) -> anyhow::Result<()> {
        if let Some(key) = lists::list_key(&e.key, |n| self.vip_id_of(n)) {
            self.dp.list_remove(e.key.list, &key)?;
        }
        Ok(())
    }

    pub(super) fn purge_targets(&self, entries: &[Entry]) -> PurgeTargets {
        entries
            .iter()
            .filter(|e| e.key.list == ListKind::Deny)
            .filter_map(|e| {
                let vip = match e.key.scope.vip() {
                    None => None,
                    Some(n) => Some(self.vip_id_of(n)?),
                };
                Some((e.key.prefix, vip, describe_entry(e)))
            })
            .collect()
    }

    /// Cuts the flows of `targets` on a thread; whether one was started.
    fn spawn_purge(&self, targets: PurgeTargets) -> bool {
        self.spawn_purge_as(targets, None)
    }

    /// As [`Daemon::spawn_purge`]; with `summary` (what, VIP name), one
    /// report for all the targets (a batch of automatic entries), not one
    /// each.
    pub(super) fn spawn_purge_as(
        &self,
        targets: PurgeTargets,
        summary: Option<(String, Option<String>)>,
    ) -> bool {
        if targets.is_empty() {
            return false;
        }
        let pin = persist::pin_dir(&self.cfg.daemon.pinned.instance);
        // `get_next_key` restarts from the first key when the LRU evicted
        // the one it was given: under churn the walk could go round for
        // ever, so it reads at most twice the table.
        let limit = 2 * self.cfg.daemon.pinned.conntrack_size as usize;
        let purges = Arc::clone(&self.purges);
        let names: HashMap<u32, String> = self
            .vips
            .iter()
            .map(|v| (v.id, v.cfg.name.clone()))
            .collect();
        let spawned = std::thread::Builder::new()
            .name("xlb-ct-purge".into())
            .spawn(move || {
                let cut = super::purge::purge(&pin, &targets, limit);
                let mut done = purges
                    .done
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some((what, vip)) = summary {
                    let total = cut.iter().try_fold(0, |n, c| c.as_ref().map(|c| n + c));
                    let cut = total.map_err(Clone::clone);
                    done.push(Purged { what, vip, cut });
                    return;
                }
                for ((_, vip, what), cut) in targets.into_iter().zip(cut) {
                    done.push(Purged {
                        what,
                        vip: vip.and_then(|id| names.get(&id).cloned()),
                        cut,
                    });
                }
            });
        if let Err(e) = spawned {
            warn!("established flows of new deny entries not cut: starting a thread: {e}");
            return false;
        }
        true
    }
}

fn list_entry(slot: Slot) -> ListEntry {
    ListEntry {
        rule: slot.rule,
        action: slot.action,
        _pad: [0; 3],
    }
}

/// `runtime deny 192.0.2.7/32 (all VIPs)`.
pub(super) fn describe_entry(e: &Entry) -> String {
    let origin = match e.origin {
        EntryOrigin::Config => "config",
        EntryOrigin::Runtime => "runtime",
        EntryOrigin::Auto => "automatic",
    };
    format!("{origin} {}", e.key.describe())
}

/// `reset, expires in 1h: seed 001`.
pub(super) fn entry_detail(e: &Entry, now: u64) -> String {
    let mut s = String::new();
    if e.key.list == ListKind::Deny {
        s.push_str(e.action.as_str());
        s.push_str(", ");
    }
    s.push_str(&expiry_text(e.expires_unix_ms, now));
    if !e.reason.is_empty() {
        s.push_str(": ");
        s.push_str(&e.reason);
    }
    s
}

/// Parses a prefix given to `xlb block`/`unblock`, with the message the
/// CLI would give.
pub(super) fn parse_prefix(text: &str) -> anyhow::Result<Prefix> {
    text.parse::<Prefix>().map_err(anyhow::Error::from)
}

impl SavedListEntry {
    pub(super) fn from_entry(e: &Entry) -> Self {
        SavedListEntry {
            list: e.key.list,
            vip: e.key.scope.vip().map(str::to_owned),
            prefix: e.key.prefix.to_string(),
            action: e.action,
            origin: e.origin,
            reason: e.reason.clone(),
            created_unix_ms: e.created_unix_ms,
            expires_unix_ms: e.expires_unix_ms,
        }
    }

    /// The entry (rule id to be allocated); `None` for a prefix that no
    /// longer parses (a hand-edited file).
    fn to_entry(&self) -> Option<Entry> {
        let prefix = self.prefix.parse().ok()?;
        Some(Entry {
            key: EntryKey {
                list: self.list,
                scope: Scope::of(self.vip.as_deref()),
                prefix,
            },
            action: self.action,
            origin: self.origin,
            reason: self.reason.clone(),
            created_unix_ms: self.created_unix_ms,
            expires_unix_ms: self.expires_unix_ms,
            rule: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SourceLimit;

    #[test]
    fn vip_guard_cases() {
        let base = VipGuardConfig::default();
        let limited = VipGuardConfig {
            limit: Some(SourceLimit {
                rate_per_s: 200.0,
                burst: 400,
                action: GuardAction::Reset,
            }),
            track_sources: false,
            v6_prefix: 56,
            ..VipGuardConfig::default()
        };
        let cases = [
            (
                "defaults: tracking only",
                vip_guard(&base, false, None),
                VipGuard {
                    flags: lb_common::GUARD_TRACK,
                    limit_action: lb_common::ACTION_DROP,
                    v4_prefix: 32,
                    v6_prefix: 64,
                    ..VipGuard::default()
                },
            ),
            (
                "lists and a cap",
                vip_guard(&base, true, Some(250_000)),
                VipGuard {
                    flags: lb_common::GUARD_TRACK | lb_common::GUARD_LISTS,
                    limit_action: lb_common::ACTION_DROP,
                    v4_prefix: 32,
                    v6_prefix: 64,
                    ct_insert_cap: 250_000,
                    ..VipGuard::default()
                },
            ),
            (
                "200/s, burst 400, reset",
                vip_guard(&limited, false, None),
                VipGuard {
                    flags: lb_common::GUARD_LIMIT,
                    limit_action: lb_common::ACTION_RESET,
                    v4_prefix: 32,
                    v6_prefix: 56,
                    interval_ns: 5_000_000,
                    tolerance_ns: 399 * 5_000_000,
                    ..VipGuard::default()
                },
            ),
        ];
        for (name, got, want) in cases {
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn saved_entries_round_trip() {
        let e = Entry {
            key: EntryKey {
                list: ListKind::Deny,
                scope: Scope::Vip("api".into()),
                prefix: "2001:db8:1:2::/64".parse().unwrap(),
            },
            action: GuardAction::Reset,
            origin: EntryOrigin::Auto,
            reason: "above 1000/s for 10s".into(),
            created_unix_ms: 1,
            expires_unix_ms: Some(2),
            rule: 0,
        };
        assert_eq!(SavedListEntry::from_entry(&e).to_entry(), Some(e));
    }
}
