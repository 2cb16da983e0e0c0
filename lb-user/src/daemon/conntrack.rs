//! The periodic conntrack walk: how full the table is, and how many
//! established flows each backend holds (what `xlb drain --wait` watches).
//!
//! The walk runs on a thread of its own, never on the main loop: at the
//! default size it reads a million entries, which must not hold up health
//! reports or admin commands. The main loop reads the latest result.

use crate::dataplane::{
    batch::{batch_unsupported, lookup_batch},
    ktime_coarse_ns,
};
use std::{
    collections::HashMap,
    io,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use lb_common::{CtEntry, FlowKey, PROTO_UDP};
use tracing::{debug, info, warn};

/// How often the table is walked when nobody is waiting for a drain.
pub(super) const PERIOD_IDLE: Duration = Duration::from_secs(10);

/// How often it is walked while a drain has a deadline or someone watches
/// one (`xlb drain --wait`): the flow count an operator watches fall, and
/// the count reported when the deadline passes, are at most this old.
pub(super) const PERIOD_DRAINING: Duration = Duration::from_secs(2);

/// A TCP entry counts as an established flow if it carried a packet within
/// this long (within [`CLOSE_GRACE`] once its client sent FIN or RST,
/// `CT_FLAG_CLOSING`).
/// The data plane keeps no other TCP state (it sees only the client's half
/// of a DSR connection, and removes nothing), so an entry outlives its
/// connection until the LRU evicts it; a client that vanished without FIN
/// or RST is counted until its `last_seen_ns` (refreshed at most every
/// `CT_TOUCH_INTERVAL_NS`) is this old. 30 s is the kernel's UDP timeout
/// and longer than the gap between requests of most keep-alive clients; a
/// connection idle for longer is not counted (but its packets still reach
/// the backend while it drains).
pub(super) const ACTIVE_WINDOW: Duration = Duration::from_secs(30);

/// A TCP entry whose client sent FIN or RST (`CT_FLAG_CLOSING`) still
/// counts as an established flow while it carried a packet within this
/// long. A FIN or RST is not authenticated: anyone who knows a flow's
/// addresses and ports can send one, and the mark alone would end the
/// flow's count (and a `drain --wait`) while the connection carries on.
/// A connection that really ended sends nothing more after its RST, and
/// only its last ACKs after its FIN; one that carries on refreshes
/// `last_seen_ns` (at most every `CT_TOUCH_INTERVAL_NS`, 1 s). So a
/// spoofed FIN or RST ends the count only of a flow that then stays silent
/// for 3 s, which a connection between requests may be; a real close is
/// counted 3 s late.
pub(super) const CLOSE_GRACE: Duration = Duration::from_secs(3);

/// A walk older than this is not reported (the walk keeps failing): better
/// "not counted" than a count that no longer moves.
pub(super) const STALE: Duration = Duration::from_secs(60);

/// How recent a packet must be for an entry to count as an established flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Window {
    pub tcp_ns: u64,
    pub udp_ns: u64,
}

impl Window {
    /// UDP entries by the data plane's own expiry (`daemon.udp_timeout`;
    /// 0 = never expires, then by [`ACTIVE_WINDOW`] like TCP).
    pub(super) fn new(udp_timeout_ns: u64) -> Self {
        let active = ACTIVE_WINDOW.as_nanos() as u64;
        Window {
            tcp_ns: active,
            udp_ns: if udp_timeout_ns == 0 {
                active
            } else {
                udp_timeout_ns
            },
        }
    }
}

/// What one walk found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct FlowCounts {
    /// Entries read, idle and stale ones included (`status` `conntrack.entries`).
    pub entries: u64,
    /// Established flows per (backend id, generation): a recycled id's new
    /// holder never inherits its predecessor's flows.
    pub per_backend: HashMap<(u32, u32), u64>,
    /// The walk stopped at its bound before the end of the table (entries
    /// moved under it while it ran); the counts are lower bounds.
    pub truncated: bool,
}

impl FlowCounts {
    /// Established flows of every backend.
    pub(super) fn established(&self) -> u64 {
        self.per_backend.values().sum()
    }

    /// Established flows of backend `id` in generation `generation`.
    pub(super) fn flows(&self, id: u32, generation: u32) -> u64 {
        self.per_backend
            .get(&(id, generation))
            .copied()
            .unwrap_or(0)
    }
}

