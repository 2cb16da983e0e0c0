//! xlb's XDP programs.
//!
//! - `xlb_lb`: the load balancer. Sends every flow for a VIP to one backend
//!   (Maglev table + LRU conntrack), encapsulating (`dsr-ipip`) or rewriting
//!   the destination MAC (`dsr-l2`). Never waits on userspace.
//! - `xlb_decap`: runs on a backend's NIC and strips IPIP / IP6IP6 addressed
//!   to it, so backends need no tunnel module.
//! - `xlb_minimal`: parse, swap MACs, `XDP_TX`: the baseline the benchmark
//!   compares against.
//! - `xlb_hc` (tc egress): sends data-path health probes (marked sockets
//!   connecting to a VIP) to one backend exactly as `xlb_lb` sends clients'.
//! - `xlb_pass`: `XDP_PASS`. veth delivers `XDP_TX`ed frames only to a peer
//!   that has an XDP program, so the lab attaches this one there.
#![no_std]
#![no_main]
// `core::intrinsics::atomic_xadd`: shared counters of `guard.rs`.
#![allow(
    internal_features,
    reason = "atomic_xadd is the one atomic add the BPF target offers"
)]
#![feature(core_intrinsics)]
#![expect(
    clippy::needless_borrows_for_generic_args,
    reason = "map keys passed by value are copied onto the 512-byte BPF stack; by reference they are not"
)]
#![allow(
    unused_crate_dependencies,
    reason = "the package's own library (lb_ebpf) exists only so lb-user can depend on it"
)]

mod chance;
mod checksum;
mod clock;
mod conntrack;
mod decap;
mod encap;
mod forward;
mod guard;
mod hc;
mod hc_nat;
mod icmp;
mod kernel;
mod key;
mod lb;
mod nat;
mod packet;
mod parse;
mod relay;
mod reply;
mod reset;
mod select;
mod stats;
mod trace;

use aya_ebpf::{
    bindings::xdp_action,
    macros::{classifier, map, xdp},
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray},
    programs::{TcContext, XdpContext},
};
use lb_common::{
    BACKEND_IDS, BackendInfo, CtEntry, CtRate, DECAP_STATS_LEN, DEFAULT_CT_SIZE,
    DEFAULT_TABLE_SIZE, DecapAddrKey, DecapSrcV4, DecapSrcV6, FlowKey, Globals, HC_STATS_LEN,
    HcReal, ListEntry, ListV4, ListV6, MAX_DECAP_ADDRS, MAX_DECAP_SOURCES, MAX_LIST_RULES,
    MAX_SOURCES, MAX_VIPS, NextHop, ReplyRate, RingSlot, STATS_LEN, SourceKey, SourceState,
    TrafficStats, VipAddrKey, VipGuard, VipInfo, VipKey,
    nat::{ClientHop, NatFlow, NatPool, PassiveStats},
};

/// VIP services: (address, port, protocol) → VIP id.
#[map(name = "XLB_VIPS")]
static XLB_VIPS: HashMap<VipKey, u32> = HashMap::with_max_entries(MAX_VIPS, 0);

/// Per VIP id: table size, live ring half, mode, down policy (mode 0 = no VIP).
#[map(name = "XLB_VIP_INFO")]
static XLB_VIP_INFO: Array<VipInfo> = Array::with_max_entries(MAX_VIPS, 0);

/// Number of VIPs per (protocol, port), indexed by `lb_common::port_index`:
/// a filter that passes non-VIP traffic without a hash lookup.
#[map(name = "XLB_VIP_PORTS")]
static XLB_VIP_PORTS: Array<u32> = Array::with_max_entries(lb_common::PORT_INDEX_LEN, 0);

/// The VIPs, direct-mapped by `lb_common::vip_index_slot`: a new flow finds
/// its VIP without a hash lookup (see `lb_common::VIP_INDEX_MANY`).
#[map(name = "XLB_VIP_INDEX")]
static XLB_VIP_INDEX: Array<u32> = Array::with_max_entries(lb_common::VIP_INDEX_LEN, 0);

