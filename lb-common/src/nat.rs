//! NAT mode's shared types (issue 27): the two flow maps, the per-VIP
//! source pools and timeouts, the reply filter, and the per-backend passive
//! counters the data plane keeps from real traffic.
//!
//! A NAT flow is known by two keys, both [`FlowKey`]s:
//! - the client's, client → VIP (as `XLB_CT` keys DSR flows): its value,
//!   [`NatFlow`], holds the whole state of the flow (backend, translated
//!   address and port, TCP state, timestamps);
//! - the reply's, backend → LB (source: the backend's address and port;
//!   destination: the pool address and the allocated port, or the client's
//!   address and port with `preserve_client`): its value is the client's key.
//!
//! Neither map is an LRU: a live flow is never evicted to make room. An
//! entry whose [`NatFlow::expires`] time has passed is reclaimed by the
//! next flow that wants its port (data plane) or by the daemon's sweep.

use crate::{Addr, FlowKey};

/// [`crate::VipInfo::mode`]: full NAT. The client's packet leaves from a
/// pool address and allocated port to the backend's address and port; the
/// backend's answer is translated back. Backends need no change.
pub const MODE_NAT: u8 = 3;
/// [`crate::VipInfo::mode`]: destination NAT only (`preserve_client`): the
/// backend sees the client's address; it must route its answers through
/// the load balancer, which translates their source back to the VIP.
pub const MODE_NAT_PRESERVE: u8 = 4;

/// Whether `mode` is one of the NAT modes.
#[inline(always)]
pub const fn is_nat(mode: u8) -> bool {
    mode == MODE_NAT || mode == MODE_NAT_PRESERVE
}

/// Pinned hash: client key → [`NatFlow`].
pub const MAP_NAT_FLOWS: &str = "XLB_NAT_FLOWS";
/// Pinned hash: reply key (backend → LB) → client key.
pub const MAP_NAT_REPLY: &str = "XLB_NAT_REPLY";
/// Pinned array of [`NatPool`], indexed by VIP id.
pub const MAP_NAT_POOL: &str = "XLB_NAT_POOL";
/// Pinned array of `u32`, indexed by [`crate::port_index`] of (protocol,
/// backend port): how many NAT backends use that port. A packet whose
/// source port has 0 is no reply to a NAT flow (one array read for the
/// host's traffic).
pub const MAP_NAT_SPORTS: &str = "XLB_NAT_SPORTS";
/// Pinned per-CPU array of [`PassiveStats`], indexed by backend id.
pub const MAP_PASSIVE: &str = "XLB_PASSIVE";
/// Pinned hash: [`crate::VipAddrKey`] of a NAT backend's address → how
/// many NAT backends have it. A packet to a pool address's port range
/// that is no flow's reply is passed to the host if it comes from a
/// backend (`pass_nat_unknown_port`), dropped as spoofed otherwise.
pub const MAP_NAT_BACKEND_ADDRS: &str = "XLB_NAT_BEADDR";

/// Default capacity of each NAT flow map (entries). A NAT flow takes one
/// entry in each.
pub const DEFAULT_NAT_SIZE: u32 = 262_144;

/// Most source addresses in one VIP's pool.
pub const MAX_SNAT_ADDRS: usize = 16;

/// Default range of allocated source ports: below Linux's ephemeral range
/// (32768–60999), so the host's own connections from a pool address never
/// collide with NAT flows.
pub const DEFAULT_SNAT_PORT_MIN: u16 = 10_000;
pub const DEFAULT_SNAT_PORT_MAX: u16 = 32_767;

/// Value of `XLB_NAT_POOL`, per VIP id: where a NAT VIP's flows leave from,
/// how long their state lives, and the passive-detection thresholds. The
/// daemon writes it before the VIP goes live.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatPool {
    /// Addresses in use in `addrs` (0 = not a NAT VIP, or `preserve_client`).
    pub count: u32,
    /// Allocated source ports, host order, inclusive.
    pub port_min: u16,
    pub port_max: u16,
    /// TCP: a flow whose handshake has not completed (SYN sent, no SYN-ACK).
    pub tcp_syn_timeout_ns: u64,
    /// TCP: an established flow with no packet.
    pub tcp_established_timeout_ns: u64,
    /// TCP: after a FIN in either direction.
    pub tcp_fin_timeout_ns: u64,
    /// TCP: after a RST in either direction.
    pub tcp_close_timeout_ns: u64,
    /// UDP: a flow with no packet.
    pub udp_timeout_ns: u64,
    /// Passive detection: a pending request older than this when its flow
    /// closes counts as unanswered ([`PassiveStats::unanswered`]); 0 = off.
    pub response_timeout_ns: u64,
    /// Passive detection: a SYN with no SYN-ACK this long counts as a
    /// connect timeout ([`PassiveStats::connect_timeouts`]); 0 = off.
    pub connect_timeout_ns: u64,
    /// The pool's addresses, network order, of the VIP's family (see
    /// [`Addr`]).
    pub addrs: [Addr; MAX_SNAT_ADDRS],
}
const _: () = assert!(core::mem::size_of::<NatPool>() == 8 + 7 * 8 + 16 * MAX_SNAT_ADDRS);

impl NatPool {
    /// Whether this VIP's flows count passive evidence (the daemon writes
    /// 0 timeouts for `[vip.passive] enabled = false`).
    #[inline(always)]
    pub fn passive_on(&self) -> bool {
        self.response_timeout_ns != 0
    }
}

/// [`NatFlow::state`] values.
/// The client's SYN passed; no SYN-ACK yet.
pub const NAT_TCP_SYN_SENT: u8 = 1;
/// The client's ACK of the backend's SYN-ACK passed: the handshake is
/// complete.
pub const NAT_TCP_ESTABLISHED: u8 = 2;
/// A FIN seen in one direction.
pub const NAT_TCP_FIN_WAIT: u8 = 3;
/// FINs seen in both directions.
pub const NAT_TCP_CLOSING: u8 = 4;
/// A RST seen in either direction.
pub const NAT_TCP_CLOSED: u8 = 5;
pub const NAT_UDP: u8 = 6;
/// The backend's SYN-ACK passed; the client's ACK of it has not. Every
/// backend answers a SYN (syncookies included), so a forged SYN from an
/// address that will never answer ends here: it keeps the handshake's
/// timeout (`tcp_syn_timeout`) and may be evicted by a new flow
/// ([`NatFlow::embryonic`]). A value after [`NAT_UDP`]: the states before
/// it keep their meaning for flows written by older binaries.
pub const NAT_TCP_SYN_RECV: u8 = 7;

