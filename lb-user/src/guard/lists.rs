//! The deny and allow lists as the daemon holds them: every entry with its
//! origin (the file, `xlb block`, `auto_block`), scope (one VIP or all),
//! action, reason, creation and expiry, and the data plane's rule id (the
//! index of its hit counter).
//!
//! Pure: the daemon applies what this decides to the tries. Entries are
//! keyed by VIP *name* (stable across reloads and restarts); the daemon
//! turns names into VIP ids when it writes the tries ([`Lists::wanted`]),
//! and [`diff`] says what to write to make the tries hold exactly that.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use lb_ctl::{EntryOrigin, GuardAction, ListKind};

use super::Prefix;
use crate::dataplane::ListKey;

/// Which VIPs an entry applies to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Every VIP (`lb_common::SCOPE_GLOBAL` in the tries).
    Global,
    /// The VIP of this name.
    Vip(String),
}

impl Scope {
    pub fn of(vip: Option<&str>) -> Scope {
        vip.map_or(Scope::Global, |v| Scope::Vip(v.to_owned()))
    }

    pub fn vip(&self) -> Option<&str> {
        match self {
            Scope::Global => None,
            Scope::Vip(v) => Some(v),
        }
    }
}

/// What identifies an entry: one prefix in one list of one scope.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EntryKey {
    pub list: ListKind,
    pub scope: Scope,
    pub prefix: Prefix,
}

impl EntryKey {
    /// `deny 192.0.2.7/32 of vip "api"`, `allow 10.0.0.0/8 (all VIPs)`.
    pub fn describe(&self) -> String {
        match &self.scope {
            Scope::Global => format!("{} {} (all VIPs)", self.list.as_str(), self.prefix),
            Scope::Vip(v) => format!("{} {} of vip {v:?}", self.list.as_str(), self.prefix),
        }
    }
}

/// One entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub key: EntryKey,
    pub action: GuardAction,
    pub origin: EntryOrigin,
    pub reason: String,
    /// ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// ms since the Unix epoch (wall clock, so it holds across restarts);
    /// `None` = never. Config entries never expire.
    pub expires_unix_ms: Option<u64>,
    /// Index of its hit counter, below `lb_common::MAX_LIST_RULES`.
    pub rule: u32,
}

impl Entry {
    /// `lb_common::ACTION_*`.
    pub fn raw_action(&self) -> u8 {
        raw_action(self.action)
    }
}

/// `lb_common::ACTION_DROP` or `ACTION_RESET`.
pub fn raw_action(a: GuardAction) -> u8 {
    match a {
        GuardAction::Drop => lb_common::ACTION_DROP,
        GuardAction::Reset => lb_common::ACTION_RESET,
    }
}

/// A new runtime or automatic entry.
#[derive(Clone, Debug)]
pub struct NewEntry {
    pub key: EntryKey,
    pub action: GuardAction,
    pub origin: EntryOrigin,
    pub reason: String,
    pub now_unix_ms: u64,
    pub expires_unix_ms: Option<u64>,
}

/// Why the lists refused a change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ListError {
    #[error(
        "{} comes from the configuration file; edit the file and reload (xlb reload) \
         to change or remove it", key.describe()
    )]
    ConfigEntry { key: EntryKey },
    #[error("there is no {}; `xlb blocks` lists the entries", key.describe())]
    NotFound { key: EntryKey },
    #[error(
        "the lists are full ({max} entries, deny and allow together); remove entries \
         or merge them into wider prefixes"
    )]
    Full { max: u32 },
}

/// Rule ids below a bound, lowest free first, so ids stay dense and a
/// freed id is reused.
#[derive(Clone, Debug)]
struct RuleIds {
    max: u32,
    /// Ids below `next` that are free.
    free: BTreeSet<u32>,
    next: u32,
}

impl RuleIds {
    fn new(max: u32) -> Self {
        RuleIds {
            max,
            free: BTreeSet::new(),
            next: 0,
        }
    }

    fn alloc(&mut self) -> Option<u32> {
        if let Some(id) = self.free.pop_first() {
            return Some(id);
        }
        (self.next < self.max).then(|| {
            self.next += 1;
            self.next - 1
        })
    }

