//! Both cores through `xlb_lb` at once, for `xlb-lru-bench`: one thread per
//! core, pinned to it (`sched_setaffinity`), each running
//! `BPF_PROG_TEST_RUN` in a loop for the same window, so the two cores'
//! conntrack inserts and lookups meet in the kernel as RSS queues' would.
//! A single-threaded test run cannot see the LRU's locks; this can.
//!
//! Three conntrack layouts ([`Kind`]): the common LRU xlb ships, a per-CPU
//! LRU (`BPF_F_NO_COMMON_LRU`, one map), and Katran's (one ordinary LRU per
//! CPU, in an array of maps). xlb's program has no array of maps, so the
//! last is played by two worlds, one per core, each with its own common LRU
//! of half the size: what each core runs is then exactly Katran's per-CPU
//! map, less the array-of-maps lookup in front of it (an inlined array
//! lookup, a few ns).
//!
//! Loads ([`Load`]): new flows are SYNs to the `dsr-l2` VIP, one per run,
//! each from a source no run used before (so each misses and inserts);
//! established packets are `dsr-l2` ACKs in repeat mode (the output is the
//! same packet with new MACs, which takes the same path again), 16 flows
//! per core taken in turn, their entries inserted by SYNs on that core
//! first; a flood is batched map updates from userspace ([`Load::Flood`]).

use std::{
    net::{IpAddr, Ipv4Addr},
    os::fd::{AsFd as _, BorrowedFd},
    sync::Barrier,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use aya::{
    maps::{MapFd, MapInfo},
    programs::{TestRun as _, TestRunOptions, Xdp},
};
use lb_common::{CtEntry, FlowKey, Stat};
use lb_user::dataplane::LoadOptions;

use crate::{
    bench::{
        dataplane::{Flows, XDP_TX, frame},
        lru::{NO_COMMON_LRU, PinnedCt, update_batch},
        set_affinity, thread_cpu,
    },
    harness::{SharedWorld, World},
    packet::{ACK, Flow, SYN, csum},
};

/// The `dsr-l2` VIP of [`Flows::install`].
const VIP_L2: &str = "10.100.0.2";
/// Packets per run for established flows: about 3 ms a run, so a window
/// ends within a few ms of its deadline.
pub const EST_REPEAT: u32 = 50_000;
/// Source ports per source address of [`NewFlows`].
const PORTS: u32 = 60_000;
/// Established flows per core, taken in turn one run each: a lookup's cost
/// depends on its hash bucket's chain, so one flow alone would carry its
/// bucket's luck into the figure.
const EST_FLOWS: u16 = 16;
/// Entries per `BPF_MAP_UPDATE_BATCH` of a flood (about half a ms).
const FLOOD_BATCH: usize = 1024;
/// Where the IPv4 header starts in an untagged frame.
const IP_AT: usize = 14;

/// A conntrack layout under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One `LRU_HASH` with the kernel's common LRU: what xlb ships.
    Common,
    /// One `LRU_HASH` with `BPF_F_NO_COMMON_LRU`: each CPU has its own LRU
    /// list and evicts only entries it inserted; a CPU's share is
    /// `max_entries / possible CPUs`.
    PerCpu,
    /// Katran's: one ordinary LRU per CPU (each half the size), played by
    /// one world per core.
    MapPerCpu,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Common, Kind::PerCpu, Kind::MapPerCpu];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Common => "common LRU (shipped)",
            Kind::PerCpu => "per-CPU LRU (NO_COMMON_LRU)",
            Kind::MapPerCpu => "LRU map per CPU (Katran)",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Kind::Common => "lruc",
            Kind::PerCpu => "lrup",
            Kind::MapPerCpu => "lruk",
        }
    }
}

/// What a core sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Load {
    /// SYNs from fresh sources, one per run: every one inserts.
    NewFlows,
    /// ACKs of the core's established flows, repeat mode: every one hits.
    Established,
    /// Conntrack inserts of fresh flows from userspace on this core, in
    /// batches (`BPF_MAP_UPDATE_BATCH`): the LRU's insert path at full
    /// speed, none of the program's other work and no syscall per entry.
    /// The most a neighbouring core can press on the LRU.
    Flood,
}

