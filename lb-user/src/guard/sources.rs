//! Heavy hitters, from two walks of the per-source map (`XLB_SOURCES`):
//! rates per source, the heaviest sources per VIP, the `source_alert` state
//! machine and the `auto_block` sustain tracker. Pure: the daemon
//! (`daemon::sources`) walks the map, feeds the walks in, and acts on what
//! comes out (events, list entries).
//!
//! The map's counters are cumulative and only grow while an entry lives; the
//! LRU evicts idle sources, and a source evicted between two walks and seen
//! again comes back with a fresh entry, so a counter that went *down* means
//! "re-created": all of its value is new ([`grown`]).
//!
//! Time is a [`Duration`] on a monotonic clock of the caller's choosing (the
//! daemon: since it started), so tests control it.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use lb_common::{FAMILY_V4, SourceKey, SourceState};

/// Sources per VIP that `xlb sources` lists.
pub const TOP: usize = 20;

/// A raised alert is kept while the source stays above this share of the
/// thresholds; below it for [`CLEAR_SAMPLES`] samples in a row, it clears. A
/// source hovering at the threshold does not raise and clear every second.
pub const CLEAR_FACTOR: f64 = 0.8;
/// Consecutive samples below [`CLEAR_FACTOR`] that clear an alert.
pub const CLEAR_SAMPLES: u32 = 3;

/// Two walks closer than this give no rate (the previous walk stays the
/// baseline): the counters of a few milliseconds say nothing per second.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// Slack on `auto_block.for`: the 1 s tick drifts by a few milliseconds, and
/// ten samples of 0.999 s still mean "for 10 s".
pub const SUSTAIN_SLACK: Duration = Duration::from_millis(100);

/// How much a counter grew between two walks: a counter that went down
/// belongs to an entry evicted and re-created in between, so all of its
/// value is new.
pub fn grown(before: u64, now: u64) -> u64 {
    if now >= before { now - before } else { now }
}

/// The source prefix a key stands for: its address and length, as an
/// operator writes it (`192.0.2.7/32`, `2001:db8:1:2::/64`).
pub fn key_prefix(key: &SourceKey) -> (IpAddr, u8) {
    let addr = if key.family == FAMILY_V4 {
        IpAddr::V4(Ipv4Addr::new(
            key.addr[0],
            key.addr[1],
            key.addr[2],
            key.addr[3],
        ))
    } else {
        IpAddr::V6(Ipv6Addr::from(key.addr))
    };
    (addr, key.prefix_len)
}

/// `key`'s prefix as text, e.g. `"2001:db8:1:2::/64"`.
pub fn key_text(key: &SourceKey) -> String {
    let (addr, len) = key_prefix(key);
    format!("{addr}/{len}")
}

/// One source's rates over the last interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SourceRate {
    pub key: SourceKey,
    /// New flows per second (admitted or not).
    pub new_flows_per_s: f64,
    /// Packets per second: new flows and misses counted one by one,
    /// established packets sampled one in `SOURCE_SAMPLE` and weighted.
    pub packets_per_s: f64,
    /// New flows per second refused by the rate limit.
    pub limited_per_s: f64,
    /// Flows per second the client confirmed past its SYN (an ACK or a
    /// second UDP packet hit their conntrack entry): what `auto_block`
    /// judges, since a SYN's source may be forged.
    pub established_per_s: f64,
}

impl SourceRate {
    fn is_idle(&self) -> bool {
        self.new_flows_per_s == 0.0
            && self.packets_per_s == 0.0
            && self.limited_per_s == 0.0
            && self.established_per_s == 0.0
    }
}

/// The previous walk, the baseline of the next rates.
#[derive(Debug, Default)]
pub struct Rates {
    prev: Option<(Duration, HashMap<SourceKey, SourceState>)>,
}

impl Rates {
    /// Feeds a walk taken at `now`: the rates of every source in it since
    /// the previous walk. `None` on the first walk (its counters hold all
    /// history, not the last second) and for a walk less than
    /// [`MIN_INTERVAL`] after the previous one (which stays the baseline).
    /// A source the previous walk did not have is new since then: all of
    /// its counters count.
    pub fn update(
        &mut self,
        walk: &[(SourceKey, SourceState)],
        now: Duration,
    ) -> Option<Vec<SourceRate>> {
        let rates = match &self.prev {
            Some((then, _)) if now.saturating_sub(*then) < MIN_INTERVAL => return None,
            Some((then, prev)) => {
                let secs = (now - *then).as_secs_f64();
                let zero = SourceState::default();
                let rates = walk.iter().map(|(key, s)| {
                    let p = prev.get(key).unwrap_or(&zero);
                    let per_s = |before, now| grown(before, now) as f64 / secs;
                    SourceRate {
                        key: *key,
                        new_flows_per_s: per_s(p.new_flows, s.new_flows),
                        packets_per_s: per_s(p.packets, s.packets),
                        limited_per_s: per_s(p.limited, s.limited),
                        established_per_s: per_s(p.established, s.established),
                    }
                });
                Some(rates.collect())
            }
            None => None,
        };
        self.prev = Some((now, walk.iter().copied().collect()));
        rates
    }

