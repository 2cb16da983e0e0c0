//! Abuse control's shared types: each VIP's guard settings, the deny and
//! allow tries' keys and values, the per-source LRU, the per-CPU conntrack
//! insert window, and the prefix mask both sides key sources by.

use crate::Addr;

/// Entries of each deny/allow trie and of `XLB_LIST_HITS`: list entries
/// (rules) get ids below this, shared by the four tries.
pub const MAX_LIST_RULES: u32 = 262_144;

/// Entries of `XLB_SOURCES`: the sources (prefixes) tracked per VIP. An LRU,
/// so a source that keeps sending stays while one-off sources age out.
pub const MAX_SOURCES: u32 = 65_536;

/// [`ListV4::scope`] / [`ListV6::scope`] of entries that apply to every VIP
/// (otherwise the scope is the VIP id).
pub const SCOPE_GLOBAL: u32 = u32::MAX;

/// Bits of [`VipGuard::flags`].
/// The VIP's deny list or the global one has entries: judge new flows
/// against the lists.
pub const GUARD_LISTS: u32 = 1;
/// `new_flows_per_source` is set: admit new flows through each source's
/// token bucket.
pub const GUARD_LIMIT: u32 = 2;
/// Count new flows and (sampled) packets per source in `XLB_SOURCES` for
/// `xlb sources`, without limiting.
pub const GUARD_TRACK: u32 = 4;

/// Actions of a list entry or a limit: drop, or answer a TCP SYN with a RST
/// (anything else is dropped).
pub const ACTION_DROP: u8 = 1;
pub const ACTION_RESET: u8 = 2;

/// One established packet in this many (per CPU, by the `ct_hit` counter)
/// is counted in its source's `packets`, weighted by this number: packet
/// rates per source cost the established path one branch.
pub const SOURCE_SAMPLE: u64 = 64;

/// Value of `XLB_GUARD` (array by VIP id): what new flows to the VIP are
/// judged by. Read on new flows and conntrack misses only.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VipGuard {
    /// [`GUARD_LISTS`] | [`GUARD_LIMIT`] | [`GUARD_TRACK`].
    pub flags: u32,
    /// [`ACTION_DROP`] or [`ACTION_RESET`] for flows over the rate.
    pub limit_action: u8,
    /// Prefix length a source is keyed by: IPv4 (default 32), IPv6 (default 64).
    pub v4_prefix: u8,
    pub v6_prefix: u8,
    pub _pad: u8,
    /// Token bucket as GCRA: ns between admitted new flows (1e9 / rate).
    pub interval_ns: u64,
    /// How far ahead of now a source's theoretical arrival time may run:
    /// (burst − 1) × `interval_ns`.
    pub tolerance_ns: u64,
    /// Conntrack inserts per second per CPU (the daemon writes the one global
    /// setting into every VIP's entry, so a new flow reads one entry);
    /// 0 = no cap.
    pub ct_insert_cap: u64,
}
const _: () = assert!(core::mem::size_of::<VipGuard>() == 32);

/// Data of an IPv4 deny/allow trie key (`XLB_DENY_V4`, `XLB_ALLOW_V4`). The
/// LPM prefix length counts the 32 bits of `scope` plus the address bits, so
/// one trie holds every VIP's list and the global one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ListV4 {
    /// VIP id or [`SCOPE_GLOBAL`], network order.
    pub scope: [u8; 4],
    pub addr: [u8; 4],
}
const _: () = assert!(core::mem::size_of::<ListV4>() == 8);

/// Data of an IPv6 trie key; see [`ListV4`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ListV6 {
    pub scope: [u8; 4],
    pub addr: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<ListV6>() == 20);

/// Bits of a deny/allow trie key before the address: the scope. A key's
/// LPM prefix length is this plus the address prefix's.
pub const LIST_SCOPE_BITS: u32 = 32;

/// The data of a deny/allow trie key, either family: the scope (VIP id or
/// [`SCOPE_GLOBAL`]) comes first, then the address.
pub trait ListData: Copy {
    /// The key of `addr` in `scope`.
    fn new(scope: u32, addr: &Addr) -> Self;
    /// The same address in another scope.
    fn set_scope(&mut self, scope: u32);
}

