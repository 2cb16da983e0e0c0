//! One line per figure for `cargo xtask bench`'s summary: each benchmark
//! binary prints its own report and also [`Figure::record`]s its headline
//! figures; xtask collects them from every binary of the run into one
//! table (case, value, spread, baseline, ratio, target, verdict) and a plot
//! under `target/bench/`.
//!
//! The file is tab-separated text, one figure per line, so xtask reads it
//! without a JSON parser:
//! `bench group case value unit min max runs baseline_name baseline target`
//! with `-` for an absent field. `target` is `ratio<=2.5`, `ratio>=5`,
//! `value<=10` or `value>=1`.

use std::io::Write as _;

/// The environment variable naming the file figures are appended to; unset
/// (a benchmark run by hand), [`Figure::record`] does nothing.
pub const OUT_ENV: &str = "XLB_BENCH_OUT";

/// What a figure is held to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    /// value ÷ baseline at most this.
    RatioAtMost(f64),
    /// value ÷ baseline at least this.
    RatioAtLeast(f64),
    /// The value itself at most this (in its unit).
    AtMost(f64),
    /// The value itself at least this.
    AtLeast(f64),
}

impl Target {
    fn encode(self) -> String {
        match self {
            Self::RatioAtMost(t) => format!("ratio<={t}"),
            Self::RatioAtLeast(t) => format!("ratio>={t}"),
            Self::AtMost(t) => format!("value<={t}"),
            Self::AtLeast(t) => format!("value>={t}"),
        }
    }
}

/// The median of `values` (the mean of the middle two for an even count;
/// NaN for none): what every benchmark reports of its rounds.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One measured figure.
#[derive(Clone, Debug)]
pub struct Figure {
    /// The benchmark binary that measured it (`xlb-bench`).
    pub bench: String,
    /// Figures of one group share a unit and are plotted together
    /// (`per-packet, one per run`).
    pub group: String,
    pub case: String,
    /// The figure reported (a median or a best, as the benchmark says).
    pub value: f64,
    /// `ns`, `Mpps`, `req/s`, `ms`, `%`.
    pub unit: String,
    /// Smallest and largest value over `runs` runs, when there were several.
    pub spread: Option<(f64, f64)>,
    pub runs: usize,
    /// The case this one is compared with, and its value in the same run.
    pub baseline: Option<(String, f64)>,
    pub target: Option<Target>,
}

impl Figure {
    /// A figure of one run, without baseline or target.
    pub fn new(bench: &str, group: &str, case: &str, value: f64, unit: &str) -> Self {
        Self {
            bench: bench.to_string(),
            group: group.to_string(),
            case: case.to_string(),
            value,
            unit: unit.to_string(),
            spread: None,
            runs: 1,
            baseline: None,
            target: None,
        }
    }

    /// The median of `values` (one per run), with their spread.
    pub fn median_of(bench: &str, group: &str, case: &str, values: &[f64], unit: &str) -> Self {
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Self {
            spread: (values.len() > 1).then_some((min, max)),
            runs: values.len(),
            ..Self::new(bench, group, case, median(values), unit)
        }
    }

    pub fn against(mut self, name: &str, value: f64) -> Self {
        self.baseline = Some((name.to_string(), value));
        self
    }

    pub fn target(mut self, t: Target) -> Self {
        self.target = Some(t);
        self
    }

    /// value ÷ baseline.
    pub fn ratio(&self) -> Option<f64> {
        self.baseline.as_ref().map(|(_, b)| self.value / b)
    }

    /// Whether the target is met; `None` without a target (or a ratio
    /// target without a baseline).
    pub fn met(&self) -> Option<bool> {
        Some(match self.target? {
            Target::RatioAtMost(t) => self.ratio()? <= t,
            Target::RatioAtLeast(t) => self.ratio()? >= t,
            Target::AtMost(t) => self.value <= t,
            Target::AtLeast(t) => self.value >= t,
        })
    }

