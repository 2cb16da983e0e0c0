//! Packet fixtures, Katran-style: a table of named cases, each with map
//! state, an input frame, the expected verdict, the expected output bytes and
//! the expected counter deltas, run through `BPF_PROG_TEST_RUN`.
//!
//! Expected bytes come from `xlb_tests::packet`, written independently of the
//! data plane; the expected backend of a forwarded flow is computed in
//! userspace with `lb_common::flow_hash` and the ring read back from the map,
//! so every forwarding case also proves the kernel and userspace hash agree.

use std::net::IpAddr;

use lb_common::{
    BACKEND_DOWN, BACKEND_DRAINING, CtEntry, DOWN_POLICY_KEEP, DOWN_POLICY_REHASH, DecapAddrKey,
    MODE_DSR_IPIP, MODE_DSR_L2, PROTO_TCP, PROTO_UDP, Stat, VipKey,
};
use lb_user::dataplane::LoadOptions;
use xlb_tests::{
    harness::{LB_MAC, LB_V4, LB_V6, PEER_MAC, World, XG_MAC, in_world, stat_delta},
    packet::{
        self, ACK, ETH_P_8021AD, ETH_P_ARP, ETH_P_IP, ETH_P_IPV6, FIN, Flow, PSH, RST, SYN, addr16,
    },
};

const XDP_ABORTED: u32 = 0;
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;
const XDP_REDIRECT: u32 = 4;

const HASH_KEY: [u64; 2] = [0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210];
const UDP_TIMEOUT_NS: u64 = 30_000_000_000;
/// A small prime table keeps fixtures fast; production default is 65537.
const TABLE: usize = 13;

const VIP4: &str = "10.100.0.1";
const VIP4_L2: &str = "10.100.0.2";
const VIP4_EMPTY: &str = "10.100.0.3";
const VIP4_NONEIGH: &str = "10.100.0.4";
const VIP4_OTHER_IF: &str = "10.100.0.5";
const VIP6: &str = "fd00:100::1";
const VIP6_L2: &str = "fd00:100::2";

fn opts() -> LoadOptions {
    LoadOptions {
        ct_size: 4096,
        ring_stride: 257,
        pin_dir: None,
    }
}

fn table(ids: &[u32]) -> Vec<u32> {
    (0..TABLE).map(|i| ids[i % ids.len()]).collect()
}

/// The map state every case starts from.
fn base(w: &mut World) -> anyhow::Result<()> {
    w.dp.ct_clear()?;
    w.write_backends()?;
    w.set_globals(HASH_KEY, UDP_TIMEOUT_NS)?;
    w.add_vip(
        0,
        VIP4,
        80,
        PROTO_TCP,
        MODE_DSR_IPIP,
        DOWN_POLICY_REHASH,
        &table(&[1, 2]),
    )?;
    w.add_vip(
        1,
        VIP4,
        53,
        PROTO_UDP,
        MODE_DSR_IPIP,
        DOWN_POLICY_REHASH,
        &table(&[1, 2]),
    )?;
    w.add_vip(
        2,
        VIP6,
        80,
        PROTO_TCP,
        MODE_DSR_IPIP,
        DOWN_POLICY_REHASH,
        &table(&[4, 5]),
    )?;
    w.add_vip(
        3,
        VIP4_L2,
        80,
        PROTO_TCP,
        MODE_DSR_L2,
        DOWN_POLICY_KEEP,
        &table(&[1, 2]),
    )?;
    w.add_vip(
        4,
        VIP6_L2,
        80,
        PROTO_TCP,
        MODE_DSR_L2,
        DOWN_POLICY_REHASH,
        &table(&[4, 5]),
    )?;
    w.add_vip(
        5,
        VIP4_EMPTY,
        80,
        PROTO_TCP,
        MODE_DSR_IPIP,
        DOWN_POLICY_REHASH,
        &table(&[0]),
    )?;
    w.add_vip(
        7,
        VIP4_OTHER_IF,
        80,
        PROTO_TCP,
        MODE_DSR_IPIP,
        DOWN_POLICY_REHASH,
        &table(&[6]),
    )?;
    w.add_vip(
        6,
        VIP4_NONEIGH,
        80,
        PROTO_TCP,
        MODE_DSR_IPIP,
        DOWN_POLICY_REHASH,
        &table(&[3]),
    )?;
    Ok(())
}

fn vip_key(flow: &Flow) -> VipKey {
    VipKey::new(flow.dst, flow.dport, flow.proto)
}

/// The backend userspace predicts for `flow` from the live table.
fn predict(w: &World, flow: &Flow) -> anyhow::Result<u32> {
    let vip = w.dp.vip(&vip_key(flow))?.expect("VIP configured");
    let slot = flow.key().slot(&HASH_KEY, vip.table_size);
    Ok(w.dp.ring_half(vip.vip_id, vip.active, vip.table_size)?[slot as usize])
}

/// A frame from a client, addressed to the LB's MAC.
fn client(flow: &Flow, vlan: Option<u16>, flags: u8) -> Vec<u8> {
    flow.frame(LB_MAC, PEER_MAC, vlan, flags, b"hello")
}

/// What the LB must send for `flow` to backend `id`.
fn forwarded(w: &World, flow: &Flow, vlan: Option<u16>, flags: u8, id: u32, mode: u8) -> Vec<u8> {
    let be = w.backend(id);
    let inner = flow.ip(flags, b"hello");
    let mac = be.mac.expect("forwarded backend has a neighbour");
    let l3 = if mode == MODE_DSR_IPIP {
        let src: IpAddr = if be.addr.is_ipv4() {
            LB_V4.parse().unwrap()
        } else {
            LB_V6.parse().unwrap()
        };
        packet::encap(src, be.addr, &inner)
    } else {
        inner
    };
    // Backends on 10.1.0.0/24 are reached through the second interface.
    let src_mac = if be.addr.to_string().starts_with("10.1.0.") {
        XG_MAC
    } else {
        LB_MAC
    };
    packet::eth(mac, src_mac, vlan, packet::ethertype(be.addr), &l3)
}

