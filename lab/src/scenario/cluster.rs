//! [`ClusterRun`]: the two-node lab with xlb and BIRD running in it.
//!
//! On top of a [`LabRun`] built with two nodes (router, node A, node B,
//! backends, decapsulators, xdp-pass on both nodes' bridge ports, and
//! `xlb run` in node A), it starts `xlb run` in node B (instance and
//! control socket of its own), and BIRD in the router and in each node,
//! each with its configuration, control socket and pid file under the work
//! directory (`bird-{rt,a,b}.*`), rendered from the shipped examples
//! ([`crate::bird`]). It waits until the router has its four BGP sessions.
//!
//! The ways a node dies, for the tests and the demo: [`ClusterRun::kill_node`]
//! (daemon and BIRD killed, XDP detached: the BGP session closes),
//! [`Lab::silence_link`] (the link to the router goes silent: only BFD or
//! the hold timer notices), and `xlb withdraw --all` through
//! [`ClusterRun::ctl`]. Until xlb announces by itself,
//! [`ClusterRun::inject_route`] writes the host route xlb would.
//!
//! Dropping it stops node B's daemon and detaches its instance, then drops
//! the [`LabRun`] (node A, every other process, the namespaces).

use std::{
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use super::process::run_bounded;
use super::{
    CLI_TIMEOUT, DEFAULT_READY_TIMEOUT, LabRun, POLL, Result, RunOptions, ScenarioError, Status,
    XlbConfig, command_in, detach, io_err, log_tail, parse_status,
};
use crate::bird::{self, BirdFiles, NODE_SESSIONS};
use crate::topology::{Lab, Node};

/// The kernel routing table xlb's announcer writes in the lab's nodes,
/// and that their BIRD learns (`examples/bird.conf`).
pub const LAB_ANNOUNCE_TABLE: u32 = 100;
/// The route protocol number of xlb's routes (xlb's default).
pub const LAB_ROUTE_PROTOCOL: u8 = 252;

/// The `hash_seed` both nodes share: the same key builds the same tables,
/// so a flow that ECMP moves to the other node keeps its backend.
pub const LAB_HASH_SEED: &str = "6c61622d636c75737465722d73656564";

/// How long BGP gets to come up after BIRD starts: the node connects after
/// its 1 s connect delay; a refused first try is retried after 2 s.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(15);

/// What to build.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub prefix: String,
    /// The `xlb` binary; `xlb-backend` next to it.
    pub xlb: PathBuf,
    pub backends: usize,
    /// Node A's configuration; node B runs the same with its own instance
    /// and control socket ([`ClusterRun::node_config`]). Both get
    /// `hash_seed = LAB_HASH_SEED` unless `extra_daemon` sets another.
    pub config: XlbConfig,
    /// Lines added to both nodes' `[daemon]` table.
    pub extra_daemon: String,
    /// TOML appended to both nodes' configuration.
    pub extra: String,
    /// `[announce]` in both nodes: table [`LAB_ANNOUNCE_TABLE`], and the
    /// node's BIRD control socket as `speaker_socket`. Off: nothing is
    /// announced unless a test writes the routes ([`ClusterRun::inject_route`]).
    pub announce: bool,
    /// BFD at 100 ms × 3 between the router and the nodes.
    pub bfd: bool,
    /// `None`: a fresh temporary directory (see [`RunOptions::work_dir`]).
    pub work_dir: Option<PathBuf>,
    /// Start `xlb run` in both nodes.
    pub start_daemons: bool,
}

impl ClusterOptions {
    /// Three backends, the lab's default VIPs in `dsr-ipip`, no BFD.
    pub fn new(prefix: &str, xlb: &Path) -> Self {
        Self {
            prefix: prefix.to_string(),
            xlb: xlb.to_path_buf(),
            backends: 3,
            config: XlbConfig::lab_default(prefix, super::Mode::DsrIpip, 3),
            extra_daemon: String::new(),
            extra: String::new(),
            announce: true,
            bfd: false,
            work_dir: None,
            start_daemons: true,
        }
    }
}

/// Node B's daemon: its names and, while it runs, its pid.
#[derive(Debug)]
struct NodeB {
    instance: String,
    socket: PathBuf,
    config_path: PathBuf,
    pid: Option<u32>,
}

/// A BIRD instance of the lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speaker {
    Router,
    Node(Node),
}

impl Speaker {
    /// `rt`, `a` or `b`: its files are `bird-<role>.*`.
    pub fn role(self) -> String {
        match self {
            Speaker::Router => "rt".to_string(),
            Speaker::Node(n) => n.letter().to_string(),
        }
    }
}

