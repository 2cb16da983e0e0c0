//! What to probe and how: the runtime form of a health-check configuration
//! (built from the TOML by `config`, consumed by the prober and the state machine).

use std::time::Duration;

pub use super::agent::AgentCheck;
pub mod dns;
pub use self::dns::DnsCheck;
pub mod expect;

pub use self::expect::{ExpectCheck, Matcher, Transport};

/// How a backend is probed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckKind {
    /// An HTTP/1.1 request; the application must answer.
    Http(HttpCheck),
    /// TCP connect only: proves the kernel accepts, not that the application
    /// answers. For non-HTTP services and for comparison.
    Tcp,
    /// One DNS query over UDP; the server must answer it (see `probe::dns`).
    Dns(DnsCheck),
    /// `kind = "tcp"` with `send`/`expect_*`, or `kind = "udp"`: bytes sent,
    /// the answer matched (see [`expect`]).
    Expect(ExpectCheck),
    /// The HTTP/1.1 request over TLS, the certificate checked as `tls` says.
    Https { http: HttpCheck, tls: TlsCheck },
    /// The standard gRPC health call (`grpc.health.v1.Health/Check`) over
    /// HTTP/2; see `probe::grpc`.
    Grpc(GrpcCheck),
}

/// A `kind = "grpc"` check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcCheck {
    /// The `service` asked about; "" is the server as a whole.
    pub service: String,
    /// `:authority`; `None` = the backend's address:port.
    pub host: Option<String>,
    /// As [`HttpCheck::reuse_connection`]: one HTTP/2 connection per
    /// backend, reopened every this many probes; `None`, one per probe.
    pub reuse_connection: Option<u32>,
    /// `tls = true`: HTTP/2 over TLS (ALPN `h2`); `None`, h2c.
    pub tls: Option<TlsCheck>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpCheck {
    /// Request method, e.g. "GET".
    pub method: String,
    /// Request target, e.g. "/health".
    pub path: String,
    /// Host header; `None` = the backend's address:port.
    pub host: Option<String>,
    /// Accepted status codes as inclusive ranges, e.g. `[(200, 299)]`.
    pub expect_status: Vec<(u16, u16)>,
    /// If set, the first 4 KiB of the body must contain this.
    pub body_contains: Option<String>,
    /// `reuse_connection = true`: keep one HTTP/1.1 keep-alive connection
    /// per backend and send each probe on it, opening a fresh one every
    /// this many probes (`reopen_every`, so the listener is still checked),
    /// and after any failure, timeout or `Connection: close`. `None`: a new
    /// connection per probe (the default).
    pub reuse_connection: Option<u32>,
}

/// How a TLS probe (`kind = "https"`, gRPC over TLS) checks the backend's
/// certificate (see `probe::tls`, which says what is and is not verified).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsCheck {
    /// `tls_verify`: check the chain, the dates and the name (the default).
    /// `false` accepts any certificate (self-signed backends).
    pub verify: bool,
    /// `ca_file`: trust only the CA certificates of this PEM file instead
    /// of the system's roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// The name sent as SNI and checked in the certificate (from `host`,
    /// without a port); `None`: the probed IP address (no SNI is sent).
    pub server_name: Option<String>,
}

/// Why an [`HttpCheck`] cannot be sent as a well-formed HTTP/1.1 request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HttpCheckError {
    #[error("method {0:?} is not an HTTP token (letters, digits, !#$%&'*+-.^_`|~)")]
    Method(String),
    #[error("path {0:?} must start with '/' and contain only visible ASCII (no spaces)")]
    Path(String),
    #[error("host {0:?} must be non-empty visible ASCII (no spaces)")]
    Host(String),
    #[error("expect_status is empty: no response could pass")]
    NoStatus,
    #[error("expect_status range {0}-{1} is not within 100-599 with low <= high")]
    StatusRange(u16, u16),
    #[error(
        "reopen_every {0} is out of range: use {min} to {max} probes per connection",
        min = MIN_REOPEN_EVERY,
        max = MAX_REOPEN_EVERY
    )]
    ReopenEvery(u32),
}

