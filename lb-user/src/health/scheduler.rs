//! Runs the probes: one Tokio task per backend, at most `max_concurrent`
//! probes in flight at once, a [`Report`] after every probe's verdict and an
//! interim `Late` report when a probe passes `timeout` without one.
//!
//! A slow or hostile backend cannot stall the others: each probe is bounded by
//! its spec's `hang_timeout`, each backend sleeps and probes in its own task,
//! and the concurrency permit is held only while probing.
//!
//! A late probe lingers (until its answer or `hang_timeout`) in a task of its
//! own, owned by the backend's task, while the backend's next probe starts on
//! schedule: a hung backend is probed, and reported late, at the same cadence
//! as a healthy one, which is what lets the per-VIP policy tell one hung
//! backend from a fleet slowed down by load. Aborting the backend's task
//! (upsert, remove, drop) aborts its lingering probes with it.
//!
//! The tasks run on the prober's own thread, a single-threaded runtime (as
//! HAProxy and Envoy run health checks on their own event loop): probing
//! 1,000 backends a second on the daemon's multi-threaded runtime cost
//! about a fifth more CPU, spent waking the other worker for each probe and
//! report, and probes no longer wait behind the daemon's main loop. One
//! thread at the measured 50-90 µs of CPU per probe (`xlb-health-bench`)
//! carries some 10,000 probes a second.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};

use super::batch::{Batcher, FLUSH_EVERY, flush_loop};
use super::datapath::DatapathTarget;
use super::machine::{HealthMachine, HealthSnapshot, HealthState, Transition, initial_delay};
use super::probe::{ConnSlot, ProbeClass, ProbeResult, probe_reusing};
use super::spec::CheckSpec;

mod agent_task;

/// Probes in flight at once unless configured otherwise: enough for 1,000
/// backends at a 2 s interval even if all of them hang for a 1 s timeout.
pub const DEFAULT_MAX_CONCURRENT: usize = 256;

/// Reports buffered in the channel before the batch flusher
/// (`health::batch`) waits for the receiver.
const REPORT_QUEUE: usize = 1024;

/// Probe starts are rounded up to a grid of this fraction of the period
/// (at most [`MAX_GRID`]): with 1,000 backends and jittered periods, nearly
/// every millisecond would otherwise wake the runtime for one probe; on a
/// 10 ms grid one wakeup starts ten. Delays only, never by more than 1 % of
/// the period, and the grid is shared by all backends of a scheduler.
const GRID_FRACTION: u32 = 100;
/// Coarsest grid: 10 ms, 1 % of a 1 s interval.
const MAX_GRID: Duration = Duration::from_millis(10);

/// `at` rounded up to the probe grid of a `period` started at `epoch`.
fn on_grid(
    at: tokio::time::Instant,
    epoch: tokio::time::Instant,
    period: Duration,
) -> tokio::time::Instant {
    let grid = (period / GRID_FRACTION).min(MAX_GRID).as_nanos().max(1);
    let since = at.saturating_duration_since(epoch).as_nanos();
    let up = since.div_ceil(grid) * grid - since;
    at + Duration::from_nanos(u64::try_from(up).unwrap_or(0))
}

/// Sent after every probe's verdict, and once before it when the probe
/// passes `timeout` without one (`class` = `Late`, `result` = `None`).
#[derive(Clone, Debug)]
pub struct Report {
    pub id: u64,
    /// The backend address given to [`Scheduler::upsert`].
    pub addr: SocketAddr,
    /// What this report says about the backend: log `Slow` answers, raise
    /// an alarm on `Local` errors.
    pub class: ProbeClass,
    /// The probe's final result; `None` in an interim `Late` report, and in
    /// an agent's report (`class` `Ok`: only the snapshot's agent changed).
    pub result: Option<ProbeResult>,
    /// Set when this probe changed the health state. Log it and update the
    /// data plane; nothing else is needed.
    pub transition: Option<Transition>,
    /// The backend's health after this probe.
    pub snapshot: HealthSnapshot,
}

/// The state machines, shared by the scheduler and the backend tasks.
type Shared = Arc<Mutex<HashMap<u64, Entry>>>;

struct Entry {
    /// Which task may update this entry: an aborted task may still be
    /// finishing a poll on another thread, and must not write stale results.
    generation: u64,
    machine: HealthMachine,
}

fn lock(shared: &Shared) -> MutexGuard<'_, HashMap<u64, Entry>> {
    // Every critical section leaves the map consistent, so a panic in
    // another holder does not make the data unusable.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A read-only handle on every backend's health, for the control socket.
/// Cheap to clone.
#[derive(Clone)]
pub struct HealthView {
    shared: Shared,
}

impl HealthView {
    pub fn snapshot(&self) -> HashMap<u64, HealthSnapshot> {
        lock(&self.shared)
            .iter()
            .map(|(&id, entry)| (id, entry.machine.snapshot()))
            .collect()
    }

    pub fn get(&self, id: u64) -> Option<HealthSnapshot> {
        lock(&self.shared)
            .get(&id)
            .map(|entry| entry.machine.snapshot())
    }
}

struct Task {
    addr: SocketAddr,
    spec: CheckSpec,
    path: Option<DatapathTarget>,
    auto: Option<AutoTimeout>,
    handle: JoinHandle<()>,
    /// The agent's poller, if the spec has one.
    agent: Option<JoinHandle<()>>,
}

impl Task {
    fn abort(&self) {
        self.handle.abort();
        if let Some(agent) = &self.agent {
            agent.abort();
        }
    }
}

