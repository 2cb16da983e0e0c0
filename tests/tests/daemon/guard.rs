//! The deny and allow lists as an operator uses them: `xlb block`,
//! `xlb allow`, `xlb unblock`, `xlb blocks`, against a running daemon. A
//! SYN is pushed through the daemon's own program and maps
//! (`BPF_PROG_TEST_RUN` on the pinned maps), so the hits `xlb blocks`
//! shows are the data plane's.

use std::time::Duration;

use aya::programs::{TestRun as _, TestRunOptions, Xdp};
use lb_common::{CtEntry, Stat};
use lb_ctl::ListKind;
use lb_user::dataplane::Dataplane;
use serde_json::Value;
use xlb_tests::{
    lab::serial,
    packet::{Flow, SYN},
};

use crate::env::{Env, config_text, wait_for};
use crate::{step, up};

const API: &str = "10.100.0.1";

/// Pushes a TCP SYN from `src`:`sport` to `vip`:80 through the daemon's
/// program once; the XDP verdict.
fn push_syn(dp: &mut Dataplane, src: &str, sport: u16, vip: &str) -> u32 {
    let frame = Flow::tcp(src, sport, vip, 80).frame(
        [0x02, 0, 0, 0, 0, 0x01],
        [0x02, 0, 0, 0, 0, 0x02],
        None,
        SYN,
        &[],
    );
    let mut out = vec![0u8; frame.len() + 256];
    let prog = dp.program::<Xdp>(lb_common::PROG_LB).unwrap();
    prog.test_run(TestRunOptions {
        data_in: Some(&frame),
        data_out: Some(&mut out),
        ..Default::default()
    })
    .unwrap()
    .return_value
}

/// `xlb blocks --json`.
fn blocks(e: &Env) -> Vec<Value> {
    let v: Value = serde_json::from_str(&e.xlb(&["blocks", "--json"]).unwrap()).unwrap();
    v.as_array().unwrap().clone()
}

/// The `xlb blocks --json` entry of `prefix` in `list`.
fn entry(e: &Env, list: &str, prefix: &str) -> Option<Value> {
    blocks(e)
        .into_iter()
        .find(|b| b["list"] == list && b["prefix"] == prefix)
}

fn hits(e: &Env, list: &str, prefix: &str) -> u64 {
    entry(e, list, prefix)
        .and_then(|b| b["hits"].as_u64())
        .unwrap_or_else(|| panic!("no {list} entry {prefix}"))
}

/// Runs `xlb ARGS`, expecting it to fail; its stderr.
fn xlb_fails(e: &Env, args: &[&str]) -> String {
    let err = e.xlb(args).expect_err("xlb should fail").to_string();
    println!("xlb {args:?} failed as expected: {err}");
    err
}

fn vip_id(dp: &Dataplane, vip: &str) -> u32 {
    let key = lb_common::VipKey::new(vip.parse().unwrap(), 80, lb_common::PROTO_TCP);
    dp.vip(&key).unwrap().unwrap().vip_id
}

/// The trie entries of `list`, as `(scope, prefix)`.
fn trie(dp: &Dataplane, list: ListKind) -> Vec<(u32, String)> {
    let mut v: Vec<_> = dp
        .list_entries(list)
        .unwrap()
        .into_iter()
        .map(|(k, _)| (k.scope, format!("{}/{}", k.addr, k.len)))
        .collect();
    v.sort();
    v
}

