//! The UDP transport of the datagram probe kinds (`dns`, `udp`
//! send/expect): one request datagram, the first answer from the backend.
//!
//! UDP has no handshake, so a probe proves only what the answer proves:
//! an application that reads the request and writes a reply. The socket is
//! fresh for every probe (a new random source port, as a resolver uses for
//! each query, so a stale answer to an earlier probe cannot be taken for
//! this one's) and connected to the backend, so the kernel drops datagrams
//! from any other address or port, and an ICMP port unreachable comes back
//! as `ECONNREFUSED` on the next call: nothing listens there.
//!
//! Nothing is resent: a lost request or answer fails this probe, and
//! `fall` consecutive failures (not one) take a backend out, as for TCP
//! probes that meet a lost SYN after the kernel's retries.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::{Instant, timeout_at};

use super::{FailReason, io_fail};
use crate::health::datapath::{DatapathTarget, NatRegistration};

/// One datagram that came back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Datagram {
    /// Its first `max_len` bytes.
    pub bytes: Vec<u8>,
    /// Whether it was longer than `max_len` (the rest is dropped).
    pub truncated: bool,
}

/// Sends `request` in one datagram from a fresh socket (a new random source
/// port each call) to `addr`, through the data path when `path` is given
/// (marked and bound to the interface as TCP probes are; `addr` is then the
/// VIP's address and port), and returns the first datagram that comes back
/// from exactly `addr`, of at most `max_len` bytes, by `deadline`. `limit`
/// is the duration a timeout names (the check's `hang_timeout`).
pub(crate) async fn exchange(
    addr: SocketAddr,
    path: Option<&DatapathTarget>,
    request: &[u8],
    max_len: usize,
    deadline: Instant,
    limit: Duration,
) -> Result<Datagram, FailReason> {
    // The registration lives until the answer is in (or the probe is
    // dropped).
    let (socket, _registration) = open(addr, path).await?;
    match timeout_at(deadline, socket.send(request)).await {
        Err(_elapsed) => return Err(FailReason::NoDatagram { timeout: limit }),
        Ok(Err(e)) => return Err(udp_fail(e, "sending the request")),
        Ok(Ok(_)) => {}
    }
    // One byte more than kept tells a datagram of exactly `max_len` from a
    // longer one (recv truncates silently).
    let mut buf = vec![0; max_len + 1];
    match timeout_at(deadline, socket.recv(&mut buf)).await {
        Err(_elapsed) => Err(FailReason::NoDatagram { timeout: limit }),
        Ok(Err(e)) => Err(udp_fail(e, "reading the answer")),
        Ok(Ok(n)) => {
            buf.truncate(n.min(max_len));
            Ok(Datagram {
                bytes: buf,
                truncated: n > max_len,
            })
        }
    }
}

/// A fresh socket connected to `addr` (marked for `path`), and the NAT
/// flow of a NAT VIP's data-path probe, written before the first datagram
/// and deleted when the registration is dropped.
async fn open(
    addr: SocketAddr,
    path: Option<&DatapathTarget>,
) -> Result<(UdpSocket, Option<NatRegistration>), FailReason> {
    let (socket, registration) = match path {
        None => {
            let any: SocketAddr = match addr {
                SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
                SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
            };
            let socket = UdpSocket::bind(any)
                .await
                .map_err(|e| io_fail(e, "creating a socket"))?;
            (socket, None)
        }
        // As for TCP: EPERM (no CAP_NET_ADMIN for SO_MARK), a missing
        // interface or the NAT flow maps are this host's problem.
        Some(path) => {
            let local = |e: io::Error| FailReason::Local {
                during: "marking a data-path probe socket",
                error: e.to_string(),
            };
            let (socket, registration) = path.udp_socket(addr).map_err(local)?;
            socket.set_nonblocking(true).map_err(local)?;
            (UdpSocket::from_std(socket).map_err(local)?, registration)
        }
    };
    // connect(2) on UDP only sets the peer: an error here is this host's
    // routing (no route, an unresolvable neighbour was not tried yet).
    socket.connect(addr).await.map_err(|e| {
        if matches!(
            e.raw_os_error(),
            Some(libc::ENETUNREACH | libc::EHOSTUNREACH)
        ) {
            FailReason::Local {
                during: "connecting (no route from this host)",
                error: e.to_string(),
            }
        } else {
            io_fail(e, "connecting")
        }
    })?;
    Ok((socket, registration))
}

