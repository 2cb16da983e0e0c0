//! Heavy hitters as an operator meets them: SYNs from two sources reach
//! the daemon's XDP program (frames sent into the veth's peer), `xlb
//! sources` names the heavy one first, a `source` event says it is heavy,
//! `auto_block` refuses it with one `Auto` entry and one `block` event once
//! its flows are confirmed by ACKs, the conntrack insert cap raises its
//! alarm; a flood of SYNs forging a victim's address blocks nothing; 10,000
//! sources over `auto_block` at once are blocked in batches while `xlb
//! status` keeps answering; and the cost of walking a full per-source map.

use std::{
    net::Ipv4Addr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use lb_common::{MAX_SOURCES, SourceState};
use lb_user::dataplane::{LoadOptions, source_key};
use serde_json::Value;
use xlb_tests::packet::{ACK, Flow, Mac, SYN};

use crate::{
    env::{Env, config_text, wait_for},
    start_all_up, step,
};

/// The heavy source: 100 SYNs/s, over `source_alert` (50/s) and
/// `auto_block` (60/s for 4 s).
const HEAVY: &str = "198.51.100.7";
/// A well-behaved one: 10 SYNs/s.
const LIGHT: &str = "198.51.100.8";

/// The test configuration with short thresholds; `ct_insert_cap` 40/s per
/// CPU, which the heavy source exceeds on any CPU that takes its frames.
/// `auto_block` judges confirmed flows, which only a tracked SYN can have:
/// with the cap, the heavy source confirms about 36 of its 100 flows a
/// second (its share of the 40 inserts), the light one about 4.
fn guard_config(e: &Env) -> String {
    let mut s = config_text(e, 1, 251);
    s += r#"
[guard]
ct_insert_cap = "40/s"
source_alert = { rate = "50/s" }
auto_block = { above = "20/s", for = "4s", ttl = "1m" }
"#;
    s
}

/// Who sends SYNs to what: (source, VIP address, one SYN every this many
/// 10 ms ticks, whether the client follows each SYN with the handshake's
/// ACK as a real one does; a spoofer, who never sees the SYN-ACK, does not).
type Plan = Vec<(&'static str, &'static str, u32, bool)>;

/// The IPv4 plan: 100 flows/s from [`HEAVY`], 10/s from [`LIGHT`], real
/// clients both.
fn v4_plan() -> Plan {
    vec![
        (HEAVY, "10.100.0.1", 1, true),
        (LIGHT, "10.100.0.1", 10, true),
    ]
}

/// Sends SYNs into `xd1` (so they arrive on `xd0`, where the daemon's
/// program runs) by `plan`, each a new flow, until `stop` or 30 s.
fn spawn_syns(e: &Env, plan: Plan, stop: Arc<AtomicBool>) -> anyhow::Result<JoinHandle<u64>> {
    let ns = e.ns.name().to_owned();
    let ifindex = e.ns.ifindex("xd1")?;
    let dst = mac_of(&e.ns.exec(&["cat", "/sys/class/net/xd0/address"])?)?;
    let src = mac_of(&e.ns.exec(&["cat", "/sys/class/net/xd1/address"])?)?;
    Ok(std::thread::spawn(move || {
        xlb_lab::topology::in_netns(&ns, || send_syns(ifindex, (dst, src), &plan, &stop))
            .expect("entering the namespace")
            .expect("sending SYNs")
    }))
}

fn mac_of(text: &str) -> anyhow::Result<Mac> {
    let bytes: Vec<u8> = text
        .trim()
        .split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<_, _>>()
        .with_context(|| format!("a MAC address: {text:?}"))?;
    bytes.try_into().ok().context("6 bytes")
}

fn send_syns(
    ifindex: u32,
    (dst, src): (Mac, Mac),
    plan: &Plan,
    stop: &AtomicBool,
) -> std::io::Result<u64> {
    // SAFETY: plain socket(2); the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    to.sll_family = libc::AF_PACKET as u16;
    to.sll_ifindex = ifindex as i32;
    to.sll_halen = 6;
    to.sll_addr[..6].copy_from_slice(&dst);
    let started = Instant::now();
    let mut sent = 0u64;
    let mut tick = 0u32;
    while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(30) {
        for (ip, vip, every, acks) in plan {
            if !tick.is_multiple_of(*every) {
                continue;
            }
            let sport = 1024 + (tick % 60_000) as u16;
            let flow = Flow::tcp(ip, sport, vip, 80);
            let flags: &[u8] = if *acks { &[SYN, ACK] } else { &[SYN] };
            for &f in flags {
                let frame = flow.frame(dst, src, None, f, &[]);
                // SAFETY: `frame` and `to` outlive the call; sizes are theirs.
                let r = unsafe {
                    libc::sendto(
                        fd,
                        frame.as_ptr().cast(),
                        frame.len(),
                        0,
                        (&raw const to).cast(),
                        std::mem::size_of::<libc::sockaddr_ll>() as u32,
                    )
                };
                if r >= 0 && f == SYN {
                    sent += 1;
                }
            }
        }
        tick += 1;
        // Paced by the clock, not by sleeps that add up.
        let next = Duration::from_millis(10) * tick;
        std::thread::sleep(next.saturating_sub(started.elapsed()));
    }
    // SAFETY: ours, closed once.
    unsafe { libc::close(fd) };
    Ok(sent)
}

fn sources(e: &Env) -> anyhow::Result<Value> {
    Ok(serde_json::from_str(&e.xlb(&["sources", "--json"])?)?)
}

/// The `source`, `block` or `alarm` events whose reason mentions `what`.
fn events_of(e: &Env, kind: &str, what: &str) -> Vec<Value> {
    let ev = e.events().unwrap();
    ev.as_array()
        .unwrap()
        .iter()
        .filter(|v| v["kind"] == kind && v["reason"].as_str().unwrap_or("").contains(what))
        .cloned()
        .collect()
}

/// Two sources, one heavy: named first by `xlb sources` with its /32, a
/// `source` alert, metrics, the insert-cap alarm, then auto_block: one
/// `Auto` entry, one `block` event, its SYNs refused.
#[test]
fn heavy_source_is_named_alerted_and_auto_blocked() {
    let _serial = xlb_tests::lab::serial();
    let mut e = Env::new().unwrap();
    std::fs::write(&e.config, guard_config(&e)).unwrap();
    step("start: every backend up", || start_all_up(&mut e));
    let stop = Arc::new(AtomicBool::new(false));
    let sender = spawn_syns(&e, v4_plan(), stop.clone()).unwrap();
    let t = Instant::now();
    step(
        "xlb sources names the heavy source first, within 5 s",
        || {
            heavy_named_first(&e);
        },
    );
    println!("named after {:?}", t.elapsed());
    step("a source event says it is heavy", || {
        wait_for(Duration::from_secs(3), "source event", || {
            Ok(events_of(&e, "source", &format!("{HEAVY}/32"))
                .iter()
                .any(|v| v["to"] == "heavy" && v["vip"] == "api"))
        })
        .unwrap();
        assert!(
            events_of(&e, "source", &format!("{LIGHT}/32")).is_empty(),
            "the light source is not heavy"
        );
    });
    step("the metrics show it", || metrics_show_heavy(&e));
    step("the insert cap's alarm fires", || {
        wait_for(Duration::from_secs(3), "insert cap alarm", || {
            Ok(!events_of(&e, "alarm", "conntrack insert cap reached").is_empty())
        })
        .unwrap();
    });
    step("auto_block: one Auto entry and one block event", || {
        auto_blocked(&e);
    });
    println!("blocked after {:?}", t.elapsed());
    step("its SYNs are refused; the alerts clear", || {
        refused_then_cleared(&e);
    });
    stop.store(true, Ordering::Relaxed);
    let sent = sender.join().unwrap();
    println!("SYNs sent: {sent}");
    println!("{}", e.xlb(&["events"]).unwrap());
}

/// The victim a spoofer names: its real client opens 2 flows a second.
const VICTIM: &str = "198.51.100.9";

/// A flood of SYNs forging [`VICTIM`]'s address, 100 a second, none of
/// them followed by the handshake's ACK (a spoofer never sees the SYN-ACK):
/// counted as the victim's new flows (`xlb sources` shows them, far above
/// `auto_block`'s rate), but `auto_block` judges confirmed flows, and the
/// victim confirms 2 a second: nothing is blocked.
#[test]
fn spoofed_syn_flood_naming_a_victim_blocks_nothing() {
    let _serial = xlb_tests::lab::serial();
    let mut e = Env::new().unwrap();
    let mut config = config_text(&e, 1, 251);
    config += "\n[guard]\nauto_block = { above = \"20/s\", for = \"2s\", ttl = \"1m\" }\n";
    std::fs::write(&e.config, config).unwrap();
    step("start: every backend up", || start_all_up(&mut e));
    let stop = Arc::new(AtomicBool::new(false));
    let plan = vec![
        (VICTIM, "10.100.0.1", 1, false),
        (VICTIM, "10.100.0.1", 50, true),
    ];
    let sender = spawn_syns(&e, plan, stop.clone()).unwrap();
    step("the forged SYNs count as the victim's new flows", || {
        let mut last = Value::Null;
        let seen = wait_for(Duration::from_secs(5), "the victim counted", || {
            last = sources(&e)?;
            let row = &last[0]["sources"][0];
            Ok(row["prefix"] == format!("{VICTIM}/32")
                && row["new_flows_per_s"].as_f64() > Some(60.0))
        });
        assert!(seen.is_ok(), "{last:#}");
    });
    step(
        "well past auto_block's 2 s: no block, no block event",
        || {
            std::thread::sleep(Duration::from_secs(6));
            let blocks: Value =
                serde_json::from_str(&e.xlb(&["blocks", "--json"]).unwrap()).unwrap();
            assert_eq!(blocks.as_array().map(Vec::len), Some(0), "{blocks:#}");
            assert!(events_of(&e, "block", VICTIM).is_empty());
            let rows = sources(&e).unwrap();
            assert_eq!(rows[0]["sources"][0]["verdict"], "ok", "{rows:#}");
        },
    );
    stop.store(true, Ordering::Relaxed);
    sender.join().unwrap();
}

/// Sources a flood from many clients brings over `auto_block` at once.
const MANY: u32 = 10_000;

/// [`MANY`] sources of VIP `api` over `auto_block` in the same second,
/// written straight into the pinned per-source map as the data plane would
/// count 10,000 real clients: all blocked in batches of 500 a tick within
/// 30 s, with one `block` event a batch (not 10,000), while `xlb status`
/// keeps answering within 100 ms.
#[test]
fn ten_thousand_sources_over_auto_block_keep_the_loop_responsive() {
    let _serial = xlb_tests::lab::serial();
    let mut e = Env::new().unwrap();
    let mut config = config_text(&e, 1, 251);
    config += "\n[guard]\nauto_block = { above = \"50/s\", for = \"1s\", ttl = \"10m\" }\n";
    std::fs::write(&e.config, config).unwrap();
    step("start: every backend up", || start_all_up(&mut e));
    let api = e
        .maps()
        .unwrap()
        .vip(&lb_common::VipKey::new(
            "10.100.0.1".parse().unwrap(),
            80,
            lb_common::PROTO_TCP,
        ))
        .unwrap()
        .unwrap()
        .vip_id;
    let idle = status_times(&e, 10);
    println!("xlb status, idle: {idle:?}");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_many_sources(e.pins(), api, stop.clone());
    let mut times = Vec::new();
    let mut auto = 0usize;
    // Counted from the metrics (refreshed every tick): `xlb blocks` reads
    // every entry's hit counter, 10,000 map reads on the loop, which would
    // measure this test's polling rather than the daemon's blocking.
    let mut series = std::collections::BTreeSet::new();
    let blocked = wait_for(Duration::from_secs(30), "every source blocked", || {
        times.extend(status_times(&e, 1));
        let metrics = e.metrics()?;
        series.extend(
            metrics
                .lines()
                .filter(|l| l.starts_with("xlb_source_new_flows_per_second{"))
                .map(|l| l.split(' ').next().unwrap_or_default().to_owned()),
        );
        auto = metrics
            .lines()
            .find_map(|l| l.strip_prefix("xlb_list_entries{list=\"deny\",origin=\"auto\"} "))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        Ok(auto == MANY as usize)
    });
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.join().unwrap();
    times.sort();
    let p95 = times[times.len() * 95 / 100];
    let slowest = times[times.len() - 1];
    println!(
        "{auto} blocked; {rounds} rounds written; xlb status: {} answers, 95% within {p95:?}, \
         the slowest {slowest:?}",
        times.len()
    );
    assert!(blocked.is_ok(), "{auto} of {MANY} blocked");
    let blocks: Value = serde_json::from_str(&e.xlb(&["blocks", "--json"]).unwrap()).unwrap();
    assert_eq!(blocks.as_array().map(Vec::len), Some(MANY as usize));
    // No source_alert: no source is heavy, so the per-source metric has no
    // series (it had the 10 heaviest of the 10,000).
    assert!(series.is_empty(), "{series:?}");
    // 100 ms for 95% of the answers, and never a stall: on the shared
    // 2-CPU test machine (load 5 to 9 from other builds) a debug daemon's
    // thread is sometimes not scheduled for a tenth of a second, even idle.
    // Before batching, the loop saved the state file, started a purge
    // thread and recorded an event per block: seconds of stall.
    assert!(
        p95 < Duration::from_millis(100),
        "xlb status: 95% of answers within {p95:?} while blocking"
    );
    assert!(
        slowest < Duration::from_millis(500),
        "xlb status took {slowest:?} while blocking"
    );
    let added = events_of(&e, "block", "added");
    println!(
        "{} block events, the first: {}",
        added.len(),
        added[0]["reason"]
    );
    assert!(
        (20..=60).contains(&added.len()),
        "batches of at most 500: {} events",
        added.len()
    );
    assert!(
        added[0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("500 automatic deny entries of vip \"api\" added"),
        "{:#}",
        added[0]
    );
}

/// Times `n` answers of `xlb status`.
fn status_times(e: &Env, n: usize) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            e.status().unwrap();
            t.elapsed()
        })
        .collect()
}

