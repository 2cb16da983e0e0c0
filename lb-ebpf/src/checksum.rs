//! Checksums of the headers the programs write. Only the outer IPv4 header
//! of `dsr-ipip` needs one: the inner packet is untouched, IPv6 has no
//! header checksum, and `dsr-l2` changes only MACs.

use crate::packet::{IPV4_LEN, Ipv4Hdr};

/// The checksum of `h` (its `check` field zero), host order: the one's
/// complement of the one's complement sum of its ten 16-bit words (RFC 791).
#[inline(always)]
pub(crate) fn ipv4_header(h: &Ipv4Hdr) -> u16 {
    // SAFETY: `Ipv4Hdr` is `repr(C)`, 20 bytes of byte fields, alignment 1.
    let b = unsafe { &*(h as *const Ipv4Hdr as *const [u8; IPV4_LEN]) };
    let mut sum: u32 = 0;
    let mut i = 0;
    while i < IPV4_LEN {
        sum += u32::from(u16::from_be_bytes([b[i], b[i + 1]]));
        i += 2;
    }
    fold(sum)
}

/// Folds a 32-bit one's complement sum to 16 bits and complements it.
#[inline(always)]
fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}