/// An error of a connected UDP socket: `ECONNREFUSED` is the ICMP port
/// unreachable an earlier datagram drew (nothing listens on the port).
fn udp_fail(e: io::Error, during: &'static str) -> FailReason {
    if e.kind() == io::ErrorKind::ConnectionRefused {
        return FailReason::PortUnreachable;
    }
    io_fail(e, during)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(2)
    }

    /// An echo server on loopback: answers each datagram with `reply(req)`.
    async fn server(reply: fn(&[u8]) -> Vec<u8>) -> SocketAddr {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            while let Ok((n, from)) = sock.recv_from(&mut buf).await {
                let _ = sock.send_to(&reply(&buf[..n]), from).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn answer_comes_back_whole_or_flagged_truncated() {
        let addr = server(|req| [req, b"!"].concat()).await;
        let got = exchange(addr, None, b"ping", 64, soon(), Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(
            got,
            Datagram {
                bytes: b"ping!".to_vec(),
                truncated: false
            }
        );
        let got = exchange(addr, None, b"ping", 5, soon(), Duration::from_secs(2))
            .await
            .unwrap();
        assert!(!got.truncated, "exactly max_len is whole");
        let got = exchange(addr, None, b"ping", 3, soon(), Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(got.bytes, b"pin");
        assert!(got.truncated);
    }

    /// Each probe has its own source port: an answer to an earlier probe
    /// cannot reach a later one.
    #[tokio::test]
    async fn every_probe_has_a_fresh_port() {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        let probes = tokio::spawn(async move {
            for _ in 0..2 {
                let _ = exchange(
                    addr,
                    None,
                    b"x",
                    8,
                    Instant::now() + Duration::from_millis(100),
                    Duration::from_millis(100),
                )
                .await;
            }
        });
        let mut buf = [0u8; 8];
        let (_, a) = sock.recv_from(&mut buf).await.unwrap();
        let (_, b) = sock.recv_from(&mut buf).await.unwrap();
        probes.await.unwrap();
        assert_ne!(a.port(), b.port());
    }

    #[tokio::test]
    async fn silence_is_no_answer_within_the_limit() {
        // Bound, never read: the request is queued and nothing answers.
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        let limit = Duration::from_millis(150);
        let start = Instant::now();
        let err = exchange(addr, None, b"x", 8, start + limit, limit)
            .await
            .unwrap_err();
        assert_eq!(err, FailReason::NoDatagram { timeout: limit });
        assert_eq!(err.to_string(), "no answer within 150ms");
        assert_eq!(err.code(), "no_answer");
        assert!(start.elapsed() >= limit);
    }

    #[tokio::test]
    async fn a_closed_port_is_port_unreachable() {
        // A port just freed: the kernel answers with ICMP port unreachable.
        let addr = UdpSocket::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let err = exchange(addr, None, b"x", 8, soon(), Duration::from_secs(2))
            .await
            .unwrap_err();
        assert_eq!(err, FailReason::PortUnreachable);
        assert_eq!(err.code(), "port_unreachable");
    }

    /// A datagram from another port of the same host is not the backend's
    /// answer: the connected socket never delivers it.
    #[tokio::test]
    async fn answers_from_elsewhere_are_ignored() {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        tokio::spawn(async move {
            let other = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let mut buf = [0u8; 8];
            if let Ok((_, from)) = sock.recv_from(&mut buf).await {
                let _ = other.send_to(b"spoof", from).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = sock.send_to(b"real", from).await;
            }
        });
        let got = exchange(addr, None, b"x", 8, soon(), Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(got.bytes, b"real");
    }
}