    /// When the baseline walk was taken.
    pub fn last_walk(&self) -> Option<Duration> {
        self.prev.as_ref().map(|(t, _)| *t)
    }
}

/// One VIP's sources over the last interval.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VipSummary {
    /// Entries the VIP has in the map.
    pub tracked: u64,
    /// New flows per second of all its sources.
    pub new_flows_per_s: f64,
    /// Every source with its rates, heaviest first: by new flows per
    /// second, then packets per second, then prefix (a stable order).
    pub sources: Vec<SourceRate>,
}

impl VipSummary {
    /// `rate`'s share of the VIP's new flows per second, 0 to 1.
    pub fn share(&self, rate: &SourceRate) -> f64 {
        share(rate.new_flows_per_s, self.new_flows_per_s)
    }

    /// The `n` heaviest sources that sent anything in the interval.
    pub fn top(&self, n: usize) -> impl Iterator<Item = &SourceRate> {
        self.sources.iter().filter(|r| !r.is_idle()).take(n)
    }
}

/// `part` of `total`, 0 when there is no total.
pub fn share(part: f64, total: f64) -> f64 {
    if total > 0.0 { part / total } else { 0.0 }
}

/// Groups a walk and its rates by VIP id.
pub fn by_vip(
    walk: &[(SourceKey, SourceState)],
    rates: &[SourceRate],
) -> BTreeMap<u32, VipSummary> {
    let mut out: BTreeMap<u32, VipSummary> = BTreeMap::new();
    for (key, _) in walk {
        out.entry(key.vip_id).or_default().tracked += 1;
    }
    for r in rates {
        let v = out.entry(r.key.vip_id).or_default();
        v.new_flows_per_s += r.new_flows_per_s;
        v.sources.push(*r);
    }
    for v in out.values_mut() {
        v.sources.sort_by(|a, b| {
            b.new_flows_per_s
                .total_cmp(&a.new_flows_per_s)
                .then(b.packets_per_s.total_cmp(&a.packets_per_s))
                .then_with(|| key_prefix(&a.key).cmp(&key_prefix(&b.key)))
        });
    }
    out
}

/// The sources VIP `summary`'s per-source metric shows: only those `heavy`
/// says are (above `source_alert`, with its hysteresis), at most `cap`, and
/// those it showed last time (`prev`) first while they stay heavy; then the
/// heaviest others. A flood from random sources then adds no label: its
/// sources are each light, and the 10 heaviest of them were a new label set
/// every second. Heaviest first.
pub fn metric_sources(
    prev: &[SourceKey],
    summary: &VipSummary,
    heavy: impl Fn(&SourceKey) -> bool,
    cap: usize,
) -> Vec<SourceRate> {
    let candidates: Vec<&SourceRate> = summary.sources.iter().filter(|r| heavy(&r.key)).collect();
    let kept: HashSet<SourceKey> = candidates
        .iter()
        .filter(|r| prev.contains(&r.key))
        .take(cap)
        .map(|r| r.key)
        .collect();
    let room = cap - kept.len();
    let fresh: HashSet<SourceKey> = candidates
        .iter()
        .filter(|r| !kept.contains(&r.key))
        .take(room)
        .map(|r| r.key)
        .collect();
    candidates
        .into_iter()
        .filter(|r| kept.contains(&r.key) || fresh.contains(&r.key))
        .copied()
        .collect()
}

/// A VIP's `source_alert`: a source is heavy above `rate_per_s` new flows
/// per second, or above `share` of the VIP's new flows while the VIP has at
/// least `min_rate_per_s` (a VIP with three clients is not under attack
/// because one of them has half of the flows).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AlertRule {
    pub rate_per_s: Option<f64>,
    pub share: Option<f64>,
    pub min_rate_per_s: f64,
}

impl AlertRule {
    /// Whether a source at `rate` with `share` of a VIP at `total` is above
    /// the rule, every threshold scaled by `factor` (1 raises the alert,
    /// [`CLEAR_FACTOR`] keeps it raised).
    pub fn above(&self, rate: f64, share: f64, total: f64, factor: f64) -> bool {
        let by_rate = self.rate_per_s.is_some_and(|t| rate > t * factor);
        let by_share = self
            .share
            .is_some_and(|t| total >= self.min_rate_per_s * factor && share > t * factor);
        by_rate || by_share
    }
}

