//! Prometheus metrics: the text exposition format (version 0.0.4), written
//! by hand from a [`StatusReport`] and served over a minimal HTTP/1.1
//! endpoint, `GET /metrics`.
//!
//! Everything is rendered from one snapshot, so the numbers of one scrape
//! agree with each other and with `xlb status` at that moment. The endpoint
//! names every VIP and backend, so it listens on localhost by default; it
//! serves strangers nothing else and gives slow or silent clients a few
//! seconds at most.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::timeout;
use tracing::{debug, warn};

use crate::ctl::{BACKEND_STATES, PLACEMENTS, StatusReport};

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

/// What the metrics need beyond a [`StatusReport`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsExtra {
    /// Keyed by (VIP name, backend `"ip:port"` as in
    /// [`crate::ctl::BackendStatus::address`]): the backend's probe
    /// latencies and its number of state transitions since the daemon started.
    pub per_backend: BTreeMap<(String, String), (LatencyHistogram, u64)>,
}

/// Where the endpoint gets its numbers, once per scrape.
pub trait MetricsSource: Send + Sync + 'static {
    /// The current status and extras. Called on the serving task, so it
    /// should only copy prepared data, not talk to the kernel.
    fn snapshot(&self) -> (StatusReport, MetricsExtra);
}

/// Errors of the metrics endpoint.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error(
        "cannot serve metrics on {addr}: {source}; set daemon.restart.metrics_address to a free \
         address, or to \"\" to disable metrics"
    )]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
}

