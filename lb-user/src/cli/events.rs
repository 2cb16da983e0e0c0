//! `xlb events`: one line per event, with UTC timestamps.

use std::fmt::Write as _;

use super::{Style, paint, state_style};
use crate::ctl::Event;

/// `xlb events`: one line per event.
pub fn render_events(events: &[Event], color: bool) -> String {
    events.iter().fold(String::new(), |mut out, e| {
        out.push_str(&render_event(e, color));
        out.push('\n');
        out
    })
}

/// One event, e.g. `2026-11-30 00:12:03.120 transition api 10.99.0.12:80
/// up→down: connected, no HTTP response within 1s (table rebuilt in 0.4 ms,
/// 1312 slots changed)`.
pub fn render_event(e: &Event, color: bool) -> String {
    let mut line = format!(
        "{} {}",
        format_utc(e.at_unix_ms),
        paint(e.kind.as_str(), Style::Bold, color)
    );
    for part in [&e.vip, &e.backend].into_iter().flatten() {
        line.push(' ');
        line.push_str(part);
    }
    match (&e.from, &e.to) {
        (Some(from), Some(to)) => {
            let _ = write!(
                line,
                " {}→{}",
                paint(from, state_style(from), color),
                paint(to, state_style(to), color)
            );
        }
        (None, Some(to)) => {
            let _ = write!(line, " →{}", paint(to, state_style(to), color));
        }
        _ => {}
    }
    if !e.reason.is_empty() {
        let _ = write!(line, ": {}", e.reason);
    }
    let mut table = Vec::new();
    if let Some(us) = e.table_build_us {
        table.push(format!("table rebuilt in {:.1} ms", us as f64 / 1000.0));
    }
    if let Some(n) = e.table_slots_changed {
        table.push(format!("{n} slots changed"));
    }
    if !table.is_empty() {
        let _ = write!(line, " ({})", table.join(", "));
    }
    line
}

/// `ms` since the Unix epoch as `YYYY-MM-DD HH:MM:SS.mmm`, UTC.
pub fn format_utc(ms: u64) -> String {
    let days = (ms / 86_400_000) as i64;
    let rem = ms % 86_400_000;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000
    )
}

/// The proleptic Gregorian date of day `z` since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`, http://howardhinnant.github.io/date_algorithms.html).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}
