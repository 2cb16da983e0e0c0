//! Cost of data-path health probes against direct ones: HTTP `GET /health`
//! probes per second from one core of the LB host, in the lab, each a new
//! TCP connection, one way and then the other. A benchmark, not a test.
//!
//! Direct probes connect to the backend's own address; data-path probes
//! connect to the VIP with the backend's mark and go through `xlb_hc`
//! (encapsulation for dsr-ipip, MAC rewrite for dsr-l2) exactly as clients'
//! packets go through `xlb_lb`. The prober is one single-threaded tokio
//! runtime with `CONCURRENCY` probes in flight, so probes/s is per core on
//! the LB side (the backends share the machine's CPUs too); the prober
//! thread's CPU time per probe is reported as well.
//!
//! `cargo build -p lb-user -p xlb-lab && cargo run -p xlb-tests --bin xlb-dpath-bench`
//! (as root). `run(probes)` is callable from other benchmarks.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]
#![allow(clippy::print_stdout, reason = "a benchmark's report goes to stdout")]

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use lb_user::{config::Mode as CfgMode, health::datapath::DatapathTarget};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    time::timeout_at,
};
use xlb_lab::{
    scenario::{LabRun, Mode, Vip, XlbConfig, find_xlb},
    topology::{self, HOST_IFNAME},
};
use xlb_tests::bench::{figures::Figure, print_command, thread_cpu};

const BENCH: &str = "xlb-dpath-bench";
const PREFIX: &str = "xlbdp";
/// Probes in flight at once on the one prober thread.
const CONCURRENCY: usize = 16;
/// Probes per mode and round. All data-path probes of one VIP share the
/// (LB address, VIP, port) 4-tuple space, ~28k ephemeral ports held 60 s in
/// TIME_WAIT: stay well below.
const PROBES: usize = 4000;
const ROUNDS: usize = 3;
const TIMEOUT: Duration = Duration::from_secs(1);

/// How one probe reaches its backend.
#[derive(Clone)]
enum Way {
    Direct(SocketAddr),
    Vip(DatapathTarget),
}

async fn probe(way: &Way) -> bool {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let (stream, host) = match way {
        Way::Direct(a) => (timeout_at(deadline, TcpStream::connect(*a)).await, *a),
        Way::Vip(t) => (Ok(t.connect(deadline).await), t.vip),
    };
    let Ok(Ok(mut s)) = stream else { return false };
    let req = format!("GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let exchange = async {
        s.write_all(req.as_bytes()).await?;
        let mut buf = [0u8; 256];
        let mut got = Vec::new();
        loop {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(got.starts_with(b"HTTP/1.1 200"))
    };
    matches!(timeout_at(deadline, exchange).await, Ok(Ok(true)))
}

/// Runs `n` probes round-robin over `ways`, `CONCURRENCY` at a time.
/// Returns (probes/s, CPU µs per probe, failures).
async fn measure(ways: &[Way], n: usize) -> (f64, f64, usize) {
    let t0 = Instant::now();
    let c0 = thread_cpu();
    let mut failures = 0;
    let mut next = 0;
    let mut set = tokio::task::JoinSet::new();
    while next < n || !set.is_empty() {
        while next < n && set.len() < CONCURRENCY {
            let way = ways[next % ways.len()].clone();
            set.spawn_local(async move { probe(&way).await });
            next += 1;
        }
        if let Some(r) = set.join_next().await
            && !matches!(r, Ok(true))
        {
            failures += 1;
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = (thread_cpu() - c0).as_secs_f64();
    (n as f64 / wall, cpu * 1e6 / n as f64, failures)
}

/// Measures direct and data-path probes of 3 backends of `mode`, in a lab
/// it builds and removes. Returns rows of (label, probes/s, CPU µs/probe,
/// failures), best round of each.
pub fn run(mode: Mode, probes: usize) -> anyhow::Result<Vec<(String, f64, f64, usize)>> {
    let xlb = find_xlb()?;
    let vip = Vip::new("api", topology::VIP_V4.into(), 80, mode, 3);
    let cfg = XlbConfig {
        vips: vec![vip.clone()],
        ..XlbConfig::for_prefix(PREFIX)
    };
    let lab = LabRun::up(PREFIX, &xlb, &cfg.render()).context("lab up")?;
    let cfg_mode = match mode {
        Mode::DsrIpip => CfgMode::DsrIpip,
        Mode::DsrL2 => CfgMode::DsrL2,
    };
    // The daemon's ids follow the configuration order from 1 on a fresh
    // instance; a wrong guess would show as failures.
    let direct: Vec<Way> = (1..=3).map(|i| Way::Direct(vip.backend_addr(i))).collect();
    let via: Vec<Way> = (1..=3)
        .map(|i| {
            Way::Vip(DatapathTarget::new(
                vip.target(),
                i as u32,
                HOST_IFNAME,
                cfg_mode,
            ))
        })
        .collect();
    let ns = lab.lab().ns_lb();
    let rows = topology::in_netns(&ns, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async {
            let mut best: Vec<(String, f64, f64, usize)> = vec![
                ("direct".into(), 0.0, f64::MAX, 0),
                (format!("via VIP ({})", mode.as_str()), 0.0, f64::MAX, 0),
            ];
            for _ in 0..ROUNDS {
                for (k, ways) in [&direct, &via].into_iter().enumerate() {
                    let (rate, cpu, fails) = measure(ways, probes).await;
                    let b = &mut best[k];
                    if rate > b.1 {
                        b.1 = rate;
                    }
                    b.2 = b.2.min(cpu);
                    b.3 += fails;
                }
            }
            best
        })
    })?;
    lab.shutdown()?;
    Ok(rows)
}

fn main() -> anyhow::Result<()> {
    print_command(BENCH);
    println!(
        "HTTP GET /health probes, new connection each, {CONCURRENCY} in flight on one \
         thread, best of {ROUNDS} rounds of {PROBES}, 3 backends"
    );
    println!(
        "{:<22} {:>10} {:>14} {:>9}",
        "", "probes/s", "CPU µs/probe", "failures"
    );
    for mode in [Mode::DsrIpip, Mode::DsrL2] {
        let rows = run(mode, PROBES)?;
        for (label, rate, cpu, fails) in &rows {
            println!("{label:<22} {rate:>10.0} {cpu:>14.1} {fails:>9}");
        }
        // Into the summary of `cargo xtask bench`: each way's CPU per
        // probe, the data path's against the direct one.
        let direct = rows[0].2;
        let group = format!("health probes, prober CPU µs per probe, {}", mode.as_str());
        for (i, (label, _, cpu, _)) in rows.iter().enumerate() {
            let f = Figure::new(BENCH, &group, label, *cpu, "µs");
            let f = if i == 0 {
                f
            } else {
                f.against("direct", direct)
            };
            f.record();
        }
    }
    Ok(())
}
