//! The two-node lab (`LabConfig::nodes = 2`): the segment of the one-node
//! lab, plus a second LB node and a router in front of both.
//!
//! ```text
//!                    {p}-br: bridge br0
//!   ┌─────────┬─────────┬─────────┬─────────┬─────────┐
//!  v-cl      v-rt      v-lb      v-lb2     v-b1 …    v-bN
//!   │         │         │         │         │
//! {p}-cl    {p}-rt    {p}-lb    {p}-lb2   {p}-b1 …  backends
//! client    router    node A    node B    (VIPs on lo)
//! .10 ::10  .4 ::4    .2 ::2    .3 ::3    .11 ::11 …
//!           BIRD      xlb+BIRD  xlb+BIRD
//!           AS 65000  AS 65001  AS 65001
//! ```
//!
//! The client routes the VIP ranges via the router (10.99.0.4,
//! fd00:99::4); the router learns each VIP from both nodes over BGP and
//! installs one ECMP route per VIP (BIRD's `merge paths`), hashed on L4
//! (`fib_multipath_hash_policy = 1`) so that one client's connections
//! spread over both nodes. Backends answer the client directly (DSR), on
//! the segment. The router forwards out of the port it received on, so it
//! sends no redirects and the client ignores any.
//!
//! Everything shares one segment so that the three ways a node dies can be
//! made without touching the others: its processes killed (the BGP session
//! closes), its link to the router silenced ([`LinkSilencer`]), or its
//! routes withdrawn by xlb. The silencing drop sits on the bridge, between
//! the router's port and the node's port, in both directions: a drop inside
//! the node's namespace would come too late, because XDP runs on the node's
//! eth0 before any nftables hook (ingress included) and would keep
//! forwarding the client's packets that the router still sends, and
//! `XDP_TX` frames never pass the node's nftables egress hook either. On the
//! bridge, the link is silent for BGP, BFD and data alike, as a cut cable
//! or a dead switch port would be, while the node still reaches the
//! backends.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{
    LB_V4, LB_V6, Lab, LabError, Result, ip_in,
    netns::{describe, run},
    sysctl_in,
};

/// Most LB nodes a lab can have.
pub const MAX_NODES: usize = 2;

/// Node B's addresses on the segment (node A is the one-node lab's LB).
pub const NODE_B_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 3);
pub const NODE_B_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x3);

/// The router's addresses on the segment: not 10.99.0.1, which each node
/// keeps as its unowned stand-in gateway for data-path probes (`build`).
pub const ROUTER_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 4);
pub const ROUTER_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x4);

/// Bridge ports of node B and of the router.
const NODE_B_PEER: &str = "v-lb2";
const ROUTER_PEER: &str = "v-rt";

/// One of the LB nodes of a two-node lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Node {
    /// `{p}-lb`, 10.99.0.2: the one-node lab's LB.
    A,
    /// `{p}-lb2`, 10.99.0.3.
    B,
}

impl Node {
    pub const ALL: [Node; 2] = [Node::A, Node::B];

    /// `a` or `b`, for file and instance names.
    pub fn letter(self) -> char {
        match self {
            Node::A => 'a',
            Node::B => 'b',
        }
    }

    pub fn v4(self) -> Ipv4Addr {
        match self {
            Node::A => LB_V4,
            Node::B => NODE_B_V4,
        }
    }

    pub fn v6(self) -> Ipv6Addr {
        match self {
            Node::A => LB_V6,
            Node::B => NODE_B_V6,
        }
    }

    /// The last byte of the node's MAC (02:99:00:00:00:0N), as in `addressing`.
    fn mac_host(self) -> u8 {
        match self {
            Node::A => 0x02,
            Node::B => 0x03,
        }
    }

    pub fn mac(self) -> [u8; 6] {
        [0x02, 0x99, 0, 0, 0, self.mac_host()]
    }

    /// eth0's IPv6 link-local address (EUI-64 of its MAC), the next hop a
    /// router may install for routes learned over IPv6 BGP.
    pub fn link_local(self) -> Ipv6Addr {
        Ipv6Addr::new(
            0xfe80,
            0,
            0,
            0,
            0x0099,
            0x00ff,
            0xfe00,
            u16::from(self.mac_host()),
        )
    }

