//! `xlb-health-bench` (see its binary for what it measures and how): one
//! module per figure, the `--serve` child, the result table, and what it
//! reads about its own process.

mod cost;
mod detection;
mod hang;
mod report;
mod resources;
mod serve;
mod switch;

use anyhow::{Context as _, Result, bail};

use crate::bench::print_command;
use report::print_table;

const USAGE: &str =
    "usage: xlb-health-bench [--quick] [--only detection|cost] [--case default|reuse]
  --quick           fewer repetitions and a shorter cost window (smoke runs)
  --only FIGURE     run one figure: detection (hung application) or cost
                    (CPU of probing 1,000 backends every second)
  --case CASE       the cost figure for one case only (to profile it): default
                    (a new connection per probe) or reuse (reuse_connection)";

/// Backends probed for the cost figure.
const COST_BACKENDS: usize = 1_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Figure {
    Detection,
    Cost,
}

#[derive(Debug, Default)]
struct Args {
    quick: bool,
    only: Option<Figure>,
    /// The cost figure's case to run alone.
    case: Option<cost::Case>,
    /// Hidden: be the cost figure's server process with this many listeners.
    serve: Option<usize>,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Args> {
    let mut out = Args::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
            None => (arg.clone(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| args.next())
                .with_context(|| format!("{name} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--quick" if inline.is_none() => out.quick = true,
            "--only" => {
                out.only = Some(match value("--only")?.as_str() {
                    "detection" => Figure::Detection,
                    "cost" => Figure::Cost,
                    other => bail!("--only {other:?}: use detection or cost\n{USAGE}"),
                });
            }
            "--case" => {
                out.case = Some(match value("--case")?.as_str() {
                    "default" => cost::Case::Fresh,
                    "reuse" => cost::Case::Reuse,
                    other => bail!("--case {other:?}: use default or reuse\n{USAGE}"),
                });
            }
            "--serve" => {
                let n = value("--serve")?;
                out.serve = Some(
                    n.parse()
                        .with_context(|| format!("--serve {n:?}: not a number of listeners"))?,
                );
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => bail!("unknown argument {arg:?}\n{USAGE}"),
        }
    }
    Ok(out)
}

/// The benchmark's `main`: parses the arguments, then either serves (the
/// cost figure's child) or measures and prints the figures.
pub fn main() -> Result<()> {
    let args = parse_args(std::env::args().skip(1))?;
    resources::raise_nofile()?;
    if let Some(n) = args.serve {
        return serve::serve_main(n);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the Tokio runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    println!("xlb health-check benchmark");
    print_command("xlb-health-bench");
    println!("host:      {}", host_description());
    if cfg!(debug_assertions) {
        println!("WARNING:   debug build; CPU figures are only meaningful with --release");
    }

    let mut rows = Vec::new();
    if args.only.is_none_or(|f| f == Figure::Detection) {
        for profile in detection::detection_profiles(args.quick) {
            rows.extend(detection::detection(&profile).await?);
        }
    }
    if args.only.is_none_or(|f| f == Figure::Cost) {
        rows.extend(cost::cost(args.quick, args.case).await?);
    }
    print_table(&rows);
    Ok(())
}

fn host_description() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned());
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    format!(
        "{cpus} CPUs, Linux {kernel}, {build} build, Tokio multi-thread runtime \
         ({cpus} workers), loopback only"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments() {
        let parse = |s: &str| parse_args(s.split_whitespace().map(str::to_owned));
        let cases = [
            ("nothing", "", Some((false, None, None))),
            ("quick", "--quick", Some((true, None, None))),
            (
                "only cost",
                "--only cost --quick",
                Some((true, Some(Figure::Cost), None)),
            ),
            (
                "only with =",
                "--only=detection",
                Some((false, Some(Figure::Detection), None)),
            ),
            ("serve", "--serve 12", Some((false, None, Some(12)))),
            ("unknown figure", "--only speed", None),
            ("missing value", "--only", None),
            ("unknown flag", "--fast", None),
            ("bad count", "--serve many", None),
        ];
        for (name, line, want) in cases {
            let got = parse(line).ok().map(|a| (a.quick, a.only, a.serve));
            assert_eq!(got, want, "{name}");
        }
    }
}
