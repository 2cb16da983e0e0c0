//! `xlb status --watch`: the status table of `xlb status`, redrawn every
//! interval. On a terminal each frame replaces the last (cleared screen);
//! into a pipe or a file the frames follow one another, with no control
//! codes, so that a log of them reads as text.

use std::io::{IsTerminal as _, Write as _};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::time::MissedTickBehavior;

use super::poll::{self, Liveness};
use crate::cli::{format_utc, render_status};
use crate::ctl::{self, StatusReport};

/// Home the cursor and clear the screen (ECMA-48 CUP and ED 2).
const CLEAR: &str = "\x1b[H\x1b[2J";

/// One frame: a title line with the time (UTC), then `xlb status`'s text.
pub fn render_watch(
    report: &StatusReport,
    now_unix_ms: u64,
    interval: Duration,
    tty: bool,
    color: bool,
) -> String {
    let mut out = String::new();
    if tty {
        out.push_str(CLEAR);
    }
    let every = super::interval_text(interval);
    out.push_str(&format!(
        "xlb status every {every}  {} UTC\n\n",
        format_utc(now_unix_ms)
    ));
    out.push_str(&render_status(report, now_unix_ms, color));
    if !tty {
        // Frames one after another: a blank line between them.
        out.push('\n');
    }
    out
}

/// Runs `xlb status --watch` until interrupted, a closed pipe (`Ok`), or a
/// daemon gone for [`super::GIVE_UP`] (`Err`).
///
/// # Errors
/// The daemon does not answer (at once at start), or stdout fails.
pub async fn watch(socket: &Path, interval: Duration, color: bool) -> anyhow::Result<()> {
    let tty = std::io::stdout().is_terminal();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut liveness = Liveness::default();
    loop {
        ticker.tick().await;
        let text = match poll::status(socket).await {
            Ok(report) => {
                liveness.ok();
                render_watch(&report, ctl::now_unix_ms(), interval, tty, color)
            }
            Err(e) => {
                let waiting = liveness
                    .failed(&e, Instant::now())
                    .map_err(anyhow::Error::msg)?;
                // On stderr: the frames on stdout stay a clean record.
                eprintln!("xlb: {waiting}");
                continue;
            }
        };
        let mut out = std::io::stdout().lock();
        match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            Ok(()) => {}
            // `xlb status --watch | head`: done.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(e).context("writing to stdout"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::tests::{SAMPLE_NOW_MS, sample_report};

    #[test]
    fn frames_clear_only_a_terminal() {
        let report = sample_report();
        let status = render_status(&report, SAMPLE_NOW_MS, false);
        let title = "xlb status every 1s  2027-01-15 08:00:00.000 UTC\n\n";
        let tty = render_watch(&report, SAMPLE_NOW_MS, Duration::from_secs(1), true, false);
        assert_eq!(tty, format!("{CLEAR}{title}{status}"));
        let piped = render_watch(&report, SAMPLE_NOW_MS, Duration::from_secs(1), false, false);
        assert_eq!(piped, format!("{title}{status}\n"));
        assert!(!piped.contains('\x1b'));
        let fast = render_watch(
            &report,
            SAMPLE_NOW_MS,
            Duration::from_millis(500),
            false,
            false,
        );
        assert!(fast.starts_with("xlb status every 500ms  "), "{fast}");
        let colored = render_watch(&report, SAMPLE_NOW_MS, Duration::from_secs(1), false, true);
        assert!(colored.contains("\x1b[32mup\x1b[0m"));
    }
}