/// When a core's loop stops: at the end of the window or after `packets`,
/// whichever comes first.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub window: Duration,
    pub packets: u64,
}

impl Budget {
    pub fn window(window: Duration) -> Self {
        Self {
            window,
            packets: u64::MAX,
        }
    }

    /// `packets`, however long they take (up to ten minutes).
    pub fn packets(packets: u64) -> Self {
        Self {
            window: Duration::from_secs(600),
            packets,
        }
    }
}

/// What one core did in one window.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    pub packets: u64,
    /// The kernel's own time of the program over all packets.
    pub kernel: Duration,
    /// The loop's wall time, syscalls included.
    pub wall: Duration,
}

impl Tally {
    /// Mean ns per packet by the kernel's clock.
    pub fn ns(&self) -> f64 {
        self.kernel.as_nanos() as f64 / self.packets.max(1) as f64
    }

    /// Packets per second a core running only the program would make
    /// (1 / [`Self::ns`]): the figure an XDP core would see.
    pub fn rate(&self) -> f64 {
        1e9 / self.ns()
    }

    /// Packets per second the loop made, syscalls included.
    pub fn wall_rate(&self) -> f64 {
        self.packets as f64 / self.wall.as_secs_f64()
    }
}

/// Frames of new flows to the `dsr-l2` VIP, from sources that never repeat
/// within a lane: flow `n` of lane `l` comes from 198.18.0.0/15 (RFC 2544's
/// benchmark range), address `l·65536 + n / 60000`, port `1024 + n % 60000`.
pub struct NewFlows {
    lane: u8,
    next: u32,
    frame: Vec<u8>,
}

impl NewFlows {
    /// Lane 0 or 1.
    pub fn new(lane: u8) -> Self {
        assert!(lane < 2, "198.18.0.0/15 holds two lanes");
        Self {
            lane,
            next: 0,
            frame: frame(&Self::flow(lane, 0), SYN),
        }
    }

    /// Flow `n` of `lane`.
    pub fn flow(lane: u8, n: u32) -> Flow {
        let addr = 0xc612_0000 | (u32::from(lane) << 16) | (n / PORTS);
        Flow {
            src: IpAddr::V4(Ipv4Addr::from(addr)),
            sport: (1024 + n % PORTS) as u16,
            ..Flow::tcp("0.0.0.0", 0, VIP_L2, 80)
        }
    }

    /// How many flows were handed out: the next one's `n`.
    pub fn position(&self) -> u32 {
        self.next
    }

    /// The SYN frame of the next flow: the template with its source address,
    /// port and header checksum rewritten.
    pub fn next_frame(&mut self) -> &[u8] {
        let n = self.next;
        assert!(n / PORTS < 1 << 16, "lane {} ran out of sources", self.lane);
        self.next += 1;
        let f = Self::flow(self.lane, n);
        let IpAddr::V4(src) = f.src else {
            unreachable!("lanes are IPv4")
        };
        let ip = &mut self.frame[IP_AT..];
        ip[12..16].copy_from_slice(&src.octets());
        ip[10..12].fill(0);
        let c = csum(&ip[..20]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        ip[20..22].copy_from_slice(&f.sport.to_be_bytes());
        &self.frame
    }
}

/// Conntrack entries of fresh flows for [`Load::Flood`], a batch at a time:
/// flow `n` of lane `l` comes from 100.64.0.0/10 (RFC 6598), address
/// `l·2²¹ + n / 60000`, port `1024 + n % 60000`, to the `dsr-l2` VIP.
struct FloodKeys {
    lane: u8,
    next: u32,
    batch: Vec<(FlowKey, CtEntry)>,
}

impl FloodKeys {
    fn new(lane: u8) -> Self {
        Self {
            lane,
            next: 0,
            batch: Vec::with_capacity(FLOOD_BATCH),
        }
    }

