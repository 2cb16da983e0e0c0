//! The lab's backend: a small HTTP/1.1 server whose failures can be switched
//! on and off from a separate admin listener.
//!
//! Service endpoints (every response carries `X-Backend: <name>`):
//! - `GET /health` → 200 `ok`
//! - `GET /api` → 200 with the backend's name as body
//! - `GET /stream?interval_ms=N` → 200, then a line `<name> <seq>\n` every N ms
//!   (default 100) for as long as the connection lasts. The body is raw bytes
//!   after the head, delimited by the connection closing (`Connection: close`,
//!   no chunked encoding), so a client can read it line by line.
//!
//! Admin endpoints (answered whatever the fault):
//! - `POST /fault/hang` – stop calling accept() and stop answering on open
//!   connections; the listening socket stays open, so the kernel keeps
//!   completing handshakes into the backlog (like a blocked event loop).
//! - `POST /fault/slow?ms=N` – wait N ms before every response.
//! - `POST /fault/503` – answer every request with 503.
//! - `POST /fault/crash` – close the service listeners (connects get RST) and
//!   every service connection (FIN, as when a process dies).
//! - `POST /fault/recover` – back to normal; rebinds after a crash. Requests
//!   held during a hang are answered.
//! - `GET /stats` → `{"name","requests","connections","fault","slow_ms"}`
//! - `GET /peers` → service connections accepted per peer address since the
//!   start ([`PeerCounts`]), for the abuse tests
//! - `GET /health` → 200 `ok`

use std::{
    io,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use serde::{Deserialize, Serialize};
use socket2::{Domain, Socket, Type};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::{Mutex, watch},
    task::{JoinHandle, JoinSet},
};

use crate::http::{self, HttpError, RequestHead};

mod peers;

pub use peers::{MAX_PEERS, PeerCounts, in_prefix, total as total_peers};

/// Listen backlog of the service sockets: during a hang the kernel completes
/// up to this many handshakes that nobody accepts (capped by
/// net.core.somaxconn, 4096 by default since Linux 5.4).
pub const LISTEN_BACKLOG: i32 = 1024;

/// Default interval of `/stream` lines.
pub const DEFAULT_STREAM_INTERVAL: Duration = Duration::from_millis(100);

/// Shortest `/stream` interval accepted, so a typo cannot spin a core.
const MIN_STREAM_INTERVAL: Duration = Duration::from_millis(1);

/// What the backend is currently doing wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    #[default]
    None,
    Hang,
    /// Delay every response by this many milliseconds.
    Slow {
        ms: u64,
    },
    Error503,
    Crash,
}

impl Fault {
    /// Name as shown in `/stats`: none, hang, slow, 503, crash.
    pub fn name(&self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Hang => "hang",
            Fault::Slow { .. } => "slow",
            Fault::Error503 => "503",
            Fault::Crash => "crash",
        }
    }

    /// The admin request that sets this fault, e.g. `/fault/slow?ms=200`.
    pub fn admin_target(&self) -> String {
        match self {
            Fault::None => "/fault/recover".to_string(),
            Fault::Slow { ms } => format!("/fault/slow?ms={ms}"),
            other => format!("/fault/{}", other.name()),
        }
    }
}

/// How to run a backend.
#[derive(Debug, Clone)]
pub struct BackendOptions {
    /// Name reported in `X-Backend`, `/api` bodies and `/stats`.
    pub name: String,
    /// Service listeners; port 0 picks a free port (kept across crash/recover).
    pub listen: Vec<SocketAddr>,
    /// Admin listener.
    pub admin: SocketAddr,
}

/// `GET /stats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendStats {
    pub name: String,
    /// Service requests answered (any status, streams included).
    pub requests: u64,
    /// Service connections accepted.
    pub connections: u64,
    /// Current fault: none, hang, slow, 503, crash.
    pub fault: String,
    /// Delay of the slow fault, when it is on.
    pub slow_ms: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend {name}: binding {addr}: {source} (port in use? run as root for ports < 1024)")]
    Bind {
        name: String,
        addr: SocketAddr,
        source: io::Error,
    },
    #[error("backend {name}: no service listener given; pass at least one --listen")]
    NoListener { name: String },
}

/// Listener tasks, replaced on crash and recover.
struct Control {
    accept_tasks: Vec<JoinHandle<()>>,
    crashed: bool,
}