/// Writes [`MANY`] sources of VIP `vip_id` into the per-source map pinned
/// under `pins`, each at 100 confirmed flows a second (advanced every
/// 500 ms), until `stop` or 40 s; the rounds written.
fn spawn_many_sources(
    pins: std::path::PathBuf,
    vip_id: u32,
    stop: Arc<AtomicBool>,
) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut dp = lb_user::dataplane::Dataplane::load(&LoadOptions {
            ct_size: 4096,
            nat_size: lb_common::nat::DEFAULT_NAT_SIZE,
            ring_stride: 251,
            pin_dir: Some(pins),
            kernel: None,
        })
        .expect("the pinned maps");
        let started = Instant::now();
        let mut rounds = 0u64;
        while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(40) {
            rounds += 1;
            let n = rounds * 50;
            for i in 0..MANY {
                let addr = Ipv4Addr::from(0x0ac8_0000 | i);
                let key = source_key(vip_id, addr.into(), 32, 64);
                let s = SourceState {
                    new_flows: n,
                    packets: n,
                    established: n,
                    ..SourceState::default()
                };
                dp.set_source(&key, &s).expect("a source");
            }
            let next = Duration::from_millis(500) * rounds as u32;
            std::thread::sleep(next.saturating_sub(started.elapsed()));
        }
        rounds
    })
}

