//! `cargo xtask lab up|down`: the namespaced lab with xlb running in it,
//! left running for hands-on use. The orchestration is `xlb_lab::scenario`,
//! shared with the end-to-end tests and `cargo xtask demo`.
//!
//! `up` builds in release as the invoking user, then (through `sudo -E` when
//! needed) rebuilds the lab from scratch: a second `up` replaces the first.
//! Processes run detached, in their own process groups, with their output
//! and the lab's state file under `target/lab/<prefix>/`; `down` reads that
//! file, so it also cleans up after an interrupted `up`.

use std::{
    env,
    ffi::OsString,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use xlb_lab::scenario::{self, LabRun, Mode, RunOptions, XlbConfig};

use crate::{
    build_cmd,
    util::{self, Root},
};

/// Set in the environment of the `sudo -E` re-run of this task, whose
/// invoking user already ran setup and the build.
const PREPARED_ENV: &str = "XLB_XTASK_PREPARED";

/// The workspace's target directory and root.
pub(crate) struct Paths {
    pub root: PathBuf,
    pub target: PathBuf,
}

impl Paths {
    pub(crate) fn find() -> Result<Paths> {
        let metadata = cargo_metadata::MetadataCommand::new()
            .no_deps()
            .exec()
            .context("finding the workspace with `cargo metadata`")?;
        Ok(Paths {
            root: metadata.workspace_root.into_std_path_buf(),
            target: metadata.target_directory.into_std_path_buf(),
        })
    }

    /// `target/release/<name>`.
    pub(crate) fn release_bin(&self, name: &str) -> PathBuf {
        self.bin(true, name)
    }

    /// `target/release/<name>` or `target/debug/<name>`.
    pub(crate) fn bin(&self, release: bool, name: &str) -> PathBuf {
        self.target
            .join(if release { "release" } else { "debug" })
            .join(name)
    }

    /// Where a lab's configuration, logs and state file live.
    pub(crate) fn lab_dir(&self, prefix: &str) -> PathBuf {
        self.target.join("lab").join(prefix)
    }
}

/// Runs setup and the build (`Some(release)`; `None`: no build) as the
/// invoking user, then makes sure the rest runs as root: returns if we are
/// root, otherwise replaces this process with `sudo -E <this task> <same
/// arguments>`, which skips the build (files in `target/` stay the user's).
/// `what` says why root is needed.
pub(crate) fn build_then_become_root(what: &str, build: Option<bool>) -> Result<()> {
    let prepared = env::var_os(PREPARED_ENV).is_some();
    if let Some(release) = build
        && !prepared
    {
        build_cmd::run(release)?;
    }
    match Root::obtain(what)? {
        Root::Already => Ok(()),
        Root::Sudo => {
            let exe = env::current_exe().context("finding this task's executable")?;
            let mut cmd = util::command("sudo");
            cmd.arg("-E")
                .arg("env")
                .arg(format!("{PREPARED_ENV}=1"))
                .arg(exe)
                .args(env::args_os().skip(1).collect::<Vec<OsString>>());
            Err(util::exec(cmd))
        }
    }
}

/// `sudo ` when the user is not root (so printed commands work when pasted).
pub(crate) fn sudo_prefix() -> &'static str {
    if env::var_os("SUDO_USER").is_some() || !nix::unistd::geteuid().is_root() {
        "sudo "
    } else {
        ""
    }
}

/// A path relative to the current directory when it is under it, for
/// shorter instructions.
pub(crate) fn short(path: &Path) -> String {
    env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| path.to_path_buf())
        .display()
        .to_string()
}

pub(crate) struct UpArgs {
    pub prefix: String,
    /// Build and run the dev profile (quicker to build) instead of release.
    pub dev: bool,
    pub mode: Mode,
    pub no_daemon: bool,
    pub config: Option<PathBuf>,
    /// 1, or 2 for the two-node lab (`lab_cluster`).
    pub nodes: u8,
    /// BFD between the router and the nodes (two-node lab).
    pub bfd: bool,
}

pub(crate) fn up(args: &UpArgs) -> Result<()> {
    if args.nodes == 2 {
        return crate::lab_cluster::up(args);
    }
    let paths = Paths::find()?;
    // Read before the build and sudo: a missing file should fail at once.
    let config_text = match &args.config {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading the configuration {}", path.display()))?,
        None => XlbConfig::lab_default(&args.prefix, args.mode, 3).render(),
    };
    let release = !args.dev;
    build_then_become_root("the lab (network namespaces, XDP programs)", Some(release))?;
    let xlb = paths.bin(release, "xlb");
    let dir = paths.lab_dir(&args.prefix);
    // Whatever runs under this prefix goes first, whatever instance it had.
    LabRun::down(
        &args.prefix,
        &dir,
        &xlb,
        &scenario::instance_for(&args.prefix),
    )
    .with_context(|| format!("removing the previous lab {:?}", args.prefix))?;
    println!(
        "lab: bringing up {:?} (namespaces {p}-br, {p}-cl, {p}-lb, {p}-b1..b3){}",
        args.prefix,
        if args.no_daemon {
            ", without xlb run"
        } else {
            ""
        },
        p = args.prefix
    );
    let mut opts = RunOptions::new(&args.prefix, &xlb, &config_text);
    opts.work_dir = Some(dir.clone());
    opts.start_daemon = !args.no_daemon;
    let run = LabRun::up_with(opts).with_context(|| {
        format!(
            "bringing up the lab (logs in {}; `cargo xtask lab down --prefix {}` cleans up)",
            short(&dir),
            args.prefix
        )
    })?;
    let info = Instructions {
        prefix: args.prefix.clone(),
        xlb: xlb.clone(),
        client_bin: paths.bin(release, "xlb-client"),
        socket: run.socket().to_path_buf(),
        config: run.config_path().to_path_buf(),
        dir: dir.clone(),
        daemon: !args.no_daemon,
    };
    if !args.no_daemon {
        println!("\n{}", run.status_text().context("xlb status")?);
    }
    run.keep();
    println!("{}", info.render());
    Ok(())
}

