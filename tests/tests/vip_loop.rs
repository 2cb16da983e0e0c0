//! The routing loop of issue 24, in the lab with a real router: a packet to
//! a VIP address that no VIP balances must cross the uplink at most once.
//!
//! The lab's LB routes the VIP prefix to a next hop (10.99.0.1) that no host
//! answers for; here a router namespace `{prefix}-rt` takes that address and
//! MAC, forwards, and routes the VIP prefix back to the LB (10.99.0.2), as an
//! upstream router does. `xlb run` turns forwarding on for the LB's
//! interface (`bpf_fib_lookup` needs it), so a packet to a VIP address that
//! the XDP program passes is forwarded by the LB's kernel to the router,
//! which sends it back: with TTL 255, some 127 round trips (the review
//! counted 254 forwards for one datagram and one SYN). The router's
//! `ForwDatagrams` (`/proc/net/snmp`) counts them.
//!
//! Needs root and the binaries, like `e2e.rs`:
//! `cargo test -p xlb-tests --test vip_loop -- --nocapture`.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    process::Command,
    thread,
    time::Duration,
};

use xlb_lab::{
    scenario::{Health, LabRun, Mode, Vip, XlbConfig},
    topology::{self, Lab},
};
use xlb_tests::lab::{serial, teardown, up};

/// A VIP port no VIP of the lab uses.
const UNBALANCED_PORT: u16 = 81;

/// How long the loop, if there is one, is given to play out: 127 round
/// trips over veths take well under a millisecond each.
const SETTLE: Duration = Duration::from_millis(500);

/// How stale `xlb status` counters may be (one daemon tick, plus margin).
const COUNTER_TICK: Duration = Duration::from_millis(1500);

/// The router namespace: removed on drop, however the test ends (the
/// lab's own teardown knows only its roles).
struct Router {
    ns: String,
}

impl Router {
    /// Plugs `{prefix}-rt` into the lab's bridge as the LB's next hop for
    /// the VIP prefix: its address and MAC, forwarding on, the VIP prefix
    /// routed back to the LB.
    fn add(lab: &Lab) -> Router {
        let router = Router {
            ns: format!("{}-rt", lab.prefix()),
        };
        let ns = router.ns.as_str();
        let br = lab.ns_bridge();
        let gw_mac = topology::format_mac(topology::LB_GW_MAC);
        let gw = format!("{}/{}", topology::LB_GW_V4, topology::NET_V4_PREFIX);
        let vips = format!("{}/{}", topology::VIP_NET_V4, topology::VIP_NET_V4_PREFIX);
        let lb = topology::LB_V4.to_string();
        ip(&["netns", "add", ns]);
        for args in [
            &["link", "set", "lo", "up"][..],
            &[
                "link", "add", "eth0", "address", &gw_mac, "type", "veth", "peer", "name", "v-rt",
                "netns", &br,
            ],
            &["addr", "add", &gw, "dev", "eth0"],
            &["link", "set", "eth0", "up"],
        ] {
            ip(&[&["-n", ns][..], args].concat());
        }
        ip(&[
            "-n",
            &br,
            "link",
            "set",
            "v-rt",
            "master",
            topology::BRIDGE_IFNAME,
            "up",
        ]);
        // Redirects off: the router's own ICMP is not what is counted.
        run(Lab::exec(
            ns,
            [
                "sysctl",
                "-q",
                "-w",
                "net.ipv4.ip_forward=1",
                "net.ipv4.conf.all.send_redirects=0",
                "net.ipv4.conf.eth0.send_redirects=0",
            ],
        ));
        ip(&["-n", ns, "route", "add", &vips, "via", &lb, "dev", "eth0"]);
        router
    }

