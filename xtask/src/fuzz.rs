//! `cargo xtask fuzz`: a long run of the XDP fuzzer (`tests/tests/fuzz`),
//! as root. The test suite runs a short one (a million frames); this runs
//! `--frames N` from `--seed S` (else a seed from the clock, printed) and
//! prints frames, seconds and violations.

use anyhow::{Context as _, Result};

use crate::{
    setup,
    util::{self, Root},
};

/// The long run's options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Options {
    pub(crate) frames: u64,
    pub(crate) seed: Option<u64>,
    pub(crate) release: bool,
}

/// The `cargo test` invocation of the long run (without the root runner).
fn test_args(opts: &Options) -> Vec<String> {
    let mut args = vec!["test".to_owned()];
    if opts.release {
        args.push("--release".to_owned());
    }
    args.extend(
        [
            "--package",
            "xlb-tests",
            "--test",
            "fuzz",
            "--",
            "--ignored",
            "--exact",
            "xdp_fuzz_long",
            "--nocapture",
        ]
        .map(str::to_owned),
    );
    args
}

pub(crate) fn run(opts: &Options) -> Result<()> {
    setup::ensure()?;
    let root = Root::obtain("fuzzing the XDP program (BPF_PROG_TEST_RUN, a network namespace)")?;
    let args = test_args(opts);
    let mut cmd = util::cargo();
    cmd.arg(&args[0])
        .args(root.cargo_runner_args())
        .args(&args[1..])
        .env("XLB_FUZZ_FRAMES", opts.frames.to_string());
    if let Some(seed) = opts.seed {
        cmd.env("XLB_FUZZ_SEED", seed.to_string());
    }
    util::run(&mut cmd).with_context(|| {
        format!(
            "the XDP fuzzer found violations or could not run ({} frames); each violation \
             above gives its frame and seed: replay it with `cargo xtask fuzz --frames {} \
             --seed <seed>`",
            opts.frames, opts.frames
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_run_is_the_ignored_test_alone() {
        let debug = test_args(&Options {
            frames: 10,
            seed: None,
            release: false,
        });
        assert_eq!(debug[0], "test");
        assert!(!debug.contains(&"--release".to_owned()));
        let tail = &debug[debug.iter().position(|a| a == "--").unwrap()..];
        assert_eq!(
            tail,
            ["--", "--ignored", "--exact", "xdp_fuzz_long", "--nocapture"]
        );
        let release = test_args(&Options {
            frames: 10,
            seed: Some(1),
            release: true,
        });
        assert_eq!(release[1], "--release");
    }
}
