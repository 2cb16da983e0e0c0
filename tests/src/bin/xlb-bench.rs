//! `cargo xtask bench`: per-packet cost of xlb's XDP program through
//! `BPF_PROG_TEST_RUN`, next to a minimal program (parse, swap MACs,
//! `XDP_TX`) measured in the same run. A benchmark, not a test: it prints
//! figures and checks them against the targets only to say so.
//!
//! The test-run trap: in plain mode the kernel reuses one buffer across
//! repeats, so a program that rewrites a packet sees its own output from the
//! second repeat on. Two measurements avoid it:
//! - `repeat` mode uses `dsr-l2`, whose output (the same packet with new
//!   MACs) takes exactly the same path again, so N repeats measure N
//!   identical packets;
//! - `single` mode runs `dsr-ipip` (which encapsulates) one packet per
//!   syscall, each with a fresh copy, and averages the kernel's own timing;
//!   the minimal program is measured the same way for its ratio.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]
#![allow(clippy::print_stdout, reason = "a benchmark's report goes to stdout")]

use std::time::Duration;

use lb_common::{CtEntry, DOWN_POLICY_REHASH, MODE_DSR_IPIP, MODE_DSR_L2, PROTO_TCP};
use lb_user::{
    config::{BackendConfig, DownPolicy, Mode, Protocol, VipConfig},
    daemon::model::{Ids, adopt_or_create_vip, install_vip, rebuild},
    dataplane::LoadOptions,
    health::{
        machine::HealthState,
        spec::{CheckKind, CheckSpec},
    },
};
use xlb_tests::{
    harness::{LB_MAC, PEER_MAC, World, in_world},
    packet::{ACK, Flow, SYN},
};

const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;
const ROUNDS: usize = 5;
const REPEAT: u32 = 200_000;
const SINGLES: u32 = 20_000;

struct Row {
    name: &'static str,
    ns: f64,
    base: f64,
    target_ns: Option<f64>,
    target_ratio: Option<f64>,
}

fn best_of(mut f: impl FnMut() -> anyhow::Result<f64>) -> anyhow::Result<f64> {
    let mut best = f64::MAX;
    for _ in 0..ROUNDS {
        best = best.min(f()?);
    }
    Ok(best)
}

fn repeat_ns(w: &mut World, prog: &'static str, frame: &[u8], want: u32) -> anyhow::Result<f64> {
    best_of(|| {
        let (verdict, _, d) = w.run_repeat(prog, frame, REPEAT)?;
        anyhow::ensure!(verdict == want, "{prog}: verdict {verdict}, want {want}");
        Ok(d.as_nanos() as f64)
    })
}

fn single_ns(
    w: &mut World,
    prog: &'static str,
    frame: &[u8],
    want: u32,
    before: &mut dyn FnMut(&mut World) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    best_of(|| {
        let mut total = Duration::ZERO;
        for _ in 0..SINGLES {
            before(w)?;
            let (verdict, _, d) = w.run_repeat(prog, frame, 1)?;
            anyhow::ensure!(verdict == want, "{prog}: verdict {verdict}, want {want}");
            total += d;
        }
        Ok(total.as_nanos() as f64 / f64::from(SINGLES))
    })
}

impl Row {
    /// A row reported without a target.
    fn info(name: &'static str, ns: f64, base: f64) -> Self {
        Self {
            name,
            ns,
            base,
            target_ns: None,
            target_ratio: None,
        }
    }
}

/// `"<= 60 ns, <= 1.5x met"`, `"… MISSED"` if any target was missed, or
/// nothing when there are no targets.
fn judged(targets: &[(String, bool)]) -> String {
    if targets.is_empty() {
        return String::new();
    }
    let names: Vec<&str> = targets.iter().map(|(t, _)| t.as_str()).collect();
    let met = targets.iter().all(|(_, met)| *met);
    format!(
        "{} {}",
        names.join(", "),
        if met { "met" } else { "MISSED" }
    )
}

/// Runs `f` in a test world of the default table size, without pinning,
/// with a conntrack table of `ct_size` entries.
fn in_world_with_ct<R: Send>(
    ct_size: u32,
    name: &str,
    f: impl FnOnce(&mut World) -> anyhow::Result<R> + Send,
) -> anyhow::Result<R> {
    let opts = LoadOptions {
        ct_size,
        ring_stride: lb_common::DEFAULT_TABLE_SIZE,
        pin_dir: None,
    };
    in_world(name, opts, f)
}

