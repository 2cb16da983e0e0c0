//! Runs xlb's XDP programs through `BPF_PROG_TEST_RUN` inside a namespace of
//! their own, with a veth whose neighbours are fixed, so `bpf_fib_lookup`
//! gives known MACs and the expected bytes are exact: a fresh world per call
//! ([`in_world`]) or one loaded once and shared by a test binary's tests
//! ([`SharedWorld`]).

use std::{
    collections::HashMap,
    fs::File,
    net::IpAddr,
    sync::{Mutex, PoisonError},
};

use anyhow::Context as _;
use aya::programs::{TestRun as _, TestRunOptions};
use lb_common::{BACKEND_UP, BackendInfo, Globals, Stat, VipInfo, VipKey};
use lb_user::dataplane::{Dataplane, LoadOptions};

use crate::{
    netns::NetNs,
    packet::{Mac, addr16, family},
};

/// MAC of the LB's test interface `xf0` (the source of everything it sends).
pub const LB_MAC: Mac = [0x02, 0, 0, 0, 0, 0x01];
/// MAC of the peer `xf1`; clients' frames arrive addressed to `LB_MAC` from here.
pub const PEER_MAC: Mac = [0x02, 0, 0, 0, 0, 0x02];
/// MAC of `xg0`, a second interface: backends routed through it are
/// reached by redirect rather than `XDP_TX`.
pub const XG_MAC: Mac = [0x02, 0, 0, 0, 0, 0x03];
/// The router `10.0.0.254` on `xf0`'s segment, the gateway of 10.2.0.0/24:
/// backends there are not neighbours.
pub const GW_MAC: Mac = [0x02, 0, 0, 0, 0, 0x04];
const GW_V4: &str = "10.0.0.254";
pub const LB_V4: &str = "10.0.0.1";
pub const LB_V6: &str = "fd00::1";

/// A backend as the fixtures see it.
#[derive(Clone, Copy, Debug)]
pub struct Backend {
    pub id: u32,
    pub addr: IpAddr,
    /// Permanent neighbour entry; `None` = unresolved (no route for XDP).
    pub mac: Option<Mac>,
}

/// The fixture world: a namespace with `xf0`/`xf1`, the loaded programs and maps.
pub struct World {
    pub dp: Dataplane,
    pub ifindex: u32,
    pub backends: Vec<Backend>,
}

/// Backends every fixture world has (ids 1–5), on the `xf0` subnet.
/// Runs the XDP program `program` `repeat` times in one
/// `BPF_PROG_TEST_RUN`, the frame arriving on interface `ifindex` (of the
/// calling thread's namespace): the verdict, the frame it left and the
/// kernel's mean time per run. Any XDP program: xlb's, or another loaded
/// beside it (`bench::katran`).
pub fn run_xdp(
    program: &aya::programs::Xdp,
    ifindex: u32,
    frame: &[u8],
    repeat: u32,
) -> anyhow::Result<(u32, Vec<u8>, std::time::Duration)> {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex,
    // rx_queue_index, egress_ifindex. The kernel requires data_end to be
    // the input length and data/data_meta 0 (net/bpf/test_run.c).
    let md: [u32; 6] = [0, frame.len() as u32, 0, ifindex, 0, 0];
    let ctx: Vec<u8> = md.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let mut out = vec![0u8; frame.len() + 256];
    let res = program.test_run(TestRunOptions {
        data_in: Some(frame),
        data_out: Some(&mut out),
        ctx_in: Some(&ctx),
        repeat,
        ..Default::default()
    })?;
    out.truncate(res.data_size_out as usize);
    Ok((res.return_value, out, res.duration))
}

