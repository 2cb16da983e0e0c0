//! Passive detection in the daemon: every [`SAMPLE_PERIOD`] (100 ms) the
//! main loop reads `XLB_PASSIVE` (one batch call for every backend id),
//! keeps a [`History`] per backend of its NAT VIPs, judges each backend in
//! the table against its peers, and feeds a failing verdict to its health
//! machine (`Scheduler::observe_passive`), as probe reports reach it; the
//! VIP policy then takes the backend out within its protections, and the
//! change is logged and recorded like any other (`evaluate`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use aya::maps::MapData;
use lb_common::nat::MAP_PASSIVE;
use tracing::{info, warn};

use super::{Daemon, persist};
use crate::dataplane::batch;
use crate::health::passive::{self, History, PassiveStats, Verdict, Window, sources};

/// Least time between two attempts to open the map, and between two
/// warnings about reading it.
const RETRY: Duration = Duration::from_secs(10);

/// What passive detection knows of one backend id.
#[derive(Debug)]
pub(super) struct Tracked {
    /// The backend the history is about: an id given to another backend
    /// (a reload) starts again.
    generation: u32,
    addr: SocketAddr,
    history: History,
    /// As of the last sample.
    window: Window,
    verdict: Verdict,
    /// Out of the table at the last sample.
    out: bool,
    /// When it came back into the table, while the evidence of its flows
    /// may still be about the time it was out (see [`Tracked::observe`]).
    back_at: Option<Instant>,
    /// Since when the counters say failing (unbroken): the sources are
    /// counted from a walk of the flow table that began after it.
    failing_since: Option<Instant>,
}

impl Tracked {
    fn new(generation: u32, addr: SocketAddr) -> Self {
        Tracked {
            generation,
            addr,
            history: History::new(),
            window: Window::default(),
            verdict: Verdict::TooFew,
            out: false,
            back_at: None,
            failing_since: None,
        }
    }

    /// Takes the counters sampled at `now`; whether the backend is to be
    /// judged on them (`window` then holds what they say). A backend out of
    /// the table is not judged, and what its flows tell meanwhile
    /// (requests it never answered while hung, flows ended when it went
    /// down) is forgotten sample by sample. Back in the table, it is not
    /// judged for `response_timeout` either, and what came in that time is
    /// forgotten too: a request still pending from before its return is
    /// judged (unanswered or abandoned) when its client gives up, right
    /// after the return, and that is evidence about the time it was out.
    fn observe(
        &mut self,
        now: Instant,
        counts: PassiveStats,
        keep: Duration,
        th: &passive::Thresholds,
        in_table: bool,
    ) -> bool {
        self.history.push(now, counts, keep);
        if in_table && self.out {
            self.back_at = Some(now);
        }
        self.out = !in_table;
        let grace = self
            .back_at
            .is_some_and(|at| now.saturating_duration_since(at) < th.response_timeout);
        if !grace {
            self.back_at = None;
        }
        if !in_table || grace {
            self.history.restart();
            self.window = Window::default();
            self.verdict = Verdict::TooFew;
            return false;
        }
        self.window = self.history.window(now, th);
        true
    }
}

/// The daemon's passive detection state.
#[derive(Debug, Default)]
pub(super) struct Passive {
    map: Option<MapData>,
    /// When opening or reading the map last failed (warned then).
    failed_at: Option<Instant>,
    tracked: HashMap<u32, Tracked>,
}

impl Passive {
    /// Opens the pinned map unless it is open, at most every [`RETRY`].
    fn open(&mut self, pin_dir: &Path, now: Instant) -> Option<&MapData> {
        if self.map.is_none() && self.may_try(now) {
            let path = pin_dir.join(MAP_PASSIVE);
            match MapData::from_pin(&path) {
                Ok(m) => {
                    info!("passive detection reads {}", path.display());
                    self.map = Some(m);
                }
                Err(e) => self.fail(
                    now,
                    format!(
                        "passive detection is off: opening {}: {e}; the data plane of this \
                         build does not pin it (NAT mode missing?), or the instance's maps \
                         are gone",
                        path.display()
                    ),
                ),
            }
        }
        self.map.as_ref()
    }