impl HttpCheck {
    /// Checks that the request can be written without header injection or a
    /// malformed request line, and that some status can pass. `config` calls
    /// this at load time; the prober calls it again so a bad spec fails the
    /// probe (with this text) instead of sending garbage to a backend.
    pub fn validate(&self) -> Result<(), HttpCheckError> {
        if !is_method(&self.method) {
            return Err(HttpCheckError::Method(self.method.clone()));
        }
        if !is_path(&self.path) {
            return Err(HttpCheckError::Path(self.path.clone()));
        }
        if let Some(host) = &self.host
            && !is_host(host)
        {
            return Err(HttpCheckError::Host(host.clone()));
        }
        if self.expect_status.is_empty() {
            return Err(HttpCheckError::NoStatus);
        }
        for &(lo, hi) in &self.expect_status {
            if !is_status_range(lo, hi) {
                return Err(HttpCheckError::StatusRange(lo, hi));
            }
        }
        if let Some(n) = self.reuse_connection
            && !is_reopen_every(n)
        {
            return Err(HttpCheckError::ReopenEvery(n));
        }
        Ok(())
    }

    /// Whether `status` falls in one of the accepted ranges.
    pub fn accepts(&self, status: u16) -> bool {
        self.expect_status
            .iter()
            .any(|&(lo, hi)| (lo..=hi).contains(&status))
    }
}

// The rules an `HttpCheck` field must meet, one function each: `validate`
// applies them all, and `config` applies them one by one so that each
// message can say where in the file the bad value is.

/// A token character (RFC 9110 §5.6.2): what a method or a header name is
/// made of.
pub(crate) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Visible ASCII, space excluded: a byte that cannot end or split a request
/// line or a header.
fn is_visible(b: u8) -> bool {
    (0x21..=0x7e).contains(&b)
}

/// A request method: one non-empty token.
pub(crate) fn is_method(method: &str) -> bool {
    !method.is_empty() && method.bytes().all(is_tchar)
}

/// A request target in origin form: '/' then visible ASCII.
pub(crate) fn is_path(path: &str) -> bool {
    path.starts_with('/') && path.bytes().all(is_visible)
}

/// A Host header value: non-empty visible ASCII.
pub(crate) fn is_host(host: &str) -> bool {
    !host.is_empty() && host.bytes().all(is_visible)
}

/// An inclusive range of status codes a server can send (100 to 599).
pub(crate) fn is_status_range(lo: u16, hi: u16) -> bool {
    lo >= 100 && hi <= 599 && lo <= hi
}

/// Fewest probes on one reused connection: 1 would be a new connection
/// every probe, i.e. `reuse_connection = false`.
pub const MIN_REOPEN_EVERY: u32 = 2;
/// Most probes on one reused connection: past this the saving is under 0.1 %
/// of a fresh connection's cost, and a dead listener behind a live
/// connection goes unnoticed for longer.
pub const MAX_REOPEN_EVERY: u32 = 1000;

/// Probes per reused connection (`reopen_every`) unless configured: at the
/// default 2 s interval a fresh connection every 20 s still checks the
/// listener, and 9 probes in 10 skip the TCP handshake and teardown.
pub const DEFAULT_REOPEN_EVERY: u32 = 10;

/// A count of probes per reused connection that the prober accepts.
pub(crate) fn is_reopen_every(n: u32) -> bool {
    (MIN_REOPEN_EVERY..=MAX_REOPEN_EVERY).contains(&n)
}

