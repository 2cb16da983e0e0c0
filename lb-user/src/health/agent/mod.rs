//! The agent check (`agent_port`): HAProxy's `agent-check` text protocol.
//! The application on a backend says, in one line on a small TCP port of
//! its own, whether it wants traffic: `up`, `down`, `drain`, `maint`, or a
//! weight percentage. The main probe still decides whether the backend is
//! healthy; the agent only adds what the application knows and the probe
//! cannot see (a deploy about to start, a full disk, load). Its effects go
//! through the VIP policy like every other exit (`policy::agent`).
//!
//! The agent is polled straight at the backend's address (never through
//! the data path): it is a management port, not the service clients use.
//! An agent that cannot be reached or answers garbage changes nothing
//! (HAProxy likewise): its last words stand, and the error is shown.
//!
//! This module: the parser (pure) and what the scheduler keeps of the
//! agent's answers; `poll` does the I/O.

use std::fmt;
use std::time::{Duration, Instant};

pub mod poll;

/// Longest line read from an agent: HAProxy's answers are a few words; a
/// longer one is refused (`agent_line_too_long`) rather than buffered.
pub const MAX_LINE: usize = 256;

/// Highest weight percentage an agent may set: HAProxy's own cap (a
/// server's weight cannot exceed 256). Above is capped, with a note.
pub const MAX_WEIGHT_PERCENT: u32 = 256;

/// Longest `agent_send`, in bytes: a request line, not a payload.
pub const MAX_SEND: usize = 256;

/// How a backend's agent is polled (`agent_*` in a health_check table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentCheck {
    /// The agent's TCP port on the backend's address.
    pub port: u16,
    /// Period between polls (jittered with the check's `jitter`).
    pub interval: Duration,
    /// Deadline for connect, send and the whole line.
    pub timeout: Duration,
    /// Bytes sent before reading (`agent_send`, escapes resolved); empty =
    /// send nothing.
    pub send: Vec<u8>,
}

/// A state word of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AgentWord {
    Up,
    Ready,
    Down,
    Fail,
    Stopped,
    Drain,
    Maint,
}

impl AgentWord {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Ready => "ready",
            Self::Down => "down",
            Self::Fail => "fail",
            Self::Stopped => "stopped",
            Self::Drain => "drain",
            Self::Maint => "maint",
        }
    }

    fn parse(word: &str) -> Option<Self> {
        Some(match word.to_ascii_lowercase().as_str() {
            "up" => Self::Up,
            "ready" => Self::Ready,
            "down" => Self::Down,
            "fail" => Self::Fail,
            "stopped" => Self::Stopped,
            "drain" => Self::Drain,
            "maint" => Self::Maint,
            _ => return None,
        })
    }

    /// What the word asks for.
    pub fn condition(self) -> AgentCondition {
        match self {
            Self::Up | Self::Ready => AgentCondition::Normal,
            Self::Down | Self::Fail | Self::Stopped => AgentCondition::Down,
            Self::Drain => AgentCondition::Drain,
            Self::Maint => AgentCondition::Maint,
        }
    }
}

/// What the agent last asked for; it stands until the agent says
/// otherwise (`up`/`ready` undo the others), as in HAProxy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AgentCondition {
    /// Nothing asked (or `up`/`ready`): the main probe decides.
    #[default]
    Normal,
    /// `drain`: no new flows, established ones continue.
    Drain,
    /// `maint`: as `drain`, under its own name.
    Maint,
    /// `down`, `fail`, `stopped`: out.
    Down,
}

impl AgentCondition {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Drain => "drain",
            Self::Maint => "maint",
            Self::Down => "down",
        }
    }
}

/// One line from an agent, understood.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentReply {
    /// The state word that decides, if any: of several in one line, the
    /// most severe (`down` over `maint` over `drain` over `up`), so that a
    /// line like `up drain` never lets new flows in.
    pub word: Option<AgentWord>,
    /// `NN%`, capped at [`MAX_WEIGHT_PERCENT`].
    pub weight_percent: Option<u32>,
    /// The text after `#`, escaped ([`escape`]), trimmed; `None` if empty.
    pub text: Option<String>,
    /// Words not understood, escaped: ignored, as HAProxy ignores them, but
    /// shown.
    pub ignored: Vec<String>,
    /// The whole line, escaped: what status and events show.
    pub line: String,
}

