//! `xlb_lb`: parse, look up the VIP, pick a backend, forward.
//!
//! Verdict policy (documented in the README, tested by the fixtures):
//! - not IPv4/IPv6, or not to a VIP (address, port, protocol): `XDP_PASS`,
//!   untouched. The host keeps working (SSH, ARP, its own services).
//! - truncated before the IP destination is known: `XDP_PASS` (nothing proves
//!   it is ours; the kernel drops junk itself).
//! - to a VIP *address* but malformed (bad IHL/version, bad length, truncated
//!   or invalid TCP/UDP header): `XDP_DROP`. Never forwarded, never
//!   `XDP_ABORTED`.
//! - IPv4 options to a VIP address: `XDP_DROP`. No TCP/UDP client needs them
//!   (RFC 7126: source-route options are attacks), and a fixed 20-byte header
//!   keeps the hot path short. Katran does the same.
//! - IPv4 or IPv6 fragments to a VIP address: `XDP_DROP`. Only the first
//!   fragment carries ports, so later fragments cannot be hashed to the same
//!   backend; forwarding the first alone would leave the backend a packet it
//!   can never reassemble. Katran does the same.
//! - IPv6 extension headers (hop-by-hop, routing, destination options, AH,
//!   mobility, HIP, shim6) before TCP/UDP to a VIP address: `XDP_PASS` to the
//!   host stack, as Katran does: rare, legitimate, and the kernel knows how to
//!   parse or reject them. ESP and unknown next headers are not a VIP
//!   protocol: passed as not ours.

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_SUCCESS, bpf_fib_lookup as FibParams,
        xdp_action,
    },
    helpers::{bpf_fib_lookup, bpf_ktime_get_coarse_ns, bpf_redirect, bpf_xdp_adjust_head},
    programs::XdpContext,
};
use lb_common::{
    BACKEND_DOWN, BACKEND_DRAINING, BACKEND_UP, BackendInfo, CT_FLAG_CLOSING, CT_TOUCH_INTERVAL_NS,
    CtEntry, DOWN_POLICY_KEEP, FAMILY_V4, FAMILY_V6, FlowKey, Globals, IPIP4_OVERHEAD,
    IPIP6_OVERHEAD, MODE_DSR_IPIP, NEXTHOP_TTL_NS, NextHop, PROTO_TCP, PROTO_UDP, Stat, VipAddrKey,
    VipInfo, VipKey, ring_index,
};

use crate::{
    XLB_BACKENDS, XLB_BE_STATS, XLB_CT, XLB_GLOBALS, XLB_NEXTHOP, XLB_RING, XLB_STATS,
    XLB_VIP_ADDRS, XLB_VIP_INFO, XLB_VIP_PORTS, XLB_VIP_STATS, XLB_VIPS,
    packet::{
        ETH_LEN, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, VLAN_LEN, be16, fib_params,
        ipip4_header, ipip6_header, len, ptr_at,
    },
};

/// TCP flag bits in the 14th byte of the TCP header.
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;

/// IPv6 next-header values of extension headers passed to the host.
const IPV6_EXT_HEADERS: [u8; 7] = [0, 43, 60, 51, 135, 139, 140];
const IPV6_FRAGMENT: u8 = 44;

#[inline(always)]
pub fn count(stat: Stat) {
    if let Some(p) = XLB_STATS.get_ptr_mut(stat as u32) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *p += 1 };
    }
}

#[inline(always)]
fn pass(stat: Stat) -> u32 {
    count(stat);
    xdp_action::XDP_PASS
}

#[inline(always)]
fn drop(stat: Stat) -> u32 {
    count(stat);
    xdp_action::XDP_DROP
}

/// What the parser learned about a packet to a VIP.
struct Packet {
    /// Offset of the IP header: 14, or 18 behind one 802.1Q tag.
    l3off: usize,
    /// Length of the IP packet (header + payload) per its own length field.
    ip_len: usize,
    flow: FlowKey,
    /// TCP flags byte (0 for UDP).
    tcp_flags: u8,
}

