//! NAT in `xlb-bench` (issue 27), per packet, in the same rounds as
//! `established hit, dsr-ipip`: both directions of an established NAT
//! flow, IPv4 and IPv6, and the SYN of a flow never seen (a backend picked,
//! a source port allocated, two map inserts).
//!
//! NAT rewrites addresses and ports, so every case runs one fresh packet
//! per run (`dataplane::single_once`), as `dsr-ipip` does.
//!
//! The established flows are made once, before any timing, the way a
//! client and a backend make them: the client's SYN, the backend's
//! SYN-ACK. Their timed packets are ACKs with 18 bytes of payload (the
//! size of the `dsr-ipip` cases' frame), so passive detection does its
//! work: the first client packet of a run of packets opens a request, the
//! first reply answers it, the rest find one pending or none.
//!
//! Passive detection's own cost: two more flows, one on the IPv4 VIP and
//! one on a VIP whose passive detection is off (`[vip.passive] enabled =
//! false`: the daemon writes 0 timeouts to its pool), each timed as a
//! client request and its backend's answer in turn
//! (`dataplane::alternate_once`), so that with detection on every packet
//! is evidence: the request opens one, the answer closes it, both are
//! counted. Their difference is what detection costs per packet.
//!
//! The new flow: `single_once` sends the same frame every run, so the SYN
//! cannot carry a fresh source port per run; instead [`Nat::forget_new_flow`]
//! deletes the flow's two entries (client key, reply key) before each run.
//! It runs in `single_once`'s `before`, outside `BPF_PROG_TEST_RUN`, whose
//! duration is the kernel's own timing of the program alone; so each timed
//! run is a SYN that misses `XLB_NAT_FLOWS`, picks, allocates (the first
//! candidate port, free as in a pool far from full) and inserts both
//! entries, and the deletes are not in the figure. The deletes also keep
//! the maps at a constant fill, as a steady stream of short flows would.

use std::net::IpAddr;

use aya::maps::{Array, HashMap, Map, MapData};
use lb_common::{
    DEFAULT_TABLE_SIZE, DOWN_POLICY_REHASH, FlowKey, PROTO_TCP, addr16,
    nat::{MODE_NAT, NAT_TCP_ESTABLISHED, NatFlow, NatPool, reply_key},
};

use super::dataplane::{XDP_TX, frame};
use crate::{
    harness::World,
    nat_world::{
        CLIENT4, CLIENT6, NatVip, add_nat_backend, add_nat_vip, flows, map, replies,
        routes_to_clients,
    },
    packet::{ACK, Flow, SYN},
};

/// The NAT VIPs of the benchmark world (ids 3 and 4: `dataplane::Flows`
/// and `chance` hold 0 to 2), their pools, and where backends listen (not
/// the VIP's port, as the issue allows).
pub const VIP4: &str = "10.100.0.10";
pub const VIP6: &str = "fd00:100::10";
pub const PORT: u16 = 8000;
pub const BE_PORT: u16 = 8080;
const POOL4: &str = "10.0.0.50";
const POOL6: &str = "fd00::50";
/// The VIP without passive detection (id 5): the same address and
/// backends as VIP 3 on another port, a pool of its own.
const PORT_QUIET: u16 = 8001;
const POOL_QUIET: &str = "10.0.0.52";
/// The default range: the allocator's work is that of a default pool.
const PORTS: (u16, u16) = (
    lb_common::nat::DEFAULT_SNAT_PORT_MIN,
    lb_common::nat::DEFAULT_SNAT_PORT_MAX,
);

/// The frames of the NAT cases, and what [`Nat::forget_new_flow`] deletes.
pub struct Nat {
    /// Client → VIP, of the established flow.
    pub est4: Vec<u8>,
    pub est6: Vec<u8>,
    /// Backend → pool address and allocated port: the established flow's
    /// answers.
    pub reply4: Vec<u8>,
    pub reply6: Vec<u8>,
    /// A request and its answer (client → VIP, backend → pool), passive
    /// detection on (VIP 3) and off (VIP 5).
    pub talk_on: [Vec<u8>; 2],
    pub talk_off: [Vec<u8>; 2],
    /// The SYN of a flow that no run finds.
    pub syn: Vec<u8>,
    fresh: FlowKey,
    fresh_reply: FlowKey,
    flows: HashMap<MapData, FlowKey, NatFlow>,
    replies: HashMap<MapData, FlowKey, FlowKey>,
}

