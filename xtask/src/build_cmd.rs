//! `cargo xtask build`: the workspace, including the eBPF object that
//! lb-user's build script compiles with nightly and embeds in `xlb`.

use anyhow::{Context as _, Result};

use crate::{setup, test::EBPF_CRATE, util};

pub(crate) fn run(release: bool) -> Result<()> {
    setup::ensure()?;
    let mut cmd = util::cargo();
    cmd.args(["build", "--workspace", "--exclude", EBPF_CRATE]);
    if release {
        cmd.arg("--release");
    }
    util::run(&mut cmd).context("the build failed (see above)")?;
    println!(
        "build: done ({} profile)",
        if release { "release" } else { "dev" }
    );
    Ok(())
}
