//! The HTTP endpoint: `GET /metrics` (and `HEAD`) over HTTP/1.1, one
//! request per connection, `GET /status`, the JSON of `xlb status
//! --json` that other nodes' `xlb peers` read, `GET /events?since=N`, the
//! JSON of `xlb events --json --since N` (see `events`), and the status
//! page at `GET /` ([`super::page`]). It names every VIP and
//! backend, so it serves strangers nothing else, is read-only, caps the
//! request head and the connections served at once, and gives slow or
//! silent clients a few seconds at most.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::timeout;
use tracing::{debug, warn};

use super::{MetricsError, MetricsSource, render};

/// Timeouts and sizes of the HTTP endpoint.
#[derive(Clone, Copy, Debug)]
struct Limits {
    /// A client must send its request head within this.
    read: Duration,
    /// And accept the response within this.
    write: Duration,
}

const LIMITS: Limits = Limits {
    read: Duration::from_secs(5),
    write: Duration::from_secs(10),
};

/// Largest request head read; a scraper sends a few hundred bytes.
const MAX_HEAD: usize = 8 * 1024;

/// Scrapes served at once; more are closed at once.
const MAX_CONNECTIONS: usize = 16;

/// Serves `GET /metrics` on `addr` until the future is dropped. Fails only
/// if `addr` cannot be bound.
pub async fn serve(addr: SocketAddr, source: Arc<dyn MetricsSource>) -> Result<(), MetricsError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| MetricsError::Bind { addr, source: e })?;
    serve_listener(listener, source).await;
    Ok(())
}

/// Serves `GET /metrics` on a bound listener until the future is dropped.
pub async fn serve_listener(listener: TcpListener, source: Arc<dyn MetricsSource>) {
    serve_with(listener, source, LIMITS).await;
}

async fn serve_with(listener: TcpListener, source: Arc<dyn MetricsSource>, limits: Limits) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // Over the limit: dropping the stream closes it.
                    if let Ok(permit) = slots.clone().try_acquire_owned() {
                        let source = source.clone();
                        connections.spawn(async move {
                            if let Err(e) = scrape(stream, &*source, limits).await {
                                debug!("metrics: {peer}: {e}");
                            }
                            drop(permit);
                        });
                    }
                }
                Err(e) => {
                    warn!("metrics: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next() => {}
        }
    }
}

/// Answers one HTTP request and closes the connection.
async fn scrape(
    mut stream: TcpStream,
    source: &dyn MetricsSource,
    limits: Limits,
) -> io::Result<()> {
    let request = timeout(limits.read, read_request(&mut stream))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no request in time"))??;
    let response = respond(request, source);
    timeout(limits.write, async {
        stream.write_all(&response).await?;
        stream.shutdown().await
    })
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "response not read in time"))??;
    // Closing with unread request bytes would send an RST, which can destroy
    // the response in flight (an oversized head): read them away first,
    // boundedly.
    let _ = timeout(limits.read, async {
        let mut chunk = [0u8; 1024];
        let mut drained = 0;
        while drained < 64 * 1024 {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
    Ok(())
}

/// What a client asked, as far as the endpoint cares.
enum Request {
    /// A complete request head.
    Http { method: String, target: String },
    /// Bytes that are not an HTTP request: answered as any path but
    /// `/metrics` is.
    NotHttp,
    /// Over [`MAX_HEAD`] bytes and still not a complete head.
    TooLarge,
}

/// Reads until the request head is complete, malformed or too large.
async fn read_request(stream: &mut TcpStream) -> io::Result<Request> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(request) = parse_request(&head) {
            return Ok(request);
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed mid-request",
            ));
        }
        head.extend_from_slice(&chunk[..n]);
    }
}

/// The request in `head`, or `None` while it may still become one.
fn parse_request(head: &[u8]) -> Option<Request> {
    // One slot per line: a head cannot hold more headers than lines, so
    // httparse never runs out of slots.
    let lines = head.iter().filter(|&&b| b == b'\n').count();
    let mut slots = vec![httparse::EMPTY_HEADER; lines];
    let mut request = httparse::Request::new(&mut slots);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => Some(Request::Http {
            method: request.method.unwrap_or_default().to_owned(),
            target: request.path.unwrap_or_default().to_owned(),
        }),
        Err(_) => Some(Request::NotHttp),
        Ok(httparse::Status::Partial) if head.len() > MAX_HEAD => Some(Request::TooLarge),
        Ok(httparse::Status::Partial) => None,
    }
}

