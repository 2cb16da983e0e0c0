//! Property tests of [`parse_request`], the daemon's parser of whatever a
//! client writes on the control socket: arbitrary bytes, JSON-shaped
//! objects built from the protocol's own keys and values, and mutations of
//! the committed corpus (`tests/fuzz-corpus/requests/`) never panic and
//! always give a verdict (a request, or an error that says something), and
//! every request the parser accepts or the CLI sends goes through
//! `to_line` and back unchanged.

use proptest::prelude::*;
use serde_json::{Map, Value};

use super::parse_request;
use crate::{GuardAction, ListKind, Protocol, Request};

/// The corpus, one request line per line (`#` starts a comment).
fn corpus() -> Vec<Vec<u8>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fuzz-corpus/requests");
    let mut lines = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let text = std::fs::read(&path).unwrap();
        lines.extend(
            text.split(|&b| b == b'\n')
                .filter(|l| !l.is_empty() && !l.starts_with(b"#"))
                .map(<[u8]>::to_vec),
        );
    }
    assert!(!lines.is_empty(), "{dir}: no request lines");
    lines
}

/// The properties every input must have.
fn check(line: &[u8]) -> Result<(), TestCaseError> {
    match parse_request(line) {
        Ok(req) => {
            let again = parse_request(req.to_line().as_bytes());
            prop_assert_eq!(again.as_ref(), Ok(&req), "to_line of an accepted request");
        }
        Err(e) => prop_assert!(e.len() > 10, "an error that says nothing: {:?}", e),
    }
    Ok(())
}

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "version",
        "command",
        "vip",
        "backend",
        "since_seq",
        "follow",
        "protocol",
        "client",
        "deadline_ms",
        "list",
        "prefix",
        "ttl_ms",
        "reason",
        "action",
        "other",
    ])
    .prop_map(str::to_owned)
}

fn value() -> impl Strategy<Value = Value> {
    let words = prop::sample::select(vec![
        "status",
        "events",
        "explain",
        "drain",
        "enable",
        "reload",
        "block",
        "unblock",
        "blocks",
        "sources",
        "tcp",
        "udp",
        "deny",
        "allow",
        "drop",
        "reset",
        "api",
        "10.0.0.1:80",
        "[fd00::1]:443",
        "10.0.0.0/8",
        "",
        "\u{0}",
        "é",
    ]);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        Just(Value::from(1u64)),
        words.prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..3)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Objects made of the protocol's keys, usually with a valid version and
/// command, so the parser gets past the envelope.
fn json_object() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::option::weighted(0.9, Just(1u64)),
        prop::option::weighted(0.9, value()),
        prop::collection::vec((key(), value()), 0..5),
    )
        .prop_map(|(version, command, rest)| {
            let mut m: Map<String, Value> = rest.into_iter().collect();
            if let Some(v) = version {
                m.insert("version".into(), v.into());
            }
            if let Some(c) = command {
                m.insert("command".into(), c);
            }
            serde_json::to_vec(&Value::Object(m)).unwrap()
        })
}

/// A corpus line with a few bytes changed, removed or added.
fn mutated() -> impl Strategy<Value = Vec<u8>> {
    let lines = corpus();
    (
        prop::sample::select(lines),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..4),
    )
        .prop_map(|(mut line, edits)| {
            for (at, byte, kind) in edits {
                if line.is_empty() {
                    line.push(byte);
                    continue;
                }
                let i = at.index(line.len());
                match kind {
                    0 => line[i] = byte,
                    1 => {
                        line.remove(i);
                    }
                    _ => line.insert(i, byte),
                }
            }
            line
        })
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z][a-z0-9-]{0,10}", ".{0,8}"]
}

/// A socket address as text carries it (no IPv6 flow label: the wire
/// format is `ip:port` / `[ip]:port`).
fn addr() -> impl Strategy<Value = std::net::SocketAddr> {
    (any::<std::net::IpAddr>(), any::<u16>()).prop_map(|(ip, port)| (ip, port).into())
}

fn request() -> impl Strategy<Value = Request> {
    let list = prop_oneof![Just(ListKind::Deny), Just(ListKind::Allow)];
    let action = prop_oneof![Just(GuardAction::Drop), Just(GuardAction::Reset)];
    let protocol = prop_oneof![Just(Protocol::Tcp), Just(Protocol::Udp)];
    prop_oneof![
        Just(Request::Status),
        Just(Request::Reload),
        Just(Request::Blocks),
        (any::<Option<u64>>(), any::<bool>())
            .prop_map(|(since_seq, follow)| Request::Events { since_seq, follow }),
        (protocol, addr(), addr()).prop_map(|(protocol, client, vip)| Request::Explain {
            protocol,
            client,
            vip
        }),
        (name(), name(), any::<Option<u64>>()).prop_map(|(vip, backend, deadline_ms)| {
            Request::Drain {
                vip,
                backend,
                deadline_ms,
            }
        }),
        (name(), name()).prop_map(|(vip, backend)| Request::Enable { vip, backend }),
        (
            list.clone(),
            name(),
            prop::option::of(name()),
            any::<Option<u64>>(),
            prop::option::of(name()),
            action
        )
            .prop_map(
                |(list, prefix, vip, ttl_ms, reason, action)| Request::Block {
                    list,
                    prefix,
                    vip,
                    ttl_ms,
                    reason,
                    action,
                    force: false,
                }
            ),
        (list, name(), prop::option::of(name())).prop_map(|(list, prefix, vip)| Request::Unblock {
            list,
            prefix,
            vip
        }),
        prop::option::of(name()).prop_map(|vip| Request::Sources { vip }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_get_a_verdict(line in prop::collection::vec(any::<u8>(), 0..256)) {
        check(&line)?;
    }

    #[test]
    fn json_objects_get_a_verdict(line in json_object()) {
        check(&line)?;
    }

    #[test]
    fn mutated_corpus_lines_get_a_verdict(line in mutated()) {
        check(&line)?;
    }

    #[test]
    fn every_request_round_trips(req in request()) {
        let line = req.to_line();
        prop_assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
        prop_assert_eq!(parse_request(line.as_bytes()), Ok(req));
    }
}

/// Every corpus line, as it is.
#[test]
fn corpus_lines_get_a_verdict() {
    for line in corpus() {
        check(&line).unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(&line)));
    }
}