enum Out {
    /// The frame leaves (or is passed/dropped) unchanged.
    Unchanged,
    /// Forwarded to the backend userspace predicts (`None`) or to this one.
    Fwd {
        flow: Flow,
        vlan: Option<u16>,
        flags: u8,
        mode: u8,
        backend: Option<u32>,
    },
    /// Exactly these bytes.
    Exact(Vec<u8>),
}

type Prep = Box<dyn Fn(&mut World) -> anyhow::Result<()>>;
type Check = Box<dyn Fn(&World) -> anyhow::Result<()>>;

struct Case {
    name: &'static str,
    prog: &'static str,
    prep: Prep,
    frame: Vec<u8>,
    verdict: u32,
    out: Out,
    deltas: Vec<(Stat, u64)>,
    check: Option<Check>,
}

fn case(
    name: &'static str,
    frame: Vec<u8>,
    verdict: u32,
    out: Out,
    deltas: &[(Stat, u64)],
) -> Case {
    Case {
        name,
        prog: lb_common::PROG_LB,
        prep: Box::new(|_| Ok(())),
        frame,
        verdict,
        out,
        deltas: deltas.to_vec(),
        check: None,
    }
}

impl Case {
    fn prep(mut self, f: impl Fn(&mut World) -> anyhow::Result<()> + 'static) -> Self {
        self.prep = Box::new(f);
        self
    }
    fn check(mut self, f: impl Fn(&World) -> anyhow::Result<()> + 'static) -> Self {
        self.check = Some(Box::new(f));
        self
    }
    fn prog(mut self, p: &'static str) -> Self {
        self.prog = p;
        self
    }
}

fn fwd(flow: Flow, flags: u8, mode: u8) -> Out {
    Out::Fwd {
        flow,
        vlan: None,
        flags,
        mode,
        backend: None,
    }
}

fn fwd_to(flow: Flow, flags: u8, mode: u8, id: u32) -> Out {
    Out::Fwd {
        flow,
        vlan: None,
        flags,
        mode,
        backend: Some(id),
    }
}

/// A conntrack entry for `flow` pointing at `id` (generation `gen`, seen at `seen`).
fn ct(w: &mut World, flow: &Flow, id: u32, generation: u32, seen: u64) -> anyhow::Result<()> {
    let vip_id = w.dp.vip(&vip_key(flow))?.expect("VIP configured").vip_id;
    w.dp.ct_insert(
        &flow.key(),
        &CtEntry {
            backend_id: id,
            generation,
            vip_id,
            flags: 0,
            last_seen_ns: seen,
        },
    )?;
    Ok(())
}

/// The backend the conntrack entry of `flow` holds.
fn ct_backend(w: &World, flow: &Flow) -> anyhow::Result<Option<u32>> {
    Ok(w.dp.ct_get(&flow.key())?.map(|e| e.backend_id))
}

fn monotonic_ns() -> u64 {
    // The data plane stamps entries with bpf_ktime_get_coarse_ns().
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: t is a valid timespec to write to.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) },
        0
    );
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The flow whose predicted backend (in the base table) is `want`: lets a
/// case point conntrack at the *other* backend and see which one wins.
fn flow_to(w: &World, proto_udp: bool, dst: &str, dport: u16, want: u32) -> Flow {
    for sport in 40000..41000 {
        let f = if proto_udp {
            Flow::udp("192.0.2.7", sport, dst, dport)
        } else {
            Flow::tcp("192.0.2.7", sport, dst, dport)
        };
        if predict(w, &f).unwrap() == want {
            return f;
        }
    }
    panic!("no flow to backend {want}");
}

use Stat::*;

