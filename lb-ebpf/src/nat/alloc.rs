//! Allocation of a new NAT flow's source (address, port): the reply key
//! (backend:port → pool address:port) is the lock. It is taken with
//! `BPF_NOEXIST`, so two CPUs never hand out one port; a key already held
//! is taken over only from a flow that has expired (or whose client key
//! no longer points back at it), never from a live one.
//!
//! The candidates are tried in a bounded loop of a function of its own
//! ([`search`]), which the verifier walks once per state it is called in;
//! the flow being built lives in a per-CPU scratch entry ([`Scratch`]), off
//! the 512-byte stack.

use aya_ebpf::bindings::{BPF_ANY, BPF_NOEXIST};
use lb_common::{
    FlowKey, Stat,
    nat::{NAT_ALLOC_TRIES, NatFlow, nat_candidate},
};

use crate::{
    XLB_NAT_FLOWS, XLB_NAT_POOL, XLB_NAT_REPLY, XLB_NAT_SCRATCH, XLB_NAT_SEEN,
    key::{addr_eq, copy_addr},
    stats::count,
};

/// Value of `XLB_NAT_SCRATCH` (per-CPU array of one, kernel-only): a new
/// flow while it is being allocated.
#[repr(C)]
pub(crate) struct Scratch {
    /// The flow: backend, VIP, state, time set; `nat_addr` and `nat_port`
    /// filled by [`search`] (or the client's own, `preserve_client`).
    pub flow: NatFlow,
    /// The client's key.
    pub client: FlowKey,
    /// The reply key tried last: the one held once [`search`] succeeds.
    pub key: FlowKey,
    /// The flow hash of `client`: where the candidates start (computed by
    /// the first try).
    pub hash: u64,
    /// What `nat::send` needs of the flow whose packet it sends.
    pub out: super::Out,
    /// The MTU `nat::too_big` leaves for the ICMP answer.
    pub too_big_mtu: u32,
    /// The new flow's SYN's sequence number (0 for UDP): what
    /// `XLB_NAT_SEEN` remembers of it.
    pub seq: u32,
    /// Whether the flow was seen before ([`PROOF_SEEN`]), not
    /// ([`PROOF_FIRST`]), or not asked yet (0): asked when it would take
    /// an embryonic flow's port ([`proven`]).
    pub proof: u32,
    pub _pad2: u32,
}

/// Sets the reply key in `s` for a flow to `backend`: the backend's side
/// of it, and the source `s.flow` holds (a `preserve_client` flow's own;
/// else filled by [`search`]).
#[inline(always)]
pub(crate) fn prepare(s: &mut Scratch, backend: &[u8; 16]) {
    copy_addr(&mut s.key.src, backend);
    s.key.dst = s.flow.nat_addr;
    s.key.sport = s.flow.backend_port;
    s.key.dport = s.flow.nat_port;
    s.key.proto = s.client.proto;
    s.key.family = s.client.family;
    s.key._pad = [0; 2];
}

/// Takes the reply key [`prepare`] left for a `preserve_client` flow: its
/// one candidate, the client's own address and port.
#[inline(always)]
pub(crate) fn claim_own(s: &Scratch) -> bool {
    claim(&s.key, &s.client, s.flow.last_seen_ns, false)
}

/// Chooses the flow's `nat_addr` and `nat_port` (in `XLB_NAT_SCRATCH`,
/// prepared) from its VIP's pool and inserts the reply key → client key:
/// up to `NAT_ALLOC_TRIES` candidates, in a bounded loop, each taken if
/// free or expired. Once the first half of them were all held (the pool
/// is nearly full, or full), a candidate held by an embryonic flow (a
/// handshake its client has not completed, a UDP flow never answered:
/// `NatFlow::embryonic`) is taken from it too (`nat_evict_embryonic`): a
/// flood from forged sources fills a pool with such flows, and they must
/// not keep real clients out. False when every candidate is held by a
/// flow past its handshake (or by an embryonic one among the first half).
// verifier: a function of its own, so the loop is walked once per state
// it is called in, not once per path through the caller; called from the
// top frame, so its frame adds to the parser's alone. A bounded loop (5.3),
// not `bpf_loop` (5.17): a callback is a subprogram older kernels do not
// know, and they refuse the whole object for it. Whether a candidate may
// evict follows from the loop's index alone (which the verifier knows), so
// it adds no paths: no second pass over the candidates.
#[inline(never)]
pub(crate) fn search() -> bool {
    let mut i = 0;
    while i < NAT_ALLOC_TRIES {
        match try_candidate(i) {
            Try::Claimed => return true,
            Try::Held => i += 1,
            Try::Stop => return false,
        }
    }
    false
}

/// Candidates tried before one held by an embryonic flow may be taken.
pub(crate) const EVICT_AFTER: u32 = NAT_ALLOC_TRIES / 2;
/// [`Scratch::proof`]: the flow was seen before (`XLB_NAT_SEEN`).
pub(crate) const PROOF_SEEN: u32 = 1;
/// [`Scratch::proof`]: first sight.
pub(crate) const PROOF_FIRST: u32 = 2;

