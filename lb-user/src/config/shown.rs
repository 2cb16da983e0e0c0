//! Bounds as a person writes them in the file: `1h`, not `3600s` or
//! `3600000000000ns`; `"1/min"`, not `"0.016666666666666666/s"`. Every
//! range message prints its bounds through these two.

use std::time::Duration;

/// The units a duration is written in, largest first, in ns.
const UNITS: [(&str, u128); 5] = [
    ("d", 86_400_000_000_000),
    ("h", 3_600_000_000_000),
    ("m", 60_000_000_000),
    ("s", 1_000_000_000),
    ("ms", 1_000_000),
];

/// `d` in the largest unit that divides it: `0s`, `500ms`, `90s`, `1h`,
/// `30d`; below a millisecond, Rust's own `1.5µs`.
pub fn duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".to_owned();
    }
    UNITS
        .iter()
        .find(|(_, unit)| ns.is_multiple_of(*unit))
        .map_or_else(
            || format!("{d:?}"),
            |(name, unit)| format!("{}{name}", ns / unit),
        )
}

/// A rate per second as the file writes it, quoted: `"1000/s"`, or per
/// minute when that is whole and the per-second figure is not (`"1/min"`).
pub fn rate(per_s: f64) -> String {
    let per_min = per_s * 60.0;
    if per_s.fract() != 0.0 && (per_min - per_min.round()).abs() < 1e-9 {
        format!("\"{}/min\"", per_min.round())
    } else {
        format!("\"{per_s}/s\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_the_largest_whole_unit() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(60), "1m"),
            (Duration::from_secs(3600), "1h"),
            (Duration::from_secs(86_400), "1d"),
            (Duration::from_secs(30 * 86_400), "30d"),
            (Duration::from_nanos(1500), "1.5µs"),
        ];
        for (d, want) in cases {
            assert_eq!(duration(d), want, "{d:?}");
        }
    }

    #[test]
    fn rates_per_second_or_per_minute() {
        let cases = [
            (1.0 / 60.0, "\"1/min\""),
            (0.5, "\"30/min\""),
            (1.0, "\"1/s\""),
            (10_000_000.0, "\"10000000/s\""),
            (2.5, "\"150/min\""),
        ];
        for (r, want) in cases {
            assert_eq!(rate(r), want, "{r}");
        }
    }
}
