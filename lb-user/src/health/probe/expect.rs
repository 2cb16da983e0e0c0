//! The send/expect probe (`kind = "tcp"` with `send`/`expect_*`, and
//! `kind = "udp"`), as HAProxy's `tcp-check send/expect`.
//!
//! TCP: connect (through the data path with `via = "vip"`, as every probe),
//! send the bytes if any, then read until the matcher passes, can no longer
//! pass (a prefix that diverged), `expect_max` bytes came, the backend
//! closed, or `hang_timeout`. A banner protocol (SMTP's `220`) needs no
//! send. This is what a plain TCP check cannot see: a Redis or memcached
//! whose process is stopped still has its kernel complete handshakes.
//!
//! UDP: one datagram sent, the first one back from exactly the backend's
//! address and port matched (any datagram passes without a matcher).
//!
//! Whatever the backend sends, at most `expect_max` bytes are read and kept,
//! and failure reasons show at most the first 64 of them, escaped.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::{Instant, timeout_at};

use super::outcome::{Compact, FailReason, ProbeOk};
use super::{Target, connect, io_fail};
use crate::health::spec::expect::{ExpectCheck, Matcher, Transport, Verdict, shown_answer};

/// Why a send/expect probe failed, beyond the connection failures every
/// TCP probe shares (refused, reset, connect timeout). `expected` is the
/// matcher as operators read it (`prefix "+PONG"`), `received` the first
/// bytes of the answer, escaped and quoted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExpectFail {
    /// Connected (and sent), but not one byte came within `hang_timeout`:
    /// the application is hung while its kernel still accepts.
    #[error("connected, no data within {}", Compact(*.timeout))]
    Silent { timeout: Duration },
    /// The answer cannot match: a prefix that diverged, or a datagram that
    /// does not match.
    #[error("answer does not match {expected}: received {received}")]
    Mismatch { expected: String, received: String },
    /// `expect_max` bytes came without a match.
    #[error("no match for {expected} in the first {max} bytes (expect_max); received {received}")]
    CapReached {
        expected: String,
        max: usize,
        received: String,
    },
    /// The backend closed the connection before a match.
    #[error("{}", closed_text(expected, *.len, received))]
    Closed {
        expected: String,
        len: usize,
        received: String,
    },
    /// Some bytes came, but no match within `hang_timeout`.
    #[error(
        "no match for {expected} within {} ({len} bytes received: {received})",
        Compact(*.timeout)
    )]
    NoMatch {
        expected: String,
        timeout: Duration,
        len: usize,
        received: String,
    },
}

fn closed_text(expected: &str, len: usize, received: &str) -> String {
    if len == 0 {
        "connection closed with no answer".to_owned()
    } else {
        format!(
            "connection closed after {len} bytes without a match for {expected}; received {received}"
        )
    }
}

impl ExpectFail {
    /// Stable snake_case identifier (see [`FailReason::code`]).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Silent { .. } => "no_data",
            Self::Mismatch { .. } => "expect_mismatch",
            Self::CapReached { .. } => "expect_cap_reached",
            Self::Closed { .. } => "closed_before_match",
            Self::NoMatch { .. } => "expect_timeout",
        }
    }
}

/// The probe of `check` to `to` (one call from `probe_to`).
pub(super) async fn probe(to: &Target<'_>, check: &ExpectCheck) -> Result<ProbeOk, FailReason> {
    if let Err(reason) = check.validate() {
        return Err(FailReason::InvalidCheck { reason });
    }
    match check.transport {
        Transport::Tcp => tcp(to, check).await,
        Transport::Udp => udp(to, check).await,
    }
    .map(|()| ProbeOk { status: None })
}

async fn tcp(to: &Target<'_>, check: &ExpectCheck) -> Result<(), FailReason> {
    let (deadline, limit) = (to.by.deadline, to.by.limit);
    let mut stream = connect(to.addr, to.path, deadline, limit).await?;
    to.note_connected();
    if let Some(send) = &check.send {
        // At most `MAX_SEND` bytes: they fit the socket send buffer, so
        // this completes even when the application never reads.
        match timeout_at(deadline, stream.write_all(send)).await {
            Err(_elapsed) => return Err(ExpectFail::Silent { timeout: limit }.into()),
            Ok(Err(e)) => return Err(io_fail(e, "sending")),
            Ok(Ok(())) => {}
        }
    }
    // Dropping the stream closes it with RST (zero linger, see `connect`),
    // which also stops a backend that sends without end.
    read_answer(&mut stream, check, deadline, limit).await
}