struct Shared {
    name: String,
    /// Resolved service addresses (port 0 replaced), to rebind after a crash.
    service_addrs: Vec<SocketAddr>,
    fault: watch::Sender<Fault>,
    shutdown: watch::Sender<bool>,
    requests: AtomicU64,
    connections: AtomicU64,
    /// Held for one map update per accepted connection, never across an
    /// await.
    peers: std::sync::Mutex<PeerCounts>,
    control: Mutex<Control>,
}

/// A running backend. Dropping it stops every listener and connection.
pub struct BackendHandle {
    shared: Arc<Shared>,
    admin_addr: SocketAddr,
    admin_task: JoinHandle<()>,
}

fn bind(name: &str, addr: SocketAddr) -> Result<TcpListener, BackendError> {
    let err = |source| BackendError::Bind {
        name: name.to_string(),
        addr,
        source,
    };
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None).map_err(err)?;
    // Rebinding right after a crash must not fail on TIME_WAIT connections.
    sock.set_reuse_address(true).map_err(err)?;
    if addr.is_ipv6() {
        // So that `0.0.0.0:80` and `[::]:80` can both be listened on.
        sock.set_only_v6(true).map_err(err)?;
    }
    sock.set_nonblocking(true).map_err(err)?;
    sock.bind(&addr.into()).map_err(err)?;
    sock.listen(LISTEN_BACKLOG).map_err(err)?;
    TcpListener::from_std(sock.into()).map_err(err)
}

/// Starts a backend; returns once every listener is bound.
pub async fn serve(opts: BackendOptions) -> Result<BackendHandle, BackendError> {
    if opts.listen.is_empty() {
        return Err(BackendError::NoListener { name: opts.name });
    }
    let mut listeners = Vec::new();
    let mut service_addrs = Vec::new();
    for addr in &opts.listen {
        let l = bind(&opts.name, *addr)?;
        service_addrs.push(l.local_addr().map_err(|source| BackendError::Bind {
            name: opts.name.clone(),
            addr: *addr,
            source,
        })?);
        listeners.push(l);
    }
    let admin = bind(&opts.name, opts.admin)?;
    let admin_addr = admin.local_addr().map_err(|source| BackendError::Bind {
        name: opts.name.clone(),
        addr: opts.admin,
        source,
    })?;
    let shared = Arc::new(Shared {
        name: opts.name,
        service_addrs,
        fault: watch::Sender::new(Fault::None),
        shutdown: watch::Sender::new(false),
        requests: AtomicU64::new(0),
        connections: AtomicU64::new(0),
        peers: std::sync::Mutex::new(PeerCounts::default()),
        control: Mutex::new(Control {
            accept_tasks: Vec::new(),
            crashed: false,
        }),
    });
    {
        let mut ctl = shared.control.lock().await;
        ctl.accept_tasks = listeners
            .into_iter()
            .map(|l| tokio::spawn(accept_loop(l, shared.clone())))
            .collect();
    }
    let admin_task = tokio::spawn(admin_loop(admin, shared.clone()));
    Ok(BackendHandle {
        shared,
        admin_addr,
        admin_task,
    })
}

