//! Passive evidence that no single client can make (issue 38). Every
//! request and connection is made by a client, and one client can make
//! its own requests fail on purpose (send half a request and wait, or
//! reset it) on the source ports that reach one backend. So a failing
//! verdict from the counters (`verdict`) stands only if the flows failing
//! at that moment come from several client prefixes (an IPv4 address, an
//! IPv6 /64, as the guard keys sources), and if it still stands when each
//! prefix's failing flows count at most `cap`.
//!
//! The flows come from the NAT sweep's walk of the flow table
//! (`daemon::nat_sweep`): a request pending past `response_timeout` on an
//! established flow, or a connection without a SYN-ACK past
//! `connect_timeout` from a prefix that has completed a handshake (a SYN's
//! source can be forged; a completed handshake's cannot).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use lb_common::FlowKey;
use lb_common::nat::{
    NAT_FLAG_ANSWERED, NAT_TCP_ESTABLISHED, NAT_TCP_SYN_SENT, NAT_UDP, NatFlow, NatPool,
};

use super::{Thresholds, Window};
use crate::config::guard_defaults;
use crate::guard::Prefix;
use crate::trace::render::addr_of;

/// The prefix a client address is counted under, as the guard keys a
/// source by default: the address itself (IPv4), or its /64 (IPv6),
/// where one host's addresses rotate.
pub fn client_prefix(addr: IpAddr) -> Prefix {
    let len = match addr {
        IpAddr::V4(_) => guard_defaults::SOURCE_V4_PREFIX,
        IpAddr::V6(_) => guard_defaults::SOURCE_V6_PREFIX,
    };
    Prefix::of(addr, len)
}

/// The client prefix of flow key `key`.
fn prefix_of(key: &FlowKey) -> Prefix {
    client_prefix(addr_of(&key.src, key.family))
}

/// Whether `flow`'s client has shown its address is its own: a completed
/// handshake, or a UDP flow its backend answered.
fn proven(flow: &NatFlow) -> bool {
    flow.state == NAT_TCP_ESTABLISHED
        || (flow.state == NAT_UDP && flow.flags & NAT_FLAG_ANSWERED != 0)
}

/// One backend's flows failing at the moment, by client prefix.
pub type Failing = HashMap<Prefix, u32>;

/// What one walk of the NAT flow table says of the flows failing at the
/// moment, by backend and client prefix.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowEvidence {
    /// Per (backend id, generation): requests pending past
    /// `response_timeout`, and connections without a SYN-ACK past
    /// `connect_timeout` from proven prefixes (after [`Self::finish`]).
    pub failing: HashMap<(u32, u32), Failing>,
    /// Connections without a SYN-ACK, until `finish` keeps the proven.
    waiting: HashMap<(u32, u32), Failing>,
}

impl FlowEvidence {
    /// Takes one unexpired flow of the table at `now_ns` (the data plane's
    /// coarse clock); `pool` is its VIP's (0 timeouts: passive detection
    /// off, nothing counted).
    pub fn add(&mut self, key: &FlowKey, flow: &NatFlow, pool: &NatPool, now_ns: u64) {
        if !pool.passive_on() {
            return;
        }
        let id = (flow.backend_id, flow.generation);
        let to = if proven(flow) {
            let overdue = flow.request_ns != 0
                && now_ns.saturating_sub(flow.request_ns) >= pool.response_timeout_ns;
            if !overdue {
                return;
            }
            &mut self.failing
        } else if flow.state == NAT_TCP_SYN_SENT
            && pool.connect_timeout_ns != 0
            && now_ns.saturating_sub(flow.last_seen_ns) >= pool.connect_timeout_ns
        {
            &mut self.waiting
        } else {
            return;
        };
        *to.entry(id).or_default().entry(prefix_of(key)).or_default() += 1;
    }

    /// Once every flow of the table is added (`flows`, read again only if
    /// a connection waits): connections waiting for a SYN-ACK count for
    /// the prefixes that have proven themselves among `flows` (a forged
    /// source has no completed handshake).
    pub fn finish<'a>(&mut self, flows: impl IntoIterator<Item = &'a (FlowKey, NatFlow)>) {
        if self.waiting.is_empty() {
            return;
        }
        let wanted: HashSet<Prefix> = self
            .waiting
            .values()
            .flat_map(|w| w.keys().copied())
            .collect();
        let proven: HashSet<Prefix> = flows
            .into_iter()
            .filter(|(_, f)| proven(f))
            .map(|(k, _)| prefix_of(k))
            .filter(|p| wanted.contains(p))
            .collect();
        for (id, waiting) in std::mem::take(&mut self.waiting) {
            for (prefix, n) in waiting {
                if proven.contains(&prefix) {
                    *self
                        .failing
                        .entry(id)
                        .or_default()
                        .entry(prefix)
                        .or_default() += n;
                }
            }
        }
    }
}

/// How many sources a verdict needs (`[passive] min_sources`), and how
/// many failing flows of one source count at most (`source_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceRule {
    pub min_sources: u32,
    pub cap: u32,
}

