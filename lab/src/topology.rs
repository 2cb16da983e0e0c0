//! The lab's network: one L2 segment built from network namespaces.
//!
//! ```text
//!            {p}-br: bridge br0 (no addresses)
//!   ┌────────────┬────────┴───┬────────────┬────────────┐
//!  v-cl         v-lb         v-b1         v-b2   …     v-bN     (bridge side, MTU 1600)
//!   │            │            │            │            │
//!  eth0         eth0         eth0         eth0         eth0
//! {p}-cl       {p}-lb       {p}-b1       {p}-b2       {p}-bN
//! client        LB host      backends: VIPs on lo, never answer ARP for them
//! .10 / ::10   .2 / ::2     .11 / ::11   .12 / ::12   …
//! MTU 1500     MTU 1600     MTU 1600 (room for the +20/+40 bytes of IPIP/IP6IP6)
//! ```
//!
//! A lab built with [`LabConfig::flooder`] has one more host on the segment,
//! the flooding client `{p}-fl` (port `v-fl`, eth0 MTU 1500, 10.99.0.9 and
//! fd00:99::9, plus 64 addresses of its own /64 fd00:99:0:1::/64, which the
//! backends route on-link), so that a flood and the well-behaved client
//! come from different namespaces and source prefixes.
//!
//! Every address exists only inside these namespaces, so labs with different
//! prefixes reuse the same addresses without seeing each other; the prefix
//! only keeps the namespace names apart.
//!
//! Two things the lab cannot do itself and leaves to whoever holds the eBPF
//! object (names exposed by [`Lab::lb_peer_ifname`] and [`BACKEND_IFNAME`]):
//! - A veth delivers frames sent with `XDP_TX` (or redirected) only if the
//!   receiving peer has an XDP program attached; otherwise they are counted as
//!   `xdp_tx_errors` and lost (veth_xdp_xmit, kernel 5.9+ behaviour). So the
//!   LB's peer `v-lb` in `{p}-br` needs any XDP program, e.g. `xlb_pass`.
//! - This kernel has neither `CONFIG_NET_IPIP` nor `CONFIG_IPV6_TUNNEL`, so a
//!   backend cannot decapsulate with a tunnel device: attach `xlb_decap` to
//!   each backend's `eth0`.
//!
//! This module holds the lab's handle ([`Lab`]: bring up, spawn, remove);
//! `addressing` every address and MAC, `build` the steps that wire the
//! segment, `netns` the `ip`/`sysctl` runners and namespace entry, `ping`
//! an echo request. Everything public is re-exported here.

mod addressing;
mod build;
mod cluster;
mod netns;
mod ping;
mod wire;

use std::{
    ffi::OsStr,
    fs::File,
    io,
    net::{Ipv4Addr, Ipv6Addr},
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::Mutex,
    thread,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill, killpg},
    unistd::Pid,
};

pub use addressing::*;
pub use cluster::{LinkSilencer, MAX_NODES, NODE_B_V4, NODE_B_V6, Node, ROUTER_V4, ROUTER_V6};
pub use netns::{ifindex, in_netns, is_root, list_namespaces, netns_fd, sysctl_get};
pub use ping::{inet_checksum, ping};
pub use wire::{WireCounts, WireSwitch};

use netns::{describe, ip, ip_in, namespace_exists, sysctl_in};

/// Where `ip netns add` bind-mounts namespaces (iproute2's NETNS_RUN_DIR).
pub const NETNS_RUN_DIR: &str = "/var/run/netns";

/// Default namespace-name prefix.
pub const DEFAULT_PREFIX: &str = "xlb";

/// Name of the bridge inside `{p}-br`.
pub const BRIDGE_IFNAME: &str = "br0";

/// Name of the lab interface inside the client, LB and backend namespaces.
pub const HOST_IFNAME: &str = "eth0";

/// A backend's lab interface, where the caller attaches the decap program.
pub const BACKEND_IFNAME: &str = HOST_IFNAME;

/// MTU of the bridge, every bridge-side veth and the LB's and backends' eth0:
/// a 1500-byte client packet plus a 40-byte IPv6 outer header fits.
pub const LAB_MTU: u32 = 1600;

/// MTU of the client's eth0, so that everything the client sends still fits
/// after the LB adds an outer header.
pub const CLIENT_MTU: u32 = 1500;

