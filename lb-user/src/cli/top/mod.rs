//! `xlb top`, a full-screen live view of a running daemon, and `xlb status
//! --watch`, the plain table redrawn. Three layers, so the first two are
//! tested without a terminal or a daemon:
//!
//! - [`model`]: status snapshots → rows with rates (counter deltas between
//!   two snapshots), sorted and filtered, and the latest events;
//! - [`keys`] and [`view`]: what the operator chose to see, and the
//!   ratatui widgets that draw it;
//! - `term` and `watch`: the I/O loops (the control socket, crossterm's
//!   keys, the terminal and its restoration).

pub mod keys;
pub mod model;
mod poll;
mod term;
pub mod view;
mod watch;

use std::time::Duration;

pub use term::run;
pub use watch::{render_watch, watch};

use crate::config;

/// Arguments of `xlb top`.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct TopArgs {
    /// How often to ask the daemon, e.g. 1s, 500ms.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Start showing only this VIP (`v` and `/` change it).
    #[arg(long, value_name = "NAME")]
    pub vip: Option<String>,
    /// Which daemon.
    #[command(flatten)]
    pub target: crate::cli::target::ClientTarget,
}

/// `--watch` and its interval, for `xlb status`.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct WatchArgs {
    /// Redraw the status every --interval until interrupted (on a terminal
    /// the screen is cleared first; otherwise each one is appended).
    #[arg(long, conflicts_with = "json")]
    pub watch: bool,
    /// With --watch: how often to redraw, e.g. 1s, 500ms.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "1s",
        value_parser = parse_interval,
        requires = "watch"
    )]
    pub interval: Duration,
}

impl Default for WatchArgs {
    fn default() -> Self {
        WatchArgs {
            watch: false,
            interval: DEFAULT_INTERVAL,
        }
    }
}

/// How often `top` and `status --watch` ask without `--interval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// Shortest `--interval`: each refresh is a `status` request, which reads
/// every counter of every backend.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// A refresh interval: a duration as in the configuration, at least
/// [`MIN_INTERVAL`].
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = config::parse_duration(s)?;
    if d < MIN_INTERVAL {
        return Err(format!(
            "{s} is too often: every refresh asks the daemon for its whole status; \
             use 100ms or more"
        ));
    }
    Ok(d)
}

/// An interval as the screens show it: `1s`, `500ms`, `2.5s`.
fn interval_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else if ms < 1000 {
        format!("{ms}ms")
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// How long the daemon may not answer before `top` and `status --watch`
/// give up: long enough to ride out a quick restart, short enough that a
/// daemon that went away is said soon.
pub const GIVE_UP: Duration = Duration::from_secs(5);

/// How long one status or events request may take before it counts as no
/// answer (the client's own limit is for slow reloads, far longer).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser as _;

    #[test]
    fn intervals() {
        let cases = [
            ("1s", Ok(Duration::from_secs(1))),
            ("250ms", Ok(Duration::from_millis(250))),
            ("100ms", Ok(MIN_INTERVAL)),
            (
                "10ms",
                Err(
                    "10ms is too often: every refresh asks the daemon for its whole status; \
                     use 100ms or more"
                        .to_owned(),
                ),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse_interval(text), want, "{text}");
        }
        assert!(parse_interval("soon").is_err());
    }

    #[test]
    fn intervals_read_as_written() {
        let cases = [
            (1000, "1s"),
            (500, "500ms"),
            (2500, "2.5s"),
            (10_000, "10s"),
        ];
        for (ms, want) in cases {
            assert_eq!(interval_text(Duration::from_millis(ms)), want);
        }
    }

    #[test]
    fn top_and_watch_parse() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("xlb").chain(args.iter().copied()))
                .map(|c| c.command)
        };
        assert_eq!(
            parse(&["top"]).unwrap(),
            Command::Top(TopArgs {
                interval: DEFAULT_INTERVAL,
                vip: None,
                target: Default::default()
            })
        );
        assert_eq!(
            parse(&["top", "--interval", "500ms", "--vip", "api"]).unwrap(),
            Command::Top(TopArgs {
                interval: Duration::from_millis(500),
                vip: Some("api".to_owned()),
                target: Default::default()
            })
        );
        assert_eq!(
            parse(&["status", "--watch", "--interval", "2s"]).unwrap(),
            Command::Status {
                json: false,
                watch: WatchArgs {
                    watch: true,
                    interval: Duration::from_secs(2)
                },
                target: Default::default(),
            }
        );
        let errors = [
            (vec!["status", "--interval", "2s"], "--watch"),
            (vec!["status", "--watch", "--json"], "cannot be used with"),
            (vec!["top", "--interval", "1ms"], "use 100ms or more"),
        ];
        for (args, want) in errors {
            let e = parse(&args).unwrap_err().to_string();
            assert!(e.contains(want), "{args:?}: {e}");
        }
        assert_eq!(
            Command::Top(TopArgs {
                interval: DEFAULT_INTERVAL,
                vip: None,
                target: Default::default()
            })
            .request(),
            None
        );
    }
}
