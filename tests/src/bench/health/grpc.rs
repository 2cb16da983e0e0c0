//! `--only grpc`: CPU per `kind = "grpc"` check, with a new connection per
//! probe and with `reuse_connection`, against xlb's own plain HTTP/1.1
//! check of the same number of servers in the same run.
//!
//! HAProxy has no gRPC health check (its `option httpchk` speaks HTTP/1.x
//! and cannot read gRPC's trailers), nor does keepalived: the reference is
//! xlb's HTTP check, which is itself held to HAProxy's by the cost figure.
//! The servers run in child processes (`xlb-grpc-health`, tonic-health's
//! standard service, and this benchmark's `--serve` HTTP servers), so the
//! CPU measured, the prober thread's own (`CLOCK_THREAD_CPUTIME_ID`, h2's
//! connection tasks included: they run on that thread), is the checker's.

use std::{
    net::SocketAddr,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use lb_user::health::{
    probe::{ConnSlot, probe_reusing},
    spec::{CheckKind, CheckSpec, GrpcCheck},
};
use tokio::io::{AsyncBufReadExt as _, BufReader};

use super::detection::http_spec;
use super::report::{Row, Verdict};

/// Servers of each kind probed.
const SERVERS: usize = 50;
/// Each server is probed every this long.
const PERIOD: Duration = Duration::from_millis(100);
/// `reopen_every` of the reuse cases (xlb's default).
const REOPEN_EVERY: u32 = 10;

/// The cases, in the order they run: (label, gRPC?, reuse?).
const CASES: [(&str, bool, bool); 4] = [
    (
        "HTTP/1.1, new connection per probe (reference)",
        false,
        false,
    ),
    ("gRPC (h2c), new connection per probe", true, false),
    ("HTTP/1.1, reuse_connection (reference)", false, true),
    ("gRPC (h2c), reuse_connection", true, true),
];

/// The check of one case on `port`.
fn spec(grpc: bool, reuse: bool, port: u16) -> CheckSpec {
    let mut spec = http_spec(|s| s.port = port);
    let every = reuse.then_some(REOPEN_EVERY);
    if grpc {
        spec.kind = CheckKind::Grpc(GrpcCheck {
            service: String::new(),
            host: None,
            reuse_connection: every,
            tls: None,
        });
    } else if let CheckKind::Http(http) = &mut spec.kind {
        http.reuse_connection = every;
    }
    spec
}

/// This thread's CPU time so far.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a pointer to a live timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// What one case measured.
struct Measured {
    checks: u64,
    failed: u64,
    cpu: Duration,
}

impl Measured {
    fn per_check_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.checks.max(1) as f64
    }
}

/// Probes every address in `addrs` every [`PERIOD`] for `window` on a
/// current-thread runtime of its own thread, measuring that thread's CPU.
fn measure(addrs: Vec<SocketAddr>, grpc: bool, reuse: bool, window: Duration) -> Result<Measured> {
    let thread = std::thread::Builder::new()
        .name("xlb-grpc-bench".to_owned())
        .spawn(move || -> Result<Measured> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("the prober's runtime")?;
            runtime.block_on(async move {
                let specs: Vec<CheckSpec> =
                    addrs.iter().map(|a| spec(grpc, reuse, a.port())).collect();
                let slots: Vec<ConnSlot> = addrs.iter().map(|_| ConnSlot::default()).collect();
                // One round unmeasured: connections and caches warm.
                let round = async |count: &mut Measured| {
                    let mut set = tokio::task::JoinSet::new();
                    for ((addr, spec), slot) in addrs.iter().zip(&specs).zip(&slots) {
                        let (addr, spec, slot) = (*addr, spec.clone(), slot.clone());
                        set.spawn(async move {
                            probe_reusing(addr, &spec, None, Some(&slot)).await.is_ok()
                        });
                    }
                    while let Some(ok) = set.join_next().await {
                        count.checks += 1;
                        count.failed += u64::from(!ok.unwrap_or(false));
                    }
                };
                let mut warm = Measured {
                    checks: 0,
                    failed: 0,
                    cpu: Duration::ZERO,
                };
                round(&mut warm).await;
                let mut out = Measured {
                    checks: 0,
                    failed: 0,
                    cpu: Duration::ZERO,
                };
                let (start, cpu0) = (Instant::now(), thread_cpu());
                let mut next = tokio::time::Instant::now();
                while start.elapsed() < window {
                    round(&mut out).await;
                    next += PERIOD;
                    tokio::time::sleep_until(next).await;
                }
                out.cpu = thread_cpu().saturating_sub(cpu0);
                Ok(out)
            })
        })
        .context("starting the prober thread")?;
    thread
        .join()
        .map_err(|_| anyhow::anyhow!("the prober thread panicked"))?
}

