//! The health benchmark's result table and how it writes durations.

use std::{fmt, time::Duration};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Met,
    Missed,
    /// Reported without a target.
    Info,
}

impl Verdict {
    pub(super) fn of(met: bool) -> Self {
        if met { Self::Met } else { Self::Missed }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Met => "met",
            Self::Missed => "MISSED",
            Self::Info => "-",
        })
    }
}

/// One figure of the final table.
#[derive(Clone, Debug)]
pub(super) struct Row {
    pub(super) figure: String,
    pub(super) value: String,
    pub(super) target: String,
    pub(super) verdict: Verdict,
}

pub(super) fn print_table(rows: &[Row]) {
    let width = |f: fn(&Row) -> usize, title: &str| {
        rows.iter()
            .map(f)
            .chain([title.chars().count()])
            .max()
            .unwrap_or(0)
    };
    let w_fig = width(|r| r.figure.chars().count(), "figure");
    let w_val = width(|r| r.value.chars().count(), "measured");
    let w_tgt = width(|r| r.target.chars().count(), "target");
    println!();
    println!(
        "{:<w_fig$}  {:<w_val$}  {:<w_tgt$}  verdict",
        "figure", "measured", "target"
    );
    println!(
        "{}",
        "-".repeat(w_fig + w_val + w_tgt + 6 + "verdict".len())
    );
    for r in rows {
        println!(
            "{:<w_fig$}  {:<w_val$}  {:<w_tgt$}  {}",
            r.figure, r.value, r.target, r.verdict
        );
    }
}

/// A measured duration for humans: `812.4 ms`, `4.831 s`.
pub(super) struct Secs(pub(super) Duration);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0.as_secs_f64();
        if s >= 1.0 {
            write!(f, "{s:.3} s")
        } else {
            write!(f, "{:.1} ms", s * 1e3)
        }
    }
}

/// Min, median and max of a set of samples.
#[derive(Clone, Copy, Debug)]
pub(super) struct Summary {
    pub(super) n: usize,
    pub(super) min: Duration,
    pub(super) median: Duration,
    pub(super) max: Duration,
}

impl Summary {
    pub(super) fn of(mut samples: Vec<Duration>) -> Option<Self> {
        samples.sort_unstable();
        let n = samples.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => samples[n / 2],
            _ => (samples[n / 2 - 1] + samples[n / 2]) / 2,
        };
        Some(Self {
            n,
            min: samples[0],
            median,
            max: samples[n - 1],
        })
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "min {} / median {} / max {}",
            Secs(self.min),
            Secs(self.median),
            Secs(self.max)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_median() {
        let ms = |v: &[u64]| v.iter().map(|&m| Duration::from_millis(m)).collect();
        let cases = [
            ("odd", ms(&[30, 10, 20]), Some((10, 20, 30))),
            ("even", ms(&[40, 10, 20, 30]), Some((10, 25, 40))),
            ("one", ms(&[7]), Some((7, 7, 7))),
            ("none", Vec::new(), None),
        ];
        for (name, samples, want) in cases {
            let got = Summary::of(samples).map(|s| {
                (
                    s.min.as_millis() as u64,
                    s.median.as_millis() as u64,
                    s.max.as_millis() as u64,
                )
            });
            assert_eq!(got, want, "{name}");
        }
    }
}
