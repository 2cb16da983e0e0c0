//! The NAT sweep (issue 27): the NAT flow maps are plain hashes (a live
//! flow is never evicted to make room), so entries past
//! [`NatFlow::expires`] stay until the data plane reuses their port or
//! this thread deletes them. Every [`PERIOD`] it walks `XLB_NAT_FLOWS`,
//! counts what is live (per VIP; established flows per backend, which
//! `xlb drain --wait` watches in place of conntrack for NAT VIPs), and
//! deletes at most [`SWEEP_MAX`] expired flows: the reply key first, then
//! the flow, so a reply key never points at nothing for long. Every
//! [`ORPHAN_EVERY`] walks it also deletes reply keys whose flow is gone
//! (a flow of a backend id since recycled cannot name its reply key).
//!
//! Like the conntrack walk it runs on a thread of its own, reading the
//! pinned maps, so a full map never holds up the main loop.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use aya::maps::{Array, HashMap as BpfHash, Map, MapData};
use lb_common::nat::{
    MAP_NAT_FLOWS, MAP_NAT_POOL, MAP_NAT_REPLY, NAT_TCP_ESTABLISHED, NatFlow, NatPool, reply_key,
};
use lb_common::{BackendInfo, FlowKey, MAX_VIPS};
use tracing::{debug, warn};

use crate::dataplane::{batch::lookup_batch, ktime_coarse_ns};
use crate::health::passive::sources::{Failing, FlowEvidence};

/// How often the flow map is walked and swept.
pub(super) const PERIOD: Duration = Duration::from_secs(1);

/// Expired flows deleted per walk at most: three syscalls each (re-read,
/// reply, flow), so a walk stays well under its period even when a burst
/// of flows expires at once; the rest go on the next walks.
pub(super) const SWEEP_MAX: usize = 16_384;

/// Walks between two searches for orphaned reply keys. A reply key is
/// deleted only if it was orphaned in two searches in a row: the data
/// plane may write a new flow's reply key an instant before its flow.
pub(super) const ORPHAN_EVERY: u32 = 10;

/// A walk older than this is not reported (the walk keeps failing).
const STALE: Duration = Duration::from_secs(30);

/// Share of `daemon.nat_size` (in quarters) from which the sweep also
/// removes embryonic flows (`NatFlow::embryonic`: a handshake the client
/// has not completed, a UDP flow never answered) older than
/// [`EMBRYONIC_GRACE`]. The data plane evicts them itself from a full
/// pool, but not from a full map: a `preserve_client` VIP's flows have no
/// pool, and a flood from forged sources would otherwise fill the map for
/// `tcp_syn_timeout`.
pub(super) const PRESSURE_QUARTERS: u64 = 3;

/// How old an embryonic flow must be before the sweep removes it under
/// pressure: far beyond a real client's round trip, so a real handshake
/// in progress completes first.
pub(super) const EMBRYONIC_GRACE: Duration = Duration::from_secs(2);

/// What one walk of `XLB_NAT_FLOWS` found, and the sweep's running totals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct NatCounts {
    /// Entries of `XLB_NAT_FLOWS` read, expired ones included.
    pub entries: u64,
    /// Unexpired flows per VIP id.
    pub per_vip: HashMap<u32, u64>,
    /// Unexpired embryonic flows per VIP id (among `per_vip`).
    pub embryonic_per_vip: HashMap<u32, u64>,
    /// Unexpired established TCP flows per (backend id, generation).
    pub per_backend: HashMap<(u32, u32), u64>,
    /// Expired flows found, to delete (at most the walk's bound).
    pub expired: Vec<(FlowKey, NatFlow)>,
    /// Unexpired embryonic flows older than [`EMBRYONIC_GRACE`], oldest
    /// first once sorted: what the sweep removes under pressure (at most
    /// the walk's bound).
    pub embryonic: Vec<(FlowKey, NatFlow)>,
    /// Expired flows found beyond the bound (left for the next walks).
    pub expired_left: u64,
    /// The flows failing now, by backend and client prefix (passive
    /// detection's sources).
    pub evidence: FlowEvidence,
}

/// The pool of each VIP id, as the data plane reads it.
pub(super) type Pools = [NatPool; MAX_VIPS as usize];

