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
                source: e,
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
                source: e,
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
            return Err(CtlError::BadResponse {
                path: self.path.clone(),
                reason,
            });
        }
        parse_response(&line)
            .map(Some)
            .map_err(|reason| CtlError::BadResponse {
                path: self.path.clone(),
                reason,
            })
    }
}

fn connect_error(path: &Path, e: io::Error) -> CtlError {
    let path = path.to_owned();
    match e.kind() {
        // No file, or a file nobody listens on (a daemon that died).
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => CtlError::NotRunning { path },
        io::ErrorKind::PermissionDenied => CtlError::PermissionDenied { path },
        _ => CtlError::Io {
            what: "connecting to",
            path,
            source: e,
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
        let path = Path::new("/run/xlb/xlb.sock");
        let cases = [
            (
                "missing",
                io::ErrorKind::NotFound,
                "no xlb daemon listening on /run/xlb/xlb.sock: is `xlb run` running? (--socket to choose another)",
            ),
            (
                "stale",
                io::ErrorKind::ConnectionRefused,
                "no xlb daemon listening on /run/xlb/xlb.sock: is `xlb run` running? (--socket to choose another)",
            ),
            (
                "permission",
                io::ErrorKind::PermissionDenied,
                "permission denied on /run/xlb/xlb.sock: run as root, or as a member of the daemon's socket_group",
            ),
            (
                "other",
                io::ErrorKind::InvalidInput,
                "connecting to /run/xlb/xlb.sock: boom",
            ),
        ];
        for (name, kind, want) in cases {
            let e = connect_error(path, io::Error::new(kind, "boom"));
            assert_eq!(e.to_string(), want, "{name}");
        }
    }
}