fn cases(w: &World) -> Vec<Case> {
    let t4 = Flow::tcp("192.0.2.1", 40001, VIP4, 80);
    let t6 = Flow::tcp("2001:db8::1", 40001, VIP6, 80);
    let l2_4 = Flow::tcp("192.0.2.1", 40001, VIP4_L2, 80);
    let l2_6 = Flow::tcp("2001:db8::1", 40001, VIP6_L2, 80);
    let u4 = Flow::udp("192.0.2.1", 5000, VIP4, 53);
    // Flows whose table backend is 1: conntrack then points them at 2.
    let est = flow_to(w, false, VIP4, 80, 1);
    let est_l2 = flow_to(w, false, VIP4_L2, 80, 1);
    let est_udp = flow_to(w, true, VIP4, 53, 1);
    let non_vip = Flow::tcp("192.0.2.1", 40001, LB_V4, 22);
    let other_port = Flow::tcp("192.0.2.1", 40001, VIP4, 443);
    let ip4 = |l4: &[u8], proto: u8| {
        packet::ipv4(
            "192.0.2.1".parse().unwrap(),
            VIP4.parse().unwrap(),
            proto,
            0,
            64,
            1,
            l4,
        )
    };
    let ip6 = |l4: &[u8], next: u8| {
        packet::ipv6(
            "2001:db8::1".parse().unwrap(),
            VIP6.parse().unwrap(),
            next,
            [0x60, 0, 0, 0],
            64,
            l4,
        )
    };
    let eth4 = |l3: &[u8]| packet::eth(LB_MAC, PEER_MAC, None, ETH_P_IP, l3);
    let eth6 = |l3: &[u8]| packet::eth(LB_MAC, PEER_MAC, None, ETH_P_IPV6, l3);
    let tcp_syn = packet::tcp(40001, 80, SYN, 5, b"");
    let good4 = ip4(&tcp_syn, PROTO_TCP);
    let with = |mut v: Vec<u8>, at: usize, bytes: &[u8]| {
        v[at..at + bytes.len()].copy_from_slice(bytes);
        v
    };
    // Rewrites an IPv4 header field and fixes its checksum, so only the
    // intended defect is present.
    let fix4 = |mut v: Vec<u8>| {
        v[10] = 0;
        v[11] = 0;
        let c = packet::csum(&v[..20]);
        v[10..12].copy_from_slice(&c.to_be_bytes());
        v
    };
    let big_payload = vec![0u8; 1500 - 20 - 20];
    let big = Flow::tcp("192.0.2.1", 40009, VIP4, 80);
    let tunnel4 = |dst: &str, inner: &[u8]| {
        packet::eth(
            LB_MAC,
            PEER_MAC,
            None,
            ETH_P_IP,
            &packet::encap("10.0.0.2".parse().unwrap(), dst.parse().unwrap(), inner),
        )
    };
    let tunnel6 = |dst: &str, inner: &[u8]| {
        packet::eth(
            LB_MAC,
            PEER_MAC,
            None,
            ETH_P_IPV6,
            &packet::encap("fd00::2".parse().unwrap(), dst.parse().unwrap(), inner),
        )
    };
    let inner4 = t4.ip(SYN, b"hello");
    let inner6 = t6.ip(SYN, b"hello");
    let decap = lb_common::PROG_DECAP;
    let add_decap = |w: &mut World| -> anyhow::Result<()> {
        for a in [LB_V4, LB_V6] {
            let ip: IpAddr = a.parse()?;
            w.dp.add_decap_addr(&DecapAddrKey {
                addr: addr16(ip),
                family: packet::family(ip),
                _pad: [0; 3],
            })?;
        }
        Ok(())
    };

    vec![
        // --- new flows, both modes, both families
        case(
            "v4 SYN, dsr-ipip",
            client(&t4, None, SYN),
            XDP_TX,
            fwd(t4, SYN, MODE_DSR_IPIP),
            &[(CtInsert, 1), (FwdTx, 1)],
        )
        .check(move |w| {
            let want = predict(w, &t4)?;
            anyhow::ensure!(
                ct_backend(w, &t4)? == Some(want),
                "conntrack records the chosen backend"
            );
            let s = w.dp.vip_stats(0)?;
            anyhow::ensure!(s.new_flows >= 1 && s.packets >= 1, "VIP counters: {s:?}");
            Ok(())
        }),
        case(
            "v6 SYN, dsr-ipip",
            client(&t6, None, SYN),
            XDP_TX,
            fwd(t6, SYN, MODE_DSR_IPIP),
            &[(CtInsert, 1), (FwdTx, 1)],
        ),
        case(
            "v4 SYN, dsr-l2",
            client(&l2_4, None, SYN),
            XDP_TX,
            fwd(l2_4, SYN, MODE_DSR_L2),
            &[(CtInsert, 1), (FwdTx, 1)],
        ),
        case(
            "v6 SYN, dsr-l2",
            client(&l2_6, None, SYN),
            XDP_TX,
            fwd(l2_6, SYN, MODE_DSR_L2),
            &[(CtInsert, 1), (FwdTx, 1)],
        ),
        case(
            "SYN ignores an existing entry: new connections follow the table",
            client(&est, None, SYN),
            XDP_TX,
            fwd_to(est, SYN, MODE_DSR_IPIP, 1),
            &[(CtInsert, 1), (FwdTx, 1)],
        )
        .prep(move |w| ct(w, &est, 2, 0, monotonic_ns()))
        .check(move |w| {
            anyhow::ensure!(ct_backend(w, &est)? == Some(1));
            Ok(())
        }),
        // --- established flows
        case(
            "established hit uses conntrack, not the table",
            client(&est, None, ACK | PSH),
            XDP_TX,
            fwd_to(est, ACK | PSH, MODE_DSR_IPIP, 2),
            &[(CtHit, 1), (FwdTx, 1)],
        )
        .prep(move |w| ct(w, &est, 2, 0, monotonic_ns()))
        .check(move |w| {
            let flags = w.dp.ct_get(&est.key())?.map(|e| e.flags);
            anyhow::ensure!(flags == Some(0), "flags {flags:?}: not closing");
            Ok(())
        }),
        case(
            "client FIN on an established flow: forwarded, entry marked closing",
            client(&est, None, FIN | ACK),
            XDP_TX,
            fwd_to(est, FIN | ACK, MODE_DSR_IPIP, 2),
            &[(CtHit, 1), (FwdTx, 1)],
        )
        .prep(move |w| ct(w, &est, 2, 0, monotonic_ns()))
        .check(move |w| {
            let e = w.dp.ct_get(&est.key())?;
            anyhow::ensure!(
                e.map(|e| (e.backend_id, e.flags)) == Some((2, lb_common::CT_FLAG_CLOSING)),
                "entry {e:?}"
            );
            Ok(())
        }),
        case(
            "client RST on an established flow: forwarded, entry marked closing",
            client(&est, None, RST),
            XDP_TX,
            fwd_to(est, RST, MODE_DSR_IPIP, 2),
            &[(CtHit, 1), (FwdTx, 1)],
        )
        .prep(move |w| ct(w, &est, 2, 0, monotonic_ns()))
        .check(move |w| {
            let flags = w.dp.ct_get(&est.key())?.map(|e| e.flags);
            anyhow::ensure!(flags == Some(lb_common::CT_FLAG_CLOSING), "flags {flags:?}");
            Ok(())
        }),
        case(
            "client FIN that misses: forwarded by the table, new entry closing",
            client(&est, None, FIN | ACK),
            XDP_TX,
            fwd_to(est, FIN | ACK, MODE_DSR_IPIP, 1),
            &[(CtMiss, 1), (CtInsert, 1), (FwdTx, 1)],
        )
        .check(move |w| {
            let e = w.dp.ct_get(&est.key())?;
            anyhow::ensure!(
                e.map(|e| (e.backend_id, e.flags)) == Some((1, lb_common::CT_FLAG_CLOSING)),
                "entry {e:?}"
            );
            Ok(())
        }),
        case(
            "miss falls back to the table and creates an entry",
            client(&est, None, ACK),
            XDP_TX,
            fwd_to(est, ACK, MODE_DSR_IPIP, 1),
            &[(CtMiss, 1), (CtInsert, 1), (FwdTx, 1)],
        )
        .check(move |w| {
            anyhow::ensure!(ct_backend(w, &est)? == Some(1));
            Ok(())
        }),
        case(
            "draining backend keeps its flows",
            client(&est, None, ACK),
            XDP_TX,
            fwd_to(est, ACK, MODE_DSR_IPIP, 2),
            &[(CtHit, 1), (FwdTx, 1)],
        )
        .prep(move |w| {
            ct(w, &est, 2, 0, monotonic_ns())?;
            w.set_backend_state(2, BACKEND_DRAINING, 0)
        }),
        case(
            "down backend, policy rehash: re-picked from the table",
            client(&est, None, ACK),
            XDP_TX,
            fwd_to(est, ACK, MODE_DSR_IPIP, 1),
            &[(DownRehash, 1), (CtInsert, 1), (FwdTx, 1)],
        )
        .prep(move |w| {
            ct(w, &est, 2, 0, monotonic_ns())?;
            w.set_backend_state(2, BACKEND_DOWN, 0)
        })
        .check(move |w| {
            anyhow::ensure!(
                ct_backend(w, &est)? == Some(1),
                "entry moved to the live backend"
            );
            Ok(())
        }),
        case(
            "down backend, policy keep: stays",
            client(&est_l2, None, ACK),
            XDP_TX,
            fwd_to(est_l2, ACK, MODE_DSR_L2, 2),
            &[(DownKeep, 1), (CtHit, 1), (FwdTx, 1)],
        )
        .prep(move |w| {
            ct(w, &est_l2, 2, 0, monotonic_ns())?;
            w.set_backend_state(2, BACKEND_DOWN, 0)
        }),
        case(
            "recycled backend id (generation changed): entry is stale",
            client(&est, None, ACK),
            XDP_TX,
            fwd_to(est, ACK, MODE_DSR_IPIP, 1),
            &[(CtStale, 1), (CtInsert, 1), (FwdTx, 1)],
        )
        .prep(move |w| {
            ct(w, &est, 2, 0, monotonic_ns())?;
            w.set_backend_state(2, lb_common::BACKEND_UP, 1)
        }),
        // --- UDP
        case(
            "UDP first packet",
            client(&u4, None, 0),
            XDP_TX,
            fwd(u4, 0, MODE_DSR_IPIP),
            &[(CtMiss, 1), (CtInsert, 1), (FwdTx, 1)],
        ),
        case(
            "UDP within the idle timeout keeps its backend",
            client(&est_udp, None, 0),
            XDP_TX,
            fwd_to(est_udp, 0, MODE_DSR_IPIP, 2),
            &[(CtHit, 1), (FwdTx, 1)],
        )
        .prep(move |w| ct(w, &est_udp, 2, 0, monotonic_ns())),
        case(
            "UDP idle past the timeout is re-picked",
            client(&est_udp, None, 0),
            XDP_TX,
            fwd_to(est_udp, 0, MODE_DSR_IPIP, 1),
            &[(CtUdpExpired, 1), (CtInsert, 1), (FwdTx, 1)],
        )
        .prep(move |w| {
            ct(
                w,
                &est_udp,
                2,
                0,
                monotonic_ns() - UDP_TIMEOUT_NS - 1_000_000_000,
            )
        }),
        // --- not ours
        case(
            "non-VIP TCP (SSH to the host)",
            client(&non_vip, None, SYN),
            XDP_PASS,
            Out::Unchanged,
            &[(PassNotVip, 1)],
        ),
        case(
            "VIP address, other port",
            client(&other_port, None, SYN),
            XDP_PASS,
            Out::Unchanged,
            &[(PassNotVip, 1)],
        ),
        case(
            "ARP",
            packet::eth([0xff; 6], PEER_MAC, None, ETH_P_ARP, &[0u8; 28]),
            XDP_PASS,
            Out::Unchanged,
            &[(PassNotIp, 1)],
        ),
        case(
            "ICMP to a VIP address",
            eth4(&ip4(&[8, 0, 0, 0, 0, 0, 0, 0], 1)),
            XDP_PASS,
            Out::Unchanged,
            &[(PassNotVip, 1)],
        ),
        case(
            "malformed packet to a non-VIP address is not ours",
            eth4(&fix4(with(
                packet::ipv4(
                    "192.0.2.1".parse().unwrap(),
                    LB_V4.parse().unwrap(),
                    PROTO_TCP,
                    0,
                    64,
                    1,
                    &tcp_syn,
                ),
                0,
                &[0x44],
            ))),
            XDP_PASS,
            Out::Unchanged,
            &[(PassNotVip, 1)],
        ),
        // --- VLAN
        case(
            "802.1Q-tagged SYN keeps its tag",
            client(&t4, Some(42), SYN),
            XDP_TX,
            Out::Fwd {
                flow: t4,
                vlan: Some(42),
                flags: SYN,
                mode: MODE_DSR_IPIP,
                backend: None,
            },
            &[(CtInsert, 1), (FwdTx, 1)],
        ),
        case(
            "802.1Q-tagged SYN, dsr-l2",
            client(&l2_4, Some(42), SYN),
            XDP_TX,
            Out::Fwd {
                flow: l2_4,
                vlan: Some(42),
                flags: SYN,
                mode: MODE_DSR_L2,
                backend: None,
            },
            &[(CtInsert, 1), (FwdTx, 1)],
        ),
        case(
            "QinQ is passed",
            packet::eth(
                LB_MAC,
                PEER_MAC,
                None,
                ETH_P_8021AD,
                &[0, 42, 0x81, 0, 0, 7, 8, 0],
            ),
            XDP_PASS,
            Out::Unchanged,
            &[(PassQinQ, 1)],
        ),
        // --- truncated at every header boundary
        // A frame shorter than an Ethernet header never reaches XDP (drivers
        // drop runts; BPF_PROG_TEST_RUN refuses it with EINVAL), so L2
        // truncation is tested inside the VLAN tag.
        case(
            "truncated inside the VLAN tag",
            packet::eth(LB_MAC, PEER_MAC, None, 0x8100, &[0, 42]),
            XDP_PASS,
            Out::Unchanged,
            &[(PassTruncatedL2, 1)],
        ),
        case(
            "Ethernet only, IPv4 ethertype",
            eth4(&[]),
            XDP_PASS,
            Out::Unchanged,
            &[(PassTruncatedL3, 1)],
        ),
        case(
            "truncated inside the IPv4 header",
            eth4(&good4[..12]),
            XDP_PASS,
            Out::Unchanged,
            &[(PassTruncatedL3, 1)],
        ),
        case(
            "truncated inside the IPv6 header",
            eth6(&ip6(&tcp_syn, PROTO_TCP)[..30]),
            XDP_PASS,
            Out::Unchanged,
            &[(PassTruncatedL3, 1)],
        ),
        case(
            "IPv4 header only, total length claims TCP",
            eth4(&good4[..20]),
            XDP_DROP,
            Out::Unchanged,
            &[(DropBadLength, 1)],
        ),
        case(
            "IPv4, TCP header truncated",
            eth4(&ip4(&tcp_syn[..10], PROTO_TCP)),
            XDP_DROP,
            Out::Unchanged,
            &[(DropBadL4, 1)],
        ),
        case(
            "IPv6, TCP header truncated",
            eth6(&ip6(&tcp_syn[..10], PROTO_TCP)),
            XDP_DROP,
            Out::Unchanged,
            &[(DropBadL4, 1)],
        ),
        case(
            "IPv4, UDP header truncated",
            eth4(&ip4(&[0, 53, 0, 53], PROTO_UDP)),
            XDP_DROP,
            Out::Unchanged,
            &[(DropBadL4, 1)],
        ),
        // --- malformed headers to a VIP address
        case(
            "IPv4 IHL 4",
            eth4(&fix4(with(good4.clone(), 0, &[0x44]))),
            XDP_DROP,
            Out::Unchanged,
            &[(DropBadIhl, 1)],
        ),
        case(
            "IPv4 version 5",
            eth4(&fix4(with(good4.clone(), 0, &[0x55]))),
            XDP_DROP,
            Out::Unchanged,
            &[(DropBadIhl, 1)],
        ),
        case(
            "IPv6 version field 4",
            eth6(&with(ip6(&tcp_syn, PROTO_TCP), 0, &[0x40])),
            XDP_DROP,
            Out::Unchanged,
            &[(DropBadIhl, 1)],
        ),
        case(
            "IPv4 total length beyond the frame",
            eth4(&fix4(with(good4.clone(), 2, &200u16.to_be_bytes()))),
            XDP_DROP,
            Out::Unchanged,
            &[(DropBadLength, 1)],
        ),
        case(
            "IPv4 total length below the header",
            eth4(&fix4(with(good4.clone(), 2, &10u16.to_be_bytes()))),
            XDP_DROP,
            Out::Unchanged,
            &[(DropBadLength, 1)],
        ),
        case(
            "IPv6 payload length beyond the frame",
            eth6(&with(ip6(&tcp_syn, PROTO_TCP), 4, &500u16.to_be_bytes())),
            XDP_DROP,
            Out::Unchanged,
            &[(DropBadLength, 1)],
        ),
        case(
            "TCP data offset 4",
            eth4(&ip4(&packet::tcp(40001, 80, SYN, 4, &[0; 4]), PROTO_TCP)),
            XDP_DROP,
            Out::Unchanged,
            &[(DropBadL4, 1)],
        ),
        case(
            "TCP data offset past the segment",
            eth4(&ip4(&with(tcp_syn.clone(), 12, &[0xf0]), PROTO_TCP)),
            XDP_DROP,
            Out::Unchanged,
            &[(DropBadL4, 1)],
        ),
        case(
            "UDP length 4",
            eth4(&ip4(
                &with(packet::udp(5000, 53, b"x"), 4, &4u16.to_be_bytes()),
                PROTO_UDP,
            )),
            XDP_DROP,
            Out::Unchanged,
            &[(DropBadL4, 1)],
        ),
        case(
            "UDP length past the datagram",
            eth4(&ip4(
                &with(packet::udp(5000, 53, b"x"), 4, &100u16.to_be_bytes()),
                PROTO_UDP,
            )),
            XDP_DROP,
            Out::Unchanged,
            &[(DropBadL4, 1)],
        ),
        case(
            "IPv4 first fragment (MF)",
            eth4(&fix4(with(good4.clone(), 6, &[0x20, 0]))),
            XDP_DROP,
            Out::Unchanged,
            &[(DropFragment, 1)],
        ),
        case(
            "IPv4 later fragment (offset)",
            eth4(&fix4(with(good4.clone(), 6, &[0, 0x10]))),
            XDP_DROP,
            Out::Unchanged,
            &[(DropFragment, 1)],
        ),
        case(
            "IPv4 options",
            eth4(&{
                let mut v = packet::ipv4(
                    "192.0.2.1".parse().unwrap(),
                    VIP4.parse().unwrap(),
                    PROTO_TCP,
                    0,
                    64,
                    1,
                    &[],
                );
                v[0] = 0x46;
                v.extend_from_slice(&[1, 1, 1, 0]);
                v.extend_from_slice(&tcp_syn);
                let len = (v.len() as u16).to_be_bytes();
                v[2..4].copy_from_slice(&len);
                v[10] = 0;
                v[11] = 0;
                let c = packet::csum(&v[..24]);
                v[10..12].copy_from_slice(&c.to_be_bytes());
                v
            }),
            XDP_DROP,
            Out::Unchanged,
            &[(DropIpOptions, 1)],
        ),
        case(
            "IPv6 fragment header",
            eth6(&ip6(&[6, 0, 0, 1, 0, 0, 0, 1], 44)),
            XDP_DROP,
            Out::Unchanged,
            &[(DropFragment, 1)],
        ),
        case(
            "IPv6 hop-by-hop header goes to the host",
            eth6(&ip6(&[6, 0, 1, 4, 0, 0, 0, 0], 0)),
            XDP_PASS,
            Out::Unchanged,
            &[(PassIpv6Ext, 1)],
        ),
        case(
            "IPv6 routing header goes to the host",
            eth6(&ip6(&[6, 0, 0, 0, 0, 0, 0, 0], 43)),
            XDP_PASS,
            Out::Unchanged,
            &[(PassIpv6Ext, 1)],
        ),
        // --- cannot forward
        case(
            "no backend up: empty table",
            client(&Flow::tcp("192.0.2.1", 40001, VIP4_EMPTY, 80), None, SYN),
            XDP_DROP,
            Out::Unchanged,
            &[(DropNoBackend, 1)],
        ),
        case(
            "backend routed through another interface: redirected",
            client(&Flow::tcp("192.0.2.1", 40001, VIP4_OTHER_IF, 80), None, SYN),
            XDP_REDIRECT,
            fwd_to(
                Flow::tcp("192.0.2.1", 40001, VIP4_OTHER_IF, 80),
                SYN,
                MODE_DSR_IPIP,
                6,
            ),
            &[(CtInsert, 1), (FwdRedirect, 1)],
        ),
        case(
            "backend without a neighbour entry",
            client(&Flow::tcp("192.0.2.1", 40001, VIP4_NONEIGH, 80), None, SYN),
            XDP_DROP,
            Out::Unchanged,
            &[(CtInsert, 1), (DropNoRoute, 1)],
        ),
        case(
            "encapsulated packet over the MTU",
            big.frame(LB_MAC, PEER_MAC, None, ACK, &big_payload),
            XDP_DROP,
            Out::Unchanged,
            &[(CtMiss, 1), (CtInsert, 1), (DropTooBig, 1)],
        ),
        // --- the decapsulator
        case(
            "decap: IPIP to us is stripped",
            tunnel4(LB_V4, &inner4),
            XDP_PASS,
            Out::Exact(packet::eth(LB_MAC, PEER_MAC, None, ETH_P_IP, &inner4)),
            &[],
        )
        .prog(decap)
        .prep(add_decap),
        case(
            "decap: IP6IP6 to us is stripped",
            tunnel6(LB_V6, &inner6),
            XDP_PASS,
            Out::Exact(packet::eth(LB_MAC, PEER_MAC, None, ETH_P_IPV6, &inner6)),
            &[],
        )
        .prog(decap)
        .prep(add_decap),
        case(
            "decap: VLAN-tagged IPIP keeps its tag",
            packet::eth(
                LB_MAC,
                PEER_MAC,
                Some(7),
                ETH_P_IP,
                &packet::encap("10.0.0.2".parse().unwrap(), LB_V4.parse().unwrap(), &inner4),
            ),
            XDP_PASS,
            Out::Exact(packet::eth(LB_MAC, PEER_MAC, Some(7), ETH_P_IP, &inner4)),
            &[],
        )
        .prog(decap)
        .prep(add_decap),
        case(
            "decap: IPIP to another address passes untouched",
            tunnel4("10.0.0.99", &inner4),
            XDP_PASS,
            Out::Unchanged,
            &[],
        )
        .prog(decap)
        .prep(add_decap),
        case(
            "decap: plain traffic passes untouched",
            client(&t4, None, SYN),
            XDP_PASS,
            Out::Unchanged,
            &[],
        )
        .prog(decap)
        .prep(add_decap),
        case(
            "decap: tunnel with a truncated inner header is dropped",
            tunnel4(LB_V4, &inner4[..10]),
            XDP_DROP,
            Out::Unchanged,
            &[],
        )
        .prog(decap)
        .prep(add_decap),
    ]
}

