//! The daemon as an operator meets it, inside a namespace of its own: start,
//! attach, probe, change states, check the maps; kill -9 and start again
//! (same link, conntrack and states kept); reload with one VIP changed (the
//! other VIP's table bytes identical); a pinned layout of another version
//! refused; detach removes everything.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use lb_common::{BACKEND_DOWN, BACKEND_UP, CtEntry, FlowKey};
use lb_user::dataplane::{Dataplane, LoadOptions};
use serde_json::Value;
use xlb_lab::backend::{BackendOptions, Fault};
use xlb_tests::netns::NetNs;

/// The `xlb` binary next to this test's target directory.
fn xlb_bin() -> PathBuf {
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

struct Env {
    ns: NetNs,
    dir: PathBuf,
    instance: String,
    socket: PathBuf,
    config: PathBuf,
    daemon: Option<Child>,
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
    }
}

const BACKENDS: [&str; 3] = ["10.0.0.11", "10.0.0.12", "10.0.0.13"];

fn config_text(e: &Env, web_weight: u32, web_table: u32) -> String {
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
        for b in BACKENDS {
            s += &format!("[[vip.backend]]\naddress = \"{b}\"\nweight = {weight}\n");
        }
    }
    s
}

impl Env {
    fn new() -> anyhow::Result<Self> {
        xlb_tests::require_root();
        let ns = NetNs::new("dmn")?;
        ns.ip(&["link", "add", "xd0", "type", "veth", "peer", "name", "xd1"])?;
        ns.ip(&["link", "set", "xd0", "up"])?;
        ns.ip(&["link", "set", "xd1", "up"])?;
        ns.ip(&["addr", "add", "10.0.0.1/24", "dev", "xd0"])?;
        for b in BACKENDS {
            ns.ip(&["addr", "add", &format!("{b}/32"), "dev", "lo"])?;
        }
        let instance = format!("t{}", std::process::id());
        let dir = std::env::temp_dir().join(format!("xlb-daemon-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("xlb.sock");
        let config = dir.join("xlb.toml");
        let e = Env {
            ns,
            dir,
            instance,
            socket,
            config,
            daemon: None,
        };
        std::fs::write(&e.config, config_text(&e, 1, 251))?;
        // Backends: real HTTP servers with fault switches, in the namespace.
        let ns_name = e.ns.name().to_string();
        std::thread::spawn(move || {
            xlb_lab::topology::in_netns(&ns_name, || {
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
                    std::future::pending::<()>().await;
                });
            })
        });
        Ok(e)
    }

    fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::File::create(self.dir.join(format!(
            "daemon-{}.log",
            Instant::now().elapsed().as_nanos()
        )))?;
        let child = self
            .in_ns()
            .arg(xlb_bin())
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

    /// A command entering only the network namespace. `ip netns exec` also
    /// gives the command a private mount namespace with a fresh /sys, where
    /// pins would land in a bpffs nobody else sees and vanish with it.
    fn in_ns(&self) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/var/run/netns/{}", self.ns.name()));
        c
    }

    fn kill9(&mut self) -> anyhow::Result<()> {
        let mut c = self.daemon.take().context("no daemon")?;
        c.kill()?; // SIGKILL
        c.wait()?;
        Ok(())
    }

    fn xlb(&self, args: &[&str]) -> anyhow::Result<String> {
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

    fn status(&self) -> anyhow::Result<Value> {
        Ok(serde_json::from_str(&self.xlb(&["status", "--json"])?)?)
    }

    /// State of backend `addr` of VIP `vip` in `xlb status --json`.
    fn backend_state(&self, vip: &str, addr: &str) -> anyhow::Result<String> {
        let s = self.status()?;
        let v = s["vips"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == vip)
            .context("vip")?;
        let b = v["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["address"] == addr)
            .context("backend")?;
        Ok(b["state"].as_str().unwrap().to_string())
    }

    fn set_fault(&self, backend: &str, fault: Fault) -> anyhow::Result<()> {
        let admin: SocketAddr = format!("{backend}:9000").parse()?;
        xlb_lab::topology::in_netns(self.ns.name(), || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(xlb_lab::backend::remote_set_fault(
                    admin,
                    fault,
                    Duration::from_secs(2),
                ))
        })??;
        Ok(())
    }

    /// `GET /metrics` from inside the namespace.
    fn metrics(&self) -> anyhow::Result<String> {
        let resp = xlb_lab::topology::in_netns(self.ns.name(), || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(xlb_lab::http::request(
                    "127.0.0.1:9813".parse().unwrap(),
                    "GET",
                    "/metrics",
                    Duration::from_secs(2),
                ))
        })??;
        ensure!(
            resp.head.status == 200,
            "metrics answered {}",
            resp.head.status
        );
        Ok(String::from_utf8(resp.body)?)
    }

    fn pins(&self) -> PathBuf {
        Path::new("/sys/fs/bpf/xlb").join(&self.instance)
    }

    /// The pinned maps, opened as the daemon sees them.
    fn maps(&self) -> anyhow::Result<Dataplane> {
        Ok(Dataplane::load(&LoadOptions {
            ct_size: 4096,
            ring_stride: 251,
            pin_dir: Some(self.pins()),
        })?)
    }

    fn link_id(&self) -> anyhow::Result<u32> {
        let pinned = aya::programs::links::PinnedLink::from_pin(self.pins().join("XLB_LINK"))?;
        let fd: aya::programs::links::FdLink = pinned.into();
        Ok(fd.info()?.id())
    }
}

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

