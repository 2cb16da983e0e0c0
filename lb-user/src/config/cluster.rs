//! `[cluster]`: this node's name and the status addresses of the other
//! xlb nodes behind the same ECMP group, which `xlb peers` reads
//! (`GET /status` on each one's metrics listener).

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::daemon::DaemonConfig;
use super::{Problems, duration_setting, ser_duration};

/// Where every message about this table is placed.
const CTX: &str = "cluster";

/// Longest `cluster.timeout`: `xlb peers` is run by people and monitoring
/// scripts, which should hear about a silent peer within a minute.
pub const MAX_PEER_TIMEOUT: Duration = Duration::from_secs(60);

/// Defaults of `[cluster]`.
pub mod defaults {
    use std::time::Duration;

    /// `cluster.timeout`: a peer that has not answered within a second is
    /// reported unreachable.
    pub const TIMEOUT: Duration = Duration::from_secs(1);
    /// `cluster.name` when the host name cannot be read or is no valid
    /// name.
    pub const NAME: &str = "xlb";
}

/// `[cluster]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCluster {
    name: Option<String>,
    #[serde(default)]
    peers: Vec<String>,
    timeout: Option<String>,
}

/// The validated `[cluster]` table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClusterConfig {
    /// This node's name in `xlb peers` and metrics; default the host name.
    pub name: String,
    /// The other nodes' metrics listeners, `host:port` as written (a host
    /// name is resolved when `xlb peers` runs), in file order.
    pub peers: Vec<String>,
    /// How long `xlb peers` waits for each peer. Default 1 s.
    #[serde(serialize_with = "ser_duration")]
    pub timeout: Duration,
}

impl Default for ClusterConfig {
    /// No peers, named after the host, 1 s timeout.
    fn default() -> Self {
        ClusterConfig {
            name: host_name(),
            peers: Vec::new(),
            timeout: defaults::TIMEOUT,
        }
    }
}

/// The host name if it is a valid node name, else [`defaults::NAME`].
pub fn host_name() -> String {
    // The UTS namespace's name, as gethostname(2) gives it.
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| valid_name(h))
        .unwrap_or_else(|| defaults::NAME.to_owned())
}

/// Node names go into tables and metric labels: as VIP names.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// `[cluster]`, or its defaults when the file has none.
pub(super) fn validate(
    raw: Option<&RawCluster>,
    daemon: &DaemonConfig,
    p: &mut Problems<'_>,
) -> ClusterConfig {
    let Some(raw) = raw else {
        return ClusterConfig::default();
    };
    let mut cfg = ClusterConfig::default();
    if let Some(name) = &raw.name {
        if valid_name(name) {
            cfg.name.clone_from(name);
        } else {
            p.error(
                CTX,
                format!("name {name:?} is invalid; use 1 to 64 characters from A-Z a-z 0-9 _ . -"),
            );
        }
    }
    cfg.peers = check_peers(&raw.peers, daemon, p);
    if let Some(text) = &raw.timeout {
        cfg.timeout = check_timeout(text, p).unwrap_or(defaults::TIMEOUT);
    }
    warn_unreadable(&cfg, daemon, p);
    cfg
}

/// Each peer is `host:port`, listed once, and not this node's own
/// listener (it would always agree with itself).
fn check_peers(peers: &[String], daemon: &DaemonConfig, p: &mut Problems<'_>) -> Vec<String> {
    let own = daemon.restart.metrics_address;
    let mut seen = HashSet::new();
    for peer in peers {
        let ctx = format!("{CTX}: peer {peer:?}");
        if let Err(why) = parse_peer(peer) {
            p.error(&ctx, why);
            continue;
        }
        if !seen.insert(peer.as_str()) {
            p.error(&ctx, "is listed twice; list each node once");
            continue;
        }
        if let (Ok(addr), Some(own)) = (peer.parse::<SocketAddr>(), own)
            && is_own_listener(addr, own)
        {
            p.error(
                &ctx,
                format!(
                    "is this node's own metrics listener (daemon.metrics_address = \"{own}\"); \
                     list only the other nodes"
                ),
            );
        }
    }
    peers.to_vec()
}