#[test]
fn fixtures() {
    in_world("fx", opts(), |w| {
        base(w)?;
        let cases = cases(w);
        let mut failures = Vec::new();
        for c in &cases {
            base(w)?;
            (c.prep)(w)?;
            let expected = match &c.out {
                Out::Unchanged => c.frame.clone(),
                Out::Exact(b) => b.clone(),
                Out::Fwd {
                    flow,
                    vlan,
                    flags,
                    mode,
                    backend,
                } => {
                    let id = match backend {
                        Some(id) => *id,
                        None => predict(w, flow)?,
                    };
                    forwarded(w, flow, *vlan, *flags, id, *mode)
                }
            };
            let before = w.stats()?;
            let decap_before = w.dp.decap_stats()?;
            let (verdict, out) = w.run(c.prog, &c.frame)?;
            let delta = stat_delta(&before, &w.stats()?);
            let mut errs = Vec::new();
            if verdict != c.verdict {
                errs.push(format!("verdict {verdict}, want {}", c.verdict));
            }
            if verdict != XDP_ABORTED && out != expected {
                errs.push(format!(
                    "output differs:\n   got  {}\n   want {}",
                    hex(&out),
                    hex(&expected)
                ));
            }
            if c.prog == lb_common::PROG_LB {
                let mut want = c.deltas.clone();
                want.sort();
                if delta != want {
                    errs.push(format!("counters {delta:?}, want {want:?}"));
                }
            } else {
                let after = w.dp.decap_stats()?;
                let d: Vec<u64> = after.iter().zip(decap_before).map(|(a, b)| a - b).collect();
                let want = match c.verdict {
                    XDP_DROP => vec![0, 0, 1],
                    _ if matches!(c.out, Out::Exact(_)) => vec![1, 0, 0],
                    _ => vec![0, 1, 0],
                };
                if d != want {
                    errs.push(format!("decap counters {d:?}, want {want:?}"));
                }
            }
            if errs.is_empty()
                && let Some(check) = &c.check
                && let Err(e) = check(w)
            {
                errs.push(format!("check: {e:#}"));
            }
            if errs.is_empty() {
                println!("ok   {}", c.name);
            } else {
                println!("FAIL {}: {}", c.name, errs.join("; "));
                failures.push(c.name);
            }
        }
        anyhow::ensure!(
            failures.is_empty(),
            "{} of {} fixtures failed: {failures:?}",
            failures.len(),
            cases.len()
        );
        println!("{} fixtures passed", cases.len());
        Ok(())
    })
    .unwrap();
}

