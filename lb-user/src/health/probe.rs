//! One health probe: a TCP connect, or a small, strict HTTP/1.1 exchange.
//!
//! The prober talks to backends that may be broken in any way (hung, resetting,
//! dripping bytes, sending endless bodies, lying about framing), so every read
//! is bounded in size and the whole probe in time: at most [`HEADER_LIMIT`]
//! bytes of headers and [`BODY_LIMIT`] bytes of body are ever read, and
//! nothing outlives `spec.hang_timeout`. Redirects are never followed.
//!
//! A probe does not stop at `spec.timeout`: a backend that answers late but
//! completely is slow, not hung, and telling the two apart is what keeps a
//! fleet slowed down by load from being ejected node by node (seed 003). The
//! verdict is classified against `timeout` afterwards ([`ProbeClass`]); the
//! scheduler reports `Late` when `timeout` passes without one.

use std::fmt;
use std::future::{Future as _, poll_fn};
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{Instant, timeout_at};

use super::datapath::DatapathTarget;
use super::spec::{CheckKind, CheckSpec, HttpCheck};

/// Cap on the status line and headers (all of them, interim 1xx responses
/// included). Longer is treated as malformed: a health endpoint has no reason
/// to send more, and a hostile one must not make us buffer without bound.
pub const HEADER_LIMIT: usize = 8 * 1024;

/// How much of the body is read and searched for `body_contains`. The rest is
/// never read: the connection is closed instead.
pub const BODY_LIMIT: usize = 4 * 1024;

/// Cap on one chunk-size line (size and extensions) of a chunked body. Real
/// servers send a few hex digits; anything this long is an attack or a bug.
const CHUNK_LINE_LIMIT: usize = 256;

/// Cap on raw bytes read for a chunked body, framing included, so tiny chunks
/// with long extensions cannot make us read far more than `BODY_LIMIT`.
const CHUNKED_RAW_LIMIT: usize = 32 * 1024;

/// The User-Agent sent with every HTTP probe, so backends can tell (and
/// exclude from their access logs) health traffic.
pub const USER_AGENT: &str = "xlb-health/0.1";

/// A probe that passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeOk {
    /// The final HTTP status; `None` for a TCP check.
    pub status: Option<u16>,
}

/// The outcome of one probe and how long it took (until the verdict: for a
/// failure by timeout this is about `spec.hang_timeout`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeResult {
    pub outcome: Result<ProbeOk, FailReason>,
    pub latency: Duration,
}

impl ProbeResult {
    pub fn is_ok(&self) -> bool {
        self.outcome.is_ok()
    }

    /// What this final result means for the backend, judged against the
    /// check's `timeout`: a pass after it is [`ProbeClass::Slow`], an error
    /// of the load balancer's own is [`ProbeClass::Local`].
    pub fn class(&self, timeout: Duration) -> ProbeClass {
        match &self.outcome {
            Ok(_) if self.latency > timeout => ProbeClass::Slow {
                latency: self.latency,
                timeout,
            },
            Ok(_) => ProbeClass::Ok,
            Err(fail @ FailReason::Local { .. }) => ProbeClass::Local(fail.clone()),
            Err(fail) => ProbeClass::Failed(fail.clone()),
        }
    }
}

/// What a probe report says about the backend. Only `Failed` counts toward
/// `fall`; `Ok` and `Slow` count toward `rise` (a slow answer proves the
/// application is alive); `Late` and `Local` move neither streak.
/// `Display` is the text for operators, [`ProbeClass::code`] the stable id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeClass {
    /// A complete, passing response within `timeout`.
    Ok,
    /// Interim, never final: `timeout` passed without a complete response
    /// and the probe goes on until `hang_timeout`. Its latency is at least
    /// `timeout`.
    Late { timeout: Duration },
    /// A complete, passing response after `timeout` (within `hang_timeout`).
    /// Not a failure.
    Slow {
        latency: Duration,
        timeout: Duration,
    },
    /// The backend failed the check (refused, reset, closed, malformed, bad
    /// status or body, no complete response within `hang_timeout`, invalid
    /// check). Counts toward `fall`.
    Failed(FailReason),
    /// The load balancer's own fault (always [`FailReason::Local`]): out of
    /// descriptors or buffers, no route from this host. Never counts toward
    /// `fall`; raise an alarm instead.
    Local(FailReason),
}

impl ProbeClass {
    /// Stable snake_case identifier: `ok`, `late`, `slow`, `local_error`, or
    /// the failure's [`FailReason::code`].
    pub fn code(&self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Late { .. } => "late",
            Self::Slow { .. } => "slow",
            Self::Failed(fail) | Self::Local(fail) => fail.code(),
        }
    }

    /// Whether this is a final verdict of a failed check (counts toward `fall`).
    pub fn is_failure(&self) -> bool {
        matches!(self, Self::Failed(_))
    }
}

impl fmt::Display for ProbeClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ok => f.write_str("ok"),
            Self::Late { timeout } => {
                write!(
                    f,
                    "no complete answer within timeout {} yet",
                    Compact(*timeout)
                )
            }
            Self::Slow { latency, timeout } => write!(
                f,
                "answered in {} (slower than timeout {})",
                Compact(*latency),
                Compact(*timeout)
            ),
            Self::Failed(fail) | Self::Local(fail) => fail.fmt(f),
        }
    }
}