    /// Which node `addr` (a next hop on the router) belongs to.
    pub fn owning(addr: IpAddr) -> Option<Node> {
        Node::ALL.into_iter().find(|n| {
            addr == IpAddr::V4(n.v4())
                || addr == IpAddr::V6(n.v6())
                || addr == IpAddr::V6(n.link_local())
        })
    }
}

/// The router's MAC: 02:99:00:00:00:04.
pub(super) const ROUTER_MAC: [u8; 6] = [0x02, 0x99, 0, 0, 0, 0x04];

impl Lab {
    /// Number of LB nodes (1, or 2 with a router).
    pub fn node_count(&self) -> usize {
        self.cfg.nodes
    }

    fn is_cluster(&self) -> bool {
        self.cfg.nodes > 1
    }

    /// Node B's namespace, in a two-node lab.
    pub fn ns_node_b(&self) -> Option<String> {
        self.is_cluster()
            .then(|| format!("{}-lb2", self.cfg.prefix))
    }

    /// The router's namespace, in a two-node lab.
    pub fn ns_router(&self) -> Option<String> {
        self.is_cluster().then(|| format!("{}-rt", self.cfg.prefix))
    }

    /// The namespace of `node` (node B only exists in a two-node lab).
    pub fn ns_node(&self, node: Node) -> String {
        match node {
            Node::A => self.ns_lb(),
            Node::B => self
                .ns_node_b()
                .expect("node B exists only in a lab built with nodes = 2"),
        }
    }

    /// The nodes this lab has, A first.
    pub fn nodes(&self) -> Vec<Node> {
        Node::ALL[..self.cfg.nodes].to_vec()
    }

