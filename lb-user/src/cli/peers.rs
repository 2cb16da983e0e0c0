//! `xlb peers`: this node and its `[cluster]` peers side by side, and the
//! warnings when their fingerprints differ; and the node's line of `xlb
//! status`.

use std::fmt::Write as _;

use crate::ctl::{StatusReport, VipStatus};

/// `xlb status`'s line about the node: its name, fingerprints and peers;
/// `None` from a daemon that reports no fingerprint.
pub(super) fn node_line(report: &StatusReport) -> Option<String> {
    let fp = &report.fingerprint;
    if fp.config.is_empty() {
        return None;
    }
    let mut line = format!(
        "node {}  fingerprint {} (hash key {})",
        report.cluster.node, fp.config, fp.hash_key
    );
    match report.cluster.peers.len() {
        0 => {}
        1 => line.push_str("  1 peer"),
        n => {
            let _ = write!(line, "  {n} peers");
        }
    }
    Some(line)
}

/// What `xlb status` appends to a VIP's line.
pub(super) fn vip_note(vip: &VipStatus) -> String {
    if vip.fingerprint.is_empty() {
        String::new()
    } else {
        format!("  fingerprint {}", vip.fingerprint)
    }
}