/// The deadline a probe of `spec` uses now: its `timeout`, or for
/// `timeout = "auto"` the one last stored in `auto` (never past
/// `hang_timeout`). The scheduler and the status both read it here.
pub fn effective_timeout(spec: &CheckSpec, auto: Option<&AutoTimeout>) -> Duration {
    let auto = auto
        .filter(|_| spec.auto_timeout)
        .map(|a| a.load(Ordering::Relaxed))
        .filter(|&ns| ns > 0)
        .map(Duration::from_nanos);
    auto.unwrap_or(spec.timeout)
        .min(spec.hang_timeout.max(spec.timeout))
}

/// The deadline of a `timeout = "auto"` check, in ns, set by whoever sees
/// the VIP's latencies (the daemon) and read by each probe as it starts; 0 =
/// not known yet (the spec's `timeout` stands). Shared by a VIP's backends.
pub type AutoTimeout = Arc<AtomicU64>;

/// The prober's thread and its runtime; dropping it stops the runtime,
/// which drops every task left on it.
struct ProberThread {
    handle: tokio::runtime::Handle,
    /// Dropped to end the thread.
    _stop: oneshot::Sender<()>,
}

impl ProberThread {
    fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("xlb-prober".to_owned())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(Self {
            handle,
            _stop: stop,
        })
    }
}

/// Owns the backend tasks. Dropping it stops them all.
pub struct Scheduler {
    semaphore: Arc<Semaphore>,
    /// Where the backend tasks put their reports (see `health::batch`).
    reports: Arc<Batcher>,
    /// Hands the reports to the receiver; aborted on drop.
    flusher: JoinHandle<()>,
    shared: Shared,
    tasks: HashMap<u64, Task>,
    next_generation: u64,
    /// Where every backend's probe grid starts (see [`on_grid`]).
    epoch: tokio::time::Instant,
    /// Where the backend tasks run: the prober's thread, or the caller's
    /// runtime if that thread could not be started.
    runtime: tokio::runtime::Handle,
    /// Declared last: dropped after every task is aborted.
    _prober: Option<ProberThread>,
}

impl Scheduler {
    /// A scheduler running at most `max_concurrent` probes at once (0 counts
    /// as 1) on a thread of its own, and the receiver of its reports. If the
    /// receiver is dropped, probing goes on and snapshots stay current.
    ///
    /// Must be called within a Tokio runtime, which runs the probes should
    /// the prober's thread fail to start (no thread or epoll instance left).
    pub fn new(max_concurrent: usize) -> (Self, mpsc::Receiver<Report>) {
        let (tx, rx) = mpsc::channel(REPORT_QUEUE);
        let prober = ProberThread::start().ok();
        let runtime = prober
            .as_ref()
            .map_or_else(tokio::runtime::Handle::current, |p| p.handle.clone());
        let reports = Arc::new(Batcher::default());
        let flusher = runtime.spawn(flush_loop(Arc::clone(&reports), tx, FLUSH_EVERY));
        let scheduler = Self {
            semaphore: Arc::new(Semaphore::new(max_concurrent.max(1))),
            reports,
            flusher,
            shared: Arc::new(Mutex::new(HashMap::new())),
            tasks: HashMap::new(),
            next_generation: 0,
            epoch: tokio::time::Instant::now(),
            runtime,
            _prober: prober,
        };
        (scheduler, rx)
    }

    /// Adds backend `id` or updates it. `addr` is the backend; probes go to
    /// `addr.ip():spec.port`. `initial` is the state a new backend starts in:
    /// `Unknown`, or the state adopted from before a restart.
    ///
    /// - Unchanged `addr` and `spec`: nothing happens (no restart, no reset).
    /// - Changed `spec`: the task restarts with the new spec; the health state,
    ///   streaks and drain are kept (new `rise`/`fall` apply to them).
    /// - Changed `addr`: the old health says nothing about the new address, so
    ///   the state restarts from `initial`; an admin drain is kept.
    pub fn upsert(&mut self, id: u64, addr: SocketAddr, spec: CheckSpec, initial: HealthState) {
        self.upsert_via(id, addr, spec, initial, None, None);
    }

