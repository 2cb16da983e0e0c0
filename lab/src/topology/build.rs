//! Building the lab's network, step by step: namespaces, the bridge, each
//! host's veth and addresses, the client's and the LB's routes to the VIPs,
//! the VIPs on the backends, then a wait for carrier. [`Plan`] says what
//! goes where before any command runs.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    thread,
    time::{Duration, Instant},
};

use super::{
    BRIDGE_IFNAME, CLIENT_MTU, CLIENT_V4, CLIENT_V6, FLOOD_NET_V6, FLOOD_NET_V6_PREFIX, FLOOD_V4,
    FLOOD_V6, HOST_IFNAME, LAB_MTU, LB_GW_MAC, LB_GW_V4, LB_GW_V6, LB_V4, LB_V6, LINK_UP_TIMEOUT,
    Lab, LabError, NET_V4_PREFIX, NET_V6_PREFIX, Result, VIP_NET_V4, VIP_NET_V4_PREFIX, VIP_NET_V6,
    VIP_NET_V6_PREFIX, VIP_V4, VIP_V6, VIP2_V4, backend_mac, backend_v4, backend_v6, client_mac,
    cluster, flood_mac, flood_v6_sources, format_mac, ip, ip_in, lb_mac, sysctl_in,
};

/// One host namespace's end of the segment.
struct HostSpec {
    ns: String,
    /// Name of the veth peer in the bridge namespace.
    peer: String,
    v4: Ipv4Addr,
    v6: Ipv6Addr,
    mac: [u8; 6],
    mtu: u32,
}

/// What [`Lab::build`] creates: the namespaces by role and every host's
/// end of the segment (client, LB, backends b1…, then the flooder if any).
struct Plan {
    bridge: String,
    client: String,
    lb: String,
    backends: Vec<String>,
    flood: Option<String>,
    hosts: Vec<HostSpec>,
}

impl Lab {
    fn plan(&self) -> Plan {
        let mut hosts = vec![
            HostSpec {
                ns: self.ns_client(),
                peer: "v-cl".to_string(),
                v4: CLIENT_V4,
                v6: CLIENT_V6,
                mac: client_mac(),
                mtu: CLIENT_MTU,
            },
            HostSpec {
                ns: self.ns_lb(),
                peer: self.lb_peer_ifname().to_string(),
                v4: LB_V4,
                v6: LB_V6,
                mac: lb_mac(),
                mtu: LAB_MTU,
            },
        ];
        hosts.extend((1..=self.cfg.backends).map(|i| HostSpec {
            ns: self.ns_backend(i),
            peer: self.backend_peer_ifname(i),
            v4: backend_v4(i),
            v6: backend_v6(i),
            mac: backend_mac(i),
            mtu: LAB_MTU,
        }));
        hosts.extend(self.ns_flood().map(|ns| HostSpec {
            ns,
            peer: "v-fl".to_string(),
            v4: FLOOD_V4,
            v6: FLOOD_V6,
            mac: flood_mac(),
            mtu: CLIENT_MTU,
        }));
        hosts.extend(
            cluster::cluster_hosts(self)
                .into_iter()
                .map(|(ns, peer, v4, v6, mac)| HostSpec {
                    ns,
                    peer: peer.to_string(),
                    v4,
                    v6,
                    mac,
                    mtu: LAB_MTU,
                }),
        );
        Plan {
            bridge: self.ns_bridge(),
            client: self.ns_client(),
            lb: self.ns_lb(),
            backends: self.backend_namespaces(),
            flood: self.ns_flood(),
            hosts,
        }
    }

    /// Builds the whole lab; a failure leaves what was built to the caller's
    /// `Drop` (see [`Lab::up`]).
    pub(super) fn build(&self) -> Result<()> {
        let plan = self.plan();
        create_namespaces(&self.namespaces())?;
        create_bridge(&plan.bridge)?;
        for host in &plan.hosts {
            connect_host(&plan.bridge, host)?;
        }
        let gateways = self.vip_gateways();
        route_vips_via(&plan.client, gateways)?;
        for ns in std::iter::once(&plan.lb).chain(self.ns_node_b().as_ref()) {
            make_lb_a_host(ns)?;
            route_lb_to_vips(ns)?;
        }
        if let Some(rt) = self.ns_router() {
            cluster::make_router(&rt)?;
            cluster::ignore_redirects(&plan.client)?;
            for ns in &plan.backends {
                cluster::let_backend_relay(ns)?;
            }
        }
        for ns in &plan.backends {
            hold_vips(ns)?;
        }
        if let Some(flood) = &plan.flood {
            make_flooder(flood, &plan.backends, gateways)?;
        }
        self.wait_links_up()
    }