/// The two-node lab with xlb and BIRD running; see the module docs.
pub struct ClusterRun {
    run: LabRun,
    node_b: NodeB,
    bfd: bool,
    /// Running BIRD instances and their pids.
    birds: Vec<(Speaker, u32)>,
    bird_bin: PathBuf,
    birdc_bin: PathBuf,
    kept: bool,
}

/// The instance of node B for a lab prefix: node A's, plus `-b`.
pub fn node_b_instance(prefix: &str) -> String {
    format!("{}-b", super::instance_for(prefix))
}

/// Node B's control socket for a lab prefix.
pub fn node_b_socket(prefix: &str) -> PathBuf {
    PathBuf::from(format!("/run/xlb/lab-{prefix}-b.sock"))
}

/// `program` found on `PATH` (BIRD lives in /usr/sbin, which a user's
/// PATH may lack: that is looked in too).
fn find_program(program: &str) -> Result<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/usr/local/sbin"])
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| ScenarioError::MissingBinary {
            what: program.to_string(),
            path: PathBuf::from("/usr/sbin").join(program),
            hint: "install BIRD 2 (Debian package `bird2`; `cargo xtask setup` installs it)"
                .to_string(),
        })
}

/// A configuration's text with `lines` added at the top of `[daemon]`.
fn with_daemon_lines(text: &str, lines: &str) -> String {
    if lines.trim().is_empty() {
        return text.to_string();
    }
    text.replacen(
        "[daemon]\n",
        &format!("[daemon]\n{}\n", lines.trim_end()),
        1,
    )
}

impl ClusterRun {
    /// The configuration text of `node` for `opts`, whose BIRD control
    /// socket is in `work_dir`.
    pub fn node_config(opts: &ClusterOptions, node: Node, work_dir: &Path) -> String {
        let mut cfg = opts.config.clone();
        if node == Node::B {
            cfg.instance = node_b_instance(&opts.prefix);
            cfg.control_socket = node_b_socket(&opts.prefix);
        }
        let mut daemon = opts.extra_daemon.clone();
        if !daemon.contains("hash_seed") {
            daemon.push_str(&format!("\nhash_seed = \"{LAB_HASH_SEED}\"\n"));
        }
        let mut text = with_daemon_lines(&cfg.render(), &daemon);
        if opts.announce {
            let ctl = BirdFiles::new(work_dir, &Speaker::Node(node).role()).ctl;
            text.push_str(&format!(
                "\n[announce]\ntable = {LAB_ANNOUNCE_TABLE}\nspeaker_socket = \"{}\"\n",
                ctl.display()
            ));
        }
        if !opts.extra.trim().is_empty() {
            text.push('\n');
            text.push_str(opts.extra.trim_end());
            text.push('\n');
        }
        text
    }

    /// Brings the lab up: namespaces, helpers, BIRD everywhere, `xlb run`
    /// in both nodes (unless `start_daemons` is false), and waits for the
    /// router's BGP sessions and every backend up on both nodes.
    pub fn up(opts: &ClusterOptions) -> Result<ClusterRun> {
        let bird_bin = find_program("bird")?;
        let birdc_bin = find_program("birdc")?;
        // Known before the lab exists: the configurations name BIRD's sockets.
        let work_dir = opts
            .work_dir
            .clone()
            .unwrap_or_else(|| super::run::temp_work_dir(&opts.prefix));
        let text_a = Self::node_config(opts, Node::A, &work_dir);
        let mut ro = RunOptions::new(&opts.prefix, &opts.xlb, &text_a);
        ro.backends = opts.backends;
        ro.nodes = 2;
        ro.work_dir = opts.work_dir.clone();
        ro.start_daemon = opts.start_daemons;
        let run = LabRun::up_with(ro)?;
        let config_path = run.work_dir().join("xlb-b.toml");
        let text = Self::node_config(opts, Node::B, &work_dir);
        fs::write(&config_path, &text)
            .map_err(io_err(format!("writing {}", config_path.display())))?;
        let instance = node_b_instance(&opts.prefix);
        detach(run.xlb_path(), &instance)?;
        let mut c = ClusterRun {
            run,
            node_b: NodeB {
                instance,
                socket: node_b_socket(&opts.prefix),
                config_path,
                pid: None,
            },
            bfd: opts.bfd,
            birds: Vec::new(),
            bird_bin,
            birdc_bin,
            kept: false,
        };
        for s in [
            Speaker::Router,
            Speaker::Node(Node::A),
            Speaker::Node(Node::B),
        ] {
            c.start_bird(s)?;
        }
        if opts.start_daemons {
            c.start_daemon(Node::B)?;
            c.wait_status(
                Node::B,
                "every backend up",
                DEFAULT_READY_TIMEOUT,
                Status::all_up,
            )?;
        }
        c.wait_sessions(&Node::ALL, SESSION_TIMEOUT)?;
        Ok(c)
    }

