//! What `xlb top` shows, as plain data: two status snapshots turned into
//! rows with rates, sorted and filtered, and the latest events. No terminal
//! and no socket here, so every figure is unit-tested.

use std::cmp::Ordering;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Duration;

use crate::ctl::{BackendStatus, Event, StatusReport, VipStatus};

/// Events kept for the view: more than any terminal shows at once.
pub const EVENTS_KEPT: usize = 200;

/// One status answer and when it arrived (on a monotonic clock: any
/// origin, only differences count).
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub report: StatusReport,
    pub at: Duration,
}

/// Packets and new flows per second between two snapshots.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    pub packets: f64,
    pub new_flows: f64,
}

/// A line of the VIP table.
#[derive(Clone, Debug, PartialEq)]
pub struct VipRow {
    pub name: String,
    /// `10.100.0.1:80/tcp`, `[2001:db8::100]:53/udp`.
    pub endpoint: String,
    /// `dsr-ipip`, `dsr-l2`.
    pub mode: String,
    pub up: u32,
    pub total: u32,
    /// `None` until a second snapshot, or when the counters went back
    /// (the maps were recreated).
    pub rates: Option<Rates>,
    /// Established flows of its backends (`None` before the first walk).
    pub flows: Option<u64>,
    /// Panic or a slow fleet, with the daemon's words.
    pub note: Option<String>,
}

/// A line of the backend table.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendRow {
    pub vip: String,
    /// `ip:port` or `[v6]:port`.
    pub address: String,
    /// The state, or the placement where it says more (as `xlb status`).
    pub state: String,
    /// Time in that state, ms (`None`: unknown).
    pub for_ms: Option<u64>,
    /// Why it is not serving, or empty.
    pub reason: String,
    /// The last probe's latency, ms (`None`: not probed yet).
    pub latency_ms: Option<f64>,
    pub rates: Option<Rates>,
    /// Established flows (`None` before the first walk of conntrack).
    pub flows: Option<u64>,
}

/// The backend table's order; `s` cycles through them in this order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortKey {
    /// As in the configuration.
    #[default]
    Config,
    /// Down first, then the other out-of-table states, unknown, up.
    State,
    /// Slowest last probe first.
    Latency,
    /// Most new flows per second first.
    NewFlows,
    /// Most packets per second first.
    Packets,
    /// Most established flows first.
    Flows,
    /// By address.
    Backend,
}

impl SortKey {
    pub const ALL: [SortKey; 7] = [
        SortKey::Config,
        SortKey::State,
        SortKey::Latency,
        SortKey::NewFlows,
        SortKey::Packets,
        SortKey::Flows,
        SortKey::Backend,
    ];

    /// The next key in [`SortKey::ALL`], wrapping.
    pub fn next(self) -> SortKey {
        let i = Self::ALL.iter().position(|&k| k == self).unwrap_or(0);
        Self::ALL[(i + 1) % Self::ALL.len()]
    }

    /// As the header shows it: the column's heading, or `config`.
    pub fn label(self) -> &'static str {
        match self {
            SortKey::Config => "config",
            SortKey::State => "STATE",
            SortKey::Latency => "LATENCY",
            SortKey::NewFlows => "NEW/S",
            SortKey::Packets => "PKT/S",
            SortKey::Flows => "FLOWS",
            SortKey::Backend => "BACKEND",
        }
    }
}

/// The daemon as last seen: the latest two snapshots and the events.
#[derive(Debug, Default)]
pub struct Model {
    prev: Option<Snapshot>,
    cur: Option<Snapshot>,
    events: VecDeque<Event>,
    last_seq: Option<u64>,
}

impl Model {
    /// Takes a status answer that arrived at `at`. A daemon that restarted
    /// (another start time) numbers its events from 1 again: the events
    /// are fetched afresh.
    pub fn push_status(&mut self, report: StatusReport, at: Duration) {
        if let Some(cur) = &self.cur
            && cur.report.started_unix_ms != report.started_unix_ms
        {
            self.events.clear();
            self.last_seq = None;
        }
        self.prev = self.cur.take();
        self.cur = Some(Snapshot { report, at });
    }

