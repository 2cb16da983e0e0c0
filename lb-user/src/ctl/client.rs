//! The CLI's end of the control socket.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::timeout;

use super::{CtlError, Request, Response, parse_response};

/// How long [`Client::connect`] waits for the daemon to accept.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long [`request`] waits for the whole exchange. A reload of many VIPs
/// rebuilds every table, so this is generous.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest response line accepted: a status of 4095 backends is a few MiB.
const MAX_RESPONSE: usize = 64 * 1024 * 1024;

/// One connection to the daemon.
pub struct Client {
    path: PathBuf,
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

impl Client {
    /// Connects to the daemon listening on `path`.
    pub async fn connect(path: &Path) -> Result<Client, CtlError> {
        let stream = match timeout(CONNECT_TIMEOUT, UnixStream::connect(path)).await {
            Err(_) => {
                return Err(CtlError::Timeout {
                    path: path.to_owned(),
                    timeout: CONNECT_TIMEOUT,
                });
            }
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(connect_error(path, e)),
        };
        let (rd, wr) = stream.into_split();
        Ok(Client {
            path: path.to_owned(),
            reader: BufReader::new(rd),
            writer: wr,
        })
    }

    /// Sends one request.
    pub async fn send(&mut self, req: &Request) -> Result<(), CtlError> {
        self.writer
            .write_all(req.to_line().as_bytes())
            .await
            .map_err(|e| CtlError::Io {
                what: "sending a request to",
                path: self.path.clone(),
                error: e,
            })
    }