    fn next_batch(&mut self) -> &[(FlowKey, CtEntry)] {
        let entry = CtEntry {
            backend_id: 1,
            vip_id: 1,
            ..CtEntry::default()
        };
        self.batch.clear();
        for _ in 0..FLOOD_BATCH {
            let n = self.next;
            assert!(n / PORTS < 1 << 21, "lane {} ran out of sources", self.lane);
            self.next += 1;
            let addr = 0x6440_0000 | (u32::from(self.lane) << 21) | (n / PORTS);
            let f = Flow {
                src: IpAddr::V4(Ipv4Addr::from(addr)),
                sport: (1024 + n % PORTS) as u16,
                ..Flow::tcp("0.0.0.0", 0, VIP_L2, 80)
            };
            self.batch.push((f.key(), entry));
        }
        &self.batch
    }
}

/// One core's part: its CPU, its new flows, its flood and its established
/// flows.
struct Lane {
    cpu: usize,
    flows: NewFlows,
    flood: FloodKeys,
    est: Vec<Flow>,
}

/// What a core's thread runs against: the program, its ingress interface
/// and its conntrack map.
#[derive(Clone, Copy)]
struct Target<'a> {
    prog: &'a Xdp,
    ifindex: u32,
    ct: BorrowedFd<'a>,
}

/// One `BPF_PROG_TEST_RUN` of `prog` on `frame` arriving on `ifindex`:
/// the verdict and the kernel's mean time per repeat.
fn run_xdp(t: Target<'_>, frame: &[u8], repeat: u32) -> anyhow::Result<(u32, Duration)> {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, ... (as
    // `World::run_repeat`).
    let md: [u32; 6] = [0, frame.len() as u32, 0, t.ifindex, 0, 0];
    let ctx: Vec<u8> = md.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let res = t.prog.test_run(TestRunOptions {
        data_in: Some(frame),
        ctx_in: Some(&ctx),
        repeat,
        ..Default::default()
    })?;
    Ok((res.return_value, res.duration))
}

/// One step of `load`: packets (or entries) and the time they took, by
/// the kernel's clock (a flood's by the thread's CPU time). Established steps take
/// the lane's flows in turn, `acks[i % EST_FLOWS]`.
fn step(
    t: Target<'_>,
    lane: &mut Lane,
    load: Load,
    acks: &[Vec<u8>],
    i: usize,
) -> anyhow::Result<(u64, Duration)> {
    let (frame, repeat) = match load {
        Load::NewFlows => (lane.flows.next_frame(), 1),
        Load::Established => (&acks[i % acks.len()][..], EST_REPEAT),
        Load::Flood => {
            let batch = lane.flood.next_batch();
            // The thread's CPU time, not the wall clock: time the scheduler
            // gives to other tasks mid-call is not the LRU's (a spinning
            // lock is, and counts).
            let t0 = thread_cpu();
            let n = update_batch(t.ct, batch).context("BPF_MAP_UPDATE_BATCH of XLB_CT")?;
            return Ok((u64::from(n), thread_cpu().saturating_sub(t0)));
        }
    };
    let (v, d) = run_xdp(t, frame, repeat)?;
    anyhow::ensure!(v == XDP_TX, "CPU {}: {load:?}: verdict {v}", lane.cpu);
    Ok((u64::from(repeat), d * repeat))
}

/// Pins the thread to the lane's CPU, readies `load` (the established
/// flows' SYNs on this CPU), waits for every core at `start`, then runs
/// `load` until the budget is spent.
fn drive(
    t: Target<'_>,
    lane: &mut Lane,
    load: Load,
    budget: Budget,
    start: &Barrier,
) -> anyhow::Result<Tally> {
    let ready = set_affinity(0, lane.cpu).and_then(|()| {
        if load == Load::Established {
            for f in &lane.est {
                let (v, _) = run_xdp(t, &frame(f, SYN), 1)?;
                anyhow::ensure!(v == XDP_TX, "established flow's SYN: verdict {v}");
            }
        }
        Ok(())
    });
    // Every core reaches the barrier, failed or not, or the others wait
    // forever.
    start.wait();
    ready?;
    let acks: Vec<Vec<u8>> = lane.est.iter().map(|f| frame(f, ACK)).collect();
    let t0 = Instant::now();
    let deadline = t0 + budget.window;
    let mut tally = Tally::default();
    let mut i = 0;
    while tally.packets < budget.packets && Instant::now() < deadline {
        let (packets, took) = step(t, lane, load, &acks, i)?;
        i += 1;
        tally.packets += packets;
        tally.kernel += took;
    }
    tally.wall = t0.elapsed();
    Ok(tally)
}

