//! `GET /events?since=N` on the metrics listener: the events the daemon
//! retains with `seq` above N, oldest first, as the JSON array `xlb events
//! --json --since N` prints (read-only, under the endpoint's limits). A
//! dashboard or a log shipper polls it with the `seq` of the last event it
//! saw; the numbers go on across restarts.

use super::MetricsSource;
use super::endpoint::plain;

/// The answer to a request for `/events` with query `query` (after `?`).
pub(super) fn respond(method: &str, query: &str, source: &dyn MetricsSource) -> Vec<u8> {
    if method != "GET" && method != "HEAD" {
        return plain(
            405,
            "Method Not Allowed",
            "only GET and HEAD\n",
            &["Allow: GET, HEAD"],
        );
    }
    let since = match since(query) {
        Ok(s) => s,
        Err(why) => return plain(400, "Bad Request", &format!("{why}\n"), &[]),
    };
    let events = source.events_since(since);
    let mut body = match serde_json::to_string_pretty(&events) {
        Ok(body) => body,
        Err(e) => {
            let why = format!("cannot encode the events: {e}\n");
            return plain(500, "Internal Server Error", &why, &[]);
        }
    };
    body.push('\n');
    super::endpoint::ok(method, "application/json", &body)
}

/// The `since` of a query string: 0 (every retained event) without one.
/// Other parameters are ignored, as `/metrics` ignores them.
fn since(query: &str) -> Result<u64, String> {
    let mut found = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "since" {
            continue;
        }
        if found.is_some() {
            return Err("since is given twice; give it once, e.g. /events?since=42".to_string());
        }
        let n = value.parse::<u64>().map_err(|_| {
            format!(
                "since={value:?} is not an event number; give the seq of the last event \
                 you saw (a whole number, 0 for every retained event), e.g. /events?since=42"
            )
        })?;
        found = Some(n);
    }
    Ok(found.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::{Event, EventKind, StatusReport};
    use crate::metrics::MetricsExtra;

    fn event(seq: u64) -> Event {
        Event {
            seq,
            at_unix_ms: 1_800_000_000_000 + seq,
            kind: EventKind::Transition,
            vip: Some("api".into()),
            backend: Some("10.99.0.12:80".into()),
            from: Some("up".into()),
            to: Some("down".into()),
            reason: "<script>alert(1)</script>".into(),
            table_build_us: None,
            table_slots_changed: None,
        }
    }

    /// Events 100_001 to 100_004, as after a restart.
    struct Log;

    impl MetricsSource for Log {
        fn snapshot(&self) -> (StatusReport, MetricsExtra) {
            Default::default()
        }
        fn events_since(&self, since: u64) -> Vec<Event> {
            (100_001..=100_004)
                .filter(|&s| s > since)
                .map(event)
                .collect()
        }
    }

    fn answer(method: &str, query: &str) -> (String, String) {
        let out = String::from_utf8(respond(method, query, &Log)).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        (head.to_string(), body.to_string())
    }

    #[test]
    fn events_since_n_are_the_json_of_xlb_events() {
        let (head, body) = answer("GET", "since=100002");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains("Content-Type: application/json\r\n"),
            "{head}"
        );
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        // What `xlb events --json --since 100002` prints.
        let want = serde_json::to_string_pretty(&[event(100_003), event(100_004)]).unwrap() + "\n";
        assert_eq!(body, want);
        // (query, seqs served)
        let cases: [(&str, &[u64]); 4] = [
            ("", &[100_001, 100_002, 100_003, 100_004]),
            ("since=0", &[100_001, 100_002, 100_003, 100_004]),
            ("x=1&since=100003", &[100_004]),
            ("since=100004", &[]),
        ];
        for (query, want) in cases {
            let (head, body) = answer("GET", query);
            assert!(head.starts_with("HTTP/1.1 200 OK"), "{query}: {head}");
            let got: Vec<Event> = serde_json::from_str(&body).unwrap();
            let seqs: Vec<u64> = got.iter().map(|e| e.seq).collect();
            assert_eq!(seqs, want, "{query}");
        }
        let (head, body) = answer("HEAD", "since=1");
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert_eq!(body, "");
    }

    #[test]
    fn a_bad_since_is_a_400_that_says_what_to_send() {
        // (query, body)
        let cases = [
            (
                "since=abc",
                "since=\"abc\" is not an event number; give the seq of the last event you saw \
                 (a whole number, 0 for every retained event), e.g. /events?since=42\n",
            ),
            (
                "since=-1",
                "since=\"-1\" is not an event number; give the seq of the last event you saw \
                 (a whole number, 0 for every retained event), e.g. /events?since=42\n",
            ),
            (
                "since=",
                "since=\"\" is not an event number; give the seq of the last event you saw \
                 (a whole number, 0 for every retained event), e.g. /events?since=42\n",
            ),
            (
                "since=1&since=2",
                "since is given twice; give it once, e.g. /events?since=42\n",
            ),
        ];
        for (query, want) in cases {
            let (head, body) = answer("GET", query);
            assert!(
                head.starts_with("HTTP/1.1 400 Bad Request\r\n"),
                "{query}: {head}"
            );
            assert_eq!(body, want, "{query}");
        }
        let (head, _) = answer("POST", "since=1");
        assert!(head.starts_with("HTTP/1.1 405"), "{head}");
    }
}
