//! `cargo xtask setup`: install what building and testing xlb needs on a
//! Debian 12 machine with rustup's stable and nightly toolchains, and nothing
//! else. Every step checks first and does work only when something is
//! missing, so a second run costs a few quick queries.

use std::process::Command;

use anyhow::{Context as _, Result, anyhow, bail};

use crate::util::{self, Root};

/// Rustup components, as (toolchain, component, why).
const COMPONENTS: &[(&str, &str, &str)] = &[
    // aya-build compiles `core` for bpfel-unknown-none (`-Z build-std=core`).
    ("nightly", "rust-src", "building the eBPF object"),
    // `cargo xtask test` checks formatting and lints with the stable toolchain.
    (
        "stable",
        "rustfmt",
        "`cargo fmt --check` in `cargo xtask test`",
    ),
    ("stable", "clippy", "`cargo clippy` in `cargo xtask test`"),
    // The eBPF crate's clippy pass needs `-Z build-std`, so it runs on nightly.
    (
        "nightly",
        "clippy",
        "the eBPF crate's clippy pass in `cargo xtask test`",
    ),
];

/// Debian packages for building.
const BUILD_PACKAGES: &[&str] = &[
    // bpf-linker 0.13 is built against LLVM 22 (`--features llvm-22`), the
    // LLVM of rustc nightly whose bitcode it links; Debian 12 has it in
    // bookworm-security.
    "llvm-22-dev",
    // LLVM 22's `llvm-config --libs` names Polly, so linking bpf-linker fails
    // without it.
    "libpolly-22-dev",
    // LLVM 22 is built with zstd compression; linking it needs `-lzstd`.
    "libzstd-dev",
];

/// Debian packages that the integration tests (crate `xlb-tests`) run.
const TEST_PACKAGES: &[&str] = &[
    // `ip netns`, `ip link add type veth`: each test's own network namespaces.
    "iproute2",
    // Real servers behind the probe kinds' lab tests (issue 25): DNS
    // (`dnsmasq`, from dnsmasq-base without its system service), Redis for
    // send/expect, `openssl s_server` and the lab certificates for TLS;
    // `dnsperf` replays the DNS incident and `dig` is the DNS probe's
    // reference in the benchmark.
    "dnsmasq-base",
    "redis-server",
    "openssl",
    "dnsperf",
    "bind9-dnsutils",
    // BIRD 2 (`bird`, `birdc`): the BGP speaker of the two-node lab's router
    // and LB nodes (issue 26), each instance run inside its namespace.
    "bird2",
    // `promtool` checks /metrics (`check metrics`) and the alert rules in
    // contrib/ (`check rules`, `test rules`), issue 28.
    "prometheus",
    // Headless Chromium loads the status page in the lab (status_page.rs).
    "chromium",
    // The package test (`xtask/src/dist/tests.rs`): `man -l` on every page,
    // `systemd-analyze verify` on the units (no systemd as PID 1 needed),
    // `zsh -n` on the zsh completion.
    "man-db",
    "systemd",
    "zsh",
    // A real terminal for `xlb top`'s lab test (a detached session read
    // with `capture-pane`).
    "tmux",
    // The kernel matrix (`xtask/src/matrix.rs`): QEMU boots each kernel,
    // virtme-ng (from PyPI, below) drives it; it builds the guest's
    // initramfs with BusyBox and the kernel's modules with kmod's `depmod`.
    "qemu-system-x86",
    "busybox-static",
    "kmod",
];

/// Debian packages for the lab (`xlb-lab`) and the benchmarks.
const LAB_PACKAGES: &[&str] = &[
    // HTTP load generator that drives traffic through the load balancer.
    "wrk",
    // `xlb-lab-bench`'s full-proxy comparisons in the LB namespace: HAProxy
    // in `mode tcp`, and nftables DNAT (`nft`), which `xlb-tput-bench`
    // compares with too.
    "haproxy", "nftables",
    // `xlb-katran-bench`: Katran's balancer, built from its source (clang)
    // and loaded and pinned with bpftool.
    "clang", "bpftool",
];

