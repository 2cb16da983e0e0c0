//! `cargo xtask dist [--debug] [--out DIR]`: what an operator installs. A
//! build of `xlb` (the eBPF object embedded) and the lab binaries, packed
//! as a Debian package and a tarball, with the systemd units, the example
//! configuration, shell completions and man pages (the last two generated
//! by the built `xlb` itself: `xlb generate`).
//!
//! The package is built with `dpkg-deb --build --root-owner-group` from a
//! staged tree, not with cargo-deb: dpkg-deb is on every Debian machine,
//! while cargo-deb would have to be downloaded and compiled first, and the
//! tree it would produce is the one staged here anyway.

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{lab::Paths, setup, util};

/// The package's name, and the binary's.
const NAME: &str = "xlb";

/// The lab binaries that go into the tarball (not the package: they serve
/// the namespaced lab and the benchmarks, which need the source tree
/// anyway, and an operator's host has no use for a test client and server).
pub(crate) const LAB_BINARIES: &[&str] = &["xlb-backend", "xlb-client", "xlb-grpc-health"];

/// Where each file of the package goes, from the staged root.
pub(crate) const BIN: &str = "usr/bin/xlb";
pub(crate) const CONFIG: &str = "etc/xlb/xlb.toml";
pub(crate) const UNITS: &str = "lib/systemd/system";
pub(crate) const BASH_COMPLETION: &str = "usr/share/bash-completion/completions/xlb";
pub(crate) const ZSH_COMPLETION: &str = "usr/share/zsh/vendor-completions/_xlb";
pub(crate) const FISH_COMPLETION: &str = "usr/share/fish/vendor_completions.d/xlb.fish";
pub(crate) const MAN_DIR: &str = "usr/share/man/man1";
const DOC_DIR: &str = "usr/share/doc/xlb";

/// The unit files in `packaging/systemd/`.
pub(crate) const UNIT_FILES: &[&str] = &["xlb.service", "xlb-decap@.service"];

/// What `dist` produced.
#[derive(Debug)]
pub(crate) struct Artifacts {
    pub deb: PathBuf,
    pub tarball: PathBuf,
}

pub(crate) fn run(debug: bool, out: Option<PathBuf>) -> Result<()> {
    setup::ensure()?;
    let paths = Paths::find()?;
    let mut cmd = util::cargo();
    cmd.args(["build", "-p", "lb-user", "-p", "xlb-lab", "--bins"]);
    if !debug {
        cmd.arg("--release");
    }
    util::run(&mut cmd).context("the build failed (see above)")?;
    let bin_dir = paths.bin(!debug, NAME).with_file_name("");
    let out = out.unwrap_or_else(|| paths.target.join("dist"));
    let a = pack(&paths.root, &bin_dir, &out, debug)?;
    println!("dist: {}", a.deb.display());
    println!("dist: {}", a.tarball.display());
    Ok(())
}

/// Stages and packs the binaries in `bin_dir` with the files of the
/// workspace at `root` into `out`; `fast` compresses lightly (a debug
/// build's binaries are large, and only tests read them).
pub(crate) fn pack(root: &Path, bin_dir: &Path, out: &Path, fast: bool) -> Result<Artifacts> {
    let xlb = bin_dir.join(NAME);
    ensure!(
        xlb.is_file(),
        "{} is missing: build it first (`cargo build -p lb-user`)",
        xlb.display()
    );
    let version = env!("CARGO_PKG_VERSION");
    let arch = probe_output(Command::new("dpkg").arg("--print-architecture"))?;
    let stage = out.join("stage");
    if stage.exists() {
        fs::remove_dir_all(&stage).with_context(|| format!("removing {}", stage.display()))?;
    }
    let deb_root = stage.join("deb");
    stage_files(root, &xlb, &deb_root)?;
    let control = control(version, &arch, &min_glibc(&fs::read(&xlb)?));
    write(&deb_root.join("DEBIAN/control"), &control, 0o644)?;
    write(
        &deb_root.join("DEBIAN/conffiles"),
        &format!("/{CONFIG}\n"),
        0o644,
    )?;
    write(&deb_root.join("DEBIAN/postinst"), POSTINST, 0o755)?;
    write(&deb_root.join("DEBIAN/postrm"), POSTRM, 0o755)?;
    let deb = out.join(format!("{NAME}_{version}_{arch}.deb"));
    run_quiet(
        Command::new("dpkg-deb")
            .args(["--build", "--root-owner-group"])
            .args(if fast {
                &["-Zgzip", "-z1"][..]
            } else {
                &["-Zxz"][..]
            })
            .arg(&deb_root)
            .arg(&deb),
    )?;
    let tarball = out.join(format!("{NAME}-{version}-{arch}.tar.gz"));
    let top = format!("{NAME}-{version}");
    pack_tarball(bin_dir, &deb_root, &stage, &top, &tarball, fast)?;
    fs::remove_dir_all(&stage).with_context(|| format!("removing {}", stage.display()))?;
    Ok(Artifacts { deb, tarball })
}

