//! The main loop's doors: requests from the control socket come in over a
//! channel ([`Bridge`]) and are answered by [`Daemon::handle`] on the main
//! loop; the metrics endpoint reads what the loop publishes every tick
//! ([`Published`]).

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, Weak},
    time::{Duration, Instant},
};

use tokio::{
    net::UnixListener,
    sync::{broadcast, mpsc, oneshot},
};
use tracing::{error, info};

use super::Daemon;
use crate::{
    ctl::{self, Event, Request, Response, StatusReport},
    metrics::{self, MetricsExtra},
};

/// A request and where its answer goes.
pub(super) type Call = (Asked, oneshot::Sender<Response>);

/// A request, and whether anyone still waits for its answer: the control
/// socket's side holds the other end of `asker` for as long as its client
/// does (it lets go when the client leaves or its wait times out).
pub(super) struct Asked {
    req: Request,
    asker: Weak<()>,
}

impl Asked {
    /// Whether nobody waits for the answer any more.
    fn withdrawn(&self) -> bool {
        self.asker.strong_count() == 0
    }
}

impl Daemon {
    /// Answers one control request (on the main loop), unless its client
    /// left while it waited in the queue: a drain or block its client gave
    /// up on is not applied later.
    /// The retained events numbered above `since`, oldest first.
    fn events_after(&self, since: u64) -> Vec<lb_ctl::Event> {
        self.events
            .iter()
            .filter(|e| e.seq > since)
            .cloned()
            .collect()
    }

    pub(super) fn handle(&mut self, asked: Asked) -> Response {
        if asked.withdrawn() {
            let what = ctl::escape(&asked.req.to_string()).into_owned();
            info!("control: {what} withdrawn: its client left before the daemon got to it");
            return Response::error("withdrawn: the client left before it was answered");
        }
        let res: anyhow::Result<Response> = match asked.req {
            Request::Status => {
                self.status_asked = Some(Instant::now());
                Ok(Response::Status(self.status()))
            }
            Request::Events { since_seq, .. } => {
                Ok(Response::Events(self.events_after(since_seq.unwrap_or(0))))
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
                // Checked with the request (`ctl::check_request`).
                force: _,
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
            Request::Withdraw { vip, reason } => Ok(self.withdraw(vip, reason)),
            Request::Announce { vip } => Ok(self.announce_again(vip)),
            Request::Weight {
                vip,
                backend,
                weight,
            } => self
                .set_weight(&vip, &backend, weight)
                .map(Response::Weight),
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
pub(super) fn spawn_metrics(
    addr: SocketAddr,
    published: Arc<Mutex<(StatusReport, MetricsExtra)>>,
    events: super::event_seq::SharedEvents,
) {
    let source = Arc::new(Published(published, events));
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
            // Dropped with this future: when the client leaves (the server
            // drops the future) or the wait below times out.
            let waiting = Arc::new(());
            let asked = Asked {
                req,
                asker: Arc::downgrade(&waiting),
            };
            if self.calls.send((asked, tx)).await.is_err() {
                return Response::Error {
                    message: "the daemon is shutting down".into(),
                };
            }
            let answer = tokio::time::timeout(Duration::from_secs(30), rx).await;
            drop(waiting);
            match answer {
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
struct Published(
    Arc<Mutex<(StatusReport, MetricsExtra)>>,
    super::event_seq::SharedEvents,
);

impl metrics::MetricsSource for Published {
    fn snapshot(&self) -> (StatusReport, MetricsExtra) {
        self.0.lock().map(|p| p.clone()).unwrap_or_default()
    }

    fn events_since(&self, since: u64) -> Vec<Event> {
        self.1.since(since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::Handler as _;

    #[tokio::test]
    async fn a_call_whose_asker_left_is_withdrawn_in_the_queue() {
        let (calls, mut queue) = mpsc::channel::<Call>(4);
        let bridge = Arc::new(Bridge {
            calls,
            events: broadcast::channel(4).0,
        });
        // (name, whether the asker still waits when the main loop gets to it)
        for (name, waits) in [("asker waits", true), ("asker left", false)] {
            let b = bridge.clone();
            let asker = tokio::spawn(async move { b.handle(Request::Reload).await });
            let (asked, reply) = queue.recv().await.unwrap();
            if waits {
                assert!(!asked.withdrawn(), "{name}");
                reply.send(Response::ok("done")).unwrap();
                assert_eq!(asker.await.unwrap(), Response::ok("done"), "{name}");
            } else {
                // What the server does when the client leaves.
                asker.abort();
                let _ = asker.await;
                assert!(asked.withdrawn(), "{name}");
            }
        }
    }
}
