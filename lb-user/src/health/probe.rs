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
//!
//! What a probe concluded is in [`outcome`]; reading and parsing the
//! response, within its size caps, in [`response`]; the keep-alive
//! connection of `reuse_connection`, and what it does not check, in
//! [`reuse`].

mod dns;
mod expect;
mod grpc;
mod outcome;
mod response;
mod reuse;
mod stream;
pub(crate) mod tls;
pub(crate) mod udp;

use std::future::{Future as _, poll_fn};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{Instant, timeout_at};

pub use self::dns::DnsFail;
pub use self::expect::ExpectFail;
pub use self::grpc::GrpcFail;
pub use self::outcome::{Compact, FailReason, ProbeClass, ProbeOk, ProbeResult};
pub use self::response::{BODY_LIMIT, HEADER_LIMIT};
use self::response::{Reader, read_body, read_final_head};
pub use self::reuse::ConnSlot;
use self::stream::ProbeStream;
use super::datapath::DatapathTarget;
use super::spec::{CheckKind, CheckSpec, HttpCheck, TlsCheck};

/// The User-Agent sent with every HTTP probe, so backends can tell (and
/// exclude from their access logs) health traffic.
pub const USER_AGENT: &str = "xlb-health/0.1";

/// How long a probe on a reused connection that passed on its head waits
/// for the rest of a small body it does not check (`body_contains` unset):
/// only to keep the connection in step for the next probe. A body later
/// than this does not fail the probe; the connection is closed instead.
const KEEP_BODY_WAIT: Duration = Duration::from_millis(10);

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
    probe_reusing(addr, spec, path, None).await
}

/// Like [`probe_via`], on the backend's kept connection in `slot` when the
/// check says `reuse_connection` (see [`reuse`]): the probe takes it (or
/// opens one), and puts it back after a complete, passing exchange that
/// leaves it usable, until it has carried `reopen_every` probes. A kept
/// connection the backend closed while idle is replaced by a fresh one
/// within the same deadline, so a server's idle timeout is never a failure.
pub async fn probe_reusing(
    addr: SocketAddr,
    spec: &CheckSpec,
    path: Option<&DatapathTarget>,
    slot: Option<&ConnSlot>,
) -> ProbeResult {
    let start = Instant::now();
    // A spec built by hand with hang_timeout < timeout still gets a verdict
    // by `timeout`, as before hang_timeout existed.
    let limit = spec.hang_timeout.max(spec.timeout);
    let whole = Deadlines::from(start, limit);
    let Some(path) = path else {
        return probe_to(addr, spec, None, slot, whole, None).await;
    };
    // A kept connection would outlive its NAT flow, deleted when the probe
    // that opened it ends: each data-path probe of a NAT VIP opens its own.
    let slot = slot.filter(|_| path.nat.is_none());
    if let Some(fault) = known_host_fault(path) {
        return judged_directly(addr, spec, path, whole, fault, None).await;
    }
    let (result, direct) = match attempt_via(addr, spec, path, slot, start, whole).await {
        Via::HostFault(fault) => {
            return judged_directly(addr, spec, path, whole, fault, None).await;
        }
        Via::Done(result, direct) => (result, direct),
    };
    let fault = host_path_fault(path, &result.outcome);
    if let Some(fault) = fault {
        return judged_directly(addr, spec, path, whole, fault, direct).await;
    }
    if !handshake_failed(&result.outcome) {
        return result;
    }
    let direct = match direct {
        Some(direct) => direct,
        None => probe_to(addr, spec, None, None, whole, None).await,
    };
    let outcome = match (&result.outcome, direct.outcome) {
        (Err(fail), Ok(_)) => Err(FailReason::NoAnswerViaVip {
            text: path.failure_reason(&fail.to_string(), Some(true)),
        }),
        // A datagram service bound to the VIP alone (usual with DSR) has
        // nothing on the backend's own address: the direct probe's "port
        // unreachable" would hide that the service itself is silent.
        (Err(via @ FailReason::NoDatagram { .. }), Err(FailReason::PortUnreachable)) => {
            Err(via.clone())
        }
        (_, direct) => direct,
    };
    ProbeResult {
        outcome,
        latency: start.elapsed(),
        path_fault: None,
    }
}

/// How a data-path attempt ended: with its result (and the direct probe's,
/// if one ran alongside), or late while this host's route is wrong.
enum Via {
    Done(ProbeResult, Option<ProbeResult>),
    HostFault(String),
}

