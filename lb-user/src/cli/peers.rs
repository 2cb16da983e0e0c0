//! `xlb peers`: this node and its `[cluster]` peers side by side, and the
//! warnings when their fingerprints differ; and the node's line of `xlb
//! status`.

use std::fmt::Write as _;

use clap::Subcommand;
use serde::Serialize;
use serde_json::Value;

use super::{Cell, Style, paint, table};
use crate::cluster::peers::{NodeView, compare};
use crate::ctl::{FingerprintStatus, StatusReport, VipStatus};

/// `xlb status`'s line about the node, with its newline: its name,
/// fingerprints and peers; empty from a daemon that reports no
/// fingerprint.
pub(super) fn node_line(report: &StatusReport) -> String {
    let fp = &report.fingerprint;
    if fp.config.is_empty() {
        return String::new();
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
    line.push('\n');
    line
}

/// What `xlb status` appends to a VIP's line.
pub(super) fn vip_note(vip: &VipStatus) -> String {
    if vip.fingerprint.is_empty() {
        String::new()
    } else {
        format!("  fingerprint {}", vip.fingerprint)
    }
}

/// `xlb peers` (a subcommand of its own so the list in `cli/mod.rs` stays
/// short).
#[derive(Debug, PartialEq, Subcommand)]
pub enum PeersCommand {
    /// Compare this node with its [cluster] peers (fingerprints, VIPs).
    ///
    /// Reads this node's status over the control socket and each peer's
    /// `GET /status` (its metrics listener) at once, within the peer's
    /// cluster.timeout, and warns when a peer's tables differ: two nodes
    /// with different tables send flows that ECMP moves between them to
    /// other backends. Exit status: 0 all agree, 2 a peer differs, 3 a
    /// peer could not be read (and none differs), 1 this node's daemon
    /// could not be asked.
    Peers {
        /// Print the comparison as JSON.
        #[arg(long)]
        json: bool,
        /// Which daemon.
        #[command(flatten)]
        target: super::target::ClientTarget,
    },
}

/// `xlb peers` exit status: every peer answered and agrees.
pub const EXIT_AGREE: u8 = 0;
/// A peer's fingerprint differs from this node's (or it reports none).
pub const EXIT_DIFFER: u8 = 2;
/// A peer could not be read; every one that could agrees.
pub const EXIT_UNREACHABLE: u8 = 3;

/// What `xlb peers` found: each node, the warnings, the exit status.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PeersReport {
    /// This node first, then its peers in `[cluster] peers` order.
    pub nodes: Vec<NodeReport>,
    /// What differs, and which peers could not be read.
    pub warnings: Vec<String>,
    /// [`EXIT_AGREE`], [`EXIT_DIFFER`] or [`EXIT_UNREACHABLE`].
    pub exit_status: u8,
}

/// One node in a [`PeersReport`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeReport {
    /// Its `cluster.name`, or its address if it could not be read.
    pub node: String,
    /// As `[cluster] peers` lists it; `null` for this node.
    pub address: Option<String>,
    pub reachable: bool,
    /// Why it could not be read.
    pub error: Option<String>,
    pub fingerprint: Option<FingerprintStatus>,
    /// Whether its configuration fingerprint equals this node's.
    pub agrees: Option<bool>,
    /// In its configuration order.
    pub vips: Vec<NodeVip>,
}

/// One VIP of one node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeVip {
    pub name: String,
    pub fingerprint: String,
    /// The VIP's `announce` object (`{state, reason, code}`) from a daemon
    /// that announces VIPs; `null` otherwise.
    pub announce: Option<Value>,
}

/// Compares every node with the first (this node).
pub fn peers_report(nodes: &[NodeView]) -> PeersReport {
    let local = nodes.first().and_then(|n| n.status.as_ref().ok());
    let mut warnings = Vec::new();
    let (mut differ, mut unreachable) = (false, false);
    let mut out = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let name = n.name();
        match &n.status {
            Ok((report, json)) => {
                let agrees = match (i, local) {
                    (0, _) | (_, None) => None,
                    (_, Some((l, _))) => {
                        let diffs = compare(l, report);
                        differ |= !diffs.is_empty();
                        warnings.extend(diffs.iter().map(|d| d.warning(&name)));
                        Some(diffs.is_empty())
                    }
                };
                out.push(NodeReport {
                    node: name,
                    address: n.address.clone(),
                    reachable: true,
                    error: None,
                    fingerprint: Some(report.fingerprint.clone()),
                    agrees,
                    vips: node_vips(report, json),
                });
            }
            Err(e) => {
                unreachable = true;
                warnings.push(format!("peer {name} could not be read: {e}"));
                out.push(NodeReport {
                    node: name,
                    address: n.address.clone(),
                    reachable: false,
                    error: Some(e.clone()),
                    fingerprint: None,
                    agrees: None,
                    vips: Vec::new(),
                });
            }
        }
    }
    let exit_status = if differ {
        EXIT_DIFFER
    } else if unreachable {
        EXIT_UNREACHABLE
    } else {
        EXIT_AGREE
    };
    PeersReport {
        nodes: out,
        warnings,
        exit_status,
    }
}

