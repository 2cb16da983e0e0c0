//! One daemon's life on the running kernel, short enough to repeat on every
//! kernel of the matrix (`cargo xtask test` boots each in QEMU and runs this
//! with the packet fixtures; here it runs on the host's kernel):
//!
//! 1. the lab up with `xlb run` on a veth (the LB namespace's `eth0`),
//!    every backend `up` through its HTTP probe;
//! 2. connections held through the VIP, each exchanging a request through
//!    the load balancer every 200 ms;
//! 3. the daemon killed with `kill -9` and started again: it adopts the
//!    pinned maps and link, and every held connection answers to the end on
//!    the backend it started on;
//! 4. a backend whose application hangs (its port still accepts) is taken
//!    out by its HTTP probe, and comes back when it recovers;
//! 5. `xlb detach` (the lab's teardown) leaves no namespace and no pin.
//!
//! The bounds are loose on purpose: under QEMU's software emulation the
//! guest runs tens of times slower than this machine, and what is checked
//! is that each step happens on that kernel, not how fast (the end-to-end
//! tests time it here).

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::{
    thread,
    time::{Duration, Instant},
};

use xlb_lab::{
    Fault,
    held::{HeldOptions, start_held_in},
    scenario::{self, Health, Mode, Vip, XlbConfig},
    topology,
};
use xlb_tests::{
    harness::kernel_release,
    lab::{serial, teardown, xlb_binary},
};

/// Held connections: enough to spread over both backends.
const HELD: u32 = 6;

/// Bound on the lab coming up (four programs verified at once, each of
/// them seconds long under emulation) and on each state change.
const SLOW: Duration = Duration::from_secs(180);

#[test]
fn daemon_life_on_this_kernel() {
    let _serial = serial();
    let p = format!("life{}", std::process::id() % 1000);
    let kernel = kernel_release();
    let vip = Vip::new("api", topology::VIP_V4.into(), 80, Mode::DsrIpip, 2);
    // Probes with room for an emulated guest: a slow answer is no hang.
    let health = Health {
        interval: Duration::from_secs(2),
        timeout: Duration::from_secs(2),
        hang_timeout: Some(Duration::from_secs(3)),
        rise: 2,
        fall: 2,
        ..Health::default()
    };
    let cfg = XlbConfig {
        health,
        vips: vec![vip.clone()],
        ..XlbConfig::for_prefix(&p)
    };
    let t0 = Instant::now();
    let mut run = scenario::LabRun::up_with(scenario::RunOptions {
        backends: 2,
        ready_timeout: SLOW,
        ..scenario::RunOptions::new(&p, &xlb_binary(), &cfg.render())
    })
    .unwrap_or_else(|e| panic!("[{p}] kernel {kernel}: lab up: {e}"));
    eprintln!(
        "[{p}] kernel {kernel}: lab up, both backends up, in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    // The kernel features the daemon found missing, and what it does
    // instead: the matrix's summary reads these lines.
    let log = std::fs::read_to_string(run.daemon_log()).unwrap_or_default();
    for line in log.lines().filter(|l| l.contains(" lacks ")) {
        eprintln!("[{p}] daemon: {}", line.trim());
    }

    // Held connections through the VIP, across kill -9 and a restart.
    let mut opts = HeldOptions::new(vip.target(), HELD);
    opts.interval = Duration::from_millis(200);
    opts.duration = SLOW;
    opts.setup_timeout = Duration::from_secs(30);
    opts.grace = Duration::from_secs(30);
    let held = start_held_in(&run.lab().ns_client(), opts)
        .unwrap_or_else(|e| panic!("[{p}] holding connections: {e}"));
    thread::sleep(Duration::from_secs(3));
    let old = run.daemon_pid();
    run.kill9_daemon()
        .unwrap_or_else(|e| panic!("[{p}] kill -9: {e}"));
    let killed_ms = held.now_ms();
    thread::sleep(Duration::from_secs(1));
    run.start_daemon().unwrap_or_else(|e| {
        panic!(
            "[{p}] restart: {e}\n{}",
            scenario::log_tail(&run.daemon_log())
        )
    });
    let status = run.status().unwrap();
    assert!(
        status.adopted,
        "[{p}] kernel {kernel}: the restarted daemon did not adopt the pins: {}",
        status.summary()
    );
    let restarted_ms = held.now_ms();
    run.wait_all_up(SLOW)
        .unwrap_or_else(|e| panic!("[{p}] backends after the restart: {e}"));
    // Exchanges after the restart, through the new daemon's program.
    thread::sleep(Duration::from_secs(3));
    held.stop();
    let report = held.join().unwrap_or_else(|e| panic!("[{p}] held: {e}"));
    eprintln!(
        "[{p}] kernel {kernel}: daemon {old:?} killed at {killed_ms} ms, restarted (pid {:?}) \
         at {restarted_ms} ms; held connections kept {} of {}, by backend {:?}",
        run.daemon_pid(),
        report.kept(),
        report.conns.len(),
        report.per_backend()
    );
    assert_eq!(report.conns.len(), HELD as usize);
    let broken: Vec<_> = report.conns.iter().filter(|c| !c.kept()).collect();
    assert!(
        broken.is_empty(),
        "[{p}] kernel {kernel}: connections broke across kill -9 and restart: {broken:?}"
    );
    for c in &report.conns {
        assert!(
            c.first_ok_after(restarted_ms).is_some(),
            "[{p}] kernel {kernel}: connection {} answered nothing after the restart: {c:?}",
            c.id
        );
    }

    // A hung application: the port accepts, the HTTP probe times out.
    let b2 = vip.backend_addr(2);
    run.set_fault(2, Fault::Hang).unwrap();
    let (_, waited) = run
        .wait_backend_state("api", b2, "down", SLOW)
        .unwrap_or_else(|e| panic!("[{p}] kernel {kernel}: the hung b2 was not taken out: {e}"));
    let status = run.status().unwrap();
    let b2_status = status.backend("api", b2).unwrap();
    assert!(
        !b2_status.in_table,
        "[{p}] kernel {kernel}: b2 is down but still in the table: {}",
        status.summary()
    );
    run.set_fault(2, Fault::None).unwrap();
    let (_, back) = run
        .wait_backend_state("api", b2, "up", SLOW)
        .unwrap_or_else(|e| panic!("[{p}] kernel {kernel}: b2 did not come back: {e}"));
    eprintln!(
        "[{p}] kernel {kernel}: hung b2 out after {} ms, back {} ms after it recovered",
        waited.as_millis(),
        back.as_millis()
    );
    // `xlb detach`, then nothing of the lab or the instance is left.
    teardown(run);
}