    /// Takes an answer to `events` (oldest first); events already seen are
    /// skipped, and only the latest [`EVENTS_KEPT`] kept.
    pub fn push_events(&mut self, events: Vec<Event>) {
        for e in events {
            if self.last_seq.is_some_and(|s| e.seq <= s) {
                continue;
            }
            self.last_seq = Some(e.seq);
            self.events.push_back(e);
        }
        while self.events.len() > EVENTS_KEPT {
            self.events.pop_front();
        }
    }

    /// What to ask `events` for next: everything after the last one seen.
    pub fn since_seq(&self) -> Option<u64> {
        self.last_seq
    }

    /// The latest status, if any.
    pub fn report(&self) -> Option<&StatusReport> {
        self.cur.as_ref().map(|s| &s.report)
    }

    /// VIP names in configuration order.
    pub fn vip_names(&self) -> Vec<String> {
        self.report()
            .map(|r| r.vips.iter().map(|v| v.name.clone()).collect())
            .unwrap_or_default()
    }

    /// The VIP table: every VIP, or only `filter`.
    pub fn vip_rows(&self, filter: Option<&str>) -> Vec<VipRow> {
        let Some(cur) = &self.cur else {
            return Vec::new();
        };
        cur.report
            .vips
            .iter()
            .filter(|v| filter.is_none_or(|f| v.name == f))
            .map(|v| {
                let prev = self.prev_vip(&v.name);
                let rates = prev.and_then(|(p, dt)| {
                    rates((p.packets, p.new_flows), (v.packets, v.new_flows), dt)
                });
                vip_row(v, rates)
            })
            .collect()
    }

    /// The backend table: every backend of every VIP (or of `filter`),
    /// in the order of `sort`.
    pub fn backend_rows(
        &self,
        filter: Option<&str>,
        sort: SortKey,
        now_unix_ms: u64,
    ) -> Vec<BackendRow> {
        let Some(cur) = &self.cur else {
            return Vec::new();
        };
        let mut rows = Vec::new();
        for v in cur
            .report
            .vips
            .iter()
            .filter(|v| filter.is_none_or(|f| v.name == f))
        {
            for b in &v.backends {
                let rates = self.prev_backend(&v.name, &b.address).and_then(|(p, dt)| {
                    rates((p.packets, p.new_flows), (b.packets, b.new_flows), dt)
                });
                rows.push(backend_row(&v.name, b, rates, now_unix_ms));
            }
        }
        // Stable: ties keep the configuration order.
        rows.sort_by(|a, b| compare(a, b, sort));
        rows
    }

    /// The latest `n` events about `filter` (or any VIP), oldest first;
    /// events about no VIP (start, reload) are always shown.
    pub fn latest_events(&self, filter: Option<&str>, n: usize) -> Vec<&Event> {
        let mut out: Vec<&Event> = self
            .events
            .iter()
            .rev()
            .filter(|e| match (filter, e.vip.as_deref()) {
                (Some(f), Some(v)) => f == v,
                _ => true,
            })
            .take(n)
            .collect();
        out.reverse();
        out
    }

    /// VIP `name` in the previous snapshot and the time between the two.
    fn prev_vip(&self, name: &str) -> Option<(&VipStatus, f64)> {
        let (prev, cur) = (self.prev.as_ref()?, self.cur.as_ref()?);
        let dt = cur.at.checked_sub(prev.at)?.as_secs_f64();
        Some((prev.report.vip(name)?, dt))
    }

    fn prev_backend(&self, vip: &str, addr: &str) -> Option<(&BackendStatus, f64)> {
        let (v, dt) = self.prev_vip(vip)?;
        Some((v.backends.iter().find(|b| b.address == addr)?, dt))
    }
}

/// Per-second rates of `(packets, new flows)` from `before` to `after`
/// over `secs`; `None` over no time, or if a counter went back (the maps
/// were recreated, e.g. after `xlb detach`): a rate from that would be a
/// huge lie.
pub fn rates(before: (u64, u64), after: (u64, u64), secs: f64) -> Option<Rates> {
    if secs <= 0.0 || after.0 < before.0 || after.1 < before.1 {
        return None;
    }
    Some(Rates {
        packets: (after.0 - before.0) as f64 / secs,
        new_flows: (after.1 - before.1) as f64 / secs,
    })
}

