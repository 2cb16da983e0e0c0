//! `xlb events --follow`: the event stream, and what happens when the
//! daemon goes away under it. A restart (an upgrade, a crash and systemd's
//! restart) closes the stream; the follower reconnects, with growing
//! pauses, for up to [`GIVE_UP`], and goes on after the last event it
//! printed: event numbers go on across restarts, so nothing is printed
//! twice and nothing retained is missed.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::ctl::{Client, Event, Request, Response};

/// How long a follower waits for a daemon that went away to come back.
pub const GIVE_UP: Duration = Duration::from_secs(30);

/// The first pause between reconnection attempts; it doubles up to
/// [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// What the follower hands its caller.
#[derive(Clone, Debug, PartialEq)]
pub enum Followed {
    /// The next event.
    Event(Event),
    /// Something to tell the operator (on stderr), e.g. that the daemon
    /// restarted.
    Note(String),
}

/// Follows the daemon's events after `since` (all retained without),
/// handing each to `out` until it returns `false` (e.g. a closed pipe);
/// reconnects when the daemon restarts, giving up after `give_up`.
///
/// # Errors
/// The first connection fails (no daemon: said at once, as every command
/// does), the daemon does not come back within `give_up`, or it answers
/// with something that is not an event.
pub async fn follow(
    socket: &Path,
    since: Option<u64>,
    give_up: Duration,
    mut out: impl FnMut(Followed) -> bool,
) -> anyhow::Result<()> {
    let mut last = since;
    let mut client = subscribe(socket, last).await?;
    loop {
        let next = match client.recv().await {
            Ok(Some(Response::Event(e))) => {
                last = Some(e.seq);
                Followed::Event(e)
            }
            // E.g. events skipped because we fell behind: worth saying,
            // not worth stopping for.
            Ok(Some(Response::Error { message })) => Followed::Note(message),
            Ok(Some(other)) => bail!(
                "unexpected answer in the event stream: {}",
                other.to_line().trim_end()
            ),
            // Closed, or cut mid-line: the daemon stopped.
            Ok(None) | Err(_) => {
                client = reconnect(socket, last, give_up).await?;
                Followed::Note(match last {
                    Some(seq) => {
                        format!("daemon restarted, reconnected; going on after event {seq}")
                    }
                    None => "daemon restarted, reconnected".to_string(),
                })
            }
        };
        if !out(next) {
            return Ok(());
        }
    }
}

/// A connection streaming the events after `since`.
async fn subscribe(socket: &Path, since: Option<u64>) -> anyhow::Result<Client> {
    let mut client = Client::connect(socket).await?;
    client
        .send(&Request::Events {
            since_seq: since,
            follow: true,
        })
        .await?;
    Ok(client)
}

