//! `xlb_decap`: strips the outer header of IPv4-in-IPv4 and IPv6-in-IPv6
//! packets addressed to this backend, so the inner packet (client → VIP)
//! reaches the stack as if it had arrived directly. Everything else passes
//! untouched.

use aya_ebpf::{bindings::xdp_action, helpers::bpf_xdp_adjust_head, programs::XdpContext};
use lb_common::{DecapAddrKey, DecapStat, FAMILY_V4, FAMILY_V6, PROTO_IPIP, PROTO_IPV6};

use crate::{
    XLB_DECAP_ADDR, XLB_DECAP_STAT,
    packet::{
        ETH_LEN, ETH_P_IP, ETH_P_IPV6, IPV4_LEN, IPV4_VERSION_IHL, IPV6_LEN, Ipv4Hdr, Ipv6Hdr,
        VLAN_LEN, ptr_at,
    },
    parse,
    stats::bump,
};

#[inline(always)]
fn count(stat: DecapStat) {
    bump(&XLB_DECAP_STAT, stat as u32);
}

#[inline(always)]
fn pass() -> u32 {
    count(DecapStat::Pass);
    xdp_action::XDP_PASS
}

#[inline(always)]
fn is_ours(addr: [u8; 16], family: u8) -> bool {
    XLB_DECAP_ADDR
        .get_ptr(&DecapAddrKey {
            addr,
            family,
            _pad: [0; 3],
        })
        .is_some()
}

pub(crate) fn run(ctx: &XdpContext) -> u32 {
    // Tagged or not, truncated or not: a frame with no IP header is not ours.
    let Ok(l2) = parse::l2(ctx) else {
        return pass();
    };
    let l3off = l2.l3off;
    let outer = match l2.ethertype {
        ETH_P_IP if ipip4_to_us(ctx, l3off) => IPV4_LEN,
        ETH_P_IPV6 if ip6ip6_to_us(ctx, l3off) => IPV6_LEN,
        _ => return pass(),
    };
    // The inner header (of the outer one's family, so as long) must be
    // there: a tunnel packet to us with nothing inside is dropped, never
    // passed up half-stripped.
    if ptr_at::<[u8; 1]>(ctx, l3off + 2 * outer - 1).is_none() {
        count(DecapStat::DropMalformed);
        return xdp_action::XDP_DROP;
    }
    let moved = if l3off == ETH_LEN {
        move_l2::<ETH_LEN>(ctx, outer)
    } else {
        move_l2::<{ ETH_LEN + VLAN_LEN }>(ctx, outer)
    };
    if moved.is_none() || unsafe { bpf_xdp_adjust_head(ctx.ctx, outer as i32) } != 0 {
        count(DecapStat::DropMalformed);
        return xdp_action::XDP_DROP;
    }
    count(DecapStat::Decap);
    xdp_action::XDP_PASS
}

/// IPv4-in-IPv4 to one of our addresses. Only a plain 20-byte, unfragmented
/// outer header is ours to strip.
#[inline(always)]
fn ipip4_to_us(ctx: &XdpContext, l3off: usize) -> bool {
    let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, l3off) else {
        return false;
    };
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &*ip };
    let mut dst = [0u8; 16];
    dst[..4].copy_from_slice(&ip.daddr);
    ip.protocol == PROTO_IPIP
        && ip.version_ihl == IPV4_VERSION_IHL
        && is_ours(dst, FAMILY_V4)
        && !ip.is_fragment()
}

/// IPv6-in-IPv6 to one of our addresses.
#[inline(always)]
fn ip6ip6_to_us(ctx: &XdpContext, l3off: usize) -> bool {
    let Some(ip) = ptr_at::<Ipv6Hdr>(ctx, l3off) else {
        return false;
    };
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &*ip };
    ip.nexthdr == PROTO_IPV6 && is_ours(ip.daddr, FAMILY_V6)
}

/// Copies the `L`-byte L2 header `shift` bytes forward, over the end of the
/// outer IP header, so that after `adjust_head(shift)` it precedes the inner one.
#[inline(always)]
fn move_l2<const L: usize>(ctx: &XdpContext, shift: usize) -> Option<()> {
    let old = ptr_at::<[u8; L]>(ctx, 0)?;
    let new = ptr_at::<[u8; L]>(ctx, shift)?;
    // SAFETY: both ranges checked by ptr_at; copied via the stack (overlap).
    unsafe {
        let hdr = *old;
        *new = hdr;
    }
    Some(())
}
