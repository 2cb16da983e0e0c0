//! Abuse control in userspace: source prefixes, the model of the deny and
//! allow lists (what the daemon installs in the tries, with its rule ids and
//! expiry), and the per-source statistics.
//!
//! Everything here is pure: the daemon (`daemon::guard`) applies it to the
//! maps.

pub mod lists;
pub mod prefix;
pub mod sources;

pub use prefix::{Prefix, PrefixError};

use std::time::Duration;

/// A duration as `xlb blocks` and the events show it: `5s`, `15m`,
/// `1m30s`, `1h`, `1h30m` (whole seconds, at most two units).
pub fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, sec) = (s / 3600, s % 3600 / 60, s % 60);
    match (h, m, sec) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, _) => format!("{h}h"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_short() {
        let cases = [
            (5, "5s"),
            (60, "1m"),
            (90, "1m30s"),
            (3600, "1h"),
            (5400, "1h30m"),
            (7200 + 59, "2h"),
        ];
        for (s, want) in cases {
            assert_eq!(short_duration(Duration::from_secs(s)), want);
        }
    }
}
