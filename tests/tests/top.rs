//! End to end, `xlb top` in a real terminal: `tmux` (a private server on a
//! socket of its own, a detached session of a fixed size, killed by a Drop
//! guard) runs a shell in which the test types `xlb top` against a daemon
//! in the lab, and reads the screen with `tmux capture-pane`.
//!
//! - `top_follows_the_lab_and_gives_the_terminal_back`: the VIP and its
//!   three backends appear `up`; a hung backend appears `down` with the
//!   reason the daemon gives; `s` sorts by state; `q` ends it with status 0,
//!   off the alternate screen, cursor shown, the terminal back in cooked
//!   mode. `xlb status --watch` into a pipe prints frame after frame with
//!   no control codes. Then a second `xlb top` sees the daemon killed: it
//!   says so while it waits, then exits with status 1 and the message, the
//!   terminal restored.
//!
//! - `top_and_watch_say_what_is_wrong_at_once`: `xlb top` into a pipe
//!   refuses and points to `status --watch`; both, given a socket no
//!   daemon listens on, exit 1 at once saying so (no 5 s wait: it never
//!   answered). No lab, no root.
//!
//! Needs root, tmux (`cargo xtask setup`) and the binaries:
//! `cargo build -p lb-user -p xlb-lab`, then
//! `cargo test -p xlb-tests --test top -- --nocapture`.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use xlb_lab::{
    Fault,
    scenario::{Health, Mode, Vip, XlbConfig},
    topology,
};
use xlb_tests::lab::{serial, steady, teardown, up};

/// The terminal's size: the README's capture is taken at this size.
const COLS: u16 = 120;
const ROWS: u16 = 24;

/// How often the screen is read while waiting.
const POLL: Duration = Duration::from_millis(200);

fn prefix(tag: &str) -> String {
    format!("top{tag}{}", std::process::id() % 1000)
}

/// A tmux server of our own (`tmux -S PATH`, a socket in the temporary
/// directory), with one session running `sh` in a `COLS`×`ROWS` window;
/// the server is killed and its socket removed when dropped.
struct Tmux {
    socket: std::path::PathBuf,
}

impl Tmux {
    fn start(name: &str) -> Tmux {
        let tmux = Tmux {
            socket: std::env::temp_dir().join(format!("xlb-tmux-{name}-{}", std::process::id())),
        };
        // `-f /dev/null`: no user configuration changes what we read.
        tmux.run(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            &COLS.to_string(),
            "-y",
            &ROWS.to_string(),
            "sh",
        ]);
        let size = tmux.display("#{window_width}x#{window_height}");
        assert_eq!(size, format!("{COLS}x{ROWS}"), "the session's size");
        tmux
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("tmux {args:?}: {e}; install it (cargo xtask setup)"));
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `line` and Enter into the shell.
    fn type_line(&self, line: &str) {
        self.run(&["send-keys", "-t", "top", "-l", line]);
        self.run(&["send-keys", "-t", "top", "Enter"]);
    }

    fn key(&self, key: &str) {
        self.run(&["send-keys", "-t", "top", key]);
    }

    /// The screen as text, wrapped lines joined.
    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-J", "-t", "top"])
    }

    /// A tmux format about the pane, e.g. `#{alternate_on}`.
    fn display(&self, format: &str) -> String {
        self.run(&["display-message", "-p", "-t", "top", format])
            .trim()
            .to_owned()
    }

    /// Reads the screen until `done` holds, for at most `timeout`.
    fn wait_for(&self, what: &str, timeout: Duration, done: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            assert!(
                start.elapsed() < timeout,
                "{what}: not on the screen after {timeout:?}:\n{screen}"
            );
            thread::sleep(POLL);
        }
    }

    /// Asserts that the terminal is back: normal screen, cursor shown.
    fn assert_restored(&self) {
        assert_eq!(
            self.display("#{alternate_on}"),
            "0",
            "left the alternate screen"
        );
        assert_eq!(self.display("#{cursor_flag}"), "1", "cursor shown");
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        // Ends every process of the session (xlb top, the shell) with it.
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// The screen line showing backend `addr`, or "".
fn row<'a>(screen: &'a str, addr: &str) -> &'a str {
    screen
        .lines()
        .find(|l| l.contains(&format!(" {addr} ")))
        .unwrap_or("")
}

/// Words `range` of `line`, split at spaces.
fn words(line: &str, range: std::ops::Range<usize>) -> Vec<&str> {
    let w: Vec<&str> = line.split_whitespace().collect();
    w.get(range).map(<[&str]>::to_vec).unwrap_or_default()
}