fn vip_key(addr: &str) -> lb_common::VipKey {
    lb_common::VipKey::new(addr.parse().unwrap(), 80, lb_common::PROTO_TCP)
}

/// Both ring halves of a VIP, and which is live.
fn table(dp: &Dataplane, vip: &str) -> anyhow::Result<(u32, Vec<u32>, Vec<u32>)> {
    let info = dp.vip(&vip_key(vip))?.context("vip in maps")?;
    Ok((
        info.active,
        dp.ring_half(info.vip_id, 0, info.table_size)?,
        dp.ring_half(info.vip_id, 1, info.table_size)?,
    ))
}

#[test]
fn daemon_lifecycle() {
    let mut e = Env::new().unwrap();
    e.start().unwrap();
    // Start, attach, probe: every backend up; XDP on xd0.
    wait_for(Duration::from_secs(10), "all backends up", || {
        Ok(BACKENDS
            .iter()
            .all(|b| e.backend_state("api", &format!("{b}:80")).ok().as_deref() == Some("up")))
    })
    .unwrap();
    let link = e.ns.ip(&["link", "show", "xd0"]).unwrap();
    assert!(link.contains("xdp"), "XDP attached to xd0: {link}");
    let link_id = e.link_id().unwrap();

    // Hang backend 2's application: down within fall × interval + timeout
    // (2 × 200 ms + 150 ms) plus 1 s of margin for scheduling on 2 CPUs.
    e.set_fault(BACKENDS[1], Fault::Hang).unwrap();
    let t = Instant::now();
    wait_for(Duration::from_millis(1550), "backend 2 down", || {
        Ok(e.backend_state("api", "10.0.0.12:80")? == "down"
            && e.backend_state("web", "10.0.0.12:80")? == "down")
    })
    .unwrap();
    println!("hung backend detected after {:?}", t.elapsed());
    let s = e.status().unwrap();
    let b2 = &s["vips"][0]["backends"][1];
    let reason = b2["last_transition_reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("connected, no HTTP response within"),
        "reason: {reason}"
    );

    // The event log has the transition, with its reason and the rebuild.
    let events: Value = serde_json::from_str(&e.xlb(&["events", "--json"]).unwrap()).unwrap();
    let down = events
        .as_array()
        .unwrap()
        .iter()
        .find(|ev| ev["kind"] == "transition" && ev["vip"] == "api" && ev["to"] == "down")
        .expect("a transition event for api's backend 2");
    assert_eq!(down["backend"], "10.0.0.12:80");
    assert!(
        down["reason"]
            .as_str()
            .unwrap()
            .starts_with("connected, no HTTP response"),
        "{down}"
    );
    // It left the table at its first exit (a hung backend among answering
    // peers is a slow outlier first, `down` when its probes reach
    // hang_timeout): that event carries the timed table rebuild.
    let exit = events
        .as_array()
        .unwrap()
        .iter()
        .find(|ev| {
            ev["kind"] == "transition"
                && ev["vip"] == "api"
                && ev["backend"] == "10.0.0.12:80"
                && ev["from"] == "up"
        })
        .expect("an exit event for api's backend 2");
    assert!(
        exit["table_build_us"].is_u64(),
        "the table rebuild is timed: {exit}"
    );

    // So do the metrics (refreshed every second).
    wait_for(Duration::from_secs(3), "metrics show b2 out", || {
        let m = e.metrics()?;
        Ok(
            m.contains(r#"xlb_backend_up{vip="api",backend="10.0.0.12:80"} 0"#)
                && m.contains(r#"xlb_backend_up{vip="api",backend="10.0.0.11:80"} 1"#),
        )
    })
    .unwrap();
    let m = e.metrics().unwrap();
    assert!(
        m.contains("xlb_backend_probe_latency_seconds_bucket"),
        "probe latency histogram"
    );
    assert!(
        m.contains(r#"xlb_packets_total{reason="ct_hit"}"#),
        "data-plane counters"
    );

    // The maps say the same: state DOWN, and the id gone from the live table.
    let mut dp = e.maps().unwrap();
    let (active, h0, h1) = table(&dp, "10.100.0.1").unwrap();
    let live = if active == 0 { &h0 } else { &h1 };
    let ids: std::collections::BTreeSet<u32> = live.iter().copied().collect();
    assert_eq!(ids.len(), 2, "two backends in the live table: {ids:?}");
    let states: Vec<u8> = (1..=6).map(|id| dp.backend(id).unwrap().state).collect();
    assert_eq!(
        states.iter().filter(|&&s| s == BACKEND_DOWN).count(),
        2,
        "b2 down in both VIPs: {states:?}"
    );
    assert_eq!(
        states.iter().filter(|&&s| s == BACKEND_UP).count(),
        4,
        "{states:?}"
    );

    // A conntrack entry, as an established flow would have.
    let flow = FlowKey::new(
        "192.0.2.1:40000".parse().unwrap(),
        "10.100.0.1:80".parse().unwrap(),
        lb_common::PROTO_TCP,
    );
    let entry = CtEntry {
        backend_id: *ids.iter().next().unwrap(),
        generation: 1,
        vip_id: 0,
        flags: 0,
        last_seen_ns: 1,
    };
    dp.ct_insert(&flow, &entry).unwrap();
    let before = table(&dp, "10.100.0.1").unwrap();

    // kill -9 and start again: same link, conntrack kept, states kept (b2
    // still down at once, before any probe), table untouched.
    e.kill9().unwrap();
    assert!(
        e.ns.ip(&["link", "show", "xd0"]).unwrap().contains("xdp"),
        "XDP stays attached while the daemon is dead"
    );
    std::fs::remove_file(&e.socket).ok();
    e.start().unwrap();
    assert_eq!(
        e.link_id().unwrap(),
        link_id,
        "the pinned link is adopted, not re-created"
    );
    let s = e.status().unwrap();
    assert_eq!(s["adopted"], true);
    assert_eq!(
        e.backend_state("api", "10.0.0.12:80").unwrap(),
        "down",
        "adopted state stands"
    );
    assert_eq!(
        dp.ct_get(&flow).unwrap(),
        Some(entry),
        "conntrack entry kept"
    );
    assert_eq!(
        table(&dp, "10.100.0.1").unwrap(),
        before,
        "table not rewritten on restart"
    );

    // `xlb explain` agrees with the maps: the established flow goes where
    // its conntrack entry says; a new one to its table slot's backend.
    let be = dp.backend(entry.backend_id).unwrap();
    let be_addr = format!(
        "{}.{}.{}.{}:80",
        be.addr[0], be.addr[1], be.addr[2], be.addr[3]
    );
    let ex: Value = serde_json::from_str(
        &e.xlb(&[
            "explain",
            "tcp",
            "192.0.2.1:40000",
            "10.100.0.1:80",
            "--json",
        ])
        .unwrap(),
    )
    .unwrap();
    assert_eq!(ex["via"], "conntrack", "{ex}");
    assert_eq!(ex["backend"], be_addr.as_str(), "{ex}");
    let ex: Value = serde_json::from_str(
        &e.xlb(&[
            "explain",
            "tcp",
            "192.0.2.9:40001",
            "10.100.0.1:80",
            "--json",
        ])
        .unwrap(),
    )
    .unwrap();
    assert_eq!(ex["via"], "table", "{ex}");
    let g = dp.globals().unwrap();
    let probe = FlowKey::new(
        "192.0.2.9:40001".parse().unwrap(),
        "10.100.0.1:80".parse().unwrap(),
        lb_common::PROTO_TCP,
    );
    let (active, h0, h1) = table(&dp, "10.100.0.1").unwrap();
    let id = if active == 0 { &h0 } else { &h1 }[probe.slot(&g.hash_key, 251) as usize];
    let be = dp.backend(id).unwrap();
    assert_eq!(
        ex["backend"],
        format!(
            "{}.{}.{}.{}:80",
            be.addr[0], be.addr[1], be.addr[2], be.addr[3]
        )
        .as_str(),
        "{ex}"
    );

    // Recover: back up after rise probes.
    e.set_fault(BACKENDS[1], Fault::None).unwrap();
    // In both VIPs (each has its own probes), so no table changes under the
    // reload below.
    wait_for(Duration::from_secs(3), "backend 2 up again", || {
        Ok(e.backend_state("api", "10.0.0.12:80")? == "up"
            && e.backend_state("web", "10.0.0.12:80")? == "up")
    })
    .unwrap();

    // Reload with only "web" changed: "api"'s table bytes and live half stay.
    let api_before = table(&dp, "10.100.0.1").unwrap();
    let web_before = table(&dp, "10.100.0.2").unwrap();
    std::fs::write(&e.config, config_text(&e, 2, 251)).unwrap();
    let out = e.xlb(&["reload"]).unwrap();
    assert!(out.contains("1 changed"), "{out}");
    assert_eq!(
        table(&dp, "10.100.0.1").unwrap(),
        api_before,
        "untouched VIP keeps its table bytes"
    );
    let web_after = table(&dp, "10.100.0.2").unwrap();
    assert_eq!(
        web_after, web_before,
        "weights all doubled: same shares, same table"
    );
    // Reload resizing web's table (251 → 241): the new table is built in the
    // spare half and goes live with one write; api is still untouched.
    let (web_active, _, _) = table(&dp, "10.100.0.2").unwrap();
    std::fs::write(&e.config, config_text(&e, 2, 241)).unwrap();
    let out = e.xlb(&["reload"]).unwrap();
    assert!(out.contains("1 changed"), "{out}");
    let info = dp.vip(&vip_key("10.100.0.2")).unwrap().unwrap();
    assert_eq!(info.table_size, 241);
    assert_ne!(
        info.active, web_active,
        "the resized table went into the spare half"
    );
    let live = dp.ring_half(info.vip_id, info.active, 251).unwrap();
    let web_ids: std::collections::BTreeSet<u32> = live.iter().copied().collect();
    assert_eq!(
        web_ids.len(),
        3,
        "every slot a reader may index holds one of web's three backends: {web_ids:?}"
    );
    let old = dp.ring_half(info.vip_id, 1 - info.active, 251).unwrap();
    assert!(
        old.iter().all(|id| web_ids.contains(id)),
        "the old half, padded, too"
    );
    assert_eq!(
        table(&dp, "10.100.0.1").unwrap(),
        api_before,
        "api untouched"
    );

    // An invalid configuration is refused whole; the daemon keeps running.
    std::fs::write(&e.config, "[daemon]\ninterface = 7\n").unwrap();
    let out = Command::new(xlb_bin())
        .arg("--socket")
        .arg(&e.socket)
        .arg("reload")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("xlb.toml"), "names the file: {err}");
    assert_eq!(e.backend_state("api", "10.0.0.11:80").unwrap(), "up");

    // Drain and enable.
    e.xlb(&["drain", "api", "10.0.0.13:80"]).unwrap();
    assert_eq!(e.backend_state("api", "10.0.0.13:80").unwrap(), "draining");
    e.xlb(&["enable", "api", "10.0.0.13:80"]).unwrap();
    assert_eq!(e.backend_state("api", "10.0.0.13:80").unwrap(), "up");

    drain_with_deadline(&mut e, &mut dp);

    // A pinned layout of another version is refused with a clear message.
    e.kill9().unwrap();
    std::fs::write(&e.config, config_text(&e, 1, 251)).unwrap();
    let mut g = dp.globals().unwrap();
    g.layout_version = 999;
    dp.set_globals(&g).unwrap();
    drop(dp);
    let out = e
        .in_ns()
        .arg(xlb_bin())
        .args(["run", "--config"])
        .arg(&e.config)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a foreign layout must be refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("layout version 999"), "{err}");

    // Detach removes everything.
    let out = Command::new(xlb_bin())
        .args(["detach", "--instance", &e.instance])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!e.pins().exists(), "pins removed");
    assert!(
        !e.ns.ip(&["link", "show", "xd0"]).unwrap().contains("xdp"),
        "XDP detached"
    );
}

