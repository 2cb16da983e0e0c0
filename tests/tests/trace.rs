//! `xlb trace` against real traffic in the lab: a trace filtered to the
//! client and the VIP shows the client's connection (its SYN picked from the
//! table, then conntrack hits, all to the backend that answered it, as the
//! backend's own `X-Backend` says), exits after `--count`, and turns
//! tracing off; a second trace while one runs is refused, naming the first;
//! a trace killed with SIGKILL does not block the next one, and a trace
//! keeps tracing across a daemon restart (which clears the flag; the
//! trace's next refresh sets it again).
//!
//! Needs root and the binaries, like `e2e.rs`:
//! `cargo test -p xlb-tests --test trace -- --nocapture`.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::Path,
    process::{Child, Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use aya::maps::{Array, Map, MapData};
use lb_common::trace::{MAP_TRACE_CONFIG, PIN_TRACE_ON, TraceConfig};
use xlb_lab::{
    scenario::{Health, LabRun, Mode, Vip, XlbConfig},
    topology,
};
use xlb_tests::lab::{serial, teardown, up};

/// A child process killed and reaped however the test ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The trace configuration pinned for the lab's instance.
fn trace_config(run: &LabRun) -> TraceConfig {
    let pin = Path::new(lb_user::daemon::persist::PIN_ROOT)
        .join(run.instance())
        .join(MAP_TRACE_CONFIG);
    let data = MapData::from_pin(&pin).expect("the trace configuration pin");
    let map: Array<MapData, TraceConfig> = Map::Array(data).try_into().unwrap();
    map.get(&0, 0).unwrap()
}

/// The trace flag pinned for the lab's instance.
fn trace_flag(run: &LabRun) -> bool {
    let pin = Path::new(lb_user::daemon::persist::PIN_ROOT)
        .join(run.instance())
        .join(PIN_TRACE_ON);
    let data = MapData::from_pin(&pin).expect("the trace flag pin");
    let map: Array<MapData, u32> = Map::Array(data).try_into().unwrap();
    map.get(&0, 0).unwrap() != 0
}

/// Waits up to 5 s for a trace to be on (`until_ns` set by `pid`, the
/// flag set).
fn wait_tracing(run: &LabRun, pid: u32) {
    let t = Instant::now();
    while trace_config(run).owner_pid != pid || trace_config(run).until_ns == 0 || !trace_flag(run)
    {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "xlb trace {pid} never turned tracing on"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// `xlb trace ARGS --instance <lab's>`, its output piped.
fn trace(run: &LabRun, args: &[&str]) -> Reaped {
    let child = Command::new(run.xlb_path())
        .arg("trace")
        .args(args)
        .args(["--instance", run.instance()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning xlb trace");
    Reaped(child)
}

/// Waits up to `limit` for `child` to exit; its output. Fails, with what
/// it printed, if it is still running then.
fn finish(mut child: Reaped, limit: Duration) -> Output {
    let t = Instant::now();
    let mut late = false;
    while child.0.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            late = true;
            let _ = child.0.kill();
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let mut out = Output {
        status: child.0.wait().unwrap(),
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut out.stdout)
        .unwrap();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut out.stderr)
        .unwrap();
    assert!(
        !late,
        "xlb trace still running after {limit:?}; it printed {:?} and {:?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// One HTTP GET from the client to the VIP; the `X-Backend` that answered.
fn get(run: &LabRun) -> String {
    let to = SocketAddr::from((topology::VIP_V4, 80));
    let resp = topology::in_netns(&run.lab().ns_client(), || -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        s.write_all(b"GET / HTTP/1.1\r\nHost: vip\r\nConnection: close\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text)
    })
    .unwrap()
    .expect("an answer from the VIP");
    resp.lines()
        .find_map(|l| l.strip_prefix("X-Backend: "))
        .unwrap_or_else(|| panic!("no X-Backend in {resp:?}"))
        .trim()
        .to_owned()
}

fn lab_up(prefix: &str) -> LabRun {
    let cfg = XlbConfig {
        health: Health::default(),
        vips: vec![Vip::new(
            "api",
            topology::VIP_V4.into(),
            80,
            Mode::DsrIpip,
            3,
        )],
        ..XlbConfig::for_prefix(prefix)
    };
    up(prefix, &cfg)
}

#[test]
fn trace_shows_a_connection_and_stops_after_its_count() {
    let _serial = serial();
    let p = format!("tr{}", std::process::id() % 1000);
    let mut run = lab_up(&p);
    let client = topology::CLIENT_V4.to_string();
    let vip = format!("{}:80", topology::VIP_V4);

    let first = trace(
        &run,
        &[
            "--vip",
            &vip,
            "--source",
            &client,
            "--verdict",
            "tx",
            "--count",
            "3",
            "--json",
        ],
    );
    let first_pid = first.0.id();
    wait_tracing(&run, first_pid);

    let second = finish(trace(&run, &["--count", "1"]), Duration::from_secs(5));
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "a second trace ran: {err}");
    assert!(
        err.contains(&format!("another xlb trace (pid {first_pid})")),
        "the refusal names the running trace: {err}"
    );

    let answered_by = get(&run);
    let out = finish(first, Duration::from_secs(10));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    eprintln!("[{p}] answered by {answered_by}; traced: {lines:#?}");
    assert_eq!(lines.len(), 3, "--count 3");
    let i: usize = answered_by.trim_start_matches('b').parse().unwrap();
    let backend = run.lab().backend_v4(i).to_string();
    for (n, l) in lines.iter().enumerate() {
        assert_eq!(l["verdict"], "tx", "line {n}");
        assert_eq!(l["reason"], "fwd_tx", "line {n}");
        assert_eq!(l["proto"], "tcp", "line {n}");
        assert_eq!(l["src"], client.as_str(), "line {n}");
        assert_eq!(l["dst"], topology::VIP_V4.to_string(), "line {n}");
        assert_eq!(l["dport"], 80, "line {n}");
        assert_eq!(l["sport"], lines[0]["sport"], "line {n}: one connection");
        assert_eq!(
            l["backend"],
            backend.as_str(),
            "line {n}: the backend that answered"
        );
    }
    assert_eq!(lines[0]["tcp"], "S", "the connection's SYN first");
    assert_eq!(lines[0]["flags"], serde_json::json!(["picked"]));
    assert_eq!(
        lines[1]["flags"],
        serde_json::json!(["ct"]),
        "then conntrack hits"
    );
    assert_eq!(trace_config(&run).until_ns, 0, "tracing off after --count");
    assert!(!trace_flag(&run), "the flag cleared after --count");

    // SIGKILL: no Drop runs, tracing stays on until its expiry; the next
    // trace is not refused (its owner is gone) and takes over.
    let killed = trace(&run, &[]);
    let killed_pid = killed.0.id();
    wait_tracing(&run, killed_pid);
    drop(killed);
    assert!(
        trace_config(&run).until_ns != 0,
        "a killed trace leaves its until_ns"
    );
    let next = trace(&run, &["--count", "1", "--verdict", "tx"]);
    let next_pid = next.0.id();
    wait_tracing(&run, next_pid);
    // A restart loads the object again, which writes the flag's initial
    // value (off) into its pin; the trace's next refresh sets it again.
    run.restart_daemon().expect("restarting the daemon");
    wait_tracing(&run, next_pid);
    get(&run);
    let out = finish(next, Duration::from_secs(10));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
    teardown(run);
}