/// Sorts `entries` at `now_ns` (the data plane's coarse clock): live ones
/// counted, up to `max_expired` expired ones listed for deletion. An entry
/// of a VIP id whose pool is zeroed (the VIP is gone) expires at once.
pub(super) fn classify(
    entries: impl IntoIterator<Item = (FlowKey, NatFlow)>,
    pools: &Pools,
    now_ns: u64,
    max_expired: usize,
) -> NatCounts {
    let mut c = NatCounts::default();
    let entries: Vec<(FlowKey, NatFlow)> = entries.into_iter().collect();
    for &(key, flow) in &entries {
        c.add(key, flow, pools, now_ns, max_expired);
    }
    c.evidence.finish(&entries);
    c
}

impl NatCounts {
    fn add(&mut self, key: FlowKey, flow: NatFlow, pools: &Pools, now_ns: u64, max: usize) {
        self.entries += 1;
        let pool = pools.get(flow.vip_id as usize).copied().unwrap_or_default();
        if flow.expires(&pool) <= now_ns {
            if self.expired.len() < max {
                self.expired.push((key, flow));
            } else {
                self.expired_left += 1;
            }
            return;
        }
        *self.per_vip.entry(flow.vip_id).or_default() += 1;
        self.evidence.add(&key, &flow, &pool, now_ns);
        if flow.embryonic() {
            *self.embryonic_per_vip.entry(flow.vip_id).or_default() += 1;
            let grace = EMBRYONIC_GRACE.as_nanos() as u64;
            if now_ns.saturating_sub(flow.last_seen_ns) >= grace && self.embryonic.len() < max {
                self.embryonic.push((key, flow));
            }
        }
        if flow.state == NAT_TCP_ESTABLISHED {
            *self
                .per_backend
                .entry((flow.backend_id, flow.generation))
                .or_default() += 1;
        }
    }
}

/// Reply keys to delete now: orphaned in this search (`replies` whose
/// client key is not in `flows`) and in the previous one (`suspects`,
/// which this replaces with this search's orphans).
pub(super) fn orphans(
    replies: impl IntoIterator<Item = (FlowKey, FlowKey)>,
    flows: &HashSet<FlowKey>,
    suspects: &mut HashSet<FlowKey>,
) -> Vec<FlowKey> {
    let now: HashSet<FlowKey> = replies
        .into_iter()
        .filter(|(_, client)| !flows.contains(client))
        .map(|(reply, _)| reply)
        .collect();
    let delete = now.intersection(suspects).copied().collect();
    *suspects = now;
    delete
}

/// What the sweep thread shares with the main loop.
#[derive(Debug, Default)]
pub(super) struct Shared {
    latest: Mutex<Option<NatWalk>>,
    /// Set by [`Shared::walk_soon`]: the sweep walks again as soon as
    /// [`MIN_GAP`] allows rather than at its period.
    soon: Mutex<bool>,
    wake: Condvar,
}

/// Least time between the starts of two walks asked for early.
const MIN_GAP: Duration = Duration::from_millis(200);

/// The latest walk as the main loop sees it.
#[derive(Clone, Debug, Default)]
pub(super) struct NatWalk {
    /// When the walk began reading the flows, and when it ended.
    pub started: Option<Instant>,
    pub at: Option<Instant>,
    /// Entries in `XLB_NAT_FLOWS`.
    pub entries: u64,
    /// Unexpired flows per VIP id.
    pub per_vip: HashMap<u32, u64>,
    /// Unexpired embryonic flows per VIP id (among `per_vip`).
    pub embryonic_per_vip: HashMap<u32, u64>,
    /// Unexpired established flows per (backend id, generation).
    pub per_backend: HashMap<(u32, u32), u64>,
    /// Flows failing as the walk read them, per (backend id, generation)
    /// and client prefix ([`FlowEvidence::failing`]).
    pub failing: HashMap<(u32, u32), Failing>,
    /// Expired flows deleted since the daemon started.
    pub swept: u64,
    /// Embryonic flows deleted under pressure since the daemon started.
    pub embryonic_swept: u64,
    /// Orphaned reply keys deleted since the daemon started.
    pub orphans: u64,
}

impl Shared {
    /// The latest walk; `None` before the first or when the last one is
    /// older than [`STALE`].
    pub(super) fn latest(&self) -> Option<NatWalk> {
        self.latest
            .lock()
            .ok()
            .and_then(|l| l.clone())
            .filter(|w| w.at.is_some_and(|at| at.elapsed() < STALE))
    }