    fn may_try(&self, now: Instant) -> bool {
        self.failed_at
            .is_none_or(|t| now.saturating_duration_since(t) >= RETRY)
    }

    fn fail(&mut self, now: Instant, msg: String) {
        self.failed_at = Some(now);
        warn!("{msg}");
    }

    /// Every backend id's counters `0..n`, summed over CPUs.
    fn read(&mut self, pin_dir: &Path, n: u32, now: Instant) -> Option<Vec<PassiveStats>> {
        let result = batch::percpu_array_sums(self.open(pin_dir, now)?, n, passive::add);
        match result {
            Ok(sums) => Some(sums),
            Err(e) => {
                if self.may_try(now) {
                    self.fail(
                        now,
                        format!(
                            "passive detection: reading {MAP_PASSIVE} failed: {e}; judging \
                             nothing until it reads again"
                        ),
                    );
                }
                None
            }
        }
    }
}

impl Daemon {
    /// Every [`passive::SAMPLE_PERIOD`]: samples, judges, and takes out
    /// backends whose real traffic fails while their peers' succeeds.
    pub(super) fn on_passive_tick(&mut self) {
        let now = Instant::now();
        let n = self
            .vips
            .iter()
            .filter(|v| v.cfg.passive.enabled)
            .flat_map(|v| v.backends.iter().map(|b| b.id + 1))
            .max();
        let Some(n) = n else {
            self.passive.tracked.clear();
            return;
        };
        let pin_dir = persist::pin_dir(&self.cfg.daemon.pinned.instance);
        let Some(sums) = self.passive.read(&pin_dir, n, now) else {
            return;
        };
        let mut live = Vec::new();
        let mut touched = Vec::new();
        for vi in 0..self.vips.len() {
            if !self.vips[vi].cfg.passive.enabled {
                continue;
            }
            live.extend(self.vips[vi].backends.iter().map(|b| b.id));
            if self.judge_vip(vi, &sums, now) {
                touched.push(vi);
            }
        }
        self.passive.tracked.retain(|id, _| live.contains(id));
        for vi in touched {
            if let Err(e) = self.evaluate_vip(vi) {
                tracing::error!("applying passive evidence: {e:#}");
            }
        }
    }

    /// Samples and judges VIP `vi`'s backends; whether passive evidence
    /// was fed to one of them (then evaluate the VIP).
    fn judge_vip(&mut self, vi: usize, sums: &[PassiveStats], now: Instant) -> bool {
        let v = &self.vips[vi];
        let th = v.cfg.passive.thresholds();
        let keep = v.cfg.passive.history();
        let mut windows = Vec::new();
        for b in &v.backends {
            let counts = sums.get(b.id as usize).copied().unwrap_or_default();
            let addr = b.cfg.socket_addr();
            let t = self
                .passive
                .tracked
                .entry(b.id)
                .or_insert_with(|| Tracked::new(b.generation, addr));
            if (t.generation, t.addr) != (b.generation, addr) {
                *t = Tracked::new(b.generation, addr);
            }
            // Peers are the backends taking traffic: one out already has
            // nothing new to say, and its old failures are not the VIP's.
            if t.observe(now, counts, keep, &th, b.in_table()) {
                windows.push((b.id, t.window));
            }
        }
        let ws: Vec<Window> = windows.iter().map(|(_, w)| *w).collect();
        let mut fed = false;
        for ((id, _), verdict) in windows.iter().zip(passive::judge(&ws, &th)) {
            let verdict = self.by_sources(vi, *id, verdict, now);
            if let Verdict::Failing(why) = &verdict {
                fed |= self.feed_evidence(vi, *id, why.clone());
            }
            if let Some(t) = self.passive.tracked.get_mut(id) {
                t.verdict = verdict;
            }
        }
        fed
    }

