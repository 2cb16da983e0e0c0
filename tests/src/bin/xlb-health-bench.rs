//! `cargo xtask bench`: what xlb's health checking costs and how fast it
//! takes a hung application out of service. A benchmark, not a test: it
//! prints figures, the command and settings that produced them, and whether
//! each meets its target (only to say so; it fails only when it cannot
//! measure).
//!
//! Everything runs on 127.0.0.1 with the real prober
//! (`lb_user::health::scheduler::Scheduler`):
//! - detection: a VIP of three `xlb_lab::backend` servers, every probe
//!   report fed to the real VIP policy (`lb_user::health::policy::evaluate`)
//!   as the daemon feeds it. Once all three serve, one is switched to
//!   `Fault::Hang` (the listening socket stays open and the kernel completes
//!   handshakes; the application never answers). What clients notice is
//!   when it leaves the table: among answering peers that is the policy
//!   ejecting a slow outlier after `fall` late probes, before the hard
//!   Up→Down at `hang_timeout`, which is the second figure. Repeated with
//!   the switch at a random phase of the probe period.
//! - cost: 1,000 minimal HTTP servers in a child process (this binary
//!   re-executed with the hidden `--serve N`), so that the CPU time read with
//!   `getrusage(RUSAGE_SELF)` is the prober's alone.
//!
//! Usage: `xlb-health-bench [--quick] [--only detection|cost]`.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use lb_user::health::machine::{HealthSnapshot, HealthState};
use lb_user::health::policy::{Change, Member, MemberState, Placement, Policy, VipState, evaluate};
use lb_user::health::probe::{Compact, FailReason, ProbeClass};
use lb_user::health::scheduler::{DEFAULT_MAX_CONCURRENT, Report, Scheduler};
use lb_user::health::spec::{CheckKind, CheckSpec, HttpCheck, Via, defaults};
use rand::Rng as _;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, sleep, timeout, timeout_at};
use xlb_lab::backend::{BackendOptions, Fault, serve};

const USAGE: &str = "usage: xlb-health-bench [--quick] [--only detection|cost]
  --quick           fewer repetitions and a shorter cost window (smoke runs)
  --only FIGURE     run one figure: detection (hung application) or cost
                    (CPU of probing 1,000 backends every second)";

/// Margin on the detection targets for scheduling and report delivery.
const DETECTION_MARGIN: Duration = Duration::from_millis(50);

/// Backends probed for the cost figure.
const COST_BACKENDS: usize = 1_000;

/// How far the probe rate may stray from one probe per backend per interval.
const RATE_TOLERANCE: f64 = 0.15;

/// File descriptors each process asks for: 1,000 listeners in the server, up
/// to `DEFAULT_MAX_CONCURRENT` probes plus the accepted connections, with room.
const NOFILE_WANTED: u64 = 16_384;

/// The server child exits when its stdin closes (the parent is done or dead),
/// and in any case after this long.
const SERVE_LIMIT: Duration = Duration::from_secs(600);

/// How long the server child waits for a request head before dropping it.
const SERVE_REQUEST_WAIT: Duration = Duration::from_secs(2);

/// The answer of the cost figure's servers, as small as a real `/health`.
const HEALTH_RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nok";

/// Backend counts of figure 3 (see [`table_switch_rows`]).
const SWITCH_BACKENDS: [usize; 3] = [10, 100, 1_000];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Figure {
    Detection,
    Cost,
}

#[derive(Debug, Default)]
struct Args {
    quick: bool,
    only: Option<Figure>,
    /// Hidden: be the cost figure's server process with this many listeners.
    serve: Option<usize>,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Args> {
    let mut out = Args::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
            None => (arg.clone(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| args.next())
                .with_context(|| format!("{name} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--quick" if inline.is_none() => out.quick = true,
            "--only" => {
                out.only = Some(match value("--only")?.as_str() {
                    "detection" => Figure::Detection,
                    "cost" => Figure::Cost,
                    other => bail!("--only {other:?}: use detection or cost\n{USAGE}"),
                })
            }
            "--serve" => {
                let n = value("--serve")?;
                out.serve = Some(
                    n.parse()
                        .with_context(|| format!("--serve {n:?}: not a number of listeners"))?,
                );
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => bail!("unknown argument {arg:?}\n{USAGE}"),
        }
    }
    Ok(out)
}

fn main() -> Result<()> {
    let args = parse_args(std::env::args().skip(1))?;
    raise_nofile()?;
    if let Some(n) = args.serve {
        return serve_main(n);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the Tokio runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    let shown: Vec<&str> = argv.iter().skip(1).map(String::as_str).collect();
    println!("xlb health-check benchmark");
    println!("command:   {}", argv.join(" "));
    println!(
        "reproduce: cargo xtask bench --bin xlb-health-bench -- {}",
        shown.join(" ")
    );
    println!("host:      {}", host_description());
    if cfg!(debug_assertions) {
        println!("WARNING:   debug build; CPU figures are only meaningful with --release");
    }

    let mut rows = Vec::new();
    if args.only.is_none_or(|f| f == Figure::Detection) {
        for profile in detection_profiles(args.quick) {
            rows.extend(detection(&profile).await?);
        }
    }
    if args.only.is_none_or(|f| f == Figure::Cost) {
        rows.extend(cost(args.quick).await?);
    }
    print_table(&rows);
    Ok(())
}

fn host_description() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned());
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    format!(
        "{cpus} CPUs, Linux {kernel}, {build} build, Tokio multi-thread runtime \
         ({cpus} workers), loopback only"
    )
}

// ---------------------------------------------------------------------------
// The result table

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Met,
    Missed,
    /// Reported without a target.
    Info,
}

impl Verdict {
    fn of(met: bool) -> Self {
        if met { Self::Met } else { Self::Missed }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Met => "met",
            Self::Missed => "MISSED",
            Self::Info => "-",
        })
    }
}