impl BackendHandle {
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The bound service addresses (port 0 resolved), in `--listen` order.
    pub fn service_addrs(&self) -> &[SocketAddr] {
        &self.shared.service_addrs
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    pub fn fault(&self) -> Fault {
        *self.shared.fault.borrow()
    }

    /// Switches the fault, as the admin endpoints do. Returns once it is in
    /// force: after `Crash` the ports are closed; after leaving `Crash` they
    /// are bound again (which can fail if something else took the port).
    pub async fn set_fault(&self, fault: Fault) -> Result<(), BackendError> {
        set_fault(&self.shared, fault).await
    }

    pub fn stats(&self) -> BackendStats {
        stats(&self.shared)
    }

    /// Service connections accepted per peer address so far.
    pub fn peers(&self) -> PeerCounts {
        peer_counts(&self.shared)
    }

    /// Stops everything and waits for the listeners to close.
    pub async fn shutdown(self) {
        self.shared.shutdown.send_replace(true);
        let tasks: Vec<_> = std::mem::take(&mut self.shared.control.lock().await.accept_tasks);
        for t in tasks {
            t.abort();
            let _ = t.await;
        }
        self.admin_task.abort();
    }
}

impl Drop for BackendHandle {
    fn drop(&mut self) {
        // Every loop watches this and exits, dropping its sockets.
        self.shared.shutdown.send_replace(true);
        self.admin_task.abort();
    }
}

fn stats(shared: &Shared) -> BackendStats {
    let fault = *shared.fault.borrow();
    BackendStats {
        name: shared.name.clone(),
        requests: shared.requests.load(Ordering::Relaxed),
        connections: shared.connections.load(Ordering::Relaxed),
        fault: fault.name().to_string(),
        slow_ms: match fault {
            Fault::Slow { ms } => Some(ms),
            _ => None,
        },
    }
}

fn lock_peers(shared: &Shared) -> std::sync::MutexGuard<'_, PeerCounts> {
    shared
        .peers
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn peer_counts(shared: &Shared) -> PeerCounts {
    PeerCounts {
        name: shared.name.clone(),
        ..lock_peers(shared).clone()
    }
}

async fn set_fault(shared: &Arc<Shared>, new: Fault) -> Result<(), BackendError> {
    let mut ctl = shared.control.lock().await;
    match (ctl.crashed, new == Fault::Crash) {
        (false, true) => {
            shared.fault.send_replace(Fault::Crash);
            // Aborting the accept loop drops its listener (closing the port)
            // and its JoinSet (closing every connection it accepted).
            for t in ctl.accept_tasks.drain(..) {
                t.abort();
                let _ = t.await;
            }
            ctl.crashed = true;
        }
        (true, false) => {
            let mut listeners = Vec::new();
            for addr in &shared.service_addrs {
                listeners.push(bind(&shared.name, *addr)?);
            }
            shared.fault.send_replace(new);
            ctl.accept_tasks = listeners
                .into_iter()
                .map(|l| tokio::spawn(accept_loop(l, shared.clone())))
                .collect();
            ctl.crashed = false;
        }
        _ => {
            shared.fault.send_replace(new);
        }
    }
    Ok(())
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut fault = shared.fault.subscribe();
    let mut shutdown = shared.shutdown.subscribe();
    let mut conns = JoinSet::new();
    loop {
        let hung = *fault.borrow_and_update() == Fault::Hang;
        tokio::select! {
            // Not calling accept() is the whole hang fault: the kernel keeps
            // completing handshakes into the backlog.
            r = listener.accept(), if !hung => match r {
                Ok((stream, peer)) => {
                    shared.connections.fetch_add(1, Ordering::Relaxed);
                    lock_peers(&shared).count(peer.ip());
                    let _ = stream.set_nodelay(true);
                    conns.spawn(service_conn(stream, shared.clone()));
                }
                // EMFILE and friends: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
            r = fault.changed() => if r.is_err() { return },
            () = stopped(&mut shutdown) => return,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Waits until the fault lets a response go out. `None`: close instead.
async fn gate(fault: &mut watch::Receiver<Fault>) -> Option<Fault> {
    loop {
        let f = *fault.borrow_and_update();
        match f {
            Fault::Hang => fault.changed().await.ok()?,
            Fault::Crash => return None,
            other => return Some(other),
        }
    }
}

/// Resolves when the backend shuts down (or its handle is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not Send; drop it here.
    let _ = shutdown.wait_for(|s| *s).await.map(drop);
}

/// Resolves when the backend crashes or shuts down.
async fn closing(fault: &mut watch::Receiver<Fault>, shutdown: &mut watch::Receiver<bool>) {
    let crashed = async {
        let _ = fault.wait_for(|f| *f == Fault::Crash).await.map(drop);
    };
    tokio::select! {
        () = crashed => {}
        () = stopped(shutdown) => {}
    }
}

/// One service connection: requests in order, each answered as the current
/// fault says, until the peer or the fault closes it.
async fn service_conn(mut stream: TcpStream, shared: Arc<Shared>) {
    let mut conn = ServiceConn {
        fault: shared.fault.subscribe(),
        shutdown: shared.shutdown.subscribe(),
        buf: Vec::new(),
    };
    loop {
        let Some(head) = conn.next_request(&mut stream, &shared).await else {
            return;
        };
        let Some(mode) = conn.wait_turn().await else {
            return;
        };
        let keep_alive = head.keep_alive();
        let result = match (mode, head.method.as_str(), head.path()) {
            (Fault::Error503, _, _) => {
                respond(&mut stream, &shared, 503, b"503 fault on\n", keep_alive).await
            }
            (_, "GET", "/health") => respond(&mut stream, &shared, 200, b"ok", keep_alive).await,
            (_, "GET", "/api") => {
                let body = shared.name.clone();
                respond(&mut stream, &shared, 200, body.as_bytes(), keep_alive).await
            }
            (_, "GET", "/stream") => {
                let ServiceConn {
                    fault, shutdown, ..
                } = &mut conn;
                stream_lines(&mut stream, &shared, &head, fault, shutdown).await;
                return;
            }
            (_, _, "/health" | "/api" | "/stream") => {
                respond(&mut stream, &shared, 405, b"use GET\n", keep_alive).await
            }
            _ => respond(&mut stream, &shared, 404, b"not found\n", keep_alive).await,
        };
        if result.is_err() || !keep_alive {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

/// What a service connection watches, and the bytes it has read but not
/// yet used.
struct ServiceConn {
    fault: watch::Receiver<Fault>,
    shutdown: watch::Receiver<bool>,
    buf: Vec<u8>,
}

impl ServiceConn {
    /// The next request's head, its body read and dropped. `None`: close
    /// (the peer left, the backend crashed, or the request was refused with
    /// an error response).
    async fn next_request(
        &mut self,
        stream: &mut TcpStream,
        shared: &Shared,
    ) -> Option<RequestHead> {
        let head = loop {
            match http::parse_request_head(&self.buf) {
                Ok(Some((head, used))) => {
                    self.buf.drain(..used);
                    break head;
                }
                Ok(None) => self.read_more(stream).await?,
                Err(e) => {
                    let status = match e {
                        HttpError::HeadTooLarge => 431,
                        _ => 400,
                    };
                    let _ = respond(stream, shared, status, e.to_string().as_bytes(), false).await;
                    return None;
                }
            }
        };
        let body_len = match head.body_len() {
            Ok(n) => n,
            Err(e) => {
                let status = match e {
                    HttpError::BodyTooLarge { .. } => 413,
                    _ => 501,
                };
                let _ = respond(stream, shared, status, e.to_string().as_bytes(), false).await;
                return None;
            }
        };
        // Read (and drop) any request body so the next request parses.
        while self.buf.len() < body_len {
            self.read_more(stream).await?;
        }
        self.buf.drain(..body_len);
        Some(head)
    }

    /// Reads more request bytes; `None` when the peer closed or the backend
    /// crashed or shut down.
    async fn read_more(&mut self, stream: &mut TcpStream) -> Option<()> {
        let mut chunk = [0u8; 4096];
        tokio::select! {
            r = stream.read(&mut chunk) => match r {
                Ok(0) | Err(_) => None,
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    Some(())
                }
            },
            () = closing(&mut self.fault, &mut self.shutdown) => None,
        }
    }

    /// Waits until the fault lets the answer go out (a hang holds it, a
    /// slow fault delays it). `None`: close instead.
    async fn wait_turn(&mut self) -> Option<Fault> {
        let mode = tokio::select! {
            m = gate(&mut self.fault) => m,
            () = stopped(&mut self.shutdown) => None,
        }?;
        if let Fault::Slow { ms } = mode {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(ms)) => {}
                () = closing(&mut self.fault, &mut self.shutdown) => return None,
            }
        }
        Some(mode)
    }
}

async fn respond(
    stream: &mut TcpStream,
    shared: &Shared,
    status: u16,
    body: &[u8],
    keep_alive: bool,
) -> io::Result<()> {
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let bytes = http::response(
        status,
        &[("X-Backend", &shared.name), ("Content-Type", "text/plain")],
        body,
        keep_alive,
    );
    stream.write_all(&bytes).await
}

/// `/stream`: head, then one line per interval until the peer goes away or
/// the backend crashes. A hang stops the lines (the connection stalls).
async fn stream_lines(
    stream: &mut TcpStream,
    shared: &Shared,
    head: &RequestHead,
    fault: &mut watch::Receiver<Fault>,
    shutdown: &mut watch::Receiver<bool>,
) {
    let interval = head
        .query("interval_ms")
        .and_then(|v| v.parse().ok())
        .map_or(DEFAULT_STREAM_INTERVAL, Duration::from_millis)
        .max(MIN_STREAM_INTERVAL);
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let head = format!(
        "HTTP/1.1 200 OK\r\nX-Backend: {}\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n",
        shared.name
    );
    if stream.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    for seq in 0u64.. {
        let ok = tokio::select! {
            m = gate(fault) => m.is_some(),
            () = stopped(shutdown) => false,
        };
        if !ok {
            return;
        }
        let line = format!("{} {seq}\n", shared.name);
        if stream.write_all(line.as_bytes()).await.is_err() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = closing(fault, shutdown) => return,
        }
    }
}

async fn admin_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => { conns.spawn(admin_conn(stream, shared.clone())); }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
            () = stopped(&mut shutdown) => return,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn admin_conn(mut stream: TcpStream, shared: Arc<Shared>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let head = match http::parse_request_head(&buf) {
            Ok(Some((head, used))) => {
                buf.drain(..used);
                head
            }
            Ok(None) => match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    continue;
                }
            },
            Err(e) => {
                let _ = stream
                    .write_all(&http::response(400, &[], e.to_string().as_bytes(), false))
                    .await;
                return;
            }
        };
        let body_len = head.body_len().unwrap_or(0);
        while buf.len() < body_len {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..body_len);
        let keep_alive = head.keep_alive();
        let (status, body) = admin_answer(&shared, &head).await;
        let bytes = http::response(
            status,
            &[
                ("X-Backend", &shared.name),
                ("Content-Type", "application/json"),
            ],
            body.as_bytes(),
            keep_alive,
        );
        if stream.write_all(&bytes).await.is_err() || !keep_alive {
            return;
        }
    }
}

