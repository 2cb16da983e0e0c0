//! `xlb peers`: this node's status and each peer's `GET /status`, fetched
//! at once with the peer's timeout, and the comparison that says what
//! differs between them.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::ctl::{self, Request, Response, StatusReport};

/// Largest `/status` answer read: a status of every backend the maps hold
/// is a few MiB.
const MAX_ANSWER: usize = 32 << 20;

/// One node as `xlb peers` saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    /// The peer's address as `[cluster] peers` lists it; `None` for this
    /// node (asked over the control socket).
    pub address: Option<String>,
    /// Its status, both parsed and as JSON (which may hold fields this
    /// build does not know, such as each VIP's `announce`); or why it could
    /// not be read.
    pub status: Result<(StatusReport, Value), String>,
}

impl NodeView {
    /// The node's name: from its status, else its address.
    pub fn name(&self) -> String {
        match (&self.status, &self.address) {
            (Ok((s, _)), _) if !s.cluster.node.is_empty() => s.cluster.node.clone(),
            (_, Some(a)) => a.clone(),
            (_, None) => "this node".to_owned(),
        }
    }
}

/// This node's status over the control socket `socket`, then every peer
/// it lists, all peers at once.
///
/// # Errors
///
/// Only when this node's daemon cannot be asked: peers that cannot be
/// read are reported in their [`NodeView`].
pub async fn gather(socket: &Path) -> anyhow::Result<Vec<NodeView>> {
    let local = match ctl::request(socket, &Request::Status).await? {
        Response::Status(r) => r,
        Response::Error { message } => anyhow::bail!("{message}"),
        other => anyhow::bail!(
            "the daemon answered status with {}",
            other.to_line().trim_end()
        ),
    };
    let timeout = Duration::from_millis(local.cluster.timeout_ms.max(1));
    let peers = local.cluster.peers.clone();
    let json = serde_json::to_value(&local)?;
    let fetched =
        futures_util::future::join_all(peers.iter().map(|p| fetch_status(p, timeout))).await;
    let mut nodes = vec![NodeView {
        address: None,
        status: Ok((local, json)),
    }];
    nodes.extend(
        peers
            .into_iter()
            .zip(fetched)
            .map(|(address, status)| NodeView {
                address: Some(address),
                status,
            }),
    );
    Ok(nodes)
}

/// `GET /status` from `addr` (`host:port`), all of it within `limit`.
pub async fn fetch_status(addr: &str, limit: Duration) -> Result<(StatusReport, Value), String> {
    let body = tokio::time::timeout(limit, get(addr, "/status"))
        .await
        .map_err(|_| format!("no answer within {limit:?}"))??;
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| format!("answered /status with something that is not JSON: {e}"))?;
    let report = serde_json::from_value(value.clone())
        .map_err(|e| format!("answered /status with JSON that is not an xlb status: {e}"))?;
    Ok((report, value))
}

/// The body of a `200 OK` answer to `GET path` over HTTP/1.1.
async fn get(addr: &str, path: &str) -> Result<Vec<u8>, String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("sending the request: {e}"))?;
    let mut answer = Vec::new();
    (&mut stream)
        .take(MAX_ANSWER as u64 + 1)
        .read_to_end(&mut answer)
        .await
        .map_err(|e| format!("reading the answer: {e}"))?;
    if answer.len() > MAX_ANSWER {
        return Err(format!("answered more than {} MiB", MAX_ANSWER >> 20));
    }
    split_response(&answer)
}

/// The body of a complete `200` response, or what the status says.
fn split_response(answer: &[u8]) -> Result<Vec<u8>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut head = httparse::Response::new(&mut headers);
    let len = match head.parse(answer) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Err("closed mid-answer".to_owned()),
        Err(e) => return Err(format!("did not answer HTTP: {e}")),
    };
    match head.code {
        Some(200) => Ok(answer[len..].to_vec()),
        Some(404) => Err(
            "answered 404 to /status: not an xlb metrics listener, or an xlb without /status"
                .to_owned(),
        ),
        code => Err(format!(
            "answered {} {} to /status",
            code.unwrap_or(0),
            head.reason.unwrap_or("")
        )),
    }
}

