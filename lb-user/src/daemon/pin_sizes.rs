//! The pinned maps whose size the configuration sets. aya adopts a pinned
//! map whatever its size, so `xlb run` refuses one pinned with another
//! size (the flows in it would be lost to a map made anew), and `xlb
//! check-upgrade` says so beforehand: one list serves both, so that the
//! check before an upgrade is the check the start makes (issue 39: a
//! changed `nat_size` passed check-upgrade, then the unit start-looped).

use std::path::Path;

use anyhow::Context as _;

use crate::config::PinnedSettings;

/// A map whose entry count a setting gives.
#[derive(Debug)]
pub struct SizedMap {
    /// The setting, as written in `[daemon]`.
    pub setting: &'static str,
    /// The map, for the operator.
    pub what: &'static str,
    /// Its pin's file name.
    pub pin: &'static str,
    configured: fn(&PinnedSettings) -> u32,
}

/// One map per setting: compared by it.
impl PartialEq for SizedMap {
    fn eq(&self, other: &Self) -> bool {
        self.setting == other.setting
    }
}
impl Eq for SizedMap {}

/// Every map the configuration sizes.
pub static SIZED: [SizedMap; 2] = [
    SizedMap {
        setting: "conntrack_size",
        what: "pinned conntrack",
        pin: lb_common::MAP_CT,
        configured: |d| d.conntrack_size,
    },
    SizedMap {
        setting: "nat_size",
        what: "pinned NAT flow map",
        pin: lb_common::nat::MAP_NAT_FLOWS,
        configured: |d| d.nat_size,
    },
];

/// The entries of each map of [`SIZED`] pinned in `dir` (those not pinned
/// are left out).
pub fn read(dir: &Path) -> anyhow::Result<Vec<(&'static SizedMap, u32)>> {
    let mut out = Vec::new();
    for m in &SIZED {
        let pin = dir.join(m.pin);
        if !pin.exists() {
            continue;
        }
        let entries = aya::maps::MapData::from_pin(&pin)
            .and_then(|d| d.info())
            .with_context(|| {
                format!(
                    "reading {} (run as root: pinned maps need CAP_SYS_ADMIN)",
                    pin.display()
                )
            })?
            .max_entries();
        out.push((m, entries));
    }
    Ok(out)
}

/// A pinned map of another size than the configuration's.
#[derive(Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub map: &'static SizedMap,
    pub pinned: u32,
    pub configured: u32,
}

impl Mismatch {
    /// `pinned conntrack in DIR holds 8192 entries, the configuration says
    /// conntrack_size = 4096`.
    pub fn text(&self, dir: &Path) -> String {
        format!(
            "{} in {} holds {} entries, the configuration says {} = {}",
            self.map.what,
            dir.display(),
            self.pinned,
            self.map.setting,
            self.configured
        )
    }
}

/// The maps of `pinned` whose size is not `d`'s.
pub fn mismatches(pinned: &[(&'static SizedMap, u32)], d: &PinnedSettings) -> Vec<Mismatch> {
    pinned
        .iter()
        .filter_map(|&(map, entries)| {
            let configured = (map.configured)(d);
            (entries != configured).then_some(Mismatch {
                map,
                pinned: entries,
                configured,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sized_map_is_compared_with_its_setting() {
        let mut d = crate::config::Config::from_str(
            "[daemon]\ninterface = \"eth0\"\nconntrack_size = 4096\nnat_size = 8192\n",
            "xlb.toml",
        )
        .unwrap()
        .daemon
        .pinned;
        let pinned = [(&SIZED[0], 4096), (&SIZED[1], 8192)];
        assert_eq!(mismatches(&pinned, &d), []);
        d.nat_size = 16384;
        let m = mismatches(&pinned, &d);
        assert_eq!(m.len(), 1);
        assert_eq!(
            m[0].text(Path::new("/sys/fs/bpf/xlb/default")),
            "pinned NAT flow map in /sys/fs/bpf/xlb/default holds 8192 entries, the \
             configuration says nat_size = 16384"
        );
        // A map not pinned is not compared.
        assert_eq!(mismatches(&pinned[..1], &d), []);
    }
}
