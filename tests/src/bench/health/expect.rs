//! The send/expect figure (`--only expect`): CPU per check of xlb's prober
//! doing Redis's `PING` / `+PONG` (`kind = "tcp"`, `send`, `expect_prefix`)
//! against HAProxy doing the same (`tcp-check send PING\r\n`, `tcp-check
//! expect string +PONG`) of the same real `redis-server`s, in the same run.
//!
//! [`BACKENDS`] backends are probed once a second each, spread over
//! [`REDIS_SERVERS`] redis-servers on 127.0.0.1 (several backends per
//! server: a backend is an address to the prober, and redis answers a
//! thousand PINGs a second without effort). Each side's checks are counted
//! by the servers themselves (redis's `total_connections_received`: one
//! connection per check on both sides), its CPU read from /proc (this
//! process for xlb, whose scheduler thread runs the probes; HAProxy's
//! process for HAProxy), over the same window after a warm-up.

use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context as _, Result, bail, ensure};
use lb_user::health::{
    machine::HealthState,
    scheduler::{DEFAULT_MAX_CONCURRENT, Scheduler},
    spec::{CheckKind, CheckSpec, ExpectCheck, Matcher, Transport, Via, expect},
};
use tokio::time::{Instant, sleep, timeout_at};

use super::{
    haproxy::{BACKEND, Haproxy},
    report::{Row, Secs, Verdict},
    resources::{CpuTime, cpu_time},
};
use crate::bench::lab_proxies::find_program;

/// Backends probed, each once a second: the cost figure's load.
const BACKENDS: usize = 1_000;
/// redis-servers they are spread over.
const REDIS_SERVERS: usize = 4;
/// The goal: xlb's CPU per check at most this many times HAProxy's.
const RATIO_GOAL: f64 = 1.2;
/// The figure's group in the summary.
const GROUP: &str = "control plane, send/expect (Redis PING) CPU per check against HAProxy (µs)";

fn spec() -> CheckSpec {
    CheckSpec {
        kind: CheckKind::Expect(ExpectCheck {
            transport: Transport::Tcp,
            send: Some(b"PING\r\n".to_vec()),
            matcher: Some(Matcher::Prefix(b"+PONG".to_vec())),
            max: expect::DEFAULT_EXPECT_MAX,
        }),
        port: 0,
        interval: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
        hang_timeout: Duration::from_secs(3),
        rise: 2,
        fall: 3,
        fast_interval: Duration::from_millis(500),
        down_interval: Duration::from_secs(5),
        jitter: 0.1,
        via: Via::Direct,
        auto_timeout: false,
        agent: None,
    }
}

/// HAProxy's configuration for the same check of `ports` (one server per
/// backend, as many as xlb probes).
fn haproxy_config(ports: &[u16], spec: &CheckSpec, sock: &Path) -> String {
    let ms = |d: Duration| d.as_millis().max(1);
    let spread = (spec.jitter * 100.0).round().clamp(0.0, 50.0) as u32;
    let mut cfg = format!(
        "# Written by xlb-health-bench.\n\
         global\n    nbthread 1\n    maxconn 4000\n    spread-checks {spread}\n    \
         stats socket {sock} mode 600\n\n\
         defaults\n    mode tcp\n    timeout connect {hang}ms\n    timeout check {hang}ms\n    \
         timeout client 30s\n    timeout server 30s\n\n\
         backend {BACKEND}\n    option tcp-check\n    \
         tcp-check send PING\\r\\n\n    tcp-check expect string +PONG\n    \
         default-server check inter {inter}ms rise {rise} fall {fall}\n",
        sock = sock.display(),
        hang = ms(spec.hang_timeout),
        inter = ms(spec.interval),
        rise = spec.rise,
        fall = spec.fall,
    );
    for (i, port) in ports.iter().enumerate() {
        cfg.push_str(&format!("    server s{i} 127.0.0.1:{port}\n"));
    }
    cfg
}

/// The redis-servers, killed and their directory removed when dropped.
struct Redis {
    children: Vec<tokio::process::Child>,
    ports: Vec<u16>,
    dir: PathBuf,
}