/// One figure of the final table.
#[derive(Clone, Debug)]
struct Row {
    figure: String,
    value: String,
    target: String,
    verdict: Verdict,
}

fn print_table(rows: &[Row]) {
    let width = |f: fn(&Row) -> usize, title: &str| {
        rows.iter()
            .map(f)
            .chain([title.chars().count()])
            .max()
            .unwrap_or(0)
    };
    let w_fig = width(|r| r.figure.chars().count(), "figure");
    let w_val = width(|r| r.value.chars().count(), "measured");
    let w_tgt = width(|r| r.target.chars().count(), "target");
    println!();
    println!(
        "{:<w_fig$}  {:<w_val$}  {:<w_tgt$}  verdict",
        "figure", "measured", "target"
    );
    println!(
        "{}",
        "-".repeat(w_fig + w_val + w_tgt + 6 + "verdict".len())
    );
    for r in rows {
        println!(
            "{:<w_fig$}  {:<w_val$}  {:<w_tgt$}  {}",
            r.figure, r.value, r.target, r.verdict
        );
    }
}

/// A measured duration for humans: `812.4 ms`, `4.831 s`.
struct Secs(Duration);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0.as_secs_f64();
        if s >= 1.0 {
            write!(f, "{s:.3} s")
        } else {
            write!(f, "{:.1} ms", s * 1e3)
        }
    }
}

/// Min, median and max of a set of samples.
#[derive(Clone, Copy, Debug)]
struct Summary {
    n: usize,
    min: Duration,
    median: Duration,
    max: Duration,
}

impl Summary {
    fn of(mut samples: Vec<Duration>) -> Option<Self> {
        samples.sort_unstable();
        let n = samples.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => samples[n / 2],
            _ => (samples[n / 2 - 1] + samples[n / 2]) / 2,
        };
        Some(Self {
            n,
            min: samples[0],
            median,
            max: samples[n - 1],
        })
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "min {} / median {} / max {}",
            Secs(self.min),
            Secs(self.median),
            Secs(self.max)
        )
    }
}

// ---------------------------------------------------------------------------
// Figure 1: when a hung application leaves the table

/// Backends of the detection figure's VIP: one hangs, its peers keep
/// answering (what makes the hung one an outlier rather than a slow fleet).
const VIP_BACKENDS: usize = 3;

/// The one that hangs.
const HUNG: usize = VIP_BACKENDS - 1;

/// Issue 7's target for the fast profile: a hung backend still leaves the
/// table within fall × interval + timeout = 0.5 s, as before probes
/// waited for late answers.
const FAST_TARGET: Duration = Duration::from_millis(500);

