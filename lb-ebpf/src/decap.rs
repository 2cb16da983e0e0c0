//! `xlb_decap`: strips the outer header of IPv4-in-IPv4 and IPv6-in-IPv6
//! packets addressed to this backend, so the inner packet (client → VIP)
//! reaches the stack as if it had arrived directly.
//!
//! Only tunnels that a load balancer of ours could have sent are stripped:
//! the outer source must be in an allowed prefix (`XLB_DECAP_SRC4/6`,
//! `xlb decap --allow-source`) and the inner destination a VIP address this
//! backend serves (`XLB_DECAP_VIP`, `--vip`). Anything else to our
//! addresses is dropped and counted, never passed up: a forged inner
//! source must not reach the stack. So is every tunnel to us of a shape
//! this program does not strip (IPv4 options or fragments, 6in4, 4in6,
//! IPv6 extension headers before the tunnel, a tunnel inside the tunnel):
//! passed up, the kernel's tunnel modules (`ipip`, `sit`, `ip6_tunnel`, whose
//! fallback devices take any source) would strip it unchecked. Traffic
//! that is not a tunnel to us passes untouched.

use aya_ebpf::{bindings::xdp_action, helpers::bpf_xdp_adjust_head, programs::XdpContext};
use lb_common::{
    DECAP_ADDR_SECOND_CHANCE, DecapAddrKey, DecapStat, FAMILY_V4, FAMILY_V6, PROTO_IPIP, PROTO_IPV6,
};

use crate::{
    XLB_DECAP_ADDR, XLB_DECAP_SRC4, XLB_DECAP_SRC6, XLB_DECAP_STAT, XLB_DECAP_VIP,
    key::{WordKey, addr_key, addr_words, word},
    packet::{
        ETH_LEN, ETH_P_IP, ETH_P_IPV6, IPV4_LEN, IPV4_VERSION_IHL, IPV6_LEN, Ipv4Hdr, Ipv6Hdr,
        VLAN_LEN, copy_l2, ptr_at,
    },
    parse, relay,
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

/// What the outer header of a packet to one of our addresses says.
enum Outer {
    /// A tunnel this program strips.
    Tunnel {
        /// Length of the outer header (that of the inner one too: same
        /// family).
        outer: usize,
        /// The outer source is an allowed load balancer.
        allowed: bool,
        /// Second chance is on for this outer destination
        /// (`lb_common::DECAP_ADDR_SECOND_CHANCE`).
        chance: bool,
    },
    /// A tunnel this program does not strip: dropped.
    Unchecked,
}

/// IPv6 extension headers whose length is (byte 1 + 1) × 8 (RFC 8200 §4):
/// hop-by-hop, routing, destination options, mobility, HIP, shim6.
const IPV6_EXT_8: [u8; 6] = [0, 43, 60, 135, 139, 140];
/// IPv6 authentication header: length (byte 1 + 2) × 4 (RFC 4302).
const IPV6_AH: u8 = 51;
/// IPv6 fragment header: 8 bytes.
const IPV6_FRAGMENT: u8 = 44;
/// Extension headers walked before the next header must be the payload's;
/// more is no traffic of ours and is dropped (RFC 8200 §4.1 recommends at
/// most one of each, in order: 6 or fewer).
const MAX_IPV6_EXT: usize = 6;
/// The furthest byte of a walked chain (past it: dropped); a bound the
/// verifier can see on the walk's offset.
const MAX_IPV6_CHAIN: usize = 512;

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
    let (outer, allowed, chance) = match tunnel {
        None => return pass(),
        Some(Outer::Unchecked) => return drop(DecapStat::DropUnchecked),
        Some(Outer::Tunnel {
            outer,
            allowed,
            chance,
        }) => (outer, allowed, chance),
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
    let Some((inner, nested)) = inner else {
        return drop(DecapStat::DropMalformed);
    };
    // The stack would hand a tunnel inside the tunnel, addressed to a VIP
    // (a local address), to a tunnel module: unchecked again. Unless it is
    // a load balancer's second chance (`relay.rs`), checked there.
    if nested {
        if chance {
            return relay::run(ctx, l3off, outer);
        }
        return drop(DecapStat::DropUnchecked);
    }
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

/// A tunnel in IPv4 to one of our addresses. Only IPv4-in-IPv4 with a
/// plain 20-byte, unfragmented outer header is ours to strip; options or a
/// fragment around it, or IPv6 inside (6in4), is unchecked.
#[inline(always)]
fn ipip4_to_us(ctx: &XdpContext, l3off: usize) -> Option<Outer> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, l3off)?;
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &*ip };
    if ip.protocol != PROTO_IPIP && ip.protocol != PROTO_IPV6 {
        return None;
    }
    let ours = XLB_DECAP_ADDR.get_ptr(addr_key::<DecapAddrKey>(
        &mut WordKey::uninit(),
        [word(&ip.daddr, 0), 0, 0, 0],
        FAMILY_V4,
    ))?;
    // SAFETY: a u32 map value, read at once.
    let chance = unsafe { *ours } & DECAP_ADDR_SECOND_CHANCE != 0;
    if ip.protocol == PROTO_IPV6 || ip.version_ihl != IPV4_VERSION_IHL || ip.is_fragment() {
        return Some(Outer::Unchecked);
    }
    Some(Outer::Tunnel {
        outer: IPV4_LEN,
        chance,
        allowed: XLB_DECAP_SRC4
            .get(
                WordKey::<1>::uninit()
                    .fill([32, word(&ip.saddr, 0)])
                    .as_trie_key(),
            )
            .is_some(),
    })
}

