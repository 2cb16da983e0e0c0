//! `xlb-tput-bench` (see its binary for what it measures): the cases, the
//! command line, and the rounds. `generator` drives the frame generator, `topo`
//! the lab around it, `report` prints and records the figures.

mod generator;
mod report;
mod topo;
pub(crate) use topo::nft;

use std::{collections::HashMap, time::Duration};

use anyhow::{Context as _, bail};
use aya::programs::{Xdp, XdpMode};
use lb_common::{
    DOWN_POLICY_REHASH, MODE_DSR_IPIP, MODE_DSR_L2, PROG_LB, PROG_MINIMAL, PROG_PASS, PROTO_TCP,
    Stat,
    bench::{GEN_MANY_SOURCES, PROG_BENCH_DROP, PROG_BENCH_GEN},
};
use lb_user::dataplane::{Dataplane, LoadOptions};
use xlb_lab::{
    Lab, LabConfig,
    topology::{
        LB_V4, VIP_V4, VIP2_V4, backend_mac, backend_v4, client_mac, ifindex, in_netns, lb_mac,
    },
};

pub use generator::{Generator, live_run};
use report::{FLOOR, FORWARD, GEN_ONLY, IPIP_EST, IPIP_NEW, L2_EST, L2_NEW, NAT};

use crate::{
    bench::{
        dataplane::{XDP_DROP, XDP_PASS, XDP_TX},
        nat_tput::{Masquerade, NAT_VIP, NAT_VIP_PORT, NFT_MASQ, XLB_NAT_EST},
        print_command,
    },
    harness::{Backend, World},
    packet::{ACK, Flow, SYN, addr16, csum},
};

const USAGE: &str = "usage: xlb-tput-bench [--rounds N] [--frames N] [--batch N] [--ct-size N]
  --rounds N    measured rounds, every case once per round (default 9, at least 1)
  --frames N    frames per case per round (default 2000000)
  --batch N     frames per live-frames batch, 1..=256 (default 64)
  --ct-size N   xlb's conntrack entries (default 1048576, the shipped default)
smoke run: --rounds 2 --frames 200000";

/// Namespace prefix of the lab; a run removes what an interrupted one left.
const PREFIX: &str = "xtput";
/// The generator and the LB run here; everything downstream on the other.
const LB_CPU: usize = 0;
const DOWNSTREAM_CPU: usize = 1;

#[derive(Clone, Debug, PartialEq)]
struct Args {
    rounds: usize,
    frames: u32,
    batch: u32,
    ct_size: u32,
}

impl Default for Args {
    fn default() -> Self {
        Self {
            rounds: 9,
            frames: 2_000_000,
            batch: 64,
            ct_size: lb_common::DEFAULT_CT_SIZE,
        }
    }
}

fn parse_args(args: impl IntoIterator<Item = String>) -> anyhow::Result<Args> {
    let mut out = Args::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        let mut number = |name: &str| -> anyhow::Result<u64> {
            let v = inline
                .clone()
                .or_else(|| args.next())
                .with_context(|| format!("{name} needs a value\n{USAGE}"))?;
            v.replace('_', "")
                .parse()
                .with_context(|| format!("{name} {v:?} is not a number\n{USAGE}"))
        };
        match flag.as_str() {
            "--rounds" => out.rounds = number("--rounds")? as usize,
            "--frames" => out.frames = u32::try_from(number("--frames")?)?,
            "--batch" => out.batch = u32::try_from(number("--batch")?)?,
            "--ct-size" => out.ct_size = u32::try_from(number("--ct-size")?)?,
            "-h" | "--help" => bail!("{USAGE}"),
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    if out.rounds == 0 || out.frames == 0 || !(1..=256).contains(&out.batch) || out.ct_size == 0 {
        bail!("--rounds, --frames and --ct-size must be positive, --batch 1..=256\n{USAGE}");
    }
    Ok(out)
}

/// One measured case: what the generator sends, to which program, and what
/// must be set up around it.
pub(crate) struct Case {
    pub(crate) name: &'static str,
    prog: &'static str,
    frame: Vec<u8>,
    flags: u32,
    verdict: u32,
    /// A SYN run once (plain test run) before measuring: puts the flow in
    /// xlb's conntrack, so every measured frame is established.
    establish: Option<Vec<u8>>,
    /// xlb's own counters must show every frame forwarded.
    xlb: bool,
    /// The nftables DNAT table is present during the run.
    nat: bool,
    /// … and the masquerade table (`bench::nat_tput`): full NAT.
    masquerade: bool,
    /// The SYN opened a NAT flow: mark it established.
    nat_flow: bool,
}

/// What one run of one case measured.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    pub(crate) frames: u32,
    /// Wall time of the test_run call.
    pub(crate) wall: Duration,
    /// CPU time of the calling thread (on the LB's CPU) during the call.
    pub(crate) cpu: Duration,
    /// CPU time of the downstream NAPI thread during the call.
    pub(crate) napi: Duration,
    /// Frames the bridge sent to the backends during the call.
    pub(crate) delivered: u64,
}

