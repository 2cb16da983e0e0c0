//! `xlb weight VIP BACKEND N`: a backend's weight changed live.
//!
//! An override lives in three places that must agree: the backend's
//! configuration in the model (which the table is built from), the VIP's
//! configuration (which a reload compares with the file's) and the
//! daemon's configuration (what status, fingerprints and the next reload
//! start from). Each override remembers the configured weight it was made
//! against: a reload or restart whose file gives that backend the same
//! weight keeps the override (the file is patched with it before anything
//! compares it, so an unchanged VIP stays untouched); a file that gives it
//! another weight, or no longer lists it, drops the override, with a note
//! and a `weight` event. `xlb weight` with the configured weight removes it.

use std::{collections::BTreeMap, net::SocketAddr};

use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

use super::{Daemon, model};
use crate::{
    config::{Config, check_weight},
    ctl::{EventKind, WeightReport},
};

/// One override: the weight in force, and the configured weight it was
/// made against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Override {
    pub weight: u32,
    pub configured: u32,
}

/// An override as the state file keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedWeight {
    pub vip: String,
    pub backend: SocketAddr,
    pub weight: u32,
    /// The configured weight it was made against.
    pub configured: u32,
}

/// The overrides in force, by (VIP name, backend address).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides(BTreeMap<(String, SocketAddr), Override>);

/// An override a new configuration dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    pub vip: String,
    pub backend: SocketAddr,
    /// The override's weight.
    pub weight: u32,
    /// The backend's weight in the new configuration; `None` if it no
    /// longer lists the backend.
    pub now: Option<u32>,
    /// Why, for the log, the event and the reload's answer.
    pub text: String,
}

impl Overrides {
    pub fn from_saved(saved: &[SavedWeight]) -> Self {
        Self(
            saved
                .iter()
                .map(|s| {
                    let o = Override {
                        weight: s.weight,
                        configured: s.configured,
                    };
                    ((s.vip.clone(), s.backend), o)
                })
                .collect(),
        )
    }

    pub fn to_saved(&self) -> Vec<SavedWeight> {
        self.0
            .iter()
            .map(|((vip, backend), o)| SavedWeight {
                vip: vip.clone(),
                backend: *backend,
                weight: o.weight,
                configured: o.configured,
            })
            .collect()
    }

    /// The override of backend `addr` of VIP `vip`, if any.
    pub fn get(&self, vip: &str, addr: SocketAddr) -> Option<Override> {
        self.0.get(&(vip.to_string(), addr)).copied()
    }

    /// The overrides that still hold for `cfg`, a configuration just read
    /// (a start, a reload), with `cfg` changed to carry them; and those it
    /// drops: its backend is gone, or has another configured weight than
    /// the one the override was made against, or the override is no
    /// longer a weight the configuration allows.
    pub fn apply_to(&self, cfg: &mut Config) -> (Overrides, Vec<Dropped>) {
        let mut kept = Overrides::default();
        let mut dropped = Vec::new();
        for ((vip, addr), o) in &self.0 {
            let backend = cfg
                .vips
                .iter_mut()
                .find(|v| v.name == *vip)
                .and_then(|v| v.backends.iter_mut().find(|b| b.socket_addr() == *addr));
            let Some(b) = backend else {
                dropped.push(Dropped {
                    vip: vip.clone(),
                    backend: *addr,
                    weight: o.weight,
                    now: None,
                    text: format!(
                        "weight override {} of {addr} in vip {vip:?} dropped: the \
                         configuration no longer lists the backend",
                        o.weight
                    ),
                });
                continue;
            };
            if b.weight != o.configured || check_weight(o.weight).is_err() {
                dropped.push(Dropped {
                    vip: vip.clone(),
                    backend: *addr,
                    weight: o.weight,
                    now: Some(b.weight),
                    text: format!(
                        "weight override {} of {addr} in vip {vip:?} dropped: the \
                         configuration changed its weight from {} to {}",
                        o.weight, o.configured, b.weight
                    ),
                });
                continue;
            }
            b.weight = o.weight;
            kept.0.insert((vip.clone(), *addr), *o);
        }
        (kept, dropped)
    }
}