/// Sets up the NAT VIPs (IPv4: backends 1 and 2 over the default table
/// size, as the DSR VIPs; IPv6: backend 4), their pools and backends, and
/// the flows. Run on the world's thread (its namespace), after
/// `dataplane::Flows::install` (the globals).
pub fn install(w: &mut World) -> anyhow::Result<Nat> {
    routes_to_clients(w)?;
    for id in [1, 2, 4] {
        add_nat_backend(w, id, BE_PORT)?;
    }
    let table4: Vec<u32> = (0..DEFAULT_TABLE_SIZE).map(|i| 1 + i % 2).collect();
    let table6 = vec![4; DEFAULT_TABLE_SIZE as usize];
    for (vip_id, addr, port, pool, table) in [
        (3, VIP4, PORT, POOL4, &table4),
        (4, VIP6, PORT, POOL6, &table6),
        (5, VIP4, PORT_QUIET, POOL_QUIET, &table4),
    ] {
        let v = NatVip {
            vip_id,
            addr,
            port,
            proto: PROTO_TCP,
            mode: MODE_NAT,
            down_policy: DOWN_POLICY_REHASH,
            table,
            pool,
            ports: PORTS,
        };
        add_nat_vip(w, &v)?;
    }
    passive_off(w, 5)?;
    let (est4, reply4) = establish(w, &Flow::tcp(CLIENT4, 40001, VIP4, PORT))?;
    let (est6, reply6) = establish(w, &Flow::tcp(CLIENT6, 40001, VIP6, PORT))?;
    let (a, b) = establish(w, &Flow::tcp(CLIENT4, 40003, VIP4, PORT))?;
    let talk_on = [a, b];
    let (a, b) = establish(w, &Flow::tcp(CLIENT4, 40004, VIP4, PORT_QUIET))?;
    let talk_off = [a, b];
    evidence_or_not(w, &Flow::tcp(CLIENT4, 40003, VIP4, PORT), &talk_on, true)?;
    evidence_or_not(
        w,
        &Flow::tcp(CLIENT4, 40004, VIP4, PORT_QUIET),
        &talk_off,
        false,
    )?;
    let fresh = Flow::tcp(CLIENT4, 40002, VIP4, PORT);
    let syn = frame(&fresh, SYN);
    // One SYN to learn the reply key the data plane makes for it; every
    // run then finds (and deletes) the two entries of the run before.
    let (entry, _) = start(w, &fresh, &syn)?;
    let fresh_reply = reply_key(&fresh.key(), &entry, &addr16(backend(w, &entry)));
    Ok(Nat {
        est4,
        est6,
        reply4,
        reply6,
        talk_on,
        talk_off,
        syn,
        fresh: fresh.key(),
        fresh_reply,
        flows: flows(w)?,
        replies: replies(w)?,
    })
}

impl Nat {
    /// Deletes the new-flow case's two entries, which its previous run
    /// made: an error if either is missing (that run made no flow, so its
    /// figure would not be a new flow's).
    pub fn forget_new_flow(&mut self) -> anyhow::Result<()> {
        self.flows.remove(&self.fresh).map_err(|e| {
            anyhow::anyhow!("nat, new flow: the SYN made no client entry to delete: {e}")
        })?;
        self.replies.remove(&self.fresh_reply).map_err(|e| {
            anyhow::anyhow!("nat, new flow: the SYN made no reply entry to delete: {e}")
        })?;
        Ok(())
    }
}

