//! `xlb check-upgrade` against real pins of a test instance: nothing
//! pinned, pins of this layout, of another layout, and a configuration
//! whose interface and socket_group the host does not have. No daemon
//! runs: the pins come from loading the maps as the daemon does.

use std::process::Output;

use lb_common::LAYOUT_VERSION;

use crate::env::{Env, xlb_bin};
use crate::step;

fn check_upgrade(e: &Env, config: &std::path::Path) -> (bool, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = e
        .in_ns()
        .arg(xlb_bin())
        .args(["check-upgrade", "--config"])
        .arg(config)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    println!("{text}");
    (status.success(), text)
}

#[test]
fn check_upgrade_tells_whether_a_restart_keeps_flows() {
    let _serial = xlb_tests::lab::serial();
    let e = Env::new().unwrap();
    step("nothing pinned: nothing to keep, ready", || {
        let (ok, text) = check_upgrade(&e, &e.config);
        assert!(ok, "{text}");
        assert!(
            text.contains(&format!("nothing pinned for instance {:?}", e.instance)),
            "{text}"
        );
        assert!(text.ends_with("ready to upgrade\n"), "{text}");
    });
    step("pins of this layout: a restart keeps every flow", || {
        std::fs::create_dir_all(e.pins()).unwrap();
        drop(e.maps().unwrap());
        let (ok, text) = check_upgrade(&e, &e.config);
        assert!(ok, "{text}");
        assert!(text.contains("a restart keeps every flow"), "{text}");
    });
    step("a missing interface and socket_group: not ready", || {
        let text = std::fs::read_to_string(&e.config).unwrap();
        let group = format!("xlbnone{}", std::process::id());
        let text = text
            .replace("interface = \"xd0\"", "interface = \"xlbnone0\"")
            .replace(
                "[daemon]\n",
                &format!("[daemon]\nsocket_group = \"{group}\"\n"),
            );
        let other = e.config.with_file_name("host.toml");
        std::fs::write(&other, text).unwrap();
        let (ok, text) = check_upgrade(&e, &other);
        assert!(!ok, "{text}");
        assert!(text.contains("a restart keeps every flow"), "{text}");
        assert!(
            text.contains("daemon.interface \"xlbnone0\" does not exist"),
            "{text}"
        );
        assert!(
            text.contains(&format!("daemon.socket_group \"{group}\" is not a group")),
            "{text}"
        );
        assert!(text.contains("not ready to upgrade"), "{text}");
    });
    step("pins of another layout: flows lost, exit 1", || {
        let mut dp = e.maps().unwrap();
        let mut g = dp.globals().unwrap();
        g.layout_version = LAYOUT_VERSION + 1;
        dp.set_globals(&g).unwrap();
        let (ok, text) = check_upgrade(&e, &e.config);
        // Back to ours, so the environment's detach finds what it expects.
        g.layout_version = LAYOUT_VERSION;
        dp.set_globals(&g).unwrap();
        assert!(!ok, "{text}");
        let want = format!(
            "flows lost: the pinned maps in {} have layout version {}, this binary has \
             {LAYOUT_VERSION}",
            e.pins().display(),
            LAYOUT_VERSION + 1
        );
        assert!(text.contains(&want), "{text}");
        assert!(
            text.contains(&format!("xlb detach --instance {}", e.instance)),
            "{text}"
        );
    });
}
