//! Cutting the established flows of new deny entries: one walk of the
//! pinned conntrack (DSR VIPs) and one of the NAT flows (`nat_purge`),
//! matching each flow against every target through an index, off the
//! daemon's main loop (`guard::spawn_purge_as` runs it on a thread).

use std::collections::{HashMap, HashSet};

use lb_common::{CtEntry, FlowKey};

use crate::dataplane::batch::{batch_unsupported, lookup_batch};
use crate::guard::Prefix;

/// Deny prefixes whose flows a purge thread cuts: the prefix, the VIP id
/// it applies to (`None` = every VIP), and how the entry is named.
pub(super) type PurgeTargets = Vec<(Prefix, Option<u32>, String)>;

/// Purge targets by (family, prefix length, masked source, VIP id or
/// `None`): one walk of a million flows against thousands of targets (a
/// batch of automatic entries) costs a few lookups a flow, not one test a
/// target.
struct TargetIndex {
    /// The distinct (family, prefix length) of the targets.
    shapes: Vec<(u8, u8)>,
    by_key: HashMap<(u8, u8, lb_common::Addr, Option<u32>), usize>,
}

impl TargetIndex {
    fn new(targets: &PurgeTargets) -> Self {
        let mut shapes = Vec::new();
        let mut by_key = HashMap::new();
        for (i, (p, vip, _)) in targets.iter().enumerate() {
            let family = lb_common::family_of(p.addr);
            if !shapes.contains(&(family, p.len)) {
                shapes.push((family, p.len));
            }
            let addr = lb_common::addr16(p.addr);
            by_key.entry((family, p.len, addr, *vip)).or_insert(i);
        }
        TargetIndex { shapes, by_key }
    }

    /// The first target (in `targets` order) that flow `k` of VIP `vip_id`
    /// matches.
    fn find(&self, k: &FlowKey, vip_id: u32) -> Option<usize> {
        self.shapes
            .iter()
            .filter(|(family, _)| *family == k.family)
            .flat_map(|&(family, len)| {
                let masked = lb_common::mask_addr(&k.src, len);
                [Some(vip_id), None]
                    .map(|vip| self.by_key.get(&(family, len, masked, vip)).copied())
            })
            .flatten()
            .min()
    }
}

/// Cuts the flows of each target among those pinned in `dir`: conntrack's
/// (DSR VIPs) and the NAT flows' (`mode = "nat"` VIPs); the count cut per
/// target.
pub(super) fn purge(
    dir: &std::path::Path,
    targets: &PurgeTargets,
    limit: usize,
) -> Vec<Result<u64, String>> {
    let index = TargetIndex::new(targets);
    let ct = purge_conntrack(&dir.join(lb_common::MAP_CT), targets, &index, limit);
    let nat = super::nat_purge::purge(dir, targets.len(), |k, vip_id| index.find(k, vip_id));
    ct.into_iter()
        .zip(nat)
        .map(|(ct, nat)| Ok(ct? + nat?))
        .collect()
}