/// A health-check configuration under test.
struct Profile {
    name: &'static str,
    /// `port` is filled in per backend.
    spec: CheckSpec,
    reps: usize,
    /// Why these settings, printed with them.
    note: &'static str,
    /// The time out of the table judged against, when the issue sets one;
    /// else the scheduler's worst case ([`Bounds::out_jittered`]).
    target: Option<(Duration, &'static str)>,
}

/// `GET /health`, 2xx, everything else from `health::spec::defaults` except
/// what `f` changes: the spec `config` builds from a TOML that sets only those
/// fields.
fn http_spec(f: impl FnOnce(&mut CheckSpec)) -> CheckSpec {
    let mut spec = CheckSpec {
        kind: CheckKind::Http(HttpCheck {
            method: defaults::HTTP_METHOD.to_owned(),
            path: defaults::HTTP_PATH.to_owned(),
            host: None,
            expect_status: vec![defaults::EXPECT_STATUS],
            body_contains: None,
        }),
        port: 0,
        interval: defaults::INTERVAL,
        timeout: defaults::TIMEOUT,
        hang_timeout: lb_user::health::spec::default_hang_timeout(defaults::TIMEOUT),
        rise: defaults::RISE,
        fall: defaults::FALL,
        fast_interval: defaults::FAST_INTERVAL,
        down_interval: defaults::DOWN_INTERVAL,
        jitter: defaults::JITTER,
        via: lb_user::health::spec::Via::Direct,
        auto_timeout: false,
    };
    f(&mut spec);
    spec
}

/// The health check an operator gets from `[health_check]` settings `extra`,
/// resolved by the real configuration code (so derived defaults such as
/// `fast_interval` ≤ `interval` apply exactly as in production). Probes go
/// straight to the backend (`via = "direct"`): there is no data path on
/// loopback, and the detection logic is the same either way.
fn spec_from_config(extra: &str) -> CheckSpec {
    let text = format!(
        "[daemon]\ninterface = \"lo\"\n[health_check]\n{extra}\n\
         [[vip]]\nname = \"bench\"\naddress = \"10.100.0.1\"\nport = 80\n\
         [[vip.backend]]\naddress = \"10.0.0.1\"\n"
    );
    let cfg =
        lb_user::config::Config::from_str(&text, "bench.toml").expect("bench config is valid");
    CheckSpec {
        via: Via::Direct,
        ..cfg.vips[0].backends[0].health.clone()
    }
}

fn detection_profiles(quick: bool) -> Vec<Profile> {
    vec![
        Profile {
            name: "default",
            spec: spec_from_config(""),
            reps: if quick { 2 } else { 5 },
            note: "health::spec::defaults, as a configuration without [health_check] gets them",
            target: None,
        },
        Profile {
            name: "fast",
            spec: spec_from_config("interval = \"200ms\"\nfall = 2\ntimeout = \"100ms\""),
            reps: if quick { 5 } else { 20 },
            note: "interval = \"200ms\", fall = 2, timeout = \"100ms\" (a 1s timeout would \
                   dominate a 200ms interval); everything else resolved by the configuration \
                   (hang_timeout 3 × timeout)",
            target: Some((FAST_TARGET, "issue 7")),
        },
        Profile {
            name: "fast-strict",
            spec: spec_from_config(
                "interval = \"200ms\"\nfall = 2\ntimeout = \"100ms\"\nhang_timeout = \"100ms\"",
            ),
            reps: if quick { 5 } else { 20 },
            note: "the fast profile with hang_timeout = timeout: a late answer is a failure, \
                   as before hang_timeout existed",
            target: None,
        },
    ]
}

/// The bounds a detection is judged against.
struct Bounds {
    /// Hard down: fall × interval + hang_timeout + margin.
    nominal: Duration,
    /// Hard down: fall × interval × (1 + jitter) + hang_timeout + margin:
    /// the judged target.
    jittered: Duration,
    /// Hard down, this scheduler's own worst case: the first failing probe
    /// starts at most interval × (1 + jitter) after the last passing one;
    /// each further one at most p = max(interval, fast_interval) × (1 +
    /// jitter) after the previous one started (periods run from the start
    /// of a probe; a late probe lingers without holding up the next), or
    /// timeout + p/10 when the period is shorter than the timeout; the last
    /// one's verdict comes hang_timeout after it started. Plus the margin.
    schedule: Duration,
    /// Out of the table: fall × interval + timeout. Among answering peers a
    /// hung backend is a slow outlier once `fall` probes are late, and a
    /// probe is late `timeout` after it starts (issue 7's bound; with
    /// hang_timeout = timeout the hard down comes at the same time).
    out_nominal: Duration,
    /// Out of the table, this scheduler's worst case: fall × interval ×
    /// (1 + jitter) + timeout + margin (while probes are only late the
    /// period stays `interval`; a hard failure on the way only shortens it
    /// to fast_interval).
    out_jittered: Duration,
}

impl Bounds {
    fn of(spec: &CheckSpec) -> Self {
        let stretch = 1.0 + spec.jitter.clamp(0.0, 1.0);
        let fall = spec.fall.max(1);
        let period = spec.interval.max(spec.fast_interval).mul_f64(stretch);
        let gap = period.max(spec.timeout + period / 10);
        Self {
            nominal: spec.interval * fall + spec.hang_timeout + DETECTION_MARGIN,
            jittered: spec.interval.mul_f64(stretch) * fall + spec.hang_timeout + DETECTION_MARGIN,
            schedule: spec.interval.mul_f64(stretch)
                + gap * (fall - 1)
                + spec.hang_timeout
                + DETECTION_MARGIN,
            out_nominal: spec.interval * fall + spec.timeout,
            out_jittered: spec.interval.mul_f64(stretch) * fall + spec.timeout + DETECTION_MARGIN,
        }
    }
}

/// One hang, seen by the VIP policy and by the hard state machine.
struct Detection {
    /// From the hang to the policy's first placement of the hung backend
    /// out of the table.
    out: Duration,
    /// The placement it left with, and why.
    out_as: Placement,
    out_reason: String,
    /// From the hang to its hard Up→Down report.
    down: Duration,
    down_reason: String,
    /// Late interim reports and failed probes of the hung backend until it
    /// left the table.
    late: u32,
    failures: u32,
}

async fn detection(profile: &Profile) -> Result<Vec<Row>> {
    let spec = &profile.spec;
    let bounds = Bounds::of(spec);
    let (target, target_source) = profile
        .target
        .unwrap_or((bounds.out_jittered, "scheduler's worst case"));
    println!();
    println!(
        "figure 1, a hung backend among {} leaving the table, profile {:?} ({})",
        VIP_BACKENDS, profile.name, profile.note
    );
    println!(
        "  check:   GET /health, interval {}, timeout {}, hang_timeout {}, rise {}, fall {}, \
         fast_interval {}, down_interval {}, jitter ±{:.0}%",
        Compact(spec.interval),
        Compact(spec.timeout),
        Compact(spec.hang_timeout),
        spec.rise,
        spec.fall,
        Compact(spec.fast_interval),
        Compact(spec.down_interval),
        spec.jitter * 100.0
    );
    println!(
        "  method:  a VIP of {VIP_BACKENDS} xlb_lab::backend servers on 127.0.0.1, probed by \
         health::scheduler::Scheduler, every report fed to health::policy::evaluate \
         (protection defaults) as the daemon does; once all serve, b{} gets Fault::Hang at T0, \
         a uniform [0, interval) later; out = first placement of b{} out of the table − T0, \
         down = its Up→Down report − T0; {} repetitions",
        HUNG + 1,
        HUNG + 1,
        profile.reps
    );
    println!(
        "  bounds:  out: nominal fall×interval+timeout = {}, worst case \
         fall×interval×{:.2}+timeout+{} = {}; down: nominal fall×interval+hang_timeout+{} = {}, \
         jitter-adjusted {} (judged), schedule {}",
        Secs(bounds.out_nominal),
        1.0 + spec.jitter,
        Compact(DETECTION_MARGIN),
        Secs(bounds.out_jittered),
        Compact(DETECTION_MARGIN),
        Secs(bounds.nominal),
        Secs(bounds.jittered),
        Secs(bounds.schedule),
    );

    let mut outs = Vec::new();
    let mut downs = Vec::new();
    let mut left_as: Vec<(Placement, usize)> = Vec::new();
    let mut reasons: Vec<String> = Vec::new();
    for rep in 0..profile.reps {
        let d = detect_once(spec, rep)
            .await
            .with_context(|| format!("profile {:?}, repetition {}", profile.name, rep + 1))?;
        println!(
            "  rep {:>2}/{}: out {:>10} as {} ({} late, {} failed probes: {:?}); down {:>10}",
            rep + 1,
            profile.reps,
            Secs(d.out).to_string(),
            d.out_as,
            d.late,
            d.failures,
            d.out_reason,
            Secs(d.down).to_string(),
        );
        outs.push(d.out);
        downs.push(d.down);
        match left_as.iter_mut().find(|(p, _)| *p == d.out_as) {
            Some((_, n)) => *n += 1,
            None => left_as.push((d.out_as, 1)),
        }
        if !reasons.contains(&d.down_reason) {
            reasons.push(d.down_reason);
        }
    }
    let out = Summary::of(outs).context("no repetitions")?;
    let down = Summary::of(downs).context("no repetitions")?;
    let expected_reason = FailReason::NoResponse {
        timeout: spec.hang_timeout,
    }
    .to_string();
    // With a grace past timeout the policy ejects the outlier before its
    // probes reach hang_timeout; without one the hard down is the exit.
    let expected_exit = if spec.hang_timeout > spec.timeout {
        Placement::EjectedSlow
    } else {
        Placement::Down
    };
    Ok(vec![
        Row {
            figure: format!(
                "hung backend out of the table, {} (n={})",
                profile.name, out.n
            ),
            value: out.to_string(),
            target: format!(
                "max <= {} ({target_source}; nominal {}, worst case {})",
                Secs(target),
                Secs(bounds.out_nominal),
                Secs(bounds.out_jittered)
            ),
            verdict: Verdict::of(out.max <= target),
        },
        Row {
            figure: format!("hung backend left as, {}", profile.name),
            value: left_as
                .iter()
                .map(|(p, n)| format!("{p} ×{n}"))
                .collect::<Vec<_>>()
                .join(", "),
            target: expected_exit.to_string(),
            verdict: Verdict::of(left_as.iter().all(|(p, _)| *p == expected_exit)),
        },
        Row {
            figure: format!("hung backend hard down, {} (n={})", profile.name, down.n),
            value: down.to_string(),
            target: format!(
                "max <= {} (jitter-adjusted; nominal {}; schedule {})",
                Secs(bounds.jittered),
                Secs(bounds.nominal),
                Secs(bounds.schedule)
            ),
            verdict: Verdict::of(down.max <= bounds.jittered),
        },
        Row {
            figure: format!("hard down reason, {}", profile.name),
            value: reasons
                .iter()
                .map(|r| format!("{r:?}"))
                .collect::<Vec<_>>()
                .join(", "),
            target: format!("{expected_reason:?}"),
            verdict: Verdict::of(reasons == [expected_reason]),
        },
    ])
}

/// The detection figure's VIP as the daemon keeps it: each backend's latest
/// snapshot and hard state, and the policy's memory.
struct VipModel {
    spec: CheckSpec,
    addrs: Vec<SocketAddr>,
    health: Vec<HealthState>,
    snapshots: Vec<Option<HealthSnapshot>>,
    states: Vec<MemberState>,
    vip: VipState,
    policy: Policy,
}

impl VipModel {
    fn new(spec: CheckSpec, addrs: Vec<SocketAddr>) -> Self {
        let now = std::time::Instant::now();
        let n = addrs.len();
        Self {
            spec,
            addrs,
            health: vec![HealthState::Unknown; n],
            snapshots: vec![None; n],
            states: (0..n)
                .map(|_| MemberState::new(Placement::Unknown, now))
                .collect(),
            vip: VipState::default(),
            policy: Policy::default(),
        }
    }