    /// [`Self::upsert`], probing through the data path when `path` is given
    /// (see [`super::probe::probe_via`]), and with the deadline in `auto` when the spec
    /// says `timeout = "auto"`. A changed path or deadline source restarts
    /// the task like a changed spec.
    pub fn upsert_via(
        &mut self,
        id: u64,
        addr: SocketAddr,
        spec: CheckSpec,
        initial: HealthState,
        path: Option<DatapathTarget>,
        auto: Option<AutoTimeout>,
    ) {
        let mut addr_changed = false;
        if let Some(task) = self.tasks.get(&id) {
            let same_auto = match (&task.auto, &auto) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            };
            if task.addr == addr && task.spec == spec && task.path == path && same_auto {
                return;
            }
            addr_changed = task.addr != addr;
            task.abort();
        }
        self.next_generation += 1;
        let generation = self.next_generation;
        let now = Instant::now();
        {
            let mut map = lock(&self.shared);
            let fresh = || HealthMachine::adopted(initial, spec.rise, spec.fall, now);
            match map.get_mut(&id) {
                Some(entry) => {
                    entry.generation = generation;
                    if addr_changed {
                        let drained = entry.machine.admin_drained();
                        entry.machine = fresh();
                        entry.machine.set_admin_drained(drained);
                    } else {
                        entry.machine.set_thresholds(spec.rise, spec.fall);
                        // The old task's lingering probes die with it.
                        entry.machine.clear_late_pending();
                    }
                }
                None => {
                    map.insert(
                        id,
                        Entry {
                            generation,
                            machine: fresh(),
                        },
                    );
                }
            }
        }
        let handle = self.runtime.spawn(run_backend(BackendTask {
            id,
            generation,
            addr,
            spec: spec.clone(),
            path: path.clone(),
            auto: auto.clone(),
            shared: Arc::clone(&self.shared),
            semaphore: Arc::clone(&self.semaphore),
            reports: Arc::clone(&self.reports),
            conn: ConnSlot::default(),
            epoch: self.epoch,
        }));
        let agent = self.start_agent(id, generation, addr, &spec);
        self.tasks.insert(
            id,
            Task {
                addr,
                spec,
                path,
                auto,
                handle,
                agent,
            },
        );
    }

    /// Stops probing backend `id` and forgets its health. A report from a
    /// probe that was finishing may still arrive; ignore unknown ids.
    pub fn remove(&mut self, id: u64) {
        if let Some(task) = self.tasks.remove(&id) {
            task.abort();
        }
        lock(&self.shared).remove(&id);
    }

    /// Drains or undrains backend `id` (health keeps being tracked). Returns
    /// the new snapshot, or `None` if `id` is unknown.
    pub fn set_admin_drained(&mut self, id: u64, drained: bool) -> Option<HealthSnapshot> {
        let mut map = lock(&self.shared);
        let entry = map.get_mut(&id)?;
        entry.machine.set_admin_drained(drained);
        Some(entry.machine.snapshot())
    }

    /// Feeds passive evidence against backend `id`
    /// ([`HealthMachine::observe_passive`]). Returns the new snapshot, or
    /// `None` if `id` is unknown.
    pub fn observe_passive(&mut self, id: u64, reason: String) -> Option<HealthSnapshot> {
        let mut map = lock(&self.shared);
        let entry = map.get_mut(&id)?;
        entry.machine.observe_passive(reason);
        Some(entry.machine.snapshot())
    }

    /// Every backend's health now.
    pub fn snapshot(&self) -> HashMap<u64, HealthSnapshot> {
        self.view().snapshot()
    }

    /// A handle that reads snapshots without owning the scheduler.
    pub fn view(&self) -> HealthView {
        HealthView {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Ids of the backends being probed.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.tasks.keys().copied()
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        for task in self.tasks.values() {
            task.abort();
        }
        self.flusher.abort();
    }
}

struct BackendTask {
    id: u64,
    generation: u64,
    addr: SocketAddr,
    spec: CheckSpec,
    /// Probe through the data path (`via = "vip"`), if set.
    path: Option<DatapathTarget>,
    /// The deadline of `timeout = "auto"`, if the spec says so.
    auto: Option<AutoTimeout>,
    shared: Shared,
    semaphore: Arc<Semaphore>,
    reports: Arc<Batcher>,
    /// The kept connection of `reuse_connection`; closed with the task.
    conn: ConnSlot,
    /// The start of the probe grid.
    epoch: tokio::time::Instant,
}

impl BackendTask {
    /// The deadline of the next probe: the spec's `timeout`, or the one the
    /// daemon derived for `timeout = "auto"` (never past `hang_timeout`).
    fn timeout(&self) -> Duration {
        effective_timeout(&self.spec, self.auto.as_ref())
    }

    /// Feeds one report to the state machine (`result` = `None`: the
    /// interim `Late`). Returns what to send and the delay until the next
    /// probe, or `None` if the backend was removed or its task restarted
    /// (then this task must stop: its results are stale).
    fn update(
        &self,
        class: &ProbeClass,
        result: Option<&ProbeResult>,
        after_late: bool,
        timeout: Duration,
    ) -> Option<(Option<Transition>, HealthSnapshot, Duration)> {
        let mut map = lock(&self.shared);
        let entry = map
            .get_mut(&self.id)
            .filter(|e| e.generation == self.generation)?;
        let transition = match result {
            Some(result) => entry
                .machine
                .observe(result, class, after_late, Instant::now()),
            None => {
                entry.machine.observe_late(timeout);
                None
            }
        };
        let delay = entry
            .machine
            .next_delay(&self.spec, &mut rand::thread_rng());
        Some((transition, entry.machine.snapshot(), delay))
    }

    fn send(
        &self,
        class: ProbeClass,
        result: Option<ProbeResult>,
        transition: Option<Transition>,
        snapshot: HealthSnapshot,
    ) {
        let report = Report {
            id: self.id,
            addr: self.addr,
            class,
            result,
            transition,
            snapshot,
        };
        self.reports.push(report);
    }
}

async fn run_backend(task: BackendTask) {
    let task = Arc::new(task);
    let target = SocketAddr::new(task.addr.ip(), task.spec.port);
    let max_in_flight = task.spec.max_in_flight();
    // Late probes linger here; dropped with this future when the task is
    // aborted, which aborts every probe still in it.
    let mut in_flight = JoinSet::new();
    let first = initial_delay(&task.spec, &mut rand::thread_rng());
    tokio::time::sleep(first).await;
    loop {
        while in_flight.try_join_next().is_some() {}
        // Bounded per backend as well as overall: with a short period and a
        // long hang_timeout, wait for the oldest probe rather than pile up.
        while in_flight.len() >= max_in_flight {
            in_flight.join_next().await;
        }
        let started = tokio::time::Instant::now();
        // The semaphore is never closed; if it were, stop quietly.
        let Ok(permit) = Arc::clone(&task.semaphore).acquire_owned().await else {
            return;
        };
        // The probe's verdict, or its Late report, gives the next delay.
        let Some(delay) = probe_once(&task, target, permit, &mut in_flight).await else {
            // Removed or restarted while this probe ran.
            return;
        };
        // Periods run from the start of each probe, so a hang is confirmed
        // within interval + (fall − 1) × max(fast_interval, timeout) +
        // hang_timeout (fast_interval ≤ interval by default), not fall ×
        // (interval + hang_timeout): a late probe lingers on its own and
        // does not hold up the next one. A probe that overran (waiting for a
        // permit, or past a fast_interval shorter than timeout) is followed
        // by at least a tenth of the period of rest, so a hung backend is
        // never probed back to back.
        let next = (started + delay).max(tokio::time::Instant::now() + delay / 10);
        tokio::time::sleep_until(on_grid(next, task.epoch, delay)).await;
    }
}

