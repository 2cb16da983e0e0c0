//! Issue 28: the metrics listener of a real daemon in the namespaced lab,
//! with backends in several states (up, hung, failing a body check whose
//! text holds `<script>`, drained). Its `/metrics` goes through `promtool
//! check metrics` (Prometheus's own linter), and its status page (`GET /`)
//! is loaded by headless Chromium from the client's namespace: the DOM
//! after the page's script ran shows each backend's state and reason, the
//! `<script>` text as text and no script element but the page's own. A
//! screenshot is kept at `<target dir>/status-page.png`.
//!
//! Same rules as `e2e.rs`: its own lab (prefix `web…`) through `LabRun`,
//! whose Drop stops every process and removes the namespaces; Chromium runs
//! in its own process group with a throwaway profile, bounded and killed by
//! a guard; one lab at a time; every wait bounded.
//!
//! Needs root, `promtool` (Debian `prometheus`), `chromium` and the
//! binaries: `cargo build -p lb-user -p xlb-lab`, then
//! `cargo test -p xlb-tests --test status_page -- --nocapture`.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use xlb_lab::Fault;
use xlb_lab::scenario::{LabRun, Mode, RunOptions, Vip, XlbConfig};
use xlb_lab::topology::{self, in_netns};
use xlb_tests::lab::{serial, teardown, xlb_binary};

/// Where the daemon serves metrics and the page: the LB's own address on
/// the lab's link, so the client's namespace reaches it.
const METRICS_PORT: u16 = 9813;

/// What backend 3 of `api` must find in its health answer, which it never
/// does: the probe's reason quotes it.
const SCRIPT_TEXT: &str = "<script>alert(1)</script>";

/// Longest a Chromium run may take (it needs ~2 s; a loaded 2-CPU machine
/// more).
const CHROMIUM_TIMEOUT: Duration = Duration::from_secs(60);

const WAIT: Duration = Duration::from_secs(20);

fn metrics_addr() -> SocketAddr {
    SocketAddr::new(topology::LB_V4.into(), METRICS_PORT)
}

/// `api` (three backends, b3 checked for [`SCRIPT_TEXT`]) and `api2` (the
/// same three backends on another VIP), with the metrics listener on.
fn config_text(prefix: &str) -> (String, Vip, Vip) {
    let api = Vip::new("api", topology::VIP_V4.into(), 80, Mode::DsrIpip, 3);
    let api2 = Vip::new("api2", topology::VIP2_V4.into(), 80, Mode::DsrIpip, 3);
    let cfg = XlbConfig {
        vips: vec![api.clone(), api2.clone()],
        ..XlbConfig::for_prefix(prefix)
    };
    let text = cfg.render().replace(
        "metrics_address = \"\"",
        &format!("metrics_address = \"{}\"", metrics_addr()),
    );
    // The first backend table with b3's address is api's.
    let b3 = format!("\naddress = \"{}\"\n", api.backend_addr(3).ip());
    let at = text.find(&b3).expect("api's b3 in the configuration") + b3.len();
    let mut text = text;
    text.insert_str(
        at,
        &format!("\n[vip.backend.health_check]\nbody_contains = \"{SCRIPT_TEXT}\"\n"),
    );
    (text, api, api2)
}

/// `GET path` from the client's namespace: (status line, body).
fn get(run: &LabRun, path: &str) -> (String, String) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n");
    let got = in_netns(
        &run.lab().ns_client(),
        move || -> std::io::Result<Vec<u8>> {
            let mut s = TcpStream::connect_timeout(&metrics_addr(), Duration::from_secs(5))?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            s.write_all(request.as_bytes())?;
            let mut out = Vec::new();
            s.read_to_end(&mut out)?;
            Ok(out)
        },
    );
    let bytes = got
        .unwrap_or_else(|e| panic!("entering the client namespace: {e}"))
        .unwrap_or_else(|e| panic!("GET {path} from {}: {e}", metrics_addr()));
    let text = String::from_utf8(bytes).expect("UTF-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    (
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    )
}

