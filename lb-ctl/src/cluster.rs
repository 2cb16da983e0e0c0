//! What a node tells others about itself in its status (issue 26): what
//! its tables are built from and which cluster it belongs to.

use serde::{Deserialize, Serialize};

/// The node's configuration fingerprints, each 16 hex digits of a SHA-256
/// (`lb_user::cluster::fingerprint`). Empty strings from a daemon too old
/// to compute them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FingerprintStatus {
    /// The hash key and every VIP's key, mode, table size and backends:
    /// equal on two nodes if, and only if, every flow maps to the same
    /// backend on both (health states aside).
    pub config: String,
    /// The hash key alone (never the key itself).
    pub hash_key: String,
}

/// `[cluster]`: this node's name and the status addresses of the others.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// `cluster.name` (default: the host name).
    pub node: String,
    /// `cluster.peers`: `host:port` of each other node's metrics listener,
    /// which serves `GET /status`.
    pub peers: Vec<String>,
    /// `cluster.timeout`: how long `xlb peers` waits for each peer, ms.
    pub timeout_ms: u64,
}
