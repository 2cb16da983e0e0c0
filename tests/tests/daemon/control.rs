//! The control socket as a client other than the CLI meets it: requests
//! written by hand, straight to the daemon's socket, out of the CLI's bounds
//! are refused by the daemon; a request whose client left before it was
//! answered is not applied; `events --follow` streams cannot take the
//! connections `reload` and `drain` need.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::net::UnixStream,
    process::Command,
    time::Duration,
};

use lb_user::ctl::{MAX_CONNECTIONS, MAX_FOLLOWERS, Response, parse_response};

use crate::{env::Env, serial, start_all_up, step};

/// Sends `line` on a new connection and returns the daemon's answer.
fn ask(e: &Env, line: &str) -> Response {
    let mut c = UnixStream::connect(&e.socket).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut answer = String::new();
    BufReader::new(c).read_line(&mut answer).unwrap();
    parse_response(answer.as_bytes()).unwrap()
}

fn signal(e: &Env, sig: &str) {
    let pid = e.daemon_pid().unwrap().to_string();
    let ok = Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

#[test]
fn control_requests_are_checked_by_the_daemon() {
    let _serial = serial();
    let mut e = Env::new().unwrap();
    step("start: every backend up", || start_all_up(&mut e));
    step("requests out of bounds are refused", || refusals(&e));
    step("a drain whose client left is not applied", || {
        withdrawn(&e);
    });
    step("followers leave room for reload and drain", || {
        followers(&e);
    });
}

fn refusals(e: &Env) {
    let block = |fields: &str| {
        format!(r#"{{"version":2,"command":"block","list":"deny","prefix":"192.0.2.7",{fields}}}"#)
    };
    let long = "x".repeat(201);
    // (name, line, start of the error)
    let cases = [
        (
            "ttl 0",
            block(r#""ttl_ms":0"#),
            "ttl_ms: a TTL of 0 ms is out of range; use 1s to 30d",
        ),
        (
            "ttl u64::MAX",
            block(r#""ttl_ms":18446744073709551615"#),
            "ttl_ms: a TTL of 18446744073709551615 ms is out of range",
        ),
        (
            "reason with a newline",
            block(r#""reason":"x\nFORGED log line""#),
            "the reason has control characters",
        ),
        (
            "reason of 201 characters",
            block(&format!(r#""reason":"{long}""#)),
            "the reason is 201 characters long; use at most 200",
        ),
        (
            "vip with a newline",
            r#"{"version":2,"command":"drain","vip":"api\nFORGED","backend":"10.0.0.11:80"}"#
                .to_owned(),
            r"vip api\nFORGED has control characters",
        ),
        (
            "a /0 without force (the CLI checks it too: a hand-written line must not pass)",
            r#"{"version":2,"command":"block","list":"deny","prefix":"0.0.0.0/0"}"#.to_owned(),
            "0.0.0.0/0 is every IPv4 address: this refuses every IPv4 client of every VIP; \
             add --force",
        ),
        (
            "a drain of a backend that is not an address",
            r#"{"version":2,"command":"drain","vip":"api","backend":"notanip"}"#.to_owned(),
            "backend \"notanip\" is not an address",
        ),
    ];
    for (name, line, want) in cases {
        match ask(e, &line) {
            Response::Error { message } => assert!(message.starts_with(want), "{name}: {message}"),
            other => panic!("{name}: accepted: {other:?}"),
        }
    }
    let blocks = e.xlb(&["blocks", "--json"]).unwrap();
    assert!(!blocks.contains("192.0.2.7"), "nothing blocked: {blocks}");
    assert!(!blocks.contains("0.0.0.0/0"), "nothing blocked: {blocks}");
    let log = e.log(1).unwrap();
    assert!(
        !log.lines().any(|l| l.starts_with("FORGED")),
        "a client's newline started a log line:\n{log}"
    );
    assert!(log.contains(r"vip api\nFORGED"), "logged escaped:\n{log}");
}

/// The daemon is stopped (as if busy) while a client sends a drain and
/// leaves; when it runs again, the drain is not applied.
fn withdrawn(e: &Env) {
    let line = r#"{"version":2,"command":"drain","vip":"api","backend":"10.0.0.11:80"}"#;
    signal(e, "-STOP");
    let sent = (|| {
        let mut c = UnixStream::connect(&e.socket)?;
        c.write_all(format!("{line}\n").as_bytes())
    })();
    signal(e, "-CONT");
    sent.unwrap();
    crate::env::wait_for(Duration::from_secs(5), "withdrawn in the log", || {
        Ok(e.log(1)?.contains("withdrawn: the client left"))
    })
    .unwrap();
    assert_eq!(e.backend_state("api", "10.0.0.11:80").unwrap(), "up");
}

fn followers(e: &Env) {
    let follow = r#"{"version":2,"command":"events","follow":true}"#;
    let mut streams = Vec::new();
    for i in 0..MAX_CONNECTIONS {
        let mut c = UnixStream::connect(&e.socket).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(format!("{follow}\n").as_bytes()).unwrap();
        let mut rd = BufReader::new(c);
        let mut first = String::new();
        rd.read_line(&mut first).unwrap();
        match parse_response(first.as_bytes()).unwrap() {
            Response::Event(_) if i < MAX_FOLLOWERS => {}
            Response::Error { message } if i >= MAX_FOLLOWERS => assert!(
                message.starts_with("too many `events --follow` streams"),
                "{i}: {message}"
            ),
            other => panic!("follower {i}: {other:?}"),
        }
        streams.push(rd);
    }
    e.xlb(&["reload"]).expect("reload answered");
    e.xlb(&["drain", "api", "10.0.0.12:80"])
        .expect("drain answered");
    e.xlb(&["enable", "api", "10.0.0.12:80"])
        .expect("enable answered");
}
