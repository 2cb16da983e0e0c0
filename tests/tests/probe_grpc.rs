//! End to end, issue 25: `kind = "grpc"` against real gRPC health servers
//! (`xlb-grpc-health`: tonic-health's standard `grpc.health.v1` service)
//! on three backends behind the lab's `api` VIP, probed on their own port
//! (`health_port`). One hung with SIGSTOP (its socket stays bound, the
//! kernel still completes handshakes) leaves the table within
//! `fall × interval + timeout` and comes back on SIGCONT; one switched to
//! NOT_SERVING goes down with the status in the reason; a fleet made slow
//! (every server stopped for 60 % of every 150 ms) stays in.
//!
//! The same through the data path (`via = "vip"`) on kept HTTP/2
//! connections (`reuse_connection = true`).
//!
//! Same rules as `e2e.rs`: the lab (prefix `grp…`, own instance and socket)
//! is torn down by `LabRun`'s Drop however the test ends, and the gRPC
//! servers with it (they are the lab's children); every wait is bounded.
//!
//! Needs root and the binaries: `cargo build -p lb-user -p xlb-lab`, then
//! `cargo test -p xlb-tests --test probe_grpc -- --test-threads 1 --nocapture`.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use xlb_lab::scenario::{Event, Health, LabRun, Protection, XlbConfig};
use xlb_tests::lab::cascade::{api, config};
use xlb_tests::lab::{DETECTION_MARGIN, now_unix_ms, serial, teardown, up, xlb_binary};

/// The port `xlb-grpc-health` serves on in every backend namespace.
const GRPC_PORT: u16 = 50051;

fn prefix(tag: &str) -> String {
    format!("grp{tag}{}", std::process::id() % 1000)
}

fn health(kind: &str) -> Health {
    Health {
        kind: kind.to_string(),
        interval: Duration::from_millis(200),
        timeout: Duration::from_millis(100),
        fall: 2,
        hang_timeout: Some(Duration::from_millis(600)),
        ..Health::default()
    }
}

/// `api` probed with `kind = "grpc"` on [`GRPC_PORT`].
fn grpc_config(p: &str) -> XlbConfig {
    let mut cfg = config(p, health("grpc"), Protection::default());
    cfg.vips[0].health_port = Some(GRPC_PORT);
    cfg
}

/// Starts `xlb-grpc-health` in every backend namespace (as the lab's
/// children: stopped with it); returns their pids.
fn start_grpc_servers(run: &LabRun) -> Vec<u32> {
    let bin = xlb_binary().with_file_name("xlb-grpc-health");
    assert!(
        bin.exists(),
        "{} missing: cargo build -p xlb-lab",
        bin.display()
    );
    (1..=run.backend_count())
        .map(|i| {
            let ns = run.lab().ns_backend(i);
            let listen = format!("0.0.0.0:{GRPC_PORT}");
            run.lab()
                .spawn_in(&ns, &bin, ["--listen", listen.as_str(), "--service", "api"])
                .unwrap_or_else(|e| panic!("starting xlb-grpc-health in {ns}: {e}"))
        })
        .collect()
}

fn signal(pid: u32, sig: Signal) {
    kill(Pid::from_raw(pid as i32), sig).unwrap_or_else(|e| panic!("{sig} to {pid}: {e}"));
}

/// The first event taking `backend` out of `api` at or after `since`.
fn exit_of(events: &[Event], backend: SocketAddr, since: u64) -> Option<&Event> {
    events.iter().find(|e| {
        e.kind == "transition"
            && e.vip.as_deref() == Some("api")
            && e.backend.as_deref() == Some(backend.to_string().as_str())
            && e.at_unix_ms >= since
            && !matches!(
                e.to.as_deref(),
                Some("up" | "serving" | "ramping" | "panic_restored")
            )
    })
}

/// Brings the lab up with HTTP checks (the lab's backends answer them),
/// starts the gRPC servers, then reloads with `kind = "grpc"` on their
/// port and waits for every backend to be up by gRPC.
fn grpc_lab(p: &str, extra: &str) -> (LabRun, Vec<u32>) {
    let run = up(p, &config(p, health("http"), Protection::default()));
    let pids = start_grpc_servers(&run);
    let text = grpc_config(p).render().replacen(
        "[health_check]\n",
        &format!("[health_check]\n{extra}"),
        1,
    );
    run.reload(&text)
        .unwrap_or_else(|e| panic!("reload to grpc: {e}"));
    let (status, took) = run
        .wait_until("every backend up by gRPC", Duration::from_secs(15), |s| {
            s.all_up()
                && s.vip("api").is_some_and(|v| {
                    // A gRPC pass carries no HTTP status; an HTTP one does.
                    v.backends.iter().all(|b| {
                        b.last_probe
                            .as_ref()
                            .is_some_and(|pr| pr.ok && pr.status.is_none())
                    })
                })
        })
        .unwrap_or_else(|e| panic!("gRPC backends not up: {e}"));
    eprintln!("[{p}] every backend up by gRPC in {took:?}: {status:?}");
    (run, pids)
}

