//! Encap (`dsr-ipip`): make room in front of the packet and write an L2
//! header and an outer IPv4 (IPv6) header addressed to the backend, field
//! by field, as Katran's `encap_helpers.h` does. The outer header writers
//! are shared with `xlb_hc`, so a probe is encapsulated exactly as clients'
//! packets are.

use aya_ebpf::{helpers::bpf_xdp_adjust_head, programs::XdpContext};
use lb_common::{
    BackendInfo, ENCAP_TTL, Globals, IPIP4_OVERHEAD, IPIP6_OVERHEAD, MAX_ENCAP_HOST_BITS, NextHop,
    PROTO_IPIP, PROTO_IPV6, Stat, encap_hash, encap_hash_v4,
};

use crate::{
    checksum,
    forward::{copy_macs, nexthop, send},
    icmp,
    key::word,
    packet::{
        ETH_LEN, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, EthHdr, IPV4_VERSION_IHL, Ipv4Hdr, Ipv6Hdr,
        VLAN_LEN, VlanHdr, ptr_at,
    },
    parse::Packet,
    stats::{aborted, drop_with},
};

/// Outer IPv4 header and the inner one it is written in front of (its TOS
/// is carried out).
#[repr(C)]
struct Ipip4 {
    outer: Ipv4Hdr,
    inner: Ipv4Hdr,
}

/// Outer IPv6 header and the first word of the inner one (version, traffic
/// class, flow label: carried out).
#[repr(C)]
struct Ip6ip6 {
    outer: Ipv6Hdr,
    inner_version_tc_flow: [u8; 4],
}

/// `dsr-ipip`: prepend an outer IPv4 (or, `V6`, IPv6: the packet's own
/// family) header addressed to the backend `id` (`be`) and send the packet
/// to its next hop. One copy per family: the family is then known at every
/// step instead of tested again at each.
#[inline(always)]
pub(crate) fn encap<const V6: bool>(
    ctx: &XdpContext,
    pkt: &Packet,
    id: u32,
    be: &BackendInfo,
    g: &Globals,
    now: u64,
) -> u32 {
    let overhead = if V6 { IPIP6_OVERHEAD } else { IPIP4_OVERHEAD } as usize;
    let outer_len = pkt.ip_len + overhead;
    // The route lookup (on a next-hop cache miss) is made from the
    // configured encapsulation source; each flow's packets carry their own
    // address within its prefix (`spread_v4`).
    let base = if V6 { &g.encap_src_v6 } else { &g.encap_src_v4 };
    // SAFETY: null or a per-CPU map value, valid for this run.
    let Some(nh) = (unsafe { nexthop(ctx, id, be, base, now).as_ref() }) else {
        return drop_with(Stat::DropNoRoute);
    };
    if outer_len as u32 > nh.mtu {
        // The largest client packet that fits once encapsulated.
        return icmp::too_big(ctx, pkt, nh.mtu.saturating_sub(overhead as u32));
    }
    // The 802.1Q TCI, if any, must survive the move of the L2 header.
    let Some(tci) = vlan_tci(ctx, pkt) else {
        return drop_with(Stat::DropNoHeadroom);
    };
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(overhead as i32)) } != 0 {
        return drop_with(Stat::DropNoHeadroom);
    }
    // One value per flow spreads the outer headers (IPv4 source within
    // its prefix, IPv6 flow label) over the backend's RSS queues.
    let spread = if V6 {
        encap_hash(&pkt.flow.src, pkt.flow.sport)
    } else {
        encap_hash_v4(&pkt.flow.src, pkt.flow.sport)
    };
    if write_headers(ctx, V6, &be.addr, g, outer_len, tci, nh, spread).is_none() {
        return aborted();
    }
    send(ctx, nh)
}

/// The packet's 802.1Q TCI (`Some(None)` untagged), which must survive
/// the move of the L2 header; `None` if the tag cannot be read.
#[inline(always)]
pub(crate) fn vlan_tci(ctx: &XdpContext, pkt: &Packet) -> Option<Option<[u8; 2]>> {
    if pkt.l3off == ETH_LEN {
        return Some(None);
    }
    let t = ptr_at::<VlanHdr>(ctx, ETH_LEN)?;
    // SAFETY: bounds checked by ptr_at.
    Some(Some(unsafe { (*t).tci }))
}

/// `base` (an IPv4 address as a word in memory order) with its low
/// `host_bits` taken from `spread`, in the same order.
#[inline(always)]
pub(crate) fn spread_v4(base: u32, host_bits: u8, spread: u32) -> u32 {
    if host_bits == 0 || host_bits > MAX_ENCAP_HOST_BITS {
        return base;
    }
    let mask = (1u32 << host_bits) - 1;
    ((u32::from_be(base) & !mask) | (spread & mask)).to_be()
}

