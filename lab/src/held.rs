//! Held connections: what the cluster's convergence is measured with.
//!
//! The load client's long `/stream` connections cannot time a load
//! balancer's outage: with direct server return the stream flows from the
//! backend straight to the client, so it keeps arriving while the node that
//! carries the client's ACKs is dead, until the backend's congestion window
//! runs out and retransmission backs off. Here every connection instead
//! exchanges one keep-alive request and its answer every `interval`: each
//! request crosses the load balancer, so the time of each connection's
//! exchanges says when its path through the load balancer was broken and
//! when it carried packets again. Every answer names its backend
//! (`X-Backend`), so a connection that continued elsewhere would show it.
//!
//! An exchange is not abandoned after a timeout (TCP retransmits the request
//! until the path comes back, and that is what is measured); a connection
//! whose exchange is still waiting when the run ends ended `stuck`.

use std::{
    io,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use tokio::{io::AsyncWriteExt as _, net::TcpStream, task::JoinSet};

use crate::{client::Outcome, http};

/// What to hold.
#[derive(Debug, Clone)]
pub struct HeldOptions {
    pub target: SocketAddr,
    /// Connections opened at the start, all at once.
    pub connections: u32,
    /// Pause between one exchange's answer and the next request.
    pub interval: Duration,
    /// Exchanges start only within this time (or until the run is
    /// stopped, [`HeldRun::stop`]); one in flight at its end may finish
    /// within [`HeldOptions::grace`].
    pub duration: Duration,
    /// Bound on connecting and the first exchange: a connection that
    /// cannot be opened is reported, not waited for.
    pub setup_timeout: Duration,
    /// How long an exchange in flight when `duration` ends may still take.
    pub grace: Duration,
    pub path: String,
}

impl HeldOptions {
    pub fn new(target: SocketAddr, connections: u32) -> Self {
        Self {
            target,
            connections,
            interval: Duration::from_millis(20),
            duration: Duration::from_secs(10),
            setup_timeout: Duration::from_secs(2),
            grace: Duration::from_secs(3),
            path: "/api".to_string(),
        }
    }
}

/// How one held connection fared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldConn {
    pub id: u32,
    /// The backends that answered, distinct, in the order they first did:
    /// one for a connection that stayed where it was.
    pub backends: Vec<String>,
    /// When each successful exchange got its answer, ms on the run's clock.
    pub ok_ms: Vec<u64>,
    /// `open` (answering at the end of the run), `stuck` (an exchange still
    /// waiting at the end), or how it broke (`reset`, `closed`, ...).
    pub end: String,
    /// When it broke, if it did.
    pub ended_ms: Option<u64>,
}

impl HeldConn {
    /// Whether it answered to the end, on one backend.
    pub fn kept(&self) -> bool {
        self.end == "open" && self.backends.len() == 1
    }

    /// When its first exchange answered after `t_ms` (run clock), if one did.
    pub fn first_ok_after(&self, t_ms: u64) -> Option<u64> {
        self.ok_ms.iter().copied().find(|&ok| ok > t_ms)
    }
}

/// Every held connection of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldReport {
    pub interval_ms: u64,
    pub conns: Vec<HeldConn>,
}

/// What an outage starting at one moment did to the held connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Convergence {
    /// Connections open at the moment.
    pub held: usize,
    /// Of those, the ones that had to wait: no answer within `slack` of
    /// the moment (the others did not pass through what broke).
    pub waited: usize,
    /// Those that never answered again (reset, stuck, or moved backend).
    pub lost: usize,
    /// From the moment to the last connection answering again, ms: the
    /// convergence time as the clients lived it. `None` when none was held.
    pub last_back_ms: Option<u64>,
}

impl HeldReport {
    /// Connections that answered to the end, each on one backend.
    pub fn kept(&self) -> usize {
        self.conns.iter().filter(|c| c.kept()).count()
    }

    /// Connections that broke (reset, closed, stuck) or changed backend.
    pub fn broken(&self) -> usize {
        self.conns.len() - self.kept()
    }

