//! NAT mode's maps (issue 27) in a loaded object: the per-VIP pools, the
//! reply filter by backend port, and the marks that tell the data plane a
//! pool address and a NAT VIP's port are its own. The two flow maps are
//! created and pinned here but walked by the daemon's sweep thread from
//! their pins (`daemon::nat_sweep`), as conntrack is; `XLB_PASSIVE` stays
//! in the object for the passive-detection reader.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::os::fd::AsFd as _;

use aya::{
    Ebpf,
    maps::{Array, Map, MapData, MapError},
};
use lb_common::nat::{MAP_NAT_BACKEND_ADDRS, MAP_NAT_POOL, MAP_NAT_SPORTS, NatPool};
use lb_common::{Addr, MAX_VIPS, PORT_INDEX_LEN, VipAddrKey, vip_addr_slot};

use super::{Dataplane, DataplaneError, Result, map_err};

pub use lb_common::nat::{VIP_ADDR_NAT_POOL, VIP_PORT_NAT, vip_addr_nat_pool};

/// `XLB_NAT_POOL` and `XLB_NAT_SPORTS`, typed, and what this process
/// knows it wrote.
pub(super) struct NatMaps {
    pool: Array<MapData, NatPool>,
    sports: Array<MapData, u32>,
    /// `XLB_NAT_BEADDR`: NAT backend addresses (a reply's source that is
    /// none of them, to a pool address's range, is spoofed).
    backend_addrs: aya::maps::HashMap<MapData, VipAddrKey, u32>,
    /// `sports` again, for one batch read (aya's arrays have none).
    sports_raw: MapData,
    /// What `sports` holds where it is not 0, read on the first sync.
    sports_now: Option<BTreeMap<u32, u32>>,
    /// Pool addresses marked in `XLB_VIP_ADDRS` (address, family), read
    /// on the first sync: they count in their `XLB_VIP_AINDEX` slots.
    pub(super) pool_addrs: Option<HashSet<(Addr, u8)>>,
    /// What the last sync that finished wrote: the same again is no work
    /// (a start installs every NAT VIP after syncing for it).
    synced: Option<NatWanted>,
}

impl NatMaps {
    pub(super) fn take(ebpf: &mut Ebpf) -> Result<Self> {
        let sports_raw = second_handle(ebpf, MAP_NAT_SPORTS)?;
        let mut take = |name: &'static str| {
            ebpf.take_map(name)
                .ok_or(DataplaneError::MissingMap { name })
        };
        let pool = take(MAP_NAT_POOL)?;
        let sports = take(MAP_NAT_SPORTS)?;
        let backend_addrs = take(MAP_NAT_BACKEND_ADDRS)?;
        Ok(Self {
            backend_addrs: backend_addrs
                .try_into()
                .map_err(map_err(MAP_NAT_BACKEND_ADDRS))?,
            pool: pool.try_into().map_err(map_err(MAP_NAT_POOL))?,
            sports: sports.try_into().map_err(map_err(MAP_NAT_SPORTS))?,
            sports_raw,
            sports_now: None,
            pool_addrs: None,
            synced: None,
        })
    }
}

/// A second handle on the array or per-CPU array `name` of `ebpf` (its
/// descriptor duplicated), before the typed one is taken out: for batch
/// reads, which aya's typed maps lack.
pub(super) fn second_handle(ebpf: &Ebpf, name: &'static str) -> Result<MapData> {
    let (Some(Map::Array(data)) | Some(Map::PerCpuArray(data))) = ebpf.map(name) else {
        return Err(DataplaneError::MissingMap { name });
    };
    let fd = data
        .fd()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| DataplaneError::Io { name, source })?;
    MapData::from_fd(fd).map_err(map_err(name))
}

