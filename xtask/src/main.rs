//! `cargo xtask`: xlb's developer tasks (aliased in `.cargo/config.toml`).

#![allow(
    clippy::print_stdout,
    reason = "xtask is a CLI: its progress and reports go to stdout"
)]

mod bench;
mod bench_notes;
mod bench_summary;
mod build_cmd;
mod counts;
mod demo;
mod demo_cluster;
mod dist;
mod fuzz;
mod kernels;
mod lab;
mod lab_cluster;
mod layout;
mod matrix;
mod run;
mod setup;
mod test;
mod util;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Developer tasks for xlb: `cargo xtask <COMMAND>`.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Install what building and testing needs, when missing: nightly's
    /// rust-src, stable's rustfmt and clippy, LLVM 22 and test tools from
    /// Debian, bpf-linker 0.13. A second run only checks.
    Setup,
    /// Run setup, then build the workspace, including the eBPF object that
    /// is embedded in `xlb`.
    Build {
        /// Build with the release profile.
        #[arg(long)]
        release: bool,
    },
    /// Run setup, check formatting, run clippy and every test (what CI
    /// runs), then the kernel matrix: the packet fixtures and the lifecycle
    /// scenario on each kernel of `xtask/src/kernels.rs`, booted in QEMU.
    /// Test binaries run as root, through `sudo -E` if needed.
    Test {
        /// Only this kernel line of the matrix (`5.10`, `6.1`, `6.12`), or
        /// `host` for the tests on this machine's kernel alone; repeat it
        /// for several. Without it: everything, or the host alone when
        /// arguments are passed on to `cargo test`.
        #[arg(long, value_name = "LINE")]
        kernel: Vec<String>,
        /// Passed on to `cargo test`: a test name filter, `--no-fail-fast`,
        /// `-- --nocapture`...
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run setup, then build and run the benchmark binaries in release, as
    /// root (through `sudo -E` if needed).
    Bench {
        /// Run only this benchmark binary; repeat it to run several.
        #[arg(long, value_name = "NAME")]
        bin: Vec<String>,
        /// Run the selected benchmarks this many times, one after another,
        /// and end with the spread of every figure over the runs and how
        /// many runs met each target.
        #[arg(long, value_name = "N", default_value_t = 1,
              value_parser = clap::value_parser!(u32).range(1..=100))]
        runs: u32,
        /// Passed to each benchmark binary.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run setup, build `xlb` in release and run it as root (through
    /// `sudo -E` if needed), e.g. `cargo xtask run -- run --config xlb.toml`.
    Run {
        /// Passed to `xlb`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build `xlb` (release) and the lab binaries and pack them: a Debian
    /// package (binary, configuration, systemd units, completions, man
    /// pages) and a tarball, in target/dist/.
    Dist {
        /// Build and pack the dev profile (quicker; for tests).
        #[arg(long)]
        debug: bool,
        /// Where to write the package and the tarball.
        #[arg(long, value_name = "DIR")]
        out: Option<std::path::PathBuf>,
    },
    /// Bring the namespaced lab (client, LB host, three backends) up with
    /// xlb running in it and leave it running, or take it down.
    Lab {
        #[command(subcommand)]
        action: LabAction,
    },
    /// Show what xlb is for: run setup, build, bring the lab up, hang a
    /// backend under load and print what the clients saw while xlb took it
    /// out and back; then tear the lab down. About 35 s after the build.
    Demo {
        /// Leave the lab running afterwards (`cargo xtask lab down` removes it).
        #[arg(long, conflicts_with = "nodes")]
        keep: bool,
        /// 2: two xlb nodes behind a BIRD router; node A dies under held
        /// connections, which go on through node B; prints the convergence
        /// time (`demo_cluster`).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
        nodes: u8,
    },
    /// Fuzz the XDP program for a long run: random and mutated frames
    /// through `BPF_PROG_TEST_RUN`, each checked against the packet policy
    /// (as root). The test suite runs a million frames; this runs more.
    Fuzz {
        /// How many frames to send.
        #[arg(long, default_value_t = 10_000_000)]
        frames: u64,
        /// The generator's seed (printed by every run and every violation);
        /// a new one from the clock if not given.
        #[arg(long)]
        seed: Option<u64>,
        /// Build the test in release (faster frames, a longer first build).
        #[arg(long)]
        release: bool,
    },
}

