//! Detection in NAT mode (issue 27): the time from a backend's hang to its
//! removal, passive evidence against active probes alone, at the same
//! probe settings, in one run.
//!
//! One NAT lab, two NAT VIPs over the same three plain backends: `passive`
//! (passive detection on, as NAT VIPs have it by default) and `active`
//! (`[vip.passive] enabled = false`), each under its own steady client
//! load. A round hangs b2's application (both VIPs' b2: one process),
//! notes when each VIP's b2 leaves (`xlb events`), then recovers it and
//! waits for both to be back. The probes are xlb's defaults (every 2 s,
//! 1 s timeout, fall 3), jitter off.

use std::{
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use xlb_lab::{
    Fault,
    client::LoadOptions,
    scenario::{Health, LabRun},
    topology::{VIP_V4, VIP2_V4},
};

use crate::{
    bench::figures::{Figure, median},
    lab::{now_unix_ms, transitions},
    nat_lab::{self, NatConfig, NatLabOptions, NatVip, POOL2_V4},
};

/// The lab's namespace prefix.
const PREFIX: &str = "xlbnd";
/// The VIP with passive detection, and the one without.
const PASSIVE_VIP: &str = "passive";
const ACTIVE_VIP: &str = "active";
/// The hung backend.
const HUNG: usize = 2;
/// `passive.response_timeout`: the lab's backends answer in about 1 ms.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(250);
/// Bound on one round's wait for each VIP's b2 to leave, and to return.
const ROUND_TIMEOUT: Duration = Duration::from_secs(30);
/// Client load per VIP, longer than any run of rounds needs (it is
/// dropped with the lab when the rounds end).
const LOAD_FOR: Duration = Duration::from_secs(3600);

/// One round: how long after the hang each VIP's b2 left, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    pub passive: Duration,
    pub passive_reason: String,
    pub active: Duration,
    pub active_reason: String,
}

/// The probes both VIPs share: xlb's defaults, without jitter so that
/// rounds compare.
pub fn probes() -> Health {
    Health {
        interval: Duration::from_secs(2),
        timeout: Duration::from_secs(1),
        rise: 2,
        fall: 3,
        ..Health::default()
    }
}

/// The lab's configuration: the two VIPs, passive on one only.
pub fn config() -> NatConfig {
    let mut cfg = NatConfig::for_prefix(PREFIX);
    cfg.base.health = probes();
    cfg.passive = Some(format!(
        "response_timeout = \"{}ms\"\n",
        RESPONSE_TIMEOUT.as_millis()
    ));
    // Its own pool address: xlb refuses two VIPs sharing one.
    let active = NatVip {
        passive: Some("enabled = false\n".to_string()),
        snat: vec![POOL2_V4.into()],
        ..NatVip::tcp(ACTIVE_VIP, VIP2_V4.into(), 80, 3)
    };
    cfg.vips = vec![NatVip::tcp(PASSIVE_VIP, VIP_V4.into(), 80, 3), active];
    cfg
}

/// Steady load on `vip`: new connections and keep-alive ones.
/// Client addresses of the load: passive evidence stands only when the
/// failing flows come from several client prefixes (`min_sources`, 3 by
/// default), as a hung backend's do.
const SOURCES: u8 = 8;

fn load(vip: &NatVip, sources: &[std::net::IpAddr]) -> LoadOptions {
    LoadOptions {
        sources: sources.to_vec(),
        duration: LOAD_FOR,
        rate: 50,
        keepalive: 4,
        keepalive_interval: Duration::from_millis(50),
        timeout: Duration::from_secs(1),
        slice: Duration::from_secs(1),
        ..LoadOptions::new(vip.target())
    }
}

