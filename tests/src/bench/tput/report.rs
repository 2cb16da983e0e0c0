//! The report of `xlb-tput-bench`: one line per case (median offered rate
//! with its spread, LB-CPU ns per packet, ratios against the floor and
//! nftables, the downstream's load), and the figures for `cargo xtask
//! bench`'s summary.

use super::{Case, Sample};
use crate::bench::figures::{Figure, Target, median};
use crate::bench::nat_tput::{NFT_MASQ, XLB_NAT_EST};

pub(super) const GEN_ONLY: &str = "generator only (XDP_DROP)";
pub(super) const FLOOR: &str = "bare floor (swap MACs, XDP_TX)";
pub(super) const IPIP_EST: &str = "xlb dsr-ipip, established";
pub(super) const IPIP_NEW: &str = "xlb dsr-ipip, new flows (many sources)";
pub(super) const L2_EST: &str = "xlb dsr-l2, established";
pub(super) const L2_NEW: &str = "xlb dsr-l2, new flows (many sources)";
pub(super) const FORWARD: &str = "kernel forwarding, no nftables";
pub(super) const NAT: &str = "nftables DNAT (numgen random mod 3)";

const BENCH: &str = "xlb-tput-bench";
const GROUP: &str = "throughput, one core";
const GROUP_NS: &str = "LB CPU per packet, live frames";

/// The goals of issue 11: xlb `dsr-ipip` established against nftables DNAT
/// and against the bare floor (ratios of Mpps).
const TARGET_VS_NAT: f64 = 5.0;
const TARGET_VS_FLOOR: f64 = 0.6;
/// Issue 27's goal: xlb NAT established against nftables doing the same
/// (DNAT + masquerade).
const TARGET_NAT_VS_MASQ: f64 = 4.0;

/// Per round: Mpps.
fn mpps(s: &[Sample]) -> Vec<f64> {
    s.iter().map(|x| x.pps() / 1e6).collect()
}

fn index(cases: &[Case], name: &str) -> usize {
    cases
        .iter()
        .position(|c| c.name == name)
        .expect("every named case is measured")
}

/// The median Mpps of case `name`.
fn median_mpps(cases: &[Case], samples: &[Vec<Sample>], name: &str) -> f64 {
    median(&mpps(&samples[index(cases, name)]))
}

pub(super) fn print(setup: &str, cases: &[Case], samples: &[Vec<Sample>]) {
    let floor = median_mpps(cases, samples, FLOOR);
    let nat = median_mpps(cases, samples, NAT);
    println!();
    println!(
        "throughput, one core (BPF_PROG_TEST_RUN live frames through xlb_bench_gen, which \
         restores the frame and tail-calls the case's program; {setup}; median of the rounds)"
    );
    println!(
        "offered = frames / wall time of the call, on CPU {}; ns/pkt = 1e9 / offered rate; \
         cpu ns = the calling thread's CPU time per frame; on-CPU = that time / wall (below \
         ~95 %, other work shared the LB's CPU and the offered rates are low); napi = the \
         bridge-side NAPI thread on the other CPU, busy %; deliv = frames the bridge sent to \
         the backends (the floor's go back to the client)",
        super::LB_CPU
    );
    println!(
        "{:<40} {:>7} {:>13} {:>7} {:>7} {:>7} {:>7} {:>6} {:>5} {:>10}",
        "case",
        "Mpps",
        "spread",
        "ns/pkt",
        "cpu ns",
        "÷floor",
        "÷nft",
        "on-CPU",
        "napi",
        "deliv kpps"
    );
    let mut on_cpu_all = Vec::new();
    for (case, s) in cases.iter().zip(samples) {
        let m = mpps(s);
        let med = median(&m);
        let lo = m.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = m.iter().copied().fold(0.0, f64::max);
        let share = |f: fn(&Sample) -> f64| median(&s.iter().map(f).collect::<Vec<_>>());
        let cpu_ns = share(|x| x.cpu.as_secs_f64() * 1e9 / f64::from(x.frames));
        let on_cpu = share(|x| x.cpu.as_secs_f64() / x.wall.as_secs_f64() * 100.0);
        let napi = share(|x| x.napi.as_secs_f64() / x.wall.as_secs_f64() * 100.0);
        let deliv = share(|x| x.delivered as f64 / x.wall.as_secs_f64() / 1e3);
        on_cpu_all.push(on_cpu);
        println!(
            "{:<40} {med:>7.2} {:>13} {:>7.0} {cpu_ns:>7.0} {:>6.2}x {:>6.2}x {on_cpu:>6.0}% {napi:>4.0}% {deliv:>10.0}",
            case.name,
            format!("{lo:.2}..{hi:.2}"),
            1e3 / med,
            med / floor,
            med / nat,
        );
    }
    if on_cpu_all.iter().any(|&p| p < 95.0) {
        println!(
            "warning: the benchmark thread had CPU {} to itself only {:.0}–{:.0} % of the time: \
             other work ran there, so offered rates are low and noisy; run it on a quiet machine \
             (the cpu ns column is the less disturbed figure)",
            super::LB_CPU,
            on_cpu_all.iter().copied().fold(f64::INFINITY, f64::min),
            on_cpu_all.iter().copied().fold(0.0, f64::max)
        );
    }
    print_ratios(cases, samples, floor, nat);
    println!(
        "every case pays the generator's restore (a {}-byte bpf_xdp_store_bytes) and one tail \
         call; the generator-only case is that cost alone",
        lb_common::bench::BENCH_FRAME_LEN
    );
}

