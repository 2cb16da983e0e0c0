//! `kind = "https"` end to end: three `openssl s_server -www` backends in
//! the lab's backend namespaces, with certificates of a lab CA made by the
//! openssl CLI (`tests/tls/make-certs.sh`) and that CA as `ca_file`, behind
//! a VIP probed by the real `xlb` daemon. One hung with SIGSTOP is taken
//! out with `tls_handshake_timeout` within `fall` periods and one
//! `hang_timeout` (+ margin) and comes back on SIGCONT; the fleet made slow
//! (each stopped most of each cycle, so handshakes complete late) stays in;
//! one whose
//! certificate names another host goes down with `tls_cert_wrong_name`.
//!
//! Needs root, openssl and the binaries: `cargo build -p lb-user -p xlb-lab`,
//! then `cargo test -p xlb-tests --test probe_https -- --nocapture`.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use lb_user::health::spec;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use xlb_lab::scenario::{Health, LabRun, Mode, Protection, RunOptions, Vip, XlbConfig};
use xlb_lab::topology;
use xlb_tests::lab::{DETECTION_MARGIN, now_unix_ms, serial, teardown, transitions, xlb_binary};
use xlb_tests::tls::LabCerts;

const PORT: u16 = 443;

fn health() -> Health {
    Health {
        kind: "https".to_string(),
        interval: Duration::from_millis(500),
        timeout: Duration::from_millis(300),
        rise: 2,
        fall: 2,
        hang_timeout: Some(Duration::from_secs(1)),
        xlb_defaults: false,
    }
}

/// Sends `signal` to an s_server; `SIGCONT` again when dropped, so a
/// failed test leaves no stopped process behind for teardown.
struct Stopped(u32);

impl Stopped {
    fn stop(pid: u32) -> Self {
        signal(pid, Signal::SIGSTOP);
        Self(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, Signal::SIGCONT);
    }
}

fn signal(pid: u32, signal: Signal) {
    kill(Pid::from_raw(pid as i32), signal).unwrap_or_else(|e| panic!("{signal} {pid}: {e}"));
}

fn start_server(run: &mut LabRun, certs: &LabCerts, i: usize, cert: &str) -> u32 {
    let ns = run.lab().ns_backend(i);
    let args = certs.s_server_args(cert, PORT);
    run.spawn_in(
        &format!("s_server-b{i}-{cert}"),
        &ns,
        Path::new("openssl"),
        &args,
    )
    .unwrap_or_else(|e| panic!("s_server in {ns}: {e}"))
}

#[test]
fn https_backends_hung_slow_and_misnamed() {
    let _serial = serial();
    xlb_tests::require_root();
    let p = format!("phttps{}", std::process::id() % 1000);
    let certs = LabCerts::make(&p);
    let health = health();
    let vip = Vip::new("tls", topology::VIP_V4.into(), PORT, Mode::DsrIpip, 3);
    let cfg = XlbConfig {
        health: health.clone(),
        vips: vec![vip.clone()],
        // The slowdown below (stop/continue cycles) gives each probe a
        // random latency between 0 and 450 ms, so for a moment one backend
        // can look 3× slower than its peers although the fleet is evenly
        // slow; a real slow fleet is not that uneven. No slow outliers
        // here: what is tested is that slow handshakes never count as
        // failures (the outlier rule has its own tests, cascade.rs).
        protection: Protection {
            outlier_margin: Some(Duration::from_secs(2)),
            ..Protection::default()
        },
        ..XlbConfig::for_prefix(&p)
    };
    // The certificates name good.test (SNI and the name checked); their
    // CA is the lab's.
    let text = cfg.render().replace(
        "kind = \"https\"\n",
        &format!(
            "kind = \"https\"\nhost = \"good.test\"\nca_file = \"{}\"\n",
            certs.path("ca.pem").display()
        ),
    );
    let xlb = xlb_binary();
    let opts = RunOptions {
        start_daemon: false,
        ..RunOptions::new(&p, &xlb, &text)
    };
    let mut run = LabRun::up_with(opts).unwrap_or_else(|e| panic!("lab up: {e}"));
    let mut servers: Vec<u32> = (1..=3)
        .map(|i| start_server(&mut run, &certs, i, "good"))
        .collect();
    run.start_daemon()
        .unwrap_or_else(|e| panic!("xlb run: {e}"));
    let t0 = Instant::now();
    run.wait_all_up(Duration::from_secs(15))
        .unwrap_or_else(|e| panic!("the https backends did not come up: {e}"));
    eprintln!("[{p}] 3 https backends up in {:?}", t0.elapsed());

    hung_backend_goes_and_returns(&run, &vip, &health, servers[1]);
    slow_fleet_stays(&run, &vip, &health, &servers);

    // b3 now presents a certificate for other.test.
    run.lab().kill(servers[2]).expect("stop b3's s_server");
    servers[2] = start_server(&mut run, &certs, 3, "other");
    let b3 = vip.backend_addr(3);
    let (status, _) = run
        .wait_backend_state("tls", b3, "down", Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("b3 with the wrong certificate stayed up: {e}"));
    let probe = status.backend("tls", b3).and_then(|b| b.last_probe.clone());
    let probe = probe.expect("b3's last probe");
    eprintln!("[{p}] b3 down: {} ({})", probe.reason, probe.code);
    assert_eq!(probe.code, "tls_cert_wrong_name");
    assert!(
        probe
            .reason
            .contains("not valid for \"good.test\" (it names \"other.test\")"),
        "{}",
        probe.reason
    );
    teardown(run);
}

