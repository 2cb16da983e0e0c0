//! Types and pure logic shared by xlb's XDP programs and its userspace.
//!
//! Every map key and value is `#[repr(C)]` with explicit padding, no `bool`,
//! enum, `Option` or `usize`, and a compile-time size check, so the kernel
//! and userspace agree on every byte. Network-order fields say so.
//!
//! When a layout here changes, bump [`LAYOUT_VERSION`]: the daemon refuses to
//! adopt pinned maps written by another layout.
#![no_std]

pub mod bench;
mod decap;
pub mod guard;
pub mod hash;
pub mod kernel;
pub mod nat;
mod reply;
mod ring;
mod stats;
pub mod trace;
mod vip_addr;

pub use decap::{
    DECAP_ADDR_ACCEPT, DECAP_ADDR_SECOND_CHANCE, DECAP_STATS_LEN, DecapAddrKey, DecapSrcV4,
    DecapSrcV6, DecapStat, MAX_DECAP_ADDRS, MAX_DECAP_SOURCES,
};
pub use guard::*;
pub use hash::{flow_hash, siphash13};
pub use reply::{DEFAULT_REPLY_RATE, ReplyRate, reply_limit};
pub use ring::{RingSlot, ring_index};
pub use stats::{STATS_LEN, Stat};
pub use vip_addr::{VIP_ADDR_BALANCED, VIP_ADDR_HOST_SERVICES, VIP_ADDR_INDEX_LEN, vip_addr_slot};

/// Version of every pinned map layout below. Stored in [`Globals::layout_version`]
/// and in the pin directory; a daemon refuses pinned state of another version.
pub const LAYOUT_VERSION: u32 = 6;

/// Maximum number of VIPs. VIP ids index the Maglev ring array and the
/// per-VIP counters; 64 VIPs × 2 halves × 65537 slots × 8 B (the kernel rounds
/// array values up to 8 bytes) = 64 MiB of ring, measured with `bpftool map`
/// at the default table size (Katran's default is 512 VIPs).
pub const MAX_VIPS: u32 = 64;

/// Maximum number of backends across all VIPs, plus one: a configuration
/// lists at most `MAX_BACKENDS - 1` (id 0 is reserved as "no backend").
pub const MAX_BACKENDS: u32 = 4096;

/// Size of the backend id space: backend ids index `XLB_BACKENDS`, the
/// per-backend counters and next hops. Twice [`MAX_BACKENDS`] because a
/// reload (or a start with an edited file) keeps a removed backend's id
/// until the new table no longer points at it: replacing every backend of
/// the largest configuration at once needs the old ids and the new ones
/// side by side. 8,192 × 40 B of `BackendInfo` and next hop per CPU is a
/// few hundred KiB. Layout version 4 (was `MAX_BACKENDS` ids in version 3).
pub const BACKEND_IDS: u32 = 2 * MAX_BACKENDS;

/// Default Maglev table size: a prime (Maglev needs a prime so every
/// permutation visits every slot), and ≥ 100 × backends keeps the disruption
/// and imbalance of a 655-backend VIP within 1 % (Maglev paper, §5.3).
pub const DEFAULT_TABLE_SIZE: u32 = 65_537;

/// Default conntrack capacity (entries): 128 MiB of kernel memory, 128 B per
/// entry (40 B key + 24 B value + the LRU hash element header; measured with
/// `bpftool map show`: memlock 134,218,624 B).
pub const DEFAULT_CT_SIZE: u32 = 1_048_576;

/// Default idle time after which a UDP conntrack entry is ignored (30 s, the
/// kernel's `nf_conntrack_udp_timeout`).
pub const DEFAULT_UDP_TIMEOUT_NS: u64 = 30_000_000_000;

/// Conntrack `last_seen_ns` is refreshed at most this often per entry, so an
/// established flow does not write its entry (and bounce the cache line
/// between CPUs) on every packet.
pub const CT_TOUCH_INTERVAL_NS: u64 = 1_000_000_000;

/// Address families as stored in keys (not the kernel's AF_* values, to keep
/// them one byte and obviously ours).
pub const FAMILY_V4: u8 = 4;
pub const FAMILY_V6: u8 = 6;

