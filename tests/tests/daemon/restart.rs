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
        .map(|id| {
            (
                id,
                (
                    crate::backend_addr(dp, id),
                    dp.backend(id).unwrap().generation,
                ),
            )
        })
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
    step(
        "kept backends keep their health, ids and generations",
        || {
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
            let info = dp
                .vip(&crate::vip_key(WEB))
                .unwrap()
                .context("web")
                .unwrap();
            assert_eq!(info.table_size, 241, "rebuilt at the new size");
        },
    );
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

/// Runs `xlb run --config <config>` in the namespace and waits up to 10 s
/// for it to exit; its stderr. A daemon still running after that is killed
/// and the step fails.
fn run_expecting_exit(e: &Env, config: &std::path::Path) -> (bool, String) {
    let mut child = e
        .in_ns()
        .arg(xlb_bin())
        .args(["run", "--config"])
        .arg(config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if t.elapsed() > std::time::Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("xlb run --config {} did not exit", config.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status.success(), err)
}

/// A second daemon for the same instance, with a control socket of its own,
/// is refused before it touches the maps, naming the first one's pid; the
/// first one's tables are untouched.
#[test]
fn a_second_daemon_for_the_same_instance_is_refused() {
    let _serial = serial();
    let e = up();
    let dp = e.maps().unwrap();
    let before = (
        crate::table(&dp, "10.100.0.1").unwrap(),
        crate::table(&dp, WEB).unwrap(),
    );
    let other_socket = e.socket.with_file_name("second.sock");
    let other_config = e.config.with_file_name("second.toml");
    let text = std::fs::read_to_string(&e.config).unwrap();
    let text = text.replace(
        &e.socket.display().to_string(),
        &other_socket.display().to_string(),
    );
    std::fs::write(&other_config, text).unwrap();
    step("the second daemon exits with the first one's pid", || {
        let (ok, err) = run_expecting_exit(&e, &other_config);
        assert!(!ok, "the second daemon must be refused");
        let pid = e.daemon_pid().unwrap();
        assert!(
            err.contains(&format!(
                "instance {:?} is in use by xlb run (pid {pid})",
                e.instance
            )),
            "{err}"
        );
        assert!(!other_socket.exists(), "no second control socket");
    });
    step("the first daemon and its tables are untouched", || {
        let after = (
            crate::table(&dp, "10.100.0.1").unwrap(),
            crate::table(&dp, WEB).unwrap(),
        );
        assert_eq!(after, before);
        assert!(e.status().is_ok(), "the first daemon answers");
    });
}

/// Maps pinned by a first start that never finished (layout version 0, no
/// link) do not block the next start: they are replaced.
#[test]
fn pins_of_a_start_that_never_finished_are_replaced() {
    let _serial = serial();
    let mut e = Env::new().unwrap();
    step("pin maps with layout version 0 and no link", || {
        std::fs::create_dir_all(e.pins()).unwrap();
        let mut dp = e.maps().unwrap();
        let mut g = dp.globals().unwrap();
        g.layout_version = 0;
        dp.set_globals(&g).unwrap();
        assert_eq!(
            lb_user::dataplane::pinned_layout_version(&e.pins()).unwrap(),
            Some(0)
        );
    });
    step("xlb run starts afresh", || {
        crate::start_all_up(&mut e);
        assert_eq!(e.status().unwrap()["adopted"], false);
        assert_eq!(
            lb_user::dataplane::pinned_layout_version(&e.pins()).unwrap(),
            Some(lb_common::LAYOUT_VERSION)
        );
        let log = e.log(1).unwrap();
        assert!(
            log.contains("maps pinned by a start that never finished"),
            "{log}"
        );
    });
}

/// `xlb detach --instance` with a name that would walk out of
/// /sys/fs/bpf/xlb is refused, and touches nothing.
#[test]
fn detach_refuses_an_instance_name_that_is_a_path() {
    let _serial = serial();
    for name in ["../..", "../xlb", "a/b"] {
        let out = Command::new(xlb_bin())
            .args(["detach", "--instance", name])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{name:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("instance {name:?} is invalid")),
            "{name:?}: {err}"
        );
    }
}

