//! End to end, send/expect probes against real servers (none written here):
//!
//! - `redis_hang_is_caught_by_send_expect_not_by_tcp`: three `redis-server`
//!   backends behind two VIPs on port 6379: `redis` checked with
//!   `kind = "tcp"`, `send = "PING\r\n"`, `expect_prefix = "+PONG"` through
//!   the data path (`via = "vip"`), `plain` with a bare `kind = "tcp"`. All
//!   come up. One redis is stopped with SIGSTOP (its kernel still completes
//!   handshakes on 6379): `redis` takes it out within `fall` periods plus
//!   `hang_timeout` (+ margin) with reason `no_data`, while `plain` keeps it
//!   up all along: the incident of issue 25. SIGCONT brings it back. Then
//!   the whole fleet is made slow (each redis stopped 60 % of every 200 ms
//!   cycle, so answers come late but come): no backend goes down.
//! - `dnsmasq_hang_is_caught_by_udp_send_expect`: three `dnsmasq` servers
//!   behind a UDP VIP on port 53, checked with `kind = "udp"`, a raw DNS
//!   query as `send_hex` and `expect_regex` on the answer's id, flags and
//!   address, once directly (`via = "direct"`) and once through the data
//!   path (`via = "vip"`). One stopped with SIGSTOP is taken out with
//!   `no_answer`; SIGCONT brings it back.
//!
//! Servers run in the backend namespaces, started by the lab (`LabRun::
//! spawn_in`: stopped at teardown) with their files in the lab's work
//! directory; a guard sends SIGCONT to every stopped one however the test
//! ends. One lab at a time; every wait is bounded.
//!
//! Needs root, redis-server and dnsmasq (`cargo xtask setup`) and the
//! binaries: `cargo build -p lb-user -p xlb-lab`, then
//! `cargo test -p xlb-tests --test probe_expect -- --nocapture --test-threads=1`.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use xlb_lab::{
    scenario::{Event, Health, LabRun, Mode, Protocol, RunOptions, Vip, XlbConfig},
    topology,
};
use xlb_tests::lab::{DETECTION_MARGIN, serial, teardown, transitions, xlb_binary};

const REDIS_PORT: u16 = 6379;
const DNS_PORT: u16 = 53;

fn prefix(tag: &str) -> String {
    format!("pex{tag}{}", std::process::id() % 1000)
}

/// Fast probes: 500 ms apart, 100 ms to answer, 1 s before an answer
/// counts as missing (a slow answer lies between the two).
fn health() -> Health {
    Health {
        kind: "tcp".to_string(),
        interval: Duration::from_millis(500),
        timeout: Duration::from_millis(100),
        rise: 2,
        fall: 2,
        hang_timeout: Some(Duration::from_secs(1)),
        xlb_defaults: false,
    }
}

/// The worst detection time of a hang: `fall` periods (jitter is 0 in lab
/// configurations), then the last probe's `hang_timeout`, plus the margin.
fn hang_bound(h: &Health) -> Duration {
    h.interval * h.fall + h.hang_timeout.unwrap_or(h.timeout) + DETECTION_MARGIN
}

/// `text` with `table` (a `[vip.health_check]`) added to VIP `name`.
fn with_vip_check(text: &str, name: &str, table: &str) -> String {
    let at = text
        .find(&format!("name = \"{name}\""))
        .and_then(|i| text[i..].find("\n[[vip.backend]]").map(|j| i + j))
        .unwrap_or_else(|| panic!("no VIP {name} with backends in:\n{text}"));
    let mut out = text.to_string();
    out.insert_str(at, &format!("\n[vip.health_check]\n{table}\n"));
    out
}

/// The lab without the daemon, for servers to start before it probes.
fn lab(prefix: &str, config: &str) -> LabRun {
    xlb_tests::require_root();
    let opts = RunOptions {
        start_daemon: false,
        ..RunOptions::new(prefix, &xlb_binary(), config)
    };
    LabRun::up_with(opts).unwrap_or_else(|e| panic!("lab up: {e}"))
}

