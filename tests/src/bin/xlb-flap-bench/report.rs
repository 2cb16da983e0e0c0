//! The stretches of a run and what is printed about them: control-request
//! latency, and per half flap the transitions and rebuilds read from the
//! daemon's log.

use std::{
    fs,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use lb_ctl::EventKind;

use super::client::{Ask, Sample, Seen};
use super::{PERIOD, STATUS_EVERY};

/// A stretch of the run, for sorting samples and events.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Nothing changing, every backend up.
    Quiet,
    /// Nothing changing, every backend down (still probed, failing).
    QuietDown,
    /// Every backend going down.
    Down,
    /// Every backend coming back.
    Up,
}

impl Phase {
    pub(crate) fn is_flap(self) -> bool {
        matches!(self, Phase::Down | Phase::Up)
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Phase::Quiet => "quiet",
            Phase::QuietDown => "quiet_down",
            Phase::Down => "down",
            Phase::Up => "up",
        }
    }
}

pub(crate) struct Window {
    pub(crate) phase: Phase,
    /// 1-based flap number (0 for the first quiet stretch).
    pub(crate) flap: usize,
    pub(crate) start: Instant,
    pub(crate) end: Instant,
    /// Events with seq in (seq_from, seq_to] belong to it (half flaps
    /// only: with the quiet settling after them).
    pub(crate) seq_from: u64,
    pub(crate) seq_to: u64,
    /// The same span on the daemon's clock (ms since the Unix epoch), for
    /// the lines of its log.
    pub(crate) from_unix_ms: u64,
    pub(crate) to_unix_ms: u64,
}

/// `/proc/loadavg`'s first three fields: how busy the host was (the
/// latencies include waiting for a CPU).
pub(crate) fn load_average() -> String {
    fs::read_to_string("/proc/loadavg").map_or_else(
        |e| format!("unknown ({e})"),
        |s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    )
}

/// Every answer: ms since the first, request, latency (ms), phase.
pub(crate) fn write_samples(path: &Path, seen: &Seen, windows: &[Window]) -> Result<()> {
    let Some(t0) = seen.samples.first().map(|s| s.at) else {
        return Ok(());
    };
    let mut out = String::from("t_ms,request,latency_ms,phase\n");
    for s in &seen.samples {
        let phase = windows
            .iter()
            .find(|w| in_window(w, s))
            .map_or("-", |w| w.phase.label());
        out.push_str(&format!(
            "{:.1},{},{:.3},{phase}\n",
            (s.at - t0).as_secs_f64() * 1e3,
            if s.ask == Ask::Status {
                "status"
            } else {
                "events"
            },
            s.latency.as_secs_f64() * 1e3
        ));
    }
    fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// p50, p99, max of `v` (sorted here), ms.
fn percentiles(v: &mut [Duration]) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    Some((at(0.5), at(0.99), at(1.0)))
}

fn in_window(w: &Window, s: &Sample) -> bool {
    s.at >= w.start && s.at < w.end
}

fn latency_row(label: &str, seen: &Seen, windows: &[&Window], ask: Ask) {
    let mut v: Vec<Duration> = seen
        .samples
        .iter()
        .filter(|s| s.ask == ask && windows.iter().any(|w| in_window(w, s)))
        .map(|s| s.latency)
        .collect();
    match percentiles(&mut v) {
        Some((p50, p99, max)) => println!(
            "{label:<26} {:>8} {p50:>9.2} {p99:>9.2} {max:>9.2}",
            v.len()
        ),
        None => println!("{label:<26} {:>8}", 0),
    }
}

pub(crate) fn print_latency(seen: &Seen, windows: &[Window]) {
    let of =
        |p: fn(Phase) -> bool| -> Vec<&Window> { windows.iter().filter(|w| p(w.phase)).collect() };
    let quiet = of(|p| p == Phase::Quiet);
    let down = of(|p| p == Phase::QuietDown);
    let flap = of(Phase::is_flap);
    println!();
    println!(
        "control requests, one connection, one every {PERIOD:?} (every {STATUS_EVERY}th a status):"
    );
    println!(
        "{:<26} {:>8} {:>9} {:>9} {:>9}",
        "", "requests", "p50 ms", "p99 ms", "max ms"
    );
    for (ask, name) in [(Ask::Events, "events"), (Ask::Status, "status")] {
        latency_row(&format!("{name}, quiet, all up"), seen, &quiet, ask);
        latency_row(&format!("{name}, quiet, all down"), seen, &down, ask);
        latency_row(&format!("{name}, during flaps"), seen, &flap, ask);
    }
}

/// A transition line of the daemon's log: when (ms since the Unix epoch),
/// and the table rebuild it carried (ms), if any. The log, unlike the
/// daemon's 1,000-event memory, has every one.
pub(crate) struct Logged {
    at_unix_ms: u64,
    build_ms: Option<f64>,
}