impl ListData for ListV4 {
    #[inline(always)]
    fn new(scope: u32, addr: &Addr) -> Self {
        ListV4 {
            scope: scope.to_be_bytes(),
            addr: [addr[0], addr[1], addr[2], addr[3]],
        }
    }

    #[inline(always)]
    fn set_scope(&mut self, scope: u32) {
        self.scope = scope.to_be_bytes();
    }
}

impl ListData for ListV6 {
    #[inline(always)]
    fn new(scope: u32, addr: &Addr) -> Self {
        ListV6 {
            scope: scope.to_be_bytes(),
            addr: *addr,
        }
    }

    #[inline(always)]
    fn set_scope(&mut self, scope: u32) {
        self.scope = scope.to_be_bytes();
    }
}

/// Value of the deny/allow tries.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListEntry {
    /// Index of the entry's hit counter in `XLB_LIST_HITS` (< [`MAX_LIST_RULES`]).
    pub rule: u32,
    /// [`ACTION_DROP`] or [`ACTION_RESET`] (deny lists).
    pub action: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<ListEntry>() == 8);

/// Key of `XLB_SOURCES`: a source prefix as seen by one VIP. Aligned to 8,
/// the same layout: built on the BPF stack from 8-byte words, it must sit
/// where they are aligned (the verifier's rule, `lb-ebpf/src/key.rs`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceKey {
    /// The source address masked to `prefix_len` bits (see [`Addr`]).
    pub addr: Addr,
    pub vip_id: u32,
    pub prefix_len: u8,
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<SourceKey>() == 24);

impl SourceKey {
    /// The key of source `src` (see [`Addr`]) of `family` as VIP `vip_id`
    /// keys it: the address masked to `v4_prefix` or `v6_prefix` bits.
    #[inline(always)]
    pub fn new(vip_id: u32, src: &Addr, family: u8, v4_prefix: u8, v6_prefix: u8) -> Self {
        let prefix_len = if family == crate::FAMILY_V4 {
            v4_prefix
        } else {
            v6_prefix
        };
        SourceKey {
            addr: mask_addr(src, prefix_len),
            vip_id,
            prefix_len,
            family,
            _pad: [0; 2],
        }
    }
}

/// Value of `XLB_SOURCES`. Shared by all CPUs: the counters are added to
/// with atomic adds, and the bucket is a single theoretical arrival time
/// (GCRA) advanced with an atomic add, so no admission goes uncharged.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceState {
    /// GCRA theoretical arrival time, `bpf_ktime_get_coarse_ns` clock.
    pub tat_ns: u64,
    /// New flows seen (admitted or not).
    pub new_flows: u64,
    /// New flows refused by the rate limit.
    pub limited: u64,
    /// Packets: new flows, misses, and established packets sampled one in
    /// [`SOURCE_SAMPLE`] (weighted).
    pub packets: u64,
    /// Flows confirmed by the client: counted once per conntrack entry, at
    /// the first packet that hits it and could only follow a handshake (see
    /// [`CT_FLAG_ESTABLISHED`]). What `auto_block` judges: a flood of SYNs
    /// with a forged source never counts here.
    pub established: u64,
}
const _: () = assert!(core::mem::size_of::<SourceState>() == 40);

/// [`crate::CtEntry::flags`]: the flow was counted in its source's
/// [`SourceState::established`]: the first packet to hit the entry was a
/// TCP ACK without SYN, FIN or RST (the third packet of a handshake), or
/// any UDP packet (a flow's second packet). Set once, so a flow counts
/// once. Only the client's half of a DSR connection reaches the load
/// balancer, so this is the cheapest sign of a handshake it can observe:
/// a flood of bare SYNs never sets it, but a spoofer who sends, for each
/// SYN, a blind ACK of the same 5-tuple does (README, security model).
pub const CT_FLAG_ESTABLISHED: u32 = 2;

