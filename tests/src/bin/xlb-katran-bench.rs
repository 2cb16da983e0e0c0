//! `cargo xtask bench --bin xlb-katran-bench`: xlb against Katran per
//! packet, side by side in one run, as issue 11 measured them first.
//!
//! Katran's XDP balancer is built from its own source with its default
//! features (`xlb_tests::bench::katran`) and configured like `xlb-bench`'s
//! `dsr-ipip` VIP: one IPv4 VIP, two reals, the client's flow established
//! in its LRU. Both programs then take the same 72-byte frames one packet
//! per run (`BPF_PROG_TEST_RUN`, each run a fresh copy of the frame, the
//! kernel's own timing), an established TCP packet and a SYN, next to xlb's
//! minimal program. The cases take turns run by run, so both sides of a
//! ratio are measured microseconds apart all through a round: this VM's
//! speed drifts (the minimal program's one-per-run cost moved from 44 to
//! 78 ns between runs of one day), and blocks of 20,000 runs of one case
//! after another gave per-round ratios from 0.6 to 2.2. A round's figure of
//! a case is the median of its runs, and each ratio the median of the
//! rounds' ratios. The targets are the intent: 10 % under Katran.
//!
//! Needs root, clang and bpftool (`cargo xtask setup`), and Katran's
//! source: `KATRAN_SRC` or a fetch of the pinned commit (without either, it
//! says so and measures nothing).

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]
#![allow(clippy::print_stdout, reason = "a benchmark's report goes to stdout")]

use std::time::Duration;

use xlb_tests::{
    bench::{
        dataplane::{Flows, SINGLES, XDP_TX, frame, in_world_with_ct},
        figures::{self, Figure, Target},
        katran::{self, Katran},
        print_command, rounds_arg,
    },
    harness::{World, run_xdp},
    packet::{ACK, SYN},
};

const BENCH: &str = "xlb-katran-bench";
const ROUNDS: usize = 15;
/// xlb's time ÷ Katran's, at most: 10 % under Katran (issue 11).
const TARGET: f64 = 0.9;
const GROUP_NS: &str = "one packet per run (ns)";
const GROUP_MIN: &str = "one packet per run: x the minimal program, median of per-round ratios";
const GROUP_KATRAN: &str = "xlb / Katran, median of per-round ratios";