/// How far past the backend's SYN-ACK (its ISN + 1) the client's ACK may
/// acknowledge and still complete the handshake: what the backend may have
/// sent with or right after its SYN-ACK (TCP Fast Open). A blind ACK from
/// an address that never saw the SYN-ACK hits it once in 65,536.
pub const NAT_HANDSHAKE_WINDOW: u32 = 1 << 16;

/// How long a UDP flow that never got an answer keeps its port (at most
/// the VIP's `udp_timeout`): a request/response protocol answers within a
/// round trip, and a client that got none retries within seconds (DNS
/// resolvers after 1–5 s). A flood of datagrams from forged sources then
/// holds ports for this long, not for `udp_timeout`.
pub const NAT_UDP_UNANSWERED_NS: u64 = 5_000_000_000;

/// [`NatFlow::flags`]: the client sent FIN.
pub const NAT_FLAG_CLIENT_FIN: u8 = 1;
/// [`NatFlow::flags`]: the backend sent FIN.
pub const NAT_FLAG_BACKEND_FIN: u8 = 2;
/// [`NatFlow::flags`]: the flow was counted in
/// [`PassiveStats::connect_timeouts`] (once per flow).
pub const NAT_FLAG_CONNECT_TIMEOUT: u8 = 4;
/// [`NatFlow::flags`]: the flow's VIP counts passive evidence (its pool's
/// `response_timeout_ns` was not 0 at the client's last packet), so the
/// backend's packets are judged too. Clear: the flow pays for no evidence
/// either way (`[vip.passive] enabled = false`).
pub const NAT_FLAG_PASSIVE: u8 = 8;
/// [`NatFlow::flags`]: the backend answered this UDP flow (a packet the
/// other way). Clear: the flow is embryonic ([`NatFlow::embryonic`]).
pub const NAT_FLAG_ANSWERED: u8 = 16;
/// [`NatFlow::flags`]: the UDP flow's client sent again after its backend
/// answered: counted once as an established flow of its source (what
/// `auto_block` judges). A TCP flow is counted when its handshake
/// completes.
pub const NAT_FLAG_CONFIRMED: u8 = 32;

/// Bit of an `XLB_VIP_PORTS` count (see [`crate::port_index`]): some NAT
/// VIP listens on this (protocol, port). The daemon keeps it beside the
/// count of VIPs (the low bits); the data plane then looks the VIP up
/// before `XLB_CT`, and a NAT VIP's flows never touch `XLB_CT`.
pub const VIP_PORT_NAT: u32 = 1 << 31;

/// `XLB_VIP_ADDRS` value bit: the address is in a NAT VIP's source pool
/// (an address of the load balancer itself, so never
/// [`crate::VIP_ADDR_BALANCED`] too). Bits 16..32 of the value then hold
/// the id + 1 of one NAT VIP whose pool holds it, whose port range tells
/// the host's own traffic to the address from stray replies
/// ([`vip_addr_nat_vip`]). VIPs that share a pool address must share its
/// port range.
pub const VIP_ADDR_NAT_POOL: u32 = 4;

/// The `XLB_VIP_ADDRS` value of a pool address of NAT VIP `vip_id`.
pub const fn vip_addr_nat_pool(vip_id: u32) -> u32 {
    VIP_ADDR_NAT_POOL | ((vip_id + 1) << 16)
}

/// The NAT VIP id an `XLB_VIP_ADDRS` value names, if it is a pool
/// address's.
#[inline(always)]
pub const fn vip_addr_nat_vip(bits: u32) -> Option<u32> {
    if bits & VIP_ADDR_NAT_POOL == 0 || bits >> 16 == 0 {
        None
    } else {
        Some((bits >> 16) - 1)
    }
}

/// Value of `XLB_NAT_FLOWS` (key: the client's [`FlowKey`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatFlow {
    /// Backend id chosen for this flow.
    pub backend_id: u32,
    /// [`crate::BackendInfo::generation`] when the flow was assigned.
    pub generation: u32,
    /// VIP id of the flow.
    pub vip_id: u32,
    /// `NAT_TCP_*` or [`NAT_UDP`].
    pub state: u8,
    /// `NAT_FLAG_*` bits.
    pub flags: u8,
    /// The source port the backend sees, network order: the allocated one
    /// (or the client's own with `preserve_client`).
    pub nat_port: u16,
    /// The source address the backend sees (a pool address, or the
    /// client's with `preserve_client`), network order.
    pub nat_addr: Addr,
    /// The backend's port, network order.
    pub backend_port: u16,
    pub _pad: [u8; 2],
    /// TCP: the backend's initial sequence number (host order), from its
    /// SYN-ACK; the client's ACK of it completes the handshake
    /// ([`NAT_TCP_SYN_RECV`]). Was padding before (0 in older entries,
    /// which are past their handshake).
    pub backend_isn: u32,
    /// Coarse monotonic ns (`clock::now`) of the last packet either way,
    /// refreshed at most every [`crate::CT_TOUCH_INTERVAL_NS`] unless the
    /// state changes.
    pub last_seen_ns: u64,
    /// Passive detection: when the client's oldest unanswered payload was
    /// sent (0 = no request pending). Set by a client packet with payload
    /// while 0; cleared by the backend's first packet with payload.
    pub request_ns: u64,
}
const _: () = assert!(core::mem::size_of::<NatFlow>() == 56);

