//! BIRD 2 in the two-node lab: the configurations of the router and of
//! each LB node, rendered from the examples xlb ships
//! (`examples/bird-router.conf`, `examples/bird.conf`) so that the examples
//! are what the lab runs, and what `birdc` says about the BGP sessions.
//!
//! The examples use documentation addresses; rendering swaps each for the
//! lab's and fails if one is missing (an example that changed its
//! addresses must change this table too). BFD lines are commented out in
//! the examples as options (`#bfd on;`: `#` then no space); rendering with
//! BFD uncomments exactly those.

use std::path::{Path, PathBuf};

use crate::topology::{Node, ROUTER_V4, ROUTER_V6};

/// The LB node's example, as shipped.
pub const NODE_EXAMPLE: &str = include_str!("../../examples/bird.conf");
/// The router's example, as shipped.
pub const ROUTER_EXAMPLE: &str = include_str!("../../examples/bird-router.conf");

/// The examples' documentation addresses: the router, node A, node B.
const EX_ROUTER: (&str, &str) = ("192.0.2.1", "2001:db8::1");
const EX_NODE_A: (&str, &str) = ("192.0.2.2", "2001:db8::2");
const EX_NODE_B: (&str, &str) = ("192.0.2.3", "2001:db8::3");

/// Where one BIRD instance keeps its files: `bird-<role>.{conf,ctl,pid,log}`
/// in the lab's work directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BirdFiles {
    pub conf: PathBuf,
    pub ctl: PathBuf,
    pub pid: PathBuf,
    pub log: PathBuf,
}

impl BirdFiles {
    /// `role`: `rt`, `a` or `b`.
    pub fn new(dir: &Path, role: &str) -> Self {
        let f = |ext: &str| dir.join(format!("bird-{role}.{ext}"));
        Self {
            conf: f("conf"),
            ctl: f("ctl"),
            pid: f("pid"),
            log: f("log"),
        }
    }

    /// `bird`'s arguments: in the foreground (the lab owns the process),
    /// with this instance's configuration, control socket and pid file.
    pub fn args(&self) -> Vec<String> {
        let mut v = vec!["-f".to_string()];
        for (flag, path) in [("-c", &self.conf), ("-s", &self.ctl), ("-P", &self.pid)] {
            v.extend([flag.to_string(), path.display().to_string()]);
        }
        v
    }
}

/// The configuration of `node`'s BIRD: [`NODE_EXAMPLE`] with the lab's
/// addresses, BFD on or off.
///
/// # Errors
///
/// The example no longer holds an address this replaces (named).
pub fn node_config(node: Node, bfd: bool) -> Result<String, String> {
    let me = (node.v4().to_string(), node.v6().to_string());
    let rt = (ROUTER_V4.to_string(), ROUTER_V6.to_string());
    let text = substitute(
        NODE_EXAMPLE,
        "examples/bird.conf",
        &[
            (EX_NODE_A.0, &me.0),
            (EX_NODE_A.1, &me.1),
            (EX_ROUTER.0, &rt.0),
            (EX_ROUTER.1, &rt.1),
        ],
    )?;
    Ok(finish(&text, bfd))
}

/// The router's configuration: [`ROUTER_EXAMPLE`] with the lab's
/// addresses, BFD on or off.
///
/// # Errors
///
/// The example no longer holds an address this replaces (named).
pub fn router_config(bfd: bool) -> Result<String, String> {
    let [rt, a, b] = [
        (ROUTER_V4.to_string(), ROUTER_V6.to_string()),
        (Node::A.v4().to_string(), Node::A.v6().to_string()),
        (Node::B.v4().to_string(), Node::B.v6().to_string()),
    ];
    let text = substitute(
        ROUTER_EXAMPLE,
        "examples/bird-router.conf",
        &[
            (EX_ROUTER.0, &rt.0),
            (EX_ROUTER.1, &rt.1),
            (EX_NODE_A.0, &a.0),
            (EX_NODE_A.1, &a.1),
            (EX_NODE_B.0, &b.0),
            (EX_NODE_B.1, &b.1),
        ],
    )?;
    Ok(finish(&text, bfd))
}

/// Replaces every whole-address occurrence of each `from` with its `to`;
/// a `from` that does not occur is an error naming it and `file`.
fn substitute(text: &str, file: &str, pairs: &[(&str, &str)]) -> Result<String, String> {
    let mut out = text.to_string();
    for (from, to) in pairs {
        let mut replaced = String::with_capacity(out.len());
        let mut rest = out.as_str();
        let mut found = false;
        while let Some(at) = rest.find(from) {
            let end = at + from.len();
            // 192.0.2.1 must not match inside 192.0.2.10, nor ::1 in ::1f.
            let whole = !rest[end..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_hexdigit() || c == '.' || c == ':');
            replaced.push_str(&rest[..at]);
            replaced.push_str(if whole { to } else { from });
            found |= whole;
            rest = &rest[end..];
        }
        replaced.push_str(rest);
        if !found {
            return Err(format!(
                "{file} no longer contains the address {from} that the lab replaces; \
                 update xlb_lab::bird with the example's new addresses"
            ));
        }
        out = replaced;
    }
    Ok(out)
}