    /// Takes `id` if it is free (an id the tries already use for the same
    /// entry, so its hit counter carries on).
    fn claim(&mut self, id: u32) -> bool {
        if id >= self.max {
            return false;
        }
        if id >= self.next {
            self.free.extend(self.next..id);
            self.next = id + 1;
            return true;
        }
        self.free.remove(&id)
    }

    fn release(&mut self, id: u32) {
        if id < self.next {
            self.free.insert(id);
        }
    }
}

/// Every entry of the deny and allow lists.
#[derive(Clone, Debug)]
pub struct Lists {
    entries: HashMap<EntryKey, Entry>,
    ids: RuleIds,
    /// Rule ids the tries held for entries at start: taken by the same
    /// entry if it is still wanted.
    hints: HashMap<EntryKey, u32>,
    /// Changes to `entries` so far: what a [`Cover`] was built from.
    changes: u64,
}

impl Default for Lists {
    fn default() -> Self {
        Lists::with_capacity(lb_common::MAX_LIST_RULES)
    }
}

impl Lists {
    /// Lists that hold at most `max` entries (tests use a small one).
    pub fn with_capacity(max: u32) -> Self {
        Lists {
            entries: HashMap::new(),
            ids: RuleIds::new(max),
            hints: HashMap::new(),
            changes: 0,
        }
    }

    /// Rule ids the tries hold (from a previous run): an entry of the same
    /// key added before [`Lists::drop_hints`] keeps its id and its hits.
    pub fn set_hints(&mut self, hints: impl IntoIterator<Item = (EntryKey, u32)>) {
        self.hints = hints.into_iter().collect();
    }

    /// Forgets the hints not taken.
    pub fn drop_hints(&mut self) {
        self.hints.clear();
    }

    fn alloc(&mut self, key: &EntryKey) -> Result<u32, ListError> {
        if let Some(id) = self.hints.remove(key)
            && self.ids.claim(id)
        {
            return Ok(id);
        }
        // An id hinted for another entry is avoided while hints are held,
        // so that entry still finds its own.
        let mut skipped = Vec::new();
        let got = loop {
            match self.ids.alloc() {
                Some(id) if self.hints.values().any(|&h| h == id) => skipped.push(id),
                other => break other,
            }
        };
        for id in skipped {
            self.ids.release(id);
        }
        got.ok_or(ListError::Full { max: self.ids.max })
    }

    /// Replaces every config entry by `rules` (from a validated file, so
    /// no duplicates): an unchanged entry keeps its rule id, a runtime
    /// entry with the key of a config entry gives way to it. Returns the
    /// entries removed (config entries gone from the file, runtime entries
    /// replaced).
    pub fn set_config(
        &mut self,
        rules: impl IntoIterator<Item = (EntryKey, GuardAction, String)>,
        now_unix_ms: u64,
    ) -> Result<Vec<Entry>, ListError> {
        let wanted: HashMap<EntryKey, (GuardAction, String)> =
            rules.into_iter().map(|(k, a, r)| (k, (a, r))).collect();
        let mut removed = Vec::new();
        let gone: Vec<EntryKey> = self
            .entries
            .values()
            .filter(|e| {
                (e.origin == EntryOrigin::Config && !wanted.contains_key(&e.key))
                    || (e.origin != EntryOrigin::Config && wanted.contains_key(&e.key))
            })
            .map(|e| e.key.clone())
            .collect();
        for k in gone {
            removed.extend(self.take(&k));
        }
        for (key, (action, reason)) in wanted {
            if let Some(e) = self.entries.get_mut(&key) {
                e.action = action;
                e.reason = reason;
                continue;
            }
            let rule = self.alloc(&key)?;
            self.changes += 1;
            self.entries.insert(
                key.clone(),
                Entry {
                    key,
                    action,
                    origin: EntryOrigin::Config,
                    reason,
                    created_unix_ms: now_unix_ms,
                    expires_unix_ms: None,
                    rule,
                },
            );
        }
        Ok(removed)
    }