/// Why an alert cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClearedBy {
    /// Below [`CLEAR_FACTOR`] of the thresholds for [`CLEAR_SAMPLES`] samples.
    Below,
    /// The source left the map (the LRU evicted it: it stopped sending).
    Gone,
    /// The VIP has no `source_alert` any more (a reload).
    Unconfigured,
}

/// A source going heavy or back to normal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AlertChange {
    pub key: SourceKey,
    /// `None`: raised; `Some`: cleared, and why.
    pub cleared: Option<ClearedBy>,
    /// The source's new flows per second and share in the last sample
    /// (0 when it is gone).
    pub rate: f64,
    pub share: f64,
}

/// The heavy sources of every VIP, with hysteresis.
#[derive(Debug, Default)]
pub struct Alerts {
    /// Heavy sources → samples in a row below the clear point.
    heavy: HashMap<SourceKey, u32>,
}

impl Alerts {
    /// Feeds VIP `vip_id`'s latest sample (`None`: it has no sources in the
    /// map); what changed.
    pub fn update(
        &mut self,
        vip_id: u32,
        rule: Option<&AlertRule>,
        summary: Option<&VipSummary>,
    ) -> Vec<AlertChange> {
        let mut out = Vec::new();
        let empty = VipSummary::default();
        let summary = summary.unwrap_or(&empty);
        let Some(rule) = rule else {
            self.clear_vip(vip_id, ClearedBy::Unconfigured, &mut out);
            return out;
        };
        let total = summary.new_flows_per_s;
        let mut present = HashSet::new();
        for r in &summary.sources {
            present.insert(r.key);
            let share = summary.share(r);
            let rate = r.new_flows_per_s;
            let change = |cleared| AlertChange {
                key: r.key,
                cleared,
                rate,
                share,
            };
            match self.heavy.get_mut(&r.key) {
                None if rule.above(rate, share, total, 1.0) => {
                    self.heavy.insert(r.key, 0);
                    out.push(change(None));
                }
                None => {}
                Some(below) if rule.above(rate, share, total, CLEAR_FACTOR) => *below = 0,
                Some(below) => {
                    *below += 1;
                    if *below >= CLEAR_SAMPLES {
                        self.heavy.remove(&r.key);
                        out.push(change(Some(ClearedBy::Below)));
                    }
                }
            }
        }
        let gone: Vec<SourceKey> = self
            .heavy
            .keys()
            .filter(|k| k.vip_id == vip_id && !present.contains(k))
            .copied()
            .collect();
        for key in gone {
            self.heavy.remove(&key);
            out.push(gone_change(key, ClearedBy::Gone));
        }
        out
    }

    fn clear_vip(&mut self, vip_id: u32, by: ClearedBy, out: &mut Vec<AlertChange>) {
        let mut keys: Vec<SourceKey> = self
            .heavy
            .keys()
            .filter(|k| k.vip_id == vip_id)
            .copied()
            .collect();
        keys.sort_by_key(key_prefix);
        for key in keys {
            self.heavy.remove(&key);
            out.push(gone_change(key, by));
        }
    }

    /// Forgets the alerts of VIPs not in `vip_ids` (removed by a reload:
    /// nobody is told about a VIP that no longer exists).
    pub fn retain_vips(&mut self, vip_ids: &[u32]) {
        self.heavy.retain(|k, _| vip_ids.contains(&k.vip_id));
    }

    pub fn is_heavy(&self, key: &SourceKey) -> bool {
        self.heavy.contains_key(key)
    }

    /// Heavy sources of VIP `vip_id` right now.
    pub fn heavy_count(&self, vip_id: u32) -> u64 {
        self.heavy.keys().filter(|k| k.vip_id == vip_id).count() as u64
    }
}

fn gone_change(key: SourceKey, by: ClearedBy) -> AlertChange {
    AlertChange {
        key,
        cleared: Some(by),
        rate: 0.0,
        share: 0.0,
    }
}

/// A VIP's `auto_block`: block a source above `above_per_s` established
/// flows per second ([`SourceRate::established_per_s`]) for `sustained`
/// without a break.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SustainRule {
    pub above_per_s: f64,
    pub sustained: Duration,
}

/// Sources above their VIP's `auto_block` rate, and since when.
#[derive(Debug, Default)]
pub struct Sustain {
    /// Source → its current run above the rate.
    runs: HashMap<SourceKey, Run>,
    /// Updates so far: a run not seen in the latest update of its VIP ends.
    updates: u64,
}

