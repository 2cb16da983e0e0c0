//! Asking the daemon, for `top` and `status --watch`: one status or events
//! request within [`REQUEST_TIMEOUT`], and when to give up on a daemon that
//! stopped answering.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::ctl::{self, Event, Request, Response, StatusReport};

use super::{GIVE_UP, REQUEST_TIMEOUT};

/// The daemon's status now, or why not (for the operator).
pub(super) async fn status(socket: &Path) -> Result<StatusReport, String> {
    match ask(socket, &Request::Status).await? {
        Response::Status(r) => Ok(r),
        other => Err(unexpected("status", &other)),
    }
}

/// The events after `since_seq` (all it keeps without one).
pub(super) async fn events(socket: &Path, since_seq: Option<u64>) -> Result<Vec<Event>, String> {
    let req = Request::Events {
        since_seq,
        follow: false,
    };
    match ask(socket, &req).await? {
        Response::Events(e) => Ok(e),
        other => Err(unexpected("events", &other)),
    }
}

async fn ask(socket: &Path, req: &Request) -> Result<Response, String> {
    match tokio::time::timeout(REQUEST_TIMEOUT, ctl::request(socket, req)).await {
        Ok(Ok(Response::Error { message })) => Err(message),
        Ok(Ok(resp)) => Ok(resp),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "no answer on {} within {}s",
            socket.display(),
            REQUEST_TIMEOUT.as_secs()
        )),
    }
}

fn unexpected(what: &str, resp: &Response) -> String {
    format!(
        "the daemon answered {what} with {}",
        resp.to_line().trim_end()
    )
}

/// Whether the daemon still answers: a daemon that never answered is
/// reported at once (a wrong --socket); one that answered before gets
/// [`GIVE_UP`] to come back (a restart), with a message meanwhile.
#[derive(Debug, Default)]
pub(super) struct Liveness {
    answered: bool,
    failing_since: Option<Instant>,
}

impl Liveness {
    /// An answer came.
    pub(super) fn ok(&mut self) {
        self.answered = true;
        self.failing_since = None;
    }

    /// A request failed with `err` at `now`: `Ok` with what to show while
    /// waiting, or `Err` with the final word.
    pub(super) fn failed(&mut self, err: &str, now: Instant) -> Result<String, String> {
        if !self.answered {
            return Err(err.to_owned());
        }
        let since = *self.failing_since.get_or_insert(now);
        let silent = now.saturating_duration_since(since);
        if silent >= GIVE_UP {
            return Err(format!(
                "the daemon stopped answering (nothing for {}s): {err}",
                GIVE_UP.as_secs()
            ));
        }
        Ok(format!(
            "no answer from the daemon for {}s (giving up after {}s): {err}",
            round_up_secs(silent),
            GIVE_UP.as_secs()
        ))
    }
}

fn round_up_secs(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_that_never_answered_is_reported_at_once() {
        let mut l = Liveness::default();
        assert_eq!(
            l.failed("no xlb daemon listening on /x", Instant::now()),
            Err("no xlb daemon listening on /x".to_owned())
        );
    }

    #[test]
    fn a_daemon_that_went_away_gets_time_to_come_back() {
        let t0 = Instant::now();
        let mut l = Liveness::default();
        l.ok();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(
            l.failed("refused", at(0)),
            Ok("no answer from the daemon for 0s (giving up after 5s): refused".to_owned())
        );
        assert_eq!(
            l.failed("refused", at(1200)),
            Ok("no answer from the daemon for 2s (giving up after 5s): refused".to_owned())
        );
        // It came back: the clock starts again at the next failure.
        l.ok();
        assert!(l.failed("refused", at(4900)).is_ok());
        assert!(l.failed("refused", at(9800)).is_ok());
        assert_eq!(
            l.failed("refused", at(9900)),
            Err("the daemon stopped answering (nothing for 5s): refused".to_owned())
        );
    }
}