/// How long `up` waits for every eth0 to report carrier.
const LINK_UP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a spawned process gets between SIGTERM and SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// Everything that can go wrong building, using or removing a lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("invalid lab config: {reason}")]
    InvalidConfig { reason: String },

    #[error(
        "the lab needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network namespaces; run as root"
    )]
    NotRoot,

    #[error("could not run `{cmd}`: {source}; is iproute2 (`ip`) installed and on PATH?")]
    Spawn { cmd: String, source: io::Error },

    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        cmd: String,
        status: String,
        stderr: String,
    },

    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },

    #[error("namespace {ns} does not exist; run `Lab::up` (or `cargo xtask lab up`) first")]
    MissingNamespace { ns: String },

    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },

    #[error("unexpected output from `{cmd}`: {output}")]
    Parse { cmd: String, output: String },
}

type Result<T, E = LabError> = std::result::Result<T, E>;

/// What to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabConfig {
    /// Namespace-name prefix: namespaces are `{prefix}-br`, `-cl`, `-lb`,
    /// `-b1`…; 1 to 32 characters of `[A-Za-z0-9_]` or `-`.
    pub prefix: String,
    /// Number of backend namespaces, 1..=[`MAX_BACKENDS`].
    pub backends: usize,
    /// Also build the flooding client `{prefix}-fl` (host 9 of the segment,
    /// plus [`FLOOD_V6_SOURCES`] addresses of its own /64,
    /// [`FLOOD_NET_V6`]), for the abuse tests: floods come from a namespace
    /// of their own, so the well-behaved client's sockets, CPU accounting
    /// and addresses stay apart.
    pub flooder: bool,
    /// LB nodes, 1..=[`MAX_NODES`]. With 2, the lab also has a router
    /// `{prefix}-rt` in front of node A (`{prefix}-lb`) and node B
    /// (`{prefix}-lb2`), and the client reaches the VIPs through it (see
    /// `cluster`); with 1 the lab is the single-LB segment drawn above.
    pub nodes: usize,
}

impl Default for LabConfig {
    /// Prefix `xlb`, three backends.
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_string(),
            backends: 3,
            flooder: false,
            nodes: 1,
        }
    }
}

impl LabConfig {
    /// The default config with another prefix.
    pub fn with_prefix(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            ..Self::default()
        }
    }

    pub fn validate(&self) -> Result<()> {
        validate_prefix(&self.prefix)?;
        if !(1..=MAX_BACKENDS).contains(&self.backends) {
            return Err(LabError::InvalidConfig {
                reason: format!(
                    "backends = {} is out of range; use 1..={MAX_BACKENDS}",
                    self.backends
                ),
            });
        }
        if !(1..=MAX_NODES).contains(&self.nodes) {
            return Err(LabError::InvalidConfig {
                reason: format!(
                    "nodes = {} is out of range; use 1 (one LB) or {MAX_NODES} (two LB nodes behind a router)",
                    self.nodes
                ),
            });
        }
        Ok(())
    }
}

fn validate_prefix(prefix: &str) -> Result<()> {
    let ok_chars = prefix
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if prefix.is_empty() || prefix.len() > 32 || !ok_chars {
        return Err(LabError::InvalidConfig {
            reason: format!(
                "prefix {prefix:?} must be 1 to 32 characters of letters, digits, '-' or '_'"
            ),
        });
    }
    Ok(())
}

/// True if `name` is one of the namespaces a lab with `prefix` creates.
fn is_lab_namespace(prefix: &str, name: &str) -> bool {
    let Some(role) = name
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('-'))
    else {
        return false;
    };
    match role {
        "br" | "cl" | "lb" | "fl" | "rt" | "lb2" => true,
        _ => role
            .strip_prefix('b')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
    }
}

/// A running lab. Dropping it kills what [`Lab::spawn`] started and removes
/// every namespace, unless [`Lab::keep`] was called.
#[derive(Debug)]
pub struct Lab {
    cfg: LabConfig,
    keep: bool,
    children: Mutex<Vec<Child>>,
}

impl Lab {
    /// Builds the lab. Any namespaces left with this prefix (a previous run
    /// that was interrupted or kept) are removed first, with the processes
    /// still running in them.
    pub fn up(cfg: &LabConfig) -> Result<Lab> {
        cfg.validate()?;
        if !is_root() {
            return Err(LabError::NotRoot);
        }
        Lab::down(&cfg.prefix)?;
        // From here on a failure drops `lab`, which removes what was built.
        let lab = Lab {
            cfg: cfg.clone(),
            keep: false,
            children: Mutex::new(Vec::new()),
        };
        lab.build()?;
        Ok(lab)
    }