/// Judges a failing verdict on window `w` by the sources of the flows
/// `failing` now: `Ok` with what to add to the verdict's reason, or `Err`
/// with why it does not stand.
pub fn check(
    failing: &Failing,
    w: &Window,
    th: &Thresholds,
    rule: &SourceRule,
) -> Result<String, String> {
    let flows: u64 = failing.values().map(|&n| u64::from(n)).sum();
    let sources = failing.values().filter(|&&n| n > 0).count() as u64;
    if sources < u64::from(rule.min_sources.max(1)) {
        return Err(format!(
            "{flows} failing {} from {} ({}); a verdict needs {} (min_sources): not ejected",
            plural(flows, "flow", "flows"),
            count_of(sources, "client prefix", "client prefixes"),
            busiest(failing, 3),
            count_of(
                u64::from(rule.min_sources),
                "client prefix",
                "client prefixes"
            ),
        ));
    }
    // What one prefix made beyond its cap is taken out of both the
    // failures and the judged: the verdict is made again without it.
    let excess: u64 = failing
        .values()
        .map(|&n| u64::from(n.saturating_sub(rule.cap)))
        .sum();
    let failed = w.failed().saturating_sub(excess);
    let judged = w.judged().saturating_sub(excess);
    let share = if judged == 0 {
        0.0
    } else {
        failed as f64 / judged as f64
    };
    if excess > 0 && (judged < th.min_requests.max(1) || share < th.failure_threshold) {
        return Err(format!(
            "with at most {} failing flows counted per client prefix, {failed} of {judged} \
             failed, below the verdict's bounds ({}% of at least {}): not ejected",
            rule.cap,
            th.failure_threshold * 100.0,
            th.min_requests
        ));
    }
    Ok(format!(
        "from {}",
        count_of(sources, "client prefix", "client prefixes")
    ))
}

fn plural<'a>(n: u64, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 { one } else { many }
}

fn count_of(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", plural(n, one, many))
}

