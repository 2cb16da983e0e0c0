//! Figure `dns` (issue 25): what a `kind = "dns"` check costs and how fast
//! it detects a hung DNS server, against three real `dnsmasq` servers on
//! 127.0.0.1 (high ports, answering `lab.test` from `--address`, files in a
//! temp dir, killed when the figure ends).
//!
//! - CPU per check: the xlb prober (`health::probe::probe`, this process's
//!   CPU from getrusage over a sequential loop of checks) against a plain
//!   `dig +tries=1 +time=1` per check (the dig processes' CPU, from the
//!   rusage of waited-for children), both asking the same servers the same
//!   question in the same run. keepalived's `DNS_CHECK` would be the other
//!   reference; keepalived is not installed here (not a test package), so
//!   it is not measured. Goal (issue 25): at most 1.2 × the reference.
//! - Detection: the real scheduler probes the three; once all are up, one
//!   `dnsmasq` is SIGSTOPped (sockets bound, no answer) at a random phase of
//!   the interval; detection = its Up → Down report − the stop, at the
//!   default and the fast profile, against fall × interval × (1 + jitter) +
//!   hang_timeout.

use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use lb_user::health::{
    probe::{Compact, probe},
    spec::{CheckSpec, Via},
};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use super::{
    fleet::{Fleet, detection},
    report::{Row, Verdict},
    resources::cpu_time,
};

/// The question every check asks.
const NAME: &str = "lab.test";

/// Issue 25's goal: no kind costs more than this × its reference.
const COST_GOAL: f64 = 1.2;

/// Three dnsmasq on 127.0.0.1, killed (and reaped) on drop.
struct Servers {
    children: Vec<Child>,
    addrs: Vec<SocketAddr>,
    dir: PathBuf,
}

impl Servers {
    fn start() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("xlb-dns-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut servers = Self {
            children: Vec::new(),
            addrs: Vec::new(),
            dir,
        };
        for i in 1..=3 {
            // A port free now for UDP; dnsmasq binds it (and TCP) at once.
            let port = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?
                .local_addr()?
                .port();
            let file = |ext: &str| servers.dir.join(format!("dnsmasq-{i}.{ext}"));
            let child = Command::new("dnsmasq")
                .args([
                    "--keep-in-foreground",
                    "--conf-file=/dev/null",
                    "--no-resolv",
                    "--no-hosts",
                    "--user=root",
                    "--bind-interfaces",
                    "--listen-address=127.0.0.1",
                ])
                .arg(format!("--port={port}"))
                .arg(format!("--address=/{NAME}/10.0.0.{i}"))
                .arg(format!("--pid-file={}", file("pid").display()))
                .arg(format!("--log-facility={}", file("log").display()))
                .stdin(Stdio::null())
                .spawn()
                .context("starting dnsmasq (apt-get install dnsmasq-base)")?;
            servers.children.push(child);
            servers
                .addrs
                .push(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
        }
        servers.wait_answering()?;
        Ok(servers)
    }

