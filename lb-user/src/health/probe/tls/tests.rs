//! The handshake against real rustls servers with certificates made by the
//! openssl CLI, and against hostile bytes: each failure named.

use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

use super::testutil::{RawServer, Serve, TempDir, TlsServer, lab_ca_check, pem};
use super::*;

const LIMIT: Duration = Duration::from_millis(500);

/// One handshake with `tls` to `addr`.
async fn shake(addr: SocketAddr, tls: &TlsCheck) -> Result<TlsStream, FailReason> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    handshake(tcp, tls, addr, &[], Instant::now() + LIMIT, LIMIT).await
}

/// The verdict of a handshake with `tls` against a server holding `cert`.
async fn verdict(cert: &str, tls: &TlsCheck) -> Result<(), FailReason> {
    let server = TlsServer::start(cert, Serve::Http).await;
    shake(server.addr, tls).await.map(|_| ())
}

fn no_verify() -> TlsCheck {
    TlsCheck {
        verify: false,
        ca_file: None,
        server_name: Some("good.test".to_owned()),
    }
}

#[tokio::test]
async fn valid_certificate_by_name_and_by_ip() {
    let dir = TempDir::new("valid");
    assert_eq!(
        verdict("good", &lab_ca_check(&dir, Some("good.test"))).await,
        Ok(())
    );
    // No name: checked against the address connected to (an IP SAN).
    assert_eq!(verdict("good", &lab_ca_check(&dir, None)).await, Ok(()));
}

#[tokio::test]
async fn wrong_name_names_both() {
    let dir = TempDir::new("name");
    let fail = verdict("other", &lab_ca_check(&dir, Some("good.test")))
        .await
        .expect_err("wrong name");
    assert_eq!(
        fail,
        FailReason::TlsCertWrongName {
            expected: "good.test".to_owned(),
            presented: vec!["other.test".to_owned()],
        }
    );
    assert_eq!(fail.code(), "tls_cert_wrong_name");
    assert_eq!(
        fail.to_string(),
        "TLS certificate is not valid for \"good.test\" (it names \"other.test\"); set host to \
         a name the certificate holds, or fix the certificate"
    );
    // By IP: the certificate of other.test holds no IP address.
    let fail = verdict("other", &lab_ca_check(&dir, None)).await;
    assert!(
        matches!(&fail, Err(FailReason::TlsCertWrongName { expected, .. }) if expected == "127.0.0.1"),
        "{fail:?}"
    );
    // And the certificate of good.test holds 127.0.0.1, not 127.0.0.2.
    let fail = verdict("good", &lab_ca_check(&dir, Some("127.0.0.2"))).await;
    let fail = fail.expect_err("wrong address");
    assert_eq!(
        fail,
        FailReason::TlsCertWrongName {
            expected: "127.0.0.2".to_owned(),
            presented: vec!["good.test".to_owned(), "127.0.0.1".to_owned()],
        }
    );
}

#[tokio::test]
async fn expired_and_not_yet_valid_give_the_dates() {
    let dir = TempDir::new("dates");
    let tls = lab_ca_check(&dir, Some("good.test"));
    let fail = verdict("expired", &tls).await.expect_err("expired");
    assert_eq!(fail.code(), "tls_cert_expired");
    let text = fail.to_string();
    assert!(
        text.starts_with("TLS certificate expired at 2021-01-01 00:00:00 UTC (now 20"),
        "{text}"
    );
    assert!(
        text.ends_with("renew it on the backend (or check this host's clock)"),
        "{text}"
    );
    let fail = verdict("future", &tls).await.expect_err("not yet valid");
    assert_eq!(fail.code(), "tls_cert_expired");
    assert!(
        fail.to_string()
            .starts_with("TLS certificate is not valid before 2090-01-01 00:00:00 UTC (now 20"),
        "{fail}"
    );
}

#[tokio::test]
async fn unknown_issuer_names_the_roots() {
    let dir = TempDir::new("issuer");
    let tls = lab_ca_check(&dir, Some("good.test"));
    let fail = verdict("stranger", &tls).await.expect_err("unknown issuer");
    let ca = tls.ca_file.as_ref().expect("ca_file").display().to_string();
    assert_eq!(fail.code(), "tls_cert_unknown_issuer");
    assert_eq!(
        fail.to_string(),
        format!(
            "TLS certificate signed by a CA not in ca_file {ca}; set ca_file to the CA that \
             signed it, or tls_verify = false for a self-signed backend"
        )
    );
    // The lab CA is in no system's roots.
    let system = TlsCheck {
        ca_file: None,
        ..tls
    };
    assert_eq!(
        verdict("good", &system).await,
        Err(FailReason::TlsCertUnknownIssuer {
            roots: "the system roots".to_owned()
        })
    );
}