    /// Adds a runtime or automatic entry, or replaces one of the same key
    /// (which keeps its rule id and hits). Refused over a config entry.
    /// Returns the entry and whether its rule id is new (its counter must
    /// be zeroed).
    pub fn add(&mut self, new: NewEntry) -> Result<(Entry, bool), ListError> {
        let (rule, fresh) = match self.entries.get(&new.key) {
            Some(e) if e.origin == EntryOrigin::Config => {
                return Err(ListError::ConfigEntry { key: new.key });
            }
            Some(e) => (e.rule, false),
            None => (self.alloc(&new.key)?, true),
        };
        let e = Entry {
            key: new.key.clone(),
            action: new.action,
            origin: new.origin,
            reason: new.reason,
            created_unix_ms: new.now_unix_ms,
            expires_unix_ms: new.expires_unix_ms,
            rule,
        };
        self.changes += 1;
        self.entries.insert(new.key, e.clone());
        Ok((e, fresh))
    }

    /// Adopts an entry saved by a previous run, unless the file has an
    /// entry of the same key (the file wins).
    pub fn restore(&mut self, e: Entry) -> Result<Option<Entry>, ListError> {
        if self.entries.contains_key(&e.key) {
            return Ok(None);
        }
        let rule = self.alloc(&e.key)?;
        let e = Entry { rule, ..e };
        self.changes += 1;
        self.entries.insert(e.key.clone(), e.clone());
        Ok(Some(e))
    }

    /// Removes a runtime or automatic entry (`xlb unblock`).
    pub fn remove(&mut self, key: &EntryKey) -> Result<Entry, ListError> {
        match self.entries.get(key) {
            None => Err(ListError::NotFound { key: key.clone() }),
            Some(e) if e.origin == EntryOrigin::Config => {
                Err(ListError::ConfigEntry { key: key.clone() })
            }
            Some(_) => Ok(self.take(key).expect("present")),
        }
    }

    fn take(&mut self, key: &EntryKey) -> Option<Entry> {
        let e = self.entries.remove(key)?;
        self.changes += 1;
        self.ids.release(e.rule);
        Some(e)
    }

    /// Removes the entries whose expiry is at or before `now_unix_ms`.
    pub fn expire(&mut self, now_unix_ms: u64) -> Vec<Entry> {
        let due: Vec<EntryKey> = self
            .entries
            .values()
            .filter(|e| e.expires_unix_ms.is_some_and(|t| t <= now_unix_ms))
            .map(|e| e.key.clone())
            .collect();
        let mut out: Vec<Entry> = due.iter().filter_map(|k| self.take(k)).collect();
        out.sort_by_key(|e| e.rule);
        out
    }

    /// Removes the entries of VIPs not in `vips` (removed from the file).
    pub fn retain_vips(&mut self, vips: &[&str]) -> Vec<Entry> {
        let gone: Vec<EntryKey> = self
            .entries
            .keys()
            .filter(|k| k.scope.vip().is_some_and(|v| !vips.contains(&v)))
            .cloned()
            .collect();
        gone.iter().filter_map(|k| self.take(k)).collect()
    }

