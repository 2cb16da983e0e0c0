//! `xlb trace`: turns tracing on in the data plane's pinned
//! `XLB_TRACE_CFG` and flag (`XLB_TRACE_ON`), prints the records of
//! `XLB_TRACE` until `--count` or Ctrl-C, and turns it off again (a Drop
//! guard; a trace whose process is killed stops by itself when `until_ns`
//! passes, within [`TRACE_TTL`]).
//!
//! Every refresh writes the configuration, then sets the flag: a daemon
//! that restarts meanwhile clears the flag (aya writes a global's initial
//! value at load), and the trace resumes within [`TRACE_REFRESH`].
//!
//! It reads the pins directly rather than through the daemon: the records
//! need no daemon state, a hop through the control socket would copy every
//! record twice, and a trace works while the daemon restarts. It needs root,
//! as any access to pinned BPF maps does.
//!
//! One trace at a time: a ring buffer has one reader, and the filters are one
//! map entry, so a second `xlb trace` while the first one's `until_ns` lies
//! ahead and its process lives is refused, naming the first one's pid.

pub mod filter;
pub mod render;

use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use aya::maps::{Array, Map, MapData, RingBuf};
use lb_common::{
    BackendInfo, MAP_BACKENDS,
    trace::{MAP_TRACE_CONFIG, MAP_TRACE_EVENTS, PIN_TRACE_ON, TraceConfig, TraceEvent},
};

use crate::cli::trace::TraceArgs;
use crate::config;
use crate::daemon::persist;
use filter::TraceFilter;
use render::{TraceLine, addr_of};

/// How far ahead `xlb trace` sets `until_ns`; it pushes it forward every
/// [`TRACE_REFRESH`], so only a dead trace lets it pass.
pub const TRACE_TTL: Duration = Duration::from_secs(3);
pub const TRACE_REFRESH: Duration = Duration::from_secs(1);
/// How long the loop sleeps when the ring buffer is empty.
const POLL: Duration = Duration::from_millis(20);

/// A record of `XLB_TRACE`, if `bytes` holds one.
pub fn decode(bytes: &[u8]) -> Option<TraceEvent> {
    if bytes.len() < size_of::<TraceEvent>() {
        return None;
    }
    // SAFETY: long enough, and every byte pattern is a valid TraceEvent
    // (integers and byte arrays).
    Some(unsafe { bytes.as_ptr().cast::<TraceEvent>().read_unaligned() })
}

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write to.
    unsafe { libc::clock_gettime(clock, &mut t) };
    i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
}

/// `bpf_ktime_get_ns()` as userspace reads it: CLOCK_MONOTONIC, ns.
pub fn ktime_ns() -> u64 {
    u64::try_from(clock_ns(libc::CLOCK_MONOTONIC)).unwrap_or(0)
}

/// An active trace: the pinned maps, and tracing on until dropped.
pub struct Session {
    config: Array<MapData, TraceConfig>,
    on: Array<MapData, u32>,
    ring: RingBuf<MapData>,
    backends: Option<Array<MapData, BackendInfo>>,
    filter: TraceFilter,
    pid: u32,
}

/// Opens the pin `name` in `dir`, saying what to do when it is missing.
fn open_pin(dir: &Path, name: &str) -> anyhow::Result<Map> {
    let path = dir.join(name);
    if !path.exists() {
        bail!(
            "{} is missing: the data plane pinned in {} predates `xlb trace`; restart `xlb run` \
             with this xlb (a restart keeps every flow) to create it",
            path.display(),
            dir.display()
        );
    }
    let data = MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
    Map::from_map_data(data).with_context(|| format!("opening {}", path.display()))
}