/// A probe of `task`'s backend that owns what it needs, so that a late one
/// can be moved into a task of its own.
type Probing = Pin<Box<dyn Future<Output = ProbeResult> + Send>>;

/// One probe, run in the backend's own task up to `timeout`: most probes
/// end by then, and cost no task, channel or wakeup of their own. One that
/// passes `timeout` without a verdict is reported `Late` and left to
/// linger (until its answer or `hang_timeout`) in `in_flight`, holding its
/// permit to the end, while the backend's next probe starts on schedule.
/// Returns the delay until the next probe, or `None` if the backend was
/// removed or its task restarted.
async fn probe_once(
    task: &Arc<BackendTask>,
    target: SocketAddr,
    permit: OwnedSemaphorePermit,
    in_flight: &mut JoinSet<()>,
) -> Option<Duration> {
    let owner = Arc::clone(task);
    let mut probing: Probing = Box::pin(async move {
        let BackendTask {
            spec, path, conn, ..
        } = &*owner;
        probe_reusing(target, spec, path.as_ref(), Some(conn)).await
    });
    let timeout = task.timeout();
    // With hang_timeout = timeout the verdict comes at timeout: no interim.
    if task.spec.hang_timeout <= timeout {
        let result = probing.await;
        return task.conclude(result, false, timeout, permit);
    }
    let late_at = tokio::time::Instant::now() + timeout;
    if let Ok(result) = tokio::time::timeout_at(late_at, probing.as_mut()).await {
        return task.conclude(result, false, timeout, permit);
    }
    let class = ProbeClass::Late { timeout };
    let (transition, snapshot, delay) = task.update(&class, None, false, timeout)?;
    task.send(class, None, transition, snapshot);
    let task = Arc::clone(task);
    in_flight.spawn(async move {
        let result = probing.await;
        task.conclude(result, true, timeout, permit);
    });
    Some(delay)
}

impl BackendTask {
    /// Reports a probe's verdict (`after_late`: it was reported `Late`
    /// first), then releases its permit. Returns the delay until the next
    /// probe, or `None` if this task's results are stale.
    fn conclude(
        &self,
        result: ProbeResult,
        after_late: bool,
        timeout: Duration,
        permit: OwnedSemaphorePermit,
    ) -> Option<Duration> {
        let class = match result.class(timeout) {
            // Done a hair before `timeout` by the probe's clock, after it by
            // ours: it was reported late, so it is slow.
            ProbeClass::Ok if after_late => ProbeClass::Slow {
                latency: result.latency.max(timeout),
                timeout,
            },
            class => class,
        };
        let (transition, snapshot, delay) =
            self.update(&class, Some(&result), after_late, timeout)?;
        self.send(class, Some(result), transition, snapshot);
        drop(permit);
        Some(delay)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::super::probe::FailReason;
    use super::super::testutil::{
        Behaviour, Holder, KeepAliveServer, Server, http_check, http_spec, http_spec_hang,
        silent_listener,
    };
    use super::*;

    /// A spec that probes every ~50 ms in every state.
    fn fast_spec(port: u16, timeout: Duration) -> CheckSpec {
        let every = Duration::from_millis(50);
        CheckSpec {
            interval: every,
            fast_interval: every,
            down_interval: every,
            rise: 2,
            fall: 2,
            ..http_spec(port, timeout)
        }
    }

    /// Receives reports until `until` returns true, for at most `limit`.
    async fn recv_until(
        rx: &mut mpsc::Receiver<Report>,
        limit: Duration,
        mut until: impl FnMut(&Report) -> bool,
    ) -> Vec<Report> {
        let mut reports = Vec::new();
        let deadline = tokio::time::Instant::now() + limit;
        while let Ok(Some(report)) = tokio::time::timeout_at(deadline, rx.recv()).await {
            let done = until(&report);
            reports.push(report);
            if done {
                break;
            }
        }
        reports
    }

    /// Every report received within `window`, with its arrival time.
    async fn collect_for(
        rx: &mut mpsc::Receiver<Report>,
        window: Duration,
    ) -> Vec<(tokio::time::Instant, Report)> {
        let mut reports = Vec::new();
        let deadline = tokio::time::Instant::now() + window;
        while let Ok(Some(report)) = tokio::time::timeout_at(deadline, rx.recv()).await {
            reports.push((tokio::time::Instant::now(), report));
        }
        reports
    }

    fn toggled_server(healthy: Arc<AtomicBool>) -> impl Fn() -> Vec<u8> + Send + Sync + 'static {
        move || {
            if healthy.load(Ordering::SeqCst) {
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec()
            } else {
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n".to_vec()
            }
        }
    }

    /// Probe starts land on the grid, late by less than one step, and the
    /// step is 1 % of the period, at most 10 ms.
    #[test]
    fn probe_starts_are_rounded_up_to_the_grid() {
        let epoch = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        // (name, offset from the epoch, period, want offset)
        let cases = [
            ("on the grid already", ms(20), ms(1000), ms(20)),
            ("just past a step", ms(20) + us(1), ms(1000), ms(30)),
            ("10 ms at most", ms(1), Duration::from_secs(30), ms(10)),
            ("1 % of a fast period", us(500), ms(200), ms(2)),
            ("before the epoch", Duration::ZERO, ms(1000), Duration::ZERO),
        ];
        for (name, offset, period, want) in cases {
            let got = on_grid(epoch + offset, epoch, period) - epoch;
            assert_eq!(got, want, "{name}");
        }
    }

