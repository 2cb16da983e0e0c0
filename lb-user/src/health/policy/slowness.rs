//! Slowness, judged against the VIP: a backend much slower than its peers
//! is an outlier and ejected (within `max_ejected`); a VIP slow as a whole
//! is reported, not emptied, since slowness shared by every backend is
//! load, not failure.

use std::time::Duration;

use super::{Change, Member, MemberState, Placement, Policy, VipState};
use crate::health::probe::Compact;

/// Ejects slow outliers among the members placed `Serving`, within
/// `max_ejected` less the `used` places of passive ejections: those
/// already ejected and still slow keep their place in the budget, then the
/// slowest new ones.
pub(super) fn eject_outliers(
    policy: &Policy,
    members: &[Member],
    states: &[MemberState],
    next: &mut [(Placement, Option<String>)],
    used: usize,
) {
    let serving: Vec<usize> = (0..members.len())
        .filter(|&i| next[i].0 == Placement::Serving)
        .collect();
    let eligible = members.iter().filter(|m| m.eligible()).count();
    let budget = policy.max_ejected.max_of(eligible).saturating_sub(used);
    let mut outliers: Vec<(bool, Duration, usize, String)> = Vec::new();
    for &i in &serving {
        let m = &members[i];
        let was_ejected = states[i].placement == Placement::EjectedSlow;
        // An ejected backend returns only after `rise` answers within timeout.
        let recovered = m.consecutive_slow == 0 && m.consecutive_ok >= m.rise;
        if was_ejected && !recovered {
            let reason = states[i].reason.clone().unwrap_or_default();
            outliers.push((true, m.latency.unwrap_or_default(), i, reason));
            continue;
        }
        // Failing only through the data path: its "latency" is how long
        // the data-path handshake waited, not how slow the backend is
        // (`policy::path` and `fall` deal with it).
        if !m.slow() || m.via_vip_only {
            continue;
        }
        let Some(lat) = m.latency else { continue };
        let peers: Vec<Duration> = serving
            .iter()
            .filter(|&&j| j != i && !members[j].via_vip_only)
            .filter_map(|&j| members[j].latency)
            .collect();
        let Some(med) = crate::health::median(peers.iter().copied()) else {
            continue;
        };
        let outlier = lat.as_secs_f64() > policy.outlier_factor * med.as_secs_f64()
            && lat > med + policy.outlier_margin;
        if outlier {
            // A backend that never answered in its streak has no answer
            // time to show, only the wait.
            let seen = if m.answered {
                format!("answers in {}", Compact(lat))
            } else {
                format!("no answer within {}", Compact(lat))
            };
            let reason = format!(
                "slow outlier: {seen} against a median of {} for its {} peer{} \
                 (more than {}× and {} slower)",
                Compact(med),
                peers.len(),
                if peers.len() == 1 { "" } else { "s" },
                policy.outlier_factor,
                Compact(policy.outlier_margin),
            );
            outliers.push((false, lat, i, reason));
        }
    }
    // Already ejected first, then slowest first.
    outliers.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    for (_, _, i, reason) in outliers.into_iter().take(budget) {
        next[i] = (Placement::EjectedSlow, Some(reason));
    }
}

/// Reports a VIP whose backends are slow as a whole (and not ejected for it).
pub(super) fn fleet_slow(
    members: &[Member],
    next: &[(Placement, Option<String>)],
    vip: &mut VipState,
    changes: &mut Vec<Change>,
) {
    let up: Vec<usize> = (0..members.len())
        .filter(|&i| matches!(next[i].0, Placement::Serving | Placement::EjectedSlow))
        .collect();
    let slow: Vec<Duration> = up
        .iter()
        .filter(|&&i| {
            members[i].slow() && !members[i].via_vip_only && next[i].0 == Placement::Serving
        })
        .filter_map(|&i| members[i].latency)
        .collect();
    let now_slow = !slow.is_empty() && slow.len() * 2 >= up.len();
    let n = slow.len();
    match (now_slow, vip.fleet_slow.is_some()) {
        (true, false) => {
            let med = crate::health::median(slow.iter().copied()).unwrap_or_default();
            let text = fleet_slow_text(n, up.len(), med);
            vip.fleet_slow = Some(text.clone());
            changes.push(Change::FleetSlow(text));
        }
        (true, true) => {
            // Same episode, no new event; the status text follows the count.
            let med = crate::health::median(slow.iter().copied()).unwrap_or_default();
            vip.fleet_slow = Some(fleet_slow_text(n, up.len(), med));
        }
        (false, true) => {
            vip.fleet_slow = None;
            changes.push(Change::FleetRecovered(
                "backends answer within timeout again".to_owned(),
            ));
        }
        (false, false) => {}
    }
}

fn fleet_slow_text(slow: usize, up: usize, median: Duration) -> String {
    let who = if slow == up {
        format!("all {slow} backends")
    } else {
        format!("{slow} of {up} backends")
    };
    format!(
        "{who} slow, median {}; not ejecting (slowness shared by the VIP is load, not failure)",
        Compact(median)
    )
}
