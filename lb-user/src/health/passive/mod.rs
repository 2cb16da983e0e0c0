//! Passive detection: what a backend's real traffic says, from the counters
//! the data plane of NAT VIPs keeps per backend id
//! ([`PassiveStats`], `XLB_PASSIVE`), sampled by the daemon every 100 ms.
//!
//! Pure: the daemon pushes timestamped samples of the counters summed over
//! CPUs into a [`History`] per backend, and asks it for a [`Window`]: how
//! many requests became due in the last `window` and how many of them got
//! no answer within `response_timeout`, how many connections got no
//! SYN-ACK within `connect_timeout`, how many resets came back. `verdict`
//! then compares each backend with its peers of the same VIP: only a
//! backend whose traffic fails while its peers' succeeds is failing (a
//! fleet slow together is load, not failure: seed 003).
//!
//! The counters cannot pair a response with its request, so the window is
//! an estimate, biased towards "answered":
//! - requests due: started in `[t − window − T, t − T]` (T =
//!   `response_timeout`): each has had at least T to be answered;
//! - resolved: responses, and flows closed with their request pending
//!   (`unanswered`, `abandoned`), in `[t − window − T, t]`;
//! - still pending past T: due minus resolved (at least 0), plus the
//!   `unanswered` the data plane counted at close.
//!
//! A healthy backend answers about as many requests as start, so its due
//! requests are all resolved; a hung one answers none, so every request
//! that started after it hung shows up as soon as T has passed. A backend
//! slower than T but answering within the window reads as answered: the
//! estimate catches backends that stop answering, not slow ones (probes
//! and `protection` judge slowness).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub use lb_common::nat::PassiveStats;

pub mod sources;
#[cfg(test)]
mod tests;
mod verdict;

pub use self::verdict::{Verdict, judge};

/// How often the daemon samples `XLB_PASSIVE`: a hung backend is seen
/// within `response_timeout` plus this.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(100);

/// What the estimator judges with: a VIP's `[passive]` settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// How far back evidence counts.
    pub window: Duration,
    /// A request with no answer this long is unanswered.
    pub response_timeout: Duration,
    /// A connection with no SYN-ACK this long failed.
    pub connect_timeout: Duration,
    /// Fewest requests and connections judged before a verdict.
    pub min_requests: u64,
    /// Share (0–1) of a backend's judged requests and connections that
    /// must fail for it to be failing.
    pub failure_threshold: f64,
    /// … and this many times its peers' failure share.
    pub peer_factor: f64,
}

/// `a += b`, field by field (summing a backend's per-CPU values).
pub fn add(a: &mut PassiveStats, b: &PassiveStats) {
    let PassiveStats {
        connects,
        connected,
        connect_timeouts,
        resets,
        requests,
        responses,
        unanswered,
        abandoned,
        response_ns,
    } = b;
    a.connects = a.connects.wrapping_add(*connects);
    a.connected = a.connected.wrapping_add(*connected);
    a.connect_timeouts = a.connect_timeouts.wrapping_add(*connect_timeouts);
    a.resets = a.resets.wrapping_add(*resets);
    a.requests = a.requests.wrapping_add(*requests);
    a.responses = a.responses.wrapping_add(*responses);
    a.unanswered = a.unanswered.wrapping_add(*unanswered);
    a.abandoned = a.abandoned.wrapping_add(*abandoned);
    a.response_ns = a.response_ns.wrapping_add(*response_ns);
}

/// The counters as a list, for comparisons field by field.
fn fields(s: &PassiveStats) -> [u64; 9] {
    [
        s.connects,
        s.connected,
        s.connect_timeouts,
        s.resets,
        s.requests,
        s.responses,
        s.unanswered,
        s.abandoned,
        s.response_ns,
    ]
}

/// `b − a` field by field, for `a` sampled before `b` (never below 0).
fn delta(a: &PassiveStats, b: &PassiveStats) -> PassiveStats {
    let d = |x: u64, y: u64| y.saturating_sub(x);
    PassiveStats {
        connects: d(a.connects, b.connects),
        connected: d(a.connected, b.connected),
        connect_timeouts: d(a.connect_timeouts, b.connect_timeouts),
        resets: d(a.resets, b.resets),
        requests: d(a.requests, b.requests),
        responses: d(a.responses, b.responses),
        unanswered: d(a.unanswered, b.unanswered),
        abandoned: d(a.abandoned, b.abandoned),
        response_ns: d(a.response_ns, b.response_ns),
    }
}

/// The samples of one backend id's counters, oldest first, reaching back
/// just far enough for the window.
#[derive(Clone, Debug, Default)]
pub struct History {
    samples: VecDeque<(Instant, PassiveStats)>,
}