#[test]
fn grpc_probe_hung_not_serving_and_slow() {
    let _serial = serial();
    let p = prefix("h");
    let (run, pids) = grpc_lab(&p, "");
    let vip = api();
    let h = health("grpc");
    let bound = h.interval * h.fall + h.timeout + DETECTION_MARGIN;

    // Hung: SIGSTOP on b2's server.
    let b2 = vip.backend_addr(2);
    let stopped_at = now_unix_ms();
    signal(pids[1], Signal::SIGSTOP);
    let hard = h.interval * h.fall + h.hang_timeout.unwrap() + DETECTION_MARGIN;
    let waited = run.wait_until("b2 out", hard + Duration::from_secs(2), |s| {
        s.backend("api", b2).is_some_and(|b| !b.in_table)
    });
    // Then its probes reach hang_timeout: down, as hung.
    let down = waited
        .and_then(|_| run.wait_backend_state("api", b2, "down", hard + Duration::from_secs(2)));
    signal(pids[1], Signal::SIGCONT);
    let (status, _) = down.unwrap_or_else(|e| panic!("hung b2 not taken out and down: {e}"));
    let events = run.events().unwrap();
    let out = exit_of(&events, b2, stopped_at).unwrap_or_else(|| panic!("no exit: {events:#?}"));
    let detection = Duration::from_millis(out.at_unix_ms - stopped_at);
    eprintln!(
        "[{p}] hung b2 out in {detection:?} (bound {bound:?}): {} ({:?})",
        out.reason, out.to
    );
    assert!(
        detection <= bound,
        "hung b2 out after {detection:?}, bound {bound:?}"
    );
    // Out first as a slow outlier among answering peers (no answer within
    // `timeout`), then down on `no_response` at hang_timeout.
    assert!(
        out.reason.contains("no answer within"),
        "reason of a hang: {}",
        out.reason
    );
    let b = status.backend("api", b2).expect("b2");
    let probe = b.last_probe.as_ref().expect("a probe");
    eprintln!(
        "[{p}] hung b2 down: {:?} / last probe {} ({})",
        b.last_transition_reason, probe.reason, probe.code
    );
    assert_eq!(probe.code, "no_response", "{probe:?}");
    run.wait_backend_state("api", b2, "up", Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("b2 not back after SIGCONT: {e}"));

    // NOT_SERVING: SIGUSR1 flips b3's server.
    let b3 = vip.backend_addr(3);
    let flipped_at = now_unix_ms();
    signal(pids[2], Signal::SIGUSR1);
    run.wait_backend_state("api", b3, "down", bound + Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("NOT_SERVING b3 not down: {e}"));
    let events = run.events().unwrap();
    let out = exit_of(&events, b3, flipped_at).unwrap_or_else(|| panic!("no exit: {events:#?}"));
    eprintln!("[{p}] NOT_SERVING b3: {}", out.reason);
    assert!(out.reason.contains("NOT_SERVING"), "{}", out.reason);
    signal(pids[2], Signal::SIGUSR1);
    run.wait_backend_state("api", b3, "up", Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("b3 not back when SERVING: {e}"));

    // A slow fleet: every server stopped for 90 ms of every 150 ms. They
    // answer late but answer; cascade protection keeps them all in (one
    // slow backend among fast peers would be an outlier, ejected by
    // design: `cascade.rs`).
    let stop = Arc::new(AtomicBool::new(false));
    let slower = {
        let (stop, pids) = (stop.clone(), pids.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                pids.iter().for_each(|&pid| signal(pid, Signal::SIGSTOP));
                thread::sleep(Duration::from_millis(90));
                pids.iter().for_each(|&pid| signal(pid, Signal::SIGCONT));
                thread::sleep(Duration::from_millis(60));
            }
        })
    };
    let until = Instant::now() + Duration::from_secs(6);
    let (mut left, mut slow_seen) = (None, 0);
    while Instant::now() < until && left.is_none() {
        let s = run.status().unwrap();
        for b in &s.vip("api").expect("api").backends {
            slow_seen += usize::from(b.last_probe.as_ref().is_some_and(|pr| pr.code == "slow"));
            if !b.in_table {
                left = Some(b.clone());
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    slower.join().unwrap();
    pids.iter().for_each(|&pid| signal(pid, Signal::SIGCONT));
    assert!(left.is_none(), "a slow backend left the table: {left:?}");
    eprintln!("[{p}] slow fleet stayed in ({slow_seen} slow probes seen in status polls)");
    assert!(slow_seen > 0, "no probe was slow: did the slowdown take?");
    teardown(run);
}

/// `via = "vip"` (the probe goes to the VIP's address, steered to the
/// backend by `xlb_hc`) on kept HTTP/2 connections: every backend comes up
/// by gRPC, and one flipped to NOT_SERVING goes down and comes back.
#[test]
fn grpc_probe_via_vip_on_kept_connections() {
    let _serial = serial();
    let p = prefix("v");
    let (run, pids) = grpc_lab(&p, "via = \"vip\"\nreuse_connection = true\n");
    let b1 = api().backend_addr(1);
    signal(pids[0], Signal::SIGUSR1);
    let (status, took) = run
        .wait_backend_state("api", b1, "down", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("NOT_SERVING b1 not down via the VIP: {e}"));
    let reason = status
        .backend("api", b1)
        .and_then(|b| b.last_transition_reason.clone())
        .unwrap_or_default();
    eprintln!("[{p}] via VIP: NOT_SERVING b1 down in {took:?}: {reason}");
    assert!(reason.contains("NOT_SERVING"), "{reason}");
    signal(pids[0], Signal::SIGUSR1);
    run.wait_backend_state("api", b1, "up", Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("b1 not back via the VIP: {e}"));
    teardown(run);
}
