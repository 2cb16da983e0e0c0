//! NAT mode end to end (issue 27): the real `xlb` in the namespaced lab,
//! in front of backends that are plain servers: no decapsulator, no VIP
//! address, no route through the load balancer (`xlb_tests::nat_lab`).
//!
//! - `traffic`: TCP and UDP through NAT VIPs, IPv4 and IPv6, backend port
//!   other than the VIP's; what the backend sees as its peer (the pool, or
//!   the client with `preserve_client`).
//! - `restart`: 200 long-lived connections across `kill -9` and a restart,
//!   and across a reload that changes the VIP's backends.
//! - `passive`: seed 000 (a hung backend out by passive evidence within a
//!   second, fewer than 1 % of requests failing) and seed 003 (a fleet slow
//!   together: nobody ejected, nothing failing).
//! - `pool`: port exhaustion of a tiny pool, and configurations refused.
//! - `flood`: a SYN flood from forged sources at a small pool (issue 38):
//!   real clients still served, the pool's occupancy bounded and shown.
//! - `block`: `xlb block` cuts a client's NAT flows, and `auto_block`
//!   judges a NAT VIP's sources (issue 38).
//! - `via`: data-path probes (`via = "vip"`) through the NAT path, and
//!   what they catch that a direct probe does not (a backend's way back to
//!   the pool address).
//!
//! Each test builds its own lab (own prefix, instance and socket) and tears
//! it down however it ends (`LabRun`'s Drop); a passing test also checks
//! that nothing is left. Tests run one at a time (`xlb_tests::lab::serial`).
//!
//! Needs root and the binaries: `cargo xtask build`, then
//! `cargo test -p xlb-tests --test nat -- --test-threads 1 --nocapture`.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

mod block;
mod flood;
mod passive;
mod pool;
mod restart;
mod traffic;
mod via;

use std::time::Duration;

use xlb_lab::{
    client::{LoadOptions, Report},
    scenario::{Event, LabRun},
};
use xlb_tests::{
    lab::transitions,
    nat_lab::{self, NatConfig, NatLabOptions, NatVip},
};

fn prefix(tag: &str) -> String {
    format!("nat{tag}{}", std::process::id() % 1000)
}

/// Brings a NAT lab up with `cfg`, or fails the test saying why.
fn up(p: &str, cfg: &NatConfig, opts: NatLabOptions) -> LabRun {
    nat_lab::up(p, cfg, opts).unwrap_or_else(|e| panic!("[{p}] NAT lab up: {e:#}"))
}

/// A short load: new connections and keep-alive ones, for `duration`.
fn short_load(vip: &NatVip, duration: Duration) -> LoadOptions {
    LoadOptions {
        duration,
        rate: 50,
        keepalive: 2,
        keepalive_interval: Duration::from_millis(100),
        timeout: Duration::from_secs(1),
        ..LoadOptions::new(vip.target())
    }
}

/// xlb's non-zero data-plane counters, for messages.
fn counters(run: &LabRun) -> String {
    match run.status() {
        Ok(s) => s
            .counters
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        Err(e) => format!("(status failed: {e})"),
    }
}

/// Asserts that backends `which` of `vip` only ever went to `up`.
fn assert_stayed_up(events: &[Event], vip: &NatVip, which: impl IntoIterator<Item = usize>) {
    for i in which {
        let t = transitions(events, &vip.name, vip.backend_addr(i));
        assert!(
            t.iter().all(|e| e.to.as_deref() == Some("up")),
            "{} b{i} changed state: {t:?}",
            vip.name
        );
    }
}

/// Asserts a load that must have gone through without a failure, over at
/// least two backends.
fn assert_clean(what: &str, report: &Report, min_requests: u64) {
    assert!(
        report.summary.requests >= min_requests,
        "{what}: {} requests, expected at least {min_requests}: {}",
        report.summary.requests,
        report.render_text()
    );
    assert_eq!(
        report.summary.failures,
        0,
        "{what}: {}",
        report.render_text()
    );
    assert!(
        report.summary.per_backend.len() >= 2,
        "{what}: answered only by {:?}",
        report.summary.per_backend
    );
}