/// A rate as top prints it (`0.4`, `35`, `1.2k`, `3.4M`); 0 for `-`.
fn rate_value(text: &str) -> f64 {
    let (num, scale) = match text.strip_suffix('k') {
        Some(n) => (n, 1e3),
        None => match text.strip_suffix('M') {
            Some(n) => (n, 1e6),
            None => (text, 1.0),
        },
    };
    num.parse::<f64>().map_or(0.0, |n| n * scale)
}

fn has_state(row: &str, state: &str) -> bool {
    row.split_whitespace().any(|w| w == state)
}

fn api() -> Vip {
    Vip::new("api", topology::VIP_V4.into(), 80, Mode::DsrIpip, 3)
}

#[test]
fn top_follows_the_lab_and_gives_the_terminal_back() {
    let _serial = serial();
    let p = prefix("live");
    let vip = api();
    let config = XlbConfig {
        health: Health::default(),
        vips: vec![vip.clone()],
        ..XlbConfig::for_prefix(&p)
    };
    let mut run = up(&p, &config);
    let tmux = Tmux::start(&p);
    let top = format!(
        "{} top --socket {}; echo top-exit=$?",
        run.xlb_path().display(),
        run.socket().display()
    );
    let backends: Vec<String> = (1..=3).map(|i| vip.backend_addr(i).to_string()).collect();
    // Traffic, so that the rates have something to show.
    let client = run
        .start_client(steady(vip.target(), Duration::from_secs(8)))
        .unwrap();
    let t0 = Instant::now();
    tmux.type_line(&top);
    let screen = tmux.wait_for(
        "the VIP and every backend up",
        Duration::from_secs(10),
        |s| s.contains("10.100.0.1:80/tcp") && backends.iter().all(|b| has_state(row(s, b), "up")),
    );
    eprintln!(
        "[{p}] top shows every backend up after {:?}:\n{screen}",
        t0.elapsed()
    );
    for heading in [
        "VIPs",
        "Backends (sorted by config)",
        "Events",
        "REASON",
        "LATENCY",
    ] {
        assert!(screen.contains(heading), "{heading:?} in\n{screen}");
    }
    // Rates from two snapshots, while the client runs: packets and new
    // flows per second on the VIP and on a backend.
    let screen = tmux.wait_for("rates under load", Duration::from_secs(5), |s| {
        let vip_row = s
            .lines()
            .find(|l| l.contains("10.100.0.1:80/tcp"))
            .unwrap_or("");
        // `│api 10.100.0.1:80/tcp dsr-ipip 3/3 up PKT/S NEW/S FLOWS`
        let vip_rates = words(vip_row, 5..7);
        // `│api 10.99.0.11:80 up FOR LATENCY NEW/S PKT/S FLOWS`
        let b1_rates = words(row(s, &backends[0]), 5..7);
        vip_rates.len() == 2
            && b1_rates.len() == 2
            && vip_rates
                .iter()
                .chain(&b1_rates)
                .all(|w| rate_value(w) > 0.0)
    });
    eprintln!("[{p}] rates under load:\n{screen}");
    let vip_row = screen
        .lines()
        .find(|l| l.contains("10.100.0.1:80/tcp"))
        .unwrap_or("");
    let new_per_sec = rate_value(words(vip_row, 6..7)[0]);
    // The client opens 100 connections a second (and keeps 6 open): a
    // rate off by a factor (a wrong unit, a wrong interval) shows here.
    assert!(
        (20.0..=250.0).contains(&new_per_sec),
        "top shows {new_per_sec} new flows/s for a client opening 100/s:\n{vip_row}"
    );

    // A hung backend: down, with the reason the daemon gives.
    let b2 = vip.backend_addr(2);
    run.set_fault(2, Fault::Hang).unwrap();
    let (status, _) = run
        .wait_backend_state("api", b2, "down", Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("b2 was not marked down: {e}"));
    let b2s = status.backend("api", b2).unwrap();
    let reason = b2s
        .last_probe
        .as_ref()
        .filter(|p| !p.ok)
        .map(|p| p.reason.clone())
        .or_else(|| b2s.last_transition_reason.clone())
        .expect("a down backend has a reason");
    // The column may cut a long reason: its start is enough.
    let start: String = reason.chars().take(24).collect();
    let b2 = b2.to_string();
    let screen = tmux.wait_for("b2 down with its reason", Duration::from_secs(5), |s| {
        let r = row(s, &b2);
        has_state(r, "down") && r.contains(&start)
    });
    eprintln!("[{p}] b2 hung; the daemon says {reason:?}; top shows:\n{screen}");
    // From `up`, or from a placement on the way (`ejected_slow`).
    assert!(
        screen
            .lines()
            .any(|l| l.contains(&format!("transition api {b2} ")) && l.contains("→down: ")),
        "the transition among the events:\n{screen}"
    );

    // `s`: sorted by state, the down backend first.
    tmux.key("s");
    let screen = tmux.wait_for("sorted by state", Duration::from_secs(3), |s| {
        s.contains("Backends (sorted by STATE)")
    });
    let first = screen
        .lines()
        .find(|l| backends.iter().any(|b| l.contains(&format!(" {b} "))))
        .unwrap_or_default();
    assert!(first.contains(&b2), "down first:\n{screen}");

    // `q`: exit 0, the terminal as it was.
    tmux.key("q");
    tmux.wait_for("top's exit status", Duration::from_secs(3), |s| {
        s.contains("top-exit=0")
    });
    tmux.assert_restored();
    let stty = run.work_dir().join("stty.txt");
    tmux.type_line(&format!("stty -a > {}", stty.display()));
    let modes = wait_file(&stty, Duration::from_secs(3));
    let words: Vec<&str> = modes.split([' ', ';', '\n']).collect();
    for mode in ["icanon", "echo", "isig"] {
        assert!(words.contains(&mode), "{mode} back on after top: {modes}");
    }

    let report = client.join().unwrap();
    eprintln!(
        "[{p}] the client: {} requests in {} ms, {} ok",
        report.summary.requests, report.duration_ms, report.summary.counts.ok
    );
    status_watch_prints_frames(run.xlb_path(), run.socket());

    // The daemon goes away under a running top.
    tmux.type_line(&top);
    tmux.wait_for("top again", Duration::from_secs(5), |s| {
        has_state(row(s, &backends[0]), "up")
    });
    let killed = Instant::now();
    run.kill9_daemon().unwrap();
    tmux.wait_for("the wait for the daemon", Duration::from_secs(4), |s| {
        s.contains("no answer from the daemon for")
    });
    let screen = tmux.wait_for(
        "top's exit after the daemon died",
        Duration::from_secs(10),
        |s| s.contains("top-exit=1"),
    );
    eprintln!(
        "[{p}] daemon killed; top exited after {:?}:\n{screen}",
        killed.elapsed()
    );
    assert!(
        screen.contains(
            "xlb: the daemon stopped answering (nothing for 5s): no xlb daemon listening on"
        ),
        "{screen}"
    );
    tmux.assert_restored();
    drop(tmux);
    teardown(run);
}