/// Value of `XLB_CT_RATE` (per-CPU array of one): this CPU's conntrack
/// inserts in the current one-second window.
/// `XLB_CT_RATE` slot of conntrack inserts.
pub const CT_RATE_CONNTRACK: u32 = 0;
/// `XLB_CT_RATE` slot of new NAT flows: a budget of their own under the
/// same cap, so a flood at a DSR VIP does not refuse a NAT VIP's clients,
/// nor the reverse.
pub const CT_RATE_NAT: u32 = 1;
/// Slots of `XLB_CT_RATE`.
pub const CT_RATE_SLOTS: u32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtRate {
    pub window_start_ns: u64,
    pub inserts: u64,
}
const _: () = assert!(core::mem::size_of::<CtRate>() == 16);

/// Masks `addr` (see [`Addr`]) to its first `bits` bits.
#[inline(always)]
pub fn mask_addr(addr: &Addr, bits: u8) -> Addr {
    // Two big-endian words and two masks: a handful of instructions in BPF,
    // where a byte loop was sixteen steps.
    let word = |o: usize| {
        u64::from_be_bytes([
            addr[o],
            addr[o + 1],
            addr[o + 2],
            addr[o + 3],
            addr[o + 4],
            addr[o + 5],
            addr[o + 6],
            addr[o + 7],
        ])
    };
    let mask = |b: u32| match b {
        0 => 0,
        1..=63 => u64::MAX << (64 - b),
        _ => u64::MAX,
    };
    let bits = u32::from(bits);
    let hi = (word(0) & mask(bits.min(64))).to_be_bytes();
    let lo = (word(8) & mask(bits.saturating_sub(64))).to_be_bytes();
    [
        hi[0], hi[1], hi[2], hi[3], hi[4], hi[5], hi[6], hi[7], lo[0], lo[1], lo[2], lo[3], lo[4],
        lo[5], lo[6], lo[7],
    ]
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: each is repr(C), Copy, and every byte pattern is a valid value
    // (integers and byte arrays only, padding explicit).
    unsafe impl aya::Pod for VipGuard {}
    unsafe impl aya::Pod for ListV4 {}
    unsafe impl aya::Pod for ListV6 {}
    unsafe impl aya::Pod for ListEntry {}
    unsafe impl aya::Pod for SourceKey {}
    unsafe impl aya::Pod for SourceState {}
    unsafe impl aya::Pod for CtRate {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_addr_keeps_the_prefix_bits_only() {
        let a = [0xffu8; 16];
        let cases: [(u8, [u8; 4]); 6] = [
            (0, [0, 0, 0, 0]),
            (8, [0xff, 0, 0, 0]),
            (12, [0xff, 0xf0, 0, 0]),
            (24, [0xff, 0xff, 0xff, 0]),
            (31, [0xff, 0xff, 0xff, 0xfe]),
            (32, [0xff, 0xff, 0xff, 0xff]),
        ];
        for (bits, want) in cases {
            let m = mask_addr(&a, bits);
            assert_eq!(&m[..4], &want, "/{bits}");
            assert!(m[4..].iter().all(|&b| b == 0), "/{bits}");
        }
        let v6 = mask_addr(&a, 64);
        assert_eq!(v6[..8], [0xff; 8]);
        assert_eq!(v6[8..], [0; 8]);
        let v6 = mask_addr(&a, 65);
        assert_eq!(
            v6[..9],
            [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x80]
        );
        assert_eq!(v6[9..], [0; 7]);
        assert_eq!(mask_addr(&a, 128), a);
        assert_eq!(mask_addr(&a, 200), a);
        // Against the definition, bit by bit, on an address of mixed bits.
        let x: Addr = core::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0x5a);
        for bits in 0..=128u8 {
            let m = mask_addr(&x, bits);
            for i in 0..128usize {
                let bit = |a: &Addr| a[i / 8] >> (7 - i % 8) & 1;
                let want = if i < usize::from(bits) { bit(&x) } else { 0 };
                assert_eq!(bit(&m), want, "/{bits} bit {i}");
            }
        }
    }
}
