//! `kind = "grpc"`: the standard `grpc.health.v1.Health/Check` unary call
//! over HTTP/2 with prior knowledge (h2c), or over TLS with ALPN `h2`
//! (`tls = true`, see `probe::tls`), framed by the `h2` crate.
//!
//! What it proves: the application's gRPC server reads a call and its
//! health service answers `SERVING` for `service` in time, so a hung
//! server (its port still accepting) fails as it does for HTTP. What it
//! cannot see: whether the service's own methods work (the answer is what
//! the application chose to report), nor, on a kept connection, whether
//! the listener still accepts (see `reuse`: the connection is reopened
//! every `reopen_every` probes).
//!
//! Every read is bounded: response headers by [`HEADER_LIST_LIMIT`], the
//! message by [`MESSAGE_LIMIT`] (the flow-control window stops a server from
//! sending more than a little past it), the whole call by `hang_timeout`.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use h2::client::SendRequest;
use http::{HeaderMap, HeaderValue, Method, Request};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;
use tokio::time::timeout_at;

use super::super::spec::GrpcCheck;
use super::{ConnSlot, Deadlines, FailReason, ProbeOk, Target, connect, io_fail};

/// The method every probe calls.
const PATH: &str = "/grpc.health.v1.Health/Check";
/// Largest response message accepted (a `HealthCheckResponse` is 2 bytes;
/// unknown fields a newer server adds still fit).
pub(crate) const MESSAGE_LIMIT: usize = 1024;
/// Largest response header list (headers or trailers), as HTTP's header cap.
const HEADER_LIST_LIMIT: u32 = 8 * 1024;
/// The HTTP/2 flow-control window we grant: a server cannot send more
/// than this before we read, so an endless body costs at most this much.
const WINDOW: u32 = 4 * 1024;
/// Longest `grpc-message` kept for the operator's text.
const MESSAGE_SHOWN: usize = 200;

/// `HealthCheckResponse.ServingStatus` values.
const UNKNOWN: u64 = 0;
const SERVING: u64 = 1;
const NOT_SERVING: u64 = 2;
const SERVICE_UNKNOWN: u64 = 3;

/// Why a gRPC health call failed, beyond what every probe kind shares
/// (refused, reset, closed, no response, incomplete: plain [`FailReason`]s).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrpcFail {
    /// The health service answered, with a status other than `SERVING`.
    NotServing { service: String, status: u64 },
    /// The call ended with a `grpc-status` other than 0 (OK).
    Status { code: u32, message: String },
    /// An HTTP status other than 200 (gRPC always answers 200).
    HttpStatus { status: u16 },
    /// A 200 whose `content-type` is not `application/grpc`.
    NotGrpc { content_type: String },
    /// The server sent GOAWAY before answering this call.
    GoAway { reason: String },
    /// The server reset the call's stream (RST_STREAM).
    StreamReset { reason: String },
    /// The connection broke HTTP/2's rules (e.g. the port speaks HTTP/1.1).
    Http2 { reason: String },
    /// Over TLS, the server did not agree to HTTP/2 (ALPN `h2`).
    NoH2Alpn,
    /// The answer is not a well-formed gRPC response.
    Malformed { reason: String },
    /// The response message is longer than [`MESSAGE_LIMIT`].
    TooLarge { limit: usize },
}

impl GrpcFail {
    /// Stable snake_case identifier (see [`FailReason::code`]).
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotServing { status, .. } => match *status {
                NOT_SERVING => "grpc_not_serving",
                UNKNOWN => "grpc_unknown",
                SERVICE_UNKNOWN => "grpc_service_unknown",
                _ => "grpc_unrecognized_status",
            },
            Self::Status { .. } => "grpc_status",
            Self::HttpStatus { .. } => "grpc_http_status",
            Self::NotGrpc { .. } => "grpc_not_grpc",
            Self::GoAway { .. } => "grpc_goaway",
            Self::StreamReset { .. } => "grpc_stream_reset",
            Self::Http2 { .. } => "grpc_http2_error",
            Self::NoH2Alpn => "grpc_no_h2_alpn",
            Self::Malformed { .. } => "grpc_malformed",
            Self::TooLarge { .. } => "grpc_message_too_large",
        }
    }
}