const XD0_FORWARDING: &str = "/proc/sys/net/ipv4/conf/xd0/forwarding";

/// `XD0_FORWARDING` as the namespace sees it.
fn xd0_forwarding(e: &Env) -> String {
    let out = e.in_ns().args(["cat", XD0_FORWARDING]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// `xlb run` turns forwarding on for xd0 and says why; the value before is
/// kept in the state file across a restart (which finds it on and changes
/// nothing); `xlb detach` in the namespace puts it back.
#[test]
fn detach_restores_the_forwarding_xlb_run_turned_on() {
    let _serial = serial();
    let mut e = Env::new().unwrap();
    let set = e
        .in_ns()
        .args(["sh", "-c", &format!("echo 0 > {XD0_FORWARDING}")])
        .status()
        .unwrap();
    assert!(set.success());
    assert_eq!(xd0_forwarding(&e), "0");
    let recorded = |e: &Env| {
        lb_user::daemon::persist::Saved::load(&lb_user::daemon::persist::state_path(&e.instance))
            .unwrap()
            .unwrap()
            .forwarding
    };
    step(
        "xlb run turns it on, logs it and records the value before",
        || {
            crate::start_all_up(&mut e);
            assert_eq!(xd0_forwarding(&e), "1");
            let log = e.log(1).unwrap();
            assert!(
                log.contains(&format!("set {XD0_FORWARDING} = 1 (was 0)")),
                "{log}"
            );
            let r = recorded(&e);
            assert_eq!(r.len(), 1, "{r:?}");
            assert_eq!(
                (r[0].path.as_str(), r[0].previous.as_str()),
                (XD0_FORWARDING, "0")
            );
        },
    );
    step("kill -9 and start again: the record is kept", || {
        e.kill9().unwrap();
        std::fs::remove_file(&e.socket).ok();
        e.start().unwrap();
        assert_eq!(recorded(&e).len(), 1);
        assert!(!e.log(2).unwrap().contains("(was "), "nothing changed");
        e.kill9().unwrap();
    });
    step("xlb detach in the namespace puts 0 back", || {
        let out = e
            .in_ns()
            .arg(xlb_bin())
            .args(["detach", "--instance", &e.instance])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!("restored {XD0_FORWARDING} = 0")),
            "{text}"
        );
        assert_eq!(xd0_forwarding(&e), "0");
    });
}

/// Runs `xlb detach --instance` of an instance a test made besides its
/// environment's, however the test ends.
struct DetachOnDrop(String);

impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        let _ = Command::new(xlb_bin())
            .args(["detach", "--instance", &self.0])
            .output();
    }
}

