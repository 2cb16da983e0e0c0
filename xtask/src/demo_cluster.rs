//! `cargo xtask demo --nodes 2`: two xlb nodes behind a router, and what
//! their clients see when one of them dies.
//!
//! The two-node lab comes up with BFD (100 ms × 3): a router running BIRD
//! with one ECMP route per VIP, hashed on L4, and nodes A and B each
//! running `xlb run` and BIRD, announcing the VIPs. Held connections (a
//! keep-alive request and answer every 20 ms each, through the VIP) spread
//! over both nodes; each node's new flows show it. Node A dies (daemon and
//! BIRD killed, XDP detached), the router moves its flows to node B, and
//! the demo shows that the connections went on, each on the backend it
//! had, none reset. Node A comes back; the demo prints the convergence
//! time: from the death to the last connection answering again.
//!
//! Everything is torn down at the end, on an error and on Ctrl-C.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use xlb_lab::{
    held::{HeldOptions, HeldReport, HeldRun, start_held_in},
    scenario::{ClusterOptions, ClusterRun, Speaker, XlbConfig},
    topology::Node,
};

use crate::lab::{self, Paths};

/// The lab's namespace prefix (`xlb2-rt`, `xlb2-lb`, …), apart from the
/// one-node demo's so that both can be left up.
const PREFIX: &str = "xlb2";

/// The VIP the connections go to.
const VIP: &str = "api";

/// Held connections.
const CONNECTIONS: u32 = 100;

/// A connection whose next answer came later than this after the death
/// lost a packet to it (TCP retransmits after 200 ms at the least).
const WAITED: Duration = Duration::from_millis(200);

/// Set by SIGINT/SIGTERM; every wait of the demo checks it.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Ctrl-C (or a `kill`) ends the demo at its next step, through the
/// teardown; a second one kills it at once (`SA_RESETHAND`), leaving what
/// `cargo xtask lab down --prefix xlb2` removes.
fn catch_interrupts() -> Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESETHAND,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { sigaction(sig, &action) }.context("installing the Ctrl-C handler")?;
    }
    Ok(())
}

/// Sleeps `d`, or returns an error as soon as the demo is interrupted.
fn pause(d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        check()?;
        thread::sleep(Duration::from_millis(50).min(end - Instant::now()));
    }
    check()
}

fn check() -> Result<()> {
    if INTERRUPTED.load(Ordering::Relaxed) {
        bail!("interrupted: the lab is being torn down");
    }
    Ok(())
}

pub(crate) fn run() -> Result<()> {
    let paths = Paths::find()?;
    lab::build_then_become_root(
        "the demo (network namespaces, XDP programs, BIRD)",
        Some(true),
    )?;
    catch_interrupts()?;
    let began = Instant::now();
    let xlb = paths.release_bin("xlb");
    let dir = paths.lab_dir(PREFIX);
    let mut opts = ClusterOptions::new(PREFIX, &xlb);
    opts.config = XlbConfig::lab_default(PREFIX, xlb_lab::scenario::Mode::DsrIpip, 3);
    // Both nodes announce through xlb's `[announce]` (the lab's default).
    opts.announce = true;
    opts.bfd = true;
    opts.work_dir = Some(dir.clone());
    println!(
        "\n== The two-node lab: client → router (BIRD, ECMP on L4) → node A, node B \
         (xlb + BIRD, BFD 100 ms × 3) → backends b1, b2, b3 =="
    );
    let mut c = ClusterRun::up(&opts).with_context(|| {
        format!(
            "bringing up the two-node lab (logs in {}; `cargo xtask lab down --prefix {PREFIX}` \
             cleans up)",
            lab::short(&dir)
        )
    })?;
    // From here on `c` is dropped on every way out: its Drop stops BIRD
    // and both daemons, detaches XDP and removes the namespaces.
    let result = story(&mut c, began);
    drop(c);
    println!("\nlab removed.");
    let took = began.elapsed();
    result?;
    println!("demo took {:.0} s after the build", took.as_secs_f64());
    Ok(())
}

/// The VIP's address, from node A's status.
fn target(c: &ClusterRun) -> Result<SocketAddr> {
    let status = c.status(Node::A)?;
    let v = status
        .vip(VIP)
        .with_context(|| format!("the lab has no VIP {VIP}: {}", status.summary()))?;
    Ok(SocketAddr::new(v.address.parse()?, v.port))
}

/// Each node's `new_flows` of the VIP.
fn new_flows(c: &ClusterRun) -> Result<[u64; 2]> {
    let mut out = [0; 2];
    for (i, n) in [Node::A, Node::B].into_iter().enumerate() {
        let s = c.status(n)?;
        out[i] = s.vip(VIP).map_or(0, |v| v.new_flows);
    }
    Ok(out)
}

fn story(c: &mut ClusterRun, began: Instant) -> Result<()> {
    let target = target(c)?;
    c.wait_router(target.ip(), &[Node::A, Node::B], Duration::from_secs(30))?;
    println!(
        "up after {:.1} s; the router sends {target} to node A ({}) and node B ({})",
        began.elapsed().as_secs_f64(),
        Node::A.v4(),
        Node::B.v4()
    );
    check()?;

    println!("\n== {CONNECTIONS} connections to {target}, an exchange every 20 ms each ==");
    let before = new_flows(c)?;
    let held = start_held_in(&c.lab().ns_client(), {
        let mut o = HeldOptions::new(target, CONNECTIONS);
        o.duration = Duration::from_secs(300);
        o
    })?;
    let r = node_a_dies_and_returns(c, &held, before);
    held.stop();
    let report = held.join()?;
    let moments = r?;
    println!("\n== What the connections saw ==");
    print!("{}", summary(&report, &moments));
    Ok(())
}

