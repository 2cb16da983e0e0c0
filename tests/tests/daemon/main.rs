//! The daemon as an operator meets it, inside a namespace of its own, one
//! scenario per test, each with a daemon of its own: a hung backend goes
//! down (status, events, metrics, maps) and comes back; kill -9 and start
//! again (same link, conntrack and states kept, `xlb explain` agrees); reload
//! with one VIP changed (the other VIP's table bytes identical), a resize, an
//! invalid file refused; drain and enable; drain with a deadline; a pinned
//! layout of another version refused; detach removes everything. Restarts
//! with an edited file, a second daemon for one instance, unfinished pins and
//! the forwarding sysctls are in `restart`.
//!
//! A scenario is a list of named steps ([`step`]): a failure names its step.
//! One daemon at a time (`xlb_tests::lab::serial`): the health checks run
//! every 200 ms with a 150 ms timeout, and the assertions on how fast a
//! backend goes down hold on a machine that is not also running five other
//! daemons.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]
#![allow(
    clippy::print_stdout,
    reason = "what a scenario saw is printed for the log"
)]

mod announce;
mod chance;
mod control;
mod env;
mod events;
mod guard;
mod nat;
mod notify;
mod reload;
mod restart;
mod sources;
mod trace;
mod upgrade;
mod weight;

use std::{
    collections::BTreeSet,
    panic::AssertUnwindSafe,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use lb_common::{BACKEND_DOWN, BACKEND_UP, CtEntry, FlowKey};
use lb_user::dataplane::Dataplane;
use serde_json::Value;
use xlb_lab::backend::Fault;
use xlb_tests::{harness::ktime_coarse_ns, lab::serial};

use crate::env::{API_MAX_FLOWS, BACKENDS, Env, config_text, wait_for, xlb_bin};

/// Runs one named step of a scenario; if it panics, the test's failure
/// message starts with the step's name.
fn step<T>(name: &str, f: impl FnOnce() -> T) -> T {
    println!("step: {name}");
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            panic!("step `{name}` failed: {msg}");
        }
    }
}

fn vip_key(addr: &str) -> lb_common::VipKey {
    lb_common::VipKey::new(addr.parse().unwrap(), 80, lb_common::PROTO_TCP)
}

/// Both ring halves of a VIP, and which is live.
fn table(dp: &Dataplane, vip: &str) -> anyhow::Result<(u32, Vec<u32>, Vec<u32>)> {
    let info = dp.vip(&vip_key(vip))?.context("vip in maps")?;
    Ok((
        info.active,
        dp.ring_half(info.vip_id, 0, info.table_size)?,
        dp.ring_half(info.vip_id, 1, info.table_size)?,
    ))
}

/// The live half of a VIP's table, as a set of backend ids.
fn live_ids(dp: &Dataplane, vip: &str) -> BTreeSet<u32> {
    let (active, h0, h1) = table(dp, vip).unwrap();
    let live = if active == 0 { &h0 } else { &h1 };
    live.iter().copied().collect()
}

/// Backend `id`'s address as `xlb` prints it (the backends are IPv4).
fn backend_addr(dp: &Dataplane, id: u32) -> String {
    let be = dp.backend(id).unwrap();
    format!(
        "{}.{}.{}.{}:80",
        be.addr[0], be.addr[1], be.addr[2], be.addr[3]
    )
}

/// A new environment with its daemon started and every backend up in
/// both VIPs.
fn up() -> Env {
    let mut e = Env::new().unwrap();
    step("start: every backend up", || start_all_up(&mut e));
    e
}

/// Start, attach, probe: every backend up; XDP on xd0.
fn start_all_up(e: &mut Env) {
    e.start().unwrap();
    wait_for(Duration::from_secs(10), "all backends up", || {
        Ok(BACKENDS.iter().all(|b| {
            let addr = format!("{b}:80");
            ["api", "web"]
                .iter()
                .all(|vip| e.backend_state(vip, &addr).ok().as_deref() == Some("up"))
        }))
    })
    .unwrap();
    assert!(e.xdp_attached().unwrap(), "XDP attached to xd0");
}

// --- a hung backend