/// The data-path attempt of a probe. One deadline for both attempts: the
/// data-path attempt has all of it (a first handshake through a neighbour
/// being resolved can take most of a short `hang_timeout`); the direct
/// probe that tells whose fault a failed handshake is starts alongside once
/// the handshake is later than the check's `timeout` (else after an early
/// failure), so it costs nothing while the path works.
async fn attempt_via(
    addr: SocketAddr,
    spec: &CheckSpec,
    path: &DatapathTarget,
    slot: Option<&ConnSlot>,
    start: Instant,
    whole: Deadlines,
) -> Via {
    let via = SocketAddr::new(path.vip.ip(), addr.port());
    let connected = AtomicBool::new(false);
    let mut attempt = pin!(probe_to(
        via,
        spec,
        Some(path),
        slot,
        whole,
        Some(&connected)
    ));
    let late_at = start + spec.timeout.min(whole.limit);
    let early = tokio::select! {
        result = &mut attempt => Some(result),
        () = tokio::time::sleep_until(late_at) => None,
    };
    match early {
        Some(result) => Via::Done(result, None),
        None if connected.load(Ordering::Relaxed) => Via::Done(attempt.await, None),
        None => {
            // A late handshake: if this host's route to the VIP is wrong,
            // nothing will come (one netlink query, on late handshakes only).
            if let Some(fault) = crate::route::vip_route_problem(path.vip.ip(), &path.interface) {
                return Via::HostFault(fault);
            }
            let direct = probe_to(addr, spec, None, None, whole, None);
            let (result, direct) = tokio::join!(attempt, direct);
            Via::Done(result, Some(direct))
        }
    }
}

/// Whether a data-path attempt failed before a connection was made (for a
/// datagram probe: got no answer at all), so that a direct probe must tell
/// whose fault it is.
fn handshake_failed(outcome: &Result<ProbeOk, FailReason>) -> bool {
    matches!(
        outcome,
        Err(FailReason::ConnectTimeout { .. }
            | FailReason::NoDatagram { .. }
            | FailReason::PortUnreachable
            | FailReason::ConnectionRefused
            | FailReason::ConnectionReset
            | FailReason::Io {
                during: "connecting",
                ..
            })
    )
}

/// A probe whose data path fails by this host's `fault`: the backend is
/// judged by its direct probe alone (`direct`, if it already ran), with the
/// direct probe's latency, not the data-path wait; the VIP is listed in
/// [`HOST_FAULTS`].
async fn judged_directly(
    addr: SocketAddr,
    spec: &CheckSpec,
    path: &DatapathTarget,
    whole: Deadlines,
    fault: String,
    direct: Option<ProbeResult>,
) -> ProbeResult {
    note_host_fault(path);
    let direct = match direct {
        Some(direct) => direct,
        None => probe_to(addr, spec, None, None, whole, None).await,
    };
    ProbeResult {
        path_fault: Some(fault),
        ..direct
    }
}

/// What a data-path connect fails with when this host has no way to the
/// VIP out of the interface (ENETUNREACH, or EHOSTUNREACH: a neighbour entry
/// that failed). A data-path probe's packets meet no router before the
/// backend (`xlb_hc` sends them to it from this host's egress), so neither
/// can come from the network.
const VIA_VIP_NO_ROUTE: &str = "connecting to the VIP (no route from this host)";

/// The operator's text when a data-path handshake failed by this host's
/// fault, rather than the path's or the backend's: a routing error of its
/// own, or a timeout while its route to the VIP out of the interface has no
/// gateway (the kernel then ARPs for the VIP itself and nobody answers).
/// The route is looked up only after a failure, never on a passing probe.
fn host_path_fault(path: &DatapathTarget, outcome: &Result<ProbeOk, FailReason>) -> Option<String> {
    let route = || crate::route::vip_route_problem(path.vip.ip(), &path.interface);
    match outcome {
        Err(FailReason::Local {
            during: VIA_VIP_NO_ROUTE,
            error,
        }) => Some(route().unwrap_or_else(|| {
            format!(
                "connecting to {} out of {} failed on this host: {error}; check the route to the \
                 VIP and its next hop's neighbour entry (`ip route get {} oif {}`, `ip neigh`)",
                path.vip,
                path.interface,
                path.vip.ip(),
                path.interface
            )
        })),
        Err(FailReason::ConnectTimeout { .. }) => route(),
        _ => None,
    }
}