    /// The bridge-side peer of `node`'s eth0 (it needs an XDP program for
    /// the node's XDP_TX frames to arrive; see the module docs of `topology`).
    pub fn node_peer_ifname(&self, node: Node) -> &'static str {
        match node {
            Node::A => self.lb_peer_ifname(),
            Node::B => NODE_B_PEER,
        }
    }

    /// Where the client (and the flooder) send VIP traffic: the router in a
    /// two-node lab, the LB otherwise.
    pub(super) fn vip_gateways(&self) -> (Ipv4Addr, Ipv6Addr) {
        if self.is_cluster() {
            (ROUTER_V4, ROUTER_V6)
        } else {
            (LB_V4, LB_V6)
        }
    }

    /// The next hops of the router's route to `vip` (a host route learned
    /// over BGP), as installed in its kernel: empty when it has none.
    ///
    /// # Errors
    ///
    /// Not a two-node lab, `ip` failed or printed what this does not read.
    pub fn router_next_hops(&self, vip: IpAddr) -> Result<Vec<IpAddr>> {
        let rt = self.ns_router().ok_or_else(|| LabError::InvalidConfig {
            reason: "this lab has no router (LabConfig::nodes = 2)".to_string(),
        })?;
        let (family, len) = match vip {
            IpAddr::V4(_) => ("-4", 32),
            IpAddr::V6(_) => ("-6", 128),
        };
        let prefix = format!("{vip}/{len}");
        let out = ip_in(&rt, &["-j", family, "route", "show", "exact", &prefix])?;
        parse_next_hops(&out).ok_or_else(|| LabError::Parse {
            cmd: format!("ip -n {rt} -j {family} route show exact {prefix}"),
            output: out,
        })
    }

    /// The nodes the router sends `vip` to, A first (see
    /// [`Lab::router_next_hops`]); a next hop that is no node is an error.
    pub fn router_nodes(&self, vip: IpAddr) -> Result<Vec<Node>> {
        let hops = self.router_next_hops(vip)?;
        let mut nodes = hops
            .iter()
            .map(|&h| {
                Node::owning(h).ok_or_else(|| LabError::Parse {
                    cmd: format!("the router's route to {vip}"),
                    output: format!("next hop {h} is no node of the lab"),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        nodes.sort();
        Ok(nodes)
    }

    /// Silences the link between the router and `node` (see the module
    /// docs); dropping the silencer restores it.
    ///
    /// # Errors
    ///
    /// Not a two-node lab, or `nft` failed.
    pub fn silence_link(&self, node: Node) -> Result<LinkSilencer> {
        if !self.is_cluster() {
            return Err(LabError::InvalidConfig {
                reason: "this lab has no router (LabConfig::nodes = 2)".to_string(),
            });
        }
        LinkSilencer::install(&self.ns_bridge(), ROUTER_PEER, self.node_peer_ifname(node))
    }
}

/// The router: it forwards, hashes ECMP on L4, and sends no redirects
/// (it forwards out of the port it received on).
pub(super) fn make_router(rt: &str) -> Result<()> {
    sysctl_in(
        rt,
        &[
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv6.conf.all.forwarding", "1"),
            // L4 hash: the 5-tuple picks the next hop, so one client's
            // connections spread over both nodes (policy 0 hashes only
            // the addresses: every connection of the client on one node).
            ("net.ipv4.fib_multipath_hash_policy", "1"),
            ("net.ipv6.fib_multipath_hash_policy", "1"),
            ("net.ipv4.conf.all.send_redirects", "0"),
            ("net.ipv4.conf.default.send_redirects", "0"),
            ("net.ipv4.conf.eth0.send_redirects", "0"),
        ],
    )
}

/// A backend of a two-node lab lets its decapsulator relay a second-chance
/// packet to the previous owner: `bpf_fib_lookup` from XDP needs forwarding
/// on the interface (the kernel checks it whatever the flags), and the
/// relayed packet leaves by the same eth0 it came in on.
pub(super) fn let_backend_relay(ns: &str) -> Result<()> {
    sysctl_in(
        ns,
        &[
            ("net.ipv4.conf.eth0.forwarding", "1"),
            ("net.ipv6.conf.eth0.forwarding", "1"),
            ("net.ipv4.conf.eth0.send_redirects", "0"),
            ("net.ipv4.conf.all.send_redirects", "0"),
        ],
    )
}

/// The client of a two-node lab ignores redirects: IPv6 has no switch to
/// stop the router sending them, and a client that took one would bypass
/// the router (and its ECMP) for good.
pub(super) fn ignore_redirects(ns: &str) -> Result<()> {
    sysctl_in(
        ns,
        &[
            ("net.ipv4.conf.all.accept_redirects", "0"),
            ("net.ipv4.conf.eth0.accept_redirects", "0"),
            ("net.ipv6.conf.all.accept_redirects", "0"),
            ("net.ipv6.conf.eth0.accept_redirects", "0"),
        ],
    )
}

/// The next hops in `ip -j route show` output: `gateway` of a single-path
/// route, every `nexthops[].gateway` of a multipath one; `Some(empty)` for
/// no route, `None` for output this does not read.
fn parse_next_hops(json: &str) -> Option<Vec<IpAddr>> {
    if json.trim().is_empty() {
        return Some(Vec::new());
    }
    let routes: Vec<serde_json::Value> = serde_json::from_str(json).ok()?;
    let mut hops = Vec::new();
    for r in &routes {
        let gateways: Vec<&serde_json::Value> = match r.get("nexthops") {
            Some(list) => list
                .as_array()?
                .iter()
                .filter_map(|h| h.get("gateway"))
                .collect(),
            None => r.get("gateway").into_iter().collect(),
        };
        for g in gateways {
            hops.push(g.as_str()?.parse().ok()?);
        }
    }
    Some(hops)
}

/// Name of the nftables table (family `bridge`) of a [`LinkSilencer`], per
/// node port so that both links can be silent at once.
fn silence_table(port: &str) -> String {
    format!("xlb_silence_{}", port.replace('-', "_"))
}

/// Drops every frame between two bridge ports, both ways, with a counter;
/// see the module documentation for why on the bridge. Dropping it removes
/// the table: the link talks again.
#[derive(Debug)]
pub struct LinkSilencer {
    ns: String,
    table: String,
}

impl LinkSilencer {
    fn install(ns: &str, a: &str, b: &str) -> Result<Self> {
        let s = Self {
            ns: ns.to_string(),
            table: silence_table(b),
        };
        let t = &s.table;
        s.nft(&format!(
            "add table bridge {t}; \
             add counter bridge {t} dropped; \
             add chain bridge {t} silence {{ type filter hook forward priority -10; }}; \
             add rule bridge {t} silence iifname \"{a}\" oifname \"{b}\" counter name \"dropped\" drop; \
             add rule bridge {t} silence iifname \"{b}\" oifname \"{a}\" counter name \"dropped\" drop"
        ))?;
        Ok(s)
    }

    /// Frames dropped since the link went silent.
    ///
    /// # Errors
    ///
    /// `nft` failed or printed what this does not read.
    pub fn dropped(&self) -> Result<u64> {
        let t = &self.table;
        let out = self.nft(&format!("list counter bridge {t} dropped"))?;
        let mut words = out.split_whitespace();
        words
            .find(|w| *w == "packets")
            .and_then(|_| words.next())
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| LabError::Parse {
                cmd: format!("nft list counter bridge {t} dropped in {}", self.ns),
                output: out,
            })
    }

    fn nft(&self, script: &str) -> Result<String> {
        let mut cmd = Lab::exec(&self.ns, ["nft", script]);
        run(&mut cmd).map_err(|e| match e {
            LabError::Spawn { source, .. } => LabError::Spawn {
                cmd: format!(
                    "{} (nft is the Debian package `nftables`; `cargo xtask setup` installs it)",
                    describe(&cmd)
                ),
                source,
            },
            e => e,
        })
    }
}

impl Drop for LinkSilencer {
    fn drop(&mut self) {
        if let Err(e) = self.nft(&format!("delete table bridge {}", self.table)) {
            eprintln!(
                "xlb-lab: could not remove the silencer {} in {}: {e}",
                self.table, self.ns
            );
        }
    }
}

/// Node B's eth0 and the router's, as `build` plugs hosts in.
pub(super) fn cluster_hosts(lab: &Lab) -> Vec<(String, &'static str, Ipv4Addr, Ipv6Addr, [u8; 6])> {
    let mut v = Vec::new();
    if let (Some(b), Some(rt)) = (lab.ns_node_b(), lab.ns_router()) {
        v.push((b, NODE_B_PEER, NODE_B_V4, NODE_B_V6, Node::B.mac()));
        v.push((rt, ROUTER_PEER, ROUTER_V4, ROUTER_V6, ROUTER_MAC));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_hops_of_single_and_multipath_routes() {
        let cases: [(&str, &str, Option<Vec<&str>>); 5] = [
            ("no route", "", Some(vec![])),
            ("empty list", "[]\n", Some(vec![])),
            (
                "one node",
                r#"[{"dst":"10.100.0.1","gateway":"10.99.0.2","dev":"eth0","protocol":"bird","metric":32,"flags":[]}]"#,
                Some(vec!["10.99.0.2"]),
            ),
            (
                "ecmp over link-locals",
                r#"[{"dst":"fd00:100::1","protocol":"bird","metric":32,"flags":[],"nexthops":[{"gateway":"fe80::99:ff:fe00:2","dev":"eth0","weight":1,"flags":[]},{"gateway":"fe80::99:ff:fe00:3","dev":"eth0","weight":1,"flags":[]}]}]"#,
                Some(vec!["fe80::99:ff:fe00:2", "fe80::99:ff:fe00:3"]),
            ),
            ("not json", "10.100.0.1 via 10.99.0.2", None),
        ];
        for (name, json, want) in cases {
            let want: Option<Vec<IpAddr>> =
                want.map(|v| v.iter().map(|a| a.parse().unwrap()).collect());
            assert_eq!(parse_next_hops(json), want, "{name}");
        }
    }

    #[test]
    fn next_hops_name_their_node() {
        let cases = [
            ("a v4", "10.99.0.2", Some(Node::A)),
            ("b v6", "fd00:99::3", Some(Node::B)),
            ("a link-local", "fe80::99:ff:fe00:2", Some(Node::A)),
            ("b link-local", "fe80::99:ff:fe00:3", Some(Node::B)),
            ("the router", "10.99.0.4", None),
            ("a backend", "10.99.0.11", None),
        ];
        for (name, addr, want) in cases {
            assert_eq!(Node::owning(addr.parse().unwrap()), want, "{name}");
        }
    }

    #[test]
    fn silencer_tables_are_per_port() {
        assert_eq!(silence_table("v-lb"), "xlb_silence_v_lb");
        assert_ne!(silence_table("v-lb"), silence_table("v-lb2"));
    }
}
