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

    /// The target as shown (`"<=2.5x"`, `">=5 Mpps"`) and whether this
    /// figure meets it (`None`: a ratio target without a baseline); `None`
    /// when the figure has no target.
    fn judge(&self) -> Option<(String, Option<bool>)> {
        let (kind, t) = self.target.as_ref()?;
        let (x, shown) = match kind.as_str() {
            "ratio<=" | "ratio>=" => (self.ratio(), format!("{}{t}x", &kind[5..])),
            _ => (Some(self.value), format!("{}{t} {}", &kind[5..], self.unit)),
        };
        let met = x.map(|x| {
            if kind.ends_with("<=") {
                x <= *t
            } else {
                x >= *t
            }
        });
        Some((shown, met))
    }

    /// `"<= 2.5x met"`, `"… MISSED"`, or empty.
    fn verdict(&self) -> String {
        match self.judge() {
            None => String::new(),
            Some((shown, None)) => format!("{shown} (no baseline)"),
            Some((shown, Some(met))) => {
                format!("{shown} {}", if met { "met" } else { "MISSED" })
            }
        }
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

/// One row of a summary table: the figure, its ratio to its baseline and
/// what is said of its target.
struct Row<'a> {
    fig: &'a Fig,
    ratio: Option<f64>,
    target: String,
}