impl Packet {
    /// TCP SYN without ACK: a new connection.
    #[inline(always)]
    fn syn(&self) -> bool {
        self.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
    }

    /// TCP FIN or RST: the client is closing the flow.
    #[inline(always)]
    fn closing(&self) -> bool {
        self.tcp_flags & (TCP_FIN | TCP_RST) != 0
    }
}

pub fn run(ctx: &XdpContext) -> u32 {
    let Some(eth) = ptr_at::<[u8; ETH_LEN]>(ctx, 0) else {
        return pass(Stat::PassTruncatedL2);
    };
    // SAFETY: bounds checked by ptr_at.
    let mut proto = unsafe { be16([(*eth)[12], (*eth)[13]]) };
    let mut l3off = ETH_LEN;
    if proto == ETH_P_8021AD {
        return pass(Stat::PassQinQ);
    }
    if proto == ETH_P_8021Q {
        let Some(tag) = ptr_at::<[u8; VLAN_LEN]>(ctx, ETH_LEN) else {
            return pass(Stat::PassTruncatedL2);
        };
        // SAFETY: bounds checked by ptr_at.
        proto = unsafe { be16([(*tag)[2], (*tag)[3]]) };
        if proto == ETH_P_8021Q || proto == ETH_P_8021AD {
            return pass(Stat::PassQinQ);
        }
        l3off = ETH_LEN + VLAN_LEN;
    }
    // One Packet, filled in place by either parser (by-value results of
    // both would each take stack).
    let mut pkt = Packet {
        l3off,
        ip_len: 0,
        flow: FlowKey::default(),
        tcp_flags: 0,
    };
    let parsed = match proto {
        ETH_P_IP => parse_v4(ctx, &mut pkt),
        ETH_P_IPV6 => parse_v6(ctx, &mut pkt),
        _ => return pass(Stat::PassNotIp),
    };
    if let Err(verdict) = parsed {
        return verdict;
    }
    // No VIP on this (protocol, port): not ours, decided without a hash
    // lookup, so the host's own traffic pays almost nothing.
    let port = lb_common::port_index(pkt.flow.proto, u16::from_be(pkt.flow.dport));
    if XLB_VIP_PORTS.get(port).is_none_or(|n| *n == 0) {
        return pass(Stat::PassNotVip);
    }
    let Some(g) = XLB_GLOBALS.get(0) else {
        count(Stat::Aborted);
        return xdp_action::XDP_ABORTED;
    };
    // The coarse clock (CLOCK_MONOTONIC_COARSE, tick resolution) is a plain
    // read; idle timeouts and cache expiry need no better.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    // Established flows: conntrack first. Its key holds the VIP's address,
    // port and protocol, and its value the VIP id, so a hit needs no VIP
    // lookup. A SYN always picks from the current table.
    let mut missed = false;
    if !pkt.syn() {
        match XLB_CT.get_ptr_mut(&pkt.flow) {
            // SAFETY: LRU hash values stay valid for the program's run (RCU);
            // racing writers only store whole u32/u64 fields.
            Some(e) => {
                if let Some((vip, id, be)) = use_ct(&pkt, unsafe { &mut *e }, g, now) {
                    return forward(ctx, &pkt, &vip, id, &be, g, now, false);
                }
            }
            None => missed = true,
        }
    }
    let vip_key = VipKey {
        addr: pkt.flow.dst,
        port: pkt.flow.dport,
        proto: pkt.flow.proto,
        family: pkt.flow.family,
    };
    // SAFETY: a u32 copied out at once.
    let Some(&vip_id) = (unsafe { XLB_VIPS.get(&vip_key) }) else {
        return pass(Stat::PassNotVip);
    };
    let Some(&vip) = XLB_VIP_INFO.get(vip_id) else {
        return pass(Stat::PassNotVip);
    };
    if vip.mode == 0 {
        return pass(Stat::PassNotVip);
    }
    if missed {
        count(Stat::CtMiss);
    }
    let Some((id, be)) = pick(&pkt, &vip, g) else {
        return drop(Stat::DropNoBackend);
    };
    let entry = CtEntry {
        backend_id: id,
        generation: be.generation,
        vip_id,
        // A FIN or RST that misses (an evicted or stale entry) starts the
        // entry closing, as one that hits marks it.
        flags: if pkt.closing() { CT_FLAG_CLOSING } else { 0 },
        last_seen_ns: now,
    };
    match XLB_CT.insert(&pkt.flow, &entry, 0) {
        Ok(()) => count(Stat::CtInsert),
        Err(_) => count(Stat::CtInsertFail),
    }
    forward(ctx, &pkt, &vip, id, &be, g, now, true)
}