/// Tries to subscribe again, with pauses from [`FIRST_PAUSE`] doubling to
/// [`MAX_PAUSE`], until `give_up` has passed.
async fn reconnect(socket: &Path, since: Option<u64>, give_up: Duration) -> anyhow::Result<Client> {
    let t = Instant::now();
    let mut pause = FIRST_PAUSE;
    loop {
        let error = match subscribe(socket, since).await {
            Ok(c) => return Ok(c),
            Err(e) => e,
        };
        if t.elapsed() >= give_up {
            let resume = since.map_or_else(
                || "xlb events --follow".to_string(),
                |s| format!("xlb events --follow --since {s}"),
            );
            bail!(
                "the daemon closed the event stream and did not come back within {} \
                 ({error:#}); once it runs, `{resume}` goes on from the last event shown",
                crate::health::probe::Compact(give_up)
            );
        }
        tokio::time::sleep(pause.min(give_up.saturating_sub(t.elapsed()))).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use tokio::sync::{broadcast, mpsc};

    use super::*;
    use crate::ctl::{EventKind, Handler, HandlerFuture, bind, serve};

    fn event(seq: u64) -> Event {
        Event {
            seq,
            at_unix_ms: 1_800_000_000_000,
            kind: EventKind::Start,
            vip: None,
            backend: None,
            from: None,
            to: None,
            reason: format!("event {seq}"),
            table_build_us: None,
            table_slots_changed: None,
        }
    }

    /// A daemon that retains events `1..=last` and records what it was
    /// asked.
    struct Daemon {
        last: u64,
        events: broadcast::Sender<Event>,
        asked: mpsc::UnboundedSender<Option<u64>>,
    }

    impl Handler for Daemon {
        fn handle(&self, req: Request) -> HandlerFuture<'_> {
            Box::pin(async move {
                match req {
                    Request::Events { since_seq, .. } => {
                        let _ = self.asked.send(since_seq);
                        let from = since_seq.unwrap_or(0) + 1;
                        Response::Events((from..=self.last).map(event).collect())
                    }
                    other => Response::error(format!("not here: {other}")),
                }
            })
        }

        fn subscribe_events(&self) -> broadcast::Receiver<Event> {
            self.events.subscribe()
        }
    }

    /// Starts a daemon retaining events up to `last` on `path`.
    fn start(
        path: &Path,
        last: u64,
        asked: &mpsc::UnboundedSender<Option<u64>>,
    ) -> tokio::task::JoinHandle<()> {
        let _ = std::fs::remove_file(path);
        let listener = bind(path, None).unwrap();
        let d = Daemon {
            last,
            events: broadcast::channel(16).0,
            asked: asked.clone(),
        };
        tokio::spawn(serve(listener, Arc::new(d)))
    }

    fn socket(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xlb-follow-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("xlb.sock")
    }

    #[tokio::test]
    async fn a_follower_goes_on_after_a_restart_from_its_last_event() {
        let path = socket("restart");
        let (asked_tx, mut asked) = mpsc::unbounded_channel();
        let first = start(&path, 2, &asked_tx);
        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        let follower = {
            let path = path.clone();
            tokio::spawn(async move {
                follow(&path, Some(0), Duration::from_secs(10), |f| {
                    seen_tx.send(f).is_ok()
                })
                .await
            })
        };
        let next = |seen: &mut mpsc::UnboundedReceiver<Followed>| {
            let f = seen.try_recv();
            f.ok()
        };
        let mut got = Vec::new();
        while got.len() < 2 {
            got.push(
                tokio::time::timeout(Duration::from_secs(5), seen.recv())
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        assert_eq!(got, [Followed::Event(event(1)), Followed::Event(event(2))]);
        assert_eq!(asked.recv().await, Some(Some(0)));
        // The daemon stops (its connections close) and a new one starts a
        // moment later, retaining events 1 to 4.
        first.abort();
        let _ = first.await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(next(&mut seen), None, "nothing while it is away");
        let second = start(&path, 4, &asked_tx);
        let mut got = Vec::new();
        while got.len() < 3 {
            got.push(
                tokio::time::timeout(Duration::from_secs(5), seen.recv())
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        assert_eq!(
            got,
            [
                Followed::Note("daemon restarted, reconnected; going on after event 2".into()),
                Followed::Event(event(3)),
                Followed::Event(event(4)),
            ]
        );
        assert_eq!(
            asked.recv().await,
            Some(Some(2)),
            "asked for what came after 2"
        );
        second.abort();
        follower.abort();
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[tokio::test]
    async fn a_follower_gives_up_when_the_daemon_stays_away() {
        let path = socket("away");
        let (asked_tx, _asked) = mpsc::unbounded_channel();
        let d = start(&path, 7, &asked_tx);
        let follower = {
            let path = path.clone();
            tokio::spawn(
                async move { follow(&path, None, Duration::from_millis(500), |_| true).await },
            )
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        d.abort();
        let _ = d.await;
        let t = Instant::now();
        let err = tokio::time::timeout(Duration::from_secs(5), follower)
            .await
            .unwrap()
            .unwrap()
            .unwrap_err();
        let took = t.elapsed();
        let msg = format!("{err:#}");
        assert!(
            msg.starts_with(
                "the daemon closed the event stream and did not come back within 500ms"
            ),
            "{msg}"
        );
        assert!(
            msg.ends_with(
                "once it runs, `xlb events --follow --since 7` goes on from the last event shown"
            ),
            "{msg}"
        );
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_secs(3),
            "{took:?}"
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}
