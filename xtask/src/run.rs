//! `cargo xtask run`: build `xlb` in release and run it as root, the way an
//! operator runs it on a host (`cargo xtask run -- run --config xlb.toml`).

use anyhow::Result;

use crate::{
    setup,
    util::{self, Root},
};

pub(crate) fn run(args: &[String]) -> Result<()> {
    setup::ensure()?;
    let root = Root::obtain("running xlb (it loads XDP programs)")?;
    let mut cmd = util::cargo();
    cmd.arg("run")
        .args(root.cargo_runner_args())
        .args(["--release", "--package", "lb-user", "--bin", "xlb", "--"])
        .args(args);
    // `cargo run` builds, then execs xlb (through `sudo -E` when we are not
    // root) in its own place; replacing this process with cargo leaves xlb
    // as the process the shell started, so Ctrl-C and `kill` reach it
    // directly and its exit code is the command's.
    Err(util::exec(cmd))
}
