//! Backend and load client against each other on loopback (no root needed).

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::{net::SocketAddr, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::timeout,
};
use xlb_lab::{
    backend::{BackendHandle, BackendOptions, Fault, remote_set_fault, remote_stats, serve},
    client::{LoadOptions, Outcome, Report, run_load},
    http,
};

const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

async fn start(name: &str, listen: &[&str]) -> BackendHandle {
    serve(BackendOptions {
        name: name.to_string(),
        listen: listen.iter().map(|a| a.parse().unwrap()).collect(),
        admin: "127.0.0.1:0".parse().unwrap(),
    })
    .await
    .expect("backend starts on loopback")
}

async fn start_v4(name: &str) -> BackendHandle {
    start(name, &["127.0.0.1:0"]).await
}

/// Short connections only, `rate`/s for `duration`.
fn shorts(
    target: SocketAddr,
    rate: u32,
    duration: Duration,
    request_timeout: Duration,
) -> LoadOptions {
    LoadOptions {
        duration,
        rate,
        keepalive: 0,
        long: 0,
        timeout: request_timeout,
        ..LoadOptions::new(target)
    }
}

fn assert_all(report: &Report, want: Outcome, what: &str) {
    let s = &report.summary;
    assert!(s.requests > 0, "{what}: no requests were made: {s:?}");
    assert_eq!(
        s.counts.get(want),
        s.requests,
        "{what}: expected every request to be {}, got {}",
        want.name(),
        report.render_text()
    );
}

#[tokio::test]
async fn client_gets_ok_answers_attributed_to_the_backend() {
    let b = start_v4("t1").await;
    let target = b.service_addrs()[0];
    let report = run_load(shorts(
        target,
        100,
        Duration::from_secs(1),
        Duration::from_secs(1),
    ))
    .await
    .unwrap();
    assert_all(&report, Outcome::Ok, "healthy backend");
    // 100/s for 1 s, scheduled from the start: exactly 100 starts.
    assert_eq!(report.summary.requests, 100);
    assert_eq!(report.summary.skipped, 0);
    assert_eq!(report.summary.per_backend.get("t1"), Some(&100));
    assert_eq!(report.summary.first_failure_ms, None);
    assert_eq!(report.timeline.len(), 10);
    assert!(
        report.timeline.iter().all(|s| s.counts.ok >= 5),
        "requests spread over every slice: {:?}",
        report.timeline
    );
    let stats = b.stats();
    assert_eq!(stats.requests, 100);
    assert_eq!(stats.connections, 100, "one connection per short request");
}

#[tokio::test]
async fn keepalive_connections_are_reused() {
    let b = start_v4("t1").await;
    let opts = LoadOptions {
        duration: Duration::from_millis(600),
        rate: 0,
        keepalive: 2,
        keepalive_interval: Duration::from_millis(20),
        long: 0,
        ..LoadOptions::new(b.service_addrs()[0])
    };
    let report = run_load(opts).await.unwrap();
    assert_all(&report, Outcome::Ok, "keep-alive");
    assert!(report.summary.requests >= 20, "{}", report.render_text());
    let stats = remote_stats(b.admin_addr(), ADMIN_TIMEOUT).await.unwrap();
    assert_eq!(
        stats.connections, 2,
        "two keep-alive connections carried every request"
    );
    assert_eq!(stats.requests, report.summary.requests);
}

#[tokio::test]
async fn serves_ipv4_and_ipv6_listeners() {
    let b = start("t6", &["127.0.0.1:0", "[::1]:0"]).await;
    for (name, target) in [("v4", b.service_addrs()[0]), ("v6", b.service_addrs()[1])] {
        let report = run_load(shorts(
            target,
            50,
            Duration::from_millis(200),
            Duration::from_secs(1),
        ))
        .await
        .unwrap();
        assert_all(&report, Outcome::Ok, name);
        assert_eq!(
            report.summary.per_backend.get("t6"),
            Some(&report.summary.requests),
            "{name}"
        );
    }
}