/// A complete, validated check specification for one backend.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckSpec {
    pub kind: CheckKind,
    /// Port probed (the backend's health port, or its service port).
    pub port: u16,
    /// Period between probes while the backend is steadily up.
    pub interval: Duration,
    /// How long a healthy answer may take: a probe with no complete answer
    /// by then is reported `Late` (not yet a failure) and, if it completes
    /// later, `Slow` (not a failure either).
    pub timeout: Duration,
    /// Deadline for the whole probe (connect, request and response): only
    /// no answer at all by then is a failure. Between `timeout` and
    /// `hang_timeout` a backend is slow, not hung. `timeout` ≤ this ≤
    /// [`MAX_HANG_TIMEOUT`]; equal to `timeout` is the strict behaviour (a
    /// late answer is a failure).
    pub hang_timeout: Duration,
    /// Consecutive successes that bring a backend up.
    pub rise: u32,
    /// Consecutive failures that take an up backend down.
    pub fall: u32,
    /// Period while a backend is between states (some successes or failures
    /// counted, threshold not yet reached).
    pub fast_interval: Duration,
    /// Period while a backend is down.
    pub down_interval: Duration,
    /// Jitter as a fraction of the period: each delay is drawn uniformly from
    /// `period × [1 − jitter, 1 + jitter]`. 0.1 = ±10 %.
    pub jitter: f64,
    /// Which way probes go: straight to the backend, or through the data
    /// path (the VIP's address, sent to this backend as clients' packets are).
    pub via: Via,
    /// `timeout = "auto"`: `timeout` is only the starting value; the daemon
    /// sets the deadline from the VIP's own recent latency
    /// ([`auto_timeout`]), so nobody has to guess one that will be wrong at
    /// peak.
    pub auto_timeout: bool,
    /// The agent check (`agent_port`), polled alongside the probe; `None`
    /// without one. See `health::agent`.
    pub agent: Option<AgentCheck>,
}

/// Latency percentile `timeout = "auto"` follows.
pub const AUTO_PERCENTILE: f64 = 0.95;
/// … times this factor …
pub const AUTO_FACTOR: f64 = 3.0;
/// … never below this (a loopback-fast VIP must not get a deadline that a
/// scheduling hiccup exceeds) …
pub const AUTO_FLOOR: Duration = Duration::from_millis(50);
/// … and never above `min(interval, hang_timeout)`. Fewer answers than this
/// and the configured starting value stands.
pub const AUTO_MIN_SAMPLES: usize = 10;
/// Answers a VIP remembers for `timeout = "auto"`.
pub const AUTO_SAMPLES: usize = 200;

/// The deadline of `timeout = "auto"`: the [`AUTO_PERCENTILE`] of a VIP's
/// recent answer latencies (passing answers only: a hung backend has none,
/// so it cannot drag the deadline up) × [`AUTO_FACTOR`], within
/// [`AUTO_FLOOR`] and `ceiling`; `start` until there are
/// [`AUTO_MIN_SAMPLES`] answers.
pub fn auto_timeout(samples: &[Duration], start: Duration, ceiling: Duration) -> Duration {
    if samples.len() < AUTO_MIN_SAMPLES {
        return start.min(ceiling);
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = ((sorted.len() as f64 * AUTO_PERCENTILE).ceil() as usize).clamp(1, sorted.len());
    let p = sorted[rank - 1];
    p.mul_f64(AUTO_FACTOR)
        .clamp(AUTO_FLOOR, ceiling.max(AUTO_FLOOR))
}

/// The way a probe reaches a backend (`via` in a health_check table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// To the backend's own address and health port.
    Direct,
    /// To the VIP's address and the health port, marked so that the tc
    /// program `xlb_hc` sends it to this backend exactly as the data plane
    /// sends clients' packets (see `health::datapath`). A backend whose
    /// decapsulator stopped, or whose VIP is missing from `lo`, fails this
    /// probe although a direct one passes.
    Vip,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Vip => "vip",
        }
    }
}

/// Longest `hang_timeout`: a backend that has not answered in a minute is
/// hung by any standard, and every waiting probe holds a socket and a
/// concurrency permit.
pub const MAX_HANG_TIMEOUT: Duration = Duration::from_secs(60);

/// Most probes of one backend in flight at once, whatever the spec says (see
/// [`CheckSpec::max_in_flight`]).
pub const MAX_IN_FLIGHT: usize = 64;

impl CheckSpec {
    /// Probes of one backend that may be in flight at once: one probe every
    /// shortest period for `hang_timeout`, plus the new one:
    /// `ceil(hang_timeout / shortest period) + 1`, at most [`MAX_IN_FLIGHT`].
    /// The scheduler waits for the oldest to end before starting another.
    pub fn max_in_flight(&self) -> usize {
        let shortest = self
            .interval
            .min(self.fast_interval)
            .min(self.down_interval)
            .as_nanos()
            .max(1);
        let lingering = self.hang_timeout.as_nanos().div_ceil(shortest);
        usize::try_from(lingering)
            .unwrap_or(usize::MAX)
            .saturating_add(1)
            .min(MAX_IN_FLIGHT)
    }
}

