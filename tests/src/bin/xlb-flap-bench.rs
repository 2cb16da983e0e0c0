//! `cargo xtask bench`: a mass flap. One VIP of 4,000 backends, every one of
//! them failing at once and coming back, a few times, while a client asks
//! the daemon's control socket for news every 10 ms. A benchmark, not a
//! test: it prints what it measured and fails only when it cannot measure.
//!
//! Everything runs in one network namespace the benchmark creates and
//! removes (`xlbt-flap-<pid>-0`): a veth pair `xf0`/`xf1` for `xlb run` to
//! attach to, the backends' addresses (10.201.0.1, 10.201.0.2, …, added to
//! `lo` with one `ip -batch`) and one `xlb-backend` listening on
//! `0.0.0.0:80` that answers for all of them. Probes are direct TCP
//! connects (`via = "direct"`) every 500 ms, rise 2, fall 2. Stopping the
//! responder (SIGKILL) makes every probe fail at once (connection refused);
//! starting it again brings every backend back. The protections that would
//! change what a flap does are off (`min_healthy = 0`: no panic;
//! `flap_damping = false`: the second flap is not held down), so each flap
//! is 4,000 transitions.
//!
//! Meanwhile one client, on one connection, sends `events since N` every
//! 10 ms and every tenth time a `status` (of 4,000 backends: a few MiB)
//! instead, and records how long each answer took. The requests are
//! sequential: a stalled daemon shows as one slow answer, not many.
//!
//! Reported:
//! - latency p50 / p99 / max of both requests while quiet (before the first
//!   flap and between flaps, once everything settled) and during the flaps
//!   (from the responder's stop or start to the status that shows every
//!   backend moved);
//! - per flap: transitions, table rebuilds (a rebuild is carried by the
//!   first event of the batch that caused it: `table_build_us` set; the
//!   daemon emits no `table` event for health changes), transitions per
//!   rebuild, how long the flap took to apply (first to last transition
//!   event, the daemon's clock) and the rebuilds' total and longest time.
//!
//! Usage: `xlb-flap-bench [--backends N] [--flaps N] [--interval-ms N]
//! [--kind tcp|http]` (as root, with `xlb` and `xlb-backend` built in
//! release next to it: `cargo xtask bench --bin xlb-flap-bench` does it).

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]
#![allow(clippy::print_stdout, reason = "a benchmark's report goes to stdout")]

use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    net::Ipv4Addr,
    os::unix::{net::UnixStream, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_ctl::{Event, EventKind, Request, Response, now_unix_ms, parse_response};
use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};
use xlb_lab::scenario::{command_in, detach, find_xlb, log_tail};
use xlb_tests::{bench::print_command, netns::NetNs};

const USAGE: &str =
    "usage: xlb-flap-bench [--backends N] [--flaps N] [--interval-ms N] [--kind tcp|http] [--keep]
  --backends N     backends of the one VIP (default 4000, at most 4000)
  --flaps N        down-and-up cycles (default 3)
  --interval-ms N  probe interval, also the probe timeout (default 500)
  --kind K         probe kind, tcp (default) or http
  --keep           keep the daemon's log and samples.csv (every answer's latency)";

/// How often the client asks.
const PERIOD: Duration = Duration::from_millis(10);
/// Every this many requests, a `status` instead of `events since N`.
const STATUS_EVERY: u64 = 10;
/// Bound on one answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Quiet time measured before the first flap.
const QUIET: Duration = Duration::from_secs(5);
/// Quiet time measured after each half flap, once it is applied.
const SETTLE: Duration = Duration::from_secs(2);
/// Bound on every backend coming up at start (4,000 probes to schedule
/// on a loaded machine).
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on one half flap being applied.
const FLAP_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on a process stopping after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);
const VIP_NAME: &str = "flap";
const MAX_BACKENDS: usize = 4000;

struct Opts {
    backends: usize,
    flaps: usize,
    interval_ms: u64,
    kind: String,
    /// Keep the work directory (logs, samples.csv).
    keep: bool,
}

