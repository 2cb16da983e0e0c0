//! The line format: a version envelope around each message, and the parsers
//! whose errors tell the other end what was wrong.

use serde::Serialize;
use serde_json::Value;

use crate::{Request, Response};

/// Version of the wire format and of every type in this crate. A daemon
/// answers a request of another version with an [`Response::Error`] naming
/// the versions it supports.
///
/// - 1: the first release.
/// - 2: `ExplainReport` has no `flow_hash` (a flow's keyed hash is an
///   oracle for the secret key; the slot is what an operator needs).
///   Requests are unchanged, so version-1 requests are still accepted.
///
/// A new command (`block`, `sources`, `withdraw`, `weight`, ...) is an
/// addition, not a new version: a daemon that predates it answers
/// "unknown command" and names the commands it knows.
pub const PROTOCOL_VERSION: u32 = 2;

/// Versions this build accepts.
pub const SUPPORTED_VERSIONS: &[u32] = &[1, PROTOCOL_VERSION];

/// The `command` of every [`Request`], as spelled on the wire.
pub const COMMANDS: &[&str] = &[
    "status", "events", "explain", "drain", "enable", "reload", "block", "unblock", "blocks",
    "sources", "withdraw", "announce", "weight",
];

/// An example request, quoted in error messages about malformed ones.
const EXAMPLE_REQUEST: &str = r#"{"version":2,"command":"status"}"#;

/// `{"version":2, ...body}` plus a newline. The version goes first so a
/// human reading the socket with `socat` sees it at once.
pub(crate) fn to_line<T: Serialize>(body: &T) -> String {
    #[derive(Serialize)]
    struct Envelope<'a, T> {
        version: u32,
        #[serde(flatten)]
        body: &'a T,
    }
    let mut line = serde_json::to_string(&Envelope {
        version: PROTOCOL_VERSION,
        body,
    })
    // Every type here is plain data with string keys: serialization cannot fail.
    .expect("protocol types serialize to JSON");
    line.push('\n');
    line
}

/// Parses one request line. The error is the message sent back: what was
/// wrong (with the column of a JSON syntax error) and how a request looks.
///
/// # Errors
///
/// A line that is not a JSON object, has no or another `version`, an
/// unknown `command`, or fields that do not fit the command.
pub fn parse_request(line: &[u8]) -> Result<Request, String> {
    let map = envelope(line, "request", "daemon")?;
    if let Some(command) = map.get("command") {
        match command.as_str() {
            Some(c) if COMMANDS.contains(&c) => {}
            Some(c) => {
                return Err(format!(
                    "unknown command {c:?}; this daemon knows {}",
                    COMMANDS.join(", ")
                ));
            }
            None => return Err(format!("\"command\" must be a string, got {command}")),
        }
    }
    serde_json::from_value(Value::Object(map))
        .map_err(|e| format!("bad request: {e}; e.g. {EXAMPLE_REQUEST}"))
}

/// Parses one response line.
///
/// # Errors
///
/// A line that is not a JSON object, has no or another `version`, or is
/// not a [`Response`].
pub fn parse_response(line: &[u8]) -> Result<Response, String> {
    let map = envelope(line, "response", "xlb CLI")?;
    serde_json::from_value(Value::Object(map)).map_err(|e| format!("bad response: {e}"))
}

