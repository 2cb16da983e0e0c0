//! `xlb peers` between two daemons, each in a namespace of its own, whose
//! metrics listeners reach each other over a veth pair: a node with
//! another `hash_seed` is reported (exit status 2), the same configuration
//! agrees (0), and a peer that does not answer is reported without failing
//! the rest (3), and each VIP's announce state is the one the peer
//! reports. Judged by what `xlb peers` prints and its exit status, and by
//! the fingerprints each daemon's own status shows.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]
#![allow(
    clippy::print_stdout,
    reason = "what the test saw is printed for the log"
)]

use std::{
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;
use xlb_tests::netns::NetNs;

/// Two different hash keys.
const KEY_A: &str = "00112233445566778899aabbccddeeff";
const KEY_B: &str = "ffeeddccbbaa99887766554433221100";

/// The status link between the nodes: node i has `10.201.0.<i+1>`; .3
/// is on the link but nobody has it.
const LINK: [&str; 2] = ["10.201.0.1", "10.201.0.2"];
const NOBODY: &str = "10.201.0.3:9813";

/// One node: a namespace with the XDP interface `xd0` and one end of the
/// status link, its files and its daemon.
struct Node {
    ns: NetNs,
    name: String,
    dir: PathBuf,
    instance: String,
    socket: PathBuf,
    config: PathBuf,
    daemon: Option<Child>,
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new(xlb_tests::lab::xlb_binary())
            .args(["detach", "--instance", &self.instance])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Node {
    fn new(i: usize) -> anyhow::Result<Self> {
        let ns = NetNs::new(&format!("peer{i}"))?;
        ns.ip(&["link", "add", "xd0", "type", "veth", "peer", "name", "xd1"])?;
        ns.ip(&["link", "set", "xd0", "up"])?;
        ns.ip(&["link", "set", "xd1", "up"])?;
        ns.ip(&["addr", "add", "10.0.0.1/24", "dev", "xd0"])?;
        let tag = format!("{}-{i}", std::process::id());
        let dir = std::env::temp_dir().join(format!("xlb-peers-test-{tag}"));
        std::fs::create_dir_all(&dir)?;
        Ok(Node {
            ns,
            name: format!("node-{}", ["a", "b"][i]),
            socket: dir.join("xlb.sock"),
            config: dir.join("xlb.toml"),
            instance: format!("p{tag}"),
            dir,
            daemon: None,
        })
    }

    /// Writes the configuration: VIPs "api" and "web", hash key `key`,
    /// metrics on its end of the link, `peers` in `[cluster]`.
    fn write_config(&self, i: usize, key: &str, peers: &[String]) -> anyhow::Result<()> {
        let peers: Vec<String> = peers.iter().map(|p| format!("{p:?}")).collect();
        let mut s = format!(
            r#"
[daemon]
interface = "xd0"
xdp_mode = "generic"
instance = "{instance}"
control_socket = "{socket}"
metrics_address = "{addr}:9813"
conntrack_size = 4096
max_table_size = 251
hash_seed = "{key}"

# No backend answers: states do not change the fingerprint.
[health_check]
kind = "tcp"
via = "direct"
interval = "1s"

[cluster]
name = "{name}"
peers = [{peers}]
"#,
            instance = self.instance,
            socket = self.socket.display(),
            addr = LINK[i],
            name = self.name,
            peers = peers.join(", "),
        );
        for (vip, addr) in [("api", "10.100.0.1"), ("web", "10.100.0.2")] {
            s += &format!(
                "[[vip]]\nname = \"{vip}\"\naddress = \"{addr}\"\nport = 80\ntable_size = 251\n"
            );
            for b in ["10.0.0.11", "10.0.0.12"] {
                s += &format!("[[vip.backend]]\naddress = \"{b}\"\n");
            }
        }
        std::fs::write(&self.config, s)?;
        // hash_seed is secret.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&self.config, std::fs::Permissions::from_mode(0o600))?;
        Ok(())
    }

    fn in_ns(&self) -> Command {
        // Only the network namespace: pins stay in the host's bpffs, which
        // `xlb detach` in Drop cleans.
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/var/run/netns/{}", self.ns.name()));
        c
    }

    fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::File::create(self.dir.join("daemon.log"))?;
        let child = self
            .in_ns()
            .arg(xlb_tests::lab::xlb_binary())
            .args(["run", "--config"])
            .arg(&self.config)
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()?;
        self.daemon = Some(child);
        wait_for(Duration::from_secs(10), "control socket", || {
            Ok(self.socket.exists())
        })
    }

    /// `xlb --socket <ours> ARGS` inside the namespace, whatever its exit
    /// status.
    fn xlb(&self, args: &[&str]) -> anyhow::Result<Output> {
        Ok(self
            .in_ns()
            .arg(xlb_tests::lab::xlb_binary())
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()?)
    }

    fn status(&self) -> anyhow::Result<Value> {
        let out = self.xlb(&["status", "--json"])?;
        ensure!(
            out.status.success(),
            "status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    fn reload(&self) -> anyhow::Result<()> {
        let out = self.xlb(&["reload"])?;
        ensure!(
            out.status.success(),
            "reload: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// `xlb peers`: its text and exit status, once every listed peer
    /// answers or `settle` passes (a daemon serves metrics a moment after
    /// its control socket appears).
    fn peers(&self, settle: Duration) -> anyhow::Result<(String, i32)> {
        let start = Instant::now();
        loop {
            let out = self.xlb(&["peers"])?;
            let text = String::from_utf8(out.stdout)?;
            let code = out.status.code().context("killed")?;
            ensure!(
                code != 1,
                "xlb peers failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            if code != 3 || start.elapsed() >= settle {
                println!("{} $ xlb peers (exit {code})\n{text}", self.name);
                return Ok((text, code));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Polls `f` every 50 ms until it says yes; fails after `limit`.
fn wait_for(
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

/// Two nodes whose status link is up: a veth pair between their
/// namespaces.
fn two_nodes() -> anyhow::Result<[Node; 2]> {
    let nodes = [Node::new(0)?, Node::new(1)?];
    let (a, b) = (&nodes[0], &nodes[1]);
    a.ns.ip(&["link", "add", "pl0", "type", "veth", "peer", "name", "pl1"])?;
    a.ns.ip(&["link", "set", "pl1", "netns", b.ns.name()])?;
    for (n, dev, addr) in [(a, "pl0", LINK[0]), (b, "pl1", LINK[1])] {
        n.ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", dev])?;
        n.ns.ip(&["link", "set", dev, "up"])?;
    }
    Ok(nodes)
}

fn peer_of(i: usize) -> String {
    format!("{}:9813", LINK[1 - i])
}

#[test]
fn peers_reports_a_node_with_another_hash_key() {
    xlb_tests::require_root();
    let _serial = xlb_tests::lab::serial();
    let mut nodes = two_nodes().unwrap();
    nodes[0].write_config(0, KEY_A, &[peer_of(0)]).unwrap();
    nodes[1].write_config(1, KEY_B, &[peer_of(1)]).unwrap();
    for n in &mut nodes {
        n.start().unwrap();
    }
    let [a, b] = &nodes;
    let settle = Duration::from_secs(10);

    // Another hash_seed on b: a says so, and exits 2.
    let (text, code) = a.peers(settle).unwrap();
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(
            "warning: node node-b: hash key differs: every flow ECMP moves between this node \
             and node-b lands on another backend"
        ),
        "{text}"
    );
    assert!(
        !text.contains("vip \"api\" differs"),
        "the VIPs are the same: {text}"
    );
    let (sa, sb) = (a.status().unwrap(), b.status().unwrap());
    assert_ne!(sa["fingerprint"]["config"], sb["fingerprint"]["config"]);
    assert_ne!(sa["fingerprint"]["hash_key"], sb["fingerprint"]["hash_key"]);
    assert_eq!(sa["vips"][0]["fingerprint"], sb["vips"][0]["fingerprint"]);
    let shown = format!("{sa}{sb}{text}");
    assert!(
        !shown.contains(KEY_A) && !shown.contains(KEY_B),
        "a key is shown: {shown}"
    );

    // The same configuration on b (reloaded): both agree, exit 0, once
    // b's /status is sampled again (every tick, 1 s).
    b.write_config(1, KEY_A, &[peer_of(1)]).unwrap();
    b.reload().unwrap();
    assert_eq!(
        a.status().unwrap()["fingerprint"],
        b.status().unwrap()["fingerprint"]
    );
    std::thread::sleep(Duration::from_millis(1500));
    for n in [a, b] {
        let (text, code) = n.peers(settle).unwrap();
        assert_eq!(code, 0, "{}: {text}", n.name);
        assert!(text.contains("all 2 nodes agree"), "{}: {text}", n.name);
        assert!(!text.contains("warning"), "{}: {text}", n.name);
    }

    // A peer nobody answers for: reported, the others still compared,
    // exit 3.
    a.write_config(0, KEY_A, &[peer_of(0), NOBODY.to_owned()])
        .unwrap();
    a.reload().unwrap();
    let started = Instant::now();
    let (text, code) = a.peers(Duration::ZERO).unwrap();
    assert_eq!(code, 3, "{text}");
    assert!(
        text.contains(&format!(
            "warning: peer {NOBODY} could not be read: no answer within 1s"
        )),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("node-b ") && l.contains(" yes ")),
        "{text}"
    );
    // Peers are asked at once, each within its timeout.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let out = a.xlb(&["peers", "--json"]).unwrap();
    assert_eq!(out.status.code(), Some(3));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["nodes"][1]["node"], "node-b");
    assert_eq!(json["nodes"][1]["agrees"], true);
    assert_eq!(json["nodes"][2]["reachable"], false);
    assert_eq!(json["exit_status"], 3);
    // Each VIP's announce state, as the peer itself reports it.
    let state = b.status().unwrap()["vips"][0]["announce"]["state"].clone();
    let state = state.as_str().expect("b reports an announce state");
    assert_eq!(json["nodes"][1]["vips"][0]["announce"]["state"], state);
    let row = text.lines().find(|l| l.starts_with("node-b ")).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[cells.len() - 2..], [state, state], "{row}");
}