impl fmt::Display for GrpcFail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotServing { service, status } => {
                let name = match *status {
                    UNKNOWN => "UNKNOWN",
                    NOT_SERVING => "NOT_SERVING",
                    SERVICE_UNKNOWN => "SERVICE_UNKNOWN",
                    _ => "an unrecognized status",
                };
                write!(f, "gRPC health status {name} ({status}) for ")?;
                if service.is_empty() {
                    f.write_str("the whole server (service \"\")")?;
                } else {
                    write!(f, "service {service:?}")?;
                }
                if *status == SERVICE_UNKNOWN {
                    f.write_str("; the server does not know this service: check `service`")?;
                }
                Ok(())
            }
            Self::Status { code, message } => {
                write!(
                    f,
                    "gRPC call failed: grpc-status {code} {}",
                    status_name(*code)
                )?;
                match *code {
                    12 => f.write_str(
                        " (the server has no grpc.health.v1.Health service; enable it or \
                         use another kind)",
                    )?,
                    5 => f.write_str(" (the health service does not know `service`)")?,
                    _ => {}
                }
                if !message.is_empty() {
                    write!(f, ", grpc-message {message:?}")?;
                }
                Ok(())
            }
            Self::HttpStatus { status } => write!(
                f,
                "HTTP status {status} to the gRPC health call (a gRPC server answers 200)"
            ),
            Self::NotGrpc { content_type } => write!(
                f,
                "content-type {content_type:?} is not application/grpc: the port does not \
                 serve gRPC"
            ),
            Self::GoAway { reason } => {
                write!(f, "the server sent GOAWAY ({reason}) before answering")
            }
            Self::StreamReset { reason } => {
                write!(f, "the server reset the health call (RST_STREAM {reason})")
            }
            Self::Http2 { reason } => write!(
                f,
                "HTTP/2 error: {reason} (does the port serve gRPC over h2c?)"
            ),
            Self::NoH2Alpn => f.write_str(
                "the TLS server did not agree to HTTP/2 (ALPN h2): it does not serve gRPC over \
                 TLS on this port",
            ),
            Self::Malformed { reason } => write!(f, "malformed gRPC response: {reason}"),
            Self::TooLarge { limit } => write!(
                f,
                "gRPC response message over {limit} bytes (a health answer is a few bytes)"
            ),
        }
    }
}

/// The canonical name of a gRPC status code.
fn status_name(code: u32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or("(not a standard code)")
}

impl From<GrpcFail> for FailReason {
    fn from(fail: GrpcFail) -> Self {
        Self::Grpc(fail)
    }
}

fn malformed(reason: impl Into<String>) -> FailReason {
    GrpcFail::Malformed {
        reason: reason.into(),
    }
    .into()
}

// ---------------------------------------------------------------------------
// Protobuf, by hand: one field each way.

