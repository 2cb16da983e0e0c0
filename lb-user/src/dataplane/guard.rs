//! The abuse-control maps: each VIP's guard settings, the deny and allow
//! tries, their per-entry hit counters, the per-source LRU and the per-CPU
//! conntrack insert windows.

use std::net::IpAddr;

use aya::maps::{LpmTrie, MapData, MapError, PerCpuValues, lpm_trie::Key};
use lb_common::{
    CtRate, LIST_SCOPE_BITS, ListData, ListEntry, ListV4, ListV6, SourceKey, SourceState, VipGuard,
    addr16, family_of,
};
use lb_ctl::ListKind;

use super::{Dataplane, DataplaneError, Result, map_err, sum_counter};

/// One entry of a deny or allow trie, as userspace names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ListKey {
    /// VIP id, or `lb_common::SCOPE_GLOBAL`.
    pub scope: u32,
    /// The prefix's address (host bits zero) and length in bits.
    pub addr: IpAddr,
    pub len: u8,
}

/// The deny/allow trie data types as userspace reads them back.
trait TrieData: ListData + aya::Pod {
    fn scope(&self) -> u32;
    fn ip(&self) -> IpAddr;
}

impl TrieData for ListV4 {
    fn scope(&self) -> u32 {
        u32::from_be_bytes(self.scope)
    }
    fn ip(&self) -> IpAddr {
        IpAddr::from(self.addr)
    }
}

impl TrieData for ListV6 {
    fn scope(&self) -> u32 {
        u32::from_be_bytes(self.scope)
    }
    fn ip(&self) -> IpAddr {
        IpAddr::from(self.addr)
    }
}

/// The trie key of `key` (of `K`'s family).
fn trie_key<K: ListData + aya::Pod>(key: &ListKey) -> Key<K> {
    Key::new(
        LIST_SCOPE_BITS + u32::from(key.len),
        K::new(key.scope, &addr16(key.addr)),
    )
}

/// Every entry of trie `t` (named `name`), appended to `out`.
fn read_trie<K: TrieData>(
    t: &LpmTrie<MapData, K, ListEntry>,
    name: &'static str,
    out: &mut Vec<(ListKey, ListEntry)>,
) -> Result<()> {
    for r in t.iter() {
        let (k, v) = r.map_err(map_err(name))?;
        let d = k.data();
        let key = ListKey {
            scope: d.scope(),
            addr: d.ip(),
            len: (k.prefix_len() - LIST_SCOPE_BITS) as u8,
        };
        out.push((key, v));
    }
    Ok(())
}

fn trie_names(kind: ListKind) -> (&'static str, &'static str) {
    match kind {
        ListKind::Deny => (lb_common::MAP_DENY_V4, lb_common::MAP_DENY_V6),
        ListKind::Allow => (lb_common::MAP_ALLOW_V4, lb_common::MAP_ALLOW_V6),
    }
}

fn absent_ok(r: std::result::Result<(), MapError>, name: &'static str) -> Result<()> {
    match r {
        Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
        Err(e) => Err(map_err(name)(e)),
    }
}

impl Dataplane {
    /// What new flows to VIP `vip_id` are judged by.
    pub fn guard(&self, vip_id: u32) -> Result<VipGuard> {
        self.guard
            .get(&vip_id, 0)
            .map_err(map_err(lb_common::MAP_GUARD))
    }

    pub fn set_guard(&mut self, vip_id: u32, g: &VipGuard) -> Result<()> {
        self.guard
            .set(vip_id, g, 0)
            .map_err(map_err(lb_common::MAP_GUARD))
    }

    /// Adds or replaces an entry of list `kind`.
    pub fn list_insert(&mut self, kind: ListKind, key: &ListKey, entry: ListEntry) -> Result<()> {
        let (n4, n6) = trie_names(kind);
        let (t4, t6) = match kind {
            ListKind::Deny => (&mut self.deny_v4, &mut self.deny_v6),
            ListKind::Allow => (&mut self.allow_v4, &mut self.allow_v6),
        };
        if key.addr.is_ipv4() {
            t4.insert(&trie_key(key), entry, 0).map_err(map_err(n4))
        } else {
            t6.insert(&trie_key(key), entry, 0).map_err(map_err(n6))
        }
    }