/// Everything NAT the daemon wants in the maps, from its VIPs
/// (`daemon::nat::wanted`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NatWanted {
    /// Per VIP id: its pool (absent = a zeroed entry).
    pub pools: BTreeMap<u32, NatPool>,
    /// Per `port_index(protocol, backend port)`: NAT backends there.
    pub sports: BTreeMap<u32, u32>,
    /// Pool address → the `XLB_VIP_ADDRS` value it gets.
    pub pool_addrs: HashMap<VipAddrKey, u32>,
    /// `port_index` of every NAT VIP's own (protocol, port).
    pub vip_ports: BTreeSet<u32>,
    /// NAT backend address → how many NAT backends have it.
    pub backend_addrs: HashMap<VipAddrKey, u32>,
}

impl Dataplane {
    /// The pool of VIP `vip_id` (zeroed for a VIP that is no NAT VIP).
    pub fn nat_pool(&self, vip_id: u32) -> Result<NatPool> {
        self.nat.pool.get(&vip_id, 0).map_err(map_err(MAP_NAT_POOL))
    }

    /// Makes the NAT maps hold `want`, writing only what differs. Order:
    /// pools and the reply filter first, then the marks that let packets
    /// in (pool addresses, VIP ports); what goes away goes in the reverse
    /// order, so a packet never finds a mark without its pool.
    pub fn sync_nat(&mut self, want: &NatWanted) -> Result<()> {
        if self.nat.synced.as_ref() == Some(want) {
            return Ok(());
        }
        // Until this sync finishes, the maps may hold part of it.
        self.nat.synced = None;
        for id in 0..MAX_VIPS {
            let pool = want.pools.get(&id).copied().unwrap_or_default();
            if self.nat_pool(id)? != pool {
                self.nat
                    .pool
                    .set(id, pool, 0)
                    .map_err(map_err(MAP_NAT_POOL))?;
            }
        }
        self.sync_nat_sports(&want.sports)?;
        self.sync_nat_backend_addrs(&want.backend_addrs)?;
        self.sync_pool_addrs(&want.pool_addrs)?;
        self.sync_nat_vip_ports(&want.vip_ports)?;
        self.nat.synced = Some(want.clone());
        Ok(())
    }

    fn sync_nat_sports(&mut self, want: &BTreeMap<u32, u32>) -> Result<()> {
        let now = match self.nat.sports_now.take() {
            Some(now) => now,
            None => self.read_sports()?,
        };
        let mut wrote = now.clone();
        let keys: BTreeSet<u32> = now.keys().chain(want.keys()).copied().collect();
        let result = keys.into_iter().try_for_each(|idx| {
            let w = want.get(&idx).copied().unwrap_or(0);
            if now.get(&idx).copied().unwrap_or(0) == w {
                return Ok(());
            }
            self.nat
                .sports
                .set(idx, w, 0)
                .map_err(map_err(MAP_NAT_SPORTS))?;
            if w == 0 {
                wrote.remove(&idx);
            } else {
                wrote.insert(idx, w);
            }
            Ok(())
        });
        // What was written, even part-way, is what the next sync diffs.
        self.nat.sports_now = Some(wrote);
        result
    }

