//! The client: one request every [`PERIOD`] on one connection to the
//! control socket, each answer's latency recorded, the events kept.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::net::UnixStream,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_ctl::{Event, Request, Response, parse_response};

use super::{PERIOD, REQUEST_TIMEOUT, STATUS_EVERY, VIP_NAME, lock};

/// Which request a sample is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    Events,
    Status,
}

pub(crate) struct Sample {
    pub(crate) at: Instant,
    pub(crate) ask: Ask,
    pub(crate) latency: Duration,
}

/// What the client saw.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) samples: Vec<Sample>,
    pub(crate) events: Vec<Event>,
    /// Sequence numbers the daemon dropped from its 1,000-event log before
    /// the client asked: (first missing, last missing).
    pub(crate) gaps: Vec<(u64, u64)>,
    pub(crate) last_seq: u64,
    pub(crate) error: Option<String>,
}

struct Shared {
    seen: Mutex<Seen>,
    /// Backends in the VIP's table per the latest status; `u32::MAX` before one.
    up: AtomicU32,
    stop: AtomicBool,
}

/// The client thread; stopped and joined on drop.
pub(crate) struct Client {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Client {
    pub(crate) fn start(socket: &Path) -> Client {
        let shared = Arc::new(Shared {
            seen: Mutex::new(Seen::default()),
            up: AtomicU32::new(u32::MAX),
            stop: AtomicBool::new(false),
        });
        let (s, path) = (Arc::clone(&shared), socket.to_path_buf());
        let thread = thread::spawn(move || {
            if let Err(e) = client_loop(&path, &s) {
                lock(&s.seen).error = Some(format!("{e:#}"));
            }
        });
        Client {
            shared,
            thread: Some(thread),
        }
    }

    pub(crate) fn up(&self) -> Option<u32> {
        Some(self.shared.up.load(Ordering::Relaxed)).filter(|&n| n != u32::MAX)
    }

    pub(crate) fn last_seq(&self) -> u64 {
        lock(&self.shared.seen).last_seq
    }

    pub(crate) fn check(&self) -> Result<()> {
        match &lock(&self.shared.seen).error {
            Some(e) => bail!("control client: {e}"),
            None => Ok(()),
        }
    }

    /// Stops the thread and returns what it saw.
    pub(crate) fn finish(mut self) -> Seen {
        self.join();
        std::mem::take(&mut *lock(&self.shared.seen))
    }

    fn join(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.join();
    }
}

/// One request every [`PERIOD`] on one connection until told to stop.
fn client_loop(socket: &Path, shared: &Shared) -> Result<()> {
    let stream = UnixStream::connect(socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let mut next = Instant::now();
    let mut line = Vec::new();
    for n in 0u64.. {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let ask = if n % STATUS_EVERY == 0 {
            Ask::Status
        } else {
            Ask::Events
        };
        let req = match ask {
            Ask::Status => Request::Status,
            Ask::Events => Request::Events {
                since_seq: Some(lock(&shared.seen).last_seq),
                follow: false,
            },
        };
        line.clear();
        let at = Instant::now();
        writer.write_all(req.to_line().as_bytes())?;
        reader.read_until(b'\n', &mut line).with_context(|| {
            format!("waiting for the answer to {req} (bound {REQUEST_TIMEOUT:?})")
        })?;
        let latency = at.elapsed();
        if line.last() != Some(&b'\n') {
            bail!("the daemon closed the connection");
        }
        let resp = parse_response(&line).map_err(anyhow::Error::msg)?;
        record(shared, Sample { at, ask, latency }, resp)?;
        next += PERIOD;
        let now = Instant::now();
        match next.checked_duration_since(now) {
            Some(d) => thread::sleep(d),
            None => next = now,
        }
    }
    Ok(())
}

fn record(shared: &Shared, sample: Sample, resp: Response) -> Result<()> {
    let mut seen = lock(&shared.seen);
    seen.samples.push(sample);
    match resp {
        Response::Events(events) => {
            if let Some(first) = events.first()
                && first.seq > seen.last_seq + 1
            {
                let gap = (seen.last_seq + 1, first.seq - 1);
                seen.gaps.push(gap);
            }
            if let Some(last) = events.last() {
                seen.last_seq = last.seq;
            }
            seen.events.extend(events);
        }
        Response::Status(s) => {
            let up = s.vips.iter().find(|v| v.name == VIP_NAME);
            shared
                .up
                .store(up.map_or(0, |v| v.backends_up), Ordering::Relaxed);
        }
        Response::Error { message } => bail!("the daemon answered an error: {message}"),
        other => bail!("unexpected answer {other:?}"),
    }
    Ok(())
}
