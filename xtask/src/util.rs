//! Running external commands the same way in every task: with `~/.cargo/bin`
//! on `PATH` (where `cargo install` puts bpf-linker, which rustc needs when
//! aya-build links the eBPF object), printed before they run, and failing
//! with the command line and its exit status.
//!
//! Read-only checks (`dpkg-query`, `rustup component list`, `bpf-linker
//! --version`) go through [`probe`], which does not print: `setup` reports
//! each check as one line of its own instead.

use std::{
    env,
    ffi::{OsStr, OsString},
    io,
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
};

use anyhow::{Context as _, Result, anyhow, bail};

/// The workspace's root folder (xtask is its `xtask/` member).
pub(crate) fn workspace_root() -> PathBuf {
    let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask.parent().unwrap_or(xtask).to_path_buf()
}

/// Where `cargo install` puts binaries: `$CARGO_HOME/bin`, else `~/.cargo/bin`.
pub(crate) fn cargo_bin_dir() -> Option<PathBuf> {
    if let Some(home) = env::var_os("CARGO_HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(home).join("bin"));
    }
    env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|home| PathBuf::from(home).join(".cargo").join("bin"))
}

/// `PATH` for every child: ours, with the cargo bin directory in front when it
/// is missing (a fresh shell on a machine set up by rustup may not have it).
pub(crate) fn search_path() -> &'static OsStr {
    static PATH: OnceLock<OsString> = OnceLock::new();
    PATH.get_or_init(|| {
        let current = env::var_os("PATH").unwrap_or_default();
        let mut dirs: Vec<PathBuf> = env::split_paths(&current).collect();
        if let Some(bin) = cargo_bin_dir()
            && !dirs.contains(&bin)
        {
            dirs.insert(0, bin);
        }
        // `join_paths` fails only on a directory containing ':', which could
        // not have come from splitting PATH; keep PATH as it was then.
        env::join_paths(dirs).unwrap_or(current)
    })
}

/// The first executable file called `name` on [`search_path`].
pub(crate) fn find_program(name: &str) -> Option<PathBuf> {
    env::split_paths(search_path())
        .map(|dir| dir.join(name))
        .find(|path| is_executable(path))
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A command for `program` whose children see [`search_path`].
pub(crate) fn command(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("PATH", search_path());
    cmd
}

/// `cargo` (the rustup proxy, so `+nightly` works) for the build, test and
/// run tasks.
///
/// `AYA_BUILD_SKIP` is removed: these tasks exist to build, test and run the
/// real eBPF object, which that variable would replace with an empty file.
pub(crate) fn cargo() -> Command {
    let mut cmd = command("cargo");
    cmd.env_remove("AYA_BUILD_SKIP");
    cmd
}

/// The command line as a user could paste it into a shell: variables this
/// program sets (except `PATH`, set on every command) come first.
pub(crate) fn render(cmd: &Command) -> String {
    let mut words = Vec::new();
    for (key, value) in cmd.get_envs() {
        if key == "PATH" {
            continue;
        }
        // A removed variable has no shell spelling short of `env -u`; the
        // command runs as printed in a shell that does not set it.
        if let Some(value) = value {
            words.push(format!(
                "{}={}",
                key.to_string_lossy(),
                quote(&value.to_string_lossy())
            ));
        }
    }
    words.push(quote(&cmd.get_program().to_string_lossy()));
    words.extend(cmd.get_args().map(|a| quote(&a.to_string_lossy())));
    words.join(" ")
}

/// Single-quotes `word` for a POSIX shell when it holds anything but plain
/// characters.
fn quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+^@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Prints `cmd`, runs it with inherited stdio and fails unless it exits 0.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    let line = render(cmd);
    eprintln!("$ {line}");
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Runs a read-only check quietly and returns its stdout, or `None` when the
/// program is missing or exits non-zero (both mean "not there" to a check).
pub(crate) fn probe(cmd: &mut Command) -> Option<String> {
    let output = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Prints `cmd` and replaces this process with it, so that the program gets
/// this process's signals (Ctrl-C, `kill`) and its exit code is ours. Returns
/// only if the exec failed.
pub(crate) fn exec(mut cmd: Command) -> anyhow::Error {
    let line = render(&cmd);
    eprintln!("$ {line}");
    let err: io::Error = cmd.exec();
    anyhow!(err).context(format!("could not start `{line}`"))
}

/// How a step that needs root (BPF programs, network namespaces) gets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Root {
    /// We are root already.
    Already,
    /// Through `sudo`.
    Sudo,
}

impl Root {
    /// Root as we are, else `sudo`; `what` says what needs root, and why, in
    /// the error when neither is available.
    pub(crate) fn obtain(what: &str) -> Result<Self> {
        if nix::unistd::geteuid().is_root() {
            Ok(Self::Already)
        } else if find_program("sudo").is_some() {
            Ok(Self::Sudo)
        } else {
            bail!(
                "{what} needs root and `sudo` is not installed: run the same `cargo xtask` \
                 command as root"
            )
        }
    }

    /// Arguments to `cargo test|run|bench` that make cargo run the built
    /// executables through `sudo -E` (as aya's own xtask does), so building
    /// stays unprivileged and files in `target/` stay ours.
    pub(crate) fn cargo_runner_args(self) -> Vec<String> {
        match self {
            Self::Already => Vec::new(),
            Self::Sudo => vec![
                "--config".to_owned(),
                r#"target."cfg(all())".runner="sudo -E""#.to_owned(),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_cases() {
        let cases = [
            ("plain word", "cargo", "cargo"),
            ("version requirement", "^0.13", "^0.13"),
            ("path", "/usr/lib/llvm-22", "/usr/lib/llvm-22"),
            ("space", "sudo -E", "'sudo -E'"),
            ("double quotes", r#"a."b""#, r#"'a."b"'"#),
            ("single quote", "it's", r"'it'\''s'"),
            ("empty", "", "''"),
        ];
        for (name, word, want) in cases {
            assert_eq!(quote(word), want, "case {name}");
        }
    }

    #[test]
    fn render_shows_set_variables_but_not_path() {
        let mut cmd = command("cargo");
        cmd.env("LLVM_PREFIX", "/usr/lib/llvm-22")
            .env_remove("AYA_BUILD_SKIP")
            .args(["install", "bpf-linker", "--version", "^0.13"]);
        assert_eq!(
            render(&cmd),
            "LLVM_PREFIX=/usr/lib/llvm-22 cargo install bpf-linker --version ^0.13"
        );
    }

    #[test]
    fn run_reports_command_and_status_on_failure() {
        let err = run(command("sh").args(["-c", "exit 3"])).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("`sh -c 'exit 3'`"), "{msg}");
        assert!(msg.contains("exit status: 3"), "{msg}");
    }

    #[test]
    fn probe_distinguishes_success_failure_and_missing_program() {
        assert_eq!(
            probe(command("sh").args(["-c", "echo hi"])).as_deref(),
            Some("hi\n")
        );
        assert_eq!(probe(command("sh").args(["-c", "echo hi; exit 1"])), None);
        assert_eq!(probe(&mut command("xtask-no-such-program")), None);
    }

    #[test]
    fn search_path_includes_cargo_bin() {
        let bin = cargo_bin_dir().expect("HOME or CARGO_HOME is set in tests");
        assert!(env::split_paths(search_path()).any(|d| d == bin));
    }
}