/// Every address that carries a VIP, with its `lb_common::VIP_ADDR_*`
/// bits: tells a malformed or unbalanced packet to a VIP address (dropped,
/// or passed to the host's services) from traffic that is not ours (passed).
#[map(name = "XLB_VIP_ADDRS")]
static XLB_VIP_ADDRS: HashMap<VipAddrKey, u32> = HashMap::with_max_entries(MAX_VIPS, 0);

/// VIP addresses per `lb_common::vip_addr_slot`: a filter read before
/// `XLB_VIP_ADDRS`, so that traffic to no VIP address skips the hash lookup.
#[map(name = "XLB_VIP_AINDEX")]
static XLB_VIP_AINDEX: Array<u32> = Array::with_max_entries(lb_common::VIP_ADDR_INDEX_LEN, 0);

/// Maglev rings, double-buffered per VIP: `ring_index(vip, half, stride, slot)`
/// → backend id and previous owner. Userspace sets the size to
/// `MAX_VIPS × 2 × stride` at load.
#[map(name = "XLB_RING")]
static XLB_RING: Array<RingSlot> = Array::with_max_entries(MAX_VIPS * 2 * DEFAULT_TABLE_SIZE, 0);

/// Backends by id (0 = none): address, generation, state.
#[map(name = "XLB_BACKENDS")]
static XLB_BACKENDS: Array<BackendInfo> = Array::with_max_entries(BACKEND_IDS, 0);

/// Connection tracking: client 5-tuple → backend. Userspace sets the size.
#[map(name = "XLB_CT")]
static XLB_CT: LruHashMap<FlowKey, CtEntry> = LruHashMap::with_max_entries(DEFAULT_CT_SIZE, 0);

/// One entry: hash key, ring stride, UDP timeout, encapsulation sources.
#[map(name = "XLB_GLOBALS")]
static XLB_GLOBALS: Array<Globals> = Array::with_max_entries(1, 0);

/// Reason counters, indexed by `lb_common::Stat`.
#[map(name = "XLB_STATS")]
static XLB_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STATS_LEN, 0);

#[map(name = "XLB_VIP_STATS")]
static XLB_VIP_STATS: PerCpuArray<TrafficStats> = PerCpuArray::with_max_entries(MAX_VIPS, 0);

#[map(name = "XLB_BE_STATS")]
static XLB_BE_STATS: PerCpuArray<TrafficStats> = PerCpuArray::with_max_entries(BACKEND_IDS, 0);

/// Cached route/neighbour answers per backend (see `lb_common::NextHop`).
#[map(name = "XLB_NEXTHOP")]
static XLB_NEXTHOP: PerCpuArray<NextHop> = PerCpuArray::with_max_entries(BACKEND_IDS, 0);

/// Outer destinations the decapsulator accepts.
#[map(name = "XLB_DECAP_ADDR")]
static XLB_DECAP_ADDR: HashMap<DecapAddrKey, u32> = HashMap::with_max_entries(MAX_DECAP_ADDRS, 0);

/// Outer sources the decapsulator accepts: the load balancers' prefixes.
#[map(name = "XLB_DECAP_SRC4")]
static XLB_DECAP_SRC4: LpmTrie<DecapSrcV4, u32> = LpmTrie::with_max_entries(MAX_DECAP_SOURCES, 0);
#[map(name = "XLB_DECAP_SRC6")]
static XLB_DECAP_SRC6: LpmTrie<DecapSrcV6, u32> = LpmTrie::with_max_entries(MAX_DECAP_SOURCES, 0);

/// Inner destinations the decapsulator accepts: the VIP addresses this
/// backend serves.
#[map(name = "XLB_DECAP_VIP")]
static XLB_DECAP_VIP: HashMap<DecapAddrKey, u32> = HashMap::with_max_entries(MAX_DECAP_ADDRS, 0);