/// 500 random flows per family: the backend the kernel sends each SYN to is
/// the one userspace computes with the shared hash.
#[test]
fn kernel_and_userspace_hash_agree() {
    in_world("hash", opts(), |w| {
        base(w)?;
        // A table with every slot distinct, so any hash difference shows.
        let ids: Vec<u32> = (0..TABLE as u32).map(|i| 1 + i % 2).collect();
        w.add_vip(
            0,
            VIP4,
            80,
            PROTO_TCP,
            MODE_DSR_IPIP,
            DOWN_POLICY_REHASH,
            &ids,
        )?;
        let mut rng = rand::thread_rng();
        use rand::Rng as _;
        let mut seen = [0u32; 3];
        for _ in 0..500 {
            let src = format!(
                "198.51.{}.{}",
                rng.gen_range(0..=255),
                rng.gen_range(1..=254)
            );
            let flow = Flow::tcp(&src, rng.gen_range(1024..=65535), VIP4, 80);
            let want = predict(w, &flow)?;
            let (verdict, out) = w.run(lb_common::PROG_LB, &client(&flow, None, SYN))?;
            anyhow::ensure!(verdict == XDP_TX, "verdict {verdict}");
            anyhow::ensure!(
                out == forwarded(w, &flow, None, SYN, want, MODE_DSR_IPIP),
                "flow {flow:?}: kernel chose another backend than userspace predicted ({want})"
            );
            seen[want as usize] += 1;
        }
        anyhow::ensure!(seen[1] > 0 && seen[2] > 0, "both backends chosen: {seen:?}");
        Ok(())
    })
    .unwrap();
}

