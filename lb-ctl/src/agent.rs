//! A backend's agent (`agent_port`) as `xlb status` shows it.

use serde::{Deserialize, Serialize};

/// What a backend's agent says. Every text in it is the agent's, escaped
/// by the daemon (control characters as `\n`, `\u{1b}`, bytes that are not
/// UTF-8 as `\xNN`): safe to print.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentStatus {
    /// What it asked for last: `normal` (nothing, or `up`/`ready`),
    /// `drain`, `maint` or `down`. It stands until the agent says otherwise.
    pub state: String,
    /// The word that set `state` (`up`, `ready`, `down`, `fail`,
    /// `stopped`, `drain`, `maint`); `null` before one.
    pub word: Option<String>,
    /// Its text after `#`, e.g. the reason of a drain.
    pub text: Option<String>,
    /// Weight as a percentage of the configured one (100 unless told).
    pub weight_percent: u32,
    /// The last line understood.
    pub line: Option<String>,
    /// Words of it that were not understood (ignored).
    pub ignored: Vec<String>,
    /// Why the last poll failed, e.g. `unreachable (connection refused)`;
    /// `null` if it answered. A failed poll changes nothing.
    pub error: Option<String>,
    /// Stable identifier of `error`, e.g. `agent_refused`.
    pub error_code: Option<String>,
    /// When it last answered, ms since the Unix epoch; `null` before.
    pub answered_unix_ms: Option<u64>,
    /// Polls since the backend was added, and how many failed.
    pub polls: u64,
    pub errors: u64,
}

impl AgentStatus {
    /// What `xlb status` adds to a backend's notes (its words are in the
    /// placement's reason): a weight it set, the error of its last poll.
    pub fn note(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.weight_percent != 100 {
            parts.push(format!("agent weight {}%", self.weight_percent));
        }
        if let Some(e) = &self.error {
            parts.push(format!("agent: {e}"));
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}
