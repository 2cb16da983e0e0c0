//! Cutting the NAT flows of blocked sources (issue 38): a deny entry's
//! purge walks `XLB_NAT_FLOWS` as it walks conntrack, and removes every
//! flow whose client matches: its reply key first (if it still names the
//! flow), then the flow. The client's next packet then finds no flow: a
//! TCP segment without SYN is dropped (`drop_nat_no_flow`), a SYN or a UDP
//! datagram is judged by the deny list and refused.

use std::path::Path;

use lb_common::FlowKey;
use lb_common::nat::{MAP_NAT_FLOWS, NatFlow};

use super::nat_sweep::Maps;
use crate::dataplane::batch::{batch_unsupported, lookup_batch};

/// Removes the NAT flows pinned in `dir` whose client key and VIP id
/// `target` maps to a target index (below `targets`); the count cut per
/// target. No NAT map pinned (no NAT VIP ever ran): nothing to cut.
pub(super) fn purge(
    dir: &Path,
    targets: usize,
    target: impl Fn(&FlowKey, u32) -> Option<usize>,
) -> Vec<Result<u64, String>> {
    let fail = |e: String| (0..targets).map(|_| Err(e.clone())).collect();
    if !dir.join(MAP_NAT_FLOWS).exists() {
        return (0..targets).map(|_| Ok(0)).collect();
    }
    let mut maps = match Maps::open(dir) {
        Ok(m) => m,
        Err(e) => return fail(format!("opening the NAT maps in {}: {e:#}", dir.display())),
    };
    let mut hit: Vec<Vec<(FlowKey, NatFlow)>> = vec![Vec::new(); targets];
    let mut visit = |k: &FlowKey, f: &NatFlow| {
        if let Some(i) = target(k, f.vip_id)
            && i < targets
        {
            hit[i].push((*k, *f));
        }
        true
    };
    match lookup_batch(&maps.flows_raw, &mut visit) {
        Ok(()) => {}
        Err(e) if batch_unsupported(&e) => {
            for item in maps.flows.iter() {
                let Ok((k, f)) = item else { break };
                visit(&k, &f);
            }
        }
        Err(e) => return fail(format!("walking {MAP_NAT_FLOWS}: {e}")),
    }
    hit.iter()
        .map(|cut| {
            for (k, f) in cut {
                // A flow the data plane ended meanwhile is as good as cut.
                maps.remove(k, f)
                    .map_err(|e| format!("cutting a NAT flow: {e:#}"))?;
            }
            Ok(cut.len() as u64)
        })
        .collect()
}