fn json_error(msg: impl Into<String>) -> String {
    serde_json::json!({ "error": msg.into() }).to_string()
}

async fn admin_answer(shared: &Arc<Shared>, head: &RequestHead) -> (u16, String) {
    let fault = match (head.method.as_str(), head.path()) {
        ("GET", "/stats") => {
            return (
                200,
                serde_json::to_string(&stats(shared)).unwrap_or_default(),
            );
        }
        ("GET", "/health") => return (200, "\"ok\"".to_string()),
        ("GET", "/peers") => {
            return (
                200,
                serde_json::to_string(&peer_counts(shared)).unwrap_or_default(),
            );
        }
        ("POST", "/fault/hang") => Fault::Hang,
        ("POST", "/fault/503") => Fault::Error503,
        ("POST", "/fault/crash") => Fault::Crash,
        ("POST", "/fault/recover") => Fault::None,
        ("POST", "/fault/slow") => match head.query("ms").map(str::parse::<u64>) {
            Some(Ok(ms)) => Fault::Slow { ms },
            _ => {
                return (
                    400,
                    json_error("/fault/slow needs ?ms=N with N a whole number of milliseconds"),
                );
            }
        },
        (_, "/stats" | "/health" | "/peers") => return (405, json_error("use GET")),
        (_, p) if p.starts_with("/fault/") => {
            if head.method == "POST" {
                return (
                    404,
                    json_error(format!(
                        "unknown fault {p}; use hang, slow?ms=N, 503, crash or recover"
                    )),
                );
            }
            return (405, json_error("use POST"));
        }
        _ => {
            return (
                404,
                json_error("not found; try GET /stats, GET /peers or POST /fault/<kind>"),
            );
        }
    };
    match set_fault(shared, fault).await {
        Ok(()) => (
            200,
            serde_json::to_string(&stats(shared)).unwrap_or_default(),
        ),
        Err(e) => (500, json_error(e.to_string())),
    }
}

