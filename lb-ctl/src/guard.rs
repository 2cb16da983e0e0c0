//! Abuse control as the control protocol shows it: deny/allow list entries
//! (`xlb blocks`) and the heaviest sources per VIP (`xlb sources`).

use serde::{Deserialize, Serialize};

/// Which list an entry is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListKind {
    /// Matching sources are refused (dropped or reset) on new flows.
    Deny,
    /// Matching sources are never refused by a deny entry (an operator's own
    /// monitoring); rate limits still apply.
    Allow,
}

impl ListKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ListKind::Deny => "deny",
            ListKind::Allow => "allow",
        }
    }
}

/// What a deny entry or a rate limit does to a refused new flow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuardAction {
    /// `XDP_DROP`: the client's SYN is lost and it retries.
    #[default]
    Drop,
    /// A TCP SYN is answered with a RST built in XDP: the client's connect
    /// fails at once (the L4 form of a 429). Other packets are dropped.
    Reset,
}

impl GuardAction {
    pub fn as_str(self) -> &'static str {
        match self {
            GuardAction::Drop => "drop",
            GuardAction::Reset => "reset",
        }
    }
}

/// Where a list entry came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryOrigin {
    /// The configuration file (`[[guard.deny]]`, `[[vip.guard.allow]]`, ...):
    /// changed by editing the file and reloading.
    Config,
    /// `xlb block` / `xlb allow`: pinned, survives restarts, expires by TTL.
    Runtime,
    /// `auto_block`: a source stayed above its VIP's `auto_block.above`.
    Auto,
}

/// One deny or allow list entry, as `xlb blocks` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockEntry {
    pub list: ListKind,
    /// `"192.0.2.7/32"`, `"2001:db8:1:2::/64"`.
    pub prefix: String,
    /// VIP name, or `null` for an entry of the global list.
    pub vip: Option<String>,
    /// What a deny entry does (allow entries say `drop`, unused).
    pub action: GuardAction,
    pub origin: EntryOrigin,
    pub reason: String,
    /// When it was added, ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// When it expires, ms since the Unix epoch; `null` = never.
    pub expires_unix_ms: Option<u64>,
    /// Packets it matched (deny: refused; allow: let through a deny match),
    /// summed over CPUs since it was added.
    pub hits: u64,
}

/// How a source is treated now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceVerdict {
    /// Nothing refused it in the last interval.
    Ok,
    /// Some of its new flows were over `new_flows_per_source`.
    Limited,
    /// A deny entry covers it.
    Blocked,
    /// An allow entry covers it.
    Allowed,
}

/// One source prefix of one VIP, with its recent rates.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SourceRow {
    /// The source as keyed: its IPv4 /32 or IPv6 /64 (the VIP's
    /// `new_flows_per_source` prefix lengths), e.g. `"2001:db8:1:2::/64"`.
    pub prefix: String,
    /// New flows per second (admitted or not) over the last sample.
    pub new_flows_per_s: f64,
    /// Packets per second, established ones sampled (see the README).
    pub packets_per_s: f64,
    /// New flows per second refused by the rate limit.
    pub limited_per_s: f64,
    /// This source's share of the VIP's new flows per second, 0 to 1.
    pub share: f64,
    pub verdict: SourceVerdict,
}

/// The heaviest sources of one VIP, by new flows per second.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VipSources {
    pub vip: String,
    /// All new flows per second to the VIP (every source).
    pub new_flows_per_s: f64,
    /// Sources tracked for the VIP right now (entries in the LRU).
    pub tracked: u64,
    /// Heaviest first.
    pub sources: Vec<SourceRow>,
}