/// The summary's ratios: NAT against masquerade and dsr-ipip, dsr-ipip
/// against nftables DNAT and the floor.
fn print_ratios(cases: &[Case], samples: &[Vec<Sample>], floor: f64, nat: f64) {
    let nat_est = median_mpps(cases, samples, XLB_NAT_EST);
    let masq = median_mpps(cases, samples, NFT_MASQ);
    println!(
        "\nxlb nat established: {:.2}x nftables DNAT + masquerade (target >= {TARGET_NAT_VS_MASQ}x), \
         {:.2}x xlb dsr-ipip established",
        nat_est / masq,
        nat_est / median_mpps(cases, samples, IPIP_EST)
    );
    let ipip = median_mpps(cases, samples, IPIP_EST);
    println!(
        "\nxlb dsr-ipip established: {:.2}x nftables DNAT (target >= {TARGET_VS_NAT}x), \
         {:.2}x the bare floor (target >= {TARGET_VS_FLOOR}x)",
        ipip / nat,
        ipip / floor
    );
}

/// What each case is compared with in the summary.
fn baseline(name: &str) -> Option<&'static str> {
    match name {
        GEN_ONLY => None,
        FLOOR => Some(GEN_ONLY),
        NAT | NFT_MASQ => Some(FORWARD),
        _ => Some(FLOOR),
    }
}

pub(super) fn record(cases: &[Case], samples: &[Vec<Sample>]) {
    for (case, s) in cases.iter().zip(samples) {
        let mut f = Figure::median_of(BENCH, GROUP, case.name, &mpps(s), "Mpps");
        if let Some(b) = baseline(case.name) {
            f = f.against(b, median_mpps(cases, samples, b));
        }
        if case.name == IPIP_EST {
            f = f.target(Target::RatioAtLeast(TARGET_VS_FLOOR));
        }
        f.record();
    }
    Figure::median_of(
        BENCH,
        GROUP,
        IPIP_EST,
        &mpps(&samples[index(cases, IPIP_EST)]),
        "Mpps",
    )
    .against(NAT, median_mpps(cases, samples, NAT))
    .target(Target::RatioAtLeast(TARGET_VS_NAT))
    .record();
    Figure::median_of(
        BENCH,
        GROUP,
        XLB_NAT_EST,
        &mpps(&samples[index(cases, XLB_NAT_EST)]),
        "Mpps",
    )
    .against(NFT_MASQ, median_mpps(cases, samples, NFT_MASQ))
    .target(Target::RatioAtLeast(TARGET_NAT_VS_MASQ))
    .record();
    for (case, s) in cases.iter().zip(samples) {
        let ns: Vec<f64> = s.iter().map(|x| 1e9 / x.pps()).collect();
        Figure::median_of(BENCH, GROUP_NS, case.name, &ns, "ns").record();
    }
}