    fn publish(&self, walk: NatWalk) {
        if let Ok(mut l) = self.latest.lock() {
            *l = Some(walk);
        }
    }

    /// Asks for a walk now (passive detection waits for the sources of a
    /// verdict): the sweep starts one within [`MIN_GAP`] of its last.
    pub(super) fn walk_soon(&self) {
        if let Ok(mut soon) = self.soon.lock() {
            *soon = true;
            self.wake.notify_one();
        }
    }

    /// Waits until `deadline`, or until a walk is asked for (but not
    /// before `earliest`).
    fn wait(&self, earliest: Instant, deadline: Instant) {
        let Ok(mut soon) = self.soon.lock() else {
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            return;
        };
        loop {
            let now = Instant::now();
            if now >= deadline || (*soon && now >= earliest) {
                break;
            }
            let until = if *soon { earliest } else { deadline };
            match self.wake.wait_timeout(soon, until - now) {
                Ok((guard, _)) => soon = guard,
                Err(_) => return,
            }
        }
        *soon = false;
    }
}

/// Sweeps the NAT maps pinned in `pin_dir` for the life of the process.
pub(super) fn spawn(
    pin_dir: PathBuf,
    shared: Arc<Shared>,
    on_walk: impl Fn(&NatWalk) + Send + 'static,
) {
    let spawned = std::thread::Builder::new()
        .name("xlb-nat-sweep".into())
        .spawn(move || match Maps::open(&pin_dir) {
            Ok(maps) => sweep_for_ever(maps, &shared, &on_walk),
            Err(e) => warn!(
                "NAT flows will not be swept or counted: opening the maps in {}: {e}",
                pin_dir.display()
            ),
        });
    if let Err(e) = spawned {
        warn!("NAT flows will not be swept or counted: starting a thread: {e}");
    }
}

/// The pinned maps the sweep (and a deny entry's purge, `nat_purge`)
/// reads and deletes from.
pub(super) struct Maps {
    pub(super) flows_raw: MapData,
    pub(super) flows: BpfHash<MapData, FlowKey, NatFlow>,
    reply_raw: MapData,
    reply: BpfHash<MapData, FlowKey, FlowKey>,
    pools: Array<MapData, NatPool>,
    backends: Array<MapData, BackendInfo>,
    /// Entries `XLB_NAT_FLOWS` holds at most (`daemon.nat_size`).
    capacity: u64,
}

impl Maps {
    pub(super) fn open(dir: &Path) -> anyhow::Result<Self> {
        let data = |name: &str| MapData::from_pin(dir.join(name));
        let flows_raw = data(MAP_NAT_FLOWS)?;
        let capacity = u64::from(flows_raw.info()?.max_entries());
        Ok(Self {
            capacity,
            flows_raw,
            flows: Map::HashMap(data(MAP_NAT_FLOWS)?).try_into()?,
            reply_raw: data(MAP_NAT_REPLY)?,
            reply: Map::HashMap(data(MAP_NAT_REPLY)?).try_into()?,
            pools: Map::Array(data(MAP_NAT_POOL)?).try_into()?,
            backends: Map::Array(data(lb_common::MAP_BACKENDS)?).try_into()?,
        })
    }

    fn pools(&self) -> anyhow::Result<Pools> {
        let mut out = [NatPool::default(); MAX_VIPS as usize];
        for (id, p) in out.iter_mut().enumerate() {
            *p = self.pools.get(&(id as u32), 0)?;
        }
        Ok(out)
    }

    /// Deletes one expired flow (or, if `embryonic`, one still embryonic
    /// and older than [`EMBRYONIC_GRACE`]) if it still is: its reply key
    /// (if it still names this flow), then the flow. Whether it was
    /// deleted.
    fn reclaim(&mut self, key: &FlowKey, pools: &Pools, embryonic: bool) -> anyhow::Result<bool> {
        // The data plane may have refreshed it, completed its handshake,
        // or reused its port for a new flow, since the walk read it.
        let Ok(flow) = self.flows.get(key, 0) else {
            return Ok(false);
        };
        let pool = pools.get(flow.vip_id as usize).copied().unwrap_or_default();
        let now = ktime_coarse_ns();
        let gone = if embryonic {
            flow.embryonic()
                && now.saturating_sub(flow.last_seen_ns) >= EMBRYONIC_GRACE.as_nanos() as u64
        } else {
            flow.expires(&pool) <= now
        };
        if !gone {
            return Ok(false);
        }
        self.remove(key, &flow)
    }