/// The program passes the verifier well within its budget; the count is printed.
#[test]
fn verifier_instruction_count() {
    // The verifier's limit on processed instructions (BPF_COMPLEXITY_LIMIT_INSNS).
    const LIMIT: u32 = 1_000_000;
    in_world("verifier", opts(), |w| {
        for name in [
            lb_common::PROG_LB,
            lb_common::PROG_DECAP,
            lb_common::PROG_MINIMAL,
        ] {
            let info = w.dp.program::<aya::programs::Xdp>(name)?.info()?;
            let n = info
                .verified_instruction_count()
                .ok_or_else(|| anyhow::anyhow!("kernel did not report verified_insns"))?;
            println!("{name}: verifier processed {n} instructions (limit {LIMIT})");
            anyhow::ensure!(
                n <= LIMIT / 2,
                "{name} needs {n} verifier instructions, over half the limit"
            );
        }
        Ok(())
    })
    .unwrap();
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
const TC_ACT_REDIRECT: u32 = 7;

/// MAC of the LB's next hop towards the VIPs: where the kernel addressed a
/// probe's frame before `xlb_hc` took it.
const GW_MAC: packet::Mac = [0x02, 0, 0, 0, 0, 0xfe];

/// A backend of the `xlb_hc` fixtures with no route at all.
const NOROUTE_V4: &str = "192.0.2.7";

/// What `XLB_HC_REALS` holds in the `xlb_hc` fixtures: mark → (address, mode).
fn hc_reals() -> Vec<(u32, &'static str, u8)> {
    vec![
        (lb_common::hc_mark(1), "10.0.0.11", MODE_DSR_IPIP),
        (lb_common::hc_mark(2), "10.0.0.12", MODE_DSR_L2),
        (lb_common::hc_mark(3), "10.0.0.13", MODE_DSR_IPIP),
        (lb_common::hc_mark(4), "fd00::11", MODE_DSR_IPIP),
        (lb_common::hc_mark(5), "fd00::12", MODE_DSR_L2),
        (lb_common::hc_mark(6), "10.1.0.11", MODE_DSR_IPIP),
        (lb_common::hc_mark(7), NOROUTE_V4, MODE_DSR_IPIP),
    ]
}

/// A probe's frame as the LB's stack sends it: LB → VIP, to the gateway's MAC.
fn probe_frame(family_v6: bool, flags: u8) -> (Vec<u8>, Vec<u8>) {
    let flow = if family_v6 {
        Flow::tcp(LB_V6, 40000, VIP6, 80)
    } else {
        Flow::tcp(LB_V4, 40000, VIP4, 80)
    };
    let inner = flow.ip(flags, b"GET /health");
    let frame = packet::eth(
        GW_MAC,
        LB_MAC,
        None,
        if family_v6 { ETH_P_IPV6 } else { ETH_P_IP },
        &inner,
    );
    (frame, inner)
}

/// The frame `xlb_hc` must hand to `bpf_redirect_neigh` for a dsr-ipip
/// probe to `backend`: the same Ethernet header (the helper rewrites it),
/// an outer header from the encap source, the probe untouched inside.
fn hc_encapsulated(backend: &str, inner: &[u8]) -> Vec<u8> {
    let be: IpAddr = backend.parse().unwrap();
    let src: IpAddr = if be.is_ipv4() {
        LB_V4.parse().unwrap()
    } else {
        LB_V6.parse().unwrap()
    };
    packet::eth(
        GW_MAC,
        LB_MAC,
        None,
        packet::ethertype(be),
        &packet::encap(src, be, inner),
    )
}

/// `xlb_hc`, Katran-style: named cases of (mark, frame) → verdict, exact
/// output bytes, mark afterwards and counter deltas.
#[test]
fn hc_fixtures() {
    use lb_common::{HcReal, HcStat};

    struct HcCase {
        name: &'static str,
        mark: u32,
        frame: Vec<u8>,
        verdict: u32,
        /// Expected output; `None` = unchanged.
        out: Option<Vec<u8>>,
        mark_after: u32,
        deltas: Vec<(HcStat, u64)>,
    }
    let (syn4, inner4) = probe_frame(false, SYN);
    let (syn6, inner6) = probe_frame(true, SYN);
    let (ack4, ack_inner4) = probe_frame(false, ACK | PSH);
    let m = lb_common::hc_mark;
    let cases = vec![
        HcCase {
            name: "unmarked traffic to a VIP passes untouched, uncounted",
            mark: 0,
            frame: syn4.clone(),
            verdict: TC_ACT_OK,
            out: None,
            mark_after: 0,
            deltas: vec![],
        },
        HcCase {
            name: "another user's mark passes untouched, uncounted",
            mark: 0x1,
            frame: syn4.clone(),
            verdict: TC_ACT_OK,
            out: None,
            mark_after: 0x1,
            deltas: vec![],
        },
        HcCase {
            name: "a mark of ours without an entry passes untouched",
            mark: m(99),
            frame: syn4.clone(),
            verdict: TC_ACT_OK,
            out: None,
            mark_after: m(99),
            deltas: vec![(HcStat::PassUnknownMark, 1)],
        },
        HcCase {
            name: "dsr-ipip v4 SYN: encapsulated to its backend, mark cleared",
            mark: m(1),
            frame: syn4.clone(),
            verdict: TC_ACT_REDIRECT,
            out: Some(hc_encapsulated("10.0.0.11", &inner4)),
            mark_after: 0,
            deltas: vec![(HcStat::FwdIpip, 1)],
        },
        HcCase {
            name: "dsr-ipip v4 data segment: encapsulated the same way",
            mark: m(1),
            frame: ack4.clone(),
            verdict: TC_ACT_REDIRECT,
            out: Some(hc_encapsulated("10.0.0.11", &ack_inner4)),
            mark_after: 0,
            deltas: vec![(HcStat::FwdIpip, 1)],
        },
        HcCase {
            name: "dsr-ipip v6 SYN: IPv6 outer header, flow label copied",
            mark: m(4),
            frame: syn6.clone(),
            verdict: TC_ACT_REDIRECT,
            out: Some(hc_encapsulated("fd00::11", &inner6)),
            mark_after: 0,
            deltas: vec![(HcStat::FwdIpip, 1)],
        },
        HcCase {
            name: "dsr-l2 v4: unchanged, redirected to the backend as next hop",
            mark: m(2),
            frame: syn4.clone(),
            verdict: TC_ACT_REDIRECT,
            out: None,
            mark_after: 0,
            deltas: vec![(HcStat::FwdL2, 1)],
        },
        HcCase {
            name: "dsr-l2 v6: unchanged, redirected",
            mark: m(5),
            frame: syn6.clone(),
            verdict: TC_ACT_REDIRECT,
            out: None,
            mark_after: 0,
            deltas: vec![(HcStat::FwdL2, 1)],
        },
        HcCase {
            name: "unresolved neighbour: still redirected (bpf_redirect_neigh resolves it)",
            mark: m(3),
            frame: syn4.clone(),
            verdict: TC_ACT_REDIRECT,
            out: Some(hc_encapsulated("10.0.0.13", &inner4)),
            mark_after: 0,
            deltas: vec![(HcStat::FwdIpip, 1)],
        },
        HcCase {
            name: "backend behind another interface: redirected there",
            mark: m(6),
            frame: syn4.clone(),
            verdict: TC_ACT_REDIRECT,
            out: Some(hc_encapsulated("10.1.0.11", &inner4)),
            mark_after: 0,
            deltas: vec![(HcStat::FwdIpip, 1)],
        },
        HcCase {
            name: "no route to the backend: dropped, the probe fails",
            mark: m(7),
            frame: syn4.clone(),
            verdict: TC_ACT_SHOT,
            out: Some(hc_encapsulated(NOROUTE_V4, &inner4)),
            mark_after: 0,
            deltas: vec![(HcStat::DropNoRoute, 1)],
        },
        HcCase {
            name: "IPv6 probe with an IPv4 backend's mark: dropped untouched",
            mark: m(1),
            frame: syn6.clone(),
            verdict: TC_ACT_SHOT,
            out: None,
            mark_after: m(1),
            deltas: vec![(HcStat::DropFamily, 1)],
        },
        HcCase {
            name: "ARP with a mark of ours: dropped untouched",
            mark: m(1),
            frame: packet::eth(GW_MAC, LB_MAC, None, ETH_P_ARP, &[0u8; 28]),
            verdict: TC_ACT_SHOT,
            out: None,
            mark_after: m(1),
            deltas: vec![(HcStat::DropFamily, 1)],
        },
    ];
    in_world("hc", opts(), |w| {
        base(w)?;
        let want: std::collections::HashMap<u32, HcReal> = hc_reals()
            .into_iter()
            .map(|(mark, addr, mode)| {
                let a: IpAddr = addr.parse().unwrap();
                let real = HcReal {
                    addr: addr16(a),
                    family: lb_common::family_of(a),
                    mode,
                    _pad: [0; 2],
                };
                (mark, real)
            })
            .collect();
        w.dp.sync_hc_reals(&want)?;
        let mut failures = Vec::new();
        for c in &cases {
            let before = w.dp.hc_stats()?;
            let (verdict, out, mark_after) = w.run_hc(&c.frame, c.mark)?;
            let after = w.dp.hc_stats()?;
            let delta: Vec<(HcStat, u64)> = after
                .iter()
                .zip(&before)
                .filter(|((_, a), (_, b))| a != b)
                .map(|((s, a), (_, b))| (*s, a - b))
                .collect();
            let expected = c.out.clone().unwrap_or_else(|| c.frame.clone());
            let mut errs = Vec::new();
            if verdict != c.verdict {
                errs.push(format!("verdict {verdict}, want {}", c.verdict));
            }
            if out != expected {
                errs.push(format!(
                    "output differs:\n   got  {}\n   want {}",
                    hex(&out),
                    hex(&expected)
                ));
            }
            if mark_after != c.mark_after {
                errs.push(format!("mark {mark_after:#x}, want {:#x}", c.mark_after));
            }
            if delta != c.deltas {
                errs.push(format!("counters {delta:?}, want {:?}", c.deltas));
            }
            if errs.is_empty() {
                println!("ok   {}", c.name);
            } else {
                println!("FAIL {}: {}", c.name, errs.join("; "));
                failures.push(c.name);
            }
        }
        anyhow::ensure!(
            failures.is_empty(),
            "{} of {} xlb_hc fixtures failed: {failures:?}",
            failures.len(),
            cases.len()
        );
        Ok(())
    })
    .unwrap();
}