/// When things happened, on the held connections' clock (ms).
struct Moments {
    death_ms: u64,
    /// The router sent the VIP to node B alone, ms after the death.
    router_ms: u64,
    back_ms: u64,
}

fn node_a_dies_and_returns(
    c: &mut ClusterRun,
    held: &HeldRun,
    before: [u64; 2],
) -> Result<Moments> {
    pause(Duration::from_secs(2))?;
    let after = new_flows(c)?;
    println!(
        "new flows: node A {}, node B {} (each node's `new_flows` of {VIP})",
        after[0] - before[0],
        after[1] - before[1]
    );

    println!("\n== Node A dies: its daemon and BIRD killed (SIGKILL), its XDP detached ==");
    let death_ms = held.now_ms();
    let t0 = Instant::now();
    c.kill_node(Node::A)?;
    let target = target_of_b(c)?;
    c.wait_router(target, &[Node::B], Duration::from_secs(10))?;
    let router_ms = t0.elapsed().as_millis() as u64;
    println!("the router sends {VIP} to node B alone, {router_ms} ms after the death");
    pause(Duration::from_secs(3))?;

    println!("\n== Node A comes back: xlb run, then BIRD ==");
    c.start_daemon(Node::A)?;
    c.start_bird(Speaker::Node(Node::A))?;
    let t1 = Instant::now();
    c.wait_router(target, &[Node::A, Node::B], Duration::from_secs(40))?;
    let back_ms = held.now_ms();
    println!(
        "node A announces {VIP} again; the router has both next hops {:.1} s after its BIRD started",
        t1.elapsed().as_secs_f64()
    );
    pause(Duration::from_secs(2))?;
    Ok(Moments {
        death_ms,
        router_ms,
        back_ms,
    })
}

/// The VIP's address, asked of node B (node A is dead).
fn target_of_b(c: &ClusterRun) -> Result<std::net::IpAddr> {
    let status = c.status(Node::B)?;
    let v = status
        .vip(VIP)
        .with_context(|| format!("node B has no VIP {VIP}"))?;
    Ok(v.address.parse()?)
}

/// How the connections ended, by name (`open`, `reset`, ...).
fn ends(report: &HeldReport) -> BTreeMap<&str, usize> {
    let mut m = BTreeMap::new();
    for c in &report.conns {
        *m.entry(c.end.as_str()).or_insert(0) += 1;
    }
    m
}

/// The demo's conclusion, from the held connections' own records.
fn summary(report: &HeldReport, m: &Moments) -> String {
    let death = report.convergence(m.death_ms, WAITED);
    let back = report.convergence(m.back_ms, WAITED);
    let ends: Vec<String> = ends(report)
        .iter()
        .map(|(e, n)| format!("{n} {e}"))
        .collect();
    let mut out = format!(
        "{} connections: {} answered to the end, each on the backend it started on; \
         ended: {}\n",
        report.conns.len(),
        report.kept(),
        ends.join(", ")
    );
    out += &format!(
        "node A's death: {} of {} connections waited over 200 ms for an answer (a packet \
         lost with node A); {} lost; the router moved node A's flows after {} ms\n",
        death.waited, death.held, death.lost, m.router_ms
    );
    out += &format!(
        "node A's return: {} connections waited, {} lost (the flows the router moved back \
         to node A found the same backends: both nodes build the same table)\n",
        back.waited, back.lost
    );
    match death.last_back_ms {
        Some(ms) if death.lost == 0 => {
            out += &format!(
                "convergence time: {ms} ms, from node A's death to the last connection \
                 answering again\n"
            );
        }
        Some(ms) => {
            out += &format!(
                "convergence time: {ms} ms for the connections that came back; {} did NOT: \
                 see the daemon logs in the lab's directory\n",
                death.lost
            );
        }
        None => out += "convergence time: none measured: no connection was held at the death\n",
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use xlb_lab::held::HeldConn;

    fn conn(id: u32, ok_ms: &[u64], end: &str) -> HeldConn {
        HeldConn {
            id,
            backends: vec![format!("b{}", id % 3 + 1)],
            ok_ms: ok_ms.to_vec(),
            end: end.to_string(),
            ended_ms: (end != "open").then_some(5000),
        }
    }

    #[test]
    fn summary_says_what_the_connections_saw() {
        let m = Moments {
            death_ms: 1000,
            router_ms: 310,
            back_ms: 4000,
        };
        let all_back = HeldReport {
            interval_ms: 20,
            conns: vec![
                conn(0, &[900, 1010, 4010, 4030], "open"),
                conn(1, &[950, 1612, 4050], "open"),
            ],
        };
        let text = summary(&all_back, &m);
        for want in [
            "2 connections: 2 answered to the end",
            "ended: 2 open",
            "1 of 2 connections waited over 200 ms for an answer (a packet lost with node A); 0 lost; the router moved node A's flows after 310 ms",
            "node A's return: 0 connections waited, 0 lost",
            "convergence time: 612 ms, from node A's death",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        let reset = HeldReport {
            interval_ms: 20,
            conns: vec![conn(0, &[900, 1010], "open"), conn(1, &[950], "reset")],
        };
        let text = summary(&reset, &m);
        assert!(text.contains("ended: 1 open, 1 reset"), "{text}");
        assert!(text.contains("1 did NOT"), "{text}");
    }
}