    /// IPv4 datagrams the router has forwarded (`Ip: ForwDatagrams`).
    fn forwarded(&self) -> u64 {
        forwarded_in(&self.ns)
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        // Deleting the namespace deletes its veth and the peer on the bridge.
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

fn run(mut cmd: Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip(args: &[&str]) {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    run(cmd);
}

/// `Ip: ForwDatagrams` of namespace `ns` (`/proc/net/snmp`, whose first
/// `Ip:` line names the fields and the second holds the values).
fn forwarded_in(ns: &str) -> u64 {
    let snmp = run(Lab::exec(ns, ["cat", "/proc/net/snmp"]));
    let mut ip_lines = snmp.lines().filter(|l| l.starts_with("Ip:"));
    let (names, values) = (ip_lines.next().unwrap(), ip_lines.next().unwrap());
    let at = names
        .split_whitespace()
        .position(|n| n == "ForwDatagrams")
        .expect("ForwDatagrams in /proc/net/snmp");
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}

/// One UDP datagram with TTL 255 from the client to `vip`:`port`.
fn send_udp(lab: &Lab, vip: Ipv4Addr, port: u16) {
    topology::in_netns(&lab.ns_client(), || {
        let s = UdpSocket::bind((topology::CLIENT_V4, 0)).unwrap();
        s.set_ttl(255).unwrap();
        s.send_to(b"a datagram no VIP balances", (vip, port))
            .unwrap();
    })
    .unwrap();
}

/// One TCP SYN with TTL 255 from the client to `vip`:`port`, sent whole on
/// a raw socket (a connect would retransmit it).
fn send_syn(lab: &Lab, vip: Ipv4Addr, port: u16) {
    let mut p = xlb_lab::flood::tcp_packet(
        SocketAddrV4::new(topology::CLIENT_V4, 40_001),
        SocketAddrV4::new(vip, port),
        0x02,
        1,
        0,
    );
    p[8] = 255;
    p[10..12].fill(0);
    let sum = topology::inet_checksum(&p[..20]);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    topology::in_netns(&lab.ns_client(), || {
        // SAFETY: plain socket calls on a descriptor this closure owns.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW);
            assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
            let to = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: 0,
                sin_addr: libc::in_addr {
                    s_addr: u32::from(vip).to_be(),
                },
                sin_zero: [0; 8],
            };
            let n = libc::sendto(
                fd,
                p.as_ptr().cast(),
                p.len(),
                0,
                (&raw const to).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            );
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            assert_eq!(n, p.len() as isize, "sendto: {err}");
        }
    })
    .unwrap();
}

fn lab_up(prefix: &str) -> LabRun {
    let vip = Vip::new("api", topology::VIP_V4.into(), 80, Mode::DsrIpip, 3);
    let cfg = XlbConfig {
        health: Health::default(),
        vips: vec![vip],
        ..XlbConfig::for_prefix(prefix)
    };
    up(prefix, &cfg)
}

/// One UDP datagram and one SYN to port 81 of a VIP address (TTL 255),
/// where only port 80 is balanced: the router forwards each at most once
/// (today none: the LB drops them in XDP, `drop_vip_unbalanced`), where
/// the LB used to pass them into a loop between itself and the router.
#[test]
fn unbalanced_vip_traffic_does_not_loop_through_the_router() {
    let _serial = serial();
    let p = format!("loop{}", std::process::id() % 1000);
    let run = lab_up(&p);
    let router = Router::add(run.lab());
    let lb_ns = run.lab().ns_lb();
    let vip = topology::VIP_V4;

    let (router0, lb0) = (router.forwarded(), forwarded_in(&lb_ns));
    let drops0 = run.counter("drop_vip_unbalanced").unwrap();
    send_udp(run.lab(), vip, UNBALANCED_PORT);
    send_syn(run.lab(), vip, UNBALANCED_PORT);
    thread::sleep(SETTLE);
    let by_router = router.forwarded() - router0;
    let by_lb = forwarded_in(&lb_ns) - lb0;
    eprintln!(
        "[{p}] one datagram and one SYN to {vip}:{UNBALANCED_PORT}, TTL 255: \
         the router forwarded {by_router}, the LB's kernel {by_lb}"
    );
    assert!(
        by_router <= 2,
        "the router forwarded {by_router} packets for 2 sent: they loop between the LB \
         (which passed them to its kernel, which routed them back, {by_lb} times) and the router"
    );
    thread::sleep(COUNTER_TICK);
    let drops = run.counter("drop_vip_unbalanced").unwrap() - drops0;
    assert_eq!(drops, 2, "drop_vip_unbalanced grew by {drops}, want 2");

    // Echo to the VIP address is still answered, by XDP.
    let pong = topology::ping(&run.lab().ns_client(), vip.into(), Duration::from_secs(2));
    assert!(pong.is_ok(), "ping to the VIP: {pong:?}");

    drop(router);
    teardown(run);
}