/// IANA protocol numbers.
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_IPIP: u8 = 4;
pub const PROTO_IPV6: u8 = 41;

/// Outer header sizes added by `dsr-ipip`.
pub const IPIP4_OVERHEAD: u32 = 20;
pub const IPIP6_OVERHEAD: u32 = 40;

/// Hop limit / TTL of the outer header of an encapsulated packet.
pub const ENCAP_TTL: u8 = 64;

/// Forwarding modes ([`VipInfo::mode`]).
pub const MODE_DSR_IPIP: u8 = 1;
pub const MODE_DSR_L2: u8 = 2;

/// Policy for flows whose backend is down ([`VipInfo::down_policy`]).
/// `rehash`: pick again from the table, so the client reaches a live backend
/// (which answers RST) and reconnects at once.
pub const DOWN_POLICY_REHASH: u8 = 0;
/// `keep`: keep sending to the recorded backend.
pub const DOWN_POLICY_KEEP: u8 = 1;

/// Backend states ([`BackendInfo::state`]), written by the daemon.
/// `up`: in the table, takes new flows.
pub const BACKEND_UP: u8 = 1;
/// `draining`: out of the table; existing flows continue.
pub const BACKEND_DRAINING: u8 = 2;
/// `down`: out of the table; existing flows follow the VIP's down policy.
pub const BACKEND_DOWN: u8 = 3;

/// Map names. The kernel keeps 15 bytes of a map name; aya truncates silently,
/// so each is at most 15 (checked below).
pub const MAP_VIPS: &str = "XLB_VIPS";
pub const MAP_VIP_INFO: &str = "XLB_VIP_INFO";
pub const MAP_VIP_PORTS: &str = "XLB_VIP_PORTS";
pub const MAP_VIP_INDEX: &str = "XLB_VIP_INDEX";
pub const MAP_VIP_ADDRS: &str = "XLB_VIP_ADDRS";
pub const MAP_VIP_ADDR_INDEX: &str = "XLB_VIP_AINDEX";
pub const MAP_RING: &str = "XLB_RING";
pub const MAP_BACKENDS: &str = "XLB_BACKENDS";
pub const MAP_CT: &str = "XLB_CT";
pub const MAP_GLOBALS: &str = "XLB_GLOBALS";
pub const MAP_STATS: &str = "XLB_STATS";
pub const MAP_VIP_STATS: &str = "XLB_VIP_STATS";
pub const MAP_BE_STATS: &str = "XLB_BE_STATS";
pub const MAP_NEXTHOP: &str = "XLB_NEXTHOP";
pub const MAP_DECAP_ADDRS: &str = "XLB_DECAP_ADDR";
pub const MAP_DECAP_STATS: &str = "XLB_DECAP_STAT";
pub const MAP_DECAP_SRC_V4: &str = "XLB_DECAP_SRC4";
pub const MAP_DECAP_SRC_V6: &str = "XLB_DECAP_SRC6";
pub const MAP_DECAP_VIPS: &str = "XLB_DECAP_VIP";
pub const MAP_HC_REALS: &str = "XLB_HC_REALS";
pub const MAP_HC_STATS: &str = "XLB_HC_STATS";
pub const MAP_GUARD: &str = "XLB_GUARD";
pub const MAP_DENY_V4: &str = "XLB_DENY_V4";
pub const MAP_DENY_V6: &str = "XLB_DENY_V6";
pub const MAP_ALLOW_V4: &str = "XLB_ALLOW_V4";
pub const MAP_ALLOW_V6: &str = "XLB_ALLOW_V6";
pub const MAP_LIST_HITS: &str = "XLB_LIST_HITS";
pub const MAP_SOURCES: &str = "XLB_SOURCES";
pub const MAP_CT_RATE: &str = "XLB_CT_RATE";
pub const MAP_REPLY_RATE: &str = "XLB_REPLY_RATE";