    pub fn run(&self) -> &LabRun {
        &self.run
    }

    pub fn run_mut(&mut self) -> &mut LabRun {
        &mut self.run
    }

    pub fn lab(&self) -> &Lab {
        self.run.lab()
    }

    pub fn bfd(&self) -> bool {
        self.bfd
    }

    pub fn instance(&self, node: Node) -> &str {
        match node {
            Node::A => self.run.instance(),
            Node::B => &self.node_b.instance,
        }
    }

    pub fn socket(&self, node: Node) -> &Path {
        match node {
            Node::A => self.run.socket(),
            Node::B => &self.node_b.socket,
        }
    }

    pub fn config_path(&self, node: Node) -> &Path {
        match node {
            Node::A => self.run.config_path(),
            Node::B => &self.node_b.config_path,
        }
    }

    /// The daemon's log of `node`.
    pub fn daemon_log(&self, node: Node) -> PathBuf {
        match node {
            Node::A => self.run.daemon_log(),
            Node::B => self.run.work_dir().join("daemon-b.log"),
        }
    }

    /// The files of a BIRD instance.
    pub fn bird_files(&self, s: Speaker) -> BirdFiles {
        BirdFiles::new(self.run.work_dir(), &s.role())
    }

    /// Runs `xlb ARGS --socket <node's socket>` and returns stdout.
    pub fn ctl(&self, node: Node, args: &[&str]) -> Result<String> {
        match node {
            Node::A => self.run.ctl(args),
            Node::B => {
                let mut cmd = Command::new(self.run.xlb_path());
                cmd.args(args).arg("--socket").arg(&self.node_b.socket);
                run_bounded(cmd, CLI_TIMEOUT)
            }
        }
    }

    /// `xlb status --json` of `node`.
    pub fn status(&self, node: Node) -> Result<Status> {
        let out = self.ctl(node, &["status", "--json"])?;
        parse_status(&out).map_err(|reason| ScenarioError::Parse {
            cmd: format!("xlb status --json (node {:?})", node),
            reason,
            output: out,
        })
    }

