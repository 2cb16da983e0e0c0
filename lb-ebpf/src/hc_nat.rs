//! `xlb_hc` for NAT VIPs (`nat`, `nat` with `preserve_client`): a data-path
//! probe's packet gets the backend's address as its destination in place
//! of the VIP's, and nothing else.
//!
//! Its source is already the one the backend must answer to: the daemon
//! binds the probe socket to the VIP's pool address (`nat`) or to the LB's
//! own address (`preserve_client`) and writes the probe's NAT flow into
//! `XLB_NAT_FLOWS` / `XLB_NAT_REPLY` before connecting, so the backend's
//! answer meets `xlb_lb`'s NAT reply path, is translated back to VIP →
//! probe, and is passed to the host (`pass_nat_local`). Its destination
//! port is already the backend's: as in DSR modes the probe connects to
//! the VIP's address and the backend's `health_port` (default: its service
//! port), so a `health_port` other than the service port is probed where
//! it is (rewriting to the service port would lose it).
//!
//! Checksums go through `bpf_l3_csum_replace` / `bpf_l4_csum_replace`, not
//! arithmetic on the packet: a locally generated packet is usually
//! CHECKSUM_PARTIAL (veth, any device with TX checksum offload), its L4
//! checksum field holding the pseudo-header sum only; the helpers know
//! that (`inet_proto_csum_replace4`: with CHECKSUM_PARTIAL only the
//! pseudo-header change is applied, the rest is left to the final sum).

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    programs::TcContext,
};
use lb_common::{PROTO_TCP, PROTO_UDP};

use crate::{
    key::word,
    packet::{ETH_LEN, IPV4_LEN, IPV6_LEN},
};

/// Offsets in an IPv4 header: protocol, header checksum, destination.
const V4_PROTO: usize = 9;
const V4_CSUM: usize = 10;
const V4_DST: usize = 16;
/// Offsets in an IPv6 header: next header, destination.
const V6_NEXT: usize = 6;
const V6_DST: usize = 24;
/// Offset of the checksum in a TCP and a UDP header.
const TCP_CSUM: usize = 16;
const UDP_CSUM: usize = 6;

/// Rewrites the probe packet's destination address to `backend` (network
/// order, IPv4 in the first 4 bytes). `None` when the packet is not what a
/// probe socket sends (any IPv4/IPv6 TCP or UDP packet is) or a helper
/// fails: the caller drops it.
#[inline(always)]
pub(crate) fn rewrite(ctx: &TcContext, backend: &[u8; 16], v6: bool) -> Option<()> {
    let ip = ETH_LEN;
    let (proto, l4) = if v6 {
        let next = ctx.load::<u8>(ip + V6_NEXT).ok()?;
        (next, ip + IPV6_LEN)
    } else {
        let vihl = ctx.load::<u8>(ip).ok()?;
        let proto = ctx.load::<u8>(ip + V4_PROTO).ok()?;
        let ihl = usize::from(vihl & 0x0f) * 4;
        if ihl < IPV4_LEN {
            return None;
        }
        (proto, ip + ihl)
    };
    let (csum, flags) = match proto {
        PROTO_TCP => (l4 + TCP_CSUM, 0),
        // A zero UDP checksum over IPv4 (none) stays zero.
        PROTO_UDP => (l4 + UDP_CSUM, u64::from(BPF_F_MARK_MANGLED_0)),
        _ => return None,
    };
    if v6 {
        return dst_v6(ctx, ip + V6_DST, backend, csum, flags);
    }
    let from = ctx.load::<u32>(ip + V4_DST).ok()?;
    let to = word(backend, 0);
    ctx.l3_csum_replace(ip + V4_CSUM, u64::from(from), u64::from(to), 4)
        .ok()?;
    ctx.l4_csum_replace(
        csum,
        u64::from(from),
        u64::from(to),
        flags | u64::from(BPF_F_PSEUDO_HDR) | 4,
    )
    .ok()?;
    ctx.store(ip + V4_DST, &to, 0).ok()
}

/// The IPv6 destination at `at` becomes `to`, word by word, each word's
/// change folded into the L4 checksum at `csum` (IPv6 has no header
/// checksum).
#[inline(always)]
fn dst_v6(ctx: &TcContext, at: usize, to: &[u8; 16], csum: usize, flags: u64) -> Option<()> {
    for i in 0..4 {
        let from = ctx.load::<u32>(at + 4 * i).ok()?;
        let new = word(to, i);
        ctx.l4_csum_replace(
            csum,
            u64::from(from),
            u64::from(new),
            flags | u64::from(BPF_F_PSEUDO_HDR) | 4,
        )
        .ok()?;
    }
    ctx.store(at, to, 0).ok()
}