#[inline(always)]
fn is_vip_addr(addr: &[u8; 16], family: u8) -> bool {
    let key = VipAddrKey {
        addr: *addr,
        family,
        _pad: [0; 3],
    };
    XLB_VIP_ADDRS.get_ptr(&key).is_some()
}

/// Verdict for a packet that cannot be balanced because of `why`: dropped if
/// it is addressed to a VIP address, passed untouched otherwise. The address
/// set is consulted only here, off the well-formed fast path.
#[inline(always)]
fn bad(dst: &[u8; 16], family: u8, why: Stat) -> u32 {
    if is_vip_addr(dst, family) {
        drop(why)
    } else {
        pass(Stat::PassNotVip)
    }
}

#[inline(always)]
fn parse_v4(ctx: &XdpContext, pkt: &mut Packet) -> Result<(), u32> {
    let l3off = pkt.l3off;
    let Some(ip) = ptr_at::<[u8; 20]>(ctx, l3off) else {
        return Err(pass(Stat::PassTruncatedL3));
    };
    // SAFETY: bounds checked by ptr_at; read in place (the stack is 512 B).
    let ip = unsafe { &*ip };
    // Written in place into the zeroed, 8-byte aligned key: a local
    // [u8; 16] would cost a byte-wise memset call in BPF.
    let flow = &mut pkt.flow;
    flow.proto = ip[9];
    flow.family = FAMILY_V4;
    flow.dst[..4].copy_from_slice(&ip[16..20]);
    let dst = &flow.dst;
    if ip[0] >> 4 != 4 || ip[0] & 0x0f < 5 {
        return Err(bad(dst, FAMILY_V4, Stat::DropBadIhl));
    }
    if ip[0] & 0x0f != 5 {
        return Err(bad(dst, FAMILY_V4, Stat::DropIpOptions));
    }
    let tot_len = be16([ip[2], ip[3]]) as usize;
    if tot_len < 20 || l3off + tot_len > len(ctx) {
        return Err(bad(dst, FAMILY_V4, Stat::DropBadLength));
    }
    // MF flag or a non-zero fragment offset.
    if be16([ip[6], ip[7]]) & 0x3fff != 0 {
        return Err(bad(dst, FAMILY_V4, Stat::DropFragment));
    }
    let proto = ip[9];
    if proto != PROTO_TCP && proto != PROTO_UDP {
        return Err(pass(Stat::PassNotVip));
    }
    let (sport, dport, tcp_flags) = parse_l4(ctx, l3off + 20, tot_len - 20, proto, dst, FAMILY_V4)?;
    let flow = &mut pkt.flow;
    flow.src[..4].copy_from_slice(&ip[12..16]);
    flow.sport = sport;
    flow.dport = dport;
    pkt.ip_len = tot_len;
    pkt.tcp_flags = tcp_flags;
    Ok(())
}

