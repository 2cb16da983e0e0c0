//! The kernel matrix of `cargo xtask test`: each kernel of
//! [`kernels::KERNELS`] booted in QEMU by virtme-ng with this machine's root
//! shared read-only over 9p, running inside the guest the test binaries
//! built for the host: the packet fixtures (where the kernel can run them,
//! see [`Kernel::fixtures`]) and the lifecycle scenario (`lifecycle.rs`:
//! the daemon on a veth, held connections across `kill -9` and a restart,
//! a hung backend taken out, `xlb detach`). Software emulation (TCG):
//! nested KVM does not work on the machines this runs on, so a guest runs
//! tens of times slower, and the kernels go one after another.
//!
//! The guest's writes stay in the guest (virtme-ng overlays `/tmp`, `/etc`,
//! `/var`; the rest is read-only), and the VM ends with the command: no
//! namespace, pin, program or VM is left on the host.

use std::{
    fs,
    io::{self, BufRead as _, BufReader, Write as _},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    counts::TestCounts,
    kernels::{self, Kernel, Unpacked},
    util,
};

/// The test binaries the guest runs.
pub(crate) struct Binaries {
    pub(crate) fixtures: PathBuf,
    pub(crate) lifecycle: PathBuf,
}

/// Builds (if needed) and finds the fixtures' and the lifecycle test's
/// binaries, as `cargo test` built them for the host.
pub(crate) fn binaries() -> Result<Binaries> {
    let mut cmd = util::cargo();
    cmd.args([
        "test",
        "--no-run",
        "--message-format=json",
        "-p",
        "xlb-tests",
        "--test",
        "fixtures",
        "--test",
        "lifecycle",
    ]);
    let line = util::render(&cmd);
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running `{line}`"))?;
    if !out.status.success() {
        bail!("`{line}` failed ({})", out.status);
    }
    let artifacts: Vec<cargo_metadata::Artifact> =
        cargo_metadata::Message::parse_stream(out.stdout.as_slice())
            .filter_map(|m| match m {
                Ok(cargo_metadata::Message::CompilerArtifact(a)) => Some(a),
                _ => None,
            })
            .collect();
    let find = |name: &str| -> Result<PathBuf> {
        artifacts
            .iter()
            .find(|a| a.target.name == name && a.profile.test)
            .and_then(|a| a.executable.as_ref().map(|p| p.clone().into_std_path_buf()))
            .with_context(|| format!("`{line}` named no test binary `{name}`"))
    };
    Ok(Binaries {
        fixtures: find("fixtures")?,
        lifecycle: find("lifecycle")?,
    })
}

/// What one kernel's run gave.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) line: &'static str,
    pub(crate) release: String,
    pub(crate) counts: TestCounts,
    /// The guest script's own exit code (`None`: it never said, the VM
    /// died or timed out).
    pub(crate) exit: Option<i32>,
    pub(crate) verifier: Option<String>,
    pub(crate) fallbacks: Vec<String>,
    pub(crate) fixtures: bool,
    pub(crate) took: Duration,
}

impl Outcome {
    pub(crate) fn passed(&self) -> bool {
        self.exit == Some(0) && self.counts.failed == 0 && self.counts.passed > 0
    }

    /// One line of the closing summary.
    pub(crate) fn summary(&self) -> String {
        let mut s = format!(
            "{} ({}): {} in {:.0} s, {} passed, {} failed",
            self.line,
            self.release,
            if self.passed() { "passed" } else { "FAILED" },
            self.took.as_secs_f64(),
            self.counts.passed,
            self.counts.failed,
        );
        if !self.fixtures {
            s.push_str("; packet fixtures not run (BPF_PROG_TEST_RUN takes no xdp_md before 5.15)");
        }
        match &self.verifier {
            Some(v) => s.push_str(&format!("; {v}")),
            None => s.push_str(
                "; verifier count: not printed (the fixtures print it where the kernel reports it, 5.16)",
            ),
        }
        if self.fallbacks.is_empty() {
            s.push_str("; fallbacks: none");
        } else {
            s.push_str(&format!("; fallbacks: {}", self.fallbacks.join(" | ")));
        }
        s
    }
}