/// Prometheus's linter on an exposition text: every problem it reports
/// fails the test.
fn promtool_check_metrics(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("promtool (Debian package prometheus, `cargo xtask setup`): {e}")
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics ({}):\n{said}",
        out.status
    );
}

/// A Chromium process group, killed (SIGKILL to the group) when dropped,
/// with its throwaway profile directory removed.
struct Chromium {
    child: Child,
    profile: PathBuf,
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Runs headless Chromium in the client's namespace on the status page with
/// `args` added; its stdout. The page's script gets 8 s of virtual time:
/// the first fetch of /status and at least two refreshes.
fn chromium(run: &LabRun, args: &[&str]) -> String {
    let profile = run
        .work_dir()
        .join(format!("chromium-{}", std::process::id()));
    let url = format!("http://{}/", metrics_addr());
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &run.lab().ns_client(), "chromium"])
        .args(["--headless", "--no-sandbox", "--disable-gpu"])
        .args(["--no-first-run", "--disable-extensions", "--disable-sync"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--virtual-time-budget=8000", "--window-size=1400,1000"])
        .args(args)
        .arg(&url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group: the guard kills the browser's helpers too.
        .process_group(0);
    let mut guard = Chromium {
        child: cmd
            .spawn()
            .unwrap_or_else(|e| panic!("chromium (Debian package chromium): {e}")),
        profile,
    };
    let mut stdout = guard.child.stdout.take().unwrap();
    let mut stderr = guard.child.stderr.take().unwrap();
    let out = thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + CHROMIUM_TIMEOUT;
    let status = loop {
        if let Some(status) = guard.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "chromium did not finish within {CHROMIUM_TIMEOUT:?}"
        );
        thread::sleep(Duration::from_millis(100));
    };
    drop(guard);
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    assert!(status.success(), "chromium {args:?}: {status}\n{err}");
    out
}

/// The cargo target directory this test was built in (`<target>/debug/deps/
/// status_page-…`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .expect("the test binary lives in <target>/<profile>/deps")
}

/// The `<tr class="backend" …>` element of `backend` in `vip` in the
/// dumped DOM.
fn backend_row<'a>(dom: &'a str, vip: &str, backend: SocketAddr) -> &'a str {
    let open = format!("<tr class=\"backend\" data-vip=\"{vip}\" data-backend=\"{backend}\"");
    let start = dom
        .find(&open)
        .unwrap_or_else(|| panic!("no row for {vip} {backend} in the rendered page:\n{dom}"));
    let len = dom[start..].find("</tr>").expect("a closed row");
    &dom[start..start + len]
}

