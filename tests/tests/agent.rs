//! End to end, issue 25: the agent check (`agent_port`, HAProxy's
//! agent-check protocol). The real `xlb` in the namespaced lab; each
//! backend's "application" runs a tiny agent in its own namespace (a
//! `python3` line server, not code under test) that answers whatever its
//! file holds, which the test rewrites. Outcomes are read from xlb's
//! status and events and from requests through the VIP.
//!
//! Same rules as `e2e.rs`: its own lab (prefix `agt…`, instance, socket)
//! through `LabRun`, whose Drop stops every process (the agents included:
//! `spawn_in`) and removes the namespaces however the test ends; a passing
//! test checks that nothing is left; one lab at a time; every wait bounded.
//!
//! Needs root and the binaries: `cargo build -p lb-user -p xlb-lab`, then
//! `cargo test -p xlb-tests --test agent -- --test-threads 1 --nocapture`.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use xlb_lab::{
    scenario::{BackendStatus, LabRun, RunOptions, Status, XlbConfig},
    topology::{VIP_V4, in_netns},
};
use xlb_tests::lab::{serial, teardown, xlb_binary};

const AGENT_PORT: u16 = 5555;
const WAIT: Duration = Duration::from_secs(15);

/// The agent: answers each connection with the bytes of the file in
/// argv[1], then closes. Bound before the test writes any answer.
const AGENT_PY: &str = r#"
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[2])))
s.listen(16)
while True:
    c, _ = s.accept()
    try:
        with open(sys.argv[1], "rb") as f:
            c.sendall(f.read())
    except OSError:
        pass
    c.close()
"#;

fn prefix() -> String {
    format!("agt{}", std::process::id() % 1000)
}

fn vip() -> SocketAddr {
    SocketAddr::new(VIP_V4.into(), 80)
}

/// The lab's default check (500 ms, rise 2, fall 2) with an agent polled
/// every 200 ms.
fn config_text(prefix: &str) -> String {
    let text = XlbConfig::for_prefix(prefix).render();
    let at = text
        .find("[health_check]\n")
        .expect("a [health_check] table")
        + 15;
    let mut text = text;
    text.insert_str(
        at,
        &format!(
            "agent_port = {AGENT_PORT}\nagent_interval = \"200ms\"\nagent_timeout = \"150ms\"\n"
        ),
    );
    text
}

/// Backend `i`'s (1-based) agent file.
fn answer_file(run: &LabRun, i: usize) -> PathBuf {
    run.work_dir().join(format!("agent-b{i}.txt"))
}

/// Makes backend `i`'s agent answer `line` from now on (written whole,
/// then renamed, so the agent never reads half of it).
fn say(run: &LabRun, i: usize, line: &[u8]) {
    let file = answer_file(run, i);
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, line).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
}

fn backend(s: &Status, i: usize) -> &BackendStatus {
    &s.vips[0].backends[i - 1]
}

fn wait(run: &LabRun, what: &str, done: impl FnMut(&Status) -> bool) -> Status {
    run.wait_until(what, WAIT, done)
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .0
}

/// `n` fresh connections to the VIP from the client namespace, `GET /api`
/// on each: how many each backend answered ("b1"…), and failures.
fn ask(run: &LabRun, n: usize) -> BTreeMap<String, usize> {
    let ns = run.lab().ns_client();
    in_netns(&ns, || {
        let mut seen = BTreeMap::new();
        for _ in 0..n {
            let name = get_api().unwrap_or_else(|e| format!("error: {e}"));
            *seen.entry(name).or_insert(0) += 1;
        }
        seen
    })
    .unwrap()
}

fn get_api() -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&vip(), Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(b"GET /api HTTP/1.1\r\nHost: vip\r\nConnection: close\r\n\r\n")?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let body = resp.split("\r\n\r\n").nth(1).unwrap_or_default();
    Ok(body.trim().to_owned())
}