fn main() -> anyhow::Result<()> {
    let rows = in_world_with_ct(65_536, "bench", |w| {
        let flows = Flows::install(w)?;
        let mut rows = repeat_rows(w, &flows)?;
        rows.extend(single_rows(w, &flows)?);
        Ok(rows)
    })?;
    print_rows(&rows);
    println!();
    table_swap()
}

/// The benchmark's flows: one to each VIP, established in conntrack, and
/// one to an address that is no VIP.
struct Flows {
    l2: Flow,
    ipip: Flow,
    other: Flow,
}

impl Flows {
    /// Sets up the two VIPs (dsr-ipip and dsr-l2, two backends) and the
    /// conntrack entries of their flows.
    fn install(w: &mut World) -> anyhow::Result<Self> {
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

fn frame(f: &Flow, flags: u8) -> Vec<u8> {
    f.frame(LB_MAC, PEER_MAC, None, flags, &[0u8; 18])
}

/// Repeat mode: dsr-l2, whose output takes the same path again.
fn repeat_rows(w: &mut World, f: &Flows) -> anyhow::Result<Vec<Row>> {
    let minimal = repeat_ns(w, lb_common::PROG_MINIMAL, &frame(&f.l2, ACK), XDP_TX)?;
    let est = repeat_ns(w, lb_common::PROG_LB, &frame(&f.l2, ACK), XDP_TX)?;
    let syn = repeat_ns(w, lb_common::PROG_LB, &frame(&f.l2, SYN), XDP_TX)?;
    let pass = repeat_ns(w, lb_common::PROG_LB, &frame(&f.other, SYN), XDP_PASS)?;
    Ok(vec![
        Row::info("minimal (parse, swap MACs, XDP_TX)", minimal, minimal),
        Row {
            target_ns: Some(60.0),
            target_ratio: Some(1.5),
            ..Row::info("established hit, dsr-l2", est, minimal)
        },
        Row {
            target_ns: Some(300.0),
            ..Row::info("new flow (SYN), dsr-l2", syn, minimal)
        },
        Row::info("non-VIP pass", pass, minimal),
    ])
}

/// Single mode: dsr-ipip, one packet per run, each on a fresh copy.
fn single_rows(w: &mut World, f: &Flows) -> anyhow::Result<Vec<Row>> {
    let mut nothing = |_: &mut World| Ok(());
    let ack = frame(&f.ipip, ACK);
    let syn = frame(&f.ipip, SYN);
    let minimal = single_ns(w, lb_common::PROG_MINIMAL, &ack, XDP_TX, &mut nothing)?;
    let est = single_ns(w, lb_common::PROG_LB, &ack, XDP_TX, &mut nothing)?;
    let new = single_ns(w, lb_common::PROG_LB, &syn, XDP_TX, &mut nothing)?;
    Ok(vec![
        Row::info("minimal, one packet per run", minimal, minimal),
        Row::info("established hit, dsr-ipip, one per run", est, minimal),
        Row::info("new flow (SYN), dsr-ipip, one per run", new, minimal),
    ])
}

fn print_rows(rows: &[Row]) {
    println!(
        "xlb data-plane benchmark (BPF_PROG_TEST_RUN, best of {ROUNDS}; repeat mode: {REPEAT} packets per run; single mode: {SINGLES} runs)"
    );
    println!(
        "{:<42} {:>9} {:>9} {:>7}  target",
        "case", "ns/pkt", "baseline", "ratio"
    );
    for r in rows {
        let ratio = r.ns / r.base;
        let mut targets = Vec::new();
        if let Some(t) = r.target_ns {
            targets.push((format!("<= {t} ns"), r.ns <= t));
        }
        if let Some(t) = r.target_ratio {
            targets.push((format!("<= {t}x"), ratio <= t));
        }
        println!(
            "{:<42} {:>9.1} {:>9.1} {:>6.2}x  {}",
            r.name,
            r.ns,
            r.base,
            ratio,
            judged(&targets)
        );
    }
}

/// Time from the probe result that crosses `fall` to the data plane using the
/// new table: the daemon's own path (`daemon::model::rebuild`: Maglev build,
/// diff against the spare half, map writes, one `VipInfo` write that flips
/// the live half), for VIPs of 10, 100 and 1,000 backends at the default
/// table size. Best and median of 9 transitions each (alternating down/up).
fn table_swap() -> anyhow::Result<()> {
    let rows = in_world_with_ct(1024, "swap", |w| {
        let mut rows = Vec::new();
        for n in [10usize, 100, 1000] {
            let (best, median, changed) = time_swaps(w, n)?;
            rows.push((n, best, median, changed));
        }
        Ok(rows)
    })?;
    println!("fall -> new table live (daemon::model::rebuild, table 65537, best of 9 / median)");
    println!(
        "{:<10} {:>10} {:>10} {:>14}  target",
        "backends", "best", "median", "slots changed"
    );
    for (n, best, median, changed) in rows {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let target = if n == 1000 {
            judged(&[("<= 10 ms".to_string(), ms(median) <= 10.0)])
        } else {
            String::new()
        };
        println!(
            "{:<10} {:>8.2}ms {:>8.2}ms {:>14}  {target}",
            n,
            ms(best),
            ms(median),
            changed
        );
    }
    Ok(())
}

/// A VIP of `n` healthy backends installed as the daemon installs it, then
/// one backend taken down and up 9 times; returns the best and median time
/// to the new table and the most slots one transition changed.
fn time_swaps(w: &mut World, n: usize) -> anyhow::Result<(Duration, Duration, u32)> {
    let mut ids = Ids::default();
    let (mut vip, _) = adopt_or_create_vip(&mut w.dp, &mut ids, vip_config(n)?, None)?;
    for b in &mut vip.backends {
        b.health = HealthState::Up;
    }
    vip.run_policy(std::time::Instant::now());
    install_vip(&mut w.dp, &vip)?;
    rebuild(&mut w.dp, &mut vip)?; // fills one half
    rebuild(&mut w.dp, &mut vip)?; // no-op: already live
    let mut times = Vec::new();
    let mut changed = 0;
    for round in 0..9 {
        let to = if round % 2 == 0 {
            HealthState::Down
        } else {
            HealthState::Up
        };
        vip.backends[n / 2].health = to;
        // What the daemon does with the report that crossed `fall`
        // or `rise`: the VIP policy, the backend's state, the table.
        let t = std::time::Instant::now();
        vip.run_policy(t);
        let info = vip.backends[n / 2].info();
        w.dp.set_backend(vip.backends[n / 2].id, &info)?;
        let r = rebuild(&mut w.dp, &mut vip)?.expect("membership changed");
        times.push(t.elapsed());
        changed = changed.max(r.slots_changed);
    }
    times.sort();
    // Free the ids for the next size.
    w.dp.remove_vip(&vip.key)?;
    Ok((times[0], times[times.len() / 2], changed))
}

/// A dsr-l2 VIP of `n` backends with TCP checks, at the default table size.
fn vip_config(n: usize) -> anyhow::Result<VipConfig> {
    let spec = CheckSpec {
        kind: CheckKind::Tcp,
        port: 80,
        interval: Duration::from_secs(2),
        timeout: Duration::from_secs(1),
        hang_timeout: Duration::from_secs(3),
        rise: 2,
        fall: 3,
        fast_interval: Duration::from_millis(500),
        down_interval: Duration::from_secs(5),
        jitter: 0.1,
        via: lb_user::health::spec::Via::Direct,
        auto_timeout: false,
    };
    Ok(VipConfig {
        name: format!("v{n}"),
        addr: "10.100.0.1".parse()?,
        port: 80,
        protocol: Protocol::Tcp,
        mode: Mode::DsrL2,
        down_policy: DownPolicy::Rehash,
        table_size: lb_common::DEFAULT_TABLE_SIZE,
        protection: Default::default(),
        guard: Default::default(),
        backends: (0..n)
            .map(|i| BackendConfig {
                addr: std::net::IpAddr::V4(std::net::Ipv4Addr::from(0x0a01_0000 + i as u32)),
                port: 80,
                weight: 1,
                health: spec.clone(),
                max_flows: None,
            })
            .collect(),
    })
}