/// Lays out the package's files under `to`.
fn stage_files(root: &Path, xlb: &Path, to: &Path) -> Result<()> {
    copy_binary(xlb, &to.join(BIN))?;
    // 0640 root:root: the file may hold `hash_seed`, a secret; the daemon
    // warns about a seed others may read.
    copy(&root.join("examples/xlb.toml"), &to.join(CONFIG), 0o640)?;
    for unit in UNIT_FILES {
        copy(
            &root.join("packaging/systemd").join(unit),
            &to.join(UNITS).join(unit),
            0o644,
        )?;
    }
    let gen_dir = to.join("../generated");
    fs::create_dir_all(&gen_dir)?;
    generate(xlb, "completions", &gen_dir)?;
    for (file, dest) in [
        ("xlb.bash", BASH_COMPLETION),
        ("_xlb", ZSH_COMPLETION),
        ("xlb.fish", FISH_COMPLETION),
    ] {
        copy(&gen_dir.join(file), &to.join(dest), 0o644)?;
    }
    let man_dir = gen_dir.join("man");
    fs::create_dir_all(&man_dir)?;
    generate(xlb, "man", &man_dir)?;
    let man_to = to.join(MAN_DIR);
    fs::create_dir_all(&man_to)?;
    for entry in fs::read_dir(&man_dir)? {
        let page = entry?.path();
        let dest = man_to.join(page.file_name().context("a man page without a name")?);
        copy(&page, &dest, 0o644)?;
        // Debian gzips man pages; -n leaves out the name and time, so the
        // same page gives the same bytes.
        run_quiet(Command::new("gzip").args(["-9n"]).arg(&dest))?;
    }
    write(&to.join(DOC_DIR).join("copyright"), COPYRIGHT, 0o644)?;
    Ok(())
}

/// `xlb generate WHAT --out DIR`.
fn generate(xlb: &Path, what: &str, dir: &Path) -> Result<()> {
    run_quiet(Command::new(xlb).args(["generate", what, "--out"]).arg(dir))
}

/// The tarball: `NAME-VERSION/` with `bin/` (xlb and the lab binaries) and
/// the package's files under their installed paths (`etc/`, `lib/`,
/// `usr/share/`), for hosts without dpkg.
fn pack_tarball(
    bin_dir: &Path,
    deb_root: &Path,
    stage: &Path,
    top: &str,
    to: &Path,
    fast: bool,
) -> Result<()> {
    let dir = stage.join(top);
    for bin in std::iter::once(NAME).chain(LAB_BINARIES.iter().copied()) {
        let from = bin_dir.join(bin);
        ensure!(
            from.is_file(),
            "{} is missing: build it first (`cargo build -p xlb-lab`)",
            from.display()
        );
        copy_binary(&from, &dir.join("bin").join(bin))?;
    }
    for sub in ["etc", "lib", "usr/share"] {
        run_quiet(
            Command::new("cp")
                .args(["-a", "--parents", sub])
                .arg(&dir)
                .current_dir(deb_root),
        )?;
    }
    run_quiet(
        Command::new("tar")
            .args(["--owner=0", "--group=0", "--sort=name"])
            .args(["-I", if fast { "gzip -1" } else { "gzip -9n" }, "-cf"])
            .arg(to)
            .arg("-C")
            .arg(stage)
            .arg(top),
    )
}