/// Walks the pinned conntrack at `pin` once (reading at most `limit`
/// entries; batch lookups, key by key on kernels without them) and removes
/// the entries of flows matching each target; the count cut per target.
fn purge_conntrack(
    pin: &std::path::Path,
    targets: &PurgeTargets,
    index: &TargetIndex,
    limit: usize,
) -> Vec<Result<u64, String>> {
    let fail = |e: String| targets.iter().map(|_| Err(e.clone())).collect();
    let data = match aya::maps::MapData::from_pin(pin) {
        Ok(m) => m,
        Err(e) => return fail(format!("opening {}: {e}", pin.display())),
    };
    let mut hit: Vec<Vec<FlowKey>> = vec![Vec::new(); targets.len()];
    let mut seen = HashSet::new();
    let mut read = 0usize;
    let mut visit = |k: &FlowKey, e: &CtEntry| {
        if let Some(i) = index.find(k, e.vip_id)
            && seen.insert(*k)
        {
            hit[i].push(*k);
        }
        read += 1;
        read < limit
    };
    let batched = lookup_batch(&data, &mut visit);
    let map = aya::maps::Map::LruHashMap(data);
    let Ok(mut ct) = aya::maps::HashMap::<_, FlowKey, CtEntry>::try_from(map) else {
        return fail(format!("{} is not the conntrack map", pin.display()));
    };
    match batched {
        Ok(()) => {}
        Err(e) if batch_unsupported(&e) => {
            for item in ct.iter() {
                let Ok((k, e)) = item else { break };
                if !visit(&k, &e) {
                    break;
                }
            }
        }
        Err(e) => return fail(format!("walking {}: {e}", pin.display())),
    }
    hit.iter()
        .map(|keys| {
            // An entry the LRU evicted meanwhile is as good as cut.
            keys.iter().for_each(|k| {
                let _ = ct.remove(k);
            });
            Ok(keys.len() as u64)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    /// Whether flow `k` (of VIP `e.vip_id`) comes from `prefix` and goes to
    /// `vip` (`None` = any VIP).
    fn flow_matches(k: &FlowKey, e: &CtEntry, prefix: &Prefix, vip: Option<u32>) -> bool {
        k.family == lb_common::family_of(prefix.addr)
            && lb_common::mask_addr(&k.src, prefix.len) == lb_common::addr16(prefix.addr)
            && vip.is_none_or(|id| e.vip_id == id)
    }

    #[test]
    fn the_target_index_finds_what_a_scan_finds() {
        let p = |s: &str| s.parse::<Prefix>().unwrap();
        let targets: PurgeTargets = [
            (p("192.0.2.0/24"), Some(3)),
            (p("192.0.2.7"), None),
            (p("198.51.100.7"), Some(4)),
            (p("2001:db8:1:2::/64"), None),
            (p("0.0.0.0/0"), Some(9)),
        ]
        .into_iter()
        .map(|(p, v)| (p, v, String::new()))
        .collect();
        let index = TargetIndex::new(&targets);
        for src in [
            "192.0.2.7",
            "192.0.2.8",
            "198.51.100.7",
            "2001:db8:1:2::9",
            "::1",
            "10.0.0.1",
        ] {
            let a: IpAddr = src.parse().unwrap();
            let k = FlowKey {
                src: lb_common::addr16(a),
                family: lb_common::family_of(a),
                ..FlowKey::default()
            };
            for vip_id in [3, 4, 9, 10] {
                let e = CtEntry {
                    vip_id,
                    ..CtEntry::default()
                };
                let scan = targets
                    .iter()
                    .position(|(p, vip, _)| flow_matches(&k, &e, p, *vip));
                assert_eq!(index.find(&k, e.vip_id), scan, "{src} at VIP {vip_id}");
            }
        }
    }

    #[test]
    fn flows_match_by_prefix_family_and_vip() {
        let key = |src: &str| {
            let a: IpAddr = src.parse().unwrap();
            FlowKey {
                src: lb_common::addr16(a),
                family: lb_common::family_of(a),
                ..FlowKey::default()
            }
        };
        let e = CtEntry {
            vip_id: 3,
            ..CtEntry::default()
        };
        let p = |s: &str| s.parse::<Prefix>().unwrap();
        assert!(flow_matches(
            &key("192.0.2.7"),
            &e,
            &p("192.0.2.0/24"),
            None
        ));
        assert!(flow_matches(
            &key("192.0.2.7"),
            &e,
            &p("192.0.2.7"),
            Some(3)
        ));
        assert!(!flow_matches(
            &key("192.0.2.7"),
            &e,
            &p("192.0.2.7"),
            Some(4)
        ));
        assert!(!flow_matches(
            &key("192.0.3.7"),
            &e,
            &p("192.0.2.0/24"),
            None
        ));
        assert!(flow_matches(
            &key("2001:db8:1:2::9"),
            &e,
            &p("2001:db8:1:2::/64"),
            None
        ));
        assert!(!flow_matches(
            &key("2001:db8:1:3::9"),
            &e,
            &p("2001:db8:1:2::/64"),
            None
        ));
        // 0.0.0.0/0 is every IPv4 source, no IPv6 one.
        assert!(!flow_matches(&key("::1"), &e, &p("0.0.0.0/0"), None));
    }
}