#[tokio::test]
async fn faults_show_as_their_outcome_and_recover() {
    struct Case {
        name: &'static str,
        fault: Fault,
        want: Outcome,
    }
    let cases = [
        Case {
            name: "503",
            fault: Fault::Error503,
            want: Outcome::Http5xx,
        },
        Case {
            name: "crash",
            fault: Fault::Crash,
            want: Outcome::Refused,
        },
        Case {
            name: "hang",
            fault: Fault::Hang,
            want: Outcome::TimedOut,
        },
        Case {
            name: "slower than the timeout",
            fault: Fault::Slow { ms: 800 },
            want: Outcome::TimedOut,
        },
    ];
    for c in cases {
        let b = start_v4("t1").await;
        let target = b.service_addrs()[0];
        let load = LoadOptions {
            keepalive: 1,
            keepalive_interval: Duration::from_millis(20),
            ..shorts(
                target,
                50,
                Duration::from_millis(400),
                Duration::from_millis(300),
            )
        };

        // Through the admin listener, as a test in another process would.
        let stats = remote_set_fault(b.admin_addr(), c.fault, ADMIN_TIMEOUT)
            .await
            .unwrap();
        assert_eq!(stats.fault, c.fault.name(), "{}", c.name);
        let report = run_load(load.clone()).await.unwrap();
        assert_all(&report, c.want, c.name);
        assert!(
            report.summary.first_failure_ms.is_some_and(|t| t < 100),
            "{}",
            c.name
        );

        // The admin listener answers whatever the service does.
        let stats = remote_stats(b.admin_addr(), ADMIN_TIMEOUT).await.unwrap();
        assert_eq!(stats.fault, c.fault.name(), "{}", c.name);

        remote_set_fault(b.admin_addr(), Fault::None, ADMIN_TIMEOUT)
            .await
            .unwrap();
        assert_eq!(
            b.service_addrs()[0],
            target,
            "{}: same port after recover",
            c.name
        );
        let report = run_load(load).await.unwrap();
        assert_all(&report, Outcome::Ok, &format!("{} then recover", c.name));
    }
}

#[tokio::test]
async fn hang_keeps_completing_handshakes_and_holds_requests() {
    let b = start_v4("t1").await;
    let target = b.service_addrs()[0];
    b.set_fault(Fault::Hang).await.unwrap();
    let accepted_before = b.stats().connections;

    // The listening socket is still open, so the kernel completes the handshake.
    let mut conn = timeout(Duration::from_secs(1), TcpStream::connect(target))
        .await
        .expect("connect during a hang completes in time")
        .expect("connect during a hang succeeds");
    conn.write_all(b"GET /api HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let early = timeout(
        Duration::from_millis(500),
        http::read_response(&mut conn, &mut buf),
    )
    .await;
    assert!(early.is_err(), "no answer during a hang: {early:?}");
    assert_eq!(
        b.stats().connections,
        accepted_before,
        "nothing accepted during a hang"
    );

    let stats = remote_stats(b.admin_addr(), ADMIN_TIMEOUT).await.unwrap();
    assert_eq!(stats.fault, "hang");

    // After recover the held connection is accepted and its request answered.
    remote_set_fault(b.admin_addr(), Fault::None, ADMIN_TIMEOUT)
        .await
        .unwrap();
    let resp = timeout(
        Duration::from_secs(2),
        http::read_response(&mut conn, &mut buf),
    )
    .await
    .expect("answer after recover")
    .unwrap();
    assert_eq!(resp.head.status, 200);
    assert_eq!(resp.head.header("x-backend"), Some("t1"));
    assert_eq!(resp.body, b"t1");
}