/// The transition lines of `xlb run`'s log (`backend up -> down: …`,
/// `…; table rebuilt in 12.34 ms (…)`), in order.
pub(crate) fn read_log(path: &Path) -> Result<Vec<Logged>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let rebuilt = |l: &str| {
        let rest = l.split("table rebuilt in ").nth(1)?;
        rest.split_whitespace().next()?.parse::<f64>().ok()
    };
    Ok(text
        .lines()
        .map(strip_ansi)
        .filter(|l| l.contains(" backend ") && l.contains(" -> "))
        .filter_map(|l| {
            let at_unix_ms = unix_ms_of(l.split_whitespace().next()?)?;
            Some(Logged {
                at_unix_ms,
                build_ms: rebuilt(&l),
            })
        })
        .collect())
}

/// `line` without terminal colour sequences (`ESC [ … m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `2026-12-01T16:35:10.123456Z` (the log's timestamps) as ms since the
/// Unix epoch.
fn unix_ms_of(ts: &str) -> Option<u64> {
    let (date, time) = ts.strip_suffix('Z')?.split_once('T')?;
    let num = |s: &str| s.parse::<i64>().ok();
    let d: Vec<i64> = date.split('-').map(num).collect::<Option<_>>()?;
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let t: Vec<i64> = hms.split(':').map(num).collect::<Option<_>>()?;
    let ms = num(&format!("{frac:0<3}")[..3])?;
    let ([y, m, day], [h, mi, sec]) = (d.as_slice(), t.as_slice()) else {
        return None;
    };
    // Days from 1970-01-01 to y-m-d (the proleptic Gregorian calendar).
    let y = if *m <= 2 { y - 1 } else { *y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    u64::try_from(((days * 24 + h) * 60 + mi) * 60_000 + sec * 1000 + ms).ok()
}

/// One half flap: transitions, rebuilds and their timing from the log;
/// events the daemon's memory dropped; the slowest control answer.
fn flap_row(seen: &Seen, log: &[Logged], w: &Window) {
    let lines: Vec<&Logged> = log
        .iter()
        .filter(|l| l.at_unix_ms >= w.from_unix_ms && l.at_unix_ms <= w.to_unix_ms)
        .collect();
    let builds: Vec<f64> = lines.iter().filter_map(|l| l.build_ms).collect();
    let first = lines.iter().map(|l| l.at_unix_ms).min();
    let last = lines.iter().map(|l| l.at_unix_ms).max();
    let applied = first.zip(last).map_or(0, |(f, l)| l - f);
    let lost: u64 = seen
        .gaps
        .iter()
        .filter(|(a, b)| *b > w.seq_from && *a <= w.seq_to)
        .map(|(a, b)| b.min(&w.seq_to) - a.max(&(w.seq_from + 1)) + 1)
        .sum();
    let retained = seen
        .events
        .iter()
        .filter(|e| e.seq > w.seq_from && e.seq <= w.seq_to && e.kind == EventKind::Transition)
        .count();
    let max_ms = seen
        .samples
        .iter()
        .filter(|s| in_window(w, s))
        .map(|s| s.latency.as_secs_f64() * 1e3)
        .fold(0.0, f64::max);
    println!(
        "{:>4} {:<5} {:>11} {:>8} {:>9.1} {:>10} {:>9.1} {:>9.2} {:>8.1} {:>6}/{:<6}",
        w.flap,
        if w.phase == Phase::Down { "down" } else { "up" },
        lines.len(),
        builds.len(),
        lines.len() as f64 / builds.len().max(1) as f64,
        applied,
        builds.iter().sum::<f64>(),
        builds.iter().copied().fold(0.0, f64::max),
        max_ms,
        retained,
        lost,
    );
}

pub(crate) fn print_flaps(seen: &Seen, log: &[Logged], windows: &[Window]) {
    println!();
    println!("per half flap (from the daemon's log, which has every transition):");
    println!(
        "{:>4} {:<5} {:>11} {:>8} {:>9} {:>10} {:>9} {:>9} {:>8} {:>7}",
        "flap",
        "",
        "transitions",
        "rebuilds",
        "trans/reb",
        "applied ms",
        "build ms",
        "max build",
        "ctl max",
        "events seen/lost"
    );
    for w in windows.iter().filter(|w| w.phase.is_flap()) {
        flap_row(seen, log, w);
    }
    println!(
        "applied ms: first to last transition event (daemon clock); build ms: all rebuilds' \
         time; ctl max: slowest control answer (ms) from the responder's stop/start to the \
         table showing it; events seen/lost: transition events `xlb events` returned, and \
         events its 1,000-event memory dropped before the client, asking every 10 ms, got them"
    );
}
