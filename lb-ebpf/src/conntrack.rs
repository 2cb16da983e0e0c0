//! Conntrack: an established flow keeps the backend it was given, whatever
//! the table says now, until its backend is gone or (UDP) it falls idle.
//! The key is the client's 5-tuple; the value holds the VIP id, so a hit
//! needs no VIP lookup.

use lb_common::{
    BACKEND_DOWN, BACKEND_DRAINING, BACKEND_UP, BackendInfo, CT_FLAG_CLOSING, CT_TOUCH_INTERVAL_NS,
    CtEntry, DOWN_POLICY_KEEP, Globals, PROTO_UDP, SOURCE_SAMPLE, Stat, VipInfo,
};

use crate::{
    XLB_BACKENDS, XLB_CT, XLB_CT_RATE, XLB_VIP_INFO,
    parse::Packet,
    stats::{count, count_sampled},
};

/// Length of a conntrack insert window: the cap is per CPU and second.
const INSERT_WINDOW_NS: u64 = 1_000_000_000;

/// Where a flow is sent, and what forwarding it needs to know.
// Only the two fields of the VIP that forwarding reads, and the backend by
// reference: this lives on the stack, and whatever is copied into it is
// copied on every packet.
pub(crate) struct Target {
    /// [`VipInfo::mode`].
    pub mode: u8,
    /// [`VipInfo::vip_id`]: the index of the VIP's counters.
    pub vip_id: u32,
    /// Backend id and entry.
    pub id: u32,
    /// The `XLB_BACKENDS` value itself, valid for the program's run. A
    /// rewrite by the daemon during the run can make two reads of a field
    /// differ, as it could tear a copy before: each read is checked where
    /// it is used (a generation that moved only misses the next-hop cache).
    pub be: &'static BackendInfo,
}

impl Target {
    #[inline(always)]
    pub(crate) fn new(vip: &VipInfo, id: u32, be: &'static BackendInfo) -> Self {
        Target {
            mode: vip.mode,
            vip_id: vip.vip_id,
            id,
            be,
        }
    }
}

/// What conntrack knows of a flow.
pub(crate) enum Lookup {
    /// An entry that may still be used.
    Hit(Target),
    /// No entry.
    Miss,
    /// An entry that may not (counted why): the flow is picked again.
    Stale,
}

/// Looks the flow up, refreshing the entry it uses.
#[inline(always)]
pub(crate) fn lookup(pkt: &Packet, g: &Globals, now: u64) -> Lookup {
    match XLB_CT.get_ptr_mut(&pkt.flow) {
        // SAFETY: LRU hash values stay valid for the program's run (RCU);
        // racing writers only store whole u32/u64 fields.
        Some(e) => match use_entry(pkt, unsafe { &mut *e }, g, now) {
            Some(t) => Lookup::Hit(t),
            None => Lookup::Stale,
        },
        None => Lookup::Miss,
    }
}

/// The target of entry `e`, if it may still be used; `None` (counted) when
/// the flow must be picked again.
#[inline(always)]
fn use_entry(pkt: &Packet, e: &mut CtEntry, g: &Globals, now: u64) -> Option<Target> {
    let vip = XLB_VIP_INFO.get(e.vip_id)?;
    let be = XLB_BACKENDS.get(e.backend_id)?;
    // A removed VIP (mode 0) or a recycled backend id: the entry is stale.
    if vip.mode == 0 || be.generation != e.generation || be.state == 0 {
        count(Stat::CtStale);
        return None;
    }
    if pkt.flow.proto == PROTO_UDP
        && g.udp_timeout_ns != 0
        && now.wrapping_sub(e.last_seen_ns) > g.udp_timeout_ns
    {
        count(Stat::CtUdpExpired);
        return None;
    }
    if be.state == BACKEND_DOWN {
        if vip.down_policy != DOWN_POLICY_KEEP {
            count(Stat::DownRehash);
            return None;
        }
        count(Stat::DownKeep);
    } else if be.state != BACKEND_UP && be.state != BACKEND_DRAINING {
        count(Stat::CtStale);
        return None;
    }
    if count_sampled(Stat::CtHit, SOURCE_SAMPLE) {
        crate::guard::sample(pkt, e.vip_id);
    }
    crate::guard::confirm(pkt, e);
    if now.wrapping_sub(e.last_seen_ns) > CT_TOUCH_INTERVAL_NS {
        e.last_seen_ns = now;
    }
    // The client is closing: tell the daemon's flow count (a drain waits on
    // it). Written once; the entry keeps forwarding the last packets.
    if pkt.closing() && e.flags & CT_FLAG_CLOSING == 0 {
        e.flags |= CT_FLAG_CLOSING;
    }
    Some(Target::new(vip, e.backend_id, be))
}

/// Records the flow's new target, for VIP `vip_id` (counted: inserted or
/// failed), unless this CPU already made `cap` inserts in the current
/// second (0 = no cap): the flow is then forwarded by the table, untracked
/// (counted), as Katran's `MAX_CONN_RATE` does.
#[inline(always)]
pub(crate) fn record(pkt: &Packet, vip_id: u32, t: &Target, now: u64, cap: u64) {
    if cap != 0 && !under_cap(lb_common::guard::CT_RATE_CONNTRACK, cap, now) {
        count(Stat::CtInsertCapped);
        return;
    }
    let entry = CtEntry {
        backend_id: t.id,
        generation: t.be.generation,
        vip_id,
        // A FIN or RST that replaces a stale entry starts it closing, as
        // one that hits marks it.
        flags: if pkt.closing() { CT_FLAG_CLOSING } else { 0 },
        last_seen_ns: now,
    };
    match XLB_CT.insert(&pkt.flow, &entry, 0) {
        Ok(()) => count(Stat::CtInsert),
        Err(_) => count(Stat::CtInsertFail),
    }
}

/// Whether this CPU may make one more insert of kind `slot`
/// (`CT_RATE_CONNTRACK`, `CT_RATE_NAT`) in the current window of [`INSERT_WINDOW_NS`]; counts it
/// if so.
#[inline(always)]
pub(crate) fn under_cap(slot: u32, cap: u64, now: u64) -> bool {
    let Some(r) = XLB_CT_RATE.get_ptr_mut(slot) else {
        return true;
    };
    // SAFETY: per-CPU slot, no concurrent writer on this CPU.
    let r = unsafe { &mut *r };
    if now.wrapping_sub(r.window_start_ns) >= INSERT_WINDOW_NS {
        r.window_start_ns = now;
        r.inserts = 0;
    }
    if r.inserts >= cap {
        return false;
    }
    r.inserts += 1;
    true
}
