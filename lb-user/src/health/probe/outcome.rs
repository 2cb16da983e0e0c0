//! What a probe concluded: [`ProbeResult`] (the raw outcome and latency),
//! [`ProbeClass`] (what it means for the backend, judged against the
//! check's `timeout`) and [`FailReason`] (why it failed), each with the text
//! operators read and a stable code for JSON and metrics.

use std::fmt;
use std::time::Duration;

use super::dns::DnsFail;

/// A probe that passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeOk {
    /// The final HTTP status; `None` for a TCP check.
    pub status: Option<u16>,
}

/// The outcome of one probe and how long it took (until the verdict: for a
/// failure by timeout this is about `spec.hang_timeout`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeResult {
    pub outcome: Result<ProbeOk, FailReason>,
    pub latency: Duration,
    /// Set when a data-path probe failed for this host's own reason (no
    /// route to the VIP out of the interface, a neighbour that never
    /// resolved): the text for the operator, with the fix. `outcome` and
    /// `latency` are then the direct probe's, so the backend keeps the
    /// state its direct probes give; the daemon raises an `alarm`.
    pub path_fault: Option<String>,
}

impl ProbeResult {
    pub fn is_ok(&self) -> bool {
        self.outcome.is_ok()
    }

    /// What this final result means for the backend, judged against the
    /// check's `timeout`: a pass after it is [`ProbeClass::Slow`], an error
    /// of the load balancer's own is [`ProbeClass::Local`].
    pub fn class(&self, timeout: Duration) -> ProbeClass {
        match &self.outcome {
            Ok(_) if self.latency > timeout => ProbeClass::Slow {
                latency: self.latency,
                timeout,
            },
            Ok(_) => ProbeClass::Ok,
            Err(fail @ FailReason::Local { .. }) => ProbeClass::Local(fail.clone()),
            Err(fail) => ProbeClass::Failed(fail.clone()),
        }
    }
}

/// What a probe report says about the backend. Only `Failed` counts toward
/// `fall`; `Ok` and `Slow` count toward `rise` (a slow answer proves the
/// application is alive); `Late` and `Local` move neither streak.
/// `Display` is the text for operators, [`ProbeClass::code`] the stable id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeClass {
    /// A complete, passing response within `timeout`.
    Ok,
    /// Interim, never final: `timeout` passed without a complete response
    /// and the probe goes on until `hang_timeout`. Its latency is at least
    /// `timeout`.
    Late { timeout: Duration },
    /// A complete, passing response after `timeout` (within `hang_timeout`).
    /// Not a failure.
    Slow {
        latency: Duration,
        timeout: Duration,
    },
    /// The backend failed the check (refused, reset, closed, malformed, bad
    /// status or body, no complete response within `hang_timeout`, invalid
    /// check). Counts toward `fall`.
    Failed(FailReason),
    /// The load balancer's own fault (always [`FailReason::Local`]): out of
    /// descriptors or buffers, no route from this host. Never counts toward
    /// `fall`; raise an alarm instead.
    Local(FailReason),
}

impl ProbeClass {
    /// Stable snake_case identifier: `ok`, `late`, `slow`, `local_error`, or
    /// the failure's [`FailReason::code`].
    pub fn code(&self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Late { .. } => "late",
            Self::Slow { .. } => "slow",
            Self::Failed(fail) | Self::Local(fail) => fail.code(),
        }
    }

    /// Whether this is a final verdict of a failed check (counts toward `fall`).
    pub fn is_failure(&self) -> bool {
        matches!(self, Self::Failed(_))
    }
}

impl fmt::Display for ProbeClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ok => f.write_str("ok"),
            Self::Late { timeout } => {
                write!(
                    f,
                    "no complete answer within timeout {} yet",
                    Compact(*timeout)
                )
            }
            Self::Slow { latency, timeout } => write!(
                f,
                "answered in {} (slower than timeout {})",
                Compact(*latency),
                Compact(*timeout)
            ),
            Self::Failed(fail) | Self::Local(fail) => fail.fmt(f),
        }
    }
}