/// One source's run above its VIP's `auto_block` rate.
#[derive(Clone, Copy, Debug)]
struct Run {
    /// The start of the run's first interval.
    since: Duration,
    /// Blocked in this run: blocked once, not again until it drops below
    /// the rate (or its block ends and it goes on).
    fired: bool,
    /// The update that last saw it above.
    seen: u64,
}

impl Sustain {
    /// Feeds VIP `vip_id`'s rates over the interval (`from`, `now`]: the
    /// sources to block now, at most `limit` of them, the heaviest first
    /// (the others stay due and come out at a later call). `covered` says
    /// whether a list entry covers a source already: a deny entry (its
    /// flows are refused before they are counted, so it starts over when
    /// the entry goes) or an allow entry (never blocked).
    pub fn update(
        &mut self,
        vip_id: u32,
        rule: Option<&SustainRule>,
        rates: &[SourceRate],
        (from, now): (Duration, Duration),
        limit: usize,
        covered: impl Fn(&SourceKey) -> bool,
    ) -> Vec<SourceRate> {
        let Some(rule) = rule else {
            self.runs.retain(|k, _| k.vip_id != vip_id);
            return Vec::new();
        };
        self.updates += 1;
        let seen = self.updates;
        let mut due = Vec::new();
        // One hash lookup per source above the rate (10,000 of them in a
        // flood from many clients), none for the others.
        for r in rates.iter().filter(|r| r.key.vip_id == vip_id) {
            if r.established_per_s <= rule.above_per_s || covered(&r.key) {
                continue;
            }
            let run = self.runs.entry(r.key).or_insert(Run {
                since: from,
                fired: false,
                seen,
            });
            run.seen = seen;
            let held = now.saturating_sub(run.since) + SUSTAIN_SLACK;
            if held >= rule.sustained && !run.fired {
                due.push(*r);
            }
        }
        self.runs
            .retain(|k, run| k.vip_id != vip_id || run.seen == seen);
        if due.len() > limit {
            due.sort_by(|a, b| {
                b.established_per_s
                    .total_cmp(&a.established_per_s)
                    .then_with(|| key_prefix(&a.key).cmp(&key_prefix(&b.key)))
            });
            due.truncate(limit);
        }
        for r in &due {
            if let Some(run) = self.runs.get_mut(&r.key) {
                run.fired = true;
            }
        }
        due
    }

    /// Forgets VIPs not in `vip_ids`.
    pub fn retain_vips(&mut self, vip_ids: &[u32]) {
        self.runs.retain(|k, _| vip_ids.contains(&k.vip_id));
    }