/// Why a probe failed. `Display` is the text shown to operators (logs, CLI);
/// [`FailReason::code`] is a stable identifier for JSON and metrics.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FailReason {
    /// Nothing listens on the port (RST to our SYN).
    #[error("connection refused")]
    ConnectionRefused,
    /// The backend reset the connection at any point of the exchange.
    #[error("connection reset")]
    ConnectionReset,
    /// No handshake within `hang_timeout` (the field): host down, packets
    /// dropped, or an accept queue overflowing.
    #[error("connect timeout after {}", Compact(*.timeout))]
    ConnectTimeout { timeout: Duration },
    /// The kernel completed the handshake but not one byte of response came
    /// within `hang_timeout` (the field): the application is hung (e.g. a
    /// blocked Node.js event loop).
    #[error("connected, no HTTP response within {}", Compact(*.timeout))]
    NoResponse { timeout: Duration },
    /// Some bytes came, but not a complete response within `hang_timeout`.
    #[error("response incomplete within {} ({received} bytes received)", Compact(*.timeout))]
    Incomplete { timeout: Duration, received: usize },
    /// The backend closed the connection before the response was complete.
    #[error("{}", closed_text(*.received))]
    Closed { received: usize },
    /// Bytes that are not an HTTP/1.x response.
    #[error("malformed response: {reason}")]
    Malformed { reason: String },
    /// A well-formed response with a status outside `expect_status`.
    #[error("unexpected status {status}")]
    UnexpectedStatus { status: u16 },
    /// The first `BODY_LIMIT` bytes of the body lack `body_contains`.
    #[error("body mismatch: first 4 KiB of the body do not contain {expected:?}")]
    BodyMismatch { expected: String },
    /// The check itself cannot be sent (see `HttpCheck::validate`).
    #[error("invalid check: {reason}")]
    InvalidCheck { reason: String },
    /// Any other socket error (e.g. an ICMP "no route to host" from a router
    /// on the way).
    #[error("I/O error while {during}: {error}")]
    Io { during: &'static str, error: String },
    /// The load balancer could not probe: out of file descriptors (EMFILE,
    /// ENFILE), socket buffers or memory (ENOBUFS, ENOMEM), local ports
    /// (EADDRNOTAVAIL), or no route from this host (ENETUNREACH,
    /// EHOSTUNREACH returned by `connect(2)` itself). Says nothing about the
    /// backend: never counts toward `fall` (see [`ProbeClass::Local`]).
    #[error("local error, not the backend's fault: {error} while {during}")]
    Local { during: &'static str, error: String },
    /// A data-path probe (`via = "vip"`) got no answer while a direct probe
    /// of the same backend did: the backend serves, but clients' packets
    /// sent to it are lost (decapsulator stopped, VIP missing from `lo`,
    /// service not bound to the VIP). `text` is the whole operator text:
    /// `no answer via VIP 10.100.0.1:80 through dsr-ipip (connect timeout
    /// after 3s); direct probe ok`.
    #[error("{text}")]
    NoAnswerViaVip { text: String },
}

fn closed_text(received: usize) -> String {
    if received == 0 {
        "connection closed with no HTTP response".to_owned()
    } else {
        format!("connection closed after {received} bytes, response incomplete")
    }
}

impl FailReason {
    /// Stable snake_case identifier, for JSON output and metric labels.
    pub fn code(&self) -> &'static str {
        match self {
            Self::ConnectionRefused => "connection_refused",
            Self::ConnectionReset => "connection_reset",
            Self::ConnectTimeout { .. } => "connect_timeout",
            Self::NoResponse { .. } => "no_response",
            Self::Incomplete { .. } => "response_incomplete",
            Self::Closed { .. } => "connection_closed",
            Self::Malformed { .. } => "malformed_response",
            Self::UnexpectedStatus { .. } => "unexpected_status",
            Self::BodyMismatch { .. } => "body_mismatch",
            Self::InvalidCheck { .. } => "invalid_check",
            Self::Io { .. } => "io_error",
            Self::Local { .. } => "local_error",
            Self::NoAnswerViaVip { .. } => "no_answer_via_vip",
        }
    }

    fn malformed(reason: impl Into<String>) -> Self {
        Self::Malformed {
            reason: reason.into(),
        }
    }
}

/// Formats a duration compactly for operators: `1s`, `200ms`, `1.5s`, `250µs`.
#[derive(Clone, Copy, Debug)]
pub struct Compact(pub Duration);

impl fmt::Display for Compact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d >= Duration::from_secs(1) {
            let secs = d.as_secs();
            // Millisecond precision is all an operator needs; trailing zeros go.
            let millis = d.subsec_millis();
            if millis == 0 {
                write!(f, "{secs}s")
            } else {
                let frac = format!("{millis:03}");
                write!(f, "{secs}.{}s", frac.trim_end_matches('0'))
            }
        } else if d >= Duration::from_millis(1) {
            let millis = d.as_millis();
            let micros = d.subsec_micros() % 1000;
            if micros == 0 {
                write!(f, "{millis}ms")
            } else {
                let frac = format!("{micros:03}");
                write!(f, "{millis}.{}ms", frac.trim_end_matches('0'))
            }
        } else {
            write!(f, "{}µs", d.as_micros())
        }
    }
}

/// Probes `addr` (exactly that address and port) as `spec.kind` says, within
/// `spec.hang_timeout` for the whole exchange (classify the result against
/// `spec.timeout` with [`ProbeResult::class`]). Never panics and never reads
/// more than `HEADER_LIMIT + BODY_LIMIT` (plus chunk framing) bytes.
pub async fn probe(addr: SocketAddr, spec: &CheckSpec) -> ProbeResult {
    probe_via(addr, spec, None).await
}

/// Like [`probe`], but through the data path when `path` is given: to the
/// VIP's address and `spec.port`, sent to this backend by `xlb_hc` (see
/// `health::datapath`). When that fails before a connection is made, a
/// direct probe tells "the path to the backend is broken" (reported as
/// [`FailReason::NoAnswerViaVip`], the operator's clue) from "the backend
/// fails" (reported as the direct probe's failure).
pub async fn probe_via(
    addr: SocketAddr,
    spec: &CheckSpec,
    path: Option<&DatapathTarget>,
) -> ProbeResult {
    let Some(path) = path else {
        return probe_to(addr, spec, None).await;
    };
    let start = Instant::now();
    let via = SocketAddr::new(path.vip.ip(), addr.port());
    let result = probe_to(via, spec, Some(path)).await;
    let connect_failed = matches!(
        &result.outcome,
        Err(FailReason::ConnectTimeout { .. }
            | FailReason::ConnectionRefused
            | FailReason::ConnectionReset
            | FailReason::Io {
                during: "connecting",
                ..
            })
    );
    if !connect_failed {
        return result;
    }
    let direct = probe_to(addr, spec, None).await;
    let outcome = match (&result.outcome, direct.outcome) {
        (Err(fail), Ok(_)) => Err(FailReason::NoAnswerViaVip {
            text: path.failure_reason(&fail.to_string(), Some(true)),
        }),
        (_, direct) => direct,
    };
    ProbeResult {
        outcome,
        latency: start.elapsed(),
    }
}

async fn probe_to(
    addr: SocketAddr,
    spec: &CheckSpec,
    path: Option<&DatapathTarget>,
) -> ProbeResult {
    let start = Instant::now();
    // A spec built by hand with hang_timeout < timeout still gets a verdict
    // by `timeout`, as before hang_timeout existed.
    let limit = spec.hang_timeout.max(spec.timeout);
    let deadline = start + limit;
    let outcome = match &spec.kind {
        CheckKind::Tcp => connect(addr, path, deadline, limit)
            .await
            .map(|_stream| ProbeOk { status: None }),
        CheckKind::Http(http) => http_probe(addr, path, http, deadline, limit).await,
    };
    ProbeResult {
        outcome,
        latency: start.elapsed(),
    }
}

async fn connect(
    addr: SocketAddr,
    path: Option<&DatapathTarget>,
    deadline: Instant,
    timeout: Duration,
) -> Result<TcpStream, FailReason> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4(),
        SocketAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(|e| io_fail(e, "creating a socket"))?;
    if let Some(path) = path {
        // EPERM (no CAP_NET_ADMIN for SO_MARK), or the interface is gone:
        // this host's problem, whatever the backend does.
        path.prepare(&socket).map_err(|e| FailReason::Local {
            during: "marking a data-path probe socket",
            error: e.to_string(),
        })?;
    }
    // `connect(2)` runs in the first poll: an error there is this host's
    // own answer (no route in our table, no local port), not the network's.
    // Later errors come from the peer or a router (SO_ERROR).
    let mut connecting = pin!(socket.connect(addr));
    let first = poll_fn(|cx| Poll::Ready(connecting.as_mut().poll(cx))).await;
    let result = match first {
        Poll::Ready(Err(e)) => return Err(connect_fail(e, true, timeout)),
        Poll::Ready(Ok(stream)) => Ok(Ok(stream)),
        Poll::Pending => timeout_at(deadline, connecting).await,
    };
    match result {
        Err(_elapsed) => Err(FailReason::ConnectTimeout { timeout }),
        Ok(Err(e)) => Err(connect_fail(e, false, timeout)),
        Ok(Ok(stream)) => Ok(stream),
    }
}