/// A `/stream` connection through the VIP: one line `<name> <seq>` every
/// 100 ms for as long as it lasts.
fn open_stream(run: &LabRun) -> BufReader<TcpStream> {
    let ns = run.lab().ns_client();
    let stream = in_netns(&ns, || -> std::io::Result<TcpStream> {
        let mut s = TcpStream::connect_timeout(&vip(), Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"GET /stream?interval_ms=100 HTTP/1.1\r\nHost: vip\r\n\r\n")?;
        Ok(s)
    })
    .unwrap()
    .unwrap();
    let mut reader = BufReader::new(stream);
    // The response head, up to the empty line.
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).expect("the stream's head");
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    reader
}

/// The next line of a stream: (backend name, sequence number).
fn next_line(reader: &mut BufReader<TcpStream>) -> (String, u64) {
    let mut line = String::new();
    reader.read_line(&mut line).expect("a stream line");
    let (name, seq) = line.trim().split_once(' ').expect("`<name> <seq>`");
    (name.to_owned(), seq.parse().expect("a sequence number"))
}

fn start_agents(run: &mut LabRun) {
    let script = run.work_dir().join("agent.py");
    std::fs::write(&script, AGENT_PY).unwrap();
    for i in 1..=3 {
        say(run, i, b"up\n");
        let ns = run.lab().ns_backend(i);
        let args = vec![
            script.display().to_string(),
            answer_file(run, i).display().to_string(),
            AGENT_PORT.to_string(),
        ];
        run.spawn_in(&format!("agent-b{i}"), &ns, Path::new("python3"), &args)
            .unwrap();
    }
}

#[test]
fn agent_drains_weighs_panics_and_escapes() {
    let _serial = serial();
    let prefix = prefix();
    let mut run = LabRun::up_with(RunOptions::new(
        &prefix,
        &xlb_binary(),
        &config_text(&prefix),
    ))
    .unwrap_or_else(|e| panic!("lab up: {e}"));
    run.wait_all_up(WAIT).unwrap();

    // No agent yet: shown, and nothing changes (the main probe decides).
    let s = wait(&run, "agent refused", |s| {
        backend(s, 1)
            .agent
            .as_ref()
            .is_some_and(|a| a.error_code.as_deref() == Some("agent_refused"))
    });
    assert_eq!(backend(&s, 1).placement, "serving");
    let text = run.status_text().unwrap();
    assert!(
        text.contains("agent: unreachable (connection refused)"),
        "{text}"
    );

    start_agents(&mut run);
    wait(&run, "every agent says up", |s| {
        (1..=3).all(|i| {
            let b = backend(s, i);
            b.placement == "serving"
                && b.agent
                    .as_ref()
                    .is_some_and(|a| a.error.is_none() && a.word.as_deref() == Some("up"))
        })
    });

    drain_keeps_open_flows(&run);
    weight_halves_the_share(&run);
    down_everywhere_panics(&run);
    hostile_words_are_escaped(&run);

    teardown(run);
}

/// `drain`: no new flows to the backend, its open connection goes on.
fn drain_keeps_open_flows(run: &LabRun) {
    let mut stream = open_stream(run);
    let (name, first) = next_line(&mut stream);
    let i: usize = name.trim_start_matches('b').parse().unwrap();
    say(run, i, b"drain #deploy\n");
    let s = wait(run, "agent drain", |s| {
        backend(s, i).placement == "agent_drain"
    });
    let b = backend(&s, i);
    assert_eq!(b.state, "draining");
    assert_eq!(
        b.placement_reason.as_deref(),
        Some("agent says \"drain\" (deploy)")
    );
    // The open connection still gets its lines, from the same backend.
    let mut last = first;
    for _ in 0..10 {
        let (n, seq) = next_line(&mut stream);
        assert_eq!(n, name, "the stream moved");
        assert!(seq > last);
        last = seq;
    }
    let seen = ask(run, 60);
    assert_eq!(
        seen.get(&name),
        None,
        "new flows to a drained backend: {seen:?}"
    );
    assert_eq!(seen.values().sum::<usize>(), 60);
    assert!(seen.keys().all(|k| !k.starts_with("error")), "{seen:?}");
    let events = run.events().unwrap();
    let addr = b.address.clone();
    assert!(
        events.iter().any(|e| e.kind == "agent"
            && e.backend.as_deref() == Some(addr.as_str())
            && e.to.as_deref() == Some("drain")
            && e.reason.contains("drain #deploy")),
        "{events:#?}"
    );
    drop(stream);
    say(run, i, b"ready\n");
    wait(run, "agent ready", |s| backend(s, i).placement == "serving");
}

