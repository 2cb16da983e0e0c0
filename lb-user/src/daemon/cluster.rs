//! What the daemon's status says about its cluster: this node's name and
//! peers, and the fingerprints of what its tables are built from.

use super::Daemon;
use crate::cluster::fingerprint::{Fingerprints, fingerprints};
use crate::ctl::{ClusterStatus, FingerprintStatus, StatusReport};

impl Daemon {
    /// The fingerprints of the configuration in effect, with the hash key
    /// the data plane holds: the file may set none (the pinned key is
    /// kept), and before the first start goes live the maps hold none yet,
    /// so then the key this start will write.
    fn fingerprints(&self) -> Fingerprints {
        let key = match self.dp.globals() {
            Ok(g) if g.hash_key != [0, 0] => g.hash_key,
            _ => self.globals.hash_key,
        };
        fingerprints(key, &self.cfg.vips)
    }

    /// Fills in `report`'s fingerprints (its own and each VIP's) and its
    /// `[cluster]` settings.
    pub(super) fn add_cluster_status(&self, report: &mut StatusReport) {
        let fp = self.fingerprints();
        report.fingerprint = FingerprintStatus {
            config: fp.config.to_string(),
            hash_key: fp.hash_key.to_string(),
        };
        for v in &mut report.vips {
            if let Some(f) = fp.vips.get(&v.name) {
                v.fingerprint = f.to_string();
            }
        }
        let c = &self.cfg.cluster;
        report.cluster = ClusterStatus {
            node: c.name.clone(),
            peers: c.peers.clone(),
            timeout_ms: c.timeout.as_millis() as u64,
        };
    }
}