impl NatFlow {
    /// When this entry may be reclaimed, in the units of `last_seen_ns`,
    /// by its state's timeout in `pool`. Shared by the data plane (port
    /// reuse) and the daemon's sweep, so both agree on what is dead.
    #[inline(always)]
    pub fn expires(&self, pool: &NatPool) -> u64 {
        let timeout = match self.state {
            NAT_TCP_SYN_SENT | NAT_TCP_SYN_RECV => pool.tcp_syn_timeout_ns,
            NAT_TCP_ESTABLISHED => pool.tcp_established_timeout_ns,
            NAT_TCP_FIN_WAIT | NAT_TCP_CLOSING => pool.tcp_fin_timeout_ns,
            NAT_TCP_CLOSED => pool.tcp_close_timeout_ns,
            _ if self.flags & NAT_FLAG_ANSWERED == 0 => {
                if pool.udp_timeout_ns < NAT_UDP_UNANSWERED_NS {
                    pool.udp_timeout_ns
                } else {
                    NAT_UDP_UNANSWERED_NS
                }
            }
            _ => pool.udp_timeout_ns,
        };
        self.last_seen_ns.saturating_add(timeout)
    }

    /// Whether the flow has not been shown to have a client at its
    /// address yet: a TCP handshake the client has not completed, or a
    /// UDP flow its backend never answered. Anyone can make such flows
    /// from forged sources, as fast as they send, so they hold a port only
    /// while no one else needs it: a new flow that finds no free port
    /// among its candidates takes one of theirs (`nat_evict_embryonic`),
    /// and the daemon's sweep removes them first when the map fills. A
    /// flow past its handshake is never evicted.
    #[inline(always)]
    pub fn embryonic(&self) -> bool {
        match self.state {
            NAT_TCP_SYN_SENT | NAT_TCP_SYN_RECV => true,
            NAT_UDP => self.flags & NAT_FLAG_ANSWERED == 0,
            _ => false,
        }
    }
}

/// Value of `XLB_PASSIVE` (per CPU, per backend id): what the backend's
/// real traffic says, counted by the data plane of NAT VIPs, where both
/// directions cross it. Monotonic counters; the daemon sums the CPUs and
/// differences its samples.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassiveStats {
    /// TCP SYNs that started a flow to this backend.
    pub connects: u64,
    /// SYN-ACKs from the backend answering them.
    pub connected: u64,
    /// Flows found still without a SYN-ACK after `connect_timeout_ns`.
    pub connect_timeouts: u64,
    /// RSTs from the backend.
    pub resets: u64,
    /// Client payload that started a request (none was pending).
    pub requests: u64,
    /// Backend payload that answered a pending request.
    pub responses: u64,
    /// Pending requests older than `response_timeout_ns` when their flow
    /// closed or was reclaimed.
    pub unanswered: u64,
    /// Pending requests younger than that when their flow closed: the
    /// client gave up first (neutral evidence).
    pub abandoned: u64,
    /// Sum of the answered requests' response times, ns.
    pub response_ns: u64,
}
const _: () = assert!(core::mem::size_of::<PassiveStats>() == 72);

/// The reply key of a NAT flow: backend:port → `nat_addr`:`nat_port`.
#[inline(always)]
pub fn reply_key(client: &FlowKey, flow: &NatFlow, backend: &Addr) -> FlowKey {
    FlowKey {
        src: *backend,
        dst: flow.nat_addr,
        sport: flow.backend_port,
        dport: flow.nat_port,
        proto: client.proto,
        family: client.family,
        _pad: [0; 2],
    }
}

/// Allocation tries for a new flow's source (address, port) before it is
/// refused as exhausted: bounded for the verifier, enough that a pool
/// half full still finds a port almost always (a random try fails with
/// the fill ratio: 0.5^16).
pub const NAT_ALLOC_TRIES: u32 = 16;

/// The `i`-th candidate (index into [`NatPool::addrs`], port in host
/// order) for a new flow of flow hash `hash` in `pool`: a start spread
/// by the hash over every (address, port), then the next ports of the
/// next addresses. `None` when the pool is empty or its range inverted.
#[inline(always)]
pub fn nat_candidate(pool: &NatPool, hash: u64, i: u32) -> Option<(u32, u16)> {
    let count = pool.count;
    if count == 0 || count > MAX_SNAT_ADDRS as u32 || pool.port_max < pool.port_min {
        return None;
    }
    let range = u32::from(pool.port_max - pool.port_min) + 1;
    let addr = ((hash as u32).wrapping_add(i)) % count;
    let port = ((hash >> 32) as u32).wrapping_add(i) % range;
    Some((addr, pool.port_min + port as u16))
}

/// Entries of `XLB_NAT_SEEN` (kernel-only LRU hash: client key → the
/// SYN's sequence number, 0 for UDP): new flows that found their pool's
/// candidates held, some by embryonic flows, and were dropped on first
/// sight. Only a flow seen again (a SYN sent again with the same ISN, a
/// UDP client's next datagram) may take an embryonic flow's port: a flood
/// from forged sources sends each source once, a real client sends again
/// within a second. Enough for several seconds of a flood at tens of
/// thousands of new sources a second (about 100 bytes each).
pub const NAT_SEEN_SIZE: u32 = 65_536;

/// Slots of `XLB_NAT_HOPS`, per CPU: a power of two.
pub const CLIENT_HOPS: u32 = 4096;

/// Value of `XLB_NAT_HOPS` (per-CPU array of [`CLIENT_HOPS`], kernel-only,
/// not pinned): a direct-mapped cache of the next hop towards a client of a
/// NAT flow, at [`client_hop_slot`] of its address, so the backend's
/// answers skip `bpf_fib_lookup` as the client's packets do with
/// `XLB_NEXTHOP`. A slot holds one client; another client at the same slot
/// replaces it (a lookup, no error).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientHop {
    /// The client address the answer is for, network order.
    pub addr: Addr,
    /// `FAMILY_V4` or `FAMILY_V6` of `addr`.
    pub family: u8,
    pub _pad: [u8; 3],
    /// The interface the lookup was made for (`bpf_fib_lookup` takes the
    /// ingress interface: policy routing may answer per interface).
    pub iif: u32,
    /// The answer: MACs, egress interface and MTU; `generation_plus_one`
    /// is 1 when filled, `expires_ns` after [`crate::NEXTHOP_TTL_NS`].
    pub hop: crate::NextHop,
}
const _: () = assert!(core::mem::size_of::<ClientHop>() == 64);

