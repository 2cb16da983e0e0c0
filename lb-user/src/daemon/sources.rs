//! Heavy hitters in the daemon: every tick, the latest walk of the
//! per-source map (taken on its own thread, see [`walk`]) goes through the
//! pure model (`guard::sources`): rates per source, the heaviest sources per
//! VIP (`xlb sources`, metrics), `source` events when a source goes above
//! or back below its VIP's `source_alert`, and the VIP's deny list gets an
//! `Auto` entry when a source's established flows stay above `auto_block`
//! for its `for` (in batches: [`block`]).

mod block;
mod walk;

pub use walk::walk_sources;

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::bail;
use lb_ctl::{EntryOrigin, ListKind, SourceRow, SourceVerdict, VipSources};
use tracing::{info, warn};

use super::Daemon;
use crate::{
    config::{AutoBlock, SourceAlert},
    ctl::EventKind,
    guard::lists::Cover,
    guard::sources::{
        AlertChange, AlertRule, Alerts, CLEAR_FACTOR, CLEAR_SAMPLES, ClearedBy, SourceRate,
        Sustain, SustainRule, TOP, VipSummary, key_prefix, key_text, metric_sources,
    },
    metrics::guard::{GuardExtra, ListCount, VipGuardExtra},
};

const ORIGINS: [EntryOrigin; 3] = [EntryOrigin::Config, EntryOrigin::Runtime, EntryOrigin::Auto];

/// An origin as the metrics label it (as in the protocol's JSON).
fn origin_str(o: EntryOrigin) -> &'static str {
    match o {
        EntryOrigin::Config => "config",
        EntryOrigin::Runtime => "runtime",
        EntryOrigin::Auto => "auto",
    }
}

/// Most sources per VIP in the metrics (`xlb_source_new_flows_per_second`),
/// of those above `source_alert`: bounded label cardinality.
pub(crate) const METRICS_TOP: usize = 10;

/// What the daemon keeps between walks.
#[derive(Debug, Default)]
pub(super) struct Watch {
    /// The walking thread's latest walk; `None` until it is started.
    latest: Option<walk::Latest>,
    alerts: Alerts,
    sustain: Sustain,
    /// The latest summary per VIP id.
    summary: BTreeMap<u32, VipSummary>,
    /// The slowest walk so far (logged when it grows past 50 ms).
    slowest: Duration,
    /// Per VIP id, the sources its metric shows ([`metric_sources`]).
    shown: BTreeMap<u32, Vec<SourceRate>>,
    /// Per VIP name, its deny and allow entries indexed, and the lists'
    /// [`changes`](crate::guard::lists::Lists::changes) they were built at:
    /// rebuilt when the lists change, not every tick.
    covers: HashMap<String, (u64, Cover, Cover)>,
    /// Saves of the state file made off the main loop ([`block`]).
    pub(super) saves: block::Saves,
}

fn alert_rule(a: &SourceAlert) -> AlertRule {
    AlertRule {
        rate_per_s: a.rate_per_s,
        share: a.share,
        min_rate_per_s: a.min_rate_per_s,
    }
}

fn sustain_rule(a: &AutoBlock) -> SustainRule {
    SustainRule {
        above_per_s: a.above_per_s,
        sustained: a.sustained,
    }
}

