//! Reading one HTTP/1.x response from a backend that may be broken in any
//! way, within a size cap and the probe's deadline: the final head (interim
//! 1xx heads skipped), then as much of the body as `body_contains` needs.
//!
//! Header lines are parsed by `httparse`. The status line is parsed here:
//! httparse knows only HTTP/1.0 and 1.1 (RFC 9112 §2.3 has a recipient treat
//! a later 1.x as the highest it implements, as this prober always has) and
//! names only "invalid status". When httparse rejects a header line, the
//! line is looked at again to say what is wrong with it: the text of a
//! [`FailReason::Malformed`] is what operators and alerts read, so each
//! distinct fault keeps its own words.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::time::{Instant, timeout_at};

use super::io_fail;
use super::outcome::FailReason;

/// Cap on the status line and headers (all of them, interim 1xx responses
/// included). Longer is treated as malformed: a health endpoint has no reason
/// to send more, and a hostile one must not make us buffer without bound.
pub const HEADER_LIMIT: usize = 8 * 1024;

/// How much of the body is read and searched for `body_contains`. The rest is
/// never read: the connection is closed instead.
pub const BODY_LIMIT: usize = 4 * 1024;

/// Cap on one chunk-size line (size and extensions) of a chunked body. Real
/// servers send a few hex digits; anything this long is an attack or a bug.
const CHUNK_LINE_LIMIT: usize = 256;

/// Cap on raw bytes read for a chunked body, framing included, so tiny chunks
/// with long extensions cannot make us read far more than `BODY_LIMIT`.
const CHUNKED_RAW_LIMIT: usize = 32 * 1024;

/// The reader's first allocation: room for a typical health response.
const INITIAL_BUFFER: usize = 1024;

/// Header slots parsed without an allocation; a head with more lines gets
/// a slot per line on the heap.
const STACK_HEADERS: usize = 16;

/// The response bytes received so far, with the deadline that bounds every
/// read, on a stream of any kind (TCP, TLS).
pub(super) struct Reader<S> {
    stream: S,
    /// Received, not yet consumed.
    buf: Vec<u8>,
    /// Total bytes received on this connection.
    received: usize,
    deadline: Instant,
    timeout: Duration,
}

impl<S: AsyncRead + Unpin> Reader<S> {
    /// A reader of the response on `stream`; reads end at `deadline`, and
    /// their failures name `timeout` (the probe's `hang_timeout`).
    pub(super) fn new(stream: S, deadline: Instant, timeout: Duration) -> Self {
        Self {
            stream,
            // A health answer is a few hundred bytes; the buffer grows
            // (up to the caps) only for the rare larger one.
            buf: Vec::with_capacity(INITIAL_BUFFER),
            received: 0,
            deadline,
            timeout,
        }
    }

    /// Reads at most `max` more bytes into `buf`; `Ok(0)` means the backend
    /// closed the connection.
    async fn fill(&mut self, max: usize) -> Result<usize, FailReason> {
        let mut chunk = [0u8; 4096];
        let want = max.min(chunk.len());
        debug_assert!(want > 0, "fill called with nothing to read");
        match timeout_at(self.deadline, self.stream.read(&mut chunk[..want])).await {
            Err(_elapsed) if self.received == 0 => Err(FailReason::NoResponse {
                timeout: self.timeout,
            }),
            Err(_elapsed) => Err(FailReason::Incomplete {
                timeout: self.timeout,
                received: self.received,
            }),
            Ok(Err(e)) => Err(io_fail(e, "reading the response")),
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                self.received += n;
                Ok(n)
            }
        }
    }

    /// The bytes received and not yet consumed.
    pub(super) fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// Total bytes received on this connection by this reader.
    pub(super) fn received(&self) -> usize {
        self.received
    }

    /// Reads until at least `n` bytes are buffered (never more than `n` are
    /// asked for), failing as [`Self::fill_more`] does.
    pub(super) async fn fill_to(&mut self, n: usize) -> Result<(), FailReason> {
        while self.buf.len() < n {
            self.fill_more(n - self.buf.len()).await?;
        }
        Ok(())
    }

    /// Ends reads at `at` if that is sooner than the probe's deadline.
    pub(super) fn cut_deadline(&mut self, at: Instant) {
        self.deadline = self.deadline.min(at);
    }

    /// The connection, for the next probe on it.
    pub(super) fn into_stream(self) -> S {
        self.stream
    }

    /// Like `fill`, but the backend closing the connection is an error.
    async fn fill_more(&mut self, max: usize) -> Result<(), FailReason> {
        if self.fill(max).await? == 0 {
            return Err(FailReason::Closed {
                received: self.received,
            });
        }
        Ok(())
    }

    /// Consumes one line (LF or CRLF terminated) of at most `limit` bytes.
    async fn read_line(&mut self, limit: usize, what: &str) -> Result<Vec<u8>, FailReason> {
        loop {
            if let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                if nl > limit {
                    return Err(FailReason::malformed(format!(
                        "{what} longer than {limit} bytes"
                    )));
                }
                let mut line: Vec<u8> = self.buf.drain(..=nl).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(line);
            }
            if self.buf.len() >= limit {
                return Err(FailReason::malformed(format!(
                    "{what} longer than {limit} bytes"
                )));
            }
            let room = limit + 2 - self.buf.len();
            self.fill_more(room).await?;
        }
    }
}