async fn udp(to: &Target<'_>, check: &ExpectCheck) -> Result<(), FailReason> {
    let Some(send) = &check.send else {
        return Err(FailReason::InvalidCheck {
            reason: "kind = \"udp\" needs send or send_hex".to_owned(),
        });
    };
    let answer = super::udp::exchange(
        to.addr,
        to.path,
        send,
        check.max,
        to.by.deadline,
        to.by.limit,
    )
    .await?;
    // A datagram longer than expect_max is judged on its first bytes.
    judge_datagram(check.matcher.as_ref(), &answer.bytes)
}

/// A datagram (its first `expect_max` bytes) against the matcher: all of
/// the answer there will be.
fn judge_datagram(matcher: Option<&Matcher>, answer: &[u8]) -> Result<(), FailReason> {
    match matcher {
        None => Ok(()),
        Some(m) if m.judge(answer, 0) == Verdict::Match => Ok(()),
        Some(m) => Err(ExpectFail::Mismatch {
            expected: m.to_string(),
            received: shown_answer(answer),
        }
        .into()),
    }
}

/// Answers up to this long are matched against a regex after every read;
/// past it, only once they grew by an eighth since the last try (and once
/// more at the end): a backend dripping 64 KiB byte by byte would
/// otherwise make the prober run the regex 65,536 times over up to 64 KiB.
const REGEX_EVERY_READ: usize = 4096;

/// Reads the answer on `stream` until `check`'s matcher decides, within
/// `check.max` bytes and by `deadline` (`limit` is the `hang_timeout` that
/// failures name).
async fn read_answer<R: AsyncRead + Unpin>(
    stream: &mut R,
    check: &ExpectCheck,
    deadline: Instant,
    limit: Duration,
) -> Result<(), FailReason> {
    let mut answer = Answer {
        bytes: Vec::with_capacity(check.max.min(1024)),
        matcher: check.matcher.as_ref(),
        judged: 0,
    };
    let mut chunk = [0u8; 4096];
    loop {
        let want = (check.max - answer.bytes.len()).min(chunk.len());
        let read = timeout_at(deadline, stream.read(&mut chunk[..want])).await;
        let n = match read {
            Ok(Ok(n)) if n > 0 => n,
            end => {
                // No more bytes: a regex not run on the last ones gets its
                // chance first.
                if answer.judge(true) == Verdict::Match {
                    return Ok(());
                }
                return Err(answer.ended(end.map(|r| r.map(|_| ())), limit));
            }
        };
        let from = answer.bytes.len();
        answer.bytes.extend_from_slice(&chunk[..n]);
        match answer.judge_new(from) {
            Verdict::Match => return Ok(()),
            Verdict::Mismatch => return Err(answer.mismatch()),
            Verdict::Undecided => {}
        }
        if answer.bytes.len() >= check.max {
            if answer.judge(true) == Verdict::Match {
                return Ok(());
            }
            return Err(answer.fail(|expected, received| ExpectFail::CapReached {
                expected,
                max: check.max,
                received,
            }));
        }
    }
}

/// The answer read so far and the matcher it must pass.
struct Answer<'a> {
    bytes: Vec<u8>,
    matcher: Option<&'a Matcher>,
    /// Length of the answer when a regex last ran on it.
    judged: usize,
}

