//! The lab's load client: short connections at a fixed rate, keep-alive
//! connections doing back-to-back requests, and long-lived `/stream`
//! connections watched for stalls. Every request's outcome lands in a
//! timeline of fixed slices and a summary.
//!
//! Times in the report are milliseconds since the run started; a request is
//! filed under the moment it *started*, so a burst of timeouts shows up when
//! the requests that suffered them were sent, not a timeout later.

use std::{
    collections::BTreeMap,
    io::{self, ErrorKind},
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpSocket, TcpStream},
    sync::Semaphore,
    task::JoinSet,
    time::Instant,
};

use crate::http;

mod options;
mod render;

pub use options::{ClientError, LoadOptions};

/// A connect that takes longer than this waited on a retransmitted SYN:
/// Linux retransmits an unanswered SYN after its initial RTO of 1 s, and in
/// the lab an answered SYN completes in well under a millisecond, so
/// anything between is scheduling noise and anything beyond is a drop.
pub const SYN_RETRANSMIT_CONNECT: Duration = Duration::from_millis(900);

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A 2xx–4xx response arrived in time (4xx counts as `other_error`).
    Ok,
    /// The connect was refused (RST to our SYN).
    Refused,
    /// The connection was reset (or the pipe broke) mid-request.
    Reset,
    /// No complete response within `--timeout` (connect included).
    TimedOut,
    /// The server answered 5xx.
    #[serde(rename = "http_5xx")]
    Http5xx,
    /// The server closed the connection (FIN) without a complete response.
    Closed,
    /// Anything else: unreachable, 4xx, unparsable response…
    OtherError,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::Ok,
        Outcome::Refused,
        Outcome::Reset,
        Outcome::TimedOut,
        Outcome::Http5xx,
        Outcome::Closed,
        Outcome::OtherError,
    ];

    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Refused => "refused",
            Outcome::Reset => "reset",
            Outcome::TimedOut => "timed_out",
            Outcome::Http5xx => "http_5xx",
            Outcome::Closed => "closed",
            Outcome::OtherError => "other_error",
        }
    }

    /// Classifies an I/O error from connect, write or read.
    pub fn from_io(e: &io::Error) -> Outcome {
        match e.kind() {
            ErrorKind::ConnectionRefused => Outcome::Refused,
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe => {
                Outcome::Reset
            }
            ErrorKind::TimedOut => Outcome::TimedOut,
            ErrorKind::UnexpectedEof => Outcome::Closed,
            _ => Outcome::OtherError,
        }
    }

    /// Classifies an HTTP status.
    pub fn from_status(status: u16) -> Outcome {
        match status {
            200..=399 => Outcome::Ok,
            500..=599 => Outcome::Http5xx,
            _ => Outcome::OtherError,
        }
    }
}

/// Per-outcome counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub ok: u64,
    pub refused: u64,
    pub reset: u64,
    pub timed_out: u64,
    pub http_5xx: u64,
    pub closed: u64,
    pub other_error: u64,
}

impl Counts {
    pub fn get(&self, o: Outcome) -> u64 {
        match o {
            Outcome::Ok => self.ok,
            Outcome::Refused => self.refused,
            Outcome::Reset => self.reset,
            Outcome::TimedOut => self.timed_out,
            Outcome::Http5xx => self.http_5xx,
            Outcome::Closed => self.closed,
            Outcome::OtherError => self.other_error,
        }
    }

    fn slot(&mut self, o: Outcome) -> &mut u64 {
        match o {
            Outcome::Ok => &mut self.ok,
            Outcome::Refused => &mut self.refused,
            Outcome::Reset => &mut self.reset,
            Outcome::TimedOut => &mut self.timed_out,
            Outcome::Http5xx => &mut self.http_5xx,
            Outcome::Closed => &mut self.closed,
            Outcome::OtherError => &mut self.other_error,
        }
    }

    fn bump(&mut self, o: Outcome) {
        *self.slot(o) += 1;
    }