#[inline(always)]
fn parse_v6(ctx: &XdpContext, pkt: &mut Packet) -> Result<(), u32> {
    let l3off = pkt.l3off;
    let Some(ip) = ptr_at::<[u8; 40]>(ctx, l3off) else {
        return Err(pass(Stat::PassTruncatedL3));
    };
    // SAFETY: bounds checked by ptr_at; read in place (the stack is 512 B).
    let ip = unsafe { &*ip };
    // Written in place, as in `parse_v4`.
    let flow = &mut pkt.flow;
    flow.proto = ip[6];
    flow.family = FAMILY_V6;
    flow.dst.copy_from_slice(&ip[24..40]);
    let dst = &flow.dst;
    if ip[0] >> 4 != 6 {
        return Err(bad(dst, FAMILY_V6, Stat::DropBadIhl));
    }
    let payload_len = be16([ip[4], ip[5]]) as usize;
    if l3off + 40 + payload_len > len(ctx) {
        return Err(bad(dst, FAMILY_V6, Stat::DropBadLength));
    }
    let next = ip[6];
    if next == IPV6_FRAGMENT {
        return Err(bad(dst, FAMILY_V6, Stat::DropFragment));
    }
    if IPV6_EXT_HEADERS.contains(&next) {
        let why = if is_vip_addr(dst, FAMILY_V6) {
            Stat::PassIpv6Ext
        } else {
            Stat::PassNotVip
        };
        return Err(pass(why));
    }
    if next != PROTO_TCP && next != PROTO_UDP {
        return Err(pass(Stat::PassNotVip));
    }
    let (sport, dport, tcp_flags) = parse_l4(ctx, l3off + 40, payload_len, next, dst, FAMILY_V6)?;
    let flow = &mut pkt.flow;
    flow.src.copy_from_slice(&ip[8..24]);
    flow.sport = sport;
    flow.dport = dport;
    pkt.ip_len = 40 + payload_len;
    pkt.tcp_flags = tcp_flags;
    Ok(())
}

/// Ports (network order, as stored in keys) and the TCP flags (0 for UDP)
/// of the TCP/UDP header at `off`, whose IP payload is `l4_len` bytes.
#[inline(always)]
fn parse_l4(
    ctx: &XdpContext,
    off: usize,
    l4_len: usize,
    proto: u8,
    dst: &[u8; 16],
    family: u8,
) -> Result<(u16, u16, u8), u32> {
    if proto == PROTO_TCP {
        let Some(tcp) = ptr_at::<[u8; 20]>(ctx, off) else {
            return Err(bad(dst, family, Stat::DropBadL4));
        };
        // SAFETY: bounds checked by ptr_at.
        let tcp = unsafe { &*tcp };
        let doff = (tcp[12] >> 4) as usize * 4;
        if doff < 20 || doff > l4_len {
            return Err(bad(dst, family, Stat::DropBadL4));
        }
        Ok((
            u16::from_ne_bytes([tcp[0], tcp[1]]),
            u16::from_ne_bytes([tcp[2], tcp[3]]),
            tcp[13],
        ))
    } else {
        let Some(udp) = ptr_at::<[u8; 8]>(ctx, off) else {
            return Err(bad(dst, family, Stat::DropBadL4));
        };
        // SAFETY: bounds checked by ptr_at.
        let udp = unsafe { &*udp };
        let ulen = be16([udp[4], udp[5]]) as usize;
        if ulen < 8 || ulen > l4_len {
            return Err(bad(dst, family, Stat::DropBadL4));
        }
        Ok((
            u16::from_ne_bytes([udp[0], udp[1]]),
            u16::from_ne_bytes([udp[2], udp[3]]),
            0,
        ))
    }
}

/// Sends `pkt` to backend `id` and counts it.
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "inlined; BPF has no cheap way to pass a bundle"
)]
fn forward(
    ctx: &XdpContext,
    pkt: &Packet,
    vip: &VipInfo,
    id: u32,
    be: &BackendInfo,
    g: &Globals,
    now: u64,
    new_flow: bool,
) -> u32 {
    let bytes = len(ctx) as u64;
    let verdict = if vip.mode == MODE_DSR_IPIP {
        encap(ctx, pkt, id, be, g, now)
    } else {
        rewrite_l2(ctx, id, be, now)
    };
    if verdict == xdp_action::XDP_TX || verdict == xdp_action::XDP_REDIRECT {
        account(XLB_VIP_STATS.get_ptr_mut(vip.vip_id), bytes, new_flow);
        account(XLB_BE_STATS.get_ptr_mut(id), bytes, new_flow);
    }
    verdict
}