impl Session {
    /// Opens the trace maps pinned in `dir` and turns tracing on with
    /// `filter`, unless another live trace holds them.
    pub fn open(dir: &Path, filter: TraceFilter) -> anyhow::Result<Self> {
        if !nix::unistd::geteuid().is_root() {
            bail!(
                "xlb trace reads the data plane's pinned maps ({}) and needs root; run it with sudo",
                dir.join(MAP_TRACE_CONFIG).display()
            );
        }
        if !dir.is_dir() {
            bail!(
                "no data plane is pinned at {}: is `xlb run` running for this instance? \
                 (choose another with --instance or --config)",
                dir.display()
            );
        }
        let config: Array<MapData, TraceConfig> = open_pin(dir, MAP_TRACE_CONFIG)?.try_into()?;
        let on: Array<MapData, u32> = open_pin(dir, PIN_TRACE_ON)?.try_into()?;
        let ring: RingBuf<MapData> = open_pin(dir, MAP_TRACE_EVENTS)?.try_into()?;
        let backends = open_pin(dir, MAP_BACKENDS)
            .ok()
            .and_then(|m| m.try_into().ok());
        let pid = std::process::id();
        // Checked before the session exists: its Drop would turn the other
        // trace off.
        let now = config
            .get(&0, 0)
            .context("reading the trace configuration")?;
        if now.until_ns > ktime_ns()
            && now.owner_pid != pid
            && Path::new(&format!("/proc/{}", now.owner_pid)).exists()
        {
            bail!(
                "another xlb trace (pid {}) is tracing this instance; one trace at a time (one \
                 ring buffer, one set of filters): stop that one first",
                now.owner_pid
            );
        }
        let mut s = Session {
            config,
            on,
            ring,
            backends,
            filter,
            pid,
        };
        // Records and losses a dead trace left behind are not this trace's.
        while s.ring.next().is_some() {}
        s.config
            .set(0, TraceConfig::default(), 0)
            .context("writing the trace configuration")?;
        s.refresh()?;
        Ok(s)
    }

    fn current(&self) -> anyhow::Result<TraceConfig> {
        self.config
            .get(&0, 0)
            .context("reading the trace configuration")
    }

    /// Pushes `until_ns` forward by [`TRACE_TTL`] (and writes the filters),
    /// then sets the flag: the data plane reads the configuration only
    /// once the flag is set, so it never sees the flag with a stale one.
    pub fn refresh(&mut self) -> anyhow::Result<()> {
        let until = ktime_ns() + TRACE_TTL.as_nanos() as u64;
        let mut c = self.filter.config(until, self.pid);
        // The entry is written whole: a loss the kernel counts between this
        // read and the write is itself lost (the report is a lower bound).
        c.lost = self.current()?.lost;
        self.config
            .set(0, c, 0)
            .context("writing the trace configuration")?;
        self.on.set(0, 1, 0).context("setting the trace flag")
    }

    /// The next record, if one is waiting.
    pub fn next_event(&mut self) -> Option<TraceEvent> {
        loop {
            let item = self.ring.next()?;
            if let Some(e) = decode(&item) {
                return Some(e);
            }
        }
    }

    /// The address of backend `id`, if the maps hold one.
    pub fn backend(&self, id: u16) -> Option<IpAddr> {
        let b = self.backends.as_ref()?.get(&u32::from(id), 0).ok()?;
        (b.state != 0).then(|| addr_of(&b.addr, b.family))
    }

    /// Records lost to a full ring buffer since this trace began.
    pub fn lost(&self) -> u64 {
        self.current().map_or(0, |c| c.lost)
    }
}

impl Drop for Session {
    /// Tracing off (the flag cleared, then `until_ns` 0): the data plane is
    /// back to one test per packet.
    fn drop(&mut self) {
        let _ = self.on.set(0, 0, 0);
        let _ = self.config.set(0, TraceConfig::default(), 0);
    }
}

/// The pin directory of the instance `args` names (default: `default`).
fn pin_dir(args: &TraceArgs) -> anyhow::Result<PathBuf> {
    let instance = config::instance_of(args.instance.as_deref(), args.config.as_deref())?;
    Ok(persist::pin_dir(&instance))
}

/// `xlb trace`: prints traced packets until `--count` or Ctrl-C (or
/// SIGTERM), then turns tracing off.
pub async fn run(args: &TraceArgs) -> anyhow::Result<()> {
    let dir = pin_dir(args)?;
    let mut session = Session::open(&dir, args.filter())?;
    let offset = clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_MONOTONIC);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut printed = 0u64;
    let mut refreshed = Instant::now();
    let mut out = std::io::stdout();
    'outer: loop {
        while let Some(e) = session.next_event() {
            let line = TraceLine::new(&e, offset, session.backend(e.backend));
            let text = if args.json {
                serde_json::to_string(&line)?
            } else {
                line.render()
            };
            // A closed pipe (`| head`) ends the trace like --count.
            if writeln!(out, "{text}").is_err() {
                break 'outer;
            }
            printed += 1;
            if args.count.is_some_and(|n| printed >= n) {
                break 'outer;
            }
        }
        if refreshed.elapsed() >= TRACE_REFRESH {
            session.refresh()?;
            refreshed = Instant::now();
        }
        tokio::select! {
            _ = &mut ctrl_c => break,
            _ = term.recv() => break,
            () = tokio::time::sleep(POLL) => {}
        }
    }
    let lost = session.lost();
    drop(session);
    if lost > 0 {
        eprintln!("xlb trace: {lost} packets not shown: the ring buffer was full (use --sample N)");
    }
    Ok(())
}
