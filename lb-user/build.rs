#![allow(
    unused_crate_dependencies,
    reason = "lb-ebpf is a build dependency only so cargo knows xlb depends on it \
              (as aya-template does); aya-build compiles it for the BPF target"
)]

use std::{env, fs, path::PathBuf};

use anyhow::{Context as _, anyhow};
use aya_build::Toolchain;

/// The object files `lb-ebpf` produces (one per `[[bin]]`), embedded by the
/// loader with `include_bytes_aligned!`.
const EBPF_BINS: &[&str] = &["xlb"];

fn main() -> anyhow::Result<()> {
    git_commit();
    let skip =
        env::var_os("AYA_BUILD_SKIP").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        // Editors, `cargo check` and unit tests work without the eBPF
        // toolchain: embed empty objects; loading then fails with a message
        // that says how this binary was built.
        println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
        let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
        for bin in EBPF_BINS {
            fs::write(out_dir.join(bin), []).with_context(|| format!("writing empty {bin}"))?;
        }
        return Ok(());
    }
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("MetadataCommand::exec")?;
    let ebpf_package = packages
        .into_iter()
        .find(|cargo_metadata::Package { name, .. }| name.as_str() == "lb-ebpf")
        .ok_or_else(|| anyhow!("lb-ebpf package not found"))?;
    let cargo_metadata::Package {
        name,
        manifest_path,
        ..
    } = ebpf_package;
    let ebpf_package = aya_build::Package {
        name: name.as_str(),
        root_dir: manifest_path
            .parent()
            .ok_or_else(|| anyhow!("no parent for {manifest_path}"))?
            .as_str(),
        ..Default::default()
    };
    select_bpf_cpu();
    aya_build::build_ebpf([ebpf_package], Toolchain::default())
}

/// Sets `XLB_GIT_COMMIT` for `xlb --version`: the commit this build comes
/// from, or "unknown" outside a git checkout (a source tarball, a vendored
/// build), which is never a reason to fail the build.
fn git_commit() {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    // A packager building outside git can name the commit itself.
    let commit = env::var("XLB_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=XLB_GIT_COMMIT={commit}");
    // A new commit (HEAD moving, or the branch it names) rebuilds with the
    // new hash; `--git-path` finds both in a worktree too. aya-build already
    // names the eBPF sources, so these add to its list.
    for path in [
        Some("HEAD".to_owned()),
        git(&["symbolic-ref", "-q", "HEAD"]),
    ]
    .into_iter()
    .flatten()
    {
        // A file that does not exist (a packed ref) would rerun every build.
        if let Some(file) = git(&["rev-parse", "--git-path", &path])
            && std::path::Path::new(&file).exists()
        {
            println!("cargo:rerun-if-changed={file}");
        }
    }
    println!("cargo:rerun-if-env-changed=XLB_GIT_COMMIT");
}

/// The BPF instruction set the object is compiled for: v3 (32-bit ALU
/// operations and 32-bit jumps, Linux ≥ 5.1, below the README's 5.11), not
/// rustc's default `generic` (v1). It takes 3 to 4 % of the instructions
/// off every path of `xlb_lb` (docs/benchmarks.md, "the BPF instruction
/// set").
///
/// aya-build sets `CARGO_ENCODED_RUSTFLAGS` for its nested cargo, which
/// overrides every other source of rustflags, and bpf-linker takes the CPU
/// from rustc (a second `--cpu` link argument is refused). A profile's
/// rustflags are added on top of them: the nested cargo is nightly, where
/// `profile-rustflags` is available, and inherits this process's
/// environment. The build scripts and proc-macros it compiles for the host
/// keep no rustflags of their own (`build-override`).
fn select_bpf_cpu() {
    // SAFETY: a build script is single-threaded; nothing reads the
    // environment concurrently.
    unsafe {
        env::set_var("CARGO_UNSTABLE_PROFILE_RUSTFLAGS", "true");
        env::set_var("CARGO_PROFILE_RELEASE_RUSTFLAGS", "-Ctarget-cpu=v3");
        env::set_var("CARGO_PROFILE_RELEASE_BUILD_OVERRIDE_RUSTFLAGS", "");
    }
}
