//! systemd's readiness protocol (`sd_notify(3)`) for `Type=notify` units:
//! READY=1 once the programs are attached and every backend has been
//! probed once (so `systemctl start` returns with health known, and units
//! ordered after xlb start against a balancer that routes), WATCHDOG=1
//! from the main loop's tick only (a loop that stops turning is caught by
//! `WatchdogSec=`), STOPPING=1 on a deliberate stop. Without
//! `NOTIFY_SOCKET` (not under systemd) every call is a no-op.
//!
//! No RELOADING=1: `ExecReload=xlb reload` returns only once the daemon has
//! applied (or refused) the new configuration, which already tells systemd
//! when the reload ends; `Type=notify-reload` would instead have systemd
//! send SIGHUP, whose outcome no client sees.

use std::time::{Duration, Instant};

use sd_notify::NotifyState;
use tracing::{debug, info, warn};

use super::{Daemon, TICK};

/// What the daemon has told systemd so far.
#[derive(Debug, Default)]
pub(super) struct Notify {
    /// When the first tick after going live ran: the first probe round is
    /// counted from it.
    live_since: Option<Instant>,
    ready: bool,
}

/// Where the first probe round stands.
#[derive(Debug, PartialEq)]
pub(super) enum FirstRound {
    /// Backends still without a first answer (or a first timeout).
    Waiting(usize),
    /// Every backend has been probed once.
    Done,
    /// Some never reported within their interval and timeout: readiness
    /// should not wait on a scheduler that is behind.
    Overdue(usize),
}

/// The first round from each backend's (probed yet, interval + timeout)
/// and the time since going live. A backend's first probe starts within
/// its interval and reports by its timeout; one tick more covers the
/// report's way to the main loop.
pub(super) fn first_round(
    backends: impl IntoIterator<Item = (bool, Duration)>,
    elapsed: Duration,
) -> FirstRound {
    let (mut waiting, mut limit) = (0, Duration::ZERO);
    for (probed, bound) in backends {
        if !probed {
            waiting += 1;
            limit = limit.max(bound);
        }
    }
    match waiting {
        0 => FirstRound::Done,
        n if elapsed > limit + TICK => FirstRound::Overdue(n),
        n => FirstRound::Waiting(n),
    }
}

/// Sends `states` if systemd listens; a failure is logged, never fatal.
fn send(states: &[NotifyState<'_>]) {
    if let Err(error) = sd_notify::notify(false, states) {
        debug!(%error, "sd_notify");
    }
}

impl Daemon {
    /// From the main loop's tick: WATCHDOG=1, and READY=1 once the first
    /// probe round is over.
    pub(super) fn notify_tick(&mut self) {
        send(&[NotifyState::Watchdog]);
        if self.notify.ready {
            return;
        }
        let since = *self.notify.live_since.get_or_insert_with(Instant::now);
        let backends = self.vips.iter().flat_map(|v| &v.backends).map(|b| {
            let h = &b.cfg.health;
            (b.snapshot.is_some(), h.interval + h.timeout)
        });
        let status = match first_round(backends, since.elapsed()) {
            FirstRound::Waiting(_) => return,
            FirstRound::Done => "attached; every backend probed".to_owned(),
            FirstRound::Overdue(n) => {
                warn!("{n} backends not probed yet; telling systemd the daemon is ready anyway");
                format!("attached; {n} backends not probed yet")
            }
        };
        info!("ready: {status}");
        send(&[NotifyState::Ready, NotifyState::Status(&status)]);
        self.notify.ready = true;
    }

    /// STOPPING=1: the stop is deliberate (SIGTERM, SIGINT), not a crash.
    pub(super) fn notify_stopping(&self) {
        send(&[
            NotifyState::Stopping,
            NotifyState::Status("stopping; the data plane stays attached"),
        ]);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;

    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn first_round_cases() {
        /// Name, each backend's (probed, interval + timeout), time since
        /// going live, the answer.
        type Case = (&'static str, Vec<(bool, Duration)>, Duration, FirstRound);
        let cases: Vec<Case> = vec![
            ("no backends", vec![], Duration::ZERO, FirstRound::Done),
            (
                "all probed",
                vec![(true, S), (true, S)],
                Duration::ZERO,
                FirstRound::Done,
            ),
            (
                "one left",
                vec![(true, S), (false, 3 * S)],
                2 * S,
                FirstRound::Waiting(1),
            ),
            // 3 s interval + timeout, one tick for the report.
            (
                "at the bound",
                vec![(false, 3 * S)],
                4 * S,
                FirstRound::Waiting(1),
            ),
            (
                "past it",
                vec![(false, 3 * S), (false, S)],
                5 * S,
                FirstRound::Overdue(2),
            ),
            // The slowest unprobed backend sets the bound.
            (
                "slowest",
                vec![(false, 10 * S), (false, S)],
                5 * S,
                FirstRound::Waiting(2),
            ),
        ];
        for (name, backends, elapsed, want) in cases {
            let got = first_round(backends, elapsed);
            assert_eq!(got, want, "{name}");
        }
    }

    /// `send` reaches the datagram socket systemd names in NOTIFY_SOCKET.
    /// The sending runs in a child (this test binary again, running
    /// [`send_as_child`]): setting the variable here would race with the
    /// other tests' reads of the environment.
    #[test]
    fn ready_reaches_notify_socket() {
        let dir = std::env::temp_dir().join(format!("xlb-notify-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "daemon::notify::tests::send_as_child",
                "--ignored",
            ])
            .env("NOTIFY_SOCKET", &path)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let mut buf = [0u8; 256];
        let n = sock.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=attached\n");
        let n = sock.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Run by [`ready_reaches_notify_socket`] with NOTIFY_SOCKET set
    /// (alone, without it, it sends nothing).
    #[test]
    #[ignore = "the child of ready_reaches_notify_socket"]
    fn send_as_child() {
        send(&[NotifyState::Ready, NotifyState::Status("attached")]);
        send(&[NotifyState::Stopping]);
    }
}
