//! Loading xlb's XDP object and typed access to its maps: the one place in
//! userspace that knows map names and layouts (shared with the kernel through
//! `lb-common`).

pub mod batch;
mod decap;
mod guard;
mod load;
pub mod nat;
pub mod nat_probe;
mod reply;
mod trace;
mod vip_addr;

pub use guard::{ListKey, source_key};

use std::{
    collections::HashMap as StdHashMap,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, LpmTrie, Map, MapData, MapError, PerCpuArray},
    programs::{Program, ProgramError},
};
use lb_common::{
    BackendInfo, CtEntry, CtRate, DecapAddrKey, DecapSrcV4, DecapSrcV6, FlowKey, Globals, HcReal,
    HcStat, LAYOUT_VERSION, ListEntry, ListV4, ListV6, MAX_VIPS, RingSlot, SourceKey, SourceState,
    Stat, TrafficStats, VIP_INDEX_LEN, VIP_INDEX_MANY, VipAddrKey, VipGuard, VipInfo, VipKey,
    vip_index_slot,
};

/// The compiled XDP object (all programs), embedded at build time.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xlb"));

#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error(
        "this xlb binary was built with AYA_BUILD_SKIP=1 and embeds no XDP object; \
         rebuild with `cargo xtask build`"
    )]
    NoObject,
    #[error("loading the XDP object failed: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("XDP program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("map {name} is missing from the XDP object (build mismatch)")]
    MissingMap { name: &'static str },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error(
        "pinned maps in {dir} have layout version {found}, this xlb uses {expected}: \
         run `xlb detach` with the xlb version that created them (or remove {dir}) and start again"
    )]
    LayoutMismatch {
        dir: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("reading the number of possible CPUs: {0}")]
    Cpus(std::io::Error),
    #[error("ring stride {0} is too large: MAX_VIPS × 2 × stride must fit in u32")]
    StrideTooLarge(u32),
    #[error("map {name}: {source}")]
    Io {
        name: &'static str,
        #[source]
        source: std::io::Error,
    },
}

type Result<T, E = DataplaneError> = std::result::Result<T, E>;

fn map_err(name: &'static str) -> impl FnOnce(MapError) -> DataplaneError {
    move |source| DataplaneError::Map { name, source }
}

/// How to create (or adopt) the maps.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Conntrack capacity (entries).
    pub ct_size: u32,
    /// Capacity of each NAT flow map (entries).
    pub nat_size: u32,
    /// Ring slots reserved per VIP half: the largest allowed table size.
    pub ring_stride: u32,
    /// Pin every map here, adopting maps already pinned there.
    pub pin_dir: Option<PathBuf>,
    /// What to tell the programs of the kernel (`crate::kernel`); `None`:
    /// probe it. Tests set it to run an older kernel's fallbacks here.
    pub kernel: Option<crate::kernel::Features>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            ct_size: lb_common::DEFAULT_CT_SIZE,
            nat_size: lb_common::nat::DEFAULT_NAT_SIZE,
            ring_stride: lb_common::DEFAULT_TABLE_SIZE,
            pin_dir: None,
            kernel: None,
        }
    }
}