/// `bpf_ktime_get_coarse_ns()`, as the data plane stamps conntrack entries.
fn coarse_now_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write to.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) },
        0
    );
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The `xlb status --json` object of backend `addr` of VIP `vip`.
fn backend_json(e: &Env, vip: &str, addr: &str) -> anyhow::Result<Value> {
    let s = e.status()?;
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

/// Three established flows on api's third backend; `drain --deadline
/// --wait` counts them, returns when the deadline passes, and the backend
/// is then down in the data plane; that survives a restart; `enable` undoes it.
fn drain_with_deadline(e: &mut Env, dp: &mut Dataplane) {
    let addr = "10.0.0.13:80";
    let saved =
        lb_user::daemon::persist::Saved::load(&lb_user::daemon::persist::state_path(&e.instance))
            .unwrap()
            .unwrap();
    let id = saved
        .backends
        .iter()
        .find(|b| b.vip == "api" && b.addr.to_string() == addr)
        .unwrap()
        .id;
    let generation = dp.backend(id).unwrap().generation;
    let flows: Vec<FlowKey> = (0..3)
        .map(|i| {
            FlowKey::new(
                format!("192.0.2.77:{}", 41_000 + i).parse().unwrap(),
                "10.100.0.1:80".parse().unwrap(),
                lb_common::PROTO_TCP,
            )
        })
        .collect();
    for f in &flows {
        let entry = CtEntry {
            backend_id: id,
            generation,
            vip_id: 0,
            flags: 0,
            last_seen_ns: coarse_now_ns(),
        };
        dp.ct_insert(f, &entry).unwrap();
    }
    // The walk runs every 10 s when nothing drains.
    wait_for(Duration::from_secs(15), "3 flows counted", || {
        Ok(backend_json(e, "api", addr)?["flows"] == 3)
    })
    .unwrap();

    let t = Instant::now();
    let out = e
        .xlb(&["drain", "api", addr, "--deadline", "3s", "--wait"])
        .unwrap();
    let took = t.elapsed();
    assert!(out.contains("down in 3s"), "{out}");
    assert!(
        out.contains("10.0.0.13:80 of vip \"api\": 3 flows\n"),
        "{out}"
    );
    assert!(
        out.contains(
            "drain deadline passed with 3 flows left; the backend is down and its remaining \
             flows follow down_policy rehash"
        ),
        "{out}"
    );
    assert!(
        took >= Duration::from_millis(2500) && took < Duration::from_secs(8),
        "--wait returned after {took:?}"
    );
    let b = backend_json(e, "api", addr).unwrap();
    assert_eq!(b["state"], "down", "{b}");
    assert_eq!(b["admin_drained"], true, "{b}");
    assert!(b["drain_deadline_unix_ms"].is_u64(), "{b}");
    assert_eq!(dp.backend(id).unwrap().state, BACKEND_DOWN);
    let events = e.xlb(&["events", "--json"]).unwrap();
    let events: Value = serde_json::from_str(&events).unwrap();
    let drain: Vec<&Value> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|ev| ev["kind"] == "drain")
        .collect();
    assert_eq!(drain.len(), 1, "{events}");
    assert_eq!(
        drain[0]["reason"],
        "drain deadline passed with 3 flows left; remaining flows follow down_policy rehash"
    );
    assert!(
        e.metrics()
            .unwrap()
            .contains("xlb_backend_flows{vip=\"api\",backend=\"10.0.0.13:80\"} 3")
    );

    // A restart keeps it down, and does not report the deadline again.
    // (With the configuration the daemon runs: the last one written was
    // refused.)
    e.kill9().unwrap();
    std::fs::write(&e.config, config_text(e, 2, 241)).unwrap();
    std::fs::remove_file(&e.socket).ok();
    e.start().unwrap();
    let b = backend_json(e, "api", addr).unwrap();
    assert_eq!(b["state"], "down", "{b}");
    assert!(b["drain_deadline_unix_ms"].is_u64(), "{b}");
    assert_eq!(dp.backend(id).unwrap().state, BACKEND_DOWN);
    let events = e.xlb(&["events"]).unwrap();
    assert!(!events.contains(" drain "), "{events}");

    // Enable clears the deadline and brings it back.
    e.xlb(&["enable", "api", addr]).unwrap();
    let b = backend_json(e, "api", addr).unwrap();
    assert_eq!(b["state"], "up", "{b}");
    assert!(b["drain_deadline_unix_ms"].is_null(), "{b}");
    assert_eq!(dp.backend(id).unwrap().state, BACKEND_UP);
    for f in &flows {
        dp.ct_remove(f).unwrap();
    }
}