/// What the prober needs from a response head.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Head {
    pub(super) status: u16,
    framing: Framing,
    /// HTTP/1.1 or later without `Connection: close`: the server keeps the
    /// connection open after this response (RFC 9112 §9.3). HTTP/1.0 is
    /// taken as closing: the prober never asks 1.0 servers to keep alive.
    keep_alive: bool,
}

impl Head {
    /// The length of the body when the connection can carry another request
    /// after it: the server keeps it alive and the body's end is known and
    /// small (no body, or a `Content-Length` within [`BODY_LIMIT`]). `None`
    /// for a chunked or close-delimited body, or a larger one: such a
    /// connection is closed rather than read to its end.
    pub(super) fn reusable_body(&self, is_head: bool) -> Option<usize> {
        if !self.keep_alive {
            return None;
        }
        if is_head || self.status == 204 || self.status == 304 {
            return Some(0);
        }
        match self.framing {
            Framing::Length(n) => usize::try_from(n).ok().filter(|&n| n <= BODY_LIMIT),
            Framing::Chunked | Framing::UntilClose => None,
        }
    }
}

/// How the body's end is found (RFC 9112 §6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
}

/// Reads response heads until a final (non-1xx) one. Interim responses
/// (100 Continue, 103 Early Hints) are allowed before it, within the same
/// header budget.
pub(super) async fn read_final_head(
    reader: &mut Reader<impl AsyncRead + Unpin>,
) -> Result<Head, FailReason> {
    let mut consumed = 0;
    loop {
        let head = loop {
            if let Some(end) = head_end(&reader.buf) {
                if consumed + end > HEADER_LIMIT {
                    return Err(too_long());
                }
                let head = parse_head(&reader.buf[..end])?;
                reader.buf.drain(..end);
                consumed += end;
                break head;
            }
            let room = HEADER_LIMIT.saturating_sub(consumed + reader.buf.len());
            if room == 0 {
                return Err(too_long());
            }
            reader.fill_more(room).await?;
        };
        // 101 is final: we never asked to switch protocols, so it will fail
        // the status check as it should.
        if !(100..200).contains(&head.status) || head.status == 101 {
            return Ok(head);
        }
    }
}

fn too_long() -> FailReason {
    FailReason::malformed(format!("headers longer than {} KiB", HEADER_LIMIT / 1024))
}

/// End (exclusive) of the head in `buf`: just past the first empty line.
fn head_end(buf: &[u8]) -> Option<usize> {
    let mut start = 0;
    while let Some(off) = buf[start..].iter().position(|&b| b == b'\n') {
        let nl = start + off;
        let line = &buf[start..nl];
        if line.is_empty() || line == b"\r" {
            return Some(nl + 1);
        }
        start = nl + 1;
    }
    None
}

/// Parses a complete head (status line, headers, empty line). Strict where
/// leniency would let a broken backend pass: only HTTP/1.x, a three-digit
/// status in 100-599, token header names with the colon right after, no
/// control characters, no obsolete line folding, consistent framing headers.
fn parse_head(head: &[u8]) -> Result<Head, FailReason> {
    let nl = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let status = parse_status_line(strip_cr(&head[..nl]))?;
    let header_block = head.get(nl + 1..).unwrap_or_default();
    // One slot per line: a head cannot hold more headers than lines, so
    // httparse never runs out of slots.
    let lines = header_block.iter().filter(|&&b| b == b'\n').count();
    let mut stack = [httparse::EMPTY_HEADER; STACK_HEADERS];
    let mut heap = Vec::new();
    let slots: &mut [httparse::Header<'_>] = if lines <= STACK_HEADERS {
        &mut stack[..lines]
    } else {
        heap.resize(lines, httparse::EMPTY_HEADER);
        &mut heap
    };
    let framing = match httparse::parse_headers(header_block, slots) {
        Ok(httparse::Status::Complete((_, headers))) => (
            framing(headers)?,
            !head.starts_with(b"HTTP/1.0") && !closes(headers),
        ),
        // A complete head never parses as partial; treat it as rejected.
        Ok(httparse::Status::Partial) | Err(_) => return Err(header_fault(header_block)),
    };
    let (framing, keep_alive) = framing;
    Ok(Head {
        status,
        framing,
        keep_alive,
    })
}