/// Checks the JSON syntax and version of a line and returns its other fields.
/// `what` is "request" or "response"; `us` is who is checking.
fn envelope(line: &[u8], what: &str, us: &str) -> Result<serde_json::Map<String, Value>, String> {
    let value: Value = serde_json::from_slice(line).map_err(|e| {
        format!("malformed {what}: {e}; send one JSON object per line, e.g. {EXAMPLE_REQUEST}")
    })?;
    let Value::Object(mut map) = value else {
        return Err(format!(
            "malformed {what}: expected a JSON object, got {}; e.g. {EXAMPLE_REQUEST}",
            json_type(&value)
        ));
    };
    let supported = SUPPORTED_VERSIONS
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    match map.remove("version") {
        None => Err(format!(
            "{what} has no \"version\"; this {us} supports protocol version {supported}: \
             add \"version\":{PROTOCOL_VERSION}"
        )),
        Some(v)
            if v.as_u64()
                .is_some_and(|v| SUPPORTED_VERSIONS.iter().any(|&s| u64::from(s) == v)) =>
        {
            Ok(map)
        }
        Some(v) => Err(format!(
            "unsupported protocol version {v}: this {us} ({}) supports version {supported}; \
             use the xlb CLI and daemon of the same release",
            env!("CARGO_PKG_VERSION")
        )),
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;

    /// Protocol 2 changed a response only: a client of version 1 still
    /// gets its requests answered (with version-2 responses).
    #[test]
    fn version_1_requests_are_still_accepted() {
        assert_eq!(
            parse_request(br#"{"version":1,"command":"status"}"#),
            Ok(Request::Status)
        );
        assert!(Request::Status.to_line().starts_with(r#"{"version":2,"#));
    }

    #[test]
    fn malformed_requests_say_what_is_wrong() {
        let cases: &[(&str, &[u8], &[&str])] = &[
            ("not json", b"status", &["malformed request", "column 1"]),
            (
                "truncated json",
                br#"{"version":2,"command":"status""#,
                &["malformed request", "column 31", r#"{"version":2,"command":"status"}"#],
            ),
            ("not an object", b"[1,2]", &["expected a JSON object, got an array"]),
            (
                "no version",
                br#"{"command":"status"}"#,
                &["no \"version\"", "supports protocol version 1"],
            ),
            (
                "other version",
                br#"{"version":3,"command":"status"}"#,
                &["unsupported protocol version 3", "supports version 1, 2"],
            ),
            (
                "version as string",
                br#"{"version":"1","command":"status"}"#,
                &["unsupported protocol version \"1\""],
            ),
            ("no command", br#"{"version":2}"#, &["missing field `command`"]),
            (
                "unknown command",
                br#"{"version":2,"command":"restart"}"#,
                &[
                    "unknown command \"restart\"",
                    "status, events, explain, drain, enable, reload",
                ],
            ),
            (
                "command not a string",
                br#"{"version":2,"command":3}"#,
                &["\"command\" must be a string, got 3"],
            ),
            (
                "missing field",
                br#"{"version":2,"command":"drain","vip":"api"}"#,
                &["bad request", "missing field `backend`"],
            ),
            (
                "negative deadline",
                br#"{"version":2,"command":"drain","vip":"api","backend":"10.0.0.1:80","deadline_ms":-5}"#,
                &["bad request", "invalid value: integer `-5`"],
            ),
            (
                "unknown field",
                br#"{"version":2,"command":"events","since":3}"#,
                &["bad request", "unknown field `since`"],
            ),
            (
                "bad address",
                br#"{"version":2,"command":"explain","protocol":"tcp","client":"1.2.3.4","vip":"10.0.0.1:80"}"#,
                &["bad request", "invalid socket address syntax"],
            ),
            (
                "bad protocol",
                br#"{"version":2,"command":"explain","protocol":"sctp","client":"1.2.3.4:1","vip":"10.0.0.1:80"}"#,
                &["bad request", "unknown variant `sctp`"],
            ),
            ("not utf-8", b"\xff\xfe", &["malformed request"]),
        ];
        for (name, line, want) in cases {
            let err = parse_request(line).expect_err(name);
            for w in *want {
                assert!(err.contains(w), "{name}: {w:?} not in {err:?}");
            }
        }
    }

    #[test]
    fn responses_of_another_version_are_refused() {
        let cases: &[(&str, &[u8], &str)] = &[
            (
                "no version",
                br#"{"response":"ok","data":{"message":"x"}}"#,
                "this xlb CLI supports protocol version 1",
            ),
            (
                "other version",
                br#"{"version":3,"response":"ok","data":{"message":"x"}}"#,
                "unsupported protocol version 3: this xlb CLI",
            ),
            (
                "unknown response",
                br#"{"version":2,"response":"maybe"}"#,
                "bad response: unknown variant `maybe`",
            ),
        ];
        for (name, line, want) in cases {
            let err = parse_response(line).expect_err(name);
            assert!(err.contains(want), "{name}: {want:?} not in {err:?}");
        }
    }
}