/// What differs between this node and one peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Difference {
    /// The hash keys differ: every VIP's flows land elsewhere.
    HashKey,
    /// Both have the VIP, with different fingerprints.
    Vip(String),
    /// Only this node has the VIP.
    Missing(String),
    /// Only the peer has the VIP.
    Extra(String),
    /// The configuration fingerprints differ, and nothing above says why
    /// (the same VIPs under other names).
    Config,
    /// The peer reports no fingerprint: an xlb from before them.
    NoFingerprint,
}

/// What differs between `local` and `peer`, hash key first, then VIPs in
/// this node's order, then the peer's extra ones.
pub fn compare(local: &StatusReport, peer: &StatusReport) -> Vec<Difference> {
    if peer.fingerprint.config.is_empty() {
        return vec![Difference::NoFingerprint];
    }
    if peer.fingerprint.config == local.fingerprint.config {
        return Vec::new();
    }
    let mut out = Vec::new();
    if peer.fingerprint.hash_key != local.fingerprint.hash_key {
        out.push(Difference::HashKey);
    }
    for v in &local.vips {
        match peer.vip(&v.name) {
            None => out.push(Difference::Missing(v.name.clone())),
            Some(p) if p.fingerprint != v.fingerprint => out.push(Difference::Vip(v.name.clone())),
            Some(_) => {}
        }
    }
    for p in &peer.vips {
        if local.vip(&p.name).is_none() {
            out.push(Difference::Extra(p.name.clone()));
        }
    }
    if out.is_empty() {
        out.push(Difference::Config);
    }
    out
}