/// Decapsulator counters, indexed by `lb_common::DecapStat`.
#[map(name = "XLB_DECAP_STAT")]
static XLB_DECAP_STAT: PerCpuArray<u64> = PerCpuArray::with_max_entries(DECAP_STATS_LEN, 0);

/// Data-path probes: socket mark → backend address, family and VIP mode.
#[map(name = "XLB_HC_REALS")]
static XLB_HC_REALS: HashMap<u32, HcReal> = HashMap::with_max_entries(BACKEND_IDS, 0);

/// `xlb_hc` counters, indexed by `lb_common::HcStat`.
#[map(name = "XLB_HC_STATS")]
static XLB_HC_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(HC_STATS_LEN, 0);

/// Per VIP id: what its new flows are judged by (lists, rate limit,
/// source tracking, conntrack insert cap).
#[map(name = "XLB_GUARD")]
static XLB_GUARD: Array<VipGuard> = Array::with_max_entries(MAX_VIPS, 0);

/// Deny and allow lists: (scope, source prefix) → rule. The scope is a VIP
/// id or `SCOPE_GLOBAL`; see `lb_common::ListV4`.
#[map(name = "XLB_DENY_V4")]
static XLB_DENY_V4: LpmTrie<ListV4, ListEntry> = LpmTrie::with_max_entries(MAX_LIST_RULES, 0);
#[map(name = "XLB_DENY_V6")]
static XLB_DENY_V6: LpmTrie<ListV6, ListEntry> = LpmTrie::with_max_entries(MAX_LIST_RULES, 0);
#[map(name = "XLB_ALLOW_V4")]
static XLB_ALLOW_V4: LpmTrie<ListV4, ListEntry> = LpmTrie::with_max_entries(MAX_LIST_RULES, 0);
#[map(name = "XLB_ALLOW_V6")]
static XLB_ALLOW_V6: LpmTrie<ListV6, ListEntry> = LpmTrie::with_max_entries(MAX_LIST_RULES, 0);

/// Packets each list entry matched, indexed by `ListEntry::rule`.
#[map(name = "XLB_LIST_HITS")]
static XLB_LIST_HITS: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_LIST_RULES, 0);

/// Per (VIP, source prefix): token bucket and counters (`xlb sources`).
#[map(name = "XLB_SOURCES")]
static XLB_SOURCES: LruHashMap<SourceKey, SourceState> =
    LruHashMap::with_max_entries(MAX_SOURCES, 0);

/// This CPU's last (jiffies, coarse ns) pair: `clock::now` without a
/// helper call until the next tick. Not pinned, not read by userspace.
#[map(name = "XLB_CLOCK")]
static XLB_CLOCK: PerCpuArray<clock::ClockCache> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's conntrack inserts and new NAT flows in the current second
/// (the insert cap), at `CT_RATE_CONNTRACK` and `CT_RATE_NAT`.
#[map(name = "XLB_CT_RATE")]
static XLB_CT_RATE: PerCpuArray<CtRate> =
    PerCpuArray::with_max_entries(lb_common::guard::CT_RATE_SLOTS, 0);

/// This CPU's budget of generated replies (`reply.rs`).
#[map(name = "XLB_REPLY_RATE")]
static XLB_REPLY_RATE: PerCpuArray<ReplyRate> = PerCpuArray::with_max_entries(1, 0);

/// NAT flows by the client's key (`lb_common::nat`). Not an LRU: a live
/// flow is never evicted; expired entries are reclaimed.
#[map(name = "XLB_NAT_FLOWS")]
static XLB_NAT_FLOWS: HashMap<FlowKey, NatFlow> =
    HashMap::with_max_entries(lb_common::nat::DEFAULT_NAT_SIZE, 0);

/// NAT flows by the reply's key (backend → LB) → the client's key.
#[map(name = "XLB_NAT_REPLY")]
static XLB_NAT_REPLY: HashMap<FlowKey, FlowKey> =
    HashMap::with_max_entries(lb_common::nat::DEFAULT_NAT_SIZE, 0);