#[tokio::test]
async fn crash_closes_the_port_and_open_connections() {
    let b = start_v4("t1").await;
    let target = b.service_addrs()[0];
    let mut conn = TcpStream::connect(target).await.unwrap();
    conn.write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let resp = http::read_response(&mut conn, &mut buf).await.unwrap();
    assert_eq!(
        (resp.head.status, resp.body.as_slice()),
        (200, b"ok".as_slice())
    );
    assert_eq!(resp.head.header("x-backend"), Some("t1"));

    b.set_fault(Fault::Crash).await.unwrap();
    let refused = TcpStream::connect(target)
        .await
        .map(drop)
        .map_err(|e| e.kind());
    assert_eq!(refused, Err(std::io::ErrorKind::ConnectionRefused));
    let mut byte = [0u8; 1];
    let n = timeout(Duration::from_secs(1), conn.read(&mut byte))
        .await
        .expect("the open connection is closed promptly");
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "connection closed by the crash, got {n:?}"
    );

    b.set_fault(Fault::None).await.unwrap();
    let resp = http::request(target, "GET", "/api", Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(resp.body, b"t1");
}

#[tokio::test]
async fn slow_fault_adds_latency() {
    let b = start_v4("t1").await;
    let load = shorts(
        b.service_addrs()[0],
        20,
        Duration::from_millis(500),
        Duration::from_secs(2),
    );
    let fast = run_load(load.clone()).await.unwrap();
    assert_all(&fast, Outcome::Ok, "baseline");
    assert!(
        fast.summary.latency.p50_ms < 50.0,
        "baseline p50 {}",
        fast.summary.latency.p50_ms
    );

    b.set_fault(Fault::Slow { ms: 150 }).await.unwrap();
    assert_eq!(b.stats().slow_ms, Some(150));
    let slow = run_load(load).await.unwrap();
    assert_all(&slow, Outcome::Ok, "slow");
    let l = slow.summary.latency;
    assert!(l.p50_ms >= 150.0 && l.p50_ms < 400.0, "slow p50 {l:?}");
    assert!(l.max_ms >= 150.0, "{l:?}");
}

#[tokio::test]
async fn in_flight_cap_skips_starts_instead_of_queueing() {
    let b = start_v4("t1").await;
    b.set_fault(Fault::Hang).await.unwrap();
    let opts = LoadOptions {
        max_in_flight: 2,
        ..shorts(
            b.service_addrs()[0],
            100,
            Duration::from_millis(300),
            Duration::from_millis(250),
        )
    };
    let report = run_load(opts).await.unwrap();
    let s = &report.summary;
    assert_all(&report, Outcome::TimedOut, "hung with a cap of 2");
    // 30 starts: 2 in flight until 250 ms, then 2 more.
    assert_eq!(s.requests + s.skipped, 30, "{s:?}");
    assert!(s.requests <= 4 && s.skipped >= 26, "{s:?}");
}