/// The lab's additions: BIRD logs to stderr (the lab's log file), and with
/// `bfd` the commented-out options (`#x`, not `# x`) are uncommented.
fn finish(text: &str, bfd: bool) -> String {
    let mut out =
        String::from("# Rendered by xlb_lab::bird from the example below.\nlog stderr all;\n");
    for line in text.lines() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        match body.strip_prefix('#') {
            Some(option) if bfd && option.starts_with(|c: char| !c.is_whitespace()) => {
                out.push_str(indent);
                out.push_str(option);
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Whether `birdc show protocols` lists protocol `name` as a BGP session
/// in state Established.
pub fn established(show_protocols: &str, name: &str) -> bool {
    show_protocols.lines().any(|l| {
        let mut words = l.split_whitespace();
        words.next() == Some(name) && words.next() == Some("BGP") && l.contains("Established")
    })
}

/// The BGP protocols of the router's configuration, by node: the v4 and
/// the v6 session.
pub fn router_sessions(node: Node) -> [String; 2] {
    let l = node.letter();
    [format!("node_{l}4"), format!("node_{l}6")]
}

/// The BGP protocols of a node's configuration: v4 and v6 to the router.
pub const NODE_SESSIONS: [&str; 2] = ["uplink4", "uplink6"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_config_carries_the_lab_addresses() {
        let b = node_config(Node::B, false).unwrap();
        for want in [
            "router id 10.99.0.3;",
            "neighbor 10.99.0.4 as 65000;",
            "neighbor fd00:99::4 as 65000;",
            "kernel table 100;",
            "krt_source = 252",
            "next hop self;",
            "\t#bfd on;",
            "log stderr all;",
        ] {
            assert!(b.contains(want), "{want:?} not in:\n{b}");
        }
        for gone in ["192.0.2.", "2001:db8::", "\tbfd on;"] {
            assert!(!b.contains(gone), "{gone:?} still in:\n{b}");
        }
    }

    #[test]
    fn bfd_uncomments_options_and_leaves_prose() {
        let text = node_config(Node::A, true).unwrap();
        for want in [
            "\tbfd on;",
            "\nprotocol bfd {",
            "\t\tmultiplier 3;",
            "# BFD (optional)",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        assert!(!text.contains("#bfd on;"), "{text}");
        let rt = router_config(true).unwrap();
        assert!(
            rt.contains("\tbfd on;") && rt.contains("\nprotocol bfd {"),
            "{rt}"
        );
    }

    #[test]
    fn router_config_names_both_nodes_and_merges_paths() {
        let rt = router_config(false).unwrap();
        for want in [
            "router id 10.99.0.4;",
            "neighbor 10.99.0.2 as 65001;",
            "neighbor fd00:99::2 as 65001;",
            "neighbor 10.99.0.3 as 65001;",
            "neighbor fd00:99::3 as 65001;",
            "merge paths on;",
            "passive on;",
        ] {
            assert!(rt.contains(want), "{want:?} not in:\n{rt}");
        }
        for node in Node::ALL {
            for s in router_sessions(node) {
                assert!(rt.contains(&format!("protocol bgp {s} ")), "{s}");
            }
        }
        for s in NODE_SESSIONS {
            assert!(NODE_EXAMPLE.contains(&format!("protocol bgp {s} ")), "{s}");
        }
    }

    #[test]
    fn substitution_replaces_whole_addresses_only() {
        let cases = [
            ("whole", "a 192.0.2.1;", Ok("a 10.0.0.1;")),
            (
                "longer address kept",
                "192.0.2.10 192.0.2.1",
                Ok("192.0.2.10 10.0.0.1"),
            ),
            ("missing", "192.0.2.10", Err(())),
        ];
        for (name, text, want) in cases {
            let got = substitute(text, "x.conf", &[("192.0.2.1", "10.0.0.1")]);
            match want {
                Ok(w) => assert_eq!(got.as_deref(), Ok(w), "{name}"),
                Err(()) => {
                    let e = got.unwrap_err();
                    assert!(
                        e.contains("x.conf no longer contains the address 192.0.2.1"),
                        "{e}"
                    );
                }
            }
        }
    }

    #[test]
    fn reads_established_sessions() {
        let out = "BIRD 2.0.12 ready.\n\
                   Name       Proto      Table      State  Since         Info\n\
                   device1    Device     ---        up     15:40:01.123  \n\
                   node_a4    BGP        ---        up     15:40:02.456  Established   \n\
                   node_a6    BGP        ---        start  15:40:02.456  Active        Socket: Connection refused\n";
        assert!(established(out, "node_a4"));
        assert!(!established(out, "node_a6"));
        assert!(!established(out, "device1"));
        assert!(!established(out, "node_b4"));
    }

    #[test]
    fn files_and_arguments() {
        let f = BirdFiles::new(Path::new("/w"), "rt");
        assert_eq!(
            f.args(),
            [
                "-f",
                "-c",
                "/w/bird-rt.conf",
                "-s",
                "/w/bird-rt.ctl",
                "-P",
                "/w/bird-rt.pid"
            ]
        );
    }
}