const _: () = {
    let names = [
        MAP_VIPS,
        MAP_VIP_INFO,
        MAP_VIP_PORTS,
        MAP_VIP_INDEX,
        MAP_VIP_ADDRS,
        MAP_VIP_ADDR_INDEX,
        MAP_RING,
        MAP_BACKENDS,
        MAP_CT,
        MAP_GLOBALS,
        MAP_STATS,
        MAP_VIP_STATS,
        MAP_BE_STATS,
        MAP_NEXTHOP,
        MAP_DECAP_ADDRS,
        MAP_DECAP_STATS,
        MAP_DECAP_SRC_V4,
        MAP_DECAP_SRC_V6,
        MAP_DECAP_VIPS,
        MAP_HC_REALS,
        MAP_HC_STATS,
        MAP_GUARD,
        MAP_DENY_V4,
        MAP_DENY_V6,
        MAP_ALLOW_V4,
        MAP_ALLOW_V6,
        MAP_LIST_HITS,
        MAP_SOURCES,
        MAP_CT_RATE,
        MAP_REPLY_RATE,
    ];
    let mut i = 0;
    while i < names.len() {
        assert!(
            names[i].len() <= 15,
            "map name longer than the kernel keeps"
        );
        i += 1;
    }
};

/// Program names (the `#[xdp]` function names in lb-ebpf).
pub const PROG_LB: &str = "xlb_lb";
pub const PROG_DECAP: &str = "xlb_decap";
pub const PROG_MINIMAL: &str = "xlb_minimal";
pub const PROG_PASS: &str = "xlb_pass";
/// The tc egress classifier that steers data-path health probes (`#[classifier]`).
pub const PROG_HC: &str = "xlb_hc";

/// An address as stored in keys: IPv4 in the first 4 bytes, the rest zero;
/// IPv6 in all 16. Network byte order, exactly as on the wire.
pub type Addr = [u8; 16];

/// Key of `XLB_VIPS`: one VIP service.
// Aligned so building one on the BPF stack is a few word stores, not a
// byte-wise memset call.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VipKey {
    /// VIP address, network byte order (see [`Addr`]).
    pub addr: Addr,
    /// VIP port, network byte order.
    pub port: u16,
    /// [`PROTO_TCP`] or [`PROTO_UDP`].
    pub proto: u8,
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u8,
}
const _: () = assert!(core::mem::size_of::<VipKey>() == 20);

/// Value of `XLB_VIP_INFO`, indexed by VIP id (`XLB_VIPS` maps a VIP's
/// address, port and protocol to its id). Flipping `active` is how a new table
/// goes live; `table_size` and `active` share the first 8 bytes so that one
/// update changes both together.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VipInfo {
    /// Maglev table size of this VIP (a prime ≤ the ring stride). 0 = no table
    /// yet: new flows are dropped with `DropNoBackend`.
    pub table_size: u32,
    /// Which half of the double-buffered ring is live: 0 or 1.
    pub active: u32,
    /// Index of this VIP: selects its ring halves and counters. < [`MAX_VIPS`].
    pub vip_id: u32,
    /// [`MODE_DSR_IPIP`] or [`MODE_DSR_L2`]; 0 = no VIP has this id (its
    /// conntrack entries are stale).
    pub mode: u8,
    /// [`DOWN_POLICY_REHASH`] or [`DOWN_POLICY_KEEP`].
    pub down_policy: u8,
    /// 1 = the operator runs host services on this VIP's address
    /// (`host_services = true`): packets to the address that no VIP
    /// balances go to the host's stack. 0 = they are dropped
    /// ([`VIP_ADDR_HOST_SERVICES`]). Was padding before layout 4.
    pub host_services: u8,
    /// 1 = second chance (`second_chance = true`, `dsr-ipip` only): a TCP
    /// packet without SYN that misses conntrack, whose slot has a live
    /// previous owner ([`RingSlot::prev_id`]), is sent to the current owner
    /// with a second tunnel header naming the previous one. Was padding
    /// before layout 5.
    pub second_chance: u8,
    /// The VIP's own key: the data plane takes an `XLB_VIP_INDEX`
    /// candidate only if the packet is addressed to exactly this.
    pub key: VipKey,
}
const _: () = assert!(core::mem::size_of::<VipInfo>() == 36);

