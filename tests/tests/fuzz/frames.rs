//! The frames the XDP fuzzer sends: built from the fixture world's VIPs
//! (mostly well-formed, with one field at a time made wrong), then mutated
//! (bit flips, bytes set, truncation, bytes added or removed), plus plain
//! random bytes and, now and then, one frame cut at every byte. All from
//! one seeded generator, so a seed replays a run.

use std::collections::VecDeque;

use rand::{Rng, RngCore, seq::SliceRandom as _};

use crate::model::{VIP4, VIP4_EMPTY, VIP4_L2, VIP4_NONEIGH, VIP4_OTHER_IF, VIP6, VIP6_L2};

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const ETH_P_ARP: u16 = 0x0806;

/// IPv6 extension headers (the data plane passes them) and a few others.
const V6_NEXT: [u8; 10] = [0, 43, 60, 51, 135, 139, 140, 44, 50, 59];

/// Destination ports worth hitting: the VIPs' and their neighbours.
const PORTS: [u16; 6] = [80, 53, 443, 22, 0, 65535];

/// SplitMix64: fast enough in a debug build (where `StdRng`'s ChaCha is
/// most of a frame's cost), and every seed gives its own stream.
pub(crate) struct SplitMix(u64);

impl RngCore for SplitMix {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

pub(crate) struct Frames {
    rng: SplitMix,
    /// Frames still to hand out (the prefixes of a frame cut at every byte).
    queue: VecDeque<Vec<u8>>,
}

fn v4(a: &[u8]) -> [u8; 4] {
    a.try_into().unwrap()
}

fn v6(a: &[u8]) -> [u8; 16] {
    a.try_into().unwrap()
}

/// The LB's own addresses (`harness::LB_V4`, `LB_V6`).
const LB4: &[u8] = &[10, 0, 0, 1];
const LB6: &[u8] = &[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const CLIENT6: &[u8] = &[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

impl Frames {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            rng: SplitMix(seed),
            queue: VecDeque::new(),
        }
    }

    /// The next frame (at least 14 bytes, at most 3,000).
    pub(crate) fn next_frame(&mut self) -> Vec<u8> {
        if let Some(f) = self.queue.pop_front() {
            return f;
        }
        let r = self.rng.gen_range(0..1000);
        let mut f = if r < 60 {
            self.random_bytes()
        } else {
            self.structured()
        };
        if r >= 60 && self.rng.gen_bool(0.35) {
            self.mutate(&mut f);
        }
        if self.rng.gen_range(0..200) == 0 {
            // The same frame cut at every byte from the end of the Ethernet
            // header on (the kernel refuses shorter input).
            for n in 14..f.len() {
                self.queue.push_back(f[..n].to_vec());
            }
        }
        if f.len() < 14 {
            f.resize(14, 0);
        }
        f.truncate(3000);
        f
    }

    fn random_bytes(&mut self) -> Vec<u8> {
        let n = self.rng.gen_range(14..160);
        let mut f = vec![0u8; n];
        self.rng.fill_bytes(&mut f);
        if self.rng.gen_bool(0.7) {
            let et = *[ETH_P_IP, ETH_P_IPV6, ETH_P_8021Q]
                .choose(&mut self.rng)
                .unwrap();
            f[12..14].copy_from_slice(&et.to_be_bytes());
        }
        f
    }

    fn structured(&mut self) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02];
        match self.rng.gen_range(0..100) {
            0..80 => {}
            80..92 => push_tag(&mut f, ETH_P_8021Q, self.rng.gen_range(0..4096)),
            92..96 => {
                push_tag(&mut f, ETH_P_8021Q, 10);
                push_tag(&mut f, ETH_P_8021Q, 20);
            }
            _ => push_tag(&mut f, ETH_P_8021AD, 30),
        }
        let (et, l3) = match self.rng.gen_range(0..100) {
            0..55 => (ETH_P_IP, self.ipv4()),
            55..95 => (ETH_P_IPV6, self.ipv6()),
            _ => {
                let et = if self.rng.gen_bool(0.5) {
                    ETH_P_ARP
                } else {
                    self.rng.r#gen()
                };
                (et, self.payload(28))
            }
        };
        f.extend_from_slice(&et.to_be_bytes());
        f.extend_from_slice(&l3);
        if self.rng.gen_range(0..10) == 0 {
            // Ethernet padding or junk after the IP packet.
            let pad = self.rng.gen_range(1..40);
            f.extend((0..pad).map(|_| 0u8));
        }
        f
    }

    fn payload(&mut self, max: usize) -> Vec<u8> {
        let n = if self.rng.gen_range(0..20) == 0 {
            // Big enough that encapsulation exceeds the MTU.
            self.rng.gen_range(1400..1600)
        } else {
            self.rng.gen_range(0..=max)
        };
        let mut p = vec![0u8; n];
        self.rng.fill_bytes(&mut p);
        p
    }

    fn dst4(&mut self) -> [u8; 4] {
        match self.rng.gen_range(0..100) {
            0..65 => {
                v4([VIP4, VIP4_L2, VIP4_EMPTY, VIP4_NONEIGH, VIP4_OTHER_IF]
                    [self.rng.gen_range(0..5)])
            }
            65..80 => v4(LB4),
            _ => self.rng.r#gen(),
        }
    }

    fn dst6(&mut self) -> [u8; 16] {
        match self.rng.gen_range(0..100) {
            0..65 => v6([VIP6, VIP6_L2][self.rng.gen_range(0..2)]),
            65..80 => v6(LB6),
            _ => self.rng.r#gen(),
        }
    }

    fn src4(&mut self) -> [u8; 4] {
        if self.rng.gen_bool(0.8) {
            [192, 0, 2, self.rng.r#gen()]
        } else {
            self.rng.r#gen()
        }
    }

    fn src6(&mut self) -> [u8; 16] {
        let mut a = v6(CLIENT6);
        a[14] = self.rng.r#gen();
        a[15] = self.rng.r#gen();
        if self.rng.gen_bool(0.2) {
            a = self.rng.r#gen();
        }
        a
    }

    fn port(&mut self) -> u16 {
        if self.rng.gen_bool(0.75) {
            *PORTS.choose(&mut self.rng).unwrap()
        } else {
            self.rng.r#gen()
        }
    }

    /// A TCP or UDP header and payload, its lengths sometimes wrong.
    fn l4(&mut self, proto: u8) -> Vec<u8> {
        let sport: u16 = self.rng.gen_range(1024..=65535);
        let dport = self.port();
        let mut h = Vec::new();
        h.extend_from_slice(&sport.to_be_bytes());
        h.extend_from_slice(&dport.to_be_bytes());
        let body = self.payload(40);
        if proto == 6 {
            h.extend_from_slice(&self.rng.r#gen::<[u8; 8]>());
            let doff: u8 = if self.rng.gen_range(0..12) == 0 {
                self.rng.gen_range(0..16)
            } else {
                5 + self.rng.gen_range(0..2) * self.rng.gen_range(0..4)
            };
            let flags = match self.rng.gen_range(0..4) {
                0 => 0x02,
                1 => 0x10,
                2 => 0x18,
                _ => self.rng.r#gen(),
            };
            h.extend_from_slice(&[doff << 4, flags, 0xff, 0xff, 0, 0, 0, 0]);
            let opts = (usize::from(doff) * 4).saturating_sub(20);
            h.extend((0..opts).map(|_| 1u8));
        } else {
            let mut ulen = (8 + body.len()) as u16;
            if self.rng.gen_range(0..10) == 0 {
                ulen = self.rng.r#gen::<u16>() % 80;
            }
            h.extend_from_slice(&ulen.to_be_bytes());
            h.extend_from_slice(&[0, 0]);
        }
        h.extend_from_slice(&body);
        h
    }

    /// An ICMP (or ICMPv6) message: echo, an error quoting a packet sent
    /// from a VIP (or from elsewhere), or another kind.
    fn icmp(&mut self, v6: bool, vip_src: &[u8]) -> Vec<u8> {
        let (echo, errors): (u8, &[u8]) = if v6 { (128, &[1, 2, 3]) } else { (8, &[3, 11]) };
        let kind = match self.rng.gen_range(0..10) {
            0..3 => echo,
            3..8 => *errors.choose(&mut self.rng).unwrap(),
            _ => self.rng.r#gen(),
        };
        let mut m = vec![kind, self.rng.gen_range(0..5), 0, 0];
        m.extend_from_slice(&self.rng.r#gen::<[u8; 4]>());
        if kind == echo {
            m.extend_from_slice(&self.payload(32));
            return m;
        }
        // The quoted packet: a backend's reply from the VIP to a client.
        let proto = if self.rng.gen_bool(0.5) { 6 } else { 17 };
        let sport = *[80u16, 53, 443].choose(&mut self.rng).unwrap();
        let mut q = Vec::new();
        if v6 {
            q.extend_from_slice(&[0x60, 0, 0, 0, 0, 20, proto, 64]);
            let src = if self.rng.gen_bool(0.8) {
                vip_src.to_vec()
            } else {
                self.dst6().to_vec()
            };
            q.extend_from_slice(&src);
            q.extend_from_slice(&self.src6());
        } else {
            let vihl = if self.rng.gen_bool(0.9) {
                0x45
            } else {
                self.rng.r#gen()
            };
            q.extend_from_slice(&[vihl, 0, 0, 40, 0, 0, 0x40, 0, 64, proto, 0, 0]);
            let src = if self.rng.gen_bool(0.8) {
                vip_src.to_vec()
            } else {
                self.dst4().to_vec()
            };
            q.extend_from_slice(&src);
            q.extend_from_slice(&self.src4());
        }
        q.extend_from_slice(&sport.to_be_bytes());
        q.extend_from_slice(&self.rng.gen_range(1024u16..=65535).to_be_bytes());
        q.extend_from_slice(&self.rng.r#gen::<[u8; 4]>());
        let keep = if self.rng.gen_range(0..8) == 0 {
            self.rng.gen_range(0..q.len())
        } else {
            q.len()
        };
        m.extend_from_slice(&q[..keep]);
        m
    }

    fn ipv4(&mut self) -> Vec<u8> {
        let dst = self.dst4();
        let proto = match self.rng.gen_range(0..100) {
            0..35 => 6,
            35..60 => 17,
            60..82 => 1,
            82..88 => 4,
            88..91 => 41,
            _ => self.rng.r#gen(),
        };
        let body = match proto {
            6 | 17 => self.l4(proto),
            1 => self.icmp(false, &dst),
            4 => {
                let mut inner = self.ipv4_header(6, 40);
                inner.extend_from_slice(&self.l4(6));
                inner
            }
            _ => self.payload(40),
        };
        let ihl = match self.rng.gen_range(0..40) {
            0..2 => self.rng.gen_range(0..5),
            2..5 => self.rng.gen_range(6..16),
            _ => 5,
        };
        let mut h = self.ipv4_header(proto, 0);
        h[0] = if self.rng.gen_range(0..60) == 0 {
            self.rng.r#gen::<u8>() & 0xf0 | ihl
        } else {
            0x40 | ihl
        };
        h[16..20].copy_from_slice(&dst);
        let opts = (usize::from(ihl) * 4).saturating_sub(20);
        h.extend((0..opts).map(|i| if i + 1 == opts { 0 } else { 1 }));
        let mut tot = (h.len() + body.len()) as u16;
        if self.rng.gen_range(0..12) == 0 {
            tot = self.rng.r#gen::<u16>() % (tot + 40);
        }
        h[2..4].copy_from_slice(&tot.to_be_bytes());
        let frag: u16 = match self.rng.gen_range(0..20) {
            0 => 0x2000,
            1 => self.rng.gen_range(1..0x2000),
            2 => 0x2000 | self.rng.gen_range(1..0x2000),
            3..12 => 0x4000,
            _ => 0,
        };
        h[6..8].copy_from_slice(&frag.to_be_bytes());
        h.extend_from_slice(&body);
        h
    }

    /// A 20-byte IPv4 header from a client to `dst4()`, total length
    /// `payload` more than the header.
    fn ipv4_header(&mut self, proto: u8, payload: u16) -> Vec<u8> {
        let mut h = vec![0x45, 0];
        h.extend_from_slice(&(20 + payload).to_be_bytes());
        h.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0]);
        h.extend_from_slice(&self.src4());
        h.extend_from_slice(&self.dst4());
        h
    }

    fn ipv6(&mut self) -> Vec<u8> {
        let dst = self.dst6();
        let next = match self.rng.gen_range(0..100) {
            0..35 => 6,
            35..55 => 17,
            55..75 => 58,
            75..90 => *V6_NEXT.choose(&mut self.rng).unwrap(),
            90..94 => 41,
            _ => self.rng.r#gen(),
        };
        let body = match next {
            6 | 17 => self.l4(next),
            58 => self.icmp(true, &dst),
            0 | 43 | 60 | 44 | 135 | 139 | 140 => {
                // One extension header (8 bytes), then TCP.
                let mut e = vec![6, 0];
                e.extend_from_slice(&self.rng.r#gen::<[u8; 6]>());
                e.extend_from_slice(&self.l4(6));
                e
            }
            _ => self.payload(40),
        };
        let vtf = if self.rng.gen_range(0..60) == 0 {
            self.rng.r#gen()
        } else {
            0x60
        };
        let mut h = vec![vtf, 0, 0, 0];
        let mut plen = body.len() as u16;
        if self.rng.gen_range(0..12) == 0 {
            plen = self.rng.r#gen::<u16>() % (plen + 40);
        }
        h.extend_from_slice(&plen.to_be_bytes());
        h.extend_from_slice(&[next, 64]);
        h.extend_from_slice(&self.src6());
        h.extend_from_slice(&dst);
        h.extend_from_slice(&body);
        h
    }

    /// One to four random changes, some at the offsets parsers read.
    fn mutate(&mut self, f: &mut Vec<u8>) {
        for _ in 0..self.rng.gen_range(1..=4) {
            if f.is_empty() {
                return;
            }
            let at = self.rng.gen_range(0..f.len());
            match self.rng.gen_range(0..6) {
                0 => f[at] ^= 1 << self.rng.gen_range(0..8),
                1 => f[at] = self.rng.r#gen(),
                2 => {
                    // A header field: version/IHL, lengths, fragment bits,
                    // protocol, behind zero or one tag.
                    let l3 = if self.rng.gen_bool(0.8) { 14 } else { 18 };
                    let off = l3
                        + [0, 2, 3, 4, 5, 6, 7, 9, 20, 32, 33, 40, 46, 47, 53]
                            [self.rng.gen_range(0..15)];
                    if off < f.len() {
                        f[off] = *[0u8, 0xff, 0x45, 0x46, 0x60, 0x40, 0x20, 6, 17, 1, 58, 44, 0]
                            .choose(&mut self.rng)
                            .unwrap();
                    }
                }
                3 => f.truncate(at),
                4 => {
                    let n = self.rng.gen_range(1..16);
                    let mut junk = [0u8; 16];
                    self.rng.fill_bytes(&mut junk[..n]);
                    f.extend_from_slice(&junk[..n]);
                }
                _ => {
                    let end = (at + self.rng.gen_range(1..8)).min(f.len());
                    f.drain(at..end);
                }
            }
        }
    }
}

fn push_tag(f: &mut Vec<u8>, tpid: u16, vid: u16) {
    f.extend_from_slice(&tpid.to_be_bytes());
    f.extend_from_slice(&vid.to_be_bytes());
}