    /// Deletes flow `flow` of client key `key`: its reply key, if it still
    /// names this flow (a recycled backend id's is the orphan search's),
    /// then the flow. Whether the flow was still there.
    pub(super) fn remove(&mut self, key: &FlowKey, flow: &NatFlow) -> anyhow::Result<bool> {
        let backend = self.backends.get(&flow.backend_id, 0)?;
        if backend.generation == flow.generation {
            let rk = reply_key(key, flow, &backend.addr);
            if self.reply.get(&rk, 0).ok() == Some(*key) {
                let _ = self.reply.remove(&rk);
            }
        }
        Ok(self.flows.remove(key).is_ok())
    }
}

/// The sweep's loop: walk, delete, publish, sleep.
fn sweep_for_ever(mut maps: Maps, shared: &Shared, on_walk: &dyn Fn(&NatWalk)) {
    let mut totals = NatWalk::default();
    let mut suspects = HashSet::new();
    let mut last_error = String::new();
    for round in 0u32.. {
        let started = Instant::now();
        match walk_once(
            &mut maps,
            &mut totals,
            &mut suspects,
            round % ORPHAN_EVERY == 0,
        ) {
            Ok(()) => {
                last_error.clear();
                totals.at = Some(Instant::now());
                on_walk(&totals);
                shared.publish(totals.clone());
                debug!(
                    entries = totals.entries,
                    took_ms = started.elapsed().as_millis() as u64,
                    "NAT flows swept"
                );
            }
            Err(e) => {
                let text = format!("{e:#}");
                if text != last_error {
                    warn!("sweeping the NAT flows: {text}");
                    last_error = text;
                }
            }
        }
        shared.wait(started + MIN_GAP, started + PERIOD);
    }
}

/// One walk: count, delete what expired, and now and then the orphans.
fn walk_once(
    maps: &mut Maps,
    totals: &mut NatWalk,
    suspects: &mut HashSet<FlowKey>,
    orphan_round: bool,
) -> anyhow::Result<()> {
    let pools = maps.pools()?;
    totals.started = Some(Instant::now());
    let now = ktime_coarse_ns();
    let mut entries = Vec::new();
    lookup_batch::<FlowKey, NatFlow>(&maps.flows_raw, |k, v| {
        entries.push((*k, *v));
        true
    })?;
    let keys: HashSet<FlowKey> = if orphan_round {
        entries.iter().map(|(k, _)| *k).collect()
    } else {
        HashSet::new()
    };
    let counts = classify(entries, &pools, now, SWEEP_MAX);
    for (key, _) in &counts.expired {
        if maps.reclaim(key, &pools, false)? {
            totals.swept += 1;
        }
    }
    for (key, _) in under_pressure(&counts, maps.capacity) {
        if maps.reclaim(key, &pools, true)? {
            totals.embryonic_swept += 1;
        }
    }
    if orphan_round {
        let mut replies = Vec::new();
        lookup_batch::<FlowKey, FlowKey>(&maps.reply_raw, |k, v| {
            replies.push((*k, *v));
            true
        })?;
        for rk in orphans(replies, &keys, suspects) {
            if let Ok(client) = maps.reply.get(&rk, 0)
                && maps.flows.get(&client, 0).is_err()
                && maps.reply.remove(&rk).is_ok()
            {
                totals.orphans += 1;
            }
        }
    }
    totals.entries = counts.entries;
    totals.per_vip = counts.per_vip;
    totals.embryonic_per_vip = counts.embryonic_per_vip;
    totals.per_backend = counts.per_backend;
    totals.failing = counts.evidence.failing;
    Ok(())
}

/// The embryonic flows a walk that found `counts` removes: none while the
/// unexpired flows fill less than [`PRESSURE_QUARTERS`] of `capacity`;
/// above, the oldest, as many as bring it back under (at most those the
/// walk listed).
pub(super) fn under_pressure(counts: &NatCounts, capacity: u64) -> Vec<&(FlowKey, NatFlow)> {
    let live = counts.entries - counts.expired.len() as u64 - counts.expired_left;
    let threshold = capacity / 4 * PRESSURE_QUARTERS;
    if live < threshold {
        return Vec::new();
    }
    let mut oldest: Vec<_> = counts.embryonic.iter().collect();
    oldest.sort_by_key(|(_, f)| f.last_seen_ns);
    // Down to an eighth under the threshold, so a steady flood does not
    // leave the map at its edge between walks.
    let excess = (live - threshold + capacity / 8) as usize;
    oldest.truncate(excess);
    oldest
}