/// Why an agent's answer could not be used. Never a verdict on the
/// backend's health: the last words stand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentError {
    /// RST to our SYN: nothing listens on `agent_port`.
    Refused,
    /// No connection within `agent_timeout`.
    ConnectTimeout { timeout: Duration },
    /// Connected, no complete line within `agent_timeout`.
    NoAnswer { timeout: Duration },
    /// The agent reset the connection.
    Reset,
    /// Closed without sending anything.
    Empty,
    /// No newline within [`MAX_LINE`] bytes.
    TooLong,
    /// A line without any word of the protocol (escaped).
    Malformed { line: String },
    /// Another error from the network.
    Io { during: &'static str, error: String },
    /// This host's own fault (out of descriptors, ports, buffers).
    Local { during: &'static str, error: String },
}

impl AgentError {
    /// Stable snake_case identifier.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Refused => "agent_refused",
            Self::ConnectTimeout { .. } => "agent_connect_timeout",
            Self::NoAnswer { .. } => "agent_no_answer",
            Self::Reset => "agent_reset",
            Self::Empty => "agent_empty",
            Self::TooLong => "agent_line_too_long",
            Self::Malformed { .. } => "agent_malformed",
            Self::Io { .. } => "agent_io_error",
            Self::Local { .. } => "agent_local_error",
        }
    }
}

impl fmt::Display for AgentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = crate::health::probe::Compact;
        match self {
            Self::Refused => f.write_str("unreachable (connection refused): is the agent running?"),
            Self::ConnectTimeout { timeout } => {
                write!(f, "unreachable (no connection within {})", c(*timeout))
            }
            Self::NoAnswer { timeout } => {
                write!(f, "connected, no complete line within {}", c(*timeout))
            }
            Self::Reset => f.write_str("connection reset by the agent"),
            Self::Empty => f.write_str("closed without an answer"),
            Self::TooLong => write!(f, "no end of line within {MAX_LINE} bytes"),
            Self::Malformed { line } => write!(f, "no word of the agent protocol in \"{line}\""),
            Self::Io { during, error } => write!(f, "{during}: {error}"),
            Self::Local { during, error } => {
                write!(f, "{during}: {error} (this host's fault, not the agent's)")
            }
        }
    }
}

/// `bytes` made safe for a log line, a terminal, status or JSON: control
/// characters escaped (`\n`, `\u{1b}`), bytes that are not UTF-8 as
/// `\xNN`; other Unicode kept. A backend's text must never start a line
/// of its own or drive the terminal of whoever reads it.
pub fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Parses one agent line (without its end of line; a trailing `\r` is
/// dropped). Words are separated by spaces, commas or tabs; `#` starts
/// the text. A line with no word of the protocol is `Malformed`.
pub fn parse(line: &[u8]) -> Result<AgentReply, AgentError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let (words, text) = match line.iter().position(|&b| b == b'#') {
        Some(i) => (&line[..i], Some(&line[i + 1..])),
        None => (line, None),
    };
    let mut reply = AgentReply {
        text: text
            .map(|t| escape(t.trim_ascii()))
            .filter(|t| !t.is_empty()),
        line: escape(line),
        ..AgentReply::default()
    };
    for word in words
        .split(|b| matches!(b, b' ' | b',' | b'\t'))
        .filter(|w| !w.is_empty())
    {
        let known = std::str::from_utf8(word).ok().and_then(|w| {
            if let Some(pct) = weight_percent(w) {
                reply.weight_percent = Some(pct);
                return Some(());
            }
            let word = AgentWord::parse(w)?;
            if reply
                .word
                .is_none_or(|old| word.condition() >= old.condition())
            {
                reply.word = Some(word);
            }
            Some(())
        });
        if known.is_none() {
            reply.ignored.push(escape(word));
        }
    }
    if reply.word.is_none() && reply.weight_percent.is_none() {
        if line.is_empty() {
            return Err(AgentError::Empty);
        }
        return Err(AgentError::Malformed { line: reply.line });
    }
    Ok(reply)
}

/// `NN%` (digits only, no sign or fraction): the percentage, capped.
fn weight_percent(w: &str) -> Option<u32> {
    let digits = w.strip_suffix('%')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Any run of digits is a number: a huge one is capped, not refused.
    Some(
        digits
            .parse::<u32>()
            .map_or(MAX_WEIGHT_PERCENT, |p| p.min(MAX_WEIGHT_PERCENT)),
    )
}

/// A change of what an agent says, as the daemon tells it (an `agent`
/// event): its condition before (`none` without an agent) and now, and
/// its words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentChange {
    pub from: &'static str,
    pub to: &'static str,
    pub text: String,
}

