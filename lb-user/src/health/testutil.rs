//! Local backends on 127.0.0.1 for the prober and scheduler tests, each bound
//! to port 0 and stopped when dropped. Every wait is bounded.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::spec::{CheckKind, CheckSpec, HttpCheck, defaults};

/// How long a test server waits for a request before giving up on it.
const REQUEST_WAIT: Duration = Duration::from_secs(5);

/// A spec for the prober: `GET /health`, 2xx, the given timeout, and a
/// `hang_timeout` equal to it (the strict behaviour: a late answer is a
/// failure); see [`http_spec_hang`].
pub(crate) fn http_spec(port: u16, timeout: Duration) -> CheckSpec {
    http_spec_hang(port, timeout, timeout)
}

/// [`http_spec`] with a `hang_timeout` of its own.
pub(super) fn http_spec_hang(port: u16, timeout: Duration, hang_timeout: Duration) -> CheckSpec {
    CheckSpec {
        kind: CheckKind::Http(HttpCheck {
            method: defaults::HTTP_METHOD.to_owned(),
            path: defaults::HTTP_PATH.to_owned(),
            host: None,
            expect_status: vec![defaults::EXPECT_STATUS],
            body_contains: None,
            reuse_connection: None,
        }),
        port,
        interval: defaults::INTERVAL,
        timeout,
        hang_timeout,
        rise: defaults::RISE,
        fall: defaults::FALL,
        fast_interval: defaults::FAST_INTERVAL,
        down_interval: defaults::DOWN_INTERVAL,
        jitter: defaults::JITTER,
        via: crate::health::spec::Via::Direct,
        auto_timeout: false,
        agent: None,
    }
}

pub(super) fn http_check(spec: &mut CheckSpec) -> &mut HttpCheck {
    match &mut spec.kind {
        CheckKind::Http(http) | CheckKind::Https { http, .. } => http,
        _ => panic!("test spec is not an HTTP check"),
    }
}

/// Reads a request head (up to the empty line), at most 16 KiB, waiting at
/// most `REQUEST_WAIT`. `None` if the client closed or sent no complete head.
pub(super) async fn read_request<S: AsyncRead + Unpin>(stream: &mut S) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    let read = async {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        true
    };
    match tokio::time::timeout(REQUEST_WAIT, read).await {
        Ok(true) => Some(buf),
        _ => None,
    }
}

/// The last request head a server received.
type LastRequest = Arc<std::sync::Mutex<Option<Vec<u8>>>>;

/// A listener on 127.0.0.1, its address, and the counters a test server
/// keeps: connections accepted, requests read, the last request.
async fn listen() -> (
    TcpListener,
    SocketAddr,
    Arc<AtomicUsize>,
    Arc<AtomicUsize>,
    LastRequest,
) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local_addr");
    (
        listener,
        addr,
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        LastRequest::default(),
    )
}

/// Counts `request` as read and keeps it as the last one.
fn note(requests: &AtomicUsize, last_request: &LastRequest, request: Vec<u8>) {
    requests.fetch_add(1, Ordering::SeqCst);
    *last_request.lock().expect("lock") = Some(request);
}

/// An HTTP server answering every request with `respond()`, then closing.
pub(super) struct Server {
    pub addr: SocketAddr,
    /// Connections accepted.
    pub connections: Arc<AtomicUsize>,
    /// Complete requests read (and answered).
    pub requests: Arc<AtomicUsize>,
    /// The last request head received.
    pub last_request: LastRequest,
    accept_loop: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

impl Server {
    pub(super) async fn start(respond: impl Fn() -> Vec<u8> + Send + Sync + 'static) -> Self {
        Self::start_delayed(Duration::ZERO, respond).await
    }

    /// Like [`Self::start`], answering each request `delay` after reading
    /// it: an application that is slow, not hung.
    pub(super) async fn start_delayed(
        delay: Duration,
        respond: impl Fn() -> Vec<u8> + Send + Sync + 'static,
    ) -> Self {
        let (listener, addr, connections, requests, last_request) = listen().await;
        let respond = Arc::new(respond);
        let accept_loop = tokio::spawn({
            let (connections, requests, last_request) =
                (connections.clone(), requests.clone(), last_request.clone());
            async move {
                while let Ok((mut stream, _)) = listener.accept().await {
                    connections.fetch_add(1, Ordering::SeqCst);
                    let (requests, last_request, respond) =
                        (requests.clone(), last_request.clone(), respond.clone());
                    tokio::spawn(async move {
                        // Reading the whole request first matters: closing a
                        // socket with unread input sends RST, which could
                        // destroy the response before the prober reads it.
                        let Some(request) = read_request(&mut stream).await else {
                            return;
                        };
                        note(&requests, &last_request, request);
                        tokio::time::sleep(delay).await;
                        let _ = stream.write_all(&respond()).await;
                        let _ = stream.shutdown().await;
                    });
                }
            }
        });
        Self {
            addr,
            connections,
            requests,
            last_request,
            accept_loop,
        }
    }

    /// Answers every request with the same bytes.
    pub(super) async fn canned(response: &[u8]) -> Self {
        Self::canned_delayed(Duration::ZERO, response).await
    }