#[cfg(test)]
mod tests {
    use lb_common::nat::{
        NAT_FLAG_ANSWERED, NAT_TCP_CLOSED, NAT_TCP_FIN_WAIT, NAT_TCP_SYN_RECV, NAT_TCP_SYN_SENT,
        NAT_UDP,
    };
    use lb_common::{PROTO_TCP, PROTO_UDP};

    use super::*;

    const S: u64 = 1_000_000_000;

    fn pools() -> Pools {
        let mut p = [NatPool::default(); MAX_VIPS as usize];
        p[1] = NatPool {
            count: 1,
            tcp_syn_timeout_ns: 60 * S,
            tcp_established_timeout_ns: 7200 * S,
            tcp_fin_timeout_ns: 120 * S,
            tcp_close_timeout_ns: 10 * S,
            udp_timeout_ns: 30 * S,
            ..NatPool::default()
        };
        p
    }

    fn flow(port: u16, vip: u32, state: u8, last_seen_s: u64) -> (FlowKey, NatFlow) {
        let proto = if state == NAT_UDP {
            PROTO_UDP
        } else {
            PROTO_TCP
        };
        let client = std::net::SocketAddr::new("192.0.2.1".parse().unwrap(), port);
        let key = FlowKey::new(client, "10.100.0.1:80".parse().unwrap(), proto);
        let f = NatFlow {
            backend_id: 7,
            generation: 2,
            vip_id: vip,
            state,
            last_seen_ns: last_seen_s * S,
            ..NatFlow::default()
        };
        (key, f)
    }

    fn answered((k, mut f): (FlowKey, NatFlow)) -> (FlowKey, NatFlow) {
        f.flags |= NAT_FLAG_ANSWERED;
        (k, f)
    }

    #[test]
    fn embryonic_flows_are_swept_only_under_pressure_oldest_first() {
        let now = 10_000;
        // 8 established, 8 embryonic of which 6 past the grace period.
        let mut entries: Vec<_> = (0..8)
            .map(|p| flow(p, 1, NAT_TCP_ESTABLISHED, now - 1))
            .collect();
        for (p, age) in [
            (10, 30),
            (11, 3),
            (12, 50),
            (13, 1),
            (14, 10),
            (15, 0),
            (16, 20),
            (17, 40),
        ] {
            let state = if p % 2 == 0 {
                NAT_TCP_SYN_RECV
            } else {
                NAT_TCP_SYN_SENT
            };
            entries.push(flow(p, 1, state, now - age));
        }
        let c = classify(entries, &pools(), now * S, 100);
        assert_eq!(c.embryonic_per_vip, HashMap::from([(1, 8)]));
        assert_eq!(c.embryonic.len(), 6, "two within the grace period");
        // 16 live of 64: no pressure.
        assert!(under_pressure(&c, 64).is_empty());
        // 16 live of 20: the threshold is 15; down to 15 - 20/8 = 13: 3 go,
        // the oldest.
        let gone: Vec<u16> = under_pressure(&c, 20)
            .iter()
            .map(|(k, _)| k.sport)
            .collect();
        assert_eq!(
            gone,
            [12u16, 17, 10].map(u16::to_be),
            "aged 50, 40 and 30 s"
        );
        // Far over: every listed one, never one in its grace period.
        assert_eq!(under_pressure(&c, 8).len(), 6);
    }