    /// How long `key` has been above its VIP's rate (0 if it is not).
    pub fn above_for(&self, key: &SourceKey, now: Duration) -> Duration {
        self.runs
            .get(key)
            .map_or(Duration::ZERO, |run| now.saturating_sub(run.since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lb_common::FAMILY_V6;

    fn v4(vip_id: u32, a: [u8; 4]) -> SourceKey {
        let mut addr = [0; 16];
        addr[..4].copy_from_slice(&a);
        SourceKey {
            addr,
            vip_id,
            prefix_len: 32,
            family: FAMILY_V4,
            _pad: [0; 2],
        }
    }

    fn v6_64(vip_id: u32, a: &str) -> SourceKey {
        let ip: Ipv6Addr = a.parse().unwrap();
        SourceKey {
            addr: ip.octets(),
            vip_id,
            prefix_len: 64,
            family: FAMILY_V6,
            _pad: [0; 2],
        }
    }

    fn st(new_flows: u64, packets: u64, limited: u64) -> SourceState {
        SourceState {
            tat_ns: 0,
            new_flows,
            limited,
            packets,
            established: 0,
        }
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    const A: [u8; 4] = [192, 0, 2, 7];
    const B: [u8; 4] = [198, 51, 100, 1];

    #[test]
    fn counters_grow_or_restart() {
        let cases = [
            ("grew", 10, 25, 15),
            ("unchanged", 10, 10, 0),
            ("evicted and re-created: all new", 1000, 40, 40),
            ("re-created empty", 1000, 0, 0),
        ];
        for (name, before, now, want) in cases {
            assert_eq!(grown(before, now), want, "{name}");
        }
    }

    #[test]
    fn prefixes_read_back_as_operators_write_them() {
        assert_eq!(key_text(&v4(1, A)), "192.0.2.7/32");
        assert_eq!(key_text(&v6_64(1, "2001:db8:1:2::")), "2001:db8:1:2::/64");
    }

    #[test]
    fn rates_need_a_baseline_and_handle_eviction_and_new_sources() {
        let mut r = Rates::default();
        let first = [(v4(1, A), st(5000, 9000, 100))];
        assert_eq!(r.update(&first, secs(10.0)), None, "history is no rate");
        assert_eq!(r.last_walk(), Some(secs(10.0)));
        let second = [
            // 200 new flows, 400 packets, 50 limited in 2 s.
            (v4(1, A), st(5200, 9400, 150)),
            // New since the first walk: everything counts.
            (v4(1, B), st(30, 30, 0)),
        ];
        let got = r.update(&second, secs(12.0)).unwrap();
        assert_eq!(
            got,
            [
                SourceRate {
                    key: v4(1, A),
                    new_flows_per_s: 100.0,
                    packets_per_s: 200.0,
                    limited_per_s: 25.0,
                    established_per_s: 0.0,
                },
                SourceRate {
                    key: v4(1, B),
                    new_flows_per_s: 15.0,
                    packets_per_s: 15.0,
                    limited_per_s: 0.0,
                    established_per_s: 0.0,
                },
            ]
        );
        // A evicted and re-created in between: its counters went down.
        let third = [(v4(1, A), st(8, 64, 0))];
        let got = r.update(&third, secs(13.0)).unwrap();
        assert_eq!(got.len(), 1, "B vanished: no rate for it");
        assert_eq!(got[0].new_flows_per_s, 8.0);
        assert_eq!(got[0].packets_per_s, 64.0);
        assert_eq!(got[0].limited_per_s, 0.0);
    }

    #[test]
    fn walks_too_close_keep_the_old_baseline() {
        let mut r = Rates::default();
        let _ = r.update(&[(v4(1, A), st(0, 0, 0))], secs(1.0));
        let close = [(v4(1, A), st(5, 5, 0))];
        assert_eq!(r.update(&close, secs(1.05)), None, "50 ms: no rate");
        assert_eq!(r.last_walk(), Some(secs(1.0)));
        assert_eq!(r.update(&close, secs(1.0)), None, "same instant");
        // The next rate covers the whole interval since the baseline.
        let later = [(v4(1, A), st(20, 20, 0))];
        let got = r.update(&later, secs(3.0)).unwrap();
        assert_eq!(got[0].new_flows_per_s, 10.0);
        // A clock that went backwards gives nothing rather than a panic.
        assert_eq!(r.update(&later, secs(2.0)), None);
    }

    fn rate(key: SourceKey, nf: f64, pk: f64) -> SourceRate {
        SourceRate {
            key,
            new_flows_per_s: nf,
            packets_per_s: pk,
            limited_per_s: 0.0,
            established_per_s: 0.0,
        }
    }

    /// A source whose `n` new flows a second are all confirmed (a real
    /// client's, or a flood that completes its handshakes).
    fn confirmed(key: SourceKey, n: f64) -> SourceRate {
        SourceRate {
            established_per_s: n,
            ..rate(key, n, n)
        }
    }

    #[test]
    fn by_vip_sorts_heaviest_first_with_shares_and_counts_idle_sources() {
        let c = v6_64(1, "2001:db8:1:2::");
        let idle = v4(1, [203, 0, 113, 9]);
        let walk = [
            (v4(1, A), st(0, 0, 0)),
            (v4(1, B), st(0, 0, 0)),
            (c, st(0, 0, 0)),
            (idle, st(0, 0, 0)),
            (v4(2, A), st(0, 0, 0)),
        ];
        let rates = [
            rate(v4(1, A), 10.0, 10.0),
            rate(v4(1, B), 30.0, 30.0),
            rate(c, 10.0, 500.0),
            rate(idle, 0.0, 0.0),
            rate(v4(2, A), 1.0, 1.0),
        ];
        let vips = by_vip(&walk, &rates);
        let one = &vips[&1];
        assert_eq!(one.tracked, 4);
        assert_eq!(one.new_flows_per_s, 50.0);
        let order: Vec<String> = one.top(TOP).map(|r| key_text(&r.key)).collect();
        assert_eq!(
            order,
            ["198.51.100.1/32", "2001:db8:1:2::/64", "192.0.2.7/32"],
            "by new flows, then packets; the idle source is not listed"
        );
        assert_eq!(one.share(&one.sources[0]), 0.6);
        assert_eq!(one.top(1).count(), 1);
        assert_eq!(vips[&2].tracked, 1);
        assert_eq!(vips[&2].share(&vips[&2].sources[0]), 1.0);
        assert_eq!(share(5.0, 0.0), 0.0, "no traffic, no share");
    }

    fn summary(rates: &[SourceRate]) -> VipSummary {
        let walk: Vec<_> = rates.iter().map(|r| (r.key, st(0, 0, 0))).collect();
        by_vip(&walk, rates).remove(&1).unwrap_or_default()
    }

    const RULE: AlertRule = AlertRule {
        rate_per_s: Some(100.0),
        share: Some(0.5),
        min_rate_per_s: 20.0,
    };

    #[test]
    fn alert_rule_by_rate_and_by_share_above_min_rate() {
        let cases = [
            ("over the rate", 101.0, 0.1, 1000.0, 1.0, true),
            (
                "at the rate is not above it",
                100.0,
                0.1,
                1000.0,
                1.0,
                false,
            ),
            ("over the share, VIP busy", 15.0, 0.75, 20.0, 1.0, true),
            ("over the share, VIP quiet", 15.0, 0.75, 19.9, 1.0, false),
            (
                "kept at 80% of the rate",
                81.0,
                0.1,
                1000.0,
                CLEAR_FACTOR,
                true,
            ),
            ("not kept below 80%", 79.0, 0.1, 1000.0, CLEAR_FACTOR, false),
            (
                "kept at 80% of share and min",
                10.0,
                0.41,
                16.5,
                CLEAR_FACTOR,
                true,
            ),
        ];
        for (name, rate, share, total, factor, want) in cases {
            assert_eq!(RULE.above(rate, share, total, factor), want, "{name}");
        }
        let rate_only = AlertRule {
            share: None,
            ..RULE
        };
        assert!(!rate_only.above(50.0, 1.0, 1000.0, 1.0), "no share rule");
    }

    #[test]
    fn an_alert_raises_once_and_clears_after_three_samples_below() {
        let mut a = Alerts::default();
        let hot = v4(1, A);
        let cool = v4(1, B);
        let sample = |hot_rate: f64| summary(&[rate(hot, hot_rate, 0.0), rate(cool, 900.0, 0.0)]);
        // 900/s from `cool` is over the rate too: both are heavy.
        let up = a.update(1, Some(&RULE), Some(&sample(150.0)));
        assert_eq!(up.len(), 2);
        assert!(up.iter().all(|c| c.cleared.is_none()));
        let hot_up = up.iter().find(|c| c.key == hot).unwrap();
        assert_eq!(hot_up.rate, 150.0);
        assert_eq!(hot_up.share, 150.0 / 1050.0);
        assert!(a.is_heavy(&hot));
        assert_eq!(a.heavy_count(1), 2);
        assert_eq!(a.heavy_count(2), 0);
        let mut seen = Vec::new();
        // 90/s is above 80% of 100: kept; then 3 samples below 80/s clear,
        // with a sample back above in between starting the count over.
        for r in [150.0, 90.0, 50.0, 50.0, 85.0, 50.0, 50.0, 50.0, 50.0] {
            let changes = a.update(1, Some(&RULE), Some(&sample(r)));
            seen.push(changes.iter().filter(|c| c.key == hot).count());
            if let Some(c) = changes.iter().find(|c| c.key == hot) {
                assert_eq!(c.cleared, Some(ClearedBy::Below));
                assert_eq!(c.rate, 50.0);
            }
        }
        assert_eq!(seen, [0, 0, 0, 0, 0, 0, 0, 1, 0]);
        assert!(!a.is_heavy(&hot));
        assert!(a.is_heavy(&cool), "the other source is still heavy");
    }

    #[test]
    fn an_alert_clears_at_once_when_its_source_is_gone_or_the_rule_goes() {
        let mut a = Alerts::default();
        let hot = v4(1, A);
        let other = v4(1, B);
        let on = summary(&[rate(hot, 500.0, 0.0), rate(other, 1.0, 0.0)]);
        assert_eq!(a.update(1, Some(&RULE), Some(&on)).len(), 1);
        let gone = summary(&[rate(other, 1.0, 0.0)]);
        let c = a.update(1, Some(&RULE), Some(&gone));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].key, hot);
        assert_eq!(c[0].cleared, Some(ClearedBy::Gone));
        // The VIP's last source evicted: no summary at all.
        assert_eq!(a.update(1, Some(&RULE), Some(&on)).len(), 1);
        let c = a.update(1, Some(&RULE), None);
        assert_eq!(c[0].cleared, Some(ClearedBy::Gone));
        // A reload removed the rule.
        assert_eq!(a.update(1, Some(&RULE), Some(&on)).len(), 1);
        let c = a.update(1, None, Some(&on));
        assert_eq!(c[0].cleared, Some(ClearedBy::Unconfigured));
        assert!(a.update(1, None, Some(&on)).is_empty(), "once");
        // A removed VIP is forgotten silently.
        assert_eq!(a.update(1, Some(&RULE), Some(&on)).len(), 1);
        a.retain_vips(&[2]);
        assert_eq!(a.heavy_count(1), 0);
    }

    #[test]
    fn share_alert_waits_for_the_vip_min_rate() {
        let mut a = Alerts::default();
        let share_only = AlertRule {
            rate_per_s: None,
            ..RULE
        };
        // One client of a quiet VIP has all of its flows: not an attack.
        let quiet = summary(&[rate(v4(1, A), 5.0, 0.0)]);
        assert!(a.update(1, Some(&share_only), Some(&quiet)).is_empty());
        let busy = summary(&[rate(v4(1, A), 30.0, 0.0), rate(v4(1, B), 10.0, 0.0)]);
        let c = a.update(1, Some(&share_only), Some(&busy));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].share, 0.75);
    }

