//! Prometheus metrics: the text exposition format (version 0.0.4), written
//! from a [`StatusReport`] and served over a minimal HTTP/1.1 endpoint,
//! `GET /metrics`.
//!
//! Everything is rendered from one snapshot, so the numbers of one scrape
//! agree with each other and with `xlb status` at that moment. Each metric
//! family is a row of a table (name, type, help, and how to read its value
//! from the snapshot): the daemon's in [`daemon`], each VIP's in [`vip`],
//! each backend's in [`backend`]; [`exposition`] writes them out and
//! [`endpoint`] serves them.

mod backend;
mod daemon;
mod endpoint;
mod events;
mod exposition;
pub mod guard;
mod page;
mod vip;

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

pub use self::endpoint::{serve, serve_listener};
use self::exposition::Out;
use crate::ctl::StatusReport;

/// Upper bounds of the probe latency histogram buckets, seconds: from a
/// healthy LAN backend (sub-millisecond) to the longest sensible timeout.
pub const LATENCY_BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Probe latencies of one backend.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyHistogram {
    /// Observations per bucket (not cumulative): `buckets[i]` counts those
    /// in (`LATENCY_BUCKETS[i-1]`, `LATENCY_BUCKETS[i]`]; larger ones are
    /// only in `count`.
    buckets: [u64; LATENCY_BUCKETS.len()],
    /// Sum of all observations, seconds.
    sum: f64,
    count: u64,
}

impl LatencyHistogram {
    /// Records one probe's latency.
    pub fn observe(&mut self, latency: Duration) {
        let secs = latency.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|&le| secs <= le) {
            self.buckets[i] += 1;
        }
        self.sum += secs;
        self.count += 1;
    }

    /// `(upper bound in seconds, observations ≤ it)` per bucket, in order;
    /// the implicit `+Inf` bucket is [`LatencyHistogram::count`].
    pub fn cumulative(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        LATENCY_BUCKETS
            .iter()
            .zip(self.buckets.iter())
            .scan(0, |acc, (&le, &n)| {
                *acc += n;
                Some((le, *acc))
            })
    }

    /// Sum of all observations, seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// Failed probes of one backend by reason code (`FailReason::code`:
/// `no_response`, `unexpected_status`, `dns_rcode`…). A code appears at its
/// first failure: the set of codes is per probe kind and open-ended, and a
/// series of zeros for every code of every kind would bury the real ones.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProbeFailures(BTreeMap<&'static str, u64>);

impl ProbeFailures {
    /// Counts one failed probe.
    pub fn count(&mut self, code: &'static str) {
        *self.0.entry(code).or_default() += 1;
    }

    /// `(code, failed probes)` in code order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.0.iter().map(|(&c, &n)| (c, n))
    }
}

/// What the metrics need beyond a [`StatusReport`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsExtra {
    /// Keyed by (VIP name, backend `"ip:port"` as in
    /// [`crate::ctl::BackendStatus::address`]): the backend's probe
    /// latencies and its number of state transitions since the daemon started.
    pub per_backend: BTreeMap<(String, String), (LatencyHistogram, u64)>,
    /// Same keys: failed probes by reason code; absent before the first.
    pub probe_failures: BTreeMap<(String, String), ProbeFailures>,
    /// Sources and lists (abuse control).
    pub guard: guard::GuardExtra,
}

/// Where the endpoint gets its numbers, once per scrape.
pub trait MetricsSource: Send + Sync + 'static {
    /// The current status and extras. Called on the serving task, so it
    /// should only copy prepared data, not talk to the kernel.
    fn snapshot(&self) -> (StatusReport, MetricsExtra);

    /// The retained events with `seq` above `since`, oldest first, for
    /// `GET /events` (what `xlb events --since` lists). A source that keeps
    /// no events (a peer's snapshot, a test's) has none.
    fn events_since(&self, since: u64) -> Vec<crate::ctl::Event> {
        let _ = since;
        Vec::new()
    }
}

/// Errors of the metrics endpoint.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error(
        "cannot serve metrics on {addr}: {source}; set daemon.metrics_address to a free \
         address, or to \"\" to disable metrics"
    )]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
}