    /// Records `report` and runs the policy over the VIP, as the daemon's
    /// `on_report` does (it skips evaluations that cannot change anything;
    /// running them all changes no outcome).
    fn observe(&mut self, report: &Report) -> Vec<Change> {
        let i = report.id as usize;
        self.health[i] = report.snapshot.state;
        self.snapshots[i] = Some(report.snapshot.clone());
        let members: Vec<Member> = (0..self.addrs.len())
            .map(|i| {
                Member::from_snapshot(
                    self.addrs[i].to_string(),
                    1,
                    false,
                    self.health[i],
                    &self.spec,
                    self.snapshots[i].as_ref(),
                )
            })
            .collect();
        evaluate(
            &self.policy,
            &members,
            &mut self.states,
            &mut self.vip,
            std::time::Instant::now(),
        )
        .changes
    }

    fn all_serving(&self) -> bool {
        self.states
            .iter()
            .all(|s| s.placement == Placement::Serving)
    }
}

async fn detect_once(template: &CheckSpec, rep: usize) -> Result<Detection> {
    let mut backends = Vec::new();
    for i in 0..VIP_BACKENDS {
        let b = serve(BackendOptions {
            name: format!("b{}-{rep}", i + 1),
            listen: vec![SocketAddr::from((Ipv4Addr::LOCALHOST, 0))],
            admin: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        })
        .await
        .context("starting a lab backend on 127.0.0.1")?;
        backends.push(b);
    }
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.service_addrs()[0]).collect();
    let (mut scheduler, mut rx) = Scheduler::new(DEFAULT_MAX_CONCURRENT);
    for (id, addr) in (0u64..).zip(&addrs) {
        let spec = CheckSpec {
            port: addr.port(),
            ..template.clone()
        };
        scheduler.upsert(id, *addr, spec, HealthState::Unknown);
    }
    let mut vip = VipModel::new(template.clone(), addrs.clone());
    let hung = addrs[HUNG];