    fn add(&mut self, other: &Counts) {
        for o in Outcome::ALL {
            *self.slot(o) += other.get(o);
        }
    }

    pub fn total(&self) -> u64 {
        Outcome::ALL.iter().map(|o| self.get(*o)).sum()
    }

    /// Everything but `ok`.
    pub fn failures(&self) -> u64 {
        self.total() - self.ok
    }
}

/// One timeline slice.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slice {
    /// Start of the slice.
    pub t_ms: u64,
    #[serde(flatten)]
    pub counts: Counts,
    /// `ok` answers per backend (`X-Backend`).
    pub per_backend: BTreeMap<String, u64>,
    /// Requests started in this slice whose connect took longer than
    /// [`SYN_RETRANSMIT_CONNECT`] (or never completed by then).
    #[serde(default)]
    pub syn_retransmit_waits: u64,
    /// Latency of each `ok` request started in this slice, µs, in the
    /// order they ended: for [`Report::latency_where`]. Not serialized
    /// (the JSON report would grow by a number per request).
    #[serde(skip)]
    pub latencies_us: Vec<u64>,
}

/// Latency of `ok` requests, milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Requests with an outcome (skipped starts excluded).
    pub requests: u64,
    #[serde(flatten)]
    pub counts: Counts,
    /// Everything that was not `ok`.
    pub failures: u64,
    /// Short-connection starts skipped because `max_in_flight` were open.
    pub skipped: u64,
    /// `ok` answers per backend.
    pub per_backend: BTreeMap<String, u64>,
    /// Start of the first and last failed request.
    pub first_failure_ms: Option<u64>,
    pub last_failure_ms: Option<u64>,
    pub latency: Latency,
    pub long_total: u64,
    /// Long connections whose data did not keep flowing to the end.
    pub long_broken: u64,
    /// Requests whose connect took longer than [`SYN_RETRANSMIT_CONNECT`]
    /// (or had not completed by then): they waited on a retransmitted SYN,
    /// i.e. the load balancer or the backend dropped the first one.
    #[serde(default)]
    pub syn_retransmit_waits: u64,
    /// Longest connect, ms (a connect cut short by the request timeout
    /// counts as the time it had taken by then).
    #[serde(default)]
    pub max_connect_ms: f64,
}

/// How one long-lived `/stream` connection fared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LongConn {
    pub id: u32,
    /// Backend that answered the stream request.
    pub backend: Option<String>,
    /// Outcome of connecting and getting the response head.
    pub setup: Option<Outcome>,
    pub bytes: u64,
    pub lines: u64,
    /// Some gap between bytes was longer than `stall_after`.
    pub stalled: bool,
    pub first_stall_ms: Option<u64>,
    /// Longest time without bytes (to the end of the run if it never resumed).
    pub longest_gap_ms: u64,
    /// How it ended: `open` (still flowing at the end of the run), `closed`,
    /// `reset`, or another outcome name.
    pub end: String,
    /// When it ended, if before the end of the run.
    pub ended_ms: Option<u64>,
    /// Data flowed from setup to the end of the run without a stall.
    pub kept_flowing: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub target: String,
    pub duration_ms: u64,
    pub slice_ms: u64,
    pub summary: Summary,
    pub timeline: Vec<Slice>,
    pub long: Vec<LongConn>,
}

struct Recorder {
    slice: Duration,
    timeline: Vec<Slice>,
    totals: Counts,
    per_backend: BTreeMap<String, u64>,
    latencies_us: Vec<u64>,
    first_failure: Option<Duration>,
    last_failure: Option<Duration>,
    skipped: u64,
    syn_retransmit_waits: u64,
    max_connect: Duration,
}

impl Recorder {
    fn new(duration: Duration, slice: Duration) -> Self {
        let n = duration.as_nanos().div_ceil(slice.as_nanos()).max(1) as usize;
        let timeline = (0..n)
            .map(|i| Slice {
                t_ms: (slice * i as u32).as_millis() as u64,
                ..Slice::default()
            })
            .collect();
        Self {
            slice,
            timeline,
            totals: Counts::default(),
            per_backend: BTreeMap::new(),
            latencies_us: Vec::new(),
            first_failure: None,
            last_failure: None,
            skipped: 0,
            syn_retransmit_waits: 0,
            max_connect: Duration::ZERO,
        }
    }

