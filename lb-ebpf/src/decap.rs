//! `xlb_decap`: strips the outer header of IPv4-in-IPv4 and IPv6-in-IPv6
//! packets addressed to this backend, so the inner packet (client → VIP)
//! reaches the stack as if it had arrived directly. Everything else passes
//! untouched.

use aya_ebpf::{bindings::xdp_action, helpers::bpf_xdp_adjust_head, programs::XdpContext};
use lb_common::{DecapAddrKey, DecapStat, FAMILY_V4, FAMILY_V6, PROTO_IPIP, PROTO_IPV6};

use crate::{
    XLB_DECAP_ADDR, XLB_DECAP_STAT,
    packet::{ETH_LEN, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, VLAN_LEN, be16, ptr_at},
};

#[inline(always)]
fn count(stat: DecapStat) {
    if let Some(p) = XLB_DECAP_STAT.get_ptr_mut(stat as u32) {
        // SAFETY: per-CPU slot.
        unsafe { *p += 1 };
    }
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

pub fn run(ctx: &XdpContext) -> u32 {
    let Some(eth) = ptr_at::<[u8; ETH_LEN]>(ctx, 0) else {
        count(DecapStat::Pass);
        return xdp_action::XDP_PASS;
    };
    // SAFETY: bounds checked by ptr_at.
    let mut proto = unsafe { be16([(*eth)[12], (*eth)[13]]) };
    let mut l3off = ETH_LEN;
    if proto == ETH_P_8021Q {
        let Some(tag) = ptr_at::<[u8; VLAN_LEN]>(ctx, ETH_LEN) else {
            count(DecapStat::Pass);
            return xdp_action::XDP_PASS;
        };
        // SAFETY: bounds checked by ptr_at.
        proto = unsafe { be16([(*tag)[2], (*tag)[3]]) };
        l3off = ETH_LEN + VLAN_LEN;
    }
    let (outer, inner_min) = match proto {
        ETH_P_IP => {
            let Some(ip) = ptr_at::<[u8; 20]>(ctx, l3off) else {
                count(DecapStat::Pass);
                return xdp_action::XDP_PASS;
            };
            // SAFETY: bounds checked by ptr_at.
            let ip = unsafe { *ip };
            let mut dst = [0u8; 16];
            dst[..4].copy_from_slice(&ip[16..20]);
            // Only a plain 20-byte, unfragmented outer header is ours to strip.
            if ip[9] != PROTO_IPIP || ip[0] != 0x45 || !is_ours(dst, FAMILY_V4) {
                count(DecapStat::Pass);
                return xdp_action::XDP_PASS;
            }
            if be16([ip[6], ip[7]]) & 0x3fff != 0 {
                count(DecapStat::Pass);
                return xdp_action::XDP_PASS;
            }
            (20usize, 20usize)
        }
        ETH_P_IPV6 => {
            let Some(ip) = ptr_at::<[u8; 40]>(ctx, l3off) else {
                count(DecapStat::Pass);
                return xdp_action::XDP_PASS;
            };
            // SAFETY: bounds checked by ptr_at.
            let ip = unsafe { *ip };
            let mut dst = [0u8; 16];
            dst.copy_from_slice(&ip[24..40]);
            if ip[6] != PROTO_IPV6 || !is_ours(dst, FAMILY_V6) {
                count(DecapStat::Pass);
                return xdp_action::XDP_PASS;
            }
            (40usize, 40usize)
        }
        _ => {
            count(DecapStat::Pass);
            return xdp_action::XDP_PASS;
        }
    };
    // The inner header must be there: a tunnel packet to us with nothing
    // inside is dropped, never passed up half-stripped.
    if ptr_at::<[u8; 1]>(ctx, l3off + outer + inner_min - 1).is_none() {
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