fn connect_fail(e: io::Error, synchronous: bool, timeout: Duration) -> FailReason {
    // The kernel gives up on SYN retries only after minutes, but if it
    // does first, it is the same condition.
    if e.kind() == io::ErrorKind::TimedOut {
        return FailReason::ConnectTimeout { timeout };
    }
    let no_route = matches!(
        e.raw_os_error(),
        Some(libc::ENETUNREACH | libc::EHOSTUNREACH)
    );
    if synchronous && no_route {
        return FailReason::Local {
            during: "connecting (no route from this host)",
            error: e.to_string(),
        };
    }
    io_fail(e, "connecting")
}

/// Whether `errno` is this host running out of something: the probe says
/// nothing about the backend.
fn is_local_errno(errno: i32) -> bool {
    matches!(
        errno,
        libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EADDRNOTAVAIL
    )
}

fn io_fail(e: io::Error, during: &'static str) -> FailReason {
    if e.raw_os_error().is_some_and(is_local_errno) {
        return FailReason::Local {
            during,
            error: e.to_string(),
        };
    }
    match e.kind() {
        io::ErrorKind::ConnectionRefused => FailReason::ConnectionRefused,
        // EPIPE on a TCP socket means the peer's RST already arrived (a FIN
        // alone does not make writes fail), so it is a reset too.
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => FailReason::ConnectionReset,
        _ => FailReason::Io {
            during,
            error: e.to_string(),
        },
    }
}

fn request(addr: SocketAddr, http: &HttpCheck) -> Vec<u8> {
    let host = match &http.host {
        Some(host) => host.clone(),
        // SocketAddr's Display brackets IPv6 ("[::1]:80"), as Host requires.
        None => addr.to_string(),
    };
    format!(
        "{} {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\nConnection: close\r\n\r\n",
        http.method, http.path
    )
    .into_bytes()
}

async fn http_probe(
    addr: SocketAddr,
    path: Option<&DatapathTarget>,
    http: &HttpCheck,
    deadline: Instant,
    timeout: Duration,
) -> Result<ProbeOk, FailReason> {
    if let Err(e) = http.validate() {
        return Err(FailReason::InvalidCheck {
            reason: e.to_string(),
        });
    }
    let mut stream = connect(addr, path, deadline, timeout).await?;
    // A request this small fits in the socket send buffer, so this completes
    // even when the application never reads; a timeout here still means no
    // response at all.
    match timeout_at(deadline, stream.write_all(&request(addr, http))).await {
        Err(_elapsed) => return Err(FailReason::NoResponse { timeout }),
        Ok(Err(e)) => return Err(io_fail(e, "sending the request")),
        Ok(Ok(())) => {}
    }
    let mut reader = Reader {
        stream,
        buf: Vec::with_capacity(HEADER_LIMIT),
        received: 0,
        deadline,
        timeout,
    };
    let head = read_final_head(&mut reader).await?;
    if !http.accepts(head.status) {
        return Err(FailReason::UnexpectedStatus {
            status: head.status,
        });
    }
    if let Some(expected) = &http.body_contains {
        let is_head = http.method.eq_ignore_ascii_case("HEAD");
        let body = read_body(&mut reader, &head, is_head).await?;
        if !contains(&body, expected.as_bytes()) {
            return Err(FailReason::BodyMismatch {
                expected: expected.clone(),
            });
        }
    }
    // Dropping the stream closes it; unread bytes (the rest of a large body)
    // make the kernel send RST, which stops the backend from sending more.
    Ok(ProbeOk {
        status: Some(head.status),
    })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// The response bytes received so far, with the deadline that bounds every read.
struct Reader {
    stream: TcpStream,
    /// Received, not yet consumed.
    buf: Vec<u8>,
    /// Total bytes received on this connection.
    received: usize,
    deadline: Instant,
    timeout: Duration,
}

impl Reader {
    /// Reads at most `max` more bytes into `buf`; `Ok(0)` means the backend
    /// closed the connection.
    async fn fill(&mut self, max: usize) -> Result<usize, FailReason> {
        let mut chunk = [0u8; 4096];
        let want = max.min(chunk.len());
        debug_assert!(want > 0, "fill called with nothing to read");
        match timeout_at(self.deadline, self.stream.read(&mut chunk[..want])).await {
            Err(_elapsed) if self.received == 0 => Err(FailReason::NoResponse {
                timeout: self.timeout,
            }),
            Err(_elapsed) => Err(FailReason::Incomplete {
                timeout: self.timeout,
                received: self.received,
            }),
            Ok(Err(e)) => Err(io_fail(e, "reading the response")),
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                self.received += n;
                Ok(n)
            }
        }
    }

    /// Like `fill`, but the backend closing the connection is an error.
    async fn fill_more(&mut self, max: usize) -> Result<(), FailReason> {
        if self.fill(max).await? == 0 {
            return Err(FailReason::Closed {
                received: self.received,
            });
        }
        Ok(())
    }

    /// Consumes one line (LF or CRLF terminated) of at most `limit` bytes.
    async fn read_line(&mut self, limit: usize, what: &str) -> Result<Vec<u8>, FailReason> {
        loop {
            if let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                if nl > limit {
                    return Err(FailReason::malformed(format!(
                        "{what} longer than {limit} bytes"
                    )));
                }
                let mut line: Vec<u8> = self.buf.drain(..=nl).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(line);
            }
            if self.buf.len() >= limit {
                return Err(FailReason::malformed(format!(
                    "{what} longer than {limit} bytes"
                )));
            }
            let room = limit + 2 - self.buf.len();
            self.fill_more(room).await?;
        }
    }
}

/// What the prober needs from a response head.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    status: u16,
    framing: Framing,
}

/// How the body's end is found (RFC 9112 §6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
}

/// Reads response heads until a final (non-1xx) one. Interim responses
/// (100 Continue, 103 Early Hints) are allowed before it, within the same
/// header budget.
async fn read_final_head(reader: &mut Reader) -> Result<Head, FailReason> {
    let mut consumed = 0;
    loop {
        let head = loop {
            if let Some(end) = head_end(&reader.buf) {
                if consumed + end > HEADER_LIMIT {
                    return Err(too_long());
                }
                let head = parse_head(&reader.buf[..end])?;
                reader.buf.drain(..end);
                consumed += end;
                break head;
            }
            let room = HEADER_LIMIT.saturating_sub(consumed + reader.buf.len());
            if room == 0 {
                return Err(too_long());
            }
            reader.fill_more(room).await?;
        };
        // 101 is final: we never asked to switch protocols, so it will fail
        // the status check as it should.
        if !(100..200).contains(&head.status) || head.status == 101 {
            return Ok(head);
        }
    }
}

