//! A SYN flood from forged sources at a NAT VIP (issue 38): every backend
//! answers a forged SYN, so before a flow needed the client's ACK to be
//! established, 5 s of flood locked the pool for the established timeout
//! (2 h) and half of a real client's connections were refused long after
//! it. Now the flood's flows stay embryonic; once the pool is held, a
//! new flow's first SYN is dropped and remembered, and only a SYN sent
//! again (a real client's; each forged source sends once) takes an
//! embryonic flow's port. The backend may still hold the flood's
//! half-open connection on that port: its answer makes the client reset
//! it, and the client's next SYN goes through, so a real client connects
//! in about 3 s during the flood and for as long as the flood's flows
//! hold the pool (`tcp_syn_timeout`), instead of never. The real client
//! (timeout 5 s) is served during the flood and after it, and the pool's
//! occupancy stays within its size, shown in `status`.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddrV4},
    thread,
    time::{Duration, Instant},
};

use xlb_lab::{
    client::LoadOptions,
    flood::{FloodOptions, TCP_SYN, flood_in},
    scenario::LabRun,
    topology::VIP_V4,
};
use xlb_tests::{
    lab::{serial, teardown, wait_client_ms},
    nat_lab::{NatConfig, NatLabOptions, NatVip},
};

use super::{counters, prefix, up};

/// The pool: 1,000 ports from one address, so 3,000 flows over the three
/// backends.
const PORTS: (u16, u16) = (10_000, 10_999);
const POOL_FLOWS: u64 = 3 * (PORTS.1 - PORTS.0 + 1) as u64;
/// The flood: 20,000 SYNs/s for 5 s from random sources of a /16 inside
/// the lab (off every segment): 33 times the pool.
const FLOOD_RATE: u32 = 20_000;
const FLOOD_FOR: Duration = Duration::from_secs(5);
const FLOOD_NET: Ipv4Addr = Ipv4Addr::new(10, 98, 0, 0);
const FLOOD_PREFIX: u8 = 16;
/// The real client: new connections at 30/s, from 4 s before the flood to
/// 10 s after it.
const CLIENT_RATE: u32 = 30;
const BEFORE: Duration = Duration::from_secs(4);
const AFTER: Duration = Duration::from_secs(10);
/// The real client's timeout per request, connect included: a client
/// that finds the pool held by the flood's embryonic flows is served on
/// its SYN sent again (see the module's notes), about 3 s in.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Share of the real client's requests that must be answered.
const SERVED: f64 = 0.99;

/// The VIP's (flows, embryonic flows) in `status`.
fn occupancy(run: &LabRun) -> Option<(u64, u64)> {
    let s = run.status_json().ok()?;
    let nat = s["vips"].as_array()?.iter().find(|v| v["name"] == "api")?["nat"].clone();
    Some((nat["flows"].as_u64()?, nat["embryonic"].as_u64()?))
}