/// The VIPs (address, interface) whose route a data-path probe found
/// wrong. While one is listed, its probes look the route up first (one
/// netlink round trip) and, while it is still wrong, go straight to the
/// direct probe instead of waiting for a handshake that cannot come (a
/// wait past `timeout` would also be reported late, and taken for
/// slowness). A VIP leaves the list when its route is right again.
static HOST_FAULTS: Mutex<Vec<(IpAddr, String)>> = Mutex::new(Vec::new());

fn host_faults() -> MutexGuard<'static, Vec<(IpAddr, String)>> {
    // Every critical section is a plain search, push or removal.
    HOST_FAULTS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether `key` is `path`'s VIP and interface.
fn is_of(key: &(IpAddr, String), path: &DatapathTarget) -> bool {
    key.0 == path.vip.ip() && key.1 == path.interface
}

fn note_host_fault(path: &DatapathTarget) {
    let mut faults = host_faults();
    if !faults.iter().any(|k| is_of(k, path)) {
        faults.push((path.vip.ip(), path.interface.clone()));
    }
}

/// The route problem of `path`'s VIP if it is listed in [`HOST_FAULTS`]
/// and still there; unlists it once fixed. Every data-path probe asks:
/// a lock and a scan of an empty list while nothing is wrong.
fn known_host_fault(path: &DatapathTarget) -> Option<String> {
    if !host_faults().iter().any(|k| is_of(k, path)) {
        return None;
    }
    let problem = crate::route::vip_route_problem(path.vip.ip(), &path.interface);
    if problem.is_none() {
        host_faults().retain(|k| !is_of(k, path));
    }
    problem
}

/// By when one probe attempt must be done (its handshake and its whole
/// exchange alike), and the duration its failures name (`hang_timeout`).
#[derive(Clone, Copy, Debug)]
struct Deadlines {
    deadline: Instant,
    limit: Duration,
}

impl Deadlines {
    fn from(start: Instant, limit: Duration) -> Self {
        Self {
            deadline: start + limit,
            limit,
        }
    }
}

async fn probe_to(
    addr: SocketAddr,
    spec: &CheckSpec,
    path: Option<&DatapathTarget>,
    slot: Option<&ConnSlot>,
    by: Deadlines,
    connected: Option<&AtomicBool>,
) -> ProbeResult {
    let start = Instant::now();
    let to = Target {
        addr,
        path,
        by,
        connected,
    };
    let nat = path.is_some_and(|p| p.nat.is_some());
    let outcome = super::datapath::keeping_flows(nat, async {
        match &spec.kind {
            CheckKind::Tcp => connect(addr, path, by.deadline, by.limit)
                .await
                .map(|_stream| ProbeOk { status: None }),
            CheckKind::Http(http) => http_probe(&to, http, None, slot).await,
            CheckKind::Https { http, tls } => http_probe(&to, http, Some(tls), slot).await,
            CheckKind::Dns(dns) => dns::dns_probe(addr, path, dns, by.deadline, by.limit).await,
            CheckKind::Expect(check) => expect::probe(&to, check).await,
            CheckKind::Grpc(grpc) => grpc::grpc_probe(&to, grpc, slot).await,
        }
    })
    .await;
    ProbeResult {
        outcome,
        latency: start.elapsed(),
        path_fault: None,
    }
}

async fn connect(
    addr: SocketAddr,
    path: Option<&DatapathTarget>,
    deadline: Instant,
    timeout: Duration,
) -> Result<TcpStream, FailReason> {
    let socket = match path {
        None => new_socket(addr)?,
        Some(path) => marked_socket(addr, path)?,
    };
    // `connect(2)` runs in the first poll: an error there is this host's
    // own answer (no route in our table, no local port), not the network's.
    // Later errors come from the peer or a router (SO_ERROR).
    let mut connecting = pin!(socket.connect(addr));
    let first = poll_fn(|cx| Poll::Ready(connecting.as_mut().poll(cx))).await;
    let result = match first {
        Poll::Ready(Err(e)) => return Err(connect_fail(e, true, path.is_some(), timeout)),
        Poll::Ready(Ok(stream)) => Ok(Ok(stream)),
        Poll::Pending => timeout_at(deadline, connecting).await,
    };
    match result {
        Err(_elapsed) => Err(FailReason::ConnectTimeout { timeout }),
        Ok(Err(e)) => Err(connect_fail(e, false, path.is_some(), timeout)),
        Ok(Ok(stream)) => Ok(stream),
    }
}