/// Entries of `XLB_VIP_INDEX`, a direct-mapped index of the VIPs (a power
/// of two, ≥ 64 × [`MAX_VIPS`] so that VIPs seldom share a slot).
pub const VIP_INDEX_LEN: u32 = 4096;

/// An `XLB_VIP_INDEX` entry: 0 = no VIP's key falls in this slot (a packet
/// whose key does is for no VIP); `id + 1` = VIP `id`'s does, alone (taken
/// once its `VipInfo::key` is the packet's); [`VIP_INDEX_MANY`] = several
/// do (the packet is looked up in `XLB_VIPS`, as is a candidate that is
/// not the packet's).
pub const VIP_INDEX_MANY: u32 = u32::MAX;

/// The `XLB_VIP_INDEX` slot of a VIP's address, port (network order) and
/// protocol: an unkeyed multiplicative hash, which saves a new flow the
/// hash map lookup of its VIP in `XLB_VIPS` (7 % of a new flow's time,
/// side by side with Katran: docs/benchmarks.md, "fifth step").
/// Unkeyed is enough: two VIPs that share a slot (addresses the operator
/// chose) only send their packets the slow way, and a client's packet to
/// another address is checked against the slot's VIP key.
#[inline(always)]
pub fn vip_index_slot(addr: &Addr, port: u16, proto: u8) -> u32 {
    let x = addr_fold(addr) ^ (u32::from(port) << 8) ^ u32::from(proto);
    // A product's high bits depend only on the factor's lower ones: fold
    // the high half (the last byte of an IPv4 address) down first.
    (x ^ (x >> 16)).wrapping_mul(0x9e37_79b1) >> (32 - VIP_INDEX_LEN.trailing_zeros())
}
const _: () = assert!(VIP_INDEX_LEN.is_power_of_two() && VIP_INDEX_LEN >= 64 * MAX_VIPS);

/// Key of `XLB_VIP_ADDRS`: every address that carries at least one VIP, so a
/// malformed or unbalanced packet to a VIP address can be told from traffic
/// that is not ours. The value holds `VIP_ADDR_*` bits.
// Aligned so building one on the BPF stack is a few word stores, not a
// byte-wise memset call.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VipAddrKey {
    /// Network byte order (see [`Addr`]).
    pub addr: Addr,
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<VipAddrKey>() == 20);

/// Value of `XLB_BACKENDS`, indexed by backend id (0 = none).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendInfo {
    /// Backend address, network byte order (see [`Addr`]).
    pub addr: Addr,
    /// Bumped by the daemon each time this id is given to another backend, so
    /// a conntrack entry made for the previous holder is recognised as stale.
    pub generation: u32,
    /// [`BACKEND_UP`], [`BACKEND_DRAINING`] or [`BACKEND_DOWN`]; 0 = unused id.
    pub state: u8,
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u8,
    /// The backend's port, network order: where NAT modes send flows
    /// (DSR modes keep the VIP's port). Was padding before layout 6.
    pub port: u16,
}
const _: () = assert!(core::mem::size_of::<BackendInfo>() == 24);

/// Key of `XLB_CT` (and the input of the flow hash): a 5-tuple as seen from
/// the client, client → VIP.
// Aligned so building one on the BPF stack is a few word stores, not a
// byte-wise memset call.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// Client address, network byte order (see [`Addr`]).
    pub src: Addr,
    /// VIP address, network byte order (see [`Addr`]).
    pub dst: Addr,
    /// Client port, network byte order.
    pub sport: u16,
    /// VIP port, network byte order.
    pub dport: u16,
    /// [`PROTO_TCP`] or [`PROTO_UDP`].
    pub proto: u8,
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<FlowKey>() == 40);

