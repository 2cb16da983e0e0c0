//! The data plane's reason counters (`XLB_STATS`): every outcome that is
//! not a forward has its own, with a stable name for metrics and `--json`.

/// Global counters (`XLB_STATS`, per-CPU array indexed by `Stat as u32`).
/// Every outcome that is not a forward has its own reason.
macro_rules! stats {
    ($($(#[doc = $doc:literal])* $name:ident = $label:literal,)*) => {
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Stat { $($(#[doc = $doc])* $name,)* }

        impl Stat {
            pub const ALL: &'static [Stat] = &[$(Stat::$name,)*];
            /// Stable snake_case name, used in metrics and `--json` output.
            pub const fn label(self) -> &'static str {
                match self { $(Stat::$name => $label,)* }
            }
        }
    };
}

stats! {
    /// Forwarded with `XDP_TX` (same interface).
    FwdTx = "fwd_tx",
    /// Forwarded with `bpf_redirect` (another interface).
    FwdRedirect = "fwd_redirect",
    /// Conntrack entry found and used.
    CtHit = "ct_hit",
    /// No conntrack entry for a non-SYN packet: fell back to the table.
    CtMiss = "ct_miss",
    /// Conntrack entries written (new or re-picked flows).
    CtInsert = "ct_insert",
    /// Conntrack insert failed (map full of pinned entries; packet still forwarded).
    CtInsertFail = "ct_insert_fail",
    /// Entry pointed at a recycled backend id (generation mismatch): re-picked.
    CtStale = "ct_stale",
    /// UDP entry idle longer than the timeout: re-picked.
    CtUdpExpired = "ct_udp_expired",
    /// Flow of a down backend re-picked from the table (policy `rehash`).
    DownRehash = "down_rehash",
    /// Flow of a down backend kept on it (policy `keep`).
    DownKeep = "down_keep",
    /// Not IPv4/IPv6 (ARP, LLDP, ...): passed.
    PassNotIp = "pass_not_ip",
    /// IP, not to a VIP address: passed.
    PassNotVip = "pass_not_vip",
    /// Frame ends inside the Ethernet/VLAN header: passed (not provably ours).
    PassTruncatedL2 = "pass_truncated_l2",
    /// Frame ends inside the IP header before the destination: passed.
    PassTruncatedL3 = "pass_truncated_l3",
    /// More than one VLAN tag (QinQ): passed, unsupported.
    PassQinQ = "pass_qinq",
    /// IPv6 with an extension header before TCP/UDP, to a VIP address whose
    /// VIPs set `host_services`: passed to the host stack, as Katran does
    /// (without `host_services` it is `drop_vip_unbalanced`).
    PassIpv6Ext = "pass_ipv6_ext",
    /// To a VIP address, but no VIP balances it (another port or protocol,
    /// ICMP xlb does not answer, IPv6 extension headers), and no VIP at the
    /// address sets `host_services`: dropped, since the host would route it
    /// back to the router it came from (a loop until its TTL runs out).
    DropVipUnbalanced = "drop_vip_unbalanced",
    /// To a VIP address whose VIPs set `host_services`, but no VIP balances
    /// it: passed to the host's own services.
    PassVipHost = "pass_vip_host",
    /// To a VIP address: IPv4 header length field < 5, or version mismatch.
    DropBadIhl = "drop_bad_ihl",
    /// To a VIP address: IP total/payload length disagrees with the frame.
    DropBadLength = "drop_bad_length",
    /// To a VIP address: IPv4 options present.
    DropIpOptions = "drop_ip_options",
    /// To a VIP address: IPv4 or IPv6 fragment.
    DropFragment = "drop_fragment",
    /// To a VIP address: TCP/UDP header truncated or TCP data offset invalid.
    DropBadL4 = "drop_bad_l4",
    /// To a VIP address: TCP SYN with RST or FIN set, which no TCP sends
    /// (RFC 9293); such a packet would replace or close a flow's conntrack
    /// entry.
    DropBadTcpFlags = "drop_bad_tcp_flags",
    /// To a VIP: no backend is up (empty table).
    DropNoBackend = "drop_no_backend",
    /// To a VIP: the backend has no route or neighbour (`bpf_fib_lookup`
    /// failed); the daemon's probes keep neighbours resolved.
    DropNoRoute = "drop_no_route",
    /// To a `dsr-l2` VIP: the backend is not a neighbour (its route goes
    /// through a gateway), and a frame still addressed to the VIP would
    /// loop through the router.
    DropNotOnLink = "drop_not_on_link",
    /// To a VIP: the encapsulated packet would exceed the egress MTU, and
    /// the client cannot be told (IPv4 without DF).
    DropTooBig = "drop_too_big",
    /// `bpf_xdp_adjust_head` failed (no headroom).
    DropNoHeadroom = "drop_no_headroom",
    /// Not a conntrack hit, source on a deny list with action `drop` (or
    /// `reset` but not a TCP SYN): dropped. Also an echo request to a VIP
    /// address from a source on the global deny list.
    DropDenied = "drop_denied",
    /// TCP SYN from a source on a deny list with action `reset`: answered
    /// with a RST (`XDP_TX`).
    ResetDenied = "reset_denied",
    /// A deny-list match overridden by an allow-list match: judged on.
    AllowListed = "allow_listed",
    /// A new flow over its source's `new_flows_per_source` rate, action
    /// `drop` (or `reset` but UDP): dropped.
    DropRateLimited = "drop_rate_limited",
    /// A TCP SYN over its source's rate, action `reset`: answered with a RST.
    ResetRateLimited = "reset_rate_limited",
    /// A new flow over this CPU's conntrack insert cap: forwarded by the
    /// table, not tracked.
    CtInsertCapped = "ct_insert_capped",
    /// An ICMP error about a VIP flow (destination unreachable, packet too
    /// big, time exceeded): sent on where the flow's packets go (its
    /// forward, or drop, is counted as theirs).
    IcmpQuoted = "icmp_quoted",
    /// An echo request to a VIP address answered (`XDP_TX`).
    IcmpEchoReply = "icmp_echo_reply",
    /// ICMP to a VIP address whose VIPs set `host_services`, of a kind xlb
    /// does not handle or whose quoted header is not a VIP flow: passed to
    /// the host's stack (without `host_services`: `drop_vip_unbalanced`).
    PassIcmp = "pass_icmp",
    /// A packet too big for its next hop (a client's to encapsulate, or a
    /// NAT packet either way) answered with "fragmentation needed" /
    /// "packet too big" carrying the MTU that fits.
    IcmpTooBig = "icmp_too_big",
    /// A reply the data plane would generate (a RST to a refused SYN, an
    /// echo reply, "fragmentation needed" / "packet too big") over this
    /// CPU's `daemon.reply_rate`: dropped instead.
    DropReplyLimited = "drop_reply_limited",
    /// A TCP packet without SYN that missed conntrack, to a `dsr-ipip` VIP
    /// with second chance, whose slot has a live previous owner other than
    /// the current one: sent to the current owner with a second tunnel
    /// header to the previous one (its decapsulator passes the packet on
    /// when it has no socket for it).
    SecondChance = "second_chance",
    /// Such a packet too big for the next hop with two tunnel headers but
    /// not with one: sent to the current owner only, as without second
    /// chance.
    SecondChanceTooBig = "second_chance_too_big",
    /// A NAT flow started: a source (address, port) allocated, both of its
    /// entries inserted, the packet translated and sent.
    NatNew = "nat_new",
    /// A NAT flow started on the port of an expired one (its entries
    /// reclaimed, its pending evidence counted).
    NatReclaim = "nat_reclaim",
    /// A NAT flow whose backend id was removed or given to another backend:
    /// its entries removed (a SYN or UDP packet then starts a new flow).
    NatStale = "nat_stale",
    /// A TCP packet without SYN to a NAT VIP, of no NAT flow: dropped (no
    /// source port was ever allocated for it).
    DropNatNoFlow = "drop_nat_no_flow",
    /// A new NAT flow (UDP) refused: no free (address, port) in the VIP's
    /// pool within `NAT_ALLOC_TRIES` tries. Live flows are never evicted.
    DropNatExhausted = "drop_nat_exhausted",
    /// A new NAT flow (TCP SYN) refused for the same reason: answered with
    /// a RST, so the client fails at once.
    ResetNatExhausted = "reset_nat_exhausted",
    /// A new NAT flow whose `XLB_NAT_FLOWS` insert failed (map full): its
    /// port released, the packet dropped.
    DropNatInsertFail = "drop_nat_insert_fail",
    /// A packet from a NAT backend to a pool address's port range that is
    /// no flow's reply: passed to the host (an old flow, the host's own).
    PassNatUnknownPort = "pass_nat_unknown_port",
    /// A packet to a pool address's port range from an address that is no
    /// NAT backend's: dropped (spoofed).
    DropNatSpoofed = "drop_nat_spoofed",
    /// A NAT packet (either way) whose TTL / hop limit would reach 0: passed
    /// to the host, which answers "time exceeded" as a router does.
    PassNatTtl = "pass_nat_ttl",
    /// A NAT packet (either way) larger than the egress MTU whose sender
    /// cannot be told (IPv4 without DF, or an ICMP error): dropped. The
    /// others are answered (`icmp_too_big`).
    DropNatTooBig = "drop_nat_too_big",
    /// An ICMP error to a NAT VIP quoting no live NAT flow (none, or its
    /// backend recycled): dropped. One quoting a live flow is translated
    /// and sent on (`icmp_quoted`, then the flow's own counters).
    DropNatIcmp = "drop_nat_icmp",
    /// A TCP packet (no SYN) of a NAT flow whose backend is down, on a VIP
    /// with `down_policy = "rehash"`: the flow ended (its port back to the
    /// pool) and the client answered with a RST, so it reconnects at once
    /// to a backend that is up (`down_rehash` counts the flow's end).
    ResetNatDown = "reset_nat_down",
    /// A NAT backend's answer to one of the LB's own addresses (the flow of
    /// a data-path probe, `via = "vip"`): translated back to VIP → probe
    /// and passed to the host, where the probe's socket takes it.
    PassNatLocal = "pass_nat_local",
    /// A new NAT flow that found every candidate (address, port) held took
    /// the first held by an embryonic flow: a TCP handshake its client had
    /// not completed, or a UDP flow its backend never answered
    /// (`NatFlow::embryonic`). A flood from forged sources fills a pool
    /// with those; they give way to real clients.
    NatEvictEmbryonic = "nat_evict_embryonic",
    /// A new NAT flow that found its pool's candidates held, some by
    /// embryonic flows, seen for the first time: dropped and remembered
    /// (`XLB_NAT_SEEN`); its client's next SYN (or datagram) may take an
    /// embryonic flow's port. A flood from forged sources, each sent once,
    /// ends here without reaching a backend.
    DropNatUnproven = "drop_nat_unproven",
    /// A new NAT flow refused because this CPU already started
    /// `guard.ct_insert_cap` NAT flows this second: dropped (a real
    /// client's SYN is sent again; a forged source gets no RST).
    DropNatInsertCapped = "drop_nat_insert_capped",
    /// An ICMP "fragmentation needed" / "packet too big" from a NAT flow's
    /// client side whose MTU was below the least a path may have (IPv4 552,
    /// Linux's `min_pmtu`; IPv6 1280): raised to it before it went to the
    /// backend, whose route to the pool address every client shares.
    NatIcmpMtuRaised = "nat_icmp_mtu_raised",
    /// A broken invariant (a map that must exist is missing): `XDP_ABORTED`.
    Aborted = "aborted",
}

/// Number of entries in `XLB_STATS`.
pub const STATS_LEN: u32 = Stat::ALL.len() as u32;