fn new_socket(addr: SocketAddr) -> Result<TcpSocket, FailReason> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4(),
        SocketAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(|e| io_fail(e, "creating a socket"))?;
    // Closed with RST rather than FIN, as HAProxy closes its checks: the
    // verdict is in when a probe closes, so the FIN exchange costs packets
    // (and the backend's work on them) for nothing, and leaves a TIME_WAIT
    // socket whenever the probe closes first. Data-path probes all share
    // one (LB address, VIP, port) 4-tuple space: at 1,000 probes/s a fifth
    // of them in TIME_WAIT for 60 s held some 13,000 of its ~28,000 ports
    // (`xlb-health-bench --only cost-lab`).
    socket
        .set_zero_linger()
        .map_err(|e| io_fail(e, "creating a socket"))?;
    Ok(socket)
}

/// A socket prepared for the data path (`DatapathTarget::prepare`); for a
/// NAT VIP, its flow kept for the probe's life (`datapath::keep_flow`),
/// from another socket while the port the kernel gave is a NAT flow's.
fn marked_socket(addr: SocketAddr, path: &DatapathTarget) -> Result<TcpSocket, FailReason> {
    let mut tries = 0;
    loop {
        let socket = new_socket(addr)?;
        tries += 1;
        // EPERM (no CAP_NET_ADMIN for SO_MARK), the interface is gone, the
        // NAT flow maps are not there: this host's problem, whatever the
        // backend does.
        let local = |e: io::Error| FailReason::Local {
            during: "marking a data-path probe socket",
            error: e.to_string(),
        };
        match path.prepare(&socket, addr) {
            Ok(None) => return Ok(socket),
            Ok(Some(registration)) => {
                super::datapath::keep_flow(registration).map_err(local)?;
                return Ok(socket);
            }
            Err(e)
                if e.kind() == io::ErrorKind::AlreadyExists
                    && tries < super::datapath::NAT_BIND_TRIES => {}
            Err(e) => return Err(local(e)),
        }
    }
}

fn connect_fail(e: io::Error, synchronous: bool, via_vip: bool, timeout: Duration) -> FailReason {
    // The kernel gives up on SYN retries only after minutes, but if it
    // does first, it is the same condition.
    if e.kind() == io::ErrorKind::TimedOut {
        return FailReason::ConnectTimeout { timeout };
    }
    let no_route = matches!(
        e.raw_os_error(),
        Some(libc::ENETUNREACH | libc::EHOSTUNREACH)
    );
    if via_vip && no_route {
        return FailReason::Local {
            during: VIA_VIP_NO_ROUTE,
            error: e.to_string(),
        };
    }
    if synchronous && no_route {
        return FailReason::Local {
            during: "connecting (no route from this host)",
            error: e.to_string(),
        };
    }
    io_fail(e, "connecting")
}

/// Whether `errno` is this host running out of something: the probe says
/// nothing about the backend (the agent poller asks the same).
pub(crate) fn is_local_errno(errno: i32) -> bool {
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
    // HTTP/1.1 keeps a connection alive unless told otherwise (RFC 9112 §9.3).
    let connection = if http.reuse_connection.is_some() {
        ""
    } else {
        "Connection: close\r\n"
    };
    format!(
        "{} {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\n{connection}\r\n",
        http.method, http.path
    )
    .into_bytes()
}

/// Where an HTTP probe goes and by when.
struct Target<'a> {
    addr: SocketAddr,
    path: Option<&'a DatapathTarget>,
    by: Deadlines,
    /// Set once a connection is made (or a kept one taken), for
    /// [`probe_reusing`] to tell a late handshake from a late answer.
    connected: Option<&'a AtomicBool>,
}

impl Target<'_> {
    fn note_connected(&self) {
        if let Some(flag) = self.connected {
            flag.store(true, Ordering::Relaxed);
        }
    }
}

/// A connection to keep after a passing exchange, and where.
struct Keep<'a> {
    slot: &'a ConnSlot,
    /// Probes the connection carried before this one.
    used: u32,
    /// `reopen_every`.
    every: u32,
}

/// Why an exchange failed, and whether the backend had closed or reset the
/// connection without a byte of answer: on a kept connection, that is the
/// backend's idle timeout, not a verdict.
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