/// Value of `XLB_CT`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtEntry {
    /// Backend id chosen for this flow.
    pub backend_id: u32,
    /// [`BackendInfo::generation`] when the flow was assigned.
    pub generation: u32,
    /// VIP id of the flow: a hit needs no VIP lookup.
    pub vip_id: u32,
    /// [`CT_FLAG_CLOSING`] once the client sent FIN or RST; 0 otherwise.
    /// Entries written before this field existed hold 0 (it was padding).
    pub flags: u32,
    /// `bpf_ktime_get_coarse_ns()` (CLOCK_MONOTONIC_COARSE, ns) of the last
    /// packet, refreshed at most every [`CT_TOUCH_INTERVAL_NS`].
    pub last_seen_ns: u64,
}
const _: () = assert!(core::mem::size_of::<CtEntry>() == 24);

/// [`CtEntry::flags`]: the client sent FIN or RST on this flow. The entry
/// still forwards the flow's last packets; the daemon's conntrack walk no
/// longer counts it as established (what `xlb drain --wait` waits on). The
/// data plane keeps no other TCP state: it sees only the client's half of
/// a DSR connection.
pub const CT_FLAG_CLOSING: u32 = 1;

/// Entries of `XLB_VIP_PORTS`: one per (TCP|UDP, port).
pub const PORT_INDEX_LEN: u32 = 2 * 65_536;

/// Index of (`proto`, `port` in host order) in `XLB_VIP_PORTS`.
#[inline(always)]
pub fn port_index(proto: u8, port: u16) -> u32 {
    (if proto == PROTO_UDP { 65_536 } else { 0 }) + u32::from(port)
}

/// The single value of `XLB_GLOBALS` (an array of one), written by the daemon
/// before it attaches the program.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Globals {
    /// [`LAYOUT_VERSION`] of the daemon that created the maps.
    pub layout_version: u32,
    /// Slots reserved per ring half: the largest table size allowed.
    pub ring_stride: u32,
    /// The flow hash key (SipHash-1-3, 128 bits). Secret: whoever knows it can
    /// aim flows at one backend. Random on first start, or set so several
    /// nodes agree.
    pub hash_key: [u64; 2],
    /// UDP conntrack idle timeout, ns. 0 = never expires.
    pub udp_timeout_ns: u64,
    /// Outer source address of IPv4-in-IPv4 packets, network byte order, in
    /// the first 4 bytes (see [`Addr`]).
    pub encap_src_v4: Addr,
    /// Outer source address of IPv6-in-IPv6 packets, network byte order.
    pub encap_src_v6: Addr,
    /// Low bits of `encap_src_v4` taken from [`encap_hash`] of each flow
    /// (`32 - prefix length` of `encap_source_v4_prefix`, at most 16), so a
    /// backend NIC's RSS spreads one LB's flows over its queues; 0 = one
    /// outer source for every flow.
    pub encap_v4_host_bits: u8,
    pub _pad: [u8; 7],
    /// Replies the data plane generates (RSTs to refused SYNs, echo replies,
    /// "fragmentation needed" / "packet too big"), per CPU: ns between two
    /// of them at the sustained rate (`1e9 / daemon.reply_rate`). 0 = no
    /// limit. See [`reply_limit`].
    pub reply_interval_ns: u64,
    /// How far ahead of now a CPU's reply budget may be spent: (burst − 1)
    /// × `reply_interval_ns`.
    pub reply_tolerance_ns: u64,
}
const _: () = assert!(core::mem::size_of::<Globals>() == 88);

/// Most host bits of the IPv4 outer source that come from the flow.
pub const MAX_ENCAP_HOST_BITS: u8 = 16;

/// A cheap, unkeyed 32-bit mix of the client's address and port: spreads
/// flows over outer IPv4 sources ([`Globals::encap_v4_host_bits`]) and
/// outer IPv6 flow labels (its low 20 bits), so that a backend's RSS hashes
/// one LB's flows onto all its queues. Not the flow hash: it chooses no
/// backend, so it needs no key, and it must cost an established packet
/// almost nothing. Every packet of a flow gets the same value.
#[inline(always)]
pub fn encap_hash(src: &Addr, sport: u16) -> u32 {
    encap_mix(addr_fold(src) ^ u32::from(sport))
}

/// The four 4-byte words of an address (memory order) XORed together: an
/// IPv4 address is its one word, the rest being zero.
#[inline(always)]
fn addr_fold(a: &Addr) -> u32 {
    let w = |i: usize| u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
    w(0) ^ w(4) ^ w(8) ^ w(12)
}