/// Brings the lab up, runs `rounds` rounds and tears it down.
///
/// # Errors
///
/// The lab, a client, or a round that did not finish within its bound.
pub fn run(xlb: &Path, rounds: usize) -> anyhow::Result<Vec<Round>> {
    let cfg = config();
    let run = nat_lab::up_with_xlb(PREFIX, &cfg, NatLabOptions::default(), xlb)?;
    let sources = run.lab().add_client_sources(SOURCES)?;
    let clients = cfg
        .vips
        .iter()
        .map(|v| run.start_client(load(v, &sources)))
        .collect::<Result<Vec<_>, _>>()?;
    thread::sleep(Duration::from_secs(2));
    let mut out = Vec::new();
    for i in 0..rounds {
        let r = round(&run, &cfg).with_context(|| format!("detection round {}", i + 1))?;
        println!(
            "detection round {}/{rounds}: passive {} ms ({}); active only {} ms ({})",
            i + 1,
            r.passive.as_millis(),
            r.passive_reason,
            r.active.as_millis(),
            r.active_reason
        );
        out.push(r);
    }
    drop(clients);
    run.shutdown()?;
    Ok(out)
}

/// Hangs b2, waits for both VIPs' b2 to leave, recovers it, waits for both
/// to be back.
fn round(run: &LabRun, cfg: &NatConfig) -> anyhow::Result<Round> {
    let hang_ms = now_unix_ms();
    run.set_fault(HUNG, Fault::Hang)?;
    wait_all(run, cfg, |state| state != "up")?;
    run.set_fault(HUNG, Fault::None)?;
    wait_all(run, cfg, |state| state == "up")?;
    let events = run.events()?;
    let out_of = |vip: &str| -> anyhow::Result<(Duration, String)> {
        let addr = cfg.vip(vip).backend_addr(HUNG);
        let e = transitions(&events, vip, addr)
            .into_iter()
            .find(|e| e.at_unix_ms >= hang_ms && e.to.as_deref() != Some("up"))
            .with_context(|| format!("no event of {vip}'s b{HUNG} leaving after the hang"))?;
        Ok((
            Duration::from_millis(e.at_unix_ms - hang_ms),
            e.reason.clone(),
        ))
    };
    let (passive, passive_reason) = out_of(PASSIVE_VIP)?;
    let (active, active_reason) = out_of(ACTIVE_VIP)?;
    Ok(Round {
        passive,
        passive_reason,
        active,
        active_reason,
    })
}

/// Polls `status` until b2 of every VIP is in a state `done` accepts.
fn wait_all(run: &LabRun, cfg: &NatConfig, done: impl Fn(&str) -> bool) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let s = run.status()?;
        let all = cfg.vips.iter().all(|v| {
            s.backend(&v.name, v.backend_addr(HUNG))
                .is_some_and(|b| done(&b.state))
        });
        if all {
            return Ok(());
        }
        if start.elapsed() > ROUND_TIMEOUT {
            bail!("b{HUNG} not there after {ROUND_TIMEOUT:?}: {}", s.summary());
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Prints the medians and records the figures (`cargo xtask bench`).
pub fn report(bench: &str, rounds: &[Round]) {
    let ms = |f: fn(&Round) -> Duration| -> Vec<f64> {
        rounds.iter().map(|r| f(r).as_secs_f64() * 1e3).collect()
    };
    let (passive, active) = (ms(|r| r.passive), ms(|r| r.active));
    let h = probes();
    println!(
        "\nNAT mode, detection of a hung backend (hang to removal, {} rounds, probes every {:?}, \
         timeout {:?}, fall {}; passive.response_timeout {:?}): passive {:.0} ms, active only \
         {:.0} ms (medians)",
        rounds.len(),
        h.interval,
        h.timeout,
        h.fall,
        RESPONSE_TIMEOUT,
        median(&passive),
        median(&active)
    );
    let group = "NAT detection, hang to removal (ms)";
    Figure::median_of(bench, group, "active probes only", &active, "ms").record();
    Figure::median_of(bench, group, "passive evidence", &passive, "ms")
        .against("active probes only", median(&active))
        .record();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_vips_one_without_passive_same_backends() {
        let cfg = config();
        let text = cfg.render();
        let passive = cfg.vip(PASSIVE_VIP);
        let active = cfg.vip(ACTIVE_VIP);
        assert_eq!(passive.backends, active.backends);
        assert_eq!(passive.backend_port, active.backend_port);
        assert!(passive.passive.is_none());
        assert!(
            text.contains("\n[vip.passive]\nenabled = false\n"),
            "{text}"
        );
        assert!(
            text.contains("\n[passive]\nresponse_timeout = \"250ms\"\n"),
            "{text}"
        );
        assert!(text.contains("interval = \"2000ms\""), "{text}");
    }
}
