//! `xlb-health-bench` (see its binary for what it measures and how): one
//! module per figure, the `--serve` child, the result table, and what it
//! reads about its own process.

mod cost;
mod detection;
mod dns;
mod expect;
mod fleet;
mod grpc;
mod hang;
mod haproxy;
mod https;
mod https_hang;
mod lab_cost;
mod lab_sample;
mod report;
mod resources;
mod serve;
mod switch;

use anyhow::{Context as _, Result, bail};
use lb_user::health::spec::DEFAULT_REOPEN_EVERY;

use crate::bench::print_command;
use report::print_table;

const USAGE: &str =
    "usage: xlb-health-bench [--quick] [--only FIGURE] [--case CASE] [--reopen-every N]
  --quick           fewer repetitions and a shorter cost window (smoke runs)
  --only FIGURE     run one figure: detection (hung application), cost (CPU of
                    probing 1,000 backends every second: both of the next two),
                    cost-loopback (the prober in this process, direct probes
                    to listeners on 127.0.0.1), cost-lab (the daemon in a lab,
                    through the data path and direct; needs root), dns (CPU
                    per DNS check against dig, detection of a hung dnsmasq),
                    expect (send/expect PING/+PONG to real redis-servers,
                    against HAProxy's tcp-check of the same), https (CPU
                    per kind = \"https\" check against HAProxy's check-ssl, and
                    detection of a hung openssl s_server)
                    or grpc (CPU per kind = \"grpc\" check against xlb's HTTP
                    check)
  --case CASE       one case of a cost figure only (to profile it): default (a
                    new connection per probe), reuse or haproxy (HAProxy's own
                    checks of the same listeners) for the loopback figure;
                    vip, vip-reuse, direct or direct-reuse for the lab's
  --reopen-every N  the loopback figure's reuse case reopens its connections
                    every N probes (2-1000; default 10, xlb's default); its
                    windows last at least N seconds";

/// Backends probed for the cost figure.
const COST_BACKENDS: usize = 1_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Figure {
    Detection,
    /// Both cost figures.
    Cost,
    CostLoopback,
    CostLab,
    /// The DNS check's cost and detection (issue 25).
    Dns,
    /// Send/expect against HAProxy's tcp-check (`expect`).
    Expect,
    /// `kind = "https"` against HAProxy's `check-ssl`.
    Https,
    /// CPU per gRPC check (`grpc.rs`).
    Grpc,
}

impl Figure {
    /// The figure `--only NAME` runs.
    fn named(name: &str) -> Option<Self> {
        Some(match name {
            "detection" => Self::Detection,
            "cost" => Self::Cost,
            "cost-loopback" => Self::CostLoopback,
            "cost-lab" => Self::CostLab,
            "dns" => Self::Dns,
            "expect" => Self::Expect,
            "https" => Self::Https,
            "grpc" => Self::Grpc,
            _ => return None,
        })
    }

    /// Whether running `only` includes this figure.
    fn selected(self, only: Option<Self>) -> bool {
        match only {
            None => true,
            Some(Self::Cost) => matches!(self, Self::CostLoopback | Self::CostLab),
            Some(o) => o == self,
        }
    }
}

#[derive(Debug, Default)]
struct Args {
    quick: bool,
    only: Option<Figure>,
    /// The loopback cost figure's case to run alone.
    case: Option<cost::Case>,
    /// The lab cost figure's case to run alone.
    lab_case: Option<lab_cost::LabCase>,
    /// `--reopen-every`: the loopback reuse case's `reopen_every`.
    reopen_every: Option<u32>,
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
                let name = value("--only")?;
                out.only = Some(Figure::named(&name).with_context(|| {
                    format!(
                        "--only {name:?}: use detection, cost, cost-loopback, cost-lab, dns, \
                         expect, https or grpc\n{USAGE}"
                    )
                })?);
            }
            "--case" => {
                let name = value("--case")?;
                match name.as_str() {
                    "default" => out.case = Some(cost::Case::Fresh),
                    "reuse" => out.case = Some(cost::Case::Reuse(DEFAULT_REOPEN_EVERY)),
                    "haproxy" => out.case = Some(cost::Case::Haproxy),
                    lab => {
                        out.lab_case = Some(lab_cost::LabCase::named(lab).with_context(|| {
                            format!(
                                "--case {lab:?}: use default, reuse or haproxy (loopback), or \
                                 vip, vip-reuse, direct or direct-reuse (lab)\n{USAGE}"
                            )
                        })?);
                    }
                }
            }
            "--reopen-every" => {
                let n = value("--reopen-every")?;
                let every = n.parse().ok().filter(|n| (2..=1000).contains(n));
                out.reopen_every = Some(every.with_context(|| {
                    format!("--reopen-every {n:?}: a number of probes from 2 to 1000\n{USAGE}")
                })?);
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
    if let Some(every) = out.reopen_every
        && (!Figure::CostLoopback.selected(out.only)
            || matches!(out.case, Some(cost::Case::Fresh | cost::Case::Haproxy)))
    {
        bail!(
            "--reopen-every {every}: only the loopback cost figure's reuse case has it; \
             run it with --only cost-loopback (or cost), without --case default or haproxy\n{USAGE}"
        );
    }
    if let Some(cost::Case::Reuse(_)) = out.case {
        out.case = Some(cost::Case::Reuse(out.reopen_every()));
    }
    Ok(out)
}

impl Args {
    /// The loopback reuse case's `reopen_every`: `--reopen-every`, else
    /// xlb's default.
    fn reopen_every(&self) -> u32 {
        self.reopen_every.unwrap_or(DEFAULT_REOPEN_EVERY)
    }
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
    if Figure::Detection.selected(args.only) {
        for profile in detection::detection_profiles(args.quick) {
            rows.extend(detection::detection(&profile).await?);
        }
    }
    if Figure::CostLoopback.selected(args.only) && args.lab_case.is_none() {
        rows.extend(cost::cost(args.quick, args.case, args.reopen_every()).await?);
    }
    if Figure::CostLab.selected(args.only) && args.case.is_none() {
        lab_cost::check_can_run()?;
        let (quick, only) = (args.quick, args.lab_case);
        rows.extend(
            tokio::task::spawn_blocking(move || lab_cost::lab_cost(quick, only))
                .await
                .context("the lab cost figure's thread")??,
        );
    }
    if Figure::Dns.selected(args.only) && args.case.is_none() && args.lab_case.is_none() {
        rows.extend(dns::dns(args.quick).await?);
    }
    if Figure::Expect.selected(args.only) && args.case.is_none() && args.lab_case.is_none() {
        rows.extend(expect::expect_cost(args.quick).await?);
    }
    if Figure::Https.selected(args.only) && args.case.is_none() && args.lab_case.is_none() {
        rows.extend(https::https_cost(args.quick).await?);
        rows.extend(https_hang::https_detection(args.quick).await?);
    }
    if Figure::Grpc.selected(args.only) && args.case.is_none() && args.lab_case.is_none() {
        rows.extend(grpc::grpc_cost(args.quick).await?);
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
         ({cpus} workers)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figure_selection() {
        use Figure::*;
        let cases = [
            (None, [true, true, true, true]),
            (Some(Cost), [false, true, true, false]),
            (Some(CostLab), [false, false, true, false]),
            (Some(CostLoopback), [false, true, false, false]),
            (Some(Detection), [true, false, false, false]),
            (Some(Expect), [false, false, false, true]),
        ];
        for (only, want) in cases {
            let got = [Detection, CostLoopback, CostLab, Expect].map(|f| f.selected(only));
            assert_eq!(got, want, "{only:?}");
        }
    }

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
            (
                "only dns",
                "--only dns --quick",
                Some((true, Some(Figure::Dns), None)),
            ),
            (
                "only the lab",
                "--only cost-lab",
                Some((false, Some(Figure::CostLab), None)),
            ),
            ("lab case", "--case vip-reuse", Some((false, None, None))),
            (
                "only grpc",
                "--only grpc --quick",
                Some((true, Some(Figure::Grpc), None)),
            ),
            ("unknown case", "--case fast", None),
            ("unknown figure", "--only speed", None),
            ("missing value", "--only", None),
            ("unknown flag", "--fast", None),
            ("bad count", "--serve many", None),
            (
                "reopen every",
                "--only cost-loopback --reopen-every 30",
                Some((false, Some(Figure::CostLoopback), None)),
            ),
            (
                "reopen every, all figures",
                "--reopen-every 30",
                Some((false, None, None)),
            ),
            (
                "reopen every, lab only",
                "--only cost-lab --reopen-every 30",
                None,
            ),
            (
                "reopen every, default case",
                "--case default --reopen-every 30",
                None,
            ),
            (
                "reopen every, HAProxy's case",
                "--case haproxy --reopen-every 30",
                None,
            ),
            ("reopen every too small", "--reopen-every 1", None),
            ("reopen every not a number", "--reopen-every often", None),
        ];
        for (name, line, want) in cases {
            let got = parse(line).ok().map(|a| (a.quick, a.only, a.serve));
            assert_eq!(got, want, "{name}");
        }
        let case = |line: &str| parse(line).ok().and_then(|a| a.case);
        assert_eq!(
            case("--case reuse --reopen-every 30"),
            Some(cost::Case::Reuse(30))
        );
        assert_eq!(
            case("--reopen-every 30 --case reuse"),
            Some(cost::Case::Reuse(30))
        );
        assert_eq!(
            case("--case reuse"),
            Some(cost::Case::Reuse(DEFAULT_REOPEN_EVERY))
        );
        assert_eq!(case("--case haproxy"), Some(cost::Case::Haproxy));
    }
}