/// After `adjust_head`: the L2 header (MACs from `nh`, the VLAN tag if any,
/// the ethertype) then the outer IP header from `g`'s encapsulation source
/// to `dst`, in front of the untouched inner packet; `spread` picks the
/// IPv4 source within its prefix, or is the IPv6 flow label (low 20 bits).
#[allow(
    clippy::too_many_arguments,
    reason = "inlined; each is one value of the one packet"
)]
#[inline(always)]
fn write_headers(
    ctx: &XdpContext,
    v6: bool,
    dst: &[u8; 16],
    g: &Globals,
    outer_len: usize,
    tci: Option<[u8; 2]>,
    nh: &NextHop,
    spread: u32,
) -> Option<()> {
    let ethertype = if v6 { ETH_P_IPV6 } else { ETH_P_IP }.to_be_bytes();
    let off = write_l2(ctx, nh, ethertype, tci)?;
    if v6 {
        let h = ptr_at::<Ip6ip6>(ctx, off)?;
        // SAFETY: bounds checked by ptr_at; written in place (the stack is 512 B).
        let h = unsafe { &mut *h };
        // Version and traffic class from the inner header, the flow label
        // from the flow.
        let inner = h.inner_version_tc_flow;
        let first = [
            inner[0],
            (inner[1] & 0xf0) | ((spread >> 16) & 0x0f) as u8,
            (spread >> 8) as u8,
            spread as u8,
        ];
        let payload = (outer_len - IPIP6_OVERHEAD as usize) as u16;
        ipip6_header(&mut h.outer, first, payload, &g.encap_src_v6, dst);
    } else {
        let h = ptr_at::<Ipip4>(ctx, off)?;
        // SAFETY: bounds checked by ptr_at; written in place.
        let h = unsafe { &mut *h };
        let tos = h.inner.tos;
        let src = spread_v4(word(&g.encap_src_v4, 0), g.encap_v4_host_bits, spread);
        ipip4_header(&mut h.outer, tos, outer_len as u16, src, word(dst, 0));
    }
    Some(())
}

/// Writes the L2 header: the next hop's MACs, then the ethertype (network
/// order), behind an 802.1Q tag with `tci` if there is one; returns the
/// offset of the L3 header.
#[inline(always)]
pub(crate) fn write_l2(
    ctx: &XdpContext,
    nh: &NextHop,
    ethertype: [u8; 2],
    tci: Option<[u8; 2]>,
) -> Option<usize> {
    let Some(tci) = tci else {
        let eth = ptr_at::<EthHdr>(ctx, 0)?;
        // SAFETY: bounds checked by ptr_at.
        let eth = unsafe { &mut *eth };
        copy_macs(eth, nh);
        eth.ethertype = ethertype;
        return Some(ETH_LEN);
    };
    let tagged = ptr_at::<TaggedEth>(ctx, 0)?;
    // SAFETY: bounds checked by ptr_at.
    let t = unsafe { &mut *tagged };
    copy_macs(&mut t.eth, nh);
    t.eth.ethertype = ETH_P_8021Q.to_be_bytes();
    t.tag.tci = tci;
    t.tag.ethertype = ethertype;
    Some(ETH_LEN + VLAN_LEN)
}

/// An Ethernet header with one 802.1Q tag.
#[repr(C)]
struct TaggedEth {
    eth: EthHdr,
    tag: VlanHdr,
}

/// Writes the outer IPv4 header of IPv4-in-IPv4 over `h`, every field of it
/// (a header written in place over old bytes leaves none behind): no
/// options, the inner packet's `tos`, total length `total`, id 0 and no
/// fragment flags (the outer header is never fragmented), TTL
/// [`ENCAP_TTL`], protocol IPIP, `src` and `dst` (addresses as words in
/// memory order), and the checksum.
#[inline(always)]
pub(crate) fn ipip4_header(h: &mut Ipv4Hdr, tos: u8, total: u16, src: u32, dst: u32) {
    h.version_ihl = IPV4_VERSION_IHL;
    h.tos = tos;
    h.tot_len = total.to_be_bytes();
    h.id = [0; 2];
    h.frag_off = [0; 2];
    h.ttl = ENCAP_TTL;
    h.protocol = PROTO_IPIP;
    h.check = [0; 2];
    h.saddr = src.to_ne_bytes();
    h.daddr = dst.to_ne_bytes();
    // Summed from the values just written, not read back byte by byte
    // from the packet: id and fragment words are zero.
    let (s, d) = (u32::from_be(src), u32::from_be(dst));
    let sum = u32::from(u16::from_be_bytes([IPV4_VERSION_IHL, tos]))
        + u32::from(total)
        + u32::from(u16::from_be_bytes([ENCAP_TTL, PROTO_IPIP]))
        + (s >> 16)
        + (s & 0xffff)
        + (d >> 16)
        + (d & 0xffff);
    h.check = checksum::fold(sum).to_be_bytes();
}

/// Writes the outer IPv6 header of IPv6-in-IPv6 over `h`: version, traffic
/// class and flow label `first` copied from the inner header (so ECMP on
/// the way keeps the flow on one path), payload length `payload`, next
/// header IPv6, hop limit [`ENCAP_TTL`], `src`, `dst`.
#[inline(always)]
pub(crate) fn ipip6_header(
    h: &mut Ipv6Hdr,
    first: [u8; 4],
    payload: u16,
    src: &[u8; 16],
    dst: &[u8; 16],
) {
    h.version_tc_flow = first;
    h.payload_len = payload.to_be_bytes();
    h.nexthdr = PROTO_IPV6;
    h.hop_limit = ENCAP_TTL;
    // Copies, not assignments: LLVM cannot tell the packet from the map
    // value, and compiles an assignment to a call to the byte-wise memmove.
    // SAFETY: 16 bytes each; the packet and the sources are distinct.
    unsafe {
        core::ptr::copy_nonoverlapping(src.as_ptr(), h.saddr.as_mut_ptr(), 16);
        core::ptr::copy_nonoverlapping(dst.as_ptr(), h.daddr.as_mut_ptr(), 16);
    }
}
