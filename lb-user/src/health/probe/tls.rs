//! TLS for probes (`kind = "https"`, and gRPC over TLS): a rustls client
//! (ring provider, no OpenSSL) whose configuration is built once per
//! distinct settings and shared by every probe that uses them, and the
//! handshake with its failures named ([`FailReason`]'s `tls_*` codes).
//!
//! What is verified, by [`TlsCheck`]:
//! - `verify = true` (the default): the chain up to the system's roots, or
//!   to the certificates of `ca_file` alone; validity dates; the name: the
//!   check's `host` (sent as SNI) or, without one, the address the probe
//!   connects to (no SNI is sent then, and the certificate must hold that
//!   IP address as a subject alternative name).
//! - `verify = false`: the certificate is accepted whatever it says: its
//!   identity (names), its issuer (self-signed or any CA) and its validity
//!   dates are NOT checked. The handshake's signature is still checked
//!   against the certificate's key, so the server holds the private key of
//!   the certificate it sent, and the TLS protocol itself is still whole.
//!
//! Session resumption is rustls's default (an in-memory cache of tickets per
//! server name): a resumed handshake costs a fraction of a full one, as
//! HAProxy's checks reuse their session. A resumed session does not present
//! the certificate again, so a certificate replaced on the backend is seen
//! when the server stops accepting the ticket (its lifetime, two hours by
//! OpenSSL's default) or when the connection is refused for another reason.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};
use tokio_rustls::TlsConnector;

use super::super::spec::TlsCheck;
use super::{FailReason, io_fail};

/// A client TLS connection over a probe's TCP stream.
pub(crate) type TlsStream = tokio_rustls::client::TlsStream<TcpStream>;

/// Handshakes over `stream` (already connected to `peer`) by `deadline`,
/// offering `alpn`. The certificate is checked as [`TlsCheck`] says, for
/// `tls.server_name` or else `peer`'s address. `limit` is the duration a
/// timeout names (`hang_timeout`).
pub(crate) async fn handshake(
    stream: TcpStream,
    tls: &TlsCheck,
    peer: SocketAddr,
    alpn: &[&[u8]],
    deadline: Instant,
    limit: Duration,
) -> Result<TlsStream, FailReason> {
    let config = client_config(tls, alpn).map_err(|reason| FailReason::InvalidCheck { reason })?;
    let name = server_name(tls, peer).map_err(|reason| FailReason::InvalidCheck { reason })?;
    let connecting = TlsConnector::from(config).connect(name, stream);
    match timeout_at(deadline, connecting).await {
        Err(_elapsed) => Err(FailReason::TlsHandshakeTimeout { timeout: limit }),
        Ok(Err(e)) => Err(handshake_fail(e, tls)),
        Ok(Ok(stream)) => Ok(stream),
    }
}

/// The name the certificate must hold: `server_name` (a DNS name, sent as
/// SNI, or an IP address literal), else the probed address (no SNI).
fn server_name(tls: &TlsCheck, peer: SocketAddr) -> Result<ServerName<'static>, String> {
    match &tls.server_name {
        Some(name) => parse_server_name(name),
        None => Ok(ServerName::IpAddress(peer.ip().into())),
    }
}

/// `name` as rustls takes it: a DNS name or an IP address.
pub(crate) fn parse_server_name(name: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(name.to_owned()).map_err(|_| {
        format!("{name:?} is not a DNS name or IP address the certificate can be checked against")
    })
}

/// What a failed handshake says about the backend. rustls reports its own
/// verdicts (a certificate it refused, an alert it received, bytes that
/// are not TLS) as `InvalidData` errors wrapping a `rustls::Error`.
fn handshake_fail(e: io::Error, tls: &TlsCheck) -> FailReason {
    if let Some(error) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        return tls_fail(error, tls);
    }
    if e.kind() == io::ErrorKind::UnexpectedEof {
        return FailReason::TlsClosed;
    }
    io_fail(e, "handshaking TLS")
}