/// SIGSTOP: the kernel still completes TCP handshakes, no ServerHello
/// comes: down with `tls_handshake_timeout`; SIGCONT brings it back.
fn hung_backend_goes_and_returns(run: &LabRun, vip: &Vip, health: &Health, pid: u32) {
    let b2 = vip.backend_addr(2);
    let hang = health.hang_timeout.expect("set");
    let period = health.interval.mul_f64(1.0 + spec::defaults::JITTER);
    let bound = period * health.fall + hang + DETECTION_MARGIN;
    let stopped = Stopped::stop(pid);
    let stopped_at = now_unix_ms();
    let (status, waited) = run
        .wait_backend_state("tls", b2, "down", bound + Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("hung b2 was not taken out: {e}"));
    let probe = status.backend("tls", b2).and_then(|b| b.last_probe.clone());
    let probe = probe.expect("b2's last probe");
    eprintln!(
        "[hung] b2 down after {waited:?} (bound {bound:?}): {} ({})",
        probe.reason, probe.code
    );
    assert_eq!(probe.code, "tls_handshake_timeout", "{}", probe.reason);
    let events = run.events().expect("events");
    let down = transitions(&events, "tls", b2)
        .into_iter()
        .rfind(|e| e.to.as_deref() == Some("down"))
        .expect("a down event for b2")
        .at_unix_ms;
    let detection = Duration::from_millis(down.saturating_sub(stopped_at));
    eprintln!("[hung] detection {detection:?}");
    assert!(
        detection <= bound,
        "b2 went down {detection:?} after SIGSTOP; bound fall × interval × (1 + jitter) + \
         hang_timeout + {DETECTION_MARGIN:?} = {bound:?}"
    );
    drop(stopped);
    let back = health.interval * (health.rise + 1) + health.timeout + DETECTION_MARGIN;
    let (_, waited) = run
        .wait_backend_state("tls", b2, "up", back + Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("b2 did not come back after SIGCONT: {e}"));
    eprintln!("[hung] b2 up again {waited:?} after SIGCONT");
}

/// The whole fleet slowed down (each server stopped 450 ms of every 600,
/// phases apart): a probe meeting a stopped server completes its handshake
/// after `timeout` (300 ms) but within `hang_timeout` (1 s): slow, not
/// failed, and with every peer as slow no outlier either. Every backend
/// must stay up and in the table. (One slow backend among fast peers is
/// taken out as a slow outlier by design, see README "Outliers".)
fn slow_fleet_stays(run: &LabRun, vip: &Vip, health: &Health, pids: &[u32]) {
    let slow_for = Duration::from_secs(8);
    let started = now_unix_ms();
    let done = AtomicBool::new(false);
    let mut slowest = 0.0f64;
    let mut seen_slow = 0;
    thread::scope(|s| {
        for (k, &pid) in pids.iter().enumerate() {
            let done = &done;
            s.spawn(move || {
                thread::sleep(Duration::from_millis(200 * k as u64));
                let until = Instant::now() + slow_for;
                while Instant::now() < until {
                    let stopped = Stopped::stop(pid);
                    thread::sleep(Duration::from_millis(450));
                    drop(stopped);
                    thread::sleep(Duration::from_millis(150));
                }
                done.store(true, Ordering::SeqCst);
            });
        }
        let mut last_at = vec![0; pids.len()];
        while !done.load(Ordering::SeqCst) {
            let status = run.status().expect("status");
            for (k, last_at) in last_at.iter_mut().enumerate() {
                let b = status
                    .backend("tls", vip.backend_addr(k + 1))
                    .expect("backend");
                assert!(
                    b.state == "up" && b.in_table,
                    "a backend of the slow fleet was taken out: {b:?}"
                );
                if let Some(probe) = &b.last_probe
                    && probe.at_unix_ms != *last_at
                {
                    *last_at = probe.at_unix_ms;
                    slowest = slowest.max(probe.latency_ms);
                    if probe.ok && probe.latency_ms > health.timeout.as_secs_f64() * 1000.0 {
                        seen_slow += 1;
                    }
                }
            }
            thread::sleep(Duration::from_millis(100));
        }
    });
    eprintln!("[slow] the fleet stayed up; {seen_slow} slow probes seen, slowest {slowest:.0} ms");
    assert!(
        seen_slow > 0,
        "no probe was slower than timeout: the slowdown did not slow the fleet"
    );
    let events = run.events().expect("events");
    for i in 1..=pids.len() {
        let moved: Vec<_> = transitions(&events, "tls", vip.backend_addr(i))
            .into_iter()
            .filter(|e| e.at_unix_ms >= started && e.to.as_deref() != Some("up"))
            .collect();
        assert!(moved.is_empty(), "b{i} left up while slow: {moved:?}");
    }
}