#[tokio::test]
async fn other_certificate_problems_are_invalid() {
    let dir = TempDir::new("invalid");
    // A certificate for client authentication only.
    let fail = verdict("client", &lab_ca_check(&dir, Some("good.test")))
        .await
        .expect_err("wrong purpose");
    assert_eq!(fail.code(), "tls_cert_invalid", "{fail}");
    assert!(
        fail.to_string().starts_with("TLS certificate invalid: "),
        "{fail}"
    );
}

/// `tls_verify = false` accepts every certificate the others refuse.
#[tokio::test]
async fn no_verify_accepts_any_certificate() {
    for cert in ["good", "other", "expired", "future", "stranger", "client"] {
        assert_eq!(verdict(cert, &no_verify()).await, Ok(()), "{cert}");
    }
}

#[tokio::test]
async fn servers_alert_is_handshake_failed() {
    // The server speaks only h2; offered http/1.1 alone, it refuses.
    let server = TlsServer::start("good", Serve::H2Only).await;
    let tcp = TcpStream::connect(server.addr).await.expect("connect");
    let deadline = Instant::now() + LIMIT;
    let fail = handshake(
        tcp,
        &no_verify(),
        server.addr,
        &[b"http/1.1"],
        deadline,
        LIMIT,
    )
    .await
    .map(|_| ())
    .expect_err("no common protocol");
    assert_eq!(fail.code(), "tls_handshake_failed", "{fail}");
    assert_eq!(
        fail.to_string(),
        "TLS handshake failed: received fatal alert: NoApplicationProtocol"
    );
}

#[tokio::test]
async fn hung_server_is_handshake_timeout() {
    // Accepted by the kernel, never read: no ServerHello ever comes.
    let listener = crate::health::testutil::silent_listener();
    let addr = listener.local_addr().expect("local_addr");
    let start = Instant::now();
    let fail = shake(addr, &no_verify())
        .await
        .map(|_| ())
        .expect_err("hung");
    assert!(start.elapsed() >= LIMIT, "{:?}", start.elapsed());
    assert_eq!(fail, FailReason::TlsHandshakeTimeout { timeout: LIMIT });
    assert_eq!(fail.code(), "tls_handshake_timeout");
    assert_eq!(
        fail.to_string(),
        "connected, no complete TLS handshake within 500ms"
    );
}

/// A plain HTTP server answering the ClientHello as a bad request.
#[tokio::test]
async fn plaintext_answer_is_handshake_failed() {
    let reply = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    for close in [true, false] {
        let server = RawServer::start(reply, close).await;
        let fail = shake(server.addr, &no_verify()).await.map(|_| ());
        let fail = fail.expect_err("plaintext");
        assert_eq!(fail.code(), "tls_handshake_failed", "close {close}: {fail}");
        assert!(
            fail.to_string().starts_with("TLS handshake failed: "),
            "{fail}"
        );
    }
}

/// A handshake record header announcing 64 bytes, 3 of them sent: closed,
/// the connection ended mid-handshake; held open, nothing completes.
#[tokio::test]
async fn truncated_record() {
    let truncated = b"\x16\x03\x03\x00\x40\x02\x00\x00";
    let server = RawServer::start(truncated, true).await;
    let fail = shake(server.addr, &no_verify()).await.map(|_| ());
    assert_eq!(fail, Err(FailReason::TlsClosed));
    assert_eq!(FailReason::TlsClosed.code(), "tls_handshake_closed");
    let server = RawServer::start(truncated, false).await;
    let fail = shake(server.addr, &no_verify()).await.map(|_| ());
    assert_eq!(
        fail,
        Err(FailReason::TlsHandshakeTimeout { timeout: LIMIT })
    );
}