/// Starts the daemon and waits for every backend.
fn start(run: &mut LabRun) {
    run.start_daemon()
        .unwrap_or_else(|e| panic!("xlb run: {e}"));
    run.wait_all_up(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("backends did not come up: {e}"));
}

/// Sends SIGCONT to every server it holds when dropped, so that a test
/// failing while one is stopped leaves none stopped (the lab's teardown
/// then stops them).
struct Stopped(Vec<u32>);

impl Drop for Stopped {
    fn drop(&mut self) {
        for &pid in &self.0 {
            signal(pid, Signal::SIGCONT);
        }
    }
}

fn signal(pid: u32, sig: Signal) {
    let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), sig);
}

/// Makes `pids` slow, not hung, until dropped: each stopped for `stopped`
/// of every `cycle`.
struct Slowdown {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
    pids: Vec<u32>,
}

impl Slowdown {
    fn start(pids: Vec<u32>, cycle: Duration, stopped: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = thread::spawn({
            let (stop, pids) = (stop.clone(), pids.clone());
            move || {
                while !stop.load(Ordering::Relaxed) {
                    pids.iter().for_each(|&p| signal(p, Signal::SIGSTOP));
                    thread::sleep(stopped);
                    pids.iter().for_each(|&p| signal(p, Signal::SIGCONT));
                    thread::sleep(cycle - stopped);
                }
            }
        });
        Self {
            stop,
            thread: Some(thread),
            pids,
        }
    }
}

impl Drop for Slowdown {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for &p in &self.pids {
            signal(p, Signal::SIGCONT);
        }
    }
}

/// The down event of `backend` in `vip` after `since_ms`.
fn down_event<'a>(events: &'a [Event], vip: &str, backend: SocketAddr, since_ms: u64) -> &'a Event {
    transitions(events, vip, backend)
        .into_iter()
        .rfind(|e| e.to.as_deref() == Some("down") && e.at_unix_ms >= since_ms)
        .unwrap_or_else(|| panic!("no down event of {vip} {backend}: {events:?}"))
}

