//! `kind = "https"`: the HTTP probe over TLS, against rustls servers: the
//! HTTP verdicts, the TLS ones, the hung-vs-slow split, and the kept
//! connection of `reuse_connection` holding a TLS session.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::super::super::spec::{CheckKind, CheckSpec, HttpCheck};
use super::super::super::testutil::http_spec_hang;
use super::super::{ConnSlot, ProbeClass, ProbeOk, probe, probe_reusing};
use super::testutil::{Serve, TempDir, TlsServer, lab_ca_check};
use super::*;

const T: Duration = Duration::from_millis(300);
const OK: Result<ProbeOk, FailReason> = Ok(ProbeOk { status: Some(200) });

/// An https check of `server` trusting the lab CA, for `good.test`.
fn https_spec(dir: &TempDir, port: u16, timeout: Duration, hang: Duration) -> CheckSpec {
    let mut spec = http_spec_hang(port, timeout, hang);
    let CheckKind::Http(http) = spec.kind else {
        unreachable!("http_spec_hang makes an HTTP check")
    };
    spec.kind = CheckKind::Https {
        http: HttpCheck {
            host: Some("good.test".to_owned()),
            ..http
        },
        tls: lab_ca_check(dir, Some("good.test")),
    };
    spec
}

fn http_of(spec: &mut CheckSpec) -> &mut HttpCheck {
    match &mut spec.kind {
        CheckKind::Https { http, .. } => http,
        _ => unreachable!("an https spec"),
    }
}

async fn outcome(server: &TlsServer, spec: &CheckSpec) -> Result<ProbeOk, FailReason> {
    probe(server.addr, spec).await.outcome
}

#[tokio::test]
async fn https_verdicts() {
    let dir = TempDir::new("https");
    let good = TlsServer::start("good", Serve::Http).await;
    let mut spec = https_spec(&dir, good.addr.port(), T, T);
    assert_eq!(outcome(&good, &spec).await, OK);
    http_of(&mut spec).body_contains = Some("ok".to_owned());
    assert_eq!(outcome(&good, &spec).await, OK);
    http_of(&mut spec).body_contains = Some("fine".to_owned());
    assert_eq!(
        outcome(&good, &spec).await,
        Err(FailReason::BodyMismatch {
            expected: "fine".to_owned()
        })
    );
    let failing = TlsServer::start("good", Serve::Fail).await;
    let spec = https_spec(&dir, failing.addr.port(), T, T);
    assert_eq!(
        outcome(&failing, &spec).await,
        Err(FailReason::UnexpectedStatus { status: 503 })
    );
    let wrong = TlsServer::start("other", Serve::Http).await;
    let spec = https_spec(&dir, wrong.addr.port(), T, T);
    assert_eq!(
        outcome(&wrong, &spec).await.map_err(|f| f.code()),
        Err("tls_cert_wrong_name")
    );
}

/// A plain HTTP probe of a TLS server fails, as it must: kinds are not
/// interchangeable.
#[tokio::test]
async fn http_kind_against_tls_fails() {
    let server = TlsServer::start("good", Serve::Http).await;
    let spec = http_spec_hang(server.addr.port(), T, T);
    assert!(outcome(&server, &spec).await.is_err());
}

/// Hung after the handshake: no response at `hang_timeout`.
#[tokio::test]
async fn hung_after_handshake_is_no_response() {
    let dir = TempDir::new("https-hung");
    let server = TlsServer::start("good", Serve::Hang).await;
    let spec = https_spec(&dir, server.addr.port(), T, T);
    let result = probe(server.addr, &spec).await;
    assert_eq!(result.outcome, Err(FailReason::NoResponse { timeout: T }));
    assert!(result.latency >= T, "{:?}", result.latency);
}

/// A handshake later than `timeout` but within `hang_timeout` is slow, not
/// failed; past `hang_timeout` it is a handshake timeout.
#[tokio::test]
async fn slow_handshake_is_slow_not_failed() {
    let dir = TempDir::new("https-slow");
    let server = TlsServer::start("good", Serve::SlowHandshake(2 * T)).await;
    let spec = https_spec(&dir, server.addr.port(), T, 4 * T);
    let result = probe(server.addr, &spec).await;
    assert_eq!(result.outcome, OK);
    assert!(
        matches!(result.class(spec.timeout), ProbeClass::Slow { .. }),
        "{:?}",
        result.class(spec.timeout)
    );
    let strict = https_spec(&dir, server.addr.port(), T, T);
    let result = probe(server.addr, &strict).await;
    assert_eq!(
        result.outcome,
        Err(FailReason::TlsHandshakeTimeout { timeout: T })
    );
}

/// `reuse_connection`: one TLS handshake carries `reopen_every` probes.
#[tokio::test]
async fn reuse_keeps_the_tls_session() {
    let dir = TempDir::new("https-reuse");
    let server = TlsServer::start("good", Serve::Http).await;
    let mut spec = https_spec(&dir, server.addr.port(), T, T);
    http_of(&mut spec).reuse_connection = Some(3);
    let slot = ConnSlot::default();
    let mut seen = Vec::new();
    for i in 0..7 {
        let result = probe_reusing(server.addr, &spec, None, Some(&slot)).await;
        assert_eq!(result.outcome, OK, "probe {i}");
        seen.push(server.handshakes.load(Ordering::SeqCst));
    }
    assert_eq!(seen, [1, 1, 1, 2, 2, 2, 3]);
    assert_eq!(server.connections.load(Ordering::SeqCst), 3);
    assert!(slot.is_idle());
}

/// A kept TLS connection is taken only while open and quiet, and only by
/// a TLS probe; one the server closed while idle is replaced within the
/// same probe.
#[tokio::test]
async fn kept_tls_connection_checked_before_use() {
    let dir = TempDir::new("https-reuse-close");
    let server = TlsServer::start("good", Serve::AnswerThenClose).await;
    let mut spec = https_spec(&dir, server.addr.port(), T, T);
    http_of(&mut spec).reuse_connection = Some(10);
    let slot = ConnSlot::default();
    let once = || probe_reusing(server.addr, &spec, None, Some(&slot));
    assert_eq!(once().await.outcome, OK);
    // Its close_notify and FIN arrive while idle.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(slot.is_idle());
    assert!(
        slot.take(server.addr, true).is_none(),
        "a closed TLS connection was taken"
    );
    assert_eq!(once().await.outcome, OK);
    assert_eq!(once().await.outcome, OK);
    assert_eq!(server.handshakes.load(Ordering::SeqCst), 3);

    let open = TlsServer::start("good", Serve::Http).await;
    let mut spec = https_spec(&dir, open.addr.port(), T, T);
    http_of(&mut spec).reuse_connection = Some(10);
    assert_eq!(
        probe_reusing(open.addr, &spec, None, Some(&slot))
            .await
            .outcome,
        OK
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Open and quiet (its session tickets consumed): taken, by TLS only.
    assert!(
        slot.take(open.addr, false).is_none(),
        "a plain probe took a TLS connection"
    );
    assert_eq!(
        probe_reusing(open.addr, &spec, None, Some(&slot))
            .await
            .outcome,
        OK
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (stream, used) = slot.take(open.addr, true).expect("the kept connection");
    assert!(stream.is_tls());
    assert_eq!(used, 1);
}
