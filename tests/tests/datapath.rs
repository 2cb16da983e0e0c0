//! Data-path probes in the namespaced lab: a backend whose decapsulator is
//! stopped, or whose VIP is missing from `lo`, answers a direct probe of its
//! own address but not a probe through the data path (to the VIP, marked for
//! that backend, encapsulated or MAC-rewritten by `xlb_hc` like client
//! packets); a healthy backend answers both.
//!
//! The lab (`xlb_lab::scenario::LabRun`) runs the real daemon, which attaches
//! `xlb_hc` and writes `XLB_HC_REALS`; the probes run in the LB namespace
//! through `lb_user::health::datapath`. LabRun's Drop stops every process,
//! detaches and removes the namespaces however the test ends.
//!
//! Needs root and fresh binaries: `cargo build -p lb-user -p xlb-lab`, then
//! `cargo test -p xlb-tests --test datapath -- --nocapture`.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]
#![allow(
    clippy::print_stdout,
    reason = "each case's verdict is printed for the log"
)]

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, ensure};
use aya::maps::{Map, MapData, PerCpuArray};
use lb_common::{HcReal, HcStat};
use lb_user::{config::Mode as CfgMode, health::datapath::DatapathTarget};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    time::timeout_at,
};
use xlb_lab::{
    scenario::{self, LabRun, Mode, RunOptions, Vip, XlbConfig},
    topology::{self, HOST_IFNAME, list_namespaces},
};

/// A free address of the lab's segment (`xlb_tests::nat_lab::POOL_V6`'s).
const DEPRECATED_V6: &str = "fd00:99::4";

/// Per probe; the lab answers in well under a millisecond.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How a backend answered: (direct probe ok, data-path probe ok).
type Answers = (bool, bool);

/// One HTTP/1.1 `GET /health` on `stream`: whether a 200 came back.
async fn get_health(
    mut stream: TcpStream,
    host: SocketAddr,
    deadline: tokio::time::Instant,
) -> bool {
    let req = format!("GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let exchange = async {
        stream.write_all(req.as_bytes()).await?;
        let mut buf = [0u8; 64];
        let mut got = Vec::new();
        while got.len() < 12 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(got.starts_with(b"HTTP/1.1 200"))
    };
    matches!(timeout_at(deadline, exchange).await, Ok(Ok(true)))
}

async fn probe_direct(backend: SocketAddr) -> bool {
    let deadline = tokio::time::Instant::now() + PROBE_TIMEOUT;
    match timeout_at(deadline, TcpStream::connect(backend)).await {
        Ok(Ok(s)) => get_health(s, backend, deadline).await,
        _ => false,
    }
}

async fn probe_via_vip(target: &DatapathTarget) -> bool {
    let deadline = tokio::time::Instant::now() + PROBE_TIMEOUT;
    match target.connect(deadline).await {
        Ok(s) => get_health(s, target.vip, deadline).await,
        Err(_) => false,
    }
}

/// Opens a map the daemon pinned for `instance`.
fn pinned(instance: &str, name: &str) -> anyhow::Result<MapData> {
    let path = Path::new("/sys/fs/bpf/xlb").join(instance).join(name);
    MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))
}

/// The probe mark of every backend address, per VIP mode, from the map the
/// daemon wrote (which also proves it wrote one entry per backend).
fn marks(instance: &str) -> anyhow::Result<HashMap<(IpAddr, u8), u32>> {
    let map: aya::maps::HashMap<MapData, u32, HcReal> =
        aya::maps::HashMap::try_from(Map::HashMap(pinned(instance, lb_common::MAP_HC_REALS)?))?;
    let mut out = HashMap::new();
    for entry in map.iter() {
        let (mark, real) = entry?;
        let addr = if real.family == lb_common::FAMILY_V4 {
            IpAddr::from(<[u8; 4]>::try_from(&real.addr[..4]).unwrap())
        } else {
            IpAddr::from(real.addr)
        };
        out.insert((addr, real.mode), mark);
    }
    Ok(out)
}

fn hc_stat(instance: &str, stat: HcStat) -> anyhow::Result<u64> {
    let map: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(Map::PerCpuArray(pinned(instance, lb_common::MAP_HC_STATS)?))?;
    Ok(map.get(&(stat as u32), 0)?.iter().sum())
}

fn cfg_mode(m: Mode) -> (CfgMode, u8) {
    match m {
        Mode::DsrIpip => (CfgMode::DsrIpip, lb_common::MODE_DSR_IPIP),
        Mode::DsrL2 => (CfgMode::DsrL2, lb_common::MODE_DSR_L2),
    }
}

/// Probes every backend of every VIP both ways from the LB namespace.
fn probe_all(run: &LabRun, vips: &[Vip]) -> anyhow::Result<HashMap<(String, usize), Answers>> {
    let marks = marks(run.instance())?;
    let mut targets = Vec::new();
    for v in vips {
        let (mode, raw) = cfg_mode(v.mode);
        for &i in &v.backends {
            let backend = v.backend_addr(i);
            let mark = *marks
                .get(&(backend.ip(), raw))
                .with_context(|| format!("no XLB_HC_REALS entry for {backend} ({})", v.name))?;
            let mut t = DatapathTarget::new(v.target(), 0, HOST_IFNAME, mode);
            t.mark = mark;
            targets.push(((v.name.clone(), i), backend, t));
        }
    }
    let ns = run.lab().ns_lb();
    let answers = topology::in_netns(&ns, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        rt.block_on(async {
            let mut out = HashMap::new();
            for (key, backend, t) in targets {
                let direct = probe_direct(backend).await;
                let via = probe_via_vip(&t).await;
                out.insert(key, (direct, via));
            }
            out
        })
    })?;
    Ok(answers)
}

