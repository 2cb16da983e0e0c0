//! Detection time of a hung server in a fleet of three real servers (one
//! process each) probed by the real scheduler: the figures `dns` and
//! `https` (issue 25) share it. Once all three are up, the third is
//! SIGSTOPped (its sockets stay bound and the kernel completes TCP
//! handshakes, the application answers nothing) at a random phase of the
//! interval; detection = its Up → Down report − the stop.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_user::health::{
    machine::HealthState,
    probe::Compact,
    scheduler::{DEFAULT_MAX_CONCURRENT, Scheduler},
    spec::CheckSpec,
};
use nix::sys::signal::Signal;
use rand::Rng as _;
use tokio::time::timeout_at;

use super::report::{Row, Secs, Verdict};

/// Three server processes, each on its own address.
pub(super) trait Fleet {
    /// Their addresses, in order; the third is the one hung.
    fn addrs(&self) -> &[SocketAddr];
    /// Sends `sig` to server `i`.
    fn signal(&self, i: usize, sig: Signal) -> Result<()>;
}

/// `reps` hangs of server 3 (a `what`) under `spec`, the profile `name`:
/// the detection times' maximum against fall × interval × (1 + jitter) +
/// hang_timeout + 50 ms.
pub(super) async fn detection(
    servers: &impl Fleet,
    what: &str,
    name: &str,
    spec: &CheckSpec,
    reps: usize,
) -> Result<Row> {
    let bound = spec.interval.mul_f64(1.0 + spec.jitter) * spec.fall
        + spec.hang_timeout
        + Duration::from_millis(50);
    let mut times = Vec::new();
    for rep in 0..reps {
        let took = detect_once(servers, spec).await;
        // Whatever happened, the server runs again for the next repetition.
        servers.signal(2, Signal::SIGCONT)?;
        let took = took.with_context(|| format!("profile {name}, repetition {}", rep + 1))?;
        println!(
            "  detection, {name}: rep {}/{reps}: down after {}",
            rep + 1,
            Secs(took)
        );
        times.push(took);
    }
    let max = times.iter().max().copied().context("no repetitions")?;
    let mean = times.iter().sum::<Duration>() / times.len() as u32;
    Ok(Row {
        figure: format!("hung {what} down, {name} (n={reps})"),
        value: format!("mean {}, max {}", Secs(mean), Secs(max)),
        target: format!(
            "max <= {} (fall {} × interval {} × {:.1} + hang_timeout {} + 50ms)",
            Secs(bound),
            spec.fall,
            Compact(spec.interval),
            1.0 + spec.jitter,
            Compact(spec.hang_timeout)
        ),
        verdict: Verdict::of(max <= bound),
    })
}

/// Probes the three until all are up, stops the third at a random phase
/// of the interval, and returns how long until its Up → Down report.
async fn detect_once(servers: &impl Fleet, spec: &CheckSpec) -> Result<Duration> {
    let (mut scheduler, mut rx) = Scheduler::new(DEFAULT_MAX_CONCURRENT);
    for (id, &addr) in (0u64..).zip(servers.addrs()) {
        let spec = CheckSpec {
            port: addr.port(),
            ..spec.clone()
        };
        scheduler.upsert(id, addr, spec, HealthState::Unknown);
    }
    let limit = spec.interval * (spec.rise + 1) + spec.hang_timeout + Duration::from_secs(5);
    let deadline = tokio::time::Instant::now() + limit;
    let mut up = [false; 3];
    while !up.iter().all(|&u| u) {
        let report = timeout_at(deadline, rx.recv())
            .await
            .ok()
            .flatten()
            .with_context(|| format!("the three were not up within {}", Secs(limit)))?;
        up[report.id as usize] = report.snapshot.state == HealthState::Up;
    }
    let phase = spec
        .interval
        .mul_f64(rand::thread_rng().gen_range(0.0..1.0));
    tokio::time::sleep(phase).await;
    servers.signal(2, Signal::SIGSTOP)?;
    let t0 = Instant::now();
    let limit = (spec.interval.max(spec.down_interval) * (spec.fall + 1) + spec.hang_timeout) * 2;
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let Some(report) = timeout_at(deadline, rx.recv()).await.ok().flatten() else {
            bail!("the stopped server was not down within {}", Secs(limit));
        };
        if report.id == 2 && report.snapshot.state == HealthState::Down {
            let took = t0.elapsed();
            drop(scheduler);
            return Ok(took);
        }
    }
}