/// An IPv6 VIP: four addresses of one /64 are one source, named first
/// with its /64 ahead of a lighter /64.
#[test]
fn ipv6_sources_are_keyed_by_their_64() {
    let _serial = xlb_tests::lab::serial();
    let mut e = Env::new().unwrap();
    // The VIP's backend refuses connections (down): sources are counted
    // before a backend is picked.
    e.ns.ip(&["addr", "add", "fd00::11/128", "dev", "lo"])
        .unwrap();
    let mut config = guard_config(&e);
    config += "\n[[vip]]\nname = \"v6\"\naddress = \"fd00:100::1\"\nport = 80\ntable_size = 251\n";
    config += "[[vip.backend]]\naddress = \"fd00::11\"\n";
    std::fs::write(&e.config, config).unwrap();
    step("start: every backend up", || start_all_up(&mut e));
    let stop = Arc::new(AtomicBool::new(false));
    let mut plan: Plan = [
        "2001:db8:1:2::1",
        "2001:db8:1:2::2",
        "2001:db8:1:2::3",
        "2001:db8:1:2:ffff::9",
    ]
    .into_iter()
    .map(|a| (a, "fd00:100::1", 4, false))
    .collect();
    plan.push(("2001:db8:9::1", "fd00:100::1", 10, false));
    let sender = spawn_syns(&e, plan, stop.clone()).unwrap();
    step("xlb sources --vip v6 names the /64 first", || {
        let mut last = Value::Null;
        let named = wait_for(Duration::from_secs(5), "the /64 named", || {
            last = serde_json::from_str(&e.xlb(&["sources", "--vip", "v6", "--json"])?)?;
            let rows = &last[0]["sources"];
            Ok(rows[0]["prefix"] == "2001:db8:1:2::/64"
                && rows[0]["new_flows_per_s"].as_f64() > Some(60.0)
                && rows[1]["prefix"] == "2001:db8:9::/64")
        });
        assert!(named.is_ok(), "{last:#}");
        assert_eq!(last.as_array().unwrap().len(), 1, "only v6: {last:#}");
        assert_eq!(last[0]["tracked"], 2, "{last:#}");
    });
    stop.store(true, Ordering::Relaxed);
    sender.join().unwrap();
}