fn vip_row(v: &VipStatus, rates: Option<Rates>) -> VipRow {
    let endpoint = match v.address.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!("[{}]:{}/{}", v.address, v.port, v.protocol),
        _ => format!("{}:{}/{}", v.address, v.port, v.protocol),
    };
    let flows = v
        .backends
        .iter()
        .map(|b| b.flows)
        .try_fold(0u64, |sum, f| Some(sum + f?));
    let note = match (&v.panic_reason, &v.fleet_slow) {
        (Some(p), _) => Some(format!("PANIC: {p}")),
        (None, Some(s)) => Some(format!("slow: {s}")),
        (None, None) if v.panic => Some("PANIC".to_owned()),
        (None, None) => None,
    };
    VipRow {
        name: v.name.clone(),
        endpoint,
        mode: v.mode.clone(),
        up: v.backends_up,
        total: v.backends_total,
        rates,
        flows: if v.backends.is_empty() { None } else { flows },
        note,
    }
}

fn backend_row(vip: &str, b: &BackendStatus, rates: Option<Rates>, now_unix_ms: u64) -> BackendRow {
    BackendRow {
        vip: vip.to_owned(),
        address: b.address.clone(),
        state: crate::cli::state_label(b).to_owned(),
        for_ms: (b.since_unix_ms > 0).then(|| now_unix_ms.saturating_sub(b.since_unix_ms)),
        reason: reason(b, now_unix_ms),
        latency_ms: b.last_probe.as_ref().map(|p| p.latency_ms),
        rates,
        flows: b.flows,
    }
}

/// Why a backend is where it is, in the daemon's words: the placement's
/// reason (slow outlier, held down, panic, agent), an operator's drain,
/// or the failed probe that took it out; empty for a serving backend.
pub fn reason(b: &BackendStatus, now_unix_ms: u64) -> String {
    let mut parts = Vec::new();
    if b.admin_drained {
        parts.push(match b.drain_deadline_unix_ms {
            Some(t) if t <= now_unix_ms => "admin drain, deadline passed".to_owned(),
            Some(t) => format!("admin drain, down in {}", crate::cli::span(t - now_unix_ms)),
            None => "admin drain".to_owned(),
        });
    }
    match b.placement.as_str() {
        "ramping" => parts.push(format!(
            "slow start: weight {:.1} of {}",
            b.effective_weight, b.weight
        )),
        "serving" | "" | "draining" => {}
        _ => parts.extend(b.placement_reason.clone()),
    }
    if b.state == "down" && parts.is_empty() {
        // The probe that keeps it down says more than the transition
        // (which may be older); the transition when the probe passed
        // (e.g. rising again).
        let probe = b
            .last_probe
            .as_ref()
            .filter(|p| !p.ok)
            .map(|p| p.reason.clone());
        parts.extend(probe.or_else(|| b.last_transition_reason.clone()));
    }
    if b.state == "unknown" && parts.is_empty() {
        parts.push("not probed yet".to_owned());
    }
    parts.join("; ")
}

/// How bad a state is, for sorting: 0 = out and failing, 3 = up.
fn severity(state: &str) -> u8 {
    match state {
        "down" | "agent_down" => 0,
        "draining" | "ejected_slow" | "held_down" | "panic_restored" | "agent_drain"
        | "agent_maint" => 1,
        "up" | "ramping" => 3,
        _ => 2,
    }
}

fn compare(a: &BackendRow, b: &BackendRow, sort: SortKey) -> Ordering {
    // Highest first; a missing figure last.
    fn desc(a: Option<f64>, b: Option<f64>) -> Ordering {
        match (a, b) {
            (Some(x), Some(y)) => y.total_cmp(&x),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        }
    }
    match sort {
        SortKey::Config => Ordering::Equal,
        SortKey::State => severity(&a.state).cmp(&severity(&b.state)),
        SortKey::Latency => desc(a.latency_ms, b.latency_ms),
        SortKey::NewFlows => desc(a.rates.map(|r| r.new_flows), b.rates.map(|r| r.new_flows)),
        SortKey::Packets => desc(a.rates.map(|r| r.packets), b.rates.map(|r| r.packets)),
        SortKey::Flows => desc(a.flows.map(|f| f as f64), b.flows.map(|f| f as f64)),
        SortKey::Backend => address_key(&a.address).cmp(&address_key(&b.address)),
    }
}

