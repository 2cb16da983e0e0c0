//! The summary of a `cargo xtask bench` run: the figures every benchmark
//! binary recorded (`xlb_tests::bench::figures`, one tab-separated line
//! each) printed as one table with a verdict per target, and drawn as bars,
//! one chart per group, in `target/bench/figures.svg`.

use std::{fmt::Write as _, path::Path};

use anyhow::{Context as _, Result, bail};

/// One recorded figure (see `xlb_tests::bench::figures::Figure::encode`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Fig {
    bench: String,
    group: String,
    case: String,
    value: f64,
    unit: String,
    spread: Option<(f64, f64)>,
    runs: usize,
    baseline: Option<(String, f64)>,
    target: Option<(String, f64)>,
}

impl Fig {
    fn parse(line: &str) -> Result<Self> {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != 11 {
            bail!("{} fields, 11 expected", f.len());
        }
        let num = |s: &str, what: &str| -> Result<f64> {
            s.parse()
                .with_context(|| format!("{what} {s:?} is not a number"))
        };
        fn opt(s: &str) -> Option<&str> {
            (s != "-").then_some(s)
        }
        let spread = match (opt(f[5]), opt(f[6])) {
            (Some(a), Some(b)) => Some((num(a, "min")?, num(b, "max")?)),
            _ => None,
        };
        let baseline = match (opt(f[8]), opt(f[9])) {
            (Some(n), Some(v)) => Some((n.to_string(), num(v, "baseline")?)),
            _ => None,
        };
        let target = match opt(f[10]) {
            Some(t) => {
                let at = t.find(['<', '>']).context("target without <= or >=")?;
                let (kind, rest) = t.split_at(at);
                let (op, n) = rest.split_at(2);
                if op != "<=" && op != ">=" {
                    bail!("target {t:?}: <= or >= expected");
                }
                Some((format!("{kind}{op}"), num(n, "target")?))
            }
            None => None,
        };
        Ok(Self {
            bench: f[0].to_string(),
            group: f[1].to_string(),
            case: f[2].to_string(),
            value: num(f[3], "value")?,
            unit: f[4].to_string(),
            spread,
            runs: f[7].parse().context("runs")?,
            baseline,
            target,
        })
    }

    fn ratio(&self) -> Option<f64> {
        self.baseline.as_ref().map(|(_, b)| self.value / b)
    }

    /// `"<= 2.5x met"`, `"… MISSED"`, or empty.
    fn verdict(&self) -> String {
        let Some((kind, t)) = &self.target else {
            return String::new();
        };
        let (x, shown) = match kind.as_str() {
            "ratio<=" | "ratio>=" => (self.ratio(), format!("{}{t}x", &kind[5..])),
            _ => (Some(self.value), format!("{}{t} {}", &kind[5..], self.unit)),
        };
        let Some(x) = x else {
            return format!("{shown} (no baseline)");
        };
        let met = if kind.ends_with("<=") {
            x <= *t
        } else {
            x >= *t
        };
        format!("{shown} {}", if met { "met" } else { "MISSED" })
    }
}

/// Reads the figures in `path`; a line that cannot be read is reported and
/// skipped (one bad figure must not hide the others).
pub(crate) fn read(path: &Path) -> Result<Vec<Fig>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the figures in {}", path.display()))?;
    let mut figs = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.is_empty()) {
        match Fig::parse(line) {
            Ok(f) => figs.push(f),
            Err(e) => eprintln!("bench: {}:{}: skipped: {e:#}", path.display(), i + 1),
        }
    }
    Ok(figs)
}

