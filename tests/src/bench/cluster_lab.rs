//! `xlb-cluster-bench` in the two-node lab: node A dies while held
//! connections run through both nodes, and a VIP's only backend fails and
//! heals while the router's routes are watched. What it computes from that
//! is [`super::cluster`]; this drives the lab.

use std::{
    net::{IpAddr, SocketAddr},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use xlb_lab::{
    Fault,
    held::{HeldOptions, HeldReport, start_held_in},
    route_watch::RouteWatch,
    scenario::{
        ClusterOptions, ClusterRun, Event, Health, Mode, Protection, Speaker, XlbConfig,
        parse_events,
    },
    topology::Node,
};

use super::cluster::{Death, Latencies, NodeChange, Timers, latencies};

/// The VIP the held connections go to (dsr-ipip, three backends).
pub const HELD_VIP: &str = "api";

/// The VIP whose announcement is timed: backend 3 only, so failing b3
/// makes it unservable (and b1, b2 keep `api` announced); protection off,
/// so that no panic mode keeps it "serving" with every backend down.
pub const LATENCY_VIP: &str = "api2";

/// The backend [`LATENCY_VIP`] has.
const LATENCY_BACKEND: usize = 3;

/// A connection that waited longer than this for its next answer lost a
/// packet (the first TCP retransmission comes after 200 ms at the least,
/// RFC 6298 and Linux's `TCP_RTO_MIN`): it went through what broke.
pub const WAITED: Duration = Duration::from_millis(200);

/// Held connections run this long before the death, to be spread and
/// answering.
const SETTLE: Duration = Duration::from_millis(1500);

/// How long a round waits for the router to drop node A, per timers.
fn detection_bound(timers: Timers, death: Death) -> Duration {
    match (timers, death) {
        // A closed session or a withdrawal reaches the router at once.
        (_, Death::Process | Death::Graceful) => Duration::from_secs(10),
        (Timers::Bfd, Death::Silent) => Duration::from_secs(5),
        (Timers::BirdDefaults, Death::Silent) => {
            Duration::from_secs(super::cluster::BIRD_DEFAULT_HOLD_S + 30)
        }
    }
}

/// How long after the router moved every flow to node B the round goes on,
/// for the last connections to come back (TCP's retransmissions back off
/// to 1.6 s after four losses).
const AFTER_SWITCH: Duration = Duration::from_secs(3);

/// Bound on node A coming back (daemon start, BGP connect delay, routes).
const RETURN_BOUND: Duration = Duration::from_secs(40);

/// What the benchmark's labs run: the lab's VIPs and health checks, with
/// [`LATENCY_VIP`] on [`LATENCY_BACKEND`] alone.
pub fn config(prefix: &str) -> XlbConfig {
    let mut cfg = XlbConfig::lab_default(prefix, Mode::DsrIpip, 3);
    cfg.health = Health::default();
    if let Some(v) = cfg.vips.iter_mut().find(|v| v.name == LATENCY_VIP) {
        v.backends = vec![LATENCY_BACKEND];
        v.protection = Some(Protection::off());
    }
    cfg
}

/// Brings a two-node lab up with `timers`: BFD is a lab option; BIRD's
/// default hold and keepalive times are the lab's configuration without
/// its short ones, reloaded into every BIRD (a BGP protocol whose timers
/// change restarts, and negotiates the new ones).
pub fn up(prefix: &str, timers: Timers) -> Result<ClusterRun> {
    let xlb = crate::lab::xlb_binary();
    let mut opts = ClusterOptions::new(prefix, &xlb);
    opts.config = config(prefix);
    opts.bfd = timers == Timers::Bfd;
    // Both nodes announce through xlb's `[announce]` (the lab's default).
    opts.announce = true;
    let c = ClusterRun::up(&opts).with_context(|| format!("two-node lab {prefix} up"))?;
    if timers == Timers::BirdDefaults {
        use_bird_default_timers(&c)?;
    }
    let vip = vip_addr(&c, HELD_VIP)?;
    c.wait_router(vip.ip(), &[Node::A, Node::B], Duration::from_secs(30))
        .context("both nodes announcing the held VIP")?;
    Ok(c)
}

/// Strips the lab's `hold time` and `keepalive time` from every BIRD's
/// configuration and reloads it, then waits for the sessions.
fn use_bird_default_timers(c: &ClusterRun) -> Result<()> {
    for s in [
        Speaker::Router,
        Speaker::Node(Node::A),
        Speaker::Node(Node::B),
    ] {
        let conf = c.bird_files(s).conf;
        let text = std::fs::read_to_string(&conf)
            .with_context(|| format!("reading {}", conf.display()))?;
        std::fs::write(&conf, without_timers(&text))
            .with_context(|| format!("writing {}", conf.display()))?;
        let out = c.birdc(s, &["configure"])?;
        // "Reconfigured", or "Reconfiguration in progress" while the BGP
        // protocols whose timers changed restart.
        if !out.contains("Reconfigur") {
            bail!("birdc configure ({}): {out}", s.role());
        }
    }
    c.wait_sessions(&[Node::A, Node::B], Duration::from_secs(30))?;
    let shown = c.birdc(Speaker::Router, &["show", "protocols", "all"])?;
    println!("  BGP hold timers on the router: {}", hold_timers(&shown));
    Ok(())
}

/// A BIRD configuration without its `hold time` and `keepalive time`
/// lines: BIRD's defaults (240 s, a third of it) apply.
pub fn without_timers(text: &str) -> String {
    text.lines()
        .filter(|l| {
            let t = l.trim_start();
            !(t.starts_with("hold time") || t.starts_with("keepalive time"))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The negotiated hold times (`Hold timer: 1.2/240`) in `birdc show
/// protocols all`, for the report.
pub fn hold_timers(shown: &str) -> String {
    let v: Vec<&str> = shown
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Hold timer:"))
        .filter_map(|t| t.trim().rsplit('/').next())
        .collect();
    if v.is_empty() {
        "(not shown)".to_string()
    } else {
        format!("{} s", v.join(" s, "))
    }
}

/// The address and port of `vip` as node A runs it.
pub fn vip_addr(c: &ClusterRun, vip: &str) -> Result<SocketAddr> {
    let status = c.status(Node::A)?;
    let v = status
        .vip(vip)
        .with_context(|| format!("node A has no VIP {vip}: {}", status.summary()))?;
    let ip: IpAddr = v
        .address
        .parse()
        .with_context(|| format!("VIP {vip}: address {:?}", v.address))?;
    Ok(SocketAddr::new(ip, v.port))
}

/// What one death did.
#[derive(Debug, Clone)]
pub struct Round {
    /// From the death to the router sending the VIP to node B alone.
    pub router_ms: u64,
    pub report: HeldReport,
    /// The death on the held connections' clock.
    pub death_ms: u64,
    /// Node A back, on the same clock.
    pub back_ms: u64,
}

/// How node A is dead, until [`Dead::revive`].
enum Dead {
    Process,
    Silent(xlb_lab::topology::LinkSilencer),
    Graceful,
}

fn kill(c: &mut ClusterRun, death: Death) -> Result<Dead> {
    Ok(match death {
        Death::Process => {
            c.kill_node(Node::A)?;
            Dead::Process
        }
        Death::Silent => Dead::Silent(c.lab().silence_link(Node::A)?),
        Death::Graceful => {
            c.ctl(Node::A, &["withdraw", "--all", "--reason", "benchmark"])?;
            Dead::Graceful
        }
    })
}

impl Dead {
    fn revive(self, c: &mut ClusterRun) -> Result<()> {
        match self {
            Dead::Process => {
                c.start_daemon(Node::A)?;
                c.start_bird(Speaker::Node(Node::A))?;
            }
            Dead::Silent(silencer) => drop(silencer),
            Dead::Graceful => {
                c.ctl(Node::A, &["announce", "--all"])?;
            }
        }
        Ok(())
    }
}

/// Node A dies with `death` while `connections` held connections run
/// through both nodes, and comes back; returns what the connections saw.
pub fn round(c: &mut ClusterRun, timers: Timers, death: Death, connections: u32) -> Result<Round> {
    let target = vip_addr(c, HELD_VIP)?;
    let mut opts = HeldOptions::new(target, connections);
    opts.duration = Duration::from_secs(600);
    let held = start_held_in(&c.lab().ns_client(), opts)?;
    thread::sleep(SETTLE);
    let death_ms = held.now_ms();
    let t0 = Instant::now();
    let dead = kill(c, death)?;
    let switched = c.wait_router(target.ip(), &[Node::B], detection_bound(timers, death));
    let router_ms = t0.elapsed().as_millis() as u64;
    thread::sleep(AFTER_SWITCH);
    let revived = dead.revive(c);
    let back = revived.and_then(|()| {
        c.wait_router(target.ip(), &[Node::A, Node::B], RETURN_BOUND)
            .map_err(Into::into)
    });
    let back_ms = held.now_ms();
    // Long enough after node A's return for connections moved back to it
    // to show whether they kept going.
    thread::sleep(Duration::from_secs(2));
    held.stop();
    let report = held.join()?;
    switched.context("the router dropping node A")?;
    back.context("node A back on the router")?;
    Ok(Round {
        router_ms,
        report,
        death_ms,
        back_ms,
    })
}

/// Node A's or B's daemon events since `after` (seq).
fn events(c: &ClusterRun, node: Node, after: u64) -> Result<Vec<Event>> {
    let out = c.ctl(node, &["events", "--json"])?;
    let all = parse_events(&out).map_err(|e| anyhow::anyhow!("xlb events of {node:?}: {e}"))?;
    Ok(all.into_iter().filter(|e| e.seq > after).collect())
}

/// The backend transitions of [`LATENCY_VIP`] that made it unservable
/// (`withdraw`) or servable again, one per phase of each node: the last
/// transition away from `up` before the VIP was withdrawn, the first to
/// `up` after.
fn node_changes(evs: &[Event], node: Node, withdraw: bool) -> Option<NodeChange> {
    let of_vip = evs
        .iter()
        .filter(|e| e.kind == "transition" && e.vip.as_deref() == Some(LATENCY_VIP));
    let at = if withdraw {
        of_vip
            .filter(|e| e.to.as_deref() != Some("up"))
            .map(|e| e.at_unix_ms)
            .max()
    } else {
        of_vip
            .filter(|e| e.to.as_deref() == Some("up"))
            .map(|e| e.at_unix_ms)
            .min()
    }?;
    Some(NodeChange {
        node: format!("{node:?}"),
        next_hop: IpAddr::V4(node.v4()),
        at_unix_ms: at,
        withdraw,
    })
}

/// `cycles` times: [`LATENCY_BACKEND`] fails (503 to every probe) until
/// both nodes withdrew [`LATENCY_VIP`], then heals until both announce it;
/// every node's change timed against the router's route change.
pub fn latency_cycles(c: &ClusterRun, cycles: usize) -> Result<Latencies> {
    let vip = vip_addr(c, LATENCY_VIP)?.ip();
    let dst = vip.to_string();
    let watch = RouteWatch::start(&c.lab().ns_router().context("no router")?)?;
    let mut node_changes_all = Vec::new();
    let last_seq =
        |n: Node| -> Result<u64> { Ok(events(c, n, 0)?.iter().map(|e| e.seq).max().unwrap_or(0)) };
    for cycle in 0..cycles {
        for (fault, withdraw, want) in [
            (Fault::Error503, true, &[][..]),
            (Fault::None, false, &[Node::A, Node::B][..]),
        ] {
            let seqs = [last_seq(Node::A)?, last_seq(Node::B)?];
            c.run().set_fault(LATENCY_BACKEND, fault)?;
            c.wait_router(vip, want, Duration::from_secs(20))
                .with_context(|| format!("cycle {cycle}: the router's route to {dst}"))?;
            for (n, seq) in [Node::A, Node::B].into_iter().zip(seqs) {
                match node_changes(&events(c, n, seq)?, n, withdraw) {
                    Some(ch) => node_changes_all.push(ch),
                    None => println!("  cycle {cycle}: node {n:?} logged no transition"),
                }
            }
        }
    }
    // The last route message may still be in the pipe.
    thread::sleep(Duration::from_millis(200));
    Ok(latencies(&node_changes_all, &watch.changes(), &dst))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_timers_drop_only_the_lab_timers() {
        let text = "template bgp n {\n\tlocal as 65001;\n\thold time 3;\n\tkeepalive time 1;\n\
                    \tconnect delay time 1;\n\t#bfd on;\n}\n";
        assert_eq!(
            without_timers(text),
            "template bgp n {\n\tlocal as 65001;\n\tconnect delay time 1;\n\t#bfd on;\n}\n"
        );
    }

    #[test]
    fn hold_timers_are_read_from_birdc() {
        let shown = "node_a4    BGP        ---        up     16:00:00.000  Established\n\
                     \x20 BGP state:          Established\n\
                     \x20   Hold timer:       221.123/240\n\
                     \x20   Keepalive timer:  12.000/80\n\
                     node_b4    BGP ...\n\
                     \x20   Hold timer:       3.000/240\n";
        assert_eq!(hold_timers(shown), "240 s, 240 s");
        assert_eq!(hold_timers("nothing"), "(not shown)");
    }

    #[test]
    fn node_changes_take_the_last_exit_and_the_first_return() {
        // Built from JSON as `xlb events --json` prints them, so that
        // fields the protocol adds later do not break the test.
        let ev = |seq: u64, at: u64, vip: &str, to: &str| {
            let json = format!(
                "[{{\"seq\":{seq},\"at_unix_ms\":{at},\"kind\":\"transition\",\"vip\":\"{vip}\",\
                 \"backend\":null,\"from\":null,\"to\":\"{to}\",\"reason\":\"\",\
                 \"table_build_us\":null,\"table_slots_changed\":null}}]"
            );
            parse_events(&json).unwrap().remove(0)
        };
        let evs = [
            ev(1, 100, LATENCY_VIP, "down"),
            ev(2, 130, "api", "down"),
            ev(3, 120, LATENCY_VIP, "down"),
            ev(4, 500, LATENCY_VIP, "up"),
            ev(5, 600, LATENCY_VIP, "up"),
        ];
        let w = node_changes(&evs[..3], Node::B, true).unwrap();
        assert_eq!((w.at_unix_ms, w.withdraw), (120, true), "api's is not ours");
        assert_eq!(w.next_hop, IpAddr::V4(Node::B.v4()));
        let a = node_changes(&evs[3..], Node::A, false).unwrap();
        assert_eq!(a.at_unix_ms, 500);
        assert_eq!(node_changes(&evs[1..2], Node::A, true), None);
    }
}