/// An address as `(ip, port)` so that 10.0.0.9 sorts before 10.0.0.10;
/// anything unparsable after every address.
fn address_key(s: &str) -> (bool, Option<std::net::SocketAddr>, &str) {
    let addr = s.parse().ok();
    (addr.is_none(), addr, s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::tests::{SAMPLE_NOW_MS, sample_event, sample_report};
    use crate::ctl::{EventKind, ProbeStatus};

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    /// The sample report with VIP `api`'s and each backend's counters
    /// advanced by `(packets, new flows)`.
    fn advanced(by: &[(u64, u64)], vip: (u64, u64)) -> StatusReport {
        let mut r = sample_report();
        let v = &mut r.vips[0];
        v.packets += vip.0;
        v.new_flows += vip.1;
        for (b, &(p, n)) in v.backends.iter_mut().zip(by) {
            b.packets += p;
            b.new_flows += n;
        }
        r
    }

    #[test]
    fn rates_come_from_counter_deltas() {
        let cases = [
            ("a second", (100, 10), (1100, 60), 1.0, Some((1000.0, 50.0))),
            ("half a second", (0, 0), (500, 5), 0.5, Some((1000.0, 10.0))),
            ("nothing moved", (7, 7), (7, 7), 2.0, Some((0.0, 0.0))),
            ("no time", (0, 0), (5, 5), 0.0, None),
            ("packets went back", (100, 0), (5, 1), 1.0, None),
            ("new flows went back", (0, 100), (5, 1), 1.0, None),
        ];
        for (name, before, after, dt, want) in cases {
            let got = rates(before, after, dt).map(|r| (r.packets, r.new_flows));
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn rows_have_rates_from_the_second_snapshot_on() {
        let mut m = Model::default();
        m.push_status(sample_report(), secs(10.0));
        assert!(m.vip_rows(None).iter().all(|v| v.rates.is_none()));
        let first = m.backend_rows(None, SortKey::Config, SAMPLE_NOW_MS);
        assert!(first.iter().all(|b| b.rates.is_none()), "{first:?}");

        m.push_status(
            advanced(&[(400, 12), (0, 0), (834, 0)], (1234, 12)),
            secs(12.0),
        );
        let vips = m.vip_rows(None);
        assert_eq!(
            vips[0].rates,
            Some(Rates {
                packets: 617.0,
                new_flows: 6.0
            })
        );
        let rows = m.backend_rows(None, SortKey::Config, SAMPLE_NOW_MS);
        let got: Vec<(&str, Option<(f64, f64)>)> = rows
            .iter()
            .map(|b| {
                (
                    b.address.as_str(),
                    b.rates.map(|r| (r.packets, r.new_flows)),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("10.99.0.11:80", Some((200.0, 6.0))),
                ("10.99.0.12:80", Some((0.0, 0.0))),
                ("10.99.0.13:80", Some((417.0, 0.0))),
            ]
        );
    }

    #[test]
    fn a_backend_added_by_a_reload_has_no_rate_yet() {
        let mut m = Model::default();
        m.push_status(sample_report(), secs(1.0));
        let mut r = advanced(&[(10, 1), (0, 0), (0, 0)], (10, 1));
        let mut added = r.vips[0].backends[0].clone();
        added.address = "10.99.0.14:80".to_owned();
        r.vips[0].backends.push(added);
        m.push_status(r, secs(2.0));
        let rows = m.backend_rows(None, SortKey::Config, SAMPLE_NOW_MS);
        assert!(rows[0].rates.is_some());
        assert_eq!(rows[3].address, "10.99.0.14:80");
        assert_eq!(rows[3].rates, None);
    }

    #[test]
    fn vip_rows_carry_endpoint_counts_flows_and_notes() {
        let mut m = Model::default();
        let mut r = sample_report();
        let mut v6 = r.vips[0].clone();
        v6.name = "v6".to_owned();
        v6.address = "2001:db8::100".to_owned();
        v6.protocol = "udp".to_owned();
        v6.port = 53;
        v6.panic = true;
        v6.panic_reason = Some("1 of 3 backends healthy".to_owned());
        r.vips.push(v6);
        m.push_status(r, secs(1.0));
        let rows = m.vip_rows(None);
        assert_eq!(rows[0].endpoint, "10.100.0.1:80/tcp");
        assert_eq!((rows[0].up, rows[0].total), (2, 3));
        // One backend not walked yet: no total.
        assert_eq!(rows[0].flows, None);
        assert_eq!(rows[0].note, None);
        assert_eq!(rows[1].endpoint, "[2001:db8::100]:53/udp");
        assert_eq!(
            rows[1].note.as_deref(),
            Some("PANIC: 1 of 3 backends healthy")
        );
        assert_eq!(m.vip_rows(Some("v6")).len(), 1);
        assert_eq!(m.vip_rows(Some("nope")).len(), 0);
        assert_eq!(m.vip_names(), ["api", "v6"]);
    }

    #[test]
    fn reasons_say_why_a_backend_is_out() {
        let now = SAMPLE_NOW_MS;
        let base = sample_report().vips[0].backends[1].clone();
        let with = |f: &dyn Fn(&mut BackendStatus)| {
            let mut b = base.clone();
            f(&mut b);
            b
        };
        let cases = [
            (
                "down: the failing probe",
                base.clone(),
                "connected, no HTTP response within 1s",
            ),
            (
                "down, probe passing again: the transition",
                with(&|b| {
                    b.last_probe = Some(ProbeStatus {
                        ok: true,
                        reason: "ok 200".to_owned(),
                        code: "ok".to_owned(),
                        ..ProbeStatus::default()
                    });
                    b.last_transition_reason = Some("2 probes failed".to_owned());
                }),
                "2 probes failed",
            ),
            (
                "serving",
                with(&|b| {
                    b.state = "up".to_owned();
                    b.placement = "serving".to_owned();
                }),
                "",
            ),
            (
                "ejected",
                with(&|b| {
                    b.state = "draining".to_owned();
                    b.placement = "ejected_slow".to_owned();
                    b.placement_reason = Some("slow outlier: answers in 2s".to_owned());
                }),
                "slow outlier: answers in 2s",
            ),
            (
                "admin drain with a deadline",
                with(&|b| {
                    b.state = "draining".to_owned();
                    b.placement = "draining".to_owned();
                    b.admin_drained = true;
                    b.drain_deadline_unix_ms = Some(now + 240_000);
                }),
                "admin drain, down in 4m",
            ),
            (
                "ramping",
                with(&|b| {
                    b.state = "up".to_owned();
                    b.placement = "ramping".to_owned();
                    b.effective_weight = 0.3;
                }),
                "slow start: weight 0.3 of 1",
            ),
            (
                "unknown",
                with(&|b| {
                    b.state = "unknown".to_owned();
                    b.placement = "unknown".to_owned();
                    b.last_probe = None;
                }),
                "not probed yet",
            ),
        ];
        for (name, b, want) in cases {
            assert_eq!(reason(&b, now), want, "{name}");
        }
    }

    #[test]
    fn sorting_cycles_through_the_columns() {
        let mut seen = vec![SortKey::Config];
        let mut k = SortKey::Config.next();
        while k != SortKey::Config {
            seen.push(k);
            k = k.next();
        }
        assert_eq!(seen, SortKey::ALL);

        // 10.99.0.11 up (1.2 ms, 3712 flows), .12 down (no flows walked),
        // .13 draining (0.9 ms, 37 flows); a fourth, .9, up and slow.
        let with_nine = |mut r: StatusReport| {
            let mut nine = r.vips[0].backends[0].clone();
            nine.address = "10.99.0.9:80".to_owned();
            nine.flows = Some(5);
            if let Some(p) = nine.last_probe.as_mut() {
                p.latency_ms = 40.0;
            }
            r.vips[0].backends.push(nine);
            r
        };
        let mut m = Model::default();
        m.push_status(with_nine(sample_report()), secs(1.0));
        let mut r = with_nine(sample_report());
        for (b, (p, n)) in r.vips[0]
            .backends
            .iter_mut()
            .zip([(10, 3), (0, 0), (30, 0), (20, 1)])
        {
            b.packets += p;
            b.new_flows += n;
        }
        m.push_status(r, secs(2.0));
        let order = |k: SortKey| -> Vec<String> {
            m.backend_rows(None, k, SAMPLE_NOW_MS)
                .into_iter()
                .map(|b| b.address.trim_end_matches(":80").to_owned())
                .collect()
        };
        let cases = [
            (
                SortKey::Config,
                ["10.99.0.11", "10.99.0.12", "10.99.0.13", "10.99.0.9"],
            ),
            (
                SortKey::State,
                ["10.99.0.12", "10.99.0.13", "10.99.0.11", "10.99.0.9"],
            ),
            (
                SortKey::Latency,
                ["10.99.0.12", "10.99.0.9", "10.99.0.11", "10.99.0.13"],
            ),
            (
                SortKey::NewFlows,
                ["10.99.0.11", "10.99.0.9", "10.99.0.12", "10.99.0.13"],
            ),
            (
                SortKey::Packets,
                ["10.99.0.13", "10.99.0.9", "10.99.0.11", "10.99.0.12"],
            ),
            (
                SortKey::Flows,
                ["10.99.0.11", "10.99.0.13", "10.99.0.9", "10.99.0.12"],
            ),
            (
                SortKey::Backend,
                ["10.99.0.9", "10.99.0.11", "10.99.0.12", "10.99.0.13"],
            ),
        ];
        for (key, want) in cases {
            assert_eq!(order(key), want, "{key:?}");
        }
    }

    #[test]
    fn filtering_keeps_one_vip_and_its_events() {
        let mut m = Model::default();
        let mut r = sample_report();
        let mut web = r.vips[0].clone();
        web.name = "web".to_owned();
        r.vips.push(web);
        m.push_status(r, secs(1.0));
        assert_eq!(
            m.backend_rows(None, SortKey::Config, SAMPLE_NOW_MS).len(),
            6
        );
        let web_rows = m.backend_rows(Some("web"), SortKey::Config, SAMPLE_NOW_MS);
        assert!(web_rows.len() == 3 && web_rows.iter().all(|b| b.vip == "web"));

        let mut start = sample_event(1);
        start.kind = EventKind::Start;
        start.vip = None;
        let mut of_web = sample_event(3);
        of_web.vip = Some("web".to_owned());
        m.push_events(vec![start, sample_event(2), of_web]);
        let seqs = |f: Option<&str>, n| -> Vec<u64> {
            m.latest_events(f, n).iter().map(|e| e.seq).collect()
        };
        assert_eq!(seqs(None, 10), [1, 2, 3]);
        assert_eq!(seqs(None, 2), [2, 3]);
        assert_eq!(seqs(Some("web"), 10), [1, 3]);
        assert_eq!(seqs(Some("api"), 10), [1, 2]);
    }

    #[test]
    fn events_are_taken_once_and_refetched_after_a_restart() {
        let mut m = Model::default();
        assert_eq!(m.since_seq(), None);
        m.push_status(sample_report(), secs(1.0));
        m.push_events((1..=3).map(sample_event).collect());
        assert_eq!(m.since_seq(), Some(3));
        // An answer overlapping what we have adds only the new ones.
        m.push_events((2..=5).map(sample_event).collect());
        let seqs: Vec<u64> = m.latest_events(None, 100).iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1, 2, 3, 4, 5]);

        m.push_events((6..=EVENTS_KEPT as u64 + 10).map(sample_event).collect());
        let kept = m.latest_events(None, usize::MAX);
        assert_eq!(kept.len(), EVENTS_KEPT);
        assert_eq!(kept[0].seq, 11);

        // Same daemon: the events stay.
        m.push_status(sample_report(), secs(2.0));
        assert_eq!(m.since_seq(), Some(EVENTS_KEPT as u64 + 10));
        // Restarted: numbering starts again, so everything is fetched anew.
        let mut restarted = sample_report();
        restarted.started_unix_ms += 60_000;
        m.push_status(restarted, secs(3.0));
        assert_eq!(m.since_seq(), None);
        assert!(m.latest_events(None, 10).is_empty());
        m.push_events(vec![sample_event(1)]);
        assert_eq!(m.since_seq(), Some(1));
    }
}