    /// Files how long the connect of a request started at `at` took (or
    /// had taken when the request gave up).
    fn record_connect(&mut self, at: Duration, connect: Duration) {
        self.max_connect = self.max_connect.max(connect);
        if connect > SYN_RETRANSMIT_CONNECT {
            let idx =
                ((at.as_nanos() / self.slice.as_nanos()) as usize).min(self.timeline.len() - 1);
            self.timeline[idx].syn_retransmit_waits += 1;
            self.syn_retransmit_waits += 1;
        }
    }

    fn record(&mut self, at: Duration, outcome: Outcome, backend: Option<&str>, latency: Duration) {
        let idx = ((at.as_nanos() / self.slice.as_nanos()) as usize).min(self.timeline.len() - 1);
        let slice = &mut self.timeline[idx];
        slice.counts.bump(outcome);
        self.totals.bump(outcome);
        if outcome == Outcome::Ok {
            if let Some(b) = backend {
                *slice.per_backend.entry(b.to_string()).or_default() += 1;
                *self.per_backend.entry(b.to_string()).or_default() += 1;
            }
            slice.latencies_us.push(latency.as_micros() as u64);
            self.latencies_us.push(latency.as_micros() as u64);
        } else {
            self.first_failure = Some(self.first_failure.map_or(at, |f| f.min(at)));
            self.last_failure = Some(self.last_failure.map_or(at, |l| l.max(at)));
        }
    }

    fn finish(self, opts: &LoadOptions, long: Vec<LongConn>) -> Report {
        let latency = Latency::of(self.latencies_us);
        Report {
            target: opts.target.to_string(),
            duration_ms: opts.duration.as_millis() as u64,
            slice_ms: opts.slice.as_millis() as u64,
            summary: Summary {
                requests: self.totals.total(),
                counts: self.totals,
                failures: self.totals.failures(),
                skipped: self.skipped,
                per_backend: self.per_backend,
                first_failure_ms: self.first_failure.map(|d| d.as_millis() as u64),
                last_failure_ms: self.last_failure.map(|d| d.as_millis() as u64),
                latency,
                long_total: long.len() as u64,
                long_broken: long.iter().filter(|l| !l.kept_flowing).count() as u64,
                syn_retransmit_waits: self.syn_retransmit_waits,
                max_connect_ms: self.max_connect.as_secs_f64() * 1000.0,
            },
            timeline: self.timeline,
            long,
        }
    }
}

impl Latency {
    /// Nearest-rank percentiles of `us` (microseconds, any order).
    pub fn of(mut us: Vec<u64>) -> Latency {
        us.sort_unstable();
        let pct = |p: f64| -> f64 {
            if us.is_empty() {
                return 0.0;
            }
            let rank = ((p / 100.0) * us.len() as f64).ceil() as usize;
            us[rank.clamp(1, us.len()) - 1] as f64 / 1000.0
        };
        Latency {
            p50_ms: pct(50.0),
            p90_ms: pct(90.0),
            p99_ms: pct(99.0),
            max_ms: pct(100.0),
        }
    }
}

impl Report {
    /// Latency of the `ok` requests started in the slices `keep` selects
    /// (e.g. while a flood ran, or while it did not), with how many there
    /// were. Only on the report [`run_load`] returned: a report read back
    /// from JSON has no per-request latencies.
    pub fn latency_where(&self, keep: impl Fn(&Slice) -> bool) -> (Latency, usize) {
        let us: Vec<u64> = self
            .timeline
            .iter()
            .filter(|s| keep(s))
            .flat_map(|s| s.latencies_us.iter().copied())
            .collect();
        let n = us.len();
        (Latency::of(us), n)
    }
}

type SharedRecorder = Arc<Mutex<Recorder>>;