/// A tunnel in IPv6 to one of our addresses. Only IPv6-in-IPv6 right after
/// the fixed header is ours to strip; IPv4 inside (4in6), or either behind
/// extension headers, is unchecked. A packet to us that is no tunnel (its
/// extension headers lead to anything else) is `None`: passed.
#[inline(always)]
fn ip6ip6_to_us(ctx: &XdpContext, l3off: usize) -> Option<Outer> {
    let ip = ptr_at::<Ipv6Hdr>(ctx, l3off)?;
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &*ip };
    let next = ip.nexthdr;
    let ext = IPV6_EXT_8.contains(&next) || next == IPV6_AH || next == IPV6_FRAGMENT;
    if next != PROTO_IPV6 && next != PROTO_IPIP && !ext {
        return None;
    }
    let ours = XLB_DECAP_ADDR.get_ptr(addr_key::<DecapAddrKey>(
        &mut WordKey::uninit(),
        addr_words(&ip.daddr),
        FAMILY_V6,
    ))?;
    // SAFETY: a u32 map value, read at once.
    let chance = unsafe { *ours } & DECAP_ADDR_SECOND_CHANCE != 0;
    if next == PROTO_IPIP || (ext && tunnel_behind_ext(ctx, l3off + IPV6_LEN, next)) {
        return Some(Outer::Unchecked);
    }
    if ext {
        return None;
    }
    let [a, b, c, d] = addr_words(&ip.saddr);
    Some(Outer::Tunnel {
        outer: IPV6_LEN,
        chance,
        allowed: XLB_DECAP_SRC6
            .get(WordKey::<3>::uninit().fill([128, a, b, c, d]).as_trie_key())
            .is_some(),
    })
}

/// Whether the IPv6 extension headers from `off` on (the first of type
/// `next`) lead to an IPIP or IPv6 header, or are too many or too long to
/// tell. A non-first fragment shows no header past its fragment header:
/// the first fragment's is judged, and without it the kernel never
/// reassembles the packet. A truncated chain is no tunnel (the kernel drops
/// it).
#[inline(always)]
fn tunnel_behind_ext(ctx: &XdpContext, mut off: usize, mut next: u8) -> bool {
    for _ in 0..MAX_IPV6_EXT {
        if next == PROTO_IPIP || next == PROTO_IPV6 {
            return true;
        }
        if off > MAX_IPV6_CHAIN {
            return true;
        }
        let Some(h) = ptr_at::<[u8; 4]>(ctx, off) else {
            return false;
        };
        // SAFETY: bounds checked by ptr_at.
        let h = unsafe { &*h };
        let len = if IPV6_EXT_8.contains(&next) {
            (usize::from(h[1]) + 1) * 8
        } else if next == IPV6_AH {
            (usize::from(h[1]) + 2) * 4
        } else if next == IPV6_FRAGMENT {
            let offset = u16::from_be_bytes([h[2], h[3]]) & 0xfff8;
            if offset != 0 {
                return h[0] == PROTO_IPIP || h[0] == PROTO_IPV6;
            }
            8
        } else {
            // The payload's header: not a tunnel.
            return false;
        };
        next = h[0];
        off += len;
    }
    // Past the walk: a tunnel, or still an extension header, is dropped.
    next == PROTO_IPIP
        || next == PROTO_IPV6
        || IPV6_EXT_8.contains(&next)
        || next == IPV6_AH
        || next == IPV6_FRAGMENT
}

/// The destination of the IPv4 header at `off`, as a key written in `key`,
/// and whether it carries a tunnel; `None` if it is truncated or not IPv4.
#[inline(always)]
fn inner_dst4<'k>(
    ctx: &XdpContext,
    off: usize,
    key: &'k mut WordKey<3>,
) -> Option<(&'k DecapAddrKey, bool)> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, off)?;
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &*ip };
    if ip.version_ihl >> 4 != 4 {
        return None;
    }
    let nested = ip.protocol == PROTO_IPIP || ip.protocol == PROTO_IPV6;
    Some((
        addr_key(key, [word(&ip.daddr, 0), 0, 0, 0], FAMILY_V4),
        nested,
    ))
}

/// The destination of the IPv6 header at `off` and whether it carries a
/// tunnel (right after it or behind extension headers), as [`inner_dst4`];
/// `None` if it is truncated or not IPv6.
#[inline(always)]
fn inner_dst6<'k>(
    ctx: &XdpContext,
    off: usize,
    key: &'k mut WordKey<3>,
) -> Option<(&'k DecapAddrKey, bool)> {
    let ip = ptr_at::<Ipv6Hdr>(ctx, off)?;
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &*ip };
    if ip.version_tc_flow[0] >> 4 != 6 {
        return None;
    }
    let next = ip.nexthdr;
    let nested = next == PROTO_IPIP
        || next == PROTO_IPV6
        || ((IPV6_EXT_8.contains(&next) || next == IPV6_AH || next == IPV6_FRAGMENT)
            && tunnel_behind_ext(ctx, off + IPV6_LEN, next));
    Some((addr_key(key, addr_words(&ip.daddr), FAMILY_V6), nested))
}
