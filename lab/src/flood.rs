//! A bounded flood of spoofed TCP packets, for the abuse tests: TCP
//! segments with a chosen flag set (ACK by default) to one address and port,
//! each from a random IPv4 source address and port inside a given prefix,
//! sent through a raw socket (`IP_HDRINCL`) from inside a lab namespace.
//!
//! Bounded twice: by a packet count and by a time limit, both required, so
//! a flood always ends. The sources are the caller's prefix only (inside the
//! lab, e.g. 10.99.128.0/17); the lab's namespaces are isolated anyway.

use rand::{RngCore, SeedableRng, rngs::StdRng};
use std::{
    io::{self, ErrorKind},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    thread,
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::topology::{LabError, in_netns, inet_checksum};

/// TCP flag bits (the low byte of the flags field).
pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;

/// Length of one flood packet: a 20-byte IPv4 header and a 20-byte TCP
/// header, no options, no payload.
pub const PACKET_LEN: usize = 40;

const IPPROTO_TCP: u8 = 6;

/// What to send.
#[derive(Debug, Clone)]
pub struct FloodOptions {
    /// Destination (a VIP and its port).
    pub dst: SocketAddrV4,
    /// Source prefix: every packet's source address is a random host of it.
    pub src_net: Ipv4Addr,
    pub src_prefix: u8,
    /// TCP flags of every packet ([`TCP_ACK`] by default).
    pub flags: u8,
    /// Most packets to send.
    pub count: u64,
    /// Longest time to send for.
    pub time_limit: Duration,
    /// Packets per second at most; `None`: as fast as the socket takes them.
    pub rate: Option<u32>,
    /// Seed of the source generator (the same seed, the same sources).
    pub seed: u64,
}

impl FloodOptions {
    /// ACKs to `dst` from `src_net/src_prefix`, `count` of them within
    /// `time_limit`, unpaced.
    pub fn new(
        dst: SocketAddrV4,
        src_net: Ipv4Addr,
        src_prefix: u8,
        count: u64,
        time_limit: Duration,
    ) -> Self {
        Self {
            dst,
            src_net,
            src_prefix,
            flags: TCP_ACK,
            count,
            time_limit,
            rate: None,
            seed: 0x9e37_79b9_7f4a_7c15,
        }
    }

    fn validate(&self) -> io::Result<()> {
        let bad = |what: &str| Err(io::Error::new(ErrorKind::InvalidInput, what.to_string()));
        if !(8..=32).contains(&self.src_prefix) {
            return bad("the source prefix length must be within 8..=32");
        }
        if self.time_limit.is_zero() {
            return bad("the time limit must be > 0");
        }
        if self.rate == Some(0) {
            return bad("the rate must be > 0 packets/s");
        }
        Ok(())
    }
}

/// What a flood did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloodReport {
    /// Packets the socket took.
    pub sent: u64,
    /// Sends refused for want of buffer space (`ENOBUFS`, `EAGAIN`), retried.
    pub retried: u64,
    pub elapsed: Duration,
    /// The time limit ended the flood before `count` packets were sent.
    pub timed_out: bool,
}

/// A random source inside `net/prefix`: random host bits, and a random
/// port in 1024..=65535.
pub fn random_source(rng: &mut impl RngCore, net: Ipv4Addr, prefix: u8) -> SocketAddrV4 {
    let r = rng.next_u64();
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    let host = (r as u32) & !mask;
    let addr = (u32::from(net) & mask) | host;
    let port = 1024 + ((r >> 32) as u16) % (u16::MAX - 1023);
    SocketAddrV4::new(addr.into(), port)
}