/// A conntrack layout, loaded: its world(s) and the two cores' lanes.
pub struct Layout {
    pub kind: Kind,
    /// One world both cores share, or one per core ([`Kind::MapPerCpu`]).
    worlds: Vec<SharedWorld>,
    /// Each world's conntrack map, for floods.
    cts: Vec<MapFd>,
    lanes: Vec<Lane>,
    /// The per-CPU map's pin directory, removed after the worlds.
    _pin: Option<PinnedCt>,
}

impl Layout {
    /// Loads `kind` with `ct_size` conntrack entries in all, the benchmark's
    /// VIPs and backends in every world.
    pub fn new(kind: Kind, ct_size: u32) -> anyhow::Result<Self> {
        let pin = match kind {
            Kind::PerCpu => Some(PinnedCt::new(kind.tag(), ct_size, NO_COMMON_LRU)?),
            Kind::Common | Kind::MapPerCpu => None,
        };
        let opts = LoadOptions {
            ct_size: if kind == Kind::MapPerCpu {
                ct_size / 2
            } else {
                ct_size
            },
            nat_size: lb_common::nat::DEFAULT_NAT_SIZE,
            ring_stride: lb_common::DEFAULT_TABLE_SIZE,
            pin_dir: pin.as_ref().map(|p| p.dir.clone()),
            kernel: None,
        };
        let count = if kind == Kind::MapPerCpu { 2 } else { 1 };
        let (mut worlds, mut cts) = (Vec::new(), Vec::new());
        for _ in 0..count {
            let world = SharedWorld::new(kind.tag(), &opts)?;
            cts.push(world.run(|w| {
                Flows::install(w)?;
                check_ct(w, kind, opts.ct_size)
            })?);
            worlds.push(world);
        }
        let lanes = (0..2u8)
            .map(|l| Lane {
                cpu: usize::from(l),
                flows: NewFlows::new(l),
                flood: FloodKeys::new(l),
                est: (0..EST_FLOWS)
                    .map(|p| Flow::tcp(&format!("192.0.2.{}", 10 + l), 40001 + p, VIP_L2, 80))
                    .collect(),
            })
            .collect();
        Ok(Self {
            kind,
            worlds,
            cts,
            lanes,
            _pin: pin,
        })
    }

    /// The index of the world core `cpu` runs in.
    fn world_of(&self, cpu: usize) -> usize {
        cpu.min(self.worlds.len() - 1)
    }

    /// Runs every `(core, load)` of `jobs` at once (cores 0 and 1, each at
    /// most once), each for `budget`; one tally per job, in order.
    pub fn run(&mut self, jobs: &[(usize, Load)], budget: Budget) -> anyhow::Result<Vec<Tally>> {
        let mut order: Vec<usize> = jobs.iter().map(|j| j.0).collect();
        order.dedup();
        anyhow::ensure!(
            order.len() == jobs.len() && order.iter().all(|&c| c < self.lanes.len()),
            "cores {order:?}: 0 and 1, each once"
        );
        let shared = self.worlds.len() == 1;
        let Self {
            worlds, cts, lanes, ..
        } = self;
        let start = &Barrier::new(jobs.len());
        let mut picked: Vec<(&mut Lane, Load)> = lanes
            .iter_mut()
            .filter_map(|l| jobs.iter().find(|j| j.0 == l.cpu).map(|j| (l, j.1)))
            .collect();
        picked.sort_by_key(|(l, _)| order.iter().position(|&c| c == l.cpu));
        if shared {
            // Both cores through one program and one set of maps; threads
            // spawned here inherit the world's namespace.
            let ct = cts[0].as_fd();
            return worlds[0].run(|w| {
                let ifindex = w.ifindex;
                let prog: &Xdp = w.dp.program::<Xdp>(lb_common::PROG_LB)?;
                let t = Target { prog, ifindex, ct };
                std::thread::scope(|s| {
                    let cores: Vec<_> = picked
                        .into_iter()
                        .map(|(lane, load)| s.spawn(move || drive(t, lane, load, budget, start)))
                        .collect();
                    cores.into_iter().map(join).collect()
                })
            });
        }
        std::thread::scope(|s| {
            let cores: Vec<_> = picked
                .into_iter()
                .map(|(lane, load)| {
                    let (world, ct) = (&worlds[lane.cpu], cts[lane.cpu].as_fd());
                    s.spawn(move || {
                        world.run(|w| {
                            let ifindex = w.ifindex;
                            let prog: &Xdp = w.dp.program::<Xdp>(lb_common::PROG_LB)?;
                            drive(Target { prog, ifindex, ct }, lane, load, budget, start)
                        })
                    })
                })
                .collect();
            cores.into_iter().map(join).collect()
        })
    }

