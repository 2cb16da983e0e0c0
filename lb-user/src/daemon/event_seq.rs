//! Event sequence numbers that go on across restarts, so `xlb events
//! --since SEQ` (and `GET /events?since=SEQ`) hold across them.
//!
//! Saving the state file per event would cost a write and an fsync per
//! backend of a mass flap. Instead the state file holds a reservation: no
//! event so far has a number at or above it. A start numbers from the
//! saved reservation and at once reserves a block above it; the tick
//! extends the reservation before it runs out (and an event that reaches
//! it extends it at once); a clean stop saves the exact next number. A
//! crash therefore skips at most one block of numbers and never reuses one.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

use super::{Daemon, EVENT_LOG, persist::Saved};
use crate::ctl::Event;

/// Numbers reserved at a time.
pub(super) const SEQ_BLOCK: u64 = 100_000;

/// The first number a start gives, from the state file of the run before
/// (whatever layout it describes: the numbers do not depend on it).
pub(super) fn first_seq(saved: Option<&Saved>) -> u64 {
    saved.map_or(1, |s| s.next_event_seq.max(1))
}

/// The events the metrics endpoint serves (`GET /events`): a copy of the
/// daemon's event log, kept by the main loop, read by the endpoint's task.
#[derive(Clone, Debug, Default)]
pub(super) struct SharedEvents(Arc<Mutex<VecDeque<Event>>>);

impl SharedEvents {
    /// Adds `e`, dropping the oldest beyond [`EVENT_LOG`] as the daemon's
    /// own log does.
    pub(super) fn push(&self, e: &Event) {
        if let Ok(mut log) = self.0.lock() {
            if log.len() == EVENT_LOG {
                log.pop_front();
            }
            log.push_back(e.clone());
        }
    }

    /// The events with `seq` above `since`, oldest first.
    pub(super) fn since(&self, since: u64) -> Vec<Event> {
        self.0.lock().map_or_else(
            |_| Vec::new(),
            |log| log.iter().filter(|e| e.seq > since).cloned().collect(),
        )
    }
}

impl Daemon {
    /// After an event took `next_seq - 1`: an event that reached the
    /// reservation extends it and saves at once (the tick normally does it
    /// first).
    pub(super) fn seq_taken(&mut self) {
        if self.next_seq >= self.seq_reserved {
            self.seq_reserved = self.next_seq + SEQ_BLOCK;
            self.save();
        }
    }

    /// Every tick: keeps at least half a block reserved ahead.
    pub(super) fn seq_tick(&mut self) {
        if self.seq_reserved.saturating_sub(self.next_seq) < SEQ_BLOCK / 2 {
            self.seq_reserved = self.next_seq + SEQ_BLOCK;
            self.save();
        }
    }

    /// A clean stop (before the last save): the next start goes on from
    /// the next number, without a gap.
    pub(super) fn seq_stop(&mut self) {
        self.seq_reserved = self.next_seq;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_goes_on_from_the_saved_reservation() {
        let saved = |next_event_seq| Saved {
            next_event_seq,
            ..Saved::default()
        };
        // (name, state file, first number)
        let cases = [
            ("no state file", None, 1),
            ("a file of an earlier version", Some(saved(0)), 1),
            ("a clean stop at 42", Some(saved(42)), 42),
            ("a crash after reserving", Some(saved(200_017)), 200_017),
        ];
        for (name, s, want) in cases {
            assert_eq!(first_seq(s.as_ref()), want, "{name}");
        }
    }
}