/// `50%`: the backend's weight, and its share of new flows, halve.
fn weight_halves_the_share(run: &LabRun) {
    say(run, 1, b"up 50%\n");
    let s = wait(run, "weight 50%", |s| {
        backend(s, 1)
            .agent
            .as_ref()
            .is_some_and(|a| a.weight_percent == 50)
            && (backend(s, 1).effective_weight - 0.5).abs() < 1e-9
    });
    assert!(backend(&s, 1).in_table);
    // Weights 0.5 : 1 : 1, so b1 holds 20 % of the table (a third before).
    let seen = ask(run, 400);
    let share = |k: &str| *seen.get(k).unwrap_or(&0) as f64 / 400.0;
    eprintln!("shares at 50%: {seen:?}");
    assert!((0.12..0.28).contains(&share("b1")), "{seen:?}");
    assert!(share("b2") > 0.3 && share("b3") > 0.3, "{seen:?}");
    say(run, 1, b"up 100%\n");
    wait(run, "weight 100%", |s| {
        (backend(s, 1).effective_weight - 1.0).abs() < 1e-9
    });
}

/// `down` on all three: panic keeps the VIP serving; `up` brings them back.
fn down_everywhere_panics(run: &LabRun) {
    for i in 1..=3 {
        say(run, i, b"down #rollout\n");
    }
    let s = wait(run, "panic over agent down", |s| {
        let placements: Vec<&str> = s.vips[0]
            .backends
            .iter()
            .map(|b| b.placement.as_str())
            .collect();
        s.vips[0].panic
            && placements.iter().filter(|p| **p == "agent_down").count() == 2
            && placements.contains(&"panic_restored")
    });
    assert!(s.vips[0].panic_reason.is_some());
    let seen = ask(run, 30);
    assert_eq!(seen.len(), 1, "one backend kept: {seen:?}");
    assert!(seen.keys().all(|k| k.starts_with('b')), "{seen:?}");
    for i in 1..=3 {
        say(run, i, b"up\n");
    }
    wait(run, "all back", |s| {
        !s.vips[0].panic && s.vips[0].backends.iter().all(|b| b.placement == "serving")
    });
    let seen = ask(run, 60);
    assert_eq!(seen.len(), 3, "every backend answers again: {seen:?}");
}

/// Control characters and bytes that are not UTF-8 never reach status raw.
fn hostile_words_are_escaped(run: &LabRun) {
    let started = Instant::now();
    say(run, 2, b"up \x1b[31m\x07 #\x1b]0;pwned\x07 \xff end\n");
    let s = wait(run, "hostile line shown", |s| {
        backend(s, 2)
            .agent
            .as_ref()
            .is_some_and(|a| a.line.as_deref().is_some_and(|l| l.contains("pwned")))
    });
    let a = backend(&s, 2).agent.clone().unwrap();
    assert_eq!(a.text.as_deref(), Some("\\u{1b}]0;pwned\\u{7} \\xff end"));
    assert_eq!(a.ignored, ["\\u{1b}[31m\\u{7}"]);
    assert_eq!(
        backend(&s, 2).placement,
        "serving",
        "an up with noise is up"
    );
    let json = run.ctl(&["status", "--json"]).unwrap();
    let text = run.status_text().unwrap();
    let events = run.ctl(&["events", "--json"]).unwrap();
    for out in [&json, &text, &events] {
        assert!(
            !out.contains('\x1b') && !out.contains('\x07'),
            "raw control bytes: {out}"
        );
    }
    assert!(events.contains("pwned"), "the agent event shows the words");
    eprintln!("hostile line handled in {:?}", started.elapsed());
}