/// Why a probe failed. `Display` is the text shown to operators (logs, CLI);
/// [`FailReason::code`] is a stable identifier for JSON and metrics.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FailReason {
    /// Nothing listens on the port (RST to our SYN).
    #[error("connection refused")]
    ConnectionRefused,
    /// The backend reset the connection at any point of the exchange.
    #[error("connection reset")]
    ConnectionReset,
    /// No handshake within `hang_timeout` (the field): host down, packets
    /// dropped, or an accept queue overflowing.
    #[error("connect timeout after {}", Compact(*.timeout))]
    ConnectTimeout { timeout: Duration },
    /// The kernel completed the handshake but not one byte of response came
    /// within `hang_timeout` (the field): the application is hung (e.g. a
    /// blocked Node.js event loop).
    #[error("connected, no HTTP response within {}", Compact(*.timeout))]
    NoResponse { timeout: Duration },
    /// Some bytes came, but not a complete response within `hang_timeout`.
    #[error("response incomplete within {} ({received} bytes received)", Compact(*.timeout))]
    Incomplete { timeout: Duration, received: usize },
    /// The backend closed the connection before the response was complete.
    #[error("{}", closed_text(*.received))]
    Closed { received: usize },
    /// Bytes that are not an HTTP/1.x response.
    #[error("malformed response: {reason}")]
    Malformed { reason: String },
    /// A well-formed response with a status outside `expect_status`.
    #[error("unexpected status {status}")]
    UnexpectedStatus { status: u16 },
    /// The first `BODY_LIMIT` bytes of the body lack `body_contains`.
    #[error("body mismatch: first 4 KiB of the body do not contain {expected:?}")]
    BodyMismatch { expected: String },
    /// The check itself cannot be sent (see `HttpCheck::validate`).
    #[error("invalid check: {reason}")]
    InvalidCheck { reason: String },
    /// Any other socket error (e.g. an ICMP "no route to host" from a router
    /// on the way).
    #[error("I/O error while {during}: {error}")]
    Io { during: &'static str, error: String },
    /// The load balancer could not probe: out of file descriptors (EMFILE,
    /// ENFILE), socket buffers or memory (ENOBUFS, ENOMEM), local ports
    /// (EADDRNOTAVAIL), or no route from this host (ENETUNREACH,
    /// EHOSTUNREACH returned by `connect(2)` itself). Says nothing about the
    /// backend: never counts toward `fall` (see [`ProbeClass::Local`]).
    #[error("local error, not the backend's fault: {error} while {during}")]
    Local { during: &'static str, error: String },
    /// A data-path probe (`via = "vip"`) got no answer while a direct probe
    /// of the same backend did: the backend serves, but clients' packets
    /// sent to it are lost (decapsulator stopped, VIP missing from `lo`,
    /// service not bound to the VIP). `text` is the whole operator text:
    /// `no answer via VIP 10.100.0.1:80 through dsr-ipip (connect timeout
    /// after 3s); direct probe ok`.
    #[error("{text}")]
    NoAnswerViaVip { text: String },
    /// A datagram probe (`dns`, `udp`) got no answer from the backend's
    /// address and port within `hang_timeout` (the field): the application
    /// is hung, or the request or the answer was lost.
    #[error("no answer within {}", Compact(*.timeout))]
    NoDatagram { timeout: Duration },
    /// ICMP port unreachable in answer to a datagram probe: nothing
    /// listens on the port (UDP's "connection refused").
    #[error("port unreachable (nothing listens on the port)")]
    PortUnreachable,
    /// A DNS answer that fails the check (`kind = "dns"`).
    #[error("{0}")]
    Dns(DnsFail),
    /// A send/expect check's answer was missing or did not match.
    #[error(transparent)]
    Expect(#[from] super::expect::ExpectFail),
    /// A `kind = "grpc"` verdict (see `probe::grpc`).
    #[error("{0}")]
    Grpc(super::grpc::GrpcFail),
    // TLS (`kind = "https"`, gRPC over TLS): see `probe::tls`.
    /// TCP connected, but no complete TLS handshake within `hang_timeout`.
    #[error("connected, no complete TLS handshake within {}", Compact(*.timeout))]
    TlsHandshakeTimeout { timeout: Duration },
    /// The certificate's validity dates exclude now: `detail` gives them.
    #[error("TLS certificate {detail}; renew it on the backend (or check this host's clock)")]
    TlsCertExpired { detail: String },
    /// The certificate does not hold the name it is checked against.
    #[error("{}", wrong_name_text(.expected, .presented))]
    TlsCertWrongName {
        expected: String,
        presented: Vec<String>,
    },
    /// The certificate's chain does not lead to a trusted CA; `roots` says
    /// which were trusted (`the system roots`, `ca_file /etc/...`).
    #[error(
        "TLS certificate signed by a CA not in {roots}; set ca_file to the CA that signed it, \
         or tls_verify = false for a self-signed backend"
    )]
    TlsCertUnknownIssuer { roots: String },
    /// Any other certificate problem (bad encoding, revoked, wrong usage...).
    #[error("TLS certificate invalid: {error}")]
    TlsCertInvalid { error: String },
    /// The server's alert, or bytes that are not TLS (a plaintext server, a
    /// truncated or garbled record), in rustls's words.
    #[error("TLS handshake failed: {error}")]
    TlsHandshakeFailed { error: String },
    /// The backend closed the connection before the handshake completed.
    #[error("connection closed during the TLS handshake")]
    TlsClosed,
}

