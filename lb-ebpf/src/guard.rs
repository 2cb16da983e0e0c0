//! Guard: what is not a conntrack hit is judged before it may take a
//! backend. Established flows (hits) never come here, so they pay nothing
//! for any of it but one branch of packet sampling.
//!
//! - Lists: a deny match in the VIP's scope or the global one refuses the
//!   packet unless an allow match (either scope) covers the source; each
//!   match counts on its rule. Allow wins whatever the prefix lengths: it
//!   is the operator's own monitoring.
//! - Rate: a new flow (TCP SYN, UDP miss) passes its source's token bucket,
//!   a GCRA on one shared theoretical arrival time per (VIP, source prefix).
//!   The time advances with an atomic add, so every admission is charged
//!   even when CPUs race; the only race left is the decision itself, which
//!   can admit at most one flow per CPU over the burst at the instant the
//!   bucket runs out. Accurate to the flow, with no lock.
//! - Tracking: new flows and packets per source, for `xlb sources`; and,
//!   from the conntrack hit path ([`confirm`]), flows the client carried on
//!   past its SYN, the only count `auto_block` judges: a SYN's source can
//!   be forged, so SYNs alone must not be able to aim a block at a victim.
//! - Refused: `reset` answers a TCP SYN with a RST (`reset.rs`), everything
//!   else is dropped.

use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::{maps::LpmTrie, programs::XdpContext};
use lb_common::{
    ACTION_RESET, CT_FLAG_ESTABLISHED, CtEntry, FAMILY_V4, GUARD_LIMIT, GUARD_LISTS, GUARD_TRACK,
    LIST_SCOPE_BITS, ListEntry, PROTO_TCP, PROTO_UDP, SCOPE_GLOBAL, SOURCE_SAMPLE, SourceKey,
    SourceState, Stat, VipGuard,
};