fn spawn_redis(run: &mut LabRun, i: usize) -> u32 {
    let ns = run.lab().ns_backend(i);
    let dir = run.work_dir().join(format!("redis-b{i}"));
    std::fs::create_dir_all(&dir).unwrap();
    let args: Vec<String> = [
        "--port",
        &REDIS_PORT.to_string(),
        // Its own address for direct probes, the VIPs (on the backend's
        // `lo`) for the data path.
        "--bind",
        &topology::backend_v4(i).to_string(),
        &topology::VIP_V4.to_string(),
        &topology::VIP2_V4.to_string(),
        "--protected-mode",
        "no",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--dir",
        &dir.display().to_string(),
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    run.spawn_in(
        &format!("redis-b{i}"),
        &ns,
        Path::new("/usr/bin/redis-server"),
        &args,
    )
    .unwrap_or_else(|e| panic!("redis-server in {ns}: {e}"))
}

#[test]
fn redis_hang_is_caught_by_send_expect_not_by_tcp() {
    let _serial = serial();
    let p = prefix("r");
    // A 50 ms timeout: the slowdown below makes a third of the answers
    // later than that.
    let h = Health {
        timeout: Duration::from_millis(50),
        ..health()
    };
    let vip = |name: &str, address: IpAddr| Vip::new(name, address, REDIS_PORT, Mode::DsrIpip, 3);
    let (redis, plain) = (
        vip("redis", topology::VIP_V4.into()),
        vip("plain", topology::VIP2_V4.into()),
    );
    let config = XlbConfig {
        health: h.clone(),
        vips: vec![redis.clone(), plain.clone()],
        ..XlbConfig::for_prefix(&p)
    };
    let text = with_vip_check(
        &config.render(),
        "redis",
        "send = 'PING\\r\\n'\nexpect_prefix = '+PONG'\nvia = \"vip\"",
    );
    let mut run = lab(&p, &text);
    let pids: Vec<u32> = (1..=3).map(|i| spawn_redis(&mut run, i)).collect();
    start(&mut run);

    // b2's redis hangs.
    let b2 = redis.backend_addr(2);
    let _guard = Stopped(pids.clone());
    let hung_at = xlb_tests::lab::now_unix_ms();
    signal(pids[1], Signal::SIGSTOP);
    let bound = hang_bound(&h);
    run.wait_backend_state("redis", b2, "down", bound + Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("the hung redis stayed in: {e}"));
    let events = run.events().unwrap();
    let down = down_event(&events, "redis", b2, hung_at);
    let detection = Duration::from_millis(down.at_unix_ms.saturating_sub(hung_at));
    eprintln!("[{p}] hung redis down after {detection:?}: {}", down.reason);
    assert!(
        detection <= bound,
        "down after {detection:?}, bound {bound:?}"
    );
    let status = run.status().unwrap();
    let probe = status
        .backend("redis", b2)
        .and_then(|b| b.last_probe.clone())
        .expect("a last probe");
    assert_eq!(probe.code, "no_data", "{probe:?}");
    assert!(
        probe.reason.starts_with("connected, no data within 1s"),
        "{probe:?}"
    );
    // The plain TCP check never noticed: the incident.
    let plain_b2 = status
        .backend("plain", plain.backend_addr(2))
        .expect("plain b2");
    assert_eq!(plain_b2.state, "up", "{plain_b2:?}");
    assert!(
        transitions(&events, "plain", plain.backend_addr(2))
            .iter()
            .all(|e| e.at_unix_ms < hung_at),
        "the plain TCP check changed state: {events:?}"
    );

    signal(pids[1], Signal::SIGCONT);
    let back = h.interval * h.rise + h.timeout + DETECTION_MARGIN;
    run.wait_backend_state("redis", b2, "up", back + Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("redis did not come back: {e}"));

    // The whole fleet slow, not hung: stopped 120 ms of every 200 ms, so
    // answers come up to 120 ms late (past the 50 ms timeout for a probe
    // that arrives early in a stop, well within hang_timeout). Cascade
    // protection keeps every backend in.
    let slow_at = xlb_tests::lab::now_unix_ms();
    let slow = Slowdown::start(
        pids.clone(),
        Duration::from_millis(200),
        Duration::from_millis(120),
    );
    let mut slowest = 0.0f64;
    let mut codes = std::collections::BTreeSet::new();
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        let status = run.status().unwrap();
        for b in &status.vip("redis").expect("redis VIP").backends {
            if let Some(probe) = &b.last_probe {
                slowest = slowest.max(probe.latency_ms);
                codes.insert(probe.code.clone());
            }
            assert_eq!(b.state, "up", "a slow backend went out: {b:?}");
        }
        thread::sleep(Duration::from_millis(100));
    }
    drop(slow);
    let events = run.events().unwrap();
    for i in 1..=3 {
        let moved: Vec<_> = transitions(&events, "redis", redis.backend_addr(i))
            .into_iter()
            .filter(|e| e.at_unix_ms >= slow_at)
            .collect();
        assert!(moved.is_empty(), "slow b{i} changed state: {moved:?}");
    }
    eprintln!("[{p}] slow fleet: slowest probe {slowest:.0} ms, codes {codes:?}");
    // The slowdown did make answers late, or the test proves nothing.
    assert!(
        slowest > h.timeout.as_secs_f64() * 1000.0,
        "no probe slower than the timeout: {slowest} ms"
    );
    assert!(
        codes
            .iter()
            .all(|c| ["ok", "slow", "late"].contains(&c.as_str())),
        "a probe of the slow fleet failed: {codes:?}"
    );
    drop(_guard);
    teardown(run);
}

/// A DNS query for `probe.lab` A with id 0x1234 (RD set).
const QUERY_HEX: &str = "1234 0100 0001 0000 0000 0000 05 70726f6265 03 6c6162 00 0001 0001";
/// The answer to it: same id, QR set, no error (RA set or not), and the
/// address 10.9.9.9 somewhere after.
const ANSWER_REGEX: &str = r"(?s)^\x12\x34[\x80-\xff][\x00\x80].*\x0a\x09\x09\x09";

