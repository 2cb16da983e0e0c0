//! Allocation of a new NAT flow's source (address, port): the reply key
//! (backend:port → pool address:port) is the lock. It is taken with
//! `BPF_NOEXIST`, so two CPUs never hand out one port; a key already held
//! is taken over only from a flow that has expired (or whose client key
//! no longer points back at it), never from a live one.
//!
//! The candidates are tried in a `bpf_loop` (kernel 5.17), whose callback
//! the verifier checks once, not once per try and per path into it; the
//! flow being built lives in a per-CPU scratch entry ([`Scratch`]), off
//! the 512-byte stack.

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    cty::c_void,
    helpers::generated::bpf_loop,
};
use lb_common::{
    FlowKey, Stat,
    nat::{NAT_ALLOC_TRIES, NatFlow, nat_candidate},
};

use crate::{
    XLB_NAT_FLOWS, XLB_NAT_POOL, XLB_NAT_REPLY, XLB_NAT_SCRATCH, key::addr_eq, stats::count,
};

/// Value of `XLB_NAT_SCRATCH` (per-CPU array of one, kernel-only): a new
/// flow while it is being allocated.
#[repr(C)]
pub(crate) struct Scratch {
    /// The flow: backend, VIP, state, time set; `nat_addr` and `nat_port`
    /// filled by [`allocate`].
    pub flow: NatFlow,
    /// The client's key.
    pub client: FlowKey,
    /// The reply key tried last: the one held once [`allocate`] succeeds.
    pub key: FlowKey,
    /// The flow hash of `client`: where the candidates start (computed by
    /// the first try, in the callback's frame).
    pub hash: u64,
    /// 1 once a candidate was claimed.
    pub found: u32,
    pub _pad: u32,
    /// What `nat::send` needs of the flow whose packet it sends.
    pub out: super::Out,
    /// The MTU `nat::too_big` leaves for the ICMP answer.
    pub too_big_mtu: u32,
    pub _pad2: u32,
}

/// Chooses `s.flow`'s `nat_addr` and `nat_port` from its VIP's pool and
/// inserts the reply key → client key. With `preserve` the flow keeps the
/// client's own address and port (already in `s.flow`): one candidate.
/// `Err` when every candidate tried is held by a live flow.
#[inline(always)]
pub(crate) fn allocate(s: &mut Scratch, backend: &[u8; 16], preserve: bool) -> Result<(), ()> {
    s.key.src = *backend;
    s.key.dst = s.flow.nat_addr;
    s.key.sport = s.flow.backend_port;
    s.key.dport = s.flow.nat_port;
    s.key.proto = s.client.proto;
    s.key.family = s.client.family;
    s.key._pad = [0; 2];
    s.found = 0;
    if preserve {
        return if claim(&s.key, &s.client, s.flow.last_seen_ns) {
            Ok(())
        } else {
            Err(())
        };
    }
    // SAFETY: a helper call; the callback has the signature bpf_loop
    // requires and finds its state in `XLB_NAT_SCRATCH` itself.
    unsafe {
        bpf_loop(
            NAT_ALLOC_TRIES,
            try_candidate as *mut c_void,
            core::ptr::null_mut(),
            0,
        )
    };
    if s.found != 0 { Ok(()) } else { Err(()) }
}

/// `bpf_loop` callback: tries candidate `i` of the flow in
/// `XLB_NAT_SCRATCH`; 1 (stop) once one is claimed or none is left.
#[inline(never)]
extern "C" fn try_candidate(i: u64, _ctx: *mut c_void) -> i64 {
    let Some(s) = XLB_NAT_SCRATCH.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: per-CPU slot, no concurrent writer on this CPU.
    let s = unsafe { &mut *s };
    let Some(pool) = XLB_NAT_POOL.get(s.flow.vip_id) else {
        return 1;
    };
    if i == 0 {
        let Some(g) = crate::XLB_GLOBALS.get(0) else {
            return 1;
        };
        s.hash = lb_common::flow_hash(&g.hash_key, &s.client);
    }
    let Some((a, port)) = nat_candidate(pool, s.hash, i as u32) else {
        return 1;
    };
    // verifier: the kernel does not bound the result of `%`, and LLVM,
    // knowing `a` < count ≤ 16, would drop the bounds check: hidden.
    let Some(addr) = pool.addrs.get(core::hint::black_box(a) as usize) else {
        return 1;
    };
    s.key.dst = *addr;
    s.key.dport = port.to_be();
    if !claim(&s.key, &s.client, s.flow.last_seen_ns) {
        return 0;
    }
    s.flow.nat_addr = s.key.dst;
    s.flow.nat_port = s.key.dport;
    s.found = 1;
    1
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
    XLB_NAT_REPLY
        .insert(key, client, u64::from(BPF_ANY))
        .is_ok()
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
