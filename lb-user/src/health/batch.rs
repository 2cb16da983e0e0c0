//! The prober's report path: reports queued on the prober's thread and
//! handed to the receiver in batches, so that the daemon's main loop wakes
//! once per batch rather than once per probe.
//!
//! A report that may change a decision goes at once, with everything queued
//! before it: a change of health, and any probe that did not pass on time
//! (slow, late, failed, a local error), which is what the VIP policy's
//! outlier and hang detection run on. Only passing, on-time probes that
//! change nothing wait, for at most [`FLUSH_EVERY`]. Order is kept: every
//! report goes through one queue and one sender.
//!
//! Measured (1,000 backends at 1/s): before, one `futex` wake per probe in
//! the prober and one wakeup of the main loop per probe (925 a second in
//! `xlb-health-bench --only cost-lab`, 44 after). In the loopback cost
//! figure, the build before and this one alternated with HAProxy's checks
//! in every run as the yardstick, CPU per probe ÷ HAProxy's per check went
//! from 1.11–1.20 to 0.97–1.02 with a new connection per probe, and from
//! 0.66–0.73 to 0.53–0.55 with `reuse_connection`; the detection figure
//! did not move (60 trials per profile and build; docs/benchmarks.md).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};

use super::probe::ProbeClass;
use super::scheduler::Report;

/// The longest a calm report waits: 2 % of a 1 s interval, and far below
/// any `timeout` (the policy's scale).
pub const FLUSH_EVERY: Duration = Duration::from_millis(20);

/// Calm reports kept while the receiver does not take them; past this,
/// new calm reports are dropped (the next report's snapshot carries the
/// same state). Urgent ones are always kept.
const QUEUE_CAP: usize = 16_384;

/// Whether `r` must reach the receiver at once.
pub fn is_urgent(r: &Report) -> bool {
    r.transition.is_some() || !matches!(r.class, ProbeClass::Ok)
}

/// The queue between the backend tasks and [`flush_loop`].
#[derive(Default)]
pub struct Batcher {
    queue: Mutex<Vec<Report>>,
    wake: Notify,
    urgent: AtomicBool,
}

impl Batcher {
    fn lock(&self) -> MutexGuard<'_, Vec<Report>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `r`; wakes the flusher for the first report of a batch and
    /// for an urgent one.
    pub fn push(&self, r: Report) {
        let urgent = is_urgent(&r);
        let first = {
            let mut q = self.lock();
            if !urgent && q.len() >= QUEUE_CAP {
                return;
            }
            q.push(r);
            q.len() == 1
        };
        if urgent {
            self.urgent.store(true, Ordering::Release);
        }
        if urgent || first {
            self.wake.notify_one();
        }
    }

    fn take(&self) -> Vec<Report> {
        std::mem::take(&mut *self.lock())
    }

    /// Waits until a batch is due: at once after an urgent report,
    /// otherwise `every` after the first one (or sooner, if an urgent one
    /// comes meanwhile).
    async fn due(&self, every: Duration) {
        self.wake.notified().await;
        if self.urgent.swap(false, Ordering::AcqRel) {
            return;
        }
        let urgent = async {
            loop {
                self.wake.notified().await;
                if self.urgent.swap(false, Ordering::AcqRel) {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(every, urgent).await;
    }
}

/// Hands `batcher`'s reports to `tx` in order, batch by batch (calm ones
/// after at most `every`, [`FLUSH_EVERY`] in the scheduler), until
/// aborted. A dropped receiver is not a reason to stop: the queue is still
/// emptied.
pub async fn flush_loop(batcher: Arc<Batcher>, tx: mpsc::Sender<Report>, every: Duration) {
    loop {
        batcher.due(every).await;
        for report in batcher.take() {
            let _ = tx.send(report).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Instant;

    use super::super::machine::{HealthMachine, HealthState, Transition};
    use super::super::probe::FailReason;
    use super::*;

    fn report(id: u64, class: ProbeClass, transition: bool) -> Report {
        let machine = HealthMachine::adopted(HealthState::Up, 2, 3, Instant::now());
        Report {
            id,
            addr: SocketAddr::from(([127, 0, 0, 1], 80)),
            class,
            result: None,
            transition: transition.then(|| Transition {
                from: HealthState::Up,
                to: HealthState::Down,
                reason: "test".to_owned(),
            }),
            snapshot: machine.snapshot(),
        }
    }

    #[test]
    fn urgent_reports() {
        let t = Duration::from_secs(1);
        let cases = [
            ("ok", ProbeClass::Ok, false, false),
            ("ok with a transition", ProbeClass::Ok, true, true),
            ("late", ProbeClass::Late { timeout: t }, false, true),
            (
                "slow",
                ProbeClass::Slow {
                    latency: t,
                    timeout: t,
                },
                false,
                true,
            ),
            (
                "failed",
                ProbeClass::Failed(FailReason::ConnectionRefused),
                false,
                true,
            ),
        ];
        for (name, class, transition, want) in cases {
            assert_eq!(is_urgent(&report(1, class, transition)), want, "{name}");
        }
    }

    /// Calm reports wait for the batch; an urgent one brings them along at
    /// once, in order. (The batch period is long here, so that "at once"
    /// and "waited" cannot be confused on a loaded machine.)
    #[tokio::test]
    async fn batches_in_order() {
        let every = Duration::from_secs(30);
        let batcher = Arc::new(Batcher::default());
        let (tx, mut rx) = mpsc::channel(64);
        let flusher = tokio::spawn(flush_loop(Arc::clone(&batcher), tx, every));
        batcher.push(report(1, ProbeClass::Ok, false));
        batcher.push(report(2, ProbeClass::Ok, false));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(rx.try_recv().is_err(), "calm reports went before the batch");
        let late = ProbeClass::Late {
            timeout: Duration::from_secs(1),
        };
        batcher.push(report(3, late, false));
        let mut ids = Vec::new();
        while ids.len() < 3 {
            let r = tokio::time::timeout(every / 3, rx.recv()).await;
            ids.push(r.expect("an urgent report waited").unwrap().id);
        }
        assert_eq!(ids, [1, 2, 3]);
        flusher.abort();
    }
}