pub fn default_backends() -> Vec<Backend> {
    let b = |id, addr: &str, mac: Option<Mac>| Backend {
        id,
        addr: addr.parse().unwrap(),
        mac,
    };
    vec![
        b(1, "10.0.0.11", Some([0x02, 0, 0, 0, 0x0b, 0x01])),
        b(2, "10.0.0.12", Some([0x02, 0, 0, 0, 0x0b, 0x02])),
        b(3, "10.0.0.13", None),
        b(4, "fd00::11", Some([0x02, 0, 0, 0, 0x0b, 0x04])),
        b(5, "fd00::12", Some([0x02, 0, 0, 0, 0x0b, 0x05])),
        b(6, "10.1.0.11", Some([0x02, 0, 0, 0, 0x0b, 0x06])),
        // Behind the router: frames go to the router's MAC.
        b(7, "10.2.0.11", Some(GW_MAC)),
    ]
}

fn mac_str(m: &Mac) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Creates a namespace, runs `f` on a thread inside it with a fresh world,
/// and removes the namespace whatever happens.
pub fn in_world<T: Send>(
    tag: &str,
    opts: LoadOptions,
    f: impl FnOnce(&mut World) -> anyhow::Result<T> + Send,
) -> anyhow::Result<T> {
    crate::require_root();
    let ns = NetNs::new(tag)?;
    let (netns, ifindex) = prepare_namespace(&ns)?;
    on_thread_in(&netns, || {
        let mut world = World::load(&opts, ifindex)?;
        f(&mut world)
    })
}

/// One world for all the tests of a test binary, loaded once: loading the
/// object (verifier included) costs more than a fixture does. The tests take
/// it one at a time, as each sets the map state it starts from.
///
/// The namespace is held by an open descriptor, not by a name: its name is
/// removed as soon as the world is loaded, and the kernel frees it with the
/// descriptor when the test binary exits, however it exits (a `static` is
/// never dropped).
pub struct SharedWorld {
    netns: File,
    world: Mutex<World>,
}

impl SharedWorld {
    /// Creates the namespace and its links and loads the programs, as
    /// [`in_world`] does.
    pub fn new(tag: &str, opts: &LoadOptions) -> anyhow::Result<Self> {
        crate::require_root();
        let ns = NetNs::new(tag)?;
        let (netns, ifindex) = prepare_namespace(&ns)?;
        let world = on_thread_in(&netns, || World::load(opts, ifindex))?;
        Ok(Self {
            netns,
            world: Mutex::new(world),
        })
    }

    /// Runs `f` on a thread inside the namespace, alone with the world.
    pub fn run<T: Send>(
        &self,
        f: impl FnOnce(&mut World) -> anyhow::Result<T> + Send,
    ) -> anyhow::Result<T> {
        // A failed test poisons the lock; the next one still starts from
        // the state it sets itself.
        let mut guard = self.world.lock().unwrap_or_else(PoisonError::into_inner);
        let world: &mut World = &mut guard;
        on_thread_in(&self.netns, || f(world))
    }
}

/// Gives `ns` the fixture links and returns a descriptor that keeps it alive
/// and the ifindex of `xf0`.
fn prepare_namespace(ns: &NetNs) -> anyhow::Result<(File, u32)> {
    setup_links(ns, &default_backends())?;
    let ifindex = ns.ifindex("xf0")?;
    let path = format!("/var/run/netns/{}", ns.name());
    let netns = File::open(&path).with_context(|| format!("opening {path}"))?;
    Ok((netns, ifindex))
}

/// Runs `f` on a thread of its own moved into `netns`: `BPF_PROG_TEST_RUN`
/// looks the ingress ifindex up in the calling thread's namespace, and only
/// that thread moves.
fn on_thread_in<T: Send>(
    netns: &File,
    f: impl FnOnce() -> anyhow::Result<T> + Send,
) -> anyhow::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(netns, nix::sched::CloneFlags::CLONE_NEWNET)
                .context("entering the fixture namespace")?;
            f()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("fixture thread panicked"))?
    })
}