impl History {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the counters read at `at`, forgetting samples older than
    /// `keep` (the window plus the longer timeout). A counter lower than
    /// in the last sample means the map was made anew (a new program, or
    /// the id's counters cleared): the history starts again from this
    /// sample, and `false` says so.
    pub fn push(&mut self, at: Instant, counts: PassiveStats, keep: Duration) -> bool {
        let went_back = self.samples.back().is_some_and(|(_, last)| {
            fields(&counts)
                .iter()
                .zip(fields(last))
                .any(|(now, before)| *now < before)
        });
        if went_back {
            self.samples.clear();
        }
        self.samples.push_back((at, counts));
        // Keep one sample at or before the cutoff: it is the window's start.
        let cutoff = at.checked_sub(keep);
        while let (Some(cutoff), Some((second, _))) = (cutoff, self.samples.get(1)) {
            if *second > cutoff {
                break;
            }
            self.samples.pop_front();
        }
        !went_back
    }

    /// Forgets every sample but the last: evidence from before now no
    /// longer counts (the backend's id changed hands, or a verdict used it).
    pub fn restart(&mut self) {
        while self.samples.len() > 1 {
            self.samples.pop_front();
        }
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.samples.clear();
    }

    /// The counters as of `t`: the last sample at or before it, or the
    /// oldest there is (nothing older is known).
    fn at(&self, t: Option<Instant>) -> Option<&PassiveStats> {
        let first = self.samples.front().map(|(_, s)| s);
        let Some(t) = t else { return first };
        self.samples
            .iter()
            .take_while(|(at, _)| *at <= t)
            .last()
            .map(|(_, s)| s)
            .or(first)
    }

    /// What the last `th.window` says, as of `now`.
    pub fn window(&self, now: Instant, th: &Thresholds) -> Window {
        let Some(latest) = self.samples.back().map(|(_, s)| s) else {
            return Window::default();
        };
        let back = |d: Duration| now.checked_sub(d);
        let count = |f: fn(&PassiveStats) -> u64, from: Duration, to: Duration| match (
            self.at(back(from)),
            self.at(back(to)),
        ) {
            (Some(a), Some(b)) => f(&delta(a, b)),
            _ => 0,
        };
        let (w, t, tc) = (th.window, th.response_timeout, th.connect_timeout);
        // Everything resolved since the due requests began.
        let start = self.at(back(w + t)).copied().unwrap_or_default();
        let resolved = delta(&start, latest);
        let due = count(|s| s.requests, w + t, t);
        let closed = resolved.unanswered;
        let pending = due.saturating_sub(resolved.responses + resolved.abandoned + closed);
        let unanswered = (pending + closed).min(due.max(closed));
        // Connections: due ones that saw no SYN-ACK (a refused one, RST
        // for SYN, is one of them), or that the data plane timed out.
        let cstart = self.at(back(w + tc)).copied().unwrap_or_default();
        let cresolved = delta(&cstart, latest);
        let connects_due = count(|s| s.connects, w + tc, tc);
        let cfail = connects_due.saturating_sub(cresolved.connected + cresolved.connect_timeouts)
            + cresolved.connect_timeouts;
        let recent = delta(self.at(back(w)).unwrap_or(latest), latest);
        // A request pending when the backend reset its flow: the data plane
        // counts it abandoned if it was younger than T; it failed.
        let reset_requests = resolved.resets.min(resolved.abandoned);
        Window {
            requests_due: due.max(unanswered + reset_requests),
            unanswered,
            reset_requests,
            abandoned: (resolved.abandoned - reset_requests).min(due),
            connects_due: connects_due.max(cfail),
            connect_failures: cfail,
            resets: recent.resets,
            responses: recent.responses,
            mean_response: (recent.responses > 0)
                .then(|| Duration::from_nanos(recent.response_ns / recent.responses)),
        }
    }

    /// The latest counters, summed over CPUs (totals since the id's
    /// counters began).
    pub fn totals(&self) -> Option<&PassiveStats> {
        self.samples.back().map(|(_, s)| s)
    }
}

/// What one backend's traffic said over the window (see the module's
/// comment for how each is estimated).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Window {
    /// Requests started early enough to have been answered.
    pub requests_due: u64,
    /// Of those, how many got no answer within `response_timeout`.
    pub unanswered: u64,
    /// Requests ended by a reset from the backend before their answer.
    pub reset_requests: u64,
    /// Requests whose client closed first (neutral: not judged).
    pub abandoned: u64,
    /// Connections started early enough to have been accepted.
    pub connects_due: u64,
    /// Of those, how many got no SYN-ACK within `connect_timeout`.
    pub connect_failures: u64,
    /// RSTs from the backend in the window.
    pub resets: u64,
    /// Answers in the window.
    pub responses: u64,
    /// Their mean response time.
    #[serde(serialize_with = "ser_mean")]
    pub mean_response: Option<Duration>,
}

fn ser_mean<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&(d.as_secs_f64() * 1000.0)),
        None => s.serialize_none(),
    }
}

impl Window {
    /// Requests and connections whose outcome is judged (abandoned
    /// requests are neither success nor failure).
    pub fn judged(&self) -> u64 {
        self.requests_due
            .saturating_sub(self.abandoned)
            .max(self.unanswered + self.reset_requests)
            + self.connects_due
    }

    /// Of those, how many failed: unanswered requests, requests the
    /// backend reset, connections refused or never accepted.
    pub fn failed(&self) -> u64 {
        self.unanswered + self.reset_requests + self.connect_failures
    }
}
