//! The daemon's logs and events as a log pipeline and a dashboard read
//! them: `--log-format json` (every line an object, a transition with its
//! fields), text logs without colour off a terminal, `GET /events?since=N`,
//! event numbers that go on across a kill -9 and a clean stop, and an
//! `xlb events --follow` that outlives a restart.

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;
use xlb_lab::backend::Fault;

use crate::env::{BACKENDS, Env, wait_for, xlb_bin};
use crate::{serial, step};

/// `xlb events --follow --json` running beside the test: its stdout lines
/// as they come; its stderr in a file. Killed on drop.
struct Follower {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: std::path::PathBuf,
}

impl Follower {
    fn spawn(e: &Env) -> Self {
        let stderr = e.config.with_file_name("follower.err");
        let mut child = std::process::Command::new(xlb_bin())
            .arg("--socket")
            .arg(&e.socket)
            .args(["events", "--follow", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&stderr).unwrap()))
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Follower {
            child,
            lines,
            stderr,
        }
    }

    /// The events printed so far (waiting up to `limit` for one that
    /// `until` accepts).
    fn events_until(&self, limit: Duration, until: impl Fn(&Value) -> bool) -> Vec<Value> {
        let t = Instant::now();
        let mut seen = Vec::new();
        while t.elapsed() < limit {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    let ev: Value =
                        serde_json::from_str(&line).unwrap_or_else(|err| panic!("{err}: {line:?}"));
                    let done = until(&ev);
                    seen.push(ev);
                    if done {
                        return seen;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let err = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        panic!(
            "the follower did not print the event within {limit:?}; saw {seen:?}; stderr: {err}"
        );
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn seqs(events: &Value) -> Vec<u64> {
    events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect()
}

fn wait_all_up(e: &Env) {
    wait_for(Duration::from_secs(10), "all backends up", || {
        Ok(BACKENDS.iter().all(|b| {
            let addr = format!("{b}:80");
            ["api", "web"]
                .iter()
                .all(|vip| e.backend_state(vip, &addr).ok().as_deref() == Some("up"))
        }))
    })
    .unwrap();
}

#[test]
fn logs_and_events_hold_across_restarts() {
    let _serial = serial();
    let mut e = Env::new().unwrap();
    step("start with --log-format json: every backend up", || {
        e.start_with(&["--log-format", "json"]).unwrap();
        wait_all_up(&e);
    });
    let follower = Follower::spawn(&e);
    step("hang backend 2: the JSON log has its transition", || {
        e.set_fault(BACKENDS[1], Fault::Hang).unwrap();
        wait_for(Duration::from_secs(5), "backend 2 down", || {
            Ok(e.backend_state("api", "10.0.0.12:80")? == "down")
        })
        .unwrap();
        json_log_has_the_transition(&e.log(1).unwrap());
    });
    step("GET /events?since=N is xlb events --since N", || {
        events_endpoint(&e);
    });
    let before = step("kill -9 and start (text logs): numbers go on", || {
        let before = *seqs(&e.events().unwrap()).last().unwrap();
        e.kill9().unwrap();
        std::fs::remove_file(&e.socket).ok();
        e.start().unwrap();
        let after = e
            .xlb(&["events", "--json", "--since", &before.to_string()])
            .unwrap();
        let after: Value = serde_json::from_str(&after).unwrap();
        let start = after
            .as_array()
            .unwrap()
            .iter()
            .find(|ev| ev["kind"] == "start")
            .expect("the new start event, above the last one before");
        println!(
            "last before the crash {before}, start after {}",
            start["seq"]
        );
        let all = seqs(&e.events().unwrap());
        assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");
        let log = e.log(2).unwrap();
        assert!(!log.contains("\x1b["), "no colour off a terminal: {log}");
        assert!(log.contains("event=\"start\""), "{log}");
        before
    });
    step("the follower reconnected and went on", || {
        let seen = follower.events_until(Duration::from_secs(20), |ev| {
            ev["kind"] == "start" && ev["seq"].as_u64().unwrap() > before
        });
        let got: Vec<u64> = seen.iter().map(|ev| ev["seq"].as_u64().unwrap()).collect();
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "no event twice: {got:?}"
        );
        let err = std::fs::read_to_string(&follower.stderr).unwrap();
        assert!(
            err.contains("xlb: daemon restarted, reconnected; going on after event"),
            "{err}"
        );
    });
    step("a clean stop: the next start takes the next number", || {
        clean_stop_goes_on(&mut e);
    });
}

/// Every line of the log is a JSON object, and backend 2's move to `down`
/// is one with the documented fields.
fn json_log_has_the_transition(log: &str) {
    let lines: Vec<Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|err| panic!("{err}: {l:?}")))
        .collect();
    assert!(lines.iter().all(Value::is_object), "{log}");
    let down = lines
        .iter()
        .find(|l| {
            l["event"] == "transition"
                && l["vip"] == "api"
                && l["backend"] == "10.0.0.12:80"
                && l["to"] == "down"
        })
        .unwrap_or_else(|| panic!("a transition of api's backend 2 to down: {log}"));
    assert!(down["from"].is_string(), "{down}");
    assert!(
        down["reason"]
            .as_str()
            .unwrap()
            .starts_with("connected, no HTTP response"),
        "{down}"
    );
    for field in ["timestamp", "level", "message", "target"] {
        assert!(down[field].is_string(), "{field}: {down}");
    }
    let start = lines.iter().find(|l| l["event"] == "start").expect("start");
    assert!(start["link_id"].is_u64(), "{start}");
}

fn events_endpoint(e: &Env) {
    let all = e.events().unwrap();
    let n = seqs(&all)[0];
    let cli: Value = serde_json::from_str(
        &e.xlb(&["events", "--json", "--since", &n.to_string()])
            .unwrap(),
    )
    .unwrap();
    let (status, body) = e.http_get(&format!("/events?since={n}")).unwrap();
    assert_eq!(status, 200, "{body}");
    let http: Value = serde_json::from_str(&body).unwrap();
    let (cli, http) = (cli.as_array().unwrap(), http.as_array().unwrap());
    assert!(!cli.is_empty());
    // Events recorded between the two reads come after.
    assert_eq!(&http[..cli.len()], &cli[..], "the same events");
    assert!(http.iter().all(|ev| ev["seq"].as_u64().unwrap() > n));
    let (status, body) = e.http_get("/events?since=last").unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(
        body.starts_with("since=\"last\" is not an event number"),
        "{body}"
    );
}

/// SIGTERM saves the exact next number: the next start's event is that
/// one, without the gap a crash leaves.
fn clean_stop_goes_on(e: &mut Env) {
    let before = *seqs(&e.events().unwrap()).last().unwrap();
    e.stop().unwrap();
    let saved =
        lb_user::daemon::persist::Saved::load(&lb_user::daemon::persist::state_path(&e.instance))
            .unwrap()
            .unwrap();
    let next = saved.next_event_seq;
    assert!(
        next > before && next < before + 10,
        "saved {next} after {before}: no reserved block left over"
    );
    e.start().unwrap();
    let events = e.events().unwrap();
    let start = events
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|ev| ev["kind"] == "start")
        .unwrap();
    assert_eq!(start["seq"].as_u64(), Some(next), "{start}");
}
