//! Processes in the lab: running a command inside a namespace with a bound
//! on its time, the binaries, the state file that records what a run
//! started, and stopping what it recorded.

use std::{
    fs,
    io::{self, Read as _},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use nix::{
    sched::{CloneFlags, setns},
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use serde::{Deserialize, Serialize};

use super::{CLI_TIMEOUT, LOG_TAIL_LINES, Result, STATE_FILE, ScenarioError, io_err};
use crate::topology::netns_fd;

/// A `Command` for `program` that runs inside network namespace `ns` (and
/// nowhere else: same mount namespace, see the module docs).
pub fn command_in(ns: &str, program: impl AsRef<Path>) -> Result<Command> {
    let fd = netns_fd(ns)?;
    let mut cmd = Command::new(program.as_ref());
    // SAFETY: the hook runs in the forked child before exec and only calls
    // setns(2), which is async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || setns(&fd, CloneFlags::CLONE_NEWNET).map_err(io::Error::from));
    }
    Ok(cmd)
}

/// Runs `cmd` to completion within `timeout` (killed after it); returns
/// stdout, or an error carrying stderr.
pub(super) fn run_bounded(mut cmd: Command, timeout: Duration) -> Result<String> {
    let line = describe(&cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io_err(format!("starting `{line}`")))?;
    // Drained on threads so a large output cannot fill the pipe and stall
    // the child while we wait for it.
    let drain = |mut r: Box<dyn io::Read + Send>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout is piped")));
    let err = drain(Box::new(child.stderr.take().expect("stderr is piped")));
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child
            .try_wait()
            .map_err(io_err(format!("waiting for `{line}`")))?
        {
            Some(s) => break s,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ScenarioError::Timeout {
                    what: format!("`{line}` to finish"),
                    after: timeout,
                    last: "still running; killed".to_string(),
                });
            }
            None => thread::sleep(Duration::from_millis(5)),
        }
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    if !status.success() {
        return Err(ScenarioError::Cli {
            cmd: line,
            status: status.to_string(),
            stderr: if stderr.trim().is_empty() {
                stdout.trim().to_string()
            } else {
                stderr.trim().to_string()
            },
        });
    }
    Ok(stdout)
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// The last lines of a log file, for error messages.
pub fn log_tail(path: &Path) -> String {
    match fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(LOG_TAIL_LINES);
            let tail = lines[from..].join("\n");
            if tail.is_empty() {
                "(empty)".to_string()
            } else {
                tail
            }
        }
        Err(e) => format!("(cannot read: {e})"),
    }
}

/// `xlb` and `xlb-backend`, found next to each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    pub xlb: PathBuf,
    pub backend: PathBuf,
}

impl Binaries {
    /// `xlb` at `xlb`, `xlb-backend` in the same directory (both are built
    /// into `target/<profile>/`).
    pub fn next_to(xlb: &Path) -> Result<Self> {
        let backend = xlb
            .parent()
            .map_or_else(|| PathBuf::from("xlb-backend"), |d| d.join("xlb-backend"));
        let b = Self {
            xlb: xlb.to_path_buf(),
            backend,
        };
        b.check()?;
        Ok(b)
    }

    fn check(&self) -> Result<()> {
        let dir = self
            .xlb
            .parent()
            .map_or_else(|| ".".to_string(), |d| d.display().to_string());
        let release = if dir.ends_with("release") {
            " --release"
        } else {
            ""
        };
        for (what, path, pkg, skip) in [
            (
                "xlb",
                &self.xlb,
                "lb-user",
                " (without AYA_BUILD_SKIP: it embeds the XDP object)",
            ),
            ("xlb-backend", &self.backend, "xlb-lab", ""),
        ] {
            if !path.is_file() {
                return Err(ScenarioError::MissingBinary {
                    what: what.to_string(),
                    path: path.clone(),
                    hint: format!("build it with `cargo build{release} -p {pkg}`{skip}"),
                });
            }
        }
        Ok(())
    }
}