    /// The line written for xtask.
    pub fn encode(&self) -> String {
        let clean = |s: &str| s.replace(['\t', '\n'], " ");
        let (min, max) = self
            .spread
            .map_or(("-".to_string(), "-".to_string()), |(a, b)| {
                (a.to_string(), b.to_string())
            });
        let (bname, bval) = self
            .baseline
            .as_ref()
            .map_or(("-".to_string(), "-".to_string()), |(n, v)| {
                (clean(n), v.to_string())
            });
        let target = self.target.map_or("-".to_string(), Target::encode);
        [
            clean(&self.bench),
            clean(&self.group),
            clean(&self.case),
            self.value.to_string(),
            clean(&self.unit),
            min,
            max,
            self.runs.to_string(),
            bname,
            bval,
            target,
        ]
        .join("\t")
    }

    /// Appends the figure to the file named by [`OUT_ENV`], if set. A
    /// benchmark must not fail over its summary: an error is printed.
    pub fn record(&self) {
        let Some(path) = std::env::var_os(OUT_ENV) else {
            return;
        };
        let r = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| writeln!(f, "{}", self.encode()));
        if let Err(e) = r {
            eprintln!(
                "bench: could not append a figure to {}: {e}",
                std::path::Path::new(&path).display()
            );
        }
    }
}

/// Prints `figures` as tables, one per group: median, spread, ratio to
/// the baseline, and the verdict of an at-most target.
pub fn print(figures: &[Figure]) {
    let mut group = "";
    for f in figures {
        if f.group != group {
            group = &f.group;
            println!("{group}");
            println!(
                "  {:<38} {:>8} {:>15} {:>7}  target",
                "case", "median", "[min..max]", "ratio"
            );
        }
        let (lo, hi) = f.spread.unwrap_or((f.value, f.value));
        let target = match (f.target, f.met()) {
            (Some(Target::AtMost(t)), Some(met)) => {
                format!("<= {t}{} {}", f.unit, if met { "met" } else { "MISSED" })
            }
            _ => String::new(),
        };
        let ratio = f.ratio().map_or(String::new(), |r| format!("{r:.2}x"));
        println!(
            "  {:<38} {:>8.2} {:>15} {ratio:>7}  {target}",
            f.case,
            f.value,
            format!("[{lo:.2}..{hi:.2}]"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_spread_ratio_and_verdict() {
        let f = Figure::median_of("b", "g", "c", &[3.0, 1.0, 2.0, 10.0], "ns")
            .against("base", 1.0)
            .target(Target::RatioAtMost(2.5));
        assert_eq!(f.value, 2.5);
        assert_eq!(f.spread, Some((1.0, 10.0)));
        assert_eq!(f.runs, 4);
        assert_eq!(f.ratio(), Some(2.5));
        assert_eq!(f.met(), Some(true));
        let f = f.target(Target::RatioAtLeast(3.0));
        assert_eq!(f.met(), Some(false));
        assert_eq!(Figure::new("b", "g", "c", 1.0, "ns").met(), None);
        // A ratio target without a baseline cannot be judged.
        let lone = Figure::new("b", "g", "c", 1.0, "ns").target(Target::RatioAtMost(1.0));
        assert_eq!(lone.met(), None);
        assert_eq!(
            Figure::new("b", "g", "c", 7.0, "Mpps")
                .target(Target::AtLeast(8.0))
                .met(),
            Some(false)
        );
    }

    #[test]
    fn encodes_eleven_tab_separated_fields() {
        let f = Figure::median_of("xlb-bench", "per\tpacket", "est", &[1.0, 2.0, 3.0], "ns")
            .against("minimal", 0.5)
            .target(Target::RatioAtMost(2.5));
        let line = f.encode();
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(
            fields,
            [
                "xlb-bench",
                "per packet",
                "est",
                "2",
                "ns",
                "1",
                "3",
                "3",
                "minimal",
                "0.5",
                "ratio<=2.5"
            ]
        );
        let bare = Figure::new("b", "g", "c", 1.5, "ms").encode();
        assert_eq!(bare, "b\tg\tc\t1.5\tms\t-\t-\t1\t-\t-\t-");
    }
}
