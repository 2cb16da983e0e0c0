//! `daemon.second_chance_window` as the daemon applies it: from the start
//! (a window of 0 means no previous owner is ever written, from the first
//! rebuild on) and, for a reload that changes it, to that reload's own
//! rebuilds.

use std::time::Duration;

use anyhow::Context as _;
use xlb_tests::lab::serial;

use crate::env::{BACKENDS, Env, config_text, wait_for};
use crate::{start_all_up, step, vip_key};

/// The configuration with `window` and VIP api's first backend at
/// `weight` (the others at 1), so a change of `weight` moves slots.
fn config(e: &Env, window: &str, weight: u32) -> String {
    config_text(e, 1, 251)
        .replacen(
            "[daemon]\n",
            &format!("[daemon]\nsecond_chance_window = \"{window}\"\n"),
            1,
        )
        // The first backend listed is api's.
        .replacen(
            &format!("address = \"{}\"\nweight = 1\n", BACKENDS[0]),
            &format!("address = \"{}\"\nweight = {weight}\n", BACKENDS[0]),
            1,
        )
}

/// VIP api's live half: (slots, slots that name a previous owner).
fn live_prev(e: &Env) -> anyhow::Result<(usize, usize)> {
    let dp = e.maps()?;
    let info = dp.vip(&vip_key("10.100.0.1"))?.context("vip api in maps")?;
    let slots = dp.ring_slots(info.vip_id, info.active, info.table_size)?;
    let with_prev = slots.iter().filter(|s| s.prev_id != 0).count();
    Ok((slots.len(), with_prev))
}

/// Rewrites the configuration and reloads it.
fn reload(e: &Env, text: &str) {
    std::fs::write(&e.config, text).unwrap();
    e.xlb(&["reload"]).unwrap();
}

/// VIP api's live half: the backend ids.
fn live_table(e: &Env) -> Vec<u32> {
    let dp = e.maps().unwrap();
    let info = dp.vip(&vip_key("10.100.0.1")).unwrap().unwrap();
    dp.ring_half(info.vip_id, info.active, info.table_size)
        .unwrap()
}

#[test]
fn the_window_holds_from_the_start_and_for_a_reloads_own_rebuilds() {
    let _serial = serial();
    let mut e = Env::new().unwrap();
    std::fs::write(&e.config, config(&e, "0s", 1)).unwrap();
    step("start with second_chance_window 0s", || {
        start_all_up(&mut e);
    });
    step(
        "a table change with window 0s remembers no previous owner",
        || {
            let before = live_table(&e);
            reload(&e, &config(&e, "0s", 5));
            wait_for(Duration::from_secs(10), "api's table rebuilt", || {
                Ok(live_table(&e) != before)
            })
            .unwrap();
            let (slots, with_prev) = live_prev(&e).unwrap();
            assert_eq!(
                with_prev, 0,
                "{with_prev} of {slots} slots name a previous owner with a window of 0s"
            );
        },
    );
    step(
        "a reload to 10m and a table change: that rebuild remembers",
        || {
            let before = live_table(&e);
            reload(&e, &config(&e, "10m", 1));
            wait_for(Duration::from_secs(10), "api's table rebuilt", || {
                Ok(live_table(&e) != before)
            })
            .unwrap();
            let (slots, with_prev) = live_prev(&e).unwrap();
            assert!(
                with_prev > 0,
                "no slot of {slots} names a previous owner after a change with a 10m window"
            );
        },
    );
}
