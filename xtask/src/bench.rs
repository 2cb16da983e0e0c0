//! `cargo xtask bench`: build in release and run each benchmark binary, as
//! root; each prints its own results and records its headline figures, which
//! end in one summary table and chart (`bench_summary`).

use anyhow::{Context as _, Result, bail};

use crate::{
    bench_summary, setup,
    util::{self, Root},
};

/// Where the benchmark binaries append their figures
/// (`xlb_tests::bench::figures::OUT_ENV`).
const FIGURES_ENV: &str = "XLB_BENCH_OUT";

/// A benchmark: a binary target of a workspace package.
#[derive(Debug)]
struct Bench {
    package: &'static str,
    bin: &'static str,
    /// Packages whose binaries it runs (`xlb`, `xlb-backend` in the lab),
    /// built in release before it: `cargo run` builds only the benchmark's
    /// own package, and the lab refuses an `xlb` older than its sources.
    runs: &'static [&'static str],
}

/// What a benchmark that runs the lab needs next to it.
const LAB_BINARIES: &[&str] = &["lb-user", "xlb-lab"];

/// Every benchmark, run in this order. Binaries not written yet are skipped
/// with a note, so this list can name them ahead of time.
const BENCHES: &[Bench] = &[
    // Forwarding throughput and latency through xlb in network namespaces.
    Bench {
        package: "xlb-tests",
        bin: "xlb-bench",
        runs: &[],
    },
    // xlb against Katran's balancer (built from Katran's source), one
    // packet per run, established and new flows, side by side.
    Bench {
        package: "xlb-tests",
        bin: "xlb-katran-bench",
        runs: &[],
    },
    // Abuse control: per-packet cost of lists, limits and tracking with
    // 100k prefixes loaded; flood drop rate against forwarding (live frames).
    Bench {
        package: "xlb-tests",
        bin: "xlb-guard-bench",
        runs: &[],
    },
    // Offered rate one CPU pushes through xlb (live frames), against a bare
    // XDP floor, kernel forwarding and nftables DNAT, in the lab.
    Bench {
        package: "xlb-tests",
        bin: "xlb-tput-bench",
        runs: &[],
    },
    // The conntrack LRU on two cores at once: common, per-CPU and one map
    // per CPU (Katran), new flows and established packets per core, one
    // core alone and both; what a full table keeps through floods.
    Bench {
        package: "xlb-tests",
        bin: "xlb-lru-bench",
        runs: &[],
    },
    // Health checking: when a hung backend leaves the table (VIP policy)
    // and goes hard down, probe CPU cost (on loopback, and the daemon's in
    // the lab, through the data path).
    Bench {
        package: "xlb-tests",
        bin: "xlb-health-bench",
        runs: LAB_BINARIES,
    },
    // Seed 003 replayed in the lab, with and without protection: failed
    // requests, SYN retransmits, drop_no_backend, time the table was empty.
    Bench {
        package: "xlb-tests",
        bin: "xlb-cascade-bench",
        runs: LAB_BINARIES,
    },
    // Data-path health probes (through xlb_hc) against direct ones.
    Bench {
        package: "xlb-tests",
        bin: "xlb-dpath-bench",
        runs: LAB_BINARIES,
    },
    // A mass flap: 4,000 backends of one VIP down and up at once, a few
    // times; control-socket latency quiet and during the flap, table
    // rebuilds per flap against transitions.
    Bench {
        package: "xlb-tests",
        bin: "xlb-flap-bench",
        runs: LAB_BINARIES,
    },
    // Several nodes (issue 26), in the two-node lab with a BIRD router:
    // a node's death to the last held connection flowing again (BIRD's
    // defaults, BFD), a backend change to the route change on the router.
    Bench {
        package: "xlb-tests",
        bin: "xlb-cluster-bench",
        runs: LAB_BINARIES,
    },
    // HTTP through the lab with wrk: direct to one backend, xlb, HAProxy
    // (`mode tcp`) and nftables DNAT; where the CPU goes (BPF run-time stats).
    Bench {
        package: "xlb-tests",
        bin: "xlb-lab-bench",
        runs: LAB_BINARIES,
    },
];