impl Sample {
    pub(crate) fn pps(&self) -> f64 {
        f64::from(self.frames) / self.wall.as_secs_f64()
    }
}

/// A 72-byte frame from the client to the LB's MAC, TCP checksum valid
/// (nftables' conntrack checks it).
fn template(flow: &Flow, flags: u8) -> Vec<u8> {
    let mut f = flow.frame(lb_mac(), client_mac(), None, flags, &[0u8; 18]);
    fix_tcp_checksum(&mut f);
    f
}

/// Sets the TCP checksum of an Ethernet + IPv4 (no options) + TCP frame.
pub fn fix_tcp_checksum(f: &mut [u8]) {
    f[50..52].fill(0);
    let mut pseudo = f[26..34].to_vec();
    let len = (f.len() - 34) as u16;
    pseudo.extend_from_slice(&[0, PROTO_TCP]);
    pseudo.extend_from_slice(&len.to_be_bytes());
    pseudo.extend_from_slice(&f[34..]);
    let c = csum(&pseudo);
    f[50..52].copy_from_slice(&c.to_be_bytes());
}

impl Case {
    fn new(name: &'static str, prog: &'static str, frame: Vec<u8>, verdict: u32) -> Self {
        Self {
            name,
            prog,
            frame,
            flags: 0,
            verdict,
            establish: None,
            xlb: prog == PROG_LB,
            nat: false,
            masquerade: false,
            nat_flow: false,
        }
    }

    /// `syn` runs once before the measurement.
    fn established(self, syn: Vec<u8>) -> Self {
        Self {
            establish: Some(syn),
            ..self
        }
    }

    fn many_sources(self) -> Self {
        Self {
            flags: GEN_MANY_SOURCES,
            ..self
        }
    }

    fn with_nat(self) -> Self {
        Self { nat: true, ..self }
    }

    fn nat_flow(self) -> Self {
        Self {
            nat_flow: true,
            ..self
        }
    }

    fn with_masquerade(self) -> Self {
        Self {
            nat: true,
            masquerade: true,
            ..self
        }
    }
}

/// The cases: issue 11's eight, in its order, then issue 27's NAT ones.
fn cases() -> Vec<Case> {
    let (vip, vip_l2, be1) = (VIP_V4.to_string(), VIP2_V4.to_string(), backend_v4(1));
    let est = Flow::tcp("192.0.2.1", 40001, &vip, 80);
    let est_l2 = Flow::tcp("192.0.2.1", 40001, &vip_l2, 80);
    // The generator rewrites the source per frame (lb_common::bench::gen_source).
    let new = Flow::tcp("198.18.0.0", 32768, &vip, 80);
    let new_l2 = Flow::tcp("198.18.0.0", 32768, &vip_l2, 80);
    let routed = Flow::tcp("192.0.2.1", 40001, &be1.to_string(), 80);
    let est_nat = Flow::tcp("192.0.2.1", 40001, NAT_VIP, NAT_VIP_PORT);
    let ack = |f: &Flow| template(f, ACK);
    let syn = |f: &Flow| template(f, SYN);
    vec![
        Case::new(GEN_ONLY, PROG_BENCH_DROP, ack(&est), XDP_DROP),
        Case::new(FLOOR, PROG_MINIMAL, ack(&est), XDP_TX),
        Case::new(IPIP_EST, PROG_LB, ack(&est), XDP_TX).established(syn(&est)),
        Case::new(IPIP_NEW, PROG_LB, syn(&new), XDP_TX).many_sources(),
        Case::new(L2_EST, PROG_LB, ack(&est_l2), XDP_TX).established(syn(&est_l2)),
        Case::new(L2_NEW, PROG_LB, syn(&new_l2), XDP_TX).many_sources(),
        Case::new(FORWARD, PROG_PASS, ack(&routed), XDP_PASS),
        Case::new(NAT, PROG_PASS, ack(&est), XDP_PASS).with_nat(),
        Case::new(NFT_MASQ, PROG_PASS, ack(&est), XDP_PASS).with_masquerade(),
        Case::new(XLB_NAT_EST, PROG_LB, ack(&est_nat), XDP_TX)
            .established(syn(&est_nat))
            .nat_flow(),
    ]
}

