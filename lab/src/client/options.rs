//! What the load client runs ([`LoadOptions`]), and why options are refused.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub target: SocketAddr,
    /// Requests start only within this time.
    pub duration: Duration,
    /// New short connections per second (one request each, `Connection: close`).
    pub rate: u32,
    /// Number of keep-alive connections doing back-to-back requests.
    pub keepalive: u32,
    /// Pause between two requests on a keep-alive connection.
    pub keepalive_interval: Duration,
    /// Number of long-lived `/stream` connections.
    pub long: u32,
    /// Interval asked of the server for `/stream` lines.
    pub stream_interval: Duration,
    /// A long connection that receives nothing for longer than this stalled.
    pub stall_after: Duration,
    /// Bound on one request (connect + request + response).
    pub timeout: Duration,
    /// Most short connections in flight at once; starts beyond it are skipped
    /// (and counted) rather than queued, so the rate stays honest.
    pub max_in_flight: usize,
    /// Path requested by short and keep-alive connections.
    pub path: String,
    /// Width of one timeline slice.
    pub slice: Duration,
    /// Source addresses the connections take in turn (each must be the
    /// client's own); empty: the kernel picks. Several addresses are
    /// several clients to the load balancer (its sources, passive
    /// detection's client prefixes).
    pub sources: Vec<IpAddr>,
}

impl LoadOptions {
    /// Defaults matching the `xlb-client` command line, against `target`.
    pub fn new(target: SocketAddr) -> Self {
        Self {
            target,
            duration: Duration::from_secs(10),
            rate: 200,
            keepalive: 10,
            keepalive_interval: Duration::from_millis(50),
            long: 0,
            stream_interval: Duration::from_millis(100),
            stall_after: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            max_in_flight: 2000,
            path: "/api".to_string(),
            slice: Duration::from_millis(100),
            sources: Vec::new(),
        }
    }

    pub fn validate(&self) -> Result<(), ClientError> {
        let bad = |reason: &str| {
            Err(ClientError::InvalidOptions {
                reason: reason.to_string(),
            })
        };
        if self.duration.is_zero() {
            return bad("duration must be > 0");
        }
        if self.timeout.is_zero() {
            return bad("timeout must be > 0");
        }
        if self.slice.is_zero() {
            return bad("slice must be > 0");
        }
        if self.stall_after.is_zero() {
            return bad("stall-after must be > 0");
        }
        if self.stream_interval.is_zero() {
            return bad("stream-interval must be > 0");
        }
        if self.max_in_flight == 0 {
            return bad("max-in-flight must be > 0");
        }
        if !self.path.starts_with('/') || self.path.contains(char::is_whitespace) {
            return bad("path must start with '/' and contain no spaces");
        }
        if self.duration.as_millis() / self.slice.as_millis().max(1) > 1_000_000 {
            return bad("duration / slice is over a million slices; use a wider --slice");
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid load options: {reason}")]
    InvalidOptions { reason: String },
}