    /// `reuse_connection`: a hung event loop stalls the kept connection as
    /// it stalls a new one, so a hung backend goes Down after `fall` probes
    /// (each ending in no_response at hang_timeout), and comes back on a
    /// fresh connection once it answers again. Healthy probing used one
    /// connection per `reopen_every` probes.
    #[tokio::test]
    async fn hung_backend_on_a_reused_connection_goes_down_after_fall() {
        let server = KeepAliveServer::start(Behaviour::Answer).await;
        let (mut scheduler, mut rx) = Scheduler::new(8);
        let timeout = Duration::from_millis(150);
        let mut spec = fast_spec(server.addr.port(), timeout);
        spec.hang_timeout = timeout * 2;
        http_check(&mut spec).reuse_connection = Some(100);
        scheduler.upsert(1, server.addr, spec, HealthState::Unknown);

        let mut oks = 0;
        recv_until(&mut rx, Duration::from_secs(3), |r| {
            oks += usize::from(r.result.as_ref().is_some_and(|p| p.outcome.is_ok()));
            oks >= 6
        })
        .await;
        assert!(oks >= 6, "only {oks} passing probes");
        assert_eq!(server.connections.load(Ordering::SeqCst), 1);

        server.set(Behaviour::Hang);
        let hung_at = tokio::time::Instant::now();
        let reports = recv_until(&mut rx, Duration::from_secs(3), |r| {
            r.snapshot.state == HealthState::Down
        })
        .await;
        let last = reports.last().expect("a report");
        assert_eq!(last.snapshot.state, HealthState::Down, "{reports:#?}");
        let failures: Vec<_> = reports
            .iter()
            .filter_map(|r| r.result.as_ref()?.outcome.as_ref().err())
            .map(FailReason::code)
            .collect();
        assert_eq!(failures, ["no_response", "no_response"], "fall = 2");
        // fall probes 50 ms apart, the last one ending at hang_timeout.
        assert!(
            hung_at.elapsed() < Duration::from_millis(1000),
            "down after {:?}",
            hung_at.elapsed()
        );

        server.set(Behaviour::Answer);
        let reports = recv_until(&mut rx, Duration::from_secs(3), |r| {
            r.snapshot.state == HealthState::Up
        })
        .await;
        assert_eq!(
            reports.last().map(|r| r.snapshot.state),
            Some(HealthState::Up)
        );
    }

    #[tokio::test]
    async fn failing_backend_goes_down_once() {
        let healthy = Arc::new(AtomicBool::new(true));
        let server = Server::start(toggled_server(healthy.clone())).await;
        let (mut scheduler, mut rx) = Scheduler::new(8);
        let spec = fast_spec(server.addr.port(), Duration::from_millis(500));
        scheduler.upsert(1, server.addr, spec, HealthState::Unknown);

        let reports = recv_until(&mut rx, Duration::from_secs(2), |r| r.transition.is_some()).await;
        let last = reports.last().expect("a report");
        assert_eq!(
            last.transition,
            Some(Transition {
                from: HealthState::Unknown,
                to: HealthState::Up,
                reason: "passed 1 consecutive check".into()
            })
        );
        assert!(last.snapshot.serving);

        healthy.store(false, Ordering::SeqCst);
        // Down after 2 failures (~100 ms); then keep listening so a second,
        // spurious transition would be seen.
        let mut failures_after_down = 0;
        let reports = recv_until(&mut rx, Duration::from_secs(3), |r| {
            if r.snapshot.state == HealthState::Down {
                failures_after_down += 1;
            }
            failures_after_down > 5
        })
        .await;
        assert!(
            failures_after_down > 5,
            "backend did not stay down: {reports:#?}"
        );
        let transitions: Vec<_> = reports
            .iter()
            .filter_map(|r| r.transition.clone())
            .collect();
        assert_eq!(
            transitions,
            vec![Transition {
                from: HealthState::Up,
                to: HealthState::Down,
                reason: "unexpected status 503".into()
            }]
        );
        let down = reports
            .iter()
            .find(|r| r.transition.is_some())
            .expect("transition");
        assert_eq!(down.snapshot.consecutive_fail, 2, "fall=2");
        assert!(!down.snapshot.serving);
        assert_eq!(scheduler.snapshot()[&1].state, HealthState::Down);
    }

    #[tokio::test]
    async fn hung_backend_does_not_delay_others() {
        let hung = silent_listener();
        let hung_addr = hung.local_addr().expect("local_addr");
        let server = Server::canned(b"HTTP/1.1 200 OK\r\n\r\n").await;
        let (mut scheduler, mut rx) = Scheduler::new(4);
        scheduler.upsert(
            1,
            hung_addr,
            fast_spec(hung_addr.port(), Duration::from_secs(10)),
            HealthState::Up,
        );
        scheduler.upsert(
            2,
            server.addr,
            fast_spec(server.addr.port(), Duration::from_secs(10)),
            HealthState::Up,
        );

        let reports = collect_for(&mut rx, Duration::from_secs(1)).await;
        assert!(
            reports.iter().all(|(_, r)| r.id == 2),
            "the hung probe cannot have finished"
        );
        let times: Vec<_> = reports.iter().map(|(at, _)| *at).collect();
        // ~50 ms ± 10 % apart: about 18 in a second.
        assert!(
            times.len() >= 10,
            "only {} reports from the healthy backend",
            times.len()
        );
        let max_gap = times
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .expect("two reports");
        assert!(
            max_gap < Duration::from_millis(150),
            "healthy backend stalled for {max_gap:?}"
        );
    }

