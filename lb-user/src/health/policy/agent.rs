//! What the agent (`agent_port`, `health::agent`) says, in the VIP policy:
//! its placements, its weight, and the text of its return.
//!
//! The agent speaks for the application, so its word goes through the same
//! protections as a failing probe: its exits count toward flap damping,
//! slow start ramps a backend it lets back in, and panic puts its
//! backends back only after every other kind of failure (they said so
//! themselves, but an agent rollout that says `down` everywhere must not
//! empty a VIP).

use super::{Member, Placement};
use crate::health::agent::{AgentCondition, AgentStatus};

/// The placement the agent asks for, and why; `None` when it asks for
/// nothing (no agent, `up`/`ready`, a weight above 0 %).
pub(super) fn placement(m: &Member) -> Option<(Placement, String)> {
    let a = m.agent.as_ref()?;
    let p = match a.condition {
        AgentCondition::Down => Placement::AgentDown,
        AgentCondition::Maint => Placement::AgentMaint,
        AgentCondition::Drain => Placement::AgentDrain,
        AgentCondition::Normal if a.weight_percent == 0 => {
            return Some((Placement::AgentDrain, "agent set weight 0%".to_owned()));
        }
        AgentCondition::Normal => return None,
    };
    Some((p, a.says()))
}

/// The agent's weight percentage (100 without an agent).
pub(super) fn percent(agent: Option<&AgentStatus>) -> u32 {
    agent.map_or(100, |a| a.weight_percent)
}

/// `table_weight` (configured weight × ramp step) scaled by the agent's
/// `percent`, rounded; at least 1 when both are above 0, so that a backend
/// at 1 % still holds a slot.
pub(super) fn scale(table_weight: u32, percent: u32) -> u32 {
    if percent == 100 || table_weight == 0 {
        return table_weight;
    }
    if percent == 0 {
        return 0;
    }
    let w = (u64::from(table_weight) * u64::from(percent) + 50) / 100;
    u32::try_from(w.max(1)).unwrap_or(u32::MAX)
}

/// Whether `p` is one of the agent's placements.
pub(super) fn is_agent(p: Placement) -> bool {
    matches!(
        p,
        Placement::AgentDown | Placement::AgentDrain | Placement::AgentMaint
    )
}

/// Why a member the agent held out is back: its new words.
pub(super) fn return_text(m: &Member) -> String {
    m.agent
        .as_ref()
        .map_or_else(|| "agent check removed".to_owned(), AgentStatus::says)
}