    /// How the connections came back from an outage that began at `t_ms`
    /// (run clock). A connection is held if it had answered by then and
    /// had not broken before it; one that waited longer than `slack` for
    /// its next answer went through what broke. The last one back sets the
    /// convergence time; one that never answered again is lost and not
    /// part of it.
    pub fn convergence(&self, t_ms: u64, slack: Duration) -> Convergence {
        let slack = slack.as_millis() as u64;
        let mut c = Convergence::default();
        for conn in &self.conns {
            let held = conn.ok_ms.first().is_some_and(|&first| first <= t_ms)
                && conn.ended_ms.is_none_or(|end| end > t_ms);
            if !held {
                continue;
            }
            c.held += 1;
            match conn.first_ok_after(t_ms) {
                Some(back) if conn.backends.len() == 1 => {
                    let after = back - t_ms;
                    if after > slack {
                        c.waited += 1;
                    }
                    c.last_back_ms = Some(c.last_back_ms.unwrap_or(0).max(after));
                }
                _ => {
                    c.waited += 1;
                    c.lost += 1;
                }
            }
        }
        c
    }

    /// Answered exchanges per backend, for a line of the demo.
    pub fn per_backend(&self) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for c in &self.conns {
            if let Some(b) = c.backends.first() {
                *m.entry(b.clone()).or_insert(0) += 1;
            }
        }
        m
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// One exchange: the request out, the answer's backend back.
async fn exchange(s: &mut TcpStream, req: &[u8]) -> io::Result<(u16, Option<String>, bool)> {
    s.write_all(req).await?;
    let mut buf = Vec::new();
    let resp = http::read_response(s, &mut buf).await?;
    let backend = resp.head.header("x-backend").map(str::to_string);
    Ok((resp.head.status, backend, resp.head.closes()))
}

/// Notes an answer: its backend and time; `Some(end)` when the connection
/// cannot go on.
fn note(
    conn: &mut HeldConn,
    at: u64,
    answer: io::Result<(u16, Option<String>, bool)>,
) -> Option<String> {
    match answer {
        Ok((200, backend, closes)) => {
            let b = backend.unwrap_or_else(|| "?".to_string());
            if !conn.backends.contains(&b) {
                conn.backends.push(b);
            }
            conn.ok_ms.push(at);
            closes.then(|| "closed".to_string())
        }
        Ok((status, _, _)) => Some(Outcome::from_status(status).name().to_string()),
        Err(e) => Some(Outcome::from_io(&e).name().to_string()),
    }
}

async fn hold(id: u32, opts: Arc<HeldOptions>, start: Instant, stop: Arc<AtomicBool>) -> HeldConn {
    let mut conn = HeldConn {
        id,
        ..HeldConn::default()
    };
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: xlb-held\r\nConnection: keep-alive\r\n\r\n",
        opts.path, opts.target
    )
    .into_bytes();
    let mut deadline = start + opts.duration;
    let setup = tokio::time::timeout(opts.setup_timeout, async {
        let mut s = TcpStream::connect(opts.target).await?;
        let _ = s.set_nodelay(true);
        let answer = exchange(&mut s, &req).await;
        Ok::<_, io::Error>((s, answer))
    })
    .await;
    let mut stream = match setup {
        Ok(Ok((s, answer))) => match note(&mut conn, ms(start.elapsed()), answer) {
            None => s,
            Some(end) => return ended(conn, end, start),
        },
        Ok(Err(e)) => return ended(conn, Outcome::from_io(&e).name().to_string(), start),
        Err(_) => return ended(conn, "timed_out".to_string(), start),
    };
    loop {
        tokio::time::sleep(opts.interval).await;
        if stop.load(Ordering::Relaxed) {
            deadline = deadline.min(Instant::now());
        }
        if Instant::now() >= deadline {
            conn.end = "open".to_string();
            return conn;
        }
        let answer =
            tokio::time::timeout_at((deadline + opts.grace).into(), exchange(&mut stream, &req))
                .await;
        let Ok(answer) = answer else {
            conn.end = "stuck".to_string();
            return conn;
        };
        if let Some(end) = note(&mut conn, ms(start.elapsed()), answer) {
            return ended(conn, end, start);
        }
    }
}