fn respond(request: Request, source: &dyn MetricsSource) -> Vec<u8> {
    let (method, target) = match request {
        Request::Http { method, target } => (method, target),
        Request::NotHttp => Default::default(),
        Request::TooLarge => {
            return plain(
                431,
                "Request Header Fields Too Large",
                "request head too large\n",
                &[],
            );
        }
    };
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    if path == "/" {
        return super::page::respond(&method);
    }
    if path == "/events" {
        return super::events::respond(&method, query, source);
    }
    let json = match path {
        "/metrics" => false,
        "/status" => true,
        _ => {
            return plain(
                404,
                "Not Found",
                "not found; metrics are at /metrics, the status at /status, events at /events, \
                 the status page at /\n",
                &[],
            );
        }
    };
    match method.as_str() {
        "GET" | "HEAD" => {
            let (status, extra) = source.snapshot();
            let (body, content_type) = if json {
                match serde_json::to_string_pretty(&status) {
                    Ok(mut body) => {
                        body.push('\n');
                        (body, "application/json")
                    }
                    Err(e) => {
                        let why = format!("cannot encode the status: {e}\n");
                        return plain(500, "Internal Server Error", &why, &[]);
                    }
                }
            } else {
                (
                    render(&status, &extra),
                    "text/plain; version=0.0.4; charset=utf-8",
                )
            };
            ok(&method, content_type, &body)
        }
        _ => plain(
            405,
            "Method Not Allowed",
            "only GET and HEAD\n",
            &["Allow: GET, HEAD"],
        ),
    }
}

