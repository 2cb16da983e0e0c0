//! TLS servers on 127.0.0.1 for the TLS and HTTPS probe tests, with the
//! certificates `tests/tls/make-certs.sh` makes (openssl CLI, once per test
//! process, read into memory and the files removed). Every server stops
//! when dropped; every wait is bounded.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

use crate::health::spec::TlsCheck;

/// How long a test server waits for a request before giving up on it.
const REQUEST_WAIT: Duration = Duration::from_secs(5);

/// The PEM files of `make-certs.sh`, by name (`ca.pem`, `good.key`...).
pub(crate) fn pem(name: &str) -> &'static [u8] {
    static CERTS: OnceLock<HashMap<String, Vec<u8>>> = OnceLock::new();
    let certs = CERTS.get_or_init(|| {
        let dir = TempDir::new("certs");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/tls/make-certs.sh");
        let status = std::process::Command::new("sh")
            .arg(script)
            .arg(&dir.0)
            .status()
            .expect("run make-certs.sh (needs the openssl CLI)");
        assert!(status.success(), "make-certs.sh failed: {status}");
        std::fs::read_dir(&dir.0)
            .expect("read the certificate directory")
            .map(|e| {
                let path = e.expect("directory entry").path();
                let name = path.file_name().expect("a file name").to_string_lossy();
                (
                    name.into_owned(),
                    std::fs::read(&path).expect("read a PEM file"),
                )
            })
            .collect()
    });
    certs.get(name).unwrap_or_else(|| panic!("no {name} made"))
}

/// A directory under the system's temporary directory, removed on drop.
pub(crate) struct TempDir(pub PathBuf);

impl TempDir {
    pub(crate) fn new(what: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("xlb-tls-test-{}-{what}-{n}", std::process::id()));
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        Self(path)
    }

    /// Writes `bytes` to `name` in the directory; returns its path.
    pub(crate) fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, bytes).expect("write a temporary file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A check trusting the lab CA (written to `dir`), expecting `name`.
pub(crate) fn lab_ca_check(dir: &TempDir, name: Option<&str>) -> TlsCheck {
    TlsCheck {
        verify: true,
        ca_file: Some(dir.file("ca.pem", pem("ca.pem"))),
        server_name: name.map(str::to_owned),
    }
}

fn cert_chain(name: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem(&format!("{name}.pem")))
        .collect::<Result<_, _>>()
        .expect("PEM certificate")
}

fn server_config(cert: &str) -> ServerConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = PrivateKeyDer::from_pem_slice(pem(&format!("{cert}.key"))).expect("PEM key");
    ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(cert_chain(cert), key)
        .expect("certificate and key")
}

/// What a [`TlsServer`] does after its handshake.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Serve {
    /// Answers each request with `200 OK` and a 2-byte body, keeping the
    /// connection alive unless asked to close.
    Http,
    /// Answers `503`.
    Fail,
    /// Answers `200 OK` as `Http` (without `Connection: close`), then
    /// closes the connection (`close_notify`, FIN): a server's idle timeout
    /// at its shortest.
    AnswerThenClose,
    /// Completes the handshake and never answers.
    Hang,
    /// Starts each handshake this late, then serves as `Http`: a slow
    /// server, not a hung one.
    SlowHandshake(Duration),
    /// Speaks only HTTP/2 (ALPN `h2`): a client offering only other
    /// protocols gets the server's `no_application_protocol` alert.
    H2Only,
}

/// A rustls server with certificate `cert` (a name of `make-certs.sh`).
pub(crate) struct TlsServer {
    pub addr: SocketAddr,
    /// TCP connections accepted.
    pub connections: Arc<AtomicUsize>,
    /// TLS handshakes completed.
    pub handshakes: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl TlsServer {
    pub(crate) async fn start(cert: &str, serve: Serve) -> Self {
        let mut config = server_config(cert);
        if matches!(serve, Serve::H2Only) {
            config.alpn_protocols = vec![b"h2".to_vec()];
        }
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local_addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let handshakes = Arc::new(AtomicUsize::new(0));
        let (c, h) = (Arc::clone(&connections), Arc::clone(&handshakes));
        let task = tokio::spawn(async move {
            // Owned here, so that aborting the accept loop drops every
            // connection's task too.
            let mut tasks = JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let (acceptor, h) = (acceptor.clone(), Arc::clone(&h));
                tasks.spawn(async move {
                    if let Serve::SlowHandshake(delay) = serve {
                        tokio::time::sleep(delay).await;
                    }
                    let Ok(Ok(stream)) =
                        tokio::time::timeout(REQUEST_WAIT, acceptor.accept(tcp)).await
                    else {
                        return;
                    };
                    h.fetch_add(1, Ordering::SeqCst);
                    serve_http(stream, serve).await;
                });
            }
        });
        Self {
            addr,
            connections,
            handshakes,
            task,
        }
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_http<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, serve: Serve) {
    loop {
        let Some(request) = crate::health::testutil::read_request(&mut stream).await else {
            return;
        };
        let answer: &[u8] = match serve {
            Serve::Http | Serve::SlowHandshake(_) | Serve::AnswerThenClose => {
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
            }
            Serve::Fail => b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
            Serve::Hang | Serve::H2Only => {
                tokio::time::sleep(REQUEST_WAIT).await;
                return;
            }
        };
        if stream.write_all(answer).await.is_err() {
            return;
        }
        let text = String::from_utf8_lossy(&request).to_ascii_lowercase();
        if text.contains("connection: close") || matches!(serve, Serve::AnswerThenClose) {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

/// A TCP server that reads what the client sends first (its ClientHello),
/// answers `reply` and then closes (`close`) or holds the connection: a
/// server that is not TLS, or a broken one.
pub(crate) struct RawServer {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl RawServer {
    pub(crate) async fn start(reply: &'static [u8], close: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local_addr");
        let task = tokio::spawn(async move {
            let mut tasks = JoinSet::new();
            while let Ok((mut tcp, _)) = listener.accept().await {
                tasks.spawn(async move {
                    let mut hello = [0u8; 4096];
                    let _ = tokio::time::timeout(REQUEST_WAIT, tcp.read(&mut hello)).await;
                    let _ = tcp.write_all(reply).await;
                    if !close {
                        tokio::time::sleep(REQUEST_WAIT).await;
                    }
                });
            }
        });
        Self { addr, task }
    }
}

impl Drop for RawServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
