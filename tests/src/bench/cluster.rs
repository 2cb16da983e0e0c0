//! What `xlb-cluster-bench` computes from what it saw in the two-node lab:
//! the announcement latency (a node's backend state change to the route
//! change on the router) and the figures of both measurements for the
//! summary. The lab is driven by the binary; everything here is pure and
//! tested on its own.

use std::net::IpAddr;

use xlb_lab::route_watch::{Change, first_change};

use super::figures::{Figure, Target};

/// The benchmark's name in the summary.
pub const BENCH: &str = "xlb-cluster-bench";

/// Goal of the convergence after a node's death with BFD at 100 ms × 3
/// (issue 26): the last connection flowing again within a second.
pub const CONVERGENCE_GOAL_MS: f64 = 1000.0;

/// Goal of the announcement latency (issue 26).
pub const ANNOUNCE_GOAL_MS: f64 = 100.0;

/// Summary group of the convergence figures (`bench_notes` in xtask says
/// what they measure).
pub const CONVERGENCE_GROUP: &str = "cluster: node death to last connection flowing";

/// Summary group of the announcement latency figures.
pub const ANNOUNCE_GROUP: &str = "cluster: backend change to route change on the router";

/// A node's decision to change what it announces, as its daemon's event
/// dated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeChange {
    /// `A` or `B`.
    pub node: String,
    /// The node's address as the router's next hop.
    pub next_hop: IpAddr,
    /// The backend transition that made the VIP (un)servable, ms since
    /// the epoch.
    pub at_unix_ms: u64,
    /// `true`: the node stops announcing the VIP; `false`: it starts.
    pub withdraw: bool,
}

/// One announcement latency: how long after `change` the router's route
/// to `dst` lost (withdraw) or gained (announce) the node as a next hop;
/// `None` when the router never showed it.
pub fn latency(change: &NodeChange, changes: &[Change], dst: &str) -> Option<u64> {
    let hop = change.next_hop;
    let seen = first_change(changes, dst, change.at_unix_ms, |via| {
        via.contains(&hop) != change.withdraw
    })?;
    Some(seen.at_unix_ms - change.at_unix_ms)
}

/// The announcement latencies of `changes`, split into withdrawals and
/// announcements; a change the router never showed is counted apart.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Latencies {
    pub withdraw_ms: Vec<f64>,
    pub announce_ms: Vec<f64>,
    /// Node changes with no matching route change on the router.
    pub unseen: usize,
}

pub fn latencies(node_changes: &[NodeChange], changes: &[Change], dst: &str) -> Latencies {
    let mut l = Latencies::default();
    for c in node_changes {
        match (latency(c, changes, dst), c.withdraw) {
            (Some(ms), true) => l.withdraw_ms.push(ms as f64),
            (Some(ms), false) => l.announce_ms.push(ms as f64),
            (None, _) => l.unseen += 1,
        }
    }
    l
}

/// The summary's figures of the announcement latency: per direction its
/// median (with the spread of the runs) and its maximum, each held to the
/// goal.
pub fn latency_figures(l: &Latencies) -> Vec<Figure> {
    let mut out = Vec::new();
    for (what, v) in [("withdraw", &l.withdraw_ms), ("announce", &l.announce_ms)] {
        if v.is_empty() {
            continue;
        }
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        out.push(
            Figure::median_of(BENCH, ANNOUNCE_GROUP, &format!("{what}, median"), v, "ms")
                .target(Target::AtMost(ANNOUNCE_GOAL_MS)),
        );
        out.push(
            Figure {
                runs: v.len(),
                ..Figure::new(BENCH, ANNOUNCE_GROUP, &format!("{what}, max"), max, "ms")
            }
            .target(Target::AtMost(ANNOUNCE_GOAL_MS)),
        );
    }
    out
}

/// A way a node dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Death {
    /// Its daemon and BIRD killed, its XDP detached: the BGP session
    /// closes, the router withdraws at once.
    Process,
    /// Its link to the router drops everything (nftables): only BFD or
    /// the BGP hold timer notices.
    Silent,
    /// `xlb withdraw --all`: the node withdraws its routes and keeps
    /// forwarding what still reaches it.
    Graceful,
}

impl Death {
    pub fn name(self) -> &'static str {
        match self {
            Self::Process => "process death",
            Self::Silent => "silent link",
            Self::Graceful => "graceful withdraw",
        }
    }
}

/// The BGP timers a case runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timers {
    /// BIRD's defaults: hold 240 s, keepalive 80 s, no BFD.
    BirdDefaults,
    /// BFD at 100 ms × 3 on both sides of every session.
    Bfd,
}

impl Timers {
    pub fn name(self) -> &'static str {
        match self {
            Self::BirdDefaults => "BIRD defaults",
            Self::Bfd => "BFD 100 ms x 3",
        }
    }
}

/// BIRD 2's default BGP hold time (`hold time`, bird.conf(5)): what a
/// silent link costs without BFD, computed rather than waited for.
pub const BIRD_DEFAULT_HOLD_S: u64 = 240;

