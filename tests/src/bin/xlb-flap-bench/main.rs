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
//! - latency p50 / p99 / max of both requests while quiet with every
//!   backend up (before the first flap, and 2 s after each return), quiet
//!   with every backend down (2 s after each fall: probes still fail 8,000
//!   times a second) and during the flaps (from the responder's stop or
//!   start to the status that shows every backend moved);
//! - per half flap, from the daemon's log (its 1,000-event memory cannot
//!   hold a flap of 4,000: what `xlb events` returned and lost is shown
//!   next to it): transitions, table rebuilds (a rebuild is logged with the
//!   first transition of the batch that caused it; health changes make no
//!   `table` event), transitions per rebuild, how long the flap took to
//!   apply (first to last transition, the daemon's clock) and the
//!   rebuilds' total and longest time.
//!
//! The host's load average is printed at start and end: the latencies
//! include waiting for a CPU. `--keep` keeps the daemon's log and
//! `samples.csv` (every answer: time, request, latency, phase).
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
    net::Ipv4Addr,
    os::unix::{net::UnixStream, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::{Mutex, MutexGuard, PoisonError},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_ctl::now_unix_ms;
use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};
use xlb_lab::scenario::{command_in, detach, find_xlb, log_tail};
use xlb_tests::{bench::print_command, netns::NetNs};

mod client;
mod report;

use client::{Client, Seen};
use report::{Phase, Window, load_average, print_flaps, print_latency, read_log, write_samples};

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
