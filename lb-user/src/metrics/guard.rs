//! The metric families of abuse control: per VIP, the sources tracked and
//! those over `source_alert`; the heaviest sources of each VIP by new flows
//! per second (at most 10 per VIP, as the daemon publishes them, so the
//! label `prefix` stays bounded whatever a flood's sources); and the deny
//! and allow entries by list and origin.

use super::exposition::{Family, Kind, Out, Subject, Value};

/// What the metrics show of abuse control, refreshed every tick.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GuardExtra {
    /// Every VIP, in configuration order.
    pub vips: Vec<VipGuardExtra>,
    /// Entries per (list, origin); a pair with no entries may be left out.
    pub lists: Vec<ListCount>,
}

/// One VIP's sources.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VipGuardExtra {
    pub vip: String,
    /// Entries of the VIP in the per-source map.
    pub tracked: u64,
    /// Sources above the VIP's `source_alert` now.
    pub heavy: u64,
    /// The heaviest sources: (prefix, new flows per second), heaviest first.
    pub top: Vec<(String, f64)>,
}

/// Entries of one list of one origin.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ListCount {
    /// `deny` or `allow`.
    pub list: String,
    /// `config`, `runtime` or `auto`.
    pub origin: String,
    pub entries: u64,
}

impl Subject for VipGuardExtra {
    fn labels(&self) -> Vec<(&'static str, &str)> {
        vec![("vip", &self.vip)]
    }
}

/// One of the top sources of a VIP.
pub(super) struct SourceView {
    vip: String,
    prefix: String,
    new_flows_per_s: f64,
}

impl Subject for SourceView {
    fn labels(&self) -> Vec<(&'static str, &str)> {
        vec![("vip", &self.vip), ("prefix", &self.prefix)]
    }
}

impl Subject for ListCount {
    fn labels(&self) -> Vec<(&'static str, &str)> {
        vec![("list", &self.list), ("origin", &self.origin)]
    }
}

pub(super) const VIP_FAMILIES: [Family<VipGuardExtra>; 2] = [
    Family {
        name: "xlb_vip_sources_tracked",
        kind: Kind::Gauge,
        help: "Source prefixes of the VIP in the per-source map (xlb sources), idle ones included until the LRU evicts them.",
        value: |v| Value::Int(v.tracked),
    },
    Family {
        name: "xlb_vip_source_alerts",
        kind: Kind::Gauge,
        help: "Sources of the VIP above its source_alert now (heavy).",
        value: |v| Value::Int(v.heavy),
    },
];

pub(super) const SOURCE_FAMILIES: [Family<SourceView>; 1] = [Family {
    name: "xlb_source_new_flows_per_second",
    kind: Kind::Gauge,
    help: "New flows per second of the VIP's 10 heaviest sources (prefix as keyed: /32, /64), over the last second.",
    value: |s| Value::Float(s.new_flows_per_s),
}];

pub(super) const LIST_FAMILIES: [Family<ListCount>; 1] = [Family {
    name: "xlb_list_entries",
    kind: Kind::Gauge,
    help: "Entries of the deny and allow lists (every scope) by origin: config, runtime (xlb block), auto (auto_block).",
    value: |l| Value::Int(l.entries),
}];

/// Every top source of every VIP.
pub(super) fn source_views(g: &GuardExtra) -> Vec<SourceView> {
    g.vips
        .iter()
        .flat_map(|v| {
            v.top.iter().map(|(prefix, rate)| SourceView {
                vip: v.vip.clone(),
                prefix: prefix.clone(),
                new_flows_per_s: *rate,
            })
        })
        .collect()
}

/// Writes the guard's families.
pub(super) fn write(out: &mut Out, g: &GuardExtra) {
    out.families(&VIP_FAMILIES, g.vips.iter());
    out.families(&SOURCE_FAMILIES, source_views(g).iter());
    out.families(&LIST_FAMILIES, g.lists.iter());
}
