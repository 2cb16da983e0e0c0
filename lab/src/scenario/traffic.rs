//! The client namespace: load from the load client, calls to the backends'
//! admin listeners (faults, `/stats`, `/peers`), single HTTP requests; and
//! the flood namespace's name.

use std::{
    net::SocketAddr,
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use lb_ctl::now_unix_ms;

use super::{ADMIN_PORT, ADMIN_TIMEOUT, LabRun, Result, ScenarioError, io_err};
use crate::{
    backend::{BackendStats, Fault, PeerCounts, remote_peers, remote_set_fault, remote_stats},
    client::{LoadOptions, Report, run_load},
    http,
    topology::in_netns,
};

impl LabRun {
    /// Backend `i`'s admin listener (reachable from the client namespace).
    pub fn backend_admin(&self, i: usize) -> SocketAddr {
        SocketAddr::new(self.lab().backend_v4(i).into(), ADMIN_PORT)
    }

    /// Runs `f` (async) on a runtime inside the client namespace.
    fn in_client<F, T>(&self, f: F) -> Result<T>
    where
        F: std::future::Future<Output = T> + Send,
        T: Send,
    {
        let ns = self.lab().ns_client();
        in_netns(&ns, move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(io_err("building a tokio runtime"))?;
            Ok(rt.block_on(f))
        })?
    }

    /// Switches backend `i`'s fault through its admin listener.
    pub fn set_fault(&self, i: usize, fault: Fault) -> Result<BackendStats> {
        let addr = self.backend_admin(i);
        self.in_client(remote_set_fault(addr, fault, ADMIN_TIMEOUT))?
            .map_err(|source| ScenarioError::Admin {
                backend: i,
                addr,
                source,
            })
    }

    /// Backend `i`'s `/stats`.
    pub fn backend_stats(&self, i: usize) -> Result<BackendStats> {
        let addr = self.backend_admin(i);
        self.in_client(remote_stats(addr, ADMIN_TIMEOUT))?
            .map_err(|source| ScenarioError::Admin {
                backend: i,
                addr,
                source,
            })
    }

    /// Backend `i`'s `/peers`: connections it accepted per peer address
    /// since it started.
    pub fn backend_peers(&self, i: usize) -> Result<PeerCounts> {
        let addr = self.backend_admin(i);
        self.in_client(remote_peers(addr, ADMIN_TIMEOUT))?
            .map_err(|source| ScenarioError::Admin {
                backend: i,
                addr,
                source,
            })
    }

    /// Every backend's `/peers`, b1 first.
    pub fn peers(&self) -> Result<Vec<PeerCounts>> {
        (1..=self.backend_count())
            .map(|i| self.backend_peers(i))
            .collect()
    }

    /// The flooding client's namespace.
    ///
    /// # Errors
    ///
    /// The lab was built without one ([`RunOptions::flooder`](super::RunOptions::flooder)).
    pub fn flood_ns(&self) -> Result<String> {
        self.lab().ns_flood().ok_or_else(|| {
            ScenarioError::Invalid(
                "this lab has no flood namespace; bring it up with RunOptions { flooder: true, .. }"
                    .to_string(),
            )
        })
    }

    /// One HTTP GET from the client namespace, `Connection: close`; returns
    /// the status and body.
    pub fn http_get(
        &self,
        addr: SocketAddr,
        path: &str,
        timeout: Duration,
    ) -> Result<(u16, String)> {
        let resp = self
            .in_client(http::request(addr, "GET", path, timeout))?
            .map_err(io_err(format!(
                "GET http://{addr}{path} from the client namespace"
            )))?;
        Ok((
            resp.head.status,
            String::from_utf8_lossy(&resp.body).into_owned(),
        ))
    }

    /// Runs the load client in the client namespace until it is done.
    pub fn run_client(&self, opts: LoadOptions) -> Result<Report> {
        self.start_client(opts)?.join()
    }

    /// Starts the load client in the client namespace on a thread of its
    /// own; returns once it has started.
    pub fn start_client(&self, opts: LoadOptions) -> Result<ClientRun> {
        start_client_in(&self.lab().ns_client(), opts)
    }
}

/// A load client running on its own thread in the client namespace.
pub struct ClientRun {
    started: Instant,
    started_unix_ms: u64,
    handle: thread::JoinHandle<Result<Report>>,
}

impl ClientRun {
    /// When the client's clock started (its timeline's 0), ms since the epoch.
    pub fn started_unix_ms(&self) -> u64 {
        self.started_unix_ms
    }

    /// Time since the client's timeline began.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Milliseconds on the client's timeline for a wall-clock time.
    pub fn timeline_ms(&self, unix_ms: u64) -> i64 {
        unix_ms as i64 - self.started_unix_ms as i64
    }

    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Waits for the report.
    pub fn join(self) -> Result<Report> {
        match self.handle.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Starts [`run_load`] on a thread inside namespace `ns`.
pub fn start_client_in(ns: &str, opts: LoadOptions) -> Result<ClientRun> {
    let ns = ns.to_string();
    let (tx, rx) = mpsc::channel::<(Instant, u64)>();
    let handle = thread::spawn(move || -> Result<Report> {
        in_netns(&ns, move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(io_err("building the client's tokio runtime"))?;
            // run_load's clock starts right after this (it validates first).
            let _ = tx.send((Instant::now(), now_unix_ms()));
            rt.block_on(run_load(opts))
                .map_err(|e| ScenarioError::Client(e.to_string()))
        })?
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok((started, started_unix_ms)) => Ok(ClientRun {
            started,
            started_unix_ms,
            handle,
        }),
        Err(_) => match handle.join() {
            Ok(Err(e)) => Err(e),
            Ok(Ok(_)) => Err(ScenarioError::Client("finished before starting".into())),
            Err(panic) => std::panic::resume_unwind(panic),
        },
    }
}