#[derive(Debug, Subcommand)]
enum LabAction {
    /// Build in release, then (re)build the lab and start xlb with a
    /// generated configuration (VIPs api, api6 and api2); logs and the
    /// configuration go to target/lab/<PREFIX>/. Running it again replaces
    /// the lab.
    Up {
        /// Namespace prefix: namespaces are <PREFIX>-br, -cl, -lb, -b1..b3.
        #[arg(long, default_value = xlb_lab::topology::DEFAULT_PREFIX)]
        prefix: String,
        /// Forwarding mode of the api and api6 VIPs (api2 gets the other).
        #[arg(long, default_value = "dsr-ipip", value_parser = parse_mode)]
        mode: xlb_lab::scenario::Mode,
        /// Run this configuration instead of the generated one.
        #[arg(long, value_name = "FILE")]
        config: Option<std::path::PathBuf>,
        /// Start everything but `xlb run` (to run the daemon by hand).
        #[arg(long)]
        no_daemon: bool,
        /// Build and run the dev profile (quicker to build) instead of release.
        #[arg(long)]
        dev: bool,
        /// LB nodes: 1, or 2 behind a router running BIRD with ECMP
        /// (namespaces <PREFIX>-rt and -lb2 too; see README "The two-node lab").
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
        nodes: u8,
        /// With --nodes 2: BFD at 100 ms x 3 between the router and the nodes.
        #[arg(long, requires = "nodes")]
        bfd: bool,
    },
    /// Stop the lab's processes, detach xlb and remove the namespaces; also
    /// cleans up after an interrupted `up`.
    Down {
        /// Namespace prefix given to `up`.
        #[arg(long, default_value = xlb_lab::topology::DEFAULT_PREFIX)]
        prefix: String,
    },
}