    /// `XLB_NAT_BEADDR` made to hold `want`: new addresses first, then
    /// the ones no NAT backend has any more.
    fn sync_nat_backend_addrs(&mut self, want: &HashMap<VipAddrKey, u32>) -> Result<()> {
        let map = &mut self.nat.backend_addrs;
        let mut now = HashMap::new();
        for item in map.iter() {
            let (k, v) = item.map_err(map_err(MAP_NAT_BACKEND_ADDRS))?;
            now.insert(k, v);
        }
        for (key, &n) in want {
            if now.get(key) != Some(&n) {
                map.insert(key, n, 0)
                    .map_err(map_err(MAP_NAT_BACKEND_ADDRS))?;
            }
        }
        for key in now.keys().filter(|k| !want.contains_key(k)) {
            match map.remove(key) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(MAP_NAT_BACKEND_ADDRS)(e)),
            }
        }
        Ok(())
    }

    /// The non-zero entries of `XLB_NAT_SPORTS`: one batch read where the
    /// kernel has it (arrays since 5.7), else entry by entry.
    fn read_sports(&self) -> Result<BTreeMap<u32, u32>> {
        let mut out = BTreeMap::new();
        let batch = super::batch::lookup_batch::<u32, u32>(&self.nat.sports_raw, |k, v| {
            if *v != 0 {
                out.insert(*k, *v);
            }
            true
        });
        if batch.is_ok() {
            return Ok(out);
        }
        out.clear();
        for idx in 0..PORT_INDEX_LEN {
            let v = self
                .nat
                .sports
                .get(&idx, 0)
                .map_err(map_err(MAP_NAT_SPORTS))?;
            if v != 0 {
                out.insert(idx, v);
            }
        }
        Ok(out)
    }

    /// Pool addresses in `XLB_VIP_ADDRS`: each marked before its slot
    /// counts it, and uncounted before its mark goes.
    fn sync_pool_addrs(&mut self, want: &HashMap<VipAddrKey, u32>) -> Result<()> {
        let now = self.marked_pool_addrs()?;
        for (key, &bits) in want {
            if now.get(key) != Some(&bits) {
                self.vip_addrs
                    .insert(key, bits, 0)
                    .map_err(map_err(lb_common::MAP_VIP_ADDRS))?;
            }
        }
        let wanted: HashSet<(Addr, u8)> = want.keys().map(|k| (k.addr, k.family)).collect();
        let before = self.nat.pool_addrs.replace(wanted.clone());
        let mut slots: BTreeSet<u32> = wanted.iter().map(|(a, _)| vip_addr_slot(a)).collect();
        slots.extend(before.iter().flatten().map(|(a, _)| vip_addr_slot(a)));
        slots.extend(now.keys().map(|k| vip_addr_slot(&k.addr)));
        for slot in slots {
            self.refresh_vip_addr_slot(slot)?;
        }
        for key in now.keys().filter(|k| !want.contains_key(k)) {
            match self.vip_addrs.remove(key) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(lb_common::MAP_VIP_ADDRS)(e)),
            }
        }
        Ok(())
    }

    /// The `XLB_VIP_ADDRS` entries with the pool bit.
    fn marked_pool_addrs(&self) -> Result<HashMap<VipAddrKey, u32>> {
        let mut out = HashMap::new();
        for item in self.vip_addrs.iter() {
            let (k, v) = item.map_err(map_err(lb_common::MAP_VIP_ADDRS))?;
            if v & VIP_ADDR_NAT_POOL != 0 {
                out.insert(k, v);
            }
        }
        Ok(out)
    }

    /// The [`VIP_PORT_NAT`] bit of `XLB_VIP_PORTS`: set on every port of
    /// `want`, cleared on every other port a VIP uses.
    fn sync_nat_vip_ports(&mut self, want: &BTreeSet<u32>) -> Result<()> {
        let mut ports: BTreeSet<u32> = want.clone();
        for (k, _) in self.vip_entries()? {
            ports.insert(lb_common::port_index(k.proto, u16::from_be(k.port)));
        }
        for idx in ports {
            let n = self
                .vip_ports
                .get(&idx, 0)
                .map_err(map_err(lb_common::MAP_VIP_PORTS))?;
            let bit = if want.contains(&idx) { VIP_PORT_NAT } else { 0 };
            let new = (n & !VIP_PORT_NAT) | bit;
            if new != n {
                self.vip_ports
                    .set(idx, new, 0)
                    .map_err(map_err(lb_common::MAP_VIP_PORTS))?;
            }
        }
        Ok(())
    }

    /// Pool addresses (address, family) that count in `XLB_VIP_AINDEX`.
    pub(super) fn pool_addrs_in_slot(&self, slot: u32) -> impl Iterator<Item = (Addr, u8)> + '_ {
        self.nat
            .pool_addrs
            .iter()
            .flatten()
            .filter(move |(a, _)| vip_addr_slot(a) == slot)
            .copied()
    }
}
