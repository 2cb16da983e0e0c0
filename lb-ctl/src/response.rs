//! What the daemon answers.

use serde::{Deserialize, Serialize};

use crate::wire::to_line;
use crate::{BlockEntry, Event, ExplainReport, StatusReport, VipSources, WeightReport};

/// What the daemon answers. On the wire the variant is the `response` field
/// and its content is `data`:
/// `{"version":2,"response":"error","data":{"message":"..."}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "response", content = "data", rename_all = "snake_case")]
pub enum Response {
    /// Answer to `status`.
    Status(StatusReport),
    /// Answer to `events` without `follow`, oldest first.
    Events(Vec<Event>),
    /// One event of an `events` stream (`follow`).
    Event(Event),
    /// Answer to `explain`.
    Explain(ExplainReport),
    /// Answer to `blocks`: every list entry, global first, then by VIP.
    Blocks(Vec<BlockEntry>),
    /// Answer to `sources`: per VIP, its heaviest sources.
    Sources(Vec<VipSources>),
    /// Answer to `weight`: the backend's weight before and now.
    Weight(WeightReport),
    /// A change was made (`drain`, `enable`, `reload`).
    Ok {
        /// What was done, for the operator.
        message: String,
    },
    /// The request failed or was not understood; nothing changed.
    Error {
        /// What was wrong and what to do, for the operator.
        message: String,
    },
}

impl Response {
    /// An [`Response::Error`] with `message`.
    pub fn error(message: impl Into<String>) -> Self {
        Response::Error {
            message: message.into(),
        }
    }

    /// An [`Response::Ok`] with `message`.
    pub fn ok(message: impl Into<String>) -> Self {
        Response::Ok {
            message: message.into(),
        }
    }

    /// The response as one line of the wire format, newline included.
    pub fn to_line(&self) -> String {
        to_line(self)
    }
}