fn num(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// The summary table, grouped as recorded.
pub(crate) fn table(figs: &[Fig]) -> String {
    let mut out = String::new();
    let w = figs.iter().map(|f| f.case.len()).max().unwrap_or(4).max(4);
    let mut group = None;
    for f in figs {
        if group != Some(&f.group) {
            group = Some(&f.group);
            let _ = writeln!(out, "\n## {} ({})", f.group, f.bench);
            let _ = writeln!(
                out,
                "{:<w$} {:>12} {:>21} {:>26} {:>7}  target",
                "case", "value", "spread (runs)", "baseline", "ratio"
            );
        }
        let value = format!("{} {}", num(f.value), f.unit);
        let spread = f.spread.map_or(String::new(), |(a, b)| {
            format!("{}..{} ({})", num(a), num(b), f.runs)
        });
        let base = f
            .baseline
            .as_ref()
            .map_or(String::new(), |(n, v)| format!("{n} {}", num(*v)));
        let ratio = f.ratio().map_or(String::new(), |r| format!("{r:.2}x"));
        let _ = writeln!(
            out,
            "{:<w$} {value:>12} {spread:>21} {base:>26} {ratio:>7}  {}",
            f.case,
            f.verdict()
        );
    }
    let judged: Vec<String> = figs.iter().map(Fig::verdict).collect();
    let met = judged.iter().filter(|v| v.ends_with(" met")).count();
    let missed = judged.iter().filter(|v| v.ends_with("MISSED")).count();
    let _ = writeln!(out, "\ntargets: {met} met, {missed} missed");
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Horizontal bars, one chart per group, each scaled to its largest value;
/// a bar's whisker is its spread, a red bar a missed target.
pub(crate) fn svg(figs: &[Fig]) -> String {
    const LABEL: f64 = 360.0;
    const BAR: f64 = 420.0;
    const ROW: f64 = 20.0;
    let mut groups: Vec<(&str, Vec<&Fig>)> = Vec::new();
    for f in figs {
        match groups.iter_mut().find(|(g, _)| *g == f.group) {
            Some((_, v)) => v.push(f),
            None => groups.push((&f.group, vec![f])),
        }
    }
    let height: f64 = groups
        .iter()
        .map(|(_, v)| 40.0 + ROW * v.len() as f64)
        .sum::<f64>()
        + 20.0;
    let width = LABEL + BAR + 140.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let mut y = 20.0;
    for (group, v) in &groups {
        // The unit after the group's name, unless the name already says it.
        let unit = format!("({})", v[0].unit);
        let title = if group.contains(&unit) {
            (*group).to_string()
        } else {
            format!("{group} {unit}")
        };
        let _ = writeln!(
            s,
            "<text x=\"4\" y=\"{y}\" font-weight=\"bold\">{}</text>",
            escape(&title)
        );
        y += 12.0;
        let max = v
            .iter()
            .map(|f| f.spread.map_or(f.value, |(_, b)| b.max(f.value)))
            .fold(0.0f64, f64::max)
            .max(f64::MIN_POSITIVE);
        for f in v {
            let len = (f.value / max * BAR).max(0.0);
            let missed = f.verdict().ends_with("MISSED");
            let color = if missed { "#d9534f" } else { "#4a7ebb" };
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n\
                 <rect x=\"{LABEL}\" y=\"{y}\" width=\"{len:.1}\" height=\"{}\" fill=\"{color}\"/>\n\
                 <text x=\"{:.1}\" y=\"{}\">{} {}</text>",
                LABEL - 6.0,
                y + 12.0,
                escape(&f.case),
                ROW - 6.0,
                LABEL + len + 4.0,
                y + 12.0,
                num(f.value),
                escape(&f.unit)
            );
            if let Some((a, b)) = f.spread {
                let (x0, x1) = (LABEL + a / max * BAR, LABEL + b / max * BAR);
                let ym = y + (ROW - 6.0) / 2.0;
                let _ = writeln!(
                    s,
                    "<line x1=\"{x0:.1}\" y1=\"{ym}\" x2=\"{x1:.1}\" y2=\"{ym}\" stroke=\"black\"/>"
                );
            }
            y += ROW;
        }
        y += 28.0;
    }
    s.push_str("</svg>\n");
    s
}

/// Prints the summary of the figures in `path` and writes the chart next
/// to it (`figures.svg`). Nothing recorded: says so.
pub(crate) fn report(path: &Path) -> Result<()> {
    if !path.exists() {
        println!("bench: no figures were recorded");
        return Ok(());
    }
    let figs = read(path)?;
    println!("\nbench: summary of this run\n{}", table(&figs));
    let chart = path.with_extension("svg");
    std::fs::write(&chart, svg(&figs))
        .with_context(|| format!("writing the chart {}", chart.display()))?;
    println!(
        "bench: figures in {}, chart in {}",
        path.display(),
        chart.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str =
        "xlb-bench\tper packet\test ipip\t2.8\tns\t2.5\t3.1\t5\tminimal\t1\tratio<=2.5";

    #[test]
    fn parses_a_line_and_judges_it() {
        let f = Fig::parse(LINE).unwrap();
        assert_eq!(f.case, "est ipip");
        assert_eq!(f.spread, Some((2.5, 3.1)));
        assert_eq!(f.baseline, Some(("minimal".to_string(), 1.0)));
        assert_eq!(f.target, Some(("ratio<=".to_string(), 2.5)));
        assert_eq!(f.verdict(), "<=2.5x MISSED");
        let ok = Fig::parse("b\tg\tc\t6\tMpps\t-\t-\t1\t-\t-\tvalue>=5").unwrap();
        assert_eq!(ok.verdict(), ">=5 Mpps met");
        let none = Fig::parse("b\tg\tc\t6\tMpps\t-\t-\t1\t-\t-\t-").unwrap();
        assert_eq!(none.verdict(), "");
    }

    #[test]
    fn refuses_malformed_lines() {
        for bad in [
            "too\tfew",
            "b\tg\tc\tsix\tns\t-\t-\t1\t-\t-\t-",
            "b\tg\tc\t6\tns\t-\t-\t1\t-\t-\tratio=2",
            "b\tg\tc\t6\tns\t-\t-\tone\t-\t-\t-",
        ] {
            assert!(Fig::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn table_counts_verdicts_and_svg_draws_every_figure() {
        let figs = vec![
            Fig::parse(LINE).unwrap(),
            Fig::parse("b\tthroughput\tx<y\t6\tMpps\t-\t-\t1\tfloor\t10\tratio>=0.6").unwrap(),
        ];
        let t = table(&figs);
        assert!(t.contains("targets: 1 met, 1 missed"), "{t}");
        assert!(t.contains("## throughput (b)"), "{t}");
        let s = svg(&figs);
        assert_eq!(s.matches("<rect x=").count(), 2);
        assert!(s.contains("x&lt;y"), "labels are escaped");
        assert!(s.contains("#d9534f"), "the missed target is red");
        assert!(
            s.contains(">throughput (Mpps)<"),
            "the unit follows the group"
        );
        let named = Fig::parse("b\tper packet (ns)\tc\t6\tns\t-\t-\t1\t-\t-\t-").unwrap();
        assert!(
            svg(&[named]).contains(">per packet (ns)<"),
            "the unit is not said twice"
        );
    }
}
