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
use super::{ConnSlot, Deadlines, FailReason, Failed, ProbeOk, Target, connect, io_fail};

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

// A call's failure is probe.rs's `Failed`: whether it failed before any
// answer on a connection the server closed or refused it on is, on a kept
// connection, the server's idle timeout (or graceful GOAWAY), not a verdict.

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
mod tests {
    // The gRPC probe against an in-process HTTP/2 server (the h2 crate's
    // server side) replaying the answers tonic 0.14 and tonic-health send
    // (the frames a `tonic-health` server answers with: SERVING as one
    // 7-byte message then `grpc-status: 0` trailers; an unknown service or a
    // missing health service as a trailers-only response), and hostile ones.

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use bytes::Bytes;
    use h2::Reason;
    use http::{HeaderMap, Response};
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use tokio::net::TcpListener;
    use tokio::task::JoinHandle;
    use tokio_rustls::TlsAcceptor;

    use super::super::super::spec::{CheckKind, CheckSpec, GrpcCheck};
    use super::super::super::testutil::http_spec_hang;
    use super::super::{ConnSlot, ProbeClass, probe_reusing};
    use super::*;

    /// What the test server answers each call with.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Reply {
        /// tonic-health, status SERVING: `00 00000002 0801`, `grpc-status: 0`.
        Serving,
        /// tonic-health after `set_not_serving`: `0802`.
        NotServing,
        /// tonic-health, service never registered: trailers-only
        /// `grpc-status: 5`, `grpc-message: service not registered`.
        NotFound,
        /// A tonic server without the health service: trailers-only `12`.
        Unimplemented,
        /// A GOAWAY (ENHANCE_YOUR_CALM) instead of an answer.
        GoAway,
        /// RST_STREAM (INTERNAL_ERROR) instead of an answer.
        Reset,
        /// A message prefix announcing 64 KiB, and 3 KiB of it.
        Oversized,
        /// A message that is not protobuf (wire type 7).
        Garbage,
        /// `grpc-status: 0` trailers with no message.
        NoMessage,
        /// HTTP 404, no gRPC.
        NotFound404,
        /// 200 `text/html`: an HTTP/2 web server, not gRPC.
        Html,
        /// Accepts the call and never answers.
        Never,
        /// SERVING after 150 ms.
        Slow,
        /// SERVING, then the server closes the connection gracefully (GOAWAY
        /// NO_ERROR): an idle timeout.
        ServingThenClose,
        /// Drops the connection as the call arrives.
        DropOnCall,
    }

    struct Server {
        addr: std::net::SocketAddr,
        reply: Arc<Mutex<Reply>>,
        connections: Arc<AtomicUsize>,
        /// The last call: its `:authority`, path, content-type, te and body.
        last: Last,
        task: JoinHandle<()>,
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl Server {
        async fn start(reply: Reply) -> Self {
            Self::start_with(reply, None).await
        }

        /// Over TLS with certificate `cert` (of `tests/tls/make-certs.sh`),
        /// offering `alpn`.
        async fn start_tls(reply: Reply, cert: &str, alpn: &[&[u8]]) -> Self {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let pem = super::super::tls::testutil::pem;
            let chain = CertificateDer::pem_slice_iter(pem(&format!("{cert}.pem")))
                .collect::<Result<Vec<_>, _>>()
                .expect("PEM certificate");
            let key = PrivateKeyDer::from_pem_slice(pem(&format!("{cert}.key"))).expect("PEM key");
            let mut config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("protocol versions")
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .expect("certificate and key");
            config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            Self::start_with(reply, Some(TlsAcceptor::from(Arc::new(config)))).await
        }

        async fn start_with(reply: Reply, tls: Option<TlsAcceptor>) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            let reply = Arc::new(Mutex::new(reply));
            let connections = Arc::new(AtomicUsize::new(0));
            let last = Arc::new(Mutex::new(None));
            let (r, c, l) = (reply.clone(), connections.clone(), last.clone());
            let task = tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    c.fetch_add(1, Ordering::SeqCst);
                    let (r, l) = (r.clone(), l.clone());
                    match tls.clone() {
                        None => drop(tokio::spawn(serve(stream, r, l))),
                        Some(tls) => drop(tokio::spawn(async move {
                            if let Ok(stream) = tls.accept(stream).await {
                                serve(stream, r, l).await;
                            }
                        })),
                    }
                }
            });
            Self {
                addr,
                reply,
                connections,
                last,
                task,
            }
        }

        fn set(&self, reply: Reply) {
            *self.reply.lock().expect("lock") = reply;
        }

        fn connections(&self) -> usize {
            self.connections.load(Ordering::SeqCst)
        }
    }

    /// The last call: its `:authority`, path, content-type, te and body.
    type Last = Arc<Mutex<Option<(String, String, String, String, Vec<u8>)>>>;

    async fn serve<T>(stream: T, reply: Arc<Mutex<Reply>>, last: Last)
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let Ok(mut conn) = h2::server::handshake(stream).await else {
            return;
        };
        if *reply.lock().expect("lock") == Reply::GoAway {
            // Before any stream is processed: GOAWAY with last stream 0, so the
            // call is refused (as a server shedding load does).
            conn.abrupt_shutdown(Reason::ENHANCE_YOUR_CALM);
            while let Some(Ok(_)) = conn.accept().await {}
            return;
        }
        while let Some(Ok((request, respond))) = conn.accept().await {
            let now = *reply.lock().expect("lock");
            if now == Reply::DropOnCall {
                return;
            }
            let done = tokio::spawn(answer(request, respond, now, last.clone()));
            if now == Reply::ServingThenClose {
                let _ = done.await;
                conn.graceful_shutdown();
            }
        }
    }

    fn header(headers: &HeaderMap, name: &str) -> String {
        headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default()
    }

    fn grpc_head(status: u16, content_type: &str, extra: &[(&str, &str)]) -> Response<()> {
        let mut builder = Response::builder()
            .status(status)
            .header("content-type", content_type);
        for (name, value) in extra {
            builder = builder.header(*name, *value);
        }
        builder.body(()).expect("response")
    }

    fn trailers(status: &str) -> HeaderMap {
        let mut map = HeaderMap::new();
        map.insert("grpc-status", status.parse().expect("value"));
        map
    }

    async fn answer(
        request: http::Request<h2::RecvStream>,
        mut respond: h2::server::SendResponse<Bytes>,
        reply: Reply,
        last: Last,
    ) {
        let (head, mut body) = request.into_parts();
        let mut received = Vec::new();
        while let Some(Ok(chunk)) = body.data().await {
            let _ = body.flow_control().release_capacity(chunk.len());
            received.extend_from_slice(&chunk);
        }
        *last.lock().expect("lock") = Some((
            head.uri
                .authority()
                .map(ToString::to_string)
                .unwrap_or_default(),
            head.uri.path().to_owned(),
            header(&head.headers, "content-type"),
            header(&head.headers, "te"),
            received,
        ));
        let message = |bytes: &'static [u8]| Bytes::from_static(bytes);
        let with_message = |data: Bytes, status: &str| (Some(data), Some(trailers(status)));
        let (data, trailer) = match reply {
            Reply::Serving | Reply::ServingThenClose => {
                with_message(message(&[0, 0, 0, 0, 2, 0x08, 0x01]), "0")
            }
            Reply::Slow => {
                tokio::time::sleep(Duration::from_millis(150)).await;
                with_message(message(&[0, 0, 0, 0, 2, 0x08, 0x01]), "0")
            }
            Reply::NotServing => with_message(message(&[0, 0, 0, 0, 2, 0x08, 0x02]), "0"),
            Reply::Garbage => with_message(message(&[0, 0, 0, 0, 3, 0x0f, 0xff, 0xff]), "0"),
            Reply::Oversized => {
                let mut data = vec![0, 0, 1, 0, 0];
                data.resize(3 * 1024, b'x');
                with_message(Bytes::from(data), "0")
            }
            Reply::NoMessage => (None, Some(trailers("0"))),
            Reply::NotFound | Reply::Unimplemented => {
                let extra: &[(&str, &str)] = if reply == Reply::NotFound {
                    &[
                        ("grpc-status", "5"),
                        ("grpc-message", "service not registered"),
                    ]
                } else {
                    &[("grpc-status", "12")]
                };
                let _ = respond.send_response(grpc_head(200, "application/grpc", extra), true);
                return;
            }
            Reply::NotFound404 => {
                let _ = respond.send_response(grpc_head(404, "text/plain", &[]), true);
                return;
            }
            Reply::Html => {
                let head = grpc_head(200, "text/html", &[]);
                if let Ok(mut stream) = respond.send_response(head, false) {
                    let _ = stream.send_data(message(b"<html></html>"), true);
                }
                return;
            }
            Reply::Reset => {
                respond.send_reset(Reason::INTERNAL_ERROR);
                return;
            }
            Reply::Never | Reply::GoAway | Reply::DropOnCall => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                return;
            }
        };
        let end_with_data = trailer.is_none();
        let Ok(mut stream) = respond.send_response(grpc_head(200, "application/grpc", &[]), false)
        else {
            return;
        };
        if let Some(data) = data {
            let _ = stream.send_data(data, end_with_data);
        }
        if let Some(trailer) = trailer {
            let _ = stream.send_trailers(trailer);
        }
    }

    const T: Duration = Duration::from_millis(300);

    fn grpc_spec(port: u16, service: &str, reuse: Option<u32>) -> CheckSpec {
        CheckSpec {
            kind: CheckKind::Grpc(GrpcCheck {
                service: service.to_owned(),
                host: None,
                reuse_connection: reuse,
                tls: None,
            }),
            ..http_spec_hang(port, T, T)
        }
    }

    async fn probe_once(server: &Server, spec: &CheckSpec, slot: Option<&ConnSlot>) -> ProbeResult {
        probe_reusing(server.addr, spec, None, slot).await
    }

    use super::super::ProbeResult;

    #[tokio::test]
    async fn serving_passes_and_the_call_is_the_standard_one() {
        let server = Server::start(Reply::Serving).await;
        let spec = grpc_spec(server.addr.port(), "grpc.health.v1.Health", None);
        let result = probe_once(&server, &spec, None).await;
        assert_eq!(result.outcome, Ok(ProbeOk { status: None }));
        let last = server.last.lock().expect("lock").clone().expect("a call");
        assert_eq!(last.0, server.addr.to_string(), ":authority");
        assert_eq!(last.1, "/grpc.health.v1.Health/Check");
        assert_eq!(last.2, "application/grpc");
        assert_eq!(last.3, "trailers");
        assert_eq!(last.4, request_message("grpc.health.v1.Health"));
    }

    /// Every failing answer, its code and its operator text.
    #[tokio::test]
    async fn each_failing_answer_is_named() {
        let cases: &[(Reply, &str, &str)] = &[
            (
                Reply::NotServing,
                "grpc_not_serving",
                "gRPC health status NOT_SERVING (2) for service \"web\"",
            ),
            (
                Reply::NotFound,
                "grpc_status",
                "gRPC call failed: grpc-status 5 NOT_FOUND (the health service does not know \
                 `service`), grpc-message \"service not registered\"",
            ),
            (
                Reply::Unimplemented,
                "grpc_status",
                "gRPC call failed: grpc-status 12 UNIMPLEMENTED (the server has no \
                 grpc.health.v1.Health service; enable it or use another kind)",
            ),
            (
                Reply::GoAway,
                "grpc_goaway",
                "the server sent GOAWAY (ENHANCE_YOUR_CALM) before answering",
            ),
            (
                Reply::Reset,
                "grpc_stream_reset",
                "the server reset the health call (RST_STREAM INTERNAL_ERROR)",
            ),
            (
                Reply::Oversized,
                "grpc_message_too_large",
                "gRPC response message over 1024 bytes (a health answer is a few bytes)",
            ),
            (
                Reply::Garbage,
                "grpc_malformed",
                "malformed gRPC response: the message is not a HealthCheckResponse",
            ),
            (
                Reply::NoMessage,
                "grpc_malformed",
                "malformed gRPC response: no message before the trailers",
            ),
            (
                Reply::NotFound404,
                "grpc_http_status",
                "HTTP status 404 to the gRPC health call (a gRPC server answers 200)",
            ),
            (
                Reply::Html,
                "grpc_not_grpc",
                "content-type \"text/html\" is not application/grpc: the port does not serve gRPC",
            ),
            (
                Reply::Never,
                "no_response",
                "connected, no HTTP response within 300ms",
            ),
            (
                Reply::DropOnCall,
                "connection_closed",
                "connection closed with no HTTP response",
            ),
        ];
        for &(reply, code, text) in cases {
            let server = Server::start(reply).await;
            let spec = grpc_spec(server.addr.port(), "web", None);
            let result = probe_once(&server, &spec, None).await;
            let fail = result.outcome.expect_err(&format!("{reply:?} passed"));
            assert_eq!(
                (fail.code(), fail.to_string().as_str()),
                (code, text),
                "{reply:?}"
            );
            assert!(result.latency < T + Duration::from_millis(200), "{reply:?}");
        }
    }

    /// Slow is not hung: an answer after `timeout` but before `hang_timeout`
    /// passes and is classed slow; none by `hang_timeout` fails.
    #[tokio::test]
    async fn a_slow_server_is_slow_and_a_hung_one_fails_at_hang_timeout() {
        let server = Server::start(Reply::Slow).await;
        let spec = CheckSpec {
            timeout: Duration::from_millis(100),
            hang_timeout: Duration::from_millis(600),
            ..grpc_spec(server.addr.port(), "", None)
        };
        let result = probe_once(&server, &spec, None).await;
        assert!(
            matches!(result.class(spec.timeout), ProbeClass::Slow { .. }),
            "{result:?}"
        );
        server.set(Reply::Never);
        let result = probe_once(&server, &spec, None).await;
        assert_eq!(result.class(spec.timeout).code(), "no_response");
        assert!(result.latency >= Duration::from_millis(600));
    }

    #[tokio::test]
    async fn reuse_keeps_one_connection_and_replaces_a_closed_one() {
        let server = Server::start(Reply::Serving).await;
        let (spec, slot) = (
            grpc_spec(server.addr.port(), "", Some(3)),
            ConnSlot::default(),
        );
        for i in 0..7 {
            let result = probe_once(&server, &spec, Some(&slot)).await;
            assert!(result.is_ok(), "probe {i}: {result:?}");
        }
        // 3 probes per connection: 1-3, 4-6, 7.
        assert_eq!(server.connections(), 3);
        assert!(slot.is_idle());

        // The server closes the kept connection (idle timeout): the next probe
        // goes out on a fresh one and passes.
        let server = Server::start(Reply::ServingThenClose).await;
        let (spec, slot) = (
            grpc_spec(server.addr.port(), "", Some(10)),
            ConnSlot::default(),
        );
        assert!(probe_once(&server, &spec, Some(&slot)).await.is_ok());
        tokio::time::sleep(Duration::from_millis(100)).await;
        server.set(Reply::Serving);
        assert!(probe_once(&server, &spec, Some(&slot)).await.is_ok());
        assert_eq!(server.connections(), 2);

        // Closed just as the call arrives: sent again once on a fresh
        // connection, whose own close is a failure.
        let server = Server::start(Reply::Serving).await;
        let (spec, slot) = (
            grpc_spec(server.addr.port(), "", Some(10)),
            ConnSlot::default(),
        );
        assert!(probe_once(&server, &spec, Some(&slot)).await.is_ok());
        server.set(Reply::DropOnCall);
        let result = probe_once(&server, &spec, Some(&slot)).await;
        assert_eq!(
            result.outcome.as_ref().err().map(FailReason::code),
            Some("connection_closed")
        );
        assert_eq!(server.connections(), 2);

        // A failure drops the kept connection.
        let server = Server::start(Reply::Serving).await;
        let (spec, slot) = (
            grpc_spec(server.addr.port(), "", Some(10)),
            ConnSlot::default(),
        );
        assert!(probe_once(&server, &spec, Some(&slot)).await.is_ok());
        server.set(Reply::NotServing);
        assert!(
            probe_once(&server, &spec, Some(&slot))
                .await
                .outcome
                .is_err()
        );
        assert!(!slot.is_idle());
    }

    /// `tls = true`: the call goes over TLS with ALPN `h2`, the certificate
    /// checked for `host`; a server that does not pick h2, or a bad
    /// certificate, is named.
    #[tokio::test]
    async fn over_tls() {
        let dir = super::super::tls::testutil::TempDir::new("grpc");
        let tls_spec = |port, cert_check| {
            let mut spec = grpc_spec(port, "", None);
            if let CheckKind::Grpc(grpc) = &mut spec.kind {
                grpc.host = Some("good.test".into());
                grpc.tls = Some(cert_check);
            }
            spec
        };
        let check = || super::super::tls::testutil::lab_ca_check(&dir, Some("good.test"));
        let server = Server::start_tls(Reply::Serving, "good", &[b"h2"]).await;
        let result = probe_once(&server, &tls_spec(server.addr.port(), check()), None).await;
        assert_eq!(result.outcome, Ok(ProbeOk { status: None }));
        let last = server.last.lock().expect("lock").clone().expect("a call");
        assert_eq!(last.0, "good.test", ":authority");

        let server = Server::start_tls(Reply::NotServing, "good", &[b"h2"]).await;
        let result = probe_once(&server, &tls_spec(server.addr.port(), check()), None).await;
        assert_eq!(
            result.outcome.err().map(|f| f.code()),
            Some("grpc_not_serving")
        );

        // A server with no ALPN at all (it would speak HTTP/1.1).
        let server = Server::start_tls(Reply::Serving, "good", &[]).await;
        let result = probe_once(&server, &tls_spec(server.addr.port(), check()), None).await;
        let fail = result.outcome.expect_err("no h2");
        assert_eq!(
            (fail.code(), fail.to_string().as_str()),
            (
                "grpc_no_h2_alpn",
                "the TLS server did not agree to HTTP/2 (ALPN h2): it does not serve gRPC over TLS \
                 on this port"
            )
        );

        // One offering only other protocols refuses the handshake itself.
        let server = Server::start_tls(Reply::Serving, "good", &[b"http/1.1"]).await;
        let result = probe_once(&server, &tls_spec(server.addr.port(), check()), None).await;
        let fail = result.outcome.expect_err("no h2");
        assert_eq!(
            (fail.code(), fail.to_string().as_str()),
            (
                "tls_handshake_failed",
                "TLS handshake failed: received fatal alert: NoApplicationProtocol"
            )
        );

        let server = Server::start_tls(Reply::Serving, "expired", &[b"h2"]).await;
        let result = probe_once(&server, &tls_spec(server.addr.port(), check()), None).await;
        assert_eq!(
            result.outcome.err().map(|f| f.code()),
            Some("tls_cert_expired")
        );

        // h2c against a TLS port: the server's bytes are not HTTP/2.
        let server = Server::start_tls(Reply::Serving, "good", &[b"h2"]).await;
        let result = probe_once(&server, &grpc_spec(server.addr.port(), "", None), None).await;
        assert!(result.outcome.is_err(), "{result:?}");
    }

    /// An HTTP/1.1 server on the port: an HTTP/2 error, named.
    #[tokio::test]
    async fn an_http1_server_is_an_http2_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf).await;
                let _ = stream
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                    .await;
            }
        });
        let spec = grpc_spec(addr.port(), "", None);
        let fail = probe_reusing(addr, &spec, None, None)
            .await
            .outcome
            .expect_err("passed");
        task.abort();
        assert_eq!(fail.code(), "grpc_http2_error", "{fail}");
    }

    #[test]
    fn request_encoding() {
        assert_eq!(request_message(""), [0, 0, 0, 0, 0]);
        assert_eq!(
            request_message("web"),
            [0, 0, 0, 0, 5, 0x0a, 3, b'w', b'e', b'b']
        );
        // A name of 200 bytes: a two-byte varint length (0xc8 0x01).
        let long = request_message(&"a".repeat(200));
        assert_eq!(&long[..8], &[0, 0, 0, 0, 203, 0x0a, 0xc8, 0x01]);
        assert_eq!(long.len(), 5 + 203);
    }

    #[test]
    fn response_parsing_recorded_and_hostile() {
        let ok = |body: &[u8]| response_status(body).map_err(|e| e.to_string());
        // Recorded from tonic-health: SERVING, NOT_SERVING, UNKNOWN (proto3
        // leaves the default 0 out: an empty message).
        assert_eq!(ok(&[0, 0, 0, 0, 2, 0x08, 0x01]), Ok(SERVING));
        assert_eq!(ok(&[0, 0, 0, 0, 2, 0x08, 0x02]), Ok(NOT_SERVING));
        assert_eq!(ok(&[0, 0, 0, 0, 0]), Ok(UNKNOWN));
        // Unknown fields of every wire type are skipped.
        let newer = [
            0, 0, 0, 0, 17, 0x10, 0x05, // field 2 varint
            0x1a, 0x02, b'h', b'i', // field 3 bytes
            0x21, 1, 2, 3, 4, 5, 6, 7, 8, // field 4 fixed64
            0x08, 0x01, // status
        ];
        assert_eq!(ok(&newer), Ok(SERVING));
        let hostile: &[(&[u8], &str)] = &[
            (&[], "no message before the trailers"),
            (&[0, 0], "2 bytes, shorter than a message prefix"),
            (&[1, 0, 0, 0, 2, 8, 1], "compressed message"),
            (
                &[0, 0, 0, 0, 3, 8, 1],
                "message prefix says 3 bytes, 2 came",
            ),
            (
                &[0, 0, 0, 0, 2, 8, 1, 0],
                "message prefix says 2 bytes, 3 came",
            ),
            (&[0, 0, 0, 0, 1, 0x08], "not a HealthCheckResponse"), // truncated varint
            (&[0, 0, 0, 0, 2, 0x0a, 0x05], "not a HealthCheckResponse"), // bytes past the end
            (&[0, 0, 0, 0, 2, 0x0b, 0x00], "not a HealthCheckResponse"), // group
            (&[0, 0, 0, 0, 2, 0x00, 0x01], "not a HealthCheckResponse"), // field 0
            (
                &[
                    0, 0, 0, 0, 12, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                    0xff, 0x01,
                ],
                "not a HealthCheckResponse",
            ), // 11-byte varint
            (&[0, 0, 0x10, 0, 0], "over 1024 bytes"),
        ];
        for (body, want) in hostile {
            let got = ok(body).expect_err(&format!("{body:?} parsed"));
            assert!(got.contains(want), "{body:?}: {got}");
        }
    }

    #[test]
    fn grpc_message_is_decoded_and_escaped() {
        assert_eq!(
            percent_decode(b"service%20not%0Aregistered"),
            "service not\nregistered"
        );
        assert_eq!(percent_decode(b"100%"), "100%");
        assert_eq!(percent_decode(b"%zz"), "%zz");
        assert_eq!(percent_decode(&[b'a'; 300]).len(), MESSAGE_SHOWN);
        let fail = GrpcFail::Status {
            code: 14,
            message: percent_decode(b"down%0D%0Anow\x1b[31m"),
        };
        assert_eq!(
            fail.to_string(),
            "gRPC call failed: grpc-status 14 UNAVAILABLE, grpc-message \"down\\r\\nnow\\u{1b}[31m\""
        );
        assert_eq!(fail.code(), "grpc_status");
    }

    #[test]
    fn serving_status_codes() {
        let code = |status| {
            GrpcFail::NotServing {
                service: String::new(),
                status,
            }
            .code()
        };
        assert_eq!(code(UNKNOWN), "grpc_unknown");
        assert_eq!(code(NOT_SERVING), "grpc_not_serving");
        assert_eq!(code(SERVICE_UNKNOWN), "grpc_service_unknown");
        assert_eq!(code(7), "grpc_unrecognized_status");
        let text = GrpcFail::NotServing {
            service: String::new(),
            status: SERVICE_UNKNOWN,
        }
        .to_string();
        assert_eq!(
            text,
            "gRPC health status SERVICE_UNKNOWN (3) for the whole server (service \"\"); the \
             server does not know this service: check `service`"
        );
    }
}