/// [`encap_hash`] of an IPv4 flow, whose address bytes past the first 4
/// are zero in every key: the same value from the one word that is not.
#[inline(always)]
pub fn encap_hash_v4(src: &Addr, sport: u16) -> u32 {
    encap_mix(u32::from_ne_bytes(v4_bytes(src)) ^ u32::from(sport))
}

/// The first 4 bytes of an address (the whole of an IPv4 one) as one
/// value, which the eBPF build reads with one load: 4 bytes gathered one by
/// one (`[a[0], a[1], a[2], a[3]]`) LLVM's BPF backend may read in two or
/// four loads.
#[inline(always)]
pub fn v4_bytes(a: &Addr) -> [u8; 4] {
    a.first_chunk().copied().unwrap_or_default()
}

#[inline(always)]
fn encap_mix(x: u32) -> u32 {
    // Murmur3's finaliser: every input bit moves every output bit.
    let x = (x ^ (x >> 16)).wrapping_mul(0x85eb_ca6b);
    let x = (x ^ (x >> 13)).wrapping_mul(0xc2b2_ae35);
    x ^ (x >> 16)
}

/// Value of `XLB_NEXTHOP` (per-CPU array indexed by backend id): the last
/// `bpf_fib_lookup` answer towards the backend, reused until `expires_ns`, so
/// the route and neighbour lookup (the most expensive step of forwarding)
/// runs about once a second per backend and CPU instead of per packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NextHop {
    /// Next-hop (or backend, on-link) MAC.
    pub dmac: [u8; 6],
    /// MAC of the egress interface.
    pub smac: [u8; 6],
    /// Egress interface.
    pub ifindex: u32,
    /// Egress MTU, bytes of IP packet.
    pub mtu: u32,
    /// [`BackendInfo::generation`] + 1 of the backend this was resolved for
    /// (0 = empty), so a recycled id never uses its predecessor's answer.
    pub generation_plus_one: u32,
    /// 1 if the backend is a neighbour (the route has no gateway): only
    /// then can `dsr-l2` reach it, the frame still being addressed to the
    /// VIP.
    pub on_link: u8,
    pub _pad: [u8; 3],
    /// `bpf_ktime_get_ns()` after which the answer is looked up again.
    pub expires_ns: u64,
}
const _: () = assert!(core::mem::size_of::<NextHop>() == 40);

/// How long a cached next hop is trusted: a changed neighbour (a backend
/// replaced behind the same address) is picked up within this time.
pub const NEXTHOP_TTL_NS: u64 = 1_000_000_000;

/// Per-VIP and per-backend counters (`XLB_VIP_STATS`, `XLB_BE_STATS`),
/// per CPU; sum them in userspace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficStats {
    /// Packets forwarded.
    pub packets: u64,
    /// Bytes forwarded (frame length as received, before encapsulation).
    pub bytes: u64,
    /// Flows assigned a backend from the table (SYNs, misses, rehashes).
    pub new_flows: u64,
}
const _: () = assert!(core::mem::size_of::<TrafficStats>() == 24);

/// `addr` as the maps store it (see [`Addr`]).
pub fn addr16(addr: core::net::IpAddr) -> Addr {
    let mut out = [0u8; 16];
    match addr {
        core::net::IpAddr::V4(v4) => {
            let o = v4.octets();
            out[0] = o[0];
            out[1] = o[1];
            out[2] = o[2];
            out[3] = o[3];
        }
        core::net::IpAddr::V6(v6) => out = v6.octets(),
    }
    out
}

/// [`FAMILY_V4`] or [`FAMILY_V6`].
pub fn family_of(addr: core::net::IpAddr) -> u8 {
    if addr.is_ipv4() { FAMILY_V4 } else { FAMILY_V6 }
}

impl VipKey {
    /// The key of the VIP at `addr`:`port` (host order) for `proto`.
    pub fn new(addr: core::net::IpAddr, port: u16, proto: u8) -> Self {
        Self {
            addr: addr16(addr),
            port: port.to_be(),
            proto,
            family: family_of(addr),
        }
    }
}