/// Every map of the object, by name. Listed once so pinning, adoption and
/// `detach` agree.
pub const MAP_NAMES: &[&str] = &[
    lb_common::MAP_VIPS,
    lb_common::MAP_VIP_INFO,
    lb_common::MAP_VIP_PORTS,
    lb_common::MAP_VIP_INDEX,
    lb_common::MAP_VIP_ADDRS,
    lb_common::MAP_VIP_ADDR_INDEX,
    lb_common::MAP_RING,
    lb_common::MAP_BACKENDS,
    lb_common::MAP_CT,
    lb_common::MAP_GLOBALS,
    lb_common::MAP_STATS,
    lb_common::MAP_VIP_STATS,
    lb_common::MAP_BE_STATS,
    lb_common::MAP_NEXTHOP,
    lb_common::MAP_DECAP_ADDRS,
    lb_common::MAP_DECAP_STATS,
    lb_common::MAP_DECAP_SRC_V4,
    lb_common::MAP_DECAP_SRC_V6,
    lb_common::MAP_DECAP_VIPS,
    lb_common::MAP_HC_REALS,
    lb_common::MAP_HC_STATS,
    lb_common::MAP_GUARD,
    lb_common::MAP_DENY_V4,
    lb_common::MAP_DENY_V6,
    lb_common::MAP_ALLOW_V4,
    lb_common::MAP_ALLOW_V6,
    lb_common::MAP_LIST_HITS,
    lb_common::MAP_SOURCES,
    lb_common::MAP_CT_RATE,
    lb_common::MAP_REPLY_RATE,
    lb_common::trace::MAP_TRACE_CONFIG,
    lb_common::trace::MAP_TRACE_EVENTS,
    lb_common::nat::MAP_NAT_FLOWS,
    lb_common::nat::MAP_NAT_REPLY,
    lb_common::nat::MAP_NAT_POOL,
    lb_common::nat::MAP_NAT_SPORTS,
    lb_common::nat::MAP_PASSIVE,
    lb_common::nat::MAP_NAT_BACKEND_ADDRS,
    lb_common::trace::MAP_TRACE_ON,
];

/// `XLB_VIP_INDEX` for the VIPs `entries` (key, id): each slot 0, the id
/// + 1 of the one VIP whose key falls in it, or `VIP_INDEX_MANY`.
fn vip_index(entries: &[(VipKey, u32)]) -> Vec<u32> {
    let mut index = vec![0; VIP_INDEX_LEN as usize];
    for (k, id) in entries {
        let slot = &mut index[vip_index_slot(&k.addr, k.port, k.proto) as usize];
        *slot = if *slot == 0 { id + 1 } else { VIP_INDEX_MANY };
    }
    index
}

/// The loaded object and typed handles to its maps.
pub struct Dataplane {
    ebpf: Ebpf,
    vips: HashMap<MapData, VipKey, u32>,
    vip_info: Array<MapData, VipInfo>,
    vip_ports: Array<MapData, u32>,
    vip_index: Array<MapData, u32>,
    /// What `vip_index` holds, read on the first change (only changed
    /// slots are written): a load that changes no VIP never reads it.
    vip_index_now: Option<Vec<u32>>,
    vip_addrs: HashMap<MapData, VipAddrKey, u32>,
    vip_addr_index: Array<MapData, u32>,
    ring: Array<MapData, RingSlot>,
    backends: Array<MapData, BackendInfo>,
    ct: HashMap<MapData, FlowKey, CtEntry>,
    globals: Array<MapData, Globals>,
    stats: PerCpuArray<MapData, u64>,
    vip_stats: PerCpuArray<MapData, TrafficStats>,
    be_stats: PerCpuArray<MapData, TrafficStats>,
    /// The three counter maps again, read whole with one batch call each
    /// (aya's typed maps have no batch lookup).
    counter_maps: CounterMaps,
    decap_addrs: HashMap<MapData, DecapAddrKey, u32>,
    decap_stats: PerCpuArray<MapData, u64>,
    decap_src_v4: LpmTrie<MapData, DecapSrcV4, u32>,
    decap_src_v6: LpmTrie<MapData, DecapSrcV6, u32>,
    decap_vips: HashMap<MapData, DecapAddrKey, u32>,
    hc_reals: HashMap<MapData, u32, HcReal>,
    hc_stats: PerCpuArray<MapData, u64>,
    guard: Array<MapData, VipGuard>,
    deny_v4: LpmTrie<MapData, ListV4, ListEntry>,
    deny_v6: LpmTrie<MapData, ListV6, ListEntry>,
    allow_v4: LpmTrie<MapData, ListV4, ListEntry>,
    allow_v6: LpmTrie<MapData, ListV6, ListEntry>,
    list_hits: PerCpuArray<MapData, u64>,
    sources: HashMap<MapData, SourceKey, SourceState>,
    ct_rate: PerCpuArray<MapData, CtRate>,
    reply_rate: PerCpuArray<MapData, lb_common::ReplyRate>,
    trace: trace::TraceMaps,
    nat: nat::NatMaps,
    ring_stride: u32,
}

