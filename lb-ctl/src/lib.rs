//! The control protocol: how `xlb status`, `xlb drain` and friends talk to a
//! running daemon, in one small crate that the daemon, the CLI, the test lab
//! and the integration tests share, so none of them copies a type.
//!
//! A Unix stream socket (default [`DEFAULT_CONTROL_SOCKET`]) carries one JSON
//! object per line each way: a [`Request`] from the client, a [`Response`]
//! from the daemon, on the same connection as many times as the client likes.
//! `events` with `follow` turns the connection into a stream of
//! [`Response::Event`] lines that ends when the client closes it.
//!
//! Every line carries `"version": 2` ([`PROTOCOL_VERSION`]):
//!
//! ```text
//! → {"version":2,"command":"drain","vip":"api","backend":"10.99.0.12:80"}
//! ← {"version":2,"response":"ok","data":{"message":"drained 10.99.0.12:80 of vip api"}}
//! ```
//!
//! The types are also the `--json` output of the CLI, so their field names
//! and spellings are a stable interface: add fields, never rename or remove
//! one without bumping [`PROTOCOL_VERSION`].
//!
//! This crate holds data and its wire format only (serde, no I/O): the
//! socket's client and server are in `lb_user::ctl`.

use std::time::{SystemTime, UNIX_EPOCH};

mod agent;
mod announce;
mod cluster;
mod event;
mod explain;
mod guard;
mod passive;
mod request;
mod response;
mod status;
mod weight;
mod wire;

pub use agent::AgentStatus;
pub use announce::{ANNOUNCE_CODES, ANNOUNCE_STATES, AnnounceStatus, VipAnnounce};
pub use cluster::{ClusterStatus, FingerprintStatus};
pub use event::{Event, EventKind};
pub use explain::{ExplainReport, VIA};
pub use guard::{
    BlockEntry, EntryOrigin, GuardAction, ListKind, SourceRow, SourceVerdict, VipSources,
};
pub use passive::{PassiveStatus, PassiveTotals};
pub use request::{Protocol, Request};
pub use response::Response;
pub use status::{
    BACKEND_STATES, BackendStatus, ConntrackStatus, NatStatus, PLACEMENTS, ProbeStatus,
    StatusReport, VipNatStatus, VipStatus,
};
pub use weight::WeightReport;
pub use wire::{COMMANDS, PROTOCOL_VERSION, SUPPORTED_VERSIONS, parse_request, parse_response};

/// `daemon.control_socket` when the configuration does not set it, and the
/// socket the CLI talks to without `--socket`.
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/xlb/xlb.sock";

/// `daemon.instance` when the configuration does not set it: pins live
/// under `/sys/fs/bpf/xlb/default/`.
pub const DEFAULT_INSTANCE: &str = "default";

/// Now, ms since the Unix epoch: the unit of every `*_unix_ms` field.
pub fn now_unix_ms() -> u64 {
    unix_ms(SystemTime::now())
}

/// `t` as ms since the Unix epoch (0 before it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn unix_ms_counts_from_the_epoch() {
        let cases = [
            ("the epoch", UNIX_EPOCH, 0),
            ("before it", UNIX_EPOCH - Duration::from_secs(1), 0),
            (
                "a date",
                UNIX_EPOCH + Duration::from_micros(1_800_000_000_123_999),
                1_800_000_000_123,
            ),
        ];
        for (name, t, want) in cases {
            assert_eq!(unix_ms(t), want, "{name}");
        }
        assert!(now_unix_ms() > 1_700_000_000_000);
    }
}
