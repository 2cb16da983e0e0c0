//! A daemon as an operator meets it, inside a namespace of its own: the
//! namespace with `xd0` and three HTTP backends with fault switches, the
//! `xlb run` process, and what an operator reads back (CLI, status, events,
//! metrics, the pinned maps and link).

use std::{
    future::Future,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use lb_user::dataplane::{Dataplane, LoadOptions};
use serde_json::Value;
use tokio::sync::oneshot;
use xlb_lab::backend::{BackendOptions, Fault};
use xlb_tests::netns::NetNs;

/// The backends of both VIPs, addresses on the namespace's `lo`.
pub(crate) const BACKENDS: [&str; 3] = ["10.0.0.11", "10.0.0.12", "10.0.0.13"];

/// Tells environments of one test binary apart (instance, directory).
static SEQ: AtomicU32 = AtomicU32::new(0);

/// The `xlb` binary next to this test's target directory.
pub(crate) fn xlb_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join("xlb");
    assert!(
        bin.exists(),
        "{} not built: run `cargo build -p lb-user` (cargo xtask test does)",
        bin.display()
    );
    bin
}

pub(crate) struct Env {
    pub(crate) ns: NetNs,
    dir: PathBuf,
    pub(crate) instance: String,
    pub(crate) socket: PathBuf,
    pub(crate) config: PathBuf,
    daemon: Option<Child>,
    /// Daemons started so far: each gets a log file of its own.
    starts: u32,
    /// Stops the backends' thread, which then ends.
    backends: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new(xlb_bin())
            .args(["detach", "--instance", &self.instance])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some((stop, thread)) = self.backends.take() {
            let _ = stop.send(());
            let _ = thread.join();
        }
    }
}

/// The daemon's configuration: VIPs "api" (10.100.0.1, weight 1, table 251)
/// and "web" (10.100.0.2, `web_weight`, `web_table`), each with all three
/// backends, probed directly over HTTP every 200 ms.
/// `max_flows` of VIP api's backends.
pub(crate) const API_MAX_FLOWS: u64 = 3000;

pub(crate) fn config_text(e: &Env, web_weight: u32, web_table: u32) -> String {
    let mut s = format!(
        r#"
[daemon]
interface = "xd0"
instance = "{instance}"
control_socket = "{socket}"
metrics_address = "127.0.0.1:9813"
conntrack_size = 4096
max_table_size = 251

# The backends are addresses on this namespace's lo, with no data path to
# them through xd0: probe them directly.
[health_check]
kind = "http"
path = "/health"
via = "direct"
interval = "200ms"
fast_interval = "100ms"
down_interval = "200ms"
timeout = "150ms"
rise = 2
fall = 2
"#,
        instance = e.instance,
        socket = e.socket.display()
    );
    for (name, vip, weight, table) in [
        ("api", "10.100.0.1", 1, 251),
        ("web", "10.100.0.2", web_weight, web_table),
    ] {
        s += &format!(
            "\n[[vip]]\nname = \"{name}\"\naddress = \"{vip}\"\nport = 80\ntable_size = {table}\n"
        );
        if name == "api" {
            // For the capacity alarms scenario.
            s += &format!("max_flows = {API_MAX_FLOWS}\n");
        }
        for b in BACKENDS {
            s += &format!("[[vip.backend]]\naddress = \"{b}\"\nweight = {weight}\n");
        }
    }
    s
}