    /// With one permit, hung probes run one at a time; with three, together.
    #[tokio::test]
    async fn concurrency_is_bounded() {
        let timeout = Duration::from_millis(300);
        let hung = silent_listener();
        let addr = hung.local_addr().expect("local_addr");
        let (mut serial, mut serial_rx) = Scheduler::new(1);
        let (mut parallel, mut parallel_rx) = Scheduler::new(3);
        for id in 1..=3 {
            serial.upsert(
                id,
                addr,
                fast_spec(addr.port(), timeout),
                HealthState::Unknown,
            );
            parallel.upsert(
                id,
                addr,
                fast_spec(addr.port(), timeout),
                HealthState::Unknown,
            );
        }
        let window = Duration::from_millis(1000);
        let (serial_reports, parallel_reports) = tokio::join!(
            collect_for(&mut serial_rx, window),
            collect_for(&mut parallel_rx, window)
        );
        // Serial: probes end at ~300, 600, 900 ms.
        assert!(
            (2..=4).contains(&serial_reports.len()),
            "{} probes finished with 1 permit",
            serial_reports.len()
        );
        // Parallel: three at a time, each backend every ~350 ms.
        assert!(
            parallel_reports.len() >= 6,
            "{} probes finished with 3 permits",
            parallel_reports.len()
        );
        for (_, report) in serial_reports.iter().chain(&parallel_reports) {
            assert_eq!(
                report.result.as_ref().map(|r| &r.outcome),
                Some(&Err(FailReason::NoResponse { timeout }))
            );
        }
    }

    #[tokio::test]
    async fn upsert_remove_drain_and_drop() {
        let server = Server::canned(b"HTTP/1.1 200 OK\r\n\r\n").await;
        let (mut scheduler, mut rx) = Scheduler::new(8);
        let spec = fast_spec(server.addr.port(), Duration::from_millis(500));
        scheduler.upsert(7, server.addr, spec.clone(), HealthState::Unknown);
        recv_until(&mut rx, Duration::from_secs(2), |r| {
            r.snapshot.consecutive_ok >= 3
        })
        .await;
        let before = scheduler.snapshot()[&7].clone();
        assert_eq!(before.state, HealthState::Up);
        let task_id = scheduler.tasks[&7].handle.id();

        // Unchanged: same task, state untouched.
        scheduler.upsert(7, server.addr, spec.clone(), HealthState::Down);
        assert_eq!(
            scheduler.tasks[&7].handle.id(),
            task_id,
            "unchanged upsert restarted the task"
        );
        let after = scheduler.snapshot()[&7].clone();
        assert_eq!((after.state, after.since), (before.state, before.since));
        assert!(after.consecutive_ok >= before.consecutive_ok);

        // Changed spec: new task, state kept.
        let slower = CheckSpec {
            interval: Duration::from_millis(60),
            ..spec.clone()
        };
        scheduler.upsert(7, server.addr, slower.clone(), HealthState::Down);
        assert_ne!(
            scheduler.tasks[&7].handle.id(),
            task_id,
            "changed spec kept the old task"
        );
        let kept = scheduler.snapshot()[&7].clone();
        assert_eq!((kept.state, kept.since), (before.state, before.since));
        // Reports the old task queued before it was aborted say nothing
        // about the restart. Probes run on the prober's own thread, so one
        // more of the old task's may still arrive after this drain, with
        // the streak as it was (a late report moves no count): the check
        // is that the streak did not fall. A reset would start it again at
        // 0 or 1, below the 3 it had reached.
        while rx.try_recv().is_ok() {}
        let next = recv_until(&mut rx, Duration::from_secs(2), |r| r.id == 7).await;
        let next = &next.last().expect("a report after the restart").snapshot;
        assert!(
            next.consecutive_ok >= before.consecutive_ok,
            "streak was reset: {} after {}",
            next.consecutive_ok,
            before.consecutive_ok
        );

        // Drain: not serving, still probed and up.
        let drained = scheduler.set_admin_drained(7, true).expect("known id");
        assert!(!drained.serving && drained.admin_drained && drained.state == HealthState::Up);
        let probed = recv_until(&mut rx, Duration::from_secs(2), |_| true).await;
        assert!(!probed[0].snapshot.serving && probed[0].snapshot.state == HealthState::Up);
        assert_eq!(scheduler.set_admin_drained(8, true), None);

        // Remove: forgotten, no more probes.
        scheduler.remove(7);
        assert!(scheduler.snapshot().is_empty());
        tokio::time::sleep(Duration::from_millis(100)).await;
        let count = server.requests.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            server.requests.load(Ordering::SeqCst),
            count,
            "removed backend still probed"
        );