/// Sends `syn` of client flow `f` once: the flow's entry and the flow of
/// its backend's answers.
fn start(w: &mut World, f: &Flow, syn: &[u8]) -> anyhow::Result<(NatFlow, Flow)> {
    let (v, _) = w.run(lb_common::PROG_LB, syn)?;
    anyhow::ensure!(v == XDP_TX, "NAT SYN of {f:?}: verdict {v}, want XDP_TX");
    let entry = flows(w)?
        .get(&f.key(), 0)
        .map_err(|e| anyhow::anyhow!("NAT SYN of {f:?} made no flow: {e}"))?;
    // The pools have one address each.
    let pool: IpAddr = match (f.src.is_ipv6(), f.dport) {
        (true, _) => POOL6,
        (false, PORT_QUIET) => POOL_QUIET,
        (false, _) => POOL4,
    }
    .parse()?;
    anyhow::ensure!(
        entry.nat_addr == addr16(pool),
        "NAT SYN of {f:?}: translated source {:?}, want the pool's {pool}",
        entry.nat_addr
    );
    let answer = Flow {
        src: backend(w, &entry),
        sport: BE_PORT,
        dst: pool,
        dport: u16::from_be(entry.nat_port),
        proto: PROTO_TCP,
    };
    Ok((entry, answer))
}

/// Makes client flow `f` established (its SYN, the backend's SYN-ACK);
/// returns its client frame and its backend's answer frame, both ACKs
/// with payload.
fn establish(w: &mut World, f: &Flow) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let (_, answer) = start(w, f, &frame(f, SYN))?;
    let (v, _) = w.run(lb_common::PROG_LB, &frame(&answer, SYN | ACK))?;
    anyhow::ensure!(
        v == XDP_TX,
        "NAT SYN-ACK of {f:?}: verdict {v}, want XDP_TX"
    );
    // The client's ACK completes the handshake (`packet::tcp` acknowledges
    // 2000, within the window past the SYN-ACK's sequence number 1000).
    let (v, _) = w.run(lb_common::PROG_LB, &frame(f, ACK))?;
    anyhow::ensure!(v == XDP_TX, "NAT ACK of {f:?}: verdict {v}, want XDP_TX");
    let state = flows(w)?.get(&f.key(), 0)?.state;
    anyhow::ensure!(
        state == NAT_TCP_ESTABLISHED,
        "NAT flow {f:?}: state {state} after the client's ACK, want established ({NAT_TCP_ESTABLISHED})"
    );
    Ok((frame(f, ACK), frame(&answer, ACK)))
}

/// The address of `entry`'s backend.
fn backend(w: &World, entry: &NatFlow) -> IpAddr {
    w.backend(entry.backend_id).addr
}

/// Turns VIP `vip_id`'s passive detection off, as the daemon does for
/// `[vip.passive] enabled = false` (`config::apply_pool_timeouts`).
fn passive_off(w: &mut World, vip_id: u32) -> anyhow::Result<()> {
    let mut pools: Array<MapData, NatPool> = map(w, lb_common::nat::MAP_NAT_POOL, Map::Array)?;
    let mut pool = pools.get(&vip_id, 0)?;
    lb_user::config::apply_pool_timeouts(
        &mut pool,
        &lb_user::config::PassiveConfig {
            enabled: false,
            ..Default::default()
        },
    );
    anyhow::ensure!(
        !pool.passive_on(),
        "VIP {vip_id}: passive detection still on"
    );
    pools.set(vip_id, pool, 0)?;
    Ok(())
}

/// Checks that the request of `talk` (flow `f`) opens a pending request
/// and its answer closes it when `on`, and that neither leaves a trace on
/// the flow when not: the two cases time what they claim to.
fn evidence_or_not(w: &mut World, f: &Flow, talk: &[Vec<u8>; 2], on: bool) -> anyhow::Result<()> {
    for (frame, pending) in [(&talk[0], on), (&talk[1], false)] {
        let (v, _) = w.run(lb_common::PROG_LB, frame)?;
        anyhow::ensure!(v == XDP_TX, "NAT flow {f:?}: verdict {v}, want XDP_TX");
        let e = flows(w)?.get(&f.key(), 0)?;
        anyhow::ensure!(
            (e.request_ns != 0) == pending
                && (e.flags & lb_common::nat::NAT_FLAG_PASSIVE != 0) == on,
            "NAT flow {f:?} with passive detection {}: request_ns {}, flags {:#x}",
            if on { "on" } else { "off" },
            e.request_ns,
            e.flags
        );
    }
    Ok(())
}
