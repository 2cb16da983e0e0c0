//! `xlb_decap`: strips the outer header of IPv4-in-IPv4 and IPv6-in-IPv6
//! packets addressed to this backend, so the inner packet (client → VIP)
//! reaches the stack as if it had arrived directly.
//!
//! Only tunnels that a load balancer of ours could have sent are stripped:
//! the outer source must be in an allowed prefix (`XLB_DECAP_SRC4/6`,
//! `xlb decap --allow-source`) and the inner destination a VIP address this
//! backend serves (`XLB_DECAP_VIP`, `--vip`). Anything else to our
//! addresses is dropped and counted, never passed up: a forged inner
//! source must not reach the stack. Traffic that is not a tunnel to us
//! passes untouched.

use aya_ebpf::{bindings::xdp_action, helpers::bpf_xdp_adjust_head, programs::XdpContext};
use lb_common::{DecapAddrKey, DecapStat, FAMILY_V4, FAMILY_V6, PROTO_IPIP, PROTO_IPV6};

use crate::{
    XLB_DECAP_ADDR, XLB_DECAP_SRC4, XLB_DECAP_SRC6, XLB_DECAP_STAT, XLB_DECAP_VIP,
    key::{WordKey, addr_key, addr_words, word},
    packet::{
        ETH_LEN, ETH_P_IP, ETH_P_IPV6, IPV4_LEN, IPV4_VERSION_IHL, IPV6_LEN, Ipv4Hdr, Ipv6Hdr,
        VLAN_LEN, copy_l2, ptr_at,
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
fn drop(stat: DecapStat) -> u32 {
    count(stat);
    xdp_action::XDP_DROP
}

/// A tunnel packet to one of our addresses, as its outer header says.
struct Tunnel {
    /// Length of the outer header (that of the inner one too: same family).
    outer: usize,
    /// The outer source is an allowed load balancer.
    allowed: bool,
}

pub(crate) fn run(ctx: &XdpContext) -> u32 {
    // Tagged or not, truncated or not: a frame with no IP header is not ours.
    let Ok(l2) = parse::l2(ctx) else {
        return pass();
    };
    let l3off = l2.l3off;
    let tunnel = match l2.ethertype {
        ETH_P_IP => ipip4_to_us(ctx, l3off),
        ETH_P_IPV6 => ip6ip6_to_us(ctx, l3off),
        _ => None,
    };
    let Some(Tunnel { outer, allowed }) = tunnel else {
        return pass();
    };
    if !allowed {
        return drop(DecapStat::DropSource);
    }
    // The inner header must be there, of the outer one's family: a tunnel
    // packet to us with nothing inside is dropped, never passed up
    // half-stripped.
    let mut key = WordKey::uninit();
    let inner = if outer == IPV4_LEN {
        inner_dst4(ctx, l3off + IPV4_LEN, &mut key)
    } else {
        inner_dst6(ctx, l3off + IPV6_LEN, &mut key)
    };
    let Some(inner) = inner else {
        return drop(DecapStat::DropMalformed);
    };
    if XLB_DECAP_VIP.get_ptr(inner).is_none() {
        return drop(DecapStat::DropInnerDst);
    }
    let moved = if l3off == ETH_LEN {
        copy_l2::<ETH_LEN>(ctx, 0, outer)
    } else {
        copy_l2::<{ ETH_LEN + VLAN_LEN }>(ctx, 0, outer)
    };
    if moved.is_none() || unsafe { bpf_xdp_adjust_head(ctx.ctx, outer as i32) } != 0 {
        return drop(DecapStat::DropMalformed);
    }
    count(DecapStat::Decap);
    xdp_action::XDP_PASS
}

/// IPv4-in-IPv4 to one of our addresses. Only a plain 20-byte, unfragmented
/// outer header is ours to strip.
#[inline(always)]
fn ipip4_to_us(ctx: &XdpContext, l3off: usize) -> Option<Tunnel> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, l3off)?;
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &*ip };
    let ours = ip.protocol == PROTO_IPIP
        && ip.version_ihl == IPV4_VERSION_IHL
        && XLB_DECAP_ADDR
            .get_ptr(addr_key::<DecapAddrKey>(
                &mut WordKey::uninit(),
                [word(&ip.daddr, 0), 0, 0, 0],
                FAMILY_V4,
            ))
            .is_some()
        && !ip.is_fragment();
    ours.then(|| Tunnel {
        outer: IPV4_LEN,
        allowed: XLB_DECAP_SRC4
            .get(
                WordKey::<1>::uninit()
                    .fill([32, word(&ip.saddr, 0)])
                    .as_trie_key(),
            )
            .is_some(),
    })
}

/// IPv6-in-IPv6 to one of our addresses.
#[inline(always)]
fn ip6ip6_to_us(ctx: &XdpContext, l3off: usize) -> Option<Tunnel> {
    let ip = ptr_at::<Ipv6Hdr>(ctx, l3off)?;
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &*ip };
    let ours = ip.nexthdr == PROTO_IPV6
        && XLB_DECAP_ADDR
            .get_ptr(addr_key::<DecapAddrKey>(
                &mut WordKey::uninit(),
                addr_words(&ip.daddr),
                FAMILY_V6,
            ))
            .is_some();
    let [a, b, c, d] = addr_words(&ip.saddr);
    ours.then(|| Tunnel {
        outer: IPV6_LEN,
        allowed: XLB_DECAP_SRC6
            .get(WordKey::<3>::uninit().fill([128, a, b, c, d]).as_trie_key())
            .is_some(),
    })
}

/// The destination of the IPv4 header at `off`, as a key written in `key`;
/// `None` if it is truncated or not IPv4.
#[inline(always)]
fn inner_dst4<'k>(
    ctx: &XdpContext,
    off: usize,
    key: &'k mut WordKey<3>,
) -> Option<&'k DecapAddrKey> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, off)?;
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &*ip };
    if ip.version_ihl >> 4 != 4 {
        return None;
    }
    Some(addr_key(key, [word(&ip.daddr, 0), 0, 0, 0], FAMILY_V4))
}

/// The destination of the IPv6 header at `off`, as [`inner_dst4`]; `None`
/// if it is truncated or not IPv6.
#[inline(always)]
fn inner_dst6<'k>(
    ctx: &XdpContext,
    off: usize,
    key: &'k mut WordKey<3>,
) -> Option<&'k DecapAddrKey> {
    let ip = ptr_at::<Ipv6Hdr>(ctx, off)?;
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &*ip };
    if ip.version_tc_flow[0] >> 4 != 6 {
        return None;
    }
    Some(addr_key(key, addr_words(&ip.daddr), FAMILY_V6))
}