/// Waits for an event whose reason contains `text`.
fn wait_for_event(e: &Env, text: &str) -> Value {
    let mut found = None;
    wait_for(
        Duration::from_secs(5),
        &format!("an event with {text:?}"),
        || {
            found = e.events()?.as_array().unwrap().iter().find_map(|ev| {
                ev["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains(text))
                    .then(|| ev.clone())
            });
            Ok(found.is_some())
        },
    )
    .unwrap();
    found.unwrap()
}

// --- block, blocks, unblock

/// Block an address with reset: its SYN is refused and counted, another
/// source's is not; an established flow from a newly blocked source is
/// cut; unblock removes the entry from the list and the trie.
#[test]
fn block_blocks_unblock_round_trip() {
    let _serial = serial();
    let e = up();
    let mut dp = e.maps().unwrap();
    let api = vip_id(&dp, API);
    step("block 192.0.2.7 with reset", || {
        let out = e
            .xlb(&[
                "block",
                "192.0.2.7",
                "--action",
                "reset",
                "--reason",
                "seed 001",
            ])
            .unwrap();
        assert!(
            out.contains("runtime deny 192.0.2.7/32 (all VIPs) added: reset, no expiry: seed 001"),
            "{out}"
        );
        let b = entry(&e, "deny", "192.0.2.7/32").expect("listed");
        assert_eq!(
            (&b["origin"], &b["action"], &b["vip"]),
            (&"runtime".into(), &"reset".into(), &Value::Null)
        );
        assert_eq!(b["hits"], 0);
        assert_eq!(
            trie(&dp, ListKind::Deny),
            [(lb_common::SCOPE_GLOBAL, "192.0.2.7/32".to_owned())]
        );
        let g = dp.guard(api).unwrap();
        assert_ne!(
            g.flags & lb_common::GUARD_LISTS,
            0,
            "api judges new flows: {g:?}"
        );
    });
    step("a SYN from it is refused with a RST and counted", || {
        let before = dp.stats().unwrap();
        let verdict = push_syn(&mut dp, "192.0.2.7", 40000, API);
        assert_eq!(verdict, 3, "XDP_TX: the RST goes back");
        assert_eq!(hits(&e, "deny", "192.0.2.7/32"), 1);
        let after = dp.stats().unwrap();
        assert_eq!(after[&Stat::ResetDenied] - before[&Stat::ResetDenied], 1);
    });
    step("a SYN from another source is not", || {
        push_syn(&mut dp, "192.0.2.8", 40000, API);
        assert_eq!(hits(&e, "deny", "192.0.2.7/32"), 1);
    });
    step("the text table", || {
        let text = e.xlb(&["blocks"]).unwrap();
        println!("{text}");
        let row = text
            .lines()
            .find(|l| l.contains("192.0.2.7/32"))
            .expect("a row");
        for col in ["deny", "all", "reset", "runtime", "1", "never", "seed 001"] {
            assert!(
                row.split_whitespace().any(|w| w == col) || row.contains(col),
                "{col:?} in {row:?}"
            );
        }
    });
    step(
        "blocking a source cuts its established flows to that VIP",
        || {
            let flow = Flow::tcp("192.0.2.9", 41000, API, 80).key();
            let other = Flow::tcp("192.0.2.10", 41000, API, 80).key();
            let ct = CtEntry {
                backend_id: 1,
                generation: 1,
                vip_id: api,
                flags: 0,
                last_seen_ns: 1,
            };
            dp.ct_insert(&flow, &ct).unwrap();
            dp.ct_insert(&other, &ct).unwrap();
            let out = e.xlb(&["block", "192.0.2.9", "--vip", "api"]).unwrap();
            println!("{out}");
            assert!(out.contains("1 established flows cut"), "{out}");
            assert_eq!(dp.ct_get(&flow).unwrap(), None, "cut");
            assert!(
                dp.ct_get(&other).unwrap().is_some(),
                "another source's flow stays"
            );
            assert_eq!(
                trie(&dp, ListKind::Deny)[0],
                (api, "192.0.2.9/32".to_owned())
            );
        },
    );
    step("an IPv6 /64 and bad arguments", || {
        e.xlb(&["block", "2001:db8:1:2::/64", "--vip", "web", "--ttl", "1h"])
            .unwrap();
        let b = entry(&e, "deny", "2001:db8:1:2::/64").expect("listed");
        assert_eq!(b["vip"], "web");
        assert!(b["expires_unix_ms"].is_u64());
        let err = xlb_fails(&e, &["block", "2001:db8:1:2::1/64"]);
        assert!(
            err.contains("has host bits set; write \"2001:db8:1:2::/64\""),
            "{err}"
        );
        let err = xlb_fails(&e, &["block", "192.0.2.1", "--vip", "nope"]);
        assert!(err.contains("no VIP named \"nope\""), "{err}");
    });
    step("unblock removes entries; an absent one is an error", || {
        let out = e.xlb(&["unblock", "192.0.2.7"]).unwrap();
        assert!(
            out.contains("runtime deny 192.0.2.7/32 (all VIPs) removed (1 hits)"),
            "{out}"
        );
        let err = xlb_fails(&e, &["unblock", "192.0.2.9"]);
        assert!(err.contains("it is listed with --vip api"), "{err}");
        e.xlb(&["unblock", "192.0.2.9", "--vip", "api"]).unwrap();
        e.xlb(&["unblock", "2001:db8:1:2::/64", "--vip", "web"])
            .unwrap();
        assert!(blocks(&e).is_empty());
        assert!(trie(&dp, ListKind::Deny).is_empty());
        assert_eq!(dp.guard(api).unwrap().flags & lb_common::GUARD_LISTS, 0);
        let err = xlb_fails(&e, &["unblock", "192.0.2.7"]);
        assert!(
            err.contains("there is no deny 192.0.2.7/32 (all VIPs)"),
            "{err}"
        );
        wait_for_event(&e, "runtime deny 192.0.2.7/32 (all VIPs) removed");
    });
}

// --- TTL

/// An entry with a TTL goes by itself, from the list and the trie, with an
/// event.
#[test]
fn block_expires_by_ttl() {
    let _serial = serial();
    let e = up();
    let dp = e.maps().unwrap();
    step("block for 2 s", || {
        e.xlb(&["block", "198.51.100.0/24", "--ttl", "2s"]).unwrap();
        assert!(entry(&e, "deny", "198.51.100.0/24").is_some());
        assert_eq!(trie(&dp, ListKind::Deny).len(), 1);
    });
    step("gone within 4 s, with an event", || {
        wait_for(Duration::from_secs(4), "the entry expires", || {
            Ok(entry(&e, "deny", "198.51.100.0/24").is_none())
        })
        .unwrap();
        assert!(trie(&dp, ListKind::Deny).is_empty());
        let ev = wait_for_event(&e, "198.51.100.0/24 (all VIPs) expired");
        assert_eq!(ev["kind"], "block");
    });
}

// --- restart

/// Runtime entries outlive the daemon: after kill -9 and a new start they
/// are listed as before (reason, expiry, hits) on the same rule ids, and a
/// stray entry left in a trie is removed.
#[test]
fn runtime_entries_survive_a_restart() {
    let _serial = serial();
    let mut e = up();
    let mut dp = e.maps().unwrap();
    let before = step("block and allow, one hit", || {
        e.xlb(&["block", "192.0.2.7", "--ttl", "1h", "--reason", "kept"])
            .unwrap();
        e.xlb(&["allow", "10.9.0.0/16", "--vip", "web"]).unwrap();
        push_syn(&mut dp, "192.0.2.7", 40000, API);
        assert_eq!(hits(&e, "deny", "192.0.2.7/32"), 1);
        (blocks(&e), dp.list_entries(ListKind::Deny).unwrap())
    });
    step("kill -9, a stray entry, start again", || {
        e.kill9().unwrap();
        let stray = lb_user::dataplane::ListKey {
            scope: lb_common::SCOPE_GLOBAL,
            addr: "203.0.113.0".parse().unwrap(),
            len: 24,
        };
        let value = lb_common::ListEntry {
            rule: 77,
            action: lb_common::ACTION_DROP,
            _pad: [0; 3],
        };
        dp.list_insert(ListKind::Deny, &stray, value).unwrap();
        std::fs::remove_file(&e.socket).ok();
        e.start().unwrap();
    });
    step("listed as before, same rules, the stray gone", || {
        assert_eq!(blocks(&e), before.0, "the same entries, hits included");
        assert_eq!(dp.list_entries(ListKind::Deny).unwrap(), before.1);
        assert_eq!(trie(&dp, ListKind::Allow).len(), 1);
    });
}

// --- configuration entries and reload

/// The configuration with `extra` appended (after both VIPs: a
/// `[vip.guard]` there belongs to "web").
fn write_config(e: &Env, extra: &str) {
    std::fs::write(&e.config, format!("{}\n{extra}", config_text(e, 1, 251))).unwrap();
}

/// Config entries are listed, refused by unblock; a reload that changes
/// only the guard applies it live without touching the VIPs.
#[test]
fn config_entries_and_reload_change_the_guard() {
    let _serial = serial();
    let e = up();
    let dp = e.maps().unwrap();
    let (api, web) = (vip_id(&dp, API), vip_id(&dp, "10.100.0.2"));
    let tables = super::table(&dp, API).unwrap();
    step("reload with a deny entry and a limit", || {
        write_config(
            &e,
            r#"
[guard]
ct_insert_cap = "100000/s"
new_flows_per_source = { rate = "200/s", burst = 400, action = "reset" }
[[guard.deny]]
prefix = "192.0.2.50"
reason = "from the file"
"#,
        );
        let out = e.xlb(&["reload"]).unwrap();
        println!("{out}");
        assert!(out.contains("0 changed"), "the VIPs are not touched: {out}");
        assert!(out.contains("guard"), "{out}");
        let b = entry(&e, "deny", "192.0.2.50/32").expect("listed");
        assert_eq!(
            (&b["origin"], &b["reason"]),
            (&"config".into(), &"from the file".into())
        );
        let g = dp.guard(api).unwrap();
        assert_eq!(
            g.flags & lb_common::GUARD_LIMIT,
            lb_common::GUARD_LIMIT,
            "{g:?}"
        );
        assert_eq!(
            (g.interval_ns, g.tolerance_ns, g.limit_action),
            (5_000_000, 399 * 5_000_000, lb_common::ACTION_RESET)
        );
        assert_eq!(g.ct_insert_cap, 100_000);
        assert_eq!(
            super::table(&dp, API).unwrap(),
            tables,
            "api's table untouched"
        );
    });
    step("unblock refuses a config entry", || {
        let err = xlb_fails(&e, &["unblock", "192.0.2.50"]);
        assert!(
            err.contains("comes from the configuration file; edit the file and reload"),
            "{err}"
        );
        let err = xlb_fails(&e, &["block", "192.0.2.50", "--ttl", "1m"]);
        assert!(err.contains("comes from the configuration file"), "{err}");
    });
    step("reload: limit only on web, the entry gone", || {
        write_config(
            &e,
            r#"
[vip.guard]
new_flows_per_source = { rate = "10/s" }
track_sources = false
"#,
        );
        e.xlb(&["reload"]).unwrap();
        assert!(blocks(&e).is_empty());
        assert!(trie(&dp, ListKind::Deny).is_empty());
        let g = dp.guard(api).unwrap();
        assert_eq!(g.flags, lb_common::GUARD_TRACK, "api: defaults: {g:?}");
        // No ct_insert_cap in the file: Katran's 125,000 per CPU, not off.
        assert_eq!(g.ct_insert_cap, 125_000);
        let g = dp.guard(web).unwrap();
        assert_eq!(
            g.flags,
            lb_common::GUARD_LIMIT,
            "web: limit, no tracking: {g:?}"
        );
        assert_eq!(
            (g.interval_ns, g.tolerance_ns),
            (100_000_000, 9 * 100_000_000)
        );
    });
    step("an invalid guard is refused, the running one kept", || {
        write_config(&e, "[guard]\nsource_v4_prefix = 33\n");
        let err = xlb_fails(&e, &["reload"]);
        assert!(err.contains("source_v4_prefix 33 is out of range"), "{err}");
        assert_eq!(dp.guard(web).unwrap().flags, lb_common::GUARD_LIMIT);
    });
}

// --- allow over deny

/// An allow entry inside a denied prefix lets its source through (counted
/// on the allow entry), the rest of the prefix stays refused.
#[test]
fn allow_wins_over_deny() {
    let _serial = serial();
    let e = up();
    let mut dp = e.maps().unwrap();
    step(
        "deny a /24 at api, allow one address of it everywhere",
        || {
            e.xlb(&["block", "192.0.2.0/24", "--vip", "api"]).unwrap();
            let out = e
                .xlb(&["allow", "192.0.2.7", "--reason", "monitoring"])
                .unwrap();
            assert!(
                out.contains("runtime allow 192.0.2.7/32 (all VIPs) added"),
                "{out}"
            );
        },
    );
    step("the allowed source passes, its neighbour does not", || {
        let before = dp.stats().unwrap();
        // The allowed SYN goes on to be forwarded (which a test run, with
        // no route to the backend, may still drop): the counters tell.
        push_syn(&mut dp, "192.0.2.7", 40000, API);
        let dropped = push_syn(&mut dp, "192.0.2.8", 40000, API);
        assert_eq!(dropped, 1, "XDP_DROP");
        let after = dp.stats().unwrap();
        assert_eq!(after[&Stat::AllowListed] - before[&Stat::AllowListed], 1);
        assert_eq!(after[&Stat::DropDenied] - before[&Stat::DropDenied], 1);
        assert_eq!(hits(&e, "allow", "192.0.2.7/32"), 1);
        assert_eq!(hits(&e, "deny", "192.0.2.0/24"), 1);
    });
    step("a deny entry under an allow entry says so", || {
        let out = e.xlb(&["block", "192.0.2.7"]).unwrap();
        assert!(out.contains("an allow entry covers 192.0.2.7"), "{out}");
    });
}