/// `IP:PORT`, `[IPv6]:PORT` or `NAME:PORT`, port above 0.
pub fn parse_peer(peer: &str) -> Result<(), String> {
    let example = "write the address of its metrics listener (its daemon.metrics_address), \
                   e.g. \"192.0.2.2:9813\"";
    if let Ok(addr) = peer.parse::<SocketAddr>() {
        if addr.port() == 0 {
            return Err(format!("has port 0; {example}"));
        }
        return Ok(());
    }
    if peer.parse::<IpAddr>().is_ok_and(|ip| ip.is_ipv6()) || peer.matches(':').count() > 1 {
        return Err(
            "is not [IPv6]:PORT; put an IPv6 address in brackets, e.g. \"[2001:db8::2]:9813\""
                .to_owned(),
        );
    }
    let Some((host, port)) = peer.rsplit_once(':') else {
        return Err(format!("has no port; {example}"));
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .split('.')
            .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    match port.parse::<u16>() {
        _ if !host_ok => Err(format!("is not host:port; {example}")),
        Ok(0) | Err(_) => Err(format!("has no valid port ({port:?}); {example}")),
        Ok(_) => Ok(()),
    }
}

/// Whether `peer` reaches this node's own listener `own`: the same address,
/// or a loopback address on the port of a listener on every address.
fn is_own_listener(peer: SocketAddr, own: SocketAddr) -> bool {
    peer == own
        || (own.ip().is_unspecified() && peer.port() == own.port() && peer.ip().is_loopback())
}

fn check_timeout(text: &str, p: &mut Problems<'_>) -> Option<Duration> {
    let d = duration_setting("timeout", text, CTX, p)?;
    if d.is_zero() || d > MAX_PEER_TIMEOUT {
        p.error(
            CTX,
            format!(
                "timeout {text:?} is out of range; give a duration above 0 and at most {}, \
                 e.g. \"1s\"",
                super::shown::duration(MAX_PEER_TIMEOUT)
            ),
        );
        return None;
    }
    Some(d)
}

/// Peers read this node's status from its metrics listener: say so when
/// they cannot.
fn warn_unreadable(cfg: &ClusterConfig, daemon: &DaemonConfig, p: &mut Problems<'_>) {
    if cfg.peers.is_empty() {
        return;
    }
    match daemon.restart.metrics_address {
        None => p.warn(
            CTX,
            "peers are listed, but daemon.metrics_address is \"\": the other nodes cannot \
             read this node's /status; set it to an address they reach",
        ),
        Some(own) if own.ip().is_loopback() => p.warn(
            CTX,
            format!(
                "peers are listed, but daemon.metrics_address {own} is a loopback address: \
                 the other nodes cannot read this node's /status; set it to an address they \
                 reach"
            ),
        ),
        Some(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{DAEMON, ok};

    /// `[daemon]` listening for metrics on 192.0.2.1:9813, then `cluster`.
    fn with_cluster(cluster: &str) -> String {
        format!(
            "[daemon]\ninterface = \"eth0\"\nmetrics_address = \"192.0.2.1:9813\"\n\
             [cluster]\n{cluster}\n"
        )
    }

    /// The warnings about `[cluster]` (the files have no VIP, another
    /// warning).
    fn cluster_warnings(c: &crate::config::Config) -> Vec<&str> {
        c.warnings
            .iter()
            .map(String::as_str)
            .filter(|w| w.starts_with("xlb.toml: cluster: "))
            .collect()
    }

    #[test]
    fn defaults_without_a_cluster_table() {
        let c = ok("no [cluster]", DAEMON);
        assert_eq!(c.cluster, ClusterConfig::default());
        assert_eq!(c.cluster.name, host_name());
        assert!(c.cluster.peers.is_empty());
        assert_eq!(c.cluster.timeout, Duration::from_secs(1));
        assert!(valid_name(&c.cluster.name), "{}", c.cluster.name);
    }

    #[test]
    fn a_full_cluster_table() {
        let c = ok(
            "full",
            &with_cluster(
                r#"name = "lb-a"
peers = ["192.0.2.2:9813", "[2001:db8::3]:9813", "lb-c.example.net:9813"]
timeout = "250ms""#,
            ),
        );
        assert_eq!(
            c.cluster,
            ClusterConfig {
                name: "lb-a".into(),
                peers: vec![
                    "192.0.2.2:9813".into(),
                    "[2001:db8::3]:9813".into(),
                    "lb-c.example.net:9813".into()
                ],
                timeout: Duration::from_millis(250),
            }
        );
        assert!(cluster_warnings(&c).is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn peers_that_cannot_read_this_node_are_a_warning() {
        let cases = [
            (
                "loopback listener",
                "metrics_address = \"127.0.0.1:9813\"",
                "xlb.toml: cluster: peers are listed, but daemon.metrics_address 127.0.0.1:9813 \
                 is a loopback address: the other nodes cannot read this node's /status; set it \
                 to an address they reach",
            ),
            (
                "no listener",
                "metrics_address = \"\"",
                "xlb.toml: cluster: peers are listed, but daemon.metrics_address is \"\": the \
                 other nodes cannot read this node's /status; set it to an address they reach",
            ),
        ];
        for (name, metrics, want) in cases {
            let text = format!(
                "[daemon]\ninterface = \"eth0\"\n{metrics}\n[cluster]\npeers = [\"192.0.2.2:9813\"]\n"
            );
            let c = ok(name, &text);
            assert_eq!(cluster_warnings(&c), [want], "{name}");
        }
    }

    rejects! {
        bad_name: with_cluster(r#"name = "lb a""#) => [
            r#"xlb.toml: cluster: name "lb a" is invalid; use 1 to 64 characters from A-Z a-z 0-9 _ . -"#,
        ];
        peer_without_port: with_cluster(r#"peers = ["192.0.2.2"]"#) => [
            r#"xlb.toml: cluster: peer "192.0.2.2": has no port; write the address of its metrics listener (its daemon.metrics_address), e.g. "192.0.2.2:9813""#,
        ];
        peer_port_zero: with_cluster(r#"peers = ["192.0.2.2:0"]"#) => [
            r#"xlb.toml: cluster: peer "192.0.2.2:0": has port 0; write the address of its metrics listener (its daemon.metrics_address), e.g. "192.0.2.2:9813""#,
        ];
        peer_bad_port: with_cluster(r#"peers = ["lb-b:http"]"#) => [
            r#"xlb.toml: cluster: peer "lb-b:http": has no valid port ("http"); write the address of its metrics listener (its daemon.metrics_address), e.g. "192.0.2.2:9813""#,
        ];
        peer_bad_host: with_cluster(r#"peers = ["lb b:9813"]"#) => [
            r#"xlb.toml: cluster: peer "lb b:9813": is not host:port; write the address of its metrics listener (its daemon.metrics_address), e.g. "192.0.2.2:9813""#,
        ];
        peer_ipv6_without_brackets: with_cluster(r#"peers = ["2001:db8::2:9813"]"#) => [
            r#"xlb.toml: cluster: peer "2001:db8::2:9813": is not [IPv6]:PORT; put an IPv6 address in brackets, e.g. "[2001:db8::2]:9813""#,
        ];
        peer_listed_twice: with_cluster(r#"peers = ["192.0.2.2:9813", "192.0.2.2:9813"]"#) => [
            r#"xlb.toml: cluster: peer "192.0.2.2:9813": is listed twice; list each node once"#,
        ];
        own_listener: with_cluster(r#"peers = ["192.0.2.1:9813"]"#) => [
            r#"xlb.toml: cluster: peer "192.0.2.1:9813": is this node's own metrics listener (daemon.metrics_address = "192.0.2.1:9813"); list only the other nodes"#,
        ];
        own_listener_on_every_address: "[daemon]\ninterface = \"eth0\"\nmetrics_address = \"0.0.0.0:9813\"\n[cluster]\npeers = [\"127.0.0.1:9813\"]\n" => [
            r#"xlb.toml: cluster: peer "127.0.0.1:9813": is this node's own metrics listener (daemon.metrics_address = "0.0.0.0:9813"); list only the other nodes"#,
        ];
        timeout_zero: with_cluster(r#"timeout = "0s""#) => [
            r#"xlb.toml: cluster: timeout "0s" is out of range; give a duration above 0 and at most 1m, e.g. "1s""#,
        ];
        timeout_not_a_duration: with_cluster(r#"timeout = "soon""#) => [
            r#"xlb.toml: cluster: timeout "soon" is not a duration; write a number and a unit (ms, s, m, h or d), e.g. "500ms", "2s", "1.5s", "1m""#,
        ];
        unknown_setting: with_cluster(r#"nodes = ["a"]"#) => [
            "xlb.toml:5:1: cluster: unknown field `nodes`, expected one of `name`, `peers`, `timeout`",
        ];
    }
}