    const BLOCK: SustainRule = SustainRule {
        above_per_s: 1000.0,
        sustained: Duration::from_secs(10),
    };

    /// Feeds one-second samples of `key` at `rates` from t = 0; the times
    /// (end of the sample) at which it was blocked.
    fn sustain_run(
        s: &mut Sustain,
        key: SourceKey,
        rates: &[f64],
        blocked: impl Fn(f64) -> bool,
    ) -> Vec<u64> {
        let mut fired = Vec::new();
        for (i, &r) in rates.iter().enumerate() {
            let (from, now) = (secs(i as f64), secs(i as f64 + 1.0));
            let out = s.update(
                1,
                Some(&BLOCK),
                &[confirmed(key, r)],
                (from, now),
                9,
                |_| blocked(now.as_secs_f64()),
            );
            if !out.is_empty() {
                fired.push(now.as_secs());
            }
        }
        fired
    }

    #[test]
    fn auto_block_after_the_sustained_time_and_once() {
        let mut s = Sustain::default();
        let key = v4(1, A);
        let fired = sustain_run(&mut s, key, &[2000.0; 15], |_| false);
        assert_eq!(fired, [10], "10 samples of 1 s above: at t = 10, once");
        assert_eq!(s.above_for(&key, secs(15.0)), secs(15.0));
    }

