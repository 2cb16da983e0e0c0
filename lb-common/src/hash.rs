//! The flow hash: SipHash-1-3 keyed with a secret, over the client's side
//! of a [`FlowKey`].
//!
//! The hash picks a flow's slot in its VIP's table, and within one VIP the
//! destination address, port, protocol and family are the VIP's own, the
//! same for every flow of the table: only the client's address and port
//! vary. So the message is exactly those: 6 bytes for IPv4 (4 of address, 2
//! of port), 18 for IPv6. SipHash takes the length in, so the two families
//! are different messages. 6 bytes fit SipHash's last block with the
//! length: one compression round and the three final ones, where the 16
//! bytes of the whole IPv4 5-tuple took three (IPv6: three instead of six).
//! The same PRF on fewer bytes: still keyed, still uniform.
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
    siphash13_tail(key, words, 0, 0)
}

/// SipHash-1-3 of `words` (little-endian 8-byte blocks) followed by the
/// `tail_len` (< 8) low bytes of `tail` (the rest of `tail` zero): a
/// message of `8 * N + tail_len` bytes. Identical to the reference.
#[inline(always)]
pub fn siphash13_tail<const N: usize>(
    key: &[u64; 2],
    words: &[u64; N],
    tail: u64,
    tail_len: u8,
) -> u64 {
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
    let b = (((N as u64 * 8 + u64::from(tail_len)) & 0xff) << 56) | tail;
    v[3] ^= b;
    sipround(&mut v);
    v[0] ^= b;
    v[2] ^= 0xff;
    sipround(&mut v);
    sipround(&mut v);
    sipround(&mut v);
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// The low (`hi` false) or high 8 bytes of `a` as a little-endian word,
/// read with one load.
#[inline(always)]
fn le64(a: &[u8; 16], hi: bool) -> u64 {
    let half = if hi {
        a.last_chunk::<8>()
    } else {
        a.first_chunk::<8>()
    };
    u64::from_le_bytes(half.copied().unwrap_or_default())
}

/// The flow hash of `flow` under the secret `key`: SipHash-1-3 of the
/// client's address (4 or 16 bytes) then port (network order, as on the
/// wire).
#[inline(always)]
pub fn flow_hash(key: &[u64; 2], flow: &FlowKey) -> u64 {
    let (s, p) = (&flow.src, flow.sport.to_ne_bytes());
    if flow.family == crate::FAMILY_V4 {
        // The bytes [s0, s1, s2, s3, p0, p1, 0, 0], little-endian, built as
        // an address word and a port, one load each.
        let addr = u32::from_le_bytes(crate::v4_bytes(s));
        let tail = u64::from(addr) | (u64::from(u16::from_le_bytes(p)) << 32);
        siphash13_tail(key, &[], tail, 6)
    } else {
        let tail = u64::from(u16::from_le_bytes(p));
        siphash13_tail(key, &[le64(s, false), le64(s, true)], tail, 2)
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

    /// The message the flow hash must read: the client's address, then its
    /// port in network order.
    fn message(k: &FlowKey) -> Vec<u8> {
        let addr = if k.family == crate::FAMILY_V4 {
            &k.src[..4]
        } else {
            &k.src[..]
        };
        [addr, &k.sport.to_ne_bytes()[..]].concat()
    }

    #[test]
    fn matches_reference_siphash13() {
        let cases = [
            ("zero key, zero flow", [0, 0], FlowKey::default()),
            (
                "v4 tcp",
                [0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908],
                FlowKey::new(
                    "10.0.0.1:40000".parse().unwrap(),
                    "10.0.0.100:80".parse().unwrap(),
                    crate::PROTO_TCP,
                ),
            ),
            (
                "v6 udp",
                [u64::MAX, 1],
                FlowKey::new(
                    "[fd00::1]:53".parse().unwrap(),
                    "[fd00::64]:5353".parse().unwrap(),
                    crate::PROTO_UDP,
                ),
            ),
        ];
        for (name, key, flow) in cases {
            assert_eq!(
                flow_hash(&key, &flow),
                reference(&key, &message(&flow)),
                "{name}"
            );
        }
        // Whole blocks and every tail length, against the reference.
        let bytes: Vec<u8> = (0u8..40).collect();
        for len in 0..=24 {
            let m = &bytes[..len];
            let words: Vec<u64> = m
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let rest = m.chunks_exact(8).remainder();
            let mut t = [0u8; 8];
            t[..rest.len()].copy_from_slice(rest);
            let (tail, tl) = (u64::from_le_bytes(t), rest.len() as u8);
            let key = [0x1111, 0x2222];
            let h = match words.len() {
                0 => siphash13_tail(&key, &[], tail, tl),
                1 => siphash13_tail(&key, &[words[0]], tail, tl),
                2 => siphash13_tail(&key, &[words[0], words[1]], tail, tl),
                _ => siphash13_tail(&key, &[words[0], words[1], words[2]], tail, tl),
            };
            assert_eq!(h, reference(&key, m), "{len} bytes");
        }
    }

    /// Every byte of the client's address and port moves the hash; the
    /// VIP's side (destination, its port, protocol) is the same for every
    /// flow of a table and is not read.
    #[test]
    fn hash_reads_the_client_side_only() {
        for (client, vip) in [
            ("192.0.2.1:40000", "10.100.0.1:80"),
            ("[2001:db8::1]:40000", "[fd00::1]:80"),
        ] {
            let base = FlowKey::new(
                client.parse().unwrap(),
                vip.parse().unwrap(),
                crate::PROTO_TCP,
            );
            let key = [0x1234, 0x5678];
            let h = flow_hash(&key, &base);
            let len = if base.family == crate::FAMILY_V4 {
                4
            } else {
                16
            };
            for i in 0..len {
                let mut f = base;
                f.src[i] ^= 1;
                assert_ne!(flow_hash(&key, &f), h, "{client}: src byte {i}");
            }
            for sport in [base.sport ^ 1, base.sport ^ 0x100] {
                let f = FlowKey { sport, ..base };
                assert_ne!(flow_hash(&key, &f), h, "{client}: sport");
            }
            let mut f = base;
            f.dst[0] ^= 1;
            f.dport ^= 1;
            f.proto = crate::PROTO_UDP;
            assert_eq!(flow_hash(&key, &f), h, "{client}: the VIP's side");
        }
        // The same first bytes as IPv6 are another message: another hash.
        let v4 = FlowKey::new(
            "192.0.2.1:40000".parse().unwrap(),
            "10.100.0.1:80".parse().unwrap(),
            crate::PROTO_TCP,
        );
        let v6 = FlowKey {
            family: crate::FAMILY_V6,
            ..v4
        };
        assert_ne!(flow_hash(&[1, 2], &v4), flow_hash(&[1, 2], &v6));
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