    /// A failing `verdict` of backend `id` of VIP `vi` stands only if its
    /// failing flows come from enough client prefixes
    /// (`health::passive::sources`), counted by a walk of the NAT flow
    /// table that began after the counters first said failing (one is
    /// asked for then); other verdicts pass as they are.
    fn by_sources(&mut self, vi: usize, id: u32, verdict: Verdict, now: Instant) -> Verdict {
        let Some(t) = self.passive.tracked.get_mut(&id) else {
            return verdict;
        };
        let Verdict::Failing(why) = verdict else {
            t.failing_since = None;
            return verdict;
        };
        let since = match t.failing_since {
            Some(since) => since,
            None => {
                t.failing_since = Some(now);
                self.nat_flows.walk_soon();
                now
            }
        };
        let Some(walk) = self
            .nat_flows
            .latest()
            .filter(|w| w.started.is_some_and(|s| s >= since))
        else {
            return Verdict::CountingSources;
        };
        let cfg = &self.vips[vi].cfg.passive;
        let failing = walk
            .failing
            .get(&(id, t.generation))
            .cloned()
            .unwrap_or_default();
        match sources::check(&failing, &t.window, &cfg.thresholds(), &cfg.source_rule()) {
            Ok(from) => Verdict::Failing(format!("{why}; {from}")),
            Err(not) => Verdict::FewSources(not),
        }
    }

    /// Gives backend `id` of VIP `vi` the evidence `why`; its history
    /// starts again (a verdict uses its evidence up: the backend is judged
    /// again on traffic after it).
    fn feed_evidence(&mut self, vi: usize, id: u32, why: String) -> bool {
        let Some(sched) = self.sched.as_mut() else {
            return false;
        };
        let Some(snap) = sched.observe_passive(u64::from(id), why) else {
            return false;
        };
        if let Some(t) = self.passive.tracked.get_mut(&id) {
            t.history.restart();
        }
        let Some(b) = self.vips[vi].backends.iter_mut().find(|b| b.id == id) else {
            return false;
        };
        b.snapshot = Some(snap);
        true
    }
}