#[test]
fn status_page_and_metrics_of_a_lab_daemon() {
    let _serial = serial();
    xlb_tests::require_root();
    let p = format!("web{}", std::process::id() % 1000);
    let (text, api, api2) = config_text(&p);
    let xlb = xlb_binary();
    let opts = RunOptions {
        start_daemon: false,
        ..RunOptions::new(&p, &xlb, &text)
    };
    let mut run = LabRun::up_with(opts).unwrap_or_else(|e| panic!("lab up: {e}"));
    run.start_daemon()
        .unwrap_or_else(|e| panic!("xlb run: {e}"));
    let (b1, b2, b3) = (
        api.backend_addr(1),
        api.backend_addr(2),
        api.backend_addr(3),
    );
    for (vip, b) in [("api", b1), ("api2", b1), ("api2", b3)] {
        run.wait_backend_state(vip, b, "up", WAIT)
            .unwrap_or_else(|e| panic!("{vip} {b} did not come up: {e}"));
    }
    run.set_fault(2, Fault::Hang)
        .unwrap_or_else(|e| panic!("hanging b2: {e}"));
    run.drain(&api2.name, api2.backend_addr(1))
        .unwrap_or_else(|e| panic!("draining api2 b1: {e}"));
    for (vip, b, state) in [
        ("api", b2, "down"),
        ("api", b3, "down"),
        ("api2", b1, "draining"),
    ] {
        run.wait_backend_state(vip, b, state, WAIT)
            .unwrap_or_else(|e| panic!("{vip} {b} did not become {state}: {e}"));
    }
    let status = run.status().unwrap();
    // The page's reason column: the policy's reason (for a down backend,
    // its failing probe's text), else a failing probe's.
    let reason = |vip: &str, b: SocketAddr| {
        let b = status.backend(vip, b).expect("backend in status");
        let failed = b.last_probe.as_ref().filter(|p| !p.ok);
        b.placement_reason
            .clone()
            .or_else(|| failed.map(|p| p.reason.clone()))
            .unwrap_or_default()
    };
    let (hung_reason, script_reason) = (reason("api", b2), reason("api", b3));
    eprintln!("[{p}] b2 hung: {hung_reason:?}; b3: {script_reason:?}");
    assert!(script_reason.contains(SCRIPT_TEXT), "{script_reason}");

    // /metrics: the failed probes are counted by code, at least `fall` (2)
    // of each down backend's. The metrics are the snapshot of the last 1 s
    // tick, which may not hold the probe that took a backend down yet:
    // scrape again until they do (bounded).
    let failures = |metrics: &str, b: SocketAddr, code: &str| -> Option<u64> {
        let prefix = format!(
            "xlb_backend_probe_failures_total{{vip=\"api\",backend=\"{b}\",code=\"{code}\"}} "
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|n| n.parse().unwrap())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let (line, metrics) = get(&run, "/metrics");
        assert_eq!(line, "HTTP/1.1 200 OK", "{metrics}");
        let counted = [(b2, "no_response"), (b3, "body_mismatch")]
            .map(|(b, code)| failures(&metrics, b, code).unwrap_or(0));
        if counted.iter().all(|&n| n >= 2) {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "failed probes counted {counted:?} (b2 no_response, b3 body_mismatch), want 2 each:\n{metrics}"
        );
        thread::sleep(Duration::from_millis(500));
    };
    // Prometheus's linter finds nothing in it.
    promtool_check_metrics(&metrics);

    // The page, after its script ran.
    let dom = chromium(&run, &["--dump-dom"]);
    let cases = [
        ("api", b1, "up", None),
        ("api", b2, "down", Some(hung_reason.as_str())),
        ("api", b3, "down", Some(script_reason.as_str())),
        ("api2", b1, "draining", None),
        ("api2", b3, "up", None),
    ];
    for (vip, b, state, reason) in cases {
        let row = backend_row(&dom, vip, b);
        assert!(
            row.contains(&format!("data-state=\"{state}\""))
                && row.contains(&format!("<span class=\"st st-{state}\">{state}</span>")),
            "{vip} {b} should show {state}: {row}"
        );
        if let Some(reason) = reason {
            // As the DOM serializer writes text: < > & escaped.
            let escaped = reason
                .replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;");
            assert!(
                row.contains(&format!("<td class=\"reason\">{escaped}</td>")),
                "{vip} {b}: reason {reason:?} not shown as text: {row}"
            );
        }
    }
    assert!(
        dom.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "the script text is shown as text"
    );
    assert_eq!(
        dom.matches("<script").count(),
        1,
        "only the page's own script element: {dom}"
    );
    for (vip, state) in [("api", "degraded"), ("api2", "degraded")] {
        let open = format!(
            "<section class=\"vip\" data-vip=\"{vip}\"><h2><span class=\"name\">{vip} </span><span class=\"st st-{state}\">{state}</span>"
        );
        assert!(dom.contains(&open), "{vip} should show {state}: {dom}");
    }
    assert!(
        dom.contains("class=\"event\"") || dom.contains("does not serve events"),
        "the events section was not rendered: {dom}"
    );
    assert!(
        dom.contains("<p id=\"updated\" class=\"meta\">updated "),
        "{dom}"
    );

    let shot = target_dir().join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    chromium(&run, &[&format!("--screenshot={}", shot.display())]);
    let png = std::fs::read(&shot).unwrap_or_else(|e| panic!("{}: {e}", shot.display()));
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "{}",
        shot.display()
    );
    eprintln!("[{p}] screenshot: {}", shot.display());
    teardown(run);
}