/// Whether a `Connection` header lists `close`.
fn closes(headers: &[httparse::Header<'_>]) -> bool {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| h.value.split(|&b| b == b','))
        .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"))
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The first header line httparse rejects on its own, and why.
fn header_fault(header_block: &[u8]) -> FailReason {
    header_block
        .split(|&b| b == b'\n')
        .map(strip_cr)
        .filter(|line| !line.is_empty())
        .find_map(header_line_fault)
        .unwrap_or_else(|| FailReason::malformed("invalid headers"))
}

/// Why httparse rejects `line` (without its line end) as a header line, if
/// it does. The checks run in the order the prober has always reported them.
fn header_line_fault(line: &[u8]) -> Option<FailReason> {
    let alone = [line, b"\r\n\r\n"].concat();
    let error = httparse::parse_headers(&alone, &mut [httparse::EMPTY_HEADER; 1]).err()?;
    let reason = if line.contains(&b'\r') {
        "bare CR in headers".to_owned()
    } else if line.starts_with(b" ") || line.starts_with(b"\t") {
        "obsolete line folding in headers".to_owned()
    } else if error == httparse::Error::HeaderValue {
        "control character in a header value".to_owned()
    } else if let Some(colon) = line.iter().position(|&b| b == b':') {
        let name = &line[..colon];
        format!(
            "invalid header name {:?}",
            String::from_utf8_lossy(&name[..name.len().min(40)])
        )
    } else {
        "header line without a colon".to_owned()
    };
    Some(FailReason::malformed(reason))
}

/// How the body of a response with these headers ends.
fn framing(headers: &[httparse::Header<'_>]) -> Result<Framing, FailReason> {
    let mut content_length: Option<u64> = None;
    let mut transfer_encoding: Option<Vec<u8>> = None;
    for header in headers {
        let value = header.value.trim_ascii();
        if header.name.eq_ignore_ascii_case("content-length") {
            // "Content-Length: 5, 5" and repeated identical headers are
            // allowed (RFC 9110 §8.6); differing values are not.
            for part in value.split(|&b| b == b',') {
                let n = parse_decimal(part.trim_ascii())
                    .ok_or_else(|| FailReason::malformed("invalid Content-Length"))?;
                if content_length.is_some_and(|old| old != n) {
                    return Err(FailReason::malformed("conflicting Content-Length values"));
                }
                content_length = Some(n);
            }
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            let te = transfer_encoding.get_or_insert_with(Vec::new);
            if !te.is_empty() {
                te.push(b',');
            }
            te.extend_from_slice(value);
        }
    }
    Ok(if let Some(te) = transfer_encoding {
        // Transfer-Encoding overrides Content-Length (RFC 9112 §6.3). A
        // response whose last coding is not chunked runs until close.
        let last = te
            .rsplit(|&b| b == b',')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        if last.eq_ignore_ascii_case(b"chunked") {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else if let Some(n) = content_length {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    })
}

fn parse_status_line(line: &[u8]) -> Result<u16, FailReason> {
    let shown = || String::from_utf8_lossy(&line[..line.len().min(40)]).into_owned();
    let rest = line
        .strip_prefix(b"HTTP/")
        .ok_or_else(|| FailReason::malformed(format!("not an HTTP status line: {:?}", shown())))?;
    let [major, b'.', minor, b' ', d0, d1, d2, tail @ ..] = rest else {
        return Err(FailReason::malformed(format!(
            "invalid status line: {:?}",
            shown()
        )));
    };
    if *major != b'1' || !minor.is_ascii_digit() {
        return Err(FailReason::malformed(format!(
            "unsupported HTTP version in {:?}",
            shown()
        )));
    }
    // The reason phrase is optional; its separating space should be there,
    // but a bare "HTTP/1.1 200" is common enough and unambiguous.
    if !(tail.is_empty() || tail[0] == b' ') {
        return Err(FailReason::malformed(format!(
            "invalid status line: {:?}",
            shown()
        )));
    }
    if tail.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(FailReason::malformed(
            "control character in the reason phrase",
        ));
    }
    let digits = [*d0, *d1, *d2];
    if !digits.iter().all(u8::is_ascii_digit) {
        return Err(FailReason::malformed(format!(
            "invalid status code in {:?}",
            shown()
        )));
    }
    let status = digits
        .iter()
        .fold(0u16, |acc, d| acc * 10 + u16::from(d - b'0'));
    if !(100..=599).contains(&status) {
        return Err(FailReason::malformed(format!(
            "status code {status} out of range"
        )));
    }
    Ok(status)
}

fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    s.iter().try_fold(0u64, |acc, d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// Reads the first `BODY_LIMIT` bytes of the body (fewer if it ends sooner).
pub(super) async fn read_body(
    reader: &mut Reader<impl AsyncRead + Unpin>,
    head: &Head,
    is_head: bool,
) -> Result<Vec<u8>, FailReason> {
    if is_head || head.status == 204 || head.status == 304 {
        return Ok(Vec::new());
    }
    match head.framing {
        Framing::Length(n) => {
            let want = usize::try_from(n).unwrap_or(usize::MAX).min(BODY_LIMIT);
            while reader.buf.len() < want {
                let room = want - reader.buf.len();
                reader.fill_more(room).await?;
            }
            reader.buf.truncate(want);
            Ok(std::mem::take(&mut reader.buf))
        }
        Framing::UntilClose => {
            while reader.buf.len() < BODY_LIMIT {
                let room = BODY_LIMIT - reader.buf.len();
                if reader.fill(room).await? == 0 {
                    break;
                }
            }
            reader.buf.truncate(BODY_LIMIT);
            Ok(std::mem::take(&mut reader.buf))
        }
        Framing::Chunked => read_chunked(reader).await,
    }
}

async fn read_chunked(reader: &mut Reader<impl AsyncRead + Unpin>) -> Result<Vec<u8>, FailReason> {
    let raw_start = reader.received - reader.buf.len();
    let mut body = Vec::with_capacity(BODY_LIMIT);
    loop {
        if reader.received - raw_start > CHUNKED_RAW_LIMIT {
            // Framing overhead this large is odd but not wrong: judge the
            // body on what came.
            return Ok(body);
        }
        let line = reader
            .read_line(CHUNK_LINE_LIMIT, "chunk-size line")
            .await?;
        let size = parse_chunk_size(&line)?;
        if size == 0 {
            // Trailers, if any, are not needed.
            return Ok(body);
        }
        let mut remaining = size;
        while remaining > 0 && body.len() < BODY_LIMIT {
            if reader.buf.is_empty() {
                let want = usize::try_from(remaining)
                    .unwrap_or(usize::MAX)
                    .min(BODY_LIMIT - body.len());
                reader.fill_more(want).await?;
            }
            let take = usize::try_from(remaining)
                .unwrap_or(usize::MAX)
                .min(reader.buf.len())
                .min(BODY_LIMIT - body.len());
            body.extend(reader.buf.drain(..take));
            remaining -= take as u64;
        }
        if body.len() >= BODY_LIMIT {
            return Ok(body);
        }
        // Chunk data ends with CRLF (or a bare LF); anything else means the
        // chunk is longer than its size line said.
        while reader.buf.len() < 2 && reader.buf.first() != Some(&b'\n') {
            reader.fill_more(2 - reader.buf.len()).await?;
        }
        let terminator = if reader.buf[0] == b'\n' { 1 } else { 2 };
        if reader.buf[..terminator] != b"\r\n"[2 - terminator..] {
            return Err(FailReason::malformed("chunk data longer than its size"));
        }
        reader.buf.drain(..terminator);
    }
}

/// `1a`, `1A;name=value`: hex digits, then optional whitespace and extensions.
fn parse_chunk_size(line: &[u8]) -> Result<u64, FailReason> {
    let digits_end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    let (digits, rest) = line.split_at(digits_end);
    let rest = rest.trim_ascii_start();
    if digits.is_empty() || !(rest.is_empty() || rest[0] == b';') {
        return Err(FailReason::malformed("invalid chunk size"));
    }
    if digits.len() > 16 {
        return Err(FailReason::malformed("chunk size too large"));
    }
    let text =
        std::str::from_utf8(digits).map_err(|_| FailReason::malformed("invalid chunk size"))?;
    u64::from_str_radix(text, 16).map_err(|_| FailReason::malformed("invalid chunk size"))
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;

    /// Heads parsed without a backend: which ones pass, and the words for
    /// those that do not (the canned responses of the probe tests cover the
    /// rest through a real connection).
    #[test]
    fn heads() {
        type Parsed = Result<(u16, Framing), FailReason>;
        let malformed = |reason: &str| Err(FailReason::malformed(reason));
        let cases: &[(&str, &[u8], Parsed)] = &[
            (
                "later HTTP/1.x minor",
                b"HTTP/1.2 200 OK\r\n\r\n",
                Ok((200, Framing::UntilClose)),
            ),
            (
                "obs-text in a value",
                b"HTTP/1.1 200 OK\r\nX-A: caf\xc3\xa9\r\n\r\n",
                Ok((200, Framing::UntilClose)),
            ),
            (
                "tab in a value",
                b"HTTP/1.1 200 OK\r\nX-A: a\tb\r\nContent-Length: 3\r\n\r\n",
                Ok((200, Framing::Length(3))),
            ),
            (
                "chunked last",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
                Ok((200, Framing::Chunked)),
            ),
            (
                "chunked not last",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                Ok((200, Framing::UntilClose)),
            ),
            (
                "empty header name",
                b"HTTP/1.1 200 OK\r\n: x\r\n\r\n",
                malformed("invalid header name \"\""),
            ),
            (
                "control char, no colon",
                b"HTTP/1.1 200 OK\r\nNo\x01Colon\r\n\r\n",
                malformed("header line without a colon"),
            ),
            (
                "bad name before bad value",
                b"HTTP/1.1 200 OK\r\nX A: \x01\r\n\r\n",
                malformed("invalid header name \"X A\""),
            ),
            (
                "DEL in a value",
                b"HTTP/1.1 200 OK\r\nX-A: \x7f\r\n\r\n",
                malformed("control character in a header value"),
            ),
            (
                "first bad line wins",
                b"HTTP/1.1 200 OK\r\nX-A: \x01\r\nNoColon\r\n\r\n",
                malformed("control character in a header value"),
            ),
            (
                "status line before headers",
                b"HTTP/1.1 999 Odd\r\nNoColon\r\n\r\n",
                malformed("status code 999 out of range"),
            ),
            (
                "control char in the reason",
                b"HTTP/1.1 200 O\x01K\r\n\r\n",
                malformed("control character in the reason phrase"),
            ),
        ];
        for (name, head, want) in cases {
            let got = parse_head(head).map(|h| (h.status, h.framing));
            assert_eq!(&got, want, "{name}");
        }
    }

    /// Which responses leave a connection that can carry the next probe,
    /// and how much body must be read to stay in step.
    #[test]
    fn reusable_bodies() {
        // (name, head, HEAD request, want)
        let cases: &[(&str, &[u8], bool, Option<usize>)] = &[
            (
                "1.1 with a length",
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n",
                false,
                Some(2),
            ),
            (
                "no body: 204",
                b"HTTP/1.1 204 No Content\r\n\r\n",
                false,
                Some(0),
            ),
            (
                "no body: HEAD",
                b"HTTP/1.1 200 OK\r\nContent-Length: 99999\r\n\r\n",
                true,
                Some(0),
            ),
            (
                "body at the limit",
                b"HTTP/1.1 200 OK\r\nContent-Length: 4096\r\n\r\n",
                false,
                Some(4096),
            ),
            (
                "body over the limit",
                b"HTTP/1.1 200 OK\r\nContent-Length: 4097\r\n\r\n",
                false,
                None,
            ),
            (
                "Connection: close",
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n",
                false,
                None,
            ),
            (
                "close among tokens",
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nconnection: Upgrade, CLOSE\r\n\r\n",
                false,
                None,
            ),
            (
                "keep-alive token",
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n",
                false,
                Some(2),
            ),
            (
                "HTTP/1.0",
                b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n",
                false,
                None,
            ),
            (
                "chunked",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                false,
                None,
            ),
            ("until close", b"HTTP/1.1 200 OK\r\n\r\n", false, None),
        ];
        for &(name, head, is_head, want) in cases {
            let head = parse_head(head).expect(name);
            assert_eq!(head.reusable_body(is_head), want, "{name}");
        }
    }
}