fn ended(mut conn: HeldConn, end: String, start: Instant) -> HeldConn {
    conn.end = end;
    conn.ended_ms = Some(ms(start.elapsed()));
    conn
}

/// Opens and holds the connections of `opts` until its duration is over;
/// returns how each fared. `start` is the run's clock (its 0 ms); `stop`
/// ends it early.
pub async fn run_held(opts: HeldOptions, start: Instant, stop: Arc<AtomicBool>) -> HeldReport {
    let interval_ms = ms(opts.interval);
    let opts = Arc::new(opts);
    let mut set = JoinSet::new();
    for id in 0..opts.connections {
        set.spawn(hold(id, opts.clone(), start, stop.clone()));
    }
    let mut conns = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(c) = r {
            conns.push(c);
        }
    }
    conns.sort_by_key(|c| c.id);
    HeldReport { interval_ms, conns }
}

/// Held connections running on their own thread in a namespace.
pub struct HeldRun {
    started: Instant,
    started_unix_ms: u64,
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Result<HeldReport, crate::scenario::ScenarioError>>,
}

impl HeldRun {
    /// Time on the run's clock (its reports' ms).
    pub fn now_ms(&self) -> u64 {
        ms(self.started.elapsed())
    }

    /// A wall-clock time (ms since the epoch, as xlb's events carry) on the
    /// run's clock; 0 for one before the run.
    pub fn run_ms(&self, unix_ms: u64) -> u64 {
        unix_ms.saturating_sub(self.started_unix_ms)
    }

    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Ends the run before its duration: no exchange starts after this.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Waits for the report.
    pub fn join(self) -> Result<HeldReport, crate::scenario::ScenarioError> {
        match self.handle.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Starts [`run_held`] on a thread inside namespace `ns` (the client's);
/// returns once its clock has started.
pub fn start_held_in(
    ns: &str,
    opts: HeldOptions,
) -> Result<HeldRun, crate::scenario::ScenarioError> {
    use crate::scenario::ScenarioError;
    let ns = ns.to_string();
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, u64)>();
    let stop = Arc::new(AtomicBool::new(false));
    let stop_run = stop.clone();
    let handle = std::thread::spawn(move || -> Result<HeldReport, ScenarioError> {
        crate::topology::in_netns(&ns, move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|e| ScenarioError::Io {
                    what: "building the held connections' tokio runtime".to_string(),
                    source: e,
                })?;
            let start = Instant::now();
            let _ = tx.send((start, lb_ctl::now_unix_ms()));
            Ok(rt.block_on(run_held(opts, start, stop_run)))
        })?
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok((started, started_unix_ms)) => Ok(HeldRun {
            started,
            started_unix_ms,
            stop,
            handle,
        }),
        Err(_) => match handle.join() {
            Ok(Err(e)) => Err(e),
            Ok(Ok(_)) => Err(ScenarioError::Client("finished before starting".into())),
            Err(panic) => std::panic::resume_unwind(panic),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(id: u32, ok_ms: &[u64], end: &str, ended_ms: Option<u64>) -> HeldConn {
        HeldConn {
            id,
            backends: vec!["b1".to_string()],
            ok_ms: ok_ms.to_vec(),
            end: end.to_string(),
            ended_ms,
        }
    }

    #[test]
    fn convergence_is_the_last_connection_back() {
        let slack = Duration::from_millis(100);
        let cases: [(&str, Vec<HeldConn>, Convergence); 5] = [
            (
                "one through the dead node, one not",
                vec![
                    conn(0, &[900, 1020, 1040], "open", None),
                    conn(1, &[950, 1650, 1670], "open", None),
                ],
                Convergence {
                    held: 2,
                    waited: 1,
                    lost: 0,
                    last_back_ms: Some(650),
                },
            ),
            (
                "a reset connection is lost, not the last one back",
                vec![
                    conn(0, &[900, 1020], "open", None),
                    conn(1, &[900], "reset", Some(1300)),
                ],
                Convergence {
                    held: 2,
                    waited: 1,
                    lost: 1,
                    last_back_ms: Some(20),
                },
            ),
            (
                "stuck to the end is lost",
                vec![conn(0, &[900], "stuck", None)],
                Convergence {
                    held: 1,
                    waited: 1,
                    lost: 1,
                    last_back_ms: None,
                },
            ),
            (
                "opened after the moment or broken before it: not held",
                vec![
                    conn(0, &[1200, 1300], "open", None),
                    conn(1, &[500], "reset", Some(800)),
                ],
                Convergence::default(),
            ),
            (
                "an answer exactly at the moment is before it",
                vec![conn(0, &[1000, 1400], "open", None)],
                Convergence {
                    held: 1,
                    waited: 1,
                    lost: 0,
                    last_back_ms: Some(400),
                },
            ),
        ];
        for (name, conns, want) in cases {
            let r = HeldReport {
                interval_ms: 20,
                conns,
            };
            assert_eq!(r.convergence(1000, slack), want, "case {name}");
        }
    }

    #[test]
    fn a_connection_answered_by_another_backend_is_lost() {
        let mut moved = conn(0, &[900, 1500], "open", None);
        moved.backends.push("b2".to_string());
        let r = HeldReport {
            interval_ms: 20,
            conns: vec![moved, conn(1, &[900, 1100], "open", None)],
        };
        assert_eq!((r.kept(), r.broken()), (1, 1));
        let c = r.convergence(1000, Duration::from_millis(50));
        assert_eq!((c.held, c.lost, c.last_back_ms), (2, 1, Some(100)));
    }

    /// A keep-alive HTTP server on loopback naming itself `b1`; the
    /// connection it accepts second is reset after its third answer.
    async fn server() -> SocketAddr {
        use tokio::io::AsyncReadExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            for n in 0.. {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    for answered in 0.. {
                        if n == 1 && answered == 3 {
                            // SO_LINGER 0: close with a reset.
                            let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                            return;
                        }
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                        let answer =
                            "HTTP/1.1 200 OK\r\nX-Backend: b1\r\nContent-Length: 2\r\n\r\nok";
                        if s.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    #[test]
    fn held_connections_answer_until_stopped_and_report_a_reset() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let addr = server().await;
            let mut opts = HeldOptions::new(addr, 3);
            opts.duration = Duration::from_secs(60);
            let stop = Arc::new(AtomicBool::new(false));
            let start = Instant::now();
            let run = tokio::spawn(run_held(opts, start, stop.clone()));
            tokio::time::sleep(Duration::from_millis(400)).await;
            stop.store(true, Ordering::Relaxed);
            let r = tokio::time::timeout(Duration::from_secs(5), run)
                .await
                .expect("stopping ends the run, long before its duration")
                .unwrap();
            assert_eq!(r.conns.len(), 3);
            assert_eq!((r.kept(), r.broken()), (2, 1), "{r:?}");
            let reset = r.conns.iter().find(|c| !c.kept()).unwrap();
            assert_eq!(reset.ok_ms.len(), 3, "{reset:?}");
            assert!(
                matches!(reset.end.as_str(), "reset" | "closed"),
                "{reset:?}"
            );
            for c in r.conns.iter().filter(|c| c.kept()) {
                assert_eq!(c.backends, ["b1"]);
                assert!(c.ok_ms.len() >= 5, "an answer every 20 ms: {c:?}");
                assert!(c.ok_ms.windows(2).all(|w| w[0] <= w[1]));
            }
        });
    }

    #[test]
    fn note_keeps_backends_distinct_and_ends_on_errors() {
        let mut c = HeldConn::default();
        assert_eq!(note(&mut c, 5, Ok((200, Some("b2".into()), false))), None);
        assert_eq!(note(&mut c, 9, Ok((200, Some("b2".into()), false))), None);
        assert_eq!(
            (c.backends.clone(), c.ok_ms.clone()),
            (vec!["b2".into()], vec![5, 9])
        );
        assert_eq!(
            note(&mut c, 12, Ok((200, Some("b2".into()), true))).as_deref(),
            Some("closed")
        );
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        assert_eq!(note(&mut c, 20, Err(reset)).as_deref(), Some("reset"));
        assert!(note(&mut c, 21, Ok((503, None, false))).is_some());
        assert_eq!(c.ok_ms, [5, 9, 12], "failures add no answer time");
    }
}
