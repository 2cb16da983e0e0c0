//! [`LabRun`]: bringing a lab with xlb up (namespaces, helpers, the daemon),
//! starting and stopping the daemon, and tearing everything down. Talking
//! to the daemon is in `control.rs`, traffic and the backends' admin
//! listeners in `traffic.rs`.

use std::{
    fs::{self, OpenOptions},
    io::Write as _,
    path::{Path, PathBuf},
    process::Stdio,
    thread,
    time::{Duration, Instant},
};

use lb_ctl::now_unix_ms;
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use super::process::stop_recorded;
use super::{
    ADMIN_PORT, Binaries, DEFAULT_READY_TIMEOUT, HELPER_START_TIMEOUT, POLL, ProcRecord, Result,
    SERVICE_PORTS, STATE_FILE, ScenarioError, StateFile, UDP_PORTS, command_in, detach,
    instance_and_socket, io_err, log_tail, set_tx_checksum_offload, xdp_attached,
};
use crate::topology::{HOST_IFNAME, Lab, LabConfig};

/// How to bring a lab with xlb up.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Namespace prefix (see [`LabConfig::prefix`]).
    pub prefix: String,
    pub backends: usize,
    /// Also build the flooding client's namespace ([`LabConfig::flooder`]).
    pub flooder: bool,
    /// LB nodes ([`LabConfig::nodes`]): with 2, the router and node B
    /// exist, node B's bridge port gets xdp-pass and the decapsulators
    /// accept both nodes' tunnels; `xlb run` and BIRD in the nodes are
    /// [`ClusterRun`](super::ClusterRun)'s.
    pub nodes: usize,
    /// The `xlb` binary; `xlb-backend` is looked for next to it.
    pub xlb: PathBuf,
    /// The configuration file's text; its `[daemon]` must say
    /// `interface = "eth0"` and name the instance and control socket.
    pub config: String,
    /// Where the configuration, logs and state file go. `None`: a fresh
    /// temporary directory, removed on a clean teardown.
    pub work_dir: Option<PathBuf>,
    /// Start `xlb run` (false: only the lab, backends, decap and xdp-pass).
    pub start_daemon: bool,
    /// Bound on the daemon answering and every backend becoming `up`.
    pub ready_timeout: Duration,
    /// `RUST_LOG` of the xlb processes.
    pub rust_log: String,
}

impl RunOptions {
    pub fn new(prefix: &str, xlb: &Path, config: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
            backends: 3,
            flooder: false,
            nodes: 1,
            xlb: xlb.to_path_buf(),
            config: config.to_string(),
            work_dir: None,
            start_daemon: true,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            rust_log: std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_string()),
        }
    }
}

/// A lab with xlb running in it. Dropping it stops every process, detaches
/// xlb's instance and removes the namespaces (unless [`LabRun::keep`]).
pub struct LabRun {
    lab: Option<Lab>,
    /// Also kept here: the prefix is needed after the `Lab` is dropped.
    prefix: String,
    bins: Binaries,
    work_dir: PathBuf,
    temp_dir: bool,
    config_path: PathBuf,
    instance: String,
    socket: PathBuf,
    backends: usize,
    rust_log: String,
    ready_timeout: Duration,
    daemon: Option<u32>,
    procs: Vec<ProcRecord>,
    kept: bool,
}

impl LabRun {
    /// Brings the lab up with three backends and xlb running `config`,
    /// and waits for every backend to be up.
    pub fn up(prefix: &str, xlb: &Path, config: &str) -> Result<LabRun> {
        Self::up_with(RunOptions::new(prefix, xlb, config))
    }