fn heavy_named_first(e: &Env) {
    let mut last = Value::Null;
    let named = wait_for(Duration::from_secs(5), "heavy source named", || {
        last = sources(e)?;
        let rows = &last[0]["sources"];
        // The first sample of a new source covers part of an interval:
        // wait for a full one.
        Ok(last[0]["vip"] == "api"
            && rows[0]["prefix"] == format!("{HEAVY}/32")
            && rows[0]["new_flows_per_s"].as_f64() > Some(60.0)
            && rows[1]["prefix"] == format!("{LIGHT}/32"))
    });
    assert!(named.is_ok(), "{last:#}");
    let api = &last[0];
    let heavy = &api["sources"][0];
    let rate = heavy["new_flows_per_s"].as_f64().unwrap();
    assert!((60.0..=140.0).contains(&rate), "heavy at ~100/s: {heavy}");
    let share = heavy["share"].as_f64().unwrap();
    assert!((0.8..=0.95).contains(&share), "~91% of the VIP: {heavy}");
    assert!(api["tracked"].as_u64().unwrap() >= 2, "{api}");
    assert_eq!(heavy["verdict"], "ok", "{heavy}");
    let text = e.xlb(&["sources", "--vip", "api"]).unwrap();
    println!("{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("VIP api  new flows "), "{text}");
    assert!(lines[1].trim_start().starts_with("PREFIX"), "{text}");
    assert!(
        lines[2].trim_start().starts_with(&format!("{HEAVY}/32")),
        "{text}"
    );
    let err = e.xlb(&["sources", "--vip", "nope"]).unwrap_err();
    assert!(
        format!("{err:#}").contains("no VIP named \"nope\""),
        "{err:#}"
    );
}

fn metrics_show_heavy(e: &Env) {
    let mut text = String::new();
    let shown = wait_for(Duration::from_secs(3), "metrics", || {
        text = e.metrics()?;
        Ok(text.contains(&format!(
            "xlb_source_new_flows_per_second{{vip=\"api\",prefix=\"{HEAVY}/32\"}} "
        )) && text.contains("xlb_vip_source_alerts{vip=\"api\"} 1\n"))
    });
    assert!(shown.is_ok(), "{text}");
    let tracked = text
        .lines()
        .find_map(|l| l.strip_prefix("xlb_vip_sources_tracked{vip=\"api\"} "))
        .unwrap();
    assert!(tracked.parse::<u64>().unwrap() >= 2, "{tracked}");
    assert!(text.contains("xlb_list_entries{list=\"deny\",origin=\"auto\"} 0\n"));
}

fn auto_blocked(e: &Env) {
    let prefix = format!("{HEAVY}/32");
    wait_for(Duration::from_secs(8), "auto block", || {
        Ok(!events_of(e, "block", &prefix).is_empty())
    })
    .unwrap();
    let blocks: Value = serde_json::from_str(&e.xlb(&["blocks", "--json"]).unwrap()).unwrap();
    let auto: Vec<&Value> = blocks
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["origin"] == "auto")
        .collect();
    assert_eq!(auto.len(), 1, "{blocks:#}");
    assert_eq!(auto[0]["prefix"], prefix, "{blocks:#}");
    assert_eq!(auto[0]["list"], "deny");
    assert!(auto[0]["expires_unix_ms"].as_u64().is_some(), "a TTL");
    // Still flooding for two more seconds: no second block.
    std::thread::sleep(Duration::from_secs(2));
    // One event adds the entry; the background purge of its established
    // flows may tell how many it cut in another.
    let added: Vec<Value> = events_of(e, "block", &prefix)
        .into_iter()
        .filter(|v| v["reason"].as_str().unwrap().contains(" added: "))
        .collect();
    assert_eq!(added.len(), 1, "one block event: {added:#?}");
    let reason = added[0]["reason"].as_str().unwrap();
    assert!(reason.contains("auto_block: "), "{reason}");
    assert_eq!(added[0]["vip"], "api");
    assert!(events_of(e, "block", LIGHT).is_empty());
}

