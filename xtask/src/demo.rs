//! `cargo xtask demo`: the incident xlb exists for, replayed in the lab.
//!
//! Three backends behind a VIP take steady traffic; backend 2's application
//! hangs (the kernel still completes TCP handshakes, the application answers
//! nothing); xlb's HTTP health checks notice within a few seconds and stop
//! sending it new connections; the application recovers and xlb brings it
//! back after `rise` good probes. The demo prints what happens as it happens,
//! then a timeline of the client's requests (per 500 ms: answered and failed
//! requests, and which backend answered), then `xlb status`.
//!
//! After the build it takes about 35 s: the lab comes up in a few seconds,
//! the load runs for 18 s, teardown takes a few more.

use std::{
    fmt::Write as _,
    net::SocketAddr,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use xlb_lab::{
    Fault,
    client::{LoadOptions, Report},
    scenario::{self, ClientRun, Event, LabRun, RunOptions},
};

use crate::lab::{self, Paths};

/// The lab's namespace prefix; `examples/lab.toml` names its instance and
/// socket after it, so `cargo xtask lab down` removes a kept demo.
const PREFIX: &str = "xlb";

/// The configuration the demo runs.
const CONFIG: &str = "examples/lab.toml";

/// The VIP of `examples/lab.toml` the load goes to.
const VIP: &str = "api";

/// The backend whose application hangs.
const HUNG: usize = 2;

/// Load before the hang, for a baseline.
const BASELINE: Duration = Duration::from_secs(3);

/// How long the demo waits for xlb to notice the hang before recovering
/// anyway (and saying that it did not notice).
const MAX_DETECTION: Duration = Duration::from_secs(10);

/// Load with backend 2 out of the table before it recovers.
const OUT_FOR: Duration = Duration::from_secs(3);

/// How long the demo waits for backend 2 to come back after recovering.
const MAX_RETURN: Duration = Duration::from_secs(8);

/// Length of the client run: baseline + detection (≈3 s) + `OUT_FOR` +
/// return (≈2 s) + a few seconds of everything healthy again.
const LOAD: Duration = Duration::from_secs(18);

/// Rows of the timeline.
const SLICE: Duration = Duration::from_millis(500);

/// How often the demo asks xlb for new events.
const POLL: Duration = Duration::from_millis(200);

pub(crate) fn run(keep: bool) -> Result<()> {
    let paths = Paths::find()?;
    let config_path = paths.root.join(CONFIG);
    let config = std::fs::read_to_string(&config_path)
        .with_context(|| format!("reading {}", config_path.display()))?;
    lab::build_then_become_root("the demo (network namespaces, XDP programs)", Some(true))?;
    let began = Instant::now();
    let xlb = paths.release_bin("xlb");
    let (run, target, hung) = bring_up(&paths, &xlb, &config, began)?;

    println!(
        "\n== Steady load on {target}: 200 new connections/s + 10 keep-alive connections, 1 s client timeout =="
    );
    let mut story = Story::new(&run)?;
    let client = run.start_client(LoadOptions {
        duration: LOAD,
        rate: 200,
        keepalive: 10,
        keepalive_interval: Duration::from_millis(100),
        timeout: Duration::from_secs(1),
        slice: SLICE,
        ..LoadOptions::new(target)
    })?;
    story.watch(&run, &client, BASELINE, |_| false)?;
    let moments = hang_and_recover(&run, &client, &mut story, hung, &config)?;
    let report = client.join()?;

    println!("\n== What the client saw (requests by start time; ok = answered, by backend) ==");
    print!("{}", timeline(&report, &story.marks));
    println!("\n== In short ==");
    print!("{}", summary(&report, &moments));
    println!("\n== xlb status ==");
    print!("{}", run.status_text()?);
    let took = began.elapsed();
    finish(run, keep, &xlb, target)?;
    println!("demo took {:.0} s after the build", took.as_secs_f64());
    Ok(())
}

/// Removes what a previous demo left, brings the lab up with xlb running
/// [`CONFIG`] and says so; returns the run, the VIP's address and the hung
/// backend's.
fn bring_up(
    paths: &Paths,
    xlb: &Path,
    config: &str,
    began: Instant,
) -> Result<(LabRun, SocketAddr, SocketAddr)> {
    let dir = paths.lab_dir(PREFIX);
    let (instance, _) = scenario::instance_and_socket(config);
    LabRun::down(PREFIX, &dir, xlb, &instance)
        .with_context(|| format!("removing the previous lab {PREFIX:?}"))?;

    println!("\n== The lab: a client, the LB host running xlb ({CONFIG}), backends b1, b2, b3 ==");
    let mut opts = RunOptions::new(PREFIX, xlb, config);
    opts.work_dir = Some(dir.clone());
    let run = LabRun::up_with(opts).with_context(|| {
        format!(
            "bringing up the lab (logs in {}; `cargo xtask lab down` cleans up)",
            lab::short(&dir)
        )
    })?;
    let status = run.status()?;
    let Some(vip) = status.vip(VIP) else {
        bail!(
            "{CONFIG} must define a VIP named {VIP:?}; it has {}",
            status.summary()
        );
    };
    let address: std::net::IpAddr = vip
        .address
        .parse()
        .with_context(|| format!("xlb status: VIP {VIP} has address {:?}", vip.address))?;
    let target = SocketAddr::new(address, vip.port);
    let hung = scenario::backend_addr(address, vip.port, HUNG);
    println!(
        "xlb is up after {:.1} s; every backend of {VIP} ({target}) passes its health checks.",
        began.elapsed().as_secs_f64()
    );
    println!(
        "health checks: {} {} every {}, timeout {}; down after fall = {} failures, up after rise = {} passes",
        setting(config, "kind"),
        setting(config, "path"),
        setting(config, "interval"),
        setting(config, "timeout"),
        setting(config, "fall"),
        setting(config, "rise"),
    );
    Ok((run, target, hung))
}

/// The incident: backend [`HUNG`] hangs, xlb takes it out, it recovers and
/// xlb takes it back; the load runs on to its end. Returns when each
/// happened.
fn hang_and_recover(
    run: &LabRun,
    client: &ClientRun,
    story: &mut Story,
    hung: SocketAddr,
    config: &str,
) -> Result<Moments> {
    run.set_fault(HUNG, Fault::Hang)?;
    let hang_ms = story.mark(
        client,
        format!(
            "b{HUNG} hangs: its application stops answering (the kernel still accepts connections)"
        ),
    );
    let is_hung = |e: &Event, to: &str| {
        e.kind == "transition"
            && e.vip.as_deref() == Some(VIP)
            && e.backend.as_deref() == Some(&hung.to_string())
            && e.to.as_deref() == Some(to)
    };
    // Out of the table: as a slow outlier among answering peers (after
    // `fall` late probes), or `down` (after `fall` probes reached
    // hang_timeout), whichever comes first.
    let detected = story.watch(run, client, ms(hang_ms) + MAX_DETECTION, |e| {
        is_hung(e, "ejected_slow") || is_hung(e, "down")
    })?;
    let detect_ms = detected.as_ref().map(|e| client.timeline_ms(e.at_unix_ms));
    let recover_at = match detect_ms {
        Some(d) => ms(d) + OUT_FOR,
        None => client.elapsed(),
    };
    story.watch(run, client, recover_at, |_| false)?;

    run.set_fault(HUNG, Fault::None)?;
    let recover_ms = story.mark(client, format!("b{HUNG} recovers"));
    let returned = story.watch(run, client, ms(recover_ms) + MAX_RETURN, |e| {
        is_hung(e, "up")
    })?;
    let return_ms = returned.as_ref().map(|e| client.timeline_ms(e.at_unix_ms));
    story.watch(run, client, LOAD + Duration::from_secs(3), |_| false)?;
    Ok(Moments {
        hang_ms,
        detect_ms,
        recover_ms,
        return_ms,
        reason: detected.map(|e| format!("{}: {}", e.to.as_deref().unwrap_or("out"), e.reason)),
        rise: setting(config, "rise"),
    })
}

/// Leaves the lab up (`--keep`), saying how to use and remove it, or
/// removes it.
fn finish(run: LabRun, keep: bool, xlb: &Path, target: SocketAddr) -> Result<()> {
    if keep {
        let socket = run.socket().to_path_buf();
        run.keep();
        println!(
            "\nthe lab is still up (--keep); e.g.\n  {s}{xlb} status --socket {sock}\n  \
             {s}ip netns exec {PREFIX}-cl curl http://{target}/api\n\
             remove it with `cargo xtask lab down`.",
            s = lab::sudo_prefix(),
            xlb = lab::short(xlb),
            sock = socket.display(),
        );
    } else {
        run.shutdown().context("tearing the lab down")?;
        println!("\nlab removed (run with --keep to leave it up).");
    }
    Ok(())
}

fn ms(t: i64) -> Duration {
    Duration::from_millis(t.max(0) as u64)
}

/// A `[health_check]` value of the configuration, for the printed summary.
fn setting(config: &str, key: &str) -> String {
    scenario::setting(config, "health_check", key).unwrap_or_else(|| "(default)".to_string())
}

/// What happened when, on the client's timeline, for the timeline and the
/// summary.
struct Story {
    /// The last event already shown.
    seen: u64,
    /// (client ms, text), in order.
    marks: Vec<(i64, String)>,
}

impl Story {
    /// Starts after the events the daemon already has (start, first probes).
    fn new(run: &LabRun) -> Result<Self> {
        let seen = run.events()?.iter().map(|e| e.seq).max().unwrap_or(0);
        Ok(Self {
            seen,
            marks: Vec::new(),
        })
    }

    /// Records and prints something the demo did; returns its client ms.
    fn mark(&mut self, client: &ClientRun, text: String) -> i64 {
        let at = client.elapsed().as_millis() as i64;
        println!("  t={:>5.1}s  {text}", at as f64 / 1000.0);
        self.marks.push((at, text));
        at
    }

    /// Prints xlb's events about backends as they come, until the client's
    /// clock reaches `until` or an event satisfies `stop` (returned).
    fn watch(
        &mut self,
        run: &LabRun,
        client: &ClientRun,
        until: Duration,
        mut stop: impl FnMut(&Event) -> bool,
    ) -> Result<Option<Event>> {
        loop {
            for e in run.events()? {
                if e.seq <= self.seen {
                    continue;
                }
                self.seen = e.seq;
                if !matches!(e.kind.as_str(), "transition" | "admin") {
                    continue;
                }
                let at = client.timeline_ms(e.at_unix_ms);
                let text = format!(
                    "xlb: {} {} → {}: {}",
                    e.backend.as_deref().unwrap_or("?"),
                    e.from.as_deref().unwrap_or("?"),
                    e.to.as_deref().unwrap_or("?"),
                    e.reason
                );
                println!("  t={:>5.1}s  {text}", at as f64 / 1000.0);
                self.marks.push((at, text));
                if stop(&e) {
                    return Ok(Some(e));
                }
            }
            // Past the end of the load nothing more is coming for the timeline.
            if client.elapsed() >= until || (client.is_finished() && until > LOAD) {
                return Ok(None);
            }
            thread::sleep(POLL);
        }
    }
}

/// The per-slice table, with the story's marks on the rows they fall in.
fn timeline(report: &Report, marks: &[(i64, String)]) -> String {
    let backends: Vec<String> = (1..=3).map(|i| format!("b{i}")).collect();
    let mut out = format!("{:>7} {:>6} {:>6}", "t", "ok", "failed");
    for b in &backends {
        let _ = write!(out, " {b:>5}");
    }
    out.push('\n');
    let slice_ms = report.slice_ms.max(1) as i64;
    for s in &report.timeline {
        let t = s.t_ms as i64;
        let _ = write!(
            out,
            "{:>6.1}s {:>6} {:>6}",
            t as f64 / 1000.0,
            s.counts.ok,
            s.counts.failures()
        );
        for b in &backends {
            let _ = write!(out, " {:>5}", s.per_backend.get(b).copied().unwrap_or(0));
        }
        let here: Vec<&str> = marks
            .iter()
            .filter(|(at, _)| (t..t + slice_ms).contains(at))
            .map(|(_, text)| text.as_str())
            .collect();
        if !here.is_empty() {
            let _ = write!(out, "   ← {}", here.join("; "));
        }
        out.push('\n');
    }
    out
}

/// Moments of the story, client ms.
struct Moments {
    hang_ms: i64,
    detect_ms: Option<i64>,
    recover_ms: i64,
    return_ms: Option<i64>,
    reason: Option<String>,
    /// `rise` of the configuration, as written.
    rise: String,
}

/// Failed requests that started in slices beginning in `[from, to)` (client ms).
fn failures_between(report: &Report, from: i64, to: i64) -> u64 {
    report
        .timeline
        .iter()
        .filter(|s| (from..to).contains(&(s.t_ms as i64)))
        .map(|s| s.counts.failures())
        .sum()
}

fn summary(report: &Report, m: &Moments) -> String {
    let mut out = totals(report);
    match m.detect_ms {
        Some(d) => out += &detected(report, m, d),
        None => {
            let _ = writeln!(
                out,
                "b{HUNG} hung at t={}, and xlb did NOT mark it down within {} s: see `xlb events` \
                 and the daemon log (xlb-run.log in the lab's directory).",
                secs(m.hang_ms),
                MAX_DETECTION.as_secs(),
            );
        }
    }
    match m.return_ms {
        Some(r) => out += &returned(report, m, r),
        None => {
            let _ = writeln!(
                out,
                "b{HUNG} recovered at t={}, but xlb had not taken it back within {} s.",
                secs(m.recover_ms),
                MAX_RETURN.as_secs()
            );
        }
    }
    out
}

/// Client ms as `1.2 s`.
fn secs(ms: i64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// The summary's first line: every request and how it ended.
fn totals(report: &Report) -> String {
    let total = &report.summary;
    format!(
        "{} requests, {} answered, {} failed (timed out {}, reset {}, refused {}, other {})\n",
        total.requests,
        total.counts.ok,
        total.failures,
        total.counts.timed_out,
        total.counts.reset,
        total.counts.refused,
        total.counts.closed + total.counts.http_5xx + total.counts.other_error
    )
}

/// When xlb took the hung backend out (client ms `d`), and the failed
/// requests before the hang, until detection and after it.
fn detected(report: &Report, m: &Moments, d: i64) -> String {
    let slice = report.slice_ms as i64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "b{HUNG} hung at t={}; xlb took it out of the table at t={}, {} later ({}).",
        secs(m.hang_ms),
        secs(d),
        secs(d - m.hang_ms),
        m.reason.as_deref().unwrap_or("no reason given")
    );
    // Rows are by request start: a row that contains the detection
    // still holds requests sent before it.
    let after_start = (d / slice + 1) * slice;
    let _ = writeln!(
        out,
        "failed requests: {} before the hang, {} between the hang and detection, {} after detection (until the end).",
        failures_between(report, 0, m.hang_ms / slice * slice),
        failures_between(report, m.hang_ms / slice * slice, after_start),
        failures_between(report, after_start, i64::MAX),
    );
    let _ = writeln!(
        out,
        "(Requests that b{HUNG} took before detection time out after the client's 1 s; \
         after detection new connections go to b1 and b3 only.)"
    );
    out
}

/// When xlb took the recovered backend back (client ms `r`), and what it
/// answered from then on.
fn returned(report: &Report, m: &Moments, r: i64) -> String {
    let served: u64 = report
        .timeline
        .iter()
        .filter(|sl| sl.t_ms as i64 >= r)
        .map(|sl| {
            sl.per_backend
                .get(&format!("b{HUNG}"))
                .copied()
                .unwrap_or(0)
        })
        .sum();
    format!(
        "b{HUNG} recovered at t={}; xlb took it back at t={} (after rise = {} good probes) and \
         it answered {served} requests from then on.\n",
        secs(m.recover_ms),
        secs(r),
        m.rise
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use xlb_lab::client::{Counts, Slice};

    fn slice(t_ms: u64, ok: u64, timed_out: u64, b2: u64) -> Slice {
        let mut s = Slice {
            t_ms,
            counts: Counts {
                ok,
                timed_out,
                ..Counts::default()
            },
            ..Slice::default()
        };
        s.per_backend.insert("b1".into(), ok - b2);
        s.per_backend.insert("b2".into(), b2);
        s
    }

    fn report() -> Report {
        let mut r = Report {
            slice_ms: 500,
            timeline: vec![
                slice(0, 10, 0, 3),
                slice(500, 8, 2, 0),
                slice(1000, 7, 3, 0),
                slice(1500, 10, 0, 0),
                slice(2000, 10, 0, 4),
            ],
            ..Report::default()
        };
        r.summary.failures = 5;
        r
    }

    #[test]
    fn timeline_puts_marks_on_their_rows() {
        let text = timeline(
            &report(),
            &[(600, "b2 hangs".into()), (1499, "xlb: down".into())],
        );
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(rows.len(), 6, "{text}");
        assert!(
            rows[0].contains("failed") && rows[0].contains("b3"),
            "{text}"
        );
        assert!(rows[2].ends_with("← b2 hangs"), "{text}");
        assert!(rows[3].ends_with("← xlb: down"), "{text}");
        assert!(rows[1].contains("   10      0"), "{text}");
        assert!(!rows[4].contains('←'), "{text}");
    }

    #[test]
    fn summary_splits_failures_at_detection() {
        let cases = [
            (
                "detected and back",
                Moments {
                    hang_ms: 600,
                    detect_ms: Some(1200),
                    recover_ms: 1600,
                    return_ms: Some(2000),
                    reason: Some("no HTTP response within 1s".into()),
                    rise: "2".into(),
                },
                vec![
                    "xlb took it out of the table at t=1.2 s, 0.6 s later (no HTTP response within 1s)",
                    "0 before the hang, 5 between the hang and detection, 0 after detection",
                    "(after rise = 2 good probes) and it answered 4 requests from then on",
                ],
            ),
            (
                "never detected",
                Moments {
                    hang_ms: 600,
                    detect_ms: None,
                    recover_ms: 1600,
                    return_ms: None,
                    reason: None,
                    rise: "2".into(),
                },
                vec!["did NOT mark it down", "had not taken it back"],
            ),
        ];
        for (name, m, wants) in cases {
            let text = summary(&report(), &m);
            for want in wants {
                assert!(text.contains(want), "{name}: {want:?} not in:\n{text}");
            }
        }
    }
}
