//! `xlb weight`: a backend's weight changed at run time, and what the
//! daemon answers.

use serde::{Deserialize, Serialize};

/// The answer to `weight`: what the backend's weight was and is now, and
/// what the table rebuild did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightReport {
    /// VIP name.
    pub vip: String,
    /// `"ip:port"` of the backend.
    pub backend: String,
    /// Its weight before the request (an earlier override, or the
    /// configuration's).
    pub from: u32,
    /// Its weight now.
    pub to: u32,
    /// What the configuration says. `to` differs from it while an override
    /// stands; a request for this weight removes the override.
    pub configured: u32,
    /// Whether `to` is an override of the configuration (kept in the state
    /// file across restarts until a reload or restart finds another
    /// configured weight for the backend).
    pub overridden: bool,
    /// How long the table rebuild took, µs; `null` when the table did not
    /// change (same weight, or the backend takes no new flows now).
    pub table_build_us: Option<u64>,
    /// How many table slots changed backend.
    pub table_slots_changed: Option<u32>,
}

impl WeightReport {
    /// One line for the operator, e.g. `10.0.0.11:80 of vip "api": weight
    /// 1 -> 3 (override; configured 1), table rebuilt: 84 slots changed`.
    pub fn summary(&self) -> String {
        let what = if self.overridden {
            format!("override; configured {}", self.configured)
        } else {
            "the configured weight".to_string()
        };
        let head = if self.from == self.to {
            format!(
                "{} of vip {:?}: weight already {} ({what})",
                self.backend, self.vip, self.to
            )
        } else {
            format!(
                "{} of vip {:?}: weight {} -> {} ({what})",
                self.backend, self.vip, self.from, self.to
            )
        };
        match self.table_slots_changed {
            Some(n) => format!("{head}, table rebuilt: {n} slots changed"),
            None if self.from == self.to => head,
            None => format!("{head}, table unchanged (the backend takes no new flows now)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries() {
        let r = |from, to, configured, slots: Option<u32>| WeightReport {
            vip: "api".into(),
            backend: "10.0.0.11:80".into(),
            from,
            to,
            configured,
            overridden: to != configured,
            table_build_us: slots.map(|_| 120),
            table_slots_changed: slots,
        };
        let cases = [
            (
                r(1, 3, 1, Some(84)),
                "10.0.0.11:80 of vip \"api\": weight 1 -> 3 (override; configured 1), table rebuilt: 84 slots changed",
            ),
            (
                r(3, 1, 1, Some(84)),
                "10.0.0.11:80 of vip \"api\": weight 3 -> 1 (the configured weight), table rebuilt: 84 slots changed",
            ),
            (
                r(3, 3, 1, None),
                "10.0.0.11:80 of vip \"api\": weight already 3 (override; configured 1)",
            ),
            (
                r(1, 0, 1, None),
                "10.0.0.11:80 of vip \"api\": weight 1 -> 0 (override; configured 1), table unchanged (the backend takes no new flows now)",
            ),
        ];
        for (report, want) in cases {
            assert_eq!(report.summary(), want);
        }
    }
}
