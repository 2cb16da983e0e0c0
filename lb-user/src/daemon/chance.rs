//! Second chance, the daemon's tick: a slot's previous owner is forgotten
//! once its window has passed, by writing the table again without it.

use tracing::{debug, error};

use super::{Daemon, model};

impl Daemon {
    /// Rewrites the tables whose remembered previous owners expired (a
    /// flip like any rebuild: the data plane sees the old or the new half).
    pub(super) fn expire_second_chance(&mut self) {
        let now = crate::chance::now_ns();
        for vip in &mut self.vips {
            if !vip.chance.due(vip.active as usize, now) {
                continue;
            }
            match model::rebuild(&mut self.dp, vip) {
                Ok(_) => {
                    debug!(vip = %vip.cfg.name, "second chance: expired previous owners cleared");
                }
                Err(e) => error!(
                    "vip {:?}: clearing expired previous owners: {e:#}",
                    vip.cfg.name
                ),
            }
        }
    }
}
