//! `xlb status --json` and `xlb events --json` as the lab reads them: the
//! control protocol's own types (`lb_ctl`), under the names the lab's
//! callers use, and parsers that accept the CLI's output in every shape it
//! takes.

pub use lb_ctl::{BackendStatus, Event, EventKind, ProbeStatus, StatusReport as Status, VipStatus};

/// Unwraps `{"version":2,"response":...,"data":X}` to `X`; anything else is
/// returned as it is.
pub(super) fn unwrap_envelope(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(mut m)
            if m.contains_key("response") && m.contains_key("data") =>
        {
            m.remove("data").unwrap_or_default()
        }
        other => other,
    }
}

/// Parses `xlb status --json` output (the report, or the protocol envelope).
///
/// # Errors
///
/// Text that is not a status report, with serde's reason.
pub fn parse_status(text: &str) -> Result<Status, String> {
    let v: serde_json::Value = serde_json::from_str(text.trim()).map_err(|e| e.to_string())?;
    serde_json::from_value(unwrap_envelope(v)).map_err(|e| e.to_string())
}

/// Parses `xlb events --json` output: a JSON array of events, or one event
/// (or protocol envelope around one event or an array) per line.
///
/// # Errors
///
/// A line that is not JSON, or an item that is not an event.
pub fn parse_events(text: &str) -> Result<Vec<Event>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let whole: Result<serde_json::Value, _> = serde_json::from_str(text);
    let values: Vec<serde_json::Value> = match whole {
        Ok(v) => vec![v],
        Err(_) => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).map_err(|e| format!("{e} in line {l:?}")))
            .collect::<Result<_, _>>()?,
    };
    let mut events = Vec::new();
    for v in values {
        match unwrap_envelope(v) {
            serde_json::Value::Array(items) => {
                for item in items {
                    events.push(serde_json::from_value(item).map_err(|e| e.to_string())?);
                }
            }
            one => events.push(serde_json::from_value(one).map_err(|e| e.to_string())?),
        }
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `xlb status --json` prints for a VIP in panic with an ejected
    /// backend and a healthy one.
    fn report() -> Status {
        let backend = |address: &str, state: &str, placement: &str| BackendStatus {
            address: address.to_string(),
            state: state.to_string(),
            placement: placement.to_string(),
            ..BackendStatus::default()
        };
        Status {
            version: lb_ctl::PROTOCOL_VERSION,
            instance: "lab-x".to_string(),
            adopted: true,
            counters: [("drop_no_backend".to_string(), 7)].into(),
            vips: vec![VipStatus {
                name: "api".to_string(),
                address: "10.100.0.1".to_string(),
                port: 80,
                panic: true,
                panic_reason: Some("kept b2: no_response".to_string()),
                ejected_slow: 1,
                backends: vec![
                    BackendStatus {
                        latency_ms: Some(2500.5),
                        flows: Some(4),
                        ..backend("10.99.0.11:80", "draining", "ejected_slow")
                    },
                    backend("10.99.0.12:80", "up", "serving"),
                ],
                ..VipStatus::default()
            }],
            ..Status::default()
        }
    }

    #[test]
    fn status_parses_report_and_envelope() {
        let want = report();
        let plain = serde_json::to_string(&want).unwrap();
        let envelope = lb_ctl::Response::Status(want.clone()).to_line();
        for (name, text) in [("report", plain), ("envelope", envelope)] {
            let s = parse_status(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(s, want, "{name}");
            assert_eq!(s.counters.get("drop_no_backend"), Some(&7), "{name}");
            let b1 = s.backend(
                "api",
                "10.99.0.11:80".parse::<std::net::SocketAddr>().unwrap(),
            );
            assert_eq!(b1.and_then(|b| b.flows), Some(4), "{name}");
            assert!(!s.all_up(), "{name}");
            assert_eq!(
                s.summary(),
                "api/10.99.0.11:80=draining(ejected_slow) api/10.99.0.12:80=up(serving) api:panic",
                "{name}"
            );
        }
    }

    #[test]
    fn status_from_a_newer_daemon_keeps_its_known_fields() {
        let mut v = serde_json::to_value(report()).unwrap();
        v["field_of_a_later_release"] = serde_json::json!(1);
        v["vips"][0]["backends"][0]["another_one"] = serde_json::json!("x");
        let s = parse_status(&v.to_string()).unwrap();
        assert_eq!(s, report());
    }

    #[test]
    fn status_errors_say_why() {
        let cases = [
            ("not json", "not json", "line 1 column 2"),
            ("no instance", r#"{"vips":[]}"#, "missing field"),
        ];
        for (name, text, want) in cases {
            let err = parse_status(text).unwrap_err();
            assert!(err.contains(want), "{name}: {err}");
        }
    }

    #[test]
    fn events_parse_in_every_shape() {
        let e1 = r#"{"seq":1,"at_unix_ms":10,"kind":"start","vip":null,"backend":null,"from":null,"to":null,"reason":"started"}"#;
        let e2 = r#"{"seq":2,"at_unix_ms":20,"kind":"transition","vip":"api","backend":"10.99.0.12:80","from":"up","to":"down","reason":"timeout"}"#;
        let cases = [
            ("array", format!("[{e1},{e2}]")),
            ("json lines", format!("{e1}\n{e2}\n")),
            (
                "envelope with array",
                format!(r#"{{"version":2,"response":"events","data":[{e1},{e2}]}}"#),
            ),
            (
                "envelope per line",
                format!(
                    "{{\"version\":1,\"response\":\"event\",\"data\":{e1}}}\n\
                     {{\"version\":1,\"response\":\"event\",\"data\":{e2}}}"
                ),
            ),
        ];
        for (name, text) in cases {
            let ev = parse_events(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(ev.len(), 2, "{name}");
            assert_eq!(ev[0].kind, EventKind::Start, "{name}");
            assert_eq!(ev[1].kind, EventKind::Transition, "{name}");
            assert_eq!(ev[1].to.as_deref(), Some("down"), "{name}");
            assert_eq!(ev[1].backend.as_deref(), Some("10.99.0.12:80"), "{name}");
        }
        assert_eq!(parse_events("  \n").unwrap(), Vec::new(), "empty");
        assert!(parse_events("{\"seq\":1}\n").is_err(), "missing fields");
        let unknown = e1.replace("\"start\"", "\"restart\"");
        assert!(parse_events(&unknown).is_err(), "unknown kind");
    }
}