impl Daemon {
    /// `xlb weight`: validates, stages the VIP's new table in its spare
    /// half and makes it live with one write (as a reload does); if that
    /// fails, the weight and the live table stay as they were. Records the
    /// override (or removes it, for the configured weight), logs, records a
    /// `weight` event and saves the state file.
    pub(super) fn set_weight(
        &mut self,
        vip: &str,
        backend: &str,
        weight: u32,
    ) -> anyhow::Result<WeightReport> {
        let (vi, bi) = model::find_backend(&self.vips, vip, backend)?;
        let addr = self.vips[vi].backends[bi].cfg.socket_addr();
        // Worded as `xlb check-config` words it.
        check_weight(weight).map_err(|p| anyhow::anyhow!("vip {vip:?}: backend {addr}: {p}"))?;
        let from = self.vips[vi].backends[bi].cfg.weight;
        let configured = self.weights.get(vip, addr).map_or(from, |o| o.configured);
        let mut report = WeightReport {
            vip: vip.to_string(),
            backend: addr.to_string(),
            from,
            to: weight,
            configured,
            overridden: weight != configured,
            table_build_us: None,
            table_slots_changed: None,
        };
        if weight == from {
            return Ok(report);
        }
        self.set_model_weight(vi, addr, weight);
        let rebuild = match model::rebuild(&mut self.dp, &mut self.vips[vi]) {
            Ok(r) => r,
            Err(e) => {
                self.set_model_weight(vi, addr, from);
                return Err(e.context(format!(
                    "vip {vip:?}: weight of {addr} not changed; the VIP keeps its table"
                )));
            }
        };
        let key = (vip.to_string(), addr);
        if report.overridden {
            self.weights.0.insert(key, Override { weight, configured });
        } else {
            self.weights.0.remove(&key);
        }
        report.table_build_us = rebuild.map(|r| r.took.as_micros() as u64);
        report.table_slots_changed = rebuild.map(|r| r.slots_changed);
        info!(
            event = "weight",
            vip,
            backend = %addr,
            from,
            to = weight,
            configured,
            slots_changed = report.table_slots_changed,
            "weight changed by xlb weight"
        );
        let reason = match report.overridden {
            true => format!("xlb weight: override of the configured weight {configured}"),
            false => "xlb weight: back to the configured weight".to_string(),
        };
        let (f, t) = (from.to_string(), weight.to_string());
        self.event(
            EventKind::Weight,
            Some(vip),
            Some(addr.to_string()),
            Some(&f),
            Some(&t),
            reason,
            rebuild,
        );
        // The policy counts only backends with a weight above 0 toward the
        // VIP's panic threshold: a weight to or from 0 may change it.
        if let Err(e) = self.evaluate_vip(vi) {
            error!(
                vip,
                "applying the health policy after a weight change: {e:#}"
            );
        }
        self.save();
        Ok(report)
    }

    /// The configuration's weight of backend `b` of VIP `vip` while an
    /// override stands (`status`).
    pub(super) fn configured_weight(&self, vip: &str, b: &model::Backend) -> Option<u32> {
        self.weights
            .get(vip, b.cfg.socket_addr())
            .map(|o| o.configured)
    }

    /// Sets the weight of backend `addr` of VIP `vi` in the model, the
    /// VIP's configuration and the daemon's.
    fn set_model_weight(&mut self, vi: usize, addr: SocketAddr, weight: u32) {
        let v = &mut self.vips[vi];
        let name = v.cfg.name.clone();
        let in_model = v.backends.iter_mut().map(|b| &mut b.cfg);
        let in_vip = v.cfg.backends.iter_mut();
        let in_daemon = self
            .cfg
            .vips
            .iter_mut()
            .filter(|c| c.name == name)
            .flat_map(|c| c.backends.iter_mut());
        for b in in_model.chain(in_vip).chain(in_daemon) {
            if b.socket_addr() == addr {
                b.weight = weight;
            }
        }
    }

    /// Takes the overrides that still hold (a start, or a reload that
    /// applied), and tells each dropped one: a warning and a `weight`
    /// event. The notes for a reload's answer.
    pub(super) fn keep_weights(&mut self, kept: Overrides, dropped: Vec<Dropped>) -> Vec<String> {
        self.weights = kept;
        let mut notes = Vec::new();
        for d in dropped {
            warn!(
                event = "weight",
                vip = %d.vip,
                backend = %d.backend,
                from = d.weight,
                to = d.now,
                "{}",
                d.text
            );
            let (f, t) = (d.weight.to_string(), d.now.map(|w| w.to_string()));
            self.event(
                EventKind::Weight,
                Some(&d.vip),
                Some(d.backend.to_string()),
                Some(&f),
                t.as_deref(),
                d.text.clone(),
                None,
            );
            notes.push(d.text);
        }
        notes
    }
}