/// Reads the layout version of maps pinned in `dir`, if any are.
pub fn pinned_layout_version(dir: &Path) -> Result<Option<u32>> {
    let path = dir.join(lb_common::MAP_GLOBALS);
    if !path.exists() {
        return Ok(None);
    }
    let data = MapData::from_pin(&path).map_err(map_err(lb_common::MAP_GLOBALS))?;
    let globals: Array<MapData, Globals> =
        Array::try_from(Map::Array(data)).map_err(map_err(lb_common::MAP_GLOBALS))?;
    let g = globals
        .get(&0, 0)
        .map_err(map_err(lb_common::MAP_GLOBALS))?;
    Ok(Some(g.layout_version))
}

impl Dataplane {
    /// Loads the object, creating its maps (or adopting pinned ones), and
    /// loads every program into the kernel (verifier included).
    pub fn load(opts: &LoadOptions) -> Result<Self> {
        Self::load_programs(opts, &load::ALL_PROGRAMS)
    }

    /// [`load`](Self::load), loading only `programs` into the kernel:
    /// a tool that attaches one program (`xlb decap`, `xlb xdp-pass`) does
    /// not wait for the verifier to walk `xlb_lb` (a second on a fast
    /// machine, far longer on a slow one).
    pub fn load_programs(opts: &LoadOptions, programs: &[&'static str]) -> Result<Self> {
        if OBJECT.is_empty() {
            return Err(DataplaneError::NoObject);
        }
        let ring_entries = MAX_VIPS
            .checked_mul(2)
            .and_then(|n| n.checked_mul(opts.ring_stride))
            .ok_or(DataplaneError::StrideTooLarge(opts.ring_stride))?;
        if let Some(dir) = &opts.pin_dir
            && let Some(found) = pinned_layout_version(dir)?
            && found != LAYOUT_VERSION
        {
            return Err(DataplaneError::LayoutMismatch {
                dir: dir.clone(),
                found,
                expected: LAYOUT_VERSION,
            });
        }
        if let Some(dir) = &opts.pin_dir {
            load::renew_counter_pins(dir)?;
        }
        let kernel_bits = crate::kernel::prepare(opts.kernel).bits();
        let mut loader = EbpfLoader::new();
        loader
            .override_global(lb_common::kernel::KERNEL_GLOBAL, &kernel_bits, true)
            .map_max_entries(lb_common::MAP_RING, ring_entries)
            .map_max_entries(lb_common::MAP_CT, opts.ct_size)
            .map_max_entries(lb_common::nat::MAP_NAT_FLOWS, opts.nat_size)
            .map_max_entries(lb_common::nat::MAP_NAT_REPLY, opts.nat_size);
        let pins: Vec<(&str, PathBuf)> = match &opts.pin_dir {
            Some(dir) => MAP_NAMES
                .iter()
                .map(|n| (*n, dir.join(lb_common::trace::pin_name(n))))
                .collect(),
            None => Vec::new(),
        };
        for (name, path) in &pins {
            loader.map_pin_path(name, path.as_path());
        }
        let mut ebpf = loader.load(OBJECT)?;
        load::load_programs(&mut ebpf, programs)?;
        let mut dp = Self::with_maps(ebpf, opts.ring_stride)?;
        // A fresh globals map is all zeroes: stamp layout and stride at once,
        // so a crash before the daemon finishes still leaves a valid version.
        let mut g = dp.globals()?;
        if g.layout_version == 0 {
            g.layout_version = LAYOUT_VERSION;
            g.ring_stride = opts.ring_stride;
            dp.set_globals(&g)?;
        }
        Ok(dp)
    }

    /// Takes every map userspace uses out of `ebpf`, typed. The next-hop
    /// cache stays in `ebpf`: only the kernel uses it.
    fn with_maps(mut ebpf: Ebpf, ring_stride: u32) -> Result<Self> {
        let counter_maps = CounterMaps {
            stats: nat::second_handle(&ebpf, lb_common::MAP_STATS)?,
            vip_stats: nat::second_handle(&ebpf, lb_common::MAP_VIP_STATS)?,
            be_stats: nat::second_handle(&ebpf, lb_common::MAP_BE_STATS)?,
        };
        let trace = trace::TraceMaps::take(&mut ebpf)?;
        let nat = nat::NatMaps::take(&mut ebpf)?;
        let mut take = |name: &'static str| -> Result<Map> {
            ebpf.take_map(name)
                .ok_or(DataplaneError::MissingMap { name })
        };
        macro_rules! typed {
            ($name:expr) => {{
                let name: &'static str = $name;
                take(name)?.try_into().map_err(map_err(name))?
            }};
        }
        Ok(Self {
            vip_index: typed!(lb_common::MAP_VIP_INDEX),
            vip_index_now: None,
            vips: typed!(lb_common::MAP_VIPS),
            vip_info: typed!(lb_common::MAP_VIP_INFO),
            vip_ports: typed!(lb_common::MAP_VIP_PORTS),
            vip_addrs: typed!(lb_common::MAP_VIP_ADDRS),
            vip_addr_index: typed!(lb_common::MAP_VIP_ADDR_INDEX),
            ring: typed!(lb_common::MAP_RING),
            backends: typed!(lb_common::MAP_BACKENDS),
            ct: typed!(lb_common::MAP_CT),
            globals: typed!(lb_common::MAP_GLOBALS),
            stats: typed!(lb_common::MAP_STATS),
            vip_stats: typed!(lb_common::MAP_VIP_STATS),
            be_stats: typed!(lb_common::MAP_BE_STATS),
            counter_maps,
            decap_addrs: typed!(lb_common::MAP_DECAP_ADDRS),
            decap_stats: typed!(lb_common::MAP_DECAP_STATS),
            decap_src_v4: typed!(lb_common::MAP_DECAP_SRC_V4),
            decap_src_v6: typed!(lb_common::MAP_DECAP_SRC_V6),
            decap_vips: typed!(lb_common::MAP_DECAP_VIPS),
            hc_reals: typed!(lb_common::MAP_HC_REALS),
            hc_stats: typed!(lb_common::MAP_HC_STATS),
            guard: typed!(lb_common::MAP_GUARD),
            deny_v4: typed!(lb_common::MAP_DENY_V4),
            deny_v6: typed!(lb_common::MAP_DENY_V6),
            allow_v4: typed!(lb_common::MAP_ALLOW_V4),
            allow_v6: typed!(lb_common::MAP_ALLOW_V6),
            list_hits: typed!(lb_common::MAP_LIST_HITS),
            sources: typed!(lb_common::MAP_SOURCES),
            ct_rate: typed!(lb_common::MAP_CT_RATE),
            reply_rate: typed!(lb_common::MAP_REPLY_RATE),
            trace,
            nat,
            ebpf,
            ring_stride,
        })
    }

