//! Running `ip` and `sysctl` for the lab, and entering its network
//! namespaces from this process.

use std::{
    ffi::OsStr,
    fs::File,
    io::ErrorKind,
    path::PathBuf,
    process::{Command, Stdio},
    thread,
};

use nix::sched::{CloneFlags, setns};

use super::{Lab, LabError, NETNS_RUN_DIR, Result};

/// True if this process runs as root; the lab needs it.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

pub(super) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` to completion; returns its stdout, or an error carrying stderr.
pub(super) fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LabError::Spawn {
            cmd: describe(cmd),
            source,
        })?;
    if !out.status.success() {
        return Err(LabError::Command {
            cmd: describe(cmd),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `ip ARGS…`.
pub(super) fn ip<S: AsRef<OsStr>>(args: &[S]) -> Result<String> {
    run(Command::new("ip").args(args))
}

/// Runs `ip -n NS ARGS…`.
pub(super) fn ip_in<S: AsRef<OsStr>>(ns: &str, args: &[S]) -> Result<String> {
    run(Command::new("ip").args(["-n", ns]).args(args))
}

/// Sets sysctls inside `ns` in one `sysctl` call.
pub(super) fn sysctl_in(ns: &str, settings: &[(&str, &str)]) -> Result<()> {
    let mut cmd = Lab::exec(ns, ["sysctl", "-q", "-w"]);
    for (k, v) in settings {
        cmd.arg(format!("{k}={v}"));
    }
    run(&mut cmd).map(drop)
}

/// Reads one sysctl inside `ns` (e.g. `net.ipv4.ip_forward`).
pub fn sysctl_get(ns: &str, key: &str) -> Result<String> {
    run(&mut Lab::exec(ns, ["sysctl", "-n", key])).map(|s| s.trim().to_string())
}

/// Names of all named network namespaces (`ip netns list`).
pub fn list_namespaces() -> Result<Vec<String>> {
    let out = ip(&["netns", "list"])?;
    // Lines look like `name` or `name (id: 3)`.
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

pub(super) fn namespace_exists(name: &str) -> bool {
    PathBuf::from(NETNS_RUN_DIR).join(name).exists()
}

/// Opens a handle on a named network namespace, for `setns(2)`.
pub fn netns_fd(ns: &str) -> Result<File> {
    let path = PathBuf::from(NETNS_RUN_DIR).join(ns);
    File::open(&path).map_err(|source| {
        if source.kind() == ErrorKind::NotFound {
            LabError::MissingNamespace { ns: ns.to_string() }
        } else {
            LabError::Io {
                what: format!("opening {}", path.display()),
                source,
            }
        }
    })
}

/// Runs `f` on a new thread that has entered network namespace `ns`, and
/// returns its result. Sockets keep the namespace they were created in, and
/// threads inherit their creator's, so `f` may build a tokio runtime and run
/// a whole client or server inside the namespace.
pub fn in_netns<F, R>(ns: &str, f: F) -> Result<R>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    let fd = netns_fd(ns)?;
    thread::scope(|s| {
        let worker = s.spawn(move || {
            setns(&fd, CloneFlags::CLONE_NEWNET).map_err(|e| LabError::Io {
                what: format!("entering network namespace {ns} (setns)"),
                source: e.into(),
            })?;
            Ok(f())
        });
        match worker.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Interface index of `ifname` inside `ns`.
pub fn ifindex(ns: &str, ifname: &str) -> Result<u32> {
    let out = ip_in(ns, &["-o", "link", "show", "dev", ifname])?;
    // `7: eth0@if8: <BROADCAST,…`
    out.split(':')
        .next()
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| LabError::Parse {
            cmd: format!("ip -n {ns} -o link show dev {ifname}"),
            output: out.clone(),
        })
}