/// The overrides a state file recorded (none without one), whatever
/// layout it describes: weights do not depend on it.
pub(super) fn from_saved(saved: Option<&super::persist::Saved>) -> Overrides {
    saved.map_or_else(Overrides::default, |s| Overrides::from_saved(&s.weights))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// VIP api with backends .11 (weight 1) and .12 (weight `w12`).
    fn config(w12: u32, with_12: bool) -> Config {
        let mut text = "[daemon]\ninterface = \"eth0\"\nmax_table_size = 1009\n\
             [[vip]]\nname = \"api\"\naddress = \"10.100.0.1\"\nport = 80\ntable_size = 1009\n\
             [[vip.backend]]\naddress = \"10.0.0.11\"\n"
            .to_string();
        if with_12 {
            text += &format!("[[vip.backend]]\naddress = \"10.0.0.12\"\nweight = {w12}\n");
        }
        Config::from_str(&text, "xlb.toml").unwrap()
    }

    fn addr(last: u8) -> SocketAddr {
        format!("10.0.0.{last}:80").parse().unwrap()
    }

    fn overrides(list: &[(u8, u32, u32)]) -> Overrides {
        let saved: Vec<SavedWeight> = list
            .iter()
            .map(|&(last, weight, configured)| SavedWeight {
                vip: "api".into(),
                backend: addr(last),
                weight,
                configured,
            })
            .collect();
        Overrides::from_saved(&saved)
    }

    fn weights(cfg: &Config) -> Vec<u32> {
        cfg.vips[0].backends.iter().map(|b| b.weight).collect()
    }

    /// (name, overrides, the file's weight of .12 and whether it lists it,
    /// weights after, overrides kept, dropped texts)
    type Case = (
        &'static str,
        Overrides,
        (u32, bool),
        Vec<u32>,
        Overrides,
        Vec<&'static str>,
    );

    #[test]
    fn a_new_configuration_keeps_or_drops_each_override() {
        let cases: [Case; 5] = [
            (
                "same configured weight: kept, the file patched",
                overrides(&[(12, 5, 2)]),
                (2, true),
                vec![1, 5],
                overrides(&[(12, 5, 2)]),
                vec![],
            ),
            (
                "another configured weight: dropped",
                overrides(&[(12, 5, 2)]),
                (3, true),
                vec![1, 3],
                overrides(&[]),
                vec![
                    "weight override 5 of 10.0.0.12:80 in vip \"api\" dropped: the configuration changed its weight from 2 to 3",
                ],
            ),
            (
                "changed to the override's own value: dropped, same weight",
                overrides(&[(12, 5, 2)]),
                (5, true),
                vec![1, 5],
                overrides(&[]),
                vec![
                    "weight override 5 of 10.0.0.12:80 in vip \"api\" dropped: the configuration changed its weight from 2 to 5",
                ],
            ),
            (
                "backend gone: dropped",
                overrides(&[(11, 0, 1), (12, 5, 2)]),
                (2, false),
                vec![0],
                overrides(&[(11, 0, 1)]),
                vec![
                    "weight override 5 of 10.0.0.12:80 in vip \"api\" dropped: the configuration no longer lists the backend",
                ],
            ),
            (
                "no overrides: the file as it is",
                overrides(&[]),
                (2, true),
                vec![1, 2],
                overrides(&[]),
                vec![],
            ),
        ];
        for (name, ov, (w12, with_12), want_weights, want_kept, want_dropped) in cases {
            let mut cfg = config(w12, with_12);
            let (kept, dropped) = ov.apply_to(&mut cfg);
            assert_eq!(weights(&cfg), want_weights, "{name}");
            assert_eq!(kept, want_kept, "{name}");
            let texts: Vec<&str> = dropped.iter().map(|d| d.text.as_str()).collect();
            assert_eq!(texts, want_dropped, "{name}");
        }
    }

    #[test]
    fn overrides_round_trip_through_the_state_file_form() {
        let ov = overrides(&[(11, 0, 1), (12, 1000, 2)]);
        assert_eq!(Overrides::from_saved(&ov.to_saved()), ov);
        assert_eq!(
            ov.get("api", addr(12)),
            Some(Override {
                weight: 1000,
                configured: 2
            })
        );
        assert_eq!(ov.get("web", addr(12)), None);
    }
}
