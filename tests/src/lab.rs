//! Helpers shared by the lab's end-to-end test files (`e2e.rs`,
//! `cascade.rs`) and the lab benchmarks: finding a fresh `xlb`, bringing a
//! lab up and tearing it down with a check that nothing is left, one lab at
//! a time, reading the client's timeline and xlb's events, and seed 003's
//! scenario ([`cascade`]).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard},
    thread,
    time::{Duration, Instant, SystemTime},
};

pub use lb_ctl::now_unix_ms;
use xlb_lab::{
    client::{LoadOptions, Report},
    scenario::{self, ClientRun, Event, EventKind, LabRun, RunOptions, StateFile, XlbConfig},
    topology::list_namespaces,
};

/// One lab at a time (within one test binary; cargo runs test binaries one
/// after another).
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    // A failed test poisons the lock; the next one still gets a clean lab.
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Newest modification time of the files under `paths` (recursively).
fn newest(paths: &[PathBuf]) -> Option<(SystemTime, PathBuf)> {
    let mut best: Option<(SystemTime, PathBuf)> = None;
    let mut stack: Vec<PathBuf> = paths.to_vec();
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&p) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        } else if let Ok(m) = meta.modified()
            && best.as_ref().is_none_or(|(t, _)| m > *t)
        {
            best = Some((m, p));
        }
    }
    best
}

/// The `xlb` binary to test. Cargo does not build it for this crate's tests
/// (it is another package's binary), so a stale one from an earlier build
/// would silently test old code: refuse binaries older than their sources.
pub fn xlb_binary() -> PathBuf {
    let xlb = scenario::find_xlb().unwrap_or_else(|e| panic!("{e}"));
    if std::env::var_os("XLB_BIN").is_some() {
        return xlb;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().unwrap_or(manifest);
    let backend = xlb.with_file_name("xlb-backend");
    let cases = [
        (
            &xlb,
            vec![
                "lb-user/src",
                "lb-user/build.rs",
                "lb-ebpf/src",
                "lb-common/src",
            ],
            "lb-user",
        ),
        (&backend, vec!["lab/src"], "xlb-lab"),
    ];
    for (bin, sources, package) in cases {
        let built = std::fs::metadata(bin)
            .and_then(|m| m.modified())
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e}; build it with `cargo build -p {package}`",
                    bin.display()
                )
            });
        let sources: Vec<PathBuf> = sources.iter().map(|s| root.join(s)).collect();
        if let Some((changed, file)) = newest(&sources)
            && changed > built
        {
            panic!(
                "{} is older than {}: rebuild with `cargo build -p lb-user -p xlb-lab` \
                 (without AYA_BUILD_SKIP), or set XLB_BIN to the binary to test",
                bin.display(),
                file.display()
            );
        }
    }
    xlb
}

/// Brings a lab up with xlb running `cfg` and waits for every backend.
pub fn up(prefix: &str, cfg: &XlbConfig) -> LabRun {
    up_lab(prefix, cfg, false)
}

/// [`up`], with the flooding client's namespace too (`{prefix}-fl`, see
/// `xlb_lab::topology::LabConfig::flooder`), for the abuse tests.
pub fn up_with_flooder(prefix: &str, cfg: &XlbConfig) -> LabRun {
    up_lab(prefix, cfg, true)
}

