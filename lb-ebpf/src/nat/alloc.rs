//! Allocation of a new NAT flow's source (address, port): the reply key
//! (backend:port → pool address:port) is the lock. It is taken with
//! `BPF_NOEXIST`, so two CPUs never hand out one port; a key already held
//! is taken over only from a flow that has expired (or whose client key
//! no longer points back at it), never from a live one.

use aya_ebpf::bindings::{BPF_ANY, BPF_NOEXIST};
use lb_common::{
    FlowKey, Stat,
    nat::{NAT_ALLOC_TRIES, NatFlow, NatPool, nat_candidate},
};

use crate::{XLB_NAT_FLOWS, XLB_NAT_POOL, XLB_NAT_REPLY, key::addr_eq, stats::count};

/// Chooses `flow`'s `nat_addr` and `nat_port` from `pool` (spread by the
/// flow hash `hash`) and inserts the reply key → `client`. With
/// `preserve` the flow keeps the client's own address and port (already
/// in `flow`): one candidate. `Err` when every candidate tried is live.
// verifier: not inlined, so the loop's keys get their own frame, and the
// loop is verified once per call site.
#[inline(never)]
pub(crate) fn allocate(
    client: &FlowKey,
    flow: &mut NatFlow,
    pool: &NatPool,
    hash: u64,
    preserve: bool,
) -> Result<(), ()> {
    let now = flow.last_seen_ns;
    let mut key = FlowKey {
        src: [0; 16],
        dst: flow.nat_addr,
        sport: flow.backend_port,
        dport: flow.nat_port,
        proto: client.proto,
        family: client.family,
        _pad: [0; 2],
    };
    if let Some(be) = crate::XLB_BACKENDS.get(flow.backend_id) {
        key.src = be.addr;
    }
    if preserve {
        return if claim(&key, client, now) {
            Ok(())
        } else {
            Err(())
        };
    }
    let mut i = 0;
    while i < NAT_ALLOC_TRIES {
        let Some((a, port)) = nat_candidate(pool, hash, i) else {
            return Err(());
        };
        let Some(addr) = pool.addrs.get(a as usize) else {
            return Err(());
        };
        key.dst = *addr;
        key.dport = port.to_be();
        if claim(&key, client, now) {
            flow.nat_addr = key.dst;
            flow.nat_port = key.dport;
            return Ok(());
        }
        i += 1;
    }
    Err(())
}

/// Takes reply key `key` for `client`: free, or held by a flow that may be
/// reclaimed (counted `nat_reclaim`). False when a live flow holds it.
#[inline(always)]
fn claim(key: &FlowKey, client: &FlowKey, now: u64) -> bool {
    if XLB_NAT_REPLY
        .insert(key, client, u64::from(BPF_NOEXIST))
        .is_ok()
    {
        return true;
    }
    // SAFETY: copied out at once.
    let Some(old) = (unsafe { XLB_NAT_REPLY.get(key) }).copied() else {
        // Removed since the insert failed: the next candidate is as good.
        return false;
    };
    if !reclaim(key, &old, now) {
        return false;
    }
    count(Stat::NatReclaim);
    XLB_NAT_REPLY.insert(key, client, u64::from(BPF_ANY)).is_ok()
}

/// Whether the flow of `old` (the client key reply key `key` holds) may
/// give its port up at `now`; if so its entry is removed and its pending
/// evidence counted. An entry whose client flow is gone, or now holds
/// another port, is an orphan and always reclaimed.
#[inline(always)]
fn reclaim(key: &FlowKey, old: &FlowKey, now: u64) -> bool {
    // SAFETY: a map value valid for the program's run; read only.
    let Some(f) = (unsafe { XLB_NAT_FLOWS.get(old) }) else {
        return true;
    };
    if f.nat_port != key.dport || !addr_eq(&f.nat_addr, &key.dst) {
        return true;
    }
    let Some(pool) = XLB_NAT_POOL.get(f.vip_id) else {
        return false;
    };
    if now < f.expires(pool) {
        return false;
    }
    let ev = f.reclaimed(pool, now);
    super::passive(f.backend_id, &ev);
    let _ = XLB_NAT_FLOWS.remove(old);
    true
}