fn parse_args() -> Result<Opts> {
    let mut o = Opts {
        backends: MAX_BACKENDS,
        flaps: 3,
        interval_ms: 500,
        kind: "tcp".to_string(),
        keep: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .with_context(|| format!("{a} needs a value\n{USAGE}"))
        };
        let number = |v: String| -> Result<u64> {
            v.parse()
                .with_context(|| format!("{a} {v:?}: not a number\n{USAGE}"))
        };
        match a.as_str() {
            "--backends" => o.backends = number(value()?)? as usize,
            "--flaps" => o.flaps = number(value()?)? as usize,
            "--interval-ms" => o.interval_ms = number(value()?)?,
            "--kind" => o.kind = value()?,
            "--keep" => o.keep = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => bail!("unknown argument {a:?}\n{USAGE}"),
        }
    }
    if !(1..=MAX_BACKENDS).contains(&o.backends) || o.flaps == 0 || o.interval_ms < 50 {
        bail!("--backends 1..={MAX_BACKENDS}, --flaps ≥ 1 and --interval-ms ≥ 50\n{USAGE}");
    }
    if o.kind != "tcp" && o.kind != "http" {
        bail!("--kind {:?}: use tcp or http\n{USAGE}", o.kind);
    }
    Ok(o)
}

/// Backend `i` (0-based): 10.201.0.1 … 10.201.0.250, 10.201.1.1, …
fn backend_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 201, (i / 250) as u8, (i % 250 + 1) as u8)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The configuration `xlb run` gets.
fn config(o: &Opts, instance: &str, socket: &Path) -> String {
    let ms = o.interval_ms;
    let mut out = format!(
        "[daemon]\ninterface = \"xf0\"\nxdp_mode = \"native\"\ninstance = \"{instance}\"\n\
         control_socket = \"{}\"\nmetrics_address = \"\"\nconntrack_size = 65536\n\n\
         [health_check]\nkind = \"{}\"\nvia = \"direct\"\ninterval = \"{ms}ms\"\n\
         timeout = \"{ms}ms\"\nfast_interval = \"{ms}ms\"\ndown_interval = \"{ms}ms\"\n\
         rise = 2\nfall = 2\n\n\
         [protection]\nmin_healthy = 0\nflap_damping = false\n\n\
         [[vip]]\nname = \"{VIP_NAME}\"\naddress = \"10.100.0.1\"\nport = 80\nmode = \"dsr-ipip\"\n",
        socket.display(),
        o.kind
    );
    for i in 0..o.backends {
        out.push_str(&format!(
            "\n[[vip.backend]]\naddress = \"{}\"\n",
            backend_ip(i)
        ));
    }
    out
}

/// A process started in the namespace, in its own process group: stopped
/// (SIGTERM, SIGKILL after [`STOP_GRACE`]) when dropped.
struct Proc {
    child: Child,
    what: String,
    log: PathBuf,
}

impl Proc {
    fn spawn(ns: &str, program: &Path, args: &[&str], log: &Path, what: &str) -> Result<Proc> {
        let mut cmd = command_in(ns, program)?;
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .env("RUST_LOG", "info")
            .process_group(0);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {what} ({})", program.display()))?;
        Ok(Proc {
            child,
            what: what.to_string(),
            log: log.to_path_buf(),
        })
    }

    fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            other => bail!(
                "{} exited ({other:?}); last lines of {}:\n{}",
                self.what,
                self.log.display(),
                log_tail(&self.log)
            ),
        }
    }

    /// `sig` to the group, then SIGKILL if it is still there after the grace.
    fn stop(&mut self, sig: Signal) {
        let pgid = Pid::from_raw(self.child.id() as i32);
        let _ = killpg(pgid, sig);
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            thread::sleep(Duration::from_millis(10));
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = killpg(pgid, Signal::SIGKILL);
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.stop(Signal::SIGTERM);
        }
    }
}

/// What `xlb run` of the instance leaves outside the namespace: removed on
/// drop (after the daemon stopped).
struct Instance {
    xlb: PathBuf,
    name: String,
    socket: PathBuf,
    /// Cleaned already (by [`Run::shutdown`]).
    cleaned: bool,
}

impl Instance {
    fn pin_dir(&self) -> PathBuf {
        Path::new("/sys/fs/bpf/xlb").join(&self.name)
    }