/// Sets `fault` on a backend through its admin listener (for processes
/// that did not start it in-process).
pub async fn remote_set_fault(
    admin: SocketAddr,
    fault: Fault,
    timeout: Duration,
) -> io::Result<BackendStats> {
    let resp = http::request(admin, "POST", &fault.admin_target(), timeout).await?;
    if resp.head.status != 200 {
        return Err(io::Error::other(format!(
            "POST http://{admin}{} answered {}: {}",
            fault.admin_target(),
            resp.head.status,
            String::from_utf8_lossy(&resp.body)
        )));
    }
    serde_json::from_slice(&resp.body).map_err(io::Error::other)
}

/// Reads `/stats` from a backend's admin listener.
pub async fn remote_stats(admin: SocketAddr, timeout: Duration) -> io::Result<BackendStats> {
    let resp = http::request(admin, "GET", "/stats", timeout).await?;
    if resp.head.status != 200 {
        return Err(io::Error::other(format!(
            "GET http://{admin}/stats answered {}",
            resp.head.status
        )));
    }
    serde_json::from_slice(&resp.body).map_err(io::Error::other)
}

/// Reads `/peers` (connections accepted per peer address) from a backend's
/// admin listener.
pub async fn remote_peers(admin: SocketAddr, timeout: Duration) -> io::Result<PeerCounts> {
    let resp = http::request(admin, "GET", "/peers", timeout).await?;
    if resp.head.status != 200 {
        return Err(io::Error::other(format!(
            "GET http://{admin}/peers answered {}",
            resp.head.status
        )));
    }
    serde_json::from_slice(&resp.body).map_err(io::Error::other)
}