fn parse_mode(s: &str) -> Result<xlb_lab::scenario::Mode, String> {
    s.parse()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Setup) && std::env::var_os("AYA_BUILD_SKIP").is_some() {
        eprintln!("note: ignoring AYA_BUILD_SKIP: this task builds the real eBPF object");
    }
    let result = match cli.command {
        Command::Setup => setup::run(),
        Command::Build { release } => build_cmd::run(release),
        Command::Test { kernel, args } => test::run(&kernel, &args),
        Command::Bench { bin, runs, args } => bench::run(&bin, runs, &args),
        Command::Run { args } => run::run(&args),
        Command::Dist { debug, out } => dist::run(debug, out),
        Command::Lab {
            action:
                LabAction::Up {
                    prefix,
                    mode,
                    config,
                    no_daemon,
                    dev,
                    nodes,
                    bfd,
                },
        } => lab::up(&lab::UpArgs {
            prefix,
            dev,
            mode,
            no_daemon,
            config,
            nodes,
            bfd,
        }),
        Command::Lab {
            action: LabAction::Down { prefix },
        } => lab::down(&prefix),
        Command::Demo { keep, nodes: 2 } => {
            debug_assert!(!keep, "clap refuses --keep with --nodes");
            demo_cluster::run()
        }
        Command::Demo { keep, .. } => demo::run(keep),
        Command::Fuzz {
            frames,
            seed,
            release,
        } => fuzz::run(&fuzz::Options {
            frames,
            seed,
            release,
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // The error and its causes, without the backtrace that returning
            // it from main would print under RUST_BACKTRACE=1: these errors
            // are for users, and each already says where it came from.
            eprintln!("error: {err}");
            for cause in err.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_after_the_command_are_passed_on() {
        let cases: [(&str, &[&str], &[&str]); 4] = [
            (
                "filter after --",
                &["test", "--", "fixtures"],
                &["fixtures"],
            ),
            ("filter without --", &["test", "fixtures"], &["fixtures"]),
            (
                "libtest flags after a second --",
                &["test", "--", "fixtures", "--", "--nocapture"],
                &["fixtures", "--", "--nocapture"],
            ),
            (
                "cargo flag",
                &["test", "--no-fail-fast"],
                &["--no-fail-fast"],
            ),
        ];
        for (name, argv, want) in cases {
            let cli = Cli::try_parse_from(std::iter::once("xtask").chain(argv.iter().copied()))
                .unwrap_or_else(|e| panic!("case {name}: {e}"));
            let Command::Test { args, kernel } = cli.command else {
                panic!("case {name}: not parsed as test");
            };
            assert_eq!(args, want, "case {name}");
            assert!(kernel.is_empty(), "case {name}: {kernel:?}");
        }
    }

    #[test]
    fn test_takes_kernels_before_the_arguments_passed_on() {
        let cli = Cli::try_parse_from([
            "xtask", "test", "--kernel", "6.1", "--kernel", "host", "--", "fixtures",
        ])
        .unwrap();
        let Command::Test { args, kernel } = cli.command else {
            panic!("not parsed as test");
        };
        assert_eq!(kernel, ["6.1", "host"]);
        assert_eq!(args, ["fixtures"]);
    }

    #[test]
    fn run_passes_xlb_flags_through() {
        for argv in [
            &["run", "--config", "xlb.toml"][..],
            &["run", "--", "--config", "xlb.toml"][..],
        ] {
            let cli =
                Cli::try_parse_from(std::iter::once("xtask").chain(argv.iter().copied())).unwrap();
            let Command::Run { args } = cli.command else {
                panic!("{argv:?}: not parsed as run");
            };
            assert_eq!(args, ["--config", "xlb.toml"], "{argv:?}");
        }
    }

    #[test]
    fn bench_takes_bin_before_passed_arguments() {
        let cli =
            Cli::try_parse_from(["xtask", "bench", "--bin", "xlb-bench", "--", "--secs", "5"])
                .unwrap();
        let Command::Bench { bin, runs, args } = cli.command else {
            panic!("not parsed as bench");
        };
        assert_eq!(bin, ["xlb-bench"]);
        assert_eq!(runs, 1, "one run unless asked");
        assert_eq!(args, ["--secs", "5"]);
    }

    #[test]
    fn bench_runs_several_benchmarks_several_times() {
        let cli = Cli::try_parse_from([
            "xtask",
            "bench",
            "--bin",
            "xlb-bench",
            "--bin",
            "xlb-katran-bench",
            "--runs",
            "5",
        ])
        .unwrap();
        let Command::Bench { bin, runs, args } = cli.command else {
            panic!("not parsed as bench");
        };
        assert_eq!(bin, ["xlb-bench", "xlb-katran-bench"]);
        assert_eq!(runs, 5);
        assert!(args.is_empty());
        for bad in ["0", "101", "five"] {
            assert!(
                Cli::try_parse_from(["xtask", "bench", "--runs", bad]).is_err(),
                "--runs {bad} was accepted"
            );
        }
    }

    #[test]
    fn lab_and_demo_arguments() {
        let cli = Cli::try_parse_from(["xtask", "lab", "up", "--mode", "dsr-l2", "--prefix", "t1"])
            .unwrap();
        let Command::Lab {
            action: LabAction::Up { prefix, mode, .. },
        } = cli.command
        else {
            panic!("not parsed as lab up");
        };
        assert_eq!(
            (prefix.as_str(), mode),
            ("t1", xlb_lab::scenario::Mode::DsrL2)
        );
        assert!(Cli::try_parse_from(["xtask", "lab", "up", "--mode", "nat"]).is_err());
        let cli = Cli::try_parse_from(["xtask", "lab", "down"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Lab { action: LabAction::Down { prefix } } if prefix == "xlb"
        ));
        let cli = Cli::try_parse_from(["xtask", "lab", "up", "--nodes", "2", "--bfd"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Lab {
                action: LabAction::Up {
                    nodes: 2,
                    bfd: true,
                    ..
                }
            }
        ));
        for bad in [
            &["xtask", "lab", "up", "--nodes", "3"][..],
            &["xtask", "lab", "up", "--nodes", "0"],
            &["xtask", "lab", "up", "--bfd"],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
        let cli = Cli::try_parse_from(["xtask", "demo", "--keep"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Demo {
                keep: true,
                nodes: 1
            }
        ));
        let cli = Cli::try_parse_from(["xtask", "demo", "--nodes", "2"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Demo {
                keep: false,
                nodes: 2
            }
        ));
        for bad in [
            &["xtask", "demo", "--nodes", "3"][..],
            &["xtask", "demo", "--nodes", "2", "--keep"][..],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }

    #[test]
    fn fuzz_takes_frames_and_seed() {
        let cli = Cli::try_parse_from(["xtask", "fuzz", "--frames", "100", "--seed", "7"]).unwrap();
        let Command::Fuzz {
            frames,
            seed,
            release,
        } = cli.command
        else {
            panic!("not parsed as fuzz");
        };
        assert_eq!((frames, seed, release), (100, Some(7), false));
    }
}