fn wrong_name_text(expected: &str, presented: &[String]) -> String {
    let mut text = format!("TLS certificate is not valid for {expected:?}");
    if !presented.is_empty() {
        // Debug-quoted: the names come from the backend, and may hold
        // anything a log line should not.
        let names: Vec<String> = presented.iter().map(|n| format!("{n:?}")).collect();
        text.push_str(&format!(" (it names {})", names.join(", ")));
    }
    text.push_str("; set host to a name the certificate holds, or fix the certificate");
    text
}

fn closed_text(received: usize) -> String {
    if received == 0 {
        "connection closed with no HTTP response".to_owned()
    } else {
        format!("connection closed after {received} bytes, response incomplete")
    }
}

impl FailReason {
    /// Stable snake_case identifier, for JSON output and metric labels.
    pub fn code(&self) -> &'static str {
        match self {
            Self::ConnectionRefused => "connection_refused",
            Self::ConnectionReset => "connection_reset",
            Self::ConnectTimeout { .. } => "connect_timeout",
            Self::NoResponse { .. } => "no_response",
            Self::Incomplete { .. } => "response_incomplete",
            Self::Closed { .. } => "connection_closed",
            Self::Malformed { .. } => "malformed_response",
            Self::UnexpectedStatus { .. } => "unexpected_status",
            Self::BodyMismatch { .. } => "body_mismatch",
            Self::InvalidCheck { .. } => "invalid_check",
            Self::Io { .. } => "io_error",
            Self::Local { .. } => "local_error",
            Self::NoAnswerViaVip { .. } => "no_answer_via_vip",
            Self::NoDatagram { .. } => "no_answer",
            Self::PortUnreachable => "port_unreachable",
            Self::Dns(fail) => fail.code(),
            Self::Expect(fail) => fail.code(),
            Self::Grpc(fail) => fail.code(),
            Self::TlsHandshakeTimeout { .. } => "tls_handshake_timeout",
            Self::TlsCertExpired { .. } => "tls_cert_expired",
            Self::TlsCertWrongName { .. } => "tls_cert_wrong_name",
            Self::TlsCertUnknownIssuer { .. } => "tls_cert_unknown_issuer",
            Self::TlsCertInvalid { .. } => "tls_cert_invalid",
            Self::TlsHandshakeFailed { .. } => "tls_handshake_failed",
            Self::TlsClosed => "tls_handshake_closed",
        }
    }

    /// A response that is not well-formed HTTP/1.x, for `reason`.
    pub(super) fn malformed(reason: impl Into<String>) -> Self {
        Self::Malformed {
            reason: reason.into(),
        }
    }
}

/// Formats a duration compactly for operators: `1s`, `200ms`, `1.5s`, `250µs`.
#[derive(Clone, Copy, Debug)]
pub struct Compact(pub Duration);

