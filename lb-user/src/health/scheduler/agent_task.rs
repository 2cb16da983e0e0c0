//! The agent's poller (`agent_port`): one task per backend with an agent,
//! beside its probe task, under the same concurrency bound, aborted with
//! it. Reports only when what the agent says changes (its words, weight
//! or error), so a steady agent costs the daemon nothing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use rand::Rng as _;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::{Batcher, Report, Shared, lock};
use crate::health::agent::{AgentCheck, poll::poll};
use crate::health::machine::jittered;
use crate::health::probe::ProbeClass;
use crate::health::spec::CheckSpec;

impl super::Scheduler {
    /// Starts polling backend `id`'s agent if `spec` has one (the task of
    /// `generation`); without one, forgets what an earlier agent said.
    pub(super) fn start_agent(
        &self,
        id: u64,
        generation: u64,
        addr: SocketAddr,
        spec: &CheckSpec,
    ) -> Option<JoinHandle<()>> {
        let Some(agent) = spec.agent.clone() else {
            if let Some(entry) = lock(&self.shared).get_mut(&id) {
                *entry.machine.agent_mut() = None;
            }
            return None;
        };
        Some(self.runtime.spawn(run_agent(AgentTask {
            id,
            generation,
            addr,
            agent,
            jitter: spec.jitter,
            shared: Arc::clone(&self.shared),
            semaphore: Arc::clone(&self.semaphore),
            reports: Arc::clone(&self.reports),
        })))
    }
}

struct AgentTask {
    id: u64,
    generation: u64,
    /// The backend (its address; the port is `agent.port`).
    addr: SocketAddr,
    agent: AgentCheck,
    /// The check's jitter, which the agent's period shares.
    jitter: f64,
    shared: Shared,
    semaphore: Arc<Semaphore>,
    reports: Arc<Batcher>,
}

async fn run_agent(task: AgentTask) {
    let target = SocketAddr::new(task.addr.ip(), task.agent.port);
    // Spread like the probes' first round: agents of backends added
    // together are not polled in lockstep.
    let nanos = u64::try_from(task.agent.interval.as_nanos()).unwrap_or(u64::MAX);
    let first = rand::thread_rng().gen_range(0..nanos.max(1));
    tokio::time::sleep(std::time::Duration::from_nanos(first)).await;
    loop {
        // The semaphore is never closed; if it were, stop quietly.
        let Ok(permit) = Arc::clone(&task.semaphore).acquire_owned().await else {
            return;
        };
        let result = poll(target, &task.agent).await;
        drop(permit);
        let snapshot = {
            let mut map = lock(&task.shared);
            let Some(entry) = map
                .get_mut(&task.id)
                .filter(|e| e.generation == task.generation)
            else {
                // Removed or restarted while this poll ran.
                return;
            };
            let status = entry.machine.agent_mut().get_or_insert_default();
            let changed = status.record(result, Instant::now());
            changed.then(|| entry.machine.snapshot())
        };
        if let Some(snapshot) = snapshot {
            // No probe result: the daemon records the snapshot (which
            // carries the agent's status) and runs the VIP policy.
            task.reports.push(Report {
                id: task.id,
                addr: task.addr,
                class: ProbeClass::Ok,
                result: None,
                transition: None,
                snapshot,
            });
        }
        let delay = jittered(task.agent.interval, task.jitter, &mut rand::thread_rng());
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::io::AsyncWriteExt as _;
    use tokio::net::TcpListener;

    use super::super::{Scheduler, mpsc};
    use crate::health::agent::{AgentCheck, AgentCondition, AgentError};
    use crate::health::machine::HealthState;
    use crate::health::spec::CheckSpec;
    use crate::health::testutil::{Server, http_spec};

    /// An agent on 127.0.0.1 answering every connection with the current
    /// `line`, counting connections.
    async fn agent(line: Arc<Mutex<&'static [u8]>>, polls: Arc<AtomicUsize>) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                polls.fetch_add(1, Ordering::SeqCst);
                let answer = *line.lock().unwrap();
                let _ = s.write_all(answer).await;
            }
        });
        port
    }

    async fn wait_agent(
        rx: &mut mpsc::Receiver<super::Report>,
        want: impl Fn(&crate::health::agent::AgentStatus) -> bool,
    ) -> crate::health::agent::AgentStatus {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let r = tokio::time::timeout_at(deadline, rx.recv())
                .await
                .expect("the agent's status within 5s")
                .expect("reports");
            if let Some(a) = r.snapshot.agent.filter(|a| want(a)) {
                return a;
            }
        }
    }

    /// The agent is polled beside the probe, its changes reported with the
    /// snapshot, its failures shown without touching health, and it stops
    /// with the backend.
    #[tokio::test]
    async fn agent_is_polled_reported_and_removed_with_the_backend() {
        let server = Server::canned(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
        let line = Arc::new(Mutex::new(&b"drain #deploy\n"[..]));
        let polls = Arc::new(AtomicUsize::new(0));
        let port = agent(Arc::clone(&line), Arc::clone(&polls)).await;
        let every = Duration::from_millis(50);
        let spec = CheckSpec {
            interval: every,
            fast_interval: every,
            agent: Some(AgentCheck {
                port,
                interval: every,
                timeout: Duration::from_millis(500),
                send: Vec::new(),
            }),
            ..http_spec(server.addr.port(), Duration::from_millis(500))
        };
        let (mut sched, mut rx) = Scheduler::new(4);
        sched.upsert(1, server.addr, spec.clone(), HealthState::Unknown);
        let a = wait_agent(&mut rx, |a| a.condition == AgentCondition::Drain).await;
        assert_eq!(a.text.as_deref(), Some("deploy"));

        *line.lock().unwrap() = b"up 50%\n";
        let a = wait_agent(&mut rx, |a| a.weight_percent == 50).await;
        assert_eq!(a.condition, AgentCondition::Normal);

        // Garbage: shown, last words kept, health untouched.
        *line.lock().unwrap() = b"\x1b]0;pwned\x07\n";
        let a = wait_agent(&mut rx, |a| a.error.is_some()).await;
        assert!(matches!(a.error, Some(AgentError::Malformed { .. })));
        assert_eq!(
            (a.condition, a.weight_percent),
            (AgentCondition::Normal, 50)
        );
        let snap = sched.snapshot()[&1].clone();
        assert_eq!(snap.state, HealthState::Up, "the main probe decides");

        // A spec without the agent forgets it.
        sched.upsert(
            1,
            server.addr,
            CheckSpec {
                agent: None,
                ..spec.clone()
            },
            HealthState::Unknown,
        );
        assert_eq!(sched.snapshot()[&1].agent, None);
        sched.upsert(1, server.addr, spec, HealthState::Unknown);
        wait_agent(&mut rx, |_| true).await;

        sched.remove(1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let after = polls.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(polls.load(Ordering::SeqCst), after, "polled after removal");
    }
}
