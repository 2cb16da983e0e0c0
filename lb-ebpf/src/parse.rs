//! Parse: Ethernet and 802.1Q (shared by `xlb_lb` and `xlb_decap`), then,
//! for `xlb_lb`, IPv4/IPv6 and TCP/UDP into the flow key. Each malformed
//! case gets the verdict the policy in `lb.rs` gives it.

use core::mem::MaybeUninit;

use aya_ebpf::programs::XdpContext;
use lb_common::{
    FAMILY_V4, FAMILY_V6, FlowKey, PROTO_TCP, PROTO_UDP, Stat, VIP_ADDR_HOST_SERVICES,
};

use crate::{
    icmp,
    packet::{
        ETH_LEN, ETH_P_8021AD, ETH_P_8021Q, EthHdr, IPV4_LEN, IPV6_LEN, Ipv4Hdr, Ipv6Hdr, TCP_ACK,
        TCP_FIN, TCP_RST, TCP_SYN, TcpHdr, UdpHdr, VLAN_LEN, VlanHdr, len, ptr_at,
    },
    select::{is_vip_addr, vip_addr},
    stats::{drop_with, pass},
};

/// IPv6 next-header values of extension headers, which xlb does not walk:
/// to a VIP address they are unbalanced (`unbalanced`).
const IPV6_EXT_HEADERS: [u8; 7] = [0, 43, 60, 51, 135, 139, 140];
const IPV6_FRAGMENT: u8 = 44;

/// The L2 header: what follows it and where.
pub(crate) struct L2 {
    /// Ethertype of the L3 header, host order.
    pub ethertype: u16,
    /// Offset of the L3 header: 14, or 18 behind one 802.1Q tag.
    pub l3off: usize,
}

/// Why there is no L3 header to look at.
pub(crate) enum L2Error {
    /// The frame ends inside the Ethernet header or the VLAN tag.
    Truncated,
    /// 802.1ad, or 802.1Q inside 802.1Q: never ours.
    QinQ,
}

/// Parses the Ethernet header and at most one 802.1Q tag.
#[inline(always)]
pub(crate) fn l2(ctx: &XdpContext) -> Result<L2, L2Error> {
    let eth = ptr_at::<EthHdr>(ctx, 0).ok_or(L2Error::Truncated)?;
    // SAFETY: bounds checked by ptr_at.
    let ethertype = unsafe { (*eth).ethertype() };
    if ethertype == ETH_P_8021AD {
        return Err(L2Error::QinQ);
    }
    if ethertype != ETH_P_8021Q {
        return Ok(L2 {
            ethertype,
            l3off: ETH_LEN,
        });
    }
    let tag = ptr_at::<VlanHdr>(ctx, ETH_LEN).ok_or(L2Error::Truncated)?;
    // SAFETY: bounds checked by ptr_at.
    let ethertype = unsafe { (*tag).ethertype() };
    if ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD {
        return Err(L2Error::QinQ);
    }
    Ok(L2 {
        ethertype,
        l3off: ETH_LEN + VLAN_LEN,
    })
}

/// What the parser learned about a packet to a VIP.
pub(crate) struct Packet {
    /// Offset of the IP header: 14, or 18 behind one 802.1Q tag.
    pub l3off: usize,
    /// Length of the IP packet (header + payload) per its own length field.
    pub ip_len: usize,
    pub flow: FlowKey,
    /// TCP flags byte (0 for UDP and ICMP).
    pub tcp_flags: u8,
    /// An ICMP error about a VIP flow: `flow` is the quoted flow, reversed
    /// (client → VIP). Sent on like the flow's packets; never inserted in
    /// conntrack, never judged by the guard.
    pub icmp: bool,
}

impl Packet {
    /// An empty packet whose IP header is at `l3off`, made in `slot` for
    /// `ipv4`/`ipv6` to fill in place (by-value results of both would each
    /// take stack).
    ///
    /// Every field is written with a volatile store that LLVM may not merge:
    /// zero-initialising the struct any plainer way compiles to a call of
    /// the byte-wise `memset` (50 iterations of a 5-instruction loop) on
    /// every packet, the non-VIP path included (issue 11).
    #[inline(always)]
    pub(crate) fn init(slot: &mut MaybeUninit<Packet>, l3off: usize) -> &mut Packet {
        let p = slot.as_mut_ptr();
        // SAFETY: every field is written before `assume_init_mut`; `FlowKey`
        // is 40 bytes aligned to 8, so five u64 stores cover it exactly.
        unsafe {
            (&raw mut (*p).l3off).write_volatile(l3off);
            (&raw mut (*p).ip_len).write_volatile(0);
            let flow = (&raw mut (*p).flow).cast::<u64>();
            let mut i = 0;
            while i < core::mem::size_of::<FlowKey>() / 8 {
                flow.add(i).write_volatile(0);
                i += 1;
            }
            (&raw mut (*p).tcp_flags).write_volatile(0);
            (&raw mut (*p).icmp).write_volatile(false);
            slot.assume_init_mut()
        }
    }