#[test]
fn top_and_watch_say_what_is_wrong_at_once() {
    let xlb = xlb_tests::lab::xlb_binary();
    let socket = std::env::temp_dir().join(format!("xlb-top-test-{}.sock", std::process::id()));
    let cases: [(&str, Vec<&str>, &str); 3] = [
        (
            "top into a pipe",
            vec!["top"],
            "xlb: xlb top draws on a terminal and stdout is not one; use `xlb status --watch` \
             for a refreshing plain table, or `xlb status --json`",
        ),
        (
            "status --watch, nobody listening",
            vec!["status", "--watch"],
            "is `xlb run` running?",
        ),
        (
            "status --watch, bad interval",
            vec!["status", "--watch", "--interval", "5ms"],
            "use 100ms or more",
        ),
    ];
    for (name, args, want) in cases {
        let start = Instant::now();
        let out = Command::new(&xlb)
            .args(&args)
            .arg("--socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: exit status {}", out.status);
        assert!(stderr.contains(want), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}: nothing on stdout");
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{name}: said at once, not after {:?}",
            start.elapsed()
        );
    }
}

/// `xlb status --watch` into a pipe: three frames, each with the status,
/// no control codes.
fn status_watch_prints_frames(xlb: &Path, socket: &Path) {
    let mut child = Command::new(xlb)
        .args(["status", "--watch", "--interval", "300ms", "--socket"])
        .arg(socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut text = String::new();
    while text.matches("xlb status every 300ms").count() < 3 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                text.push_str(&line);
                text.push('\n');
            }
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = reader.join();
    assert!(
        text.matches("xlb status every 300ms").count() >= 3,
        "three frames within 5 s:\n{text}"
    );
    assert!(
        text.matches("VIP api  10.100.0.1:80/tcp").count() >= 2,
        "{text}"
    );
    assert!(
        !text.contains('\x1b'),
        "no control codes into a pipe:\n{text}"
    );
}

/// The contents of `path` once it has some, for at most `timeout`.
fn wait_file(path: &Path, timeout: Duration) -> String {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && !text.is_empty()
        {
            return text;
        }
        assert!(start.elapsed() < timeout, "{} not written", path.display());
        thread::sleep(POLL);
    }
}
