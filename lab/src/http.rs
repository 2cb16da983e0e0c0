//! Just enough HTTP/1.1 for the lab: request and response heads (parsed by
//! `httparse`), bodies delimited by `Content-Length` (or by close),
//! keep-alive. No chunked request bodies, no pipelining guarantees beyond
//! in-order answers. Responses are written by hand, and so can be wrong on
//! purpose where the backend's faults need them to be.

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

/// Header slots for parsing the head at the start of `buf`: one per line
/// within [`MAX_HEAD`], so a head within the cap never runs out of them.
fn header_slots(buf: &[u8]) -> Vec<httparse::Header<'static>> {
    let window = &buf[..buf.len().min(MAX_HEAD)];
    let lines = window.iter().filter(|&&b| b == b'\n').count();
    vec![httparse::EMPTY_HEADER; lines]
}

/// The length of the head at the start of `buf` once httparse has all of
/// it; `None` while more bytes may complete it.
fn head_len(
    parsed: httparse::Result<usize>,
    buf: &[u8],
    what: &'static str,
) -> Result<Option<usize>, HttpError> {
    let first_line = || {
        let line = buf.split(|&b| b == b'\n').next().unwrap_or_default();
        String::from_utf8_lossy(line.strip_suffix(b"\r").unwrap_or(line)).into_owned()
    };
    match parsed {
        Ok(httparse::Status::Complete(end)) if end <= MAX_HEAD => Ok(Some(end)),
        Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD => Ok(None),
        // Past the cap, complete or not; or more headers than there are
        // lines within the cap, which only a longer head can have.
        Ok(_) | Err(httparse::Error::TooManyHeaders) => Err(HttpError::HeadTooLarge),
        Err(httparse::Error::Version) => Err(HttpError::Unsupported {
            what: format!("version in {:?}", first_line()),
        }),
        Err(e) => Err(HttpError::Malformed {
            what,
            detail: format!("{e} (head starting {:?})", first_line()),
        }),
    }
}

/// The parsed headers as owned strings.
fn owned_headers(
    headers: &[httparse::Header<'_>],
    what: &'static str,
) -> Result<Vec<(String, String)>, HttpError> {
    headers
        .iter()
        .map(|h| {
            let value = std::str::from_utf8(h.value).map_err(|_| HttpError::Malformed {
                what,
                detail: "head is not UTF-8".to_string(),
            })?;
            Ok((h.name.to_string(), value.trim().to_string()))
        })
        .collect()
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
    let mut slots = header_slots(buf);
    let mut request = httparse::Request::new(&mut slots);
    let Some(end) = head_len(request.parse(buf), buf, "request")? else {
        return Ok(None);
    };
    let (method, target) = (
        request.method.unwrap_or_default(),
        request.path.unwrap_or_default(),
    );
    if !target.starts_with('/') {
        return Err(HttpError::Malformed {
            what: "request",
            detail: format!("request target {target:?} is not a path"),
        });
    }
    Ok(Some((
        RequestHead {
            method: method.to_string(),
            target: target.to_string(),
            minor_version: request.version.unwrap_or_default(),
            headers: owned_headers(request.headers, "request")?,
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
    let mut slots = header_slots(buf);
    let mut response = httparse::Response::new(&mut slots);
    let Some(end) = head_len(response.parse(buf), buf, "response")? else {
        return Ok(None);
    };
    let head = ResponseHead {
        status: response.code.unwrap_or_default(),
        headers: owned_headers(response.headers, "response")?,
    };
    Ok(Some((head, end)))
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
    let head = read_response_head(stream, buf).await?;
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

/// Reads one response head from `stream`. `buf` holds bytes already read
/// and keeps the bytes past the head (the start of the body). A close
/// before the head is complete is `UnexpectedEof`.
pub async fn read_response_head(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> std::io::Result<ResponseHead> {
    loop {
        if let Some((head, used)) = parse_response_head(buf).map_err(std::io::Error::other)? {
            buf.drain(..used);
            return Ok(head);
        }
        read_more(stream, buf).await?;
    }
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
                    assert_eq!((g.0.as_str(), g.1.as_str(), g.2, g.3), *w, "{}", c.name);
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