/// Every metric family this build exports, as (name, type).
fn families() -> Vec<(&'static str, exposition::Kind)> {
    let names = daemon::FAMILIES.iter().map(|f| (f.name, f.kind));
    let names = names.chain(vip::FAMILIES.iter().map(|f| (f.name, f.kind)));
    let names = names.chain(backend::FAMILIES.iter().map(|f| (f.name, f.kind)));
    let names = names.chain(guard::VIP_FAMILIES.iter().map(|f| (f.name, f.kind)));
    let names = names.chain(guard::SOURCE_FAMILIES.iter().map(|f| (f.name, f.kind)));
    names
        .chain(guard::LIST_FAMILIES.iter().map(|f| (f.name, f.kind)))
        .collect()
}

/// Every series name a scrape can hold: each family's, a histogram's as its
/// `_bucket`, `_sum` and `_count`. What the dashboard and alert rules in
/// `contrib/` are checked against, so they cannot name a metric xlb does
/// not have.
pub fn series_names() -> Vec<String> {
    let mut out = Vec::new();
    for (name, kind) in families() {
        if kind == exposition::Kind::Histogram {
            out.extend(["_bucket", "_sum", "_count"].map(|s| format!("{name}{s}")));
        } else {
            out.push(name.to_owned());
        }
    }
    out
}

/// Renders the exposition text of one snapshot.
pub fn render(status: &StatusReport, extra: &MetricsExtra) -> String {
    let mut out = Out::default();
    out.families(&daemon::FAMILIES, std::iter::once(status));
    out.families(&vip::FAMILIES, status.vips.iter());
    out.families(&backend::FAMILIES, backend::views(status, extra).iter());
    guard::write(&mut out, &extra.guard);
    out.into_text()
}

#[cfg(test)]
mod tests {
    use super::exposition::{escape_help, escape_label};
    use super::*;
    use crate::ctl::tests::sample_report;

    pub(super) fn sample_extra() -> MetricsExtra {
        let mut h = LatencyHistogram::default();
        for ms in [1.2, 0.3, 1000.4] {
            h.observe(Duration::from_secs_f64(ms / 1000.0));
        }
        let mut extra = MetricsExtra::default();
        extra
            .per_backend
            .insert(("api".to_owned(), "10.99.0.11:80".to_owned()), (h, 3));
        let mut failures = ProbeFailures::default();
        for code in ["no_response", "unexpected_status", "no_response"] {
            failures.count(code);
        }
        extra
            .probe_failures
            .insert(("api".to_owned(), "10.99.0.12:80".to_owned()), failures);
        extra.guard = guard::GuardExtra {
            vips: vec![guard::VipGuardExtra {
                vip: "api".to_owned(),
                tracked: 812,
                heavy: 1,
                top: vec![
                    ("198.51.100.7/32".to_owned(), 1000.0),
                    ("2001:db8:1:2::/64".to_owned(), 12.5),
                ],
            }],
            lists: vec![
                guard::ListCount {
                    list: "deny".to_owned(),
                    origin: "config".to_owned(),
                    entries: 2,
                },
                guard::ListCount {
                    list: "deny".to_owned(),
                    origin: "auto".to_owned(),
                    entries: 1,
                },
            ],
        };
        extra
    }

    #[test]
    fn histogram_buckets() {
        let mut h = LatencyHistogram::default();
        let cases = [
            ("below the first bound", Duration::from_micros(100)),
            ("on a bound", Duration::from_millis(1)),
            ("between bounds", Duration::from_millis(30)),
            ("above the last bound", Duration::from_secs(7)),
        ];
        for (_, d) in cases {
            h.observe(d);
        }
        let cum: Vec<(f64, u64)> = h.cumulative().collect();
        assert_eq!(
            cum,
            [
                (0.0005, 1),
                (0.001, 2),
                (0.0025, 2),
                (0.005, 2),
                (0.01, 2),
                (0.025, 2),
                (0.05, 3),
                (0.1, 3),
                (0.25, 3),
                (0.5, 3),
                (1.0, 3),
                (2.5, 3),
                (5.0, 3),
            ]
        );
        assert_eq!(h.count(), 4);
        assert!(
            (h.sum_seconds() - 7.0311).abs() < 1e-9,
            "{}",
            h.sum_seconds()
        );
    }

