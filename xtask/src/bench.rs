//! `cargo xtask bench`: build in release and run each benchmark binary, as
//! root; each prints its own results.

use anyhow::{Context as _, Result, bail};

use crate::{
    setup,
    util::{self, Root},
};

/// A benchmark: a binary target of a workspace package.
struct Bench {
    package: &'static str,
    bin: &'static str,
}

/// Every benchmark, run in this order. Binaries not written yet are skipped
/// with a note, so this list can name them ahead of time.
const BENCHES: &[Bench] = &[
    // Forwarding throughput and latency through xlb in network namespaces.
    Bench {
        package: "xlb-tests",
        bin: "xlb-bench",
    },
    // Health checking: hung-application detection time, probe CPU cost.
    Bench {
        package: "xlb-tests",
        bin: "xlb-health-bench",
    },
    // HTTP throughput through xlb in the lab, with wrk, next to no LB.
    Bench {
        package: "xlb-tests",
        bin: "xlb-lab-bench",
    },
];

/// Runs the benchmark called `only` (all when `None`) with `args` after `--`.
pub fn run(only: Option<&str>, args: &[String]) -> Result<()> {
    let selected: Vec<&Bench> = BENCHES
        .iter()
        .filter(|b| only.is_none_or(|name| name == b.bin))
        .collect();
    if selected.is_empty() {
        let known: Vec<&str> = BENCHES.iter().map(|b| b.bin).collect();
        bail!(
            "no benchmark called {:?}: known benchmarks are {}",
            only.unwrap_or_default(),
            known.join(", ")
        );
    }
    setup::ensure()?;
    let root = Root::obtain("running the benchmarks (BPF programs, network namespaces)")?;
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("reading the workspace's packages with `cargo metadata`")?;
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
            .args(args);
        util::run(&mut cmd).with_context(|| format!("benchmark {} failed", bench.bin))?;
        ran += 1;
    }
    println!("bench: ran {ran} of {} benchmarks", selected.len());
    Ok(())
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
                },
                true,
            ),
            (
                "missing binary",
                Bench {
                    package: "xtask",
                    bin: "xtask-no-such-bench",
                },
                false,
            ),
            (
                "binary of another package",
                Bench {
                    package: "lb-common",
                    bin: "xtask",
                },
                false,
            ),
            (
                "missing package",
                Bench {
                    package: "no-such-package",
                    bin: "xtask",
                },
                false,
            ),
        ];
        for (name, bench, want) in cases {
            assert_eq!(bin_exists(&metadata, &bench), want, "case {name}");
        }
    }
}