/// Renders the exposition text of one snapshot.
pub fn render(status: &StatusReport, extra: &MetricsExtra) -> String {
    let mut out = Out::default();

    out.family(
        "xlb_info",
        "gauge",
        "Always 1; the labels describe the running daemon.",
    );
    out.sample(
        "xlb_info",
        &[
            ("instance", &status.instance),
            ("interface", &status.interface),
            ("xdp_mode", &status.xdp_mode),
        ],
        1,
    );
    out.family(
        "xlb_start_time_seconds",
        "gauge",
        "When the daemon started, seconds since the Unix epoch.",
    );
    out.sample_f64(
        "xlb_start_time_seconds",
        &[],
        status.started_unix_ms as f64 / 1000.0,
    );
    out.family(
        "xlb_adopted",
        "gauge",
        "1 if the daemon took over the pinned maps of a previous run at start.",
    );
    out.sample("xlb_adopted", &[], u64::from(status.adopted));

    out.family(
        "xlb_packets_total",
        "counter",
        "Packets by data-plane outcome (forwards, passes, drops) and conntrack events.",
    );
    // Every known reason, even at 0, so a rate() works from the first
    // drop; then any the daemon reports that this build does not know.
    let known: Vec<&str> = lb_common::Stat::ALL.iter().map(|s| s.label()).collect();
    for reason in &known {
        let n = status.counters.get(*reason).copied().unwrap_or(0);
        out.sample("xlb_packets_total", &[("reason", reason)], n);
    }
    for (reason, &n) in &status.counters {
        if !known.contains(&reason.as_str()) {
            out.sample("xlb_packets_total", &[("reason", reason)], n);
        }
    }

    out.family(
        "xlb_conntrack_entries",
        "gauge",
        "Entries in the connection tracking table.",
    );
    out.sample("xlb_conntrack_entries", &[], status.conntrack.entries);
    out.family(
        "xlb_conntrack_capacity",
        "gauge",
        "Capacity of the connection tracking table (daemon.pinned.conntrack_size).",
    );
    out.sample("xlb_conntrack_capacity", &[], status.conntrack.capacity);

    type VipValue = fn(&crate::ctl::VipStatus) -> u64;
    let vip_metrics: [(&str, &str, &str, VipValue); 9] = [
        (
            "xlb_vip_table_size",
            "gauge",
            "Maglev table size of the VIP (slots).",
            |v| u64::from(v.table_size),
        ),
        (
            "xlb_vip_backends_up",
            "gauge",
            "Backends of the VIP in its table (taking new flows).",
            |v| u64::from(v.backends_up),
        ),
        (
            "xlb_vip_backends",
            "gauge",
            "Backends configured for the VIP.",
            |v| u64::from(v.backends_total),
        ),
        (
            "xlb_vip_packets_total",
            "counter",
            "Packets forwarded for the VIP.",
            |v| v.packets,
        ),
        (
            "xlb_vip_bytes_total",
            "counter",
            "Bytes forwarded for the VIP (frame length as received).",
            |v| v.bytes,
        ),
        (
            "xlb_vip_new_flows_total",
            "counter",
            "Flows of the VIP given a backend from its table.",
            |v| v.new_flows,
        ),
        (
            "xlb_vip_panic",
            "gauge",
            "1 while the VIP is in panic: fewer than min_healthy backends healthy, the least-bad failing ones kept in the table.",
            |v| u64::from(v.panic),
        ),
        (
            "xlb_vip_fleet_slow",
            "gauge",
            "1 while at least half of the VIP's backends answer probes slower than their timeout (load, not failure: nobody is ejected for it).",
            |v| u64::from(v.fleet_slow.is_some()),
        ),
        (
            "xlb_vip_backends_ejected_slow",
            "gauge",
            "Backends of the VIP out of its table as slow outliers (at most max_ejected).",
            |v| u64::from(v.ejected_slow),
        ),
    ];
    out.family(
        "xlb_vip_info",
        "gauge",
        "Always 1; the labels describe the VIP.",
    );
    for v in &status.vips {
        let port = v.port.to_string();
        out.sample(
            "xlb_vip_info",
            &[
                ("vip", &v.name),
                ("address", &v.address),
                ("port", &port),
                ("protocol", &v.protocol),
                ("mode", &v.mode),
                ("down_policy", &v.down_policy),
            ],
            1,
        );
    }
    for (name, kind, help, value) in vip_metrics {
        out.family(name, kind, help);
        for v in &status.vips {
            out.sample(name, &[("vip", &v.name)], value(v));
        }
    }

    let backends = || {
        status
            .vips
            .iter()
            .flat_map(|v| v.backends.iter().map(move |b| (v.name.as_str(), b)))
    };
    out.family(
        "xlb_backend_up",
        "gauge",
        "1 if the backend is in its VIP's table (takes new flows), else 0.",
    );
    for (vip, b) in backends() {
        out.sample(
            "xlb_backend_up",
            &[("vip", vip), ("backend", &b.address)],
            u64::from(b.in_table),
        );
    }
    out.family(
        "xlb_backend_state",
        "gauge",
        "1 for the backend's current data-plane state (up, down, draining, unknown), 0 for the others.",
    );
    for (vip, b) in backends() {
        for state in BACKEND_STATES {
            out.sample(
                "xlb_backend_state",
                &[("vip", vip), ("backend", &b.address), ("state", state)],
                u64::from(b.state == state),
            );
        }
    }
    out.family(
        "xlb_backend_placement",
        "gauge",
        "1 for what the VIP's health policy does with the backend now (serving, ramping, ejected_slow, down, held_down, panic_restored, draining, unknown), 0 for the others.",
    );
    for (vip, b) in backends() {
        for placement in PLACEMENTS {
            out.sample(
                "xlb_backend_placement",
                &[
                    ("vip", vip),
                    ("backend", &b.address),
                    ("placement", placement),
                ],
                u64::from(b.placement == placement),
            );
        }
    }
    out.family(
        "xlb_backend_probe_local_errors_total",
        "counter",
        "Probes of the backend that failed for the load balancer's own reason (out of descriptors or buffers, no route from this host); never counted against the backend.",
    );
    for (vip, b) in backends() {
        out.sample(
            "xlb_backend_probe_local_errors_total",
            &[("vip", vip), ("backend", &b.address)],
            b.probe_local_errors,
        );
    }
    out.family(
        "xlb_backend_effective_weight",
        "gauge",
        "Weight of the backend in its VIP's table now: the configured weight, less while ramping up (slow start), 0 when out.",
    );
    for (vip, b) in backends() {
        out.sample_f64(
            "xlb_backend_effective_weight",
            &[("vip", vip), ("backend", &b.address)],
            b.effective_weight,
        );
    }
    out.family(
        "xlb_backend_admin_drained",
        "gauge",
        "1 if an operator drained the backend (xlb drain).",
    );
    for (vip, b) in backends() {
        out.sample(
            "xlb_backend_admin_drained",
            &[("vip", vip), ("backend", &b.address)],
            u64::from(b.admin_drained),
        );
    }
    out.family(
        "xlb_backend_weight",
        "gauge",
        "Configured weight of the backend.",
    );
    for (vip, b) in backends() {
        out.sample(
            "xlb_backend_weight",
            &[("vip", vip), ("backend", &b.address)],
            u64::from(b.weight),
        );
    }
    out.family(
        "xlb_backend_flows",
        "gauge",
        "Established flows of the backend: conntrack entries that carried a packet in the last 30 s \
         (UDP: within udp_timeout), from the periodic conntrack walk; absent before the first walk.",
    );
    for (vip, b) in backends() {
        if let Some(n) = b.flows {
            out.sample(
                "xlb_backend_flows",
                &[("vip", vip), ("backend", &b.address)],
                n,
            );
        }
    }

    let empty = (LatencyHistogram::default(), 0);
    let extra_of = |vip: &str, backend: &str| {
        extra
            .per_backend
            .get(&(vip.to_owned(), backend.to_owned()))
            .unwrap_or(&empty)
    };
    let hist = "xlb_backend_probe_latency_seconds";
    out.family(
        hist,
        "histogram",
        "Duration of health probes, failed ones included.",
    );
    for (vip, b) in backends() {
        let (h, _) = extra_of(vip, &b.address);
        let bucket = format!("{hist}_bucket");
        for (le, n) in h.cumulative() {
            let le = le.to_string();
            out.sample(
                &bucket,
                &[("vip", vip), ("backend", &b.address), ("le", &le)],
                n,
            );
        }
        let labels = [("vip", vip), ("backend", b.address.as_str())];
        out.sample(&bucket, &[labels[0], labels[1], ("le", "+Inf")], h.count());
        out.sample_f64(&format!("{hist}_sum"), &labels, h.sum_seconds());
        out.sample(&format!("{hist}_count"), &labels, h.count());
    }
    out.family(
        "xlb_backend_transitions_total",
        "counter",
        "State transitions of the backend since the daemon started.",
    );
    for (vip, b) in backends() {
        let (_, transitions) = extra_of(vip, &b.address);
        out.sample(
            "xlb_backend_transitions_total",
            &[("vip", vip), ("backend", &b.address)],
            *transitions,
        );
    }
    type BackendValue = fn(&crate::ctl::BackendStatus) -> u64;
    let backend_counters: [(&str, &str, BackendValue); 3] = [
        (
            "xlb_backend_packets_total",
            "Packets forwarded to the backend.",
            |b| b.packets,
        ),
        (
            "xlb_backend_bytes_total",
            "Bytes forwarded to the backend (frame length as received).",
            |b| b.bytes,
        ),
        (
            "xlb_backend_new_flows_total",
            "Flows given to the backend from the table.",
            |b| b.new_flows,
        ),
    ];
    for (name, help, value) in backend_counters {
        out.family(name, "counter", help);
        for (vip, b) in backends() {
            out.sample(name, &[("vip", vip), ("backend", &b.address)], value(b));
        }
    }
    out.text
}