    #[test]
    fn text_of_a_sample_report() {
        let text = render(&sample_report(), &sample_extra());
        let want = [
            "# HELP xlb_packets_total Packets by data-plane outcome (forwards, passes, drops) and conntrack events.",
            "# TYPE xlb_packets_total counter",
            "xlb_packets_total{reason=\"fwd_tx\"} 0",
            "xlb_packets_total{reason=\"ct_hit\"} 20",
            "xlb_info{instance=\"default\",interface=\"eth0\",xdp_mode=\"native\"} 1",
            "xlb_start_time_seconds 1799989080",
            "xlb_adopted 1",
            "xlb_config_info{node=\"lb-a\",fingerprint=\"1f2e3d4c5b6a7988\",hash_key=\"0a1b2c3d4e5f6071\"} 1",
            "xlb_vip_config_info{vip=\"api\",fingerprint=\"5a6b7c8d9e0f1a2b\"} 1",
            "xlb_conntrack_entries 1234",
            "xlb_conntrack_capacity 1048576",
            "xlb_vip_info{vip=\"api\",address=\"10.100.0.1\",port=\"80\",protocol=\"tcp\",mode=\"dsr-ipip\",down_policy=\"rehash\"} 1",
            "xlb_vip_table_size{vip=\"api\"} 65537",
            "xlb_vip_panic{vip=\"api\"} 0",
            "xlb_vip_fleet_slow{vip=\"api\"} 0",
            "xlb_vip_backends_ejected_slow{vip=\"api\"} 0",
            "xlb_backend_placement{vip=\"api\",backend=\"10.99.0.11:80\",placement=\"serving\"} 1",
            "xlb_backend_placement{vip=\"api\",backend=\"10.99.0.12:80\",placement=\"down\"} 1",
            "xlb_backend_placement{vip=\"api\",backend=\"10.99.0.12:80\",placement=\"serving\"} 0",
            "xlb_backend_effective_weight{vip=\"api\",backend=\"10.99.0.11:80\"} 1",
            "xlb_backend_probe_local_errors_total{vip=\"api\",backend=\"10.99.0.11:80\"} 0",
            "xlb_backend_effective_weight{vip=\"api\",backend=\"10.99.0.12:80\"} 0",
            "xlb_vip_backends_up{vip=\"api\"} 2",
            "xlb_vip_backends{vip=\"api\"} 3",
            "# TYPE xlb_vip_packets_total counter",
            "xlb_vip_packets_total{vip=\"api\"} 1000000",
            "xlb_vip_bytes_total{vip=\"api\"} 900000000",
            "xlb_vip_new_flows_total{vip=\"api\"} 50000",
            "xlb_backend_up{vip=\"api\",backend=\"10.99.0.11:80\"} 1",
            "xlb_backend_up{vip=\"api\",backend=\"10.99.0.12:80\"} 0",
            "xlb_backend_state{vip=\"api\",backend=\"10.99.0.12:80\",state=\"up\"} 0",
            "xlb_backend_state{vip=\"api\",backend=\"10.99.0.12:80\",state=\"down\"} 1",
            "xlb_backend_state{vip=\"api\",backend=\"10.99.0.13:80\",state=\"draining\"} 1",
            "xlb_backend_admin_drained{vip=\"api\",backend=\"10.99.0.13:80\"} 1",
            "xlb_backend_weight{vip=\"api\",backend=\"10.99.0.13:80\"} 2",
            "# TYPE xlb_backend_flows gauge",
            "xlb_backend_flows{vip=\"api\",backend=\"10.99.0.11:80\"} 3712",
            "xlb_backend_flows{vip=\"api\",backend=\"10.99.0.13:80\"} 37",
            "# TYPE xlb_backend_probe_latency_seconds histogram",
            "xlb_backend_probe_latency_seconds_bucket{vip=\"api\",backend=\"10.99.0.11:80\",le=\"0.0005\"} 1",
            "xlb_backend_probe_latency_seconds_bucket{vip=\"api\",backend=\"10.99.0.11:80\",le=\"0.0025\"} 2",
            "xlb_backend_probe_latency_seconds_bucket{vip=\"api\",backend=\"10.99.0.11:80\",le=\"1\"} 2",
            "xlb_backend_probe_latency_seconds_bucket{vip=\"api\",backend=\"10.99.0.11:80\",le=\"5\"} 3",
            "xlb_backend_probe_latency_seconds_bucket{vip=\"api\",backend=\"10.99.0.11:80\",le=\"+Inf\"} 3",
            "xlb_backend_probe_latency_seconds_count{vip=\"api\",backend=\"10.99.0.11:80\"} 3",
            // A backend without extras still has its (empty) series.
            "xlb_backend_probe_latency_seconds_count{vip=\"api\",backend=\"10.99.0.12:80\"} 0",
            "xlb_backend_probe_latency_seconds_sum{vip=\"api\",backend=\"10.99.0.12:80\"} 0",
            "xlb_backend_transitions_total{vip=\"api\",backend=\"10.99.0.11:80\"} 3",
            "xlb_backend_transitions_total{vip=\"api\",backend=\"10.99.0.12:80\"} 0",
            "# TYPE xlb_backend_probe_failures_total counter",
            "xlb_backend_probe_failures_total{vip=\"api\",backend=\"10.99.0.12:80\",code=\"no_response\"} 2",
            "xlb_backend_probe_failures_total{vip=\"api\",backend=\"10.99.0.12:80\",code=\"unexpected_status\"} 1",
            "xlb_backend_packets_total{vip=\"api\",backend=\"10.99.0.11:80\"} 600000",
            "xlb_backend_bytes_total{vip=\"api\",backend=\"10.99.0.12:80\"} 400000000",
            "xlb_backend_new_flows_total{vip=\"api\",backend=\"10.99.0.11:80\"} 30000",
            "# TYPE xlb_vip_sources_tracked gauge",
            "xlb_vip_sources_tracked{vip=\"api\"} 812",
            "xlb_vip_source_alerts{vip=\"api\"} 1",
            "# TYPE xlb_source_new_flows_per_second gauge",
            "xlb_source_new_flows_per_second{vip=\"api\",prefix=\"198.51.100.7/32\"} 1000",
            "xlb_source_new_flows_per_second{vip=\"api\",prefix=\"2001:db8:1:2::/64\"} 12.5",
            "# TYPE xlb_list_entries gauge",
            "xlb_list_entries{list=\"deny\",origin=\"config\"} 2",
            "xlb_list_entries{list=\"deny\",origin=\"auto\"} 1",
        ];
        let lines: Vec<&str> = text.lines().collect();
        // The sample's counters are 10 × the position in `Stat::ALL`.
        let aborted = lb_common::Stat::ALL
            .iter()
            .position(|s| *s == lb_common::Stat::Aborted)
            .unwrap();
        let aborted = format!("xlb_packets_total{{reason=\"aborted\"}} {}", aborted * 10);
        assert!(lines.contains(&aborted.as_str()), "missing {aborted:?}");
        for w in want {
            assert!(lines.contains(&w), "missing line {w:?} in\n{text}");
        }
        let sum_line = lines
            .iter()
            .find(|l| {
                l.starts_with(
                    "xlb_backend_probe_latency_seconds_sum{vip=\"api\",backend=\"10.99.0.11:80\"} ",
                )
            })
            .unwrap();
        let sum: f64 = sum_line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!((sum - 1.0019).abs() < 1e-9, "{sum_line}");
        // Every reason this build knows is exported.
        for s in lb_common::Stat::ALL {
            let prefix = format!("xlb_packets_total{{reason=\"{}\"}} ", s.label());
            assert!(lines.iter().any(|l| l.starts_with(&prefix)), "{prefix}");
        }
        assert_well_formed(&text);
    }