    #[test]
    fn auto_block_restarts_after_a_dip_and_at_the_rate_exactly() {
        let mut s = Sustain::default();
        let mut rates = vec![2000.0; 9];
        rates.push(1000.0); // at the rate is not above it
        rates.extend([2000.0; 10]);
        assert_eq!(sustain_run(&mut s, v4(1, A), &rates, |_| false), [20]);
    }

    #[test]
    fn auto_block_not_again_while_blocked_and_again_after_the_block() {
        let mut s = Sustain::default();
        // Blocked at 10; a deny entry covers it from 10 to 30 (its flows
        // are refused, not counted: the rate reads 0); it floods on.
        let rates: Vec<f64> = (0..45)
            .map(|t| if (10..30).contains(&t) { 0.0 } else { 2000.0 })
            .collect();
        let fired = sustain_run(&mut s, v4(1, A), &rates, |t| (11.0..=30.0).contains(&t));
        assert_eq!(fired, [10, 40]);
        // Covered by an entry while still counted (e.g. an allow entry won,
        // or an operator's block of another VIP's scope): never blocked.
        let mut s = Sustain::default();
        assert!(sustain_run(&mut s, v4(1, B), &[2000.0; 20], |_| true).is_empty());
    }

    #[test]
    fn auto_block_timing_edges() {
        let key = v4(1, A);
        // Ticks a little short of a second: ten of them still count as 10 s.
        let mut s = Sustain::default();
        let mut fired = None;
        for i in 0..12u32 {
            let (from, now) = (secs(f64::from(i) * 0.999), secs(f64::from(i + 1) * 0.999));
            if !s
                .update(
                    1,
                    Some(&BLOCK),
                    &[confirmed(key, 5000.0)],
                    (from, now),
                    9,
                    |_| false,
                )
                .is_empty()
            {
                fired = Some(i + 1);
            }
        }
        assert_eq!(fired, Some(10));
        // A stalled loop: one 12 s interval above the rate is 12 s above.
        let mut s = Sustain::default();
        let out = s.update(
            1,
            Some(&BLOCK),
            &[confirmed(key, 5000.0)],
            (secs(0.0), secs(12.0)),
            9,
            |_| false,
        );
        assert_eq!(out.len(), 1);
        // A source that vanishes starts over when it comes back.
        let mut s = Sustain::default();
        let _ = sustain_run(&mut s, key, &[2000.0; 5], |_| false);
        let _ = s.update(1, Some(&BLOCK), &[], (secs(5.0), secs(6.0)), 9, |_| false);
        assert_eq!(s.above_for(&key, secs(6.0)), Duration::ZERO);
        // Other VIPs' sources are left alone by VIP 2's update.
        let _ = sustain_run(&mut s, key, &[2000.0; 3], |_| false);
        let _ = s.update(2, Some(&BLOCK), &[], (secs(3.0), secs(4.0)), 9, |_| false);
        assert_eq!(s.above_for(&key, secs(4.0)), secs(4.0));
        // No rule: the VIP's runs are forgotten.
        let _ = s.update(1, None, &[], (secs(4.0), secs(5.0)), 9, |_| false);
        assert_eq!(s.above_for(&key, secs(5.0)), Duration::ZERO);
    }