#[inline(always)]
fn account(stats: Option<*mut lb_common::TrafficStats>, bytes: u64, new_flow: bool) {
    if let Some(s) = stats {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe {
            (*s).packets += 1;
            (*s).bytes += bytes;
            if new_flow {
                (*s).new_flows += 1;
            }
        }
    }
}

/// The VIP and backend of conntrack entry `e`, if it may still be used;
/// `None` (counted) when the flow must be picked again.
#[inline(always)]
fn use_ct(
    pkt: &Packet,
    e: &mut CtEntry,
    g: &Globals,
    now: u64,
) -> Option<(VipInfo, u32, BackendInfo)> {
    let vip = *XLB_VIP_INFO.get(e.vip_id)?;
    let be = *XLB_BACKENDS.get(e.backend_id)?;
    // A removed VIP (mode 0) or a recycled backend id: the entry is stale.
    if vip.mode == 0 || be.generation != e.generation || be.state == 0 {
        count(Stat::CtStale);
        return None;
    }
    if pkt.flow.proto == PROTO_UDP
        && g.udp_timeout_ns != 0
        && now.wrapping_sub(e.last_seen_ns) > g.udp_timeout_ns
    {
        count(Stat::CtUdpExpired);
        return None;
    }
    if be.state == BACKEND_DOWN {
        if vip.down_policy != DOWN_POLICY_KEEP {
            count(Stat::DownRehash);
            return None;
        }
        count(Stat::DownKeep);
    } else if be.state != BACKEND_UP && be.state != BACKEND_DRAINING {
        count(Stat::CtStale);
        return None;
    }
    count(Stat::CtHit);
    if now.wrapping_sub(e.last_seen_ns) > CT_TOUCH_INTERVAL_NS {
        e.last_seen_ns = now;
    }
    // The client is closing: tell the daemon's flow count (a drain waits on
    // it). Written once; the entry keeps forwarding the last packets.
    if pkt.closing() && e.flags & CT_FLAG_CLOSING == 0 {
        e.flags |= CT_FLAG_CLOSING;
    }
    Some((vip, e.backend_id, be))
}

/// The backend in the flow's slot of the VIP's live table.
#[inline(always)]
fn pick(pkt: &Packet, vip: &VipInfo, g: &Globals) -> Option<(u32, BackendInfo)> {
    if vip.table_size == 0 || vip.table_size > g.ring_stride {
        return None;
    }
    let slot = pkt.flow.slot(&g.hash_key, vip.table_size);
    let idx = ring_index(vip.vip_id, vip.active & 1, g.ring_stride, slot);
    let id = *XLB_RING.get(idx)?;
    if id == 0 {
        return None;
    }
    let be = *XLB_BACKENDS.get(id)?;
    if be.state == 0 {
        return None;
    }
    Some((id, be))
}

/// The next hop towards backend `id` (`be`): the cached answer, or a fresh
/// `bpf_fib_lookup` when it is missing, expired or for another generation.
/// Null when there is no route or neighbour (not cached: the next packet
/// looks again).
// verifier: not inlined, so the 64-byte fib parameters get their own frame
// instead of adding to the 512-byte stack of the parser. BPF calls take at
// most 5 register arguments, hence the raw pointer result.
#[inline(never)]
fn nexthop(
    ctx: &XdpContext,
    id: u32,
    be: &BackendInfo,
    src: &[u8; 16],
    now: u64,
) -> *const NextHop {
    let Some(nh) = XLB_NEXTHOP.get_ptr_mut(id) else {
        return core::ptr::null();
    };
    // SAFETY: per-CPU slot, only this CPU reads or writes it.
    let nh = unsafe { &mut *nh };
    if nh.generation_plus_one == be.generation.wrapping_add(1) && now < nh.expires_ns {
        return nh;
    }
    // SAFETY: an all-zero bpf_fib_lookup is a valid input.
    let mut p: FibParams = unsafe { core::mem::zeroed() };
    let rc = fib(ctx, &mut p, be, src, 0);
    if rc != BPF_FIB_LKUP_RET_SUCCESS as i64 {
        return core::ptr::null();
    }
    nh.dmac = p.dmac;
    nh.smac = p.smac;
    nh.ifindex = p.ifindex;
    // A second lookup claiming the largest packet makes the kernel report
    // the egress MTU (it only does on BPF_FIB_LKUP_RET_FRAG_NEEDED).
    // SAFETY: as above.
    let mut m: FibParams = unsafe { core::mem::zeroed() };
    let rc = fib(ctx, &mut m, be, src, u16::MAX);
    // SAFETY: reading the union member the kernel wrote.
    nh.mtu = if rc == BPF_FIB_LKUP_RET_FRAG_NEEDED as i64 {
        unsafe { m.__bindgen_anon_1.mtu_result as u32 }
    } else {
        u16::MAX as u32
    };
    nh.generation_plus_one = be.generation.wrapping_add(1);
    nh.expires_ns = now + NEXTHOP_TTL_NS;
    nh
}