    /// TCP SYN without ACK: a new connection.
    #[inline(always)]
    pub(crate) fn syn(&self) -> bool {
        self.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
    }

    /// TCP SYN with FIN or RST: starts and ends a connection at once.
    #[inline(always)]
    pub(crate) fn syn_fin_or_rst(&self) -> bool {
        self.tcp_flags & TCP_SYN != 0 && self.tcp_flags & (TCP_FIN | TCP_RST) != 0
    }

    /// TCP FIN or RST: the client is closing the flow.
    #[inline(always)]
    pub(crate) fn closing(&self) -> bool {
        self.tcp_flags & (TCP_FIN | TCP_RST) != 0
    }
}

/// Verdict for a packet that cannot be balanced because of `why`: dropped if
/// it is addressed to a VIP address, passed untouched otherwise. The address
/// set is consulted only here, off the well-formed fast path.
#[inline(always)]
pub(crate) fn bad(dst: &[u8; 16], family: u8, why: Stat) -> u32 {
    if is_vip_addr(dst, family) {
        drop_with(why)
    } else {
        pass(Stat::PassNotVip)
    }
}

/// Verdict for a packet to `dst` that no VIP balances (another port or
/// protocol, ICMP xlb does not answer, IPv6 extension headers): passed if
/// `dst` carries no VIP (not ours), else as [`unbalanced_at`] says.
#[inline(always)]
pub(crate) fn unbalanced(dst: &[u8; 16], family: u8, host: Stat) -> u32 {
    match vip_addr(dst, family) {
        None => pass(Stat::PassNotVip),
        Some(bits) => unbalanced_at(bits, host),
    }
}

/// Verdict for a packet that no VIP balances to a VIP address with
/// `XLB_VIP_ADDRS` bits `bits`: passed to the host (counted `host`) if a
/// VIP there sets `host_services`, else dropped. The host does not hold a
/// VIP address, and forwarding is on (`bpf_fib_lookup` needs it), so the
/// kernel would route the packet back to the router that sent it here,
/// which sends it back again until its TTL runs out: one packet from any
/// client would cross the uplink a hundred times.
#[inline(always)]
pub(crate) fn unbalanced_at(bits: u32, host: Stat) -> u32 {
    // Only a NAT pool address (the host's own): not ours.
    if bits & lb_common::VIP_ADDR_BALANCED == 0 {
        pass(Stat::PassNotVip)
    } else if bits & VIP_ADDR_HOST_SERVICES != 0 {
        pass(host)
    } else {
        drop_with(Stat::DropVipUnbalanced)
    }
}

/// Parses the IPv4 header and the TCP/UDP header behind it into `pkt`;
/// `Err` holds the verdict (counted) for a packet that is not balanced.
#[inline(always)]
pub(crate) fn ipv4(ctx: &XdpContext, pkt: &mut Packet) -> Result<(), u32> {
    let l3off = pkt.l3off;
    let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, l3off) else {
        return Err(pass(Stat::PassTruncatedL3));
    };
    // SAFETY: bounds checked by ptr_at; read in place (the stack is 512 B).
    let ip = unsafe { &*ip };
    // Written in place into the zeroed, 8-byte aligned key: a local
    // [u8; 16] would cost a byte-wise memset call in BPF.
    let flow = &mut pkt.flow;
    flow.proto = ip.protocol;
    flow.family = FAMILY_V4;
    flow.dst[..4].copy_from_slice(&ip.daddr);
    let dst = &flow.dst;
    if ip.version() != 4 || ip.ihl() < 5 {
        return Err(bad(dst, FAMILY_V4, Stat::DropBadIhl));
    }
    if ip.ihl() != 5 {
        return Err(bad(dst, FAMILY_V4, Stat::DropIpOptions));
    }
    let tot_len = ip.tot_len() as usize;
    if tot_len < IPV4_LEN || l3off + tot_len > len(ctx) {
        return Err(bad(dst, FAMILY_V4, Stat::DropBadLength));
    }
    if ip.is_fragment() {
        return Err(bad(dst, FAMILY_V4, Stat::DropFragment));
    }
    let proto = ip.protocol;
    if proto == icmp::PROTO_ICMP {
        // The ICMP parser reads no further than the packet's own length.
        pkt.ip_len = tot_len;
        let v = icmp::v4(ctx, pkt);
        return if v == icmp::QUOTED { Ok(()) } else { Err(v) };
    }
    if proto != PROTO_TCP && proto != PROTO_UDP {
        return Err(unbalanced(dst, FAMILY_V4, Stat::PassVipHost));
    }
    let l4_len = tot_len - IPV4_LEN;
    let (sport, dport, tcp_flags) = l4(ctx, l3off + IPV4_LEN, l4_len, proto, dst, FAMILY_V4)?;
    let flow = &mut pkt.flow;
    flow.src[..4].copy_from_slice(&ip.saddr);
    flow.sport = sport;
    flow.dport = dport;
    pkt.ip_len = tot_len;
    pkt.tcp_flags = tcp_flags;
    Ok(())
}