#[tokio::test]
async fn long_connections_report_whether_data_kept_flowing() {
    struct Case {
        name: &'static str,
        fault_at_500ms: Option<Fault>,
        kept_flowing: bool,
        stalled: bool,
        end: &'static str,
    }
    let cases = [
        Case {
            name: "healthy",
            fault_at_500ms: None,
            kept_flowing: true,
            stalled: false,
            end: "open",
        },
        Case {
            name: "hang",
            fault_at_500ms: Some(Fault::Hang),
            kept_flowing: false,
            stalled: true,
            end: "open",
        },
        Case {
            name: "crash",
            fault_at_500ms: Some(Fault::Crash),
            kept_flowing: false,
            stalled: false,
            end: "closed",
        },
    ];
    for c in cases {
        let b = start_v4("t1").await;
        let opts = LoadOptions {
            duration: Duration::from_millis(1500),
            rate: 0,
            keepalive: 0,
            long: 2,
            stream_interval: Duration::from_millis(20),
            stall_after: Duration::from_millis(300),
            ..LoadOptions::new(b.service_addrs()[0])
        };
        let load = tokio::spawn(run_load(opts));
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Some(f) = c.fault_at_500ms {
            b.set_fault(f).await.unwrap();
        }
        let report = load.await.unwrap().unwrap();
        assert_eq!(report.long.len(), 2, "{}", c.name);
        assert_eq!(
            report.summary.long_broken,
            if c.kept_flowing { 0 } else { 2 },
            "{}",
            c.name
        );
        for l in &report.long {
            let what = format!("{} #{}: {l:?}", c.name, l.id);
            assert_eq!(l.backend.as_deref(), Some("t1"), "{what}");
            assert_eq!(l.setup, Some(Outcome::Ok), "{what}");
            assert_eq!(l.kept_flowing, c.kept_flowing, "{what}");
            assert_eq!(l.stalled, c.stalled, "{what}");
            assert_eq!(l.end, c.end, "{what}");
            // ~25 lines in the first 500 ms at 20 ms each.
            assert!(l.lines >= 10, "{what}");
            if c.stalled {
                let t = l.first_stall_ms.unwrap();
                assert!(
                    (750..=1200).contains(&t),
                    "stall noticed 300 ms after the hang: {what}"
                );
            }
            if c.kept_flowing {
                assert!(l.longest_gap_ms < 300, "{what}");
                assert!(l.lines >= 40, "{what}");
            }
        }
    }
}

#[tokio::test]
async fn admin_rejects_bad_requests() {
    let b = start_v4("t1").await;
    let cases = [
        ("slow without ms", "POST", "/fault/slow", 400),
        ("slow with junk ms", "POST", "/fault/slow?ms=abc", 400),
        ("unknown fault", "POST", "/fault/explode", 404),
        ("fault by GET", "GET", "/fault/hang", 405),
        ("stats by POST", "POST", "/stats", 405),
        ("unknown path", "GET", "/nope", 404),
        ("stats", "GET", "/stats", 200),
    ];
    for (name, method, path, want) in cases {
        let resp = http::request(b.admin_addr(), method, path, ADMIN_TIMEOUT)
            .await
            .unwrap();
        assert_eq!(resp.head.status, want, "{name}");
    }
    assert_eq!(b.fault(), Fault::None, "no bad request changed the fault");
    // Service side: unknown path is 404 but still attributed.
    let resp = http::request(b.service_addrs()[0], "GET", "/nope", ADMIN_TIMEOUT)
        .await
        .unwrap();
    assert_eq!(resp.head.status, 404);
    assert_eq!(resp.head.header("x-backend"), Some("t1"));
}

#[test]
fn binaries_run_against_each_other() {
    use std::process::{Command, Stdio};
    // Find a free port pair by binding and releasing (bounded race on loopback).
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let (svc, admin) = (free(), free());
    /// Kills the backend however the test ends.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _backend = Kill(
        Command::new(env!("CARGO_BIN_EXE_xlb-backend"))
            .args([
                "--name",
                "bin1",
                "--listen",
                &svc.to_string(),
                "--admin",
                &admin.to_string(),
            ])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    fn wait_ready(addr: SocketAddr) {
        for _ in 0..100 {
            if std::net::TcpStream::connect(addr).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("xlb-backend did not listen on {addr} within 2 s");
    }
    wait_ready(admin);
    let json = std::env::temp_dir().join(format!("xlb-client-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_xlb-client"))
        .args([
            "--target",
            &svc.to_string(),
            "--duration",
            "500ms",
            "--rate",
            "40",
            "--keepalive",
            "1",
        ])
        .args(["--long", "1", "--timeout", "1s", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("per backend: bin1"), "{text}");
    let report: Report = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).ok();
    assert_eq!(report.summary.failures, 0, "{text}");
    assert!(report.summary.requests >= 20, "{text}");
    assert_eq!(report.long.len(), 1);
    assert!(report.long[0].kept_flowing, "{text}");
}