    // Every backend is probed within one interval and enters the table.
    let up_limit = template.interval + template.hang_timeout + Duration::from_secs(2);
    let up_deadline = Instant::now() + up_limit;
    while !vip.all_serving() {
        let report = timeout_at(up_deadline, rx.recv())
            .await
            .ok()
            .flatten()
            .with_context(|| {
                format!(
                    "the VIP's backends were not all serving within {}: {:?}",
                    Secs(up_limit),
                    vip.states.iter().map(|s| s.placement).collect::<Vec<_>>()
                )
            })?;
        vip.observe(&report);
    }

    // The hang starts at a random phase of the probe period, as it would in
    // production, so the repetitions sample the whole range.
    let phase = template
        .interval
        .mul_f64(rand::thread_rng().gen_range(0.0..1.0));
    let phase_end = Instant::now() + phase;
    while let Ok(Some(report)) = timeout_at(phase_end, rx.recv()).await {
        if !matches!(report.class, ProbeClass::Ok) {
            bail!(
                "healthy backend {} answered a probe {} before the hang",
                report.addr,
                report.class
            );
        }
        vip.observe(&report);
    }
    ensure!(
        vip.all_serving() && vip.vip.panic.is_none(),
        "the VIP is not steadily serving before the hang: {:?}",
        vip.states.iter().map(|s| s.placement).collect::<Vec<_>>()
    );

    let t0 = Instant::now();
    backends[HUNG]
        .set_fault(Fault::Hang)
        .await
        .context("switching the backend to hang")?;
    let (mut late, mut failures) = (0, 0);
    let mut out: Option<(Duration, Placement, String)> = None;
    let mut down: Option<(Duration, String)> = None;
    let limit = Bounds::of(template).schedule * 2 + Duration::from_secs(5);
    let deadline = Instant::now() + limit;
    while out.is_none() || down.is_none() {
        let report = timeout_at(deadline, rx.recv())
            .await
            .ok()
            .flatten()
            .with_context(|| {
                format!(
                    "hung backend {hung}: out of the table {}, down {} after {}",
                    out.is_some(),
                    down.is_some(),
                    Secs(limit)
                )
            })?;
        let at = Instant::now() - t0;
        let changes = vip.observe(&report);
        if report.id as usize == HUNG && out.is_none() {
            match report.class {
                ProbeClass::Late { .. } => late += 1,
                ref c if c.is_failure() => failures += 1,
                _ => {}
            }
        }
        if report.id as usize == HUNG
            && let Some(t) = &report.transition
        {
            ensure!(
                (t.from, t.to) == (HealthState::Up, HealthState::Down),
                "hung backend {hung}: expected up → down, got {} → {}: {}",
                t.from,
                t.to,
                t.reason
            );
            down = Some((at, t.reason.clone()));
        }
        for change in changes {
            match change {
                Change::Placement {
                    member,
                    from,
                    to,
                    reason,
                } if member == HUNG && out.is_none() && from.in_table() && !to.in_table() => {
                    out = Some((at, to, reason));
                }
                Change::Placement { member, to, .. } if member != HUNG && !to.in_table() => {
                    bail!("answering peer {} left the table as {to}", addrs[member])
                }
                Change::PanicEnter(why) => bail!("the VIP entered panic: {why}"),
                _ => {}
            }
        }
    }
    drop(scheduler);
    for b in backends {
        b.shutdown().await;
    }
    let (Some((out, out_as, out_reason)), Some((down, down_reason))) = (out, down) else {
        unreachable!("the loop ends when both are set")
    };
    Ok(Detection {
        out,
        out_as,
        out_reason,
        down,
        down_reason,
        late,
        failures,
    })
}

// ---------------------------------------------------------------------------
// Figure 2: CPU cost of probing 1,000 backends every second