/// The rows under a heading per group, in the order recorded; `head` names
/// the value, spread and baseline columns.
fn grouped(rows: &[Row<'_>], head: [&str; 3]) -> String {
    let mut out = String::new();
    let w = rows
        .iter()
        .map(|r| r.fig.case.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut group = None;
    for Row {
        fig: f,
        ratio,
        target,
    } in rows
    {
        if group != Some(&f.group) {
            group = Some(&f.group);
            let _ = writeln!(out, "\n## {} ({})", f.group, f.bench);
            if let Some(note) = crate::bench_notes::about(&f.group) {
                let _ = writeln!(out, "{note}");
            }
            let _ = writeln!(
                out,
                "{:<w$} {:>12} {:>21} {:>26} {:>7}  target",
                "case", head[0], head[1], head[2], "ratio"
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
        let ratio = ratio.map_or(String::new(), |r| format!("{r:.2}x"));
        let _ = writeln!(
            out,
            "{:<w$} {value:>12} {spread:>21} {base:>26} {ratio:>7}  {target}",
            f.case
        );
    }
    out
}

/// The summary table, grouped as recorded.
pub(crate) fn table(figs: &[Fig]) -> String {
    let rows: Vec<Row<'_>> = figs
        .iter()
        .map(|f| Row {
            fig: f,
            ratio: f.ratio(),
            target: f.verdict(),
        })
        .collect();
    let mut out = grouped(&rows, ["value", "spread (runs)", "baseline"]);
    let met = rows.iter().filter(|r| r.target.ends_with(" met")).count();
    let missed = rows.iter().filter(|r| r.target.ends_with("MISSED")).count();
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
    let rows: Vec<(&Fig, bool)> = figs
        .iter()
        .map(|f| (f, f.verdict().ends_with("MISSED")))
        .collect();
    draw(&rows)
}

/// The chart of [`svg`], each figure with whether to draw it red.
fn draw(rows: &[(&Fig, bool)]) -> String {
    const LABEL: f64 = 360.0;
    const BAR: f64 = 420.0;
    const ROW: f64 = 20.0;
    let mut groups: Vec<(&str, Vec<(&Fig, bool)>)> = Vec::new();
    for &(f, missed) in rows {
        match groups.iter_mut().find(|(g, _)| *g == f.group) {
            Some((_, v)) => v.push((f, missed)),
            None => groups.push((&f.group, vec![(f, missed)])),
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
        let unit = format!("({})", v[0].0.unit);
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
            .map(|(f, _)| f.spread.map_or(f.value, |(_, b)| b.max(f.value)))
            .fold(0.0f64, f64::max)
            .max(f64::MIN_POSITIVE);
        for &(f, missed) in v {
            let len = (f.value / max * BAR).max(0.0);
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

/// One figure over the runs of `cargo xtask bench --runs N`.
#[derive(Clone, Debug)]
pub(crate) struct Across {
    /// The median of the runs' values, their min..max as the spread, the
    /// number of runs that recorded it, the median of their baselines.
    fig: Fig,
    /// The median of each run's ratio to that run's own baseline: the
    /// figure to read on a machine whose speed drifts between runs.
    ratio: Option<f64>,
    /// Runs whose own figure met the target, of those that judged it.
    met: usize,
    judged: usize,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Every figure recorded in any of `runs`, in the order first recorded,
/// summed up over the runs that recorded it.
pub(crate) fn across(runs: &[Vec<Fig>]) -> Vec<Across> {
    // A case can be recorded twice in a group, against two baselines
    // (xlb against the floor and against nftables): the baseline's name is
    // part of what makes a figure.
    fn key(f: &Fig) -> (&str, &str, &str, Option<&str>) {
        let base = f.baseline.as_ref().map(|(n, _)| n.as_str());
        (f.bench.as_str(), f.group.as_str(), f.case.as_str(), base)
    }
    let mut keys = Vec::new();
    for f in runs.iter().flatten() {
        if !keys.contains(&key(f)) {
            keys.push(key(f));
        }
    }
    keys.into_iter()
        .map(|k| {
            let of: Vec<&Fig> = runs.iter().flatten().filter(|f| key(f) == k).collect();
            let mut values: Vec<f64> = of.iter().map(|f| f.value).collect();
            let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut bases: Vec<f64> = of
                .iter()
                .filter_map(|f| f.baseline.as_ref())
                .map(|b| b.1)
                .collect();
            let mut ratios: Vec<f64> = of.iter().filter_map(|f| f.ratio()).collect();
            let verdicts: Vec<bool> = of.iter().filter_map(|f| f.judge()?.1).collect();
            let first = of[0];
            Across {
                fig: Fig {
                    value: median(&mut values),
                    spread: Some((lo, hi)),
                    runs: of.len(),
                    baseline: first
                        .baseline
                        .as_ref()
                        .map(|(name, _)| (name.clone(), median(&mut bases))),
                    ..first.clone()
                },
                ratio: (!ratios.is_empty()).then(|| median(&mut ratios)),
                met: verdicts.iter().filter(|&&m| m).count(),
                judged: verdicts.len(),
            }
        })
        .collect()
}

/// The table of [`across`]: per figure the median over the runs, its
/// spread, the median ratio to the run's own baseline, and how many runs
/// met the target.
pub(crate) fn runs_table(rows: &[Across], runs: usize) -> String {
    let shown: Vec<Row<'_>> = rows
        .iter()
        .map(|r| Row {
            fig: &r.fig,
            ratio: r.ratio,
            target: match r.fig.judge() {
                None => String::new(),
                Some((shown, _)) if r.judged == 0 => format!("{shown} (no baseline)"),
                Some((shown, _)) => format!("{shown} met in {} of {} runs", r.met, r.judged),
            },
        })
        .collect();
    let mut out = grouped(&shown, ["median", "min..max (runs)", "median baseline"]);
    let judged: Vec<&Across> = rows.iter().filter(|r| r.judged > 0).collect();
    let every = judged.iter().filter(|r| r.met == r.judged).count();
    let none = judged.iter().filter(|r| r.met == 0).count();
    let _ = writeln!(
        out,
        "\ntargets over {runs} runs: {every} met in every run, {} in some, {none} in none",
        judged.len() - every - none
    );
    out
}

/// Prints the summary of the runs whose figures are in `paths` and draws
/// it in `chart` (the median of each figure, its whisker the runs'
/// min..max, red unless every run met its target).
pub(crate) fn report_runs(paths: &[std::path::PathBuf], chart: &Path) -> Result<()> {
    let runs = paths.iter().map(|p| read(p)).collect::<Result<Vec<_>>>()?;
    let rows = across(&runs);
    println!(
        "\nbench: summary of {} runs (each run's figures: {})\n{}",
        runs.len(),
        paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        runs_table(&rows, runs.len())
    );
    let drawn: Vec<(&Fig, bool)> = rows.iter().map(|r| (&r.fig, r.met < r.judged)).collect();
    std::fs::write(chart, draw(&drawn))
        .with_context(|| format!("writing the chart {}", chart.display()))?;
    println!("bench: chart of the runs in {}", chart.display());
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
        let cluster = Fig::parse(
            "xlb-cluster-bench\tcluster: node death to last connection flowing\tc\t400\tms\t-\t-\t1\t-\t-\tvalue<=1000",
        )
        .unwrap();
        let t = table(&[cluster]);
        assert!(
            t.contains("flowing (xlb-cluster-bench)\nFrom the moment node A dies"),
            "a group's note follows its heading: {t}"
        );
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

    #[test]
    fn across_runs_takes_medians_spreads_and_counts_verdicts() {
        let line = |v: f64, base: f64| {
            Fig::parse(&format!(
                "xlb-bench\tper packet\test ipip\t{v}\tns\t-\t-\t12\tminimal\t{base}\tratio<=2.5"
            ))
            .unwrap()
        };
        let other =
            |v: f64| Fig::parse(&format!("b\tg\tno target\t{v}\tMpps\t-\t-\t1\t-\t-\t-")).unwrap();
        // Ratios 2.0, 3.0, 2.4, 2.2: the machine slowed in run 2, and the
        // median of the runs' own ratios is not the ratio of the medians.
        // The same case against a second baseline is a figure of its own.
        let twice = |v: f64| {
            Fig::parse(&format!(
                "xlb-bench\tper packet\test ipip\t{v}\tns\t-\t-\t12\tKatran\t{}\tratio<=0.9",
                v * 1.25
            ))
            .unwrap()
        };
        let runs = vec![
            vec![line(200.0, 100.0), other(5.0), twice(200.0)],
            vec![line(300.0, 100.0), twice(300.0)],
            vec![line(240.0, 100.0), other(7.0), twice(240.0)],
            vec![other(6.0), line(330.0, 150.0), twice(330.0)],
        ];
        let rows = across(&runs);
        assert_eq!(
            rows.len(),
            3,
            "one row per figure, in the order first recorded"
        );
        let k = &rows[2];
        assert_eq!(
            k.fig.baseline.as_ref().map(|b| b.0.as_str()),
            Some("Katran")
        );
        assert_eq!((k.fig.runs, k.met, k.judged), (4, 4, 4), "0.8 each time");
        let est = &rows[0];
        assert_eq!(est.fig.case, "est ipip");
        assert_eq!(est.fig.value, 270.0, "median of 200, 240, 300, 330");
        assert_eq!(est.fig.spread, Some((200.0, 330.0)));
        assert_eq!(est.fig.runs, 4);
        assert_eq!(est.fig.baseline, Some(("minimal".to_string(), 100.0)));
        assert!((est.ratio.unwrap() - 2.3).abs() < 1e-9, "{:?}", est.ratio);
        assert_eq!((est.met, est.judged), (3, 4), "run 2's 3.0 misses <= 2.5");
        let nt = &rows[1];
        assert_eq!(
            (nt.fig.value, nt.fig.runs, nt.judged),
            (6.0, 3, 0),
            "missing in run 2"
        );
        assert_eq!(nt.ratio, None);

        let t = runs_table(&rows, 4);
        assert!(t.contains("<=2.5x met in 3 of 4 runs"), "{t}");
        assert!(t.contains("2.30x"), "the median ratio is shown: {t}");
        assert!(t.contains("200..330 (4)"), "{t}");
        assert!(
            t.contains("targets over 4 runs: 1 met in every run, 1 in some, 0 in none"),
            "{t}"
        );

        let all_met = across(&[vec![line(200.0, 100.0)], vec![line(210.0, 100.0)]]);
        assert!(runs_table(&all_met, 2).contains("1 met in every run, 0 in some, 0 in none"));
        let none_met = across(&[vec![line(300.0, 100.0)], vec![line(310.0, 100.0)]]);
        assert!(runs_table(&none_met, 2).contains("0 met in every run, 0 in some, 1 in none"));
    }
}