/// Adds entries to a [`FlowCounts`], one at a time, up to a bound.
struct Counter {
    counts: FlowCounts,
    now_ns: u64,
    window: Window,
    limit: u64,
}

impl Counter {
    fn new(now_ns: u64, window: Window, limit: u64) -> Self {
        Counter {
            counts: FlowCounts::default(),
            now_ns,
            window,
            limit,
        }
    }

    /// Counts one entry; `false` once the bound is reached (stop walking).
    fn add(&mut self, key: &FlowKey, e: &CtEntry) -> bool {
        if self.counts.entries >= self.limit {
            self.counts.truncated = true;
            return false;
        }
        self.counts.entries += 1;
        // `last_seen_ns` of another CPU may be a tick ahead of our clock.
        let idle = self.now_ns.saturating_sub(e.last_seen_ns);
        let window = if key.proto == PROTO_UDP {
            self.window.udp_ns
        } else {
            self.window.tcp_ns
        };
        // The client sent FIN or RST: the connection is ending, once it
        // falls silent (`CLOSE_GRACE`: the FIN or RST may be spoofed).
        let window = if e.flags & lb_common::CT_FLAG_CLOSING != 0 {
            window.min(CLOSE_GRACE.as_nanos() as u64)
        } else {
            window
        };
        if idle <= window {
            *self
                .counts
                .per_backend
                .entry((e.backend_id, e.generation))
                .or_default() += 1;
        }
        true
    }
}

/// Counts `entries` as of `now_ns` (CLOCK_MONOTONIC_COARSE, the data
/// plane's clock), reading at most `limit` of them.
pub(super) fn count_flows(
    entries: impl IntoIterator<Item = (FlowKey, CtEntry)>,
    now_ns: u64,
    window: Window,
    limit: u64,
) -> FlowCounts {
    let mut c = Counter::new(now_ns, window, limit);
    for (k, e) in entries {
        if !c.add(&k, &e) {
            break;
        }
    }
    c.counts
}

/// The latest walk, as the main loop sees it.
#[derive(Clone, Debug)]
pub(super) struct Walk {
    /// When it began (entries it counted were read after this).
    pub started: Instant,
    /// When it finished.
    pub at: Instant,
    pub counts: Arc<FlowCounts>,
}

/// What the walking thread and the main loop share.
#[derive(Debug, Default)]
pub(super) struct Shared {
    latest: Mutex<Option<Walk>>,
    /// Walk every [`PERIOD_DRAINING`] instead of [`PERIOD_IDLE`].
    fast: AtomicBool,
    /// `daemon.udp_timeout` in ns (it can change on reload).
    udp_timeout_ns: AtomicU64,
    /// Established NAT flows per (backend id, generation), from the NAT
    /// sweep (`nat_sweep`): NAT flows never enter `XLB_CT`, so they are
    /// added to every walk's counts.
    nat: Mutex<HashMap<(u32, u32), u64>>,
}

impl Shared {
    /// The latest walk; `None` until the first one finishes, or when the
    /// last one to finish is older than [`STALE`].
    pub(super) fn latest(&self) -> Option<Walk> {
        let mut walk = self
            .latest
            .lock()
            .ok()
            .and_then(|l| l.clone())
            .filter(|w| w.at.elapsed() < STALE)?;
        if let Ok(nat) = self.nat.lock()
            && !nat.is_empty()
        {
            let mut counts = (*walk.counts).clone();
            for (k, n) in nat.iter() {
                *counts.per_backend.entry(*k).or_default() += n;
            }
            walk.counts = Arc::new(counts);
        }
        Some(walk)
    }

    /// The NAT sweep's latest established flows per backend.
    pub(super) fn set_nat_flows(&self, per_backend: HashMap<(u32, u32), u64>) {
        if let Ok(mut nat) = self.nat.lock() {
            *nat = per_backend;
        }
    }

    pub(super) fn set_fast(&self, fast: bool) {
        self.fast.store(fast, Ordering::Relaxed);
    }

    pub(super) fn set_udp_timeout(&self, t: Duration) {
        self.udp_timeout_ns
            .store(t.as_nanos() as u64, Ordering::Relaxed);
    }