impl Answer<'_> {
    /// After new bytes from `from` on.
    fn judge_new(&mut self, from: usize) -> Verdict {
        match self.matcher {
            // Any byte is an answer.
            None => Verdict::Match,
            Some(Matcher::Regex(_)) => {
                let len = self.bytes.len();
                let due = len <= REGEX_EVERY_READ || len - self.judged >= self.judged / 8;
                self.judge(due)
            }
            Some(m) => m.judge(&self.bytes, from),
        }
    }

    /// Runs the matcher over the whole answer if `due` (only a regex is
    /// ever not due).
    fn judge(&mut self, due: bool) -> Verdict {
        match self.matcher {
            None => Verdict::Undecided,
            Some(_) if !due => Verdict::Undecided,
            Some(m) => {
                self.judged = self.bytes.len();
                m.judge(&self.bytes, 0)
            }
        }
    }

    fn expected(&self) -> String {
        self.matcher
            .map_or_else(|| "any answer".to_owned(), ToString::to_string)
    }

    fn fail(&self, make: impl FnOnce(String, String) -> ExpectFail) -> FailReason {
        make(self.expected(), shown_answer(&self.bytes)).into()
    }

    fn mismatch(&self) -> FailReason {
        self.fail(|expected, received| ExpectFail::Mismatch { expected, received })
    }

    /// The verdict when reading stopped without a match: `Err(_)` the
    /// deadline, `Ok(Err(_))` a socket error, `Ok(Ok(()))` the backend
    /// closed.
    fn ended(
        &self,
        end: Result<std::io::Result<()>, tokio::time::error::Elapsed>,
        limit: Duration,
    ) -> FailReason {
        let len = self.bytes.len();
        match end {
            Err(_elapsed) if len == 0 => ExpectFail::Silent { timeout: limit }.into(),
            Err(_elapsed) => self.fail(|expected, received| ExpectFail::NoMatch {
                expected,
                timeout: limit,
                len,
                received,
            }),
            Ok(Err(e)) => io_fail(e, "reading the answer"),
            Ok(Ok(())) => self.fail(|expected, received| ExpectFail::Closed {
                expected,
                len,
                received,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::io::{AsyncWriteExt as _, ReadBuf};

    use super::*;
    use crate::health::spec::expect::{MAX_EXPECT_MAX, compile_regex};

    const HANG: Duration = Duration::from_millis(300);

    fn check(matcher: Option<Matcher>, max: usize) -> ExpectCheck {
        ExpectCheck {
            transport: Transport::Tcp,
            send: Some(b"PING\r\n".to_vec()),
            matcher,
            max,
        }
    }

    fn pong() -> Option<Matcher> {
        Some(Matcher::Prefix(b"+PONG".to_vec()))
    }

    /// Feeds `parts` to the reader one write each (then closes if `close`,
    /// else stays silent), and returns the verdict and how long it took.
    async fn answer(
        check: &ExpectCheck,
        parts: &[&[u8]],
        close: bool,
    ) -> (Result<(), FailReason>, Duration) {
        let (mut server, mut client) = tokio::io::duplex(256 * 1024);
        for part in parts {
            server.write_all(part).await.unwrap();
            server.flush().await.unwrap();
        }
        let _held = if close {
            drop(server);
            None
        } else {
            Some(server)
        };
        let start = Instant::now();
        let verdict = read_answer(&mut client, check, start + HANG, HANG).await;
        (verdict, start.elapsed())
    }

    fn code(r: &Result<(), FailReason>) -> &'static str {
        match r {
            Ok(()) => "ok",
            Err(e) => e.code(),
        }
    }

    /// (name, matcher, max, parts, close, code)
    type Case<'a> = (
        &'a str,
        Option<Matcher>,
        usize,
        Vec<&'a [u8]>,
        bool,
        &'a str,
    );

    #[tokio::test]
    async fn verdicts_on_recorded_answers() {
        let contains = Some(Matcher::Contains(b"VERSION ".to_vec()));
        let banner = Some(Matcher::Regex(compile_regex(r"^220[ -]").unwrap()));
        // (name, matcher, max, parts, close, code)
        let cases: Vec<Case<'_>> = vec![
            ("redis PONG", pong(), 1024, vec![b"+PONG\r\n"], false, "ok"),
            (
                "redis PONG in pieces",
                pong(),
                1024,
                vec![b"+P", b"ON", b"G"],
                false,
                "ok",
            ),
            (
                "redis loading",
                pong(),
                1024,
                vec![b"-LOADING Redis is loading the dataset in memory\r\n"],
                false,
                "expect_mismatch",
            ),
            (
                "redis auth required",
                pong(),
                1024,
                vec![b"-NOAUTH Authentication required.\r\n"],
                false,
                "expect_mismatch",
            ),
            (
                "memcached version",
                contains.clone(),
                1024,
                vec![b"VERSION 1.6.21\r\n"],
                false,
                "ok",
            ),
            (
                "smtp banner",
                banner.clone(),
                1024,
                vec![b"220 mx.example.org ESMTP Postfix (Debian/GNU)\r\n"],
                false,
                "ok",
            ),
            (
                "smtp refusing",
                banner.clone(),
                1024,
                vec![b"554 5.3.2 mx.example.org closing\r\n"],
                true,
                "closed_before_match",
            ),
            ("silent", pong(), 1024, vec![], false, "no_data"),
            (
                "closed at once",
                pong(),
                1024,
                vec![],
                true,
                "closed_before_match",
            ),
            (
                "partial then silent",
                pong(),
                1024,
                vec![b"+PO"],
                false,
                "expect_timeout",
            ),
            ("any answer: one byte", None, 1024, vec![b"x"], false, "ok"),
            ("any answer: none", None, 1024, vec![], false, "no_data"),
            (
                "cap reached",
                contains.clone(),
                16,
                vec![&[b'x'; 64]],
                false,
                "expect_cap_reached",
            ),
            (
                "match beyond the cap",
                contains,
                16,
                vec![b"0123456789abcdefVERSION "],
                false,
                "expect_cap_reached",
            ),
            (
                "binary garbage",
                banner,
                1024,
                vec![b"\x00\xff\xfe\x1b[2J\x07"],
                true,
                "closed_before_match",
            ),
        ];
        for (name, matcher, max, parts, close, want) in cases {
            let (got, _) = answer(&check(matcher, max), &parts, close).await;
            assert_eq!(code(&got), want, "{name}: {got:?}");
        }
    }

    #[tokio::test]
    async fn reasons_show_the_answer_escaped() {
        let (got, _) = answer(&check(pong(), 1024), &[b"-ERR \x1b[31m\"x\"\r\n"], false).await;
        assert_eq!(
            got.unwrap_err().to_string(),
            r#"answer does not match prefix "+PONG": received "-ERR \x1b[31m\"x\"\r\n""#
        );
        let (got, _) = answer(&check(pong(), 1024), &[b"+PO"], false).await;
        assert_eq!(
            got.unwrap_err().to_string(),
            r#"no match for prefix "+PONG" within 300ms (3 bytes received: "+PO")"#
        );
        let (got, _) = answer(&check(pong(), 1024), &[], false).await;
        assert_eq!(
            got.unwrap_err().to_string(),
            "connected, no data within 300ms"
        );
        let (got, _) = answer(&check(pong(), 1024), &[], true).await;
        assert_eq!(
            got.unwrap_err().to_string(),
            "connection closed with no answer"
        );
        let contains = Some(Matcher::Contains(b"OK".to_vec()));
        let (got, _) = answer(&check(contains.clone(), 1024), &[b"nope"], true).await;
        assert_eq!(
            got.unwrap_err().to_string(),
            r#"connection closed after 4 bytes without a match for substring "OK"; received "nope""#
        );
        let long = [b'y'; 100];
        let (got, _) = answer(&check(contains, 80), &[&long], false).await;
        assert_eq!(
            got.unwrap_err().to_string(),
            format!(
                "no match for substring \"OK\" in the first 80 bytes (expect_max); received \"{}...\"",
                "y".repeat(64)
            )
        );
    }

    /// A stream that never ends: every read fills the buffer.
    struct Endless;

    impl AsyncRead for Endless {
        fn poll_read(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            buf.put_slice(&vec![b'z'; buf.remaining()]);
            Poll::Ready(Ok(()))
        }
    }

    /// One byte per read, forever.
    struct Drip;

    impl AsyncRead for Drip {
        fn poll_read(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            buf.put_slice(b"z");
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn endless_streams_stop_at_the_cap() {
        let far = Instant::now() + Duration::from_secs(30);
        let regex = Some(Matcher::Regex(compile_regex("never").unwrap()));
        for matcher in [regex, Some(Matcher::Contains(b"never".to_vec()))] {
            let c = check(matcher, MAX_EXPECT_MAX);
            let start = std::time::Instant::now();
            let got = read_answer(&mut Endless, &c, far, HANG).await;
            assert_eq!(code(&got), "expect_cap_reached", "{got:?}");
            let got = read_answer(&mut Drip, &c, far, HANG).await;
            assert_eq!(code(&got), "expect_cap_reached", "{got:?}");
            // Linear work: 64 KiB byte by byte is well under a second even
            // in a debug build (a regex run per byte took minutes).
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{:?}",
                start.elapsed()
            );
        }
    }

    #[tokio::test]
    async fn regex_sees_the_last_bytes_even_when_skipped() {
        // Past REGEX_EVERY_READ a regex runs only on growth by an eighth; a
        // match in the last bytes before the backend stops must still pass.
        let mut parts: Vec<Vec<u8>> = vec![vec![b'.'; REGEX_EVERY_READ + 100]];
        parts.push(b"OK".to_vec());
        let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let regex = Some(Matcher::Regex(compile_regex("OK$").unwrap()));
        let (got, took) = answer(&check(regex.clone(), MAX_EXPECT_MAX), &parts, true).await;
        assert_eq!(code(&got), "ok", "{got:?}");
        let (got, took_silent) = answer(&check(regex, MAX_EXPECT_MAX), &parts, false).await;
        assert_eq!(code(&got), "ok", "{got:?}");
        assert!(
            took < HANG && took_silent >= HANG,
            "{took:?} {took_silent:?}"
        );
    }

    /// The whole probe over loopback: connect, send, read, verdict, and
    /// the hung-vs-slow split (a late match passes, its latency tells).
    #[tokio::test]
    async fn probes_over_loopback() {
        use crate::health::probe::probe;
        use crate::health::spec::CheckKind;
        use crate::health::testutil::{closed_port, http_spec_hang, silent_listener};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            for delay in [0u64, 400] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut req = [0u8; 6];
                s.read_exact(&mut req).await.unwrap();
                assert_eq!(&req, b"PING\r\n");
                tokio::time::sleep(Duration::from_millis(delay)).await;
                s.write_all(b"+PONG\r\n").await.unwrap();
            }
        });
        let mut spec = http_spec_hang(addr.port(), Duration::from_millis(200), HANG * 3);
        spec.kind = CheckKind::Expect(check(pong(), 1024));
        let fast = probe(addr, &spec).await;
        assert!(fast.is_ok() && fast.latency < spec.timeout, "{fast:?}");
        let slow = probe(addr, &spec).await;
        assert_eq!(slow.class(spec.timeout).code(), "slow", "{slow:?}");
        server.await.unwrap();

        let hung = silent_listener();
        let start = std::time::Instant::now();
        let got = probe(hung.local_addr().unwrap(), &spec).await;
        assert_eq!(got.outcome.unwrap_err().code(), "no_data");
        assert!(start.elapsed() < spec.hang_timeout + Duration::from_millis(500));
        let got = probe(closed_port(), &spec).await;
        assert_eq!(got.outcome.unwrap_err().code(), "connection_refused");
    }

    /// UDP over loopback: the answer matched, a wrong one named, silence
    /// is `no_answer` by `hang_timeout`.
    #[tokio::test]
    async fn udp_over_loopback() {
        use crate::health::probe::probe;
        use crate::health::spec::CheckKind;
        use crate::health::testutil::http_spec_hang;

        let server = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = server.local_addr().unwrap();
        let answers: [&[u8]; 2] = [b"+PONG\r\n", b"-ERR\r\n"];
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            for answer in answers {
                let (n, from) = server.recv_from(&mut buf).await.unwrap();
                assert_eq!(&buf[..n], b"PING\r\n");
                server.send_to(answer, from).await.unwrap();
            }
            // Then silent: the socket stays open, nothing answers.
            server
        });
        let mut spec = http_spec_hang(addr.port(), Duration::from_millis(200), HANG);
        spec.kind = CheckKind::Expect(ExpectCheck {
            transport: Transport::Udp,
            ..check(pong(), 1024)
        });
        let got = probe(addr, &spec).await;
        assert!(got.is_ok(), "{got:?}");
        let got = probe(addr, &spec).await.outcome.unwrap_err();
        assert_eq!(got.code(), "expect_mismatch", "{got}");
        let _silent = task.await.unwrap();
        let got = probe(addr, &spec).await;
        assert_eq!(got.outcome.unwrap_err().code(), "no_answer");
        assert!(
            got.latency >= HANG && got.latency < HANG * 3,
            "{:?}",
            got.latency
        );
    }

    #[test]
    fn datagram_verdicts() {
        let dns_answer = b"\x12\x34\x81\x80\x00\x01\x00\x01";
        assert_eq!(judge_datagram(None, b"\x00"), Ok(()));
        // A response (QR set) with rcode NOERROR.
        let re = Matcher::Regex(compile_regex(r"^\x12\x34[\x80-\xff]\x80").unwrap());
        assert_eq!(judge_datagram(Some(&re), dns_answer), Ok(()));
        let servfail = b"\x12\x34\x81\x82\x00\x01\x00\x00";
        let got = judge_datagram(Some(&re), servfail).unwrap_err();
        assert_eq!(got.code(), "expect_mismatch");
        assert_eq!(
            got.to_string(),
            r#"answer does not match regex "^\x12\x34[\x80-\xff]\x80": received "\x124\x81\x82\0\x01\0\0""#
        );
    }

    #[test]
    fn codes_are_stable() {
        let t = Duration::from_secs(1);
        let s = String::new;
        let cases = [
            (ExpectFail::Silent { timeout: t }, "no_data"),
            (
                ExpectFail::Mismatch {
                    expected: s(),
                    received: s(),
                },
                "expect_mismatch",
            ),
            (
                ExpectFail::CapReached {
                    expected: s(),
                    max: 1,
                    received: s(),
                },
                "expect_cap_reached",
            ),
            (
                ExpectFail::Closed {
                    expected: s(),
                    len: 0,
                    received: s(),
                },
                "closed_before_match",
            ),
            (
                ExpectFail::NoMatch {
                    expected: s(),
                    timeout: t,
                    len: 1,
                    received: s(),
                },
                "expect_timeout",
            ),
        ];
        for (fail, want) in cases {
            assert_eq!(FailReason::from(fail.clone()).code(), want, "{fail:?}");
        }
    }
}