/// The `XLB_NAT_HOPS` slot of client address `addr` (16 bytes, an IPv4
/// address in the first 4): its four words folded together, then mixed
/// (the `lowbias32` integer hash: every input bit moves every output bit),
/// so clients of one IPv4 network or one IPv6 /64 spread over the slots.
/// Not keyed: a client choosing addresses that share a slot only costs
/// route lookups, never a wrong next hop (the slot holds its address).
#[inline(always)]
pub fn client_hop_slot(addr: &Addr) -> u32 {
    let w = |i: usize| u32::from_ne_bytes([addr[i], addr[i + 1], addr[i + 2], addr[i + 3]]);
    let mut x = w(0) ^ w(4).rotate_left(8) ^ w(8).rotate_left(16) ^ w(12).rotate_left(24);
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x & (CLIENT_HOPS - 1)
}

/// TCP flag bits, as on the wire (RFC 9293).
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;

/// What one packet of a NAT flow tells [`PassiveStats`], as bits.
pub const EV_CONNECTED: u32 = 1;
pub const EV_RESET: u32 = 2;
pub const EV_REQUEST: u32 = 4;
pub const EV_RESPONSE: u32 = 8;
pub const EV_UNANSWERED: u32 = 16;
pub const EV_ABANDONED: u32 = 32;
pub const EV_CONNECT_TIMEOUT: u32 = 64;
/// Not a passive counter: the client's packet established the flow (the
/// ACK completing the handshake; a UDP client's packet after an answer),
/// once per flow. Its source counts one established flow (the guard's
/// `auto_block`).
pub const EV_ESTABLISHED: u32 = 128;

/// The passive evidence of a packet: [`EV_CONNECTED`]… bits, and for
/// [`EV_RESPONSE`] the response time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Evidence {
    pub events: u32,
    pub response_ns: u64,
}

impl Evidence {
    /// Adds the evidence to `s`: only the counters of its events are
    /// written (a packet is one or two events; the map value is memory
    /// the next packet of another flow reads).
    #[inline(always)]
    pub fn add_to(&self, s: &mut PassiveStats) {
        let e = self.events;
        if e & EV_REQUEST != 0 {
            s.requests += 1;
        }
        if e & EV_RESPONSE != 0 {
            s.responses += 1;
            s.response_ns += self.response_ns;
        }
        if e & !(EV_REQUEST | EV_RESPONSE) == 0 {
            return;
        }
        if e & EV_CONNECTED != 0 {
            s.connected += 1;
        }
        if e & EV_RESET != 0 {
            s.resets += 1;
        }
        if e & EV_UNANSWERED != 0 {
            s.unanswered += 1;
        }
        if e & EV_ABANDONED != 0 {
            s.abandoned += 1;
        }
        if e & EV_CONNECT_TIMEOUT != 0 {
            s.connect_timeouts += 1;
        }
    }
}

impl NatFlow {
    /// A client packet (TCP `flags`, 0 for UDP; `payload` whether it
    /// carries data, asked only when the answer counts; `ack` its
    /// acknowledgment number, host order, asked only while the handshake
    /// waits for it) at `now`: the flow's new state, written only where a
    /// field changes (the entry is the map's own memory), and what it
    /// tells the passive counters.
    #[inline(always)]
    pub fn client_packet(
        &mut self,
        pool: &NatPool,
        flags: u8,
        payload: impl FnOnce() -> bool,
        ack: impl FnOnce() -> u32,
        now: u64,
    ) -> Evidence {
        let mut ev = Evidence::default();
        let on = pool.passive_on();
        if on != (self.flags & NAT_FLAG_PASSIVE != 0) {
            self.flags ^= NAT_FLAG_PASSIVE;
            // Turned off: a request pending from before is judged by none.
            if !on {
                self.request_ns = 0;
            }
        }
        if self.state == NAT_TCP_SYN_SENT
            && pool.connect_timeout_ns != 0
            && self.flags & NAT_FLAG_CONNECT_TIMEOUT == 0
            && now.saturating_sub(self.last_seen_ns) >= pool.connect_timeout_ns
        {
            self.flags |= NAT_FLAG_CONNECT_TIMEOUT;
            ev.events |= EV_CONNECT_TIMEOUT;
        }
        let mut changed = false;
        if self.state == NAT_UDP
            && self.flags & (NAT_FLAG_ANSWERED | NAT_FLAG_CONFIRMED) == NAT_FLAG_ANSWERED
        {
            self.flags |= NAT_FLAG_CONFIRMED;
            ev.events |= EV_ESTABLISHED;
        }
        if flags & (TCP_RST | TCP_FIN) != 0 && self.request_ns != 0 {
            ev.events |= self.pending_verdict(pool, now);
            self.request_ns = 0;
        } else if on && self.request_ns == 0 && payload() {
            self.request_ns = now;
            ev.events |= EV_REQUEST;
        }
        if flags & TCP_RST != 0 {
            // Before the handshake completes, a client's RST is forwarded
            // and changes nothing: the flow stays embryonic (evictable, the
            // handshake's timeout). A client whose SYN reached a backend
            // still holding state for the same addresses and ports (a port
            // just taken from an embryonic flow) gets an ACK or SYN-ACK it
            // did not ask for and answers it with a RST, which clears that
            // state; its SYN, sent again, must then find the same flow.
            if self.state != NAT_TCP_SYN_SENT && self.state != NAT_TCP_SYN_RECV {
                changed |= self.set_state(NAT_TCP_CLOSED);
            }
        } else if self.state == NAT_TCP_SYN_RECV {
            // Only the ACK of the backend's SYN-ACK completes the
            // handshake; a FIN before it changes nothing (a forged source
            // must not reach the longer FIN timeout either).
            if flags & (TCP_SYN | TCP_ACK) == TCP_ACK
                && ack().wrapping_sub(self.backend_isn.wrapping_add(1)) < NAT_HANDSHAKE_WINDOW
            {
                changed |= self.set_state(NAT_TCP_ESTABLISHED);
                ev.events |= EV_ESTABLISHED;
            }
        } else if flags & TCP_FIN != 0
            && self.state != NAT_TCP_SYN_SENT
            && self.flags & NAT_FLAG_CLIENT_FIN == 0
        {
            self.flags |= NAT_FLAG_CLIENT_FIN;
            changed |= self.set_state(self.fin_state());
        }
        self.touch(now, changed);
        ev
    }