    fn period(&self) -> Duration {
        if self.fast.load(Ordering::Relaxed) {
            PERIOD_DRAINING
        } else {
            PERIOD_IDLE
        }
    }

    fn publish(&self, started: Instant, counts: FlowCounts) {
        if let Ok(mut l) = self.latest.lock() {
            *l = Some(Walk {
                started,
                at: Instant::now(),
                counts: Arc::new(counts),
            });
        }
    }
}

/// Walks the pinned conntrack map at `pin` for the life of the process,
/// reading at most `limit` entries (its `conntrack_size`) per walk, and
/// publishes each result to `shared` and the entry count to `entries`.
pub(super) fn spawn(pin: PathBuf, limit: u32, entries: Arc<AtomicU64>, shared: Arc<Shared>) {
    let spawned = std::thread::Builder::new()
        .name("xlb-conntrack".into())
        .spawn(move || walk_for_ever(&pin, u64::from(limit), &entries, &shared));
    if let Err(e) = spawned {
        warn!("conntrack fill and flows per backend will not be reported: starting a thread: {e}");
    }
}

/// The walking thread: opens the map, then walks it every period.
fn walk_for_ever(pin: &Path, limit: u64, entries: &AtomicU64, shared: &Shared) {
    let map = match aya::maps::MapData::from_pin(pin) {
        Ok(m) => aya::maps::Map::LruHashMap(m),
        Err(e) => {
            warn!(
                "conntrack fill and flows per backend will not be reported: opening {}: {e}",
                pin.display()
            );
            return;
        }
    };
    let Ok(ct) = aya::maps::HashMap::<_, FlowKey, CtEntry>::try_from(&map) else {
        warn!(
            "conntrack fill and flows per backend will not be reported: {} is not the conntrack map",
            pin.display()
        );
        return;
    };
    let aya::maps::Map::LruHashMap(data) = &map else {
        return;
    };
    let mut walker = Walker {
        pin,
        data,
        ct,
        limit,
        batch: true,
        last_error: String::new(),
    };
    loop {
        let started = Instant::now();
        let window = Window::new(shared.udp_timeout_ns.load(Ordering::Relaxed));
        if let Some(counts) = walker.walk(window) {
            debug!(
                entries = counts.entries,
                took_ms = started.elapsed().as_millis() as u64,
                "conntrack walked"
            );
            entries.store(counts.entries, Ordering::Relaxed);
            shared.publish(started, counts);
        }
        // Re-read the period while sleeping: a drain with a deadline
        // should not wait out a 10 s sleep for its first fresh count.
        loop {
            let left = shared.period().saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(250)));
        }
    }
}

/// The conntrack map as the walking thread reads it, and what it learnt
/// between walks.
struct Walker<'m> {
    pin: &'m Path,
    data: &'m aya::maps::MapData,
    ct: aya::maps::HashMap<&'m aya::maps::MapData, FlowKey, CtEntry>,
    limit: u64,
    /// Whether to try `BPF_MAP_LOOKUP_BATCH` (until the kernel says it
    /// has none for this map type).
    batch: bool,
    /// The last error logged: each distinct error once, not every walk.
    last_error: String,
}

impl Walker<'_> {
    /// One walk; `None` if it failed (logged).
    fn walk(&mut self, window: Window) -> Option<FlowCounts> {
        let mut c = Counter::new(ktime_coarse_ns(), window, self.limit);
        let mut result = Ok(());
        if self.batch {
            result = lookup_batch(self.data, |k, v| c.add(k, v));
            if let Err(e) = &result
                && c.counts.entries == 0
                && batch_unsupported(e)
            {
                info!(
                    "conntrack walk: this kernel has no BPF_MAP_LOOKUP_BATCH for LRU hash maps ({e}); \
                     walking key by key instead (two syscalls per entry)"
                );
                self.batch = false;
            }
        }
        if !self.batch {
            let now = ktime_coarse_ns();
            result = walk_keys(&self.ct, now, window, self.limit).map(|counts| c.counts = counts);
        }
        match result {
            Ok(()) => {
                self.last_error.clear();
                Some(c.counts)
            }
            Err(e) => {
                let text = e.to_string();
                if text != self.last_error {
                    warn!("walking conntrack {}: {text}", self.pin.display());
                    self.last_error = text;
                }
                None
            }
        }
    }
}