/// The cases measured, in order: with BIRD's defaults only the deaths
/// that close the session (a silent link would take the hold time, 240 s,
/// which is computed instead); with BFD all three.
pub fn cases() -> Vec<(Death, Timers)> {
    vec![
        (Death::Process, Timers::BirdDefaults),
        (Death::Graceful, Timers::BirdDefaults),
        (Death::Process, Timers::Bfd),
        (Death::Silent, Timers::Bfd),
        (Death::Graceful, Timers::Bfd),
    ]
}

/// The convergence figure of a case over its rounds (ms from the death to
/// the last held connection answering again); with BFD held to the goal.
pub fn convergence_figure(death: Death, timers: Timers, rounds_ms: &[f64]) -> Figure {
    let case = format!("{}, {}", death.name(), timers.name());
    let f = Figure::median_of(BENCH, CONVERGENCE_GROUP, &case, rounds_ms, "ms");
    match timers {
        Timers::Bfd => f.target(Target::AtMost(CONVERGENCE_GOAL_MS)),
        Timers::BirdDefaults => f,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xlb_lab::route_watch::changes;

    const A: &str = "10.20.0.2";
    const B: &str = "10.20.1.2";
    const VIP: &str = "10.100.0.1";

    fn node(node: &str, hop: &str, at: u64, withdraw: bool) -> NodeChange {
        NodeChange {
            node: node.into(),
            next_hop: hop.parse().unwrap(),
            at_unix_ms: at,
            withdraw,
        }
    }

    /// Both nodes announce, both withdraw (B first), both announce again.
    fn router() -> Vec<Change> {
        let both = format!(
            "{VIP} proto bird \\\tnexthop via {A} dev r0 weight 1 \\\tnexthop via {B} dev r1 weight 1 "
        );
        let only = |h: &str| format!("{VIP} via {h} dev r0 proto bird ");
        let lines = [
            (1000, only(A)),
            (1010, both.clone()),
            (2040, only(A)),
            (2300, format!("Deleted {VIP} via {A} dev r0 proto bird ")),
            (5012, only(B)),
            (5030, both),
        ];
        changes(lines.iter().map(|(t, l)| (*t, l.as_str())))
    }

    #[test]
    fn latency_finds_the_route_change_that_matches_the_node() {
        let r = router();
        let cases = [
            ("B withdraws first", node("B", B, 2000, true), Some(40)),
            ("A withdraws after B", node("A", A, 2290, true), Some(10)),
            ("B announces first", node("B", B, 5000, false), Some(12)),
            ("A announces", node("A", A, 5001, false), Some(29)),
            // A change the router never showed: A is still a next hop.
            ("never seen", node("A", A, 5100, true), None),
        ];
        for (name, c, want) in cases {
            assert_eq!(latency(&c, &r, VIP), want, "case {name}");
        }
        assert_eq!(latency(&node("A", A, 2290, true), &r, "10.100.0.2"), None);
    }

    #[test]
    fn latency_figures_are_medians_and_maxima_held_to_the_goal() {
        let l = latencies(
            &[
                node("B", B, 2000, true),
                node("A", A, 2290, true),
                node("B", B, 5000, false),
                node("A", A, 5001, false),
                node("A", A, 5100, true),
            ],
            &router(),
            VIP,
        );
        assert_eq!(l.withdraw_ms, [40.0, 10.0]);
        assert_eq!(l.announce_ms, [12.0, 29.0]);
        assert_eq!(l.unseen, 1);
        let figs = latency_figures(&l);
        let got: Vec<(&str, f64, Option<bool>)> = figs
            .iter()
            .map(|f| (f.case.as_str(), f.value, f.met()))
            .collect();
        assert_eq!(
            got,
            [
                ("withdraw, median", 25.0, Some(true)),
                ("withdraw, max", 40.0, Some(true)),
                ("announce, median", 20.5, Some(true)),
                ("announce, max", 29.0, Some(true)),
            ]
        );
        let slow = latency_figures(&Latencies {
            withdraw_ms: vec![50.0, 150.0, 60.0],
            ..Latencies::default()
        });
        assert_eq!(slow.len(), 2, "no announcements, no announce figures");
        assert_eq!((slow[0].met(), slow[1].met()), (Some(true), Some(false)));
        assert_eq!(slow[1].runs, 3);
    }

    #[test]
    fn convergence_is_held_to_the_goal_with_bfd_only() {
        let bfd = convergence_figure(Death::Silent, Timers::Bfd, &[700.0, 1300.0, 900.0]);
        assert_eq!(bfd.case, "silent link, BFD 100 ms x 3");
        assert_eq!((bfd.value, bfd.met()), (900.0, Some(true)));
        let late = convergence_figure(Death::Process, Timers::Bfd, &[1200.0]);
        assert_eq!(late.met(), Some(false));
        let defaults = convergence_figure(Death::Process, Timers::BirdDefaults, &[5.0]);
        assert_eq!(defaults.met(), None, "no goal with BIRD's defaults");
        assert!(
            !cases().contains(&(Death::Silent, Timers::BirdDefaults)),
            "a silent link without BFD waits the hold time: computed, not run"
        );
    }
}