    /// Removes an entry of list `kind` (absent is fine).
    pub fn list_remove(&mut self, kind: ListKind, key: &ListKey) -> Result<()> {
        let (n4, n6) = trie_names(kind);
        let (t4, t6) = match kind {
            ListKind::Deny => (&mut self.deny_v4, &mut self.deny_v6),
            ListKind::Allow => (&mut self.allow_v4, &mut self.allow_v6),
        };
        if key.addr.is_ipv4() {
            absent_ok(t4.remove(&trie_key(key)), n4)
        } else {
            absent_ok(t6.remove(&trie_key(key)), n6)
        }
    }

    /// Every entry of list `kind`, both families.
    pub fn list_entries(&self, kind: ListKind) -> Result<Vec<(ListKey, ListEntry)>> {
        let (n4, n6) = trie_names(kind);
        let (t4, t6) = match kind {
            ListKind::Deny => (&self.deny_v4, &self.deny_v6),
            ListKind::Allow => (&self.allow_v4, &self.allow_v6),
        };
        let mut out = Vec::new();
        read_trie(t4, n4, &mut out)?;
        read_trie(t6, n6, &mut out)?;
        Ok(out)
    }

    /// Packets list entry `rule` matched, summed over CPUs.
    pub fn list_hits(&self, rule: u32) -> Result<u64> {
        sum_counter(&self.list_hits, rule, lb_common::MAP_LIST_HITS)
    }

    /// Zeroes rule `rule`'s counter (when the id is given to a new entry).
    pub fn reset_list_hits(&mut self, rule: u32) -> Result<()> {
        let n = aya::util::nr_cpus().map_err(|(_, e)| DataplaneError::Cpus(e))?;
        let zero = PerCpuValues::try_from(vec![0u64; n]).map_err(DataplaneError::Cpus)?;
        self.list_hits
            .set(rule, zero, 0)
            .map_err(map_err(lb_common::MAP_LIST_HITS))
    }

    /// Every tracked source. Entries that vanish during the walk (LRU
    /// eviction) are skipped.
    pub fn sources(&self) -> Vec<(SourceKey, SourceState)> {
        self.sources.iter().filter_map(Result::ok).collect()
    }

    pub fn source(&self, key: &SourceKey) -> Result<Option<SourceState>> {
        match self.sources.get(key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(map_err(lb_common::MAP_SOURCES)(e)),
        }
    }

    pub fn set_source(&mut self, key: &SourceKey, state: &SourceState) -> Result<()> {
        self.sources
            .insert(key, state, 0)
            .map_err(map_err(lb_common::MAP_SOURCES))
    }

    pub fn remove_source(&mut self, key: &SourceKey) -> Result<()> {
        absent_ok(self.sources.remove(key), lb_common::MAP_SOURCES)
    }

    /// Sets every CPU's conntrack insert window (tests: a controlled window).
    pub fn set_ct_rate(&mut self, slot: u32, rate: CtRate) -> Result<()> {
        let n = aya::util::nr_cpus().map_err(|(_, e)| DataplaneError::Cpus(e))?;
        let v = PerCpuValues::try_from(vec![rate; n]).map_err(DataplaneError::Cpus)?;
        self.ct_rate
            .set(slot, v, 0)
            .map_err(map_err(lb_common::MAP_CT_RATE))
    }

    /// Each CPU's insert window of `slot` (`CT_RATE_CONNTRACK`,
    /// `CT_RATE_NAT`).
    pub fn ct_rate(&self, slot: u32) -> Result<Vec<CtRate>> {
        let v = self
            .ct_rate
            .get(&slot, 0)
            .map_err(map_err(lb_common::MAP_CT_RATE))?;
        Ok(v.iter().copied().collect())
    }
}

/// The `XLB_SOURCES` key of `src` as VIP `vip_id` keys it: the address
/// masked to `v4_prefix` or `v6_prefix` bits.
pub fn source_key(vip_id: u32, src: IpAddr, v4_prefix: u8, v6_prefix: u8) -> SourceKey {
    SourceKey::new(vip_id, &addr16(src), family_of(src), v4_prefix, v6_prefix)
}