/// A rate as the events write it: whole numbers, one decimal below 10.
fn per_s(x: f64) -> String {
    if x < 10.0 {
        format!("{x:.1}/s")
    } else {
        format!("{x:.0}/s")
    }
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

impl Daemon {
    /// Every tick: the insert-cap alarm, then the latest walk of the
    /// sources map through rates, alerts and auto_block.
    pub(super) fn check_sources(&mut self, counters: Option<&super::alarms::Counters>) {
        if let Some(c) = counters {
            self.check_insert_cap(c);
        }
        let latest = self.sources.latest.get_or_insert_with(|| {
            let latest = Arc::new(Mutex::new(None));
            let pin = super::persist::pin_dir(&self.cfg.daemon.pinned.instance)
                .join(lb_common::MAP_SOURCES);
            walk::spawn(pin, Arc::clone(&latest));
            latest
        });
        let Some(w) = latest.lock().ok().and_then(|mut l| l.take()) else {
            return;
        };
        if w.took > self.sources.slowest && w.took > Duration::from_millis(50) {
            self.sources.slowest = w.took;
            info!(
                "walking the sources map took {} ms for {} entries (its own thread)",
                w.took.as_millis(),
                w.entries
            );
        }
        if let Some(summary) = w.summary {
            self.sources.summary = summary;
        }
        let Some(((from, now), rates)) = w.rated else {
            return;
        };
        let ids: Vec<u32> = self.vips.iter().map(|v| v.id).collect();
        self.sources.alerts.retain_vips(&ids);
        self.sources.sustain.retain_vips(&ids);
        let mut budget = block::MAX_PER_TICK;
        let mut due = Vec::new();
        for vi in 0..self.vips.len() {
            self.judge_alerts(vi);
            self.choose_shown(vi);
            let d = self.judge_auto_block(vi, &rates, (from, now), budget);
            budget -= d.len();
            if !d.is_empty() {
                due.push((vi, d));
            }
        }
        self.auto_block(due);
    }

    /// The sources VIP `vi`'s metric shows from now on.
    fn choose_shown(&mut self, vi: usize) {
        let id = self.vips[vi].id;
        if self.vips[vi].cfg.guard.alert.is_none() {
            // Nothing is heavy without an alert: no scan of every source.
            self.sources.shown.remove(&id);
            return;
        }
        let empty = VipSummary::default();
        let summary = self.sources.summary.get(&id).unwrap_or(&empty);
        let prev: Vec<_> = self
            .sources
            .shown
            .get(&id)
            .map(|v| v.iter().map(|r| r.key).collect())
            .unwrap_or_default();
        let alerts = &self.sources.alerts;
        let shown = metric_sources(&prev, summary, |k| alerts.is_heavy(k), METRICS_TOP);
        self.sources.shown.insert(id, shown);
    }

    /// VIP `vi`'s `source_alert`: one `source` event per source that went
    /// heavy or back to normal.
    fn judge_alerts(&mut self, vi: usize) {
        let vip = &self.vips[vi];
        let rule = vip.cfg.guard.alert.as_ref().map(alert_rule);
        let changes =
            self.sources
                .alerts
                .update(vip.id, rule.as_ref(), self.sources.summary.get(&vip.id));
        let name = vip.cfg.name.clone();
        let total = self
            .sources
            .summary
            .get(&vip.id)
            .map_or(0.0, |s| s.new_flows_per_s);
        for c in changes {
            let text = alert_text(&name, &c, total, rule.as_ref());
            let to = if c.cleared.is_none() {
                warn!("{text}");
                "heavy"
            } else {
                info!("{text}");
                "normal"
            };
            let from = if to == "heavy" { "normal" } else { "heavy" };
            self.event(
                EventKind::Source,
                Some(&name),
                None,
                Some(from),
                Some(to),
                text,
                None,
            );
        }
    }

    /// VIP `vi`'s `auto_block`: its sources whose established flows stayed
    /// above its rate for its `for`, at most `budget` of them (the rest
    /// stay due for the next ticks). A source an allow entry covers is
    /// never due, nor one a deny entry already covers.
    fn judge_auto_block(
        &mut self,
        vi: usize,
        rates: &[SourceRate],
        interval: (Duration, Duration),
        budget: usize,
    ) -> Vec<SourceRate> {
        let vip = &self.vips[vi];
        let vip_id = vip.id;
        let rule = vip.cfg.guard.auto_block.as_ref().map(sustain_rule);
        let Watch {
            sustain, covers, ..
        } = &mut self.sources;
        let Some(rule) = rule else {
            return sustain.update(vip_id, None, rates, interval, budget, |_| false);
        };
        let changes = self.lists.changes();
        let name = &vip.cfg.name;
        let fresh = covers.get(name).is_some_and(|(at, ..)| *at == changes);
        if !fresh {
            let deny = self.lists.cover(ListKind::Deny, name);
            let allow = self.lists.cover(ListKind::Allow, name);
            covers.insert(name.clone(), (changes, deny, allow));
        }
        let (_, deny, allow) = &covers[name];
        sustain.update(vip_id, Some(&rule), rates, interval, budget, |k| {
            let addr = key_prefix(k).0;
            deny.covers(addr) || allow.covers(addr)
        })
    }

    /// `xlb sources`: the heaviest sources of one VIP or of every VIP.
    pub(super) fn sources_report(&self, vip: Option<&str>) -> anyhow::Result<Vec<VipSources>> {
        if let Some(name) = vip
            && !self.vips.iter().any(|v| v.cfg.name == name)
        {
            let names: Vec<&str> = self.vips.iter().map(|v| v.cfg.name.as_str()).collect();
            bail!("no VIP named {name:?}; the VIPs are {}", names.join(", "));
        }
        let empty = VipSummary::default();
        let report = self
            .vips
            .iter()
            .filter(|v| vip.is_none_or(|n| v.cfg.name == n))
            .map(|v| {
                let s = self.sources.summary.get(&v.id).unwrap_or(&empty);
                let rows = s.top(TOP).map(|r| SourceRow {
                    prefix: key_text(&r.key),
                    new_flows_per_s: r.new_flows_per_s,
                    packets_per_s: r.packets_per_s,
                    limited_per_s: r.limited_per_s,
                    share: s.share(r),
                    verdict: self.verdict(v.id, r),
                });
                VipSources {
                    vip: v.cfg.name.clone(),
                    new_flows_per_s: s.new_flows_per_s,
                    tracked: s.tracked,
                    sources: rows.collect(),
                }
            });
        Ok(report.collect())
    }

    /// How a source is treated now: an allow entry wins over a deny entry
    /// (as in the data plane), then the rate limit.
    fn verdict(&self, vip_id: u32, r: &SourceRate) -> SourceVerdict {
        let addr: IpAddr = key_prefix(&r.key).0;
        if self.list_covers(ListKind::Allow, vip_id, addr) {
            SourceVerdict::Allowed
        } else if self.list_covers(ListKind::Deny, vip_id, addr) {
            SourceVerdict::Blocked
        } else if r.limited_per_s > 0.0 {
            SourceVerdict::Limited
        } else {
            SourceVerdict::Ok
        }
    }

    /// What the metrics show of the sources: per VIP, how many are tracked
    /// and heavy, and at most [`METRICS_TOP`] heavy ones.
    pub(super) fn sources_metrics(&self) -> GuardExtra {
        let empty = VipSummary::default();
        let vips = self.vips.iter().map(|v| {
            let s = self.sources.summary.get(&v.id).unwrap_or(&empty);
            VipGuardExtra {
                vip: v.cfg.name.clone(),
                tracked: s.tracked,
                heavy: self.sources.alerts.heavy_count(v.id),
                top: self
                    .sources
                    .shown
                    .get(&v.id)
                    .map(|shown| {
                        shown
                            .iter()
                            .map(|r| (key_text(&r.key), r.new_flows_per_s))
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        });
        GuardExtra {
            vips: vips.collect(),
            lists: self.list_counts(),
        }
    }

    /// Entries per list and origin, every pair even at 0 (a series that
    /// exists from the start is one an alert rule can watch).
    fn list_counts(&self) -> Vec<ListCount> {
        let mut counts: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for list in [ListKind::Deny, ListKind::Allow] {
            for origin in ORIGINS {
                counts.insert((list.as_str(), origin_str(origin)), 0);
            }
        }
        for e in self.lists.iter() {
            *counts
                .entry((e.key.list.as_str(), origin_str(e.origin)))
                .or_default() += 1;
        }
        counts
            .into_iter()
            .map(|((list, origin), entries)| ListCount {
                list: list.to_owned(),
                origin: origin.to_owned(),
                entries,
            })
            .collect()
    }
}

/// The text of a `source` event.
fn alert_text(vip: &str, c: &AlertChange, total: f64, rule: Option<&AlertRule>) -> String {
    let src = key_text(&c.key);
    let now = format!(
        "{} new flows ({} of the VIP's {})",
        per_s(c.rate),
        pct(c.share),
        per_s(total)
    );
    match c.cleared {
        None => {
            let rule = rule.copied().unwrap_or(AlertRule {
                rate_per_s: None,
                share: None,
                min_rate_per_s: 0.0,
            });
            let why = if rule.rate_per_s.is_some_and(|t| c.rate > t) {
                format!(
                    "above source_alert rate {}",
                    per_s(rule.rate_per_s.unwrap_or(0.0))
                )
            } else {
                format!(
                    "above source_alert share {} (the VIP at least {})",
                    pct(rule.share.unwrap_or(0.0)),
                    per_s(rule.min_rate_per_s)
                )
            };
            format!(
                "source {src} of VIP {vip} is heavy: {now}, {why}. xlb sources --vip {vip} \
                 lists it; xlb block {src} --vip {vip} refuses it"
            )
        }
        Some(ClearedBy::Below) => format!(
            "source {src} of VIP {vip} back to normal: {now}, below {} of source_alert for \
             {CLEAR_SAMPLES} samples",
            pct(CLEAR_FACTOR)
        ),
        Some(ClearedBy::Gone) => format!(
            "source {src} of VIP {vip} back to normal: it is no longer in the sources map \
             (evicted by newer sources, or removed)"
        ),
        Some(ClearedBy::Unconfigured) => format!(
            "source {src} of VIP {vip} back to normal: the VIP has no source_alert any more"
        ),
    }
}