/// A child process that prints its addresses on a line starting with
/// `marker` (on stdout or stderr); killed on drop.
struct Child {
    child: tokio::process::Child,
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn spawn_servers(
    program: &std::path::Path,
    args: &[String],
    marker: &str,
    on_stderr: bool,
) -> Result<(Child, Vec<SocketAddr>)> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).stdin(Stdio::piped()).kill_on_drop(true);
    if on_stderr {
        cmd.stderr(Stdio::piped()).stdout(Stdio::null());
    } else {
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    let pipe: Box<dyn tokio::io::AsyncRead + Unpin + Send> = if on_stderr {
        Box::new(child.stderr.take().context("stderr")?)
    } else {
        Box::new(child.stdout.take().context("stdout")?)
    };
    let child = Child { child };
    let mut lines = BufReader::new(pipe).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(rest) = line.strip_prefix(marker) {
                return Ok(rest.to_owned());
            }
        }
        bail!("{} ended without {marker:?}", program.display())
    })
    .await
    .with_context(|| format!("{} did not start in 30 s", program.display()))??;
    // Keep reading so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let addrs = line
        .split_whitespace()
        .map(|w| {
            w.parse::<SocketAddr>()
                .or_else(|_| {
                    w.parse::<u16>()
                        .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
                })
                .with_context(|| format!("{w:?} is not an address"))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((child, addrs))
}

/// The figure's rows.
pub(super) async fn grpc_cost(quick: bool) -> Result<Vec<Row>> {
    let window = Duration::from_secs(if quick { 3 } else { 10 });
    let exe = std::env::current_exe().context("this benchmark's path")?;
    let grpc_bin = exe.with_file_name("xlb-grpc-health");
    ensure!(
        grpc_bin.exists(),
        "{} missing: cargo build -p xlb-lab (same profile)",
        grpc_bin.display()
    );
    let listen: Vec<String> = (0..SERVERS)
        .flat_map(|_| ["--listen".to_owned(), "127.0.0.1:0".to_owned()])
        .collect();
    let (_grpc, grpc_addrs) =
        spawn_servers(&grpc_bin, &listen, "xlb-grpc-health: serving on ", true).await?;
    let serve = ["--serve".to_owned(), SERVERS.to_string()];
    let (_http, http_addrs) = spawn_servers(&exe, &serve, "ports ", false).await?;
    println!(
        "grpc:      {SERVERS} tonic-health servers (xlb-grpc-health) and {SERVERS} HTTP/1.1 \
         servers (--serve), each probed every {} ms for {} s per case",
        PERIOD.as_millis(),
        window.as_secs()
    );
    println!(
        "grpc:      reference: xlb's own HTTP/1.1 check of as many servers in the same run \
         (HAProxy and keepalived have no gRPC health check)"
    );
    let mut results = Vec::new();
    for (label, grpc, reuse) in CASES {
        let addrs = if grpc { &grpc_addrs } else { &http_addrs };
        let addrs = addrs.clone();
        let m = tokio::task::spawn_blocking(move || measure(addrs, grpc, reuse, window))
            .await
            .context("the measuring task")??;
        println!(
            "grpc:      {label}: {} checks ({} failed), {:.1} ms CPU, {:.1} µs per check",
            m.checks,
            m.failed,
            m.cpu.as_secs_f64() * 1e3,
            m.per_check_us()
        );
        ensure!(
            m.failed == 0,
            "{label}: {} of {} checks failed",
            m.failed,
            m.checks
        );
        results.push((label, m));
    }
    let mut rows = Vec::new();
    for pair in results.chunks(2) {
        let [(ref_label, reference), (label, grpc)] = pair else {
            continue;
        };
        let ratio = grpc.per_check_us() / reference.per_check_us();
        rows.push(Row {
            figure: format!("CPU per check: {label}"),
            value: format!("{:.1} µs ({ratio:.2}× HTTP)", grpc.per_check_us()),
            target: format!(
                "- (reference: {ref_label}, {:.1} µs)",
                reference.per_check_us()
            ),
            verdict: Verdict::Info,
        });
    }
    Ok(rows)
}
