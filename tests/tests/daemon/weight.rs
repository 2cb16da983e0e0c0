//! `xlb weight`: a backend's weight changed live, judged by the table the
//! data plane reads; the override kept across a restart and an unchanged
//! reload, dropped by a reload that changes that backend's weight; bad
//! requests refused with the configuration's wording and nothing changed.

use lb_user::dataplane::Dataplane;
use serde_json::Value;

use crate::env::{Env, config_text};
use crate::{backend_id, serial, step, table, up};

const API: &str = "10.100.0.1";
const B11: &str = "10.0.0.11:80";

/// api's live table.
fn live(dp: &Dataplane) -> Vec<u32> {
    let (active, h0, h1) = table(dp, API).unwrap();
    if active == 0 { h0 } else { h1 }
}

/// Slots of api's live table that hold backend `id`.
fn slots_of(dp: &Dataplane, id: u32) -> usize {
    live(dp).iter().filter(|&&s| s == id).count()
}

fn weight(e: &Env, args: &[&str]) -> Value {
    let mut all = vec!["weight"];
    all.extend_from_slice(args);
    all.push("--json");
    serde_json::from_str(&e.xlb(&all).unwrap()).unwrap()
}

/// The last `weight` event.
fn last_weight_event(e: &Env) -> Value {
    let events = e.events().unwrap();
    events
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|ev| ev["kind"] == "weight")
        .cloned()
        .expect("a weight event")
}

#[test]
fn weight_changes_the_table_and_persists_until_the_file_changes_it() {
    let _serial = serial();
    let mut e = up();
    let dp = e.maps().unwrap();
    let id = backend_id(&e, "api", B11);
    // 251 slots over three backends of weight 1.
    let before = slots_of(&dp, id);
    step(
        "weight 3: the table gives it about 3/5 of the slots",
        || {
            set_three(&e, &dp, id, before);
        },
    );
    step("bad requests are refused, nothing changes", || {
        bad_requests(&e, &dp);
    });
    step("weight 0 takes it out of the table; back to 3", || {
        let r = weight(&e, &["api", "10.0.0.12", "0"]);
        assert_eq!((r["from"].as_u64(), r["to"].as_u64()), (Some(1), Some(0)));
        let id12 = backend_id(&e, "api", "10.0.0.12:80");
        assert_eq!(slots_of(&dp, id12), 0, "weight 0: no slot");
        let b = e.backend("api", "10.0.0.12:80").unwrap();
        assert_eq!(
            (b["in_table"].as_bool(), b["state"].as_str()),
            (Some(false), Some("up"))
        );
        // The configured weight removes the override.
        let r = weight(&e, &["api", "10.0.0.12", "1"]);
        assert_eq!(r["overridden"], false, "{r}");
        assert!(slots_of(&dp, id12) > 0);
        assert!(e.backend("api", "10.0.0.12:80").unwrap()["configured_weight"].is_null());
    });
    step(
        "kill -9 and start: the override stands, table untouched",
        || {
            let t = table(&dp, API).unwrap();
            e.kill9().unwrap();
            std::fs::remove_file(&e.socket).ok();
            e.start().unwrap();
            let b = e.backend("api", B11).unwrap();
            assert_eq!(
                (b["weight"].as_u64(), b["configured_weight"].as_u64()),
                (Some(3), Some(1)),
                "{b}"
            );
            assert_eq!(
                table(&dp, API).unwrap(),
                t,
                "the adopted table is the override's"
            );
        },
    );
    step("a reload of the same file keeps the override", || {
        let out = e.xlb(&["reload"]).unwrap();
        assert!(out.contains("0 changed"), "{out}");
        assert_eq!(e.backend("api", B11).unwrap()["weight"], 3);
    });
    step(
        "a reload that changes its weight drops the override",
        || {
            drop_by_reload(&mut e, &dp, id);
        },
    );
}

