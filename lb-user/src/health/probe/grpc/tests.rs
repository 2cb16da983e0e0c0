//! The gRPC probe against an in-process HTTP/2 server (the h2 crate's
//! server side) replaying the answers tonic 0.14 and tonic-health send
//! (the frames a `tonic-health` server answers with: SERVING as one
//! 7-byte message then `grpc-status: 0` trailers; an unknown service or a
//! missing health service as a trailers-only response), and hostile ones.

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
    last: Arc<Mutex<Option<(String, String, String, String, Vec<u8>)>>>,
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
                0, 0, 0, 0, 12, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                0x01,
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