/// One IPv4 + TCP packet from `src` to `dst` with `flags`, sequence and
/// acknowledgement numbers `seq` and `ack`, both checksums filled in.
pub fn tcp_packet(
    src: SocketAddrV4,
    dst: SocketAddrV4,
    flags: u8,
    seq: u32,
    ack: u32,
) -> [u8; PACKET_LEN] {
    let mut p = [0u8; PACKET_LEN];
    // IPv4: version 4, IHL 5; total length; ID; DF; TTL 64; TCP.
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(PACKET_LEN as u16).to_be_bytes());
    p[4..6].copy_from_slice(&(seq as u16).to_be_bytes());
    p[6] = 0x40;
    p[8] = 64;
    p[9] = IPPROTO_TCP;
    p[12..16].copy_from_slice(&src.ip().octets());
    p[16..20].copy_from_slice(&dst.ip().octets());
    let ip_sum = inet_checksum(&p[..20]);
    p[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    // TCP: ports, numbers, data offset 5, flags, window 64240.
    let t = &mut p[20..];
    t[0..2].copy_from_slice(&src.port().to_be_bytes());
    t[2..4].copy_from_slice(&dst.port().to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&ack.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&64240u16.to_be_bytes());
    let tcp_sum = tcp_checksum(src.ip(), dst.ip(), &p[20..]);
    p[36..38].copy_from_slice(&tcp_sum.to_be_bytes());
    p
}

/// The TCP checksum of `segment` (its checksum field zero) over the IPv4
/// pseudo-header.
fn tcp_checksum(src: &Ipv4Addr, dst: &Ipv4Addr, segment: &[u8]) -> u16 {
    let mut buf = Vec::with_capacity(12 + segment.len());
    buf.extend_from_slice(&src.octets());
    buf.extend_from_slice(&dst.octets());
    buf.push(0);
    buf.push(IPPROTO_TCP);
    buf.extend_from_slice(&(segment.len() as u16).to_be_bytes());
    buf.extend_from_slice(segment);
    inet_checksum(&buf)
}

/// Floods from inside namespace `ns` (see [`flood_here`]).
pub fn flood_in(ns: &str, opts: &FloodOptions) -> Result<FloodReport, LabError> {
    in_netns(ns, || flood_here(opts))?.map_err(|source| LabError::Io {
        what: format!("flooding {} from namespace {ns}", opts.dst),
        source,
    })
}

