//! A small packet builder for fixtures: written independently of the data
//! plane, so expected bytes (outer headers, checksums) are computed twice.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lb_common::{FlowKey, PROTO_TCP, PROTO_UDP};

pub type Mac = [u8; 6];

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88a8;

pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const ACK: u8 = 0x10;
pub const PSH: u8 = 0x08;

/// A client → VIP 5-tuple.
#[derive(Clone, Copy, Debug)]
pub struct Flow {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
}

impl Flow {
    pub fn tcp(src: &str, sport: u16, dst: &str, dport: u16) -> Self {
        Self {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            sport,
            dport,
            proto: PROTO_TCP,
        }
    }

    pub fn udp(src: &str, sport: u16, dst: &str, dport: u16) -> Self {
        Self {
            proto: PROTO_UDP,
            ..Self::tcp(src, sport, dst, dport)
        }
    }

    /// The conntrack key / hash input the data plane builds for this flow.
    pub fn key(&self) -> FlowKey {
        FlowKey::new(
            std::net::SocketAddr::new(self.src, self.sport),
            std::net::SocketAddr::new(self.dst, self.dport),
            self.proto,
        )
    }

    /// The L4 header (+ payload): TCP with `flags`, or UDP.
    pub fn l4(&self, flags: u8, payload: &[u8]) -> Vec<u8> {
        if self.proto == PROTO_TCP {
            tcp(self.sport, self.dport, flags, 5, payload)
        } else {
            udp(self.sport, self.dport, payload)
        }
    }

    /// The IP packet of this flow.
    pub fn ip(&self, flags: u8, payload: &[u8]) -> Vec<u8> {
        let l4 = self.l4(flags, payload);
        ip(self.src, self.dst, self.proto, &l4)
    }

    /// The whole frame, optionally VLAN-tagged.
    pub fn frame(
        &self,
        dst_mac: Mac,
        src_mac: Mac,
        vlan: Option<u16>,
        flags: u8,
        payload: &[u8],
    ) -> Vec<u8> {
        eth(
            dst_mac,
            src_mac,
            vlan,
            ethertype(self.dst),
            &self.ip(flags, payload),
        )
    }
}

pub use lb_common::{addr16, family_of as family};

pub fn ethertype(a: IpAddr) -> u16 {
    if a.is_ipv4() { ETH_P_IP } else { ETH_P_IPV6 }
}

