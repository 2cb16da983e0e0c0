//! Reset: answer a refused TCP SYN with a RST, built in place and sent back
//! out of the interface it came in on (`XDP_TX`), so the client's connect
//! fails at once instead of retrying into silence: the L4 form of a 429.
//!
//! The reply is what a closed port answers (RFC 9293, 3.10.7.1): MACs,
//! addresses and ports swapped; to a segment without ACK (a SYN)
//! `<SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>` (SYN and FIN count one), to
//! one with ACK (a NAT flow ended under the client, `nat::start`)
//! `<SEQ=SEG.ACK><CTL=RST>`, the sequence number the client expects, so it
//! takes the reset (RFC 5961); no options, no payload; a fresh IPv4 header
//! (TTL 64, DF, id 0) or IPv6 header (hop limit 64, flow label 0). An
//! 802.1Q tag stays as it was.

use aya_ebpf::{helpers::bpf_xdp_adjust_tail, programs::XdpContext};
use lb_common::{ENCAP_TTL, FAMILY_V4, PROTO_TCP, Stat};

use crate::{
    checksum,
    packet::{
        IPV4_LEN, IPV4_VERSION_IHL, IPV6_LEN, Ipv4Hdr, Ipv6Hdr, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN,
        TcpHdr, len, ptr_at, swap_macs,
    },
    parse::Packet,
    stats::{drop_with, tx},
};

const TCP_LEN: usize = core::mem::size_of::<TcpHdr>();

/// Turns the TCP segment `pkt` into its RST and returns `XDP_TX` (counted as
/// `sent`); drops it (counted as `dropped`) if the frame cannot be trimmed,
/// or (`drop_reply_limited`) if this CPU's reply budget is spent.
#[inline(always)]
pub(crate) fn reply(ctx: &XdpContext, pkt: &Packet, sent: Stat, dropped: Stat) -> u32 {
    if !crate::reply::allowed() {
        return crate::reply::limited();
    }
    let v4 = pkt.flow.family == FAMILY_V4;
    let ip_hdr = if v4 { IPV4_LEN } else { IPV6_LEN };
    let l4off = pkt.l3off + ip_hdr;
    let Some(tcp) = ptr_at::<TcpHdr>(ctx, l4off) else {
        return drop_with(dropped);
    };
    // SAFETY: bounds checked by ptr_at.
    let (seq, ack_in, flags, doff) = unsafe {
        (
            u32::from_be_bytes((*tcp).seq),
            u32::from_be_bytes((*tcp).ack_seq),
            (*tcp).flags,
            (*tcp).header_len(),
        )
    };
    let r = if flags & TCP_ACK != 0 {
        Rst {
            seq: ack_in,
            ack: 0,
            flags: TCP_RST,
        }
    } else {
        // SEG.LEN: the data, and one for each of SYN and FIN.
        let data = pkt.ip_len.saturating_sub(ip_hdr + doff) as u32;
        let len = data + u32::from(flags & TCP_SYN != 0) + u32::from(flags & TCP_FIN != 0);
        Rst {
            seq: 0,
            ack: seq.wrapping_add(len),
            flags: TCP_RST | TCP_ACK,
        }
    };
    // Trim to the three headers (the SYN's options and any Ethernet padding
    // go).
    let want = l4off + TCP_LEN;
    let have = len(ctx);
    if have > want {
        // SAFETY: shrinking the frame; the verifier re-checks every pointer.
        let delta = -((have - want) as i32);
        if unsafe { bpf_xdp_adjust_tail(ctx.ctx, delta) } != 0 {
            return drop_with(dropped);
        }
    }
    let done = if v4 {
        ipv4(ctx, pkt.l3off, l4off, &r)
    } else {
        ipv6(ctx, pkt.l3off, l4off, &r)
    };
    if done.is_none() || swap_macs(ctx).is_none() {
        return drop_with(dropped);
    }
    tx(sent)
}

/// The IPv4 header and TCP RST of the reply.
#[inline(always)]
fn ipv4(ctx: &XdpContext, l3off: usize, l4off: usize, r: &Rst) -> Option<()> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, l3off)?;
    let tcp = ptr_at::<TcpHdr>(ctx, l4off)?;
    // SAFETY: bounds checked by ptr_at; the headers do not overlap.
    let (ip, tcp) = unsafe { (&mut *ip, &mut *tcp) };
    core::mem::swap(&mut ip.saddr, &mut ip.daddr);
    ip.version_ihl = IPV4_VERSION_IHL;
    ip.tos = 0;
    ip.tot_len = ((IPV4_LEN + TCP_LEN) as u16).to_be_bytes();
    ip.id = [0; 2];
    ip.frag_off = 0x4000u16.to_be_bytes();
    ip.ttl = ENCAP_TTL;
    ip.protocol = PROTO_TCP;
    ip.check = [0; 2];
    ip.check = checksum::ipv4_header(ip).to_be_bytes();
    rst(tcp, r);
    let pseudo = checksum::sum(&ip.saddr) + checksum::sum(&ip.daddr);
    tcp.check = checksum::tcp(pseudo, tcp).to_be_bytes();
    Some(())
}

/// The IPv6 header and TCP RST of the reply.
#[inline(always)]
fn ipv6(ctx: &XdpContext, l3off: usize, l4off: usize, r: &Rst) -> Option<()> {
    let ip = ptr_at::<Ipv6Hdr>(ctx, l3off)?;
    let tcp = ptr_at::<TcpHdr>(ctx, l4off)?;
    // SAFETY: bounds checked by ptr_at; the headers do not overlap.
    let (ip, tcp) = unsafe { (&mut *ip, &mut *tcp) };
    core::mem::swap(&mut ip.saddr, &mut ip.daddr);
    ip.version_tc_flow = [0x60, 0, 0, 0];
    ip.payload_len = (TCP_LEN as u16).to_be_bytes();
    ip.nexthdr = PROTO_TCP;
    ip.hop_limit = ENCAP_TTL;
    rst(tcp, r);
    let pseudo = checksum::sum(&ip.saddr) + checksum::sum(&ip.daddr);
    tcp.check = checksum::tcp(pseudo, tcp).to_be_bytes();
    Some(())
}

/// What the RST says: its sequence and acknowledgement numbers and flags.
struct Rst {
    seq: u32,
    ack: u32,
    flags: u8,
}

/// The TCP header of the RST `r`, ports swapped, checksum 0.
#[inline(always)]
fn rst(tcp: &mut TcpHdr, r: &Rst) {
    core::mem::swap(&mut tcp.source, &mut tcp.dest);
    tcp.seq = r.seq.to_be_bytes();
    tcp.ack_seq = r.ack.to_be_bytes();
    tcp.doff_res = ((TCP_LEN / 4) as u8) << 4;
    tcp.flags = r.flags;
    tcp.window = [0; 2];
    tcp.check = [0; 2];
    tcp.urg_ptr = [0; 2];
}