    #[test]
    fn each_state_expires_by_its_own_timeout() {
        let now = 10_000;
        // (name, flow, expired)
        let cases = [
            ("syn 59 s", flow(1, 1, NAT_TCP_SYN_SENT, now - 59), false),
            ("syn 60 s", flow(2, 1, NAT_TCP_SYN_SENT, now - 60), true),
            (
                "established 1 h",
                flow(3, 1, NAT_TCP_ESTABLISHED, now - 3600),
                false,
            ),
            (
                "established 2 h",
                flow(4, 1, NAT_TCP_ESTABLISHED, now - 7200),
                true,
            ),
            ("fin 119 s", flow(5, 1, NAT_TCP_FIN_WAIT, now - 119), false),
            ("closed 10 s", flow(6, 1, NAT_TCP_CLOSED, now - 10), true),
            ("udp 29 s", answered(flow(7, 1, NAT_UDP, now - 29)), false),
            ("udp 31 s", answered(flow(8, 1, NAT_UDP, now - 31)), true),
            ("unanswered udp 4 s", flow(11, 1, NAT_UDP, now - 4), false),
            ("unanswered udp 5 s", flow(12, 1, NAT_UDP, now - 5), true),
            (
                "syn-recv 60 s",
                flow(13, 1, NAT_TCP_SYN_RECV, now - 60),
                true,
            ),
            (
                "a removed VIP's flow",
                flow(9, 2, NAT_TCP_ESTABLISHED, now),
                true,
            ),
            // Another CPU's clock may be a tick ahead of ours.
            (
                "seen in the future",
                flow(10, 1, NAT_TCP_CLOSED, now + 1),
                false,
            ),
        ];
        for (name, f, want) in cases {
            let c = classify([f], &pools(), now * S, 100);
            assert_eq!(c.expired.len() == 1, want, "{name}");
            assert_eq!(c.entries, 1, "{name}");
        }
    }

    #[test]
    fn live_flows_are_counted_per_vip_and_established_per_backend() {
        let now = 10_000;
        let entries = vec![
            flow(1, 1, NAT_TCP_ESTABLISHED, now - 1),
            flow(2, 1, NAT_TCP_ESTABLISHED, now - 1),
            flow(3, 1, NAT_TCP_SYN_SENT, now - 1),
            flow(4, 1, NAT_TCP_FIN_WAIT, now - 1),
            flow(5, 1, NAT_TCP_ESTABLISHED, now - 8000),
        ];
        let c = classify(entries, &pools(), now * S, 100);
        assert_eq!(c.entries, 5);
        assert_eq!(c.per_vip, HashMap::from([(1, 4)]));
        assert_eq!(c.per_backend, HashMap::from([((7, 2), 2)]));
        assert_eq!(c.expired.len(), 1);
    }

    #[test]
    fn a_walk_deletes_at_most_its_bound_and_counts_the_rest() {
        let now = 10_000;
        let entries: Vec<_> = (1..=5).map(|p| flow(p, 1, NAT_TCP_CLOSED, 0)).collect();
        let c = classify(entries, &pools(), now * S, 3);
        assert_eq!(c.expired.len(), 3);
        assert_eq!(c.expired_left, 2);
    }

    #[test]
    fn a_reply_key_is_deleted_only_when_orphaned_twice_in_a_row() {
        let (a, _) = flow(1, 1, NAT_TCP_ESTABLISHED, 0);
        let (b, _) = flow(2, 1, NAT_TCP_ESTABLISHED, 0);
        let (ra, _) = flow(101, 1, NAT_TCP_ESTABLISHED, 0);
        let (rb, _) = flow(102, 1, NAT_TCP_ESTABLISHED, 0);
        let mut suspects = HashSet::new();
        let flows = HashSet::from([a]);
        // First search: rb's flow b is missing (maybe being written).
        let first = orphans([(ra, a), (rb, b)], &flows, &mut suspects);
        assert!(first.is_empty());
        // Second: still missing, so deleted; ra's flow exists.
        assert_eq!(orphans([(ra, a), (rb, b)], &flows, &mut suspects), [rb]);
        // A flow written between two searches saves its reply key.
        let mut suspects = HashSet::from([rb]);
        let flows = HashSet::from([a, b]);
        assert!(orphans([(ra, a), (rb, b)], &flows, &mut suspects).is_empty());
    }

    /// Passive detection asks for a walk when a verdict waits for its
    /// sources: the sweep starts one at the gap's end, not the period's.
    #[test]
    fn a_walk_asked_for_starts_after_the_gap_not_the_period() {
        let shared = Arc::new(Shared::default());
        let t0 = Instant::now();
        let waiter = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || {
                shared.wait(t0 + MIN_GAP, t0 + Duration::from_secs(10));
                t0.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        shared.walk_soon();
        let waited = waiter.join().unwrap();
        assert!(waited >= MIN_GAP, "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        // Nobody asks: the period's end.
        let t1 = Instant::now();
        shared.wait(t1, t1 + Duration::from_millis(100));
        assert!(t1.elapsed() >= Duration::from_millis(100));
    }
}