pub fn eth(dst: Mac, src: Mac, vlan: Option<u16>, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(18 + payload.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    if let Some(id) = vlan {
        f.extend_from_slice(&ETH_P_8021Q.to_be_bytes());
        f.extend_from_slice(&(id & 0x0fff).to_be_bytes());
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// RFC 1071 checksum (the lab's, which its ping uses too).
pub use xlb_lab::topology::inet_checksum as csum;

/// An IPv4 header (20 bytes, checksummed) followed by `payload`.
pub fn ipv4(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    tos: u8,
    ttl: u8,
    id: u16,
    payload: &[u8],
) -> Vec<u8> {
    let len = (20 + payload.len()) as u16;
    let mut h = vec![0x45, tos];
    h.extend_from_slice(&len.to_be_bytes());
    h.extend_from_slice(&id.to_be_bytes());
    h.extend_from_slice(&[0, 0, ttl, proto, 0, 0]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    let c = csum(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h.extend_from_slice(payload);
    h
}

/// An IPv6 header followed by `payload`.
pub fn ipv6(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    next: u8,
    vcf: [u8; 4],
    hop: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut h = vcf.to_vec();
    h.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    h.extend_from_slice(&[next, hop]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    h.extend_from_slice(payload);
    h
}

/// A client packet: IPv4 (tos 0, ttl 64, id 1) or IPv6 (flow label 0x12345).
pub fn ip(src: IpAddr, dst: IpAddr, proto: u8, payload: &[u8]) -> Vec<u8> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => ipv4(s, d, proto, 0, 64, 1, payload),
        (IpAddr::V6(s), IpAddr::V6(d)) => ipv6(s, d, proto, [0x60, 0x01, 0x23, 0x45], 64, payload),
        _ => panic!("mixed address families"),
    }
}

/// A TCP header with data offset `doff` (words; options zero-filled) + payload.
/// The checksum is left zero: XDP does not verify it and the LB never changes it.
pub fn tcp(sport: u16, dport: u16, flags: u8, doff: u8, payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&1000u32.to_be_bytes());
    h.extend_from_slice(&(if flags & ACK != 0 { 2000u32 } else { 0 }).to_be_bytes());
    h.push(doff << 4);
    h.push(flags);
    h.extend_from_slice(&65535u16.to_be_bytes());
    h.extend_from_slice(&[0, 0, 0, 0]);
    h.resize(h.len().max(doff as usize * 4), 0);
    h.extend_from_slice(payload);
    h
}

pub fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    h.extend_from_slice(&[0, 0]);
    h.extend_from_slice(payload);
    h
}

/// What `xlb_lb` sends for a packet of `flow` (`inner`) to `backend` in
/// `dsr-ipip`, with one outer IPv4 source: as [`encap`], but an outer IPv6
/// header's flow label is the low 20 bits of `lb_common::encap_hash` of the
/// flow's client address and port (the traffic class still the inner one).
pub fn encap_flow(outer_src: IpAddr, backend: IpAddr, inner: &[u8], flow: &Flow) -> Vec<u8> {
    let mut out = encap(outer_src, backend, inner);
    if backend.is_ipv6() {
        let label = lb_common::encap_hash(&addr16(flow.src), flow.sport.to_be());
        out[1] = (out[1] & 0xf0) | ((label >> 16) & 0x0f) as u8;
        out[2] = (label >> 8) as u8;
        out[3] = label as u8;
    }
    out
}

/// What `dsr-ipip` must send: an outer header to `backend` around `inner`
/// (an IP packet). IPv4 outer: tos copied, id 0, no flags, TTL 64, proto 4.
/// IPv6 outer: version/class/flow label copied, next header 41, hop limit 64.
pub fn encap(outer_src: IpAddr, backend: IpAddr, inner: &[u8]) -> Vec<u8> {
    match (outer_src, backend) {
        (IpAddr::V4(s), IpAddr::V4(d)) => ipv4(s, d, 4, inner[1], 64, 0, inner),
        (IpAddr::V6(s), IpAddr::V6(d)) => ipv6(
            s,
            d,
            41,
            [inner[0], inner[1], inner[2], inner[3]],
            64,
            inner,
        ),
        _ => panic!("mixed address families"),
    }
}

/// What the LB answers a refused SYN of `flow` with (the SYN sent by
/// [`Flow::frame`] from `client_mac` to `lb_mac` with `syn_payload`): a RST
/// back to the client, addresses, ports and MACs swapped, no options, no
/// payload. `<SEQ=0><ACK=SYN.SEQ+1+payload><CTL=RST,ACK>`, window 0. IPv4:
/// tos 0, id 0, DF, TTL 64; IPv6: flow label 0, hop limit 64. Checksums
/// computed here, independently of the data plane.
pub fn rst_reply(
    flow: &Flow,
    lb_mac: Mac,
    client_mac: Mac,
    vlan: Option<u16>,
    syn_payload: &[u8],
) -> Vec<u8> {
    // The SYN's sequence number as `tcp` writes it.
    const SYN_SEQ: u32 = 1000;
    let ack = SYN_SEQ + 1 + syn_payload.len() as u32;
    rst_frame(flow, (lb_mac, client_mac), vlan, (0, ack, RST | ACK))
}

/// What the LB answers a segment with ACK of `flow` with (as sent by
/// [`Flow::frame`], whose ACK number is 2000) when it resets the flow:
/// `<SEQ=SEG.ACK><CTL=RST>` (RFC 9293, 3.10.7.1), otherwise as
/// [`rst_reply`].
pub fn rst_to_ack(flow: &Flow, lb_mac: Mac, client_mac: Mac, vlan: Option<u16>) -> Vec<u8> {
    // The ACK number as `tcp` writes it.
    const SEG_ACK: u32 = 2000;
    rst_frame(flow, (lb_mac, client_mac), vlan, (SEG_ACK, 0, RST))
}

/// A RST of `flow` back to its client, (`seq`, `ack`, `flags`) in its TCP
/// header, from `macs.0` to `macs.1`.
fn rst_frame(flow: &Flow, macs: (Mac, Mac), vlan: Option<u16>, tcp: (u32, u32, u8)) -> Vec<u8> {
    let (lb_mac, client_mac) = macs;
    let (seq, ack, flags) = tcp;
    let mut seg = Vec::with_capacity(20);
    seg.extend_from_slice(&flow.dport.to_be_bytes());
    seg.extend_from_slice(&flow.sport.to_be_bytes());
    seg.extend_from_slice(&seq.to_be_bytes());
    seg.extend_from_slice(&ack.to_be_bytes());
    seg.extend_from_slice(&[5 << 4, flags, 0, 0, 0, 0, 0, 0]);
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&addr_bytes(flow.dst));
    pseudo.extend_from_slice(&addr_bytes(flow.src));
    pseudo.extend_from_slice(&[0, PROTO_TCP, 0, seg.len() as u8]);
    pseudo.extend_from_slice(&seg);
    let c = csum(&pseudo);
    seg[16..18].copy_from_slice(&c.to_be_bytes());
    let l3 = match (flow.dst, flow.src) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut h = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, PROTO_TCP, 0, 0];
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
            let c = csum(&h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            h.extend_from_slice(&seg);
            h
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => ipv6(s, d, PROTO_TCP, [0x60, 0, 0, 0], 64, &seg),
        _ => panic!("mixed address families"),
    };
    eth(client_mac, lb_mac, vlan, ethertype(flow.dst), &l3)
}

/// The address as it appears on the wire (4 or 16 bytes).
fn addr_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// An ICMP message (header + `body`), its checksum computed.
pub fn icmp4(kind: u8, code: u8, rest: [u8; 4], body: &[u8]) -> Vec<u8> {
    let mut m = vec![kind, code, 0, 0];
    m.extend_from_slice(&rest);
    m.extend_from_slice(body);
    let c = csum(&m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}

/// An ICMPv6 message from `src` to `dst` (header + `body`), its checksum
/// computed over the pseudo-header (RFC 4443, 2.3).
pub fn icmp6(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    kind: u8,
    code: u8,
    rest: [u8; 4],
    body: &[u8],
) -> Vec<u8> {
    let mut m = vec![kind, code, 0, 0];
    m.extend_from_slice(&rest);
    m.extend_from_slice(body);
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&(m.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 58]);
    pseudo.extend_from_slice(&m);
    let c = csum(&pseudo);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}
