//! `cargo xtask bench --bin xlb-tput-bench`: how many packets per second
//! one CPU pushes through xlb, against what users would pick instead, in
//! one run with the cases alternating round by round.
//!
//! This kernel has no pktgen; `BPF_PROG_TEST_RUN` with
//! `BPF_F_TEST_XDP_LIVE_FRAMES` plays its part: frames go through the real
//! XDP driver path of the LB's veth in the lab (`XDP_TX` out of it,
//! `XDP_PASS` up its stack). The program run is `xlb_bench_gen`, which
//! writes the template back into the recycled frame (live mode does not
//! copy it again, so xlb would otherwise see its own IPIP output), gives it
//! a new source for the new-flow cases, and tail-calls the case's program:
//!
//! 1. generator only (`XDP_DROP`); 2. bare floor: swap MACs, `XDP_TX`
//!    (`xlb_minimal`); 3./4. xlb `dsr-ipip`, an established flow / every
//!    frame a SYN from a new source; 5./6. the same for `dsr-l2`; 7. kernel
//!    forwarding (`XDP_PASS`, routed to a backend, no nftables); 8. the same
//!    path with nftables DNAT of the VIP (`numgen random mod 3`); 9. the
//!    same with masquerade of what was DNATed too: the full NAT that
//!    xlb's NAT mode does (issue 27).
//!
//! The generator and the LB share CPU 0 (this thread, pinned); the
//! bridge-side veth's NAPI runs in its own thread pinned to CPU 1, with the
//! bridge and the backends behind it, so the figures do not depend on the
//! scheduler. The offered rate is frames / wall time of the call: what the
//! LB's CPU could push. What reached the backends is printed for
//! information; on a 2-CPU machine their stack is the bottleneck.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

fn main() -> anyhow::Result<()> {
    xlb_tests::bench::tput::main()
}