fn up_lab(prefix: &str, cfg: &XlbConfig, flooder: bool) -> LabRun {
    crate::require_root();
    let xlb = xlb_binary();
    let t0 = Instant::now();
    let opts = RunOptions {
        flooder,
        ..RunOptions::new(prefix, &xlb, &cfg.render())
    };
    let run = LabRun::up_with(opts).unwrap_or_else(|e| panic!("lab up: {e}"));
    eprintln!(
        "[{prefix}] lab up, every backend up, in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    run
}

/// Tears down and checks that nothing is left: no namespace of the prefix,
/// no pins of the instance.
pub fn teardown(run: LabRun) {
    let prefix = run.prefix().to_string();
    let instance = run.instance().to_string();
    run.shutdown()
        .unwrap_or_else(|e| panic!("[{prefix}] teardown: {e}"));
    let left: Vec<String> = list_namespaces()
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .collect();
    assert!(left.is_empty(), "[{prefix}] namespaces left: {left:?}");
    let pins = Path::new("/sys/fs/bpf/xlb").join(&instance);
    assert!(!pins.exists(), "[{prefix}] pins left in {}", pins.display());
}

/// Sleeps until the client's timeline reaches `at_ms` (or it finished).
pub fn wait_client_ms(client: &ClientRun, at_ms: u64) {
    while (client.elapsed().as_millis() as u64) < at_ms && !client.is_finished() {
        thread::sleep(Duration::from_millis(20));
    }
}

/// Failures by slice start, `(t_ms, failures)`, for messages.
pub fn failure_slices(report: &Report) -> Vec<(u64, u64)> {
    report
        .timeline
        .iter()
        .filter(|s| s.counts.failures() > 0)
        .map(|s| (s.t_ms, s.counts.failures()))
        .collect()
}

/// Answers of backend `name` in slices starting in `[from, to)`.
pub fn answered_by(report: &Report, name: &str, from: i64, to: i64) -> u64 {
    report
        .timeline
        .iter()
        .filter(|s| (from..to).contains(&(s.t_ms as i64)))
        .map(|s| s.per_backend.get(name).copied().unwrap_or(0))
        .sum()
}

/// `transition` events of `backend` in `vip`.
pub fn transitions<'a>(events: &'a [Event], vip: &str, backend: SocketAddr) -> Vec<&'a Event> {
    let b = backend.to_string();
    events
        .iter()
        .filter(|e| {
            e.kind == EventKind::Transition
                && e.vip.as_deref() == Some(vip)
                && e.backend.as_deref() == Some(b.as_str())
        })
        .collect()
}

/// Issue 7's cascade scenario (seed 003: a fleet slower than its health
/// check's timeout at peak), shared by the end-to-end tests (`cascade.rs`)
/// and its benchmark (`xlb-cascade-bench`), so both replay the same thing.
/// Allowed on top of the worst case the health settings give, for process
/// scheduling on a loaded 2-CPU machine and the status poll.
pub const DETECTION_MARGIN: Duration = Duration::from_secs(1);

/// How long after xlb's event the data plane may still send a new flow to
/// the old choice: the maps are written right after the event is recorded,
/// plus one client timeline slice.
pub const MAP_UPDATE_MARGIN_MS: i64 = 300;

/// Client request timeout of [`steady`] load.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(1);

/// Short connections and keep-alive connections against `target`.
pub fn steady(target: SocketAddr, duration: Duration) -> LoadOptions {
    LoadOptions {
        duration,
        rate: 100,
        keepalive: 6,
        keepalive_interval: Duration::from_millis(50),
        timeout: CLIENT_TIMEOUT,
        slice: Duration::from_millis(100),
        ..LoadOptions::new(target)
    }
}

pub mod cascade {
    use std::{net::SocketAddr, thread, time::Duration};

    use xlb_lab::{
        Fault,
        client::{LoadOptions, Report},
        scenario::{ClientRun, Event, Health, LabRun, Mode, Protection, Status, Vip, XlbConfig},
        topology,
    };

    use super::now_unix_ms;

    /// How stale `xlb status` counters may be (sampled once per 1 s tick).
    pub const COUNTER_TICK: Duration = Duration::from_millis(1500);

    /// How often `watch` polls `status` while a load runs.
    pub const POLL: Duration = Duration::from_millis(250);

    /// Seed 003: how late every backend answers during the slowdown.
    pub const SEED_SLOW: Duration = Duration::from_millis(2500);

    /// Seed 003's timeline: every backend slow from here (client time, ms)…
    pub const SLOW_FROM_MS: i64 = 5_000;

    /// … to here.
    pub const SLOW_UNTIL_MS: i64 = 20_000;

    /// The VIP of the scenarios: `api`, dsr-ipip, three backends.
    pub fn api() -> Vip {
        Vip::new("api", topology::VIP_V4.into(), 80, Mode::DsrIpip, 3)
    }

    /// A lab configuration with `api` as its only VIP.
    pub fn config(prefix: &str, health: Health, protection: Protection) -> XlbConfig {
        XlbConfig {
            health,
            protection,
            vips: vec![api()],
            ..XlbConfig::for_prefix(prefix)
        }
    }