/// The `n` prefixes with the most failing flows, for the operator:
/// `"192.0.2.7: 12, 2001:db8::/64: 3"`.
fn busiest(failing: &Failing, n: usize) -> String {
    let mut all: Vec<(&Prefix, &u32)> = failing.iter().filter(|(_, c)| **c > 0).collect();
    all.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let mut out = String::new();
    for (i, (p, c)) in all.iter().take(n).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let shown = if p.is_ipv4() {
            p.addr.to_string()
        } else {
            p.to_string()
        };
        let _ = write!(out, "{shown}: {c}");
    }
    if all.len() > n {
        let _ = write!(out, ", {} more", all.len() - n);
    }
    if out.is_empty() {
        out.push_str("none in the flow table now");
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn th() -> Thresholds {
        Thresholds {
            window: Duration::from_secs(2),
            response_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            min_requests: 10,
            failure_threshold: 0.2,
            peer_factor: 5.0,
        }
    }

    const RULE: SourceRule = SourceRule {
        min_sources: 3,
        cap: 4,
    };

    /// A window where `failed` of `judged` requests went unanswered.
    fn window(failed: u64, judged: u64) -> Window {
        Window {
            requests_due: judged,
            unanswered: failed,
            ..Window::default()
        }
    }

    fn failing(list: &[(&str, u32)]) -> Failing {
        let mut f = Failing::new();
        for (a, n) in list {
            *f.entry(client_prefix(a.parse().unwrap())).or_default() += n;
        }
        f
    }

    #[test]
    fn an_ipv6_client_is_its_64_and_an_ipv4_client_its_address() {
        let a = client_prefix("2001:db8:1:2::7".parse().unwrap());
        let b = client_prefix("2001:db8:1:2:ffff::1".parse().unwrap());
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "2001:db8:1:2::/64");
        assert_ne!(
            client_prefix("192.0.2.7".parse().unwrap()),
            client_prefix("192.0.2.8".parse().unwrap())
        );
    }

    /// The review's attack: one client's 13 requests, held unanswered.
    #[test]
    fn one_client_cannot_make_a_verdict() {
        let f = failing(&[("192.0.2.7", 13)]);
        let e = check(&f, &window(13, 43), &th(), &RULE).unwrap_err();
        assert_eq!(
            e,
            "13 failing flows from 1 client prefix (192.0.2.7: 13); a verdict needs 3 client \
             prefixes (min_sources): not ejected"
        );
        // Rotating through its /64 is one client still.
        let f = failing(&[("2001:db8::1", 5), ("2001:db8::2", 5), ("2001:db8::3", 5)]);
        let e = check(&f, &window(15, 40), &th(), &RULE).unwrap_err();
        assert!(
            e.contains("from 1 client prefix (2001:db8::/64: 15)"),
            "{e}"
        );
        // Nothing in the table (the failures closed before the walk).
        let e = check(&Failing::new(), &window(15, 40), &th(), &RULE).unwrap_err();
        assert!(
            e.contains("0 failing flows from 0 client prefixes (none"),
            "{e}"
        );
    }

    #[test]
    fn a_hung_backend_fails_for_many_clients() {
        let f = failing(&[
            ("192.0.2.1", 3),
            ("192.0.2.2", 2),
            ("192.0.2.3", 4),
            ("192.0.2.4", 1),
        ]);
        assert_eq!(
            check(&f, &window(10, 30), &th(), &RULE),
            Ok("from 4 client prefixes".to_owned())
        );
        // Many flows each: the cap takes as much from the judged as from
        // the failed, so a real hang still stands.
        let f = failing(&[("192.0.2.1", 40), ("192.0.2.2", 40), ("192.0.2.3", 40)]);
        assert_eq!(
            check(&f, &window(120, 150), &th(), &RULE),
            Ok("from 3 client prefixes".to_owned())
        );
    }

    /// One client with many failing flows and two others with one each:
    /// three sources, but past the cap the one client's flows do not
    /// count, and what is left is below the threshold.
    #[test]
    fn one_clients_flows_beyond_the_cap_do_not_count() {
        let f = failing(&[("192.0.2.7", 30), ("192.0.2.1", 1), ("192.0.2.2", 1)]);
        let e = check(&f, &window(32, 150), &th(), &RULE).unwrap_err();
        assert_eq!(
            e,
            "with at most 4 failing flows counted per client prefix, 6 of 124 failed, below \
             the verdict's bounds (20% of at least 10): not ejected"
        );
        // The same three prefixes within the cap: the verdict stands.
        let f = failing(&[("192.0.2.7", 4), ("192.0.2.1", 1), ("192.0.2.2", 1)]);
        assert!(check(&f, &window(32, 150), &th(), &RULE).is_ok());
    }

    /// A NAT flow of `client` to backend id 1 in `state`, last seen
    /// `age_ms` ago, a request pending for `pending_ms` (0: none).
    fn flow(client: &str, state: u8, age_ms: u64, pending_ms: u64) -> (FlowKey, NatFlow) {
        const NOW: u64 = 100_000_000_000;
        let ip: IpAddr = client.parse().unwrap();
        let mut key = FlowKey::default();
        match ip {
            IpAddr::V4(a) => {
                key.src[..4].copy_from_slice(&a.octets());
                key.family = lb_common::FAMILY_V4;
            }
            IpAddr::V6(a) => {
                key.src = a.octets();
                key.family = lb_common::FAMILY_V6;
            }
        }
        let f = NatFlow {
            backend_id: 1,
            generation: 7,
            state,
            last_seen_ns: NOW - age_ms * 1_000_000,
            request_ns: if pending_ms == 0 {
                0
            } else {
                NOW - pending_ms * 1_000_000
            },
            ..NatFlow::default()
        };
        (key, f)
    }

    #[test]
    fn a_walk_counts_overdue_requests_and_proven_connections_by_source() {
        const NOW: u64 = 100_000_000_000;
        let pool = NatPool {
            response_timeout_ns: 1_000_000_000,
            connect_timeout_ns: 1_000_000_000,
            ..NatPool::default()
        };
        let mut e = FlowEvidence::default();
        let flows = [
            flow("192.0.2.1", NAT_TCP_ESTABLISHED, 10, 1500),
            flow("192.0.2.1", NAT_TCP_ESTABLISHED, 10, 1000),
            // Pending, but not for long enough.
            flow("192.0.2.2", NAT_TCP_ESTABLISHED, 10, 900),
            // No SYN-ACK for 2 s, from a prefix with a handshake done…
            flow("192.0.2.2", NAT_TCP_SYN_SENT, 2000, 0),
            // … and from one without (a forged source, perhaps).
            flow("198.51.100.9", NAT_TCP_SYN_SENT, 2000, 0),
            // A UDP flow never answered proves nothing either.
            flow("198.51.100.10", NAT_UDP, 10, 1500),
            flow("2001:db8::1", NAT_TCP_ESTABLISHED, 10, 1200),
            flow("2001:db8::2", NAT_TCP_ESTABLISHED, 10, 1200),
        ];
        for (k, f) in &flows {
            e.add(k, f, &pool, NOW);
        }
        e.finish(&flows);
        let want = failing(&[("192.0.2.1", 2), ("192.0.2.2", 1), ("2001:db8::9", 2)]);
        assert_eq!(e.failing, HashMap::from([((1, 7), want)]));
        // Passive detection off for the VIP: nothing counted.
        let mut off = FlowEvidence::default();
        let (k, f) = flow("192.0.2.1", NAT_TCP_ESTABLISHED, 10, 1500);
        off.add(&k, &f, &NatPool::default(), NOW);
        off.finish(&[(k, f)]);
        assert!(off.failing.is_empty());
    }

    #[test]
    fn the_busiest_prefixes_are_named_first() {
        let f = failing(&[
            ("192.0.2.1", 1),
            ("192.0.2.2", 9),
            ("192.0.2.3", 4),
            ("192.0.2.4", 2),
        ]);
        assert_eq!(
            busiest(&f, 3),
            "192.0.2.2: 9, 192.0.2.3: 4, 192.0.2.4: 2, 1 more"
        );
    }
}
