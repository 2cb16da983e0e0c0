//! The namespace lab itself. Needs root; skipped (with a message) otherwise.
//! Each test uses its own prefix so they can run in parallel, and its `Lab`
//! (a Drop guard) removes the namespaces however the test ends.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::{
    net::{IpAddr, SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use nix::{sys::wait::WaitPidFlag, sys::wait::waitpid, unistd::Pid};
use xlb_lab::{
    client::{LoadOptions, Outcome, run_load},
    topology::{self, Lab, LabConfig, in_netns, list_namespaces, ping, sysctl_get},
};

const PING_TIMEOUT: Duration = Duration::from_secs(1);

/// Unique per test process and test, so parallel runs do not collide.
fn prefix(test: char) -> String {
    format!("xlbt{}{test}", std::process::id() % 1000)
}

fn root_or_skip(test: &str) -> bool {
    if topology::is_root() {
        return true;
    }
    eprintln!("skipping {test}: the namespace lab needs root");
    false
}

fn lab_namespaces(prefix: &str) -> Vec<String> {
    list_namespaces()
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .collect()
}

fn ip_out(args: &[&str]) -> String {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_wired(lab: &Lab) {
    let cases: [(&str, String, IpAddr); 6] = [
        ("client → b1 v4", lab.ns_client(), lab.backend_v4(1).into()),
        ("client → b1 v6", lab.ns_client(), lab.backend_v6(1).into()),
        ("client → lb v4", lab.ns_client(), lab.lb_v4().into()),
        ("client → lb v6", lab.ns_client(), lab.lb_v6().into()),
        ("lb → b3 v4", lab.ns_lb(), lab.backend_v4(3).into()),
        ("b2 → client v6", lab.ns_backend(2), lab.client_v6().into()),
    ];
    for (name, ns, dst) in cases {
        ping(&ns, dst, PING_TIMEOUT).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn up_builds_the_segment_and_drop_removes_it() {
    if !root_or_skip("up_builds_the_segment_and_drop_removes_it") {
        return;
    }
    let p = prefix('a');
    let lab = Lab::up(&LabConfig::with_prefix(&p)).unwrap();
    assert_eq!(lab_namespaces(&p).len(), 6, "br, cl, lb, b1..b3");
    assert_wired(&lab);

    // Every backend holds the VIPs on lo.
    for ns in lab.backend_namespaces() {
        let lo = ip_out(&["-n", &ns, "-o", "addr", "show", "dev", "lo"]);
        for vip in ["10.100.0.1/32", "10.100.0.2/32", "fd00:100::1/128"] {
            assert!(lo.contains(vip), "{ns} lo lacks {vip}: {lo}");
        }
    }
    // The client reaches the VIPs via the LB.
    let cl = lab.ns_client();
    let route = ip_out(&["-n", &cl, "route", "get", "10.100.0.1"]);
    assert!(route.contains("via 10.99.0.2 dev eth0"), "{route}");
    let route = ip_out(&["-n", &cl, "-6", "route", "get", "fd00:100::1"]);
    assert!(route.contains("via fd00:99::2 dev eth0"), "{route}");

    let sysctls = [
        (lab.ns_lb(), "net.ipv4.ip_forward", "0"),
        (lab.ns_lb(), "net.ipv6.conf.all.forwarding", "0"),
        (lab.ns_backend(1), "net.ipv4.conf.all.arp_ignore", "1"),
        (lab.ns_backend(1), "net.ipv4.conf.eth0.arp_announce", "2"),
        (lab.ns_backend(3), "net.ipv4.conf.all.rp_filter", "0"),
        (lab.ns_backend(3), "net.ipv4.conf.eth0.rp_filter", "0"),
    ];
    for (ns, key, want) in sysctls {
        assert_eq!(sysctl_get(&ns, key).unwrap(), want, "{ns} {key}");
    }

    let links = [
        (lab.ns_client(), "eth0", "mtu 1500", "02:99:00:00:00:10"),
        (lab.ns_lb(), "eth0", "mtu 1600", "02:99:00:00:00:02"),
        (lab.ns_backend(2), "eth0", "mtu 1600", "02:99:00:00:00:12"),
        (
            lab.ns_bridge(),
            lab.lb_peer_ifname(),
            "mtu 1600",
            "master br0",
        ),
        (lab.ns_bridge(), "v-cl", "mtu 1600", "master br0"),
    ];
    for (ns, dev, mtu, also) in links {
        let l = ip_out(&["-n", &ns, "-o", "link", "show", "dev", dev]);
        assert!(
            l.contains(mtu) && l.contains(also),
            "{ns} {dev}: want {mtu}, {also}: {l}"
        );
    }
    assert!(topology::ifindex(&lab.ns_lb(), "eth0").unwrap() > 1);

    // In-process code can use the namespaces: a listener in b2, a connect
    // from the client.
    let addr = SocketAddr::new(lab.backend_v4(2).into(), 0);
    let listener = in_netns(&lab.ns_backend(2), || TcpListener::bind(addr))
        .unwrap()
        .unwrap();
    let addr = listener.local_addr().unwrap();
    in_netns(&cl, || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(1))
    })
    .unwrap()
    .expect("client connects to a listener in b2 over the bridge");
    drop(listener);

    drop(lab);
    assert_eq!(lab_namespaces(&p), Vec::<String>::new());
}

/// The flooding client: a namespace of its own on the segment, its /64's
/// addresses on eth0, and backends that answer those addresses directly.
#[test]
fn flooder_gets_a_namespace_and_a_64_the_backends_reach() {
    if !root_or_skip("flooder_gets_a_namespace_and_a_64_the_backends_reach") {
        return;
    }
    let p = prefix('f');
    let lab = Lab::up(&LabConfig {
        flooder: true,
        ..LabConfig::with_prefix(&p)
    })
    .unwrap();
    assert_eq!(lab_namespaces(&p).len(), 7, "br, cl, lb, b1..b3, fl");
    let fl = lab.ns_flood().expect("a flood namespace");
    assert_eq!(fl, format!("{p}-fl"));
    assert_wired(&lab);
    ping(&fl, lab.backend_v4(1).into(), PING_TIMEOUT).unwrap();
    ping(&fl, lab.backend_v6(2).into(), PING_TIMEOUT).unwrap();
    let addrs = ip_out(&["-n", &fl, "-o", "addr", "show", "dev", "eth0"]);
    for want in [
        "10.99.0.9/24",
        "fd00:99::9/64",
        "fd00:99:0:1::1/64",
        "fd00:99:0:1::40/64",
    ] {
        assert!(addrs.contains(want), "{fl} eth0 lacks {want}: {addrs}");
    }
    let route = ip_out(&["-n", &fl, "-6", "route", "get", "fd00:100::1"]);
    assert!(route.contains("via fd00:99::2 dev eth0"), "{route}");
    assert_eq!(
        sysctl_get(&fl, "net.ipv4.ip_local_port_range")
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["1024", "65535"]
    );

    // A connection from each end of the /64 reaches b1, whose answers find
    // their way back (on-link route and neighbour discovery).
    let listen = SocketAddr::new(lab.backend_v6(1).into(), 0);
    let listener = in_netns(&lab.ns_backend(1), || TcpListener::bind(listen))
        .unwrap()
        .unwrap();
    let to = listener.local_addr().unwrap();
    for src in [lab.flood_v6_sources()[0], lab.flood_v6_sources()[63]] {
        let stream = in_netns(&fl, || {
            let s = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None)?;
            s.bind(&SocketAddr::new(src.into(), 0).into())?;
            s.connect_timeout(&to.into(), Duration::from_secs(1))?;
            Ok::<_, std::io::Error>(TcpStream::from(s))
        })
        .unwrap()
        .unwrap_or_else(|e| panic!("connect from {src}: {e}"));
        let (_, peer) = listener.accept().unwrap();
        assert_eq!(peer.ip(), IpAddr::from(src));
        drop(stream);
    }
    drop(lab);
    assert_eq!(lab_namespaces(&p), Vec::<String>::new());
}

#[test]
fn backends_never_answer_arp_or_nd_for_the_vips() {
    if !root_or_skip("backends_never_answer_arp_or_nd_for_the_vips") {
        return;
    }
    let lab = Lab::up(&LabConfig::with_prefix(prefix('b'))).unwrap();
    let cl = lab.ns_client();
    let cases: [(&str, IpAddr, &str); 2] = [
        ("arp for the v4 VIP", lab.vip2_v4().into(), "10.100.0.2/32"),
        ("nd for the v6 VIP", lab.vip_v6().into(), "fd00:100::1/128"),
    ];
    for (name, vip, route) in cases {
        // Take the LB out of the path: ask the segment directly who has the VIP.
        ip_out(&["-n", &cl, "route", "add", route, "dev", "eth0"]);
        let r = ping(&cl, vip, PING_TIMEOUT);
        assert!(r.is_err(), "{name}: a backend answered for the VIP");
        let neigh = ip_out(&["-n", &cl, "neigh", "show", &vip.to_string()]);
        assert!(
            !neigh.contains("lladdr"),
            "{name}: neighbour entry resolved: {neigh}"
        );
    }
    // The backends do answer for their own addresses.
    assert_wired(&lab);
}

#[test]
fn up_replaces_a_kept_or_interrupted_lab() {
    if !root_or_skip("up_replaces_a_kept_or_interrupted_lab") {
        return;
    }
    let p = prefix('c');
    let cfg = LabConfig::with_prefix(&p);
    let mut first = Lab::up(&cfg).unwrap();
    let sleeper = first
        .spawn_in(&first.ns_backend(1), "sleep", ["300"])
        .unwrap();
    assert!(first.is_running(sleeper));
    // As if the run that built it had been killed: nothing torn down.
    first.keep();
    drop(first);
    assert_eq!(lab_namespaces(&p).len(), 6);
    let attached = Lab::attach(&cfg).unwrap();
    assert_wired(&attached);
    drop(attached);
    assert_eq!(lab_namespaces(&p).len(), 6, "an attached lab is kept");

    let second = Lab::up(&cfg).unwrap();
    assert_wired(&second);
    // The leftover process was killed; it is our child, so reap it (bounded).
    let pid = Pid::from_raw(sleeper as i32);
    let reaped = (0..200).any(|_| match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
        Ok(nix::sys::wait::WaitStatus::StillAlive) => {
            std::thread::sleep(Duration::from_millis(10));
            false
        }
        _ => true,
    });
    assert!(reaped, "process left in the old lab was killed by up");

    // Spawned processes die with the lab.
    let server = second
        .spawn_in(&second.ns_backend(2), "sleep", ["300"])
        .unwrap();
    assert!(second.is_running(server));
    drop(second);
    assert!(
        !std::path::Path::new(&format!("/proc/{server}")).exists(),
        "killed and reaped on drop"
    );
    assert_eq!(lab_namespaces(&p), Vec::<String>::new());
    Lab::down(&p).expect("down with nothing left is fine");
}