    /// Polls `node`'s status until `done` holds, for at most `timeout`.
    pub fn wait_status(
        &self,
        node: Node,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&Status) -> bool,
    ) -> Result<Status> {
        let start = Instant::now();
        loop {
            let last = match self.status(node) {
                Ok(s) if done(&s) => return Ok(s),
                Ok(s) => s.summary(),
                Err(e) => e.to_string(),
            };
            if start.elapsed() >= timeout {
                return Err(ScenarioError::Timeout {
                    what: format!("node {node:?}: {what}"),
                    after: timeout,
                    last: format!("{last}; daemon log:\n{}", log_tail(&self.daemon_log(node))),
                });
            }
            thread::sleep(POLL);
        }
    }

    /// Starts `xlb run` in `node` and waits until it answers `status`.
    pub fn start_daemon(&mut self, node: Node) -> Result<()> {
        if node == Node::A {
            return self.run.start_daemon();
        }
        let ns = self.lab().ns_node(Node::B);
        let args = vec![
            "run".to_string(),
            "--config".to_string(),
            self.node_b.config_path.display().to_string(),
        ];
        let xlb = self.run.xlb_path().to_path_buf();
        let pid = self.run.spawn_in("daemon-b", &ns, &xlb, &args)?;
        self.node_b.pid = Some(pid);
        let log = self.daemon_log(Node::B);
        let deadline = Instant::now() + DEFAULT_READY_TIMEOUT;
        loop {
            self.run.check_alive("xlb run in node B", pid, &log)?;
            match self.status(Node::B) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(ScenarioError::Timeout {
                        what: format!(
                            "xlb run in node B to answer on {}",
                            self.node_b.socket.display()
                        ),
                        after: DEFAULT_READY_TIMEOUT,
                        last: format!("{e}; daemon log:\n{}", log_tail(&log)),
                    });
                }
                Err(_) => thread::sleep(POLL),
            }
        }
    }

    /// SIGKILL to `node`'s daemon, as a crash would: XDP stays attached.
    pub fn kill9_daemon(&mut self, node: Node) -> Result<()> {
        match node {
            Node::A => self.run.kill9_daemon(),
            Node::B => {
                let pid = self.node_b.pid.take().ok_or_else(|| {
                    ScenarioError::Invalid("no xlb run in node B to kill".to_string())
                })?;
                sigkill(pid)?;
                self.lab().kill(pid)?;
                Ok(())
            }
        }
    }

    /// Starts BIRD `s` with its configuration rendered for this lab.
    pub fn start_bird(&mut self, s: Speaker) -> Result<()> {
        let files = self.bird_files(s);
        let text = match s {
            Speaker::Router => bird::router_config(self.bfd),
            Speaker::Node(n) => bird::node_config(n, self.bfd),
        }
        .map_err(ScenarioError::Invalid)?;
        fs::write(&files.conf, text)
            .map_err(io_err(format!("writing {}", files.conf.display())))?;
        let _ = fs::remove_file(&files.ctl);
        let ns = match s {
            Speaker::Router => self.lab().ns_router().expect("a two-node lab has a router"),
            Speaker::Node(n) => self.lab().ns_node(n),
        };
        let bin = self.bird_bin.clone();
        let pid = self
            .run
            .spawn_in(&format!("bird-{}", s.role()), &ns, &bin, &files.args())?;
        self.birds.push((s, pid));
        // Ready when its control socket answers.
        let deadline = Instant::now() + CLI_TIMEOUT;
        loop {
            self.run
                .check_alive(&format!("bird in {ns}"), pid, &files.log)?;
            match self.birdc(s, &["show", "status"]) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(ScenarioError::Timeout {
                        what: format!("bird in {ns} to answer on {}", files.ctl.display()),
                        after: CLI_TIMEOUT,
                        last: e.to_string(),
                    });
                }
                Err(_) => thread::sleep(POLL),
            }
        }
    }

    /// SIGKILL to BIRD `s`: its BGP sessions close (the kernel closes the
    /// sockets of a dead process).
    pub fn kill_bird(&mut self, s: Speaker) -> Result<()> {
        let pos = self
            .birds
            .iter()
            .position(|(b, _)| *b == s)
            .ok_or_else(|| ScenarioError::Invalid(format!("bird {} does not run", s.role())))?;
        let (_, pid) = self.birds.swap_remove(pos);
        sigkill(pid)?;
        self.lab().kill(pid)?;
        Ok(())
    }

    /// `birdc -s <ctl> ARGS` for BIRD `s`.
    pub fn birdc(&self, s: Speaker, args: &[&str]) -> Result<String> {
        let mut cmd = Command::new(&self.birdc_bin);
        cmd.arg("-s").arg(self.bird_files(s).ctl).args(args);
        run_bounded(cmd, CLI_TIMEOUT)
    }

    /// Waits until the router has both BGP sessions (v4, v6) of every node
    /// in `nodes` established.
    pub fn wait_sessions(&self, nodes: &[Node], timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            let out = self.birdc(Speaker::Router, &["show", "protocols"])?;
            let missing: Vec<String> = nodes
                .iter()
                .flat_map(|&n| bird::router_sessions(n))
                .filter(|p| !bird::established(&out, p))
                .collect();
            if missing.is_empty() {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(ScenarioError::Timeout {
                    what: format!("the router's BGP sessions {missing:?} to be established"),
                    after: timeout,
                    last: out,
                });
            }
            thread::sleep(POLL);
        }
    }

    /// Whether `node`'s BIRD has both its sessions to the router up.
    pub fn node_sessions_up(&self, node: Node) -> Result<bool> {
        let out = self.birdc(Speaker::Node(node), &["show", "protocols"])?;
        Ok(NODE_SESSIONS.iter().all(|p| bird::established(&out, p)))
    }

    /// Waits until the router sends `vip` to exactly `want` (sorted, A
    /// first; empty: no route); returns how long that took.
    pub fn wait_router(&self, vip: IpAddr, want: &[Node], timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            let last = self.lab().router_nodes(vip)?;
            if last == want {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(ScenarioError::Timeout {
                    what: format!("the router to send {vip} to {want:?}"),
                    after: timeout,
                    last: format!("{last:?}"),
                });
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Writes the host route of `vip` into `node`'s announce table, as
    /// xlb's announcer does (table [`LAB_ANNOUNCE_TABLE`], protocol
    /// [`LAB_ROUTE_PROTOCOL`]); for labs without the announcer.
    pub fn inject_route(&self, node: Node, vip: IpAddr) -> Result<()> {
        self.ip_route(node, "replace", vip)
    }

    /// Removes a route [`ClusterRun::inject_route`] wrote.
    pub fn remove_route(&self, node: Node, vip: IpAddr) -> Result<()> {
        self.ip_route(node, "del", vip)
    }

    fn ip_route(&self, node: Node, verb: &str, vip: IpAddr) -> Result<()> {
        let len = if vip.is_ipv4() { 32 } else { 128 };
        let mut cmd = command_in(&self.lab().ns_node(node), "ip")?;
        cmd.args(["route", verb, "blackhole", &format!("{vip}/{len}")])
            .args(["table", &LAB_ANNOUNCE_TABLE.to_string()])
            .args(["proto", &LAB_ROUTE_PROTOCOL.to_string()]);
        run_bounded(cmd, CLI_TIMEOUT).map(drop)
    }

    /// Rewrites both nodes' configuration for `opts` (its `config`,
    /// `extra*` and `announce`) and has both daemons reload it, A first.
    pub fn reload(&self, opts: &ClusterOptions) -> Result<()> {
        let dir = self.run.work_dir().to_path_buf();
        for node in Node::ALL {
            let path = self.config_path(node).to_path_buf();
            fs::write(&path, Self::node_config(opts, node, &dir))
                .map_err(io_err(format!("writing {}", path.display())))?;
            self.ctl(node, &["reload"])?;
        }
        Ok(())
    }

    /// Leaves everything running when dropped (for `cargo xtask lab up
    /// --nodes 2`); `lab down` removes it using the state file. Returns the
    /// work directory.
    pub fn keep(mut self) -> PathBuf {
        self.kept = true;
        self.run.mark_kept();
        self.run.work_dir().to_path_buf()
    }

    /// Death (a): `node`'s daemon and BIRD killed (SIGKILL) and its XDP
    /// detached. The router hears the BGP sessions close.
    pub fn kill_node(&mut self, node: Node) -> Result<()> {
        self.kill9_daemon(node)?;
        self.kill_bird(Speaker::Node(node))?;
        detach(self.run.xlb_path(), self.instance(node))
    }
}

fn sigkill(pid: u32) -> Result<()> {
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).map_err(|e| ScenarioError::Io {
        what: format!("kill -9 {pid}"),
        source: e.into(),
    })
}