/// A start that fails after turning forwarding on (here: native XDP on
/// `lo`, which has no driver support) puts the value back before it exits,
/// and leaves no record of it; nor has it written the hash key or the
/// encapsulation source.
#[test]
fn a_failed_start_puts_forwarding_back() {
    let _serial = serial();
    let e = Env::new().unwrap();
    let instance = format!("{}-lo", e.instance);
    let _detach = DetachOnDrop(instance.clone());
    let lo_forwarding = "/proc/sys/net/ipv4/conf/lo/forwarding";
    let read = || {
        let out = e.in_ns().args(["cat", lo_forwarding]).output().unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let set = e
        .in_ns()
        .args(["sh", "-c", &format!("echo 0 > {lo_forwarding}")])
        .status()
        .unwrap();
    assert!(set.success());
    let config = e.config.with_file_name("lo.toml");
    let text = std::fs::read_to_string(&e.config)
        .unwrap()
        .replace(
            "interface = \"xd0\"",
            "interface = \"lo\"\nxdp_mode = \"native\"",
        )
        .replace(&format!("\"{}\"", e.instance), &format!("\"{instance}\""))
        .replace(
            &e.socket.display().to_string(),
            &e.socket.with_file_name("lo.sock").display().to_string(),
        );
    std::fs::write(&config, text).unwrap();
    step("the start fails at attaching XDP", || {
        let (ok, err) = run_expecting_exit(&e, &config);
        assert!(!ok, "native XDP on lo must fail");
        assert!(err.contains("attaching XDP to lo"), "{err}");
        assert!(
            err.contains(&format!("set {lo_forwarding} = 1 (was 0)")),
            "{err}"
        );
        assert!(
            err.contains(&format!("restored {lo_forwarding} = 0")),
            "{err}"
        );
    });
    step(
        "the hash key and encapsulation source were never written",
        || {
            // The start failed after building its model: the pinned globals
            // are as it found them (a first start: no key, no source; lo's
            // 127.0.0.1 would be the source had they been written).
            let pins = std::path::Path::new(lb_user::daemon::persist::PIN_ROOT).join(&instance);
            let data = aya::maps::MapData::from_pin(pins.join(lb_common::MAP_GLOBALS)).unwrap();
            let globals: aya::maps::Array<_, lb_common::Globals> =
                aya::maps::Array::try_from(aya::maps::Map::Array(data)).unwrap();
            let g = globals.get(&0, 0).unwrap();
            assert_eq!(g.hash_key, [0, 0], "{g:?}");
            assert_eq!(g.encap_src_v4, [0; 16], "{g:?}");
        },
    );
    step("forwarding is back at 0, and no record is left", || {
        assert_eq!(read(), "0");
        let saved =
            lb_user::daemon::persist::Saved::load(&lb_user::daemon::persist::state_path(&instance))
                .unwrap();
        assert!(saved.is_none_or(|s| s.forwarding.is_empty()));
    });
}

/// Backend ids of every VIP in the state file: (VIP, address) → id.
fn saved_ids(e: &Env) -> BTreeMap<(String, String), u32> {
    lb_user::daemon::persist::Saved::load(&lb_user::daemon::persist::state_path(&e.instance))
        .unwrap()
        .unwrap()
        .backends
        .iter()
        .map(|b| ((b.vip.clone(), b.addr.to_string()), b.id))
        .collect()
}

/// Files moved aside next to the state file (`<instance>.json.bad-*`).
fn set_aside(e: &Env) -> Vec<std::path::PathBuf> {
    let path = lb_user::daemon::persist::state_path(&e.instance);
    let prefix = format!("{}.json.bad-", e.instance);
    std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|d| d.unwrap().path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .collect()
}

/// The state file deleted, then made unreadable, each time with `kill -9`
/// and a start: the daemon adopts from the pinned maps by VIP key and
/// backend address. Both tables stay byte for byte, backend ids and
/// generations stay, backend 2 is down at once (as the data plane had
/// it), the others up, the established flow's conntrack entry is kept. The
/// unreadable file is moved aside with a warning instead of stopping the
/// start.
#[test]
fn restart_without_a_usable_state_file_adopts_from_the_pins() {
    let _serial = serial();
    let mut e = up();
    step("hang backend 2", || hang_backend_2(&e));
    let mut dp = e.maps().unwrap();
    let (flow, entry) = crate::insert_established_flow(&mut dp);
    let tables = |dp: &Dataplane| {
        (
            crate::table(dp, "10.100.0.1").unwrap(),
            crate::table(dp, WEB).unwrap(),
        )
    };
    let before = tables(&dp);
    let ids = saved_ids(&e);
    let generations: Vec<u32> = ids
        .values()
        .map(|id| dp.backend(*id).unwrap().generation)
        .collect();
    let link_id = e.link_id().unwrap();
    let state = lb_user::daemon::persist::state_path(&e.instance);
    let check = |e: &Env, n: u32| {
        let s = e.status().unwrap();
        assert_eq!(s["adopted"], true, "{s}");
        for vip in ["api", "web"] {
            assert_eq!(
                e.backend_state(vip, "10.0.0.12:80").unwrap(),
                "down",
                "{vip}"
            );
            for addr in ["10.0.0.11:80", "10.0.0.13:80"] {
                assert_eq!(e.backend_state(vip, addr).unwrap(), "up", "{vip} {addr}");
            }
        }
        assert_eq!(tables(&dp), before, "tables untouched");
        assert_eq!(saved_ids(e), ids, "ids kept");
        let now: Vec<u32> = ids
            .values()
            .map(|id| dp.backend(*id).unwrap().generation)
            .collect();
        assert_eq!(now, generations, "generations kept");
        assert_eq!(dp.ct_get(&flow).unwrap(), Some(entry), "conntrack kept");
        assert_eq!(e.link_id().unwrap(), link_id, "link adopted");
        let log = e.log(n).unwrap();
        assert!(
            log.contains(
                "no usable state file: adopted 2 VIPs and 6 backends from the pinned maps"
            ),
            "{log}"
        );
    };
    step("kill -9, delete the state file, start again", || {
        e.kill9().unwrap();
        std::fs::remove_file(&state).unwrap();
        std::fs::remove_file(&e.socket).ok();
        e.start().unwrap();
        check(&e, 2);
    });
    step("kill -9, an unreadable state file, start again", || {
        e.kill9().unwrap();
        std::fs::write(&state, b"{\"layout_version\": 4, \"vips\": {").unwrap();
        std::fs::remove_file(&e.socket).ok();
        e.start().unwrap();
        check(&e, 3);
        let aside = set_aside(&e);
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert_eq!(
            std::fs::read(&aside[0]).unwrap(),
            b"{\"layout_version\": 4, \"vips\": {",
            "kept as it was"
        );
        let log = e.log(3).unwrap();
        assert!(log.contains("STATE FILE UNREADABLE"), "{log}");
        assert!(log.contains(&aside[0].display().to_string()), "{log}");
    });
    for p in set_aside(&e) {
        std::fs::remove_file(p).unwrap();
    }
}

/// Entries of the map pinned at `pin`.
fn pinned_entries(pin: &std::path::Path) -> u32 {
    aya::maps::MapData::from_pin(pin)
        .and_then(|m| m.info())
        .unwrap()
        .max_entries()
}

/// An upgrade onto a binary that counts one more reason: the pinned
/// `XLB_STATS` (one entry a reason) is smaller than the new binary's. The
/// restart adopts every other map (flows kept) and renews that one alone.
/// The older binary's map is stood in for by a smaller one pinned in its
/// place while no daemon runs.
#[test]
fn a_counter_map_of_another_size_is_renewed_and_the_rest_adopted() {
    let _serial = serial();
    let mut e = up();
    let pin = e.pins().join(lb_common::MAP_STATS);
    let older = lb_common::STATS_LEN - 1;
    step("kill -9; a smaller XLB_STATS pinned in its place", || {
        e.kill9().unwrap();
        std::fs::remove_file(&pin).unwrap();
        let out = Command::new("bpftool")
            .args(["map", "create"])
            .arg(&pin)
            .args(["type", "percpu_array", "key", "4", "value", "8", "entries"])
            .arg(older.to_string())
            .args(["name", lb_common::MAP_STATS])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(pinned_entries(&pin), older);
    });
    step(
        "start again: the state adopted, the counters renewed and read",
        || {
            std::fs::remove_file(&e.socket).ok();
            e.start().unwrap();
            assert_eq!(e.status().unwrap()["adopted"], true);
            assert_eq!(pinned_entries(&pin), lb_common::STATS_LEN);
            assert_eq!(e.backend_state("web", "10.0.0.11:80").unwrap(), "up");
            let text = e.xlb(&["status"]).unwrap();
            assert!(text.contains("VIP web"), "{text}");
        },
    );
}