/// Walks the map key by key (kernels before 5.6).
fn walk_keys(
    ct: &aya::maps::HashMap<&aya::maps::MapData, FlowKey, CtEntry>,
    now_ns: u64,
    window: Window,
    limit: u64,
) -> io::Result<FlowCounts> {
    let mut failed = None;
    let entries = ct
        .iter()
        .map_while(|item| item.map_err(|e| failed = Some(e)).ok());
    let counts = count_flows(entries, now_ns, window, limit);
    match failed {
        Some(e) => Err(io::Error::other(e)),
        None => Ok(counts),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lb_common::PROTO_TCP;

    const S: u64 = 1_000_000_000;

    type Case = (
        &'static str,
        Vec<(FlowKey, CtEntry)>,
        u64,
        Vec<((u32, u32), u64)>,
        bool,
    );

    fn entry(
        client_port: u16,
        proto: u8,
        id: u32,
        generation: u32,
        last_seen_ns: u64,
    ) -> (FlowKey, CtEntry) {
        let key = FlowKey::new(
            format!("192.0.2.1:{client_port}").parse().unwrap(),
            "10.100.0.1:80".parse().unwrap(),
            proto,
        );
        let e = CtEntry {
            backend_id: id,
            generation,
            vip_id: 0,
            flags: 0,
            last_seen_ns,
        };
        (key, e)
    }

    /// A TCP entry of backend 1 (generation 1) marked closing, last seen
    /// at `last_seen_ns`.
    fn closing(client_port: u16, last_seen_ns: u64) -> (FlowKey, CtEntry) {
        let (k, mut e) = entry(client_port, PROTO_TCP, 1, 1, last_seen_ns);
        e.flags = lb_common::CT_FLAG_CLOSING;
        (k, e)
    }

    #[test]
    fn counts_established_flows_per_backend_and_generation() {
        let now = 1000 * S;
        let window = Window::new(10 * S);
        // (name, entries, bound, flows per backend, truncated)
        let cases: Vec<Case> = vec![
            ("empty table", vec![], 10, vec![], false),
            (
                "two backends",
                vec![
                    entry(1, PROTO_TCP, 1, 1, now),
                    entry(2, PROTO_TCP, 1, 1, now - S),
                    entry(3, PROTO_TCP, 2, 5, now),
                ],
                10,
                vec![((1, 1), 2), ((2, 5), 1)],
                false,
            ),
            (
                "a recycled id keeps its generations apart",
                vec![
                    entry(1, PROTO_TCP, 1, 1, now),
                    entry(2, PROTO_TCP, 1, 2, now),
                ],
                10,
                vec![((1, 1), 1), ((1, 2), 1)],
                false,
            ),
            (
                "tcp idle past the active window is not a flow, but an entry",
                vec![
                    entry(1, PROTO_TCP, 1, 1, now - 30 * S),
                    entry(2, PROTO_TCP, 1, 1, now - 30 * S - 1),
                ],
                10,
                vec![((1, 1), 1)],
                false,
            ),
            (
                "a flow whose client sent FIN or RST has ended once silent for 3 s",
                vec![entry(1, PROTO_TCP, 1, 1, now), closing(2, now - 3 * S - 1)],
                10,
                vec![((1, 1), 1)],
                false,
            ),
            (
                "a closing flow that still carries packets counts (the FIN or RST may be spoofed)",
                vec![closing(1, now), closing(2, now - 3 * S)],
                10,
                vec![((1, 1), 2)],
                false,
            ),
            (
                "udp by udp_timeout",
                vec![
                    entry(1, PROTO_UDP, 1, 1, now - 10 * S),
                    entry(2, PROTO_UDP, 1, 1, now - 11 * S),
                ],
                10,
                vec![((1, 1), 1)],
                false,
            ),
            (
                "last seen after now (another CPU's clock) counts",
                vec![entry(1, PROTO_TCP, 3, 1, now + S)],
                10,
                vec![((3, 1), 1)],
                false,
            ),
            (
                "bounded",
                vec![
                    entry(1, PROTO_TCP, 1, 1, now),
                    entry(2, PROTO_TCP, 1, 1, now),
                    entry(3, PROTO_TCP, 1, 1, now),
                ],
                2,
                vec![((1, 1), 2)],
                true,
            ),
            (
                "exactly at the bound is complete",
                vec![
                    entry(1, PROTO_TCP, 1, 1, now),
                    entry(2, PROTO_TCP, 1, 1, now),
                ],
                2,
                vec![((1, 1), 2)],
                false,
            ),
        ];
        for (name, entries, limit, want, truncated) in cases {
            let n = entries.len() as u64;
            let got = count_flows(entries, now, window, limit);
            let want: HashMap<(u32, u32), u64> = want.into_iter().collect();
            assert_eq!(got.per_backend, want, "{name}");
            assert_eq!(got.entries, n.min(limit), "{name}");
            assert_eq!(got.truncated, truncated, "{name}");
        }
    }

    #[test]
    fn flows_of_an_unknown_backend_are_zero() {
        let now = 100 * S;
        let c = count_flows([entry(1, PROTO_TCP, 7, 2, now)], now, Window::new(0), 10);
        assert_eq!(c.flows(7, 2), 1);
        assert_eq!(c.flows(7, 3), 0, "the next holder of the id");
        assert_eq!(c.flows(8, 2), 0);
    }

    #[test]
    fn udp_without_timeout_uses_the_active_window() {
        assert_eq!(
            Window::new(0),
            Window {
                tcp_ns: 30 * S,
                udp_ns: 30 * S
            }
        );
        assert_eq!(Window::new(5 * S).udp_ns, 5 * S);
    }

    /// The batch walk against a real LRU hash map, checked against aya's
    /// key-by-key iteration. Needs root (CAP_BPF); says so and passes
    /// without it, as the netns tests do.
    #[test]
    fn batch_walk_reads_every_entry() {
        let Some(mut map) = lru_map(65_536) else {
            eprintln!("skipped: creating a BPF map needs root");
            return;
        };
        let mut ct = aya::maps::HashMap::<_, FlowKey, CtEntry>::try_from(&mut map).unwrap();
        let now = crate::dataplane::ktime_coarse_ns();
        // More than one batch, spread over three backends.
        let n = 3 * crate::dataplane::batch::BATCH as u32 + 17;
        for i in 0..n {
            let key = FlowKey::new(
                std::net::SocketAddr::from(([192, 0, 2, (i % 200) as u8], (i / 200) as u16 + 1)),
                "10.100.0.1:80".parse().unwrap(),
                PROTO_TCP,
            );
            let e = CtEntry {
                backend_id: i % 3 + 1,
                generation: 1,
                vip_id: 0,
                flags: 0,
                last_seen_ns: now,
            };
            ct.insert(key, e, 0).unwrap();
        }
        let aya::maps::Map::LruHashMap(data) = &map else {
            unreachable!()
        };
        let mut batch = Counter::new(now, Window::new(0), 1_000_000);
        lookup_batch(data, |k, v| batch.add(k, v)).unwrap();
        let ro = aya::maps::HashMap::<_, FlowKey, CtEntry>::try_from(&map).unwrap();
        let keys = walk_keys(&ro, now, Window::new(0), 1_000_000).unwrap();
        assert_eq!(batch.counts.entries, u64::from(n));
        assert_eq!(batch.counts, keys);
        assert_eq!(
            batch.counts.flows(1, 1) + batch.counts.flows(2, 1) + batch.counts.flows(3, 1),
            u64::from(n)
        );
        // The bound holds across batches.
        let mut bounded = Counter::new(now, Window::new(0), 5000);
        lookup_batch(data, |k, v| bounded.add(k, v)).unwrap();
        assert_eq!(bounded.counts.entries, 5000);
        assert!(bounded.counts.truncated);
    }

    /// A fresh LRU hash map of conntrack's key and value sizes; `None`
    /// without the privilege to make one.
    fn lru_map(max_entries: u32) -> Option<aya::maps::Map> {
        const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
        crate::dataplane::batch::test_map(
            BPF_MAP_TYPE_LRU_HASH,
            std::mem::size_of::<FlowKey>() as u32,
            std::mem::size_of::<CtEntry>() as u32,
            max_entries,
        )
        .map(aya::maps::Map::LruHashMap)
    }
}