use crate::{
    XLB_ALLOW_V4, XLB_ALLOW_V6, XLB_DENY_V4, XLB_DENY_V6, XLB_GUARD, XLB_LIST_HITS, XLB_SOURCES,
    key::{WordKey, Zeroed, addr_words, word},
    packet::{TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
    parse::Packet,
    reset,
    stats::{bump, count, drop_with},
};

/// [`judge`]'s answer for a packet it lets through (not an XDP action).
pub(crate) const ADMITTED: u32 = u32::MAX;

/// Whether `g` asks anything of a new flow (a list, a limit, tracking). A
/// VIP that asks nothing is not judged: one flag test in the caller
/// instead of [`judge`]'s call.
#[inline(always)]
pub(crate) fn active(g: &VipGuard) -> bool {
    g.flags & (GUARD_LISTS | GUARD_LIMIT | GUARD_TRACK) != 0
}

/// Judges a packet that is not a conntrack hit, for VIP `vip_id` guarded by
/// `g`: the verdict (counted) when it is refused, else [`ADMITTED`].
// verifier: a function of its own, verified once per call site rather than
// multiplied into every path of the stages around it. A plain u32 result:
// an `Option` would be returned through a sixth (pointer) argument, and BPF
// calls take five.
#[inline(never)]
pub(crate) fn judge(ctx: &XdpContext, pkt: &Packet, vip_id: u32, g: &VipGuard, now: u64) -> u32 {
    if g.flags & GUARD_LISTS != 0
        && let Some(action) = denied(pkt, vip_id)
    {
        return refuse(ctx, pkt, action, Stat::DropDenied, Stat::ResetDenied);
    }
    if g.flags & (GUARD_LIMIT | GUARD_TRACK) == 0 {
        return ADMITTED;
    }
    let key = source_key(pkt, vip_id, g);
    // A TCP packet without SYN that missed is no new flow: it only counts as
    // a packet of a source already tracked (a spoofed flood from random
    // sources must not wash the sources out).
    if pkt.flow.proto == PROTO_TCP && !pkt.syn() {
        if let Some(s) = XLB_SOURCES.get_ptr_mut(&key) {
            // SAFETY: LRU values stay valid for the program's run (RCU).
            add(unsafe { &raw mut (*s).packets }, 1);
        }
        return ADMITTED;
    }
    let Some(s) = tracked(&key) else {
        return ADMITTED;
    };
    // SAFETY: as above; every field is a u64 written whole.
    let s = unsafe { &mut *s };
    add(&raw mut s.new_flows, 1);
    add(&raw mut s.packets, 1);
    if g.flags & GUARD_LIMIT == 0 || admit(s, g, now) {
        return ADMITTED;
    }
    add(&raw mut s.limited, 1);
    refuse(
        ctx,
        pkt,
        g.limit_action,
        Stat::DropRateLimited,
        Stat::ResetRateLimited,
    )
}

/// One established packet of VIP `vip_id` in [`SOURCE_SAMPLE`] (the caller
/// decides which): counts that many packets to its source, if tracked.
// verifier: as `judge`.
#[inline(never)]
pub(crate) fn sample(pkt: &Packet, vip_id: u32) {
    let Some(g) = XLB_GUARD.get(vip_id) else {
        return;
    };
    if g.flags & (GUARD_LIMIT | GUARD_TRACK) == 0 {
        return;
    }
    if let Some(s) = XLB_SOURCES.get_ptr_mut(&source_key(pkt, vip_id, g)) {
        // SAFETY: LRU values stay valid for the program's run (RCU).
        add(unsafe { &raw mut (*s).packets }, SOURCE_SAMPLE);
    }
}

/// A packet that hit conntrack entry `e`: the first that confirms the flow
/// (a TCP ACK without SYN, FIN or RST, the handshake's third packet; any
/// UDP packet, a flow's second) marks the entry [`CT_FLAG_ESTABLISHED`]
/// and counts one established flow on its source, which `auto_block`
/// judges. Once per flow: later packets cost this one flag test.
#[inline(always)]
pub(crate) fn confirm(pkt: &Packet, e: &mut CtEntry) {
    if e.flags & CT_FLAG_ESTABLISHED != 0 {
        return;
    }
    let f = pkt.tcp_flags & (TCP_SYN | TCP_ACK | TCP_FIN | TCP_RST);
    if pkt.flow.proto == PROTO_UDP || (pkt.flow.proto == PROTO_TCP && f == TCP_ACK) {
        // A racing CPU's `CT_FLAG_CLOSING` could be lost by this plain
        // read-modify-write; the flow's FIN or RST is not its first
        // confirming packet, so the two are not written at the same time
        // in practice, and a lost mark only delays a drain's count.
        e.flags |= CT_FLAG_ESTABLISHED;
        established(pkt, e.vip_id);
    }
}

/// One confirmed flow of VIP `vip_id` ([`confirm`]): counted on its source,
/// whose entry is made if the LRU lost it since the SYN (a random-source
/// flood churns the map; a real client must still be counted).
// verifier: as `judge`.
#[inline(never)]
pub(crate) fn established(pkt: &Packet, vip_id: u32) {
    let Some(g) = XLB_GUARD.get(vip_id) else {
        return;
    };
    if g.flags & (GUARD_LIMIT | GUARD_TRACK) == 0 {
        return;
    }
    if let Some(s) = tracked(&source_key(pkt, vip_id, g)) {
        // SAFETY: LRU values stay valid for the program's run (RCU).
        add(unsafe { &raw mut (*s).established }, 1);
    }
}

/// GCRA: admits a new flow if the source's theoretical arrival time is at
/// most `tolerance_ns` ahead of now, and charges it one interval.
#[inline(always)]
fn admit(s: &mut SourceState, g: &VipGuard, now: u64) -> bool {
    // SAFETY: an aligned u64 of a map value; read once.
    let tat = unsafe { core::ptr::read_volatile(&raw const s.tat_ns) };
    let from = if tat < now { now } else { tat };
    if from - now > g.tolerance_ns {
        return false;
    }
    if tat < now {
        // An idle bucket restarts from now: the burst is back.
        s.tat_ns = now;
    }
    add(&raw mut s.tat_ns, g.interval_ns);
    true
}

/// The source's entry, inserted (empty) if it has none. `None` only if the
/// LRU cannot take it: the flow is then judged as untracked (admitted).
#[inline(always)]
fn tracked(key: &SourceKey) -> Option<*mut SourceState> {
    if let Some(s) = XLB_SOURCES.get_ptr_mut(key) {
        return Some(s);
    }
    // BPF_NOEXIST: another CPU's entry for the same source, inserted in the
    // meantime, is kept.
    let mut empty = Zeroed::<SourceState>::uninit();
    let _ = XLB_SOURCES.insert(key, empty.zero(), 1);
    XLB_SOURCES.get_ptr_mut(key)
}

/// Adds `n` to a shared counter with one atomic add (BPF `lock xadd`; the
/// old value is not used, so any BPF CPU version has it). The intrinsic,
/// because the BPF target offers no `AtomicU64::fetch_add` (no CAS).
#[inline(always)]
fn add(p: *mut u64, n: u64) {
    // SAFETY: `p` points at an aligned u64 inside a map value, valid for the
    // program's run; other CPUs only touch it atomically or with whole stores.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, n) };
}

/// The `XLB_SOURCES` key of the packet's source for VIP `vip_id`.
#[inline(always)]
fn source_key(pkt: &Packet, vip_id: u32, g: &VipGuard) -> SourceKey {
    let f = &pkt.flow;
    SourceKey::new(vip_id, &f.src, f.family, g.v4_prefix, g.v6_prefix)
}

/// The action of the deny entry covering the source, unless an allow entry
/// covers it too; hits counted on the rule that decided.
#[inline(always)]
pub(crate) fn denied(pkt: &Packet, vip_id: u32) -> Option<u8> {
    let v4 = pkt.flow.family == FAMILY_V4;
    let deny = if v4 {
        lookup_v4(Trie::Deny, pkt, vip_id)
    } else {
        lookup_v6(Trie::Deny, pkt, vip_id)
    }?;
    let allow = if v4 {
        lookup_v4(Trie::Allow, pkt, vip_id)
    } else {
        lookup_v6(Trie::Allow, pkt, vip_id)
    };
    if let Some(a) = allow {
        bump(&XLB_LIST_HITS, a.rule);
        count(Stat::AllowListed);
        return None;
    }
    bump(&XLB_LIST_HITS, deny.rule);
    Some(deny.action)
}

/// Which list a lookup searches.
#[derive(Clone, Copy)]
enum Trie {
    Deny,
    Allow,
}

/// Longest match of the IPv4 source in the VIP's scope, else the global one.
#[inline(always)]
fn lookup_v4(trie: Trie, pkt: &Packet, vip_id: u32) -> Option<ListEntry> {
    let map = match trie {
        Trie::Deny => &XLB_DENY_V4,
        Trie::Allow => &XLB_ALLOW_V4,
    };
    let src = &pkt.flow.src;
    let mut key = WordKey::<2>::uninit();
    key.fill([LIST_SCOPE_BITS + 32, vip_id.to_be(), word(src, 0)]);
    longest(map, &mut key)
}

/// Longest match of the IPv6 source, as [`lookup_v4`].
#[inline(always)]
fn lookup_v6(trie: Trie, pkt: &Packet, vip_id: u32) -> Option<ListEntry> {
    let map = match trie {
        Trie::Deny => &XLB_DENY_V6,
        Trie::Allow => &XLB_ALLOW_V6,
    };
    let [a, b, c, d] = addr_words(&pkt.flow.src);
    let mut key = WordKey::<3>::uninit();
    key.fill([LIST_SCOPE_BITS + 128, vip_id.to_be(), a, b, c, d]);
    longest(map, &mut key)
}

/// Longest match of `key` (prefix length, scope, the whole address) in its
/// scope, else in the global one.
#[inline(always)]
fn longest<K, const N: usize>(
    map: &LpmTrie<K, ListEntry>,
    key: &mut WordKey<N>,
) -> Option<ListEntry> {
    if let Some(e) = map.get(key.as_trie_key()) {
        return Some(*e);
    }
    key.set(1, SCOPE_GLOBAL.to_be());
    map.get(key.as_trie_key()).copied()
}

/// A refused packet: a TCP SYN under action `reset` is answered with a RST
/// (`reset_stat`); anything else is dropped (`drop_stat`).
#[inline(always)]
fn refuse(ctx: &XdpContext, pkt: &Packet, action: u8, drop_stat: Stat, reset_stat: Stat) -> u32 {
    if action == ACTION_RESET && pkt.syn() {
        return reset::reply(ctx, pkt, reset_stat, drop_stat);
    }
    drop_with(drop_stat)
}