/// Runs the benchmark with the process's arguments.
pub fn main() -> anyhow::Result<()> {
    print_command("xlb-tput-bench");
    let args = parse_args(std::env::args().skip(1))?;
    crate::require_root();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    anyhow::ensure!(
        cpus > DOWNSTREAM_CPU,
        "this benchmark needs 2 CPUs (one for the LB, one downstream); {cpus} available"
    );
    let lab = Lab::up(&LabConfig {
        prefix: PREFIX.to_string(),
        backends: 3,
        flooder: false,
        nodes: 1,
    })?;
    topo::prepare(&lab)?;
    let cases = cases();
    let samples = in_netns(&lab.ns_lb(), || measure(&lab, &args, &cases))??;
    report::print(&args_line(&args), &cases, &samples);
    report::record(&cases, &samples);
    Ok(())
}

fn args_line(a: &Args) -> String {
    format!(
        "{} rounds, {} frames per case per round, batch {}, conntrack {} entries",
        a.rounds, a.frames, a.batch, a.ct_size
    )
}

/// Everything the rounds use, loaded once in the LB namespace.
struct Bench<'a> {
    lab: &'a Lab,
    w: World,
    generator: Generator,
    napi_pid: u32,
    batch: u32,
}

/// Sets up xlb and the downstream, runs a warm-up round, then the rounds,
/// every case once per round, starting one case later each round. Returns
/// the samples per case.
fn measure(lab: &Lab, args: &Args, cases: &[Case]) -> anyhow::Result<Vec<Vec<Sample>>> {
    super::set_affinity(0, LB_CPU)?;
    let mut b = Bench::new(lab, args)?;
    let warm = (args.frames / 10).max(10_000);
    for case in cases {
        b.run(case, warm, true)?;
    }
    let mut samples = vec![Vec::new(); cases.len()];
    for round in 0..args.rounds {
        for k in 0..cases.len() {
            let i = (round + k) % cases.len();
            samples[i].push(b.run(&cases[i], args.frames, false)?);
        }
        println!("round {}/{} done", round + 1, args.rounds);
    }
    Ok(samples)
}

impl<'a> Bench<'a> {
    fn new(lab: &'a Lab, args: &Args) -> anyhow::Result<Self> {
        let dp = Dataplane::load(&LoadOptions {
            ct_size: args.ct_size,
            nat_size: lb_common::nat::DEFAULT_NAT_SIZE,
            ring_stride: lb_common::DEFAULT_TABLE_SIZE,
            pin_dir: None,
            kernel: None,
        })
        .context("loading xlb's XDP object")?;
        let backends = (1..=lab.backend_count())
            .map(|i| Backend {
                id: i as u32,
                addr: backend_v4(i).into(),
                mac: Some(backend_mac(i)),
            })
            .collect();
        let mut w = World {
            dp,
            ifindex: ifindex(&lab.ns_lb(), lab.lb_ifname())?,
            backends,
        };
        configure_xlb(&mut w)?;
        let generator = Generator::new(&mut w.dp)?;
        // veth delivers XDP_TX frames only to a peer with an XDP program;
        // with one, it also queues every skb sent to the peer (the kernel-
        // forwarding cases) to the peer's NAPI rather than to the sending
        // CPU's backlog (veth_skb_is_eligible_for_gro, drivers/net/veth.c).
        let peer = lab.lb_peer_ifname();
        let pass = w.dp.program::<Xdp>(PROG_PASS)?;
        in_netns(&lab.ns_bridge(), || pass.attach(peer, XdpMode::Driver))?
            .with_context(|| format!("attaching xlb_pass to {peer}"))?;
        let napi_pid = topo::threaded_napi(&lab.ns_bridge(), peer, DOWNSTREAM_CPU)?;
        Ok(Self {
            lab,
            w,
            generator,
            napi_pid,
            batch: args.batch,
        })
    }