impl Daemon {
    /// `passive` of backend `b` of VIP `v` in `xlb status` (`None` unless
    /// its VIP has passive detection).
    pub(super) fn passive_status(
        &self,
        v: &super::model::Vip,
        b: &super::model::Backend,
    ) -> Option<crate::ctl::PassiveStatus> {
        if !v.cfg.passive.enabled {
            return None;
        }
        let t = self.passive.tracked.get(&b.id);
        let w = t.map(|t| t.window).unwrap_or_default();
        let c = t
            .and_then(|t| t.history.totals())
            .copied()
            .unwrap_or_default();
        Some(crate::ctl::PassiveStatus {
            window_ms: u64::try_from(v.cfg.passive.window.as_millis()).unwrap_or(u64::MAX),
            requests_due: w.requests_due,
            unanswered: w.unanswered,
            reset_requests: w.reset_requests,
            abandoned: w.abandoned,
            connects_due: w.connects_due,
            connect_failures: w.connect_failures,
            responses: w.responses,
            mean_response_ms: w.mean_response.map(|d| d.as_secs_f64() * 1e3),
            verdict: t.map_or("too_few", |t| t.verdict.as_str()).to_owned(),
            sources: t.and_then(|t| match &t.verdict {
                Verdict::FewSources(why) => Some(why.clone()),
                _ => None,
            }),
            evidence: b.snapshot.as_ref().and_then(|s| s.passive.clone()),
            totals: crate::ctl::PassiveTotals {
                connects: c.connects,
                connected: c.connected,
                connect_timeouts: c.connect_timeouts,
                resets: c.resets,
                requests: c.requests,
                responses: c.responses,
                unanswered: c.unanswered,
                abandoned: c.abandoned,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use aya::maps::{Map, PerCpuArray, PerCpuValues};

    use super::*;

    /// Issue 38: a hung backend out by passive evidence, back by a probe,
    /// was out again 60 ms later on "24 of 24 requests unanswered": the
    /// requests of its hang, judged when their clients gave up.
    #[test]
    fn evidence_from_before_a_backends_return_is_not_judged() {
        let th = passive::Thresholds {
            window: Duration::from_secs(2),
            response_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            min_requests: 5,
            failure_threshold: 0.5,
            peer_factor: 2.0,
        };
        let keep = Duration::from_secs(4);
        let ms = Duration::from_millis;
        let at = |n: u64| PassiveStats {
            requests: n,
            unanswered: n,
            ..PassiveStats::default()
        };
        let t0 = Instant::now();
        let mut t = Tracked::new(1, "10.0.0.1:80".parse().unwrap());
        assert!(
            t.observe(t0, at(0), keep, &th, true),
            "in the table: judged"
        );
        // Out, its flows' requests going unanswered.
        for i in 1..=10 {
            assert!(!t.observe(t0 + ms(100 * i), at(2 * i), keep, &th, false));
            assert_eq!(t.verdict, Verdict::TooFew);
        }
        // Back at 1.1 s; the hang's requests judged as their clients give
        // up, within the response timeout: not judged, and forgotten.
        let back = t0 + ms(1100);
        assert!(!t.observe(back, at(30), keep, &th, true), "just back");
        assert!(
            !t.observe(back + ms(60), at(44), keep, &th, true),
            "60 ms after"
        );
        assert!(!t.observe(back + ms(900), at(48), keep, &th, true));
        assert!(
            t.observe(back + ms(1000), at(48), keep, &th, true),
            "past the grace"
        );
        assert_eq!(
            t.window.unanswered, 0,
            "the hang's evidence: {:?}",
            t.window
        );
        // What goes unanswered after the grace counts.
        assert!(t.observe(back + ms(3500), at(60), keep, &th, true));
        assert!(t.window.unanswered > 0, "{:?}", t.window);
        // An id that changes hands starts afresh, in the table.
        let mut u = Tracked::new(2, "10.0.0.2:80".parse().unwrap());
        assert!(u.observe(t0, at(5), keep, &th, true));
    }

    #[test]
    fn a_missing_map_is_warned_once_and_tried_again_later() {
        let mut p = Passive::default();
        let t0 = Instant::now();
        let dir = Path::new("/nonexistent/xlb-passive-test");
        assert!(p.read(dir, 4, t0).is_none());
        assert_eq!(p.failed_at, Some(t0));
        // Not again within RETRY: no second warning, no second attempt.
        assert!(p.read(dir, 4, t0 + Duration::from_secs(1)).is_none());
        assert_eq!(p.failed_at, Some(t0));
        let later = t0 + RETRY;
        assert!(p.read(dir, 4, later).is_none());
        assert_eq!(p.failed_at, Some(later));
    }

    /// The daemon's read of a real per-CPU array, a different value on
    /// every CPU. Needs root (CAP_BPF); says so and passes without it.
    #[test]
    fn every_cpu_is_summed_for_every_backend_id() {
        const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
        let size = size_of::<PassiveStats>() as u32;
        let Some(data) = batch::test_map(BPF_MAP_TYPE_PERCPU_ARRAY, 4, size, 16) else {
            eprintln!("skipped: creating a BPF map needs root");
            return;
        };
        let mut map = Map::PerCpuArray(data);
        let cpus = aya::util::nr_cpus().unwrap() as u64;
        let mut typed = PerCpuArray::<_, PassiveStats>::try_from(&mut map).unwrap();
        for id in 0..3u64 {
            let per_cpu: Vec<PassiveStats> = (0..cpus)
                .map(|c| PassiveStats {
                    requests: 100 * id + c,
                    responses: 90 * id,
                    unanswered: c,
                    ..PassiveStats::default()
                })
                .collect();
            typed
                .set(id as u32, PerCpuValues::try_from(per_cpu).unwrap(), 0)
                .unwrap();
        }
        let Map::PerCpuArray(data) = map else {
            unreachable!()
        };
        let mut p = Passive {
            map: Some(data),
            ..Passive::default()
        };
        let sums = p.read(Path::new("/unused"), 4, Instant::now()).unwrap();
        let spread: u64 = (0..cpus).sum();
        assert_eq!(sums.len(), 4);
        assert_eq!(
            (sums[2].requests, sums[2].responses, sums[2].unanswered),
            (200 * cpus + spread, 180 * cpus, spread)
        );
        assert_eq!(sums[3], PassiveStats::default());
    }
}
