//! When a VIP is announced: a pure function of what the daemon knows about
//! it, so every rule has a host unit test.
//!
//! Routes are per address while VIPs are per address, port and protocol:
//! an address is announced while **any** VIP on it is announced. A VIP
//! whose backends are all down on port 443 must not pull the address away
//! from a sibling VIP on port 80 that serves; its packets to the dead port
//! are then dropped by this node exactly as any other node would drop them
//! (every node sees the same backends down).

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use serde::Serialize;

/// Whether a VIP is announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AnnounceState {
    /// Its address is (or will be, at the next reconcile) in the table.
    Announced,
    /// It does not want its address in the table.
    Withdrawn,
    /// No `[announce]` table: xlb announces nothing.
    Off,
}

impl AnnounceState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Announced => "announced",
            Self::Withdrawn => "withdrawn",
            Self::Off => "off",
        }
    }
}

impl fmt::Display for AnnounceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a VIP is in its state; [`Reason::code`] is stable (metrics labels,
/// JSON), the `Display` text is for the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// No `[announce]` table.
    Off,
    /// Not attached yet, or some backend has not had its first probe.
    Starting,
    /// At least `min_up` backends serve.
    Serving { up: u32, total: u32 },
    /// Too few serve, but panic put failing backends back: the VIP serves.
    Panic { up: u32, total: u32 },
    /// Fewer than `min_up` serve.
    TooFewUp { up: u32, total: u32, min_up: u32 },
    /// `xlb withdraw`, with the operator's reason.
    Operator(String),
    /// The VIP left the configuration (events only: it has no state after).
    Removed,
}

impl Reason {
    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Starting => "starting",
            Self::Serving { .. } => "serving",
            Self::Panic { .. } => "panic",
            Self::TooFewUp { .. } => "too_few_up",
            Self::Operator(_) => "operator",
            Self::Removed => "removed",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("off: no [announce] table in the configuration"),
            Self::Starting => f.write_str("starting: waiting for the first probe round"),
            Self::Serving { up, total } => write!(f, "serving: {up} of {total} backends up"),
            Self::Panic { up, total } => write!(
                f,
                "panic: {up} of {total} backends up, panic mode serves with the failing ones"
            ),
            Self::TooFewUp { up, total, min_up } => write!(
                f,
                "too_few_up: {up} of {total} backends up, announce_min_up = {min_up}"
            ),
            Self::Operator(reason) => write!(f, "operator: {reason}"),
            Self::Removed => f.write_str("removed: the VIP left the configuration"),
        }
    }
}

/// What the daemon knows about one VIP, as the decision needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VipFacts<'a> {
    /// `[announce]` is configured.
    pub enabled: bool,
    /// The programs are attached (`go_live` done).
    pub attached: bool,
    /// Every backend has had a probe result since this daemon started.
    pub probed: bool,
    /// Backends in the table (serving, ramping, or put back by panic).
    pub up: u32,
    pub total: u32,
    /// The VIP's policy is in panic.
    pub panic: bool,
    /// Its `announce_min_up`.
    pub min_up: u32,
    /// Withdrawn by an operator, with the reason.
    pub operator: Option<&'a str>,
}

/// The decision for one VIP. The order of the rules is the order an
/// operator reads them: off beats everything, an operator's withdraw beats
/// health, and health waits for the first round. (A deliberate stop is
/// `xlb detach`, which runs without the daemon and deletes the routes
/// itself: no daemon state says "stopping".)
pub fn decide(f: &VipFacts<'_>) -> (AnnounceState, Reason) {
    use AnnounceState::{Announced, Withdrawn};
    if !f.enabled {
        return (AnnounceState::Off, Reason::Off);
    }
    if let Some(r) = f.operator {
        return (Withdrawn, Reason::Operator(r.to_string()));
    }
    if !f.attached || !f.probed {
        return (Withdrawn, Reason::Starting);
    }
    let (up, total) = (f.up, f.total);
    if up >= f.min_up {
        let reason = if f.panic {
            Reason::Panic { up, total }
        } else {
            Reason::Serving { up, total }
        };
        return (Announced, reason);
    }
    (
        Withdrawn,
        Reason::TooFewUp {
            up,
            total,
            min_up: f.min_up,
        },
    )
}

