//! The control socket: how `xlb status`, `xlb drain` and friends reach a
//! running daemon (its client and server ends, and their errors).
//!
//! The messages, their wire format and the protocol's defaults are in the
//! `lb_ctl` crate, shared with the test lab; they are re-exported here, so
//! `crate::ctl::StatusReport` and `lb_user::ctl::Request` name them.

use std::path::PathBuf;

pub use lb_ctl::*;

mod checks;
mod client;
mod server;

pub use checks::{
    MAX_REASON, MIN_TTL, check_backend_name, check_reason, check_request, check_ttl,
    check_whole_family, escape,
};
pub use client::{CONNECT_TIMEOUT, Client, REQUEST_TIMEOUT, request};
pub use server::{
    Handler, HandlerFuture, IDLE_TIMEOUT, MAX_CONNECTIONS, MAX_FOLLOWERS, MAX_LINE, WRITE_TIMEOUT,
    bind, serve,
};

/// Errors of the control socket, on either end.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error(
        "no xlb daemon listening on {}: is `xlb run` running? (--socket, --instance or --config to choose another)",
        path.display()
    )]
    NotRunning { path: PathBuf },
    #[error(
        "permission denied on {}: run as root, or as a member of the daemon's socket_group",
        path.display()
    )]
    PermissionDenied { path: PathBuf },
    #[error(
        "another xlb is running on {}; stop it, or give this one another daemon.control_socket",
        path.display()
    )]
    AlreadyRunning { path: PathBuf },
    #[error(
        "{} exists and is not a socket; remove it, or set daemon.control_socket to another path",
        path.display()
    )]
    NotASocket { path: PathBuf },
    #[error(
        "the directory of the control socket, {}, is {why}: another user could replace the \
         socket and answer the CLI in the daemon's place; set daemon.control_socket to a path \
         in a directory only root can write, e.g. /run/xlb/xlb.sock",
        dir.display()
    )]
    UnsafeDirectory { dir: PathBuf, why: String },
    #[error(
        "socket_group {group:?} does not exist; create it (groupadd {group}), or remove \
         daemon.socket_group to keep the control socket root-only"
    )]
    NoSuchGroup { group: String },
    /// The message holds the cause, so it is not also the error's
    /// `source`: `{:#}` would print it twice ("Broken pipe (os error 32):
    /// Broken pipe (os error 32)").
    #[error("{what} {}: {error}", path.display())]
    Io {
        /// What was being done, e.g. "connecting to".
        what: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "{} is {kind}, not a socket: give --socket the daemon's control socket (its \
         daemon.control_socket, default /run/xlb/xlb.sock), or --instance NAME or --config FILE",
        path.display()
    )]
    NotASocketHere { path: PathBuf, kind: &'static str },
    #[error(
        "{} does not speak xlb's control protocol ({what}); is it the daemon's control \
         socket? Give --socket the path of daemon.control_socket, or --instance NAME or \
         --config FILE",
        path.display()
    )]
    NotXlb { path: PathBuf, what: String },
    #[error("the xlb daemon on {} did not answer within {}s", path.display(), timeout.as_secs())]
    Timeout {
        path: PathBuf,
        timeout: std::time::Duration,
    },
    #[error(
        "{} closed the connection without answering: the daemon stopped, or it is not \
         xlb's control socket",
        path.display()
    )]
    Closed { path: PathBuf },
    #[error("the xlb daemon on {} sent a bad response: {reason}", path.display())]
    BadResponse { path: PathBuf, reason: String },
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::{Value, json};

    pub(crate) const SAMPLE_NOW_MS: u64 = 1_800_000_000_000;

    /// A backend of weight 1 that no probe has reached yet.
    fn backend(
        addr: &str,
        state: &str,
        health: &str,
        drained: bool,
        in_table: bool,
    ) -> BackendStatus {
        BackendStatus {
            address: addr.to_owned(),
            weight: 1,
            state: state.to_owned(),
            health: health.to_owned(),
            admin_drained: drained,
            in_table,
            placement: match state {
                "up" => "serving",
                other => other,
            }
            .to_owned(),
            effective_weight: if in_table { 1.0 } else { 0.0 },
            latency_ms: Some(1.0),
            ..BackendStatus::default()
        }
    }

    fn probe(ok: bool, reason: &str, code: &str, latency_ms: f64, at_unix_ms: u64) -> ProbeStatus {
        ProbeStatus {
            ok,
            reason: reason.to_owned(),
            code: code.to_owned(),
            status: ok.then_some(200),
            latency_ms,
            at_unix_ms,
        }
    }

    /// Up, down (no response) and drained with a deadline, at [`SAMPLE_NOW_MS`].
    fn sample_backends() -> Vec<BackendStatus> {
        let now = SAMPLE_NOW_MS;
        let no_response = "connected, no HTTP response within 1s";
        vec![
            BackendStatus {
                since_unix_ms: now - (12 * 60 + 4) * 1000,
                last_transition_reason: Some("passed 2 consecutive checks".to_owned()),
                last_probe: Some(probe(true, "ok", "ok", 1.2, now - 500)),
                consecutive_ok: 41,
                flows: Some(3712),
                max_flows: Some(5000),
                new_flows_per_sec: 12.0,
                packets_per_sec: 400.0,
                packets: 600_000,
                bytes: 500_000_000,
                new_flows: 30_000,
                agent: Some(crate::ctl::AgentStatus {
                    state: "normal".to_owned(),
                    word: Some("up".to_owned()),
                    weight_percent: 100,
                    line: Some("up".to_owned()),
                    polls: 40,
                    ..crate::ctl::AgentStatus::default()
                }),
                ..backend("10.99.0.11:80", "up", "up", false, true)
            },
            BackendStatus {
                since_unix_ms: now - 35_000,
                last_transition_reason: Some(no_response.to_owned()),
                last_probe: Some(probe(false, no_response, "no_response", 1000.4, now - 1500)),
                consecutive_fail: 7,
                packets: 400_000,
                bytes: 400_000_000,
                new_flows: 20_000,
                ..backend("10.99.0.12:80", "down", "down", false, false)
            },
            BackendStatus {
                weight: 2,
                since_unix_ms: now - 120_000,
                last_transition_reason: Some("drained by an operator".to_owned()),
                last_probe: Some(probe(true, "ok", "ok", 0.9, now - 700)),
                consecutive_ok: 60,
                packets_per_sec: 834.0,
                flows: Some(37),
                drain_deadline_unix_ms: Some(now + 240_000),
                // Healthy traffic: nothing for the status line to say.
                passive: Some(crate::ctl::PassiveStatus {
                    window_ms: 2000,
                    requests_due: 120,
                    connects_due: 60,
                    responses: 121,
                    mean_response_ms: Some(4.5),
                    verdict: "healthy".to_owned(),
                    totals: crate::ctl::PassiveTotals {
                        connects: 900,
                        connected: 900,
                        connect_timeouts: 1,
                        resets: 2,
                        requests: 1800,
                        responses: 1795,
                        unanswered: 3,
                        abandoned: 2,
                    },
                    ..crate::ctl::PassiveStatus::default()
                }),
                ..backend("10.99.0.13:80", "draining", "up", true, false)
            },
        ]
    }

    /// A report with one VIP of three backends in different states, used by
    /// the CLI and metrics tests too.
    pub(crate) fn sample_report() -> StatusReport {
        StatusReport {
            version: PROTOCOL_VERSION,
            instance: "default".to_owned(),
            interface: "eth0".to_owned(),
            xdp_mode: "native".to_owned(),
            started_unix_ms: SAMPLE_NOW_MS - 3 * 3600 * 1000 - 120_000,
            adopted: true,
            config_path: "/etc/xlb/xlb.toml".into(),
            conntrack: ConntrackStatus {
                entries: 1234,
                capacity: 1_048_576,
                established: Some(800),
            },
            counters: lb_common::Stat::ALL
                .iter()
                .enumerate()
                .map(|(i, s)| (s.label().to_owned(), i as u64 * 10))
                .collect(),
            fingerprint: FingerprintStatus {
                config: "1f2e3d4c5b6a7988".to_owned(),
                hash_key: "0a1b2c3d4e5f6071".to_owned(),
            },
            cluster: ClusterStatus {
                node: "lb-a".to_owned(),
                peers: vec!["192.0.2.2:9813".to_owned()],
                timeout_ms: 1000,
            },
            tx_alarm: None,
            vips: vec![VipStatus {
                name: "api".to_owned(),
                address: "10.100.0.1".to_owned(),
                port: 80,
                protocol: "tcp".to_owned(),
                mode: "dsr-ipip".to_owned(),
                down_policy: "rehash".to_owned(),
                second_chance: true,
                table_size: 65537,
                fingerprint: "5a6b7c8d9e0f1a2b".to_owned(),
                backends_up: 2,
                backends_total: 3,
                packets_per_sec: 1234.0,
                new_flows_per_sec: 35.0,
                packets: 1_000_000,
                bytes: 900_000_000,
                new_flows: 50_000,
                max_ejected: 1,
                min_healthy: 1,
                backends: sample_backends(),
                ..VipStatus::default()
            }],
            announce: None,
            nat: None,
        }
    }

    pub(crate) fn sample_event(seq: u64) -> Event {
        Event {
            seq,
            at_unix_ms: 1_796_000_000_000 + seq,
            kind: EventKind::Transition,
            vip: Some("api".to_owned()),
            backend: Some("10.99.0.12:80".to_owned()),
            from: Some("up".to_owned()),
            to: Some("down".to_owned()),
            reason: "connected, no HTTP response within 1s".to_owned(),
            table_build_us: Some(400),
            table_slots_changed: Some(1312),
        }
    }

    fn sample_explain() -> ExplainReport {
        ExplainReport {
            protocol: "tcp".to_owned(),
            client: "192.0.2.10:51234".to_owned(),
            vip: "10.100.0.1:80".to_owned(),
            vip_name: "api".to_owned(),
            backend: Some("10.99.0.11:80".to_owned()),
            via: "table".to_owned(),
            slot: Some(4242),
            table_size: 65537,
            backend_state: Some("up".to_owned()),
            detail: "no conntrack entry; slot 4242 of the table holds 10.99.0.11:80".to_owned(),
        }
    }

    /// The keys of a JSON object, sorted.
    fn keys(v: &Value) -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    }

    #[test]
    fn responses_round_trip() {
        let cases = [
            ("status", Response::Status(sample_report())),
            (
                "events",
                Response::Events(vec![sample_event(1), sample_event(2)]),
            ),
            ("event", Response::Event(sample_event(3))),
            ("explain", Response::Explain(sample_explain())),
            ("ok", Response::ok("drained")),
            ("error", Response::error("no such vip")),
        ];
        for (name, resp) in cases {
            let line = resp.to_line();
            assert!(
                line.ends_with('\n') && !line[..line.len() - 1].contains('\n'),
                "{name}"
            );
            assert!(
                line.starts_with(r#"{"version":2,"response":""#),
                "{name}: {line}"
            );
            assert_eq!(parse_response(line.as_bytes()), Ok(resp), "{name}");
        }
        assert_eq!(
            Response::error("no such vip").to_line(),
            "{\"version\":2,\"response\":\"error\",\"data\":{\"message\":\"no such vip\"}}\n"
        );
    }

    /// Pins the `StatusReport` schema (the `xlb status --json` output): every
    /// key, its JSON type and spelling. The VIP and backend parts follow.
    #[test]
    fn status_report_schema() {
        let v = serde_json::to_value(sample_report()).unwrap();
        assert_eq!(
            keys(&v),
            [
                "adopted",
                "cluster",
                "config_path",
                "conntrack",
                "counters",
                "fingerprint",
                "instance",
                "interface",
                "started_unix_ms",
                "version",
                "vips",
                "xdp_mode"
            ]
        );
        assert_eq!(v["version"], json!(2));
        assert_eq!(v["instance"], json!("default"));
        assert_eq!(v["interface"], json!("eth0"));
        assert_eq!(v["xdp_mode"], json!("native"));
        assert_eq!(v["started_unix_ms"], json!(1_799_989_080_000_u64));
        assert_eq!(v["adopted"], json!(true));
        assert_eq!(v["config_path"], json!("/etc/xlb/xlb.toml"));
        assert_eq!(
            v["fingerprint"],
            json!({"config": "1f2e3d4c5b6a7988", "hash_key": "0a1b2c3d4e5f6071"})
        );
        assert_eq!(
            v["cluster"],
            json!({"node": "lb-a", "peers": ["192.0.2.2:9813"], "timeout_ms": 1000})
        );
        assert_eq!(
            v["conntrack"],
            json!({"entries": 1234, "capacity": 1_048_576, "established": 800})
        );
        let counters = v["counters"].as_object().unwrap();
        assert_eq!(counters.len(), lb_common::Stat::ALL.len());
        assert_eq!(counters["fwd_tx"], json!(0));
        assert_eq!(counters["ct_hit"], json!(20));
        assert!(counters.values().all(Value::is_u64));
    }

    #[test]
    fn vip_status_schema() {
        let v = serde_json::to_value(sample_report()).unwrap();
        let vip = &v["vips"][0];
        assert_eq!(
            keys(vip),
            [
                "address",
                "announce",
                "auto_timeout_ms",
                "backends",
                "backends_total",
                "backends_up",
                "bytes",
                "down_policy",
                "ejected_slow",
                "fingerprint",
                "fleet_slow",
                "max_ejected",
                "min_healthy",
                "mode",
                "name",
                "new_flows",
                "new_flows_per_sec",
                "packets",
                "packets_per_sec",
                "panic",
                "panic_reason",
                "port",
                "protocol",
                "second_chance",
                "table_size"
            ]
        );
        let want_vip = [
            ("name", json!("api")),
            ("address", json!("10.100.0.1")),
            ("port", json!(80)),
            ("protocol", json!("tcp")),
            ("mode", json!("dsr-ipip")),
            ("down_policy", json!("rehash")),
            ("second_chance", json!(true)),
            ("table_size", json!(65537)),
            ("fingerprint", json!("5a6b7c8d9e0f1a2b")),
            ("backends_up", json!(2)),
            ("backends_total", json!(3)),
            ("packets_per_sec", json!(1234.0)),
            ("new_flows_per_sec", json!(35.0)),
            ("packets", json!(1_000_000)),
            ("bytes", json!(900_000_000)),
            ("new_flows", json!(50_000)),
        ];
        for (key, want) in want_vip {
            assert_eq!(vip[key], want, "vip.{key}");
        }
        assert!(vip["packets_per_sec"].is_f64());
    }

    #[test]
    fn backend_status_keys() {
        let v = serde_json::to_value(sample_report()).unwrap();
        assert_eq!(
            keys(&v["vips"][0]["backends"][1]),
            [
                "address",
                "admin_drained",
                "agent",
                "bytes",
                "consecutive_fail",
                "consecutive_ok",
                "consecutive_slow",
                "drain_deadline_unix_ms",
                "effective_weight",
                "flows",
                "health",
                "in_table",
                "last_probe",
                "last_transition_reason",
                "latency_ms",
                "max_flows",
                "new_flows",
                "new_flows_per_sec",
                "packets",
                "packets_per_sec",
                "placement",
                "placement_reason",
                "probe_local_errors",
                "since_unix_ms",
                "state",
                "weight"
            ]
        );
    }

    #[test]
    fn backend_status_values() {
        let v = serde_json::to_value(sample_report()).unwrap();
        let backends = &v["vips"][0]["backends"];
        let b = &backends[1];
        let want_backend = [
            ("address", json!("10.99.0.12:80")),
            ("weight", json!(1)),
            ("state", json!("down")),
            ("health", json!("down")),
            ("admin_drained", json!(false)),
            ("in_table", json!(false)),
            ("since_unix_ms", json!(1_799_999_965_000_u64)),
            (
                "last_transition_reason",
                json!("connected, no HTTP response within 1s"),
            ),
            ("consecutive_ok", json!(0)),
            ("consecutive_fail", json!(7)),
            ("new_flows_per_sec", json!(0.0)),
            ("packets_per_sec", json!(0.0)),
            ("packets", json!(400_000)),
            ("bytes", json!(400_000_000)),
            ("new_flows", json!(20_000)),
            ("flows", Value::Null),
            ("drain_deadline_unix_ms", Value::Null),
        ];
        for (key, want) in want_backend {
            assert_eq!(b[key], want, "backend.{key}");
        }
        assert_eq!(
            b["last_probe"],
            json!({
                "ok": false,
                "reason": "connected, no HTTP response within 1s",
                "code": "no_response",
                "status": null,
                "latency_ms": 1000.4,
                "at_unix_ms": 1_799_999_998_500_u64,
            })
        );
        let states: Vec<&Value> = backends
            .as_array()
            .unwrap()
            .iter()
            .map(|b| &b["state"])
            .collect();
        assert_eq!(states, [&json!("up"), &json!("down"), &json!("draining")]);
        assert_eq!(backends[2]["admin_drained"], json!(true));
        assert_eq!(backends[2]["flows"], json!(37));
        assert_eq!(
            backends[2]["drain_deadline_unix_ms"],
            json!(1_800_000_240_000_u64)
        );
    }

    #[test]
    fn event_and_explain_schema() {
        assert_eq!(
            serde_json::to_value(sample_event(5)).unwrap(),
            json!({
                "seq": 5,
                "at_unix_ms": 1_796_000_000_005_u64,
                "kind": "transition",
                "vip": "api",
                "backend": "10.99.0.12:80",
                "from": "up",
                "to": "down",
                "reason": "connected, no HTTP response within 1s",
                "table_build_us": 400,
                "table_slots_changed": 1312,
            })
        );
        assert_eq!(
            serde_json::to_value(sample_explain()).unwrap(),
            json!({
                "protocol": "tcp",
                "client": "192.0.2.10:51234",
                "vip": "10.100.0.1:80",
                "vip_name": "api",
                "backend": "10.99.0.11:80",
                "via": "table",
                "slot": 4242,
                "table_size": 65537,
                "backend_state": "up",
                "detail": "no conntrack entry; slot 4242 of the table holds 10.99.0.11:80",
            })
        );
        let none = ExplainReport {
            via: "none".to_owned(),
            backend: None,
            ..sample_explain()
        };
        let v = serde_json::to_value(&none).unwrap();
        assert_eq!(v["via"], json!("none"));
        assert_eq!(v["backend"], Value::Null);
    }

    #[test]
    fn configuration_defaults_are_the_protocols() {
        use crate::config::defaults;
        assert_eq!(defaults::CONTROL_SOCKET, DEFAULT_CONTROL_SOCKET);
        assert_eq!(defaults::INSTANCE, DEFAULT_INSTANCE);
    }
}