impl Drop for ClusterRun {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        if let Some(pid) = self.node_b.pid.take() {
            let _ = self.lab().kill(pid);
        }
        if let Err(e) = detach(self.run.xlb_path(), &self.node_b.instance) {
            eprintln!("xlb-lab: detaching node B's instance: {e}");
        }
        let _ = fs::remove_file(&self.node_b.socket);
        // `run` drops next: node A, BIRD, the helpers, the namespaces.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_b_runs_the_same_config_under_its_own_names() {
        let opts = ClusterOptions::new("c1", Path::new("/x/xlb"));
        let a = ClusterRun::node_config(&opts, Node::A, Path::new("/w"));
        let b = ClusterRun::node_config(&opts, Node::B, Path::new("/w"));
        for (text, instance, socket, speaker) in [
            (&a, "lab-c1", "/run/xlb/lab-c1.sock", "/w/bird-a.ctl"),
            (&b, "lab-c1-b", "/run/xlb/lab-c1-b.sock", "/w/bird-b.ctl"),
        ] {
            assert_eq!(
                super::super::setting(text, "announce", "speaker_socket").as_deref(),
                Some(speaker)
            );
            assert_eq!(
                super::super::setting(text, "daemon", "instance").as_deref(),
                Some(instance)
            );
            assert_eq!(
                super::super::setting(text, "daemon", "control_socket").as_deref(),
                Some(socket)
            );
            assert_eq!(
                super::super::setting(text, "daemon", "hash_seed").as_deref(),
                Some(LAB_HASH_SEED)
            );
            assert_eq!(
                super::super::setting(text, "announce", "table").as_deref(),
                Some("100")
            );
        }
        // Everything else is the same.
        let strip = |t: &str| {
            t.replace("-b.sock", ".sock")
                .replace("lab-c1-b", "lab-c1")
                .replace("bird-b.ctl", "bird-a.ctl")
        };
        assert_eq!(strip(&a), strip(&b));
    }

    #[test]
    fn a_seed_of_its_own_is_kept() {
        let mut opts = ClusterOptions::new("c2", Path::new("/x/xlb"));
        opts.extra_daemon = "hash_seed = \"00112233445566778899aabbccddeeff\"".to_string();
        let a = ClusterRun::node_config(&opts, Node::A, Path::new("/w"));
        assert_eq!(
            super::super::setting(&a, "daemon", "hash_seed").as_deref(),
            Some("00112233445566778899aabbccddeeff")
        );
    }
}