    /// Checks the exposition rules a scraper enforces: each family has one
    /// HELP and TYPE before its samples, samples of a family are together,
    /// and every sample line is `name{labels} value`.
    fn assert_well_formed(text: &str) {
        let mut seen = std::collections::HashSet::new();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap().to_owned();
                assert!(seen.insert(name.clone()), "family {name} declared twice");
                current = name;
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            let name_end = line.find(['{', ' ']).unwrap();
            let name = &line[..name_end];
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| *f == current))
                .unwrap_or(name);
            assert_eq!(family, current, "sample {line:?} outside its family");
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "bad value in {line:?}");
        }
    }

    /// `report` with NAT maps and its first VIP in NAT mode, so that the
    /// NAT families have samples.
    fn with_nat(mut report: crate::ctl::StatusReport) -> crate::ctl::StatusReport {
        report.nat = Some(Box::new(crate::ctl::NatStatus {
            entries: Some(1200),
            capacity: 262_144,
            swept: 40,
            orphans_swept: 1,
            embryonic_swept: 0,
            exhausted: 0,
        }));
        report.vips[0].mode = "nat".to_owned();
        report.vips[0].nat = Some(crate::ctl::VipNatStatus {
            preserve_client: false,
            snat: vec!["10.0.0.2".to_owned()],
            snat_ports: "10000-32767".to_owned(),
            flows: Some(1100),
            embryonic: Some(40),
            ports_per_backend: 22_768,
        });
        report
    }

    /// [`series_names`] lists exactly the series [`render`] writes (the
    /// sample has every family).
    #[test]
    fn series_names_are_what_is_rendered() {
        let text = render(&with_nat(sample_report()), &sample_extra());
        let rendered: std::collections::BTreeSet<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        let listed = series_names();
        let listed: std::collections::BTreeSet<&str> = listed.iter().map(String::as_str).collect();
        assert_eq!(listed, rendered);
    }

    #[test]
    fn label_values_are_escaped() {
        let mut report = sample_report();
        report.vips[0].name = "we\"ird\\name\nx".to_owned();
        report.interface = "eth\"0".to_owned();
        let text = render(&report, &MetricsExtra::default());
        assert!(
            text.contains("xlb_vip_table_size{vip=\"we\\\"ird\\\\name\\nx\"} 65537\n"),
            "{text}"
        );
        assert!(text.contains("interface=\"eth\\\"0\""), "{text}");
        assert_well_formed(&text);
        let cases = [
            ("plain", "api", "api"),
            ("quote", "a\"b", "a\\\"b"),
            ("backslash", "a\\b", "a\\\\b"),
            ("newline", "a\nb", "a\\nb"),
            ("unicode", "µ→", "µ→"),
        ];
        for (name, input, want) in cases {
            assert_eq!(escape_label(input), want, "{name}");
        }
        assert_eq!(escape_help("a\\b\nc\"d"), "a\\\\b\\nc\"d");
    }

    /// A real Prometheus text-format parser reads every line, finds every
    /// family with its help and type, and every sample with its labels.
    #[test]
    fn a_prometheus_parser_reads_every_family() {
        use prometheus_parse::{LineInfo, Scrape, Value as Parsed};

        use super::exposition::Kind;

        let text = render(&with_nat(sample_report()), &sample_extra());
        for line in text.lines() {
            assert_ne!(LineInfo::parse(line), LineInfo::Ignored, "{line:?}");
        }
        let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("parses");
        // (name, type, help, labels every sample has)
        let families = daemon::FAMILIES
            .iter()
            .map(|f| (f.name, f.kind, f.help, &[][..]))
            .chain(
                vip::FAMILIES
                    .iter()
                    .map(|f| (f.name, f.kind, f.help, &["vip"][..])),
            )
            .chain(
                backend::FAMILIES
                    .iter()
                    .map(|f| (f.name, f.kind, f.help, &["vip", "backend"][..])),
            )
            .chain(
                guard::VIP_FAMILIES
                    .iter()
                    .map(|f| (f.name, f.kind, f.help, &["vip"][..])),
            )
            .chain(
                guard::SOURCE_FAMILIES
                    .iter()
                    .map(|f| (f.name, f.kind, f.help, &["vip", "prefix"][..])),
            )
            .chain(
                guard::LIST_FAMILIES
                    .iter()
                    .map(|f| (f.name, f.kind, f.help, &["list", "origin"][..])),
            );
        let mut parsed = 0;
        for (name, kind, help, labels) in families {
            assert_eq!(
                scrape.docs.get(name).map(String::as_str),
                Some(help),
                "{name}"
            );
            let samples: Vec<_> = scrape.samples.iter().filter(|s| s.metric == name).collect();
            assert!(!samples.is_empty(), "{name} has no samples");
            for sample in samples {
                let typed = match (&sample.value, kind) {
                    (Parsed::Gauge(_), Kind::Gauge) | (Parsed::Counter(_), Kind::Counter) => true,
                    (Parsed::Histogram(buckets), Kind::Histogram) => {
                        buckets.len() == LATENCY_BUCKETS.len() + 1
                    }
                    _ => false,
                };
                assert!(typed, "{name} is a {kind:?}: {sample:?}");
                for label in labels {
                    assert!(sample.labels.get(label).is_some(), "{name} lacks {label}");
                }
                parsed += 1;
            }
        }
        // Everything else the parser found is a histogram's _sum or _count.
        let rest: Vec<_> = scrape
            .samples
            .iter()
            .filter(|s| !(s.metric.ends_with("_sum") || s.metric.ends_with("_count")))
            .collect();
        assert_eq!(rest.len(), parsed, "samples outside any family");
    }
}