/// `bpf_fib_lookup` towards `be` from `src` (a v4 address in the first 4
/// bytes for IPv4); `tot_len` > 0 also checks it against the egress MTU.
#[inline(always)]
fn fib(ctx: &XdpContext, p: &mut FibParams, be: &BackendInfo, src: &[u8; 16], tot_len: u16) -> i64 {
    let v6 = be.family != FAMILY_V4;
    fib_params(p, ctx.ingress_ifindex() as u32, v6, src, &be.addr, tot_len);
    // An input lookup, as if the packet were being forwarded from the
    // ingress interface: any route to the backend is found, through this
    // interface (XDP_TX) or another (redirect). BPF_FIB_LOOKUP_OUTPUT would
    // pin the lookup to the ingress interface as output device. Either way
    // the kernel requires forwarding on the ingress device (checked on
    // 6.18); the daemon sets it.
    unsafe {
        bpf_fib_lookup(
            ctx.ctx as *mut _,
            p,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    }
}

#[inline(always)]
fn send(ctx: &XdpContext, p: &NextHop) -> u32 {
    if p.ifindex as usize == ctx.ingress_ifindex() {
        count(Stat::FwdTx);
        xdp_action::XDP_TX
    } else {
        count(Stat::FwdRedirect);
        unsafe { bpf_redirect(p.ifindex, 0) as u32 }
    }
}

/// Writes destination and source MACs at the start of the frame.
#[inline(always)]
fn set_macs(ctx: &XdpContext, p: &NextHop) -> Option<()> {
    let eth = ptr_at::<[u8; 12]>(ctx, 0)?;
    // SAFETY: bounds checked by ptr_at; distinct from `p`.
    unsafe {
        core::ptr::copy_nonoverlapping(p.dmac.as_ptr(), eth as *mut u8, 6);
        core::ptr::copy_nonoverlapping(p.smac.as_ptr(), (eth as *mut u8).add(6), 6);
    }
    Some(())
}

/// `dsr-l2`: the frame goes unchanged to the backend's MAC.
#[inline(always)]
fn rewrite_l2(ctx: &XdpContext, id: u32, be: &BackendInfo, now: u64) -> u32 {
    // SAFETY: null or a per-CPU map value, valid for this run.
    let Some(nh) = (unsafe { nexthop(ctx, id, be, &[0; 16], now).as_ref() }) else {
        return drop(Stat::DropNoRoute);
    };
    if set_macs(ctx, nh).is_none() {
        count(Stat::Aborted);
        return xdp_action::XDP_ABORTED;
    }
    send(ctx, nh)
}

/// `dsr-ipip`: prepend an outer IPv4 (or IPv6) header addressed to the backend.
#[inline(always)]
fn encap(ctx: &XdpContext, pkt: &Packet, id: u32, be: &BackendInfo, g: &Globals, now: u64) -> u32 {
    let v6 = pkt.flow.family == FAMILY_V6;
    let overhead = if v6 { IPIP6_OVERHEAD } else { IPIP4_OVERHEAD } as usize;
    let src = if v6 { &g.encap_src_v6 } else { &g.encap_src_v4 };
    let outer_len = pkt.ip_len + overhead;
    // SAFETY: null or a per-CPU map value, valid for this run.
    let Some(nh) = (unsafe { nexthop(ctx, id, be, src, now).as_ref() }) else {
        return drop(Stat::DropNoRoute);
    };
    if outer_len as u32 > nh.mtu {
        return drop(Stat::DropTooBig);
    }
    // The 802.1Q TCI, if any, must survive the move of the L2 header.
    let tci = if pkt.l3off == ETH_LEN {
        None
    } else {
        match ptr_at::<[u8; 2]>(ctx, ETH_LEN) {
            // SAFETY: bounds checked by ptr_at.
            Some(t) => Some(unsafe { *t }),
            None => return drop(Stat::DropNoHeadroom),
        }
    };
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(overhead as i32)) } != 0 {
        return drop(Stat::DropNoHeadroom);
    }
    if write_headers(ctx, pkt, be, src, outer_len, tci, nh).is_none() {
        count(Stat::Aborted);
        return xdp_action::XDP_ABORTED;
    }
    send(ctx, nh)
}