impl Env {
    /// The namespace, its backends and the configuration; no daemon yet.
    pub(crate) fn new() -> anyhow::Result<Self> {
        xlb_tests::require_root();
        let ns = NetNs::new("dmn")?;
        ns.ip(&["link", "add", "xd0", "type", "veth", "peer", "name", "xd1"])?;
        ns.ip(&["link", "set", "xd0", "up"])?;
        ns.ip(&["link", "set", "xd1", "up"])?;
        ns.ip(&["addr", "add", "10.0.0.1/24", "dev", "xd0"])?;
        for b in BACKENDS {
            ns.ip(&["addr", "add", &format!("{b}/32"), "dev", "lo"])?;
        }
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let instance = format!("t{}-{n}", std::process::id());
        let dir = std::env::temp_dir().join(format!("xlb-daemon-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("xlb.sock");
        let config = dir.join("xlb.toml");
        let mut e = Env {
            ns,
            dir,
            instance,
            socket,
            config,
            daemon: None,
            starts: 0,
            backends: None,
        };
        std::fs::write(&e.config, config_text(&e, 1, 251))?;
        e.backends = Some(spawn_backends(e.ns.name().to_string()));
        Ok(e)
    }

    /// Starts `xlb run` and waits for its control socket.
    pub(crate) fn start(&mut self) -> anyhow::Result<()> {
        self.start_with(&[])
    }

    /// Starts `xlb run ... EXTRA` and waits for its control socket.
    pub(crate) fn start_with(&mut self, extra: &[&str]) -> anyhow::Result<()> {
        self.starts += 1;
        let log = std::fs::File::create(self.dir.join(format!("daemon-{}.log", self.starts)))?;
        let child = self
            .in_ns()
            .arg(xlb_bin())
            .args(["run", "--config"])
            .arg(&self.config)
            .args(extra)
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()?;
        self.daemon = Some(child);
        wait_for(Duration::from_secs(10), "control socket", || {
            Ok(self.socket.exists())
        })
    }

    /// A command entering only the network namespace. `ip netns exec` also
    /// gives the command a private mount namespace with a fresh /sys, where
    /// pins would land in a bpffs nobody else sees and vanish with it.
    pub(crate) fn in_ns(&self) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/var/run/netns/{}", self.ns.name()));
        c
    }

    /// The log of the `n`th daemon started (from 1).
    pub(crate) fn log(&self, n: u32) -> anyhow::Result<String> {
        Ok(std::fs::read_to_string(
            self.dir.join(format!("daemon-{n}.log")),
        )?)
    }

    /// The pid of the running `xlb run`, if one runs.
    pub(crate) fn daemon_pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(Child::id)
    }