    #[test]
    fn auto_block_judges_confirmed_flows_not_syns() {
        // 5,000 SYNs a second naming A, none followed by the client's ACK:
        // what a flood with a forged source looks like. Never blocked.
        let mut s = Sustain::default();
        let key = v4(1, A);
        for i in 0..20 {
            let (from, now) = (secs(f64::from(i)), secs(f64::from(i + 1)));
            let spoofed = rate(key, 5000.0, 5000.0);
            let out = s.update(1, Some(&BLOCK), &[spoofed], (from, now), 9, |_| false);
            assert!(out.is_empty(), "blocked at {now:?} on SYNs alone");
        }
        assert_eq!(s.above_for(&key, secs(20.0)), Duration::ZERO);
    }

    #[test]
    fn auto_block_fires_at_most_limit_per_call_heaviest_first_the_rest_later() {
        let mut s = Sustain::default();
        let keys = [v4(1, A), v4(1, B), v4(1, [203, 0, 113, 9])];
        let rates = [
            confirmed(keys[0], 2000.0),
            confirmed(keys[1], 4000.0),
            confirmed(keys[2], 3000.0),
        ];
        let mut fired = Vec::new();
        for i in 0..12 {
            let (from, now) = (secs(f64::from(i)), secs(f64::from(i + 1)));
            let out = s.update(1, Some(&BLOCK), &rates, (from, now), 2, |_| false);
            fired.push(out.iter().map(|r| key_text(&r.key)).collect::<Vec<_>>());
        }
        assert!(fired[..9].iter().all(Vec::is_empty), "{fired:?}");
        assert_eq!(
            fired[9],
            ["198.51.100.1/32", "203.0.113.9/32"],
            "heaviest two"
        );
        assert_eq!(fired[10], ["192.0.2.7/32"], "the third a tick later");
        assert!(fired[11].is_empty(), "each once");
    }

    #[test]
    fn the_metric_shows_heavy_sources_only_at_most_cap_and_keeps_its_labels() {
        let key = |i: u32| v4(1, (0x0a00_0000 | i).to_be_bytes());
        let mut labels = HashSet::new();
        let mut prev: Vec<SourceKey> = Vec::new();
        // Ten seconds of a flood from 10,000 new random sources a second,
        // each light, under 12 heavy sources whose order changes.
        for t in 0..10u32 {
            let mut rates: Vec<SourceRate> = (0..10_000)
                .map(|i| rate(key(100 + t * 10_000 + i), 1.0 + f64::from(i % 7), 0.0))
                .collect();
            rates.extend((0..12).map(|i| rate(key(i), 500.0 + f64::from((i + t) % 12), 0.0)));
            let s = summary(&rates);
            let shown = metric_sources(&prev, &s, |k| k.addr[3] < 12 && k.addr[2] == 0, 10);
            assert_eq!(shown.len(), 10, "at most the cap, at t = {t}");
            assert!(
                shown
                    .windows(2)
                    .all(|w| w[0].new_flows_per_s >= w[1].new_flows_per_s),
                "heaviest first"
            );
            prev = shown.iter().map(|r| r.key).collect();
            labels.extend(prev.iter().copied());
        }
        assert_eq!(
            labels.len(),
            10,
            "the same 10 labels all along: {}",
            labels.len()
        );
        // Without an alert nothing is heavy: no series at all.
        let s = summary(&[rate(key(1), 900.0, 0.0)]);
        assert!(metric_sources(&[], &s, |_| false, 10).is_empty());
        // A shown source that is no longer heavy gives its place.
        let s = summary(&[rate(key(1), 900.0, 0.0), rate(key(2), 800.0, 0.0)]);
        let shown = metric_sources(&[key(1)], &s, |k| *k == key(2), 1);
        assert_eq!(shown.iter().map(|r| r.key).collect::<Vec<_>>(), [key(2)]);
    }
}