/// A hung backend goes down within its budget, with its reason in the
/// status, the event log, the metrics and the maps; it comes back up.
#[test]
fn hung_backend_goes_down_and_comes_back() {
    let _serial = serial();
    let e = up();
    step("hang backend 2: down in both VIPs, with its reason", || {
        hang_backend_2(&e);
    });
    step(
        "the event log has the transition and the timed rebuild",
        || events_record_backend_2_down(&e),
    );
    step("the metrics show backend 2 out", || {
        metrics_show_backend_2_out(&e);
    });
    step("the maps show backend 2 down and out of the table", || {
        maps_show_backend_2_down(&e);
    });
    step("recover: back up after rise probes", || {
        recover_backend_2(&e);
    });
}

/// Hang backend 2's application: down within fall × interval + timeout
/// (2 × 200 ms + 150 ms) plus 1 s of margin for scheduling on 2 CPUs.
fn hang_backend_2(e: &Env) {
    e.set_fault(BACKENDS[1], Fault::Hang).unwrap();
    let t = Instant::now();
    wait_for(Duration::from_millis(1550), "backend 2 down", || {
        Ok(e.backend_state("api", "10.0.0.12:80")? == "down"
            && e.backend_state("web", "10.0.0.12:80")? == "down")
    })
    .unwrap();
    println!("hung backend detected after {:?}", t.elapsed());
    let s = e.status().unwrap();
    let b2 = &s["vips"][0]["backends"][1];
    let reason = b2["last_transition_reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("connected, no HTTP response within"),
        "reason: {reason}"
    );
}

fn events_record_backend_2_down(e: &Env) {
    let events = e.events().unwrap();
    let down = events
        .as_array()
        .unwrap()
        .iter()
        .find(|ev| ev["kind"] == "transition" && ev["vip"] == "api" && ev["to"] == "down")
        .expect("a transition event for api's backend 2");
    assert_eq!(down["backend"], "10.0.0.12:80");
    assert!(
        down["reason"]
            .as_str()
            .unwrap()
            .starts_with("connected, no HTTP response"),
        "{down}"
    );
    // It left the table at its first exit (a hung backend among answering
    // peers is a slow outlier first, `down` when its probes reach
    // hang_timeout): that event carries the timed table rebuild.
    let exit = events
        .as_array()
        .unwrap()
        .iter()
        .find(|ev| {
            ev["kind"] == "transition"
                && ev["vip"] == "api"
                && ev["backend"] == "10.0.0.12:80"
                && ev["from"] == "up"
        })
        .expect("an exit event for api's backend 2");
    assert!(
        exit["table_build_us"].is_u64(),
        "the table rebuild is timed: {exit}"
    );
}