impl fmt::Display for Compact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d >= Duration::from_secs(1) {
            let secs = d.as_secs();
            // Millisecond precision is all an operator needs; trailing zeros go.
            let millis = d.subsec_millis();
            if millis == 0 {
                write!(f, "{secs}s")
            } else {
                let frac = format!("{millis:03}");
                write!(f, "{secs}.{}s", frac.trim_end_matches('0'))
            }
        } else if d >= Duration::from_millis(1) {
            let millis = d.as_millis();
            let micros = d.subsec_micros() % 1000;
            if micros == 0 {
                write!(f, "{millis}ms")
            } else {
                let frac = format!("{micros:03}");
                write!(f, "{millis}.{}ms", frac.trim_end_matches('0'))
            }
        } else {
            write!(f, "{}µs", d.as_micros())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_reason_text_and_code() {
        let cases: &[(FailReason, &str, &str)] = &[
            (
                FailReason::ConnectionRefused,
                "connection refused",
                "connection_refused",
            ),
            (
                FailReason::ConnectionReset,
                "connection reset",
                "connection_reset",
            ),
            (
                FailReason::ConnectTimeout {
                    timeout: Duration::from_secs(1),
                },
                "connect timeout after 1s",
                "connect_timeout",
            ),
            (
                FailReason::NoResponse {
                    timeout: Duration::from_secs(1),
                },
                "connected, no HTTP response within 1s",
                "no_response",
            ),
            (
                FailReason::NoResponse {
                    timeout: Duration::from_millis(200),
                },
                "connected, no HTTP response within 200ms",
                "no_response",
            ),
            (
                FailReason::NoResponse {
                    timeout: Duration::from_millis(1500),
                },
                "connected, no HTTP response within 1.5s",
                "no_response",
            ),
            (
                FailReason::Incomplete {
                    timeout: Duration::from_secs(2),
                    received: 3,
                },
                "response incomplete within 2s (3 bytes received)",
                "response_incomplete",
            ),
            (
                FailReason::Closed { received: 0 },
                "connection closed with no HTTP response",
                "connection_closed",
            ),
            (
                FailReason::Closed { received: 12 },
                "connection closed after 12 bytes, response incomplete",
                "connection_closed",
            ),
            (
                FailReason::malformed("invalid status line"),
                "malformed response: invalid status line",
                "malformed_response",
            ),
            (
                FailReason::UnexpectedStatus { status: 503 },
                "unexpected status 503",
                "unexpected_status",
            ),
            (
                FailReason::BodyMismatch {
                    expected: "ok".into(),
                },
                "body mismatch: first 4 KiB of the body do not contain \"ok\"",
                "body_mismatch",
            ),
            (
                FailReason::InvalidCheck {
                    reason: "bad path".into(),
                },
                "invalid check: bad path",
                "invalid_check",
            ),
            (
                FailReason::Io {
                    during: "connecting",
                    error: "No route to host".into(),
                },
                "I/O error while connecting: No route to host",
                "io_error",
            ),
            (
                FailReason::Local {
                    during: "creating a socket",
                    error: "Too many open files (os error 24)".into(),
                },
                "local error, not the backend's fault: Too many open files (os error 24) while \
                 creating a socket",
                "local_error",
            ),
            (
                FailReason::NoDatagram {
                    timeout: Duration::from_millis(300),
                },
                "no answer within 300ms",
                "no_answer",
            ),
            (
                FailReason::PortUnreachable,
                "port unreachable (nothing listens on the port)",
                "port_unreachable",
            ),
        ];
        for (reason, text, code) in cases {
            assert_eq!(reason.to_string(), *text, "{reason:?}");
            assert_eq!(reason.code(), *code, "{reason:?}");
        }
    }

    #[test]
    fn probe_class_text_and_code() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let result = |outcome, latency| ProbeResult {
            outcome,
            latency,
            path_fault: None,
        };
        let passed = Ok(ProbeOk { status: Some(200) });
        let local = FailReason::Local {
            during: "connecting",
            error: "Cannot assign requested address (os error 99)".into(),
        };
        // (name, result, timeout, class, text, code)
        let cases = [
            (
                "within timeout",
                result(passed.clone(), ms(3)),
                s(1),
                ProbeClass::Ok,
                "ok",
                "ok",
            ),
            (
                "exactly the timeout",
                result(passed.clone(), s(1)),
                s(1),
                ProbeClass::Ok,
                "ok",
                "ok",
            ),
            (
                "slower than timeout",
                result(passed.clone(), ms(2500)),
                s(1),
                ProbeClass::Slow {
                    latency: ms(2500),
                    timeout: s(1),
                },
                "answered in 2.5s (slower than timeout 1s)",
                "slow",
            ),
            (
                "no response within hang_timeout",
                result(Err(FailReason::NoResponse { timeout: s(3) }), s(3)),
                s(1),
                ProbeClass::Failed(FailReason::NoResponse { timeout: s(3) }),
                "connected, no HTTP response within 3s",
                "no_response",
            ),
            (
                "a fast failure",
                result(Err(FailReason::ConnectionRefused), ms(1)),
                s(1),
                ProbeClass::Failed(FailReason::ConnectionRefused),
                "connection refused",
                "connection_refused",
            ),
            (
                "local error",
                result(Err(local.clone()), ms(1)),
                s(1),
                ProbeClass::Local(local.clone()),
                "local error, not the backend's fault: Cannot assign requested address \
                 (os error 99) while connecting",
                "local_error",
            ),
        ];
        for (name, result, timeout, class, text, code) in cases {
            let got = result.class(timeout);
            assert_eq!(got, class, "{name}");
            assert_eq!(got.to_string(), text, "{name}");
            assert_eq!(got.code(), code, "{name}");
            assert_eq!(
                got.is_failure(),
                matches!(got, ProbeClass::Failed(_)),
                "{name}"
            );
        }
        let late = ProbeClass::Late { timeout: s(1) };
        assert_eq!(late.to_string(), "no complete answer within timeout 1s yet");
        assert_eq!(late.code(), "late");
        assert!(!late.is_failure());
    }

    #[test]
    fn compact_durations() {
        let cases = [
            ("whole seconds", Duration::from_secs(1), "1s"),
            ("minutes stay seconds", Duration::from_secs(90), "90s"),
            ("milliseconds", Duration::from_millis(200), "200ms"),
            ("fractional seconds", Duration::from_millis(1500), "1.5s"),
            ("two decimals", Duration::from_millis(1250), "1.25s"),
            (
                "fractional milliseconds",
                Duration::from_micros(1500),
                "1.5ms",
            ),
            ("microseconds", Duration::from_micros(250), "250µs"),
            ("zero", Duration::ZERO, "0µs"),
        ];
        for (name, d, text) in cases {
            assert_eq!(Compact(d).to_string(), text, "{name}");
        }
    }
}