/// A `HealthCheckRequest { string service = 1; }` in a gRPC message frame
/// (flag 0 = uncompressed, 4-byte big-endian length, the message).
pub(crate) fn request_message(service: &str) -> Vec<u8> {
    let mut message = Vec::new();
    // proto3 leaves a default ("") field out.
    if !service.is_empty() {
        message.push(0x0a); // field 1, length-delimited
        put_varint(&mut message, service.len() as u64);
        message.extend_from_slice(service.as_bytes());
    }
    let mut framed = vec![0];
    // A service name is at most a few hundred bytes (checked by config).
    framed.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    framed.extend_from_slice(&message);
    framed
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads a varint at `*at`, advancing it; `None` if truncated or longer
/// than 10 bytes.
fn varint(buf: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let b = *buf.get(*at)?;
        *at += 1;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The `status` of a framed `HealthCheckResponse` (the whole body of the
/// call). Unknown fields are skipped, as protobuf requires; an absent
/// `status` is its default, `UNKNOWN`.
pub(crate) fn response_status(body: &[u8]) -> Result<u64, FailReason> {
    let Some((prefix, message)) = body.split_first_chunk::<5>() else {
        return Err(malformed(if body.is_empty() {
            "no message before the trailers".to_owned()
        } else {
            format!("{} bytes, shorter than a message prefix", body.len())
        }));
    };
    if prefix[0] != 0 {
        return Err(malformed(
            "compressed message, though the probe accepts no compression",
        ));
    }
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if len > MESSAGE_LIMIT {
        return Err(GrpcFail::TooLarge {
            limit: MESSAGE_LIMIT,
        }
        .into());
    }
    if message.len() != len {
        return Err(malformed(format!(
            "message prefix says {len} bytes, {} came (a unary call has one message)",
            message.len()
        )));
    }
    parse_status(message).ok_or_else(|| malformed("the message is not a HealthCheckResponse"))
}

fn parse_status(message: &[u8]) -> Option<u64> {
    let (mut at, mut status) = (0, UNKNOWN);
    while at < message.len() {
        let key = varint(message, &mut at)?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                let v = varint(message, &mut at)?;
                if field == 1 {
                    status = v;
                }
            }
            1 => at = at.checked_add(8)?,
            2 => {
                let len = usize::try_from(varint(message, &mut at)?).ok()?;
                at = at.checked_add(len)?;
            }
            5 => at = at.checked_add(4)?,
            _ => return None, // groups (3, 4) and 6, 7: not in this message
        }
        if field == 0 || at > message.len() {
            return None;
        }
    }
    Some(status)
}

// ---------------------------------------------------------------------------
// The call.

/// The request of one check, built once per probe.
struct Call {
    head: Request<()>,
    body: Bytes,
    service: String,
}

impl Call {
    fn new(addr: SocketAddr, grpc: &GrpcCheck, scheme: &str) -> Result<Self, FailReason> {
        let authority = grpc.host.clone().unwrap_or_else(|| addr.to_string());
        let head = Request::builder()
            .method(Method::POST)
            .uri(format!("{scheme}://{authority}{PATH}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("user-agent", super::USER_AGENT)
            .body(())
            .map_err(|e| FailReason::InvalidCheck {
                reason: format!("cannot make a gRPC request to {authority:?}: {e}"),
            })?;
        Ok(Self {
            head,
            body: Bytes::from(request_message(&grpc.service)),
            service: grpc.service.clone(),
        })
    }
}

/// How far a call got, for the verdict at the deadline.
#[derive(Default)]
struct Progress {
    answered: bool,
    received: usize,
}

/// Why a call failed, and whether it failed before any answer on a
/// connection the server closed or refused it on: on a kept connection,
/// that is the server's idle timeout (or graceful GOAWAY), not a verdict.
struct Failed {
    reason: FailReason,
    closed_unanswered: bool,
}

impl From<FailReason> for Failed {
    fn from(reason: FailReason) -> Self {
        Self {
            reason,
            closed_unanswered: false,
        }
    }
}

/// The h2 error's verdict.
fn h2_fail(e: h2::Error, progress: &Progress) -> Failed {
    let unanswered = !progress.answered;
    // A GOAWAY or RST_STREAM h2 sent itself is its verdict on what the
    // server sent (e.g. an HTTP/1.1 answer: FRAME_SIZE_ERROR).
    if !e.is_remote() && (e.is_go_away() || e.is_reset()) {
        return FailReason::from(GrpcFail::Http2 {
            reason: e.to_string(),
        })
        .into();
    }
    if e.is_go_away() {
        let reason = e
            .reason()
            .map_or_else(|| e.to_string(), |r| format!("{r:?}"));
        return Failed {
            reason: GrpcFail::GoAway { reason }.into(),
            closed_unanswered: unanswered,
        };
    }
    if e.is_reset() {
        let refused = e.reason() == Some(h2::Reason::REFUSED_STREAM);
        let reason = e
            .reason()
            .map_or_else(|| e.to_string(), |r| format!("{r:?}"));
        return Failed {
            reason: GrpcFail::StreamReset { reason }.into(),
            closed_unanswered: unanswered && refused,
        };
    }
    if e.is_io() {
        let Some(io) = e.into_io() else {
            unreachable!("is_io")
        };
        // h2 reports the peer's FIN as BrokenPipe; a real RST is
        // ConnectionReset.
        let reason = match io.kind() {
            io::ErrorKind::BrokenPipe | io::ErrorKind::UnexpectedEof => FailReason::Closed {
                received: progress.received,
            },
            _ => io_fail(io, "making the gRPC call"),
        };
        let closed = matches!(
            reason,
            FailReason::Closed { .. } | FailReason::ConnectionReset
        );
        return Failed {
            reason,
            closed_unanswered: unanswered && closed,
        };
    }
    FailReason::from(GrpcFail::Http2 {
        reason: e.to_string(),
    })
    .into()
}

/// Sends `call` on `send` and judges the answer, all by `by.deadline`.
async fn call(send: SendRequest<Bytes>, call: &Call, by: Deadlines) -> Result<ProbeOk, Failed> {
    let mut progress = Progress::default();
    let result = timeout_at(by.deadline, exchange(send, call, &mut progress)).await;
    match result {
        Ok(done) => done,
        Err(_elapsed) if progress.answered => Err(FailReason::Incomplete {
            timeout: by.limit,
            received: progress.received,
        }
        .into()),
        Err(_elapsed) => Err(FailReason::NoResponse { timeout: by.limit }.into()),
    }
}

async fn exchange(
    send: SendRequest<Bytes>,
    call: &Call,
    progress: &mut Progress,
) -> Result<ProbeOk, Failed> {
    let mut send = send.ready().await.map_err(|e| h2_fail(e, progress))?;
    let (response, mut body_out) = send
        .send_request(call.head.clone(), false)
        .map_err(|e| h2_fail(e, progress))?;
    body_out
        .send_data(call.body.clone(), true)
        .map_err(|e| h2_fail(e, progress))?;
    let response = response.await.map_err(|e| h2_fail(e, progress))?;
    progress.answered = true;
    let (head, mut body) = response.into_parts();
    if head.status != http::StatusCode::OK {
        return Err(FailReason::from(GrpcFail::HttpStatus {
            status: head.status.as_u16(),
        })
        .into());
    }
    // Trailers-only: the call's status in the headers, no message.
    if head.headers.contains_key("grpc-status") {
        grpc_status(&head.headers)?;
        return Err(malformed("grpc-status 0 with no message (trailers-only response)").into());
    }
    check_content_type(&head.headers)?;
    let mut message = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| h2_fail(e, progress))?;
        // Returned to the window only once read, and reading stops at the cap.
        let _ = body.flow_control().release_capacity(chunk.len());
        progress.received += chunk.len();
        if message.len() + chunk.len() > MESSAGE_LIMIT + 5 {
            return Err(FailReason::from(GrpcFail::TooLarge {
                limit: MESSAGE_LIMIT,
            })
            .into());
        }
        message.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.map_err(|e| h2_fail(e, progress))?;
    let Some(trailers) = trailers else {
        return Err(malformed("the call ended without trailers (no grpc-status)").into());
    };
    grpc_status(&trailers)?;
    match response_status(&message)? {
        SERVING => Ok(ProbeOk { status: None }),
        status => Err(FailReason::from(GrpcFail::NotServing {
            service: call.service.clone(),
            status,
        })
        .into()),
    }
}

fn check_content_type(headers: &HeaderMap) -> Result<(), FailReason> {
    let value = headers.get("content-type").map(HeaderValue::as_bytes);
    // `application/grpc`, `application/grpc+proto`, `application/grpc;...`.
    let is_grpc = value.is_some_and(|v| {
        v.strip_prefix(b"application/grpc")
            .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
    });
    if is_grpc {
        return Ok(());
    }
    let content_type = value.map_or_else(
        || "(none)".to_owned(),
        |v| String::from_utf8_lossy(&v[..v.len().min(MESSAGE_SHOWN)]).into_owned(),
    );
    Err(GrpcFail::NotGrpc { content_type }.into())
}

/// `Ok` for `grpc-status: 0`; the named failure otherwise.
fn grpc_status(headers: &HeaderMap) -> Result<(), FailReason> {
    let Some(value) = headers.get("grpc-status") else {
        return Err(malformed("no grpc-status in the trailers"));
    };
    let code = std::str::from_utf8(value.as_bytes())
        .ok()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u32>().ok());
    match code {
        None => Err(malformed(format!(
            "grpc-status {:?} is not a number",
            String::from_utf8_lossy(&value.as_bytes()[..value.len().min(MESSAGE_SHOWN)])
        ))),
        Some(0) => Ok(()),
        Some(code) => {
            let message = headers
                .get("grpc-message")
                .map(|m| percent_decode(m.as_bytes()))
                .unwrap_or_default();
            Err(GrpcFail::Status { code, message }.into())
        }
    }
}

/// `grpc-message` is percent-encoded UTF-8; kept to [`MESSAGE_SHOWN`]
/// characters (escaped when shown).
fn percent_decode(raw: &[u8]) -> String {
    let hex = |b: u8| char::from(b).to_digit(16);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let decoded = (raw[i] == b'%')
            .then(|| Some(hex(*raw.get(i + 1)?)? * 16 + hex(*raw.get(i + 2)?)?))
            .flatten();
        match decoded {
            Some(b) => {
                out.push(b as u8);
                i += 3;
            }
            None => {
                out.push(raw[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out)
        .chars()
        .take(MESSAGE_SHOWN)
        .collect()
}

// ---------------------------------------------------------------------------
// Connections.

/// An HTTP/2 connection: the handle calls go out on, and the task that
/// drives it (aborted when this is dropped, which closes the socket).
pub(crate) struct H2Conn {
    send: SendRequest<Bytes>,
    task: JoinHandle<()>,
    addr: SocketAddr,
    used: u32,
}

impl Drop for H2Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A backend's idle HTTP/2 connection between two probes (in [`ConnSlot`]).
#[derive(Clone, Default)]
pub(crate) struct GrpcSlot(Arc<Mutex<Option<H2Conn>>>);

impl GrpcSlot {
    fn lock(&self) -> MutexGuard<'_, Option<H2Conn>> {
        // Every critical section is a plain take or store.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The idle connection to `addr`, unless its task ended (the server
    /// closed it, or sent GOAWAY and the last stream ended).
    fn take(&self, addr: SocketAddr) -> Option<H2Conn> {
        let conn = self.lock().take()?;
        (conn.addr == addr && !conn.task.is_finished()).then_some(conn)
    }

    fn put(&self, conn: H2Conn) {
        *self.lock() = Some(conn);
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.lock().is_some()
    }
}

/// Starts HTTP/2 (prior knowledge) on `io` and drives it in a task.
async fn open<T>(io: T, addr: SocketAddr, by: Deadlines) -> Result<H2Conn, FailReason>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let handshake = h2::client::Builder::new()
        .initial_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .max_header_list_size(HEADER_LIST_LIMIT)
        .enable_push(false)
        .handshake::<_, Bytes>(io);
    let (send, connection) = match timeout_at(by.deadline, handshake).await {
        Err(_elapsed) => return Err(FailReason::NoResponse { timeout: by.limit }),
        Ok(Err(e)) => return Err(h2_fail(e, &Progress::default()).reason),
        Ok(Ok(pair)) => pair,
    };
    let task = tokio::spawn(async move {
        // Its error reaches the call that is waiting on it.
        let _ = connection.await;
    });
    Ok(H2Conn {
        send,
        task,
        addr,
        used: 0,
    })
}

/// A `kind = "grpc"` probe of `to` (on the backend's kept connection in
/// `slot` when `reuse_connection` is set).
pub(super) async fn grpc_probe(
    to: &Target<'_>,
    grpc: &GrpcCheck,
    slot: Option<&ConnSlot>,
) -> Result<ProbeOk, FailReason> {
    let scheme = if grpc.tls.is_some() { "https" } else { "http" };
    let call_spec = Call::new(to.addr, grpc, scheme)?;
    let reuse = slot.map(ConnSlot::grpc).zip(grpc.reuse_connection);
    if let Some((slot, every)) = reuse
        && let Some(conn) = slot.take(to.addr)
    {
        to.note_connected();
        match call(conn.send.clone(), &call_spec, to.by).await {
            Err(failed) if failed.closed_unanswered => {}
            done => return kept(done, conn, slot, every),
        }
    }
    let stream = connect(to.addr, to.path, to.by.deadline, to.by.limit).await?;
    to.note_connected();
    let conn = match &grpc.tls {
        None => open(stream, to.addr, to.by).await?,
        Some(tls) => {
            let (deadline, limit) = (to.by.deadline, to.by.limit);
            let stream =
                super::tls::handshake(stream, tls, to.addr, &[b"h2"], deadline, limit).await?;
            // A server that did not pick h2 would answer HTTP/1.1 to our
            // HTTP/2 preface: say why instead.
            if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
                return Err(GrpcFail::NoH2Alpn.into());
            }
            open(stream, to.addr, to.by).await?
        }
    };
    let done = call(conn.send.clone(), &call_spec, to.by).await;
    match reuse {
        Some((slot, every)) => kept(done, conn, slot, every),
        None => done.map_err(|f| f.reason),
    }
}

/// The verdict of a call on `conn`, which is kept for the next probe after
/// a pass until it has carried `every` probes; dropped (closed) otherwise.
fn kept(
    done: Result<ProbeOk, Failed>,
    mut conn: H2Conn,
    slot: &GrpcSlot,
    every: u32,
) -> Result<ProbeOk, FailReason> {
    conn.used += 1;
    if done.is_ok() && conn.used < every {
        slot.put(conn);
    }
    done.map_err(|f| f.reason)
}

#[cfg(test)]
mod tests;