/// Finds the `xlb` binary for a test or task: `$XLB_BIN` if set, else
/// `xlb` in the directory of the running executable or its parent (a test
/// binary runs from `target/<profile>/deps/`).
pub fn find_xlb() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("XLB_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(io_err("finding the running executable"))?;
    let mut candidates = Vec::new();
    if let Some(dir) = exe.parent() {
        candidates.push(dir.join("xlb"));
        if let Some(up) = dir.parent() {
            candidates.push(up.join("xlb"));
        }
    }
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| ScenarioError::MissingBinary {
            what: "xlb".to_string(),
            path: candidates.last().cloned().unwrap_or_default(),
            hint: "build it with `cargo build -p lb-user -p xlb-lab` (without AYA_BUILD_SKIP: \
                   it embeds the XDP object), or point XLB_BIN at it"
                .to_string(),
        })
}

/// One process a lab run started, as recorded in the state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcRecord {
    /// `backend-b1`, `decap-b1`, `xdp-pass`, `daemon`...
    pub role: String,
    pub pid: u32,
    /// The binary, to recognise the process (pids are reused).
    pub exe: PathBuf,
}

/// `lab.json` in the work directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFile {
    pub prefix: String,
    pub backends: usize,
    pub instance: String,
    pub socket: PathBuf,
    pub xlb: PathBuf,
    pub config: PathBuf,
    pub procs: Vec<ProcRecord>,
}

impl StateFile {
    pub fn load(dir: &Path) -> Result<Option<StateFile>> {
        let path = dir.join(STATE_FILE);
        match fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| ScenarioError::Parse {
                    cmd: format!("reading {}", path.display()),
                    reason: e.to_string(),
                    output: text,
                }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(format!("reading {}", path.display()))(e)),
        }
    }

    pub(super) fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(STATE_FILE);
        let text = serde_json::to_string_pretty(self).expect("plain data serializes");
        fs::write(&path, text).map_err(io_err(format!("writing {}", path.display())))
    }
}

/// SIGTERM to the processes a state file in `work_dir` records that are
/// still ours (same binary), SIGKILL to those alive 3 s later.
pub(super) fn stop_recorded(work_dir: &Path) {
    let Ok(Some(state)) = StateFile::load(work_dir) else {
        return;
    };
    let ours = |p: &ProcRecord| {
        fs::read_link(format!("/proc/{}/exe", p.pid)).is_ok_and(|exe| {
            // A rebuilt binary shows as "<path> (deleted)".
            exe.to_string_lossy().starts_with(&*p.exe.to_string_lossy())
        })
    };
    let live: Vec<&ProcRecord> = state.procs.iter().filter(|p| ours(p)).collect();
    // The daemon first, so that it does not probe backends that are going.
    for p in live.iter().filter(|p| p.role == "daemon") {
        let _ = kill(Pid::from_raw(p.pid as i32), Signal::SIGTERM);
    }
    for p in &live {
        let _ = kill(Pid::from_raw(p.pid as i32), Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && live.iter().any(|p| ours(p) && !is_zombie(p.pid)) {
        thread::sleep(Duration::from_millis(20));
    }
    for p in &live {
        if ours(p) {
            let _ = kill(Pid::from_raw(p.pid as i32), Signal::SIGKILL);
        }
    }
}

fn is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// `xlb detach --instance NAME`: unpins and detaches whatever `xlb run` of
/// that instance left.
pub fn detach(xlb: &Path, instance: &str) -> Result<()> {
    let mut cmd = Command::new(xlb);
    cmd.args(["detach", "--instance", instance]);
    run_bounded(cmd, CLI_TIMEOUT).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binaries_say_how_to_build_them() {
        let err = Binaries::next_to(Path::new("/nonexistent/target/release/xlb")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("cargo build --release -p lb-user"), "{msg}");
    }
}
