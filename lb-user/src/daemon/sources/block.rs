//! `auto_block` in batches. A flood from many sources can bring thousands
//! of them over the rate in the same second; each block is one trie write,
//! but the state file, the conntrack purge (a walk of the whole table) and
//! the event were per entry, and 10,000 of each stalled the main loop for
//! seconds. So a tick blocks at most [`MAX_PER_TICK`] sources (the
//! heaviest first; the others stay due for the next ticks), writes every
//! trie entry, then saves the state once, starts one purge walk for all of
//! them and records one `block` event per VIP. The save itself (10,000
//! entries serialized and written) runs on a thread of its own, in order
//! with the loop's own saves ([`Saves`]).

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use lb_ctl::{EntryOrigin, ListKind};
use tracing::{error, info, warn};

use super::{Daemon, per_s};
use crate::{
    config::AutoBlock,
    ctl::{self, EventKind},
    daemon::{
        guard::{describe_entry, entry_detail},
        persist::{self, Saved, SavedListEntry},
        purge::PurgeTargets,
    },
    guard::{
        Prefix,
        lists::{self, Entry, EntryKey, NewEntry, Scope},
        sources::{SourceRate, key_prefix, key_text},
    },
};

/// Most automatic entries made in one tick, all VIPs together: a trie
/// write each (a few microseconds), so a full batch costs the loop a few
/// milliseconds in a release build, tens in a debug one; 10,000 sources
/// over the rate at once are all blocked within twenty ticks.
pub(super) const MAX_PER_TICK: usize = 500;

/// Sources a batch's event names; the rest are counted (`xlb blocks`
/// lists them all).
const NAMED: usize = 5;

impl Daemon {
    /// Blocks `due` (per VIP index, the sources due), as one batch.
    pub(super) fn auto_block(&mut self, due: Vec<(usize, Vec<SourceRate>)>) {
        let mut targets = PurgeTargets::new();
        let mut blocked = 0;
        let mut vips = Vec::new();
        for (vi, rates) in due {
            let Some(auto) = self.vips[vi].cfg.guard.auto_block.clone() else {
                continue;
            };
            let name = self.vips[vi].cfg.name.clone();
            let added = self.add_auto_entries(&name, &auto, &rates);
            if added.is_empty() {
                continue;
            }
            blocked += added.len();
            targets.extend(self.purge_targets(&added));
            self.auto_block_event(&name, &auto, &added, &rates);
            vips.push(name);
        }
        if blocked == 0 {
            return;
        }
        if let Err(e) = self.write_guards() {
            error!("auto_block: writing the VIP guards: {e:#}");
        }
        self.save_off_the_loop();
        let (what, vip) = match vips.as_slice() {
            [one] if blocked == 1 && targets.len() == 1 => {
                (targets[0].2.clone(), Some(one.clone()))
            }
            [one] => (
                format!("{blocked} automatic deny entries of vip {one:?}"),
                Some(one.clone()),
            ),
            _ => (format!("{blocked} automatic deny entries"), None),
        };
        self.spawn_purge_as(targets, Some((what, vip)));
    }

    /// Saves the state file as `save` does, but the list entries are turned
    /// into the file's form, and the file serialized and written, on a
    /// thread: 10,000 entries cost a debug build most of a second.
    fn save_off_the_loop(&self) {
        let path = persist::state_path(&self.cfg.daemon.pinned.instance);
        let mut saved = self.state_but_lists();
        let entries: Vec<Entry> = self
            .lists
            .iter()
            .filter(|e| e.origin != EntryOrigin::Config)
            .cloned()
            .collect();
        self.sources.saves.store_later(path, move || {
            let mut sorted: Vec<&Entry> = entries.iter().collect();
            sorted.sort_by(|a, b| lists::order(a, b));
            saved.lists = sorted.into_iter().map(SavedListEntry::from_entry).collect();
            saved
        });
    }

    /// Adds an `Auto` deny entry of VIP `vip` for each of `rates` and writes
    /// it to the trie; the entries added. One that cannot be added (the
    /// lists are full, a config entry has the key) is logged and skipped,
    /// and leaves the model as it was.
    fn add_auto_entries(
        &mut self,
        vip: &str,
        auto: &AutoBlock,
        rates: &[SourceRate],
    ) -> Vec<Entry> {
        let now = ctl::now_unix_ms();
        let expires = now.saturating_add(auto.ttl.as_millis() as u64);
        let mut added = Vec::new();
        for r in rates {
            let (addr, len) = key_prefix(&r.key);
            let key = EntryKey {
                list: ListKind::Deny,
                scope: Scope::Vip(vip.to_owned()),
                prefix: Prefix::of(addr, len),
            };
            let new = NewEntry {
                key: key.clone(),
                action: auto.action,
                origin: EntryOrigin::Auto,
                reason: reason(r, auto),
                now_unix_ms: now,
                expires_unix_ms: Some(expires),
            };
            let written = match self.lists.add(new) {
                Ok((e, fresh)) => match self.write_entry(&e, fresh) {
                    Ok(()) => Ok(e),
                    Err(err) => {
                        let _ = self.lists.remove(&key);
                        Err(err)
                    }
                },
                Err(err) => Err(err.into()),
            };
            match written {
                Ok(e) => added.push(e),
                Err(e) => error!("auto_block of {} at VIP {vip}: {e:#}", key_text(&r.key)),
            }
        }
        added
    }

