//! NAT state lives in pinned maps: long-lived connections outlive the
//! daemon (`kill -9`, restart) and a reload that changes the VIP's
//! backends.

use std::{collections::BTreeSet, thread, time::Duration};

use xlb_lab::client::LoadOptions;
use xlb_tests::{
    lab::{serial, teardown, wait_client_ms},
    nat_lab::{NatConfig, NatLabOptions, NatVip},
};

use super::{assert_stayed_up, prefix, up};

/// Long-lived connections held through the restart and the reload.
const LONG: u32 = 200;

/// 200 long-lived `/stream` connections through a NAT VIP (to b1 and b2)
/// keep flowing without a stall across `kill -9` of the daemon and a
/// restart with a file that adds b3, then across a reload that adds b4 and
/// removes b3 (which holds none of them: it joined after they opened).
/// Short connections keep working throughout and no SYN is dropped for
/// want of a backend.
#[test]
fn long_connections_survive_kill9_restart_and_reload() {
    let _serial = serial();
    let p = prefix("rst");
    let mut cfg = NatConfig::for_prefix(&p);
    cfg.vips = vec![NatVip {
        backends: vec![1, 2],
        ..NatVip::tcp("web", xlb_lab::topology::VIP_V4.into(), 80, 2)
    }];
    let opts = NatLabOptions {
        backends: 4,
        ..NatLabOptions::default()
    };
    let mut run = up(&p, &cfg, opts);
    let vip = cfg.vips[0].clone();
    let client = run
        .start_client(LoadOptions {
            duration: Duration::from_secs(12),
            rate: 20,
            keepalive: 0,
            long: LONG,
            stream_interval: Duration::from_millis(200),
            stall_after: Duration::from_millis(1500),
            timeout: Duration::from_secs(3),
            slice: Duration::from_millis(500),
            ..LoadOptions::new(vip.target())
        })
        .unwrap();
    wait_client_ms(&client, 2000);
    let drops_before = run.counter("drop_no_backend").unwrap();
    run.kill9_daemon().unwrap();
    let killed_ms = client.elapsed().as_millis();
    cfg.vips[0].backends = vec![1, 2, 3];
    std::fs::write(run.config_path(), cfg.render()).unwrap();
    thread::sleep(Duration::from_millis(500));
    run.start_daemon().unwrap();
    let status = run.status().unwrap();
    eprintln!(
        "[{p}] daemon killed at {killed_ms} ms, restarted with b3 added, answering at {} ms; adopted = {}",
        client.elapsed().as_millis(),
        status.adopted
    );
    assert!(
        status.adopted,
        "the restarted daemon did not adopt the pinned maps"
    );
    for i in [1, 2] {
        let b = status.backend("web", vip.backend_addr(i)).unwrap();
        assert_eq!(b.state, "up", "b{i} not adopted up: {}", status.summary());
    }
    run.wait_all_up(Duration::from_secs(5)).unwrap();

    wait_client_ms(&client, 6000);
    cfg.vips[0].backends = vec![1, 2, 4];
    let out = run.reload(&cfg.render()).unwrap();
    eprintln!(
        "[{p}] xlb reload (b4 in, b3 out) at {} ms: {}",
        client.elapsed().as_millis(),
        out.trim()
    );
    let want: BTreeSet<String> = [1, 2, 4].map(|i| vip.backend_addr(i).to_string()).into();
    run.wait_until("web to have b1, b2 and b4", Duration::from_secs(5), |s| {
        s.vip("web").is_some_and(|v| {
            v.backends
                .iter()
                .map(|b| b.address.clone())
                .collect::<BTreeSet<_>>()
                == want
        })
    })
    .unwrap();
    let report = client.join().unwrap();
    let drops_after = run.counter("drop_no_backend").unwrap();
    let events = run.events().unwrap();
    let spread: BTreeSet<&str> = report
        .long
        .iter()
        .filter_map(|l| l.backend.as_deref())
        .collect();
    eprintln!(
        "[{p}] long connections: {} of {} kept flowing (backends {spread:?}), longest gap {} ms; \
         short connections {} ok, {} failed; drop_no_backend {drops_before} -> {drops_after}",
        report.summary.long_total - report.summary.long_broken,
        report.summary.long_total,
        report
            .long
            .iter()
            .map(|l| l.longest_gap_ms)
            .max()
            .unwrap_or(0),
        report.summary.counts.ok,
        report.summary.failures
    );
    assert_eq!(report.summary.long_total, u64::from(LONG));
    let broken: Vec<_> = report.long.iter().filter(|l| !l.kept_flowing).collect();
    assert!(
        broken.is_empty(),
        "{} long connections broke, e.g. {:?}",
        broken.len(),
        broken.first()
    );
    assert_eq!(
        spread,
        BTreeSet::from(["b1", "b2"]),
        "the long connections opened before b3 and b4 existed"
    );
    assert_eq!(report.summary.failures, 0, "{}", report.render_text());
    assert_eq!(
        drops_after, drops_before,
        "SYNs dropped for want of a backend"
    );
    assert_stayed_up(&events, &vip, [1, 2]);
    teardown(run);
}