    /// One live run of `case` over `frames` frames, checked; `show` prints
    /// it as a warm-up, with xlb's counters.
    fn run(&mut self, case: &Case, frames: u32, show: bool) -> anyhow::Result<Sample> {
        let Self {
            lab, w, generator, ..
        } = self;
        generator.set(&mut w.dp, case.prog, &case.frame, case.flags)?;
        if let Some(syn) = &case.establish {
            let (v, _) = w.run(PROG_LB, syn)?;
            anyhow::ensure!(v == XDP_TX, "{}: SYN verdict {v}", case.name);
        }
        if case.nat_flow {
            crate::bench::nat_tput::mark_established(w)?;
        }
        let _nat = case
            .nat
            .then(|| {
                let backends: Vec<String> = w.backends.iter().map(|b| b.addr.to_string()).collect();
                topo::NatTable::add(&lab.ns_lb(), &VIP_V4.to_string(), 80, &backends)
            })
            .transpose()?;
        let _masquerade = case
            .masquerade
            .then(|| Masquerade::add(&lab.ns_lb()))
            .transpose()?;
        // Live mode reports no verdict: one plain run through the same chain.
        let (v, _) = w.run(PROG_BENCH_GEN, &case.frame)?;
        anyhow::ensure!(
            v == case.verdict,
            "{}: verdict {v}, want {}",
            case.name,
            case.verdict
        );
        let stats = w.stats()?;
        let (napi, delivered) = (topo::task_cpu(self.napi_pid)?, topo::delivered(lab)?);
        let cpu = super::thread_cpu();
        let wall = live_run(&mut w.dp, w.ifindex, frames, self.batch)?;
        let sample = Sample {
            frames,
            wall,
            cpu: super::thread_cpu() - cpu,
            napi: topo::task_cpu(self.napi_pid)?.saturating_sub(napi),
            delivered: topo::delivered(lab)? - delivered,
        };
        if show {
            println!(
                "warm-up: {:<40} {:>6.2} Mpps, {} delivered",
                case.name,
                sample.pps() / 1e6,
                sample.delivered
            );
        }
        if case.xlb {
            check_forwarded(case, frames, &stats, &w.stats()?, show)?;
        }
        Ok(sample)
    }
}

/// Fails unless xlb's counters show every frame of the run forwarded (so
/// the generator restored each one); `show` prints what they counted.
fn check_forwarded(
    case: &Case,
    frames: u32,
    before: &HashMap<Stat, u64>,
    after: &HashMap<Stat, u64>,
    show: bool,
) -> anyhow::Result<()> {
    let delta = crate::harness::stat_delta(before, after);
    let tx = after[&Stat::FwdTx] - before[&Stat::FwdTx];
    anyhow::ensure!(
        tx == u64::from(frames),
        "{}: xlb forwarded {tx} of {frames} frames (counters: {delta:?})",
        case.name,
    );
    if show {
        let shown: Vec<String> = delta
            .iter()
            .map(|(s, n)| format!("{} {n}", s.label()))
            .collect();
        println!("         xlb counters: {}", shown.join(", "));
    }
    Ok(())
}

/// Two VIPs over the lab's three backends: `dsr-ipip` on the lab's VIP,
/// `dsr-l2` on its second one; the shipped table size.
fn configure_xlb(w: &mut World) -> anyhow::Result<()> {
    w.write_backends()?;
    w.set_globals([0x1234, 0x5678], lb_common::DEFAULT_UDP_TIMEOUT_NS)?;
    let mut g = w.dp.globals()?;
    g.encap_src_v4 = addr16(LB_V4.into());
    w.dp.set_globals(&g)?;
    let n = w.backends.len() as u32;
    let table: Vec<u32> = (0..lb_common::DEFAULT_TABLE_SIZE)
        .map(|i| 1 + i % n)
        .collect();
    for (vip_id, vip, mode) in [(0, VIP_V4, MODE_DSR_IPIP), (1, VIP2_V4, MODE_DSR_L2)] {
        let addr = vip.to_string();
        w.add_vip(
            vip_id,
            &addr,
            80,
            PROTO_TCP,
            mode,
            DOWN_POLICY_REHASH,
            &table,
        )?;
    }
    crate::bench::nat_tput::configure_xlb_nat(w, &table)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> anyhow::Result<Args> {
        parse_args(s.split_whitespace().map(str::to_string))
    }

    #[test]
    fn parses_the_command_line() {
        let cases = [
            ("defaults", "", Some(Args::default())),
            (
                "smoke",
                "--rounds 2 --frames=200_000",
                Some(Args {
                    rounds: 2,
                    frames: 200_000,
                    ..Args::default()
                }),
            ),
            (
                "batch and ct",
                "--batch 256 --ct-size 65536",
                Some(Args {
                    batch: 256,
                    ct_size: 65_536,
                    ..Args::default()
                }),
            ),
            ("zero rounds", "--rounds 0", None),
            ("batch too big", "--batch 257", None),
            ("missing value", "--frames", None),
            ("not a number", "--frames many", None),
            ("unknown", "--fast", None),
        ];
        for (name, line, want) in cases {
            match (args(line), want) {
                (Ok(got), Some(want)) => assert_eq!(got, want, "{name}"),
                (Err(_), None) => {}
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn templates_are_generator_sized_with_valid_checksums() {
        for c in cases() {
            assert_eq!(
                c.frame.len(),
                lb_common::bench::BENCH_FRAME_LEN,
                "{}",
                c.name
            );
            assert_eq!(csum(&c.frame[14..34]), 0, "{}: IPv4 checksum", c.name);
            let mut f = c.frame.clone();
            fix_tcp_checksum(&mut f);
            assert_eq!(f, c.frame, "{}: TCP checksum", c.name);
        }
    }
}