/// After `adjust_head`: the L2 header (MACs from `p`, the VLAN tag if any, the
/// ethertype) then the outer IP header, in front of the untouched inner packet.
#[inline(always)]
fn write_headers(
    ctx: &XdpContext,
    pkt: &Packet,
    be: &BackendInfo,
    src: &[u8; 16],
    outer_len: usize,
    tci: Option<[u8; 2]>,
    p: &NextHop,
) -> Option<()> {
    set_macs(ctx, p)?;
    let v6 = pkt.flow.family == FAMILY_V6;
    let ethertype = if v6 { ETH_P_IPV6 } else { ETH_P_IP }.to_be_bytes();
    let off = if let Some(tci) = tci {
        let tag = ptr_at::<[u8; 6]>(ctx, 12)?;
        let q = ETH_P_8021Q.to_be_bytes();
        // SAFETY: bounds checked by ptr_at.
        unsafe { *tag = [q[0], q[1], tci[0], tci[1], ethertype[0], ethertype[1]] };
        ETH_LEN + VLAN_LEN
    } else {
        let et = ptr_at::<[u8; 2]>(ctx, 12)?;
        // SAFETY: bounds checked by ptr_at.
        unsafe { *et = ethertype };
        ETH_LEN
    };
    if v6 {
        write_outer_v6(ctx, off, outer_len, src, &be.addr)
    } else {
        write_outer_v4(ctx, off, outer_len, src, &be.addr)
    }
}

#[inline(always)]
fn write_outer_v4(
    ctx: &XdpContext,
    off: usize,
    outer_len: usize,
    src: &[u8; 16],
    dst: &[u8; 16],
) -> Option<()> {
    let h = ptr_at::<[u8; 40]>(ctx, off)?;
    // SAFETY: bounds checked by ptr_at (outer 20 bytes + the inner header's
    // first 20); written in place, the stack is 512 B.
    let h = unsafe { &mut *h };
    let tos = h[IPIP4_OVERHEAD as usize + 1];
    ipip4_header(h, tos, outer_len as u16, src, dst);
    Some(())
}

#[inline(always)]
fn write_outer_v6(
    ctx: &XdpContext,
    off: usize,
    outer_len: usize,
    src: &[u8; 16],
    dst: &[u8; 16],
) -> Option<()> {
    let h = ptr_at::<[u8; 44]>(ctx, off)?;
    // SAFETY: bounds checked by ptr_at (outer 40 bytes + the inner header's
    // first 4); written in place.
    let h = unsafe { &mut *h };
    let o = IPIP6_OVERHEAD as usize;
    let first = [h[o], h[o + 1], h[o + 2], h[o + 3]];
    ipip6_header(h, first, (outer_len - o) as u16, src, dst);
    Some(())
}