fn too_long() -> FailReason {
    FailReason::malformed(format!("headers longer than {} KiB", HEADER_LIMIT / 1024))
}

/// End (exclusive) of the head in `buf`: just past the first empty line.
fn head_end(buf: &[u8]) -> Option<usize> {
    let mut start = 0;
    while let Some(off) = buf[start..].iter().position(|&b| b == b'\n') {
        let nl = start + off;
        let line = &buf[start..nl];
        if line.is_empty() || line == b"\r" {
            return Some(nl + 1);
        }
        start = nl + 1;
    }
    None
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parses a complete head (status line, headers, empty line). Strict where
/// leniency would let a broken backend pass: only HTTP/1.x, a three-digit
/// status in 100-599, token header names with the colon right after, no
/// control characters, no obsolete line folding, consistent framing headers.
fn parse_head(head: &[u8]) -> Result<Head, FailReason> {
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    let status_line = lines.next().unwrap_or_default();
    let status = parse_status_line(status_line)?;

    let mut content_length: Option<u64> = None;
    let mut transfer_encoding: Option<Vec<u8>> = None;
    for line in lines {
        if line.is_empty() {
            // The terminating empty line (and the empty split after it).
            continue;
        }
        if line.contains(&b'\r') {
            return Err(FailReason::malformed("bare CR in headers"));
        }
        if line[0] == b' ' || line[0] == b'\t' {
            return Err(FailReason::malformed("obsolete line folding in headers"));
        }
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or_else(|| FailReason::malformed("header line without a colon"))?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return Err(FailReason::malformed(format!(
                "invalid header name {:?}",
                String::from_utf8_lossy(&name[..name.len().min(40)])
            )));
        }
        if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err(FailReason::malformed("control character in a header value"));
        }
        let value = value.trim_ascii();
        if name.eq_ignore_ascii_case(b"content-length") {
            // "Content-Length: 5, 5" and repeated identical headers are
            // allowed (RFC 9110 §8.6); differing values are not.
            for part in value.split(|&b| b == b',') {
                let n = parse_decimal(part.trim_ascii())
                    .ok_or_else(|| FailReason::malformed("invalid Content-Length"))?;
                if content_length.is_some_and(|old| old != n) {
                    return Err(FailReason::malformed("conflicting Content-Length values"));
                }
                content_length = Some(n);
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            let te = transfer_encoding.get_or_insert_with(Vec::new);
            if !te.is_empty() {
                te.push(b',');
            }
            te.extend_from_slice(value);
        }
    }

    let framing = if let Some(te) = transfer_encoding {
        // Transfer-Encoding overrides Content-Length (RFC 9112 §6.3). A
        // response whose last coding is not chunked runs until close.
        let last = te
            .rsplit(|&b| b == b',')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        if last.eq_ignore_ascii_case(b"chunked") {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else if let Some(n) = content_length {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    Ok(Head { status, framing })
}

fn parse_status_line(line: &[u8]) -> Result<u16, FailReason> {
    let shown = || String::from_utf8_lossy(&line[..line.len().min(40)]).into_owned();
    let rest = line
        .strip_prefix(b"HTTP/")
        .ok_or_else(|| FailReason::malformed(format!("not an HTTP status line: {:?}", shown())))?;
    let [major, b'.', minor, b' ', d0, d1, d2, tail @ ..] = rest else {
        return Err(FailReason::malformed(format!(
            "invalid status line: {:?}",
            shown()
        )));
    };
    if *major != b'1' || !minor.is_ascii_digit() {
        return Err(FailReason::malformed(format!(
            "unsupported HTTP version in {:?}",
            shown()
        )));
    }
    // The reason phrase is optional; its separating space should be there,
    // but a bare "HTTP/1.1 200" is common enough and unambiguous.
    if !(tail.is_empty() || tail[0] == b' ') {
        return Err(FailReason::malformed(format!(
            "invalid status line: {:?}",
            shown()
        )));
    }
    if tail.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(FailReason::malformed(
            "control character in the reason phrase",
        ));
    }
    let digits = [*d0, *d1, *d2];
    if !digits.iter().all(u8::is_ascii_digit) {
        return Err(FailReason::malformed(format!(
            "invalid status code in {:?}",
            shown()
        )));
    }
    let status = digits
        .iter()
        .fold(0u16, |acc, d| acc * 10 + u16::from(d - b'0'));
    if !(100..=599).contains(&status) {
        return Err(FailReason::malformed(format!(
            "status code {status} out of range"
        )));
    }
    Ok(status)
}

fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    s.iter().try_fold(0u64, |acc, d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// Reads the first `BODY_LIMIT` bytes of the body (fewer if it ends sooner).
async fn read_body(reader: &mut Reader, head: &Head, is_head: bool) -> Result<Vec<u8>, FailReason> {
    if is_head || head.status == 204 || head.status == 304 {
        return Ok(Vec::new());
    }
    match head.framing {
        Framing::Length(n) => {
            let want = usize::try_from(n).unwrap_or(usize::MAX).min(BODY_LIMIT);
            while reader.buf.len() < want {
                let room = want - reader.buf.len();
                reader.fill_more(room).await?;
            }
            reader.buf.truncate(want);
            Ok(std::mem::take(&mut reader.buf))
        }
        Framing::UntilClose => {
            while reader.buf.len() < BODY_LIMIT {
                let room = BODY_LIMIT - reader.buf.len();
                if reader.fill(room).await? == 0 {
                    break;
                }
            }
            reader.buf.truncate(BODY_LIMIT);
            Ok(std::mem::take(&mut reader.buf))
        }
        Framing::Chunked => read_chunked(reader).await,
    }
}

async fn read_chunked(reader: &mut Reader) -> Result<Vec<u8>, FailReason> {
    let raw_start = reader.received - reader.buf.len();
    let mut body = Vec::with_capacity(BODY_LIMIT);
    loop {
        if reader.received - raw_start > CHUNKED_RAW_LIMIT {
            // Framing overhead this large is odd but not wrong: judge the
            // body on what came.
            return Ok(body);
        }
        let line = reader
            .read_line(CHUNK_LINE_LIMIT, "chunk-size line")
            .await?;
        let size = parse_chunk_size(&line)?;
        if size == 0 {
            // Trailers, if any, are not needed.
            return Ok(body);
        }
        let mut remaining = size;
        while remaining > 0 && body.len() < BODY_LIMIT {
            if reader.buf.is_empty() {
                let want = usize::try_from(remaining)
                    .unwrap_or(usize::MAX)
                    .min(BODY_LIMIT - body.len());
                reader.fill_more(want).await?;
            }
            let take = usize::try_from(remaining)
                .unwrap_or(usize::MAX)
                .min(reader.buf.len())
                .min(BODY_LIMIT - body.len());
            body.extend(reader.buf.drain(..take));
            remaining -= take as u64;
        }
        if body.len() >= BODY_LIMIT {
            return Ok(body);
        }
        // Chunk data ends with CRLF (or a bare LF); anything else means the
        // chunk is longer than its size line said.
        while reader.buf.len() < 2 && reader.buf.first() != Some(&b'\n') {
            reader.fill_more(2 - reader.buf.len()).await?;
        }
        let terminator = if reader.buf[0] == b'\n' { 1 } else { 2 };
        if reader.buf[..terminator] != b"\r\n"[2 - terminator..] {
            return Err(FailReason::malformed("chunk data longer than its size"));
        }
        reader.buf.drain(..terminator);
    }
}

/// `1a`, `1A;name=value`: hex digits, then optional whitespace and extensions.
fn parse_chunk_size(line: &[u8]) -> Result<u64, FailReason> {
    let digits_end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    let (digits, rest) = line.split_at(digits_end);
    let rest = rest.trim_ascii_start();
    if digits.is_empty() || !(rest.is_empty() || rest[0] == b';') {
        return Err(FailReason::malformed("invalid chunk size"));
    }
    if digits.len() > 16 {
        return Err(FailReason::malformed("chunk size too large"));
    }
    let text =
        std::str::from_utf8(digits).map_err(|_| FailReason::malformed("invalid chunk size"))?;
    u64::from_str_radix(text, 16).map_err(|_| FailReason::malformed("invalid chunk size"))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use tokio::io::AsyncWriteExt as _;
    use tokio::net::{TcpListener, TcpSocket};

    use super::super::testutil::{
        Server, closed_port, http_check, http_spec, http_spec_hang, read_request, silent_listener,
    };
    use super::*;

    const T: Duration = Duration::from_millis(500);
    /// Every probe must have its verdict by the deadline plus this margin.
    const MARGIN: Duration = Duration::from_millis(1000);

    /// Probes and checks the verdict came within the deadline.
    async fn timed_probe(addr: SocketAddr, spec: &CheckSpec) -> ProbeResult {
        let start = std::time::Instant::now();
        let result = probe(addr, spec).await;
        let elapsed = start.elapsed();
        assert!(
            elapsed < spec.hang_timeout + MARGIN,
            "probe took {elapsed:?} with hang_timeout {:?}: {result:?}",
            spec.hang_timeout
        );
        assert!(
            result.latency <= elapsed,
            "latency {:?} > elapsed {elapsed:?}",
            result.latency
        );
        result
    }

    fn malformed(reason: &str) -> Result<u16, FailReason> {
        Err(FailReason::malformed(reason))
    }

    #[test]
    fn fail_reason_text_and_code() {
        let cases: &[(FailReason, &str, &str)] = &[
            (
                FailReason::ConnectionRefused,
                "connection refused",
                "connection_refused",
            ),
            (
                FailReason::ConnectionReset,
                "connection reset",
                "connection_reset",
            ),
            (
                FailReason::ConnectTimeout {
                    timeout: Duration::from_secs(1),
                },
                "connect timeout after 1s",
                "connect_timeout",
            ),
            (
                FailReason::NoResponse {
                    timeout: Duration::from_secs(1),
                },
                "connected, no HTTP response within 1s",
                "no_response",
            ),
            (
                FailReason::NoResponse {
                    timeout: Duration::from_millis(200),
                },
                "connected, no HTTP response within 200ms",
                "no_response",
            ),
            (
                FailReason::NoResponse {
                    timeout: Duration::from_millis(1500),
                },
                "connected, no HTTP response within 1.5s",
                "no_response",
            ),
            (
                FailReason::Incomplete {
                    timeout: Duration::from_secs(2),
                    received: 3,
                },
                "response incomplete within 2s (3 bytes received)",
                "response_incomplete",
            ),
            (
                FailReason::Closed { received: 0 },
                "connection closed with no HTTP response",
                "connection_closed",
            ),
            (
                FailReason::Closed { received: 12 },
                "connection closed after 12 bytes, response incomplete",
                "connection_closed",
            ),
            (
                FailReason::malformed("invalid status line"),
                "malformed response: invalid status line",
                "malformed_response",
            ),
            (
                FailReason::UnexpectedStatus { status: 503 },
                "unexpected status 503",
                "unexpected_status",
            ),
            (
                FailReason::BodyMismatch {
                    expected: "ok".into(),
                },
                "body mismatch: first 4 KiB of the body do not contain \"ok\"",
                "body_mismatch",
            ),
            (
                FailReason::InvalidCheck {
                    reason: "bad path".into(),
                },
                "invalid check: bad path",
                "invalid_check",
            ),
            (
                FailReason::Io {
                    during: "connecting",
                    error: "No route to host".into(),
                },
                "I/O error while connecting: No route to host",
                "io_error",
            ),
            (
                FailReason::Local {
                    during: "creating a socket",
                    error: "Too many open files (os error 24)".into(),
                },
                "local error, not the backend's fault: Too many open files (os error 24) while \
                 creating a socket",
                "local_error",
            ),
        ];
        for (reason, text, code) in cases {
            assert_eq!(reason.to_string(), *text, "{reason:?}");
            assert_eq!(reason.code(), *code, "{reason:?}");
        }
    }

    #[test]
    fn probe_class_text_and_code() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let result = |outcome, latency| ProbeResult { outcome, latency };
        let passed = Ok(ProbeOk { status: Some(200) });
        let local = FailReason::Local {
            during: "connecting",
            error: "Cannot assign requested address (os error 99)".into(),
        };
        // (name, result, timeout, class, text, code)
        let cases = [
            (
                "within timeout",
                result(passed.clone(), ms(3)),
                s(1),
                ProbeClass::Ok,
                "ok",
                "ok",
            ),
            (
                "exactly the timeout",
                result(passed.clone(), s(1)),
                s(1),
                ProbeClass::Ok,
                "ok",
                "ok",
            ),
            (
                "slower than timeout",
                result(passed.clone(), ms(2500)),
                s(1),
                ProbeClass::Slow {
                    latency: ms(2500),
                    timeout: s(1),
                },
                "answered in 2.5s (slower than timeout 1s)",
                "slow",
            ),
            (
                "no response within hang_timeout",
                result(Err(FailReason::NoResponse { timeout: s(3) }), s(3)),
                s(1),
                ProbeClass::Failed(FailReason::NoResponse { timeout: s(3) }),
                "connected, no HTTP response within 3s",
                "no_response",
            ),
            (
                "a fast failure",
                result(Err(FailReason::ConnectionRefused), ms(1)),
                s(1),
                ProbeClass::Failed(FailReason::ConnectionRefused),
                "connection refused",
                "connection_refused",
            ),
            (
                "local error",
                result(Err(local.clone()), ms(1)),
                s(1),
                ProbeClass::Local(local.clone()),
                "local error, not the backend's fault: Cannot assign requested address \
                 (os error 99) while connecting",
                "local_error",
            ),
        ];
        for (name, result, timeout, class, text, code) in cases {
            let got = result.class(timeout);
            assert_eq!(got, class, "{name}");
            assert_eq!(got.to_string(), text, "{name}");
            assert_eq!(got.code(), code, "{name}");
            assert_eq!(
                got.is_failure(),
                matches!(got, ProbeClass::Failed(_)),
                "{name}"
            );
        }
        let late = ProbeClass::Late { timeout: s(1) };
        assert_eq!(late.to_string(), "no complete answer within timeout 1s yet");
        assert_eq!(late.code(), "late");
        assert!(!late.is_failure());
    }

    /// Which socket errors are the load balancer's own: resource exhaustion
    /// anywhere, no route only when `connect(2)` itself says so.
    #[test]
    fn local_errors_are_classified() {
        let err = io::Error::from_raw_os_error;
        let t = Duration::from_secs(3);
        // (name, errno, synchronous, code)
        let cases = [
            ("EMFILE", libc::EMFILE, true, "local_error"),
            ("ENFILE", libc::ENFILE, false, "local_error"),
            ("ENOBUFS", libc::ENOBUFS, false, "local_error"),
            ("ENOMEM", libc::ENOMEM, true, "local_error"),
            ("EADDRNOTAVAIL", libc::EADDRNOTAVAIL, true, "local_error"),
            (
                "ENETUNREACH from connect(2)",
                libc::ENETUNREACH,
                true,
                "local_error",
            ),
            (
                "EHOSTUNREACH from connect(2)",
                libc::EHOSTUNREACH,
                true,
                "local_error",
            ),
            (
                "EHOSTUNREACH from the network",
                libc::EHOSTUNREACH,
                false,
                "io_error",
            ),
            (
                "ENETUNREACH from the network",
                libc::ENETUNREACH,
                false,
                "io_error",
            ),
            (
                "ECONNREFUSED",
                libc::ECONNREFUSED,
                true,
                "connection_refused",
            ),
            ("ECONNRESET", libc::ECONNRESET, false, "connection_reset"),
            ("ETIMEDOUT", libc::ETIMEDOUT, false, "connect_timeout"),
        ];
        for (name, errno, synchronous, code) in cases {
            assert_eq!(
                connect_fail(err(errno), synchronous, t).code(),
                code,
                "{name}"
            );
        }
        assert_eq!(
            io_fail(err(libc::EMFILE), "reading the response").code(),
            "local_error"
        );
        assert_eq!(
            io_fail(err(libc::EHOSTUNREACH), "reading the response").code(),
            "io_error"
        );
    }

    /// A backend answering after 2.5 × timeout, within hang_timeout: a pass,
    /// slow, with its latency.
    #[tokio::test]
    async fn late_answer_within_hang_timeout_is_slow() {
        let timeout = Duration::from_millis(200);
        let server = Server::canned_delayed(
            timeout * 5 / 2,
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        )
        .await;
        let spec = http_spec_hang(server.addr.port(), timeout, timeout * 3);
        let result = timed_probe(server.addr, &spec).await;
        assert_eq!(result.outcome, Ok(ProbeOk { status: Some(200) }));
        assert!(
            result.latency >= timeout * 5 / 2 && result.latency < timeout * 3,
            "latency {:?}",
            result.latency
        );
        let class = result.class(timeout);
        assert_eq!(class.code(), "slow");
        assert!(
            class.to_string().starts_with("answered in 50")
                && class
                    .to_string()
                    .ends_with("ms (slower than timeout 200ms)"),
            "{class}"
        );
    }

    /// The old behaviour, kept by hang_timeout = timeout: a late answer is
    /// a failure at the timeout.
    #[tokio::test]
    async fn hang_timeout_equal_to_timeout_fails_a_late_answer() {
        let timeout = Duration::from_millis(200);
        let server = Server::canned_delayed(timeout * 5 / 2, b"HTTP/1.1 200 OK\r\n\r\n").await;
        let spec = http_spec_hang(server.addr.port(), timeout, timeout);
        let result = timed_probe(server.addr, &spec).await;
        assert_eq!(result.outcome, Err(FailReason::NoResponse { timeout }));
        assert!(result.latency < timeout * 2, "latency {:?}", result.latency);
        assert_eq!(result.class(timeout).code(), "no_response");
    }

    /// A hung application is a failure only at hang_timeout, and says so.
    #[tokio::test]
    async fn silent_backend_fails_at_hang_timeout() {
        let timeout = Duration::from_millis(100);
        let hang = Duration::from_millis(300);
        let listener = silent_listener();
        let addr = listener.local_addr().expect("local_addr");
        let result = timed_probe(addr, &http_spec_hang(addr.port(), timeout, hang)).await;
        assert_eq!(
            result.outcome,
            Err(FailReason::NoResponse { timeout: hang })
        );
        assert_eq!(
            result.class(timeout).to_string(),
            "connected, no HTTP response within 300ms"
        );
        assert!(
            result.latency >= hang,
            "verdict before hang_timeout: {:?}",
            result.latency
        );
    }

    #[test]
    fn compact_durations() {
        let cases = [
            ("whole seconds", Duration::from_secs(1), "1s"),
            ("minutes stay seconds", Duration::from_secs(90), "90s"),
            ("milliseconds", Duration::from_millis(200), "200ms"),
            ("fractional seconds", Duration::from_millis(1500), "1.5s"),
            ("two decimals", Duration::from_millis(1250), "1.25s"),
            (
                "fractional milliseconds",
                Duration::from_micros(1500),
                "1.5ms",
            ),
            ("microseconds", Duration::from_micros(250), "250µs"),
            ("zero", Duration::ZERO, "0µs"),
        ];
        for (name, d, text) in cases {
            assert_eq!(Compact(d).to_string(), text, "{name}");
        }
    }

    /// Canned responses, each from its own server: what a backend sends, how
    /// the check is configured, and the verdict.
    #[tokio::test]
    async fn canned_responses() {
        let big_headers = format!("HTTP/1.1 200 OK\r\nX-Pad: {}\r\n\r\n", "a".repeat(9000));
        let endless_interim = "HTTP/1.1 100 Continue\r\n\r\n".repeat(400);
        let long_chunk_line = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;{}\r\nok\r\n0\r\n\r\n",
            "e".repeat(300)
        );
        let long_body = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: 5002\r\n\r\n{}ok",
            "x".repeat(5000)
        );
        struct Case<'a> {
            name: &'a str,
            response: &'a [u8],
            body_contains: Option<&'a str>,
            expect_status: Option<Vec<(u16, u16)>>,
            method: &'a str,
            want: Result<u16, FailReason>,
        }
        let case = |name, response, want| Case {
            name,
            response,
            body_contains: None,
            expect_status: None,
            method: "GET",
            want,
        };
        let with_body = |name, response, needle, want| Case {
            body_contains: Some(needle),
            ..case(name, response, want)
        };
        let cases = [
            case("200 with reason", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", Ok(200)),
            case("204 no reason phrase", b"HTTP/1.1 204\r\n\r\n", Ok(204)),
            case("HTTP/1.0", b"HTTP/1.0 200 OK\r\n\r\nok", Ok(200)),
            case("bare LF line ends", b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", Ok(200)),
            case("503", b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", Err(FailReason::UnexpectedStatus { status: 503 })),
            case("redirect fails by default", b"HTTP/1.1 301 Moved\r\nLocation: /x\r\n\r\n", Err(FailReason::UnexpectedStatus { status: 301 })),
            Case {
                expect_status: Some(vec![(200, 399)]),
                ..case("redirect accepted when configured", b"HTTP/1.1 301 Moved\r\nLocation: /x\r\n\r\n", Ok(301))
            },
            Case {
                expect_status: Some(vec![(200, 200), (418, 418)]),
                ..case("second range", b"HTTP/1.1 418 Teapot\r\n\r\n", Ok(418))
            },
            case("interim 103 then 200", b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", Ok(200)),
            case("101 is final", b"HTTP/1.1 101 Switching\r\n\r\n", Err(FailReason::UnexpectedStatus { status: 101 })),
            case("garbage", b"garbage\r\n\r\n", malformed("not an HTTP status line: \"garbage\"")),
            case("HTTP/2 status line", b"HTTP/2 200\r\n\r\n", malformed("invalid status line: \"HTTP/2 200\"")),
            case("HTTP/2.0 version", b"HTTP/2.0 200 OK\r\n\r\n", malformed("unsupported HTTP version in \"HTTP/2.0 200 OK\"")),
            case("status out of range", b"HTTP/1.1 700 Odd\r\n\r\n", malformed("status code 700 out of range")),
            case("non-digit status", b"HTTP/1.1 2x0 OK\r\n\r\n", malformed("invalid status code in \"HTTP/1.1 2x0 OK\"")),
            case("empty first line", b"\r\nHTTP/1.1 200 OK\r\n\r\n", malformed("not an HTTP status line: \"\"")),
            case("header without colon", b"HTTP/1.1 200 OK\r\nNoColon\r\n\r\n", malformed("header line without a colon")),
            case("space before colon", b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok", malformed("invalid header name \"Content-Length \"")),
            case("obsolete folding", b"HTTP/1.1 200 OK\r\nX-A: 1\r\n  continued\r\n\r\n", malformed("obsolete line folding in headers")),
            case("bare CR", b"HTTP/1.1 200 OK\r\nX-A: 1\rX-B: 2\r\n\r\n", malformed("bare CR in headers")),
            case("control char in value", b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\n\r\n", malformed("control character in a header value")),
            case("headers over 8 KiB", big_headers.as_bytes(), malformed("headers longer than 8 KiB")),
            case("endless interim responses", endless_interim.as_bytes(), malformed("headers longer than 8 KiB")),
            with_body("chunk-size line too long", long_chunk_line.as_bytes(), "ok", malformed("chunk-size line longer than 256 bytes")),
            case("closed before a byte", b"", Err(FailReason::Closed { received: 0 })),
            case("closed in headers", b"HTTP/1.1 200 OK\r\nContent-", Err(FailReason::Closed { received: 25 })),
            with_body("body contains", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nstatus: ok", "status: ok", Ok(200)),
            with_body("body mismatch", b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\nstatus: error", "status: ok", Err(FailReason::BodyMismatch { expected: "status: ok".into() })),
            with_body("Content-Length bounds the body", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nnoise-ok", "ok", Err(FailReason::BodyMismatch { expected: "ok".into() })),
            with_body("needle after 4 KiB is not seen", long_body.as_bytes(), "ok", Err(FailReason::BodyMismatch { expected: "ok".into() })),
            with_body("body until close", b"HTTP/1.1 200 OK\r\n\r\nall ok", "all ok", Ok(200)),
            with_body("chunked across chunks", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nstat\r\n6;ext=1\r\nus: ok\r\n0\r\n\r\n", "status: ok", Ok(200)),
            with_body("chunked framing is not body", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n", "ab\r\n", Err(FailReason::BodyMismatch { expected: "ab\r\n".into() })),
            with_body("chunked wins over Content-Length", b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "hello", Ok(200)),
            with_body("invalid chunk size", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", "hello", malformed("invalid chunk size")),
            with_body("chunk longer than its size", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhello\r\n0\r\n\r\n", "hello", malformed("chunk data longer than its size")),
            with_body("truncated body", b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nok", "ok", Err(FailReason::Closed { received: 42 })),
            with_body("conflicting Content-Length", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok", "ok", malformed("conflicting Content-Length values")),
            with_body("repeated equal Content-Length", b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok", "ok", Ok(200)),
            with_body("invalid Content-Length", b"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\nok", "ok", malformed("invalid Content-Length")),
            Case {
                method: "HEAD",
                ..with_body("HEAD has no body", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", "", Ok(200))
            },
            case("status is checked before the body", b"HTTP/1.1 500 Oops\r\nContent-Length: 10\r\n\r\n", Err(FailReason::UnexpectedStatus { status: 500 })),
        ];
        for case in cases {
            let server = Server::canned(case.response).await;
            let mut spec = http_spec(server.addr.port(), T);
            let http = http_check(&mut spec);
            http.body_contains = case.body_contains.map(str::to_owned);
            http.method = case.method.to_owned();
            if let Some(expect) = case.expect_status {
                http.expect_status = expect;
            }
            let result = timed_probe(server.addr, &spec).await;
            let got = result.outcome.map(|ok| ok.status.expect("HTTP status"));
            assert_eq!(got, case.want, "case {:?}", case.name);
        }
    }

    #[tokio::test]
    async fn sends_a_minimal_request() {
        let server = Server::canned(b"HTTP/1.1 200 OK\r\n\r\n").await;
        let port = server.addr.port();
        let cases = [
            (
                "default host",
                None,
                format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"),
            ),
            (
                "configured host",
                Some("api.example"),
                "GET /health HTTP/1.1\r\nHost: api.example\r\n".to_owned(),
            ),
        ];
        for (name, host, start) in cases {
            let mut spec = http_spec(port, T);
            http_check(&mut spec).host = host.map(str::to_owned);
            let result = timed_probe(server.addr, &spec).await;
            assert_eq!(result.outcome, Ok(ProbeOk { status: Some(200) }), "{name}");
            let request = server
                .last_request
                .lock()
                .expect("lock")
                .clone()
                .expect("a request");
            let want = format!("{start}User-Agent: xlb-health/0.1\r\nConnection: close\r\n\r\n");
            assert_eq!(String::from_utf8_lossy(&request), want, "{name}");
        }
    }

    #[tokio::test]
    async fn invalid_check_sends_nothing() {
        let server = Server::canned(b"HTTP/1.1 200 OK\r\n\r\n").await;
        let mut spec = http_spec(server.addr.port(), T);
        http_check(&mut spec).path = "/health HTTP/1.1\r\nX-Injected: 1\r\n".to_owned();
        let result = timed_probe(server.addr, &spec).await;
        assert_eq!(
            result.outcome.as_ref().map_err(FailReason::code),
            Err("invalid_check")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(server.connections.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn success_with_latency() {
        let server = Server::canned(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
        let result = timed_probe(server.addr, &http_spec(server.addr.port(), T)).await;
        assert_eq!(result.outcome, Ok(ProbeOk { status: Some(200) }));
        assert!(
            result.latency > Duration::ZERO && result.latency < T,
            "{:?}",
            result.latency
        );
    }

    /// The hung-event-loop case: the kernel completes the handshake, nothing
    /// ever reads or answers.
    #[tokio::test]
    async fn listener_that_never_accepts_is_no_response() {
        let listener = silent_listener();
        let addr = listener.local_addr().expect("local_addr");
        let result = timed_probe(addr, &http_spec(addr.port(), T)).await;
        assert_eq!(result.outcome, Err(FailReason::NoResponse { timeout: T }));
        assert_eq!(
            result.outcome.unwrap_err().to_string(),
            "connected, no HTTP response within 500ms"
        );
        assert!(
            result.latency >= T,
            "verdict before the deadline: {:?}",
            result.latency
        );
    }

    #[tokio::test]
    async fn accepted_but_silent_is_no_response() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local_addr");
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            // Hold the connection open without reading past the deadline.
            tokio::time::sleep(Duration::from_secs(2)).await;
            drop(stream);
        });
        let result = timed_probe(addr, &http_spec(addr.port(), T)).await;
        assert_eq!(result.outcome, Err(FailReason::NoResponse { timeout: T }));
        server.abort();
    }

    #[tokio::test]
    async fn reset_is_connection_reset() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local_addr");
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            // SO_LINGER 0: close sends RST instead of FIN (socket(7)).
            stream.set_zero_linger().expect("SO_LINGER");
            drop(stream);
        });
        let result = timed_probe(addr, &http_spec(addr.port(), T)).await;
        assert_eq!(result.outcome, Err(FailReason::ConnectionReset));
        server.await.expect("server task");
    }

    #[tokio::test]
    async fn dripping_backend_is_incomplete() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local_addr");
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            read_request(&mut stream).await.expect("request");
            for &byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" {
                if stream.write_all(&[byte]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        let result = timed_probe(addr, &http_spec(addr.port(), T)).await;
        match result.outcome {
            Err(FailReason::Incomplete { timeout, received }) => {
                assert_eq!(timeout, T);
                // One byte at 0, 200 and 400 ms; the deadline is at 500 ms.
                assert!((1..=4).contains(&received), "received {received}");
            }
            other => panic!("expected an incomplete response, got {other:?}"),
        }
        server.abort();
    }

    /// A 200 with a 1 GiB body: the prober reads at most 4 KiB of it, closes,
    /// and the backend's writes fail long before 1 GiB.
    #[tokio::test]
    async fn huge_body_is_not_read() {
        for body_contains in [None, Some("xxxx")] {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("local_addr");
            const GIB: u64 = 1 << 30;
            let server = tokio::spawn(async move {
                let (mut stream, _) = listener.accept().await.expect("accept");
                read_request(&mut stream).await.expect("request");
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {GIB}\r\n\r\n");
                stream.write_all(head.as_bytes()).await.expect("write head");
                // The body is one buffer written over and over, never 1 GiB in memory.
                let chunk = vec![b'x'; 64 * 1024];
                let mut written = 0u64;
                while written < GIB {
                    match tokio::time::timeout(Duration::from_secs(3), stream.write(&chunk)).await {
                        Ok(Ok(n)) => written += n as u64,
                        Ok(Err(e)) => return (written, Some(e.kind())),
                        Err(_) => return (written, None),
                    }
                }
                (written, None)
            });
            let mut spec = http_spec(addr.port(), T);
            http_check(&mut spec).body_contains = body_contains.map(str::to_owned);
            let result = timed_probe(addr, &spec).await;
            assert_eq!(
                result.outcome,
                Ok(ProbeOk { status: Some(200) }),
                "{body_contains:?}"
            );
            let (written, error) = tokio::time::timeout(Duration::from_secs(5), server)
                .await
                .expect("server stops writing")
                .expect("server task");
            assert!(
                error.is_some(),
                "server writes stalled instead of failing: the prober did not close ({written} bytes)"
            );
            assert!(
                written < 16 << 20,
                "server wrote {written} bytes before the prober closed"
            );
        }
    }

    #[tokio::test]
    async fn redirect_is_not_followed() {
        let other = Server::canned(b"HTTP/1.1 200 OK\r\n\r\n").await;
        let redirect = format!(
            "HTTP/1.1 302 Found\r\nLocation: http://{}/health\r\nContent-Length: 0\r\n\r\n",
            other.addr
        );
        let server = Server::canned(redirect.as_bytes()).await;
        let result = timed_probe(server.addr, &http_spec(server.addr.port(), T)).await;
        assert_eq!(
            result.outcome,
            Err(FailReason::UnexpectedStatus { status: 302 })
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(server.requests.load(Ordering::SeqCst), 1);
        assert_eq!(
            other.connections.load(Ordering::SeqCst),
            0,
            "redirect target was contacted"
        );
    }

    #[tokio::test]
    async fn closed_port_is_refused() {
        let addr = closed_port();
        let http = timed_probe(addr, &http_spec(addr.port(), T)).await;
        assert_eq!(http.outcome, Err(FailReason::ConnectionRefused));
        let tcp = timed_probe(
            addr,
            &CheckSpec {
                kind: CheckKind::Tcp,
                ..http_spec(addr.port(), T)
            },
        )
        .await;
        assert_eq!(tcp.outcome, Err(FailReason::ConnectionRefused));
    }

    /// A listener whose accept queue is full: Linux drops further SYNs
    /// (tcp_conn_request, LISTENOVERFLOWS), so connects time out.
    #[tokio::test]
    async fn full_accept_queue_is_connect_timeout() {
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.1:0".parse().expect("addr"))
            .expect("bind");
        let addr = socket.local_addr().expect("local_addr");
        let _listener = socket.listen(1).expect("listen");
        let mut fillers = Vec::new();
        for _ in 0..4 {
            if let Ok(Ok(stream)) =
                tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await
            {
                fillers.push(stream);
            }
        }
        assert!(!fillers.is_empty(), "no filler connection got through");
        for spec in [
            http_spec(addr.port(), T),
            CheckSpec {
                kind: CheckKind::Tcp,
                ..http_spec(addr.port(), T)
            },
        ] {
            let result = timed_probe(addr, &spec).await;
            assert_eq!(
                result.outcome,
                Err(FailReason::ConnectTimeout { timeout: T }),
                "{:?}",
                spec.kind
            );
            assert!(
                result.latency >= T,
                "verdict before the deadline: {:?}",
                result.latency
            );
        }
    }

    #[tokio::test]
    async fn tcp_check_passes_on_a_listening_port() {
        let listener = silent_listener();
        let addr = listener.local_addr().expect("local_addr");
        let spec = CheckSpec {
            kind: CheckKind::Tcp,
            ..http_spec(addr.port(), T)
        };
        let result = timed_probe(addr, &spec).await;
        assert_eq!(result.outcome, Ok(ProbeOk { status: None }));
        assert!(result.latency < T);
    }
}