/// Defaults (documented in the README and `examples/xlb.toml`).
pub mod defaults {
    use std::time::Duration;
    pub const INTERVAL: Duration = Duration::from_secs(2);
    pub const TIMEOUT: Duration = Duration::from_secs(1);
    /// `hang_timeout` is this many times `timeout` unless configured (and
    /// never beyond [`super::MAX_HANG_TIMEOUT`] nor below `timeout`): a fleet
    /// that answers 2-3× slower than usual at peak is slow, not hung.
    pub const HANG_TIMEOUT_FACTOR: u32 = 3;
    pub const RISE: u32 = 2;
    pub const FALL: u32 = 3;
    pub const FAST_INTERVAL: Duration = Duration::from_millis(500);
    pub const DOWN_INTERVAL: Duration = Duration::from_secs(5);
    pub const JITTER: f64 = 0.1;
    /// Through the data path: it costs about 12 µs of CPU more per probe
    /// than a direct one with dsr-ipip, nothing measurable with dsr-l2
    /// (`xlb-dpath-bench`), and catches a backend that blackholes clients.
    pub const VIA: super::Via = super::Via::Vip;
    pub const HTTP_METHOD: &str = "GET";
    pub const HTTP_PATH: &str = "/health";
    /// 2xx only: a redirect is a failure, as in Envoy. A health endpoint that
    /// redirects (to a login page, to https) is not answering the check.
    pub const EXPECT_STATUS: (u16, u16) = (200, 299);
}

