//! Second chance, the decapsulator's half: a tunnel inside the tunnel
//! that a load balancer of ours sends when a packet missed its conntrack
//! (`chance.rs`): outer header LB → us (the slot's current owner), middle
//! header LB → the slot's previous owner, then the client's TCP packet to
//! a VIP. If this host has the connection (an established, request or
//! time-wait socket; a listener does not count), both headers are
//! stripped and the packet goes up; otherwise the outer one is stripped
//! and the rest, now a plain tunnel LB → previous owner, is sent on to it
//! (`bpf_fib_lookup`, TTL decremented, `XDP_TX` or redirect; with a route
//! but no resolved neighbour, passed to the stack, which forwards it). With
//! no route the packet goes up as it would have without second chance.
//!
//! Only exactly that shape is relayed; every other tunnel in a tunnel is
//! dropped (`drop_unchecked`) as before.

use aya_ebpf::{
    bindings::{
        BPF_F_CURRENT_NETNS, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS,
        bpf_fib_lookup as FibParams, bpf_sock_tuple, xdp_action,
    },
    helpers::{
        bpf_fib_lookup, bpf_redirect, bpf_sk_release, bpf_skc_lookup_tcp, bpf_xdp_adjust_head,
    },
    programs::XdpContext,
};
use lb_common::{DecapAddrKey, DecapStat, FAMILY_V4, FAMILY_V6, PROTO_IPIP, PROTO_IPV6, PROTO_TCP};

use crate::{
    XLB_DECAP_ADDR, XLB_DECAP_SRC4, XLB_DECAP_SRC6, XLB_DECAP_STAT, XLB_DECAP_VIP,
    forward::fib_params,
    key::{WordKey, Zeroed, addr_key, addr_words, word},
    packet::{
        ETH_LEN, EthHdr, IPV4_LEN, IPV4_VERSION_IHL, IPV6_LEN, Ipv4Hdr, Ipv6Hdr, TCP_SYN, TcpHdr,
        VLAN_LEN, copy_l2, ptr_at,
    },
    stats::bump,
};

/// `TCP_LISTEN` (include/net/tcp_states.h): a listener is no connection.
const TCP_LISTEN: u32 = 10;

#[inline(always)]
fn done(stat: DecapStat, verdict: u32) -> u32 {
    bump(&XLB_DECAP_STAT, stat as u32);
    verdict
}

/// What a tunnel inside our tunnel holds, once checked.
struct Relay {
    /// The middle header's source and destination (IPv4 in the first 4
    /// bytes), its total length and TTL.
    src: [u8; 16],
    dst: [u8; 16],
    tot_len: u16,
    ttl: u8,
    /// The innermost TCP packet's 4-tuple, as the socket lookup takes it.
    tuple: bpf_sock_tuple,
}

/// Second chance for the packet at `l3off` whose outer header (`outer`
/// bytes, 20 for IPv4) is ours and from an allowed load balancer, and
/// whose payload is a tunnel.
// verifier: not inlined, so the socket tuple and the route lookup get a
// frame of their own beside the decapsulator's.
#[inline(never)]
pub(crate) fn run(ctx: &XdpContext, l3off: usize, outer: usize) -> u32 {
    let v6 = outer != IPV4_LEN;
    let mut slot = Zeroed::<Relay>::uninit();
    let r = slot.zero();
    let checked = if v6 {
        check6(ctx, l3off, r)
    } else {
        check4(ctx, l3off, r)
    };
    if checked.is_none() {
        return done(DecapStat::DropUnchecked, xdp_action::XDP_DROP);
    }
    if has_connection(ctx, r, v6) {
        return up(ctx, l3off, 2 * outer, DecapStat::ChanceLocal);
    }
    let mut fib = Zeroed::<FibParams>::uninit();
    let p = fib.zero();
    fib_params(
        p,
        ctx.ingress_ifindex() as u32,
        v6,
        &r.src,
        &r.dst,
        r.tot_len,
    );
    // SAFETY: a zeroed, filled parameter block of the size passed.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.ctx as *mut _,
            p,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    };
    // A route but no resolved neighbour (backends seldom talk to each
    // other, and XDP cannot resolve one): the stack forwards the plain
    // tunnel to the previous owner itself, resolving it on the way.
    if rc == i64::from(BPF_FIB_LKUP_RET_NO_NEIGH) && r.ttl > 1 {
        return up(ctx, l3off, outer, DecapStat::ChanceForward);
    }
    // No route, forwarding off on this interface, or the packet's hops
    // spent: the stack answers it as without second chance.
    if rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) || r.ttl <= 1 {
        return up(ctx, l3off, 2 * outer, DecapStat::ChanceNoRoute);
    }
    if strip(ctx, l3off, outer).is_none() || relay_headers(ctx, v6, p).is_none() {
        return done(DecapStat::DropMalformed, xdp_action::XDP_DROP);
    }
    bump(&XLB_DECAP_STAT, DecapStat::ChanceForward as u32);
    if p.ifindex as usize == ctx.ingress_ifindex() {
        xdp_action::XDP_TX
    } else {
        // SAFETY: a plain helper call.
        unsafe { bpf_redirect(p.ifindex, 0) as u32 }
    }
}