        // Drop: tasks stop, the report stream ends.
        scheduler.upsert(9, server.addr, spec, HealthState::Unknown);
        recv_until(&mut rx, Duration::from_secs(2), |r| r.id == 9).await;
        drop(scheduler);
        let rest = recv_until(&mut rx, Duration::from_secs(2), |_| false).await;
        assert!(rest.len() <= 2, "{} reports after drop", rest.len());
        assert!(
            tokio::time::timeout(Duration::from_millis(100), rx.recv())
                .await
                .is_ok_and(|r| r.is_none()),
            "report channel still open after the scheduler was dropped"
        );
        let count = server.requests.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            server.requests.load(Ordering::SeqCst),
            count,
            "probes after drop"
        );
    }

    /// A spec that probes every `every` in every state, with the given
    /// timeout and hang_timeout.
    fn hang_spec(port: u16, every: Duration, timeout: Duration, hang: Duration) -> CheckSpec {
        CheckSpec {
            interval: every,
            fast_interval: every,
            down_interval: every,
            rise: 2,
            fall: 2,
            ..http_spec_hang(port, timeout, hang)
        }
    }

    /// `timeout = "auto"`: each probe takes the deadline the daemon set
    /// last, not the spec's starting value.
    #[tokio::test]
    async fn auto_timeout_is_read_by_each_probe() {
        // The backend answers in 150 ms; the spec's own timeout would pass it.
        let server =
            Server::canned_delayed(Duration::from_millis(150), b"HTTP/1.1 200 OK\r\n\r\n").await;
        let spec = CheckSpec {
            auto_timeout: true,
            ..hang_spec(
                server.addr.port(),
                Duration::from_secs(1),
                Duration::from_millis(500),
                Duration::from_secs(1),
            )
        };
        // (the deadline the daemon derived, the report that must come first)
        let cases = [
            (Duration::from_millis(50), "late"),
            (Duration::from_millis(400), "ok"),
        ];
        for (deadline, first) in cases {
            let (mut scheduler, mut rx) = Scheduler::new(8);
            let auto = AutoTimeout::new(AtomicU64::new(deadline.as_nanos() as u64));
            scheduler.upsert_via(
                1,
                server.addr,
                spec.clone(),
                HealthState::Unknown,
                None,
                Some(auto),
            );
            let reports = collect_until_final(&mut rx, Duration::from_secs(3)).await;
            assert_eq!(
                reports.first().map(|(_, r)| r.class.code()),
                Some(first),
                "deadline {deadline:?}: {reports:#?}"
            );
            if first == "late" {
                assert_eq!(reports[0].1.class, ProbeClass::Late { timeout: deadline });
                assert_eq!(reports.last().map(|(_, r)| r.class.code()), Some("slow"));
            }
        }
    }

    /// Per probe: a backend answering after 2.5 × timeout is reported Late at
    /// the timeout, then Slow with its latency, and comes up; a silent one is
    /// reported Late, then fails at hang_timeout.
    #[tokio::test]
    async fn late_then_slow_or_late_then_no_response() {
        let timeout = Duration::from_millis(100);
        let hang = Duration::from_millis(400);
        let slow = Server::canned_delayed(timeout * 5 / 2, b"HTTP/1.1 200 OK\r\n\r\n").await;
        let silent = silent_listener();
        let silent_addr = silent.local_addr().expect("local_addr");
        // (name, address, final code, final text prefix, state after)
        let cases = [
            ("slow", slow.addr, "slow", "answered in 2", HealthState::Up),
            (
                "hung",
                silent_addr,
                "no_response",
                "connected, no HTTP response within 400ms",
                HealthState::Down,
            ),
        ];
        for (name, addr, code, text, state) in cases {
            let (mut scheduler, mut rx) = Scheduler::new(8);
            // One probe per second: the first one's reports come alone.
            let spec = hang_spec(addr.port(), Duration::from_secs(1), timeout, hang);
            scheduler.upsert(1, addr, spec, HealthState::Unknown);
            let reports = collect_until_final(&mut rx, Duration::from_secs(3)).await;
            let [(late_at, late), (final_at, last)] = &reports[..] else {
                panic!("{name}: expected Late then a final report, got {reports:#?}");
            };
            assert_eq!(late.class, ProbeClass::Late { timeout }, "{name}");
            assert!(late.result.is_none(), "{name}: a Late has no result");
            assert!(late.transition.is_none(), "{name}: a Late moves nothing");
            assert_eq!(late.snapshot.state, HealthState::Unknown, "{name}");
            assert_eq!(
                (late.snapshot.late_pending, late.snapshot.consecutive_slow),
                (1, 1),
                "{name}"
            );
            assert_eq!(late.snapshot.current_latency(), Some(timeout), "{name}");

            assert_eq!(last.class.code(), code, "{name}");
            assert!(
                last.class.to_string().starts_with(text),
                "{name}: {}",
                last.class
            );
            let result = last.result.as_ref().expect("a final result");
            let waited = *final_at - *late_at;
            match state {
                HealthState::Up => {
                    assert!(
                        result.latency >= timeout * 5 / 2,
                        "{name}: {:?}",
                        result.latency
                    );
                    assert_eq!(last.snapshot.recent_latency, Some(result.latency), "{name}");
                    // The Late came at the timeout, the answer 1.5 × timeout later.
                    assert!(
                        waited >= timeout,
                        "{name}: Late only {waited:?} before the answer"
                    );
                }
                _ => {
                    assert!(result.latency >= hang, "{name}: {:?}", result.latency);
                    assert!(
                        waited >= hang - timeout - Duration::from_millis(20),
                        "{name}: {waited:?}"
                    );
                    assert_eq!(last.snapshot.last_fail_code, Some("no_response"), "{name}");
                }
            }
            assert_eq!(last.snapshot.state, state, "{name}");
            assert_eq!(
                last.transition.as_ref().map(|t| t.to),
                Some(state),
                "{name}"
            );
            assert_eq!(last.snapshot.late_pending, 0, "{name}");
            assert_eq!(
                last.snapshot.consecutive_slow, 1,
                "{name}: the final adds no slow"
            );
        }
    }

    /// Reports until the first one with a result, for at most `limit`.
    async fn collect_until_final(
        rx: &mut mpsc::Receiver<Report>,
        limit: Duration,
    ) -> Vec<(tokio::time::Instant, Report)> {
        let mut reports = Vec::new();
        let deadline = tokio::time::Instant::now() + limit;
        while let Ok(Some(report)) = tokio::time::timeout_at(deadline, rx.recv()).await {
            let done = report.result.is_some();
            reports.push((tokio::time::Instant::now(), report));
            if done {
                break;
            }
        }
        reports
    }

    /// A hung backend is probed (and reported Late) at its normal cadence
    /// while earlier probes linger; lingering probes hold their permits, are
    /// bounded, and stop when the backend is removed.
    #[tokio::test]
    async fn hung_backend_keeps_its_cadence_and_lingering_probes_are_bounded() {
        let holder = Holder::start().await;
        let every = Duration::from_millis(100);
        let timeout = Duration::from_millis(50);
        let hang = Duration::from_secs(2);
        let spec = CheckSpec {
            jitter: 0.0,
            via: crate::health::spec::Via::Direct,
            auto_timeout: false,
            ..hang_spec(holder.addr.port(), every, timeout, hang)
        };
        let (mut scheduler, mut rx) = Scheduler::new(64);
        scheduler.upsert(1, holder.addr, spec.clone(), HealthState::Up);

        let reports = collect_for(&mut rx, Duration::from_millis(1200)).await;
        let lates: Vec<_> = reports
            .iter()
            .filter(|(_, r)| r.class.code() == "late")
            .map(|(at, r)| (*at, r.snapshot.late_pending))
            .collect();
        assert!(
            reports.iter().all(|(_, r)| r.result.is_none()),
            "a probe ended before hang_timeout"
        );
        // One probe every 100 ms from a random start in the first interval.
        assert!(lates.len() >= 9, "only {} probes in 1.2 s", lates.len());
        let max_gap = lates
            .windows(2)
            .map(|w| w[1].0 - w[0].0)
            .max()
            .expect("two");
        assert!(
            max_gap < every * 2,
            "a lingering probe delayed the next by {max_gap:?}"
        );
        let pending: Vec<u32> = lates.iter().map(|(_, p)| *p).collect();
        assert_eq!(
            pending,
            (1..=lates.len() as u32).collect::<Vec<_>>(),
            "late_pending"
        );
        let snap = scheduler.snapshot()[&1].clone();
        assert_eq!((snap.state, snap.consecutive_fail), (HealthState::Up, 0));
        let open = holder.open.load(Ordering::SeqCst);
        assert!(
            open >= lates.len() && open <= spec.max_in_flight(),
            "{open} connections held for {} late probes (at most {})",
            lates.len(),
            spec.max_in_flight()
        );

        scheduler.remove(1);
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        while holder.open.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            holder.open.load(Ordering::SeqCst),
            0,
            "lingering probes outlived the removal"
        );
        let accepted = holder.accepted.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            holder.accepted.load(Ordering::SeqCst),
            accepted,
            "probed after removal"
        );
    }

    /// Lingering probes keep their permits: with 3 permits, 3 probes linger
    /// and no fourth starts until one ends; a changed spec aborts them.
    #[tokio::test]
    async fn lingering_probes_hold_permits_and_die_with_their_task() {
        let holder = Holder::start().await;
        let every = Duration::from_millis(50);
        let spec = hang_spec(
            holder.addr.port(),
            every,
            Duration::from_millis(20),
            Duration::from_secs(2),
        );
        let (mut scheduler, mut rx) = Scheduler::new(3);
        scheduler.upsert(1, holder.addr, spec.clone(), HealthState::Up);
        let reports = collect_for(&mut rx, Duration::from_millis(600)).await;
        assert_eq!(reports.len(), 3, "{reports:#?}");
        assert!(reports.iter().all(|(_, r)| r.class.code() == "late"));
        assert_eq!(holder.open.load(Ordering::SeqCst), 3);
        assert_eq!(scheduler.snapshot()[&1].late_pending, 3);

        // A restart (changed spec) aborts the old task's probes and frees
        // their permits for the new one.
        let changed = CheckSpec { rise: 3, ..spec };
        scheduler.upsert(1, holder.addr, changed, HealthState::Up);
        assert_eq!(
            scheduler.snapshot()[&1].late_pending,
            0,
            "aborted probes still pending"
        );
        let reports = collect_for(&mut rx, Duration::from_millis(400)).await;
        assert!(
            !reports.is_empty() && reports.len() <= 3,
            "{} reports after the restart",
            reports.len()
        );
        assert!(holder.open.load(Ordering::SeqCst) <= 3);
        assert!(
            holder.accepted.load(Ordering::SeqCst) > 3,
            "the new task never probed"
        );
    }

    #[tokio::test]
    async fn changed_address_restarts_health() {
        let a = Server::canned(b"HTTP/1.1 200 OK\r\n\r\n").await;
        let b = silent_listener();
        let b_addr = b.local_addr().expect("local_addr");
        let (mut scheduler, mut rx) = Scheduler::new(8);
        scheduler.upsert(
            1,
            a.addr,
            fast_spec(a.addr.port(), Duration::from_millis(300)),
            HealthState::Unknown,
        );
        recv_until(&mut rx, Duration::from_secs(2), |r| r.transition.is_some()).await;
        assert_eq!(scheduler.snapshot()[&1].state, HealthState::Up);
        scheduler.upsert(
            1,
            b_addr,
            fast_spec(b_addr.port(), Duration::from_millis(300)),
            HealthState::Unknown,
        );
        assert_eq!(scheduler.snapshot()[&1].state, HealthState::Unknown);
        let reports = recv_until(&mut rx, Duration::from_secs(2), |r| r.transition.is_some()).await;
        let last = reports.last().expect("a report");
        assert_eq!(last.addr, b_addr);
        assert_eq!(
            last.transition.as_ref().map(|t| (t.from, t.to)),
            Some((HealthState::Unknown, HealthState::Down))
        );
    }
}
