//! A bounded flood of real TCP connections, for the abuse tests: new
//! connections to one address (a VIP) as fast as the kernel opens them,
//! from one source address or from many in turn (e.g. 64 addresses of one
//! IPv6 /64), each a real non-blocking `connect(2)` with many in flight.
//! Unlike [`flood`](crate::flood)'s spoofed packets, every SYN here belongs
//! to a socket: an answered one completes a handshake that a backend
//! accepts, a RST fails the connect with `ECONNREFUSED`, a dropped one
//! times out. The report counts each.
//!
//! Knobs ([`ConnectFloodOptions`]):
//! - `target`: where to connect (a VIP and port inside the lab).
//! - `sources`: local addresses bound in turn, one per connect (none: the
//!   kernel's choice). Each must be an address of the namespace the flood
//!   runs in; `IP_BIND_ADDRESS_NO_PORT` leaves the port to `connect`, so
//!   every source has the whole local port range.
//! - `count` and `time_limit`: the flood starts at most `count` connects and
//!   none after `time_limit`; both are required, so a flood always ends,
//!   at the latest `time_limit + connect_timeout + request_timeout` after
//!   it began.
//! - `in_flight`: most connects (and requests) open at once; the next
//!   connect waits for a slot.
//! - `rate`: connects started per second at most; `None`: as fast as slots
//!   free up.
//! - `connect_timeout`: a connect not done by then counts as timed out and
//!   its socket is closed. Below Linux's initial SYN retransmission timeout
//!   (1 s), every connect sends exactly one SYN.
//! - `then`: after connecting, [`AfterConnect::Request`] sends one
//!   keep-alive `GET` and reads the answer, [`AfterConnect::Close`] does
//!   nothing; either way the flood then closes first (FIN), so the
//!   connection's 4-tuple waits in TIME_WAIT here and the kernel does not
//!   reuse it for a later connect within 60 s. (A reused 4-tuple of an
//!   admitted connection would still have its conntrack entry in the load
//!   balancer and pass as established, unjudged.)
//!
//! Traffic goes only where `target` says, from the namespace the caller
//! runs it in ([`connect_flood_in`]); the lab's namespaces are isolated.

use std::{
    io::{self, ErrorKind},
    net::{IpAddr, SocketAddr},
    os::fd::AsRawFd,
    sync::Arc,
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::{
    io::AsyncWriteExt,
    net::{TcpSocket, TcpStream},
    sync::Semaphore,
    task::JoinSet,
    time::Instant,
};

use crate::{
    http,
    topology::{LabError, in_netns},
};

/// What a connection does once it is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterConnect {
    /// Close at once.
    Close,
    /// `GET /api` (keep-alive, so the server does not close first), read
    /// the answer, then close.
    Request,
}

/// What to flood; see the module documentation for each knob.
#[derive(Debug, Clone)]
pub struct ConnectFloodOptions {
    pub target: SocketAddr,
    pub sources: Vec<IpAddr>,
    pub count: u64,
    pub time_limit: Duration,
    pub in_flight: usize,
    pub rate: Option<u32>,
    pub connect_timeout: Duration,
    pub then: AfterConnect,
    /// Bound on the request and its answer ([`AfterConnect::Request`]).
    pub request_timeout: Duration,
    /// Run the flooding thread at `SCHED_IDLE` ([`connect_flood_in`]): it
    /// still opens connections as fast as it can, but only on CPU time no
    /// other task wants. In a 2-CPU lab the attacker's own syscalls would
    /// otherwise take CPU from the well-behaved clients, which a real
    /// attacker, on another machine, cannot; the load balancer's work for
    /// the flood (the XDP verdicts in softirq) is still done.
    pub idle_priority: bool,
}

impl ConnectFloodOptions {
    /// Connects to `target` from `sources`, at most `count` of them within
    /// `time_limit`, unpaced, 1024 in flight, 500 ms connect timeout (one
    /// SYN each), one request per connection.
    pub fn new(target: SocketAddr, sources: Vec<IpAddr>, count: u64, time_limit: Duration) -> Self {
        Self {
            target,
            sources,
            count,
            time_limit,
            in_flight: 1024,
            rate: None,
            connect_timeout: Duration::from_millis(500),
            then: AfterConnect::Request,
            request_timeout: Duration::from_secs(1),
            idle_priority: false,
        }
    }

