//! Cutting the NAT flows of blocked sources (issue 38): a deny entry's
//! purge walks `XLB_NAT_FLOWS` as it walks conntrack, and removes every
//! flow whose client matches: its reply key first (if it still names the
//! flow), then the flow. The client's next packet then finds no flow: a
//! TCP segment without SYN is dropped (`drop_nat_no_flow`), a SYN or a UDP
//! datagram is judged by the deny list and refused.

use std::path::Path;

use aya::maps::{Array, HashMap as BpfHash, Map, MapData};
use lb_common::nat::{MAP_NAT_FLOWS, MAP_NAT_REPLY, NatFlow, reply_key};
use lb_common::{BackendInfo, FlowKey};

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
    let flows_pin = dir.join(MAP_NAT_FLOWS);
    if !flows_pin.exists() {
        return (0..targets).map(|_| Ok(0)).collect();
    }
    let open = |name: &str| {
        MapData::from_pin(dir.join(name))
            .map_err(|e| format!("opening {name} in {}: {e}", dir.display()))
    };
    let maps = (|| {
        let raw = open(MAP_NAT_FLOWS)?;
        let flows: BpfHash<MapData, FlowKey, NatFlow> = Map::HashMap(open(MAP_NAT_FLOWS)?)
            .try_into()
            .map_err(|e| format!("{MAP_NAT_FLOWS}: {e}"))?;
        let reply: BpfHash<MapData, FlowKey, FlowKey> = Map::HashMap(open(MAP_NAT_REPLY)?)
            .try_into()
            .map_err(|e| format!("{MAP_NAT_REPLY}: {e}"))?;
        let backends: Array<MapData, BackendInfo> = Map::Array(open(lb_common::MAP_BACKENDS)?)
            .try_into()
            .map_err(|e| format!("{}: {e}", lb_common::MAP_BACKENDS))?;
        Ok::<_, String>((raw, flows, reply, backends))
    })();
    let (raw, mut flows, mut reply, backends) = match maps {
        Ok(m) => m,
        Err(e) => return fail(e),
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
    match lookup_batch(&raw, &mut visit) {
        Ok(()) => {}
        Err(e) if batch_unsupported(&e) => {
            for item in flows.iter() {
                let Ok((k, f)) = item else { break };
                visit(&k, &f);
            }
        }
        Err(e) => return fail(format!("walking {MAP_NAT_FLOWS}: {e}")),
    }
    hit.iter()
        .map(|cut| {
            for (k, f) in cut {
                if let Ok(be) = backends.get(&f.backend_id, 0)
                    && be.generation == f.generation
                {
                    let rk = reply_key(k, f, &be.addr);
                    if reply.get(&rk, 0).ok() == Some(*k) {
                        let _ = reply.remove(&rk);
                    }
                }
                // A flow the data plane ended meanwhile is as good as cut.
                let _ = flows.remove(k);
            }
            Ok(cut.len() as u64)
        })
        .collect()
}
