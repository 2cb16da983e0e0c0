//! Each backend's window against its peers': a backend is failing when its
//! own traffic fails (`failure_threshold` of it), fails `peer_factor`
//! times more than its peers' of the same VIP, and its peers' succeeds
//! (they fail at most `failure_threshold / peer_factor` of theirs). A VIP failing together
//! (seed 003: every backend slowed beyond `response_timeout`) ejects
//! nobody; neither does evidence from fewer than `min_requests`.

use std::fmt;

use super::{Thresholds, Window};
use crate::health::probe::Compact;

/// What a backend's window says, judged against its peers'.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Fewer than `min_requests` requests and connections judged.
    TooFew,
    /// Its peers have fewer than `min_requests` between them: nothing to
    /// compare with (a VIP of one backend, or the only one with traffic).
    NoPeers,
    /// Its traffic succeeds (below `failure_threshold`).
    Healthy,
    /// Its traffic fails, but its peers' fails nearly as much: load, or
    /// the network, not this backend.
    FailingWithPeers,
    /// Its traffic fails while its peers' succeeds: why, for the operator.
    Failing(String),
    /// Failing by the counters; the flow table's walk that counts the
    /// failing flows' client prefixes (`sources`) is awaited.
    CountingSources,
    /// Failing by the counters, but the flows failing come from too few
    /// client prefixes (or weigh too little past the cap per prefix): no
    /// verdict, and why.
    FewSources(String),
}

impl Verdict {
    /// Its name in `--json` and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::TooFew => "too_few",
            Self::NoPeers => "no_peers",
            Self::Healthy => "healthy",
            Self::FailingWithPeers => "failing_with_peers",
            Self::Failing(_) => "failing",
            Self::CountingSources => "counting_sources",
            Self::FewSources(_) => "few_sources",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failing(why) | Self::FewSources(why) => f.write_str(why),
            other => f.write_str(other.as_str()),
        }
    }
}

/// The share (0–1) of `failed` in `judged` (0 when nothing was judged).
fn share(failed: u64, judged: u64) -> f64 {
    if judged == 0 {
        0.0
    } else {
        failed as f64 / judged as f64
    }
}

/// What a window says of one kind of evidence: (failed, judged).
type Tally = (u64, u64);

/// Requests and connections, judged apart: a hung application accepts
/// its connections, so they must not dilute its unanswered requests.
fn tallies(w: &Window) -> [Tally; 2] {
    let requests = w
        .requests_due
        .saturating_sub(w.abandoned)
        .max(w.unanswered + w.reset_requests);
    [
        (w.unanswered + w.reset_requests, requests),
        (w.connect_failures, w.connects_due),
    ]
}

/// One kind's verdict, from the backend's tally and its peers'.
fn judge_kind(own: Tally, peers: Tally, th: &Thresholds) -> Verdict {
    let min = th.min_requests.max(1);
    if own.1 < min {
        Verdict::TooFew
    } else if share(own.0, own.1) < th.failure_threshold {
        Verdict::Healthy
    } else if peers.1 < min {
        Verdict::NoPeers
    } else if share(own.0, own.1) < th.peer_factor * share(peers.0, peers.1)
        || share(peers.0, peers.1) > th.failure_threshold / th.peer_factor
    {
        // Its peers fail too, or fail at all beyond noise: a fleet
        // slowing down, whose backends cross `response_timeout` one after
        // another (seed 003), shows one of them ahead of the rest for a
        // moment; that is no outlier.
        Verdict::FailingWithPeers
    } else {
        Verdict::Failing(String::new())
    }
}

/// The worse of two verdicts.
fn rank(v: &Verdict) -> u8 {
    match v {
        Verdict::TooFew => 0,
        Verdict::Healthy => 1,
        Verdict::NoPeers => 2,
        Verdict::FailingWithPeers => 3,
        // Not made by `judge`: the daemon's, after it (`sources`).
        Verdict::CountingSources | Verdict::FewSources(_) => 4,
        Verdict::Failing(_) => 5,
    }
}

/// The verdict on each of a VIP's backends (same order as `windows`); the
/// peers of each are all the others.
pub fn judge(windows: &[Window], th: &Thresholds) -> Vec<Verdict> {
    let all: Vec<[Tally; 2]> = windows.iter().map(tallies).collect();
    let sum = |k: usize| {
        all.iter()
            .fold((0, 0), |(f, j), t| (f + t[k].0, j + t[k].1))
    };
    let totals = [sum(0), sum(1)];
    windows
        .iter()
        .zip(&all)
        .map(|(w, own)| {
            let peers = [0, 1].map(|k| (totals[k].0 - own[k].0, totals[k].1 - own[k].1));
            let kinds = [0, 1].map(|k| judge_kind(own[k], peers[k], th));
            let failing = kinds.clone().map(|v| matches!(v, Verdict::Failing(_)));
            if failing.iter().any(|&f| f) {
                return Verdict::Failing(reason(w, th, failing, peers));
            }
            kinds
                .into_iter()
                .max_by_key(rank)
                .unwrap_or(Verdict::TooFew)
        })
        .collect()
}

/// `passive: 12 of 14 requests unanswered within 1s in the last 2s; peers
/// answered 98%`: what failed (requests, connections or both, as
/// `failing` says), and how the peers did at the same.
fn reason(w: &Window, th: &Thresholds, failing: [bool; 2], peers: [Tally; 2]) -> String {
    let plural = |n: u64| if n == 1 { "" } else { "s" };
    // Rounded down: "100%" only when no peer failed.
    let ok = |(failed, judged): Tally| (judged - failed) * 100 / judged.max(1);
    let mut what = Vec::new();
    let mut peer_text = Vec::new();
    if failing[0] {
        let judged = tallies(w)[0].1;
        if w.unanswered > 0 || w.reset_requests == 0 {
            what.push(format!(
                "{} of {judged} request{} unanswered within {}",
                w.unanswered,
                plural(judged),
                Compact(th.response_timeout)
            ));
        }
        if w.reset_requests > 0 {
            what.push(format!(
                "{} of {judged} request{} reset by the backend",
                w.reset_requests,
                plural(judged)
            ));
        }
        peer_text.push(format!("answered {}%", ok(peers[0])));
    }
    if failing[1] {
        what.push(format!(
            "{} of {} connection{} not accepted within {}",
            w.connect_failures,
            w.connects_due,
            plural(w.connects_due),
            Compact(th.connect_timeout)
        ));
        peer_text.push(format!("accepted {}%", ok(peers[1])));
    }
    format!(
        "passive: {} in the last {}; peers {}",
        what.join(", "),
        Compact(th.window),
        peer_text.join(", ")
    )
}
