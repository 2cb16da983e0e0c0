//! Panic (`min_healthy`, Envoy's panic threshold): when fewer backends than
//! that would be left in the table, the least-bad ones are put back.

use std::collections::BTreeMap;

use super::{Change, Member, MemberState, Placement, Policy, TIMEOUT_CODES, VipState};
use crate::health::machine::HealthState;

/// Puts the least-bad backends back while fewer than `min_healthy` are in.
pub(super) fn panic(
    policy: &Policy,
    members: &[Member],
    states: &[MemberState],
    next: &mut [(Placement, Option<String>)],
    vip: &mut VipState,
    changes: &mut Vec<Change>,
) {
    let eligible = members.iter().filter(|m| m.eligible()).count();
    // Never more than there are: min_healthy 2 of a VIP with one probed
    // backend must not mean panic for ever (nor 1 of none at start).
    let min = policy.min_healthy.min_of(eligible).min(eligible);
    let healthy = (0..members.len())
        .filter(|&i| next[i].0.in_table() && members[i].weight > 0)
        .count();
    if min == 0 || healthy >= min {
        if vip.panic.take().is_some() {
            changes.push(Change::PanicExit(format!(
                "{healthy} of {eligible} backends healthy (min_healthy {})",
                policy.min_healthy
            )));
        }
        return;
    }
    let mut kept = Vec::new();
    let mut agent_kept = false;
    for i in panic_candidates(members, states, next)
        .into_iter()
        .take(min - healthy)
    {
        agent_kept |= super::agent::is_agent(next[i].0);
        let why = next[i].1.clone().unwrap_or_default();
        kept.push(format!("{} ({why})", members[i].name));
        next[i] = (
            Placement::PanicRestored,
            Some(format!(
                "panic: kept in the table although {why}; fewer than min_healthy {} backends healthy",
                policy.min_healthy
            )),
        );
    }
    let mut text = panic_text(policy, healthy, members, next, &kept);
    if agent_kept {
        text.push_str("; agents that take every backend out are overruled");
    }
    if vip.panic.as_deref() != Some(text.as_str()) {
        if vip.panic.is_none() {
            changes.push(Change::PanicEnter(text.clone()));
        }
        vip.panic = Some(text);
    }
}

/// The members panic may put back, least bad first: slow outliers (fastest
/// first), then flapping ones that pass probes, then those failing only by
/// timeouts (fewest failures first), then those their agent drains, then
/// those their agent says are down. Within a class, the ones panic already
/// keeps come first, so panic does not swap backends back and forth as
/// failure counts move.
fn panic_candidates(
    members: &[Member],
    states: &[MemberState],
    next: &[(Placement, Option<String>)],
) -> Vec<usize> {
    let mut candidates: Vec<(u8, bool, u128, usize)> = Vec::new();
    for (i, m) in members.iter().enumerate() {
        if m.weight == 0 || m.admin_drained {
            continue;
        }
        let kept = states[i].placement != Placement::PanicRestored;
        let timeouts_only = m
            .last_fail
            .as_ref()
            .is_some_and(|(code, _)| TIMEOUT_CODES.contains(code));
        match next[i].0 {
            // Out on passive evidence alone: its probes pass.
            Placement::Down if m.passive.is_some() && m.health == HealthState::Up => {
                candidates.push((2, kept, 0, i));
            }
            Placement::EjectedSlow => {
                candidates.push((0, kept, m.latency.unwrap_or_default().as_nanos(), i));
            }
            Placement::HeldDown => candidates.push((1, kept, 0, i)),
            Placement::Down if timeouts_only => {
                candidates.push((2, kept, u128::from(m.consecutive_fail), i));
            }
            // Last: the application itself asked out; but an agent saying
            // `down` (or `drain`) on every backend must not empty the VIP.
            Placement::AgentDrain | Placement::AgentMaint => candidates.push((3, kept, 0, i)),
            Placement::AgentDown => candidates.push((4, kept, 0, i)),
            _ => {}
        }
    }
    candidates.sort();
    candidates.into_iter().map(|(_, _, _, i)| i).collect()
}

/// What panic says: how many of the VIP's backends are healthy (those not
/// probed yet counted apart), whom it keeps (`kept`), and otherwise why
/// none can come back, by the failures the others really have.
fn panic_text(
    policy: &Policy,
    healthy: usize,
    members: &[Member],
    next: &[(Placement, Option<String>)],
    kept: &[String],
) -> String {
    let candidates = || members.iter().filter(|m| m.weight > 0 && !m.admin_drained);
    let total = candidates().count();
    let unprobed = candidates()
        .filter(|m| m.health == HealthState::Unknown)
        .count();
    let counts = if unprobed == 0 {
        format!(
            "{healthy} of {total} backends healthy (min_healthy {})",
            policy.min_healthy
        )
    } else {
        format!(
            "{healthy} of {total} backends healthy (min_healthy {}; {unprobed} not probed yet)",
            policy.min_healthy
        )
    };
    if !kept.is_empty() {
        return format!(
            "{counts}; keeping {} in the table (timeouts and slowness may be overload)",
            kept.join(", ")
        );
    }
    let mut causes: BTreeMap<&str, usize> = BTreeMap::new();
    for (m, (placement, _)) in members.iter().zip(next) {
        if m.weight > 0 && !m.admin_drained && *placement == Placement::Down {
            let code = m.last_fail.as_ref().map_or("failed", |(code, _)| *code);
            *causes.entry(code).or_default() += 1;
        }
    }
    let causes: Vec<String> = causes
        .into_iter()
        .map(|(code, n)| format!("{n} {code}"))
        .collect();
    let why = if causes.is_empty() {
        String::new()
    } else {
        format!(
            ": {} (only timeouts and slowness may be overload)",
            causes.join(", ")
        )
    };
    format!(
        "{counts}; none can be put back{why}{}",
        if healthy == 0 {
            "; the table is empty"
        } else {
            ""
        }
    )
}