fn check(
    what: &str,
    got: &HashMap<(String, usize), Answers>,
    want: &[(&str, usize, Answers)],
) -> anyhow::Result<()> {
    let mut errs = Vec::new();
    for &(vip, i, (direct, via)) in want {
        let g = got.get(&(vip.to_string(), i)).copied();
        let line = format!(
            "{what}: {vip} b{i}: direct {}, via VIP {}",
            ok(g.map(|a| a.0)),
            ok(g.map(|a| a.1))
        );
        if g == Some((direct, via)) {
            println!("ok   {line}");
        } else {
            println!("FAIL {line} (want direct {direct}, via VIP {via})");
            errs.push(line);
        }
    }
    ensure!(
        errs.is_empty(),
        "{} probe outcomes differ: {errs:#?}",
        errs.len()
    );
    Ok(())
}

fn ok(b: Option<bool>) -> &'static str {
    match b {
        Some(true) => "answers",
        Some(false) => "NO ANSWER",
        None => "not probed",
    }
}

#[test]
fn datapath_probe_catches_what_a_direct_probe_misses() {
    xlb_tests::require_root();
    let xlb = scenario::find_xlb().unwrap_or_else(|e| panic!("{e}"));
    let prefix = format!("dp{}", std::process::id() % 1000);
    let vips = vec![
        Vip::new("api", topology::VIP_V4.into(), 80, Mode::DsrIpip, 3),
        Vip::new("api6", topology::VIP_V6.into(), 80, Mode::DsrIpip, 3),
        Vip::new("l2", topology::VIP2_V4.into(), 80, Mode::DsrL2, 3),
    ];
    let cfg = XlbConfig {
        vips: vips.clone(),
        ..XlbConfig::for_prefix(&prefix)
    };
    let t0 = Instant::now();
    let mut run = LabRun::up_with(RunOptions {
        start_daemon: false,
        ..RunOptions::new(&prefix, &xlb, &cfg.render())
    })
    .unwrap_or_else(|e| panic!("lab up: {e}"));
    // A deprecated IPv6 address on the LB's interface when the daemon
    // starts, as a NAT pool's may be: listed before the LB's own (the
    // kernel lists the newest first), it is still no source for tunnels
    // (the backends accept the LB's own address; taken as the encap
    // source, every IPv6 data-path probe timed out).
    xlb_tests::netns::run(&[
        "ip",
        "-n",
        &run.lab().ns_lb(),
        "-6",
        "addr",
        "add",
        &format!("{DEPRECATED_V6}/128"),
        "dev",
        HOST_IFNAME,
        "nodad",
        "preferred_lft",
        "0",
    ])
    .unwrap();
    run.start_daemon().unwrap();
    run.wait_all_up(Duration::from_secs(30)).unwrap();
    println!("[{prefix}] lab up in {:.1} s", t0.elapsed().as_secs_f64());
    let instance = run.instance().to_string();

    let healthy: Vec<(&str, usize, Answers)> = ["api", "api6", "l2"]
        .iter()
        .flat_map(|v| (1..=3).map(move |i| (*v, i, (true, true))))
        .collect();
    let got = probe_all(&run, &vips).unwrap();
    check("healthy", &got, &healthy).unwrap();
    let ipip = hc_stat(&instance, HcStat::FwdIpip).unwrap();
    let l2 = hc_stat(&instance, HcStat::FwdL2).unwrap();
    assert!(
        ipip > 0 && l2 > 0,
        "xlb_hc counted {ipip} encapsulated and {l2} l2 probe packets"
    );

    // b1: its decapsulator stops (killed like a crashed process).
    xlb_tests::lab::kill_decap(&run, 1);
    // b2: the IPv4 VIP of `api` goes missing from lo (api2/l2 keeps its own).
    xlb_tests::netns::run(&[
        "ip",
        "-n",
        &run.lab().ns_backend(2),
        "addr",
        "del",
        &format!("{}/32", topology::VIP_V4),
        "dev",
        "lo",
    ])
    .unwrap();
    let got = probe_all(&run, &vips).unwrap();
    let broken = [
        // The decapsulator's work is lost: every dsr-ipip VIP on b1.
        ("api", 1, (true, false)),
        ("api6", 1, (true, false)),
        // dsr-l2 needs no decapsulation: still fine.
        ("l2", 1, (true, true)),
        // VIP 10.100.0.1 gone from b2's lo: only that VIP.
        ("api", 2, (true, false)),
        ("api6", 2, (true, true)),
        ("l2", 2, (true, true)),
        ("api", 3, (true, true)),
        ("api6", 3, (true, true)),
        ("l2", 3, (true, true)),
    ];
    check("broken", &got, &broken).unwrap();

    run.shutdown().unwrap();
    let left: Vec<String> = list_namespaces()
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");
    let pins = Path::new("/sys/fs/bpf/xlb").join(&instance);
    assert!(!pins.exists(), "pins left in {}", pins.display());
}