    /// A loaded program by name (one of `lb_common::PROG_*`), as its type:
    /// `Xdp` for the XDP programs, `SchedClassifier` for `xlb_hc`.
    pub fn program<T>(&mut self, name: &'static str) -> Result<&mut T>
    where
        for<'a> &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
    {
        self.ebpf
            .program_mut(name)
            .ok_or(DataplaneError::Program {
                name,
                source: ProgramError::NotLoaded,
            })?
            .try_into()
            .map_err(|source| DataplaneError::Program { name, source })
    }

    pub fn ring_stride(&self) -> u32 {
        self.ring_stride
    }

    pub fn globals(&self) -> Result<Globals> {
        self.globals
            .get(&0, 0)
            .map_err(map_err(lb_common::MAP_GLOBALS))
    }

    pub fn set_globals(&mut self, g: &Globals) -> Result<()> {
        self.globals
            .set(0, g, 0)
            .map_err(map_err(lb_common::MAP_GLOBALS))
    }

    /// The VIP served at `key`, if any.
    pub fn vip(&self, key: &VipKey) -> Result<Option<VipInfo>> {
        match self.vips.get(key, 0) {
            Ok(id) => Ok(Some(self.vip_info(id)?)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(map_err(lb_common::MAP_VIPS)(e)),
        }
    }

    pub fn vip_info(&self, vip_id: u32) -> Result<VipInfo> {
        self.vip_info
            .get(&vip_id, 0)
            .map_err(map_err(lb_common::MAP_VIP_INFO))
    }

    /// Every VIP key in `XLB_VIPS` and its id.
    fn vip_ids(&self) -> Result<Vec<(VipKey, u32)>> {
        self.vips
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(map_err(lb_common::MAP_VIPS))
    }

    /// All VIPs in the maps.
    pub fn vip_entries(&self) -> Result<Vec<(VipKey, VipInfo)>> {
        self.vip_ids()?
            .into_iter()
            .map(|(k, id)| Ok((k, self.vip_info(id)?)))
            .collect()
    }

    /// Writes a VIP's info (table size, live half, mode, policy, and its
    /// key, which must be the VIP's: the data plane takes the VIP only for
    /// packets to that key). Writing a new `active` is how a freshly
    /// written table half goes live: the kernel reads `table_size` and
    /// `active` from one 8-byte word.
    pub fn set_vip_info(&mut self, info: &VipInfo) -> Result<()> {
        self.vip_info
            .set(info.vip_id, info, 0)
            .map_err(map_err(lb_common::MAP_VIP_INFO))
    }

    /// Inserts or replaces a VIP: its info (with `key` in it), its key →
    /// id, its address and port, and its slot in the index.
    pub fn set_vip(&mut self, key: &VipKey, info: &VipInfo) -> Result<()> {
        self.set_vip_info(&VipInfo { key: *key, ..*info })?;
        let new = matches!(self.vips.get(key, 0), Err(MapError::KeyNotFound));
        self.vips
            .insert(key, info.vip_id, 0)
            .map_err(map_err(lb_common::MAP_VIPS))?;
        self.sync_vip_addr(key)?;
        if new {
            self.bump_port(key, 1)?;
        }
        self.sync_vip_index()
    }

    /// Writes the slots of `XLB_VIP_INDEX` that differ from what the VIPs
    /// in `XLB_VIPS` make of it (see `lb_common::VIP_INDEX_MANY`). The
    /// data plane checks each candidate against its `VipInfo::key`, so the
    /// order of the writes never sends a packet to the wrong VIP.
    fn sync_vip_index(&mut self) -> Result<()> {
        let want = vip_index(&self.vip_ids()?);
        let now = match &mut self.vip_index_now {
            Some(now) => now,
            none => none.insert(
                (0..VIP_INDEX_LEN)
                    .map(|i| self.vip_index.get(&i, 0))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(map_err(lb_common::MAP_VIP_INDEX))?,
            ),
        };
        for (i, (&w, now)) in want.iter().zip(now.iter_mut()).enumerate() {
            if w != *now {
                self.vip_index
                    .set(i as u32, w, 0)
                    .map_err(map_err(lb_common::MAP_VIP_INDEX))?;
                *now = w;
            }
        }
        Ok(())
    }

    fn bump_port(&mut self, key: &VipKey, delta: i32) -> Result<()> {
        let idx = lb_common::port_index(key.proto, u16::from_be(key.port));
        let n = self
            .vip_ports
            .get(&idx, 0)
            .map_err(map_err(lb_common::MAP_VIP_PORTS))?;
        let n = n.saturating_add_signed(delta);
        self.vip_ports
            .set(idx, n, 0)
            .map_err(map_err(lb_common::MAP_VIP_PORTS))
    }

    /// Removes a VIP: its key, its info (so its conntrack entries are stale),
    /// its port count, and its address when no other VIP uses it.
    pub fn remove_vip(&mut self, key: &VipKey) -> Result<()> {
        let id = match self.vips.get(key, 0) {
            Ok(id) => id,
            Err(MapError::KeyNotFound) => return Ok(()),
            Err(e) => return Err(map_err(lb_common::MAP_VIPS)(e)),
        };
        self.vips
            .remove(key)
            .map_err(map_err(lb_common::MAP_VIPS))?;
        self.set_vip_info(&VipInfo {
            vip_id: id,
            ..VipInfo::default()
        })?;
        self.bump_port(key, -1)?;
        self.sync_vip_addr(key)?;
        self.sync_vip_index()
    }

    /// Reads half `half` of VIP `vip_id`'s ring (`len` slots): the backend ids.
    pub fn ring_half(&self, vip_id: u32, half: u32, len: u32) -> Result<Vec<u32>> {
        Ok(self
            .ring_slots(vip_id, half, len)?
            .iter()
            .map(|s| s.backend_id)
            .collect())
    }

    /// Reads half `half` of VIP `vip_id`'s ring (`len` slots), previous
    /// owners included.
    pub fn ring_slots(&self, vip_id: u32, half: u32, len: u32) -> Result<Vec<RingSlot>> {
        (0..len)
            .map(|slot| {
                let idx = lb_common::ring_index(vip_id, half, self.ring_stride, slot);
                self.ring.get(&idx, 0).map_err(map_err(lb_common::MAP_RING))
            })
            .collect()
    }

    /// Writes `(slot, backend id)` pairs into half `half` of VIP `vip_id`'s
    /// ring, with no previous owner.
    pub fn write_ring(&mut self, vip_id: u32, half: u32, slots: &[(u32, u32)]) -> Result<()> {
        for &(slot, id) in slots {
            self.set_ring_slot(
                vip_id,
                half,
                slot,
                RingSlot {
                    backend_id: id,
                    prev_id: 0,
                },
            )?;
        }
        Ok(())
    }

    /// Writes `(slot, value)` pairs into half `half` of VIP `vip_id`'s ring.
    pub fn write_ring_slots(
        &mut self,
        vip_id: u32,
        half: u32,
        slots: &[(u32, RingSlot)],
    ) -> Result<()> {
        for &(slot, value) in slots {
            self.set_ring_slot(vip_id, half, slot, value)?;
        }
        Ok(())
    }

    fn set_ring_slot(&mut self, vip_id: u32, half: u32, slot: u32, value: RingSlot) -> Result<()> {
        let idx = lb_common::ring_index(vip_id, half, self.ring_stride, slot);
        self.ring
            .set(idx, value, 0)
            .map_err(map_err(lb_common::MAP_RING))
    }

    pub fn backend(&self, id: u32) -> Result<BackendInfo> {
        self.backends
            .get(&id, 0)
            .map_err(map_err(lb_common::MAP_BACKENDS))
    }

    pub fn set_backend(&mut self, id: u32, info: &BackendInfo) -> Result<()> {
        self.backends
            .set(id, info, 0)
            .map_err(map_err(lb_common::MAP_BACKENDS))
    }

    pub fn ct_get(&self, key: &FlowKey) -> Result<Option<CtEntry>> {
        match self.ct.get(key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(map_err(lb_common::MAP_CT)(e)),
        }
    }

    pub fn ct_insert(&mut self, key: &FlowKey, entry: &CtEntry) -> Result<()> {
        self.ct
            .insert(key, entry, 0)
            .map_err(map_err(lb_common::MAP_CT))
    }

    pub fn ct_remove(&mut self, key: &FlowKey) -> Result<()> {
        match self.ct.remove(key) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err(lb_common::MAP_CT)(e)),
        }
    }