    /// `interval = "2s", timeout = "1s", fall = 3` (rise 2), the issue's
    /// second profile; the lab also sets fast and down intervals to 2 s and
    /// no jitter.
    pub fn seed_profile() -> Health {
        Health {
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            fall: 3,
            ..Health::default()
        }
    }

    /// Seed 003's load: 50 new connections per second, one request each,
    /// with a timeout that a 2.5 s answer fits in even after one SYN
    /// retransmit (so a retransmit shows as such, not as a failure).
    pub fn seed_load(target: SocketAddr, duration: Duration) -> LoadOptions {
        LoadOptions {
            duration,
            rate: 50,
            keepalive: 0,
            timeout: Duration::from_secs(5),
            slice: Duration::from_millis(500),
            ..LoadOptions::new(target)
        }
    }

    pub fn set_all(run: &LabRun, fault: Fault) {
        for i in 1..=run.backend_count() {
            run.set_fault(i, fault)
                .unwrap_or_else(|e| panic!("setting {fault:?} on b{i}: {e}"));
        }
    }

    /// Polls `status` every [`POLL`] until the client finishes, passing each
    /// status and the client's timeline time to `f`. Returns how many polls.
    pub fn watch(run: &LabRun, client: &ClientRun, mut f: impl FnMut(i64, &Status)) -> usize {
        let mut polls = 0;
        while !client.is_finished() {
            let s = run
                .status()
                .unwrap_or_else(|e| panic!("status while the load runs: {e}"));
            f(client.timeline_ms(now_unix_ms()), &s);
            polls += 1;
            thread::sleep(POLL);
        }
        polls
    }

    /// What a replay of seed 003 saw: the client's report, the statuses
    /// polled (timeline ms, status), xlb's events, and the
    /// `drop_no_backend` counter before and after.
    pub struct Slowdown {
        pub report: Report,
        pub polls: Vec<(i64, Status)>,
        pub events: Vec<Event>,
        pub drops_before: u64,
        pub drops_after: u64,
    }

    /// Seed 003 in the lab: steady new connections for `run_for`, every
    /// backend [`SEED_SLOW`] late (probes included) from [`SLOW_FROM_MS`] to
    /// [`SLOW_UNTIL_MS`].
    pub fn seed_003(run: &LabRun, run_for: Duration) -> Slowdown {
        let p = run.prefix().to_string();
        let drops_before = run.counter("drop_no_backend").unwrap();
        let client = run
            .start_client(seed_load(api().target(), run_for))
            .unwrap();
        let mut polls = Vec::new();
        let mut slowed = false;
        let mut recovered = false;
        watch(run, &client, |t, s| {
            if !slowed && t >= SLOW_FROM_MS {
                set_all(
                    run,
                    Fault::Slow {
                        ms: SEED_SLOW.as_millis() as u64,
                    },
                );
                eprintln!(
                    "[{p}] every backend {} ms late at {t} ms",
                    SEED_SLOW.as_millis()
                );
                slowed = true;
            }
            if slowed && !recovered && t >= SLOW_UNTIL_MS {
                set_all(run, Fault::None);
                eprintln!("[{p}] back to normal at {t} ms");
                recovered = true;
            }
            polls.push((t, s.clone()));
        });
        assert!(
            slowed && recovered,
            "the load ended before the slowdown did"
        );
        let report = client.join().unwrap();
        thread::sleep(COUNTER_TICK);
        let drops_after = run.counter("drop_no_backend").unwrap();
        let events = run.events().unwrap();
        eprintln!("{}", report.render_text());
        Slowdown {
            report,
            polls,
            events,
            drops_before,
            drops_after,
        }
    }
}

/// Stops backend `i`'s decapsulator as a crash would (SIGKILL): its
/// application still answers on its own address, but every `dsr-ipip`
/// packet sent to it is lost.
pub fn kill_decap(run: &LabRun, i: usize) {
    let state = StateFile::load(run.work_dir())
        .unwrap()
        .expect("lab state file");
    let role = format!("decap-b{i}");
    let decap = state
        .procs
        .iter()
        .find(|p| p.role == role)
        .unwrap_or_else(|| panic!("{role} recorded"));
    run.lab().kill(decap.pid).unwrap();
}
