//! `xlb_lb`: parse, look up the VIP, pick a backend, forward. This file is
//! the order of the stages; each stage is its own module: `parse`,
//! `conntrack`, `select`, `forward` (with `encap` and `checksum`).
//!
//! Verdict policy (documented in the README, tested by the fixtures):
//! - not IPv4/IPv6, or not to a VIP address: `XDP_PASS`, untouched. The
//!   host keeps working (SSH, ARP, its own services).
//! - to a VIP address but for no VIP (another port or protocol, ICMP xlb
//!   does not answer, IPv6 extension headers): `XDP_DROP`
//!   (`drop_vip_unbalanced`). The host does not hold VIP addresses (they
//!   are routed to it), and forwarding is on for `bpf_fib_lookup`, so the
//!   kernel would send the packet back to the router, which sends it here
//!   again until its TTL runs out. A VIP with `host_services = true` opts
//!   its address out: such packets go to the host's stack (`XDP_PASS`).
//! - truncated before the IP destination is known: `XDP_PASS` (nothing proves
//!   it is ours; the kernel drops junk itself).
//! - to a VIP *address* but malformed (bad IHL/version, bad length, truncated
//!   or invalid TCP/UDP header): `XDP_DROP`. Never forwarded, never
//!   `XDP_ABORTED`.
//! - IPv4 options to a VIP address: `XDP_DROP`. No TCP/UDP client needs them
//!   (RFC 7126: source-route options are attacks), and a fixed 20-byte header
//!   keeps the hot path short. Katran does the same.
//! - IPv4 or IPv6 fragments to a VIP address: `XDP_DROP`. Only the first
//!   fragment carries ports, so later fragments cannot be hashed to the same
//!   backend; forwarding the first alone would leave the backend a packet it
//!   can never reassemble. Katran does the same.
//! - IPv6 extension headers (hop-by-hop, routing, destination options, AH,
//!   mobility, HIP, shim6) before TCP/UDP to a VIP address: not balanced
//!   (xlb does not walk them), so dropped like any unbalanced packet, or
//!   passed to the host stack (Katran's choice) where the address has
//!   `host_services`: only a host that holds the address can take them
//!   without routing them back. ESP and unknown next headers likewise.
//! - conntrack: a TCP SYN or a UDP packet that misses inserts an entry; a TCP
//!   packet without SYN that misses follows the table and inserts nothing.
//! - ICMP to a VIP address (`icmp.rs`): errors about a VIP flow go where
//!   the flow's packets go (conntrack, else the table), never inserting and
//!   never judged; echo requests are answered; the rest is unbalanced
//!   (dropped, or passed with `host_services`).
//! - guard: what is not a conntrack hit is judged by the VIP's deny/allow
//!   lists and its per-source rate before it may take a backend
//!   (`guard.rs`): refused packets are dropped, or a SYN is answered with a
//!   RST. Conntrack hits are never judged.
//!
//! Every stage returns a verdict word (`lb_common::trace`): the XDP action
//! with the reason and backend above it. `run::<true>` hands it to
//! `trace::after` and returns the action alone; `run::<false>` (no trace
//! on: `xlb_lb` tests the flag first) returns the action, the other bits
//! folded away.

use core::mem::MaybeUninit;

use aya_ebpf::programs::XdpContext;
use lb_common::{
    Globals, PROTO_UDP, Stat,
    nat::{VIP_ADDR_NAT_POOL, VIP_PORT_NAT},
    trace::{TRACE_FLAG_PICKED, VERDICT_ACTION_MASK, flag_bits},
};

use crate::{
    XLB_GLOBALS, XLB_GUARD, chance, clock,
    conntrack::{self, Lookup, Target},
    forward::forward,
    guard, icmp, nat,
    packet::{ETH_P_IP, ETH_P_IPV6},
    parse::{self, L2Error, Packet},
    select,
    stats::{aborted, count, drop_with, pass},
    trace,
};

