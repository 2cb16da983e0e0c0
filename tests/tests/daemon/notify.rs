//! `xlb run` under a `Type=notify` service manager: a datagram socket
//! named by NOTIFY_SOCKET, as systemd gives it. READY=1 comes once XDP is
//! attached and every backend has been probed (the backends are then
//! known, not `unknown`), WATCHDOG=1 keeps coming from the main loop, and
//! SIGTERM brings STOPPING=1 before a clean exit that leaves XDP attached.

use std::{
    os::unix::net::UnixDatagram,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use crate::env::{BACKENDS, Env, xlb_bin};
use crate::step;

/// Kills the daemon if the test ends early.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The datagrams received until one contains `want` (or 15 s pass).
fn until(sock: &UnixDatagram, want: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        let Ok(n) = sock.recv(&mut buf) else { continue };
        let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
        let done = msg.lines().any(|l| l == want);
        seen.push(msg);
        if done {
            return seen;
        }
    }
    panic!("no {want} within 15 s; got {seen:?}");
}

#[test]
fn run_tells_systemd_ready_watchdog_and_stopping() {
    let _serial = xlb_tests::lab::serial();
    let e = Env::new().unwrap();
    let path = e.config.with_file_name("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut daemon = Daemon(
        e.in_ns()
            .arg(xlb_bin())
            .args(["run", "--config"])
            .arg(&e.config)
            .env("NOTIFY_SOCKET", &path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    step("READY=1 once attached and every backend probed", || {
        let seen = until(&sock, "READY=1");
        let ready = seen.last().unwrap();
        assert!(
            ready.contains("STATUS=attached; every backend probed"),
            "{ready}"
        );
        // Before it: only the watchdog.
        for msg in &seen[..seen.len() - 1] {
            assert_eq!(msg, "WATCHDOG=1\n", "{seen:?}");
        }
        assert!(e.xdp_attached().unwrap(), "XDP attached at READY=1");
        for b in BACKENDS {
            let state = e.backend_state("api", &format!("{b}:80")).unwrap();
            assert_ne!(state, "unknown", "{b} not probed at READY=1");
        }
    });
    step("WATCHDOG=1 keeps coming from the main loop", || {
        until(&sock, "WATCHDOG=1");
        until(&sock, "WATCHDOG=1");
    });
    step("SIGTERM: STOPPING=1, exit 0, XDP stays attached", || {
        let pid = nix::unistd::Pid::from_raw(daemon.0.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        until(&sock, "STOPPING=1");
        let status = daemon.0.wait().unwrap();
        assert!(status.success(), "{status}");
        assert!(
            e.xdp_attached().unwrap(),
            "XDP still attached after the stop"
        );
    });
}
