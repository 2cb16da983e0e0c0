//! What the data-plane benchmarks (`xlb-bench`, `xlb-guard-bench`) share:
//! the test world with two VIPs and established flows, their frames, and
//! the two `BPF_PROG_TEST_RUN` timings (repeat mode, one packet per run).
//!
//! The test-run trap: in plain mode the kernel reuses one buffer across
//! repeats, so a program that rewrites a packet sees its own output from the
//! second repeat on. Repeat mode therefore uses `dsr-l2`, whose output (the
//! same packet with new MACs) takes the same path again; one-per-run mode
//! gives every `dsr-ipip` packet a fresh copy.

use std::time::Duration;

use lb_common::{CtEntry, DOWN_POLICY_REHASH, MODE_DSR_IPIP, MODE_DSR_L2, PROTO_TCP};
use lb_user::dataplane::LoadOptions;

use crate::{
    harness::{LB_MAC, PEER_MAC, World, in_world},
    packet::Flow,
};

pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
/// Packets per run in repeat mode.
pub const REPEAT: u32 = 200_000;
/// Runs per figure in one-packet-per-run mode.
pub const SINGLES: u32 = 20_000;

/// Mean ns per packet of `REPEAT` repeats of `frame` through `prog`.
pub fn repeat_once(
    w: &mut World,
    prog: &'static str,
    frame: &[u8],
    want: u32,
) -> anyhow::Result<f64> {
    let (verdict, _, d) = w.run_repeat(prog, frame, REPEAT)?;
    anyhow::ensure!(verdict == want, "{prog}: verdict {verdict}, want {want}");
    Ok(d.as_nanos() as f64)
}

/// Mean of the kernel's own time over `SINGLES` runs of one packet each,
/// `before` run ahead of each.
pub fn single_once(
    w: &mut World,
    prog: &'static str,
    frame: &[u8],
    want: u32,
    before: &mut dyn FnMut(&mut World) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let mut total = Duration::ZERO;
    for _ in 0..SINGLES {
        before(w)?;
        let (verdict, _, d) = w.run_repeat(prog, frame, 1)?;
        anyhow::ensure!(verdict == want, "{prog}: verdict {verdict}, want {want}");
        total += d;
    }
    Ok(total.as_nanos() as f64 / f64::from(SINGLES))
}

/// Mean of the kernel's own time per packet over `SINGLES` runs of one
/// packet each, taking `frames` in turn (a request, then its answer: each
/// run meets the state the other left).
pub fn alternate_once(
    w: &mut World,
    prog: &'static str,
    frames: [&[u8]; 2],
    want: u32,
) -> anyhow::Result<f64> {
    let mut total = Duration::ZERO;
    for i in 0..SINGLES {
        let frame = frames[(i % 2) as usize];
        let (verdict, _, d) = w.run_repeat(prog, frame, 1)?;
        anyhow::ensure!(verdict == want, "{prog}: verdict {verdict}, want {want}");
        total += d;
    }
    Ok(total.as_nanos() as f64 / f64::from(SINGLES))
}

/// Runs `f` in a test world of the default table size, without pinning,
/// with a conntrack table of `ct_size` entries.
pub fn in_world_with_ct<R: Send>(
    ct_size: u32,
    name: &str,
    f: impl FnOnce(&mut World) -> anyhow::Result<R> + Send,
) -> anyhow::Result<R> {
    let opts = LoadOptions {
        ct_size,
        nat_size: lb_common::nat::DEFAULT_NAT_SIZE,
        ring_stride: lb_common::DEFAULT_TABLE_SIZE,
        pin_dir: None,
        kernel: None,
    };
    in_world(name, opts, f)
}

/// The benchmark's flows: one to each VIP, established in conntrack, and
/// one to an address that is no VIP.
pub struct Flows {
    /// To VIP 1 (`dsr-l2`).
    pub l2: Flow,
    /// To VIP 0 (`dsr-ipip`).
    pub ipip: Flow,
    pub other: Flow,
}

impl Flows {
    /// Sets up the two VIPs (dsr-ipip and dsr-l2, two backends) and the
    /// conntrack entries of their flows.
    pub fn install(w: &mut World) -> anyhow::Result<Self> {
        w.set_globals([0x1234, 0x5678], 30_000_000_000)?;
        let size = lb_common::DEFAULT_TABLE_SIZE as usize;
        let table: Vec<u32> = (0..size).map(|i| 1 + (i % 2) as u32).collect();
        w.add_vip(
            0,
            "10.100.0.1",
            80,
            PROTO_TCP,
            MODE_DSR_IPIP,
            DOWN_POLICY_REHASH,
            &table,
        )?;
        w.add_vip(
            1,
            "10.100.0.2",
            80,
            PROTO_TCP,
            MODE_DSR_L2,
            DOWN_POLICY_REHASH,
            &table,
        )?;
        let flows = Self {
            l2: Flow::tcp("192.0.2.1", 40001, "10.100.0.2", 80),
            ipip: Flow::tcp("192.0.2.1", 40001, "10.100.0.1", 80),
            other: Flow::tcp("192.0.2.1", 40001, "10.0.0.1", 22),
        };
        let now = 0; // refreshed by the program on the first packet
        for (f, vip_id) in [(&flows.l2, 1), (&flows.ipip, 0)] {
            w.dp.ct_insert(
                &f.key(),
                &CtEntry {
                    backend_id: 1,
                    generation: 0,
                    vip_id,
                    flags: 0,
                    last_seen_ns: now,
                },
            )?;
        }
        Ok(flows)
    }
}

/// A 72-byte frame of `f` (18 bytes of payload) with TCP `flags`.
pub fn frame(f: &Flow, flags: u8) -> Vec<u8> {
    f.frame(LB_MAC, PEER_MAC, None, flags, &[0u8; 18])
}