pub(crate) fn down(prefix: &str) -> Result<()> {
    let paths = Paths::find()?;
    build_then_become_root("removing the lab (network namespaces, XDP programs)", None)?;
    let dir = paths.lab_dir(prefix);
    // The state file names the binary that ran; without one (an `up`
    // interrupted early), whichever xlb exists.
    let xlb = [
        paths.release_bin("xlb"),
        paths.target.join("debug").join("xlb"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .unwrap_or_else(|| paths.release_bin("xlb"));
    LabRun::down(prefix, &dir, &xlb, &scenario::instance_for(prefix))
        .with_context(|| format!("removing lab {prefix:?}"))?;
    crate::lab_cluster::detach_node_b(prefix, &xlb)?;
    let left: Vec<String> = xlb_lab::topology::list_namespaces()
        .context("listing namespaces")?
        .into_iter()
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .collect();
    if !left.is_empty() {
        bail!(
            "namespaces {} are still there; remove them with `ip netns del NAME`",
            left.join(", ")
        );
    }
    println!("lab: {prefix:?} is down (namespaces removed, xlb detached)");
    Ok(())
}

/// What `lab up` prints: how to reach the lab.
pub(crate) struct Instructions {
    pub prefix: String,
    pub xlb: PathBuf,
    pub client_bin: PathBuf,
    pub socket: PathBuf,
    pub config: PathBuf,
    pub dir: PathBuf,
    pub daemon: bool,
}

impl Instructions {
    pub(crate) fn render(&self) -> String {
        let s = sudo_prefix();
        let p = &self.prefix;
        let xlb = short(&self.xlb);
        let sock = self.socket.display();
        let mut out = format!(
            "lab {p:?} is up; logs, configuration and state in {dir}/\n\n\
             try it:\n\
             \x20 {s}ip netns exec {p}-cl curl http://10.100.0.1/api\n\
             \x20 {s}ip netns exec {p}-cl curl -g 'http://[fd00:100::1]/api'\n\
             \x20 {s}ip netns exec {p}-cl {client} --target 10.100.0.1:80 --duration 10s\n\
             break a backend (hang, slow?ms=N, 503, crash; recover):\n\
             \x20 {s}ip netns exec {p}-cl curl -X POST http://10.99.0.12:9000/fault/hang\n\
             \x20 {s}ip netns exec {p}-cl curl -X POST http://10.99.0.12:9000/fault/recover\n",
            dir = short(&self.dir),
            client = short(&self.client_bin),
        );
        if self.daemon {
            out.push_str(&format!(
                "watch xlb:\n\
                 \x20 {s}{xlb} status --socket {sock}\n\
                 \x20 {s}{xlb} events --follow --socket {sock}\n\
                 \x20 {s}{xlb} drain api 10.99.0.12:80 --socket {sock}\n\
                 change it: edit {config}, then\n\
                 \x20 {s}{xlb} reload --socket {sock}\n",
                config = short(&self.config),
            ));
        } else {
            out.push_str(&format!(
                "start xlb yourself (backends, decap and xdp-pass run):\n\
                 \x20 {s}nsenter --net=/var/run/netns/{p}-lb {xlb} run --config {config}\n",
                config = short(&self.config),
            ));
        }
        out.push_str(&format!(
            "tear it down:\n  cargo xtask lab down --prefix {p}\n"
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_name_the_lab_and_socket() {
        let info = Instructions {
            prefix: "xlb".into(),
            xlb: "/w/target/release/xlb".into(),
            client_bin: "/w/target/release/xlb-client".into(),
            socket: "/run/xlb/lab-xlb.sock".into(),
            config: "/w/target/lab/xlb/xlb.toml".into(),
            dir: "/w/target/lab/xlb".into(),
            daemon: true,
        };
        let text = info.render();
        for want in [
            "ip netns exec xlb-cl curl http://10.100.0.1/api",
            "/w/target/release/xlb status --socket /run/xlb/lab-xlb.sock",
            "reload --socket /run/xlb/lab-xlb.sock",
            "cargo xtask lab down --prefix xlb",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        let bare = Instructions {
            daemon: false,
            ..info
        }
        .render();
        assert!(
            bare.contains("nsenter --net=/var/run/netns/xlb-lb"),
            "{bare}"
        );
        assert!(!bare.contains("events --follow"), "{bare}");
    }
}