    /// Where core `cpu`'s new flows are: flows handed out so far.
    pub fn position(&self, cpu: usize) -> u32 {
        self.lanes[cpu].flows.position()
    }

    /// How many of core `cpu`'s new flows `from..to` still have their
    /// conntrack entry (in the map core `cpu` writes).
    pub fn kept(&self, cpu: usize, from: u32, to: u32) -> anyhow::Result<u32> {
        self.worlds[self.world_of(cpu)].run(|w| {
            let mut kept = 0;
            for n in from..to {
                let key = NewFlows::flow(cpu as u8, n).key();
                if w.dp.ct_get(&key)?.is_some() {
                    kept += 1;
                }
            }
            Ok(kept)
        })
    }

    /// Empties every conntrack map.
    pub fn clear(&self) -> anyhow::Result<()> {
        for world in &self.worlds {
            world.run(|w| Ok(w.dp.ct_clear()?))?;
        }
        Ok(())
    }

    /// A counter summed over every world.
    pub fn stat(&self, stat: Stat) -> anyhow::Result<u64> {
        let mut sum = 0;
        for world in &self.worlds {
            sum += world.run(|w: &mut World| Ok(w.stats()?.get(&stat).copied().unwrap_or(0)))?;
        }
        Ok(sum)
    }
}

/// Checks that `xlb_lb` in `w` uses a conntrack map of `kind`'s flags and
/// `entries` (proof that a pinned per-CPU map was adopted), and returns it.
fn check_ct(w: &mut World, kind: Kind, entries: u32) -> anyhow::Result<MapFd> {
    let ct = MapInfo::from_id(w.lb_map_id(lb_common::MAP_CT)?)?;
    let want = if kind == Kind::PerCpu {
        NO_COMMON_LRU
    } else {
        0
    };
    // A per-CPU LRU's size is rounded up to a multiple of the possible
    // CPUs (kernel/bpf/hashtab.c, htab_map_alloc).
    let sized =
        ct.max_entries() == entries || (kind == Kind::PerCpu && ct.max_entries() >= entries);
    anyhow::ensure!(
        ct.map_flags() == want && sized,
        "{}: xlb_lb's XLB_CT has flags {:#x} and {} entries, want {want:#x} and {entries}",
        kind.name(),
        ct.map_flags(),
        ct.max_entries()
    );
    Ok(ct.fd()?)
}

fn join(h: std::thread::ScopedJoinHandle<'_, anyhow::Result<Tally>>) -> anyhow::Result<Tally> {
    h.join()
        .map_err(|_| anyhow::anyhow!("a benchmark core's thread panicked"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_flow_frames_are_the_builders_frames() {
        let mut flows = NewFlows::new(1);
        for n in 0..=PORTS + 1 {
            let got = flows.next_frame().to_vec();
            if n == 0 || n == PORTS - 1 || n == PORTS + 1 {
                assert_eq!(got, frame(&NewFlows::flow(1, n), SYN), "flow {n}");
            }
        }
        assert_eq!(flows.position(), PORTS + 2);
    }

    #[test]
    fn lanes_never_share_a_source() {
        let a = NewFlows::flow(0, 3 * PORTS + 7);
        let b = NewFlows::flow(1, 3 * PORTS + 7);
        assert_ne!(a.src, b.src);
        assert_eq!(a.src, "198.18.0.3".parse::<IpAddr>().unwrap());
        assert_eq!(b.src, "198.19.0.3".parse::<IpAddr>().unwrap());
        assert_eq!(a.sport, 1031);
    }
}