/// The named failure for a rustls error.
pub(crate) fn tls_fail(error: &rustls::Error, tls: &TlsCheck) -> FailReason {
    let rustls::Error::InvalidCertificate(cert) = error else {
        return FailReason::TlsHandshakeFailed {
            error: error.to_string(),
        };
    };
    match cert {
        CertificateError::Expired => expired("has expired".to_owned()),
        CertificateError::ExpiredContext { time, not_after } => expired(format!(
            "expired at {} (now {})",
            Utc(*not_after),
            Utc(*time)
        )),
        CertificateError::NotValidYet => expired("is not valid yet".to_owned()),
        CertificateError::NotValidYetContext { time, not_before } => expired(format!(
            "is not valid before {} (now {})",
            Utc(*not_before),
            Utc(*time)
        )),
        CertificateError::NotValidForName => FailReason::TlsCertWrongName {
            expected: tls.server_name.clone().unwrap_or_default(),
            presented: Vec::new(),
        },
        CertificateError::NotValidForNameContext {
            expected,
            presented,
        } => FailReason::TlsCertWrongName {
            expected: expected.to_str().into_owned(),
            presented: presented.iter().map(|n| presented_name(n)).collect(),
        },
        CertificateError::UnknownIssuer => FailReason::TlsCertUnknownIssuer {
            roots: roots_text(tls),
        },
        other => FailReason::TlsCertInvalid {
            error: rustls::Error::InvalidCertificate(other.clone()).to_string(),
        },
    }
}

/// A name of the certificate as webpki reports it (`DnsName("a.test")`,
/// `IpAddress(10.0.0.1)`), as the operator would write it.
fn presented_name(name: &str) -> String {
    let inner = name
        .strip_prefix("DnsName(\"")
        .and_then(|n| n.strip_suffix("\")"))
        .or_else(|| name.strip_prefix("IpAddress(")?.strip_suffix(')'));
    inner.unwrap_or(name).to_owned()
}

fn expired(detail: String) -> FailReason {
    FailReason::TlsCertExpired { detail }
}

/// Where the trusted CAs come from, for operators.
fn roots_text(tls: &TlsCheck) -> String {
    match &tls.ca_file {
        Some(path) => format!("ca_file {}", path.display()),
        None => "the system roots".to_owned(),
    }
}

/// A certificate time as `2026-12-03 12:00:00 UTC`.
struct Utc(UnixTime);

impl fmt::Display for Utc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0.as_secs();
        let (days, rem) = (secs / 86_400, secs % 86_400);
        let (y, m, d) = civil_from_days(days);
        write!(
            f,
            "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
            rem / 3600,
            rem / 60 % 60,
            rem % 60
        )
    }
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days ≥ 0).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

// ---------------------------------------------------------------------------
// Client configurations, built once per distinct settings.

/// Whose certificates a verifying client trusts.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Roots {
    System,
    File(PathBuf),
    /// `verify = false`: none needed.
    Any,
}

impl Roots {
    fn of(tls: &TlsCheck) -> Self {
        match (&tls.ca_file, tls.verify) {
            (_, false) => Self::Any,
            (Some(path), true) => Self::File(path.clone()),
            (None, true) => Self::System,
        }
    }
}

#[derive(Default)]
struct Cache {
    /// Trusted certificates per source, read at config load ([`load`]) or
    /// by the first probe that needs them.
    roots: HashMap<Roots, Arc<RootCertStore>>,
    /// Client configurations per source and ALPN list.
    configs: HashMap<(Roots, Vec<Vec<u8>>), Arc<ClientConfig>>,
}

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(Mutex::default);