fn setup_links(ns: &NetNs, backends: &[Backend]) -> anyhow::Result<()> {
    add_interfaces(ns)?;
    // bpf_fib_lookup from XDP answers FWD_DISABLED unless forwarding is on
    // for the ingress device (checked on 6.18); the daemon turns it on for
    // its interface the same way.
    ns.exec(&[
        "sysctl",
        "-qw",
        "net.ipv4.conf.xf0.forwarding=1",
        "net.ipv6.conf.xf0.forwarding=1",
    ])?;
    add_neighbours(ns, backends)
}

/// `xf0` (the LB's interface, v4 and v6 addresses) with its peer `xf1`, and
/// `xg0`, the second interface, with its peer `xg1`.
fn add_interfaces(ns: &NetNs) -> anyhow::Result<()> {
    ns.ip(&["link", "add", "xf0", "type", "veth", "peer", "name", "xf1"])?;
    ns.ip(&[
        "link",
        "set",
        "xf0",
        "address",
        &mac_str(&LB_MAC),
        "mtu",
        "1500",
        "up",
    ])?;
    ns.ip(&["link", "set", "xf1", "address", &mac_str(&PEER_MAC), "up"])?;
    ns.ip(&["addr", "add", &format!("{LB_V4}/24"), "dev", "xf0"])?;
    ns.ip(&["link", "add", "xg0", "type", "veth", "peer", "name", "xg1"])?;
    ns.ip(&["link", "set", "xg0", "address", &mac_str(&XG_MAC), "up"])?;
    ns.ip(&["link", "set", "xg1", "up"])?;
    ns.ip(&["addr", "add", "10.1.0.1/24", "dev", "xg0"])?;
    ns.ip(&[
        "neigh",
        "add",
        GW_V4,
        "lladdr",
        &mac_str(&GW_MAC),
        "dev",
        "xf0",
        "nud",
        "permanent",
    ])?;
    ns.ip(&["route", "add", "10.2.0.0/24", "via", GW_V4, "dev", "xf0"])?;
    ns.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{LB_V6}/64"),
        "dev",
        "xf0",
        "nodad",
    ])?;
    Ok(())
}

/// A permanent neighbour entry for every backend that has a MAC, on the
/// interface whose subnet it is in.
fn add_neighbours(ns: &NetNs, backends: &[Backend]) -> anyhow::Result<()> {
    for b in backends.iter().filter(|b| !b.behind_the_router()) {
        if let Some(mac) = b.mac {
            let dev = if b.on_second_interface() {
                "xg0"
            } else {
                "xf0"
            };
            ns.ip(&[
                "neigh",
                "add",
                &b.addr.to_string(),
                "lladdr",
                &mac_str(&mac),
                "dev",
                dev,
                "nud",
                "permanent",
            ])?;
        }
    }
    Ok(())
}

impl Backend {
    /// Whether the backend is in 10.2.0.0/24, reached through the router
    /// on `xf0` (its `mac` is the router's).
    pub fn behind_the_router(&self) -> bool {
        self.addr.to_string().starts_with("10.2.0.")
    }

    /// Whether the backend is on `xg0`'s subnet (10.1.0.0/24): the LB
    /// reaches it by redirect, from `XG_MAC`, rather than by `XDP_TX`.
    pub fn on_second_interface(&self) -> bool {
        self.addr.to_string().starts_with("10.1.0.")
    }

    /// The MAC the LB sends from to reach this backend.
    pub fn egress_mac(&self) -> Mac {
        if self.on_second_interface() {
            XG_MAC
        } else {
            LB_MAC
        }
    }
}

/// The verifier's limit on instructions processed for one program
/// (`BPF_COMPLEXITY_LIMIT_INSNS`).
pub const VERIFIER_LIMIT: u32 = 1_000_000;

/// The running kernel's release, as `uname -r` prints it.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".to_string(), |s| s.trim().to_string())
}

impl World {
    /// Loads the programs (from a thread inside the namespace) and writes
    /// the default backends.
    fn load(opts: &LoadOptions, ifindex: u32) -> anyhow::Result<Self> {
        let dp = Dataplane::load(opts).context("loading the XDP object")?;
        let mut world = Self {
            dp,
            ifindex,
            backends: default_backends(),
        };
        world.write_backends()?;
        Ok(world)
    }