/// Who runs a case.
#[derive(Clone, Copy)]
enum Prog {
    Xlb(&'static str),
    Katran,
}

struct Case {
    name: &'static str,
    prog: Prog,
    frame: Vec<u8>,
}

fn main() -> anyhow::Result<()> {
    print_command(BENCH);
    let rounds = rounds_arg(ROUNDS)?;
    // Without Katran's source (offline, no KATRAN_SRC) there is nothing to
    // compare with: said, and the other benchmarks of `cargo xtask bench`
    // still run.
    let (src, commit) = match katran::source() {
        Ok(s) => s,
        Err(e) => {
            println!("skipped: no Katran source: {e:#}");
            return Ok(());
        }
    };
    let cpu = katran::mcpu()?;
    let obj = katran::build(&src, cpu.as_deref())?;
    let built_for = cpu.map_or_else(
        || "clang's default BPF CPU".to_owned(),
        |c| format!("-mcpu={c} (KATRAN_MCPU)"),
    );
    println!(
        "Katran: {} at {commit}, built for {built_for} into {}",
        src.display(),
        obj.display()
    );
    let figures = in_world_with_ct(65_536, "kbench", |w| {
        let flows = Flows::install(w)?;
        let k = Katran::load(&obj, &flows.ipip)?;
        let (est, syn) = (frame(&flows.ipip, ACK), frame(&flows.ipip, SYN));
        check_same_work(w, &k, &est)?;
        check_same_work(w, &k, &syn)?;
        let cases = [
            Case {
                name: "minimal (xlb_minimal)",
                prog: Prog::Xlb(lb_common::PROG_MINIMAL),
                frame: est.clone(),
            },
            Case {
                name: "xlb established, dsr-ipip",
                prog: Prog::Xlb(lb_common::PROG_LB),
                frame: est.clone(),
            },
            Case {
                name: "Katran established, IPIP",
                prog: Prog::Katran,
                frame: est,
            },
            Case {
                name: "xlb new flow (SYN), dsr-ipip",
                prog: Prog::Xlb(lb_common::PROG_LB),
                frame: syn.clone(),
            },
            Case {
                name: "Katran new flow (SYN), IPIP",
                prog: Prog::Katran,
                frame: syn,
            },
        ];
        measure(w, &k, &cases, rounds)
    })?;
    println!(
        "xlb and Katran side by side ({rounds} rounds of {SINGLES} turns; each turn runs every \
         case once, one packet per run, a fresh 72-byte frame each; a case's figure per round \
         is the median of the kernel's own timing of its runs)"
    );
    figures::print(&figures);
    for f in &figures {
        f.record();
    }
    Ok(())
}

/// One run of `frame` through Katran, on the world's ingress interface as
/// xlb's runs are: the kernel's time and the frame it sent.
fn katran_once(w: &World, k: &Katran, frame: &[u8]) -> anyhow::Result<(Duration, Vec<u8>)> {
    let (verdict, out, t) = run_xdp(&k.prog, w.ifindex, frame, 1)?;
    anyhow::ensure!(verdict == XDP_TX, "Katran: verdict {verdict}, want XDP_TX");
    Ok((t, out))
}

/// Both programs do the same work on `frame`: each sends back (`XDP_TX`)
/// the client's IP packet unchanged behind one outer IPv4 header of
/// protocol 4 (IPIP) to a backend, so the timings compare like with like.
fn check_same_work(w: &mut World, k: &Katran, frame: &[u8]) -> anyhow::Result<()> {
    let (verdict, xlb, _) = w.run_repeat(lb_common::PROG_LB, frame, 1)?;
    anyhow::ensure!(verdict == XDP_TX, "xlb: verdict {verdict}, want XDP_TX");
    let (_, katran) = katran_once(w, k, frame)?;
    let inner = &frame[14..];
    for (who, out) in [("xlb", &xlb), ("Katran", &katran)] {
        anyhow::ensure!(
            out.len() == frame.len() + 20
                && out[12..14] == [0x08, 0x00]
                && out[14] == 0x45
                && out[23] == 4
                && &out[34..] == inner,
            "{who} did not send the frame on as IPIP: {out:02x?}"
        );
    }
    Ok(())
}

/// `rounds` rounds; in each, [`SINGLES`] turns of one run of every case
/// (the order rotating turn by turn), so both sides of a comparison are
/// measured within microseconds of each other all through the round. A
/// case's figure for the round is the median of its runs.
fn measure(
    w: &mut World,
    k: &Katran,
    cases: &[Case],
    rounds: usize,
) -> anyhow::Result<Vec<Figure>> {
    let mut ns = vec![Vec::with_capacity(rounds); cases.len()];
    let mut runs = vec![Vec::with_capacity(SINGLES as usize); cases.len()];
    for _ in 0..rounds {
        for r in &mut runs {
            r.clear();
        }
        for turn in 0..SINGLES as usize {
            for j in 0..cases.len() {
                let i = (turn + j) % cases.len();
                let c = &cases[i];
                let t = match c.prog {
                    Prog::Xlb(prog) => {
                        let (verdict, _, t) = w.run_repeat(prog, &c.frame, 1)?;
                        anyhow::ensure!(verdict == XDP_TX, "{}: verdict {verdict}", c.name);
                        t
                    }
                    Prog::Katran => katran_once(w, k, &c.frame)?.0,
                };
                runs[i].push(t.as_nanos() as f64);
            }
        }
        for (v, r) in ns.iter_mut().zip(&runs) {
            v.push(figures::median(r));
        }
    }
    let per_round =
        |a: usize, b: usize| -> Vec<f64> { ns[a].iter().zip(&ns[b]).map(|(x, y)| x / y).collect() };
    let mut figures: Vec<Figure> = cases
        .iter()
        .zip(&ns)
        .map(|(c, v)| Figure::median_of(BENCH, GROUP_NS, c.name, v, "ns"))
        .collect();
    for (i, c) in cases.iter().enumerate().skip(1) {
        figures.push(Figure::median_of(
            BENCH,
            GROUP_MIN,
            c.name,
            &per_round(i, 0),
            "x",
        ));
    }
    for (xlb, kat, name) in [
        (1, 2, "established, dsr-ipip against IPIP"),
        (3, 4, "new flow (SYN)"),
    ] {
        figures.push(
            Figure::median_of(BENCH, GROUP_KATRAN, name, &per_round(xlb, kat), "x")
                .target(Target::AtMost(TARGET)),
        );
    }
    Ok(figures)
}