    pub fn get(&self, key: &EntryKey) -> Option<&Entry> {
        self.entries.get(key)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry: deny before allow, global before per-VIP (by name),
    /// then by prefix.
    pub fn sorted(&self) -> Vec<&Entry> {
        let mut v: Vec<&Entry> = self.entries.values().collect();
        v.sort_by(|a, b| order(a, b));
        v
    }

    /// Changes to the entries so far (added, replaced or removed): a
    /// [`Cover`] built at one count holds until it moves.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    /// Whether list `list` of scope `scope` has any entry.
    pub fn has_entries(&self, list: ListKind, scope: &Scope) -> bool {
        self.entries
            .keys()
            .any(|k| k.list == list && k.scope == *scope)
    }

    /// The scopes whose list `list` has entries (one pass over the lists).
    pub fn scopes_with(&self, list: ListKind) -> HashSet<&Scope> {
        self.entries
            .keys()
            .filter(|k| k.list == list)
            .map(|k| &k.scope)
            .collect()
    }

    /// The most specific entry of `list` covering `addr` that applies to
    /// VIP `vip` (its own or a global one).
    pub fn covering(&self, list: ListKind, vip: &str, addr: IpAddr) -> Option<&Entry> {
        let max: u8 = if addr.is_ipv4() { 32 } else { 128 };
        let scopes = [Scope::Vip(vip.to_owned()), Scope::Global];
        (0..=max).rev().find_map(|len| {
            let prefix = Prefix::of(addr, len);
            scopes.iter().find_map(|scope| {
                self.entries.get(&EntryKey {
                    list,
                    scope: scope.clone(),
                    prefix,
                })
            })
        })
    }

    /// The entries of `list` that apply to VIP `vip` (its own and the
    /// global ones), indexed for many [`Cover::covers`] in a row: a lookup
    /// per prefix length in use, where [`Lists::covering`] tries every
    /// length of both scopes (10,000 heavy sources a tick judged against
    /// 10,000 entries must not stall the main loop).
    pub fn cover(&self, list: ListKind, vip: &str) -> Cover {
        let mut c = Cover::default();
        for k in self.entries.keys().filter(|k| k.list == list) {
            if k.scope.vip().is_some_and(|v| v != vip) {
                continue;
            }
            let lens = if k.prefix.addr.is_ipv4() {
                &mut c.lens_v4
            } else {
                &mut c.lens_v6
            };
            if !lens.contains(&k.prefix.len) {
                lens.push(k.prefix.len);
            }
            c.prefixes.insert(k.prefix);
        }
        c
    }

    /// What the tries should hold: each entry whose scope resolves to a VIP
    /// id (`vip_id(name)`; `None` = no such VIP, left out).
    pub fn wanted(
        &self,
        vip_id: impl Fn(&str) -> Option<u32>,
    ) -> HashMap<(ListKind, ListKey), Slot> {
        self.entries
            .values()
            .filter_map(|e| {
                let key = list_key(&e.key, &vip_id)?;
                Some((
                    (e.key.list, key),
                    Slot {
                        rule: e.rule,
                        action: e.raw_action(),
                    },
                ))
            })
            .collect()
    }
}

/// The order of [`Lists::sorted`]: deny before allow, then scope, then
/// prefix. Borrowed keys: a clone of each scope per comparison cost 10,000
/// entries (a batch of auto blocks) a tenth of a second.
pub fn order(a: &Entry, b: &Entry) -> std::cmp::Ordering {
    (a.key.list == ListKind::Allow)
        .cmp(&(b.key.list == ListKind::Allow))
        .then_with(|| a.key.scope.cmp(&b.key.scope))
        .then_with(|| a.key.prefix.cmp(&b.key.prefix))
}

/// The prefixes of one list at one VIP ([`Lists::cover`]).
#[derive(Clone, Debug, Default)]
pub struct Cover {
    prefixes: HashSet<Prefix>,
    lens_v4: Vec<u8>,
    lens_v6: Vec<u8>,
}

impl Cover {
    /// Whether an entry covers `addr`.
    pub fn covers(&self, addr: IpAddr) -> bool {
        let lens = if addr.is_ipv4() {
            &self.lens_v4
        } else {
            &self.lens_v6
        };
        lens.iter()
            .any(|&len| self.prefixes.contains(&Prefix::of(addr, len)))
    }
}

/// The trie key of `key`, its scope resolved by `vip_id`.
pub fn list_key(key: &EntryKey, vip_id: impl Fn(&str) -> Option<u32>) -> Option<ListKey> {
    let scope = match &key.scope {
        Scope::Global => lb_common::SCOPE_GLOBAL,
        Scope::Vip(name) => vip_id(name)?,
    };
    Some(ListKey {
        scope,
        addr: key.prefix.addr,
        len: key.prefix.len,
    })
}

/// A trie entry's value as userspace compares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub rule: u32,
    /// `lb_common::ACTION_*`.
    pub action: u8,
}

/// What to write to make the tries hold `wanted` when they hold `present`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Diff {
    /// Insert or overwrite; `true` = a rule id the trie did not hold for
    /// this key, whose hit counter must be zeroed first.
    pub upsert: Vec<(ListKind, ListKey, Slot, bool)>,
    pub remove: Vec<(ListKind, ListKey)>,
}

