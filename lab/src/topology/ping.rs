//! `ping -c1` for the lab: one echo request from inside a namespace.

use std::{
    io::{self, ErrorKind},
    mem::MaybeUninit,
    net::{IpAddr, SocketAddr},
    sync::atomic::{AtomicU16, Ordering},
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, Socket, Type};

use super::{LabError, Result, in_netns};

/// Sends one ICMP (v4) or ICMPv6 echo request from inside `ns` to `dst` and
/// waits up to `timeout` for the reply; returns the round-trip time. A
/// replacement for `ping -c1`, which this machine does not have.
pub fn ping(ns: &str, dst: IpAddr, timeout: Duration) -> Result<Duration> {
    in_netns(ns, || ping_here(dst, timeout))?.map_err(|source| LabError::Io {
        what: format!("ping {dst} from namespace {ns}"),
        source,
    })
}

/// The Internet checksum (RFC 1071) of `data`.
pub fn inet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

static PING_SEQ: AtomicU16 = AtomicU16::new(1);

fn ping_here(dst: IpAddr, timeout: Duration) -> io::Result<Duration> {
    let (domain, proto, request_type, reply_type) = match dst {
        IpAddr::V4(_) => (Domain::IPV4, Protocol::ICMPV4, 8u8, 0u8),
        IpAddr::V6(_) => (Domain::IPV6, Protocol::ICMPV6, 128, 129),
    };
    // A raw socket (root) rather than a ping socket: new namespaces start
    // with ping_group_range "1 0", which allows nobody.
    let sock = Socket::new(domain, Type::RAW, Some(proto))?;
    let id = (std::process::id() as u16) ^ 0x5a5a;
    let seq = PING_SEQ.fetch_add(1, Ordering::Relaxed);
    let mut pkt = vec![request_type, 0, 0, 0];
    pkt.extend_from_slice(&id.to_be_bytes());
    pkt.extend_from_slice(&seq.to_be_bytes());
    pkt.extend_from_slice(b"xlb-lab-ping-pad");
    if dst.is_ipv4() {
        // The kernel fills in the ICMPv6 checksum (it needs the pseudo-header);
        // ICMPv4's is ours.
        let csum = inet_checksum(&pkt);
        pkt[2..4].copy_from_slice(&csum.to_be_bytes());
    }
    let start = Instant::now();
    sock.send_to(&pkt, &SocketAddr::new(dst, 0).into())?;
    let mut buf = [MaybeUninit::<u8>::uninit(); 2048];
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(io::Error::new(
                ErrorKind::TimedOut,
                format!("no echo reply within {timeout:?}"),
            ));
        }
        sock.set_read_timeout(Some(left))?;
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) => return Err(e),
        };
        // SAFETY: recv_from initialised the first n bytes.
        let data: &[u8] = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), n) };
        // Raw IPv4 sockets deliver the IP header too; IPv6 ones do not.
        let icmp = if dst.is_ipv4() {
            let ihl = usize::from(data.first().copied().unwrap_or(0) & 0x0f) * 4;
            data.get(ihl..).unwrap_or(&[])
        } else {
            data
        };
        let from_ip = from.as_socket().map(|a| a.ip());
        if icmp.len() >= 8
            && icmp[0] == reply_type
            && icmp[4..6] == id.to_be_bytes()
            && icmp[6..8] == seq.to_be_bytes()
            && from_ip == Some(dst)
        {
            return Ok(start.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_known_echo_request() {
        // Echo request, id 0x1234, seq 1, no payload: 0x08 0x00 + 0x12 0x34 + 0x00 0x01
        // sum = 0x0800 + 0x1234 + 0x0001 = 0x1a35 → !0x1a35 = 0xe5ca.
        let pkt = [8, 0, 0, 0, 0x12, 0x34, 0, 1];
        assert_eq!(inet_checksum(&pkt), 0xe5ca);
        // An odd length pads with a zero byte.
        assert_eq!(inet_checksum(&[0xff]), !0xff00);
    }
}