/// A 200 answer of `body` (its head alone for `HEAD`).
pub(super) fn ok(method: &str, content_type: &str, body: &str) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method == "GET" {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

pub(super) fn plain(code: u16, reason: &str, body: &str, headers: &[&str]) -> Vec<u8> {
    let mut out =
        format!("HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n");
    for h in headers {
        out.push_str(h);
        out.push_str("\r\n");
    }
    out.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::StatusReport;
    use crate::ctl::tests::sample_report;
    use crate::metrics::MetricsExtra;
    use crate::metrics::tests::sample_extra;

    struct Fixed;

    impl MetricsSource for Fixed {
        fn snapshot(&self) -> (StatusReport, MetricsExtra) {
            (sample_report(), sample_extra())
        }
    }

    async fn start(limits: Limits) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (
            addr,
            tokio::spawn(serve_with(listener, Arc::new(Fixed), limits)),
        )
    }

    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut out = Vec::new();
        timeout(Duration::from_secs(5), s.read_to_end(&mut out))
            .await
            .expect("response within 5 s")
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn http_endpoint() {
        let (addr, task) = start(LIMITS).await;
        let ok = exchange(
            addr,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n",
        )
        .await;
        let (head, body) = ok.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"),
            "{head}"
        );
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        assert_eq!(body, render(&sample_report(), &sample_extra()));

        let cases: &[(&str, &[u8], &str, &str)] = &[
            (
                "query string",
                b"GET /metrics?x=1 HTTP/1.0\n\n",
                "HTTP/1.1 200 OK",
                "xlb_info",
            ),
            (
                "head",
                b"HEAD /metrics HTTP/1.1\r\n\r\n",
                "HTTP/1.1 200 OK",
                "",
            ),
            (
                "other path",
                b"GET /nope HTTP/1.1\r\n\r\n",
                "HTTP/1.1 404 Not Found",
                "metrics are at /metrics",
            ),
            (
                "status page",
                b"GET / HTTP/1.1\r\n\r\n",
                "HTTP/1.1 200 OK",
                "<title>xlb status</title>",
            ),
            (
                "status page is read-only",
                b"POST / HTTP/1.1\r\n\r\n",
                "HTTP/1.1 405 Method Not Allowed",
                "only GET",
            ),
            (
                "other method",
                b"POST /metrics HTTP/1.1\r\n\r\n",
                "HTTP/1.1 405 Method Not Allowed",
                "only GET",
            ),
            (
                "garbage",
                b"\x00\x01\x02\r\n\r\n",
                "HTTP/1.1 404 Not Found",
                "",
            ),
        ];
        for (name, req, status, body_part) in cases {
            let resp = exchange(addr, req).await;
            assert!(resp.starts_with(status), "{name}: {resp}");
            let body = resp.split_once("\r\n\r\n").unwrap().1;
            assert!(body.contains(body_part), "{name}: {resp}");
            if *name == "head" {
                assert_eq!(body, "", "{name}");
            }
        }
        // The same limit guards /status and the page.
        let huge_page = [b"GET / HTTP/1.1\r\nX: ".as_slice(), &[b'a'; MAX_HEAD + 10]].concat();
        let resp = exchange(addr, &huge_page).await;
        assert!(resp.starts_with("HTTP/1.1 431"), "{resp}");
        let huge_status = [
            b"GET /status HTTP/1.1\r\nX: ".as_slice(),
            &[b'a'; MAX_HEAD + 10],
        ]
        .concat();
        let resp = exchange(addr, &huge_status).await;
        assert!(resp.starts_with("HTTP/1.1 431"), "{resp}");
        let huge = [
            b"GET /metrics HTTP/1.1\r\nX: ".as_slice(),
            &[b'a'; MAX_HEAD + 10],
        ]
        .concat();
        let resp = exchange(addr, &huge).await;
        assert!(resp.starts_with("HTTP/1.1 431"), "{resp}");
        task.abort();
    }

    #[tokio::test]
    async fn status_endpoint_serves_the_status_json() {
        let (addr, task) = start(LIMITS).await;
        let ok = exchange(addr, b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let (head, body) = ok.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains("Content-Type: application/json\r\n"),
            "{head}"
        );
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        // What `xlb status --json` prints for the same report.
        let want = serde_json::to_string_pretty(&sample_report()).unwrap() + "\n";
        assert_eq!(body, want);
        let parsed: StatusReport = serde_json::from_str(body).unwrap();
        assert_eq!(parsed, sample_report());

        let cases: &[(&str, &[u8], &str)] = &[
            (
                "query string",
                b"GET /status?x=1 HTTP/1.0\n\n",
                "HTTP/1.1 200 OK",
            ),
            ("head", b"HEAD /status HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK"),
            (
                "read-only",
                b"POST /status HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
                "HTTP/1.1 405 Method Not Allowed",
            ),
            ("put", b"PUT /status HTTP/1.1\r\n\r\n", "HTTP/1.1 405"),
            (
                "a path below it",
                b"GET /status/x HTTP/1.1\r\n\r\n",
                "HTTP/1.1 404",
            ),
        ];
        for (name, req, status) in cases {
            let resp = exchange(addr, req).await;
            assert!(resp.starts_with(status), "{name}: {resp}");
            if *name == "head" {
                assert_eq!(resp.split_once("\r\n\r\n").unwrap().1, "", "{name}");
            }
        }
        task.abort();
    }

    #[tokio::test]
    async fn events_endpoint_is_served_under_the_same_limits() {
        let (addr, task) = start(LIMITS).await;
        // (name, request, status line, body)
        let cases: &[(&str, &[u8], &str, &str)] = &[
            (
                "a source without events",
                b"GET /events?since=3 HTTP/1.1\r\n\r\n",
                "HTTP/1.1 200 OK",
                "[]\n",
            ),
            (
                "bad since",
                b"GET /events?since=x HTTP/1.1\r\n\r\n",
                "HTTP/1.1 400 Bad Request",
                "since=\"x\" is not an event number",
            ),
            (
                "read-only",
                b"DELETE /events HTTP/1.1\r\n\r\n",
                "HTTP/1.1 405",
                "only GET",
            ),
        ];
        for (name, req, status, body_part) in cases {
            let resp = exchange(addr, req).await;
            assert!(resp.starts_with(status), "{name}: {resp}");
            let body = resp.split_once("\r\n\r\n").unwrap().1;
            assert!(body.starts_with(body_part), "{name}: {resp}");
        }
        let huge = [
            b"GET /events?since=1 HTTP/1.1\r\nX: ".as_slice(),
            &[b'a'; MAX_HEAD + 10],
        ]
        .concat();
        let resp = exchange(addr, &huge).await;
        assert!(resp.starts_with("HTTP/1.1 431"), "{resp}");
        task.abort();
    }

    #[tokio::test]
    async fn silent_clients_are_dropped() {
        let (addr, task) = start(Limits {
            read: Duration::from_millis(200),
            write: Duration::from_millis(200),
        })
        .await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metr").await.unwrap();
        let mut out = Vec::new();
        let closed = timeout(Duration::from_secs(5), s.read_to_end(&mut out))
            .await
            .expect("closed within 5 s");
        assert!(
            matches!(&closed, Ok(0))
                || matches!(&closed, Err(e) if e.kind() == io::ErrorKind::ConnectionReset),
            "closed without an answer: {closed:?} {out:?}"
        );
        // The endpoint still serves others.
        let ok = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK"));
        task.abort();
    }

    #[tokio::test]
    async fn bind_error_says_what_to_do() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let err = serve(addr, Arc::new(Fixed)).await.unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("cannot serve metrics on {addr}: ")),
            "{msg}"
        );
        assert!(
            msg.ends_with(
                "set daemon.metrics_address to a free address, or to \"\" to disable metrics"
            ),
            "{msg}"
        );
    }
}