/// Runs the benchmarks named in `only` (all when empty) with `args` after
/// `--`, `runs` times over: each run is the whole selection in order, so the
/// runs of different benchmarks interleave in time, and a machine whose
/// speed drifts moves every figure of a run alike.
pub(crate) fn run(only: &[String], runs: u32, args: &[String]) -> Result<()> {
    let selected = select(only)?;
    setup::ensure()?;
    let root = Root::obtain("running the benchmarks (BPF programs, network namespaces)")?;
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("reading the workspace's packages with `cargo metadata`")?;
    build_runs(&selected)?;
    // Every binary appends its headline figures here; the summary reads them.
    let out_dir = std::path::Path::new(&metadata.target_directory).join("bench");
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let figures = out_dir.join("figures.tsv");
    let mut kept = Vec::new();
    for n in 1..=runs {
        remove_stale(&figures)?;
        if runs > 1 {
            println!("bench: run {n} of {runs}");
        }
        let mut ran = 0;
        for bench in &selected {
            if !bin_exists(&metadata, bench) {
                println!(
                    "bench: {} (package {}) does not exist yet; skipping it",
                    bench.bin, bench.package
                );
                continue;
            }
            println!("bench: running {}", bench.bin);
            let mut cmd = util::cargo();
            cmd.arg("run")
                .args(root.cargo_runner_args())
                .args([
                    "--release",
                    "--package",
                    bench.package,
                    "--bin",
                    bench.bin,
                    "--",
                ])
                .args(args)
                .env(FIGURES_ENV, &figures);
            util::run(&mut cmd).with_context(|| format!("benchmark {} failed", bench.bin))?;
            ran += 1;
        }
        println!("bench: ran {ran} of {} benchmarks", selected.len());
        bench_summary::report(&figures)?;
        if runs > 1 && figures.exists() {
            // Each run's figures stay next to the summary of them all.
            let this = out_dir.join(format!("figures.run{n}.tsv"));
            std::fs::copy(&figures, &this)
                .with_context(|| format!("keeping run {n}'s figures in {}", this.display()))?;
            kept.push(this);
        }
    }
    if runs > 1 && !kept.is_empty() {
        bench_summary::report_runs(&kept, &out_dir.join("figures-runs.svg"))?;
    }
    Ok(())
}

/// The benchmarks named in `only`, in the order they run; all when empty.
fn select(only: &[String]) -> Result<Vec<&'static Bench>> {
    let known: Vec<&str> = BENCHES.iter().map(|b| b.bin).collect();
    if let Some(unknown) = only.iter().find(|n| !known.contains(&n.as_str())) {
        bail!(
            "no benchmark called {unknown:?}: known benchmarks are {}",
            known.join(", ")
        );
    }
    Ok(BENCHES
        .iter()
        .filter(|b| only.is_empty() || only.iter().any(|n| n == b.bin))
        .collect())
}

/// Removes the figures a previous run left in `path`.
fn remove_stale(path: &std::path::Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing the old {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// Builds in release, in one cargo invocation, the packages whose binaries
/// the selected benchmarks run.
fn build_runs(selected: &[&Bench]) -> Result<()> {
    let mut packages: Vec<&str> = selected.iter().flat_map(|b| b.runs).copied().collect();
    packages.sort_unstable();
    packages.dedup();
    if packages.is_empty() {
        return Ok(());
    }
    println!("bench: building {} in release", packages.join(", "));
    let mut cmd = util::cargo();
    cmd.args(["build", "--release"]);
    for p in &packages {
        cmd.args(["--package", p]);
    }
    util::run(&mut cmd).with_context(|| {
        format!(
            "building {} for the benchmarks that run them",
            packages.join(", ")
        )
    })
}

fn bin_exists(metadata: &cargo_metadata::Metadata, bench: &Bench) -> bool {
    metadata
        .workspace_packages()
        .into_iter()
        .filter(|p| p.name.as_str() == bench.package)
        .flat_map(|p| &p.targets)
        .any(|t| t.is_bin() && t.name == bench.bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_keeps_the_run_order_and_refuses_unknown_names() {
        let names = |v: Vec<&Bench>| v.iter().map(|b| b.bin).collect::<Vec<_>>();
        assert_eq!(select(&[]).unwrap().len(), BENCHES.len(), "none named: all");
        // Named out of order: run in the list's order, each once.
        let two = [
            "xlb-katran-bench".to_string(),
            "xlb-bench".to_string(),
            "xlb-bench".to_string(),
        ];
        assert_eq!(
            names(select(&two).unwrap()),
            ["xlb-bench", "xlb-katran-bench"]
        );
        let err = select(&["xlb-bench".to_string(), "xlb-nope".to_string()])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"xlb-nope\"") && err.contains("xlb-tput-bench"),
            "{err}"
        );
    }

    #[test]
    fn bin_exists_cases() {
        let metadata = cargo_metadata::MetadataCommand::new()
            .no_deps()
            .exec()
            .expect("cargo metadata on this workspace");
        let cases = [
            (
                "existing binary",
                Bench {
                    package: "xtask",
                    bin: "xtask",
                    runs: &[],
                },
                true,
            ),
            (
                "missing binary",
                Bench {
                    package: "xtask",
                    bin: "xtask-no-such-bench",
                    runs: &[],
                },
                false,
            ),
            (
                "binary of another package",
                Bench {
                    package: "lb-common",
                    bin: "xtask",
                    runs: &[],
                },
                false,
            ),
            (
                "missing package",
                Bench {
                    package: "no-such-package",
                    bin: "xtask",
                    runs: &[],
                },
                false,
            ),
        ];
        for (name, bench, want) in cases {
            assert_eq!(bin_exists(&metadata, &bench), want, "case {name}");
        }
    }
}
