//! `cargo xtask bench`: what xlb's health checking costs and how fast it
//! takes a hung application out of service. A benchmark, not a test: it
//! prints figures, the command and settings that produced them, and whether
//! each meets its target (only to say so; it fails only when it cannot
//! measure).
//!
//! Everything runs on 127.0.0.1 with the real prober
//! (`lb_user::health::scheduler::Scheduler`):
//! - detection: a VIP of three `xlb_lab::backend` servers, every probe
//!   report fed to the real VIP policy (`lb_user::health::policy::evaluate`)
//!   as the daemon feeds it. Once all three serve, one is switched to
//!   `Fault::Hang` (the listening socket stays open and the kernel completes
//!   handshakes; the application never answers). What clients notice is
//!   when it leaves the table: among answering peers that is the policy
//!   ejecting a slow outlier after `fall` late probes, before the hard
//!   Up→Down at `hang_timeout`, which is the second figure. Repeated with
//!   the switch at a random phase of the probe period.
//! - cost: 1,000 minimal HTTP servers in a child process (this binary
//!   re-executed with the hidden `--serve N`), so that the CPU time read with
//!   `getrusage(RUSAGE_SELF)` is the prober's alone.
//!
//! Usage: `xlb-health-bench [--quick] [--only detection|cost]`.
//!
//! The figures live in [`xlb_tests::bench::health`], one module each.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

fn main() -> anyhow::Result<()> {
    xlb_tests::bench::health::main()
}