/// An HTTP exchange, over TLS when `tls` is given (`kind = "https"`).
async fn http_probe(
    to: &Target<'_>,
    http: &HttpCheck,
    tls: Option<&TlsCheck>,
    slot: Option<&ConnSlot>,
) -> Result<ProbeOk, FailReason> {
    if let Err(e) = http.validate() {
        return Err(FailReason::InvalidCheck {
            reason: e.to_string(),
        });
    }
    let request = request(to.addr, http);
    let reuse = slot.zip(http.reuse_connection);
    if let Some((slot, every)) = reuse
        && let Some((stream, used)) = slot.take(to.addr, tls.is_some())
    {
        let keep = Keep { slot, used, every };
        to.note_connected();
        match exchange(stream, to, http, &request, Some(keep)).await {
            Err(failed) if failed.closed_unanswered => {}
            done => return done.map_err(|f| f.reason),
        }
    }
    let stream = connect(to.addr, to.path, to.by.deadline, to.by.limit).await?;
    to.note_connected();
    let keep = reuse.map(|(slot, every)| Keep {
        slot,
        used: 0,
        every,
    });
    let done = match tls {
        None => exchange(stream, to, http, &request, keep).await,
        Some(tls) => {
            // Within the probe's one deadline: a handshake that is slow
            // but completes makes a slow probe, not a failed one.
            let (deadline, limit) = (to.by.deadline, to.by.limit);
            let stream = tls::handshake(stream, tls, to.addr, &[], deadline, limit).await?;
            exchange(stream, to, http, &request, keep).await
        }
    };
    done.map_err(|f| f.reason)
}

/// Sends `request` on `stream` and judges the answer; with `keep`, leaves
/// the connection in its slot if the exchange passed and left it usable.
async fn exchange<S>(
    mut stream: S,
    to: &Target<'_>,
    http: &HttpCheck,
    request: &[u8],
    keep: Option<Keep<'_>>,
) -> Result<ProbeOk, Failed>
where
    S: AsyncRead + AsyncWrite + Unpin + Into<ProbeStream>,
{
    let (deadline, timeout) = (to.by.deadline, to.by.limit);
    // A request this small fits in the socket send buffer, so this completes
    // even when the application never reads; a timeout here still means no
    // response at all.
    // Flushed: TLS may hold the record back until asked.
    let send = async {
        stream.write_all(request).await?;
        stream.flush().await
    };
    match timeout_at(deadline, send).await {
        Err(_elapsed) => return Err(FailReason::NoResponse { timeout }.into()),
        Ok(Err(e)) => {
            return Err(Failed {
                reason: io_fail(e, "sending the request"),
                closed_unanswered: true,
            });
        }
        Ok(Ok(())) => {}
    }
    let mut reader = Reader::new(stream, deadline, timeout);
    let head = match read_final_head(&mut reader).await {
        Ok(head) => head,
        Err(reason) => {
            let closed = matches!(
                reason,
                FailReason::Closed { .. } | FailReason::ConnectionReset
            );
            let closed_unanswered = closed && reader.received() == 0;
            return Err(Failed {
                reason,
                closed_unanswered,
            });
        }
    };
    if !http.accepts(head.status) {
        return Err(FailReason::UnexpectedStatus {
            status: head.status,
        }
        .into());
    }
    let is_head = http.method.eq_ignore_ascii_case("HEAD");
    match keep.and_then(|k| Some((k, head.reusable_body(is_head)?))) {
        Some((keep, len)) => keep_alive(reader, http, len, to.addr, keep).await?,
        None => {
            if let Some(expected) = &http.body_contains {
                let body = read_body(&mut reader, &head, is_head).await?;
                check_body(&body, expected)?;
            }
            // Dropping the stream closes it; unread bytes (the rest of a
            // large body) make the kernel send RST, which stops the backend
            // from sending more.
        }
    }
    Ok(ProbeOk {
        status: Some(head.status),
    })
}