fn record(
    rec: &SharedRecorder,
    at: Duration,
    outcome: Outcome,
    backend: Option<&str>,
    latency: Duration,
) {
    rec.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .record(at, outcome, backend, latency);
}

/// What one request got back.
struct Answer {
    outcome: Outcome,
    backend: Option<String>,
    server_closes: bool,
}

fn request_bytes(opts: &LoadOptions, path: &str, keep_alive: bool) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: xlb-client\r\nConnection: {}\r\n\r\n",
        opts.target,
        if keep_alive { "keep-alive" } else { "close" }
    )
    .into_bytes()
}

async fn exchange(stream: &mut TcpStream, req: &[u8]) -> io::Result<Answer> {
    stream.write_all(req).await?;
    let mut buf = Vec::new();
    let resp = http::read_response(stream, &mut buf).await?;
    Ok(Answer {
        outcome: Outcome::from_status(resp.head.status),
        backend: resp.head.header("x-backend").map(str::to_string),
        server_closes: resp.head.closes(),
    })
}

/// A connection to `opts.target`, from the next of `opts.sources` (if any).
async fn connect(opts: &LoadOptions) -> io::Result<TcpStream> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let s = if opts.sources.is_empty() {
        TcpStream::connect(opts.target).await?
    } else {
        let src = opts.sources[NEXT.fetch_add(1, Ordering::Relaxed) % opts.sources.len()];
        let socket = if src.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.bind(SocketAddr::new(src, 0))?;
        socket.connect(opts.target).await?
    };
    let _ = s.set_nodelay(true);
    Ok(s)
}

fn record_connect(rec: &SharedRecorder, at: Duration, connect: Duration) {
    rec.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .record_connect(at, connect);
}

async fn short_request(opts: Arc<LoadOptions>, rec: SharedRecorder, start: Instant) {
    let t0 = Instant::now();
    let req = request_bytes(&opts, &opts.path, false);
    let mut connected: Option<Duration> = None;
    let res = tokio::time::timeout(opts.timeout, async {
        let s = connect(&opts).await;
        connected = Some(t0.elapsed());
        exchange(&mut s?, &req).await
    })
    .await;
    let (outcome, backend) = match res {
        Ok(Ok(a)) => (a.outcome, a.backend),
        Ok(Err(e)) => (Outcome::from_io(&e), None),
        Err(_) => (Outcome::TimedOut, None),
    };
    let elapsed = t0.elapsed();
    record_connect(&rec, t0 - start, connected.unwrap_or(elapsed));
    record(&rec, t0 - start, outcome, backend.as_deref(), elapsed);
}

