//! Blocks reach NAT flows (issue 38): `xlb block` cut only conntrack's
//! flows, and NAT flows are never there, so a blocked client's NAT
//! connections went on and the command reported "0 established flows
//! cut". Now the purge walks the NAT flows too: the client's held
//! connections stop, the count says how many, its new connections are
//! refused while the block holds, and `xlb unblock` lets it back. And
//! `auto_block`, which counted established flows in DSR conntrack only,
//! judges a NAT VIP's sources too.

use std::time::{Duration, Instant};

use xlb_lab::{
    client::LoadOptions,
    scenario::{EventKind, LabRun},
    topology::{CLIENT_V4, VIP_V4},
};
use xlb_tests::{
    lab::{serial, teardown, wait_client_ms},
    nat_lab::{NatConfig, NatLabOptions, NatVip},
};

use super::{prefix, up};

/// Long-lived connections the client holds through the NAT VIP.
const HELD: u32 = 20;

/// The count of the `flows_cut` event about `what`, once it is out.
fn flows_cut(run: &LabRun, within: Duration) -> Option<u64> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        let cut = run.events().ok()?.into_iter().find_map(|e| {
            (e.kind == EventKind::Block && e.to.as_deref() == Some("flows_cut"))
                .then(|| e.reason.split(": ").last()?.split(' ').next()?.parse().ok())
                .flatten()
        });
        if cut.is_some() {
            return cut;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

#[test]
fn block_cuts_the_clients_nat_flows_and_refuses_new_ones() {
    let _serial = serial();
    let p = prefix("blk");
    let mut cfg = NatConfig::for_prefix(&p);
    cfg.vips = vec![NatVip::tcp("api", VIP_V4.into(), 80, 3)];
    let vip = cfg.vips[0].clone();
    let run = up(&p, &cfg, NatLabOptions::default());
    let held = run
        .start_client(LoadOptions {
            duration: Duration::from_secs(8),
            rate: 0,
            keepalive: 0,
            long: HELD,
            stream_interval: Duration::from_millis(100),
            stall_after: Duration::from_secs(1),
            timeout: Duration::from_secs(2),
            slice: Duration::from_millis(500),
            ..LoadOptions::new(vip.target())
        })
        .unwrap();
    wait_client_ms(&held, 2000);
    let client = format!("{CLIENT_V4}/32");
    run.block(&client, &["--vip", "api"]).unwrap();
    let cut = flows_cut(&run, Duration::from_secs(5));
    // New connections while the block holds: dropped (the default action).
    let refused = run
        .run_client(LoadOptions {
            duration: Duration::from_secs(2),
            rate: 5,
            keepalive: 0,
            timeout: Duration::from_millis(500),
            ..LoadOptions::new(vip.target())
        })
        .unwrap();
    let report = held.join().unwrap();
    run.unblock(&client, &["--vip", "api"]).unwrap();
    let after = run
        .run_client(LoadOptions {
            duration: Duration::from_secs(1),
            rate: 5,
            keepalive: 0,
            timeout: Duration::from_secs(1),
            ..LoadOptions::new(vip.target())
        })
        .unwrap();
    let stopped: Vec<_> = report.long.iter().filter(|l| !l.kept_flowing).collect();
    eprintln!(
        "[{p}] {HELD} held connections; block of {client}: flows cut {cut:?}; held connections \
         stopped: {} ({:?}); new connections while blocked: {:?}; after unblock: {:?}",
        stopped.len(),
        report
            .long
            .iter()
            .map(|l| l.end.as_str())
            .collect::<Vec<_>>(),
        refused.summary.counts,
        after.summary.counts,
    );
    assert_eq!(report.long.len(), HELD as usize);
    assert!(
        cut.is_some_and(|n| n >= u64::from(HELD)),
        "the block reported {cut:?} flows cut, not the {HELD} NAT flows the client held"
    );
    assert_eq!(
        stopped.len(),
        HELD as usize,
        "held NAT connections went on after the block"
    );
    assert!(refused.summary.requests >= 5, "{}", refused.render_text());
    assert_eq!(
        refused.summary.counts.ok,
        0,
        "a blocked client's new connection was served: {}",
        refused.render_text()
    );
    assert_eq!(
        after.summary.counts.ok,
        after.summary.requests,
        "after unblock: {}",
        after.render_text()
    );
    teardown(run);
}

/// `[vip.guard]` of the auto_block test: a source above 20 established
/// flows/s for 2 s is blocked for 30 s, its SYNs answered with a RST.
const AUTO_GUARD: &str =
    "auto_block = { above = \"20/s\", for = \"2s\", ttl = \"30s\", action = \"reset\" }";

/// `auto_block` judges a NAT VIP's flows: counted when the client
/// acknowledges the backend's SYN-ACK (the data plane sees both ways).
/// Before, only DSR conntrack counted established flows, and a NAT VIP's
/// heavy source was never blocked.
#[test]
fn auto_block_judges_a_nat_vips_established_flows() {
    let _serial = serial();
    let p = prefix("aub");
    let mut cfg = NatConfig::for_prefix(&p);
    cfg.vips = vec![NatVip {
        guard: Some(AUTO_GUARD.to_owned()),
        ..NatVip::tcp("api", VIP_V4.into(), 80, 3)
    }];
    let vip = cfg.vips[0].clone();
    let run = up(&p, &cfg, NatLabOptions::default());
    let started = Instant::now();
    let client = run
        .start_client(LoadOptions {
            duration: Duration::from_secs(10),
            rate: 60,
            keepalive: 0,
            timeout: Duration::from_secs(1),
            slice: Duration::from_secs(1),
            ..LoadOptions::new(vip.target())
        })
        .unwrap();
    let want = format!("{CLIENT_V4}/32");
    let mut blocked_after = None;
    while started.elapsed() < Duration::from_secs(9) {
        let auto = run
            .blocks()
            .unwrap_or_default()
            .into_iter()
            .any(|b| b.origin == lb_ctl::EntryOrigin::Auto && b.prefix == want);
        if auto {
            blocked_after = Some(started.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let report = client.join().unwrap();
    eprintln!(
        "[{p}] 60 connections/s from {want} to a NAT VIP with {AUTO_GUARD}: blocked after \
         {blocked_after:?}; client: {:?}\n{}",
        report.summary.counts,
        report.render_text()
    );
    let blocked_after = blocked_after.expect("auto_block never blocked the NAT VIP's heavy source");
    assert!(
        blocked_after < Duration::from_secs(8),
        "blocked after {blocked_after:?}"
    );
    assert!(report.summary.counts.ok > 0, "served before the block");
    assert!(
        report.summary.counts.refused > 0,
        "the block's RSTs were not seen: {:?}",
        report.summary.counts
    );
    teardown(run);
}
