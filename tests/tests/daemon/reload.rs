//! Reloads of a large VIP: 2,100 backends replaced by 2,100 others in one
//! reload, and again by a restart with an edited file (old and new ids side
//! by side until the new table is live), and a reload that fails while
//! writing the table, which must leave the status, the tables and the
//! probes exactly as they were.

use std::{
    collections::BTreeSet,
    net::TcpListener,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, ensure};
use lb_user::dataplane::{Dataplane, LoadOptions};
use serde_json::{Value, json};
use xlb_tests::lab::serial;

use crate::env::{Env, config_text, wait_for};
use crate::step;

/// Backends of VIP "big".
const BIG: usize = 2100;
/// VIP "big"'s address; its backends are addresses of 10.1.0.0/16, all
/// local to the namespace (`ip route add local`), on port 8080.
const BIG_VIP: &str = "10.100.0.3";
/// Ring stride of this test's daemon: room for a table of 21,011 slots
/// (10 × 2,100 backends, prime).
const STRIDE: u32 = 21_011;

/// The `n`th address of 10.1.0.0/16 from `first` on (skipping .0 and .255).
fn big_addr(first: usize, n: usize) -> String {
    let i = first + n;
    format!("10.1.{}.{}", i / 250, 1 + i % 250)
}

/// The environment's configuration with a stride of [`STRIDE`] and VIP
/// "big" whose backends are the [`BIG`] addresses from `first` on, probed
/// by TCP connect every second.
fn config_with_big(e: &Env, first: usize) -> String {
    config_with_big_and_web(e, first, 1)
}

/// [`config_with_big`], with VIP web's backends of weight `web_weight`
/// (web comes before big in the file).
fn config_with_big_and_web(e: &Env, first: usize, web_weight: u32) -> String {
    let mut s = config_text(e, web_weight, 251).replace(
        "max_table_size = 251",
        &format!("max_table_size = {STRIDE}"),
    );
    s += &format!(
        "\n[[vip]]\nname = \"big\"\naddress = \"{BIG_VIP}\"\nport = 8080\n\
         table_size = {STRIDE}\n\
         [vip.health_check]\nkind = \"tcp\"\ninterval = \"1s\"\nfast_interval = \"1s\"\n\
         down_interval = \"1s\"\ntimeout = \"500ms\"\nrise = 1\n"
    );
    for n in 0..BIG {
        s += &format!(
            "[[vip.backend]]\naddress = \"{}\"\nport = 8080\n",
            big_addr(first, n)
        );
    }
    s
}