    /// Clears every conntrack entry.
    pub fn ct_clear(&mut self) -> Result<()> {
        let keys: Vec<FlowKey> = self.ct.keys().filter_map(std::result::Result::ok).collect();
        for k in keys {
            self.ct_remove(&k)?;
        }
        Ok(())
    }

    /// Global reason counters, summed over CPUs.
    pub fn stats(&self) -> Result<StdHashMap<Stat, u64>> {
        let sums = sums_of(
            &self.counter_maps.stats,
            Stat::ALL.len() as u32,
            |s, v: &u64| *s += v,
            |i| sum_counter(&self.stats, i, lb_common::MAP_STATS),
            lb_common::MAP_STATS,
        )?;
        Ok(Stat::ALL.iter().copied().zip(sums).collect())
    }

    /// Every VIP's traffic counters and those of backend ids `0..backends`,
    /// summed over CPUs: two syscalls, whatever the number of backends
    /// (one lookup per VIP and backend on kernels without batch reads of
    /// arrays).
    pub fn traffic(&self, backends: u32) -> Result<Traffic> {
        let read = |map: &MapData,
                    typed: &PerCpuArray<MapData, TrafficStats>,
                    n: u32,
                    name: &'static str| {
            sums_of(
                map,
                n,
                add_traffic,
                |i| sum_traffic(typed, i).map_err(map_err(name)),
                name,
            )
        };
        Ok(Traffic {
            vips: read(
                &self.counter_maps.vip_stats,
                &self.vip_stats,
                MAX_VIPS,
                lb_common::MAP_VIP_STATS,
            )?,
            backends: read(
                &self.counter_maps.be_stats,
                &self.be_stats,
                backends.min(lb_common::BACKEND_IDS),
                lb_common::MAP_BE_STATS,
            )?,
        })
    }

    pub fn vip_stats(&self, vip_id: u32) -> Result<TrafficStats> {
        sum_traffic(&self.vip_stats, vip_id).map_err(map_err(lb_common::MAP_VIP_STATS))
    }

    pub fn backend_stats(&self, id: u32) -> Result<TrafficStats> {
        sum_traffic(&self.be_stats, id).map_err(map_err(lb_common::MAP_BE_STATS))
    }

    /// Zeroes a backend's counters (when its id is given to another backend).
    pub fn reset_backend_stats(&mut self, id: u32) -> Result<()> {
        let zero = zero_per_cpu()?;
        self.be_stats
            .set(id, zero, 0)
            .map_err(map_err(lb_common::MAP_BE_STATS))
    }

    /// Zeroes a VIP's counters (when its id is given to another VIP).
    pub fn reset_vip_stats(&mut self, vip_id: u32) -> Result<()> {
        let zero = zero_per_cpu()?;
        self.vip_stats
            .set(vip_id, zero, 0)
            .map_err(map_err(lb_common::MAP_VIP_STATS))
    }

    /// Makes `XLB_HC_REALS` hold exactly `want` (mark → where probes with
    /// that mark go): writes what differs, removes what is no longer wanted.
    pub fn sync_hc_reals(&mut self, want: &StdHashMap<u32, HcReal>) -> Result<()> {
        let err = map_err(lb_common::MAP_HC_REALS);
        let have: StdHashMap<u32, HcReal> = self
            .hc_reals
            .iter()
            .collect::<Result<_, _>>()
            .map_err(map_err(lb_common::MAP_HC_REALS))?;
        for (mark, real) in want {
            if have.get(mark) != Some(real) {
                self.hc_reals
                    .insert(mark, real, 0)
                    .map_err(map_err(lb_common::MAP_HC_REALS))?;
            }
        }
        for mark in have.keys().filter(|m| !want.contains_key(m)) {
            match self.hc_reals.remove(mark) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(err(e)),
            }
        }
        Ok(())
    }

    /// `xlb_hc` counters, summed over CPUs.
    pub fn hc_stats(&self) -> Result<Vec<(HcStat, u64)>> {
        HcStat::ALL
            .iter()
            .map(|&s| {
                let n = sum_counter(&self.hc_stats, s as u32, lb_common::MAP_HC_STATS)?;
                Ok((s, n))
            })
            .collect()
    }
}