/// The end of a passing exchange on a connection that may carry the next
/// probe: reads the `len`-byte body to stay in step (checking it for
/// `body_contains`), and keeps the connection unless it has carried
/// `reopen_every` probes or more bytes came than the response framed.
async fn keep_alive<S: AsyncRead + Unpin + Into<ProbeStream>>(
    mut reader: Reader<S>,
    http: &HttpCheck,
    len: usize,
    addr: SocketAddr,
    keep: Keep<'_>,
) -> Result<(), FailReason> {
    let complete = match &http.body_contains {
        Some(expected) => {
            reader.fill_to(len).await?;
            check_body(&reader.buffered()[..len], expected)?;
            true
        }
        None => {
            reader.cut_deadline(Instant::now() + KEEP_BODY_WAIT);
            reader.fill_to(len).await.is_ok()
        }
    };
    let used = keep.used + 1;
    if complete && reader.buffered().len() == len && used < keep.every {
        keep.slot.put(reader.into_stream().into(), addr, used);
    }
    Ok(())
}

fn check_body(body: &[u8], expected: &str) -> Result<(), FailReason> {
    if contains(body, expected.as_bytes()) {
        Ok(())
    } else {
        Err(FailReason::BodyMismatch {
            expected: expected.to_owned(),
        })
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
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
                connect_fail(err(errno), synchronous, false, t).code(),
                code,
                "{name}"
            );
        }
        // A data-path probe's packets meet no router before the backend:
        // an unreachable error is this host's, however it arrives.
        for errno in [libc::EHOSTUNREACH, libc::ENETUNREACH] {
            for synchronous in [true, false] {
                assert_eq!(
                    connect_fail(err(errno), synchronous, true, t),
                    FailReason::Local {
                        during: VIA_VIP_NO_ROUTE,
                        error: err(errno).to_string()
                    },
                    "errno {errno}, synchronous {synchronous}"
                );
            }
        }
        assert_eq!(
            connect_fail(err(libc::ECONNREFUSED), false, true, t).code(),
            "connection_refused"
        );
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

    /// A data-path probe whose handshake is lost (the "VIP" is a listener
    /// with a full accept queue) and whose direct fallback hangs (the
    /// backend accepts and never answers): one verdict by `hang_timeout`,
    /// not one `hang_timeout` for each attempt. (Bound to `lo`, the "VIP"
    /// has no route through a gateway: the late handshake is taken for this
    /// host's fault, and the backend judged by its direct probe alone. The
    /// other branch, a late handshake with a sound route, runs both attempts
    /// side by side under the same deadline; the lab tests exercise it.)
    #[tokio::test]
    async fn datapath_probe_and_its_fallback_share_one_deadline() {
        // The same port on both addresses: a port the kernel gave on
        // 127.0.0.2 may be taken on 127.0.0.1 by a test running alongside,
        // so try a few.
        let (backend, port, vip) = (0..50)
            .find_map(|_| {
                let backend = std::net::TcpListener::bind("127.0.0.2:0").expect("bind 127.0.0.2");
                let port = backend.local_addr().expect("local_addr").port();
                let vip = TcpSocket::new_v4().expect("socket");
                vip.bind(SocketAddr::from(([127, 0, 0, 1], port)))
                    .ok()
                    .map(|()| (backend, port, vip))
            })
            .expect("no port free on both 127.0.0.1 and 127.0.0.2 in 50 tries");
        let vip_addr = vip.local_addr().expect("local_addr");
        let _vip = vip.listen(1).expect("listen");
        let mut fillers = Vec::new();
        for _ in 0..4 {
            if let Ok(Ok(s)) =
                tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(vip_addr)).await
            {
                fillers.push(s);
            }
        }
        assert!(!fillers.is_empty(), "no filler connection got through");
        let hang = Duration::from_secs(1);
        let spec = http_spec_hang(port, Duration::from_millis(300), hang);
        // SO_MARK needs CAP_NET_ADMIN: the unit tests run as root.
        let path = DatapathTarget::new(vip_addr, 1, "lo", crate::config::Mode::DsrIpip);
        let t0 = std::time::Instant::now();
        let result = probe_via(backend.local_addr().expect("addr"), &spec, Some(&path)).await;
        let elapsed = t0.elapsed();
        assert_eq!(
            result.outcome,
            Err(FailReason::NoResponse { timeout: hang }),
            "the direct fallback's verdict"
        );
        assert!(
            result
                .path_fault
                .as_deref()
                .is_some_and(|f| f.contains("no route to 127.0.0.1 through a gateway out of lo")),
            "{:?}",
            result.path_fault
        );
        assert!(
            elapsed < hang + Duration::from_millis(250),
            "a data-path probe and its fallback took {elapsed:?} with hang_timeout {hang:?}"
        );
    }
}