    /// Instructions the verifier processed to load program `name` (an XDP
    /// program of the object), `None` where the kernel does not report
    /// them (`verified_insns`, 5.16).
    pub fn verified_insns(&mut self, name: &'static str) -> anyhow::Result<Option<u32>> {
        let prog: &mut aya::programs::Xdp = self.dp.program(name)?;
        Ok(prog.info()?.verified_instruction_count())
    }

    /// One line for reports: what the verifier processed for `xlb_lb` on
    /// this kernel, against its limit, or that the kernel does not say.
    pub fn verifier_line(&mut self) -> anyhow::Result<String> {
        let name = lb_common::PROG_LB;
        let kernel = kernel_release();
        Ok(match self.verified_insns(name)? {
            Some(n) => format!(
                "verifier: {name} processed {n} instructions (limit {VERIFIER_LIMIT}, {:.0} % used) on kernel {kernel}",
                f64::from(n) * 100.0 / f64::from(VERIFIER_LIMIT)
            ),
            None => format!(
                "verifier: {name} loaded on kernel {kernel}, which does not report the instructions processed (verified_insns, 5.16)"
            ),
        })
    }

    /// The id of `xlb_lb`'s map `name`: the map the program really uses,
    /// to check or write what `Dataplane` never would.
    pub fn lb_map_id(&mut self, name: &str) -> anyhow::Result<u32> {
        let prog: &mut aya::programs::Xdp = self.dp.program(lb_common::PROG_LB)?;
        prog.info()?
            .map_ids()?
            .unwrap_or_default()
            .into_iter()
            .find(|&id| aya::maps::MapInfo::from_id(id).is_ok_and(|m| m.name() == name.as_bytes()))
            .with_context(|| format!("xlb_lb uses no {name} map"))
    }

    /// Writes every backend as up, generation 0.
    pub fn write_backends(&mut self) -> anyhow::Result<()> {
        for b in self.backends.clone() {
            self.set_backend_state(b.id, BACKEND_UP, 0)?;
        }
        Ok(())
    }

    pub fn backend(&self, id: u32) -> Backend {
        *self
            .backends
            .iter()
            .find(|b| b.id == id)
            .expect("known backend id")
    }

    pub fn set_backend_state(&mut self, id: u32, state: u8, generation: u32) -> anyhow::Result<()> {
        let b = self.backend(id);
        self.dp.set_backend(
            id,
            &BackendInfo {
                addr: addr16(b.addr),
                generation,
                state,
                family: family(b.addr),
                port: 0,
            },
        )?;
        Ok(())
    }

    pub fn set_globals(&mut self, hash_key: [u64; 2], udp_timeout_ns: u64) -> anyhow::Result<()> {
        let g = Globals {
            layout_version: lb_common::LAYOUT_VERSION,
            ring_stride: self.dp.ring_stride(),
            hash_key,
            udp_timeout_ns,
            encap_src_v4: addr16(LB_V4.parse().unwrap()),
            encap_src_v6: addr16(LB_V6.parse().unwrap()),
            encap_v4_host_bits: 0,
            _pad: [0; 7],
            // No reply budget: a fixture that tests it sets one.
            reply_interval_ns: 0,
            reply_tolerance_ns: 0,
        };
        self.dp.set_globals(&g)?;
        Ok(())
    }

