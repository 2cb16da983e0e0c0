//! Restarts that are not the plain `kill -9` and start again: a restart
//! with a changed file (as graceful as a reload), two daemons for one
//! instance, pins a failed first start left, `xlb detach --instance` with a
//! name that is not one, and the forwarding sysctls `xlb run` turns on.

use std::{collections::BTreeMap, process::Command};

use anyhow::Context as _;
use lb_user::dataplane::Dataplane;
use xlb_tests::lab::serial;

use crate::env::{Env, config_text, xlb_bin};
use crate::{hang_backend_2, live_ids, step, up};

const WEB: &str = "10.100.0.2";

/// Backend id → (address, generation) of the live table of `vip`.
fn members(dp: &Dataplane, vip: &str) -> BTreeMap<u32, (String, u32)> {
    live_ids(dp, vip)
        .into_iter()
        .map(|id| (id, (crate::backend_addr(dp, id), dp.backend(id).unwrap().generation)))
        .collect()
}

/// The file after an edit of VIP web: weight 1 → 2, table 251 → 241,
/// backend .13 removed, .14 added (no server: it stays out of the table).
fn edited(e: &Env) -> String {
    let text = config_text(e, 2, 241);
    let gone = "[[vip.backend]]\naddress = \"10.0.0.13\"\nweight = 2\n";
    assert!(text.contains(gone), "{text}");
    text.replace(
        gone,
        "[[vip.backend]]\naddress = \"10.0.0.14\"\nweight = 2\n",
    )
}

/// kill -9, the file edited (table size, weights, a backend removed, one
/// added), start again: every backend web keeps has its id, generation and
/// health (backend 2 down stays down, the others up, none `unknown`), the
/// table is rebuilt at its new size from them, the removed one's id is
/// retired and not handed to the added one.
#[test]
fn restart_with_a_changed_file_adopts_backends() {
    let _serial = serial();
    let mut e = up();
    step("hang backend 2", || hang_backend_2(&e));
    let dp = e.maps().unwrap();
    let before = members(&dp, WEB);
    let b2 = crate::backend_id(&e, "web", "10.0.0.12:80");
    let b2_generation = dp.backend(b2).unwrap().generation;
    println!("web before: {before:?}, backend 2 (down): id {b2}");
    step("kill -9, edit the file, start again", || {
        e.kill9().unwrap();
        std::fs::write(&e.config, edited(&e)).unwrap();
        std::fs::remove_file(&e.socket).ok();
        e.start().unwrap();
        assert_eq!(e.status().unwrap()["adopted"], true);
    });
    step("kept backends keep their health, ids and generations", || {
        for (addr, want) in [("10.0.0.11:80", "up"), ("10.0.0.12:80", "down")] {
            assert_eq!(e.backend_state("web", addr).unwrap(), want, "{addr}");
        }
        let after = members(&dp, WEB);
        println!("web after: {after:?}");
        let kept: BTreeMap<_, _> = before
            .iter()
            .filter(|(_, (a, _))| a != "10.0.0.13:80")
            .map(|(id, m)| (*id, m.clone()))
            .collect();
        // Backend 2 is down: out of the table before and after.
        assert_eq!(after, kept, "table members, ids and generations");
        assert_eq!(crate::backend_id(&e, "web", "10.0.0.12:80"), b2);
        assert_eq!(dp.backend(b2).unwrap().generation, b2_generation);
        let info = dp.vip(&crate::vip_key(WEB)).unwrap().context("web").unwrap();
        assert_eq!(info.table_size, 241, "rebuilt at the new size");
    });
    step("the removed backend's id is retired, not reused", || {
        let (gone, _) = before
            .iter()
            .find(|(_, (a, _))| a == "10.0.0.13:80")
            .unwrap();
        assert_eq!(dp.backend(*gone).unwrap().state, 0, "id {gone} retired");
        let added = crate::backend_id(&e, "web", "10.0.0.14:80");
        assert!(!before.contains_key(&added), "added got a used id {added}");
        assert_eq!(e.backend_state("web", "10.0.0.14:80").unwrap(), "unknown");
    });
}