#[derive(Default)]
struct Out {
    text: String,
}

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn labels(&mut self, name: &str, labels: &[(&str, &str)]) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"{}\"", escape_label(v));
            }
            self.text.push('}');
        }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.labels(name, labels);
        let _ = writeln!(self.text, " {value}");
    }

    fn sample_f64(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.labels(name, labels);
        // Rust's Display of f64 never uses an exponent and prints NaN and
        // inf in a way Prometheus would reject; neither can occur here
        // (sums of durations, a timestamp), but keep the output parseable.
        if value.is_finite() {
            let _ = writeln!(self.text, " {value}");
        } else {
            self.text.push_str(" NaN\n");
        }
    }
}

/// A label value: backslash, double quote and newline escaped.
fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A HELP text: backslash and newline escaped.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Timeouts and sizes of the HTTP endpoint.
#[derive(Clone, Copy, Debug)]
struct Limits {
    /// A client must send its request head within this.
    read: Duration,
    /// And accept the response within this.
    write: Duration,
}

const LIMITS: Limits = Limits {
    read: Duration::from_secs(5),
    write: Duration::from_secs(10),
};

/// Largest request head read; a scraper sends a few hundred bytes.
const MAX_HEAD: usize = 8 * 1024;

/// Scrapes served at once; more are closed at once.
const MAX_CONNECTIONS: usize = 16;