async fn cost(quick: bool) -> Result<Vec<Row>> {
    let n = COST_BACKENDS;
    let window = Duration::from_secs(if quick { 5 } else { 15 });
    let warmup = Duration::from_secs(if quick { 1 } else { 3 });
    let spec = http_spec(|s| s.interval = Duration::from_secs(1));
    println!();
    println!("figure 2, probe cost: {n} backends probed every second");
    println!(
        "  check:   GET /health, interval {}, timeout {}, rise {}, fall {}, jitter ±{:.0}%, \
         max {DEFAULT_MAX_CONCURRENT} probes in flight",
        Compact(spec.interval),
        Compact(spec.timeout),
        spec.rise,
        spec.fall,
        spec.jitter * 100.0
    );
    println!(
        "  method:  {n} HTTP listeners on 127.0.0.1 in a child process (this binary, --serve \
         {n}); all Up, then {} of warm-up; CPU = getrusage(RUSAGE_SELF) user+system of this \
         process (prober and report consumer) over a {} window",
        Secs(warmup),
        Secs(window)
    );
    println!(
        "  caveat:  on loopback the kernel runs the receive side of a packet in the sender's \
         context, so each process pays for the other's TCP input of what it sends (the \
         servers' handling of SYNs and requests counts here, the prober's handling of \
         responses counts in the server): the system share is loopback's, not a NIC's"
    );

    let mut server = ServerChild::spawn(n).await?;
    let ports = server.ports.clone();
    let rss_before = rss_kib()?;
    let (mut scheduler, mut rx) = Scheduler::new(DEFAULT_MAX_CONCURRENT);
    for (id, port) in (0u64..).zip(&ports) {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, *port));
        let spec = CheckSpec {
            port: *port,
            ..spec.clone()
        };
        scheduler.upsert(id, addr, spec, HealthState::Unknown);
    }

    // Every backend is probed once within the first interval (the initial
    // delay is spread over it), which takes it Unknown → Up.
    let mut up = std::collections::HashSet::new();
    let up_limit = spec.interval + spec.timeout + Duration::from_secs(5);
    let deadline = Instant::now() + up_limit;
    while up.len() < n {
        match timeout_at(deadline, rx.recv()).await {
            Ok(Some(report)) => match &report.transition {
                Some(t) if t.to == HealthState::Up => {
                    up.insert(report.id);
                }
                Some(t) => bail!(
                    "backend {} went {} → {} during warm-up: {}",
                    report.addr,
                    t.from,
                    t.to,
                    t.reason
                ),
                None => {}
            },
            Ok(None) => bail!("the scheduler's report channel closed"),
            Err(_) => bail!(
                "only {} of {n} backends came up within {}",
                up.len(),
                Secs(up_limit)
            ),
        }
    }
    let warm_end = Instant::now() + warmup;
    while timeout_at(warm_end, rx.recv()).await.is_ok() {}

    let mut per_backend: HashMap<u64, u32> = HashMap::new();
    let mut failed: HashMap<String, u32> = HashMap::new();
    let cpu_start = cpu_time()?;
    let start = Instant::now();
    let end = start + window;
    while let Ok(received) = timeout_at(end, rx.recv()).await {
        let report = received.context("the scheduler's report channel closed")?;
        // Probes, not reports: an interim Late report is not a probe.
        let Some(result) = &report.result else {
            continue;
        };
        *per_backend.entry(report.id).or_default() += 1;
        if let Err(e) = &result.outcome {
            *failed.entry(e.code().to_owned()).or_default() += 1;
        }
    }
    let cpu = cpu_time()? - cpu_start;
    let wall = start.elapsed();
    let rss_after = rss_kib()?;
    drop(scheduler);
    server.stop().await;

    let probes: u32 = per_backend.values().sum();
    let probes_per_s = f64::from(probes) / wall.as_secs_f64();
    let expected_rate = n as f64 / spec.interval.as_secs_f64();
    let cpu_share = cpu.total().as_secs_f64() / wall.as_secs_f64();
    // Each backend should have been probed window/interval times, give or
    // take the tolerance and one probe at either edge of the window.
    let per_expected = window.as_secs_f64() / spec.interval.as_secs_f64();
    let per_low = (per_expected * (1.0 - RATE_TOLERANCE) - 1.0)
        .floor()
        .max(1.0) as u32;
    let per_high = (per_expected * (1.0 + RATE_TOLERANCE) + 1.0).ceil() as u32;
    let per_min = (0u64..n as u64)
        .map(|id| per_backend.get(&id).copied().unwrap_or(0))
        .min()
        .unwrap_or(0);
    let per_max = per_backend.values().copied().max().unwrap_or(0);
    let failures: u32 = failed.values().sum();
    let failed_text = if failed.is_empty() {
        "0 failed".to_owned()
    } else {
        let mut codes: Vec<_> = failed.iter().map(|(c, k)| format!("{k} {c}")).collect();
        codes.sort();
        format!("{failures} failed ({})", codes.join(", "))
    };
    let rate_ok = (probes_per_s - expected_rate).abs() <= expected_rate * RATE_TOLERANCE;
    let per_ok = (per_low..=per_high).contains(&per_min) && per_max <= per_high;

    Ok(vec![
        Row {
            figure: format!("probe CPU, {n} backends @ {}", Compact(spec.interval)),
            value: format!(
                "{:.1}% of one core ({:.1} ms CPU per s: {:.0}% user, {:.0}% system; \
                 {:.0} µs per probe)",
                cpu_share * 100.0,
                cpu_share * 1e3,
                100.0 * cpu.user.as_secs_f64() / cpu.total().as_secs_f64().max(1e-9),
                100.0 * cpu.system.as_secs_f64() / cpu.total().as_secs_f64().max(1e-9),
                cpu.total().as_secs_f64() * 1e6 / f64::from(probes.max(1))
            ),
            target: "none set (reported)".to_owned(),
            verdict: Verdict::Info,
        },
        Row {
            figure: format!("probe rate, {n} backends @ {}", Compact(spec.interval)),
            value: format!("{probes_per_s:.0} probes/s, {failed_text}"),
            target: format!(
                "{:.0} ± {:.0}%, 0 failed",
                expected_rate,
                RATE_TOLERANCE * 100.0
            ),
            verdict: Verdict::of(rate_ok && failures == 0),
        },
        Row {
            figure: format!("probes per backend in {}", Secs(window)),
            value: format!("min {per_min} / max {per_max}"),
            target: format!("each in {per_low}..={per_high}"),
            verdict: Verdict::of(per_ok),
        },
        Row {
            figure: "prober RSS".to_owned(),
            value: format!(
                "{:.1} MiB ({:+.1} MiB with the {n} backends)",
                rss_after as f64 / 1024.0,
                (rss_after as f64 - rss_before as f64) / 1024.0
            ),
            target: "none set (reported)".to_owned(),
            verdict: Verdict::Info,
        },
    ])
}