impl FlowKey {
    /// The key of a flow from `client` to `vip` (ports in host order), as the
    /// data plane builds it from a packet.
    pub fn new(client: core::net::SocketAddr, vip: core::net::SocketAddr, proto: u8) -> Self {
        Self {
            src: addr16(client.ip()),
            dst: addr16(vip.ip()),
            sport: client.port().to_be(),
            dport: vip.port().to_be(),
            proto,
            family: family_of(vip.ip()),
            _pad: [0; 2],
        }
    }

    /// Slot of this flow in a Maglev table of `table_size` slots: the high
    /// 32 bits of the hash scaled to the table (multiply and shift, Lemire's
    /// range reduction). As uniform as `%` for a table under 2^32 slots, and
    /// it spares the data plane a 64-bit division per new flow.
    #[inline(always)]
    pub fn slot(&self, key: &[u64; 2], table_size: u32) -> u32 {
        (((flow_hash(key, self) >> 32) * u64::from(table_size)) >> 32) as u32
    }
}

/// Socket marks of data-path health probes: [`HC_MARK_BASE`] | backend id.
/// A probe socket carries the mark (`SO_MARK`); `xlb_hc` sends every packet
/// with such a mark to that backend exactly as `xlb_lb` would send a
/// client's. The base is "XL" in the high 16 bits, far from the small marks
/// firewalls and policy routing usually use; the low 16 bits hold the id
/// ([`BACKEND_IDS`] fits).
pub const HC_MARK_BASE: u32 = 0x584c_0000;
/// Bits of a mark that must equal [`HC_MARK_BASE`] for `xlb_hc` to look at it.
pub const HC_MARK_MASK: u32 = 0xffff_0000;
const _: () = assert!(BACKEND_IDS <= !HC_MARK_MASK + 1);

/// The mark of data-path probes to backend `id`.
pub const fn hc_mark(id: u32) -> u32 {
    HC_MARK_BASE | id
}

/// Value of `XLB_HC_REALS` (hash: probe mark → where its packets go).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcReal {
    /// Backend address, network byte order (see [`Addr`]).
    pub addr: Addr,
    /// [`FAMILY_V4`] or [`FAMILY_V6`]; a probe of the other family is dropped.
    pub family: u8,
    /// The VIP's raw mode: [`MODE_DSR_IPIP`], [`MODE_DSR_L2`],
    /// [`nat::MODE_NAT`] or [`nat::MODE_NAT_PRESERVE`].
    pub mode: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<HcReal>() == 20);

/// `xlb_hc` counters (`XLB_HC_STATS`, per-CPU array indexed by `HcStat as u32`).
/// Packets without a probe mark are not counted: the program sits on the
/// egress of every packet the host sends and costs them one compare.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HcStat {
    /// Encapsulated (`dsr-ipip`) and redirected towards the backend.
    FwdIpip = 0,
    /// Redirected unchanged towards the backend's MAC (`dsr-l2`).
    FwdL2 = 1,
    /// A mark in xlb's range with no entry (a backend removed while its probe
    /// ran): passed untouched, it goes where the route says and fails.
    PassUnknownMark = 2,
    /// Marked, but not IPv4/IPv6 of the backend's family: dropped.
    DropFamily = 3,
    /// No route to the backend (`bpf_fib_lookup` failed): dropped.
    DropNoRoute = 4,
    /// `bpf_skb_adjust_room` or the header write failed: dropped.
    DropEncap = 5,
    /// Destination address rewritten to the backend's (NAT VIPs) and
    /// redirected towards the backend.
    FwdNat = 6,
    /// A NAT VIP's probe that could not be rewritten (not TCP/UDP, or a
    /// checksum helper failed): dropped.
    DropNatRewrite = 7,
}
pub const HC_STATS_LEN: u32 = 8;