/// DEBIAN/control. The maintainer is a placeholder until xlb has a
/// published address. Depends: the C library (the binary's newest glibc
/// symbol version) and libgcc_s (Rust's unwinder); xlb runs no other
/// program and links nothing else.
pub(crate) fn control(version: &str, arch: &str, glibc: &str) -> String {
    format!(
        "Package: {NAME}\n\
         Version: {version}\n\
         Architecture: {arch}\n\
         Maintainer: xlb developers <xlb@localhost>\n\
         Depends: libc6 (>= {glibc}), libgcc-s1\n\
         Section: net\n\
         Priority: optional\n\
         Description: XDP layer-4 load balancer (Maglev hashing, direct server return)\n \
         xlb balances TCP and UDP flows to backends in XDP, before the kernel's\n \
         network stack, with Maglev consistent hashing, connection tracking and\n \
         direct server return (L2 or IP-in-IP). Its daemon health-checks the\n \
         backends, keeps flows across restarts, and answers the `xlb` commands.\n"
    )
}

/// The highest `GLIBC_x.y` symbol version named in `binary` (what libc6
/// must provide), or 2.17 if none is found.
pub(crate) fn min_glibc(binary: &[u8]) -> String {
    const TAG: &[u8] = b"GLIBC_";
    let mut best: (u32, u32) = (2, 17);
    let mut rest = binary;
    while let Some(at) = rest.windows(TAG.len()).position(|w| w == TAG) {
        rest = &rest[at + TAG.len()..];
        let end = rest
            .iter()
            .position(|b| !(b.is_ascii_digit() || *b == b'.'))
            .unwrap_or(rest.len());
        let v = std::str::from_utf8(&rest[..end]).unwrap_or("");
        let mut parts = v.split('.').map(str::parse::<u32>);
        if let (Some(Ok(major)), Some(Ok(minor))) = (parts.next(), parts.next()) {
            best = best.max((major, minor));
        }
    }
    format!("{}.{}", best.0, best.1)
}

/// Tells systemd about the new units; enables and starts nothing: the
/// example configuration names `eth0`, and attaching a load balancer to an
/// interface is the operator's decision.
const POSTINST: &str = "#!/bin/sh\nset -e\n\
if [ \"$1\" = configure ] && [ -d /run/systemd/system ]; then\n\
\tsystemctl daemon-reload || true\n\
fi\n";

const POSTRM: &str = "#!/bin/sh\nset -e\n\
if [ -d /run/systemd/system ]; then\n\
\tsystemctl daemon-reload || true\n\
fi\n";

const COPYRIGHT: &str = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
Upstream-Name: xlb\n\n\
Files: *\n\
License: MIT or Apache-2.0\n";

/// Copies a binary without its DWARF (`strip --strip-debug`, binutils,
/// which every Rust toolchain's linker brings): a fifth of the size, and
/// symbols stay, so a backtrace still names functions. The eBPF object
/// is data of the binary and stays whole.
fn copy_binary(from: &Path, to: &Path) -> Result<()> {
    copy(from, to, 0o755)?;
    run_quiet(Command::new("strip").arg("--strip-debug").arg(to))
}

fn copy(from: &Path, to: &Path, mode: u32) -> Result<()> {
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", to.display()))
}

fn write(to: &Path, text: &str, mode: u32) -> Result<()> {
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::write(to, text).with_context(|| format!("writing {}", to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", to.display()))
}

/// Runs `cmd`, failing with its command line and stderr.
fn run_quiet(cmd: &mut Command) -> Result<()> {
    probe_output(cmd).map(drop)
}

/// Runs `cmd` and returns its trimmed stdout, failing with its stderr.
fn probe_output(cmd: &mut Command) -> Result<String> {
    let line = util::render(cmd);
    let out = cmd
        .output()
        .with_context(|| format!("could not start `{line}`"))?;
    if !out.status.success() {
        bail!(
            "`{line}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests;