/// The cost figure's server process; killed when dropped.
struct ServerChild {
    child: tokio::process::Child,
    ports: Vec<u16>,
}

impl ServerChild {
    async fn spawn(n: usize) -> Result<Self> {
        let exe = std::env::current_exe().context("finding this benchmark's own executable")?;
        let mut child = tokio::process::Command::new(&exe)
            .arg("--serve")
            .arg(n.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} --serve {n}", exe.display()))?;
        let stdout = child.stdout.take().context("server child has no stdout")?;
        let mut line = String::new();
        let wait = Duration::from_secs(20);
        timeout(wait, BufReader::new(stdout).read_line(&mut line))
            .await
            .with_context(|| format!("server child did not list its ports within {}", Secs(wait)))?
            .context("reading the server child's ports")?;
        let ports = line
            .strip_prefix("ports ")
            .with_context(|| format!("server child said {line:?}, expected \"ports …\""))?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<Vec<u16>, _>>()
            .with_context(|| format!("server child's port list {line:?}"))?;
        ensure!(
            ports.len() == n,
            "server child listed {} ports, expected {n}",
            ports.len()
        );
        Ok(Self { child, ports })
    }

    /// Closes the child's stdin (its signal to exit) and waits for it a
    /// little; kills it if it lingers.
    async fn stop(&mut self) {
        drop(self.child.stdin.take());
        if timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// `--serve N`: N HTTP listeners on 127.0.0.1 that answer any request with
/// 200 and close. Prints `ports P1 P2 …` once they are bound, then serves
/// until stdin closes (at most `SERVE_LIMIT`).
fn serve_main(n: usize) -> Result<()> {
    ensure!(n > 0, "--serve needs at least one listener");
    // One thread: the server's CPU must not crowd out the prober it serves.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the server's Tokio runtime")?;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    // A std thread, not tokio's stdin: it must not keep the runtime from
    // shutting down if the limit passes first.
    std::thread::spawn(move || {
        let mut sink = [0u8; 64];
        let mut stdin = io::stdin();
        while matches!(stdin.read(&mut sink), Ok(k) if k > 0) {}
        let _ = done_tx.send(());
    });
    let result = runtime.block_on(async move {
        let mut ports = Vec::with_capacity(n);
        for i in 0..n {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .await
                .with_context(|| format!("listener {} of {n}: binding 127.0.0.1:0", i + 1))?;
            ports.push(listener.local_addr()?.port().to_string());
            tokio::spawn(accept_loop(listener));
        }
        let mut out = io::stdout().lock();
        writeln!(out, "ports {}", ports.join(" ")).context("writing the port list")?;
        out.flush().context("writing the port list")?;
        drop(out);
        let _ = timeout(SERVE_LIMIT, done_rx).await;
        anyhow::Ok(())
    });
    runtime.shutdown_background();
    result
}

async fn accept_loop(listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(answer(stream));
            }
            // EMFILE and friends: back off instead of spinning.
            Err(_) => sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn answer(mut stream: TcpStream) {
    let exchange = async {
        let mut buf = Vec::with_capacity(512);
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            if buf.len() > 8 * 1024 {
                return;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(k) => buf.extend_from_slice(&chunk[..k]),
            }
        }
        if stream.write_all(HEALTH_RESPONSE).await.is_ok() {
            let _ = stream.shutdown().await;
        }
    };
    let _ = timeout(SERVE_REQUEST_WAIT, exchange).await;
}

// ---------------------------------------------------------------------------
// Figure 3 (hook): health change to data plane

/// Figure 3, to be wired to the daemon's table swap: the time from the probe
/// result that crosses `fall` to the data plane using the new table, with
/// 10, 100 and 1,000 backends behind a VIP.
///
/// `measure(n)` sets up `n` healthy backends, makes one cross `fall` as many
/// times as it likes, and returns one duration per time: from the report of
/// the Up→Down transition to the moment the data plane uses the rebuilt
/// table. Each count becomes one row judged on its max against `target`.
/// `run` does not call this yet, so nothing is printed for figure 3.
#[expect(
    dead_code,
    reason = "figure 3 hook: the lead wires it to the daemon's table swap"
)]
async fn table_switch_rows(
    target: Duration,
    mut measure: impl AsyncFnMut(usize) -> Result<Vec<Duration>>,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for n in SWITCH_BACKENDS {
        let samples = measure(n)
            .await
            .with_context(|| format!("figure 3 with {n} backends"))?;
        let summary = Summary::of(samples)
            .with_context(|| format!("figure 3 with {n} backends: no samples"))?;
        rows.push(Row {
            figure: format!(
                "fall crossed → data plane on new table, {n} backends (n={})",
                summary.n
            ),
            value: summary.to_string(),
            target: format!("max <= {}", Secs(target)),
            verdict: Verdict::of(summary.max <= target),
        });
    }
    Ok(rows)
}