    pub fn up_with(opts: RunOptions) -> Result<LabRun> {
        let bins = Binaries::next_to(&opts.xlb)?;
        let cfg = LabConfig {
            prefix: opts.prefix.clone(),
            backends: opts.backends,
            flooder: opts.flooder,
            nodes: opts.nodes,
        };
        cfg.validate()?;
        let (instance, socket) = instance_and_socket(&opts.config);
        let (work_dir, temp_dir) = match &opts.work_dir {
            Some(d) => (d.clone(), false),
            None => (temp_work_dir(&opts.prefix), true),
        };
        // Whatever a previous run of this prefix left (interrupted, kept).
        stop_recorded(&work_dir);
        detach(&bins.xlb, &instance)?;
        fs::create_dir_all(&work_dir)
            .map_err(io_err(format!("creating {}", work_dir.display())))?;
        let config_path = work_dir.join("xlb.toml");
        fs::write(&config_path, &opts.config)
            .map_err(io_err(format!("writing {}", config_path.display())))?;
        if let Some(dir) = socket.parent() {
            fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
        }

        let lab = Lab::up(&cfg)?;
        // The client sends on a veth, which leaves TCP checksums to "the
        // hardware" (CHECKSUM_PARTIAL) as long as the packet stays an skb;
        // XDP_TX on the LB turns it into a raw frame and the backend then
        // drops it as corrupt (TcpInCsumErrors). Real NICs deliver complete
        // checksums, so the client computes its own, as a real one's sender
        // would have.
        // The flooder's connects go the same way.
        for ns in std::iter::once(lab.ns_client()).chain(lab.ns_flood()) {
            set_tx_checksum_offload(&ns, HOST_IFNAME, false)?;
        }
        // From here on an error drops `run`, which tears everything down.
        let mut run = LabRun {
            lab: Some(lab),
            prefix: opts.prefix.clone(),
            bins,
            work_dir,
            temp_dir,
            config_path,
            instance,
            socket,
            backends: opts.backends,
            rust_log: opts.rust_log,
            ready_timeout: opts.ready_timeout,
            daemon: None,
            procs: Vec::new(),
            kept: false,
        };
        run.save_state()?;
        run.start_helpers()?;
        if opts.start_daemon {
            run.start_daemon()?;
            run.wait_all_up(run.ready_timeout)?;
        }
        Ok(run)
    }

    fn lab_ref(&self) -> &Lab {
        self.lab.as_ref().expect("the lab exists until teardown")
    }

    pub fn lab(&self) -> &Lab {
        self.lab_ref()
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }

    pub fn xlb_path(&self) -> &Path {
        &self.bins.xlb
    }

    pub fn backend_count(&self) -> usize {
        self.backends
    }

    /// The daemon's log (stdout and stderr of every `xlb run`, appended).
    pub fn daemon_log(&self) -> PathBuf {
        self.work_dir.join("xlb-run.log")
    }