/// Every Debian package setup installs: `docs/development.md` names each
/// (`development_md_names_every_package`).
pub(crate) const PACKAGES: &[&[&str]] = &[BUILD_PACKAGES, TEST_PACKAGES, LAB_PACKAGES];

/// The LLVM that [`BUILD_PACKAGES`] installs.
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

/// The bpf-linker release line that works with aya 0.14 and LLVM 22.
const BPF_LINKER_REQ: &str = "^0.13";

pub(crate) fn run() -> Result<()> {
    ensure()?;
    println!("setup: done");
    Ok(())
}

/// Runs every step; each prints one line saying whether it was already done.
pub(crate) fn ensure() -> Result<()> {
    let host = host_triple()?;
    for &(toolchain, component, why) in COMPONENTS {
        ensure_component(&host, toolchain, component, why)?;
    }
    ensure_packages(&PACKAGES.concat())?;
    ensure_bpf_linker()?;
    ensure_virtme_ng()?;
    crate::kernels::ensure()?;
    Ok(())
}

/// The virtme-ng release the kernel matrix is run with (PyPI).
const VIRTME_NG: &str = "1.42";

/// Whether `vng --version` output is [`VIRTME_NG`]'s (`virtme-ng 1.42`).
fn wanted_virtme_ng(version_output: &str) -> bool {
    version_output.split_whitespace().nth(1) == Some(VIRTME_NG)
}

fn ensure_virtme_ng() -> Result<()> {
    let found = crate::kernels::vng()
        .and_then(|p| util::probe(util::command(&p).arg("--version")))
        .map(|v| v.trim().to_owned());
    if let Some(v) = &found
        && wanted_virtme_ng(v)
    {
        println!("setup: virtme-ng {VIRTME_NG}: present");
        return Ok(());
    }
    println!(
        "setup: virtme-ng {VIRTME_NG}: installing with pip ({})",
        found.as_deref().unwrap_or("not found")
    );
    let mut install = util::command("python3");
    install.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        &format!("virtme-ng=={VIRTME_NG}"),
    ]);
    let line = util::render(&install);
    util::run(&mut install).with_context(|| {
        format!("virtme-ng (boots the kernel matrix in QEMU) could not be installed: run `{line}`")
    })?;
    let now = crate::kernels::vng()
        .and_then(|p| util::probe(util::command(&p).arg("--version")))
        .unwrap_or_default();
    if !wanted_virtme_ng(&now) {
        bail!(
            "`{line}` succeeded but `vng --version` says {:?}: check which python3 pip \
             installed it for",
            now.trim()
        );
    }
    Ok(())
}

/// The host triple, which rustup appends to most component names.
fn host_triple() -> Result<String> {
    let out = util::probe(util::command("rustc").arg("-vV")).ok_or_else(|| {
        anyhow!("`rustc -vV` failed: install Rust with rustup (https://rustup.rs) and retry")
    })?;
    out.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(|h| h.trim().to_owned())
        .context("`rustc -vV` printed no `host:` line")
}

/// Whether `rustup component list --installed` output lists `component`,
/// which rustup prints either bare (`rust-src`) or with the host triple
/// (`clippy-x86_64-unknown-linux-gnu`).
fn component_listed(installed: &str, component: &str, host: &str) -> bool {
    let with_host = format!("{component}-{host}");
    installed
        .lines()
        .map(str::trim)
        .any(|l| l == component || l == with_host)
}

fn ensure_component(host: &str, toolchain: &str, component: &str, why: &str) -> Result<()> {
    let installed = util::probe(util::command("rustup").args([
        "component",
        "list",
        "--toolchain",
        toolchain,
        "--installed",
    ]))
    .unwrap_or_default();
    if component_listed(&installed, component, host) {
        println!("setup: {component} for {toolchain}: present");
        return Ok(());
    }
    println!("setup: {component} for {toolchain}: installing (needed for {why})");
    let mut add = util::command("rustup");
    add.args(["component", "add", component, "--toolchain", toolchain]);
    let line = util::render(&add);
    util::run(&mut add).with_context(|| {
        format!(
            "{component} for the {toolchain} toolchain is missing (needed for {why}) and \
             could not be installed: run `{line}` (the {toolchain} toolchain itself comes \
             from `rustup toolchain install {toolchain}`)"
        )
    })
}