impl Difference {
    /// The warning about peer `peer`, as `xlb peers` prints it.
    pub fn warning(&self, peer: &str) -> String {
        match self {
            Difference::HashKey => format!(
                "node {peer}: hash key differs: every flow ECMP moves between this node and \
                 {peer} lands on another backend; set the same daemon.hash_seed on every node"
            ),
            Difference::Vip(v) => format!(
                "vip {v:?} differs on {peer}: its address, mode, table size or backends are not \
                 the same, so flows ECMP moves between this node and {peer} may land on another \
                 backend"
            ),
            Difference::Missing(v) => format!("vip {v:?} is missing on {peer}"),
            Difference::Extra(v) => format!("vip {v:?} is on {peer} but not on this node"),
            Difference::Config => format!(
                "node {peer}: configuration fingerprint differs (the same VIPs under other \
                 names?)"
            ),
            Difference::NoFingerprint => format!(
                "node {peer}: reports no configuration fingerprint (an older xlb?); cannot tell \
                 whether its tables are the same"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::tests::sample_report;
    use crate::metrics::{MetricsExtra, MetricsSource, serve_listener};
    use std::sync::Arc;
    use tokio::net::TcpListener;

    /// `sample_report` with its hash key or VIP "api" changed.
    fn peer(hash_key: &str, api: &str) -> StatusReport {
        let mut r = sample_report();
        r.cluster.node = "lb-b".to_owned();
        r.fingerprint.config = format!("c-{hash_key}-{api}");
        r.fingerprint.hash_key = hash_key.to_owned();
        r.vips[0].fingerprint = api.to_owned();
        r
    }

    #[test]
    fn compare_says_what_differs() {
        let mut local = peer("k1", "a1");
        local.cluster.node = "lb-a".to_owned();
        let renamed = {
            let mut r = peer("k1", "a1");
            r.fingerprint.config = "other".to_owned();
            r
        };
        let with_extra = {
            let mut r = peer("k1", "a1");
            let mut web = r.vips[0].clone();
            web.name = "web".to_owned();
            r.vips.push(web);
            r.fingerprint.config = "c-extra".to_owned();
            r
        };
        let without_api = {
            let mut r = peer("k1", "a1");
            r.vips.clear();
            r.fingerprint.config = "c-none".to_owned();
            r
        };
        let old = {
            let mut r = peer("k1", "a1");
            r.fingerprint = crate::ctl::FingerprintStatus::default();
            r
        };
        let cases: Vec<(&str, StatusReport, Vec<Difference>)> = vec![
            ("same", peer("k1", "a1"), vec![]),
            ("hash key", peer("k2", "a1"), vec![Difference::HashKey]),
            ("vip", peer("k1", "a2"), vec![Difference::Vip("api".into())]),
            (
                "both",
                peer("k2", "a2"),
                vec![Difference::HashKey, Difference::Vip("api".into())],
            ),
            (
                "vip missing",
                without_api,
                vec![Difference::Missing("api".into())],
            ),
            (
                "vip extra",
                with_extra,
                vec![Difference::Extra("web".into())],
            ),
            ("only the total", renamed, vec![Difference::Config]),
            ("older xlb", old, vec![Difference::NoFingerprint]),
        ];
        for (name, p, want) in cases {
            assert_eq!(compare(&local, &p), want, "{name}");
        }
    }

    #[test]
    fn warnings_say_what_it_means() {
        let cases = [
            (
                Difference::HashKey,
                "node b: hash key differs: every flow ECMP moves between this node and b lands \
                 on another backend; set the same daemon.hash_seed on every node",
            ),
            (
                Difference::Vip("web".into()),
                "vip \"web\" differs on b: its address, mode, table size or backends are not the \
                 same, so flows ECMP moves between this node and b may land on another backend",
            ),
            (
                Difference::Missing("web".into()),
                "vip \"web\" is missing on b",
            ),
            (
                Difference::Extra("web".into()),
                "vip \"web\" is on b but not on this node",
            ),
        ];
        for (d, want) in cases {
            assert_eq!(d.warning("b"), want);
        }
    }

    struct Fixed;

    impl MetricsSource for Fixed {
        fn snapshot(&self) -> (StatusReport, MetricsExtra) {
            (sample_report(), MetricsExtra::default())
        }
    }

    #[tokio::test]
    async fn fetch_status_reads_a_metrics_listener() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(serve_listener(listener, Arc::new(Fixed)));
        let (report, json) = fetch_status(&addr, Duration::from_secs(2)).await.unwrap();
        assert_eq!(report, sample_report());
        assert_eq!(json["cluster"]["node"], "lb-a");
        server.abort();
    }

    #[tokio::test]
    async fn fetch_status_failures_say_why() {
        // Bound, never accepting: the connection is queued, nothing answers.
        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap().to_string();
        let err = fetch_status(&addr, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert_eq!(err, "no answer within 200ms");

        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = closed.local_addr().unwrap().to_string();
        drop(closed);
        let err = fetch_status(&addr, Duration::from_secs(2))
            .await
            .unwrap_err();
        assert!(
            err.starts_with("cannot connect: Connection refused"),
            "{err}"
        );

        let cases: [(&str, &[u8], &str); 4] = [
            (
                "not found",
                b"HTTP/1.1 404 Not Found\r\n\r\nnot found",
                "answered 404 to /status: not an xlb metrics listener, or an xlb without /status",
            ),
            (
                "server error",
                b"HTTP/1.1 500 Internal Server Error\r\n\r\n",
                "answered 500 Internal Server Error to /status",
            ),
            (
                "cut short",
                b"HTTP/1.1 200 OK\r\nContent-Le",
                "closed mid-answer",
            ),
            (
                "not http",
                b"SSH-2.0-OpenSSH\r\n",
                "did not answer HTTP: invalid HTTP version",
            ),
        ];
        for (name, answer, want) in cases {
            assert_eq!(split_response(answer).unwrap_err(), want, "{name}");
        }
        assert_eq!(
            split_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}").unwrap(),
            b"{}"
        );
    }
}