/// The metrics are refreshed every second.
fn metrics_show_backend_2_out(e: &Env) {
    wait_for(Duration::from_secs(3), "metrics show b2 out", || {
        let m = e.metrics()?;
        Ok(
            m.contains(r#"xlb_backend_up{vip="api",backend="10.0.0.12:80"} 0"#)
                && m.contains(r#"xlb_backend_up{vip="api",backend="10.0.0.11:80"} 1"#),
        )
    })
    .unwrap();
    let m = e.metrics().unwrap();
    assert!(
        m.contains("xlb_backend_probe_latency_seconds_bucket"),
        "probe latency histogram"
    );
    assert!(
        m.contains(r#"xlb_packets_total{reason="ct_hit"}"#),
        "data-plane counters"
    );
}

/// State DOWN in both VIPs, and the id gone from api's live table.
fn maps_show_backend_2_down(e: &Env) {
    let dp = e.maps().unwrap();
    let ids = live_ids(&dp, "10.100.0.1");
    assert_eq!(ids.len(), 2, "two backends in the live table: {ids:?}");
    let states: Vec<u8> = (1..=6).map(|id| dp.backend(id).unwrap().state).collect();
    assert_eq!(
        states.iter().filter(|&&s| s == BACKEND_DOWN).count(),
        2,
        "b2 down in both VIPs: {states:?}"
    );
    assert_eq!(
        states.iter().filter(|&&s| s == BACKEND_UP).count(),
        4,
        "{states:?}"
    );
}

/// In both VIPs (each has its own probes).
fn recover_backend_2(e: &Env) {
    e.set_fault(BACKENDS[1], Fault::None).unwrap();
    wait_for(Duration::from_secs(3), "backend 2 up again", || {
        Ok(e.backend_state("api", "10.0.0.12:80")? == "up"
            && e.backend_state("web", "10.0.0.12:80")? == "up")
    })
    .unwrap();
}

// --- kill -9 and start again

/// kill -9 and start again: the pinned link is adopted, conntrack and the
/// backends' states kept (a down backend is down at once, before any
/// probe), the table untouched; `xlb explain` agrees with the maps.
#[test]
fn restart_after_kill9_adopts_link_conntrack_and_states() {
    let _serial = serial();
    let mut e = up();
    let link_id = e.link_id().unwrap();
    step("hang backend 2", || hang_backend_2(&e));
    let mut dp = e.maps().unwrap();
    let (flow, entry) = step("an established flow in conntrack", || {
        insert_established_flow(&mut dp)
    });
    step("kill -9 and start again", || {
        restart_keeps_everything(&mut e, &dp, link_id, &flow, &entry);
    });
    step("xlb explain agrees with the maps", || {
        explain_agrees_with_the_maps(&e, &dp, &entry);
    });
}

/// A conntrack entry on api's first live backend, as an established flow
/// would have.
fn insert_established_flow(dp: &mut Dataplane) -> (FlowKey, CtEntry) {
    let ids = live_ids(dp, "10.100.0.1");
    let flow = FlowKey::new(
        "192.0.2.1:40000".parse().unwrap(),
        "10.100.0.1:80".parse().unwrap(),
        lb_common::PROTO_TCP,
    );
    let entry = CtEntry {
        backend_id: *ids.iter().next().unwrap(),
        generation: 1,
        vip_id: 0,
        flags: 0,
        last_seen_ns: 1,
    };
    dp.ct_insert(&flow, &entry).unwrap();
    (flow, entry)
}

fn restart_keeps_everything(
    e: &mut Env,
    dp: &Dataplane,
    link_id: u32,
    flow: &FlowKey,
    entry: &CtEntry,
) {
    let before = table(dp, "10.100.0.1").unwrap();
    e.kill9().unwrap();
    assert!(
        e.xdp_attached().unwrap(),
        "XDP stays attached while the daemon is dead"
    );
    std::fs::remove_file(&e.socket).ok();
    e.start().unwrap();
    assert_eq!(
        e.link_id().unwrap(),
        link_id,
        "the pinned link is adopted, not re-created"
    );
    let s = e.status().unwrap();
    assert_eq!(s["adopted"], true);
    assert_eq!(
        e.backend_state("api", "10.0.0.12:80").unwrap(),
        "down",
        "adopted state stands"
    );
    assert_eq!(
        dp.ct_get(flow).unwrap(),
        Some(*entry),
        "conntrack entry kept"
    );
    assert_eq!(
        table(dp, "10.100.0.1").unwrap(),
        before,
        "table not rewritten on restart"
    );
}

/// The established flow goes where its conntrack entry says; a new one to
/// its table slot's backend.
fn explain_agrees_with_the_maps(e: &Env, dp: &Dataplane, entry: &CtEntry) {
    let explain = |client: &str| -> Value {
        serde_json::from_str(
            &e.xlb(&["explain", "tcp", client, "10.100.0.1:80", "--json"])
                .unwrap(),
        )
        .unwrap()
    };
    let ex = explain("192.0.2.1:40000");
    assert_eq!(ex["via"], "conntrack", "{ex}");
    assert_eq!(
        ex["backend"],
        backend_addr(dp, entry.backend_id).as_str(),
        "{ex}"
    );
    let ex = explain("192.0.2.9:40001");
    assert_eq!(ex["via"], "table", "{ex}");
    let g = dp.globals().unwrap();
    let probe = FlowKey::new(
        "192.0.2.9:40001".parse().unwrap(),
        "10.100.0.1:80".parse().unwrap(),
        lb_common::PROTO_TCP,
    );
    let (active, h0, h1) = table(dp, "10.100.0.1").unwrap();
    let id = if active == 0 { &h0 } else { &h1 }[probe.slot(&g.hash_key, 251) as usize];
    assert_eq!(ex["backend"], backend_addr(dp, id).as_str(), "{ex}");
}

// --- reload

/// Reload with only "web" changed: "api"'s table bytes and live half stay;
/// a resize goes through the spare half; an invalid file is refused whole.
#[test]
fn reload_changes_only_the_changed_vip() {
    let _serial = serial();
    let e = up();
    let dp = e.maps().unwrap();
    let api_before = table(&dp, "10.100.0.1").unwrap();
    step("reload with web's weights doubled", || {
        reload_same_shares(&e, &dp, &api_before);
    });
    step("reload resizing web's table", || {
        reload_resize(&e, &dp, &api_before);
    });
    step("an invalid configuration is refused", || {
        invalid_config_refused(&e);
    });
}

fn reload_same_shares(e: &Env, dp: &Dataplane, api_before: &(u32, Vec<u32>, Vec<u32>)) {
    let web_before = table(dp, "10.100.0.2").unwrap();
    std::fs::write(&e.config, config_text(e, 2, 251)).unwrap();
    let out = e.xlb(&["reload"]).unwrap();
    assert!(out.contains("1 changed"), "{out}");
    assert_eq!(
        &table(dp, "10.100.0.1").unwrap(),
        api_before,
        "untouched VIP keeps its table bytes"
    );
    let web_after = table(dp, "10.100.0.2").unwrap();
    assert_eq!(
        web_after, web_before,
        "weights all doubled: same shares, same table"
    );
}

/// 251 → 241: the new table is built in the spare half and goes live with
/// one write; api is still untouched.
fn reload_resize(e: &Env, dp: &Dataplane, api_before: &(u32, Vec<u32>, Vec<u32>)) {
    let (web_active, _, _) = table(dp, "10.100.0.2").unwrap();
    std::fs::write(&e.config, config_text(e, 2, 241)).unwrap();
    let out = e.xlb(&["reload"]).unwrap();
    assert!(out.contains("1 changed"), "{out}");
    let info = dp.vip(&vip_key("10.100.0.2")).unwrap().unwrap();
    assert_eq!(info.table_size, 241);
    assert_ne!(
        info.active, web_active,
        "the resized table went into the spare half"
    );
    let live = dp.ring_half(info.vip_id, info.active, 251).unwrap();
    let web_ids: BTreeSet<u32> = live.iter().copied().collect();
    assert_eq!(
        web_ids.len(),
        3,
        "every slot a reader may index holds one of web's three backends: {web_ids:?}"
    );
    let old = dp.ring_half(info.vip_id, 1 - info.active, 251).unwrap();
    assert!(
        old.iter().all(|id| web_ids.contains(id)),
        "the old half, padded, too"
    );
    assert_eq!(
        &table(dp, "10.100.0.1").unwrap(),
        api_before,
        "api untouched"
    );
}

/// Refused whole, naming the file; the daemon keeps running.
fn invalid_config_refused(e: &Env) {
    std::fs::write(&e.config, "[daemon]\ninterface = 7\n").unwrap();
    let out = Command::new(xlb_bin())
        .arg("--socket")
        .arg(&e.socket)
        .arg("reload")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("xlb.toml"), "names the file: {err}");
    assert_eq!(e.backend_state("api", "10.0.0.11:80").unwrap(), "up");
}

// --- drain

#[test]
fn drain_and_enable() {
    let _serial = serial();
    let e = up();
    step("drain, then enable", || {
        e.xlb(&["drain", "api", "10.0.0.13:80"]).unwrap();
        assert_eq!(e.backend_state("api", "10.0.0.13:80").unwrap(), "draining");
        e.xlb(&["enable", "api", "10.0.0.13:80"]).unwrap();
        assert_eq!(e.backend_state("api", "10.0.0.13:80").unwrap(), "up");
    });
}

/// Three established flows on api's third backend; `drain --deadline
/// --wait` counts them, returns when the deadline passes, and the backend
/// is then down in the data plane; that survives a restart; `enable` undoes it.
#[test]
fn drain_with_a_deadline() {
    let _serial = serial();
    let mut e = up();
    let mut dp = e.maps().unwrap();
    let id = backend_id(&e, "api", DRAINED);
    let flows = step("three established flows counted", || {
        three_flows_counted(&e, &mut dp, id)
    });
    step("drain --deadline 3s --wait: down when it passes", || {
        drain_until_the_deadline(&e, &dp, id);
    });
    step("a restart keeps it down", || {
        restart_keeps_the_drain(&mut e, &dp, id);
    });
    step("enable clears the deadline and brings it back", || {
        enable_undoes_the_drain(&e, &mut dp, id, &flows);
    });
}

/// Established flows beyond 80 % of the conntrack (4096 entries) and beyond
/// a backend's `max_flows` raise one `alarm` event each, and clearing them
/// one more each; `xlb status` and the metrics show the established flows
/// and `max_flows`.
#[test]
fn capacity_alarms_fire_and_clear() {
    let _serial = serial();
    let e = up();
    let mut dp = e.maps().unwrap();
    let id = backend_id(&e, "api", DRAINED);
    let b = e.backend("api", DRAINED).unwrap();
    assert_eq!(b["max_flows"], API_MAX_FLOWS, "{b}");
    let flows = step(
        "3,400 established flows: conntrack 83% full, over max_flows",
        || {
            let flows = established_flows(&mut dp, id, 3400);
            wait_for_event(
                &e,
                "conntrack 83% full (at least 80%): 3400 established flows",
            );
            wait_for_event(
                &e,
                "backend 10.0.0.13:80 holds 3400 established flows, more than its max_flows 3000",
            );
            let ct = &e.status().unwrap()["conntrack"];
            assert_eq!(ct["established"], 3400, "{ct}");
            let metrics = e.metrics().unwrap();
            assert!(
                metrics.contains("\nxlb_conntrack_established_flows 3400\n"),
                "{metrics}"
            );
            flows
        },
    );
    step("the flows end: both alarms clear", || {
        for f in &flows {
            dp.ct_remove(f).unwrap();
        }
        wait_for_event(&e, "conntrack back below 75% full");
        wait_for_event(&e, "backend 10.0.0.13:80 back to 0 established flows");
    });
}

/// `n` conntrack entries of backend `id` (VIP api), seen now.
fn established_flows(dp: &mut Dataplane, id: u32, n: u16) -> Vec<FlowKey> {
    let generation = dp.backend(id).unwrap().generation;
    let flows: Vec<FlowKey> = (0..n)
        .map(|i| {
            FlowKey::new(
                format!("192.0.2.{}:{}", 1 + i / 1000, 40_000 + i % 1000)
                    .parse()
                    .unwrap(),
                "10.100.0.1:80".parse().unwrap(),
                lb_common::PROTO_TCP,
            )
        })
        .collect();
    let entry = CtEntry {
        backend_id: id,
        generation,
        vip_id: 0,
        flags: 0,
        last_seen_ns: ktime_coarse_ns(),
    };
    for f in &flows {
        dp.ct_insert(f, &entry).unwrap();
    }
    flows
}

/// Waits for an `alarm` event containing `text` (the walk runs every 10 s).
fn wait_for_event(e: &Env, text: &str) {
    let found = wait_for(Duration::from_secs(25), text, || {
        Ok(e.xlb(&["events"])?
            .lines()
            .any(|l| l.contains(" alarm") && l.contains(text)))
    });
    if let Err(err) = found {
        panic!(
            "{err:#}; events:\n{}",
            e.xlb(&["events"]).unwrap_or_default()
        );
    }
}

/// The backend `drain_with_a_deadline` drains.
const DRAINED: &str = "10.0.0.13:80";

/// Backend `addr`'s id in VIP `vip`, from the daemon's saved state.
pub(crate) fn backend_id(e: &Env, vip: &str, addr: &str) -> u32 {
    let saved =
        lb_user::daemon::persist::Saved::load(&lb_user::daemon::persist::state_path(&e.instance))
            .unwrap()
            .unwrap();
    saved
        .backends
        .iter()
        .find(|b| b.vip == vip && b.addr.to_string() == addr)
        .unwrap()
        .id
}

fn three_flows_counted(e: &Env, dp: &mut Dataplane, id: u32) -> Vec<FlowKey> {
    let flows = established_flows(dp, id, 3);
    // The walk runs every 10 s when nothing drains.
    wait_for(Duration::from_secs(15), "3 flows counted", || {
        Ok(e.backend("api", DRAINED)?["flows"] == 3)
    })
    .unwrap();
    flows
}

fn drain_until_the_deadline(e: &Env, dp: &Dataplane, id: u32) {
    let t = Instant::now();
    let out = e
        .xlb(&["drain", "api", DRAINED, "--deadline", "3s", "--wait"])
        .unwrap();
    let took = t.elapsed();
    assert!(out.contains("down in 3s"), "{out}");
    assert!(
        out.contains("10.0.0.13:80 of vip \"api\": 3 flows\n"),
        "{out}"
    );
    assert!(
        out.contains(
            "drain deadline passed with 3 flows left; the backend is down and its remaining \
             flows follow down_policy rehash"
        ),
        "{out}"
    );
    assert!(
        took >= Duration::from_millis(2500) && took < Duration::from_secs(8),
        "--wait returned after {took:?}"
    );
    let b = e.backend("api", DRAINED).unwrap();
    assert_eq!(b["state"], "down", "{b}");
    assert_eq!(b["admin_drained"], true, "{b}");
    assert!(b["drain_deadline_unix_ms"].is_u64(), "{b}");
    assert_eq!(dp.backend(id).unwrap().state, BACKEND_DOWN);
    let events = e.events().unwrap();
    let drain: Vec<&Value> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|ev| ev["kind"] == "drain")
        .collect();
    assert_eq!(drain.len(), 1, "{events}");
    assert_eq!(
        drain[0]["reason"],
        "drain deadline passed with 3 flows left; remaining flows follow down_policy rehash"
    );
    assert!(
        e.metrics()
            .unwrap()
            .contains("xlb_backend_flows{vip=\"api\",backend=\"10.0.0.13:80\"} 3")
    );
}

/// Down at once, and the deadline not reported again.
fn restart_keeps_the_drain(e: &mut Env, dp: &Dataplane, id: u32) {
    e.kill9().unwrap();
    std::fs::remove_file(&e.socket).ok();
    e.start().unwrap();
    let b = e.backend("api", DRAINED).unwrap();
    assert_eq!(b["state"], "down", "{b}");
    assert!(b["drain_deadline_unix_ms"].is_u64(), "{b}");
    assert_eq!(dp.backend(id).unwrap().state, BACKEND_DOWN);
    let events = e.xlb(&["events"]).unwrap();
    assert!(!events.contains(" drain "), "{events}");
}

fn enable_undoes_the_drain(e: &Env, dp: &mut Dataplane, id: u32, flows: &[FlowKey]) {
    e.xlb(&["enable", "api", DRAINED]).unwrap();
    let b = e.backend("api", DRAINED).unwrap();
    assert_eq!(b["state"], "up", "{b}");
    assert!(b["drain_deadline_unix_ms"].is_null(), "{b}");
    assert_eq!(dp.backend(id).unwrap().state, BACKEND_UP);
    for f in flows {
        dp.ct_remove(f).unwrap();
    }
}

// --- pins

/// A pinned layout of another version is refused with a clear message.
#[test]
fn pinned_layout_of_another_version_is_refused() {
    let _serial = serial();
    let mut e = up();
    step("kill -9, stamp layout version 999 on the pins", || {
        e.kill9().unwrap();
        let mut dp = e.maps().unwrap();
        let mut g = dp.globals().unwrap();
        g.layout_version = 999;
        dp.set_globals(&g).unwrap();
    });
    step("xlb run refuses the pins", || {
        let out = e
            .in_ns()
            .arg(xlb_bin())
            .args(["run", "--config"])
            .arg(&e.config)
            .output()
            .unwrap();
        assert!(!out.status.success(), "a foreign layout must be refused");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("layout version 999"), "{err}");
    });
}