    /// Stops the daemon as systemd does (SIGTERM) and waits for it to exit
    /// (10 s at most).
    pub(crate) fn stop(&mut self) -> anyhow::Result<()> {
        let mut c = self.daemon.take().context("no daemon")?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(c.id())?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        let t = Instant::now();
        while c.try_wait()?.is_none() {
            if t.elapsed() > Duration::from_secs(10) {
                c.kill()?;
                c.wait()?;
                bail!("xlb run did not stop within 10 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    pub(crate) fn kill9(&mut self) -> anyhow::Result<()> {
        let mut c = self.daemon.take().context("no daemon")?;
        c.kill()?; // SIGKILL
        c.wait()?;
        Ok(())
    }

    /// Runs `xlb --socket <ours> ARGS`; fails with its stderr.
    pub(crate) fn xlb(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(xlb_bin())
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()?;
        ensure!(
            out.status.success(),
            "xlb {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    }

    pub(crate) fn status(&self) -> anyhow::Result<Value> {
        Ok(serde_json::from_str(&self.xlb(&["status", "--json"])?)?)
    }

    /// `xlb events --json`.
    pub(crate) fn events(&self) -> anyhow::Result<Value> {
        Ok(serde_json::from_str(&self.xlb(&["events", "--json"])?)?)
    }

    /// The `xlb status --json` object of backend `addr` of VIP `vip`.
    pub(crate) fn backend(&self, vip: &str, addr: &str) -> anyhow::Result<Value> {
        let s = self.status()?;
        let v = s["vips"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == vip)
            .context("vip")?;
        v["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["address"] == addr)
            .cloned()
            .context("backend")
    }

    /// State of backend `addr` of VIP `vip` in `xlb status --json`.
    pub(crate) fn backend_state(&self, vip: &str, addr: &str) -> anyhow::Result<String> {
        Ok(self.backend(vip, addr)?["state"]
            .as_str()
            .unwrap()
            .to_string())
    }

    /// Runs `fut` to completion on a runtime inside the namespace.
    fn block_on_in_ns<F: Future + Send>(&self, fut: F) -> anyhow::Result<F::Output>
    where
        F::Output: Send,
    {
        Ok(xlb_lab::topology::in_netns(self.ns.name(), || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(fut)
        })?)
    }

    /// Switches a backend's fault through its admin port.
    pub(crate) fn set_fault(&self, backend: &str, fault: Fault) -> anyhow::Result<()> {
        let admin: SocketAddr = format!("{backend}:9000").parse()?;
        self.block_on_in_ns(xlb_lab::backend::remote_set_fault(
            admin,
            fault,
            Duration::from_secs(2),
        ))??;
        Ok(())
    }

    /// `GET PATH` on the metrics listener from inside the namespace: its
    /// status code and body.
    pub(crate) fn http_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let resp = self.block_on_in_ns(xlb_lab::http::request(
            "127.0.0.1:9813".parse().unwrap(),
            "GET",
            path,
            Duration::from_secs(2),
        ))??;
        Ok((resp.head.status, String::from_utf8(resp.body)?))
    }

    /// `GET /metrics` from inside the namespace.
    pub(crate) fn metrics(&self) -> anyhow::Result<String> {
        let resp = self.block_on_in_ns(xlb_lab::http::request(
            "127.0.0.1:9813".parse().unwrap(),
            "GET",
            "/metrics",
            Duration::from_secs(2),
        ))??;
        ensure!(
            resp.head.status == 200,
            "metrics answered {}",
            resp.head.status
        );
        Ok(String::from_utf8(resp.body)?)
    }

    pub(crate) fn pins(&self) -> PathBuf {
        Path::new("/sys/fs/bpf/xlb").join(&self.instance)
    }

    /// The pinned maps, opened as the daemon sees them.
    pub(crate) fn maps(&self) -> anyhow::Result<Dataplane> {
        Ok(Dataplane::load(&LoadOptions {
            ct_size: 4096,
            nat_size: lb_common::nat::DEFAULT_NAT_SIZE,
            ring_stride: 251,
            pin_dir: Some(self.pins()),
            kernel: None,
        })?)
    }

    /// The id of the pinned XDP link.
    pub(crate) fn link_id(&self) -> anyhow::Result<u32> {
        let pinned = aya::programs::links::PinnedLink::from_pin(self.pins().join("XLB_LINK"))?;
        let fd: aya::programs::links::FdLink = pinned.into();
        Ok(fd.info()?.id())
    }

    /// Whether an XDP program is attached to `xd0`.
    pub(crate) fn xdp_attached(&self) -> anyhow::Result<bool> {
        Ok(self.ns.ip(&["link", "show", "xd0"])?.contains("xdp"))
    }
}

/// Real HTTP servers with fault switches, one per backend, in the namespace,
/// on a thread that runs them until told to stop.
fn spawn_backends(ns: String) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let _ = xlb_lab::topology::in_netns(&ns, || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut handles = Vec::new();
                for (i, b) in BACKENDS.iter().enumerate() {
                    let opts = BackendOptions {
                        name: format!("b{}", i + 1),
                        listen: vec![format!("{b}:80").parse().unwrap()],
                        admin: format!("{b}:9000").parse().unwrap(),
                    };
                    handles.push(xlb_lab::backend::serve(opts).await.unwrap());
                }
                // Dropping the handles stops the servers.
                let _ = stopped.await;
            });
        });
    });
    (stop, thread)
}

/// Polls `f` every 50 ms until it says yes; fails after `limit`.
pub(crate) fn wait_for(
    limit: Duration,
    what: &str,
    mut f: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f().unwrap_or(false) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{what}: not within {limit:?}")
}