/// How long one kernel may take, boot to power-off. Measured under TCG on
/// this 2-CPU machine: see the README's "Supported kernels".
const KERNEL_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs the suite on each of `kernels`, one after another, printing the
/// guests' output as it comes.
pub(crate) fn run(kernels: &[&'static Kernel], bins: &Binaries) -> Result<Vec<Outcome>> {
    let vng = kernels::vng().context(
        "`vng` (virtme-ng) is neither on PATH nor beside python3: run `cargo xtask setup`",
    )?;
    let mut outcomes = Vec::new();
    for k in kernels {
        let u = kernels::unpacked(k).with_context(|| {
            format!(
                "kernel {} is not in {}: run `cargo xtask setup`",
                k.line,
                kernels::cache_dir().display()
            )
        })?;
        outcomes.push(run_one(&vng, k, &u, bins)?);
    }
    Ok(outcomes)
}

fn run_one(vng: &Path, k: &'static Kernel, u: &Unpacked, bins: &Binaries) -> Result<Outcome> {
    let script = write_script(k, u, bins)?;
    let mut cmd = Command::new(vng);
    cmd.arg("-r")
        .arg(u.image())
        .args(["--disable-kvm", "--force-9p", "--cpus", "2", "-m", "2G"])
        .arg("--exec")
        .arg(format!("bash {}", script.display()))
        .current_dir(util::workspace_root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        // Piped too, not inherited: QEMU opens its stderr again by path
        // (`/proc/self/fd/2`), which truncates a log file it was given.
        .stderr(Stdio::piped())
        // Its own process group: a timeout ends QEMU with it.
        .process_group(0);
    eprintln!("$ {}", util::render(&cmd));
    println!("kernel matrix: booting {} ({}) in QEMU", k.line, u.release);
    let t0 = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", vng.display()))?;
    let (tx, rx) = mpsc::channel::<String>();
    let readers = [
        forward(
            child.stdout.take().context("vng's stdout was not piped")?,
            tx.clone(),
        ),
        forward(
            child.stderr.take().context("vng's stderr was not piped")?,
            tx,
        ),
    ];
    let (lines, counts, timed_out) = follow(k.line, &rx, t0);
    if timed_out {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let status = child.wait().context("waiting for vng")?;
    for r in readers {
        let _ = r.join();
    }
    let took = t0.elapsed();
    let _ = fs::remove_file(&script);
    let exit = lines
        .iter()
        .rev()
        .find_map(|l| l.trim().strip_prefix(EXIT_MARK)?.trim().parse().ok());
    if timed_out {
        println!(
            "kernel matrix: {} did not finish within {} s: QEMU killed",
            k.line,
            KERNEL_TIMEOUT.as_secs()
        );
    } else if exit.is_none() {
        println!(
            "kernel matrix: {} ended ({status}) before the suite said how it went",
            k.line
        );
    }
    Ok(Outcome {
        line: k.line,
        release: u.release.clone(),
        counts,
        exit,
        verifier: lines
            .iter()
            .find(|l| l.trim_start().starts_with("verifier: "))
            .map(|l| l.trim().trim_start_matches("verifier: ").to_string()),
        fallbacks: fallbacks(&lines),
        fixtures: k.fixtures,
        took,
    })
}

/// Sends `from`'s lines to `to` until either ends.
fn forward(
    from: impl io::Read + Send + 'static,
    to: mpsc::Sender<String>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            if to.send(line).is_err() {
                break;
            }
        }
    })
}

/// Prints the guest's lines as they come, prefixed with its kernel line,
/// and counts libtest's results, until the guest ends or [`KERNEL_TIMEOUT`]
/// from `t0` passes (true: timed out).
fn follow(line: &str, rx: &mpsc::Receiver<String>, t0: Instant) -> (Vec<String>, TestCounts, bool) {
    let mut counts = TestCounts::default();
    let mut lines = Vec::new();
    loop {
        let left = KERNEL_TIMEOUT.saturating_sub(t0.elapsed());
        match rx.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok(l) => {
                println!("[{line}] {l}");
                let _ = io::stdout().flush();
                counts.add_line(&l);
                lines.push(l);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return (lines, counts, false),
            Err(mpsc::RecvTimeoutError::Timeout) => return (lines, counts, true),
        }
    }
}