/// Counter `idx` of the per-CPU array `name`, summed over CPUs.
fn sum_counter(map: &PerCpuArray<MapData, u64>, idx: u32, name: &'static str) -> Result<u64> {
    let v = map.get(&idx, 0).map_err(map_err(name))?;
    Ok(v.iter().sum())
}

fn zero_per_cpu() -> Result<aya::maps::PerCpuValues<TrafficStats>> {
    let n = aya::util::nr_cpus().map_err(|(_, e)| DataplaneError::Cpus(e))?;
    aya::maps::PerCpuValues::try_from(vec![TrafficStats::default(); n])
        .map_err(DataplaneError::Cpus)
}

fn sum_traffic(
    map: &PerCpuArray<MapData, TrafficStats>,
    idx: u32,
) -> Result<TrafficStats, MapError> {
    let v = map.get(&idx, 0)?;
    let mut sum = TrafficStats::default();
    for s in v.iter() {
        add_traffic(&mut sum, s);
    }
    Ok(sum)
}

/// Entries `0..n` of the per-CPU array `map` (`name`), summed over CPUs by
/// `add` in one batch read; entry by entry with `one` on a kernel without
/// batch reads of arrays.
fn sums_of<V: aya::Pod + Default, S: Default>(
    map: &MapData,
    n: u32,
    add: impl Fn(&mut S, &V),
    one: impl Fn(u32) -> Result<S>,
    name: &'static str,
) -> Result<Vec<S>> {
    match batch::percpu_array_sums(map, n, add) {
        Ok(sums) => Ok(sums),
        Err(e) if batch::batch_unsupported(&e) => (0..n).map(one).collect(),
        Err(source) => Err(DataplaneError::Io { name, source }),
    }
}