/// Whether `dpkg-query -W -f='${Status}'` output means installed.
fn dpkg_installed(status: &str) -> bool {
    status.trim() == "install ok installed"
}

fn ensure_packages(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|pkg| {
            let status = util::probe(util::command("dpkg-query").args(["-W", "-f=${Status}", pkg]));
            !status.is_some_and(|s| dpkg_installed(&s))
        })
        .collect();
    if missing.is_empty() {
        println!("setup: Debian packages {}: present", packages.join(" "));
        return Ok(());
    }
    let list = missing.join(" ");
    println!("setup: Debian packages {list}: installing");
    let fix = format!("apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y {list}");
    let install = || -> Result<()> {
        util::run(&mut as_root(&["apt-get", "update"])?)?;
        let mut args = vec![
            "env",
            "DEBIAN_FRONTEND=noninteractive",
            "apt-get",
            "install",
            "-y",
        ];
        args.extend(&missing);
        util::run(&mut as_root(&args)?)
    };
    install().with_context(|| {
        format!(
            "Debian packages {list} are missing and could not be installed: run `{fix}` as root"
        )
    })
}

/// `argv` as root: directly when we are, else through `sudo -n`, which fails
/// at once instead of waiting for a password nobody will type (CI, scripts).
fn as_root(argv: &[&str]) -> Result<Command> {
    let (program, args) = argv.split_first().context("empty command")?;
    Ok(
        match Root::obtain("installing Debian packages (apt-get)")? {
            Root::Already => {
                let mut cmd = util::command(program);
                cmd.args(args);
                cmd
            }
            Root::Sudo => {
                let mut cmd = util::command("sudo");
                cmd.arg("-n").args(argv);
                cmd
            }
        },
    )
}

/// Whether `bpf-linker --version` output is of the release line we want
/// (`bpf-linker 0.13.0`).
fn wanted_bpf_linker(version_output: &str) -> bool {
    version_output.split_whitespace().nth(1).is_some_and(|v| {
        v.strip_prefix("0.13.")
            .is_some_and(|patch| !patch.is_empty())
    })
}

/// The `bpf-linker` that rustc will find, and what it says its version is.
fn current_bpf_linker() -> Option<(std::path::PathBuf, String)> {
    let path = util::find_program("bpf-linker")?;
    let version = util::probe(util::command(&path).arg("--version"))?;
    Some((path, version.trim().to_owned()))
}