    /// A handle on a lab that already exists (e.g. built by an earlier
    /// `cargo xtask lab up`). It is kept: dropping it removes nothing.
    pub fn attach(cfg: &LabConfig) -> Result<Lab> {
        cfg.validate()?;
        let lab = Lab {
            cfg: cfg.clone(),
            keep: true,
            children: Mutex::new(Vec::new()),
        };
        for ns in lab.namespaces() {
            if !namespace_exists(&ns) {
                return Err(LabError::MissingNamespace { ns });
            }
        }
        Ok(lab)
    }

    /// Removes every namespace of `prefix` and kills the processes running
    /// in them. Fine if there are none.
    pub fn down(prefix: &str) -> Result<()> {
        validate_prefix(prefix)?;
        if !PathBuf::from(NETNS_RUN_DIR).exists() {
            return Ok(());
        }
        let me = std::process::id();
        for ns in list_namespaces()? {
            if !is_lab_namespace(prefix, &ns) {
                continue;
            }
            // Processes keep a namespace (and its veths) alive after its name
            // is gone; a lab that is down must not leave servers running.
            let pids = ip(&["netns", "pids", &ns]).unwrap_or_default();
            for pid in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                if pid as u32 != me {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
            match ip(&["netns", "del", &ns]) {
                Ok(_) => {}
                // Removed concurrently or already half gone: the goal is met.
                Err(_) if !namespace_exists(&ns) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Leaves the namespaces and spawned processes in place when this handle
    /// is dropped (for `cargo xtask lab up`).
    pub fn keep(&mut self) {
        self.keep = true;
    }

    /// A `Command` running `args[0] args[1..]` inside namespace `ns`
    /// (`ip netns exec ns …`).
    pub fn exec<I, S>(ns: &str, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).args(args);
        cmd
    }

    /// Starts `cmd` in its own process group and owns it: it is killed
    /// (SIGTERM, then SIGKILL after 2 s) when the lab is dropped, unless kept.
    /// Build `cmd` with [`Lab::exec`] to run it inside a namespace. Returns
    /// the pid (also the process group id).
    pub fn spawn(&self, mut cmd: Command) -> Result<u32> {
        cmd.process_group(0);
        let child = cmd.spawn().map_err(|source| LabError::Spawn {
            cmd: describe(&cmd),
            source,
        })?;
        let pid = child.id();
        self.children
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(child);
        Ok(pid)
    }

    /// Starts `program args…` in the background inside `ns` (stdin closed,
    /// stdout and stderr inherited); see [`Lab::spawn`].
    pub fn spawn_in<I, S>(&self, ns: &str, program: impl AsRef<OsStr>, args: I) -> Result<u32>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Lab::exec(ns, [program.as_ref()]);
        cmd.args(args).stdin(Stdio::null());
        self.spawn(cmd)
    }

    /// Stops one process started by [`Lab::spawn`] (SIGTERM to its group,
    /// SIGKILL after 2 s) and reaps it. Unknown pids are an error.
    pub fn kill(&self, pid: u32) -> Result<()> {
        let child = {
            let mut children = self
                .children
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let pos = children.iter().position(|c| c.id() == pid).ok_or_else(|| {
                LabError::InvalidConfig {
                    reason: format!("pid {pid} was not started by this lab"),
                }
            })?;
            children.swap_remove(pos)
        };
        stop_children(vec![child]);
        Ok(())
    }

    /// True while a process started by [`Lab::spawn`] is still running.
    pub fn is_running(&self, pid: u32) -> bool {
        let mut children = self
            .children
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        children
            .iter_mut()
            .find(|c| c.id() == pid)
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn config(&self) -> &LabConfig {
        &self.cfg
    }

    pub fn prefix(&self) -> &str {
        &self.cfg.prefix
    }

    pub fn backend_count(&self) -> usize {
        self.cfg.backends
    }

    /// The namespace holding the bridge.
    pub fn ns_bridge(&self) -> String {
        format!("{}-br", self.cfg.prefix)
    }

    pub fn ns_client(&self) -> String {
        format!("{}-cl", self.cfg.prefix)
    }

    pub fn ns_lb(&self) -> String {
        format!("{}-lb", self.cfg.prefix)
    }

    /// The flooding client's namespace; `None` unless the lab was built
    /// with [`LabConfig::flooder`].
    pub fn ns_flood(&self) -> Option<String> {
        self.cfg.flooder.then(|| format!("{}-fl", self.cfg.prefix))
    }

    /// Namespace of backend `i`, 1-based.
    pub fn ns_backend(&self, i: usize) -> String {
        assert!(
            (1..=self.cfg.backends).contains(&i),
            "backend {i} out of range 1..={}",
            self.cfg.backends
        );
        format!("{}-b{i}", self.cfg.prefix)
    }

    /// Every backend namespace, b1 first.
    pub fn backend_namespaces(&self) -> Vec<String> {
        (1..=self.cfg.backends)
            .map(|i| self.ns_backend(i))
            .collect()
    }

    /// Client, LB, backend and flood namespaces, and node B's and the
    /// router's in a two-node lab (everything with an eth0).
    pub fn host_namespaces(&self) -> Vec<String> {
        let mut v = vec![self.ns_client(), self.ns_lb()];
        v.extend(self.backend_namespaces());
        v.extend(self.ns_flood());
        v.extend(self.ns_node_b());
        v.extend(self.ns_router());
        v
    }

    /// Every namespace of the lab, bridge first.
    pub fn namespaces(&self) -> Vec<String> {
        let mut v = vec![self.ns_bridge()];
        v.extend(self.host_namespaces());
        v
    }

    /// The bridge-side peer of the LB's eth0 (in [`Lab::ns_bridge`]); it needs
    /// an XDP program for the LB's XDP_TX frames to arrive (see module docs).
    pub fn lb_peer_ifname(&self) -> &'static str {
        "v-lb"
    }

    /// The bridge-side peer of backend `i`'s eth0 (in [`Lab::ns_bridge`]).
    pub fn backend_peer_ifname(&self, i: usize) -> String {
        assert!(
            (1..=self.cfg.backends).contains(&i),
            "backend {i} out of range 1..={}",
            self.cfg.backends
        );
        format!("v-b{i}")
    }

    /// The LB's interface (in [`Lab::ns_lb`]), where the XDP LB attaches.
    pub fn lb_ifname(&self) -> &'static str {
        HOST_IFNAME
    }

    pub fn lb_v4(&self) -> Ipv4Addr {
        LB_V4
    }

    pub fn lb_v6(&self) -> Ipv6Addr {
        LB_V6
    }

    pub fn client_v4(&self) -> Ipv4Addr {
        CLIENT_V4
    }

    pub fn client_v6(&self) -> Ipv6Addr {
        CLIENT_V6
    }

    /// The flooding client's address on the segment (see [`Lab::ns_flood`]).
    pub fn flood_v4(&self) -> Ipv4Addr {
        FLOOD_V4
    }

    /// Adds the first `n` of [`client_source_v4`] to the client's eth0 and
    /// returns them: one client namespace as `n` clients (sources) to the
    /// load balancer. The LB host gets a permanent neighbour entry for
    /// each, and for the client's own address (the client's MAC): the data
    /// plane forwards only to resolved neighbours (`drop_no_route`
    /// otherwise), and the LB learns a client's from its ARP request for
    /// the LB, which the client sends once, from whichever address speaks
    /// first. They go with the namespaces.
    pub fn add_client_sources(&self, n: u8) -> Result<Vec<std::net::IpAddr>> {
        let mac = format_mac(client_mac());
        let neigh = |a: &str| {
            let args = ["neigh", "replace", a, "lladdr", &mac, "dev", HOST_IFNAME];
            ip_in(&self.ns_lb(), &[&args[..], &["nud", "permanent"]].concat())
        };
        neigh(&CLIENT_V4.to_string())?;
        let mut out = Vec::new();
        for i in 1..=n.min(CLIENT_SOURCES) {
            let a = client_source_v4(i).to_string();
            let with_len = format!("{a}/{NET_V4_PREFIX}");
            ip_in(
                &self.ns_client(),
                &["addr", "add", &with_len, "dev", HOST_IFNAME],
            )?;
            neigh(&a)?;
            out.push(client_source_v4(i).into());
        }
        Ok(out)
    }

    /// The flood namespace's addresses of its own /64 ([`flood_v6_sources`]).
    pub fn flood_v6_sources(&self) -> Vec<Ipv6Addr> {
        flood_v6_sources()
    }

    /// Backend `i`'s IPv4 address, 1-based.
    pub fn backend_v4(&self, i: usize) -> Ipv4Addr {
        assert!(i <= self.cfg.backends, "backend {i} out of range");
        backend_v4(i)
    }

    /// Backend `i`'s IPv6 address, 1-based.
    pub fn backend_v6(&self, i: usize) -> Ipv6Addr {
        assert!(i <= self.cfg.backends, "backend {i} out of range");
        backend_v6(i)
    }

    pub fn vip_v4(&self) -> Ipv4Addr {
        VIP_V4
    }

    pub fn vip2_v4(&self) -> Ipv4Addr {
        VIP2_V4
    }

    pub fn vip_v6(&self) -> Ipv6Addr {
        VIP_V6
    }

    /// Opens namespace `ns` for `setns(2)`; see also [`in_netns`].
    pub fn netns_fd(&self, ns: &str) -> Result<File> {
        netns_fd(ns)
    }
}

/// SIGTERM to each child's process group, SIGKILL to those still running
/// after [`KILL_GRACE`], then reap them all.
fn stop_children(mut children: Vec<Child>) {
    for c in &children {
        let _ = killpg(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
    }
    let deadline = Instant::now() + KILL_GRACE;
    while Instant::now() < deadline
        && children
            .iter_mut()
            .any(|c| matches!(c.try_wait(), Ok(None)))
    {
        thread::sleep(Duration::from_millis(10));
    }
    for c in &mut children {
        if matches!(c.try_wait(), Ok(None)) {
            let _ = killpg(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
            let _ = c.kill();
        }
        let _ = c.wait();
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let children = std::mem::take(self.children.get_mut().unwrap_or_else(|e| e.into_inner()));
        stop_children(children);
        if let Err(e) = Lab::down(&self.cfg.prefix) {
            eprintln!(
                "xlb-lab: removing lab {:?} failed: {e}; run `ip netns list` and delete its namespaces by hand",
                self.cfg.prefix
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_namespace_names() {
        let cases = [
            ("bridge", "xlb", "xlb-br", true),
            ("client", "xlb", "xlb-cl", true),
            ("flood", "xlb", "xlb-fl", true),
            ("lb", "xlb", "xlb-lb", true),
            ("backend", "xlb", "xlb-b2", true),
            ("backend two digits", "xlb", "xlb-b12", true),
            ("other prefix sharing a start", "xlb", "xlbt1-b1", false),
            ("longer prefix", "xlb", "xlb-b1-br", false),
            ("bare b", "xlb", "xlb-b", false),
            ("unknown role", "xlb", "xlb-foo", false),
            ("no dash", "xlb", "xlbbr", false),
            ("prefix with dash", "xlb-x", "xlb-x-cl", true),
            ("router", "xlb", "xlb-rt", true),
            ("node b", "xlb", "xlb-lb2", true),
            ("no node c", "xlb", "xlb-lb3", false),
        ];
        for (name, prefix, ns, want) in cases {
            assert_eq!(is_lab_namespace(prefix, ns), want, "{name}");
        }
    }

    #[test]
    fn config_validation() {
        let cases = [
            ("default", LabConfig::default(), true),
            ("empty prefix", LabConfig::with_prefix(""), false),
            ("slash", LabConfig::with_prefix("a/b"), false),
            ("space", LabConfig::with_prefix("a b"), false),
            ("too long", LabConfig::with_prefix("x".repeat(33)), false),
            (
                "zero backends",
                LabConfig {
                    backends: 0,
                    ..LabConfig::default()
                },
                false,
            ),
            (
                "max backends",
                LabConfig {
                    backends: MAX_BACKENDS,
                    ..LabConfig::default()
                },
                true,
            ),
            (
                "too many",
                LabConfig {
                    backends: MAX_BACKENDS + 1,
                    ..LabConfig::default()
                },
                false,
            ),
            (
                "two nodes",
                LabConfig {
                    nodes: 2,
                    ..LabConfig::default()
                },
                true,
            ),
            (
                "no node",
                LabConfig {
                    nodes: 0,
                    ..LabConfig::default()
                },
                false,
            ),
            (
                "three nodes",
                LabConfig {
                    nodes: 3,
                    ..LabConfig::default()
                },
                false,
            ),
        ];
        for (name, cfg, ok) in cases {
            assert_eq!(cfg.validate().is_ok(), ok, "{name}");
        }
    }
}