    /// Detaches and unpins; an error names what is left.
    fn clean(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.cleaned, true) {
            return Ok(());
        }
        let detached = detach(&self.xlb, &self.name);
        let _ = fs::remove_file(&self.socket);
        if self.pin_dir().exists() {
            let _ = fs::remove_dir_all(self.pin_dir());
        }
        detached.with_context(|| format!("xlb detach --instance {}", self.name))?;
        if self.pin_dir().exists() {
            bail!(
                "{} is still there; remove it by hand",
                self.pin_dir().display()
            );
        }
        Ok(())
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Err(e) = self.clean() {
            eprintln!("xlb-flap-bench: cleaning up instance {}: {e:#}", self.name);
        }
    }
}

/// Which request a sample is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ask {
    Events,
    Status,
}

struct Sample {
    at: Instant,
    ask: Ask,
    latency: Duration,
}

/// What the client saw.
#[derive(Default)]
struct Seen {
    samples: Vec<Sample>,
    events: Vec<Event>,
    /// Sequence numbers the daemon dropped from its 1,000-event log before
    /// the client asked: (first missing, last missing).
    gaps: Vec<(u64, u64)>,
    last_seq: u64,
    error: Option<String>,
}

struct Shared {
    seen: Mutex<Seen>,
    /// Backends in the VIP's table per the latest status; `u32::MAX` before one.
    up: AtomicU32,
    stop: AtomicBool,
}

/// The client thread; stopped and joined on drop.
struct Client {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Client {
    fn start(socket: &Path) -> Client {
        let shared = Arc::new(Shared {
            seen: Mutex::new(Seen::default()),
            up: AtomicU32::new(u32::MAX),
            stop: AtomicBool::new(false),
        });
        let (s, path) = (Arc::clone(&shared), socket.to_path_buf());
        let thread = thread::spawn(move || {
            if let Err(e) = client_loop(&path, &s) {
                lock(&s.seen).error = Some(format!("{e:#}"));
            }
        });
        Client {
            shared,
            thread: Some(thread),
        }
    }

    fn up(&self) -> Option<u32> {
        Some(self.shared.up.load(Ordering::Relaxed)).filter(|&n| n != u32::MAX)
    }

    fn last_seq(&self) -> u64 {
        lock(&self.shared.seen).last_seq
    }

    fn check(&self) -> Result<()> {
        match &lock(&self.shared.seen).error {
            Some(e) => bail!("control client: {e}"),
            None => Ok(()),
        }
    }

    /// Stops the thread and returns what it saw.
    fn finish(mut self) -> Seen {
        self.join();
        std::mem::take(&mut *lock(&self.shared.seen))
    }

    fn join(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.join();
    }
}

/// One request every [`PERIOD`] on one connection until told to stop.
fn client_loop(socket: &Path, shared: &Shared) -> Result<()> {
    let stream = UnixStream::connect(socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let mut next = Instant::now();
    let mut line = Vec::new();
    for n in 0u64.. {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let ask = if n % STATUS_EVERY == 0 {
            Ask::Status
        } else {
            Ask::Events
        };
        let req = match ask {
            Ask::Status => Request::Status,
            Ask::Events => Request::Events {
                since_seq: Some(lock(&shared.seen).last_seq),
                follow: false,
            },
        };
        line.clear();
        let at = Instant::now();
        writer.write_all(req.to_line().as_bytes())?;
        reader.read_until(b'\n', &mut line).with_context(|| {
            format!("waiting for the answer to {req} (bound {REQUEST_TIMEOUT:?})")
        })?;
        let latency = at.elapsed();
        if line.last() != Some(&b'\n') {
            bail!("the daemon closed the connection");
        }
        let resp = parse_response(&line).map_err(anyhow::Error::msg)?;
        record(shared, Sample { at, ask, latency }, resp)?;
        next += PERIOD;
        let now = Instant::now();
        match next.checked_duration_since(now) {
            Some(d) => thread::sleep(d),
            None => next = now,
        }
    }
    Ok(())
}

fn record(shared: &Shared, sample: Sample, resp: Response) -> Result<()> {
    let mut seen = lock(&shared.seen);
    seen.samples.push(sample);
    match resp {
        Response::Events(events) => {
            if let Some(first) = events.first()
                && first.seq > seen.last_seq + 1
            {
                let gap = (seen.last_seq + 1, first.seq - 1);
                seen.gaps.push(gap);
            }
            if let Some(last) = events.last() {
                seen.last_seq = last.seq;
            }
            seen.events.extend(events);
        }
        Response::Status(s) => {
            let up = s.vips.iter().find(|v| v.name == VIP_NAME);
            shared
                .up
                .store(up.map_or(0, |v| v.backends_up), Ordering::Relaxed);
        }
        Response::Error { message } => bail!("the daemon answered an error: {message}"),
        other => bail!("unexpected answer {other:?}"),
    }
    Ok(())
}

/// A stretch of the run, for sorting samples and events.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing changing, every backend up.
    Quiet,
    /// Nothing changing, every backend down (still probed, failing).
    QuietDown,
    /// Every backend going down.
    Down,
    /// Every backend coming back.
    Up,
}

impl Phase {
    fn is_flap(self) -> bool {
        matches!(self, Phase::Down | Phase::Up)
    }

