//! The router's routes to the VIPs as they change, with the time of each
//! change: what the announcement latency is measured against.
//!
//! `ip -o monitor route` runs inside the router's namespace and prints one
//! line per netlink route message as the kernel sends it; each line is
//! timed when it is read (the pipe adds microseconds: iproute2 flushes
//! after every message). The lines are folded into each destination's set
//! of next hops, so a change reads as "10.100.0.1 now via A and B".
//!
//! IPv4 messages carry a route whole (a multipath route lists every next
//! hop; a `Deleted` one removes the route). IPv6 keeps a multipath route as
//! one route per next hop and the kernel announces deleting one of them
//! alone, so for IPv6 a message adds or removes the next hops it names.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    net::IpAddr,
    process::{Child, Stdio},
    sync::{Arc, Mutex},
    thread,
};

use crate::scenario::{ScenarioError, command_in};

/// One route message, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteMsg {
    /// `Deleted …`.
    pub deleted: bool,
    /// The destination as printed: an address for a host route
    /// (`10.100.0.1`), a prefix otherwise (`10.0.0.0/24`).
    pub dst: String,
    /// The next hops the message names (`via`), in order.
    pub via: Vec<IpAddr>,
    /// `table N`, when not the main table.
    pub table: Option<String>,
}

/// Route types `ip` prints before the destination (`local 10.0.0.1 …`).
const TYPES: [&str; 9] = [
    "unicast",
    "local",
    "broadcast",
    "multicast",
    "anycast",
    "unreachable",
    "blackhole",
    "prohibit",
    "throw",
];

/// Parses one line of `ip -o monitor route`; `None` for a line that is not
/// a route (a blank line, a `Timestamp:`).
pub fn parse_line(line: &str) -> Option<RouteMsg> {
    let mut words = line.split_whitespace().peekable();
    let deleted = words.next_if_eq(&"Deleted").is_some();
    words.next_if(|w| TYPES.contains(w));
    let dst = words.next()?.to_string();
    if dst.parse::<IpAddr>().is_err()
        && dst
            .split_once('/')
            .is_none_or(|(a, _)| a.parse::<IpAddr>().is_err())
        && dst != "default"
    {
        return None;
    }
    let mut msg = RouteMsg {
        deleted,
        dst,
        via: Vec::new(),
        table: None,
    };
    while let Some(w) = words.next() {
        match w {
            "via" => {
                // `via inet6 fe80::1` names the family first.
                words.next_if(|w| *w == "inet" || *w == "inet6");
                if let Some(a) = words.next().and_then(|a| a.parse().ok()) {
                    msg.via.push(a);
                }
            }
            "table" => msg.table = words.next().map(str::to_string),
            _ => {}
        }
    }
    Some(msg)
}

/// Each destination's next hops, folded from route messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes {
    /// Destination → next hops, sorted; a destination without a route is
    /// absent.
    pub by_dst: BTreeMap<String, Vec<IpAddr>>,
}

impl Routes {
    /// Applies one message of the main table (others are ignored: the
    /// router forwards by its main table).
    pub fn apply(&mut self, m: &RouteMsg) {
        if m.table.is_some() {
            return;
        }
        let v6 = m.dst.contains(':');
        let hops = self.by_dst.entry(m.dst.clone()).or_default();
        match (v6, m.deleted) {
            (false, true) => hops.clear(),
            (false, false) => hops.clone_from(&m.via),
            (true, true) if m.via.is_empty() => hops.clear(),
            (true, true) => hops.retain(|h| !m.via.contains(h)),
            (true, false) => hops.extend(&m.via),
        }
        hops.sort_unstable();
        hops.dedup();
        if hops.is_empty() {
            self.by_dst.remove(&m.dst);
        }
    }

    /// The next hops of `dst` (empty: no route).
    pub fn via(&self, dst: &str) -> &[IpAddr] {
        self.by_dst.get(dst).map_or(&[], Vec::as_slice)
    }
}