    /// Adds a VIP whose live table (half 0) is `table`.
    #[expect(
        clippy::too_many_arguments,
        reason = "fixture tables read best with every field inline"
    )]
    pub fn add_vip(
        &mut self,
        vip_id: u32,
        addr: &str,
        port: u16,
        proto: u8,
        mode: u8,
        down_policy: u8,
        table: &[u32],
    ) -> anyhow::Result<VipKey> {
        let key = VipKey::new(addr.parse()?, port, proto);
        let slots: Vec<(u32, u32)> = table
            .iter()
            .enumerate()
            .map(|(i, &id)| (i as u32, id))
            .collect();
        self.dp.write_ring(vip_id, 0, &slots)?;
        self.dp.set_vip(
            &key,
            &VipInfo {
                vip_id,
                table_size: table.len() as u32,
                active: 0,
                mode,
                down_policy,
                host_services: 0,
                second_chance: 0,
                key,
            },
        )?;
        Ok(key)
    }

    /// Runs `prog` once on `frame`, arriving on `xf0`.
    pub fn run(&mut self, prog: &'static str, frame: &[u8]) -> anyhow::Result<(u32, Vec<u8>)> {
        let (verdict, out, _) = self.run_repeat(prog, frame, 1)?;
        Ok((verdict, out))
    }

    /// Runs `prog` `repeat` times in one `BPF_PROG_TEST_RUN`; also returns
    /// the kernel's mean time per run. The kernel reuses one buffer across
    /// repeats, so from the second run on the program sees its own output.
    pub fn run_repeat(
        &mut self,
        prog: &'static str,
        frame: &[u8],
        repeat: u32,
    ) -> anyhow::Result<(u32, Vec<u8>, std::time::Duration)> {
        let ifindex = self.ifindex;
        let program = self.dp.program::<aya::programs::Xdp>(prog)?;
        run_xdp(program, ifindex, frame, repeat)
            .with_context(|| format!("BPF_PROG_TEST_RUN of {prog}"))
    }

    /// Runs the tc classifier `xlb_hc` once on `frame`, as if a socket with
    /// mark `mark` sent it out of `xf0`. Returns the verdict, the frame and
    /// the skb mark afterwards.
    pub fn run_hc(&mut self, frame: &[u8], mark: u32) -> anyhow::Result<(u32, Vec<u8>, u32)> {
        // The head of struct __sk_buff up to `ifindex`: len, pkt_type, mark,
        // queue_mapping, protocol, vlan_present, vlan_tci, vlan_proto,
        // priority, ingress_ifindex, ifindex. Of these the kernel accepts only
        // mark, priority and the ifindexes non-zero (net/bpf/test_run.c,
        // convert___skb_to_skb); ifindex > 1 makes it the skb's device.
        let mut head = [0u32; 11];
        head[2] = mark;
        head[10] = self.ifindex;
        let ctx: Vec<u8> = head.iter().flat_map(|w| w.to_ne_bytes()).collect();
        // The kernel writes back the whole __sk_buff (ENOSPC if smaller).
        let mut ctx_out = vec![0u8; 256];
        let mut out = vec![0u8; frame.len() + 256];
        let program = self
            .dp
            .program::<aya::programs::SchedClassifier>(lb_common::PROG_HC)?;
        let res = program
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ctx_in: Some(&ctx),
                ctx_out: Some(&mut ctx_out),
                ..Default::default()
            })
            .context("BPF_PROG_TEST_RUN of xlb_hc")?;
        out.truncate(res.data_size_out as usize);
        let mark_out = u32::from_ne_bytes(ctx_out[8..12].try_into().unwrap());
        Ok((res.return_value, out, mark_out))
    }

    pub fn stats(&self) -> anyhow::Result<HashMap<Stat, u64>> {
        Ok(self.dp.stats()?)
    }
}

/// Counter changes between two snapshots (only the non-zero ones).
pub fn stat_delta(before: &HashMap<Stat, u64>, after: &HashMap<Stat, u64>) -> Vec<(Stat, u64)> {
    let mut d: Vec<(Stat, u64)> = Stat::ALL
        .iter()
        .filter_map(|s| {
            let delta = after.get(s).copied().unwrap_or(0) - before.get(s).copied().unwrap_or(0);
            (delta != 0).then_some((*s, delta))
        })
        .collect();
    d.sort();
    d
}

/// The data plane's conntrack clock, as the daemon reads it.
pub use lb_user::dataplane::ktime_coarse_ns;