/// Per VIP id: a NAT VIP's source pool, timeouts and passive thresholds.
#[map(name = "XLB_NAT_POOL")]
static XLB_NAT_POOL: Array<NatPool> = Array::with_max_entries(MAX_VIPS, 0);

/// NAT backends per (protocol, backend port): the reply path's filter.
#[map(name = "XLB_NAT_SPORTS")]
static XLB_NAT_SPORTS: Array<u32> = Array::with_max_entries(lb_common::PORT_INDEX_LEN, 0);

/// NAT backends' addresses (`lb_common::nat::MAP_NAT_BACKEND_ADDRS`):
/// tells a late answer from a backend from a spoofed one.
#[map(name = "XLB_NAT_BEADDR")]
static XLB_NAT_BEADDR: HashMap<VipAddrKey, u32> = HashMap::with_max_entries(BACKEND_IDS, 0);

/// New NAT flows dropped on first sight while their pool was held
/// (`lb_common::nat::NAT_SEEN_SIZE`). Not pinned, not read by userspace.
#[map(name = "XLB_NAT_SEEN")]
static XLB_NAT_SEEN: LruHashMap<FlowKey, u32> =
    LruHashMap::with_max_entries(lb_common::nat::NAT_SEEN_SIZE, 0);

/// This CPU's NAT flow being allocated (`nat::alloc::Scratch`): off the
/// stack. Not pinned, not read by userspace.
#[map(name = "XLB_NAT_SCRATCH")]
static XLB_NAT_SCRATCH: PerCpuArray<nat::alloc::Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Per CPU: next hops towards NAT clients (`lb_common::nat::ClientHop`),
/// a direct-mapped cache. Not pinned, not read by userspace.
#[map(name = "XLB_NAT_HOPS")]
static XLB_NAT_HOPS: PerCpuArray<ClientHop> =
    PerCpuArray::with_max_entries(lb_common::nat::CLIENT_HOPS, 0);

/// Per backend id, per CPU: what NAT traffic says about the backend.
#[map(name = "XLB_PASSIVE")]
static XLB_PASSIVE: PerCpuArray<PassiveStats> = PerCpuArray::with_max_entries(BACKEND_IDS, 0);

#[xdp]
pub(crate) fn xlb_lb(ctx: XdpContext) -> u32 {
    // One flag test while no trace is on (`trace.rs`).
    if trace::tracing() {
        trace::run_traced(ctx)
    } else {
        trace::run_untraced(ctx)
    }
}

#[xdp]
pub(crate) fn xlb_decap(ctx: XdpContext) -> u32 {
    decap::run(&ctx)
}

#[classifier]
pub(crate) fn xlb_hc(ctx: TcContext) -> i32 {
    hc::run(&ctx)
}

#[xdp]
pub(crate) fn xlb_minimal(ctx: XdpContext) -> u32 {
    let Some(eth) = packet::ptr_at::<[u8; 14]>(&ctx, 0) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: `ptr_at` checked that 14 bytes are inside the packet.
    let eth = unsafe { &mut *eth };
    let mut dst = [0u8; 6];
    dst.copy_from_slice(&eth[0..6]);
    eth.copy_within(6..12, 0);
    eth[6..12].copy_from_slice(&dst);
    xdp_action::XDP_TX
}

#[xdp]
pub(crate) fn xlb_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // verifier: unreachable in a verified program; the loop gives `!`.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

// `xlb-tput-bench`'s frame generator and its `XDP_DROP` target: bench-only,
// loaded by the benchmark, never by the daemon (see bench_gen.rs).
mod bench_gen;

#[xdp]
pub(crate) fn xlb_bench_gen(ctx: XdpContext) -> u32 {
    bench_gen::run(&ctx)
}

#[xdp]
pub(crate) fn xlb_bench_drop(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_DROP
}