    fn validate(&self) -> io::Result<()> {
        let bad = |what: String| Err(io::Error::new(ErrorKind::InvalidInput, what));
        if self.time_limit.is_zero() {
            return bad("the time limit must be > 0".into());
        }
        if self.in_flight == 0 {
            return bad("in_flight must be > 0".into());
        }
        if self.rate == Some(0) {
            return bad("the rate must be > 0 connects/s".into());
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return bad("the connect and request timeouts must be > 0".into());
        }
        if let Some(s) = self
            .sources
            .iter()
            .find(|s| s.is_ipv4() != self.target.is_ipv4())
        {
            return bad(format!(
                "source {s} is not of the family of the target {}",
                self.target
            ));
        }
        Ok(())
    }
}

/// What a flood did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectFloodReport {
    /// Connects started.
    pub started: u64,
    /// Connects that completed (the handshake was answered).
    pub connected: u64,
    /// Connects refused: a RST answered the SYN (`ECONNREFUSED`).
    pub refused: u64,
    /// Connects not done within `connect_timeout` (the SYN was dropped).
    pub timed_out: u64,
    /// Connects that failed otherwise (e.g. `EADDRNOTAVAIL`: no local port).
    pub errors: u64,
    /// The first such error, for the message.
    pub first_error: Option<String>,
    /// Requests answered ([`AfterConnect::Request`]).
    pub answered: u64,
    /// Connections whose request got no answer in time.
    pub unanswered: u64,
    /// From the flood's start to the last `connect(2)` call.
    pub sending: Duration,
    /// From the flood's start to the end of the last connect attempt: the
    /// window in which its SYNs went out, retransmissions included (a
    /// connect whose timeout fires late, on a loaded machine, retransmits
    /// its SYN after 1 s). A rate limit admits at most its burst plus
    /// rate × this.
    pub syn_window: Duration,
    /// From the first connect started to the last outcome.
    pub elapsed: Duration,
    /// The time limit ended the flood before `count` connects started.
    pub stopped_by_time: bool,
    /// Slowest refused connect, µs (how fast a RST fails a connect).
    pub max_refused_us: u64,
}

impl ConnectFloodReport {
    /// Connects started per second while it started them.
    pub fn started_per_s(&self) -> f64 {
        self.started as f64 / self.sending.as_secs_f64().max(1e-3)
    }
}

/// How one connection ended, and when (since the flood's start) it called
/// `connect(2)`.
struct Ended {
    outcome: Outcome,
    connect_at: Duration,
    /// When the connect attempt ended (connected, failed or gave up).
    connect_end: Duration,
}

/// How one connection ended.
enum Outcome {
    Connected { answered: Option<bool> },
    Refused(Duration),
    TimedOut,
    Error(io::Error),
}

