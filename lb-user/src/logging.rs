//! Logs of `xlb run` and `xlb decap`, on stderr: text for people (colour
//! only on a terminal: journald and files get no escape codes), or JSON
//! for log pipelines (`--log-format json`): one object per line, the
//! event's fields at the top level beside `timestamp`, `level`, `target`
//! and `message`.
//!
//! The lines that matter to a pipeline carry `event`, named as in `xlb
//! events` (`transition`, `admin`, `drain`, `table`, `reload`, `alarm`,
//! `panic`, `fleet_slow`, `agent`, `weight`, `start`), with `vip`,
//! `backend`, `from`, `to`, `reason` where they apply and, for a table
//! rebuild, `table_build_ms` and `slots_changed`. The README ("Logs")
//! lists them; renaming one breaks someone's alert.

use std::io::IsTerminal as _;

use tracing::Subscriber;
use tracing_subscriber::{EnvFilter, fmt::MakeWriter};

/// `--log-format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line per event for people; colour only on a terminal.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Whether text logs get ANSI colour: only on a terminal, and never with
/// `NO_COLOR` set to anything (no-color.org).
pub fn ansi(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

/// The subscriber for `format` writing to `writer`; `RUST_LOG` filters
/// (default `info`).
pub fn subscriber<W>(format: LogFormat, ansi: bool, writer: W) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(fmt.with_ansi(ansi).finish()),
        LogFormat::Json => Box::new(
            fmt.json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .finish(),
        ),
    }
}

/// Sets up logging for the process: stderr, in `format`.
pub fn init(format: LogFormat) {
    let colour = ansi(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    // Only fails if a subscriber is set already (a second call): keep it.
    let _ = tracing::subscriber::set_global_default(subscriber(format, colour, std::io::stderr));
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buf {
        type Writer = Buf;
        fn make_writer(&'w self) -> Buf {
            self.clone()
        }
    }

    /// What a transition and a plain line log in `format`.
    fn logged(format: LogFormat, ansi: bool) -> String {
        let buf = Buf::default();
        tracing::subscriber::with_default(subscriber(format, ansi, buf.clone()), || {
            tracing::info!(
                event = "transition",
                vip = "api",
                backend = "10.0.0.12:80",
                from = "up",
                to = "down",
                reason = "connected, no HTTP response within 1s",
                "backend up -> down: connected, no HTTP response within 1s"
            );
            tracing::warn!("a line \"quoted\"\nover two lines");
        });
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn json_logs_are_one_object_per_line_with_the_fields_at_the_top() {
        let out = logged(LogFormat::Json, true);
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(lines.len(), 2, "{out}");
        let t = &lines[0];
        for (field, want) in [
            ("event", "transition"),
            ("vip", "api"),
            ("backend", "10.0.0.12:80"),
            ("from", "up"),
            ("to", "down"),
            ("reason", "connected, no HTTP response within 1s"),
            ("level", "INFO"),
            (
                "message",
                "backend up -> down: connected, no HTTP response within 1s",
            ),
        ] {
            assert_eq!(t[field], want, "{field}: {t}");
        }
        assert!(t["timestamp"].is_string(), "{t}");
        assert_eq!(lines[1]["message"], "a line \"quoted\"\nover two lines");
        assert!(!out.contains("\x1b["), "no colour in JSON: {out}");
    }

    #[test]
    fn text_logs_have_colour_only_when_asked() {
        let plain = logged(LogFormat::Text, false);
        assert!(!plain.contains("\x1b["), "{plain}");
        assert!(
            plain.contains("event=\"transition\" vip=\"api\""),
            "{plain}"
        );
        let coloured = logged(LogFormat::Text, true);
        assert!(coloured.contains("\x1b["), "{coloured}");
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        let set = std::ffi::OsStr::new("1");
        let empty = std::ffi::OsStr::new("");
        // (terminal, NO_COLOR, colour)
        let cases = [
            (true, None, true),
            (false, None, false),
            (true, Some(set), false),
            (true, Some(empty), true),
            (false, Some(set), false),
        ];
        for (terminal, no_color, want) in cases {
            assert_eq!(ansi(terminal, no_color), want, "{terminal} {no_color:?}");
        }
    }
}