impl AgentChange {
    /// The change from `old` to `new`, if what the agent says changed
    /// (not its counters); `to` = `none` when the agent was removed.
    pub fn between(old: Option<&AgentStatus>, new: Option<&AgentStatus>) -> Option<Self> {
        let name = |a: Option<&AgentStatus>| a.map_or("none", |a| a.condition.as_str());
        let changed = match (old, new) {
            (Some(old), Some(new)) => !old.says_same(new),
            (old, new) => old.is_some() != new.is_some(),
        };
        changed.then(|| Self {
            from: name(old),
            to: name(new),
            text: new.map_or_else(
                || "agent check removed".to_owned(),
                AgentStatus::change_text,
            ),
        })
    }
}

/// What the scheduler keeps of a backend's agent, and what status shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentStatus {
    /// What the agent asked for last (sticky).
    pub condition: AgentCondition,
    /// The word that set `condition`, and its text after `#`.
    pub word: Option<AgentWord>,
    pub text: Option<String>,
    /// Weight as a percentage of the configured one (100 until the agent
    /// says otherwise; sticky like `condition`).
    pub weight_percent: u32,
    /// The last line understood, escaped.
    pub line: Option<String>,
    /// Words of it that were ignored, escaped.
    pub ignored: Vec<String>,
    /// The error of the last poll, if it failed (cleared by an answer).
    pub error: Option<AgentError>,
    /// When the last answer came.
    pub answered_at: Option<Instant>,
    pub polls: u64,
    pub errors: u64,
}

impl Default for AgentStatus {
    /// Before any answer: nothing asked, full weight.
    fn default() -> Self {
        Self {
            condition: AgentCondition::Normal,
            word: None,
            text: None,
            weight_percent: 100,
            line: None,
            ignored: Vec::new(),
            error: None,
            answered_at: None,
            polls: 0,
            errors: 0,
        }
    }
}

impl AgentStatus {
    /// Records one poll. Returns whether what the policy or an operator
    /// sees changed (condition, weight, the words, or the error's kind), so
    /// that only changes are reported.
    pub fn record(&mut self, poll: Result<AgentReply, AgentError>, now: Instant) -> bool {
        let before = self.clone();
        self.polls = self.polls.saturating_add(1);
        match poll {
            Ok(reply) => {
                if let Some(word) = reply.word {
                    self.condition = word.condition();
                    self.word = Some(word);
                    self.text = reply.text;
                }
                if let Some(pct) = reply.weight_percent {
                    self.weight_percent = pct;
                }
                self.line = Some(reply.line);
                self.ignored = reply.ignored;
                self.error = None;
                self.answered_at = Some(now);
            }
            Err(e) => {
                self.errors = self.errors.saturating_add(1);
                self.error = Some(e);
            }
        }
        !self.says_same(&before)
    }

    /// Whether `other` says the same: condition, weight, words and the
    /// kind of error (not the counters nor the times, which change with
    /// every poll).
    pub fn says_same(&self, other: &Self) -> bool {
        let key = |s: &Self| {
            (
                s.condition,
                s.weight_percent,
                s.line.clone(),
                s.error.as_ref().map(AgentError::code),
            )
        };
        key(self) == key(other)
    }

    /// For `xlb status`; `unix_ms` turns an instant into wall-clock ms.
    pub fn to_ctl(&self, unix_ms: impl Fn(Instant) -> u64) -> crate::ctl::AgentStatus {
        crate::ctl::AgentStatus {
            state: self.condition.as_str().to_owned(),
            word: self.word.map(|w| w.as_str().to_owned()),
            text: self.text.clone(),
            weight_percent: self.weight_percent,
            line: self.line.clone(),
            ignored: self.ignored.clone(),
            error: self.error.as_ref().map(ToString::to_string),
            error_code: self.error.as_ref().map(|e| e.code().to_owned()),
            answered_unix_ms: self.answered_at.map(unix_ms),
            polls: self.polls,
            errors: self.errors,
        }
    }

    /// The text of an `agent` event about this status:
    /// the words, weight and error now.
    pub fn change_text(&self) -> String {
        let mut text = match &self.line {
            Some(line) => format!("agent says \"{line}\""),
            None => "agent has not answered yet".to_owned(),
        };
        if self.weight_percent != 100 {
            text.push_str(&format!("; weight {}%", self.weight_percent));
        }
        if let Some(e) = &self.error {
            text.push_str(&format!("; last poll: {e} (its last words stand)"));
        }
        text
    }

    /// What the agent says, for reasons: `agent says "drain" (deploy)`.
    pub fn says(&self) -> String {
        match (self.word, &self.text) {
            (Some(word), Some(text)) => format!("agent says \"{}\" ({text})", word.as_str()),
            (Some(word), None) => format!("agent says \"{}\"", word.as_str()),
            (None, _) => format!("agent says \"{}%\"", self.weight_percent),
        }
    }
}

#[cfg(test)]
mod tests;