impl Redis {
    async fn start(n: usize) -> Result<Self> {
        let redis = find_program("redis-server")?;
        let dir =
            std::env::temp_dir().join(format!("xlb-health-bench-redis-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut me = Self {
            children: Vec::new(),
            ports: Vec::new(),
            dir,
        };
        for _ in 0..n {
            // A port the kernel just gave out and took back: free unless
            // something grabs it in between (then redis fails to start,
            // and so does the figure, with its log).
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let log = std::fs::File::create(me.dir.join(format!("redis-{port}.log")))?;
            let child = tokio::process::Command::new(&redis)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(&me.dir)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("starting {}", redis.display()))?;
            me.children.push(child);
            me.ports.push(port);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for &port in &me.ports {
            while me.connections(port).await.is_err() {
                ensure!(
                    Instant::now() < deadline,
                    "redis-server on port {port} did not answer within 10 s (log in {})",
                    me.dir.display()
                );
                sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(me)
    }

    /// `total_connections_received` of the server on `port` (`INFO stats`).
    async fn connections(&self, port: u16) -> Result<u64> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut s = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
        s.write_all(b"INFO stats\r\nQUIT\r\n").await?;
        let mut text = String::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut text)).await??;
        text.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("no total_connections_received in redis's INFO: {text:?}"))
    }

    /// Connections received by all servers.
    async fn total(&self) -> Result<u64> {
        let mut sum = 0;
        for &port in &self.ports {
            sum += self.connections(port).await?;
        }
        Ok(sum)
    }

    /// The port of each of `n` backends, round robin over the servers.
    fn backend_ports(&self, n: usize) -> Vec<u16> {
        (0..n).map(|i| self.ports[i % self.ports.len()]).collect()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One side's window: checks counted by the servers, CPU, wall time and
/// failures seen.
#[derive(Debug)]
struct Window {
    checks: u64,
    cpu: CpuTime,
    wall: Duration,
    failed: HashMap<String, u32>,
}

impl Window {
    fn per_check_us(&self) -> f64 {
        self.cpu.total().as_secs_f64() * 1e6 / (self.checks.max(1) as f64)
    }
}

async fn xlb_window(
    redis: &Redis,
    spec: &CheckSpec,
    warmup: Duration,
    window: Duration,
) -> Result<Window> {
    let (mut scheduler, mut rx) = Scheduler::new(DEFAULT_MAX_CONCURRENT);
    let ports = redis.backend_ports(BACKENDS);
    for (id, port) in (0u64..).zip(&ports) {
        let spec = CheckSpec {
            port: *port,
            ..spec.clone()
        };
        scheduler.upsert(
            id,
            SocketAddr::from((Ipv4Addr::LOCALHOST, *port)),
            spec,
            HealthState::Unknown,
        );
    }
    let warm_end = Instant::now() + warmup;
    let mut failed: HashMap<String, u32> = HashMap::new();
    while let Ok(Some(_)) = timeout_at(warm_end, rx.recv()).await {}
    let (cpu_start, served_start, start) = (cpu_time()?, redis.total().await?, Instant::now());
    let end = start + window;
    while let Ok(received) = timeout_at(end, rx.recv()).await {
        let report = received.context("the scheduler's report channel closed")?;
        if let Some(Err(e)) = report.result.as_ref().map(|r| &r.outcome) {
            *failed.entry(e.code().to_owned()).or_default() += 1;
        }
    }
    let cpu = cpu_time()? - cpu_start;
    let wall = start.elapsed();
    // The servers' counts are read after the CPU: the INFO connections are
    // not the prober's, and they count once each side.
    let checks = redis.total().await? - served_start;
    drop(scheduler);
    Ok(Window {
        checks: checks.saturating_sub(REDIS_SERVERS as u64),
        cpu,
        wall,
        failed,
    })
}

async fn haproxy_window(
    redis: &Redis,
    spec: &CheckSpec,
    warmup: Duration,
    window: Duration,
) -> Result<Window> {
    let ports = redis.backend_ports(BACKENDS);
    let haproxy = Haproxy::start_with(
        "expect",
        |sock| Ok(haproxy_config(&ports, spec, sock)),
        Some((BACKENDS, spec)),
    )
    .await?;
    sleep(warmup).await;
    let failed_before = haproxy.stats().await?.failed;
    let (cpu_start, served_start, start) = (haproxy.cpu()?, redis.total().await?, Instant::now());
    sleep(window).await;
    let cpu = haproxy.cpu()? - cpu_start;
    let wall = start.elapsed();
    let checks = redis.total().await? - served_start;
    let stats = haproxy.stats().await?;
    drop(haproxy);
    let mut failed = HashMap::new();
    let failures = stats.failed.saturating_sub(failed_before);
    if failures > 0 {
        failed.insert("HAProxy chkfail".to_owned(), u32::try_from(failures)?);
    }
    Ok(Window {
        checks: checks.saturating_sub(REDIS_SERVERS as u64),
        cpu,
        wall,
        failed,
    })
}

/// The figure: both sides, one after the other, against the same servers.
pub(super) async fn expect_cost(quick: bool) -> Result<Vec<Row>> {
    let version = Haproxy::version()?;
    let (warmup, window) = if quick {
        (Duration::from_secs(3), Duration::from_secs(10))
    } else {
        (Duration::from_secs(5), Duration::from_secs(30))
    };
    let spec = spec();
    println!(
        "\n== send/expect: {BACKENDS} backends on {REDIS_SERVERS} redis-servers, PING/+PONG every {}, \
         {} windows after {} warm-up; reference {version}, one thread ==",
        Secs(spec.interval),
        Secs(window),
        Secs(warmup)
    );
    let redis = Redis::start(REDIS_SERVERS).await?;
    let xlb = xlb_window(&redis, &spec, warmup, window).await?;
    let haproxy = haproxy_window(&redis, &spec, warmup, window).await?;
    for (name, w) in [("xlb", &xlb), ("HAProxy", &haproxy)] {
        println!(
            "{name:>8}: {} checks in {} ({:.0}/s), CPU {} ({:.1} % of a core), {:.1} µs per check, failures {:?}",
            w.checks,
            Secs(w.wall),
            w.checks as f64 / w.wall.as_secs_f64(),
            Secs(w.cpu.total()),
            100.0 * w.cpu.total().as_secs_f64() / w.wall.as_secs_f64(),
            w.per_check_us(),
            w.failed
        );
    }
    let expected = BACKENDS as f64 * window.as_secs_f64() / spec.interval.as_secs_f64();
    for (name, w) in [("xlb", &xlb), ("HAProxy", &haproxy)] {
        if (w.checks as f64) < expected * 0.8 {
            bail!(
                "{name} made {} checks, expected about {expected:.0}: the figure would mislead",
                w.checks
            );
        }
    }
    let ratio = xlb.per_check_us() / haproxy.per_check_us();
    let met = ratio <= RATIO_GOAL && xlb.failed.is_empty();
    println!("ratio: xlb / HAProxy = {ratio:.2} (goal ≤ {RATIO_GOAL})");
    Ok(vec![Row {
        figure: format!(
            "{GROUP}: xlb {:.1} / HAProxy {:.1}",
            xlb.per_check_us(),
            haproxy.per_check_us()
        ),
        value: format!("{ratio:.2}×"),
        target: format!("≤ {RATIO_GOAL}× HAProxy's, no failed probe"),
        verdict: Verdict::of(met),
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn haproxy_does_the_same_check() {
        let cfg = haproxy_config(&[7001, 7002], &spec(), Path::new("/tmp/x.sock"));
        for want in [
            "option tcp-check",
            "tcp-check send PING\\r\\n\n",
            "tcp-check expect string +PONG\n",
            "default-server check inter 1000ms rise 2 fall 3",
            "timeout check 3000ms",
            "spread-checks 10",
            "server s1 127.0.0.1:7002\n",
        ] {
            assert!(cfg.contains(want), "{want:?} missing from:\n{cfg}");
        }
    }
}