/// Serves `GET /metrics` on `addr` until the future is dropped. Fails only
/// if `addr` cannot be bound.
pub async fn serve(addr: SocketAddr, source: Arc<dyn MetricsSource>) -> Result<(), MetricsError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| MetricsError::Bind { addr, source: e })?;
    serve_listener(listener, source).await;
    Ok(())
}

/// Serves `GET /metrics` on a bound listener until the future is dropped.
pub async fn serve_listener(listener: TcpListener, source: Arc<dyn MetricsSource>) {
    serve_with(listener, source, LIMITS).await;
}

async fn serve_with(listener: TcpListener, source: Arc<dyn MetricsSource>, limits: Limits) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // Over the limit: dropping the stream closes it.
                    if let Ok(permit) = slots.clone().try_acquire_owned() {
                        let source = source.clone();
                        connections.spawn(async move {
                            if let Err(e) = scrape(stream, &*source, limits).await {
                                debug!("metrics: {peer}: {e}");
                            }
                            drop(permit);
                        });
                    }
                }
                Err(e) => {
                    warn!("metrics: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next() => {}
        }
    }
}

/// Answers one HTTP request and closes the connection.
async fn scrape(
    mut stream: TcpStream,
    source: &dyn MetricsSource,
    limits: Limits,
) -> io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let complete = timeout(limits.read, async {
        let mut chunk = [0u8; 1024];
        loop {
            if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
                return Ok(true);
            }
            if head.len() > MAX_HEAD {
                return Ok(false);
            }
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "closed mid-request",
                ));
            }
            head.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no request in time"))??;

    let response = if complete {
        respond(&head, source)
    } else {
        plain(
            431,
            "Request Header Fields Too Large",
            "request head too large\n",
            &[],
        )
    };
    timeout(limits.write, async {
        stream.write_all(&response).await?;
        stream.shutdown().await
    })
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "response not read in time"))??;
    // Closing with unread request bytes would send an RST, which can destroy
    // the response in flight (an oversized head): read them away first,
    // boundedly.
    let _ = timeout(limits.read, async {
        let mut chunk = [0u8; 1024];
        let mut drained = 0;
        while drained < 64 * 1024 {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
    Ok(())
}

fn respond(head: &[u8], source: &dyn MetricsSource) -> Vec<u8> {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if path != "/metrics" {
        return plain(
            404,
            "Not Found",
            "not found; metrics are at /metrics\n",
            &[],
        );
    }
    match method {
        "GET" | "HEAD" => {
            let (status, extra) = source.snapshot();
            let body = render(&status, &extra);
            let mut out = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            if method == "GET" {
                out.extend_from_slice(body.as_bytes());
            }
            out
        }
        _ => plain(
            405,
            "Method Not Allowed",
            "only GET and HEAD\n",
            &["Allow: GET, HEAD"],
        ),
    }
}

fn plain(code: u16, reason: &str, body: &str, headers: &[&str]) -> Vec<u8> {
    let mut out =
        format!("HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n");
    for h in headers {
        out.push_str(h);
        out.push_str("\r\n");
    }
    out.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::tests::sample_report;

    fn sample_extra() -> MetricsExtra {
        let mut h = LatencyHistogram::default();
        for ms in [1.2, 0.3, 1000.4] {
            h.observe(Duration::from_secs_f64(ms / 1000.0));
        }
        let mut extra = MetricsExtra::default();
        extra
            .per_backend
            .insert(("api".to_owned(), "10.99.0.11:80".to_owned()), (h, 3));
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
            "xlb_packets_total{reason=\"aborted\"} 250",
            "xlb_info{instance=\"default\",interface=\"eth0\",xdp_mode=\"native\"} 1",
            "xlb_start_time_seconds 1799989080",
            "xlb_adopted 1",
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
            "xlb_backend_packets_total{vip=\"api\",backend=\"10.99.0.11:80\"} 600000",
            "xlb_backend_bytes_total{vip=\"api\",backend=\"10.99.0.12:80\"} 400000000",
            "xlb_backend_new_flows_total{vip=\"api\",backend=\"10.99.0.11:80\"} 30000",
        ];
        let lines: Vec<&str> = text.lines().collect();
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

    struct Fixed;

    impl MetricsSource for Fixed {
        fn snapshot(&self) -> (StatusReport, MetricsExtra) {
            (sample_report(), sample_extra())
        }
    }

    async fn start(limits: Limits) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (
            addr,
            tokio::spawn(serve_with(listener, Arc::new(Fixed), limits)),
        )
    }

    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut out = Vec::new();
        timeout(Duration::from_secs(5), s.read_to_end(&mut out))
            .await
            .expect("response within 5 s")
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn http_endpoint() {
        let (addr, task) = start(LIMITS).await;
        let ok = exchange(
            addr,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n",
        )
        .await;
        let (head, body) = ok.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"),
            "{head}"
        );
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        assert_eq!(body, render(&sample_report(), &sample_extra()));

        let cases: &[(&str, &[u8], &str, &str)] = &[
            (
                "query string",
                b"GET /metrics?x=1 HTTP/1.0\n\n",
                "HTTP/1.1 200 OK",
                "xlb_info",
            ),
            (
                "head",
                b"HEAD /metrics HTTP/1.1\r\n\r\n",
                "HTTP/1.1 200 OK",
                "",
            ),
            (
                "other path",
                b"GET / HTTP/1.1\r\n\r\n",
                "HTTP/1.1 404 Not Found",
                "metrics are at /metrics",
            ),
            (
                "other method",
                b"POST /metrics HTTP/1.1\r\n\r\n",
                "HTTP/1.1 405 Method Not Allowed",
                "only GET",
            ),
            (
                "garbage",
                b"\x00\x01\x02\r\n\r\n",
                "HTTP/1.1 404 Not Found",
                "",
            ),
        ];
        for (name, req, status, body_part) in cases {
            let resp = exchange(addr, req).await;
            assert!(resp.starts_with(status), "{name}: {resp}");
            let body = resp.split_once("\r\n\r\n").unwrap().1;
            assert!(body.contains(body_part), "{name}: {resp}");
            if *name == "head" {
                assert_eq!(body, "", "{name}");
            }
        }
        let huge = [
            b"GET /metrics HTTP/1.1\r\nX: ".as_slice(),
            &[b'a'; MAX_HEAD + 10],
        ]
        .concat();
        let resp = exchange(addr, &huge).await;
        assert!(resp.starts_with("HTTP/1.1 431"), "{resp}");
        task.abort();
    }

    #[tokio::test]
    async fn silent_clients_are_dropped() {
        let (addr, task) = start(Limits {
            read: Duration::from_millis(200),
            write: Duration::from_millis(200),
        })
        .await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metr").await.unwrap();
        let mut out = Vec::new();
        let closed = timeout(Duration::from_secs(5), s.read_to_end(&mut out))
            .await
            .expect("closed within 5 s");
        assert!(
            matches!(&closed, Ok(0))
                || matches!(&closed, Err(e) if e.kind() == io::ErrorKind::ConnectionReset),
            "closed without an answer: {closed:?} {out:?}"
        );
        // The endpoint still serves others.
        let ok = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK"));
        task.abort();
    }

    #[tokio::test]
    async fn bind_error_says_what_to_do() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let err = serve(addr, Arc::new(Fixed)).await.unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("cannot serve metrics on {addr}: ")),
            "{msg}"
        );
        assert!(
            msg.ends_with(
                "set daemon.restart.metrics_address to a free address, or to \"\" to disable metrics"
            ),
            "{msg}"
        );
    }
}