    /// Waits (without a time limit: wrap it in one) for the next response;
    /// `None` when the daemon closed the connection.
    pub async fn recv(&mut self) -> Result<Option<Response>, CtlError> {
        let mut line = Vec::new();
        let n = (&mut self.reader)
            .take(MAX_RESPONSE as u64)
            .read_until(b'\n', &mut line)
            .await
            .map_err(|e| CtlError::Io {
                what: "reading a response from",
                path: self.path.clone(),
                error: e,
            })?;
        if n == 0 {
            return Ok(None);
        }
        if line.last() != Some(&b'\n') {
            let reason = if n >= MAX_RESPONSE {
                format!("a line longer than {MAX_RESPONSE} bytes")
            } else {
                "the connection closed in the middle of a line".to_owned()
            };
            return Err(bad_response(&self.path, &line, reason));
        }
        parse_response(&line)
            .map(Some)
            .map_err(|reason| bad_response(&self.path, &line, reason))
    }
}

/// An answer that is not a JSON object with a `"version"` is not from an
/// xlb daemon: the parser's own message would advise the sender ("send one
/// JSON object per line"), which is no help to whoever runs the CLI.
fn bad_response(path: &Path, line: &[u8], reason: String) -> CtlError {
    let xlb = serde_json::from_slice::<serde_json::Value>(line)
        .ok()
        .is_some_and(|v| v.get("version").is_some());
    if xlb {
        return CtlError::BadResponse {
            path: path.to_owned(),
            reason,
        };
    }
    const SHOWN: usize = 40;
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end();
    let mut shown: String = text.chars().take(SHOWN).collect();
    if text.chars().count() > SHOWN {
        shown.push('…');
    }
    CtlError::NotXlb {
        path: path.to_owned(),
        what: format!("it answered {shown:?}"),
    }
}

fn connect_error(path: &Path, e: io::Error) -> CtlError {
    use std::os::unix::fs::FileTypeExt as _;
    let path = path.to_owned();
    // connect(2) says ECONNREFUSED for a file that is not a socket, as for
    // a socket nobody listens on: tell them apart by looking.
    if let Ok(meta) = std::fs::metadata(&path)
        && !meta.file_type().is_socket()
    {
        let kind = if meta.is_dir() {
            "a directory"
        } else if meta.is_file() {
            "a regular file"
        } else {
            "a special file"
        };
        return CtlError::NotASocketHere { path, kind };
    }
    // A datagram socket (journald's /dev/log, systemd's notify socket).
    if e.raw_os_error() == Some(libc::EPROTOTYPE) {
        return CtlError::NotXlb {
            path,
            what: "it is a datagram socket".to_owned(),
        };
    }
    match e.kind() {
        // No file, or a file nobody listens on (a daemon that died).
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => CtlError::NotRunning { path },
        io::ErrorKind::PermissionDenied => CtlError::PermissionDenied { path },
        _ => CtlError::Io {
            what: "connecting to",
            path,
            error: e,
        },
    }
}

/// Sends `req` to the daemon on `path` and returns its answer, all within
/// [`REQUEST_TIMEOUT`]. For `events` with `follow`, this returns only the
/// first line: use [`Client`] to read the stream.
pub async fn request(path: &Path, req: &Request) -> Result<Response, CtlError> {
    let exchange = async {
        let mut client = Client::connect(path).await?;
        client.send(req).await?;
        client.recv().await?.ok_or_else(|| CtlError::Closed {
            path: path.to_owned(),
        })
    };
    timeout(REQUEST_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| {
            Err(CtlError::Timeout {
                path: path.to_owned(),
                timeout: REQUEST_TIMEOUT,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_errors_say_what_to_do() {
        // A path that does not exist, so that only the error decides.
        let path = Path::new("/run/xlb-none/xlb.sock");
        let cases = [
            (
                "missing",
                io::ErrorKind::NotFound,
                "no xlb daemon listening on /run/xlb-none/xlb.sock: is `xlb run` running? (--socket, --instance or --config to choose another)",
            ),
            (
                "stale",
                io::ErrorKind::ConnectionRefused,
                "no xlb daemon listening on /run/xlb-none/xlb.sock: is `xlb run` running? (--socket, --instance or --config to choose another)",
            ),
            (
                "permission",
                io::ErrorKind::PermissionDenied,
                "permission denied on /run/xlb-none/xlb.sock: run as root, or as a member of the daemon's socket_group",
            ),
            (
                "other",
                io::ErrorKind::InvalidInput,
                "connecting to /run/xlb-none/xlb.sock: boom",
            ),
        ];
        for (name, kind, want) in cases {
            let e = connect_error(path, io::Error::new(kind, "boom"));
            assert_eq!(e.to_string(), want, "{name}");
        }
    }

    /// A directory of this test process, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("xlb-client-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn an_io_error_is_said_once() {
        let e = CtlError::Io {
            what: "sending a request to",
            path: "/run/xlb/xlb.sock".into(),
            error: io::Error::from_raw_os_error(libc::EPIPE),
        };
        assert_eq!(
            format!("{:#}", anyhow::Error::from(e)),
            "sending a request to /run/xlb/xlb.sock: Broken pipe (os error 32)"
        );
    }

    #[tokio::test]
    async fn a_file_or_a_directory_is_not_a_socket() {
        let dir = TempDir::new("notsock");
        let file = dir.0.join("file");
        std::fs::write(&file, "").unwrap();
        for (path, kind) in [(&file, "a regular file"), (&dir.0, "a directory")] {
            let e = request(path, &Request::Status).await.err().unwrap();
            assert_eq!(
                e.to_string(),
                format!(
                    "{} is {kind}, not a socket: give --socket the daemon's control socket (its \
                     daemon.control_socket, default /run/xlb/xlb.sock), or --instance NAME or \
                     --config FILE",
                    path.display()
                )
            );
        }
    }

    /// A Unix socket served by something else: an HTTP server, a server that
    /// hangs up, a datagram socket.
    #[tokio::test]
    async fn a_socket_of_something_else_is_named_so() {
        let dir = TempDir::new("other");
        let http = dir.0.join("http.sock");
        let listener = tokio::net::UnixListener::bind(&http).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 256];
            let _ = s.read(&mut buf).await;
            s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                .await
                .unwrap();
        });
        let e = request(&http, &Request::Status).await.err().unwrap();
        server.await.unwrap();
        let advice = "is it the daemon's control socket? Give --socket the path of \
                      daemon.control_socket, or --instance NAME or --config FILE";
        assert_eq!(
            e.to_string(),
            format!(
                "{} does not speak xlb's control protocol (it answered \"HTTP/1.1 400 Bad \
                 Request\"); {advice}",
                http.display()
            )
        );

        let dgram = dir.0.join("dgram.sock");
        let _socket = std::os::unix::net::UnixDatagram::bind(&dgram).unwrap();
        let e = request(&dgram, &Request::Status).await.err().unwrap();
        assert_eq!(
            e.to_string(),
            format!(
                "{} does not speak xlb's control protocol (it is a datagram socket); {advice}",
                dgram.display()
            )
        );
    }

    #[tokio::test]
    async fn an_answer_of_json_without_a_version_is_not_xlb_but_one_with_is() {
        let dir = TempDir::new("json");
        let path = dir.0.join("json.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            for answer in [&b"{\"ok\":true}\n"[..], b"{\"version\":99}\n"] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 256];
                let _ = s.read(&mut buf).await;
                s.write_all(answer).await.unwrap();
            }
        });
        let first = request(&path, &Request::Status).await.err().unwrap();
        assert!(matches!(first, CtlError::NotXlb { .. }), "{first}");
        let second = request(&path, &Request::Status).await.err().unwrap();
        assert!(matches!(second, CtlError::BadResponse { .. }), "{second}");
        server.await.unwrap();
    }
}