/// Parses the IPv6 header and the TCP/UDP header right behind it into
/// `pkt`, as [`ipv4`] does.
#[inline(always)]
pub(crate) fn ipv6(ctx: &XdpContext, pkt: &mut Packet) -> Result<(), u32> {
    let l3off = pkt.l3off;
    let Some(ip) = ptr_at::<Ipv6Hdr>(ctx, l3off) else {
        return Err(pass(Stat::PassTruncatedL3));
    };
    // SAFETY: bounds checked by ptr_at; read in place (the stack is 512 B).
    let ip = unsafe { &*ip };
    // Written in place, as in `ipv4`.
    let flow = &mut pkt.flow;
    flow.proto = ip.nexthdr;
    flow.family = FAMILY_V6;
    flow.dst.copy_from_slice(&ip.daddr);
    let dst = &flow.dst;
    if ip.version() != 6 {
        return Err(bad(dst, FAMILY_V6, Stat::DropBadIhl));
    }
    let payload_len = ip.payload_len() as usize;
    if l3off + IPV6_LEN + payload_len > len(ctx) {
        return Err(bad(dst, FAMILY_V6, Stat::DropBadLength));
    }
    let next = ip.nexthdr;
    if next == IPV6_FRAGMENT {
        return Err(bad(dst, FAMILY_V6, Stat::DropFragment));
    }
    if IPV6_EXT_HEADERS.contains(&next) {
        return Err(unbalanced(dst, FAMILY_V6, Stat::PassIpv6Ext));
    }
    if next == icmp::PROTO_ICMP6 {
        pkt.ip_len = IPV6_LEN + payload_len;
        let v = icmp::v6(ctx, pkt);
        return if v == icmp::QUOTED { Ok(()) } else { Err(v) };
    }
    if next != PROTO_TCP && next != PROTO_UDP {
        return Err(unbalanced(dst, FAMILY_V6, Stat::PassVipHost));
    }
    let (sport, dport, tcp_flags) = l4(ctx, l3off + IPV6_LEN, payload_len, next, dst, FAMILY_V6)?;
    let flow = &mut pkt.flow;
    flow.src.copy_from_slice(&ip.saddr);
    flow.sport = sport;
    flow.dport = dport;
    pkt.ip_len = IPV6_LEN + payload_len;
    pkt.tcp_flags = tcp_flags;
    Ok(())
}

/// Ports (network order, as stored in keys) and the TCP flags (0 for UDP)
/// of the TCP/UDP header at `off`, whose IP payload is `l4_len` bytes.
#[inline(always)]
fn l4(
    ctx: &XdpContext,
    off: usize,
    l4_len: usize,
    proto: u8,
    dst: &[u8; 16],
    family: u8,
) -> Result<(u16, u16, u8), u32> {
    if proto == PROTO_TCP {
        let Some(tcp) = ptr_at::<TcpHdr>(ctx, off) else {
            return Err(bad(dst, family, Stat::DropBadL4));
        };
        // SAFETY: bounds checked by ptr_at.
        let tcp = unsafe { &*tcp };
        let doff = tcp.header_len();
        if doff < core::mem::size_of::<TcpHdr>() || doff > l4_len {
            return Err(bad(dst, family, Stat::DropBadL4));
        }
        Ok((
            u16::from_ne_bytes(tcp.source),
            u16::from_ne_bytes(tcp.dest),
            tcp.flags,
        ))
    } else {
        let Some(udp) = ptr_at::<UdpHdr>(ctx, off) else {
            return Err(bad(dst, family, Stat::DropBadL4));
        };
        // SAFETY: bounds checked by ptr_at.
        let udp = unsafe { &*udp };
        let ulen = udp.length() as usize;
        if ulen < core::mem::size_of::<UdpHdr>() || ulen > l4_len {
            return Err(bad(dst, family, Stat::DropBadL4));
        }
        Ok((
            u16::from_ne_bytes(udp.source),
            u16::from_ne_bytes(udp.dest),
            0,
        ))
    }
}