impl ConnectFloodReport {
    fn tally(&mut self, e: Ended) {
        self.sending = self.sending.max(e.connect_at);
        self.syn_window = self.syn_window.max(e.connect_end);
        match e.outcome {
            Outcome::Connected { answered } => {
                self.connected += 1;
                match answered {
                    Some(true) => self.answered += 1,
                    Some(false) => self.unanswered += 1,
                    None => {}
                }
            }
            Outcome::Refused(took) => {
                self.refused += 1;
                self.max_refused_us = self.max_refused_us.max(took.as_micros() as u64);
            }
            Outcome::TimedOut => self.timed_out += 1,
            Outcome::Error(e) => {
                self.errors += 1;
                self.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

/// How a single timed connect ended ([`time_connect_in`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connect {
    Connected,
    /// `ECONNREFUSED`: a RST answered the SYN.
    Refused,
    /// Nothing answered within the timeout.
    TimedOut,
    /// Any other error, as the kernel said it.
    Failed(String),
}

/// One blocking connect from namespace `ns` to `target`, timed: how it
/// ended and how long it took (the timeout, when it timed out). The
/// connection, if any, is closed at once.
pub fn time_connect_in(
    ns: &str,
    target: SocketAddr,
    timeout: Duration,
) -> Result<(Connect, Duration), LabError> {
    in_netns(ns, || {
        let t0 = std::time::Instant::now();
        let r = std::net::TcpStream::connect_timeout(&target, timeout);
        let took = t0.elapsed();
        let how = match r {
            Ok(_) => Connect::Connected,
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => Connect::Refused,
            Err(e) if e.kind() == ErrorKind::TimedOut => Connect::TimedOut,
            Err(e) => Connect::Failed(e.to_string()),
        };
        (how, took)
    })
}

/// Floods from inside namespace `ns` on a runtime of its own (one thread).
pub fn connect_flood_in(
    ns: &str,
    opts: &ConnectFloodOptions,
) -> Result<ConnectFloodReport, LabError> {
    let what = format!("flooding {} with connects from namespace {ns}", opts.target);
    in_netns(ns, || {
        if opts.idle_priority {
            set_idle_priority()?;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(connect_flood(opts.clone()))
    })?
    .map_err(|source| LabError::Io { what, source })
}

/// Puts the calling thread (only) under `SCHED_IDLE`.
fn set_idle_priority() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a valid parameter; pid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Floods from this thread's namespace: starts connects until `count` were
/// started or `time_limit` passed, then waits for those in flight.
///
/// # Errors
///
/// Invalid options. Failed connects are counted, not returned.
pub async fn connect_flood(opts: ConnectFloodOptions) -> io::Result<ConnectFloodReport> {
    opts.validate()?;
    let opts = Arc::new(opts);
    let slots = Arc::new(Semaphore::new(opts.in_flight));
    let mut tasks = JoinSet::new();
    let mut report = ConnectFloodReport::default();
    let start = Instant::now();
    let deadline = start + opts.time_limit;
    while report.started < opts.count {
        if let Some(rate) = opts.rate {
            let due = start + Duration::from_secs_f64(report.started as f64 / f64::from(rate));
            tokio::time::sleep_until(due).await;
        }
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.map_err(io::Error::other)?,
            () = tokio::time::sleep_until(deadline) => break,
        };
        if Instant::now() >= deadline {
            break;
        }
        let src = match opts.sources.len() {
            0 => None,
            n => Some(opts.sources[(report.started % n as u64) as usize]),
        };
        let o = opts.clone();
        tasks.spawn(async move {
            let ended = one(&o, src, start).await;
            drop(permit);
            ended
        });
        report.started += 1;
        while let Some(r) = tasks.try_join_next() {
            report.tally(r.map_err(io::Error::other)?);
        }
    }
    report.stopped_by_time = report.started < opts.count;
    while let Some(r) = tasks.join_next().await {
        report.tally(r.map_err(io::Error::other)?);
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

/// One connection from `src`, as the options say.
async fn one(opts: &ConnectFloodOptions, src: Option<IpAddr>, start: Instant) -> Ended {
    let t0 = Instant::now();
    let mut connect_end = None;
    let outcome = connect_and_close(opts, src, t0, &mut connect_end).await;
    Ended {
        outcome,
        connect_at: t0 - start,
        connect_end: connect_end.unwrap_or_else(Instant::now) - start,
    }
}

async fn connect_and_close(
    opts: &ConnectFloodOptions,
    src: Option<IpAddr>,
    t0: Instant,
    connect_end: &mut Option<Instant>,
) -> Outcome {
    let sock = match socket(opts.target, src) {
        Ok(s) => s,
        Err(e) => return Outcome::Error(e),
    };
    let connected = tokio::time::timeout(opts.connect_timeout, sock.connect(opts.target)).await;
    *connect_end = Some(Instant::now());
    let stream = match connected {
        Err(_) => return Outcome::TimedOut,
        Ok(Err(e)) if e.kind() == ErrorKind::ConnectionRefused => {
            return Outcome::Refused(t0.elapsed());
        }
        Ok(Err(e)) => return Outcome::Error(e),
        Ok(Ok(s)) => s,
    };
    let answered = match opts.then {
        AfterConnect::Close => None,
        AfterConnect::Request => Some(
            tokio::time::timeout(opts.request_timeout, request(stream, opts.target))
                .await
                .is_ok_and(|r| r.is_ok()),
        ),
    };
    Outcome::Connected { answered }
}

/// A socket bound to `src` (address only: the port is left to connect).
fn socket(target: SocketAddr, src: Option<IpAddr>) -> io::Result<TcpSocket> {
    let sock = if target.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(src) = src {
        bind_address_no_port(&sock)?;
        sock.bind(SocketAddr::new(src, 0))?;
    }
    Ok(sock)
}

/// `IP_BIND_ADDRESS_NO_PORT` (Linux 4.2+; IPv6 sockets take it at the
/// SOL_IP level too): `bind` takes the address only and `connect` picks a
/// port unique for the 4-tuple, instead of `bind` reserving a port for the
/// address alone. Without it, 64 k connects from one address would exhaust
/// the ports of every destination at once.
fn bind_address_no_port(sock: &TcpSocket) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: a valid socket descriptor and a c_int option of its size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&raw const one).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One keep-alive `GET /api` and its answer; then the caller drops the
/// stream, closing first.
async fn request(mut stream: TcpStream, target: SocketAddr) -> io::Result<()> {
    let req = format!(
        "GET /api HTTP/1.1\r\nHost: {target}\r\nUser-Agent: xlb-flood\r\nConnection: keep-alive\r\n\r\n"
    );
    stream.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    http::read_response(&mut stream, &mut buf).await.map(drop)
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, TcpListener};

    use super::*;

    fn opts(target: SocketAddr) -> ConnectFloodOptions {
        ConnectFloodOptions::new(target, Vec::new(), 10, Duration::from_secs(1))
    }

    #[test]
    fn idle_priority_applies_to_the_calling_thread_only() {
        let policy = || unsafe { libc::sched_getscheduler(0) };
        let before = policy();
        let inside = std::thread::spawn(move || {
            set_idle_priority().unwrap();
            policy()
        })
        .join()
        .unwrap();
        assert_eq!(inside, libc::SCHED_IDLE);
        assert_eq!(policy(), before, "the caller's own thread is unchanged");
    }

    #[test]
    fn options_are_checked() {
        let ok = opts("127.0.0.1:1".parse().unwrap());
        assert!(ok.validate().is_ok());
        let cases = [
            (
                "zero time",
                ConnectFloodOptions {
                    time_limit: Duration::ZERO,
                    ..ok.clone()
                },
            ),
            (
                "no slot",
                ConnectFloodOptions {
                    in_flight: 0,
                    ..ok.clone()
                },
            ),
            (
                "zero rate",
                ConnectFloodOptions {
                    rate: Some(0),
                    ..ok.clone()
                },
            ),
            (
                "v6 source to a v4 target",
                ConnectFloodOptions {
                    sources: vec!["::1".parse().unwrap()],
                    ..ok.clone()
                },
            ),
        ];
        for (name, o) in cases {
            assert!(o.validate().is_err(), "{name}");
        }
    }

    /// On loopback: a closed port refuses every connect at once; an open
    /// one (that nobody answers HTTP on) connects every time.
    #[test]
    fn counts_refused_and_connected() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let loopback = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
        let r = rt
            .block_on(connect_flood(ConnectFloodOptions {
                sources: loopback.clone(),
                ..opts(closed)
            }))
            .unwrap();
        assert_eq!((r.started, r.refused, r.connected), (10, 10, 0), "{r:?}");
        assert!(!r.stopped_by_time);

        let open = TcpListener::bind("127.0.0.1:0").unwrap();
        let r = rt
            .block_on(connect_flood(ConnectFloodOptions {
                then: AfterConnect::Close,
                sources: loopback,
                ..opts(open.local_addr().unwrap())
            }))
            .unwrap();
        assert_eq!((r.started, r.connected, r.refused), (10, 10, 0), "{r:?}");
        assert_eq!(r.answered + r.unanswered, 0, "no requests: {r:?}");
    }
}