/// Strips `len` bytes of headers after the L2 header and passes the rest up.
#[inline(always)]
fn up(ctx: &XdpContext, l3off: usize, len: usize, stat: DecapStat) -> u32 {
    if strip(ctx, l3off, len).is_none() {
        return done(DecapStat::DropMalformed, xdp_action::XDP_DROP);
    }
    done(stat, xdp_action::XDP_PASS)
}

/// Moves the L2 header `len` bytes on and drops what it covered.
#[inline(always)]
fn strip(ctx: &XdpContext, l3off: usize, len: usize) -> Option<()> {
    if l3off == ETH_LEN {
        copy_l2::<ETH_LEN>(ctx, 0, len)?;
    } else {
        copy_l2::<{ ETH_LEN + VLAN_LEN }>(ctx, 0, len)?;
    }
    // SAFETY: a plain helper call.
    (unsafe { bpf_xdp_adjust_head(ctx.ctx, len as i32) } == 0).then_some(())
}

/// After the outer header is gone: the next hop's MACs, and the (now
/// outer) middle header's TTL or hop limit one less.
#[inline(always)]
fn relay_headers(ctx: &XdpContext, v6: bool, p: &FibParams) -> Option<()> {
    let eth = ptr_at::<EthHdr>(ctx, 0)?;
    // SAFETY: bounds checked by ptr_at.
    let eth = unsafe { &mut *eth };
    eth.dst = p.dmac;
    eth.src = p.smac;
    let l3 = if eth.ethertype() == crate::packet::ETH_P_8021Q {
        ETH_LEN + VLAN_LEN
    } else {
        ETH_LEN
    };
    if v6 {
        let ip = ptr_at::<Ipv6Hdr>(ctx, l3)?;
        // SAFETY: bounds checked by ptr_at.
        unsafe { (*ip).hop_limit -= 1 };
    } else {
        let ip = ptr_at::<Ipv4Hdr>(ctx, l3)?;
        // SAFETY: bounds checked by ptr_at.
        let ip = unsafe { &mut *ip };
        ip.ttl -= 1;
        // RFC 1624: the TTL is the high byte of its word, so the sum grows
        // by 0x0100 (the kernel's ip_decrease_ttl).
        let c = u32::from(u16::from_be_bytes(ip.check)) + 0x0100;
        ip.check = (((c & 0xffff) + (c >> 16)) as u16).to_be_bytes();
    }
    Some(())
}

/// Whether an allowed load balancer sent the middle header at `off` (its
/// source) and it is addressed to neither us nor a VIP.
#[inline(always)]
fn middle_ok(src: [u32; 4], dst: [u32; 4], v6: bool) -> bool {
    let allowed = if v6 {
        let [a, b, c, d] = src;
        XLB_DECAP_SRC6
            .get(WordKey::<3>::uninit().fill([128, a, b, c, d]).as_trie_key())
            .is_some()
    } else {
        XLB_DECAP_SRC4
            .get(WordKey::<1>::uninit().fill([32, src[0]]).as_trie_key())
            .is_some()
    };
    let family = if v6 { FAMILY_V6 } else { FAMILY_V4 };
    let mut k = WordKey::uninit();
    let key: &DecapAddrKey = addr_key(&mut k, dst, family);
    allowed && XLB_DECAP_ADDR.get_ptr(key).is_none() && XLB_DECAP_VIP.get_ptr(key).is_none()
}

/// Whether `dst` (words) is a VIP this backend serves.
#[inline(always)]
fn serves(dst: [u32; 4], family: u8) -> bool {
    let mut k = WordKey::uninit();
    XLB_DECAP_VIP
        .get_ptr(addr_key::<DecapAddrKey>(&mut k, dst, family))
        .is_some()
}

/// The TCP header at `off`: its ports if it is there and carries no SYN
/// (a load balancer sends a SYN with one header only).
#[inline(always)]
fn tcp_ports(ctx: &XdpContext, off: usize) -> Option<([u8; 2], [u8; 2])> {
    let t = ptr_at::<TcpHdr>(ctx, off)?;
    // SAFETY: bounds checked by ptr_at.
    let t = unsafe { &*t };
    (t.flags & TCP_SYN == 0).then_some((t.source, t.dest))
}