fn cache() -> MutexGuard<'static, Cache> {
    // Every critical section is a lookup or an insert.
    CACHE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reads the certificates `tls` trusts (the system's roots or `ca_file`),
/// replacing what an earlier load read, so that a reloaded configuration
/// picks up a renewed CA file; the client configurations built on the old
/// ones are dropped (probes in flight keep theirs). `config` calls this
/// at load time: the error is for the operator, naming the file and what
/// to do.
pub(crate) fn load(tls: &TlsCheck) -> Result<(), String> {
    let roots = Roots::of(tls);
    let store = match &roots {
        Roots::Any => return Ok(()),
        Roots::System => system_roots()?,
        Roots::File(path) => file_roots(path)?,
    };
    let mut cache = cache();
    cache.configs.retain(|(r, _), _| *r != roots);
    cache.roots.insert(roots, Arc::new(store));
    Ok(())
}

/// The client configuration for `tls` offering `alpn`: the cached one, or
/// one built now (and cached) from the roots read at load time (or read
/// now, for a check that was not loaded from a configuration).
pub(crate) fn client_config(tls: &TlsCheck, alpn: &[&[u8]]) -> Result<Arc<ClientConfig>, String> {
    let roots = Roots::of(tls);
    let key = (roots.clone(), alpn.iter().map(|p| p.to_vec()).collect());
    if let Some(config) = cache().configs.get(&key) {
        return Ok(Arc::clone(config));
    }
    let store = match &roots {
        Roots::Any => None,
        _ => {
            if !cache().roots.contains_key(&roots) {
                load(tls)?;
            }
            cache().roots.get(&roots).cloned()
        }
    };
    let mut config = build(store)?;
    config.alpn_protocols = key.1.clone();
    let config = Arc::new(config);
    cache().configs.insert(key, Arc::clone(&config));
    Ok(config)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client trusting `roots`, or (`None`) accepting any certificate.
fn build(roots: Option<Arc<RootCertStore>>) -> Result<ClientConfig, String> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS client setup: {e}"))?;
    let config = match roots {
        Some(roots) => builder.with_root_certificates(roots),
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider))),
    };
    Ok(config.with_no_client_auth())
}

/// The system's trusted roots (rustls-native-certs: the files OpenSSL
/// would read, `SSL_CERT_FILE`/`SSL_CERT_DIR` honoured).
fn system_roots() -> Result<RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut store = RootCertStore::empty();
    let (added, _ignored) = store.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map_or_else(String::new, |e| format!(" ({e})"));
        return Err(format!(
            "this host has no trusted CA certificates to verify backends with{why}; install \
             them (Debian: the ca-certificates package), or set ca_file to the CA that signed \
             the backends' certificates, or tls_verify = false for self-signed backends"
        ));
    }
    Ok(store)
}

/// The CA certificates of the PEM file at `path`, all of them required to
/// parse: a file that is half garbage is a mistake to report, not to skip.
fn file_roots(path: &Path) -> Result<RootCertStore, String> {
    let shown = path.display();
    let bytes = std::fs::read(path).map_err(|e| {
        format!(
            "ca_file {shown} cannot be read: {e}; give the path of a PEM file holding the CA \
             certificates that signed the backends' certificates"
        )
    })?;
    let certs: Result<Vec<CertificateDer<'static>>, _> =
        CertificateDer::pem_slice_iter(&bytes).collect();
    let certs = certs.map_err(|e| {
        format!("ca_file {shown} is not a valid PEM file ({e}); give PEM CA certificates")
    })?;
    if certs.is_empty() {
        return Err(format!(
            "ca_file {shown} holds no PEM certificate (no \"-----BEGIN CERTIFICATE-----\" \
             block); give the CA certificates in PEM form"
        ));
    }
    let mut store = RootCertStore::empty();
    for (i, cert) in certs.into_iter().enumerate() {
        store.add(cert).map_err(|e| {
            format!(
                "ca_file {shown}: certificate {} is not a usable CA certificate: {e}",
                i + 1
            )
        })?;
    }
    Ok(store)
}

/// `tls_verify = false`: accepts any certificate (identity, issuer and
/// dates unchecked), while still checking the handshake's signatures with
/// the certificate's key, as the TLS protocol requires.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
pub(crate) mod testutil;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod https_tests;