fn add_traffic(sum: &mut TrafficStats, s: &TrafficStats) {
    sum.packets += s.packets;
    sum.bytes += s.bytes;
    sum.new_flows += s.new_flows;
}

/// The counter maps the daemon reads every tick, as raw handles for
/// [`batch::percpu_array_sums`].
struct CounterMaps {
    stats: MapData,
    vip_stats: MapData,
    be_stats: MapData,
}

/// Traffic counters of every VIP and backend id, read at one moment
/// ([`Dataplane::traffic`]).
#[derive(Clone, Debug, Default)]
pub struct Traffic {
    vips: Vec<TrafficStats>,
    backends: Vec<TrafficStats>,
}

impl Traffic {
    /// VIP `id`'s counters, if it was read.
    pub fn vip(&self, id: u32) -> Option<TrafficStats> {
        self.vips.get(id as usize).copied()
    }

    /// Backend `id`'s counters, if it was read.
    pub fn backend(&self, id: u32) -> Option<TrafficStats> {
        self.backends.get(id as usize).copied()
    }
}

/// `bpf_ktime_get_coarse_ns()` as userspace reads it (`CLOCK_MONOTONIC_COARSE`,
/// ns): the clock the data plane stamps conntrack entries with.
pub fn ktime_coarse_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write to.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) } != 0 {
        return 0;
    }
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(addr: &str, port: u16) -> VipKey {
        VipKey::new(addr.parse().unwrap(), port, lb_common::PROTO_TCP)
    }

    #[test]
    fn vip_index_holds_each_vip_alone_or_many() {
        let slot = |k: &VipKey| vip_index_slot(&k.addr, k.port, k.proto) as usize;
        let (a, b) = (key("10.100.0.1", 80), key("10.100.0.2", 80));
        // A VIP that shares a slot with `a`: found by trying ports.
        let c = (1..u16::MAX)
            .map(|p| key("10.100.0.3", p))
            .find(|k| slot(k) == slot(&a))
            .unwrap();
        assert_ne!(slot(&a), slot(&b));
        let index = vip_index(&[(a, 0), (b, 7)]);
        assert_eq!(index[slot(&a)], 1);
        assert_eq!(index[slot(&b)], 8);
        assert_eq!(index.iter().filter(|&&n| n != 0).count(), 2);
        let index = vip_index(&[(a, 0), (b, 7), (c, 3)]);
        assert_eq!(index[slot(&a)], VIP_INDEX_MANY);
        assert_eq!(index[slot(&b)], 8);
        assert!(vip_index(&[]).iter().all(|&n| n == 0));
    }
}