#[test]
fn syn_flood_from_forged_sources_leaves_real_clients_served() {
    let _serial = serial();
    let p = prefix("syn");
    let mut cfg = NatConfig::for_prefix(&p);
    cfg.vips = vec![NatVip {
        snat_ports: Some(PORTS),
        ..NatVip::tcp("api", VIP_V4.into(), 80, 3)
    }];
    let vip = cfg.vips[0].clone();
    let run = up(&p, &cfg, NatLabOptions::default());
    let run_for = BEFORE + FLOOD_FOR + AFTER;
    let client = run
        .start_client(LoadOptions {
            duration: run_for,
            rate: CLIENT_RATE,
            keepalive: 0,
            timeout: CLIENT_TIMEOUT,
            slice: Duration::from_secs(1),
            ..LoadOptions::new(vip.target())
        })
        .unwrap();
    wait_client_ms(&client, BEFORE.as_millis() as u64);

    // The flood, from the client's namespace, while a thread samples the
    // pool's occupancy every 500 ms until the client is done.
    let IpAddr::V4(vip_v4) = vip.address else {
        panic!("api is not an IPv4 VIP")
    };
    let opts = FloodOptions {
        flags: TCP_SYN,
        rate: Some(FLOOD_RATE),
        ..FloodOptions::new(
            SocketAddrV4::new(vip_v4, vip.port),
            FLOOD_NET,
            FLOOD_PREFIX,
            u64::from(FLOOD_RATE) * FLOOD_FOR.as_secs(),
            FLOOD_FOR + Duration::from_secs(5),
        )
    };
    let samples = thread::scope(|s| {
        let sampler = s.spawn(|| {
            let until = Instant::now() + FLOOD_FOR + AFTER;
            let mut out = Vec::new();
            while Instant::now() < until {
                if let Some(o) = occupancy(&run) {
                    out.push(o);
                }
                thread::sleep(Duration::from_millis(500));
            }
            out
        });
        let flood = flood_in(&run.lab().ns_client(), &opts).unwrap();
        (flood, sampler.join().unwrap())
    });
    let (flood, samples) = samples;
    let report = client.join().unwrap();
    let status = run.status().unwrap();
    let c = |name: &str| status.counters.get(name).copied().unwrap_or(0);
    let answered = report.summary.counts.ok;
    let requests = report.summary.requests;
    let peak = samples.iter().map(|(f, _)| *f).max().unwrap_or(0);
    let peak_embryonic = samples.iter().map(|(_, e)| *e).max().unwrap_or(0);
    let after_flood: Vec<_> = report
        .timeline
        .iter()
        .filter(|s| s.t_ms >= (BEFORE + FLOOD_FOR).as_millis() as u64)
        .map(|s| {
            format!(
                "{}:{}/{}",
                s.t_ms / 1000,
                s.counts.ok,
                s.counts.ok + s.counts.refused + s.counts.reset + s.counts.timed_out
            )
        })
        .collect();
    eprintln!(
        "[{p}] pool {POOL_FLOWS} flows; flood {:?} ({:.0} SYN/s from {FLOOD_NET}/{FLOOD_PREFIX}); \
         real client: {answered} of {requests} answered ({:?}); after the flood, per second \
         (answered/started): {}; pool occupancy sampled every 500 ms: peak {peak} flows, \
         {peak_embryonic} embryonic; last {:?}; nat_evict_embryonic {}, reset_nat_exhausted {}, \
         drop_nat_insert_capped {}, drop_nat_unproven {}\nreal client:\n{}\ncounters: {}\nstatus:\n{}",
        flood,
        flood.sent as f64 / flood.elapsed.as_secs_f64().max(1e-9),
        report.summary.counts,
        after_flood.join(" "),
        samples.last(),
        c("nat_evict_embryonic"),
        c("reset_nat_exhausted"),
        c("drop_nat_insert_capped"),
        c("drop_nat_unproven"),
        report.render_text(),
        counters(&run),
        run.status_text().unwrap_or_default(),
    );
    assert!(
        flood.sent >= u64::from(FLOOD_RATE) * FLOOD_FOR.as_secs() / 2,
        "the flood was too small to fill the pool many times: {flood:?}"
    );
    assert!(
        c("nat_evict_embryonic") > 0,
        "the flood's flows never gave a port up: it did not fill the pool"
    );
    assert!(
        requests >= u64::from(CLIENT_RATE) * run_for.as_secs() * 9 / 10,
        "{requests} requests"
    );
    assert!(
        answered as f64 >= SERVED * requests as f64,
        "the real client lost more than {:.0} % of its requests: {}",
        (1.0 - SERVED) * 100.0,
        report.render_text()
    );
    assert!(
        !samples.is_empty(),
        "the VIP's occupancy was never shown in status"
    );
    assert!(
        peak <= POOL_FLOWS,
        "more flows ({peak}) than the pool holds ({POOL_FLOWS})"
    );
    assert!(
        peak_embryonic > 0,
        "status never showed the flood's embryonic flows"
    );
    teardown(run);
}