pub fn diff(
    wanted: &HashMap<(ListKind, ListKey), Slot>,
    present: &HashMap<(ListKind, ListKey), Slot>,
) -> Diff {
    let mut d = Diff::default();
    for ((list, key), slot) in wanted {
        match present.get(&(*list, *key)) {
            Some(p) if p == slot => {}
            Some(p) => d.upsert.push((*list, *key, *slot, p.rule != slot.rule)),
            None => d.upsert.push((*list, *key, *slot, true)),
        }
    }
    for (list, key) in present.keys() {
        if !wanted.contains_key(&(*list, *key)) {
            d.remove.push((*list, *key));
        }
    }
    let order = |l: &ListKind, k: &ListKey| (*l == ListKind::Allow, k.scope, k.addr, k.len);
    d.upsert.sort_by_key(|(l, k, ..)| order(l, k));
    d.remove.sort_by_key(|(l, k)| order(l, k));
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(list: ListKind, vip: Option<&str>, prefix: &str) -> EntryKey {
        EntryKey {
            list,
            scope: Scope::of(vip),
            prefix: prefix.parse().unwrap(),
        }
    }

    fn deny(vip: Option<&str>, prefix: &str) -> EntryKey {
        key(ListKind::Deny, vip, prefix)
    }

    fn runtime(k: EntryKey, now: u64, expires: Option<u64>) -> NewEntry {
        NewEntry {
            key: k,
            action: GuardAction::Drop,
            origin: EntryOrigin::Runtime,
            reason: "test".into(),
            now_unix_ms: now,
            expires_unix_ms: expires,
        }
    }

    #[test]
    fn rule_ids_are_dense_and_reused() {
        let mut ids = RuleIds::new(4);
        assert_eq!(
            [ids.alloc(), ids.alloc(), ids.alloc()],
            [Some(0), Some(1), Some(2)]
        );
        ids.release(1);
        assert_eq!(ids.alloc(), Some(1), "freed id reused first");
        assert_eq!(ids.alloc(), Some(3));
        assert_eq!(ids.alloc(), None, "full at max");
        let mut ids = RuleIds::new(10);
        assert!(ids.claim(5));
        assert!(!ids.claim(5), "taken");
        assert!(!ids.claim(10), "out of range");
        assert_eq!(
            (0..5).map(|_| ids.alloc().unwrap()).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
        assert_eq!(ids.alloc(), Some(6));
    }

    #[test]
    fn add_replace_remove() {
        let mut l = Lists::default();
        let k = deny(Some("api"), "192.0.2.7");
        let (e, fresh) = l.add(runtime(k.clone(), 1000, None)).unwrap();
        assert_eq!((e.rule, fresh), (0, true));
        let again = NewEntry {
            action: GuardAction::Reset,
            ..runtime(k.clone(), 2000, Some(5000))
        };
        let (e, fresh) = l.add(again).unwrap();
        assert_eq!((e.rule, fresh, e.action), (0, false, GuardAction::Reset));
        assert_eq!(l.len(), 1);
        assert_eq!(l.remove(&k).unwrap().rule, 0);
        assert_eq!(
            l.remove(&k).unwrap_err().to_string(),
            r#"there is no deny 192.0.2.7/32 of vip "api"; `xlb blocks` lists the entries"#
        );
    }

    #[test]
    fn config_entries_cannot_be_overridden_or_removed_at_runtime() {
        let mut l = Lists::default();
        let k = deny(None, "2001:db8:1:2::/64");
        l.set_config([(k.clone(), GuardAction::Drop, "seed".into())], 0)
            .unwrap();
        let msg = "deny 2001:db8:1:2::/64 (all VIPs) comes from the configuration file; \
                   edit the file and reload (xlb reload) to change or remove it";
        assert_eq!(l.remove(&k).unwrap_err().to_string(), msg);
        assert_eq!(
            l.add(runtime(k.clone(), 1, None)).unwrap_err().to_string(),
            msg
        );
    }

    #[test]
    fn set_config_keeps_ids_of_unchanged_entries_and_replaces_runtime_ones() {
        let mut l = Lists::default();
        let a = deny(None, "192.0.2.1");
        let b = deny(None, "192.0.2.2");
        let c = key(ListKind::Allow, Some("api"), "10.0.0.0/8");
        l.set_config(
            [
                (a.clone(), GuardAction::Drop, String::new()),
                (b.clone(), GuardAction::Drop, String::new()),
            ],
            0,
        )
        .unwrap();
        let rule_a = l.get(&a).unwrap().rule;
        l.add(runtime(c.clone(), 5, None)).unwrap();
        let removed = l
            .set_config(
                [
                    (a.clone(), GuardAction::Reset, "now reset".into()),
                    (c.clone(), GuardAction::Drop, String::new()),
                ],
                10,
            )
            .unwrap();
        let mut gone: Vec<_> = removed.iter().map(|e| e.key.describe()).collect();
        gone.sort();
        assert_eq!(
            gone,
            [
                "allow 10.0.0.0/8 of vip \"api\"",
                "deny 192.0.2.2/32 (all VIPs)"
            ]
        );
        let ea = l.get(&a).unwrap();
        assert_eq!((ea.rule, ea.action), (rule_a, GuardAction::Reset));
        assert_eq!(l.get(&c).unwrap().origin, EntryOrigin::Config);
    }

    #[test]
    fn expiry() {
        let mut l = Lists::default();
        l.add(runtime(deny(None, "192.0.2.1"), 0, Some(1000)))
            .unwrap();
        l.add(runtime(deny(None, "192.0.2.2"), 0, Some(2000)))
            .unwrap();
        l.add(runtime(deny(None, "192.0.2.3"), 0, None)).unwrap();
        assert!(l.expire(999).is_empty());
        let gone = l.expire(1000);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].key, deny(None, "192.0.2.1"));
        assert_eq!(l.expire(u64::MAX).len(), 1);
        assert_eq!(l.len(), 1, "no expiry: stays");
        // The expired entries' ids are free again.
        let (e, _) = l.add(runtime(deny(None, "192.0.2.9"), 0, None)).unwrap();
        assert_eq!(e.rule, 0);
    }

    #[test]
    fn full_lists_refuse() {
        let mut l = Lists::with_capacity(2);
        l.add(runtime(deny(None, "192.0.2.1"), 0, None)).unwrap();
        l.add(runtime(deny(None, "192.0.2.2"), 0, None)).unwrap();
        assert_eq!(
            l.add(runtime(deny(None, "192.0.2.3"), 0, None))
                .unwrap_err(),
            ListError::Full { max: 2 }
        );
    }

    #[test]
    fn hinted_ids_are_kept_for_their_entries() {
        let mut l = Lists::default();
        let a = deny(None, "192.0.2.1");
        let b = deny(Some("api"), "192.0.2.2");
        l.set_hints([(a.clone(), 0), (b.clone(), 7)]);
        // An entry without a hint does not take a hinted id.
        let (other, _) = l.add(runtime(deny(None, "192.0.2.3"), 0, None)).unwrap();
        assert_eq!(other.rule, 1);
        let restored = Entry {
            key: b.clone(),
            action: GuardAction::Drop,
            origin: EntryOrigin::Runtime,
            reason: String::new(),
            created_unix_ms: 0,
            expires_unix_ms: None,
            rule: 99,
        };
        assert_eq!(l.restore(restored).unwrap().unwrap().rule, 7);
        l.set_config([(a.clone(), GuardAction::Drop, String::new())], 0)
            .unwrap();
        assert_eq!(l.get(&a).unwrap().rule, 0);
        l.drop_hints();
        let (next, _) = l.add(runtime(deny(None, "192.0.2.4"), 0, None)).unwrap();
        assert_eq!(next.rule, 2);
    }

    #[test]
    fn covering_finds_the_most_specific_entry_of_the_vip_or_global() {
        let mut l = Lists::default();
        l.add(runtime(deny(None, "2001:db8:1::/48"), 0, None))
            .unwrap();
        l.add(runtime(deny(Some("api"), "2001:db8:1:2::/64"), 0, None))
            .unwrap();
        l.add(runtime(deny(Some("web"), "192.0.2.0/24"), 0, None))
            .unwrap();
        let a = |s: &str| s.parse::<IpAddr>().unwrap();
        let hit = |vip, addr| {
            l.covering(ListKind::Deny, vip, a(addr))
                .map(|e| e.key.prefix.to_string())
        };
        assert_eq!(
            hit("api", "2001:db8:1:2::5").as_deref(),
            Some("2001:db8:1:2::/64")
        );
        assert_eq!(
            hit("web", "2001:db8:1:2::5").as_deref(),
            Some("2001:db8:1::/48")
        );
        assert_eq!(hit("api", "192.0.2.5"), None, "another VIP's entry");
        assert_eq!(hit("web", "192.0.2.5").as_deref(), Some("192.0.2.0/24"));
        assert!(
            l.covering(ListKind::Allow, "api", a("2001:db8:1:2::5"))
                .is_none()
        );
        assert!(l.has_entries(ListKind::Deny, &Scope::Global));
        assert!(!l.has_entries(ListKind::Allow, &Scope::Global));
        let scopes = l.scopes_with(ListKind::Deny);
        assert_eq!(scopes.len(), 3);
        assert!(scopes.contains(&Scope::Vip("web".into())));
        assert!(l.scopes_with(ListKind::Allow).is_empty());
    }

    #[test]
    fn cover_agrees_with_covering() {
        let mut l = Lists::default();
        for (vip, p) in [
            (None, "2001:db8:1::/48"),
            (Some("api"), "2001:db8:1:2::/64"),
            (Some("web"), "192.0.2.0/24"),
            (None, "198.51.100.7"),
        ] {
            l.add(runtime(deny(vip, p), 0, None)).unwrap();
        }
        let addrs = [
            "2001:db8:1:2::5",
            "2001:db8:2::1",
            "192.0.2.5",
            "198.51.100.7",
            "198.51.100.8",
        ];
        for vip in ["api", "web", "other"] {
            let c = l.cover(ListKind::Deny, vip);
            let allow = l.cover(ListKind::Allow, vip);
            for a in addrs {
                let a: IpAddr = a.parse().unwrap();
                let want = l.covering(ListKind::Deny, vip, a).is_some();
                assert_eq!(c.covers(a), want, "{vip} {a}");
                assert!(!allow.covers(a), "no allow entries");
            }
        }
    }

    #[test]
    fn wanted_and_diff() {
        let mut l = Lists::default();
        l.add(runtime(deny(None, "192.0.2.1"), 0, None)).unwrap();
        l.add(runtime(deny(Some("api"), "192.0.2.2"), 0, None))
            .unwrap();
        l.add(runtime(deny(Some("gone"), "192.0.2.3"), 0, None))
            .unwrap();
        let wanted = l.wanted(|name| (name == "api").then_some(3));
        assert_eq!(wanted.len(), 2, "the entry of an unknown VIP is left out");
        let lk = |scope, addr: &str| ListKey {
            scope,
            addr: addr.parse().unwrap(),
            len: 32,
        };
        let drop = lb_common::ACTION_DROP;
        let present: HashMap<_, _> = [
            // Same: untouched.
            (
                (ListKind::Deny, lk(lb_common::SCOPE_GLOBAL, "192.0.2.1")),
                Slot {
                    rule: 0,
                    action: drop,
                },
            ),
            // Another rule id: rewritten, counter zeroed.
            (
                (ListKind::Deny, lk(3, "192.0.2.2")),
                Slot {
                    rule: 9,
                    action: drop,
                },
            ),
            // A stray.
            (
                (ListKind::Allow, lk(3, "192.0.2.9")),
                Slot {
                    rule: 4,
                    action: drop,
                },
            ),
        ]
        .into();
        let d = diff(&wanted, &present);
        assert_eq!(
            d.upsert,
            [(
                ListKind::Deny,
                lk(3, "192.0.2.2"),
                Slot {
                    rule: 1,
                    action: drop
                },
                true
            )]
        );
        assert_eq!(d.remove, [(ListKind::Allow, lk(3, "192.0.2.9"))]);
        // An action change keeps the counter.
        let mut changed = present.clone();
        changed.insert(
            (ListKind::Deny, lk(3, "192.0.2.2")),
            Slot {
                rule: 1,
                action: lb_common::ACTION_RESET,
            },
        );
        assert!(!diff(&wanted, &changed).upsert[0].3);
    }

    #[test]
    fn retain_vips_removes_entries_of_removed_vips() {
        let mut l = Lists::default();
        l.add(runtime(deny(Some("api"), "192.0.2.2"), 0, None))
            .unwrap();
        l.add(runtime(deny(Some("old"), "192.0.2.3"), 0, None))
            .unwrap();
        l.add(runtime(deny(None, "192.0.2.4"), 0, None)).unwrap();
        let gone = l.retain_vips(&["api"]);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].key.scope, Scope::Vip("old".into()));
        assert_eq!(l.len(), 2);
    }
}