/// Each VIP with its fingerprint and, when the daemon reports it, its
/// `announce` object (read from the JSON: a field this build may not know).
fn node_vips(report: &StatusReport, json: &Value) -> Vec<NodeVip> {
    report
        .vips
        .iter()
        .enumerate()
        .map(|(i, v)| NodeVip {
            name: v.name.clone(),
            fingerprint: v.fingerprint.clone(),
            announce: json["vips"][i]
                .get("announce")
                .filter(|a| !a.is_null())
                .cloned(),
        })
        .collect()
}

/// `xlb peers` as text: one row per node (node, address, reachable or the
/// error, fingerprint, then each VIP's announce state), then the warnings.
pub fn render_peers(report: &PeersReport, color: bool) -> String {
    let mut vip_names: Vec<&str> = Vec::new();
    for n in &report.nodes {
        for v in &n.vips {
            if !vip_names.contains(&v.name.as_str()) {
                vip_names.push(&v.name);
            }
        }
    }
    let mut header: Vec<Cell> = ["NODE", "ADDRESS", "REACHABLE", "FINGERPRINT"]
        .map(Cell::plain)
        .into();
    header.extend(vip_names.iter().map(|v| Cell::plain(format!("VIP {v}"))));
    let mut rows = vec![header];
    let local = report.nodes.first();
    for n in &report.nodes {
        rows.push(node_row(n, local, &vip_names));
    }
    let mut out = String::new();
    table(&mut out, "", &rows, color);
    for w in &report.warnings {
        let _ = writeln!(out, "{} {w}", paint("warning:", Style::Yellow, color));
    }
    if report.nodes.len() == 1 {
        out.push_str("no peers: list the other nodes in [cluster] peers\n");
    } else if report.exit_status == EXIT_AGREE {
        let _ = writeln!(
            out,
            "all {} nodes agree: every flow maps to the same backend on each",
            report.nodes.len()
        );
    }
    out
}

fn node_row(n: &NodeReport, local: Option<&NodeReport>, vip_names: &[&str]) -> Vec<Cell> {
    let address = n
        .address
        .clone()
        .unwrap_or_else(|| "(this node)".to_owned());
    let reach = match &n.error {
        None => Cell::styled("yes", Style::Green),
        Some(e) => Cell::styled(e.clone(), Style::Red),
    };
    let fp = match (&n.fingerprint, n.agrees) {
        (None, _) => Cell::plain("-"),
        (Some(f), Some(false)) => Cell::styled(format!("{} (differs)", f.config), Style::Red),
        (Some(f), _) => Cell::plain(f.config.clone()),
    };
    let mut row = vec![Cell::plain(n.node.clone()), Cell::plain(address), reach, fp];
    for name in vip_names {
        row.push(vip_cell(n, local, name));
    }
    row
}