/// The line the guest script ends with: `xlb-matrix: exit N`.
const EXIT_MARK: &str = "xlb-matrix: exit";

/// The daemon's fallback lines (`kernel X lacks F: ...`), each once, as
/// the lifecycle test prints them from the daemon's log.
fn fallbacks(lines: &[String]) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for l in lines {
        let Some(i) = l.find(" lacks ") else { continue };
        let rest = &l[i + " lacks ".len()..];
        let feature = rest.split(':').next().unwrap_or(rest).trim().to_string();
        if !seen.contains(&feature) {
            seen.push(feature);
        }
    }
    seen
}

/// The script the guest runs, written where the guest sees it (the host's
/// root is its root).
fn write_script(k: &Kernel, u: &Unpacked, bins: &Binaries) -> Result<PathBuf> {
    let dir = util::workspace_root().join("target/matrix");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("guest-{}.sh", k.line));
    let tests_dir = util::workspace_root().join("tests");
    let fixtures = if k.fixtures {
        format!(
            "run {} --test-threads 1 --show-output",
            bins.fixtures.display()
        )
    } else {
        "echo 'xlb-matrix: packet fixtures not run: BPF_PROG_TEST_RUN takes no xdp_md before 5.15'"
            .to_string()
    };
    let text = format!(
        r#"#!/bin/bash
# Written and run by `cargo xtask test` (xtask/src/matrix.rs) inside a QEMU
# guest of kernel {release}: the host's root, read-only but for virtme-ng's
# overlays; every write stays in the guest.
set -u
exec 2>&1
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
# The kernel's modules (veth, bridge, sch_ingress, ...) from the package
# unpacked on the host, where modprobe looks for them (virtme-ng leaves a
# link there, or nothing).
m=/usr/lib/modules/{release}
if [ ! -d "$m/kernel" ]; then
    rm -f "$m" 2>/dev/null
    mkdir -p "$m" && mount --bind {modules} "$m"
fi
ip link set lo up
export RUST_BACKTRACE=1
cd {tests_dir}
echo "xlb-matrix: kernel $(uname -r), $(nproc) CPUs"
rc=0
run() {{ "$@" || rc=1; }}
{fixtures}
run {lifecycle} --test-threads 1 --nocapture
echo "{EXIT_MARK} $rc"
"#,
        release = u.release,
        modules = u.modules().display(),
        tests_dir = tests_dir.display(),
        lifecycle = bins.lifecycle.display(),
    );
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallbacks_are_read_once_each() {
        let lines: Vec<String> = [
            "  WARN kernel 5.10.0-32-amd64 lacks bpf_fib_lookup's mtu_result (5.12): a next hop's ...",
            "  WARN kernel 5.10.0-32-amd64 lacks tcx links (6.6): xlb_hc is a filter ...",
            "  WARN kernel 5.10.0-32-amd64 lacks tcx links (6.6): xlb_hc is a filter ...",
            "test result: ok. 1 passed",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            fallbacks(&lines),
            vec!["bpf_fib_lookup's mtu_result (5.12)", "tcx links (6.6)"]
        );
    }

    #[test]
    fn outcome_passes_only_with_the_scripts_zero_and_tests_run() {
        let mut o = Outcome {
            line: "6.1",
            release: "6.1.0-50-amd64".into(),
            counts: TestCounts {
                passed: 40,
                failed: 0,
                ignored: 0,
            },
            exit: Some(0),
            verifier: None,
            fallbacks: vec![],
            fixtures: true,
            took: Duration::from_secs(1),
        };
        assert!(o.passed());
        o.exit = None;
        assert!(!o.passed(), "a VM that never said how it went");
        o.exit = Some(0);
        o.counts.passed = 0;
        assert!(!o.passed(), "no test ran");
        o.counts.passed = 40;
        o.counts.failed = 1;
        assert!(!o.passed());
    }
}