#[test]
fn backend_and_client_binaries_work_across_the_bridge() {
    if !root_or_skip("backend_and_client_binaries_work_across_the_bridge") {
        return;
    }
    let lab = Lab::up(&LabConfig {
        backends: 1,
        ..LabConfig::with_prefix(prefix('d'))
    })
    .unwrap();
    let b1 = lab.ns_backend(1);
    lab.spawn_in(
        &b1,
        env!("CARGO_BIN_EXE_xlb-backend"),
        [
            "--name",
            "b1",
            "--listen",
            "0.0.0.0:80",
            "--listen",
            "[::]:80",
            "--admin",
            "0.0.0.0:9000",
        ],
    )
    .unwrap();
    let targets: [(&str, SocketAddr); 3] = [
        ("v4", SocketAddr::new(lab.backend_v4(1).into(), 80)),
        ("v6", SocketAddr::new(lab.backend_v6(1).into(), 80)),
        // The VIP is local on b1 too (it is what the LB will deliver to).
        ("vip on b1", SocketAddr::new(lab.vip_v4().into(), 80)),
    ];
    let ready = (0..100).any(|_| {
        let up = in_netns(&lab.ns_client(), || {
            TcpStream::connect_timeout(&targets[0].1, Duration::from_millis(100)).is_ok()
        })
        .unwrap();
        if !up {
            std::thread::sleep(Duration::from_millis(20));
        }
        up
    });
    assert!(ready, "xlb-backend in {b1} did not come up within ~10 s");
    for (name, target) in targets {
        let ns = if name == "vip on b1" {
            b1.clone()
        } else {
            lab.ns_client()
        };
        let report = in_netns(&ns, || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(run_load(LoadOptions {
                duration: Duration::from_millis(300),
                rate: 50,
                keepalive: 1,
                ..LoadOptions::new(target)
            }))
        })
        .unwrap()
        .unwrap();
        let s = &report.summary;
        assert!(s.requests >= 15, "{name}: {}", report.render_text());
        assert_eq!(
            s.counts.get(Outcome::Ok),
            s.requests,
            "{name}: {}",
            report.render_text()
        );
        assert_eq!(s.per_backend.get("b1"), Some(&s.requests), "{name}");
    }
}
