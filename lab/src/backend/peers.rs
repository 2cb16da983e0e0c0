//! Service connections accepted per peer address, for the abuse tests: how
//! many connections a flooding source got through the load balancer is
//! what its backends accepted from it. `GET /peers` on the admin listener
//! returns the counts since the backend started; a test reads them before
//! and after a flood and takes the difference ([`PeerCounts::since`]).

use std::{collections::BTreeMap, net::IpAddr};

use serde::{Deserialize, Serialize};

/// Distinct peer addresses counted one by one; connections from further
/// addresses only add to [`PeerCounts::others`]. The lab's clients have a
/// few dozen addresses; this keeps a backend's memory bounded whatever
/// reaches it.
pub const MAX_PEERS: usize = 4096;

/// `GET /peers`: connections accepted per peer address since the backend
/// started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerCounts {
    pub name: String,
    pub peers: BTreeMap<IpAddr, u64>,
    /// Connections from addresses beyond the first [`MAX_PEERS`].
    pub others: u64,
}

impl PeerCounts {
    pub(super) fn count(&mut self, peer: IpAddr) {
        let peer = canonical(peer);
        if let Some(n) = self.peers.get_mut(&peer) {
            *n += 1;
        } else if self.peers.len() < MAX_PEERS {
            self.peers.insert(peer, 1);
        } else {
            self.others += 1;
        }
    }

    /// Connections accepted from addresses inside `net/len` (an IPv4 net
    /// counts IPv4 peers only, an IPv6 net IPv6 peers only).
    pub fn from_prefix(&self, net: IpAddr, len: u8) -> u64 {
        self.peers
            .iter()
            .filter(|(a, _)| in_prefix(**a, net, len))
            .map(|(_, n)| n)
            .sum()
    }

    /// The counts accepted after `earlier` (an earlier read of the same
    /// backend), addresses with none left out.
    pub fn since(&self, earlier: &PeerCounts) -> PeerCounts {
        let peers = self
            .peers
            .iter()
            .map(|(a, n)| (*a, n - earlier.peers.get(a).copied().unwrap_or(0).min(*n)))
            .filter(|(_, n)| *n > 0)
            .collect();
        PeerCounts {
            name: self.name.clone(),
            peers,
            others: self.others.saturating_sub(earlier.others),
        }
    }
}

/// An IPv4 peer on a dual-stack socket shows as `::ffff:a.b.c.d`; the
/// lab's listeners are v6-only, but count it as IPv4 anyway.
fn canonical(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        v4 => v4,
    }
}

/// True if `a` is inside `net/len` (same family).
pub fn in_prefix(a: IpAddr, net: IpAddr, len: u8) -> bool {
    match (a, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(len.min(32)))
                .unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(len.min(128)))
                .unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Sums the counts of several backends (per address).
pub fn total<'a>(counts: impl IntoIterator<Item = &'a PeerCounts>) -> PeerCounts {
    let mut sum = PeerCounts {
        name: "total".to_string(),
        ..PeerCounts::default()
    };
    for c in counts {
        for (a, n) in &c.peers {
            *sum.peers.entry(*a).or_default() += n;
        }
        sum.others += c.others;
    }
    sum
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    fn v4(d: u8) -> IpAddr {
        Ipv4Addr::new(10, 99, 0, d).into()
    }

    fn v6(s: &str) -> IpAddr {
        s.parse::<Ipv6Addr>().unwrap().into()
    }

    #[test]
    fn prefixes_match_by_family_and_length() {
        let cases = [
            ("same /32", v4(9), v4(9), 32, true),
            ("other /32", v4(10), v4(9), 32, false),
            ("inside /24", v4(10), v4(0), 24, true),
            ("/0 takes every v4", v4(10), v4(1), 0, true),
            (
                "inside /64",
                v6("fd00:99:0:1::40"),
                v6("fd00:99:0:1::"),
                64,
                true,
            ),
            (
                "next /64",
                v6("fd00:99::10"),
                v6("fd00:99:0:1::"),
                64,
                false,
            ),
            ("/128", v6("fd00:99::9"), v6("fd00:99::9"), 128, true),
            ("v4 against a v6 net", v4(9), v6("::"), 0, false),
        ];
        for (name, a, net, len, want) in cases {
            assert_eq!(in_prefix(a, net, len), want, "{name}");
        }
    }

    #[test]
    fn counts_differences_and_sums() {
        let mut c = PeerCounts {
            name: "b1".into(),
            ..PeerCounts::default()
        };
        c.count(v4(10));
        c.count(v6("::ffff:10.99.0.9"));
        let before = c.clone();
        for i in 1..=3u16 {
            c.count(IpAddr::V6(Ipv6Addr::new(0xfd00, 0x99, 0, 1, 0, 0, 0, i)));
        }
        c.count(v4(9));
        assert_eq!(c.peers.get(&v4(9)), Some(&2), "a mapped v4 counts as v4");
        let d = c.since(&before);
        assert_eq!(d.from_prefix(v4(9), 32), 1);
        assert_eq!(d.from_prefix(v4(10), 32), 0);
        assert_eq!(d.from_prefix(v6("fd00:99:0:1::"), 64), 3);
        assert!(!d.peers.contains_key(&v4(10)), "no new connection");
        let sum = total([&d, &d]);
        assert_eq!(sum.from_prefix(v6("fd00:99:0:1::"), 64), 6);
    }

    #[test]
    fn addresses_past_the_bound_go_to_others() {
        let mut c = PeerCounts::default();
        for i in 0..(MAX_PEERS as u32 + 5) {
            c.count(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)));
        }
        c.count(IpAddr::V4(Ipv4Addr::from(0x0a00_0000)));
        assert_eq!(c.peers.len(), MAX_PEERS);
        assert_eq!(c.others, 5);
        assert_eq!(c.peers.values().sum::<u64>(), MAX_PEERS as u64 + 1);
    }
}