/// `TRACED`: with the trace hook (`trace::run_traced`, while a trace is on),
/// or without (the untraced path of `xlb_lb`, and the benchmark's twin).
#[inline(always)]
pub(crate) fn run<const TRACED: bool>(ctx: &XdpContext) -> u32 {
    let l2 = match parse::l2(ctx) {
        Ok(l2) => l2,
        // Not traced: no address to show or filter by.
        Err(L2Error::Truncated) => return pass(Stat::PassTruncatedL2) & VERDICT_ACTION_MASK,
        Err(L2Error::QinQ) => return pass(Stat::PassQinQ) & VERDICT_ACTION_MASK,
    };
    // One Packet, filled in place by either parser.
    let mut slot = MaybeUninit::uninit();
    let pkt = Packet::init(&mut slot, l2.l3off);
    let verdict = decide(ctx, pkt, l2.ethertype);
    if TRACED {
        trace::after(ctx, pkt, verdict);
    }
    verdict & VERDICT_ACTION_MASK
}

/// The verdict word for `pkt` (zeroed, its IP header at `pkt.l3off`, of
/// `ethertype`): parse, then the stages.
#[inline(always)]
fn decide(ctx: &XdpContext, pkt: &mut Packet, ethertype: u16) -> u32 {
    let parsed = match ethertype {
        ETH_P_IP => parse::ipv4(ctx, pkt),
        ETH_P_IPV6 => parse::ipv6(ctx, pkt),
        _ => return pass(Stat::PassNotIp),
    };
    if let Err(verdict) = parsed {
        if verdict == icmp::TRANSIT {
            return nat_verdict(ctx, pkt, nat::reply::transit(ctx, pkt));
        }
        return verdict;
    }
    // A NAT backend's answer (`nat::reply`): one array read of the source
    // port for every other packet.
    if nat::reply::from_backend_port(pkt)
        && let Some(verdict) = nat::reply::answer(ctx, pkt)
    {
        return nat_verdict(ctx, pkt, verdict);
    }
    // No VIP on this port: the host's own traffic, unless it is to a VIP
    // address (checked after the port filter, so the host's traffic pays
    // one array read for it).
    let vips = select::port_vips(&pkt.flow);
    if vips == 0 {
        return unbalanced(pkt);
    }
    // SYN+RST and SYN+FIN: no TCP sends them, and taken as a SYN they
    // would replace the flow's conntrack entry (a new backend mid-
    // connection), taken as a FIN or RST mark it closing. Checked past the
    // port filter: the host's own traffic does not pay for it.
    if pkt.syn_fin_or_rst() {
        return parse::bad(&pkt.flow.dst, pkt.flow.family, Stat::DropBadTcpFlags);
    }
    let Some(g) = XLB_GLOBALS.get(0) else {
        return aborted();
    };
    // The coarse clock (CLOCK_MONOTONIC_COARSE, tick resolution), cached
    // per CPU until the next tick; idle timeouts and cache expiry need no
    // better.
    let now = clock::now();
    // A NAT VIP on this port: its flows are in the NAT maps, not conntrack.
    if vips & VIP_PORT_NAT != 0 {
        let verdict = match nat::client(ctx, pkt, now) {
            nat::NOT_NAT => None,
            nat::SEND => {
                if pkt.icmp {
                    nat::raise_mtu(ctx, pkt);
                }
                Some(nat::send(ctx, pkt, now))
            }
            nat::NEW => Some(nat::start(ctx, pkt, now)),
            verdict => return verdict,
        };
        if let Some(verdict) = verdict {
            return nat_verdict(ctx, pkt, verdict);
        }
    }
    balance(ctx, pkt, g, now)
}