    /// A backend packet (as [`Self::client_packet`]; `seq` its sequence
    /// number, host order, asked only of the SYN-ACK); evidence only while
    /// [`NAT_FLAG_PASSIVE`] is set. `payload` is asked only while a request
    /// is pending.
    #[inline(always)]
    pub fn backend_packet(
        &mut self,
        flags: u8,
        payload: impl FnOnce() -> bool,
        seq: impl FnOnce() -> u32,
        now: u64,
    ) -> Evidence {
        let mut ev = Evidence::default();
        let mut changed = false;
        if self.state == NAT_UDP && self.flags & NAT_FLAG_ANSWERED == 0 {
            self.flags |= NAT_FLAG_ANSWERED;
            changed = true;
        }
        if flags & TCP_RST != 0 {
            ev.events |= EV_RESET;
            self.request_ns = 0;
            changed |= self.set_state(NAT_TCP_CLOSED);
        } else if flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK {
            // In SYN_RECV too: after the client's RST cleared the backend's
            // old state (above), its SYN sent again gets a new ISN.
            if self.state == NAT_TCP_SYN_SENT {
                ev.events |= EV_CONNECTED;
                self.backend_isn = seq();
                changed |= self.set_state(NAT_TCP_SYN_RECV);
            } else if self.state == NAT_TCP_SYN_RECV {
                self.backend_isn = seq();
            }
        }
        // `request_ns` is 0 whenever detection is off.
        if self.request_ns != 0 && payload() {
            ev.events |= EV_RESPONSE;
            ev.response_ns = now.saturating_sub(self.request_ns);
            self.request_ns = 0;
        }
        if flags & TCP_FIN != 0 && !self.embryonic() && self.flags & NAT_FLAG_BACKEND_FIN == 0 {
            self.flags |= NAT_FLAG_BACKEND_FIN;
            changed |= self.set_state(self.fin_state());
        }
        self.touch(now, changed);
        if self.flags & NAT_FLAG_PASSIVE == 0 {
            ev.events = 0;
        }
        ev
    }

    /// What a flow reclaimed at `now` (its port given to another) leaves
    /// in the passive counters: its pending request, its handshake that
    /// never completed.
    #[inline(always)]
    pub fn reclaimed(&self, pool: &NatPool, now: u64) -> Evidence {
        let mut events = 0;
        if self.request_ns != 0 {
            events |= self.pending_verdict(pool, now);
        }
        if self.state == NAT_TCP_SYN_SENT
            && pool.connect_timeout_ns != 0
            && self.flags & NAT_FLAG_CONNECT_TIMEOUT == 0
            && now.saturating_sub(self.last_seen_ns) >= pool.connect_timeout_ns
        {
            events |= EV_CONNECT_TIMEOUT;
        }
        Evidence {
            events,
            response_ns: 0,
        }
    }

    /// A pending request given up at `now`: unanswered if older than the
    /// response timeout, else abandoned (the client left first); nothing
    /// with passive detection off.
    #[inline(always)]
    fn pending_verdict(&self, pool: &NatPool, now: u64) -> u32 {
        if pool.response_timeout_ns == 0 {
            0
        } else if now.saturating_sub(self.request_ns) >= pool.response_timeout_ns {
            EV_UNANSWERED
        } else {
            EV_ABANDONED
        }
    }

    /// The state after a FIN: closing once both sides sent one.
    #[inline(always)]
    fn fin_state(&self) -> u8 {
        if self.state == NAT_TCP_CLOSED {
            NAT_TCP_CLOSED
        } else if self.flags & (NAT_FLAG_CLIENT_FIN | NAT_FLAG_BACKEND_FIN)
            == NAT_FLAG_CLIENT_FIN | NAT_FLAG_BACKEND_FIN
        {
            NAT_TCP_CLOSING
        } else {
            NAT_TCP_FIN_WAIT
        }
    }

    #[inline(always)]
    fn set_state(&mut self, state: u8) -> bool {
        if self.state == state || self.state == NAT_UDP {
            return false;
        }
        self.state = state;
        true
    }

