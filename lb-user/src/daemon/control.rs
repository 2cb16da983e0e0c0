//! The main loop's doors: requests from the control socket come in over a
//! channel ([`Bridge`]) and are answered by [`Daemon::handle`] on the main
//! loop; the metrics endpoint reads what the loop publishes every tick
//! ([`Published`]).

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::{
    net::UnixListener,
    sync::{broadcast, mpsc, oneshot},
};
use tracing::error;

use super::Daemon;
use crate::{
    ctl::{self, Event, Request, Response, StatusReport},
    metrics::{self, MetricsExtra},
};

/// A request and where its answer goes.
pub(super) type Call = (Request, oneshot::Sender<Response>);

impl Daemon {
    /// Answers one control request (on the main loop).
    pub(super) fn handle(&mut self, req: Request) -> Response {
        let res: anyhow::Result<Response> = match req {
            Request::Status => {
                self.status_asked = Some(Instant::now());
                Ok(Response::Status(self.status()))
            }
            Request::Events { since_seq, .. } => {
                let since = since_seq.unwrap_or(0);
                Ok(Response::Events(
                    self.events
                        .iter()
                        .filter(|e| e.seq > since)
                        .cloned()
                        .collect(),
                ))
            }
            Request::Explain {
                protocol,
                client,
                vip,
            } => self
                .explain(&protocol.to_string(), client, vip)
                .map(Response::Explain),
            Request::Drain {
                vip,
                backend,
                deadline_ms,
            } => self
                .set_drain(&vip, &backend, true, deadline_ms.map(Duration::from_millis))
                .map(|m| Response::Ok { message: m }),
            Request::Enable { vip, backend } => self
                .set_drain(&vip, &backend, false, None)
                .map(|m| Response::Ok { message: m }),
            Request::Reload => self
                .reload_by("xlb reload")
                .map(|m| Response::Ok { message: m }),
            Request::Block {
                list,
                prefix,
                vip,
                ttl_ms,
                reason,
                action,
            } => super::guard::parse_prefix(&prefix).and_then(|p| {
                self.add_list_entry(
                    list,
                    vip.as_deref(),
                    p,
                    action,
                    ctl::EntryOrigin::Runtime,
                    ttl_ms.map(Duration::from_millis),
                    reason.unwrap_or_default(),
                )
                .map(|m| Response::Ok { message: m })
            }),
            Request::Unblock { list, prefix, vip } => super::guard::parse_prefix(&prefix)
                .and_then(|p| self.remove_list_entry(list, vip.as_deref(), p))
                .map(|m| Response::Ok { message: m }),
            Request::Blocks => Ok(Response::Blocks(self.blocks())),
            Request::Sources { vip } => self.sources_report(vip.as_deref()).map(Response::Sources),
        };
        res.unwrap_or_else(|e| Response::Error {
            message: format!("{e:#}"),
        })
    }
}

/// Serves the control socket on its own task; its requests come out of the
/// returned channel, for the main loop to answer.
pub(super) fn spawn_control(
    listener: UnixListener,
    events: broadcast::Sender<Event>,
) -> mpsc::Receiver<Call> {
    let (calls, rx) = mpsc::channel::<Call>(64);
    tokio::spawn(ctl::serve(listener, Arc::new(Bridge { calls, events })));
    rx
}

/// Serves metrics on `addr` on its own task, from what the main loop
/// publishes in `published`.
pub(super) fn spawn_metrics(addr: SocketAddr, published: Arc<Mutex<(StatusReport, MetricsExtra)>>) {
    let source = Arc::new(Published(published));
    tokio::spawn(async move {
        if let Err(e) = metrics::serve(addr, source).await {
            error!("metrics on {addr}: {e:#}");
        }
    });
}

/// The control socket's side: forwards each request to the main loop.
struct Bridge {
    calls: mpsc::Sender<Call>,
    events: broadcast::Sender<Event>,
}

impl ctl::Handler for Bridge {
    fn handle(
        &self,
        req: Request,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send + '_>> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            if self.calls.send((req, tx)).await.is_err() {
                return Response::Error {
                    message: "the daemon is shutting down".into(),
                };
            }
            match tokio::time::timeout(Duration::from_secs(30), rx).await {
                Ok(Ok(r)) => r,
                _ => Response::Error {
                    message: "the daemon did not answer within 30 s".into(),
                },
            }
        })
    }

    fn subscribe_events(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }
}

/// The metrics endpoint's view: refreshed by the main loop every tick.
struct Published(Arc<Mutex<(StatusReport, MetricsExtra)>>);

impl metrics::MetricsSource for Published {
    fn snapshot(&self) -> (StatusReport, MetricsExtra) {
        self.0.lock().map(|p| p.clone()).unwrap_or_default()
    }
}
