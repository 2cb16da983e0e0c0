//! Data-path failures shared by most of a VIP: this host's fault, not the
//! backends' (issue 24). A data-path probe that fails while the direct
//! probe of the same backend passes (`no_answer_via_vip`) points at the
//! path: one backend's decapsulator, its VIP on `lo`, or the load
//! balancer's own side of it (its route to the VIP out of the XDP
//! interface, `xlb_hc`, `rp_filter`). For one backend it is that backend's;
//! for most of a VIP's backends at once it is the one thing they share, the
//! LB host, and taking them out would empty the VIP for the LB's own fault.
//! So while it lasts, such backends keep the state their direct probes
//! give (in the table), and the VIP reports it (an `alarm`).

use super::{Change, Member, Placement, VipState};

/// Fewest backends failing through the data path only before it is taken
/// for the LB's fault: one backend alone cannot tell its own path from the
/// LB's, and is taken out as before.
const MIN_SHARED: usize = 2;

/// Puts back the backends out only for data-path failures while more than
/// half of the VIP fails that way, or while some of them are recovering
/// from such an episode (so the last ones to pass `rise` do not drop out
/// for a moment when it ends).
pub(super) fn shared_path_failure(
    members: &[Member],
    next: &mut [(Placement, Option<String>)],
    vip: &mut VipState,
    changes: &mut Vec<Change>,
) {
    let total = members
        .iter()
        .filter(|m| m.weight > 0 && !m.admin_drained)
        .count();
    let path_only: Vec<usize> = (0..members.len())
        .filter(|&i| members[i].weight > 0 && !members[i].admin_drained)
        .filter(|&i| members[i].via_vip_only)
        .collect();
    let shared = path_only.len() >= MIN_SHARED && path_only.len() * 2 > total;
    let recovering = path_only.iter().any(|&i| members[i].consecutive_fail == 0);
    let on = match vip.path_fault {
        None => shared,
        Some(_) => shared || recovering,
    };
    match (on, vip.path_fault.is_some()) {
        (true, false) => {
            let text = path_fault_text(path_only.len(), total);
            vip.path_fault = Some(text.clone());
            changes.push(Change::PathFault(text));
        }
        (false, true) => {
            vip.path_fault = None;
            changes.push(Change::PathRecovered(format!(
                "data-path probes pass again for most backends ({} of {total} still fail only \
                 through the data path)",
                path_only.len()
            )));
        }
        _ => {}
    }
    if !on {
        return;
    }
    // Out for failing, or ejected as slow by the data-path wait before the
    // episode was recognised: back as their direct probes say.
    for &i in &path_only {
        if matches!(next[i].0, Placement::Down | Placement::EjectedSlow) {
            next[i] = (Placement::Serving, None);
        }
    }
}

fn path_fault_text(failing: usize, total: usize) -> String {
    format!(
        "data-path probes fail for {failing} of {total} backends while their direct probes \
         pass: the fault is on the load balancer's side of the path, not the backends'; they \
         stay in the table as their direct probes say. Check this host's route to the VIP out \
         of the XDP interface (`ip route get VIP oif IFACE` must show `via`), that `xlb_hc` is \
         attached (`XLB_HC_STATS`), and rp_filter for replies from the VIP"
    )
}
