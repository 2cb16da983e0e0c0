//! The decapsulator's (`xlb_decap`) map types and counters.

use crate::VipAddrKey;

/// Decapsulator counters (`XLB_DECAP_STAT`, per-CPU array).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecapStat {
    /// IPIP / IP6IP6 to one of our addresses, from an allowed load balancer,
    /// to a VIP we serve: outer header stripped.
    Decap = 0,
    /// Anything else (not a tunnel packet, or one to another address):
    /// passed untouched.
    Pass = 1,
    /// Tunnel packet to us whose inner header is truncated: dropped.
    DropMalformed = 2,
    /// Tunnel packet to us from an outer source that is not an allowed load
    /// balancer (`--allow-source`): dropped.
    DropSource = 3,
    /// Tunnel packet to us from an allowed source whose inner destination is
    /// not a VIP this backend serves (`--vip`): dropped.
    DropInnerDst = 4,
    /// Tunnel packet to us of a shape the decapsulator does not check:
    /// IPv4 with options or fragmented around IPIP, 6in4 (IPv4 protocol 41),
    /// 4in6 (IPv6 next header 4), IPIP/IP6IP6 behind IPv6 extension headers
    /// (or a chain too long to walk), or a tunnel inside the tunnel.
    /// Dropped: passed up, a tunnel module (`ipip`, `sit`, `ip6_tunnel`)
    /// would strip it without the `--allow-source` check.
    DropUnchecked = 5,
    /// Second chance: a tunnel in the tunnel (outer and middle headers from
    /// allowed load balancers, the middle one to another address), the
    /// innermost packet TCP to a VIP we serve, for which this host has a
    /// connection: both headers stripped, passed up.
    ChanceLocal = 6,
    /// Second chance, no connection here: the outer header stripped and the
    /// rest (a plain tunnel to the previous owner) sent on to it.
    ChanceForward = 7,
    /// Second chance, no connection here and no route to the previous
    /// owner: both headers stripped, passed up (the stack answers as it
    /// would without second chance).
    ChanceNoRoute = 8,
}
pub const DECAP_STATS_LEN: u32 = DecapStat::ALL.len() as u32;

impl DecapStat {
    /// Every counter, in index order.
    pub const ALL: [DecapStat; 9] = [
        DecapStat::Decap,
        DecapStat::Pass,
        DecapStat::DropMalformed,
        DecapStat::DropSource,
        DecapStat::DropInnerDst,
        DecapStat::DropUnchecked,
        DecapStat::ChanceLocal,
        DecapStat::ChanceForward,
        DecapStat::ChanceNoRoute,
    ];

    /// The counter's name in logs and the README.
    pub const fn name(self) -> &'static str {
        match self {
            DecapStat::Decap => "decap",
            DecapStat::Pass => "pass",
            DecapStat::DropMalformed => "drop_malformed",
            DecapStat::DropSource => "drop_source",
            DecapStat::DropInnerDst => "drop_inner_dst",
            DecapStat::DropUnchecked => "drop_unchecked",
            DecapStat::ChanceLocal => "second_chance_local",
            DecapStat::ChanceForward => "second_chance_forward",
            DecapStat::ChanceNoRoute => "second_chance_no_route",
        }
    }
}

/// Key of `XLB_DECAP_ADDR`: an outer destination the decapsulator accepts.
/// Also the key of `XLB_DECAP_VIP`: an inner destination (a VIP address this
/// backend serves) it accepts.
pub type DecapAddrKey = VipAddrKey;

/// `XLB_DECAP_ADDR` value bits: the address is a tunnel endpoint of ours.
pub const DECAP_ADDR_ACCEPT: u32 = 1;
/// ... and second chance is on (`xlb decap --second-chance on`, the
/// default): a load balancer's tunnel inside the tunnel is kept when this
/// host has the connection, else relayed to the previous owner.
pub const DECAP_ADDR_SECOND_CHANCE: u32 = 2;

/// Data of an `XLB_DECAP_SRC4` trie key: an allowed outer IPv4 source
/// prefix, network order (the trie key's `prefix_len` gives its length).
pub type DecapSrcV4 = [u8; 4];
/// Data of an `XLB_DECAP_SRC6` trie key; see [`DecapSrcV4`].
pub type DecapSrcV6 = [u8; 16];
/// Most allowed outer source prefixes per family.
pub const MAX_DECAP_SOURCES: u32 = 256;
/// Most outer destinations, and most inner destinations (VIP addresses).
pub const MAX_DECAP_ADDRS: u32 = 1024;
