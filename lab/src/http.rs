//! Just enough HTTP/1.1 for the lab: request and response heads, bodies
//! delimited by `Content-Length` (or by close), keep-alive. No chunked
//! request bodies, no pipelining guarantees beyond in-order answers.

use std::{net::SocketAddr, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// Largest request or response head accepted (request line + headers).
pub const MAX_HEAD: usize = 16 * 1024;

/// Largest body read into memory.
pub const MAX_BODY: usize = 1024 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HttpError {
    #[error("malformed HTTP {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
    #[error("HTTP head larger than {MAX_HEAD} bytes")]
    HeadTooLarge,
    #[error("HTTP body of {len} bytes is larger than {MAX_BODY}")]
    BodyTooLarge { len: usize },
    #[error("unsupported HTTP feature: {what}")]
    Unsupported { what: String },
}

/// Position just past the blank line ending the head, if it is complete.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

fn parse_headers<'a>(
    lines: impl Iterator<Item = &'a str>,
    what: &'static str,
) -> Result<Vec<(String, String)>, HttpError> {
    let mut headers = Vec::new();
    for line in lines {
        if line.is_empty() {
            continue;
        }
        let (name, value) = line.split_once(':').ok_or_else(|| HttpError::Malformed {
            what,
            detail: format!("header line without ':': {line:?}"),
        })?;
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    Ok(headers)
}

fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn content_length(
    headers: &[(String, String)],
    what: &'static str,
) -> Result<Option<usize>, HttpError> {
    match find_header(headers, "content-length") {
        None => Ok(None),
        Some(v) => {
            let len: usize = v.parse().map_err(|_| HttpError::Malformed {
                what,
                detail: format!("Content-Length {v:?}"),
            })?;
            if len > MAX_BODY {
                return Err(HttpError::BodyTooLarge { len });
            }
            Ok(Some(len))
        }
    }
}

fn has_token(value: Option<&str>, token: &str) -> bool {
    value.is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// A parsed request line and headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    /// Path and query as sent, e.g. `/stream?interval_ms=100`.
    pub target: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    pub headers: Vec<(String, String)>,
}

impl RequestHead {
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// Value of query parameter `key` (no percent-decoding; the lab never
    /// needs it).
    pub fn query(&self, key: &str) -> Option<&str> {
        let (_, q) = self.target.split_once('?')?;
        q.split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// Whether the client wants the connection kept after the response
    /// (HTTP/1.1 default yes, HTTP/1.0 default no).
    pub fn keep_alive(&self) -> bool {
        let conn = self.header("connection");
        if self.minor_version == 0 {
            has_token(conn, "keep-alive")
        } else {
            !has_token(conn, "close")
        }
    }

    /// Body length announced by the request (0 if none).
    pub fn body_len(&self) -> Result<usize, HttpError> {
        if self.header("transfer-encoding").is_some() {
            return Err(HttpError::Unsupported {
                what: "Transfer-Encoding in a request".to_string(),
            });
        }
        Ok(content_length(&self.headers, "request")?.unwrap_or(0))
    }
}

/// Parses a request head at the start of `buf`. `Ok(None)` means more bytes
/// are needed; otherwise returns the head and the bytes it used.
pub fn parse_request_head(buf: &[u8]) -> Result<Option<(RequestHead, usize)>, HttpError> {
    let Some(end) = head_end(buf) else {
        return if buf.len() > MAX_HEAD {
            Err(HttpError::HeadTooLarge)
        } else {
            Ok(None)
        };
    };
    if end > MAX_HEAD {
        return Err(HttpError::HeadTooLarge);
    }
    let text = std::str::from_utf8(&buf[..end]).map_err(|_| HttpError::Malformed {
        what: "request",
        detail: "head is not UTF-8".to_string(),
    })?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or("");
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::Malformed {
            what: "request",
            detail: format!("request line {request_line:?}"),
        });
    };
    let minor_version = match version {
        "HTTP/1.1" => 1,
        "HTTP/1.0" => 0,
        _ => {
            return Err(HttpError::Unsupported {
                what: format!("version {version:?}"),
            });
        }
    };
    if method.is_empty() || !target.starts_with('/') {
        return Err(HttpError::Malformed {
            what: "request",
            detail: format!("request line {request_line:?}"),
        });
    }
    let headers = parse_headers(lines, "request")?;
    Ok(Some((
        RequestHead {
            method: method.to_string(),
            target: target.to_string(),
            minor_version,
            headers,
        },
        end,
    )))
}

/// A parsed status line and headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl ResponseHead {
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// Whether the server will close the connection after this response.
    pub fn closes(&self) -> bool {
        has_token(self.header("connection"), "close")
    }

    /// `Some(len)` for a `Content-Length` body, `None` for a body delimited by
    /// the connection closing.
    pub fn body_len(&self) -> Result<Option<usize>, HttpError> {
        if self.header("transfer-encoding").is_some() {
            return Err(HttpError::Unsupported {
                what: "Transfer-Encoding in a response".to_string(),
            });
        }
        content_length(&self.headers, "response")
    }
}

/// Parses a response head at the start of `buf`; like [`parse_request_head`].
pub fn parse_response_head(buf: &[u8]) -> Result<Option<(ResponseHead, usize)>, HttpError> {
    let Some(end) = head_end(buf) else {
        return if buf.len() > MAX_HEAD {
            Err(HttpError::HeadTooLarge)
        } else {
            Ok(None)
        };
    };
    let text = std::str::from_utf8(&buf[..end]).map_err(|_| HttpError::Malformed {
        what: "response",
        detail: "head is not UTF-8".to_string(),
    })?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
        return Err(HttpError::Malformed {
            what: "response",
            detail: format!("status line {status_line:?}"),
        });
    };
    if !version.starts_with("HTTP/1.") {
        return Err(HttpError::Malformed {
            what: "response",
            detail: format!("status line {status_line:?}"),
        });
    }
    let status = code.parse().map_err(|_| HttpError::Malformed {
        what: "response",
        detail: format!("status line {status_line:?}"),
    })?;
    let headers = parse_headers(lines, "response")?;
    Ok(Some((ResponseHead { status, headers }, end)))
}