    /// The daemon's pid, while one runs.
    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon
    }

    fn save_state(&self) -> Result<()> {
        StateFile {
            prefix: self.prefix().to_string(),
            backends: self.backends,
            instance: self.instance.clone(),
            socket: self.socket.clone(),
            xlb: self.bins.xlb.clone(),
            config: self.config_path.clone(),
            procs: self.procs.clone(),
        }
        .save(&self.work_dir)
    }

    /// Starts `program args` in `ns` with output appended to `log`.
    fn spawn(
        &mut self,
        role: &str,
        ns: &str,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<u32> {
        let mut cmd = command_in(ns, program)?;
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(io_err(format!("opening {}", log.display())))?;
        let _ = writeln!(
            file,
            "--- {} {role}: {} {}",
            now_unix_ms(),
            program.display(),
            args.join(" ")
        );
        let err = file
            .try_clone()
            .map_err(io_err(format!("opening {}", log.display())))?;
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .env("RUST_LOG", &self.rust_log);
        let pid = self.lab_ref().spawn(cmd)?;
        self.procs.push(ProcRecord {
            role: role.to_string(),
            pid,
            exe: program.to_path_buf(),
        });
        self.save_state()?;
        Ok(pid)
    }

    pub(super) fn check_alive(&self, role: &str, pid: u32, log: &Path) -> Result<()> {
        if self.lab_ref().is_running(pid) {
            return Ok(());
        }
        Err(ScenarioError::Exited {
            what: format!("{role} (pid {pid})"),
            status: "see its log".to_string(),
            log: log.to_path_buf(),
            tail: log_tail(log),
        })
    }

    /// Backends, decapsulators and the XDP_PASS program on the LB's peer.
    fn start_helpers(&mut self) -> Result<()> {
        let lab = self.lab_ref();
        let bridge = lab.ns_bridge();
        let mut peers: Vec<String> = lab
            .nodes()
            .into_iter()
            .map(|n| lab.node_peer_ifname(n).to_string())
            .collect();
        // Second chance: a backend's decapsulator relays a packet to the
        // previous owner with XDP_TX out of its eth0, which its bridge-side
        // peer drops unless it runs XDP too (see `topology`). Only the
        // two-node lab runs second-chance scenarios.
        if lab.node_count() > 1 {
            peers.extend((1..=lab.backend_count()).map(|i| lab.backend_peer_ifname(i)));
        }
        let backend_ns: Vec<String> = lab.backend_namespaces();
        let xlb = self.bins.xlb.clone();
        let backend_bin = self.bins.backend.clone();
        let decap_args = decap_args(lab);
        let mut started = Vec::new();
        for (idx, ns) in backend_ns.iter().enumerate() {
            let i = idx + 1;
            let mut args = vec!["--name".to_string(), format!("b{i}")];
            for port in SERVICE_PORTS {
                args.extend(["--listen".to_string(), format!("0.0.0.0:{port}")]);
                args.extend(["--listen".to_string(), format!("[::]:{port}")]);
            }
            args.extend(["--admin".to_string(), format!("0.0.0.0:{ADMIN_PORT}")]);
            args.extend(udp_listen_args());
            let log = self.work_dir.join(format!("backend-b{i}.log"));
            let pid = self.spawn(&format!("backend-b{i}"), ns, &backend_bin, &args, &log)?;
            started.push((format!("backend b{i}"), pid, log));

            let log = self.work_dir.join(format!("decap-b{i}.log"));
            let pid = self.spawn(&format!("decap-b{i}"), ns, &xlb, &decap_args, &log)?;
            started.push((format!("xlb decap in {ns}"), pid, log));
        }
        started.extend(self.start_xdp_pass(&bridge, &peers)?);

        // Ready means: every XDP program attached, every admin port answering.
        let deadline = Instant::now() + HELPER_START_TIMEOUT;
        let mut waiting: Vec<(String, String)> = backend_ns
            .iter()
            .map(|ns| (ns.clone(), HOST_IFNAME.to_string()))
            .collect();
        waiting.extend(peers.into_iter().map(|p| (bridge.clone(), p)));
        let mut admins_pending: Vec<usize> = (1..=self.backends).collect();
        loop {
            for (what, pid, log) in &started {
                self.check_alive(what, *pid, log)?;
            }
            waiting.retain(|(ns, ifname)| !xdp_attached(ns, ifname));
            admins_pending.retain(|&i| self.backend_stats(i).is_err());
            if waiting.is_empty() && admins_pending.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let last = format!(
                    "no XDP program yet on {:?}; admin not answering for backends {:?}",
                    waiting, admins_pending
                );
                return Err(ScenarioError::Timeout {
                    what: "the backends, decapsulators and xdp-pass to start".to_string(),
                    after: HELPER_START_TIMEOUT,
                    last,
                });
            }
            thread::sleep(POLL);
        }
    }

    /// `xlb xdp-pass` on each of `peers` (bridge ports) in `bridge`;
    /// returns what it started, as `start_helpers` watches it.
    fn start_xdp_pass(
        &mut self,
        bridge: &str,
        peers: &[String],
    ) -> Result<Vec<(String, u32, PathBuf)>> {
        let xlb = self.bins.xlb.clone();
        let mut started = Vec::new();
        for (n, peer) in peers.iter().enumerate() {
            // The one-node lab's names stay as they were.
            let role = if n == 0 {
                "xdp-pass".to_string()
            } else {
                format!("xdp-pass-{peer}")
            };
            let log = self.work_dir.join(format!("{role}.log"));
            let args = [
                "xdp-pass".to_string(),
                "--interface".to_string(),
                peer.clone(),
            ];
            let pid = self.spawn(&role, bridge, &xlb, &args, &log)?;
            started.push((format!("xlb xdp-pass on {peer} in {bridge}"), pid, log));
        }
        Ok(started)
    }

    /// Starts `xlb run` and waits until it answers `status` (not for the
    /// backends; see [`LabRun::wait_all_up`]).
    pub fn start_daemon(&mut self) -> Result<()> {
        if let Some(pid) = self.daemon
            && self.lab_ref().is_running(pid)
        {
            return Err(ScenarioError::Invalid(format!(
                "xlb run already runs (pid {pid})"
            )));
        }
        let ns = self.lab_ref().ns_lb();
        let args = vec![
            "run".to_string(),
            "--config".to_string(),
            self.config_path.display().to_string(),
        ];
        let log = self.daemon_log();
        let xlb = self.bins.xlb.clone();
        let pid = self.spawn("daemon", &ns, &xlb, &args, &log)?;
        self.daemon = Some(pid);
        let timeout = self.ready_timeout;
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive("xlb run", pid, &log)?;
            let last = match self.status() {
                Ok(_) => return Ok(()),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(ScenarioError::Timeout {
                    what: format!("xlb run to answer on {}", self.socket.display()),
                    after: timeout,
                    last: format!("{last}; daemon log:\n{}", log_tail(&log)),
                });
            }
            thread::sleep(POLL);
        }
    }

    /// SIGTERM to the daemon (SIGKILL after 2 s); XDP stays attached.
    pub fn stop_daemon(&mut self) -> Result<()> {
        if let Some(pid) = self.daemon.take() {
            self.lab_ref().kill(pid)?;
        }
        Ok(())
    }

    /// SIGKILL to the daemon, as a crash would; XDP stays attached and the
    /// maps stay pinned.
    pub fn kill9_daemon(&mut self) -> Result<()> {
        let pid = self
            .daemon
            .take()
            .ok_or_else(|| ScenarioError::Invalid("no xlb run to kill".to_string()))?;
        kill(Pid::from_raw(pid as i32), Signal::SIGKILL).map_err(|e| ScenarioError::Io {
            what: format!("kill -9 {pid}"),
            source: e.into(),
        })?;
        // Reaps it (the SIGTERM that `kill` sends first finds it dead).
        self.lab_ref().kill(pid)?;
        Ok(())
    }

    /// Stops the daemon if it runs, starts it again and waits until it answers.
    pub fn restart_daemon(&mut self) -> Result<()> {
        self.stop_daemon()?;
        self.start_daemon()
    }

    /// Starts a process (e.g. a server) inside namespace `ns`, owned by the
    /// lab: stopped at teardown. Output goes to `<work dir>/<role>.log`.
    pub fn spawn_in(
        &mut self,
        role: &str,
        ns: &str,
        program: &Path,
        args: &[String],
    ) -> Result<u32> {
        let log = self.work_dir.join(format!("{role}.log"));
        let pid = self.spawn(role, ns, program, args, &log)?;
        Ok(pid)
    }

    /// Stops `xlb xdp-pass` on the LB's bridge port (role `xdp-pass`): the
    /// veth then drops every frame the LB forwards with `XDP_TX`, the
    /// by-hand deployment's mistake (issue 39). Waits until it is detached.
    pub fn stop_lb_xdp_pass(&mut self) -> Result<()> {
        let pids: Vec<u32> = self
            .procs
            .iter()
            .filter(|p| p.role == "xdp-pass")
            .map(|p| p.pid)
            .collect();
        for pid in pids {
            self.lab_ref().kill(pid)?;
        }
        self.procs.retain(|p| p.role != "xdp-pass");
        self.save_state()?;
        self.wait_lb_xdp_pass(false, &[])
    }

    /// Starts `xlb xdp-pass` on the LB's bridge port again (after
    /// [`Self::stop_lb_xdp_pass`]) and waits until it is attached.
    pub fn start_lb_xdp_pass(&mut self) -> Result<()> {
        let bridge = self.lab_ref().ns_bridge();
        let peer = self.lab_ref().lb_peer_ifname().to_string();
        let started = self.start_xdp_pass(&bridge, std::slice::from_ref(&peer))?;
        self.wait_lb_xdp_pass(true, &started)
    }

    /// Waits until the LB's bridge port has an XDP program (`attached`) or
    /// none, checking that `started` stays alive meanwhile.
    fn wait_lb_xdp_pass(&self, attached: bool, started: &[(String, u32, PathBuf)]) -> Result<()> {
        let bridge = self.lab_ref().ns_bridge();
        let peer = self.lab_ref().lb_peer_ifname();
        let deadline = Instant::now() + HELPER_START_TIMEOUT;
        while xdp_attached(&bridge, peer) != attached {
            for (what, pid, log) in started {
                self.check_alive(what, *pid, log)?;
            }
            if Instant::now() >= deadline {
                let what = if attached { "attach to" } else { "detach from" };
                return Err(ScenarioError::Timeout {
                    what: format!("xdp-pass to {what} the LB's bridge port"),
                    after: HELPER_START_TIMEOUT,
                    last: format!("{peer} in {bridge}: XDP program attached {}", !attached),
                });
            }
            thread::sleep(POLL);
        }
        Ok(())
    }

    /// Path of `xlb-backend` (also handy as a plain HTTP server).
    pub fn backend_bin(&self) -> &Path {
        &self.bins.backend
    }

    /// Leaves everything running when dropped; `lab down` (or
    /// [`LabRun::down`]) removes it later, using the state file.
    pub fn keep(mut self) -> PathBuf {
        self.kept = true;
        if let Some(lab) = self.lab.as_mut() {
            lab.keep();
        }
        self.work_dir.clone()
    }

    /// [`LabRun::keep`] for an owner that cannot give the run away
    /// ([`ClusterRun`](super::ClusterRun), which has a `Drop` of its own).
    pub(super) fn mark_kept(&mut self) {
        self.kept = true;
        if let Some(lab) = self.lab.as_mut() {
            lab.keep();
        }
    }

    /// Tears down now and reports what failed (Drop does the same silently).
    pub fn shutdown(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        // Done already (`shutdown`, then Drop).
        if self.lab.is_none() {
            return Ok(());
        }
        let mut first_err = None;
        if let Err(e) = self.stop_daemon() {
            first_err.get_or_insert(e);
        }
        if let Err(e) = detach(&self.bins.xlb, &self.instance) {
            first_err.get_or_insert(e);
        }
        // Stops the backends, decap and xdp-pass, removes the namespaces.
        if let Some(lab) = self.lab.take() {
            drop(lab);
            if let Err(e) = Lab::down(&self.prefix) {
                first_err.get_or_insert(e.into());
            }
        }
        // A daemon that died by SIGKILL leaves its socket behind.
        let _ = fs::remove_file(&self.socket);
        if self.temp_dir && first_err.is_none() && !thread::panicking() {
            let _ = fs::remove_dir_all(&self.work_dir);
        } else {
            let _ = fs::remove_file(self.work_dir.join(STATE_FILE));
            if thread::panicking() || first_err.is_some() {
                eprintln!(
                    "xlb-lab: logs of lab {:?} kept in {}",
                    self.prefix,
                    self.work_dir.display()
                );
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Stops a lab left running by [`LabRun::keep`] (or by an interrupted
    /// run): the processes recorded in `work_dir`'s state file, then `xlb
    /// detach --instance`, then every namespace of `prefix`. Fine if nothing
    /// is left. `xlb` and `instance` are used when there is no state file.
    pub fn down(prefix: &str, work_dir: &Path, xlb: &Path, instance: &str) -> Result<()> {
        let state = StateFile::load(work_dir)?;
        stop_recorded(work_dir);
        let (xlb, instance) = match &state {
            Some(s) => (s.xlb.clone(), s.instance.clone()),
            None => (xlb.to_path_buf(), instance.to_string()),
        };
        let mut result = Ok(());
        if xlb.is_file() {
            result = detach(&xlb, &instance);
        }
        Lab::down(prefix)?;
        if let Some(s) = &state {
            let _ = fs::remove_file(&s.socket);
        }
        let _ = fs::remove_file(work_dir.join(STATE_FILE));
        result
    }
}

/// The work directory of a run of `prefix` given none: a fresh temporary
/// one, removed after a clean teardown.
pub(super) fn temp_work_dir(prefix: &str) -> PathBuf {
    std::env::temp_dir().join(format!("xlb-lab-{prefix}-{}", std::process::id()))
}

/// `xlb-backend` arguments for the UDP echo on [`UDP_PORTS`], v4 and v6.
fn udp_listen_args() -> Vec<String> {
    UDP_PORTS
        .iter()
        .flat_map(|p| [format!("0.0.0.0:{p}"), format!("[::]:{p}")])
        .flat_map(|addr| ["--udp".to_string(), addr])
        .collect()
}

impl Drop for LabRun {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        if let Err(e) = self.teardown() {
            eprintln!("xlb-lab: tearing down lab {:?}: {e}", self.prefix);
        }
    }
}

/// `xlb decap`'s arguments on every backend: strip only tunnels from the
/// LB nodes' addresses (their encapsulation sources: the lab sets no
/// `encap_source_*`, so they are their `eth0` addresses) to the VIPs the
/// backends hold on `lo`.
fn decap_args(lab: &Lab) -> Vec<String> {
    let mut args = vec![
        "decap".to_string(),
        "--interface".to_string(),
        HOST_IFNAME.to_string(),
    ];
    for node in lab.nodes() {
        for src in [node.v4().to_string(), node.v6().to_string()] {
            args.extend(["--allow-source".to_string(), src]);
        }
    }
    let vips = [
        lab.vip_v4().into(),
        lab.vip2_v4().into(),
        lab.vip_v6().into(),
    ];
    for vip in vips.map(|v: std::net::IpAddr| v.to_string()) {
        args.extend(["--vip".to_string(), vip]);
    }
    args
}
