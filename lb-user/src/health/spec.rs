//! What to probe and how: the runtime form of a health-check configuration
//! (built from the TOML by `config`, consumed by the prober and the state machine).

use std::time::Duration;

/// How a backend is probed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckKind {
    /// An HTTP/1.1 request; the application must answer.
    Http(HttpCheck),
    /// TCP connect only: proves the kernel accepts, not that the application
    /// answers. For non-HTTP services and for comparison.
    Tcp,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpCheck {
    /// Request method, e.g. "GET".
    pub method: String,
    /// Request target, e.g. "/health".
    pub path: String,
    /// Host header; `None` = the backend's address:port.
    pub host: Option<String>,
    /// Accepted status codes as inclusive ranges, e.g. `[(200, 299)]`.
    pub expect_status: Vec<(u16, u16)>,
    /// If set, the first 4 KiB of the body must contain this.
    pub body_contains: Option<String>,
}

/// A complete, validated check specification for one backend.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckSpec {
    pub kind: CheckKind,
    /// Port probed (the backend's health port, or its service port).
    pub port: u16,
    /// Period between probes while the backend is steadily up.
    pub interval: Duration,
    /// Deadline for the whole probe: connect, request and response.
    pub timeout: Duration,
    /// Consecutive successes that bring a backend up.
    pub rise: u32,
    /// Consecutive failures that take an up backend down.
    pub fall: u32,
    /// Period while a backend is between states (some successes or failures
    /// counted, threshold not yet reached).
    pub fast_interval: Duration,
    /// Period while a backend is down.
    pub down_interval: Duration,
    /// Jitter as a fraction of the period: each delay is drawn uniformly from
    /// `period × [1 − jitter, 1 + jitter]`. 0.1 = ±10 %.
    pub jitter: f64,
}

/// Defaults (documented in the README and `examples/xlb.toml`).
pub mod defaults {
    use std::time::Duration;
    pub const INTERVAL: Duration = Duration::from_secs(2);
    pub const TIMEOUT: Duration = Duration::from_secs(1);
    pub const RISE: u32 = 2;
    pub const FALL: u32 = 3;
    pub const FAST_INTERVAL: Duration = Duration::from_millis(500);
    pub const DOWN_INTERVAL: Duration = Duration::from_secs(5);
    pub const JITTER: f64 = 0.1;
    pub const HTTP_METHOD: &str = "GET";
    pub const HTTP_PATH: &str = "/health";
    pub const EXPECT_STATUS: (u16, u16) = (200, 399);
}