/// Standard reason phrase for the status codes the lab sends.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// Serialises a response with a `Content-Length` body.
pub fn response(status: u16, headers: &[(&str, &str)], body: &[u8], keep_alive: bool) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (n, v) in headers {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out.push_str(&format!(
        "Content-Length: {}\r\nConnection: {}\r\n\r\n",
        body.len(),
        if keep_alive { "keep-alive" } else { "close" }
    ));
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// A complete response as read by [`read_response`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub head: ResponseHead,
    pub body: Vec<u8>,
}

/// Reads one response from `stream`. `buf` holds bytes already read and
/// keeps any bytes past this response. A close before the response is
/// complete is `UnexpectedEof`.
pub async fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Response> {
    let (head, used) = loop {
        if let Some(parsed) = parse_response_head(buf).map_err(std::io::Error::other)? {
            break parsed;
        }
        read_more(stream, buf).await?;
    };
    buf.drain(..used);
    let body = match head.body_len().map_err(std::io::Error::other)? {
        Some(len) => {
            while buf.len() < len {
                read_more(stream, buf).await?;
            }
            buf.drain(..len).collect()
        }
        None => {
            loop {
                let mut chunk = [0u8; 4096];
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    break;
                }
                if buf.len() + n > MAX_BODY {
                    return Err(std::io::Error::other(HttpError::BodyTooLarge {
                        len: buf.len() + n,
                    }));
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            std::mem::take(buf)
        }
    };
    Ok(Response { head, body })
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let mut chunk = [0u8; 4096];
    let n = stream.read(&mut chunk).await?;
    if n == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed before the response was complete",
        ));
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

/// One request on a fresh connection with `Connection: close`, bounded by
/// `timeout` overall. For admin calls and tests.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    timeout: Duration,
) -> std::io::Result<Response> {
    let work = async {
        let mut stream = TcpStream::connect(addr).await?;
        let req = format!(
            "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        read_response(&mut stream, &mut buf).await
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{method} http://{addr}{target}: no response within {timeout:?}"),
        )
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads() {
        struct Case {
            name: &'static str,
            input: &'static [u8],
            want: Result<Option<(&'static str, &'static str, bool, usize)>, ()>,
        }
        let cases = [
            Case {
                name: "simple get",
                input: b"GET /api HTTP/1.1\r\nHost: x\r\n\r\n",
                want: Ok(Some(("GET", "/api", true, 0))),
            },
            Case {
                name: "close",
                input: b"GET /api HTTP/1.1\r\nConnection: close\r\n\r\n",
                want: Ok(Some(("GET", "/api", false, 0))),
            },
            Case {
                name: "http/1.0 defaults to close",
                input: b"GET / HTTP/1.0\r\n\r\n",
                want: Ok(Some(("GET", "/", false, 0))),
            },
            Case {
                name: "http/1.0 keep-alive",
                input: b"GET / HTTP/1.0\r\nconnection: Keep-Alive\r\n\r\n",
                want: Ok(Some(("GET", "/", true, 0))),
            },
            Case {
                name: "body length",
                input: b"POST /fault/hang HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
                want: Ok(Some(("POST", "/fault/hang", true, 5))),
            },
            Case {
                name: "incomplete",
                input: b"GET /api HTTP/1.1\r\nHost: x\r\n",
                want: Ok(None),
            },
            Case {
                name: "garbage request line",
                input: b"HELLO\r\n\r\n",
                want: Err(()),
            },
            Case {
                name: "http/2 preface",
                input: b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
                want: Err(()),
            },
            Case {
                name: "header without colon",
                input: b"GET / HTTP/1.1\r\nbogus\r\n\r\n",
                want: Err(()),
            },
        ];
        for c in cases {
            let got = parse_request_head(c.input).map(|o| {
                o.map(|(h, _)| {
                    (
                        h.method.clone(),
                        h.target.clone(),
                        h.keep_alive(),
                        h.body_len().unwrap(),
                    )
                })
            });
            match (&got, &c.want) {
                (Ok(Some(g)), Ok(Some(w))) => {
                    assert_eq!((g.0.as_str(), g.1.as_str(), g.2, g.3), *w, "{}", c.name)
                }
                (Ok(None), Ok(None)) | (Err(_), Err(())) => {}
                _ => panic!("{}: got {got:?}", c.name),
            }
        }
    }

    #[test]
    fn oversized_head_is_rejected_before_it_completes() {
        let big = vec![b'a'; MAX_HEAD + 1];
        assert_eq!(parse_request_head(&big), Err(HttpError::HeadTooLarge));
    }

    #[test]
    fn query_parameters() {
        let (h, _) = parse_request_head(b"GET /stream?interval_ms=100&x=1 HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.path(), "/stream");
        assert_eq!(h.query("interval_ms"), Some("100"));
        assert_eq!(h.query("x"), Some("1"));
        assert_eq!(h.query("y"), None);
    }

    #[test]
    fn response_round_trip() {
        let bytes = response(503, &[("X-Backend", "b1")], b"down", false);
        let (head, used) = parse_response_head(&bytes).unwrap().unwrap();
        assert_eq!(head.status, 503);
        assert_eq!(head.header("x-backend"), Some("b1"));
        assert!(head.closes());
        assert_eq!(head.body_len(), Ok(Some(4)));
        assert_eq!(&bytes[used..], b"down");
    }
}