    /// One `block` event for a VIP's batch: the entry itself when it is
    /// one, else how many, the rule, and the heaviest few.
    fn auto_block_event(
        &mut self,
        vip: &str,
        auto: &AutoBlock,
        added: &[Entry],
        rates: &[SourceRate],
    ) {
        let now = ctl::now_unix_ms();
        let msg = match added {
            [e] => format!("{} added: {}", describe_entry(e), entry_detail(e, now)),
            _ => {
                let mut heaviest: Vec<&SourceRate> = rates.iter().collect();
                heaviest.sort_by(|a, b| b.established_per_s.total_cmp(&a.established_per_s));
                let named: Vec<String> = heaviest
                    .iter()
                    .take(NAMED)
                    .map(|r| format!("{} ({})", key_text(&r.key), per_s(r.established_per_s)))
                    .collect();
                let more = added.len().saturating_sub(named.len());
                format!(
                    "{} automatic deny entries of vip {vip:?} added: {}, expires in {}: \
                     auto_block: established flows above {} for at least {} s; the heaviest: \
                     {}{}; `xlb blocks` lists them all",
                    added.len(),
                    auto.action.as_str(),
                    crate::guard::short_duration(auto.ttl),
                    per_s(auto.above_per_s),
                    auto.sustained.as_secs_f64(),
                    named.join(", "),
                    if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    },
                )
            }
        };
        info!("{msg}");
        self.event(
            EventKind::Block,
            Some(vip),
            None,
            None,
            Some("added"),
            msg,
            None,
        );
    }
}

/// The reason an automatic entry records.
fn reason(r: &SourceRate, auto: &AutoBlock) -> String {
    format!(
        "auto_block: {} established flows for at least {} s (above {})",
        per_s(r.established_per_s),
        auto.sustained.as_secs_f64(),
        per_s(auto.above_per_s)
    )
}

/// Saves of the state file, from the loop and off it, landing in the order
/// they were asked for: each gets a number when asked (on the loop), and a
/// write of an older number than the last one written is skipped, under
/// one lock, so a slow save off the loop never overwrites a newer one.
/// Saves off the loop are coalesced: one thread writes the latest asked,
/// and one asked while it writes replaces any still waiting (ten batches a
/// second must not be ten writes of a growing file competing with the loop
/// for the CPU).
#[derive(Default)]
pub(in crate::daemon) struct Saves {
    asked: AtomicU64,
    written: Arc<Mutex<u64>>,
    /// The save waiting for the thread, and whether the thread runs.
    later: Arc<Mutex<(Option<Later>, bool)>>,
}

/// A save off the loop: its number, its file, how to make it.
type Later = (u64, PathBuf, Box<dyn FnOnce() -> Saved + Send>);

impl std::fmt::Debug for Saves {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Saves")
            .field("asked", &self.asked)
            .field("written", &self.written)
            .finish_non_exhaustive()
    }
}

impl Saves {
    /// Writes `saved` now (waiting for a write off the loop in progress).
    pub(in crate::daemon) fn store_now(&self, saved: &Saved, path: &Path) {
        let n = self.asked.fetch_add(1, Ordering::Relaxed) + 1;
        store_in_order(&self.written, n, saved, path);
    }

    /// Writes what `make` returns, on the saving thread.
    fn store_later(&self, path: PathBuf, make: impl FnOnce() -> Saved + Send + 'static) {
        let n = self.asked.fetch_add(1, Ordering::Relaxed) + 1;
        let mut later = lock(&self.later);
        later.0 = Some((n, path, Box::new(make)));
        if later.1 {
            return;
        }
        let (slot, written) = (Arc::clone(&self.later), Arc::clone(&self.written));
        let spawned = std::thread::Builder::new()
            .name("xlb-save".into())
            .spawn(move || save_for_ever(&slot, &written));
        match spawned {
            Ok(_) => later.1 = true,
            Err(e) => warn!("the state file is not saved: starting a thread: {e}"),
        }
    }
}

/// The saving thread: writes what waits, until nothing does.
fn save_for_ever(slot: &Mutex<(Option<Later>, bool)>, written: &Mutex<u64>) {
    // SAFETY: nice(2) changes only the calling thread's priority on Linux
    // (per-thread nice values, sched(7)): the loop keeps its CPU share.
    unsafe { libc::nice(10) };
    loop {
        let next = {
            let mut s = lock(slot);
            let next = s.0.take();
            if next.is_none() {
                s.1 = false;
            }
            next
        };
        let Some((n, path, make)) = next else { return };
        store_in_order(written, n, &make(), &path);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn store_in_order(written: &Mutex<u64>, n: u64, saved: &Saved, path: &Path) {
    let mut last = lock(written);
    if n < *last {
        return;
    }
    if let Err(e) = saved.store(path) {
        warn!("{e:#}");
    }
    *last = n;
}