async fn keepalive_conn(
    opts: Arc<LoadOptions>,
    rec: SharedRecorder,
    start: Instant,
    deadline: Instant,
) {
    let req = request_bytes(&opts, &opts.path, true);
    let mut conn: Option<TcpStream> = None;
    while Instant::now() < deadline {
        let t0 = Instant::now();
        let mut connected: Option<Option<Duration>> = None;
        let res = tokio::time::timeout(opts.timeout, async {
            if conn.is_none() {
                connected = Some(None);
                let s = connect(&opts).await;
                connected = Some(Some(t0.elapsed()));
                conn = Some(s?);
            }
            let s = conn.as_mut().expect("connected just above");
            exchange(s, &req).await
        })
        .await;
        let (outcome, backend) = match res {
            Ok(Ok(a)) => {
                if a.server_closes {
                    conn = None;
                }
                (a.outcome, a.backend)
            }
            Ok(Err(e)) => {
                conn = None;
                (Outcome::from_io(&e), None)
            }
            Err(_) => {
                conn = None;
                (Outcome::TimedOut, None)
            }
        };
        let elapsed = t0.elapsed();
        // Only requests that had to connect: a reused connection has no SYN.
        if let Some(c) = connected {
            record_connect(&rec, t0 - start, c.unwrap_or(elapsed));
        }
        record(&rec, t0 - start, outcome, backend.as_deref(), elapsed);
        let next = (t0 + opts.keepalive_interval).min(deadline);
        tokio::time::sleep_until(next).await;
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

async fn long_conn(id: u32, opts: Arc<LoadOptions>, start: Instant, deadline: Instant) -> LongConn {
    let mut report = LongConn {
        id,
        ..LongConn::default()
    };
    let (stream, head, rest) = match open_stream(&opts).await {
        Ok(opened) => opened,
        Err(outcome) => {
            report.setup = Some(outcome);
            report.end = outcome.name().to_string();
            report.ended_ms = Some(ms(start.elapsed()));
            return report;
        }
    };
    report.setup = Some(Outcome::from_status(head.status));
    report.backend = head.header("x-backend").map(str::to_string);
    if head.status != 200 {
        report.end = Outcome::from_status(head.status).name().to_string();
        report.ended_ms = Some(ms(start.elapsed()));
        return report;
    }
    watch_stream(stream, &rest, &opts, &mut report, start, deadline).await;
    report
}

/// Connects and asks for `/stream`: the connection, the response head and
/// the bytes read past it, or how that failed.
async fn open_stream(
    opts: &LoadOptions,
) -> Result<(TcpStream, http::ResponseHead, Vec<u8>), Outcome> {
    let path = format!(
        "/stream?interval_ms={}",
        opts.stream_interval.as_millis().max(1)
    );
    let req = request_bytes(opts, &path, false);
    let setup = tokio::time::timeout(opts.timeout, async {
        let mut s = connect(opts).await?;
        s.write_all(&req).await?;
        let mut buf = Vec::new();
        let head = http::read_response_head(&mut s, &mut buf).await?;
        Ok::<_, io::Error>((s, head, buf))
    })
    .await;
    match setup {
        Ok(Ok(opened)) => Ok(opened),
        Ok(Err(e)) => Err(Outcome::from_io(&e)),
        Err(_) => Err(Outcome::TimedOut),
    }
}

/// Reads a stream's body (`rest` already came with the head) until it ends
/// or the run does, noting the bytes, lines, gaps and stalls in `report`.
async fn watch_stream(
    mut stream: TcpStream,
    rest: &[u8],
    opts: &LoadOptions,
    report: &mut LongConn,
    start: Instant,
    deadline: Instant,
) {
    let account = |data: &[u8], report: &mut LongConn| {
        report.bytes += data.len() as u64;
        report.lines += data.iter().filter(|b| **b == b'\n').count() as u64;
    };
    account(rest, report);
    let mut last = Instant::now();
    let mut chunk = [0u8; 4096];
    let end = loop {
        let stall_at = last + opts.stall_after;
        tokio::select! {
            r = stream.read(&mut chunk) => {
                let now = Instant::now();
                report.longest_gap_ms = report.longest_gap_ms.max(ms(now - last));
                match r {
                    Ok(0) => break Some("closed".to_string()),
                    Ok(n) => {
                        account(&chunk[..n], report);
                        last = now;
                    }
                    Err(e) => break Some(Outcome::from_io(&e).name().to_string()),
                }
            }
            () = tokio::time::sleep_until(stall_at), if !report.stalled && stall_at < deadline => {
                report.stalled = true;
                report.first_stall_ms = Some(ms(stall_at - start));
            }
            () = tokio::time::sleep_until(deadline) => break None,
        }
    };
    let now = Instant::now();
    report.longest_gap_ms = report.longest_gap_ms.max(ms(now - last));
    match end {
        None => {
            report.end = "open".to_string();
            report.kept_flowing = !report.stalled;
        }
        Some(how) => {
            report.end = how;
            report.ended_ms = Some(ms(now - start));
        }
    }
}

/// Runs the load described by `opts` and returns what happened. Takes at
/// most `duration + timeout` (plus scheduling noise): nothing starts after
/// `duration` and everything in flight is bounded by `timeout`.
pub async fn run_load(opts: LoadOptions) -> Result<Report, ClientError> {
    opts.validate()?;
    let opts = Arc::new(opts);
    let rec: SharedRecorder = Arc::new(Mutex::new(Recorder::new(opts.duration, opts.slice)));
    let start = Instant::now();
    let deadline = start + opts.duration;

    let mut longs = JoinSet::new();
    for id in 0..opts.long {
        longs.spawn(long_conn(id, opts.clone(), start, deadline));
    }
    let mut keepalives = JoinSet::new();
    for _ in 0..opts.keepalive {
        keepalives.spawn(keepalive_conn(opts.clone(), rec.clone(), start, deadline));
    }

    let mut shorts = JoinSet::new();
    if opts.rate > 0 {
        let in_flight = Arc::new(Semaphore::new(opts.max_in_flight));
        let period = Duration::from_secs(1) / opts.rate;
        let mut i: u32 = 0;
        loop {
            // Scheduled from the start, not from the previous start, so a slow
            // wake-up does not lower the rate.
            let at = start + period * i;
            if at >= deadline {
                break;
            }
            tokio::time::sleep_until(at).await;
            i += 1;
            match in_flight.clone().try_acquire_owned() {
                Ok(permit) => {
                    let (opts, rec) = (opts.clone(), rec.clone());
                    shorts.spawn(async move {
                        short_request(opts, rec, start).await;
                        drop(permit);
                    });
                }
                Err(_) => {
                    rec.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .skipped += 1;
                }
            }
            // Reap finished tasks so the set stays as small as what is in flight.
            while shorts.try_join_next().is_some() {}
        }
    }

    while shorts.join_next().await.is_some() {}
    while keepalives.join_next().await.is_some() {}
    let mut long = Vec::new();
    while let Some(r) = longs.join_next().await {
        if let Ok(l) = r {
            long.push(l);
        }
    }
    long.sort_by_key(|l| l.id);
    let rec = Arc::into_inner(rec)
        .expect("every task holding the recorder has finished")
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Ok(rec.finish(&opts, long))
}

/// Parses `500ms`, `2s`, `1.5s`, `1m`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration; use e.g. 500ms, 2s, 1.5s or 1m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?}; use ms, s or m")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let cases = [
            ("millis", "50ms", Ok(Duration::from_millis(50))),
            ("seconds", "10s", Ok(Duration::from_secs(10))),
            ("fraction", "1.5s", Ok(Duration::from_millis(1500))),
            ("minutes", "2m", Ok(Duration::from_secs(120))),
            ("bare number is seconds", "3", Ok(Duration::from_secs(3))),
            ("unknown unit", "3h", Err(())),
            ("no number", "ms", Err(())),
            ("negative", "-1s", Err(())),
        ];
        for (name, input, want) in cases {
            assert_eq!(parse_duration(input).map_err(|_| ()), want, "{name}");
        }
    }

    #[test]
    fn io_error_classification() {
        let cases = [
            ("refused", ErrorKind::ConnectionRefused, Outcome::Refused),
            ("reset", ErrorKind::ConnectionReset, Outcome::Reset),
            ("broken pipe", ErrorKind::BrokenPipe, Outcome::Reset),
            ("eof", ErrorKind::UnexpectedEof, Outcome::Closed),
            ("timeout", ErrorKind::TimedOut, Outcome::TimedOut),
            (
                "unreachable",
                ErrorKind::HostUnreachable,
                Outcome::OtherError,
            ),
        ];
        for (name, kind, want) in cases {
            assert_eq!(Outcome::from_io(&io::Error::from(kind)), want, "{name}");
        }
        assert_eq!(Outcome::from_status(200), Outcome::Ok);
        assert_eq!(Outcome::from_status(503), Outcome::Http5xx);
        assert_eq!(Outcome::from_status(404), Outcome::OtherError);
    }

    #[test]
    fn recorder_files_events_by_start_time() {
        let mut r = Recorder::new(Duration::from_millis(1000), Duration::from_millis(100));
        assert_eq!(r.timeline.len(), 10);
        r.record(
            Duration::from_millis(5),
            Outcome::Ok,
            Some("b1"),
            Duration::from_millis(2),
        );
        r.record(
            Duration::from_millis(150),
            Outcome::Ok,
            Some("b2"),
            Duration::from_millis(4),
        );
        r.record(
            Duration::from_millis(420),
            Outcome::Refused,
            None,
            Duration::ZERO,
        );
        r.record(
            Duration::from_millis(610),
            Outcome::TimedOut,
            None,
            Duration::ZERO,
        );
        r.record_connect(Duration::from_millis(610), Duration::from_millis(1000));
        r.record_connect(Duration::from_millis(150), Duration::from_millis(3));
        r.record_connect(Duration::from_millis(160), SYN_RETRANSMIT_CONNECT);
        // Past the end (cannot happen for starts, but must not panic).
        r.record(
            Duration::from_millis(1000),
            Outcome::Ok,
            Some("b1"),
            Duration::from_millis(6),
        );
        let opts = LoadOptions {
            duration: Duration::from_millis(1000),
            ..LoadOptions::new("127.0.0.1:1".parse().unwrap())
        };
        let rep = r.finish(&opts, Vec::new());
        assert_eq!(rep.summary.requests, 5);
        assert_eq!(rep.summary.failures, 2);
        assert_eq!(rep.summary.first_failure_ms, Some(420));
        assert_eq!(rep.summary.last_failure_ms, Some(610));
        assert_eq!(rep.summary.per_backend.get("b1"), Some(&2));
        assert_eq!(rep.timeline[1].per_backend.get("b2"), Some(&1));
        assert_eq!(rep.timeline[4].counts.refused, 1);
        assert_eq!(rep.timeline[6].counts.timed_out, 1);
        assert_eq!(rep.timeline[9].counts.ok, 1);
        assert_eq!(rep.summary.latency.p50_ms, 4.0);
        assert_eq!(rep.summary.latency.max_ms, 6.0);
        let (early, n) = rep.latency_where(|s| s.t_ms < 200);
        assert_eq!(
            (early.p50_ms, early.max_ms, n),
            (2.0, 4.0, 2),
            "slices 0 and 1"
        );
        let (none, n) = rep.latency_where(|_| false);
        assert_eq!((none, n), (Latency::default(), 0));
        assert_eq!(rep.summary.syn_retransmit_waits, 1, "over, not at, 900 ms");
        assert_eq!(rep.timeline[6].syn_retransmit_waits, 1);
        assert_eq!(rep.summary.max_connect_ms, 1000.0);
        let sum: u64 = rep.timeline.iter().map(|s| s.counts.total()).sum();
        assert_eq!(sum, rep.summary.requests);
        // The JSON names the outcomes as documented.
        let json = serde_json::to_value(&rep).unwrap();
        for key in [
            "ok",
            "refused",
            "reset",
            "timed_out",
            "http_5xx",
            "closed",
            "other_error",
        ] {
            assert!(json["summary"].get(key).is_some(), "summary lacks {key}");
            assert!(json["timeline"][0].get(key).is_some(), "slice lacks {key}");
        }
        assert!(rep.render_text().contains("failures from 420 ms to 610 ms"));
    }

    #[test]
    fn invalid_options_are_refused() {
        let base = LoadOptions::new("127.0.0.1:1".parse().unwrap());
        let cases = [
            (
                "zero duration",
                LoadOptions {
                    duration: Duration::ZERO,
                    ..base.clone()
                },
            ),
            (
                "zero timeout",
                LoadOptions {
                    timeout: Duration::ZERO,
                    ..base.clone()
                },
            ),
            (
                "zero slice",
                LoadOptions {
                    slice: Duration::ZERO,
                    ..base.clone()
                },
            ),
            (
                "bad path",
                LoadOptions {
                    path: "api".into(),
                    ..base.clone()
                },
            ),
            (
                "no in-flight",
                LoadOptions {
                    max_in_flight: 0,
                    ..base.clone()
                },
            ),
        ];
        assert!(base.validate().is_ok());
        for (name, o) in cases {
            assert!(o.validate().is_err(), "{name}");
        }
    }
}