    fn label(self) -> &'static str {
        match self {
            Phase::Quiet => "quiet",
            Phase::QuietDown => "quiet_down",
            Phase::Down => "down",
            Phase::Up => "up",
        }
    }
}

struct Window {
    phase: Phase,
    /// 1-based flap number (0 for the first quiet stretch).
    flap: usize,
    start: Instant,
    end: Instant,
    /// Events with seq in (seq_from, seq_to] belong to it (half flaps
    /// only: with the quiet settling after them).
    seq_from: u64,
    seq_to: u64,
    /// The same span on the daemon's clock (ms since the Unix epoch), for
    /// the lines of its log.
    from_unix_ms: u64,
    to_unix_ms: u64,
}

/// Everything the run holds; dropped in field order: the client, the
/// responder, the daemon, the instance's pins, the namespace, the work
/// directory (kept if the run failed).
struct Run {
    client: Option<Client>,
    responder: Option<Proc>,
    daemon: Option<Proc>,
    instance: Instance,
    ns: NetNs,
    work: PathBuf,
    backend_bin: PathBuf,
    backends: usize,
}

impl Run {
    fn up(o: &Opts) -> Result<Run> {
        let xlb = find_xlb()?;
        let backend_bin = xlb.with_file_name("xlb-backend");
        if !backend_bin.is_file() {
            bail!(
                "{} not found; build it with `cargo build --release -p xlb-lab`",
                backend_bin.display()
            );
        }
        let pid = std::process::id();
        let work = std::env::temp_dir().join(format!("xlb-flap-bench-{pid}"));
        fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
        fs::create_dir_all("/run/xlb").context("creating /run/xlb")?;
        let instance = Instance {
            xlb: xlb.clone(),
            name: format!("flapbench{pid}"),
            socket: PathBuf::from(format!("/run/xlb/flapbench-{pid}.sock")),
            cleaned: false,
        };
        let ns = NetNs::new("flap")?;
        let mut run = Run {
            client: None,
            responder: None,
            daemon: None,
            instance,
            ns,
            work,
            backend_bin,
            backends: o.backends,
        };
        run.wire()?;
        run.start_responder()?;
        run.start_daemon(o)?;
        Ok(run)
    }

    /// The veth `xlb run` attaches to and every backend address on `lo`.
    fn wire(&self) -> Result<()> {
        let ns = &self.ns;
        ns.ip(&["link", "add", "xf0", "type", "veth", "peer", "name", "xf1"])?;
        ns.ip(&["addr", "add", "10.0.0.1/24", "dev", "xf0"])?;
        ns.ip(&["link", "set", "xf0", "up"])?;
        ns.ip(&["link", "set", "xf1", "up"])?;
        let batch: String = (0..self.backends)
            .map(|i| format!("address add {}/32 dev lo\n", backend_ip(i)))
            .collect();
        let path = self.work.join("addresses.batch");
        fs::write(&path, batch).with_context(|| format!("writing {}", path.display()))?;
        ns.ip(&["-batch", &path.display().to_string()])?;
        Ok(())
    }

    fn start_responder(&mut self) -> Result<()> {
        let args = [
            "--name",
            "all",
            "--listen",
            "0.0.0.0:80",
            "--admin",
            "127.0.0.1:9000",
        ];
        let log = self.work.join("responder.log");
        let p = Proc::spawn(
            self.ns.name(),
            &self.backend_bin,
            &args,
            &log,
            "xlb-backend",
        )?;
        self.responder = Some(p);
        Ok(())
    }