/// A record longer than TLS allows, or of an unknown content type.
#[tokio::test]
async fn garbled_records_are_handshake_failed() {
    let oversized = b"\x16\x03\x03\xff\xff\x02\x00\x00";
    let unknown_type = b"\x63\x03\x03\x00\x04\x00\x00\x00\x00";
    for reply in [&oversized[..], &unknown_type[..]] {
        let server = RawServer::start(reply, false).await;
        let fail = shake(server.addr, &no_verify()).await.map(|_| ());
        let fail = fail.expect_err("garbled");
        assert_eq!(fail.code(), "tls_handshake_failed", "{reply:?}: {fail}");
    }
}

#[tokio::test]
async fn closed_before_any_answer() {
    let server = RawServer::start(b"", true).await;
    let fail = shake(server.addr, &no_verify()).await.map(|_| ());
    assert_eq!(fail, Err(FailReason::TlsClosed));
    assert_eq!(
        FailReason::TlsClosed.to_string(),
        "connection closed during the TLS handshake"
    );
}

#[tokio::test]
async fn configs_are_built_once_per_settings() {
    let dir = TempDir::new("cache");
    let tls = lab_ca_check(&dir, Some("good.test"));
    let a = client_config(&tls, &[]).expect("config");
    let b = client_config(&tls, &[]).expect("config");
    assert!(Arc::ptr_eq(&a, &b), "a second probe built its own config");
    // The server name is per handshake, not per configuration.
    let other_name = TlsCheck {
        server_name: None,
        ..tls.clone()
    };
    assert!(Arc::ptr_eq(
        &a,
        &client_config(&other_name, &[]).expect("config")
    ));
    let h2 = client_config(&tls, &[b"h2"]).expect("config");
    assert!(!Arc::ptr_eq(&a, &h2));
    assert_eq!(h2.alpn_protocols, [b"h2".to_vec()]);
    // A reload reads the file again.
    load(&tls).expect("load");
    assert!(!Arc::ptr_eq(&a, &client_config(&tls, &[]).expect("config")));
}

#[test]
fn ca_file_errors_name_the_file() {
    let dir = TempDir::new("ca-errors");
    let check = |path: PathBuf| {
        load(&TlsCheck {
            verify: true,
            ca_file: Some(path),
            server_name: None,
        })
    };
    let missing = dir.0.join("missing.pem");
    assert_eq!(
        check(missing.clone()),
        Err(format!(
            "ca_file {} cannot be read: No such file or directory (os error 2); give the path \
             of a PEM file holding the CA certificates that signed the backends' certificates",
            missing.display()
        ))
    );
    let empty = dir.file("empty.pem", b"");
    assert_eq!(
        check(empty.clone()),
        Err(format!(
            "ca_file {} holds no PEM certificate (no \"-----BEGIN CERTIFICATE-----\" block); \
             give the CA certificates in PEM form",
            empty.display()
        ))
    );
    // A key is PEM, but not a certificate.
    let key = dir.file("key.pem", pem("ca.key"));
    assert!(
        check(key)
            .expect_err("a key")
            .contains("holds no PEM certificate")
    );
    let der = dir.file(
        "garbage.pem",
        b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
    );
    let err = check(der.clone()).expect_err("garbage");
    assert!(
        err.starts_with(&format!(
            "ca_file {} is not a valid PEM file (",
            der.display()
        )),
        "{err}"
    );
    // Base64 that is not a certificate.
    let junk = dir.file(
        "junk.pem",
        b"-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n",
    );
    let err = check(junk.clone()).expect_err("junk");
    assert!(
        err.starts_with(&format!(
            "ca_file {}: certificate 1 is not a usable CA certificate",
            junk.display()
        )),
        "{err}"
    );
    assert_eq!(check(dir.file("ca.pem", pem("ca.pem"))), Ok(()));
}

#[test]
fn system_roots_load_here() {
    // The test machines have ca-certificates installed.
    let system = TlsCheck {
        verify: true,
        ca_file: None,
        server_name: None,
    };
    assert_eq!(load(&system), Ok(()));
}

#[test]
fn utc_dates() {
    let at = |secs| Utc(UnixTime::since_unix_epoch(Duration::from_secs(secs))).to_string();
    assert_eq!(at(0), "1970-01-01 00:00:00 UTC");
    assert_eq!(at(1_609_459_200), "2021-01-01 00:00:00 UTC");
    assert_eq!(at(951_782_400 + 3_723), "2000-02-29 01:02:03 UTC");
    assert_eq!(at(3_786_912_000), "2090-01-01 00:00:00 UTC");
}