fn refused_then_cleared(e: &Env) {
    let denied = |e: &Env| -> anyhow::Result<u64> {
        Ok(e.status()?["counters"]["drop_denied"].as_u64().unwrap_or(0))
    };
    let before = denied(e).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        denied(e).unwrap() > before,
        "the heavy source's SYNs are dropped"
    );
    // Refused before they are counted: its rate falls to 0, and after 3
    // samples below the clear point the alert clears.
    wait_for(Duration::from_secs(6), "alert cleared", || {
        Ok(events_of(e, "source", &format!("{HEAVY}/32"))
            .iter()
            .any(|v| v["to"] == "normal"))
    })
    .unwrap();
    // Its SYNs no longer reach conntrack, the light source's 10/s are
    // under the cap: the insert cap's alarm clears.
    wait_for(Duration::from_secs(6), "insert cap alarm cleared", || {
        Ok(!events_of(e, "alarm", "conntrack insert cap no longer reached").is_empty())
    })
    .unwrap();
}

/// Walking all `MAX_SOURCES` entries: with aya's iterator, two syscalls per
/// entry (about 200 ms: why the daemon walks on its own thread), and as the
/// daemon does, with batch lookups.
#[test]
fn walking_a_full_sources_map() {
    let pins = std::path::Path::new("/sys/fs/bpf").join(format!("xlb-srcw-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&pins);
    std::fs::create_dir_all(&pins).unwrap();
    let opts = LoadOptions {
        ct_size: 4096,
        nat_size: lb_common::nat::DEFAULT_NAT_SIZE,
        ring_stride: 251,
        pin_dir: Some(pins.clone()),
        kernel: None,
    };
    let pin = pins.join(lb_common::MAP_SOURCES);
    let took = xlb_tests::harness::in_world("srcw", opts, |w| {
        // The inserts from one CPU: the common LRU keeps up to 128 free
        // entries in each CPU's local list, and a thread that moves between
        // CPUs can leave them there and make the map evict before it is
        // full (seen: 65,408 of 65,536 kept).
        let mut one = nix::sched::CpuSet::new();
        one.set(0)?;
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &one)?;
        for i in 0..MAX_SOURCES {
            let addr = Ipv4Addr::from(0x0a00_0000 | i);
            let key = source_key(1, addr.into(), 32, 64);
            let s = SourceState {
                new_flows: u64::from(i),
                ..SourceState::default()
            };
            w.dp.set_source(&key, &s)?;
        }
        let mut took = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            let walk = w.dp.sources();
            took.push(t.elapsed());
            assert_eq!(walk.len(), MAX_SOURCES as usize);
        }
        let mut batch = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            let walk = lb_user::daemon::walk_sources(&pin)?;
            batch.push(t.elapsed());
            assert_eq!(walk.len(), MAX_SOURCES as usize);
            assert!(
                walk.iter()
                    .any(|(_, s)| s.new_flows == u64::from(MAX_SOURCES - 1))
            );
        }
        Ok((took, batch))
    })
    .unwrap();
    let _ = std::fs::remove_dir_all(&pins);
    let (by_key, batch) = took;
    println!("walking {MAX_SOURCES} sources: key by key {by_key:?}, batched {batch:?}");
    // 12 to 25 ms on the 2-CPU test machine while other builds run; the
    // bound leaves room for a loaded machine, the comparison says why batch.
    let fastest = *batch.iter().min().unwrap();
    assert!(
        fastest < Duration::from_millis(100),
        "a batched walk of a full map in {fastest:?}"
    );
    assert!(fastest < *by_key.iter().min().unwrap(), "batched is faster");
}