    /// Refreshes `last_seen_ns` at most every [`crate::CT_TOUCH_INTERVAL_NS`]
    /// unless the state `changed`. A flow in SYN_SENT keeps the time of
    /// its first SYN, and one in SYN_RECV the time of the SYN-ACK:
    /// retransmits (or a forged source's repeated SYNs) do not extend the
    /// handshake's timeout, and the connect timeout is measured from the
    /// SYN.
    #[inline(always)]
    fn touch(&mut self, now: u64, changed: bool) {
        if changed
            || (self.state != NAT_TCP_SYN_SENT
                && self.state != NAT_TCP_SYN_RECV
                && now.saturating_sub(self.last_seen_ns) > crate::CT_TOUCH_INTERVAL_NS)
        {
            self.last_seen_ns = now;
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: repr(C), Copy, integers and byte arrays only, padding explicit.
    unsafe impl aya::Pod for NatPool {}
    unsafe impl aya::Pod for NatFlow {}
    unsafe impl aya::Pod for PassiveStats {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_hop_slots_are_in_range_and_spread_a_network() {
        let mut seen = [[false; CLIENT_HOPS as usize]; 2];
        for i in 0..1024u32 {
            let mut v4 = [0u8; 16];
            v4[..4].copy_from_slice(&[198, 18, (i >> 8) as u8, i as u8]);
            let mut v6 = [0u8; 16];
            v6[..8].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 1]);
            v6[12..].copy_from_slice(&i.to_be_bytes());
            for (f, a) in [v4, v6].iter().enumerate() {
                let slot = client_hop_slot(a);
                assert!(slot < CLIENT_HOPS, "slot {slot} of {a:?}");
                seen[f][slot as usize] = true;
            }
        }
        // 1024 addresses per family into 4096 slots: a uniform hash leaves
        // 4096 (1 - e^-0.25) = 906 distinct on average; a hash that keeps
        // an address's fixed bits in the slot leaves far fewer.
        for (f, slots) in seen.iter().enumerate() {
            let distinct = slots.iter().filter(|s| **s).count();
            assert!(
                distinct > 850,
                "family {f}: {distinct} distinct slots of 1024"
            );
        }
        // The same address always lands on the same slot; the upper half
        // of an IPv6 address counts too.
        let mut a = [0u8; 16];
        a[15] = 1;
        let mut b = a;
        b[0] = 0x20;
        assert_eq!(client_hop_slot(&a), client_hop_slot(&a));
        assert_ne!(client_hop_slot(&a), client_hop_slot(&b));
    }

    const S: u64 = 1_000_000_000;

    fn pool() -> NatPool {
        NatPool {
            count: 2,
            port_min: 100,
            port_max: 103,
            response_timeout_ns: S,
            connect_timeout_ns: S,
            tcp_syn_timeout_ns: 5 * S,
            ..Default::default()
        }
    }

    fn syn_sent(at: u64) -> NatFlow {
        NatFlow {
            state: NAT_TCP_SYN_SENT,
            flags: NAT_FLAG_PASSIVE,
            last_seen_ns: at,
            ..Default::default()
        }
    }

    #[test]
    fn candidates_cover_the_pool_and_stay_in_range() {
        let p = pool();
        let mut seen = [[false; 4]; 2];
        for i in 0..NAT_ALLOC_TRIES {
            let (a, port) = nat_candidate(&p, 0x1234_5678_9abc_def0, i).unwrap();
            assert!(a < 2 && (100..=103).contains(&port), "{a} {port}");
            seen[a as usize][usize::from(port - 100)] = true;
        }
        // Address and port advance together: 8 pairs of one parity class.
        assert!(
            seen.iter().flatten().filter(|s| **s).count() >= 4,
            "{seen:?}"
        );
        assert_eq!(nat_candidate(&NatPool::default(), 1, 0), None, "empty pool");
        let inverted = NatPool {
            port_min: 5,
            port_max: 4,
            ..p
        };
        assert_eq!(nat_candidate(&inverted, 1, 0), None, "inverted range");
    }

    #[test]
    fn tcp_states_follow_syn_fin_rst() {
        let p = pool();
        let mut f = syn_sent(10);
        assert_eq!(
            f.backend_packet(TCP_SYN | TCP_ACK, || false, || 0, 20)
                .events,
            EV_CONNECTED
        );
        assert_eq!(
            (f.state, f.last_seen_ns),
            (NAT_TCP_SYN_RECV, 20),
            "state change touches"
        );
        assert_eq!(
            f.client_packet(&p, TCP_ACK, || false, || 1, 25).events,
            EV_ESTABLISHED
        );
        assert_eq!(f.state, NAT_TCP_ESTABLISHED, "the client's ACK of ISN 0");
        assert_eq!(
            f.client_packet(&p, TCP_ACK, || false, || 1, 26).events,
            0,
            "established once"
        );
        f.client_packet(&p, TCP_FIN | TCP_ACK, || false, || 0, 30);
        assert_eq!(f.state, NAT_TCP_FIN_WAIT);
        f.backend_packet(TCP_FIN | TCP_ACK, || false, || 0, 40);
        assert_eq!((f.state, f.last_seen_ns), (NAT_TCP_CLOSING, 40));
        assert_eq!(
            f.backend_packet(TCP_RST, || false, || 0, 50).events,
            EV_RESET
        );
        assert_eq!(f.state, NAT_TCP_CLOSED);
        assert_eq!(
            f.expires(&NatPool {
                tcp_close_timeout_ns: 7,
                ..p
            }),
            57
        );
    }

    /// A SYN-ACK with ISN `isn` on a fresh SYN_SENT flow.
    fn syn_recv(isn: u32) -> NatFlow {
        let mut f = syn_sent(S);
        f.backend_packet(TCP_SYN | TCP_ACK, || false, || isn, 2 * S);
        f
    }

    #[test]
    fn only_the_clients_ack_of_the_syn_ack_completes_the_handshake() {
        let p = pool();
        let isn = u32::MAX - 10;
        let f = syn_recv(isn);
        assert_eq!(
            (f.state, f.backend_isn, f.last_seen_ns),
            (NAT_TCP_SYN_RECV, isn, 2 * S)
        );
        assert!(f.embryonic());
        assert_eq!(
            f.expires(&p),
            2 * S + p.tcp_syn_timeout_ns,
            "the handshake's timeout"
        );
        // In the window (ISN + 1 wraps past 0), with or without data.
        for ack in [isn.wrapping_add(1), isn.wrapping_add(NAT_HANDSHAKE_WINDOW)] {
            let mut g = f;
            g.client_packet(&p, TCP_ACK, || true, || ack, 3 * S);
            assert_eq!(g.state, NAT_TCP_ESTABLISHED, "ack {ack}");
            assert!(!g.embryonic());
            assert_eq!(g.last_seen_ns, 3 * S, "completing touches");
        }
        // A blind ACK, a retransmitted SYN, a FIN: still waiting, the
        // handshake's time kept.
        for (flags, ack) in [
            (TCP_ACK, isn),
            (TCP_ACK, isn.wrapping_add(NAT_HANDSHAKE_WINDOW + 1)),
            (TCP_ACK, isn.wrapping_add(1 << 20)),
            (TCP_SYN, isn.wrapping_add(1)),
            (TCP_SYN | TCP_ACK, isn.wrapping_add(1)),
            (TCP_FIN | TCP_ACK, isn),
            (0, isn.wrapping_add(1)),
        ] {
            let mut g = f;
            g.client_packet(&p, flags, || false, || ack, 9 * S);
            assert_eq!(
                (g.state, g.flags & NAT_FLAG_CLIENT_FIN, g.last_seen_ns),
                (NAT_TCP_SYN_RECV, 0, 2 * S),
                "flags {flags:#x} ack {ack:#x}"
            );
        }
        // The ACK number is read only while the handshake waits for it.
        let mut e = f;
        e.client_packet(&p, TCP_ACK, || false, || isn + 1, 3 * S);
        e.client_packet(&p, TCP_ACK, || false, || panic!("ack read"), 4 * S);
        let mut s = syn_sent(S);
        s.client_packet(&p, TCP_ACK, || false, || panic!("ack read"), 2 * S);
        assert_eq!(
            s.state, NAT_TCP_SYN_SENT,
            "no ACK completes before the SYN-ACK"
        );
        // The client's RST before the handshake completes changes nothing
        // (it answers a backend's stale state on a reused port); the
        // backend's next SYN-ACK gives the ISN to acknowledge.
        let mut r = f;
        r.client_packet(&p, TCP_RST, || false, || 0, 3 * S);
        assert_eq!((r.state, r.last_seen_ns), (NAT_TCP_SYN_RECV, 2 * S));
        r.backend_packet(TCP_SYN | TCP_ACK, || false, || 77, 3 * S);
        assert_eq!((r.state, r.backend_isn), (NAT_TCP_SYN_RECV, 77));
        r.client_packet(&p, TCP_ACK, || false, || 78, 3 * S);
        assert_eq!(r.state, NAT_TCP_ESTABLISHED);
        r.client_packet(&p, TCP_RST, || false, || 0, 4 * S);
        assert_eq!(r.state, NAT_TCP_CLOSED, "after it, a RST closes");
        let mut s = syn_sent(S);
        s.client_packet(&p, TCP_RST, || false, || 0, 2 * S);
        assert_eq!(s.state, NAT_TCP_SYN_SENT);
        s.backend_packet(TCP_RST, || false, || 0, 2 * S);
        assert_eq!(s.state, NAT_TCP_CLOSED, "the backend's RST closes");
        // A backend FIN before the handshake completes changes nothing.
        let mut b = f;
        b.backend_packet(TCP_FIN | TCP_ACK, || false, || 0, 3 * S);
        assert_eq!(
            (b.state, b.flags & NAT_FLAG_BACKEND_FIN),
            (NAT_TCP_SYN_RECV, 0)
        );
    }

    #[test]
    fn udp_flows_are_embryonic_until_answered() {
        let p = NatPool {
            udp_timeout_ns: 30 * S,
            ..pool()
        };
        let mut f = NatFlow {
            state: NAT_UDP,
            last_seen_ns: S,
            ..Default::default()
        };
        assert!(f.embryonic());
        assert_eq!(f.expires(&p), S + NAT_UDP_UNANSWERED_NS, "unanswered");
        let short = NatPool {
            udp_timeout_ns: 2 * S,
            ..p
        };
        assert_eq!(f.expires(&short), 3 * S, "never past udp_timeout");
        assert_eq!(
            f.client_packet(&p, 0, || true, || 0, 3 * S).events & EV_ESTABLISHED,
            0
        );
        assert!(f.embryonic(), "the client's own packets prove nothing");
        f.backend_packet(0, || true, || 0, 3 * S + 5);
        let mut g = f;
        assert_eq!(
            g.client_packet(&p, 0, || false, || 0, 4 * S).events,
            EV_ESTABLISHED,
            "the client's next datagram after an answer"
        );
        assert_eq!(
            g.client_packet(&p, 0, || false, || 0, 4 * S).events,
            0,
            "once"
        );
        assert!(!f.embryonic());
        assert_eq!(f.flags & NAT_FLAG_ANSWERED, NAT_FLAG_ANSWERED);
        assert_eq!((f.state, f.last_seen_ns), (NAT_UDP, 3 * S + 5));
        assert_eq!(f.expires(&p), 33 * S + 5, "answered: udp_timeout");
        for (state, embryonic) in [
            (NAT_TCP_SYN_SENT, true),
            (NAT_TCP_SYN_RECV, true),
            (NAT_TCP_ESTABLISHED, false),
            (NAT_TCP_FIN_WAIT, false),
            (NAT_TCP_CLOSING, false),
            (NAT_TCP_CLOSED, false),
        ] {
            let g = NatFlow {
                state,
                ..Default::default()
            };
            assert_eq!(g.embryonic(), embryonic, "state {state}");
        }
    }

    #[test]
    fn last_seen_refreshed_only_each_interval_or_on_change() {
        let p = pool();
        let mut f = NatFlow {
            state: NAT_TCP_ESTABLISHED,
            last_seen_ns: 10 * S,
            ..Default::default()
        };
        f.client_packet(&p, TCP_ACK, || false, || 0, 10 * S + S / 2);
        assert_eq!(f.last_seen_ns, 10 * S, "within the interval");
        f.client_packet(&p, TCP_ACK, || false, || 0, 12 * S);
        assert_eq!(f.last_seen_ns, 12 * S, "past it");
        let mut s = syn_sent(S);
        s.client_packet(&p, TCP_SYN, || false, || 0, 4 * S);
        assert_eq!(
            s.last_seen_ns, S,
            "a SYN retransmit keeps the first SYN's time"
        );
        let mut r = syn_recv(7);
        r.client_packet(&p, TCP_SYN, || false, || 0, 9 * S);
        assert_eq!(r.last_seen_ns, 2 * S, "nor does one after the SYN-ACK");
    }

    #[test]
    fn passive_evidence() {
        let p = pool();
        let mut f = NatFlow {
            state: NAT_TCP_ESTABLISHED,
            last_seen_ns: S,
            ..Default::default()
        };
        assert_eq!(
            f.client_packet(&p, TCP_ACK, || true, || 0, 2 * S).events,
            EV_REQUEST
        );
        assert_eq!(
            f.client_packet(&p, TCP_ACK, || true, || 0, 2 * S + 5)
                .events,
            0,
            "one pending"
        );
        let ev = f.backend_packet(TCP_ACK, || true, || 0, 2 * S + 30);
        assert_eq!(
            (ev.events, ev.response_ns, f.request_ns),
            (EV_RESPONSE, 30, 0)
        );
        f.client_packet(&p, TCP_ACK, || true, || 0, 3 * S);
        let ev = f.client_packet(&p, TCP_FIN, || false, || 0, 3 * S + S / 2);
        assert_eq!(ev.events, EV_ABANDONED, "younger than the response timeout");
        f.request_ns = 3 * S;
        assert_eq!(
            f.client_packet(&p, TCP_RST, || false, || 0, 5 * S).events,
            EV_UNANSWERED
        );
        // Connect timeout: once, on a SYN seen again, or at reclaim.
        let mut s = syn_sent(S);
        assert_eq!(
            s.client_packet(&p, TCP_SYN, || false, || 0, S + S / 2)
                .events,
            0
        );
        assert_eq!(
            s.client_packet(&p, TCP_SYN, || false, || 0, 3 * S).events,
            EV_CONNECT_TIMEOUT
        );
        assert_eq!(
            s.client_packet(&p, TCP_SYN, || false, || 0, 4 * S).events,
            0
        );
        assert_eq!(s.reclaimed(&p, 9 * S).events, 0, "already counted");
        assert_eq!(syn_sent(S).reclaimed(&p, 9 * S).events, EV_CONNECT_TIMEOUT);
        let off = NatPool {
            response_timeout_ns: 0,
            ..p
        };
        let mut g = NatFlow {
            request_ns: S,
            state: NAT_TCP_ESTABLISHED,
            ..Default::default()
        };
        assert_eq!(
            g.client_packet(&off, TCP_RST, || false, || 0, 9 * S).events,
            0,
            "detection off"
        );
        let mut stats = PassiveStats::default();
        Evidence {
            events: EV_RESPONSE | EV_RESET,
            response_ns: 9,
        }
        .add_to(&mut stats);
        assert_eq!(
            (
                stats.responses,
                stats.resets,
                stats.response_ns,
                stats.requests
            ),
            (1, 1, 9, 0)
        );
    }

    #[test]
    fn passive_off_costs_no_evidence_and_never_reads_the_payload() {
        let on = pool();
        let off = NatPool {
            response_timeout_ns: 0,
            connect_timeout_ns: 0,
            ..on
        };
        let unread = || -> bool { panic!("the payload was read with detection off") };
        let mut f = NatFlow {
            state: NAT_TCP_SYN_SENT,
            last_seen_ns: S,
            ..Default::default()
        };
        assert_eq!(f.client_packet(&off, TCP_SYN, unread, || 0, S).events, 0);
        assert_eq!(f.flags & NAT_FLAG_PASSIVE, 0);
        // The handshake, a request and its answer, a reset: state follows,
        // evidence does not.
        assert_eq!(
            f.backend_packet(TCP_SYN | TCP_ACK, unread, || 0, 2 * S)
                .events,
            0
        );
        assert_eq!(f.state, NAT_TCP_SYN_RECV);
        assert_eq!(
            f.client_packet(&off, TCP_ACK, unread, || 1, 3 * S).events,
            EV_ESTABLISHED,
            "the guard's count, not passive evidence"
        );
        assert_eq!(f.state, NAT_TCP_ESTABLISHED);
        assert_eq!(f.backend_packet(TCP_ACK, unread, || 0, 4 * S).events, 0);
        assert_eq!(f.backend_packet(TCP_RST, unread, || 0, 5 * S).events, 0);
        assert_eq!((f.state, f.request_ns), (NAT_TCP_CLOSED, 0));
        // Turned on by a reload: the next client packet sets the flag and
        // opens a request; turned off again: the pending one is dropped
        // unjudged, and the answer tells nothing.
        let mut g = NatFlow {
            state: NAT_TCP_ESTABLISHED,
            last_seen_ns: S,
            ..Default::default()
        };
        assert_eq!(
            g.client_packet(&on, TCP_ACK, || true, || 0, 2 * S).events,
            EV_REQUEST
        );
        assert_ne!(g.flags & NAT_FLAG_PASSIVE, 0);
        assert_eq!(
            g.client_packet(&off, TCP_ACK, unread, || 0, 3 * S).events,
            0
        );
        assert_eq!((g.flags & NAT_FLAG_PASSIVE, g.request_ns), (0, 0));
        assert_eq!(g.backend_packet(TCP_ACK, unread, || 0, 4 * S).events, 0);
    }

    #[test]
    fn an_answer_without_a_pending_request_never_reads_the_payload() {
        let mut f = NatFlow {
            state: NAT_TCP_ESTABLISHED,
            flags: NAT_FLAG_PASSIVE,
            ..Default::default()
        };
        let unread = || -> bool { panic!("the payload was read with no request pending") };
        assert_eq!(f.backend_packet(TCP_ACK, unread, || 0, S).events, 0);
    }

    #[test]
    fn each_event_adds_to_its_own_counter() {
        let all = EV_CONNECTED
            | EV_RESET
            | EV_REQUEST
            | EV_RESPONSE
            | EV_UNANSWERED
            | EV_ABANDONED
            | EV_CONNECT_TIMEOUT;
        let mut s = PassiveStats::default();
        Evidence {
            events: all,
            response_ns: 7,
        }
        .add_to(&mut s);
        let one = PassiveStats {
            connects: 0,
            connected: 1,
            connect_timeouts: 1,
            resets: 1,
            requests: 1,
            responses: 1,
            unanswered: 1,
            abandoned: 1,
            response_ns: 7,
        };
        assert_eq!(s, one);
        for bit in 0..7 {
            let mut s = PassiveStats::default();
            Evidence {
                events: 1 << bit,
                response_ns: 0,
            }
            .add_to(&mut s);
            let total = s.connected
                + s.connect_timeouts
                + s.resets
                + s.requests
                + s.responses
                + s.unanswered
                + s.abandoned;
            assert_eq!(total, 1, "event bit {bit}: {s:?}");
        }
    }

    #[test]
    fn pool_address_bits_name_their_vip() {
        assert_eq!(vip_addr_nat_vip(vip_addr_nat_pool(0)), Some(0));
        assert_eq!(vip_addr_nat_vip(vip_addr_nat_pool(63)), Some(63));
        assert_eq!(vip_addr_nat_vip(crate::VIP_ADDR_BALANCED), None);
    }
}