/// A VIP's cell: its announce state (`-` when the daemon reports none),
/// `absent` where the node lacks it, marked when its fingerprint differs
/// from this node's.
fn vip_cell(n: &NodeReport, local: Option<&NodeReport>, name: &str) -> Cell {
    if !n.reachable {
        return Cell::plain("");
    }
    let Some(v) = n.vips.iter().find(|v| v.name == name) else {
        return Cell::styled("absent", Style::Red);
    };
    let state = v
        .announce
        .as_ref()
        .and_then(|a| a.get("state"))
        .and_then(Value::as_str)
        .unwrap_or("-");
    let mine = local.and_then(|l| l.vips.iter().find(|lv| lv.name == name));
    match mine {
        Some(m) if n.address.is_some() && m.fingerprint != v.fingerprint => {
            Cell::styled(format!("{state} (differs)"), Style::Red)
        }
        _ => Cell::plain(state),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::tests::sample_report;

    fn node(address: Option<&str>, name: &str, key: &str, api: &str) -> NodeView {
        let mut r = sample_report();
        r.cluster.node = name.to_owned();
        r.fingerprint.config = format!("{key}{api}");
        r.fingerprint.hash_key = key.to_owned();
        r.vips[0].fingerprint = api.to_owned();
        let mut json = serde_json::to_value(&r).unwrap();
        if name == "lb-b" {
            // A daemon that announces VIPs (issue 26's announce slice).
            json["vips"][0]["announce"] =
                serde_json::json!({"state": "announced", "reason": "2 of 3 up", "code": "up"});
        }
        NodeView {
            address: address.map(str::to_owned),
            status: Ok((r, json)),
        }
    }

    fn down(address: &str, why: &str) -> NodeView {
        NodeView {
            address: Some(address.to_owned()),
            status: Err(why.to_owned()),
        }
    }

    const KEY: &str = "0a1b2c3d";
    const API: &str = "5a6b7c8d";

    #[test]
    fn nodes_that_agree() {
        let nodes = [
            node(None, "lb-a", KEY, API),
            node(Some("10.9.0.2:9813"), "lb-b", KEY, API),
        ];
        let report = peers_report(&nodes);
        assert_eq!(report.exit_status, EXIT_AGREE);
        assert!(report.warnings.is_empty());
        assert_eq!(
            render_peers(&report, false),
            "\
NODE  ADDRESS        REACHABLE  FINGERPRINT       VIP api
lb-a  (this node)    yes        0a1b2c3d5a6b7c8d  -
lb-b  10.9.0.2:9813  yes        0a1b2c3d5a6b7c8d  announced
all 2 nodes agree: every flow maps to the same backend on each
"
        );
    }

    #[test]
    fn a_node_with_another_key_and_one_that_is_down() {
        let nodes = [
            node(None, "lb-a", KEY, API),
            node(Some("10.9.0.2:9813"), "lb-b", "ffffffff", API),
            down("10.9.0.3:9813", "no answer within 1s"),
        ];
        let report = peers_report(&nodes);
        assert_eq!(report.exit_status, EXIT_DIFFER);
        assert_eq!(
            render_peers(&report, false),
            "\
NODE           ADDRESS        REACHABLE            FINGERPRINT                 VIP api
lb-a           (this node)    yes                  0a1b2c3d5a6b7c8d            -
lb-b           10.9.0.2:9813  yes                  ffffffff5a6b7c8d (differs)  announced
10.9.0.3:9813  10.9.0.3:9813  no answer within 1s  -
warning: node lb-b: hash key differs: every flow ECMP moves between this node and lb-b lands on another backend; set the same daemon.hash_seed on every node
warning: peer 10.9.0.3:9813 could not be read: no answer within 1s
"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["exit_status"], 2);
        assert_eq!(json["nodes"][1]["agrees"], false);
        assert_eq!(
            json["nodes"][1]["vips"][0]["announce"]["state"],
            "announced"
        );
        assert_eq!(json["nodes"][2]["reachable"], false);
        assert_eq!(json["nodes"][2]["error"], "no answer within 1s");
    }

    #[test]
    fn exit_statuses() {
        let a = || node(None, "lb-a", KEY, API);
        let cases: [(&str, Vec<NodeView>, u8); 5] = [
            ("alone", vec![a()], EXIT_AGREE),
            (
                "agree",
                vec![a(), node(Some("b:1"), "lb-c", KEY, API)],
                EXIT_AGREE,
            ),
            (
                "a vip differs",
                vec![a(), node(Some("b:1"), "lb-c", KEY, "x")],
                EXIT_DIFFER,
            ),
            (
                "unreachable",
                vec![a(), down("b:1", "refused")],
                EXIT_UNREACHABLE,
            ),
            (
                "differs and unreachable",
                vec![
                    a(),
                    down("b:1", "refused"),
                    node(Some("c:1"), "lb-c", "k", API),
                ],
                EXIT_DIFFER,
            ),
        ];
        for (name, nodes, want) in cases {
            assert_eq!(peers_report(&nodes).exit_status, want, "{name}");
        }
        let alone = render_peers(&peers_report(&[a()]), false);
        assert!(
            alone.ends_with("no peers: list the other nodes in [cluster] peers\n"),
            "{alone}"
        );
    }

    #[test]
    fn the_vip_that_differs_is_marked() {
        let nodes = [
            node(None, "lb-a", KEY, API),
            node(Some("10.9.0.2:9813"), "lb-c", KEY, "99999999"),
        ];
        let report = peers_report(&nodes);
        assert_eq!(
            report.warnings,
            [
                "vip \"api\" differs on lb-c: its address, mode, table size or backends are not the \
              same, so flows ECMP moves between this node and lb-c may land on another backend"
            ]
        );
        let text = render_peers(&report, false);
        assert!(
            text.contains(
                "lb-c  10.9.0.2:9813  yes        0a1b2c3d99999999 (differs)  - (differs)\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn command_line() {
        use clap::Parser as _;
        let cases = [
            (vec!["xlb", "peers"], false),
            (vec!["xlb", "peers", "--json"], true),
        ];
        for (args, json) in cases {
            let cli = crate::cli::Cli::try_parse_from(&args).unwrap();
            assert_eq!(
                cli.command,
                crate::cli::Command::Peers(PeersCommand::Peers {
                    target: Default::default(),
                    json
                }),
                "{args:?}"
            );
            assert_eq!(cli.command.request(), None, "not a single request");
        }
    }

    #[test]
    fn status_node_line() {
        let r = sample_report();
        assert_eq!(
            node_line(&r),
            "node lb-a  fingerprint 1f2e3d4c5b6a7988 (hash key 0a1b2c3d4e5f6071)  1 peer\n"
        );
        let mut old = r.clone();
        old.fingerprint = FingerprintStatus::default();
        assert_eq!(node_line(&old), "");
    }
}
