//! The readable form of a load [`Report`], as `xlb-client` prints it:
//! the summary, one row per second of the timeline, then the long
//! connections.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{Counts, LongConn, Report, SYN_RETRANSMIT_CONNECT, Summary};

impl Report {
    /// The readable form printed by `xlb-client`: summary, then one row per
    /// second of the timeline, then the long connections.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let backends: Vec<&str> = self
            .summary
            .per_backend
            .keys()
            .map(String::as_str)
            .collect();
        self.write_summary(&mut out);
        self.write_timeline(&mut out, &backends);
        if !self.long.is_empty() {
            let s = &self.summary;
            let _ = writeln!(
                out,
                "\nlong connections: {} of {} kept flowing",
                s.long_total - s.long_broken,
                s.long_total
            );
            for l in &self.long {
                write_long(&mut out, l);
            }
        }
        out
    }

    fn write_summary(&self, out: &mut String) {
        let s: &Summary = &self.summary;
        let _ = writeln!(
            out,
            "target {}  duration {} ms",
            self.target, self.duration_ms
        );
        let _ = writeln!(
            out,
            "requests {}  ok {}  failures {}  (refused {}, reset {}, timed_out {}, http_5xx {}, closed {}, other_error {})  skipped {}",
            s.requests,
            s.counts.ok,
            s.failures,
            s.counts.refused,
            s.counts.reset,
            s.counts.timed_out,
            s.counts.http_5xx,
            s.counts.closed,
            s.counts.other_error,
            s.skipped
        );
        if let (Some(f), Some(l)) = (s.first_failure_ms, s.last_failure_ms) {
            let _ = writeln!(out, "failures from {f} ms to {l} ms");
        }
        let _ = writeln!(
            out,
            "connects over {} ms (waited on a SYN retransmit): {}  longest connect {:.1} ms",
            SYN_RETRANSMIT_CONNECT.as_millis(),
            s.syn_retransmit_waits,
            s.max_connect_ms
        );
        let _ = writeln!(
            out,
            "latency ok: p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
            s.latency.p50_ms, s.latency.p90_ms, s.latency.p99_ms, s.latency.max_ms
        );
        let per_backend = s
            .per_backend
            .iter()
            .map(|(b, n)| format!("{b} {n}"))
            .collect::<Vec<_>>()
            .join("  ");
        let _ = writeln!(out, "per backend: {per_backend}");
    }

    /// One row per second (whatever the slice width): outcomes, then the
    /// `ok` answers of each backend.
    fn write_timeline(&self, out: &mut String, backends: &[&str]) {
        let _ = write!(
            out,
            "\n{:>7} {:>6} {:>7} {:>6} {:>7} {:>6} {:>6} {:>6}",
            "t(s)", "ok", "refused", "reset", "timeout", "5xx", "closed", "other"
        );
        for b in backends {
            let _ = write!(out, " {b:>6}");
        }
        out.push('\n');
        let per_row = (1000 / self.slice_ms.max(1)).max(1) as usize;
        for rows in self.timeline.chunks(per_row) {
            let mut c = Counts::default();
            let mut pb: BTreeMap<&str, u64> = BTreeMap::new();
            for sl in rows {
                c.add(&sl.counts);
                for (b, n) in &sl.per_backend {
                    *pb.entry(b).or_default() += n;
                }
            }
            let _ = write!(
                out,
                "{:>7.1} {:>6} {:>7} {:>6} {:>7} {:>6} {:>6} {:>6}",
                rows[0].t_ms as f64 / 1000.0,
                c.ok,
                c.refused,
                c.reset,
                c.timed_out,
                c.http_5xx,
                c.closed,
                c.other_error
            );
            for b in backends {
                let _ = write!(out, " {:>6}", pb.get(b).copied().unwrap_or(0));
            }
            out.push('\n');
        }
    }
}

fn write_long(out: &mut String, l: &LongConn) {
    let _ = writeln!(
        out,
        "  #{:<3} backend {:<6} lines {:<6} longest gap {:>5} ms  stalled {}{}  end {}{}",
        l.id,
        l.backend.as_deref().unwrap_or("-"),
        l.lines,
        l.longest_gap_ms,
        l.stalled,
        l.first_stall_ms
            .map(|t| format!(" (at {t} ms)"))
            .unwrap_or_default(),
        l.end,
        l.ended_ms
            .map(|t| format!(" at {t} ms"))
            .unwrap_or_default(),
    );
}