fn spawn_dnsmasq(run: &mut LabRun, i: usize) -> u32 {
    let ns = run.lab().ns_backend(i);
    let args: Vec<String> = vec![
        "--keep-in-foreground".into(),
        "--conf-file=/dev/null".into(),
        "--no-resolv".into(),
        "--no-hosts".into(),
        "--pid-file=".into(),
        "--user=root".into(),
        format!("--port={DNS_PORT}"),
        "--bind-interfaces".into(),
        format!(
            "--listen-address={},{}",
            topology::backend_v4(i),
            topology::VIP_V4
        ),
        "--address=/probe.lab/10.9.9.9".into(),
    ];
    run.spawn_in(
        &format!("dnsmasq-b{i}"),
        &ns,
        Path::new("/usr/sbin/dnsmasq"),
        &args,
    )
    .unwrap_or_else(|e| panic!("dnsmasq in {ns}: {e}"))
}

#[test]
fn dnsmasq_hang_is_caught_by_udp_send_expect() {
    dnsmasq_case("d", "direct");
}

/// The same through the data path: the probe's datagrams are marked and
/// sent to each backend by `xlb_hc`, encapsulated as clients' are.
#[test]
fn dnsmasq_hang_is_caught_by_udp_send_expect_via_vip() {
    dnsmasq_case("v", "vip");
}

fn dnsmasq_case(tag: &str, via: &str) {
    let _serial = serial();
    let p = prefix(tag);
    // kind = "udp" in the VIP's table: the daemon-wide one, checked on
    // its own, stays "tcp" (a UDP check there would need a send too).
    let h = health();
    let dns = Vip {
        protocol: Protocol::Udp,
        ..Vip::new("dns", topology::VIP_V4.into(), DNS_PORT, Mode::DsrIpip, 3)
    };
    let config = XlbConfig {
        health: h.clone(),
        vips: vec![dns.clone()],
        ..XlbConfig::for_prefix(&p)
    };
    let text = with_vip_check(
        &config.render(),
        "dns",
        &format!(
            "kind = \"udp\"\nsend_hex = \"{QUERY_HEX}\"\nexpect_regex = '{ANSWER_REGEX}'\nvia = \"{via}\""
        ),
    );
    let mut run = lab(&p, &text);
    let pids: Vec<u32> = (1..=3).map(|i| spawn_dnsmasq(&mut run, i)).collect();
    start(&mut run);

    let b1 = dns.backend_addr(1);
    let _guard = Stopped(pids.clone());
    let hung_at = xlb_tests::lab::now_unix_ms();
    signal(pids[0], Signal::SIGSTOP);
    let bound = hang_bound(&h);
    let t0 = Instant::now();
    run.wait_backend_state("dns", b1, "down", bound + Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("the hung dnsmasq stayed in: {e}"));
    let events = run.events().unwrap();
    let down = down_event(&events, "dns", b1, hung_at);
    let detection = Duration::from_millis(down.at_unix_ms.saturating_sub(hung_at));
    eprintln!(
        "[{p}] hung dnsmasq down after {detection:?} (seen in {:?}): {}",
        t0.elapsed(),
        down.reason
    );
    assert!(
        detection <= bound,
        "down after {detection:?}, bound {bound:?}"
    );
    let status = run.status().unwrap();
    let probe = status
        .backend("dns", b1)
        .and_then(|b| b.last_probe.clone())
        .expect("a last probe");
    assert_eq!(probe.code, "no_answer", "{probe:?}");
    for i in [2, 3] {
        let s = status.backend("dns", dns.backend_addr(i)).expect("backend");
        assert_eq!(s.state, "up", "b{i}: {s:?}");
    }

    signal(pids[0], Signal::SIGCONT);
    let back = h.interval * h.rise + h.timeout + DETECTION_MARGIN;
    run.wait_backend_state("dns", b1, "up", back + Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("dnsmasq did not come back: {e}"));
    drop(_guard);
    teardown(run);
}