/// The addresses to announce: those with at least one announced VIP.
pub fn wanted_addresses<'a>(
    vips: impl IntoIterator<Item = (IpAddr, AnnounceState)> + 'a,
) -> BTreeSet<IpAddr> {
    vips.into_iter()
        .filter(|(_, s)| *s == AnnounceState::Announced)
        .map(|(a, _)| a)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serving() -> VipFacts<'static> {
        VipFacts {
            enabled: true,
            attached: true,
            probed: true,
            up: 3,
            total: 3,
            panic: false,
            min_up: 1,
            operator: None,
        }
    }

    #[test]
    fn decisions() {
        use AnnounceState::*;
        let cases: Vec<(&str, VipFacts<'_>, AnnounceState, &str, &str)> = vec![
            (
                "all up",
                serving(),
                Announced,
                "serving",
                "serving: 3 of 3 backends up",
            ),
            (
                "no [announce]",
                VipFacts {
                    enabled: false,
                    ..serving()
                },
                Off,
                "off",
                "off: no [announce] table in the configuration",
            ),
            (
                "not attached",
                VipFacts {
                    attached: false,
                    ..serving()
                },
                Withdrawn,
                "starting",
                "starting: waiting for the first probe round",
            ),
            (
                "first round not done",
                VipFacts {
                    probed: false,
                    ..serving()
                },
                Withdrawn,
                "starting",
                "starting: waiting for the first probe round",
            ),
            (
                "none up",
                VipFacts { up: 0, ..serving() },
                Withdrawn,
                "too_few_up",
                "too_few_up: 0 of 3 backends up, announce_min_up = 1",
            ),
            (
                "exactly min_up",
                VipFacts {
                    up: 2,
                    min_up: 2,
                    ..serving()
                },
                Announced,
                "serving",
                "serving: 2 of 3 backends up",
            ),
            (
                "one short of min_up",
                VipFacts {
                    up: 1,
                    min_up: 2,
                    ..serving()
                },
                Withdrawn,
                "too_few_up",
                "too_few_up: 1 of 3 backends up, announce_min_up = 2",
            ),
            (
                "panic counts as serving",
                VipFacts {
                    up: 3,
                    panic: true,
                    ..serving()
                },
                Announced,
                "panic",
                "panic: 3 of 3 backends up, panic mode serves with the failing ones",
            ),
            (
                "operator beats health",
                VipFacts {
                    operator: Some("maintenance of rack 4"),
                    ..serving()
                },
                Withdrawn,
                "operator",
                "operator: maintenance of rack 4",
            ),
            (
                "operator beats starting",
                VipFacts {
                    operator: Some("m"),
                    probed: false,
                    ..serving()
                },
                Withdrawn,
                "operator",
                "operator: m",
            ),
            (
                "off beats the operator",
                VipFacts {
                    enabled: false,
                    operator: Some("m"),
                    ..serving()
                },
                Off,
                "off",
                "off: no [announce] table in the configuration",
            ),
            (
                "no backends",
                VipFacts {
                    up: 0,
                    total: 0,
                    ..serving()
                },
                Withdrawn,
                "too_few_up",
                "too_few_up: 0 of 0 backends up, announce_min_up = 1",
            ),
        ];
        for (name, facts, state, code, text) in cases {
            let (s, r) = decide(&facts);
            assert_eq!(
                (s, r.code(), r.to_string().as_str()),
                (state, code, text),
                "{name}"
            );
        }
    }

    /// The codes a VIP's state can have are the ones the protocol lists
    /// (`Removed` is told in events only: a removed VIP has no state).
    #[test]
    fn codes_are_the_protocols() {
        let codes: Vec<&str> = [
            Reason::Off,
            Reason::Starting,
            Reason::Serving { up: 1, total: 1 },
            Reason::Panic { up: 1, total: 1 },
            Reason::TooFewUp {
                up: 0,
                total: 1,
                min_up: 1,
            },
            Reason::Operator("x".into()),
        ]
        .iter()
        .map(Reason::code)
        .collect();
        assert_eq!(codes, lb_ctl::ANNOUNCE_CODES);
        let states: Vec<&str> = [
            AnnounceState::Announced,
            AnnounceState::Withdrawn,
            AnnounceState::Off,
        ]
        .iter()
        .map(|s| s.as_str())
        .collect();
        assert_eq!(states, lb_ctl::ANNOUNCE_STATES);
    }

    #[test]
    fn an_address_stays_while_any_vip_on_it_is_announced() {
        use AnnounceState::*;
        let a: IpAddr = "10.100.0.1".parse().unwrap();
        let b: IpAddr = "10.100.0.2".parse().unwrap();
        let c: IpAddr = "fd00::1".parse().unwrap();
        let got = wanted_addresses([
            (a, Announced),
            (a, Withdrawn), // a sibling port down: a stays
            (b, Withdrawn),
            (b, Off),
            (c, Announced),
        ]);
        assert_eq!(got, BTreeSet::from([a, c]));
        assert_eq!(wanted_addresses([(a, Off)]), BTreeSet::new());
    }
}