// ---------------------------------------------------------------------------
// Process resources

/// CPU time of this process, all threads.
#[derive(Clone, Copy, Debug)]
struct CpuTime {
    user: Duration,
    system: Duration,
}

impl CpuTime {
    fn total(self) -> Duration {
        self.user + self.system
    }
}

impl std::ops::Sub for CpuTime {
    type Output = Self;
    fn sub(self, earlier: Self) -> Self {
        Self {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }
}

fn cpu_time() -> Result<CpuTime> {
    // SAFETY: rusage is plain integers, for which all-zero bytes are valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage for the duration of the call.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    if rc != 0 {
        return Err(io::Error::last_os_error()).context("getrusage(RUSAGE_SELF)");
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    Ok(CpuTime {
        user: tv(usage.ru_utime),
        system: tv(usage.ru_stime),
    })
}

/// Resident set size of this process now, in KiB.
fn rss_kib() -> Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .context("/proc/self/status has no readable VmRSS line")
}

/// Raises the soft RLIMIT_NOFILE towards `NOFILE_WANTED` (within the hard
/// limit): 1,000 listeners or probes exceed the usual soft limit of 1,024.
fn raise_nofile() -> Result<()> {
    let (soft, hard) =
        lb_user::daemon::raise_nofile_to(NOFILE_WANTED).context("raising RLIMIT_NOFILE")?;
    ensure!(
        soft >= (COST_BACKENDS as u64) * 2,
        "RLIMIT_NOFILE hard limit is {hard}, too low for {COST_BACKENDS} backends; raise it \
         (ulimit -Hn) to at least {}",
        COST_BACKENDS * 2
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments() {
        let parse = |s: &str| parse_args(s.split_whitespace().map(str::to_owned));
        let cases = [
            ("nothing", "", Some((false, None, None))),
            ("quick", "--quick", Some((true, None, None))),
            (
                "only cost",
                "--only cost --quick",
                Some((true, Some(Figure::Cost), None)),
            ),
            (
                "only with =",
                "--only=detection",
                Some((false, Some(Figure::Detection), None)),
            ),
            ("serve", "--serve 12", Some((false, None, Some(12)))),
            ("unknown figure", "--only speed", None),
            ("missing value", "--only", None),
            ("unknown flag", "--fast", None),
            ("bad count", "--serve many", None),
        ];
        for (name, line, want) in cases {
            let got = parse(line).ok().map(|a| (a.quick, a.only, a.serve));
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn bounds_of_the_default_profile() {
        let b = Bounds::of(&http_spec(|_| {}));
        // 3 × 2 s + 3 s + 50 ms; 3 × 2.2 s + 3 s + 50 ms;
        // 2.2 s + 2 × max(2.2 s, 1 s + 0.22 s) + 3 s + 50 ms (periods run
        // from the start of a probe; a failing one lasts the 3 s
        // hang_timeout, and until one has failed the period is interval).
        assert_eq!(b.nominal, Duration::from_millis(9_050));
        assert_eq!(b.jittered.as_millis(), 9_650);
        assert_eq!(b.schedule.as_millis(), 9_650);
    }

    #[test]
    fn out_of_table_bounds() {
        // (name, spec, out_nominal ms, out_jittered ms): fall × interval +
        // timeout, and fall × interval × 1.1 + timeout + 50 ms.
        let cases = [
            ("default", http_spec(|_| {}), 7_000, 7_650),
            (
                "fast: issue 7's 0.5 s",
                http_spec(|s| {
                    s.interval = Duration::from_millis(200);
                    s.timeout = Duration::from_millis(100);
                    s.hang_timeout = Duration::from_millis(300);
                    s.fall = 2;
                }),
                500,
                590,
            ),
            ("no jitter", http_spec(|s| s.jitter = 0.0), 7_000, 7_050),
        ];
        for (name, spec, nominal, jittered) in cases {
            let b = Bounds::of(&spec);
            assert_eq!(b.out_nominal.as_millis(), nominal, "{name}");
            assert_eq!(b.out_jittered.as_millis(), jittered, "{name}");
        }
    }

    #[test]
    fn fast_profile_target_is_the_nominal_bound() {
        let profiles = detection_profiles(false);
        let fast = profiles
            .iter()
            .find(|p| p.name == "fast")
            .expect("fast profile");
        assert_eq!(fast.target.map(|(t, _)| t), Some(FAST_TARGET));
        assert_eq!(Bounds::of(&fast.spec).out_nominal, FAST_TARGET);
        assert_eq!(fast.reps, 20);
    }

    #[test]
    fn summary_median() {
        let ms = |v: &[u64]| v.iter().map(|&m| Duration::from_millis(m)).collect();
        let cases = [
            ("odd", ms(&[30, 10, 20]), Some((10, 20, 30))),
            ("even", ms(&[40, 10, 20, 30]), Some((10, 25, 40))),
            ("one", ms(&[7]), Some((7, 7, 7))),
            ("none", Vec::new(), None),
        ];
        for (name, samples, want) in cases {
            let got = Summary::of(samples).map(|s| {
                (
                    s.min.as_millis() as u64,
                    s.median.as_millis() as u64,
                    s.max.as_millis() as u64,
                )
            });
            assert_eq!(got, want, "{name}");
        }
    }
}