impl HcStat {
    pub const ALL: [HcStat; HC_STATS_LEN as usize] = [
        HcStat::FwdIpip,
        HcStat::FwdL2,
        HcStat::PassUnknownMark,
        HcStat::DropFamily,
        HcStat::DropNoRoute,
        HcStat::DropEncap,
        HcStat::FwdNat,
        HcStat::DropNatRewrite,
    ];
    /// Stable snake_case name, for metrics and `--json` output.
    pub const fn label(self) -> &'static str {
        match self {
            HcStat::FwdIpip => "fwd_ipip",
            HcStat::FwdL2 => "fwd_l2",
            HcStat::PassUnknownMark => "pass_unknown_mark",
            HcStat::DropFamily => "drop_family",
            HcStat::DropNoRoute => "drop_no_route",
            HcStat::DropEncap => "drop_encap",
            HcStat::FwdNat => "fwd_nat",
            HcStat::DropNatRewrite => "drop_nat_rewrite",
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: each is repr(C), Copy, and every byte pattern is a valid value
    // (integers and byte arrays only, padding explicit).
    unsafe impl aya::Pod for VipKey {}
    unsafe impl aya::Pod for VipInfo {}
    unsafe impl aya::Pod for VipAddrKey {}
    unsafe impl aya::Pod for BackendInfo {}
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for CtEntry {}
    unsafe impl aya::Pod for Globals {}
    unsafe impl aya::Pod for ReplyRate {}
    unsafe impl aya::Pod for TrafficStats {}
    unsafe impl aya::Pod for NextHop {}
    unsafe impl aya::Pod for HcReal {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;

    #[test]
    fn encap_hash_spreads_ports_and_addresses() {
        let a = addr16(core::net::IpAddr::V4(core::net::Ipv4Addr::new(
            192, 0, 2, 1,
        )));
        let mut low = [0u32; 16];
        for port in 0..4096u16 {
            low[(encap_hash(&a, port) & 15) as usize] += 1;
        }
        // 4096 flows over 16 sources: each gets 256 ± 25 %.
        assert!(low.iter().all(|&n| (192..=320).contains(&n)), "{low:?}");
        let b = addr16(core::net::IpAddr::V4(core::net::Ipv4Addr::new(
            192, 0, 2, 2,
        )));
        assert_ne!(encap_hash(&a, 1), encap_hash(&b, 1));
        assert_eq!(encap_hash(&a, 1), encap_hash(&a, 1));
        // The IPv4 form gives the same value for every IPv4 key.
        for (addr, port) in [("192.0.2.1", 40000), ("10.0.0.255", 1), ("0.0.0.0", 0)] {
            let k = FlowKey::new(
                core::net::SocketAddr::new(addr.parse().unwrap(), port),
                "10.100.0.1:80".parse().unwrap(),
                PROTO_TCP,
            );
            assert_eq!(encap_hash_v4(&k.src, k.sport), encap_hash(&k.src, k.sport));
        }
    }

    #[test]
    fn vip_index_slots_spread_typical_vips() {
        // 64 VIPs the way operators number them: consecutive addresses,
        // one port, or one address and consecutive ports. At most a few
        // share a slot (each pair just takes the hash map).
        let slot = |a: &str, port: u16| {
            let a: core::net::IpAddr = a.parse().unwrap();
            vip_index_slot(&addr16(a), port.to_be(), PROTO_TCP)
        };
        let sets: [std::vec::Vec<u32>; 3] = [
            (1..=64)
                .map(|i| slot(&format!("10.100.0.{i}"), 443))
                .collect(),
            (0..64).map(|i| slot("10.100.0.1", 8000 + i)).collect(),
            (1..=64)
                .map(|i| slot(&format!("2001:db8::{i:x}"), 443))
                .collect(),
        ];
        for slots in sets {
            assert!(slots.iter().all(|&s| s < VIP_INDEX_LEN));
            let distinct: std::collections::HashSet<_> = slots.iter().collect();
            assert!(distinct.len() >= 62, "{} of 64 distinct", distinct.len());
        }
        // The protocol is part of the slot's input.
        let a = addr16("10.100.0.1".parse().unwrap());
        assert_ne!(
            vip_index_slot(&a, 53u16.to_be(), PROTO_TCP),
            vip_index_slot(&a, 53u16.to_be(), PROTO_UDP)
        );
    }
}
