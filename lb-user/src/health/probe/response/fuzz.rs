//! Property tests of the prober's response reader, which reads whatever a
//! backend sends: heads, chunk-size lines and whole responses over a real
//! connection, from arbitrary bytes, mutations of the committed corpus
//! (`tests/fuzz-corpus/http/`) and well-formed responses. Nothing panics,
//! every read ends (by the deadline at worst) with a head and body or a
//! reason, and a well-formed response is read back as it was sent: its
//! status, and its body up to [`BODY_LIMIT`] whether framed by length, by
//! chunks (split anywhere) or by the connection's end.

use std::time::Duration;

use proptest::prelude::*;
use tokio::{
    io::AsyncWriteExt as _,
    net::{TcpListener, TcpStream},
    time::Instant,
};

use super::{
    BODY_LIMIT, FailReason, Reader, head_end, parse_chunk_size, parse_head, read_body,
    read_final_head,
};

/// The corpus: one response per file, bytes as sent.
fn corpus() -> Vec<Vec<u8>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fuzz-corpus/http");
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    let all: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert!(!all.is_empty(), "{dir}: no responses");
    all
}

/// Sends `bytes` from a local server that then closes, and reads them as a
/// probe does: the final head, then the body.
fn read(bytes: Vec<u8>, is_head: bool) -> Result<(u16, Vec<u8>), FailReason> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            // The reader may stop early (a malformed head): a reset is fine.
            let _ = s.write_all(&bytes).await;
            let _ = s.shutdown().await;
        });
        let stream = TcpStream::connect(addr).await.unwrap();
        let timeout = Duration::from_secs(2);
        let mut reader = Reader::new(stream, Instant::now() + timeout, timeout);
        let result = async {
            let head = read_final_head(&mut reader).await?;
            let body = read_body(&mut reader, &head, is_head).await?;
            Ok((head.status, body))
        }
        .await;
        drop(reader);
        server.await.unwrap();
        result
    })
}

/// A verdict that says something.
fn check_verdict(r: &Result<(u16, Vec<u8>), FailReason>) -> Result<(), TestCaseError> {
    match r {
        Ok((status, body)) => {
            prop_assert!((100..=599).contains(status), "status {}", status);
            prop_assert!(body.len() <= BODY_LIMIT, "body of {} bytes", body.len());
        }
        Err(FailReason::Malformed { reason }) => prop_assert!(!reason.is_empty()),
        Err(_) => {}
    }
    Ok(())
}

/// How a generated response marks its body's end.
#[derive(Clone, Debug)]
enum Framing {
    Length,
    /// Chunks of these sizes (the rest in one last chunk).
    Chunked(Vec<usize>),
    UntilClose,
}

fn framing() -> impl Strategy<Value = Framing> {
    prop_oneof![
        Just(Framing::Length),
        prop::collection::vec(1usize..700, 0..8).prop_map(Framing::Chunked),
        Just(Framing::UntilClose),
    ]
}

fn header() -> impl Strategy<Value = String> {
    ("[A-Za-z][A-Za-z0-9-]{0,15}", "[ -~]{0,30}")
        .prop_filter("framing headers are the test's", |(n, _)| {
            !n.eq_ignore_ascii_case("content-length")
                && !n.eq_ignore_ascii_case("transfer-encoding")
        })
        .prop_map(|(n, v)| format!("{n}: {}\r\n", v.trim()))
}

/// A well-formed response, and the body a probe must read from it.
fn response() -> impl Strategy<Value = (Vec<u8>, u16, Vec<u8>)> {
    (
        200u16..=599,
        any::<bool>(),
        prop::collection::vec(header(), 0..5),
        prop::collection::vec(any::<u8>(), 0..6000),
        framing(),
        any::<bool>(),
    )
        .prop_map(|(status, interim, headers, body, framing, lf_only)| {
            let mut r = Vec::new();
            if interim {
                r.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            }
            r.extend_from_slice(format!("HTTP/1.1 {status} Whatever\r\n").as_bytes());
            for h in &headers {
                r.extend_from_slice(h.as_bytes());
            }
            match &framing {
                Framing::Length => {
                    r.extend_from_slice(
                        format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes(),
                    );
                    r.extend_from_slice(&body);
                }
                Framing::UntilClose => {
                    r.extend_from_slice(b"\r\n");
                    r.extend_from_slice(&body);
                }
                Framing::Chunked(sizes) => {
                    r.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                    let eol: &[u8] = if lf_only { b"\n" } else { b"\r\n" };
                    let mut rest = &body[..];
                    let mut sizes = sizes.iter();
                    while !rest.is_empty() {
                        let n = sizes.next().copied().unwrap_or(rest.len()).min(rest.len());
                        r.extend_from_slice(format!("{n:x};ext=1").as_bytes());
                        r.extend_from_slice(eol);
                        r.extend_from_slice(&rest[..n]);
                        r.extend_from_slice(eol);
                        rest = &rest[n..];
                    }
                    r.extend_from_slice(b"0\r\n\r\n");
                }
            }
            let mut want = body;
            if status == 204 || status == 304 {
                want.clear();
            }
            want.truncate(BODY_LIMIT);
            (r, status, want)
        })
}

/// A corpus response with a few bytes changed, removed or added.
fn mutated() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(corpus()),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..6),
    )
        .prop_map(|(mut r, edits)| {
            for (at, byte, kind) in edits {
                if r.is_empty() {
                    r.push(byte);
                    continue;
                }
                let i = at.index(r.len());
                match kind {
                    0 => r[i] = byte,
                    1 => {
                        r.remove(i);
                    }
                    _ => r.insert(i, byte),
                }
            }
            r
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn arbitrary_heads_get_a_verdict(buf in prop::collection::vec(any::<u8>(), 0..400)) {
        let mut buf = buf;
        buf.extend_from_slice(b"\r\n\r\n");
        let end = head_end(&buf);
        prop_assert!(end.is_some_and(|e| e <= buf.len()));
        if let Ok(head) = parse_head(&buf[..end.unwrap()]) {
            prop_assert!((100..=599).contains(&head.status));
        }
    }

    #[test]
    fn chunk_sizes_round_trip(n in any::<u64>(), ext in prop::option::of("[ \t]{0,2};[ -~]{0,20}")) {
        let line = format!("{n:x}{}", ext.unwrap_or_default());
        prop_assert_eq!(parse_chunk_size(line.as_bytes()).ok(), Some(n));
    }

    #[test]
    fn arbitrary_chunk_lines_get_a_verdict(line in prop::collection::vec(any::<u8>(), 0..40)) {
        let _ = parse_chunk_size(&line);
    }

    #[test]
    fn well_formed_responses_read_back((bytes, status, want) in response()) {
        let got = read(bytes, false);
        prop_assert_eq!(got.map_err(|e| e.to_string()), Ok((status, want)));
    }

    #[test]
    fn arbitrary_responses_get_a_verdict(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        check_verdict(&read(bytes, false))?;
    }

    #[test]
    fn mutated_corpus_responses_get_a_verdict(bytes in mutated(), is_head in any::<bool>()) {
        check_verdict(&read(bytes, is_head))?;
    }
}

/// Every corpus response, as it is.
#[test]
fn corpus_responses_get_a_verdict() {
    for r in corpus() {
        let shown = String::from_utf8_lossy(&r).into_owned();
        check_verdict(&read(r, false)).unwrap_or_else(|e| panic!("{e}\nfor:\n{shown}"));
    }
}