fn ensure_bpf_linker() -> Result<()> {
    let found = current_bpf_linker();
    if let Some((path, version)) = &found
        && wanted_bpf_linker(version)
    {
        println!(
            "setup: bpf-linker {BPF_LINKER_REQ}: present ({version} at {})",
            path.display()
        );
        return Ok(());
    }
    let seen = match &found {
        Some((path, version)) => format!("found {version} at {}", path.display()),
        None => "not found".to_owned(),
    };
    println!("setup: bpf-linker {BPF_LINKER_REQ}: installing ({seen}; takes a few minutes)");
    let mut install = util::command("cargo");
    install
        // llvm-sys finds LLVM 22 through this...
        .env("LLVM_SYS_221_PREFIX", LLVM_PREFIX)
        // ...and bpf-linker's own build script through this; without it, it
        // asks /usr/bin/llvm-config, which belongs to an older LLVM, and the
        // link fails with "unable to find library -lLLVM".
        .env("LLVM_PREFIX", LLVM_PREFIX)
        .args([
            "+stable",
            "install",
            "bpf-linker",
            "--version",
            BPF_LINKER_REQ,
            "--locked",
            "--no-default-features",
            "--features",
            "llvm-22",
        ]);
    let line = util::render(&install);
    util::run(&mut install).with_context(|| {
        format!(
            "bpf-linker {BPF_LINKER_REQ} (links the eBPF object) is missing and could not be \
             installed: run `{line}`"
        )
    })?;
    match current_bpf_linker() {
        Some((_, version)) if wanted_bpf_linker(&version) => Ok(()),
        Some((path, version)) => bail!(
            "bpf-linker was installed in {}, but {} ({version}) comes first on PATH: remove it \
             or put {} first on PATH",
            util::cargo_bin_dir().unwrap_or_default().display(),
            path.display(),
            util::cargo_bin_dir().unwrap_or_default().display(),
        ),
        None => bail!(
            "`{line}` succeeded but `bpf-linker --version` still does not run: check that \
             {} is where cargo installs binaries (CARGO_HOME)",
            util::cargo_bin_dir().unwrap_or_default().display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "x86_64-unknown-linux-gnu";

    #[test]
    fn component_listed_cases() {
        let installed = "cargo-x86_64-unknown-linux-gnu\nclippy-x86_64-unknown-linux-gnu\n\
                         rust-src\nrustc-x86_64-unknown-linux-gnu\n";
        let cases = [
            ("bare name", "rust-src", true),
            ("name with host triple", "clippy", true),
            ("absent", "rustfmt", false),
            ("prefix of another component is not enough", "rust", false),
            ("other component's prefix", "rustc-dev", false),
        ];
        for (name, component, want) in cases {
            assert_eq!(
                component_listed(installed, component, HOST),
                want,
                "case {name}"
            );
        }
        assert!(!component_listed("", "rust-src", HOST), "empty list");
    }

    #[test]
    fn dpkg_status_cases() {
        let cases = [
            ("installed", "install ok installed", true),
            ("removed, config left", "deinstall ok config-files", false),
            ("half installed", "install reinstreq half-installed", false),
            ("empty", "", false),
        ];
        for (name, status, want) in cases {
            assert_eq!(dpkg_installed(status), want, "case {name}");
        }
    }

    #[test]
    fn bpf_linker_version_cases() {
        let cases = [
            ("0.13.0", "bpf-linker 0.13.0\n", true),
            ("later patch", "bpf-linker 0.13.7", true),
            ("older minor", "bpf-linker 0.12.3", false),
            ("newer minor", "bpf-linker 0.14.0", false),
            ("0.1.13 is not 0.13", "bpf-linker 0.1.13", false),
            ("no patch", "bpf-linker 0.13.", false),
            ("no version", "bpf-linker", false),
            ("empty", "", false),
        ];
        for (name, output, want) in cases {
            assert_eq!(wanted_bpf_linker(output), want, "case {name}");
        }
    }

    #[test]
    fn virtme_ng_version_cases() {
        assert!(wanted_virtme_ng("virtme-ng 1.42\n"));
        assert!(!wanted_virtme_ng("virtme-ng 1.41"));
        assert!(!wanted_virtme_ng("virtme-ng 1.421"));
        assert!(!wanted_virtme_ng(""));
    }

    #[test]
    fn package_lists_have_no_duplicates() {
        let all = PACKAGES.concat();
        let mut sorted = all.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len(), "{all:?}");
    }

    /// The packages listed in docs/development.md are the ones setup
    /// installs: a package added here without its line there fails.
    #[test]
    fn development_md_names_every_package() {
        let doc = include_str!("../../docs/development.md");
        let doc = doc
            .split_once("\n## Building")
            .and_then(|(_, rest)| rest.split_once("\n## ").map(|(b, _)| b))
            .expect("docs/development.md has a \"## Building\" section");
        let missing: Vec<&str> = PACKAGES
            .concat()
            .into_iter()
            .filter(|p| !doc.contains(&format!("`{p}`")))
            .collect();
        assert!(
            missing.is_empty(),
            "docs/development.md (\"Building\") does not name {missing:?}"
        );
    }
}