fn set_three(e: &Env, dp: &Dataplane, id: u32, before: usize) {
    let old = live(dp);
    let r = weight(e, &["api", "10.0.0.11", "3"]);
    assert_eq!(r["from"], 1, "{r}");
    assert_eq!(r["to"], 3, "{r}");
    assert_eq!(r["configured"], 1, "{r}");
    assert_eq!(r["overridden"], true, "{r}");
    let changed = r["table_slots_changed"].as_u64().unwrap();
    let after = slots_of(dp, id);
    println!("slots of {B11}: {before} -> {after} ({changed} changed)");
    // Shares 1/3 → 3/5 of 251 slots: about 84 → 151.
    assert!((70..100).contains(&before), "{before}");
    assert!((135..165).contains(&after), "{after}");
    let differ = old.iter().zip(live(dp)).filter(|(a, b)| **a != *b).count();
    assert_eq!(
        changed, differ as u64,
        "the slots that changed in the live table"
    );
    assert!(
        differ >= after - before,
        "{differ} slots changed, {after} - {before} gained"
    );
    let b = e.backend("api", B11).unwrap();
    assert_eq!(b["weight"], 3, "{b}");
    assert_eq!(b["configured_weight"], 1, "{b}");
    let text = e.xlb(&["status"]).unwrap();
    assert!(
        text.contains("weight 3 by xlb weight, configured 1"),
        "{text}"
    );
    let ev = last_weight_event(e);
    assert_eq!(
        (ev["from"].as_str(), ev["to"].as_str()),
        (Some("1"), Some("3")),
        "{ev}"
    );
    assert_eq!(ev["backend"], B11, "{ev}");
    assert!(ev["table_slots_changed"].is_u64(), "{ev}");
    // The same weight again: nothing to do.
    let again = e.xlb(&["weight", "api", B11, "3"]).unwrap();
    assert!(again.contains("weight already 3"), "{again}");
}

fn bad_requests(e: &Env, dp: &Dataplane) {
    let t = table(dp, API).unwrap();
    // (name, args, start of the error)
    let cases: [(&str, &[&str], &str); 4] = [
        (
            "unknown VIP",
            &["nope", "10.0.0.11", "3"],
            "no VIP named \"nope\"; configured: api, web",
        ),
        (
            "unknown backend",
            &["api", "10.0.0.99", "3"],
            "vip \"api\" has no backend \"10.0.0.99\"; its backends: 10.0.0.11:80, 10.0.0.12:80, 10.0.0.13:80",
        ),
        (
            "out of range, as check-config says it",
            &["api", "10.0.0.11", "1001"],
            "vip \"api\": backend 10.0.0.11:80: weight 1001 is too large; use 0 to 1000 \
             (weights are relative; 0 takes no new flows)",
        ),
        (
            "not a number",
            &["api", "10.0.0.11", "-1"],
            "\"-1\" is not a weight",
        ),
    ];
    for (name, args, want) in cases {
        let mut all = vec!["weight"];
        all.extend_from_slice(args);
        let err = e.xlb(&all).unwrap_err().to_string();
        assert!(err.contains(want), "{name}: {err}");
    }
    assert_eq!(table(dp, API).unwrap(), t, "the table is untouched");
    assert_eq!(e.backend("api", B11).unwrap()["weight"], 3);
    // check-config words the same weight the same way.
    let bad = e.config.with_file_name("bad-weight.toml");
    let text = config_text(e, 1001, 251);
    std::fs::write(&bad, text).unwrap();
    let out = std::process::Command::new(crate::env::xlb_bin())
        .args(["check-config"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "weight 1001 is too large; use 0 to 1000 (weights are relative; 0 takes no new flows)"
        ),
        "{err}"
    );
}

fn drop_by_reload(e: &mut Env, dp: &Dataplane, id: u32) {
    let text = config_text(e, 1, 251);
    let old = format!("[[vip.backend]]\naddress = \"{}\"\nweight = 1\n", &B11[..9]);
    assert!(text.contains(&old), "{text}");
    // The first occurrence is api's.
    let new = text.replacen(&old, &old.replace("weight = 1", "weight = 2"), 1);
    std::fs::write(&e.config, new).unwrap();
    let out = e.xlb(&["reload"]).unwrap();
    assert!(
        out.contains(
            "weight override 3 of 10.0.0.11:80 in vip \"api\" dropped: the configuration \
             changed its weight from 1 to 2"
        ),
        "{out}"
    );
    let b = e.backend("api", B11).unwrap();
    assert_eq!(b["weight"], 2, "{b}");
    assert!(b["configured_weight"].is_null(), "{b}");
    let ev = last_weight_event(e);
    assert_eq!(
        (ev["from"].as_str(), ev["to"].as_str()),
        (Some("3"), Some("2")),
        "{ev}"
    );
    // Shares 2/4 of 251.
    let slots = slots_of(dp, id);
    assert!((110..140).contains(&slots), "{slots}");
    // And a restart does not bring it back.
    e.kill9().unwrap();
    std::fs::remove_file(&e.socket).ok();
    e.start().unwrap();
    let b = e.backend("api", B11).unwrap();
    assert_eq!(b["weight"], 2, "{b}");
    assert!(b["configured_weight"].is_null(), "{b}");
}