/// A TCP listener on 0.0.0.0:8080 in the namespace that accepts and closes
/// every connection: the probes of every address of 10.1.0.0/16 pass.
struct Acceptor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Acceptor {
    fn start(e: &Env) -> anyhow::Result<Self> {
        e.ns.ip(&["route", "add", "local", "10.1.0.0/16", "dev", "lo"])?;
        let listener =
            xlb_lab::topology::in_netns(e.ns.name(), || TcpListener::bind("0.0.0.0:8080"))??;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok(_) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The pinned maps of this test's daemon.
fn maps(e: &Env) -> Dataplane {
    Dataplane::load(&LoadOptions {
        ct_size: 4096,
        nat_size: lb_common::nat::DEFAULT_NAT_SIZE,
        ring_stride: STRIDE,
        pin_dir: Some(e.pins()),
        kernel: None,
    })
    .unwrap()
}

/// A VIP's address, live half, table size and both ring halves.
type Table = (String, u32, u32, Vec<u32>, Vec<u32>);

/// Each VIP's entry and both ring halves, as the data plane reads them.
fn tables(dp: &Dataplane) -> Vec<Table> {
    [("10.100.0.1", 80), ("10.100.0.2", 80), (BIG_VIP, 8080)]
        .iter()
        .map(|(addr, port)| {
            let key = lb_common::VipKey::new(addr.parse().unwrap(), *port, lb_common::PROTO_TCP);
            let info = dp.vip(&key).unwrap().unwrap();
            (
                (*addr).to_string(),
                info.active,
                info.table_size,
                dp.ring_half(info.vip_id, 0, info.table_size).unwrap(),
                dp.ring_half(info.vip_id, 1, info.table_size).unwrap(),
            )
        })
        .collect()
}

/// What an operator reads in `xlb status --json` of each VIP and backend,
/// without the counters and probe times that move on their own.
fn status_view(s: &Value) -> Value {
    let vips = s["vips"].as_array().unwrap().iter().map(|v| {
        let backends: Vec<Value> = v["backends"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                json!([
                    b["address"],
                    b["weight"],
                    b["state"],
                    b["health"],
                    b["in_table"],
                    b["since_unix_ms"],
                    b["placement"],
                    b["admin_drained"]
                ])
            })
            .collect();
        json!([
            v["name"],
            v["address"],
            v["port"],
            v["table_size"],
            v["backends_up"],
            v["backends_total"],
            backends
        ])
    });
    Value::Array(vips.collect())
}

/// The backends of VIP "big" in `status`.
fn big_backends(s: &Value) -> Vec<Value> {
    s["vips"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "big")
        .map(|v| v["backends"].as_array().unwrap().clone())
        .unwrap_or_default()
}

/// Waits until every backend of "big" is up, and they are the [`BIG`]
/// addresses from `first` on.
fn wait_big_up(e: &Env, first: usize) {
    let want: BTreeSet<String> = (0..BIG)
        .map(|n| format!("{}:8080", big_addr(first, n)))
        .collect();
    wait_for(Duration::from_secs(30), "every backend of big up", || {
        let s = e.status()?;
        let b = big_backends(&s);
        let up: BTreeSet<String> = b
            .iter()
            .filter(|b| b["state"] == "up")
            .map(|b| b["address"].as_str().unwrap().to_string())
            .collect();
        Ok(b.len() == BIG && up == want)
    })
    .unwrap();
}

/// Backend ids of VIP "big" in the state file.
fn big_ids(e: &Env) -> BTreeSet<u32> {
    let saved =
        lb_user::daemon::persist::Saved::load(&lb_user::daemon::persist::state_path(&e.instance))
            .unwrap()
            .unwrap();
    saved
        .backends
        .iter()
        .filter(|b| b.vip == "big")
        .map(|b| b.id)
        .collect()
}

/// Makes the pinned map at `pin` read-only for every syscall from now on
/// (`BPF_MAP_FREEZE`, Linux 5.2): a later write from the daemon fails with
/// EPERM, as a table write that fails in the kernel would.
fn freeze(pin: &Path) -> anyhow::Result<()> {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    const BPF_MAP_FREEZE: libc::c_long = 22;
    let map = aya::maps::MapData::from_pin(pin).context("opening the pinned ring")?;
    // `union bpf_attr` for BPF_MAP_FREEZE: the map's descriptor, then zeros.
    let mut attr = [0u32; 32];
    attr[0] = map.fd().as_fd().as_raw_fd() as u32;
    // SAFETY: bpf(2) reads `size_of_val(&attr)` bytes from `attr`, which
    // outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_FREEZE,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    ensure!(
        r == 0,
        "BPF_MAP_FREEZE: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// 2,100 backends replaced by 2,100 others in one reload: it succeeds, the
/// new ones come up and fill the table, the old ids are retired; the same
/// by a restart with an edited file. Then a reload changing web (live at
/// once) and big, whose table write fails (the ring frozen), is refused
/// and leaves the status, every table and the probes as they were: web is
/// put back too.
#[test]
fn a_large_vip_replaced_whole_and_a_failed_reload_changes_nothing() {
    let _serial = serial();
    let mut e = Env::new().unwrap();
    let _acceptor = Acceptor::start(&e).unwrap();
    std::fs::write(&e.config, config_with_big(&e, 0)).unwrap();
    step("start with 2,100 backends in big, all up", || {
        e.start().unwrap();
        wait_big_up(&e, 0);
    });
    let old_ids = big_ids(&e);
    step("reload replacing all 2,100 with 2,100 others", || {
        std::fs::write(&e.config, config_with_big(&e, BIG)).unwrap();
        let out = e.xlb(&["reload"]).unwrap();
        assert!(out.contains("1 changed"), "{out}");
        wait_big_up(&e, BIG);
    });
    step(
        "the table holds the new ids only; the old ones are retired",
        || {
            let dp = maps(&e);
            let new_ids = big_ids(&e);
            assert_eq!(new_ids.len(), BIG);
            assert!(
                new_ids.is_disjoint(&old_ids),
                "old and new ids side by side"
            );
            let t = tables(&dp);
            let (_, active, _, h0, h1) = &t[2];
            let live: BTreeSet<u32> = if *active == 0 { h0 } else { h1 }.iter().copied().collect();
            assert_eq!(live, new_ids);
            for id in old_ids.iter().filter(|id| !new_ids.contains(id)) {
                assert_eq!(dp.backend(*id).unwrap().state, 0, "old id {id} retired");
            }
        },
    );
    step(
        "kill -9, all 2,100 replaced in the file, start again",
        || {
            e.kill9().unwrap();
            std::fs::write(&e.config, config_with_big(&e, 2 * BIG)).unwrap();
            std::fs::remove_file(&e.socket).ok();
            e.start().unwrap();
            assert_eq!(e.status().unwrap()["adopted"], true);
            wait_big_up(&e, 2 * BIG);
        },
    );
    step("a reload whose table write fails changes nothing", || {
        let dp = maps(&e);
        let status_before = status_view(&e.status().unwrap());
        let tables_before = tables(&dp);
        let ids_before = big_ids(&e);
        let probed_before: Vec<u64> = big_backends(&e.status().unwrap())
            .iter()
            .map(|b| b["last_probe"]["at_unix_ms"].as_u64().unwrap())
            .collect();
        freeze(&e.pins().join(lb_common::MAP_RING)).unwrap();
        // Web changes too, before big in the file, and goes live (its
        // doubled weights give the same table: no ring write); big's
        // failure must put it back.
        std::fs::write(&e.config, config_with_big_and_web(&e, 3 * BIG, 2)).unwrap();
        let err = e.xlb(&["reload"]).unwrap_err().to_string();
        assert_eq!(status_view(&e.status().unwrap()), status_before, "status");
        assert_eq!(tables(&dp), tables_before, "tables");
        assert_eq!(big_ids(&e), ids_before, "ids in the state file");
        assert!(
            err.contains("vip \"big\": change not applied; it keeps its previous backends"),
            "{err}"
        );
        // The staged ids were given back: none of the would-be backends
        // holds an entry.
        let used: usize = (1..lb_common::BACKEND_IDS)
            .filter(|id| dp.backend(*id).unwrap().state != 0)
            .count();
        assert_eq!(used, BIG + 6, "ids in use: big's and api's and web's");
        // Every backend is still probed: each has a newer probe.
        wait_for(Duration::from_secs(5), "every backend probed again", || {
            let now: Vec<u64> = big_backends(&e.status()?)
                .iter()
                .map(|b| b["last_probe"]["at_unix_ms"].as_u64().unwrap_or(0))
                .collect();
            Ok(now.len() == probed_before.len()
                && now.iter().zip(&probed_before).all(|(n, b)| n > b))
        })
        .unwrap();
    });
}

/// The `reload` events, oldest first: (to, reason).
fn reload_events(e: &Env) -> Vec<(String, String)> {
    e.events()
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .filter(|ev| ev["kind"] == "reload")
        .map(|ev| {
            (
                ev["to"].as_str().unwrap_or_default().to_string(),
                ev["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Every reload's outcome, asked over the socket or by SIGHUP, reaches the
/// daemon's log and the event log: applied, applied with a note that only
/// the CLI saw before, and rejected with the error.
#[test]
fn every_reload_outcome_is_logged_and_recorded() {
    let _serial = serial();
    let e = crate::up();
    let original = std::fs::read_to_string(&e.config).unwrap();
    step("xlb reload, applied: a log line and an event", || {
        std::fs::write(&e.config, config_text(&e, 2, 251)).unwrap();
        e.xlb(&["reload"]).unwrap();
        let events = reload_events(&e);
        let (to, reason) = events.last().unwrap();
        assert_eq!(to, "applied", "{events:?}");
        assert!(
            reason.starts_with("xlb reload: reloaded: 0 VIPs added, 1 changed"),
            "{reason}"
        );
        let log = e.log(1).unwrap();
        assert!(
            log.contains("reload applied: reloaded: 0 VIPs added, 1 changed"),
            "{log}"
        );
    });
    step(
        "xlb reload with a restart-only change: the note is recorded",
        || {
            let text = original.replace("127.0.0.1:9813", "127.0.0.1:9814");
            assert_ne!(text, original);
            std::fs::write(&e.config, text).unwrap();
            let out = e.xlb(&["reload"]).unwrap();
            let note = "daemon.metrics_address changed: takes effect at the next restart";
            assert!(out.contains(note), "{out}");
            let events = reload_events(&e);
            let (to, reason) = events.last().unwrap();
            assert_eq!(to, "applied", "{events:?}");
            assert!(reason.contains(note), "{reason}");
            let log = e.log(1).unwrap();
            assert!(
                log.lines()
                    .any(|l| l.contains("reload applied, with notes") && l.contains(note)),
                "{log}"
            );
        },
    );
    step(
        "web renamed www: added on web's key, web removed after",
        || {
            let dp = e.maps().unwrap();
            let key = crate::vip_key("10.100.0.2");
            let web_id = dp.vip(&key).unwrap().unwrap().vip_id;
            let text = original.replace("name = \"web\"", "name = \"www\"");
            std::fs::write(&e.config, text).unwrap();
            let out = e.xlb(&["reload"]).unwrap();
            assert!(out.contains("1 VIPs added, 0 changed, 1 removed"), "{out}");
            let www = dp.vip(&key).unwrap().expect("www holds web's key");
            assert_ne!(www.vip_id, web_id, "a new VIP id for www");
            assert_eq!(dp.vip_info(web_id).unwrap().mode, 0, "web's id cleared");
            // Its backends are new: out of its table until probed up.
            wait_for(Duration::from_secs(5), "www's backends up", || {
                Ok(["10.0.0.11:80", "10.0.0.12:80", "10.0.0.13:80"]
                    .iter()
                    .all(|b| e.backend_state("www", b).is_ok_and(|s| s == "up")))
            })
            .unwrap();
            let info = dp.vip(&key).unwrap().expect("www holds web's key");
            let live: BTreeSet<u32> = dp
                .ring_half(info.vip_id, info.active, info.table_size)
                .unwrap()
                .into_iter()
                .collect();
            assert_eq!(live.len(), 3, "www's three backends in its table: {live:?}");
            std::fs::write(&e.config, &original).unwrap();
            e.xlb(&["reload"]).unwrap();
        },
    );
    step(
        "xlb reload of an invalid file: rejected, with the error",
        || {
            std::fs::write(&e.config, "[daemon]\ninterface = 7\n").unwrap();
            let err = e.xlb(&["reload"]).unwrap_err().to_string();
            let events = reload_events(&e);
            let (to, reason) = events.last().unwrap();
            assert_eq!(to, "rejected", "{events:?}");
            assert!(reason.starts_with("xlb reload: "), "{reason}");
            assert!(reason.contains("xlb.toml"), "names the file: {reason}");
            assert!(
                reason.contains("configuration rejected: still running the previous one"),
                "{reason}"
            );
            assert!(!reason.contains('\n'), "one line: {reason}");
            assert!(err.contains("xlb.toml"), "{err}");
            let log = e.log(1).unwrap();
            assert!(
                log.lines()
                    .any(|l| l.contains("reload rejected") && l.contains("xlb.toml")),
                "{log}"
            );
        },
    );
    step(
        "SIGHUP with an invalid file: rejected, in the events too",
        || {
            let before = reload_events(&e).len();
            let pid = e.daemon_pid().unwrap();
            let killed = std::process::Command::new("kill")
                .args(["-HUP", &pid.to_string()])
                .status()
                .unwrap();
            assert!(killed.success());
            wait_for(Duration::from_secs(5), "a reload event", || {
                Ok(reload_events(&e).len() > before)
            })
            .unwrap();
            let events = reload_events(&e);
            let (to, reason) = events.last().unwrap();
            assert_eq!(to, "rejected", "{events:?}");
            assert!(reason.starts_with("SIGHUP: "), "{reason}");
            std::fs::write(&e.config, &original).unwrap();
        },
    );
}