/// Detach under a running daemon is refused (it holds the instance lock):
/// XDP, the pins and the daemon stay. `--force` detaches anyway. A daemon
/// that is stopping is waited for.
#[test]
fn detach_refuses_a_running_daemon_unless_forced() {
    let _serial = serial();
    let e = up();
    let detach = |extra: &[&str]| {
        Command::new(xlb_bin())
            .args(["detach", "--instance", &e.instance])
            .args(extra)
            .output()
            .unwrap()
    };
    step("xlb detach is refused", || {
        let out = detach(&[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "detach under a running daemon: {err}"
        );
        let pid = e.daemon_pid().unwrap();
        assert!(
            err.contains(&format!("is in use by xlb run (pid {pid})")),
            "{err}"
        );
        assert!(err.contains("--force"), "says what to do: {err}");
        assert!(e.pins().exists(), "pins kept");
        assert!(e.xdp_attached().unwrap(), "XDP kept");
        e.status().expect("the daemon still answers");
    });
    step("xlb detach --force detaches", || {
        let out = detach(&["--force"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("still runs with nothing attached"), "{text}");
        assert!(!e.pins().exists(), "pins removed");
        assert!(!e.xdp_attached().unwrap(), "XDP detached");
    });
    step(
        "kill PID; xlb detach: detach waits for the daemon to stop",
        || {
            let pid = e.daemon_pid().unwrap().to_string();
            let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
            assert!(killed.success(), "kill -TERM {pid}");
            let out = detach(&[]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        },
    );
}

/// Detach (with the daemon dead) removes the pins and the XDP program.
#[test]
fn detach_removes_everything() {
    let _serial = serial();
    let mut e = up();
    step("kill -9", || e.kill9().unwrap());
    step("xlb detach", || {
        let out = Command::new(xlb_bin())
            .args(["detach", "--instance", &e.instance])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!e.pins().exists(), "pins removed");
        assert!(!e.xdp_attached().unwrap(), "XDP detached");
    });
}
