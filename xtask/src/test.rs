//! `cargo xtask test`: what CI runs. Formatting, clippy, then every test in
//! the workspace against the real eBPF object.

use std::{io, process::Stdio, time::Instant};

use anyhow::{Context as _, Result, bail};

use crate::{
    counts::{TestCounts, tee_counting},
    kernels::{self, Kernel},
    layout, matrix, setup,
    util::{self, Root},
};

/// The crate built only for the BPF target, by `lb-user`'s build script.
/// Host builds, clippy's workspace pass and `cargo test` leave it out: as a
/// `no_std` host binary it does not compile ("unwinding panics are not
/// supported without std") and its test harness does not link.
pub(crate) const EBPF_CRATE: &str = "lb-ebpf";

/// What `--kernel` selected: the host's tests, and the matrix's kernels.
#[derive(Debug, PartialEq, Eq)]
struct Selection {
    host: bool,
    kernels: Vec<&'static Kernel>,
}

/// `--kernel` values: none is everything, or the host's kernel alone when
/// `cargo test` is given arguments (a filter: one suite, not the matrix's
/// seven minutes); `host` is this machine's kernel (formatting, clippy and
/// the tests); a line is that kernel of the matrix.
fn select(lines: &[String], passed_on: &[String]) -> Result<Selection> {
    if lines.is_empty() {
        return Ok(Selection {
            host: true,
            kernels: if passed_on.is_empty() {
                kernels::KERNELS.iter().collect()
            } else {
                Vec::new()
            },
        });
    }
    let mut sel = Selection {
        host: false,
        kernels: Vec::new(),
    };
    for line in lines {
        if line == "host" {
            sel.host = true;
            continue;
        }
        let k = kernels::by_line(line).with_context(|| {
            let known: Vec<&str> = kernels::KERNELS.iter().map(|k| k.line).collect();
            format!(
                "--kernel {line}: not a kernel of the matrix; one of host, {}",
                known.join(", ")
            )
        })?;
        if !sel.kernels.contains(&k) {
            sel.kernels.push(k);
        }
    }
    Ok(sel)
}

pub(crate) fn run(kernel_lines: &[String], args: &[String]) -> Result<()> {
    let sel = select(kernel_lines, args)?;
    setup::ensure()?;
    let t0 = Instant::now();
    if sel.host {
        fmt()?;
        clippy()?;
        layout::check(&util::workspace_root())?;
    }
    // The daemon, lab and end-to-end tests run the `xlb`, `xlb-backend` and
    // `xlb-client` binaries; `cargo test` alone does not promise to build them.
    util::run(util::cargo().args(["build", "--workspace", "--exclude", EBPF_CRATE, "--bins"]))
        .context("building the binaries the integration tests run")?;
    let mut counts = if sel.host {
        cargo_test(args)?
    } else {
        TestCounts::default()
    };
    let host_took = t0.elapsed();
    if !sel.kernels.is_empty() {
        let t1 = Instant::now();
        let bins = matrix::binaries()?;
        let outcomes = matrix::run(&sel.kernels, &bins)?;
        println!(
            "kernel matrix ({:.0} s; host's kernel: {:.0} s):",
            t1.elapsed().as_secs_f64(),
            host_took.as_secs_f64()
        );
        for o in &outcomes {
            println!("  {}", o.summary());
            counts.add(&o.counts);
        }
        let failed: Vec<&str> = outcomes
            .iter()
            .filter(|o| !o.passed())
            .map(|o| o.line)
            .collect();
        if !failed.is_empty() {
            bail!(
                "the kernel matrix failed on {} (output above); {}",
                failed.join(", "),
                counts.summary()
            );
        }
    }
    println!("xtask test: formatting, clippy and tests passed");
    println!("{}", counts.summary());
    Ok(())
}

fn fmt() -> Result<()> {
    util::run(util::cargo().args(["fmt", "--all", "--", "--check"])).context(
        "formatting differs from rustfmt's (diff above): run `cargo fmt --all` and commit the result",
    )
}

fn clippy() -> Result<()> {
    // Two passes, as aya-template does: one workspace-wide pass would unify
    // lb-common's features between the eBPF crate and the userspace crates,
    // pulling `std` (through aya) into the `no_std` eBPF binary. This pass
    // builds the eBPF object too (lb-user's build script), as a build would.
    util::run(util::cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--exclude",
        EBPF_CRATE,
        "--",
        "-D",
        "warnings",
    ]))
    .context("clippy found problems in the workspace (see above)")?;
    // The eBPF crate alone, for the target it is built for, so that clippy
    // sees exactly the code the kernel gets (aya-template checks it for the
    // host instead, with `-C panic=abort`). `-Z build-std=core` needs
    // nightly, as the real build does; `core` is built once into
    // target/bpfel-unknown-none and reused.
    util::run(util::cargo().args([
        "+nightly",
        "clippy",
        "--package",
        EBPF_CRATE,
        "--target",
        "bpfel-unknown-none",
        "-Z",
        "build-std=core",
        "--",
        "-D",
        "warnings",
    ]))
    .with_context(|| format!("clippy found problems in {EBPF_CRATE} (see above)"))
}

fn cargo_test(args: &[String]) -> Result<TestCounts> {
    let root = Root::obtain("running the tests (BPF programs, network namespaces)")?;
    let mut cmd = util::cargo();
    cmd.arg("test")
        .args(root.cargo_runner_args())
        .args(["--workspace", "--exclude", EBPF_CRATE])
        .args(args);
    let line = util::render(&cmd);
    eprintln!("$ {line}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start `{line}`"))?;
    let stdout = child.stdout.take().context("child stdout was not piped")?;
    let counts = tee_counting(stdout, io::stdout().lock())
        .with_context(|| format!("reading the output of `{line}`"))?;
    let status = child
        .wait()
        .with_context(|| format!("waiting for `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status}); so far {}", counts.summary());
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_selection() {
        let s = |v: &[&str]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        let all = select(&[], &[]).unwrap();
        assert!(all.host);
        assert_eq!(all.kernels.len(), kernels::KERNELS.len());
        let filtered = select(&[], &s(&["--test", "fixtures"])).unwrap();
        assert!(
            filtered.host && filtered.kernels.is_empty(),
            "a filter: the host alone"
        );
        let one = select(&s(&["6.1"]), &[]).unwrap();
        assert!(!one.host);
        assert_eq!(one.kernels, vec![kernels::by_line("6.1").unwrap()]);
        let host = select(&s(&["host"]), &[]).unwrap();
        assert!(host.host && host.kernels.is_empty());
        let twice = select(&s(&["5.10", "5.10"]), &[]).unwrap();
        assert_eq!(twice.kernels.len(), 1);
        let e = select(&s(&["4.19"]), &[]).unwrap_err().to_string();
        assert!(e.contains("4.19") && e.contains("6.12"), "{e}");
    }
}
