//! The source pool: exhaustion of a tiny one, and pools xlb must refuse.

use std::time::Duration;

use xlb_lab::{
    client::LoadOptions,
    scenario::{EventKind, LabRun},
    topology::{VIP_V4, VIP2_V4},
};
use xlb_tests::{
    lab::{serial, teardown, wait_client_ms},
    nat_lab::{self, NatConfig, NatLabOptions, NatVip, OFF_HOST_V4, POOL_V4},
};

use super::{assert_clean, prefix, short_load, up};

/// The tiny pool's ports: four, from one address, to one backend.
const TINY_PORTS: (u16, u16) = (20000, 20003);

/// Counters of `status` whose name says NAT port exhaustion, summed.
fn exhaustion_count(run: &LabRun) -> u64 {
    run.status()
        .unwrap()
        .counters
        .iter()
        .filter(|(k, _)| k.contains("nat") && k.contains("exhaust"))
        .map(|(_, v)| v)
        .sum()
}

/// A pool of four ports (one address, one backend): four long-lived
/// connections take them all. Every new connection is then refused with a
/// RST (the client sees `refused`, not a timeout), counted, and alarmed;
/// the four keep flowing.
#[test]
fn exhausted_pool_refuses_new_flows_and_keeps_the_old() {
    let _serial = serial();
    let p = prefix("exh");
    let mut cfg = NatConfig::for_prefix(&p);
    cfg.vips = vec![NatVip {
        snat_ports: Some(TINY_PORTS),
        ..NatVip::tcp("tiny", VIP_V4.into(), 80, 1)
    }];
    let vip = cfg.vips[0].clone();
    let opts = NatLabOptions {
        backends: 1,
        ..NatLabOptions::default()
    };
    let run = up(&p, &cfg, opts);
    let ports = u32::from(TINY_PORTS.1 - TINY_PORTS.0 + 1);
    let holders = run
        .start_client(LoadOptions {
            duration: Duration::from_secs(8),
            rate: 0,
            keepalive: 0,
            long: ports,
            stream_interval: Duration::from_millis(100),
            stall_after: Duration::from_secs(1),
            timeout: Duration::from_secs(2),
            slice: Duration::from_millis(500),
            ..LoadOptions::new(vip.target())
        })
        .unwrap();
    wait_client_ms(&holders, 1500);
    let exhausted_before = exhaustion_count(&run);
    let refused = run
        .run_client(LoadOptions {
            duration: Duration::from_secs(2),
            rate: 10,
            keepalive: 0,
            timeout: Duration::from_secs(1),
            ..LoadOptions::new(vip.target())
        })
        .unwrap();
    // Counters in `status` are sampled once per second.
    std::thread::sleep(Duration::from_millis(1500));
    let exhausted_after = exhaustion_count(&run);
    let held = holders.join().unwrap();
    let events = run.events().unwrap();
    let alarms: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventKind::Alarm)
        .collect();
    eprintln!(
        "[{p}] {ports} ports held: {} of {} long connections kept flowing; new connections: {:?}; \
         exhaustion counters {exhausted_before} -> {exhausted_after}; alarms: {alarms:?}",
        held.summary.long_total - held.summary.long_broken,
        held.summary.long_total,
        refused.summary.counts
    );
    assert_eq!(held.summary.long_total, u64::from(ports));
    let broken: Vec<_> = held.long.iter().filter(|l| !l.kept_flowing).collect();
    assert!(
        broken.is_empty(),
        "connections holding the pool broke: {broken:?}"
    );
    assert!(refused.summary.requests >= 15, "{}", refused.render_text());
    assert_eq!(
        refused.summary.counts.refused,
        refused.summary.requests,
        "every new connection must be refused with a RST: {}",
        refused.render_text()
    );
    assert!(
        exhausted_after >= exhausted_before + refused.summary.requests,
        "exhaustion counted {} times for {} refused connections",
        exhausted_after - exhausted_before,
        refused.summary.requests
    );
    assert!(
        alarms.iter().any(|e| {
            let r = e.reason.to_lowercase();
            e.vip.as_deref() == Some("tiny") || r.contains("tiny") || r.contains("exhaust")
        }),
        "no alarm about the exhausted pool: {events:?}"
    );
    teardown(run);
}

/// Configurations a NAT VIP must not start with, each with what its error
/// must name.
fn bad_configs(good: &NatConfig) -> Vec<(&'static str, NatConfig, Vec<String>)> {
    let with = |f: &dyn Fn(&mut NatConfig)| {
        let mut c = good.clone();
        f(&mut c);
        c
    };
    vec![
        (
            "snat address on no interface",
            with(&|c| c.vips[0].snat = vec![OFF_HOST_V4.into()]),
            vec!["web".into(), OFF_HOST_V4.to_string()],
        ),
        (
            "two VIPs' pools overlap",
            with(&|c| {
                c.vips.push(NatVip {
                    snat: vec![POOL_V4.into()],
                    ..NatVip::tcp("web2", VIP2_V4.into(), 80, 3)
                });
            }),
            vec!["web".into(), "web2".into(), POOL_V4.to_string()],
        ),
        (
            "NAT VIP without a pool",
            with(&|c| c.vips[0].snat.clear()),
            vec!["web".into(), "snat".into()],
        ),
    ]
}

/// A `snat` address on no interface, two VIPs with overlapping pools, a
/// NAT VIP without a pool: `xlb check-config` (on the LB host) refuses
/// each, naming the VIP and the problem, and so does `xlb reload`, which
/// leaves the running VIP as it was, carrying traffic.
#[test]
fn bad_pools_are_refused_at_check_config_and_reload() {
    let _serial = serial();
    let p = prefix("bad");
    let good = NatConfig::for_prefix(&p);
    let vip = good.vips[0].clone();
    let run = up(&p, &good, NatLabOptions::default());
    let accepted = nat_lab::check_config(&run, &good.render()).unwrap();
    assert!(
        accepted.is_ok(),
        "check-config refuses the configuration the lab runs: {accepted:?}"
    );
    for (name, cfg, names) in bad_configs(&good) {
        let text = cfg.render();
        let checked = nat_lab::check_config(&run, &text).unwrap();
        let Err(check_err) = checked else {
            panic!("{name}: check-config accepted it:\n{text}\n{checked:?}");
        };
        let reload_err = match run.reload(&text) {
            Ok(out) => panic!("{name}: reload accepted it: {out}"),
            Err(e) => e.to_string(),
        };
        eprintln!(
            "[{p}] {name}:\n  check-config: {}\n  reload: {reload_err}",
            check_err.trim()
        );
        for (how, err) in [("check-config", &check_err), ("reload", &reload_err)] {
            for want in &names {
                assert!(
                    err.contains(want.as_str()),
                    "{name}: {how} does not name {want:?}: {err}"
                );
            }
        }
        let s = run.status().unwrap();
        let web = s
            .vip(&vip.name)
            .unwrap_or_else(|| panic!("{name}: web gone after a refused reload: {}", s.summary()));
        assert_eq!(
            (web.mode.as_str(), web.backends.len(), s.vips.len()),
            ("nat", 3, 1),
            "{name}: the refused reload changed the running configuration: {}",
            s.summary()
        );
        let report = run
            .run_client(short_load(&vip, Duration::from_secs(1)))
            .unwrap();
        assert_clean(&format!("{name}: after the refused reload"), &report, 20);
    }
    teardown(run);
}