    /// Answers every request with the same bytes, `delay` after reading it.
    pub(super) async fn canned_delayed(delay: Duration, response: &[u8]) -> Self {
        let response = response.to_vec();
        Self::start_delayed(delay, move || response.clone()).await
    }
}

/// A listening socket that never accepts: the kernel completes handshakes
/// into its accept queue, nobody reads. A hung application, as the network
/// sees it.
pub(super) fn silent_listener() -> std::net::TcpListener {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0")
}

/// An address nothing listens on: bound, then closed.
pub(super) fn closed_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local_addr")
}

/// A server that accepts, reads the request and never answers, holding each
/// connection until the prober closes it: counts the connections still
/// open, so a test can see lingering probes and their end.
pub(super) struct Holder {
    pub addr: SocketAddr,
    /// Connections accepted.
    pub accepted: Arc<AtomicUsize>,
    /// Connections the prober has not closed yet.
    pub open: Arc<AtomicUsize>,
    accept_loop: JoinHandle<()>,
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

impl Holder {
    pub(super) async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local_addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let accept_loop = tokio::spawn({
            let (accepted, open) = (accepted.clone(), open.clone());
            async move {
                while let Ok((mut stream, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    open.fetch_add(1, Ordering::SeqCst);
                    let open = open.clone();
                    tokio::spawn(async move {
                        let mut chunk = [0u8; 1024];
                        // Until EOF or error: the prober closed. Bounded so
                        // a test that forgets a probe does not hang here.
                        let _ = tokio::time::timeout(Duration::from_secs(30), async {
                            while let Ok(n) = stream.read(&mut chunk).await {
                                if n == 0 {
                                    break;
                                }
                            }
                        })
                        .await;
                        open.fetch_sub(1, Ordering::SeqCst);
                    });
                }
            }
        });
        Self {
            addr,
            accepted,
            open,
            accept_loop,
        }
    }
}

/// What a [`KeepAliveServer`] does with the request it has just read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Behaviour {
    /// `200`, `Content-Length: 2`, and wait for the next request.
    Answer,
    /// `503` with an empty body, and wait for the next request.
    Fail,
    /// Never answer: a hung event loop. Holds the connection until the
    /// prober closes it.
    Hang,
    /// `200` with `Connection: close`, then close.
    AnswerAndClose,
    /// Close without answering (the request was read: FIN, not RST), as a
    /// server whose idle timeout fires as the request arrives.
    CloseUnanswered,
    /// `200`, then close the idle connection 20 ms later (an idle timeout).
    AnswerThenIdleClose,
    /// `200`, then 20 ms later an unsolicited `408` and close, as some
    /// servers do at their idle timeout.
    AnswerThen408,
}

/// An HTTP/1.1 server that keeps connections alive and serves request
/// after request on each, doing what its [`Behaviour`] says at the time of
/// each request.
pub(super) struct KeepAliveServer {
    pub addr: SocketAddr,
    /// Connections accepted.
    pub connections: Arc<AtomicUsize>,
    /// Requests read, over all connections.
    pub requests: Arc<AtomicUsize>,
    /// The last request head received.
    pub last_request: LastRequest,
    behaviour: Arc<std::sync::Mutex<Behaviour>>,
    accept_loop: JoinHandle<()>,
}

impl Drop for KeepAliveServer {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

impl KeepAliveServer {
    pub(super) async fn start(behaviour: Behaviour) -> Self {
        let (listener, addr, connections, requests, last_request) = listen().await;
        let behaviour = Arc::new(std::sync::Mutex::new(behaviour));
        let shared = (
            connections.clone(),
            requests.clone(),
            last_request.clone(),
            behaviour.clone(),
        );
        let accept_loop = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                shared.0.fetch_add(1, Ordering::SeqCst);
                let (_, requests, last, behaviour) = shared.clone();
                tokio::spawn(serve_keep_alive(stream, requests, last, behaviour));
            }
        });
        Self {
            addr,
            connections,
            requests,
            last_request,
            behaviour,
            accept_loop,
        }
    }

    /// What the server does with the next requests.
    pub(super) fn set(&self, behaviour: Behaviour) {
        *self.behaviour.lock().expect("lock") = behaviour;
    }
}

async fn serve_keep_alive(
    mut stream: TcpStream,
    requests: Arc<AtomicUsize>,
    last_request: LastRequest,
    behaviour: Arc<std::sync::Mutex<Behaviour>>,
) {
    const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    while let Some(request) = read_request(&mut stream).await {
        note(&requests, &last_request, request);
        let now = *behaviour.lock().expect("lock");
        let idle = Duration::from_millis(20);
        match now {
            Behaviour::Answer => {
                if stream.write_all(OK).await.is_err() {
                    return;
                }
            }
            Behaviour::Fail => {
                let fail = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n";
                if stream.write_all(fail).await.is_err() {
                    return;
                }
            }
            Behaviour::Hang => {
                let mut sink = [0u8; 256];
                let _ = tokio::time::timeout(Duration::from_secs(30), async {
                    while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
                })
                .await;
                return;
            }
            Behaviour::AnswerAndClose => {
                let close = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
                let _ = stream.write_all(close).await;
                let _ = stream.shutdown().await;
                return;
            }
            Behaviour::CloseUnanswered => return,
            Behaviour::AnswerThenIdleClose => {
                let _ = stream.write_all(OK).await;
                tokio::time::sleep(idle).await;
                return;
            }
            Behaviour::AnswerThen408 => {
                let _ = stream.write_all(OK).await;
                tokio::time::sleep(idle).await;
                let timeout = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
                let _ = stream.write_all(timeout).await;
                let _ = stream.shutdown().await;
                return;
            }
        }
    }
}