/// Floods from this thread's namespace: sends until `count` packets went
/// out or `time_limit` passed, whichever comes first. Needs root (a raw
/// socket).
pub fn flood_here(opts: &FloodOptions) -> io::Result<FloodReport> {
    opts.validate()?;
    let sock = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(255)))?;
    sock.set_header_included_v4(true)?;
    let to = SockAddr::from(SocketAddr::V4(opts.dst));
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let start = Instant::now();
    let mut report = FloodReport {
        sent: 0,
        retried: 0,
        elapsed: Duration::ZERO,
        timed_out: false,
    };
    while report.sent < opts.count {
        if start.elapsed() >= opts.time_limit {
            report.timed_out = true;
            break;
        }
        pace(opts.rate, report.sent, start);
        let src = random_source(&mut rng, opts.src_net, opts.src_prefix);
        let r = rng.next_u64();
        let pkt = tcp_packet(src, opts.dst, opts.flags, r as u32, (r >> 32) as u32);
        match sock.send_to(&pkt, &to) {
            Ok(_) => report.sent += 1,
            Err(e) if is_full(&e) => {
                report.retried += 1;
                thread::sleep(Duration::from_micros(200));
            }
            Err(e) => return Err(e),
        }
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

/// Sleeps until packet number `sent` is due at `rate` packets/s.
fn pace(rate: Option<u32>, sent: u64, start: Instant) {
    let Some(rate) = rate else { return };
    let due = Duration::from_secs_f64(sent as f64 / f64::from(rate));
    let now = start.elapsed();
    // Sleep in steps of a millisecond or more: a finer sleep costs more
    // than it paces.
    if due > now + Duration::from_millis(1) {
        thread::sleep(due - now);
    }
}

fn is_full(e: &io::Error) -> bool {
    e.kind() == ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ENOBUFS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dst() -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(10, 100, 0, 1), 80)
    }

    #[test]
    fn packet_headers_are_what_was_asked() {
        let src = SocketAddrV4::new(Ipv4Addr::new(10, 99, 200, 7), 40000);
        let p = tcp_packet(src, dst(), TCP_ACK, 0x0102_0304, 0x0a0b_0c0d);
        assert_eq!(p[0], 0x45, "IPv4, 20-byte header");
        assert_eq!(u16::from_be_bytes([p[2], p[3]]), 40, "total length");
        assert_eq!(p[6] & 0x40, 0x40, "DF");
        assert_eq!(p[8], 64, "TTL");
        assert_eq!(p[9], 6, "TCP");
        assert_eq!(&p[12..16], &[10, 99, 200, 7]);
        assert_eq!(&p[16..20], &[10, 100, 0, 1]);
        assert_eq!(u16::from_be_bytes([p[20], p[21]]), 40000);
        assert_eq!(u16::from_be_bytes([p[22], p[23]]), 80);
        assert_eq!(&p[24..28], &[1, 2, 3, 4], "sequence number");
        assert_eq!(&p[28..32], &[0x0a, 0x0b, 0x0c, 0x0d], "ack number");
        assert_eq!(p[32] >> 4, 5, "data offset");
        assert_eq!(p[33], TCP_ACK, "flags");
        assert_eq!(&p[38..40], &[0, 0], "urgent pointer");
    }

    #[test]
    fn checksums_verify() {
        let mut rng = StdRng::seed_from_u64(7);
        for flags in [
            TCP_ACK,
            TCP_SYN,
            TCP_RST,
            TCP_FIN | TCP_ACK,
            TCP_PSH | TCP_ACK,
        ] {
            let src = random_source(&mut rng, Ipv4Addr::new(10, 99, 128, 0), 17);
            let p = tcp_packet(src, dst(), flags, rng.next_u64() as u32, 5);
            // A header with its checksum in place sums to 0 (complemented).
            assert_eq!(inet_checksum(&p[..20]), 0, "IPv4 checksum of {p:?}");
            assert_eq!(
                tcp_checksum(src.ip(), dst().ip(), &p[20..]),
                0,
                "TCP checksum of {p:?}"
            );
        }
    }

    #[test]
    fn checksums_match_a_known_packet() {
        // Computed independently (Python, RFC 1071) for these exact fields.
        let src = SocketAddrV4::new(Ipv4Addr::new(10, 99, 128, 1), 1024);
        let p = tcp_packet(src, dst(), TCP_ACK, 1, 2);
        assert_eq!(u16::from_be_bytes([p[10], p[11]]), KNOWN_IP_SUM);
        assert_eq!(u16::from_be_bytes([p[36], p[37]]), KNOWN_TCP_SUM);
    }

    const KNOWN_IP_SUM: u16 = 0xa606;
    const KNOWN_TCP_SUM: u16 = 0x1bc8;

    #[test]
    fn sources_stay_inside_the_prefix() {
        let mut rng = StdRng::seed_from_u64(1);
        let net = Ipv4Addr::new(10, 99, 128, 0);
        let mut distinct = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let s = random_source(&mut rng, net, 17);
            let o = s.ip().octets();
            assert_eq!((o[0], o[1]), (10, 99), "{s}");
            assert!(o[2] >= 128, "{s} is outside 10.99.128.0/17");
            assert!(s.port() >= 1024, "{s}");
            distinct.insert(s);
        }
        assert!(distinct.len() > 9_900, "only {} distinct", distinct.len());
        let one = random_source(&mut rng, Ipv4Addr::new(10, 99, 0, 77), 32);
        assert_eq!(*one.ip(), Ipv4Addr::new(10, 99, 0, 77));
    }

    #[test]
    fn options_are_checked() {
        let ok = FloodOptions::new(
            dst(),
            Ipv4Addr::new(10, 99, 128, 0),
            17,
            10,
            Duration::from_secs(1),
        );
        assert!(ok.validate().is_ok());
        for bad in [
            FloodOptions {
                src_prefix: 33,
                ..ok.clone()
            },
            FloodOptions {
                src_prefix: 4,
                ..ok.clone()
            },
            FloodOptions {
                time_limit: Duration::ZERO,
                ..ok.clone()
            },
            FloodOptions {
                rate: Some(0),
                ..ok.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