    fn wait_links_up(&self) -> Result<()> {
        let start = Instant::now();
        for ns in self.host_namespaces() {
            loop {
                let out = ip_in(&ns, &["-o", "link", "show", "dev", HOST_IFNAME])?;
                if out.contains("state UP") {
                    break;
                }
                if start.elapsed() > LINK_UP_TIMEOUT {
                    return Err(LabError::Timeout {
                        what: format!("{HOST_IFNAME} in {ns} to come up (last: {})", out.trim()),
                        after: LINK_UP_TIMEOUT,
                    });
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }
}

fn create_namespaces(namespaces: &[String]) -> Result<()> {
    for ns in namespaces {
        ip(&["netns", "add", ns])?;
        ip_in(ns, &["link", "set", "lo", "up"])?;
    }
    Ok(())
}

fn create_bridge(br: &str) -> Result<()> {
    // The bridge namespace only switches frames; no IPv6 link-local
    // chatter from its ports.
    sysctl_in(
        br,
        &[
            ("net.ipv6.conf.all.disable_ipv6", "1"),
            ("net.ipv6.conf.default.disable_ipv6", "1"),
        ],
    )?;
    let mtu = LAB_MTU.to_string();
    // STP off and forward_delay 0: ports forward as soon as they are up.
    // Multicast snooping off: neighbour discovery must reach every port
    // whatever the bridge has (not) learnt about MLD listeners.
    ip_in(
        br,
        &[
            "link",
            "add",
            BRIDGE_IFNAME,
            "mtu",
            &mtu,
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
            "mcast_snooping",
            "0",
        ],
    )?;
    ip_in(br, &["link", "set", BRIDGE_IFNAME, "up"])?;
    Ok(())
}

/// Gives `host` its eth0, plugged into the bridge in `br`, with its
/// addresses, and brings it up.
fn connect_host(br: &str, host: &HostSpec) -> Result<()> {
    // Addresses go on with nodad, but eth0's link-local would still
    // be tentative for a second; no DAD at all in the lab.
    sysctl_in(
        &host.ns,
        &[
            ("net.ipv6.conf.all.accept_dad", "0"),
            ("net.ipv6.conf.default.accept_dad", "0"),
        ],
    )?;
    add_veth(br, host)?;
    add_addresses(host)?;
    ip_in(&host.ns, &["link", "set", HOST_IFNAME, "up"])?;
    Ok(())
}

fn add_veth(br: &str, host: &HostSpec) -> Result<()> {
    // Created inside the namespaces directly, so nothing ever appears
    // in the root namespace and parallel labs cannot clash on names.
    ip_in(
        &host.ns,
        &[
            "link",
            "add",
            HOST_IFNAME,
            "mtu",
            &host.mtu.to_string(),
            "address",
            &format_mac(host.mac),
            "type",
            "veth",
            "peer",
            "name",
            &host.peer,
            "mtu",
            &LAB_MTU.to_string(),
            "netns",
            br,
        ],
    )?;
    ip_in(
        br,
        &["link", "set", &host.peer, "master", BRIDGE_IFNAME, "up"],
    )?;
    Ok(())
}

fn add_addresses(host: &HostSpec) -> Result<()> {
    let HostSpec { ns, v4, v6, .. } = host;
    ip_in(
        ns,
        &[
            "addr",
            "add",
            &format!("{v4}/{NET_V4_PREFIX}"),
            "dev",
            HOST_IFNAME,
        ],
    )?;
    ip_in(
        ns,
        &[
            "addr",
            "add",
            &format!("{v6}/{NET_V6_PREFIX}"),
            "dev",
            HOST_IFNAME,
            "nodad",
        ],
    )?;
    Ok(())
}

/// The client reaches the VIPs through `gw` (v4, v6): the LB, as through
/// a router, or the router of a two-node lab.
fn route_vips_via(client: &str, gw: (Ipv4Addr, Ipv6Addr)) -> Result<()> {
    ip_in(
        client,
        &[
            "route",
            "add",
            &format!("{VIP_NET_V4}/{VIP_NET_V4_PREFIX}"),
            "via",
            &gw.0.to_string(),
            "dev",
            HOST_IFNAME,
        ],
    )?;
    ip_in(
        client,
        &[
            "-6",
            "route",
            "add",
            &format!("{VIP_NET_V6}/{VIP_NET_V6_PREFIX}"),
            "via",
            &gw.1.to_string(),
            "dev",
            HOST_IFNAME,
        ],
    )?;
    Ok(())
}

fn make_lb_a_host(lb: &str) -> Result<()> {
    // The LB host never routes: forwarding is XDP's job, and a kernel
    // that forwarded would hide a data-plane bug.
    sysctl_in(
        lb,
        &[
            ("net.ipv4.ip_forward", "0"),
            ("net.ipv6.conf.all.forwarding", "0"),
        ],
    )
}

/// Data-path health probes: the LB host connects to the VIPs itself and
/// `xlb_hc` takes the marked packets on eth0's egress. So, like a real LB
/// host with its default route, it needs a route to the VIPs out of eth0
/// whose next hop resolves (an on-link route would wait forever for an ARP
/// answer nobody gives: backends ignore ARP for VIPs). The lab has no
/// router: the next hop is a fixed neighbour whose MAC nobody owns, so an
/// unmarked packet from the LB host to a VIP is flooded by the bridge and
/// dropped everywhere, as a real gateway would send it back to the LB's XDP
/// program (never to a backend directly). Replies from the VIP then also
/// pass strict rp_filter: their source routes back out of eth0.
fn route_lb_to_vips(lb: &str) -> Result<()> {
    let gw_mac = format_mac(LB_GW_MAC);
    for (family, gw, net) in [
        (
            "-4",
            LB_GW_V4.to_string(),
            format!("{VIP_NET_V4}/{VIP_NET_V4_PREFIX}"),
        ),
        (
            "-6",
            LB_GW_V6.to_string(),
            format!("{VIP_NET_V6}/{VIP_NET_V6_PREFIX}"),
        ),
    ] {
        ip_in(
            lb,
            &[
                family,
                "neigh",
                "add",
                &gw,
                "lladdr",
                &gw_mac,
                "dev",
                HOST_IFNAME,
                "nud",
                "permanent",
            ],
        )?;
        ip_in(
            lb,
            &[family, "route", "add", &net, "via", &gw, "dev", HOST_IFNAME],
        )?;
    }
    Ok(())
}

/// The flooding client: routes to the VIPs like the client's, its /64's
/// addresses on eth0, and every local port for its connects (a flood of
/// real connects ends in TIME_WAIT by the thousand). The backends answer
/// the /64 on-link: their replies go straight back over the segment (DSR),
/// and neighbour discovery finds the flooder's addresses there.
fn make_flooder(flood: &str, backends: &[String], gw: (Ipv4Addr, Ipv6Addr)) -> Result<()> {
    route_vips_via(flood, gw)?;
    for addr in flood_v6_sources() {
        ip_in(
            flood,
            &[
                "addr",
                "add",
                &format!("{addr}/{FLOOD_NET_V6_PREFIX}"),
                "dev",
                HOST_IFNAME,
                "nodad",
            ],
        )?;
    }
    sysctl_in(flood, &[("net.ipv4.ip_local_port_range", "1024 65535")])?;
    let net = format!("{FLOOD_NET_V6}/{FLOOD_NET_V6_PREFIX}");
    for ns in backends {
        ip_in(ns, &["-6", "route", "add", &net, "dev", HOST_IFNAME])?;
    }
    Ok(())
}

/// Puts the VIPs on backend `ns`'s `lo`, where decapsulated packets find
/// them, and keeps the backend quiet about them on the segment.
fn hold_vips(ns: &str) -> Result<()> {
    for vip in [
        format!("{VIP_V4}/32"),
        format!("{VIP2_V4}/32"),
        format!("{VIP_V6}/128"),
    ] {
        ip_in(ns, &["addr", "add", &vip, "dev", "lo"])?;
    }
    sysctl_in(
        ns,
        &[
            // Answer ARP only for addresses on the receiving interface
            // (not the VIPs on lo), and source ARP from eth0's own
            // address: the LB alone owns the VIPs on the segment.
            ("net.ipv4.conf.all.arp_ignore", "1"),
            ("net.ipv4.conf.eth0.arp_ignore", "1"),
            ("net.ipv4.conf.all.arp_announce", "2"),
            ("net.ipv4.conf.eth0.arp_announce", "2"),
            // Decapsulated packets (client → VIP) arrive on eth0; no
            // reverse-path check may drop them. The effective value
            // is max(all, iface), so both.
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
            ("net.ipv4.conf.eth0.rp_filter", "0"),
            ("net.ipv4.conf.lo.rp_filter", "0"),
        ],
    )
}