/// `verdict`, the NAT path's, or for [`nat::TOO_BIG`] the answer to the
/// packet's sender: "fragmentation needed" / "packet too big". Built here,
/// at the top of the call chain, as DSR's is from `encap`: from inside the
/// NAT functions its frame would be stacked on theirs, past 512 bytes.
#[inline(always)]
fn nat_verdict(ctx: &XdpContext, pkt: &Packet, verdict: u32) -> u32 {
    if verdict == nat::TOO_BIG {
        icmp::too_big(ctx, pkt, nat::too_big_mtu())
    } else {
        verdict
    }
}

/// The DSR stages of a packet to a VIP's port: conntrack, the VIP, the
/// guard, the table, forward.
#[inline(always)]
fn balance(ctx: &XdpContext, pkt: &mut Packet, g: &Globals, now: u64) -> u32 {
    // Established flows: conntrack first, and a hit needs no VIP lookup.
    // A SYN always picks from the current table.
    let mut missed = false;
    if !pkt.syn() {
        match conntrack::lookup(pkt, g, now) {
            Lookup::Hit(t) => return forward(ctx, pkt, &t, g, now, false),
            Lookup::Miss => missed = true,
            Lookup::Stale => {}
        }
    }
    let Some((vip_id, vip)) = select::vip(&pkt.flow) else {
        return unbalanced(pkt);
    };
    if missed {
        count(Stat::CtMiss);
    }
    let Some(guard) = XLB_GUARD.get(vip_id) else {
        return aborted();
    };
    // An ICMP error about a flow is no new flow: not judged. A VIP with no
    // list, limit or tracking is not judged either: one flag test here
    // instead of a call.
    if !pkt.icmp && guard::active(guard) {
        let judged = guard::judge(ctx, pkt, vip_id, guard, now);
        if judged != guard::ADMITTED {
            return judged;
        }
    }
    // The table's answer: picked, not a conntrack hit (for `xlb trace`).
    let Some((id, be, prev)) = select::pick(&pkt.flow, &vip, g) else {
        return drop_with(Stat::DropNoBackend);
    };
    let t = Target::new(&vip, id, be);
    record_if_new(pkt, missed, vip_id, &t, now, guard.ct_insert_cap);
    // A TCP packet without SYN that missed may be of a connection the
    // slot's previous owner holds: it gets a second chance (`chance.rs`).
    if missed && let Some(p) = chance::previous(pkt, &vip, id, be, prev) {
        return chance::forward(ctx, pkt, &t, p, g, now) | flag_bits(TRACE_FLAG_PICKED);
    }
    forward(ctx, pkt, &t, g, now, !pkt.icmp) | flag_bits(TRACE_FLAG_PICKED)
}

/// Only what starts a flow is tracked: a TCP SYN or a UDP packet (and an
/// existing entry that went stale is replaced). A TCP packet without SYN
/// that misses (a spoofed ACK, RST or FIN, or a flow whose entry was
/// evicted) follows the table without inserting, so a flood of them cannot
/// wash real flows out of the LRU; it records nothing and goes to the
/// table's backend.
#[inline(always)]
fn record_if_new(pkt: &Packet, missed: bool, vip_id: u32, t: &Target, now: u64, cap: u64) {
    if !pkt.icmp && (!missed || pkt.flow.proto == PROTO_UDP) {
        conntrack::record(pkt, vip_id, t, now, cap);
    }
}

/// A TCP/UDP packet (or an ICMP error about one) that no VIP balances:
/// passed if not to a VIP address, else dropped unless the address has
/// host services (`parse::unbalanced`).
#[inline(always)]
fn unbalanced(pkt: &Packet) -> u32 {
    let host = if pkt.icmp {
        Stat::PassIcmp
    } else {
        Stat::PassVipHost
    };
    match select::vip_addr(&pkt.flow.dst, pkt.flow.family) {
        None => pass(Stat::PassNotVip),
        Some(bits) if bits & VIP_ADDR_NAT_POOL != 0 => nat::reply::stray(pkt, bits),
        Some(bits) => parse::unbalanced_at(bits, host),
    }
}