/// A change of one destination's next hops, and when it was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// ms since the epoch (as xlb's events carry).
    pub at_unix_ms: u64,
    pub dst: String,
    /// The next hops after the change (empty: the route is gone).
    pub via: Vec<IpAddr>,
}

/// The changes that `lines` (time, line) make to destinations, in order;
/// a message that leaves a destination's next hops as they were is none.
pub fn changes<'a>(lines: impl IntoIterator<Item = (u64, &'a str)>) -> Vec<Change> {
    let mut routes = Routes::default();
    let mut out = Vec::new();
    for (at, line) in lines {
        let Some(m) = parse_line(line) else { continue };
        let before = routes.via(&m.dst).to_vec();
        routes.apply(&m);
        let after = routes.via(&m.dst);
        if before != after {
            out.push(Change {
                at_unix_ms: at,
                dst: m.dst.clone(),
                via: after.to_vec(),
            });
        }
    }
    out
}

/// The first change of `dst` seen at or after `from_unix_ms` whose next
/// hops satisfy `want`.
pub fn first_change<'a>(
    changes: &'a [Change],
    dst: &str,
    from_unix_ms: u64,
    want: impl Fn(&[IpAddr]) -> bool,
) -> Option<&'a Change> {
    changes
        .iter()
        .find(|c| c.dst == dst && c.at_unix_ms >= from_unix_ms && want(&c.via))
}

/// `ip -o monitor route` running in a namespace, its lines collected with
/// the time each was read. Dropping it stops the monitor.
pub struct RouteWatch {
    child: Child,
    lines: Arc<Mutex<Vec<(u64, String)>>>,
}

impl RouteWatch {
    /// Starts watching the routes of namespace `ns` (the router's). Changes
    /// made before this returns may be missed: start it before acting.
    pub fn start(ns: &str) -> Result<Self, ScenarioError> {
        let mut cmd = command_in(ns, "ip")?;
        cmd.args(["-o", "monitor", "route"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().map_err(|e| ScenarioError::Io {
            what: format!("starting `ip -o monitor route` in namespace {ns}"),
            source: e,
        })?;
        let out = child.stdout.take().expect("stdout is piped");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let at = lb_ctl::now_unix_ms();
                sink.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((at, line));
            }
        });
        // `ip monitor` subscribes before it reads anything; give it the
        // moment it needs so a change right after this is not missed.
        thread::sleep(std::time::Duration::from_millis(100));
        Ok(Self { child, lines })
    }

    /// Every change seen so far, in order.
    pub fn changes(&self) -> Vec<Change> {
        let lines = self
            .lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        changes(lines.iter().map(|(t, l)| (*t, l.as_str())))
    }
}