    /// Every server answers `dig` within 5 s of starting.
    fn wait_answering(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(5);
        for &addr in &self.addrs {
            while !dig(addr)?.success() {
                ensure!(
                    Instant::now() < deadline,
                    "dnsmasq on {addr} does not answer"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }
}

impl Fleet for Servers {
    fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    fn signal(&self, i: usize, sig: Signal) -> Result<()> {
        let pid = Pid::from_raw(i32::try_from(self.children[i].id())?);
        kill(pid, sig).with_context(|| format!("kill -{sig} dnsmasq {i}"))
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for child in &mut self.children {
            // A stopped dnsmasq dies of SIGKILL too.
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One `dig` check of `addr`.
fn dig(addr: SocketAddr) -> Result<std::process::ExitStatus> {
    Command::new("dig")
        .args(["+tries=1", "+time=1", "+short"])
        .arg(format!("@{}", addr.ip()))
        .args(["-p", &addr.port().to_string(), NAME, "A"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running dig (apt-get install bind9-dnsutils)")
}

/// CPU of this process's waited-for children so far.
fn children_cpu() -> Result<Duration> {
    // SAFETY: rusage is plain integers, for which all-zero bytes are valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage for the duration of the call.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    ensure!(
        rc == 0,
        "getrusage(RUSAGE_CHILDREN): {}",
        std::io::Error::last_os_error()
    );
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    Ok(tv(usage.ru_utime) + tv(usage.ru_stime))
}

/// The DNS check a `[health_check]` with `extra` resolves to (through the
/// real configuration code), probing straight to the server.
fn dns_spec(extra: &str) -> CheckSpec {
    let text = format!(
        "[daemon]\ninterface = \"lo\"\n[health_check]\nkind = \"dns\"\n\
         dns_name = \"{NAME}\"\ndns_type = \"A\"\n{extra}\n\
         [[vip]]\nname = \"dns\"\naddress = \"10.100.0.53\"\nport = 53\nprotocol = \"udp\"\n\
         [[vip.backend]]\naddress = \"10.0.0.1\"\n"
    );
    let cfg = lb_user::config::Config::from_str(&text, "bench.toml").expect("valid bench config");
    CheckSpec {
        via: Via::Direct,
        ..cfg.vips[0].backends[0].health.clone()
    }
}

/// The figure's rows.
pub(super) async fn dns(quick: bool) -> Result<Vec<Row>> {
    let servers = Servers::start()?;
    println!();
    println!(
        "figure dns: CPU per DNS check and detection of a hung dnsmasq; 3 dnsmasq {} on {:?}, \
         question {NAME} A",
        std::process::Command::new("dnsmasq")
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_owned))
            .unwrap_or_default(),
        servers.addrs
    );
    let mut rows = cost(&servers, quick).await?;
    for (name, extra, reps) in [
        ("default", "", if quick { 2 } else { 5 }),
        (
            "fast",
            "interval = \"200ms\"\nfall = 2\ntimeout = \"100ms\"",
            if quick { 4 } else { 20 },
        ),
    ] {
        rows.push(detection(&servers, "dnsmasq", name, &dns_spec(extra), reps).await?);
    }
    Ok(rows)
}

async fn cost(servers: &Servers, quick: bool) -> Result<Vec<Row>> {
    let (checks, digs) = if quick { (2_000, 100) } else { (20_000, 500) };
    let spec = dns_spec("");
    let before = cpu_time()?;
    for i in 0..checks {
        let addr = servers.addrs[i % servers.addrs.len()];
        let result = probe(
            addr,
            &CheckSpec {
                port: addr.port(),
                ..spec.clone()
            },
        )
        .await;
        ensure!(
            result.is_ok(),
            "xlb's DNS check of {addr} failed: {:?}",
            result.outcome
        );
    }
    let xlb = (cpu_time()? - before).total() / checks as u32;
    let before = children_cpu()?;
    for i in 0..digs {
        let addr = servers.addrs[i % servers.addrs.len()];
        ensure!(dig(addr)?.success(), "dig @{addr} failed");
    }
    let reference = (children_cpu()? - before) / digs as u32;
    let ratio = xlb.as_secs_f64() / reference.as_secs_f64().max(1e-9);
    println!(
        "  cost: xlb {} per check over {checks} sequential checks (this process's CPU); \
         dig {} per check over {digs} runs (children's CPU); keepalived DNS_CHECK: not \
         installed, not measured",
        Compact(xlb),
        Compact(reference)
    );
    Ok(vec![
        Row {
            figure: format!("DNS check CPU per check, xlb prober (n={checks})"),
            value: Compact(xlb).to_string(),
            target: "-".to_owned(),
            verdict: Verdict::Info,
        },
        Row {
            figure: format!("DNS check CPU per check, dig +tries=1 (n={digs})"),
            value: Compact(reference).to_string(),
            target: "reference (keepalived DNS_CHECK not installed)".to_owned(),
            verdict: Verdict::Info,
        },
        Row {
            figure: "DNS check CPU, xlb / dig".to_owned(),
            value: format!("{ratio:.3}×"),
            target: format!("<= {COST_GOAL}× (issue 25)"),
            verdict: Verdict::of(ratio <= COST_GOAL),
        },
    ])
}
