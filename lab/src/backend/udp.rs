//! The backend's UDP service: an echo that names the backend. Every
//! datagram `P` is answered with `<name> P`, sent from the address `P` was
//! sent to (the VIP, which the lab puts on every backend's `lo`), so a DSR
//! reply reaches the client from the address it asked. The socket is bound
//! to the wildcard address, so the destination is read from each
//! datagram's `IP_PKTINFO` / `IPV6_PKTINFO` and given back as the source of
//! the answer (as a DNS server on a host with many addresses does).
//!
//! The HTTP faults do not apply: the UDP service answers until the backend
//! stops.

use std::{
    io::{self, IoSlice, IoSliceMut},
    net::{IpAddr, SocketAddr},
    os::fd::AsRawFd as _,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use nix::sys::socket::{
    ControlMessage, ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg, sendmsg, setsockopt,
    sockopt,
};
use socket2::{Domain, Socket, Type};
use tokio::{io::Interest, net::UdpSocket, task::JoinHandle};

/// Largest datagram answered; longer ones are truncated to this.
const MAX_DATAGRAM: usize = 2048;

/// A running UDP echo. Dropping it closes its sockets.
pub struct UdpHandle {
    addrs: Vec<SocketAddr>,
    answered: Arc<AtomicU64>,
    tasks: Vec<JoinHandle<()>>,
}

impl UdpHandle {
    /// The bound addresses (port 0 resolved), in the order given.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Datagrams answered so far.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }
}

impl Drop for UdpHandle {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The answer to `payload` from backend `name`: `<name> <payload>`.
pub fn answer(name: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(name.len() + 1 + payload.len());
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload);
    out
}

/// Binds every address of `listen` and answers on each until the handle is
/// dropped. Must run inside a tokio runtime.
pub fn serve_udp(name: &str, listen: &[SocketAddr]) -> io::Result<UdpHandle> {
    let answered = Arc::new(AtomicU64::new(0));
    let mut addrs = Vec::new();
    let mut tasks = Vec::new();
    for addr in listen {
        let sock = bind(*addr).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("backend {name}: binding UDP {addr}: {e} (port in use?)"),
            )
        })?;
        addrs.push(sock.local_addr()?);
        tasks.push(tokio::spawn(echo_loop(
            sock,
            name.to_string(),
            answered.clone(),
        )));
    }
    Ok(UdpHandle {
        addrs,
        answered,
        tasks,
    })
}

fn bind(addr: SocketAddr) -> io::Result<UdpSocket> {
    let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, None)?;
    if addr.is_ipv6() {
        // So that `0.0.0.0:P` and `[::]:P` can both be bound.
        sock.set_only_v6(true)?;
        setsockopt(&sock, sockopt::Ipv6RecvPacketInfo, &true)?;
    } else {
        setsockopt(&sock, sockopt::Ipv4PacketInfo, &true)?;
    }
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    UdpSocket::from_std(sock.into())
}

/// One received datagram: its length, its sender, and the address it was
/// sent to.
struct Received {
    len: usize,
    peer: SockaddrStorage,
    local: Option<IpAddr>,
}

fn recv_one(sock: &UdpSocket, buf: &mut [u8]) -> io::Result<Received> {
    let mut cmsg = nix::cmsg_space!(libc::in6_pktinfo);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<SockaddrStorage>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::empty(),
    )?;
    let mut local = None;
    for c in msg.cmsgs()? {
        match c {
            ControlMessageOwned::Ipv4PacketInfo(info) => {
                local = Some(IpAddr::from(info.ipi_addr.s_addr.to_ne_bytes()));
            }
            ControlMessageOwned::Ipv6PacketInfo(info) => {
                local = Some(IpAddr::from(info.ipi6_addr.s6_addr));
            }
            _ => {}
        }
    }
    let peer = msg
        .address
        .ok_or_else(|| io::Error::other("recvmsg gave no sender address"))?;
    Ok(Received {
        len: msg.bytes,
        peer,
        local,
    })
}

fn send_from(
    sock: &UdpSocket,
    data: &[u8],
    peer: &SockaddrStorage,
    local: Option<IpAddr>,
) -> io::Result<usize> {
    let iov = [IoSlice::new(data)];
    let fd = sock.as_raw_fd();
    match local {
        Some(IpAddr::V4(a)) => {
            let info = libc::in_pktinfo {
                ipi_ifindex: 0,
                ipi_spec_dst: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.octets()),
                },
                ipi_addr: libc::in_addr { s_addr: 0 },
            };
            let cm = [ControlMessage::Ipv4PacketInfo(&info)];
            Ok(sendmsg(fd, &iov, &cm, MsgFlags::empty(), Some(peer))?)
        }
        Some(IpAddr::V6(a)) => {
            let info = libc::in6_pktinfo {
                ipi6_addr: libc::in6_addr {
                    s6_addr: a.octets(),
                },
                ipi6_ifindex: 0,
            };
            let cm = [ControlMessage::Ipv6PacketInfo(&info)];
            Ok(sendmsg(fd, &iov, &cm, MsgFlags::empty(), Some(peer))?)
        }
        None => Ok(sendmsg(fd, &iov, &[], MsgFlags::empty(), Some(peer))?),
    }
}

async fn echo_loop(sock: UdpSocket, name: String, answered: Arc<AtomicU64>) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let got = sock
            .async_io(Interest::READABLE, || recv_one(&sock, &mut buf))
            .await;
        let Ok(r) = got else {
            // ENOBUFS and friends: skip the datagram.
            continue;
        };
        let reply = answer(&name, &buf[..r.len.min(MAX_DATAGRAM)]);
        // A full send buffer loses this answer, as UDP may.
        let sent = sock
            .async_io(Interest::WRITABLE, || {
                send_from(&sock, &reply, &r.peer, r.local)
            })
            .await;
        if sent.is_ok() {
            answered.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Answers name the backend, echo the payload and come from the
    /// address the datagram was sent to (here 127.0.0.2 and ::1, not the
    /// socket's wildcard address).
    #[tokio::test]
    async fn answers_name_the_backend_from_the_address_asked() {
        let h = serve_udp(
            "b7",
            &["0.0.0.0:0".parse().unwrap(), "[::]:0".parse().unwrap()],
        )
        .unwrap();
        let cases = [
            (
                "v4 on another loopback address",
                "127.0.0.2",
                h.addrs()[0].port(),
            ),
            ("v6", "::1", h.addrs()[1].port()),
        ];
        for (name, ip, port) in cases {
            let ip: IpAddr = ip.parse().unwrap();
            let bind: SocketAddr = if ip.is_ipv4() {
                "127.0.0.1:0".parse().unwrap()
            } else {
                "[::1]:0".parse().unwrap()
            };
            let c = UdpSocket::bind(bind).await.unwrap();
            let target = SocketAddr::new(ip, port);
            c.send_to(b"hello 1", target).await.unwrap();
            let mut buf = [0u8; 64];
            let (n, from) = tokio::time::timeout(Duration::from_secs(2), c.recv_from(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("{name}: no answer"))
                .unwrap();
            assert_eq!(&buf[..n], b"b7 hello 1", "{name}");
            assert_eq!(from, target, "{name}: answered from another address");
        }
        assert_eq!(h.answered(), 2);
    }
}
