//! The flow hash: SipHash-1-3 keyed with a secret, over a [`FlowKey`].
//!
//! An IPv4 flow is hashed as 16 bytes (both addresses, both ports,
//! protocol, family), not as the 40 bytes of its key whose 24 address bytes
//! past the IPv4 ones are always zero: two compression rounds instead of
//! five, the same PRF (SipHash takes the message length in), so it stays
//! keyed and uniform. IPv6 flows are hashed as their 40 bytes.
//!
//! SipHash is a PRF, so without the key nobody can choose source ports that
//! land on one backend (a keyed jhash, as in Katran, can be inverted). The
//! kernel and userspace run this same code, so `xlb explain` predicts the
//! data plane exactly.

use crate::FlowKey;

#[inline(always)]
fn sipround(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13);
    v[1] ^= v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16);
    v[3] ^= v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21);
    v[3] ^= v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17);
    v[1] ^= v[2];
    v[2] = v[2].rotate_left(32);
}

/// SipHash-1-3 of `words` (little-endian 8-byte blocks; the message length is
/// `8 * N` bytes), keyed with `key`. Identical to the reference SipHash-1-3
/// of the same bytes.
#[inline(always)]
pub fn siphash13<const N: usize>(key: &[u64; 2], words: &[u64; N]) -> u64 {
    let mut v = [
        key[0] ^ 0x736f_6d65_7073_6575,
        key[1] ^ 0x646f_7261_6e64_6f6d,
        key[0] ^ 0x6c79_6765_6e65_7261,
        key[1] ^ 0x7465_6462_7974_6573,
    ];
    let mut i = 0;
    while i < N {
        let m = words[i];
        v[3] ^= m;
        sipround(&mut v);
        v[0] ^= m;
        i += 1;
    }
    let b = ((N as u64 * 8) & 0xff) << 56;
    v[3] ^= b;
    sipround(&mut v);
    v[0] ^= b;
    v[2] ^= 0xff;
    sipround(&mut v);
    sipround(&mut v);
    sipround(&mut v);
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

#[inline(always)]
fn le64(a: &[u8; 16], hi: bool) -> u64 {
    let o = if hi { 8 } else { 0 };
    u64::from_le_bytes([
        a[o],
        a[o + 1],
        a[o + 2],
        a[o + 3],
        a[o + 4],
        a[o + 5],
        a[o + 6],
        a[o + 7],
    ])
}

impl FlowKey {
    /// The five little-endian words the flow hash reads: exactly the 40
    /// bytes of the key as laid out in memory.
    #[inline(always)]
    pub fn words(&self) -> [u64; 5] {
        [
            le64(&self.src, false),
            le64(&self.src, true),
            le64(&self.dst, false),
            le64(&self.dst, true),
            self.tail_word(),
        ]
    }

    /// The two little-endian words an IPv4 flow is hashed as: the 4-byte
    /// source and destination, then the last 8 bytes of the key (ports,
    /// protocol, family, padding), i.e. the key's bytes 0..4, 16..20 and
    /// 32..40.
    #[inline(always)]
    pub fn words_v4(&self) -> [u64; 2] {
        let (s, d) = (&self.src, &self.dst);
        [
            u64::from_le_bytes([s[0], s[1], s[2], s[3], d[0], d[1], d[2], d[3]]),
            self.tail_word(),
        ]
    }

    /// The key's last 8 bytes (ports, protocol, family, padding) as one
    /// little-endian word.
    #[inline(always)]
    fn tail_word(&self) -> u64 {
        let (sport, dport) = (self.sport.to_ne_bytes(), self.dport.to_ne_bytes());
        u64::from_le_bytes([
            sport[0],
            sport[1],
            dport[0],
            dport[1],
            self.proto,
            self.family,
            self._pad[0],
            self._pad[1],
        ])
    }
}

/// The flow hash of `flow` under the secret `key`.
#[inline(always)]
pub fn flow_hash(key: &[u64; 2], flow: &FlowKey) -> u64 {
    if flow.family == crate::FAMILY_V4 {
        siphash13(key, &flow.words_v4())
    } else {
        siphash13(key, &flow.words())
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use core::hash::Hasher as _;
    use siphasher::sip::SipHasher13;
    use std::vec::Vec;

    fn reference(key: &[u64; 2], bytes: &[u8]) -> u64 {
        let mut h = SipHasher13::new_with_keys(key[0], key[1]);
        h.write(bytes);
        h.finish()
    }

    fn key_bytes(k: &FlowKey) -> Vec<u8> {
        // SAFETY: FlowKey is repr(C), 40 bytes, no implicit padding.
        let p = k as *const FlowKey as *const u8;
        unsafe { core::slice::from_raw_parts(p, core::mem::size_of::<FlowKey>()) }.to_vec()
    }

    #[test]
    fn matches_reference_siphash13() {
        let cases = [
            ("zero key, zero flow", [0, 0], FlowKey::default()),
            (
                "v4 tcp",
                [0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908],
                FlowKey {
                    src: [10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    dst: [10, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    sport: 40000u16.to_be(),
                    dport: 80u16.to_be(),
                    proto: crate::PROTO_TCP,
                    family: crate::FAMILY_V4,
                    _pad: [0; 2],
                },
            ),
            (
                "v6 udp",
                [u64::MAX, 1],
                FlowKey {
                    src: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                    dst: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x64],
                    sport: 53u16.to_be(),
                    dport: 5353u16.to_be(),
                    proto: crate::PROTO_UDP,
                    family: crate::FAMILY_V6,
                    _pad: [0; 2],
                },
            ),
        ];
        for (name, key, flow) in cases {
            // IPv4: the 16 bytes of `words_v4`, taken from the key's memory.
            let bytes = key_bytes(&flow);
            let message = if flow.family == crate::FAMILY_V4 {
                [&bytes[0..4], &bytes[16..20], &bytes[32..40]].concat()
            } else {
                bytes
            };
            assert_eq!(flow_hash(&key, &flow), reference(&key, &message), "{name}");
        }
    }

    /// The IPv4 words leave out only bytes that are zero in every IPv4 key;
    /// every byte they read moves the hash.
    #[test]
    fn ipv4_words_cover_every_meaningful_byte() {
        let base = FlowKey::new(
            "192.0.2.1:40000".parse().unwrap(),
            "10.100.0.1:80".parse().unwrap(),
            crate::PROTO_TCP,
        );
        let key = [0x1234, 0x5678];
        let h = flow_hash(&key, &base);
        for i in 0..4 {
            let mut f = base;
            f.src[i] ^= 1;
            assert_ne!(flow_hash(&key, &f), h, "src byte {i}");
            let mut f = base;
            f.dst[i] ^= 1;
            assert_ne!(flow_hash(&key, &f), h, "dst byte {i}");
        }
        let mut f = base;
        f.dport = 81u16.to_be();
        assert_ne!(flow_hash(&key, &f), h, "dport");
        let mut f = base;
        f.proto = crate::PROTO_UDP;
        assert_ne!(flow_hash(&key, &f), h, "proto");
        // The same bytes as IPv6 are another message: another hash.
        let mut f = base;
        f.family = crate::FAMILY_V6;
        assert_ne!(flow_hash(&key, &f), h, "family");
    }

    #[test]
    fn key_changes_the_hash() {
        let flow = FlowKey {
            sport: 1234,
            ..FlowKey::default()
        };
        assert_ne!(flow_hash(&[1, 2], &flow), flow_hash(&[1, 3], &flow));
    }

    #[test]
    fn ports_change_the_hash() {
        let a = FlowKey {
            sport: 1,
            ..FlowKey::default()
        };
        let b = FlowKey {
            sport: 2,
            ..FlowKey::default()
        };
        assert_ne!(flow_hash(&[7, 7], &a), flow_hash(&[7, 7], &b));
    }
}