/// The `hang_timeout` of a check whose `timeout` is `timeout` and that sets
/// none: [`defaults::HANG_TIMEOUT_FACTOR`] × `timeout`, within
/// `[timeout, MAX_HANG_TIMEOUT]` (a timeout above the maximum is kept: the
/// hang deadline is never shorter than the timeout).
pub fn default_hang_timeout(timeout: Duration) -> Duration {
    timeout
        .saturating_mul(defaults::HANG_TIMEOUT_FACTOR)
        .min(MAX_HANG_TIMEOUT)
        .max(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_timeout_follows_the_vips_latency() {
        let ms = Duration::from_millis;
        let start = ms(1000);
        let ceiling = ms(2000);
        let same = |n: usize, v: u64| vec![ms(v); n];
        let mut mixed = same(95, 20);
        mixed.extend(same(5, 400));
        let mut tail = same(90, 20);
        tail.extend(same(10, 400));
        let cases: Vec<(&str, Vec<Duration>, Duration)> = vec![
            ("too few answers: the starting value", same(9, 10), start),
            ("fast VIP: p95 × 3, above the floor", same(20, 30), ms(90)),
            ("loopback-fast VIP: the floor", same(20, 1), AUTO_FLOOR),
            ("slow VIP at peak: follows it", same(50, 500), ms(1500)),
            (
                "slower than the ceiling allows: the ceiling",
                same(50, 900),
                ceiling,
            ),
            (
                "5 % slow answers are the 95th percentile's edge",
                mixed,
                ms(60),
            ),
            ("10 % slow answers set it", tail, ms(1200)),
        ];
        for (name, samples, want) in cases {
            assert_eq!(auto_timeout(&samples, start, ceiling), want, "{name}");
        }
        assert_eq!(
            auto_timeout(&[], ms(3000), ceiling),
            ceiling,
            "start capped"
        );
    }

    #[test]
    fn default_hang_timeout_cases() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let cases = [
            ("default 1s timeout", s(1), s(3)),
            ("fast profile", ms(100), ms(300)),
            ("capped at a minute", s(30), s(60)),
            ("never below the timeout", s(90), s(90)),
        ];
        for (name, timeout, want) in cases {
            assert_eq!(default_hang_timeout(timeout), want, "{name}");
        }
    }

    #[test]
    fn max_in_flight_cases() {
        let ms = Duration::from_millis;
        let spec = |interval, fast, down, hang| CheckSpec {
            kind: CheckKind::Tcp,
            port: 80,
            interval,
            timeout: ms(100),
            hang_timeout: hang,
            rise: 1,
            fall: 1,
            fast_interval: fast,
            down_interval: down,
            jitter: 0.0,
            via: crate::health::spec::Via::Direct,
            auto_timeout: false,
            agent: None,
        };
        let cases = [
            ("defaults", spec(ms(2000), ms(500), ms(5000), ms(3000)), 7),
            (
                "hang within one period",
                spec(ms(2000), ms(2000), ms(2000), ms(1000)),
                2,
            ),
            ("hang = period", spec(ms(200), ms(200), ms(200), ms(200)), 2),
            ("fast profile", spec(ms(200), ms(200), ms(5000), ms(300)), 3),
            (
                "capped",
                spec(ms(10), ms(10), ms(10), ms(60_000)),
                MAX_IN_FLIGHT,
            ),
        ];
        for (name, spec, want) in cases {
            assert_eq!(spec.max_in_flight(), want, "{name}");
        }
    }

    #[test]
    fn http_check_validation() {
        let base = HttpCheck {
            method: defaults::HTTP_METHOD.to_owned(),
            path: defaults::HTTP_PATH.to_owned(),
            host: None,
            expect_status: vec![defaults::EXPECT_STATUS],
            body_contains: None,
            reuse_connection: None,
        };
        let with = |f: fn(&mut HttpCheck)| {
            let mut check = base.clone();
            f(&mut check);
            check
        };
        let cases = [
            ("defaults", base.clone(), Ok(())),
            (
                "HEAD with host",
                with(|c| {
                    c.method = "HEAD".into();
                    c.host = Some("api.example:8080".into());
                }),
                Ok(()),
            ),
            (
                "several ranges",
                with(|c| c.expect_status = vec![(200, 204), (418, 418)]),
                Ok(()),
            ),
            (
                "method with space",
                with(|c| c.method = "GET /x".into()),
                Err(HttpCheckError::Method("GET /x".into())),
            ),
            (
                "empty method",
                with(|c| c.method = String::new()),
                Err(HttpCheckError::Method(String::new())),
            ),
            (
                "relative path",
                with(|c| c.path = "health".into()),
                Err(HttpCheckError::Path("health".into())),
            ),
            (
                "CRLF in path",
                with(|c| c.path = "/h\r\nX: 1".into()),
                Err(HttpCheckError::Path("/h\r\nX: 1".into())),
            ),
            (
                "space in host",
                with(|c| c.host = Some("a b".into())),
                Err(HttpCheckError::Host("a b".into())),
            ),
            (
                "empty host",
                with(|c| c.host = Some(String::new())),
                Err(HttpCheckError::Host(String::new())),
            ),
            (
                "no status",
                with(|c| c.expect_status = vec![]),
                Err(HttpCheckError::NoStatus),
            ),
            (
                "inverted range",
                with(|c| c.expect_status = vec![(299, 200)]),
                Err(HttpCheckError::StatusRange(299, 200)),
            ),
            (
                "beyond 599",
                with(|c| c.expect_status = vec![(200, 600)]),
                Err(HttpCheckError::StatusRange(200, 600)),
            ),
            (
                "reused connection",
                with(|c| c.reuse_connection = Some(DEFAULT_REOPEN_EVERY)),
                Ok(()),
            ),
            (
                "reused for one probe only",
                with(|c| c.reuse_connection = Some(1)),
                Err(HttpCheckError::ReopenEvery(1)),
            ),
            (
                "reused for too many probes",
                with(|c| c.reuse_connection = Some(1001)),
                Err(HttpCheckError::ReopenEvery(1001)),
            ),
        ];
        for (name, check, want) in cases {
            assert_eq!(check.validate(), want, "{name}");
        }
    }

    #[test]
    fn default_status_excludes_redirects() {
        let check = HttpCheck {
            method: "GET".into(),
            path: "/".into(),
            host: None,
            expect_status: vec![defaults::EXPECT_STATUS],
            body_contains: None,
            reuse_connection: None,
        };
        let cases = [
            (199, false),
            (200, true),
            (204, true),
            (299, true),
            (301, false),
            (302, false),
            (503, false),
        ];
        for (status, accepted) in cases {
            assert_eq!(check.accepts(status), accepted, "{status}");
        }
    }
}