/// Whether the client of the flow in `s` sent this SYN (same ISN) or
/// another datagram before, and was dropped for its pool ([`remember`]).
#[inline(always)]
fn seen(s: &Scratch) -> bool {
    // SAFETY: a u32 read at once.
    unsafe { XLB_NAT_SEEN.get(&s.client) }.is_some_and(|seq| *seq == s.seq)
}

/// Whether the flow being allocated may take an embryonic flow's port: it
/// was seen before ([`seen`]). Asked once per flow, the answer kept in
/// the scratch entry (where the verifier does not follow it).
#[inline(always)]
fn proven() -> bool {
    let Some(s) = XLB_NAT_SCRATCH.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: per-CPU slot, no concurrent writer on this CPU.
    let s = unsafe { &mut *s };
    if s.proof == 0 {
        s.proof = if seen(s) { PROOF_SEEN } else { PROOF_FIRST };
    }
    s.proof == PROOF_SEEN
}

/// Remembers the flow in `s`, dropped on first sight (`drop_nat_unproven`).
#[inline(always)]
pub(crate) fn remember(s: &Scratch) {
    let _ = XLB_NAT_SEEN.insert(&s.client, &s.seq, 0);
}

/// What one candidate gave.
enum Try {
    /// Taken: the flow has its source.
    Claimed,
    /// Held by a live flow: try the next.
    Held,
    /// No candidate left (or no scratch entry): give up.
    Stop,
}

/// Tries candidate `i` of the flow in `XLB_NAT_SCRATCH`, taking it from
/// an embryonic flow from [`EVICT_AFTER`] on if the flow is proven
/// ([`proven`]).
#[inline(always)]
fn try_candidate(i: u32) -> Try {
    let Some(s) = XLB_NAT_SCRATCH.get_ptr_mut(0) else {
        return Try::Stop;
    };
    // SAFETY: per-CPU slot, no concurrent writer on this CPU.
    let s = unsafe { &mut *s };
    let Some(pool) = XLB_NAT_POOL.get(s.flow.vip_id) else {
        return Try::Stop;
    };
    if i == 0 {
        let Some(g) = crate::XLB_GLOBALS.get(0) else {
            return Try::Stop;
        };
        s.hash = lb_common::flow_hash(&g.hash_key, &s.client);
    }
    let Some((a, port)) = nat_candidate(pool, s.hash, i) else {
        return Try::Stop;
    };
    // verifier: the kernel does not bound the result of `%`, and LLVM,
    // knowing `a` < count ≤ 16, would drop the bounds check: hidden.
    let Some(addr) = pool.addrs.get(core::hint::black_box(a) as usize) else {
        return Try::Stop;
    };
    copy_addr(&mut s.key.dst, addr);
    s.key.dport = port.to_be();
    if !claim(&s.key, &s.client, s.flow.last_seen_ns, i >= EVICT_AFTER) {
        return Try::Held;
    }
    s.flow.nat_addr = s.key.dst;
    s.flow.nat_port = s.key.dport;
    Try::Claimed
}

/// Takes reply key `key` for `client`: free, or held by a flow that may be
/// reclaimed (counted `nat_reclaim`), or by an embryonic one if `evict`
/// (counted `nat_evict_embryonic`). False when a live flow holds it.
#[inline(always)]
fn claim(key: &FlowKey, client: &FlowKey, now: u64, evict: bool) -> bool {
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
    if !reclaim(key, &old, now, evict) {
        return false;
    }
    XLB_NAT_REPLY
        .insert(key, client, u64::from(BPF_ANY))
        .is_ok()
}

/// Whether the flow of `old` (the client key reply key `key` holds) may
/// give its port up at `now`: expired (counted `nat_reclaim`, its pending
/// evidence counted), or embryonic and `evict` (counted
/// `nat_evict_embryonic`); if so its entry is removed. An entry whose client flow
/// is gone, or now holds another port, is an orphan and always reclaimed.
#[inline(always)]
fn reclaim(key: &FlowKey, old: &FlowKey, now: u64, evict: bool) -> bool {
    // SAFETY: a map value valid for the program's run; read only.
    let Some(f) = (unsafe { XLB_NAT_FLOWS.get(old) }) else {
        count(Stat::NatReclaim);
        return true;
    };
    if f.nat_port != key.dport || !addr_eq(&f.nat_addr, &key.dst) {
        count(Stat::NatReclaim);
        return true;
    }
    let Some(pool) = XLB_NAT_POOL.get(f.vip_id) else {
        return false;
    };
    if now < f.expires(pool) {
        // `proven` last: asked only when it decides.
        if !evict || !f.embryonic() || !proven() {
            return false;
        }
        // No evidence from it: its client is most likely forged, and a
        // forged client's flows must not judge the backend.
        count(Stat::NatEvictEmbryonic);
    } else {
        count(Stat::NatReclaim);
        super::passive(f.backend_id, &f.reclaimed(pool, now));
    }
    let _ = XLB_NAT_FLOWS.remove(old);
    true
}
