//! Passive detection's view of one backend of a NAT VIP: what its real
//! traffic said over the window, the verdict against its peers, and the
//! counters since they began.

use serde::{Deserialize, Serialize};

/// `passive` of a backend in `xlb status --json` (NAT VIPs only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PassiveStatus {
    /// The window judged, ms.
    pub window_ms: u64,
    /// Requests started early enough to have been answered
    /// (`response_timeout` ago or more), in the window.
    pub requests_due: u64,
    /// Of those, an estimate of how many got no answer within
    /// `response_timeout`.
    pub unanswered: u64,
    /// Of those, how many the backend reset before answering.
    pub reset_requests: u64,
    /// Requests whose client closed first (not judged).
    pub abandoned: u64,
    /// Connections started `connect_timeout` ago or more, in the window.
    pub connects_due: u64,
    /// Of those, how many got no SYN-ACK within `connect_timeout`.
    pub connect_failures: u64,
    /// Answers in the window, and their mean time, ms (`null` without one).
    pub responses: u64,
    pub mean_response_ms: Option<f64>,
    /// Against its peers: `too_few` (fewer than `min_requests`),
    /// `no_peers`, `healthy`, `failing_with_peers` (the VIP fails as a
    /// whole: nobody is ejected), `counting_sources` (failing by the
    /// counters; the client prefixes of its failing flows are being
    /// counted), `few_sources` (failing by the counters, but its failing
    /// flows come from fewer than `min_sources` client prefixes: nobody
    /// is ejected), or `failing`.
    pub verdict: String,
    /// For `few_sources`, why the verdict did not stand (`null` otherwise;
    /// a standing verdict's evidence says from how many client prefixes
    /// its failing flows came).
    #[serde(default)]
    pub sources: Option<String>,
    /// The evidence that stands against it until `rise` probes pass after
    /// it; `null` when none does.
    pub evidence: Option<String>,
    /// The data plane's counters since they began (`xlb_backend_passive_*`).
    pub totals: PassiveTotals,
}

/// Monotonic counters of one backend id, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassiveTotals {
    pub connects: u64,
    pub connected: u64,
    pub connect_timeouts: u64,
    pub resets: u64,
    pub requests: u64,
    pub responses: u64,
    pub unanswered: u64,
    pub abandoned: u64,
}

impl PassiveStatus {
    /// What `xlb status` adds to a backend's notes: the standing evidence,
    /// else the window's failures when there are any.
    pub fn note(&self) -> Option<String> {
        if let Some(e) = &self.evidence {
            return Some(e.clone());
        }
        let mut parts = Vec::new();
        if self.unanswered > 0 || self.reset_requests > 0 {
            parts.push(format!(
                "{}/{} requests unanswered",
                self.unanswered + self.reset_requests,
                self.requests_due.saturating_sub(self.abandoned)
            ));
        }
        if self.connect_failures > 0 {
            parts.push(format!(
                "{}/{} connections not accepted",
                self.connect_failures, self.connects_due
            ));
        }
        if parts.is_empty() {
            return None;
        }
        let verdict = self.verdict.replace('_', " ");
        let verdict = match (&self.sources, self.verdict.as_str()) {
            (Some(why), "few_sources") => format!("{verdict}: {why}"),
            _ => verdict,
        };
        Some(format!(
            "passive {} in {}s ({verdict})",
            parts.join(", "),
            self.window_ms as f64 / 1000.0,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_note_shows_evidence_first_then_failures_and_nothing_when_calm() {
        let calm = PassiveStatus {
            window_ms: 2000,
            requests_due: 400,
            verdict: "healthy".into(),
            ..PassiveStatus::default()
        };
        assert_eq!(calm.note(), None);
        let slow_fleet = PassiveStatus {
            unanswered: 300,
            connect_failures: 2,
            connects_due: 400,
            verdict: "failing_with_peers".into(),
            ..calm.clone()
        };
        assert_eq!(
            slow_fleet.note().as_deref(),
            Some(
                "passive 300/400 requests unanswered, 2/400 connections not accepted in 2s \
                 (failing with peers)"
            )
        );
        let one_client = PassiveStatus {
            unanswered: 13,
            requests_due: 43,
            connect_failures: 0,
            verdict: "few_sources".into(),
            sources: Some("13 failing flows from 1 client prefix (192.0.2.7: 13)".into()),
            ..calm.clone()
        };
        assert_eq!(
            one_client.note().as_deref(),
            Some(
                "passive 13/43 requests unanswered in 2s (few sources: 13 failing flows from 1 \
                 client prefix (192.0.2.7: 13))"
            )
        );
        let out = PassiveStatus {
            evidence: Some("passive: 12 of 14 requests unanswered".into()),
            ..slow_fleet
        };
        assert_eq!(
            out.note().as_deref(),
            Some("passive: 12 of 14 requests unanswered")
        );
    }
}
