//! Things that happened in the daemon, as `xlb events` lists them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What an [`Event`] is about; on the wire, its snake_case name
/// (`"fleet_slow"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A backend changed state (health or data plane).
    Transition,
    /// A VIP's Maglev table was rebuilt.
    Table,
    /// An operator drained or enabled a backend.
    Admin,
    /// The configuration was reloaded.
    Reload,
    /// The daemon started.
    Start,
    /// A drain's deadline passed (the backend went `down`).
    Drain,
    /// A VIP entered (`to` = `panic`) or left (`to` = `normal`) panic.
    Panic,
    /// At least half of a VIP's backends became slow (`to` = `slow`), or
    /// recovered (`to` = `normal`).
    FleetSlow,
    /// A probe failed for the load balancer's own reason, or a capacity
    /// alarm (conntrack fill, a backend over `max_flows`, the conntrack
    /// insert cap) was raised or cleared.
    Alarm,
    /// A deny or allow entry was added, removed or expired (`xlb block`,
    /// `unblock`, a TTL, `auto_block`, a reload), or a new deny entry's
    /// established flows were cut: `to` is `added`, `removed`, `expired` or
    /// `flows_cut`, and `reason` names the entry.
    Block,
    /// A source went above (`to` = `heavy`) or back below (`to` = `normal`)
    /// its VIP's `source_alert`.
    Source,
    /// A backend's agent (`agent_port`) changed what it says: `from` and
    /// `to` are its states (`normal`, `drain`, `maint`, `down`), `reason`
    /// its words (escaped), its weight and any error.
    Agent,
    /// A VIP's announce state changed (`from`/`to`: `announced`,
    /// `withdrawn`, `off`; `reason` says why), or the hand-off to the
    /// speaker has a problem (`to` = `error`, `speaker_down`) or recovered
    /// (`to` = `ok`, `speaker_up`).
    Announce,
    /// A backend's weight changed at run time (`xlb weight`), or its
    /// override was dropped because the configuration changed that
    /// backend's weight: `from` and `to` are the weights.
    Weight,
}

impl EventKind {
    /// Every kind, in the order of the declaration.
    pub const ALL: [EventKind; 14] = [
        EventKind::Transition,
        EventKind::Table,
        EventKind::Admin,
        EventKind::Reload,
        EventKind::Start,
        EventKind::Drain,
        EventKind::Panic,
        EventKind::FleetSlow,
        EventKind::Alarm,
        EventKind::Block,
        EventKind::Source,
        EventKind::Agent,
        EventKind::Announce,
        EventKind::Weight,
    ];

    /// The kind as spelled in JSON, e.g. `"fleet_slow"`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Transition => "transition",
            EventKind::Table => "table",
            EventKind::Admin => "admin",
            EventKind::Reload => "reload",
            EventKind::Start => "start",
            EventKind::Drain => "drain",
            EventKind::Panic => "panic",
            EventKind::FleetSlow => "fleet_slow",
            EventKind::Alarm => "alarm",
            EventKind::Block => "block",
            EventKind::Source => "source",
            EventKind::Agent => "agent",
            EventKind::Announce => "announce",
            EventKind::Weight => "weight",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A kind equals its JSON spelling, so that a test or a script can filter
/// events with `e.kind == "transition"`, as `http::Method` compares with
/// `"GET"`.
impl PartialEq<str> for EventKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for EventKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Something that happened in the daemon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Increases by one per event, from 1 at the instance's first start,
    /// and on across restarts (kept in the state file), so `since_seq`
    /// holds across them; numbers may be skipped after a crash, never
    /// reused.
    pub seq: u64,
    /// When it happened, ms since the Unix epoch.
    pub at_unix_ms: u64,
    pub kind: EventKind,
    /// VIP name, if about one VIP.
    pub vip: Option<String>,
    /// `"ip:port"` of the backend, if about one backend.
    pub backend: Option<String>,
    /// Previous state (`"up"`, `"down"`, `"draining"`, `"unknown"`), for
    /// `transition` and `admin` events.
    pub from: Option<String>,
    /// New state.
    pub to: Option<String>,
    /// Why, for the operator, e.g. `"connected, no HTTP response within 1s"`.
    pub reason: String,
    /// How long the table rebuild this caused took, µs.
    pub table_build_us: Option<u64>,
    /// How many table slots changed backend.
    pub table_slots_changed: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_spelled_in_snake_case() {
        let spelled: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            spelled,
            [
                "transition",
                "table",
                "admin",
                "reload",
                "start",
                "drain",
                "panic",
                "fleet_slow",
                "alarm",
                "block",
                "source",
                "agent",
                "announce",
                "weight"
            ]
        );
        for kind in EventKind::ALL {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, kind.as_str(), "{kind:?} serializes as its spelling");
            assert_eq!(serde_json::from_value::<EventKind>(json).unwrap(), kind);
            assert_eq!(kind.to_string(), kind.as_str());
            assert!(kind == kind.as_str());
        }
        assert!(EventKind::FleetSlow != "fleet-slow");
        assert!(serde_json::from_str::<EventKind>(r#""restart""#).is_err());
    }
}