impl Drop for RouteWatch {
    fn drop(&mut self) {
        // Our own child, by its pid: nothing else is signalled.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_the_lines_of_ip_monitor() {
        // Lines as `ip -o monitor route` printed them (iproute2 6.x).
        let cases: [(&str, &str, Option<RouteMsg>); 6] = [
            (
                "v4 multipath",
                "10.100.0.1 proto bird \\\tnexthop via 10.9.0.2 dev d0 weight 1 \\\tnexthop via 10.9.1.2 dev d1 weight 1 ",
                Some(RouteMsg {
                    deleted: false,
                    dst: "10.100.0.1".into(),
                    via: vec![ip("10.9.0.2"), ip("10.9.1.2")],
                    table: None,
                }),
            ),
            (
                "v4 deleted",
                "Deleted 10.100.0.1 via 10.9.1.2 dev d1 proto bird ",
                Some(RouteMsg {
                    deleted: true,
                    dst: "10.100.0.1".into(),
                    via: vec![ip("10.9.1.2")],
                    table: None,
                }),
            ),
            (
                "v6 multipath",
                "fd00:100::1 proto bird metric 1024 pref medium\\\tnexthop via fd09::2 dev d0 weight 1 \\\tnexthop via fd09:1::2 dev d1 weight 1 ",
                Some(RouteMsg {
                    deleted: false,
                    dst: "fd00:100::1".into(),
                    via: vec![ip("fd09::2"), ip("fd09:1::2")],
                    table: None,
                }),
            ),
            (
                "local table, typed",
                "local fe80::841f:8fff:fecd:a93f dev d1 table local proto kernel metric 0 pref medium",
                Some(RouteMsg {
                    deleted: false,
                    dst: "fe80::841f:8fff:fecd:a93f".into(),
                    via: vec![],
                    table: Some("local".into()),
                }),
            ),
            (
                "timestamp line",
                "Timestamp: Thu Dec  3 15:30:00 2026 1 usec",
                None,
            ),
            ("blank", "", None),
        ];
        for (name, line, want) in cases {
            assert_eq!(parse_line(line), want, "case {name}");
        }
        let prefix = parse_line("10.9.0.0/24 dev d0 proto kernel scope link src 10.9.0.1").unwrap();
        assert_eq!((prefix.dst.as_str(), prefix.via.len()), ("10.9.0.0/24", 0));
    }

    #[test]
    fn folds_messages_into_changes_of_next_hops() {
        let lines = [
            (10, "10.100.0.1 via 10.9.0.2 dev d0 proto bird "),
            (
                20,
                "10.100.0.1 proto bird \\\tnexthop via 10.9.0.2 dev d0 weight 1 \\\tnexthop via 10.9.1.2 dev d1 weight 1 ",
            ),
            // The same route again (a refresh): no change.
            (
                25,
                "10.100.0.1 proto bird \\\tnexthop via 10.9.1.2 dev d1 weight 1 \\\tnexthop via 10.9.0.2 dev d0 weight 1 ",
            ),
            (30, "10.100.0.1 via 10.9.1.2 dev d1 proto bird "),
            (40, "Deleted 10.100.0.1 via 10.9.1.2 dev d1 proto bird "),
            (
                50,
                "fd00:100::1 proto bird metric 1024 pref medium\\\tnexthop via fd09::2 dev d0 weight 1 \\\tnexthop via fd09:1::2 dev d1 weight 1 ",
            ),
            // IPv6 deletes one next hop of a multipath route at a time.
            (
                60,
                "Deleted fd00:100::1 via fd09::2 dev d0 proto bird metric 1024 pref medium",
            ),
            (
                70,
                "Deleted fd00:100::1 via fd09:1::2 dev d1 proto bird metric 1024 pref medium",
            ),
            (80, "10.100.0.9 via 10.9.0.2 dev d0 table 100 proto 252 "),
        ];
        let got: Vec<(u64, &str, Vec<IpAddr>)> = changes(lines)
            .iter()
            .map(|c| (c.at_unix_ms, c.dst.as_str(), c.via.clone()))
            .map(|(t, d, v)| (t, if d.contains(':') { "v6" } else { "v4" }, v))
            .collect();
        assert_eq!(
            got,
            [
                (10, "v4", vec![ip("10.9.0.2")]),
                (20, "v4", vec![ip("10.9.0.2"), ip("10.9.1.2")]),
                (30, "v4", vec![ip("10.9.1.2")]),
                (40, "v4", vec![]),
                (50, "v6", vec![ip("fd09::2"), ip("fd09:1::2")]),
                (60, "v6", vec![ip("fd09:1::2")]),
                (70, "v6", vec![]),
            ],
            "another table's route is not the router's"
        );
        let all = changes(lines);
        let gone = first_change(&all, "10.100.0.1", 21, |v| !v.contains(&ip("10.9.0.2")));
        assert_eq!(gone.map(|c| c.at_unix_ms), Some(30));
        assert_eq!(first_change(&all, "10.100.0.1", 41, |_| true), None);
    }
}