/// IPIP in IPIP: the middle and innermost headers plain 20-byte,
/// unfragmented IPv4, the innermost TCP to a VIP we serve.
#[inline(always)]
fn check4(ctx: &XdpContext, l3off: usize, r: &mut Relay) -> Option<()> {
    let m = ptr_at::<Ipv4Hdr>(ctx, l3off + IPV4_LEN)?;
    // SAFETY: bounds checked by ptr_at.
    let m = unsafe { &*m };
    if m.version_ihl != IPV4_VERSION_IHL || m.is_fragment() || m.protocol != PROTO_IPIP {
        return None;
    }
    let (src, dst) = ([word(&m.saddr, 0), 0, 0, 0], [word(&m.daddr, 0), 0, 0, 0]);
    if !middle_ok(src, dst, false) {
        return None;
    }
    let off = l3off + 2 * IPV4_LEN;
    let i = ptr_at::<Ipv4Hdr>(ctx, off)?;
    // SAFETY: bounds checked by ptr_at.
    let i = unsafe { &*i };
    if i.version_ihl != IPV4_VERSION_IHL || i.is_fragment() || i.protocol != PROTO_TCP {
        return None;
    }
    if !serves([word(&i.daddr, 0), 0, 0, 0], FAMILY_V4) {
        return None;
    }
    let (sport, dport) = tcp_ports(ctx, off + IPV4_LEN)?;
    r.src[..4].copy_from_slice(&m.saddr);
    r.dst[..4].copy_from_slice(&m.daddr);
    r.tot_len = m.tot_len();
    r.ttl = m.ttl;
    // SAFETY: writing the IPv4 member of a zeroed union.
    let t = unsafe { &mut r.tuple.__bindgen_anon_1.ipv4 };
    t.saddr = word(&i.saddr, 0);
    t.daddr = word(&i.daddr, 0);
    t.sport = u16::from_ne_bytes(sport);
    t.dport = u16::from_ne_bytes(dport);
    Some(())
}

/// IP6IP6 in IP6IP6, as [`check4`]: no extension header anywhere.
#[inline(always)]
fn check6(ctx: &XdpContext, l3off: usize, r: &mut Relay) -> Option<()> {
    let m = ptr_at::<Ipv6Hdr>(ctx, l3off + IPV6_LEN)?;
    // SAFETY: bounds checked by ptr_at.
    let m = unsafe { &*m };
    if m.version_tc_flow[0] >> 4 != 6 || m.nexthdr != PROTO_IPV6 {
        return None;
    }
    if !middle_ok(addr_words(&m.saddr), addr_words(&m.daddr), true) {
        return None;
    }
    let off = l3off + 2 * IPV6_LEN;
    let i = ptr_at::<Ipv6Hdr>(ctx, off)?;
    // SAFETY: bounds checked by ptr_at.
    let i = unsafe { &*i };
    if i.version_tc_flow[0] >> 4 != 6 || i.nexthdr != PROTO_TCP {
        return None;
    }
    if !serves(addr_words(&i.daddr), FAMILY_V6) {
        return None;
    }
    let (sport, dport) = tcp_ports(ctx, off + IPV6_LEN)?;
    r.src = m.saddr;
    r.dst = m.daddr;
    r.tot_len = m.payload_len() + IPV6_LEN as u16;
    r.ttl = m.hop_limit;
    // SAFETY: writing the IPv6 member of a zeroed union.
    let t = unsafe { &mut r.tuple.__bindgen_anon_1.ipv6 };
    t.saddr = addr_words(&i.saddr);
    t.daddr = addr_words(&i.daddr);
    t.sport = u16::from_ne_bytes(sport);
    t.dport = u16::from_ne_bytes(dport);
    Some(())
}

/// Whether this host (the program's network namespace) has a socket of
/// the innermost packet's connection: established, request or time-wait
/// (`bpf_skc_lookup_tcp` finds all three; a listener is no connection).
#[inline(always)]
fn has_connection(ctx: &XdpContext, r: &mut Relay, v6: bool) -> bool {
    let size = if v6 { 36 } else { 12 };
    // SAFETY: a tuple of `size` valid bytes; the socket, if any, is
    // released before returning.
    unsafe {
        let sk = bpf_skc_lookup_tcp(
            ctx.ctx as *mut _,
            &mut r.tuple,
            size,
            BPF_F_CURRENT_NETNS as u64,
            0,
        );
        if sk.is_null() {
            return false;
        }
        let state = (*sk).state;
        bpf_sk_release(sk as *mut _);
        state != TCP_LISTEN
    }
}