    fn start_daemon(&mut self, o: &Opts) -> Result<()> {
        let path = self.work.join("xlb.toml");
        let text = config(o, &self.instance.name, &self.instance.socket);
        fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        let log = self.work.join("xlb-run.log");
        let args = ["run", "--config", &path.display().to_string()].map(String::from);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut daemon = Proc::spawn(self.ns.name(), &self.instance.xlb, &args, &log, "xlb run")?;
        let deadline = Instant::now() + START_TIMEOUT;
        while UnixStream::connect(&self.instance.socket).is_err() {
            daemon.check_alive()?;
            if Instant::now() >= deadline {
                bail!(
                    "xlb run did not answer within {START_TIMEOUT:?}:\n{}",
                    log_tail(&log)
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
        self.daemon = Some(daemon);
        self.client = Some(Client::start(&self.instance.socket));
        Ok(())
    }

    fn client(&self) -> &Client {
        self.client.as_ref().expect("started with the daemon")
    }

    /// Waits until the VIP has `want` backends in its table.
    fn wait_up(&mut self, want: usize, timeout: Duration) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            self.client().check()?;
            if let Some(d) = self.daemon.as_mut() {
                d.check_alive()?;
            }
            let up = self.client().up();
            if up == Some(want as u32) {
                return Ok(Instant::now());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{want} backends in the table not reached within {timeout:?}; last status said {up:?}"
                );
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// A quiet stretch of `d` (`phase`: every backend up or down).
    fn quiet(&self, flap: usize, d: Duration, phase: Phase) -> Window {
        let (start, seq, from_unix_ms) = (Instant::now(), self.client().last_seq(), now_unix_ms());
        thread::sleep(d);
        Window {
            phase,
            flap,
            start,
            end: Instant::now(),
            seq_from: seq,
            seq_to: self.client().last_seq(),
            from_unix_ms,
            to_unix_ms: now_unix_ms(),
        }
    }

    /// Every backend down (the responder killed) or up (started again),
    /// until the table shows it; the settling after it is a quiet window.
    fn half_flap(&mut self, flap: usize, phase: Phase) -> Result<[Window; 2]> {
        let (start, seq_from, from_unix_ms) =
            (Instant::now(), self.client().last_seq(), now_unix_ms());
        let want = match phase {
            Phase::Down => {
                if let Some(mut r) = self.responder.take() {
                    r.stop(Signal::SIGKILL);
                }
                0
            }
            _ => {
                self.start_responder()?;
                self.backends
            }
        };
        let end = self.wait_up(want, FLAP_TIMEOUT)?;
        let still = if phase == Phase::Down {
            Phase::QuietDown
        } else {
            Phase::Quiet
        };
        let settle = self.quiet(flap, SETTLE, still);
        let w = Window {
            phase,
            flap,
            start,
            end,
            seq_from,
            seq_to: settle.seq_to,
            from_unix_ms,
            to_unix_ms: settle.to_unix_ms,
        };
        Ok([w, settle])
    }

    fn measure(&mut self, o: &Opts) -> Result<Vec<Window>> {
        self.wait_up(self.backends, START_TIMEOUT)?;
        let mut windows = vec![self.quiet(0, QUIET, Phase::Quiet)];
        for flap in 1..=o.flaps {
            windows.extend(self.half_flap(flap, Phase::Down)?);
            windows.extend(self.half_flap(flap, Phase::Up)?);
        }
        Ok(windows)
    }

    /// Stops everything and checks that nothing is left.
    fn shutdown(mut self) -> Result<Seen> {
        let seen = self.client.take().expect("client").finish();
        drop(self.responder.take());
        drop(self.daemon.take());
        self.instance.clean()?;
        Ok(seen)
    }
}

/// `/proc/loadavg`'s first three fields: how busy the host was (the
/// latencies include waiting for a CPU).
fn load_average() -> String {
    fs::read_to_string("/proc/loadavg").map_or_else(
        |e| format!("unknown ({e})"),
        |s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    )
}

/// Every answer: ms since the first, request, latency (ms), phase.
fn write_samples(path: &Path, seen: &Seen, windows: &[Window]) -> Result<()> {
    let Some(t0) = seen.samples.first().map(|s| s.at) else {
        return Ok(());
    };
    let mut out = String::from("t_ms,request,latency_ms,phase\n");
    for s in &seen.samples {
        let phase = windows
            .iter()
            .find(|w| in_window(w, s))
            .map_or("-", |w| w.phase.label());
        out.push_str(&format!(
            "{:.1},{},{:.3},{phase}\n",
            (s.at - t0).as_secs_f64() * 1e3,
            if s.ask == Ask::Status {
                "status"
            } else {
                "events"
            },
            s.latency.as_secs_f64() * 1e3
        ));
    }
    fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// p50, p99, max of `v` (sorted here), ms.
fn percentiles(v: &mut [Duration]) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    Some((at(0.5), at(0.99), at(1.0)))
}

fn in_window(w: &Window, s: &Sample) -> bool {
    s.at >= w.start && s.at < w.end
}

fn latency_row(label: &str, seen: &Seen, windows: &[&Window], ask: Ask) {
    let mut v: Vec<Duration> = seen
        .samples
        .iter()
        .filter(|s| s.ask == ask && windows.iter().any(|w| in_window(w, s)))
        .map(|s| s.latency)
        .collect();
    match percentiles(&mut v) {
        Some((p50, p99, max)) => println!(
            "{label:<26} {:>8} {p50:>9.2} {p99:>9.2} {max:>9.2}",
            v.len()
        ),
        None => println!("{label:<26} {:>8}", 0),
    }
}

fn print_latency(seen: &Seen, windows: &[Window]) {
    let of =
        |p: fn(Phase) -> bool| -> Vec<&Window> { windows.iter().filter(|w| p(w.phase)).collect() };
    let quiet = of(|p| p == Phase::Quiet);
    let down = of(|p| p == Phase::QuietDown);
    let flap = of(Phase::is_flap);
    println!();
    println!(
        "control requests, one connection, one every {PERIOD:?} (every {STATUS_EVERY}th a status):"
    );
    println!(
        "{:<26} {:>8} {:>9} {:>9} {:>9}",
        "", "requests", "p50 ms", "p99 ms", "max ms"
    );
    for (ask, name) in [(Ask::Events, "events"), (Ask::Status, "status")] {
        latency_row(&format!("{name}, quiet, all up"), seen, &quiet, ask);
        latency_row(&format!("{name}, quiet, all down"), seen, &down, ask);
        latency_row(&format!("{name}, during flaps"), seen, &flap, ask);
    }
}

/// A transition line of the daemon's log: when (ms since the Unix epoch),
/// and the table rebuild it carried (ms), if any. The log, unlike the
/// daemon's 1,000-event memory, has every one.
struct Logged {
    at_unix_ms: u64,
    build_ms: Option<f64>,
}

/// The transition lines of `xlb run`'s log (`backend up -> down: …`,
/// `…; table rebuilt in 12.34 ms (…)`), in order.
fn read_log(path: &Path) -> Result<Vec<Logged>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let rebuilt = |l: &str| {
        let rest = l.split("table rebuilt in ").nth(1)?;
        rest.split_whitespace().next()?.parse::<f64>().ok()
    };
    Ok(text
        .lines()
        .map(strip_ansi)
        .filter(|l| l.contains(" backend ") && l.contains(" -> "))
        .filter_map(|l| {
            let at_unix_ms = unix_ms_of(l.split_whitespace().next()?)?;
            Some(Logged {
                at_unix_ms,
                build_ms: rebuilt(&l),
            })
        })
        .collect())
}

/// `line` without terminal colour sequences (`ESC [ … m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `2026-12-01T16:35:10.123456Z` (the log's timestamps) as ms since the
/// Unix epoch.
fn unix_ms_of(ts: &str) -> Option<u64> {
    let (date, time) = ts.strip_suffix('Z')?.split_once('T')?;
    let num = |s: &str| s.parse::<i64>().ok();
    let d: Vec<i64> = date.split('-').map(num).collect::<Option<_>>()?;
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let t: Vec<i64> = hms.split(':').map(num).collect::<Option<_>>()?;
    let ms = num(&format!("{frac:0<3}")[..3])?;
    let ([y, m, day], [h, mi, sec]) = (d.as_slice(), t.as_slice()) else {
        return None;
    };
    // Days from 1970-01-01 to y-m-d (the proleptic Gregorian calendar).
    let y = if *m <= 2 { y - 1 } else { *y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    u64::try_from(((days * 24 + h) * 60 + mi) * 60_000 + sec * 1000 + ms).ok()
}

/// One half flap: transitions, rebuilds and their timing from the log;
/// events the daemon's memory dropped; the slowest control answer.
fn flap_row(seen: &Seen, log: &[Logged], w: &Window) {
    let lines: Vec<&Logged> = log
        .iter()
        .filter(|l| l.at_unix_ms >= w.from_unix_ms && l.at_unix_ms <= w.to_unix_ms)
        .collect();
    let builds: Vec<f64> = lines.iter().filter_map(|l| l.build_ms).collect();
    let first = lines.iter().map(|l| l.at_unix_ms).min();
    let last = lines.iter().map(|l| l.at_unix_ms).max();
    let applied = first.zip(last).map_or(0, |(f, l)| l - f);
    let lost: u64 = seen
        .gaps
        .iter()
        .filter(|(a, b)| *b > w.seq_from && *a <= w.seq_to)
        .map(|(a, b)| b.min(&w.seq_to) - a.max(&(w.seq_from + 1)) + 1)
        .sum();
    let retained = seen
        .events
        .iter()
        .filter(|e| e.seq > w.seq_from && e.seq <= w.seq_to && e.kind == EventKind::Transition)
        .count();
    let max_ms = seen
        .samples
        .iter()
        .filter(|s| in_window(w, s))
        .map(|s| s.latency.as_secs_f64() * 1e3)
        .fold(0.0, f64::max);
    println!(
        "{:>4} {:<5} {:>11} {:>8} {:>9.1} {:>10} {:>9.1} {:>9.2} {:>8.1} {:>6}/{:<6}",
        w.flap,
        if w.phase == Phase::Down { "down" } else { "up" },
        lines.len(),
        builds.len(),
        lines.len() as f64 / builds.len().max(1) as f64,
        applied,
        builds.iter().sum::<f64>(),
        builds.iter().copied().fold(0.0, f64::max),
        max_ms,
        retained,
        lost,
    );
}

fn print_flaps(seen: &Seen, log: &[Logged], windows: &[Window]) {
    println!();
    println!("per half flap (from the daemon's log, which has every transition):");
    println!(
        "{:>4} {:<5} {:>11} {:>8} {:>9} {:>10} {:>9} {:>9} {:>8} {:>7}",
        "flap",
        "",
        "transitions",
        "rebuilds",
        "trans/reb",
        "applied ms",
        "build ms",
        "max build",
        "ctl max",
        "events seen/lost"
    );
    for w in windows.iter().filter(|w| w.phase.is_flap()) {
        flap_row(seen, log, w);
    }
    println!(
        "applied ms: first to last transition event (daemon clock); build ms: all rebuilds' \
         time; ctl max: slowest control answer (ms) from the responder's stop/start to the \
         table showing it; events seen/lost: transition events `xlb events` returned, and \
         events its 1,000-event memory dropped before the client, asking every 10 ms, got them"
    );
}

fn main() -> Result<()> {
    let o = parse_args()?;
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "xlb-flap-bench creates a network namespace and loads XDP programs: run it as root (`cargo xtask bench --bin xlb-flap-bench` does)"
        );
    }
    print_command("xlb-flap-bench");
    println!(
        "one dsr-ipip VIP of {} backends (addresses on lo in a namespace, one responder on \
         0.0.0.0:80); {} probes via direct every {} ms, timeout {} ms, rise 2, fall 2; \
         min_healthy 0, flap_damping off; {} flaps (responder SIGKILLed, then restarted)",
        o.backends, o.kind, o.interval_ms, o.interval_ms, o.flaps
    );
    println!("load average at start: {}", load_average());
    let mut run = Run::up(&o)?;
    let work = run.work.clone();
    let windows = match run.measure(&o) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("xlb-flap-bench: logs kept in {}", work.display());
            return Err(e);
        }
    };
    let seen = run.shutdown()?;
    println!("load average at end:   {}", load_average());
    if let Some(e) = &seen.error {
        bail!("control client: {e}");
    }
    let log = read_log(&work.join("xlb-run.log"))?;
    write_samples(&work.join("samples.csv"), &seen, &windows)?;
    print_latency(&seen, &windows);
    print_flaps(&seen, &log, &windows);
    if o.keep {
        println!(
            "logs and samples.csv (every answer's latency) kept in {}",
            work.display()
        );
    } else {
        let _ = fs::remove_dir_all(&work);
    }
    Ok(())
}
