//! The daemon's own metric families: what runs, since when, and the
//! data plane's global counters.

use std::borrow::Cow;

use super::exposition::{Family, Kind, Subject, Value};
use crate::ctl::StatusReport;

impl Subject for StatusReport {
    fn labels(&self) -> Vec<(&'static str, &str)> {
        Vec::new()
    }
}

pub(super) const FAMILIES: [Family<StatusReport>; 12] = [
    Family {
        name: "xlb_info",
        kind: Kind::Gauge,
        help: "Always 1; the labels describe the running daemon.",
        value: |s| {
            Value::Info(vec![
                ("instance", s.instance.as_str().into()),
                ("interface", s.interface.as_str().into()),
                ("xdp_mode", s.xdp_mode.as_str().into()),
            ])
        },
    },
    Family {
        name: "xlb_config_info",
        kind: Kind::Gauge,
        help: "Always 1; fingerprints (16 hex digits) of what the tables are built from: the hash key and every \
               VIP (config), the hash key alone (hash_key). Nodes behind one ECMP group must show the same config.",
        value: |s| {
            Value::Info(vec![
                ("node", s.cluster.node.as_str().into()),
                ("fingerprint", s.fingerprint.config.as_str().into()),
                ("hash_key", s.fingerprint.hash_key.as_str().into()),
            ])
        },
    },
    Family {
        name: "xlb_start_time_seconds",
        kind: Kind::Gauge,
        help: "When the daemon started, seconds since the Unix epoch.",
        value: |s| Value::Float(s.started_unix_ms as f64 / 1000.0),
    },
    Family {
        name: "xlb_adopted",
        kind: Kind::Gauge,
        help: "1 if the daemon took over the pinned maps of a previous run at start.",
        value: |s| Value::Int(u64::from(s.adopted)),
    },
    Family {
        name: "xlb_packets_total",
        kind: Kind::Counter,
        help: "Packets by data-plane outcome (forwards, passes, drops) and conntrack events.",
        value: packets_by_reason,
    },
    Family {
        name: "xlb_conntrack_entries",
        kind: Kind::Gauge,
        help: "Entries in the connection tracking table.",
        value: |s| Value::Int(s.conntrack.entries),
    },
    Family {
        name: "xlb_conntrack_capacity",
        kind: Kind::Gauge,
        help: "Capacity of the connection tracking table (daemon.conntrack_size).",
        value: |s| Value::Int(s.conntrack.capacity),
    },
    Family {
        name: "xlb_conntrack_established_flows",
        kind: Kind::Gauge,
        help: "Established flows in the connection tracking table (a packet in the last 30 s, UDP: within \
               udp_timeout): what the fill alarms at 80% and 95% of capacity watch; absent before the first walk.",
        value: |s| s.conntrack.established.map_or(Value::Absent, Value::Int),
    },
    Family {
        name: "xlb_tx_alarm",
        kind: Kind::Gauge,
        help: "1 while frames the data plane forwarded are dropped on transmit (the interfaces' TX drops grow \
               with fwd_tx: a veth peer without an XDP program, a driver without XDP_TX), else 0.",
        value: |s| Value::Int(u64::from(s.tx_alarm.is_some())),
    },
    Family {
        name: "xlb_nat_flows",
        kind: Kind::Gauge,
        help: "Flows in the NAT flow map (expired ones not yet swept included), counted every second; \
               absent without NAT VIPs or before the first walk.",
        value: |s| {
            s.nat
                .as_ref()
                .and_then(|n| n.entries)
                .map_or(Value::Absent, Value::Int)
        },
    },
    Family {
        name: "xlb_nat_capacity",
        kind: Kind::Gauge,
        help: "Capacity of each NAT flow map (daemon.nat_size): new NAT flows are refused beyond it; absent without NAT VIPs.",
        value: |s| {
            s.nat
                .as_ref()
                .map_or(Value::Absent, |n| Value::Int(n.capacity))
        },
    },
    Family {
        name: "xlb_nat_swept_total",
        kind: Kind::Counter,
        help: "Expired NAT flows the daemon's sweep deleted since it started; absent without NAT VIPs.",
        value: |s| {
            s.nat
                .as_ref()
                .map_or(Value::Absent, |n| Value::Int(n.swept))
        },
    },
];

/// Every reason this build knows, even at 0, so a rate() works from the
/// first drop; then any the daemon reports that this build does not know.
fn packets_by_reason(s: &StatusReport) -> Value<'_> {
    let known: Vec<&'static str> = lb_common::Stat::ALL.iter().map(|s| s.label()).collect();
    let mut samples: Vec<(Cow<'_, str>, u64)> = known
        .iter()
        .map(|&reason| {
            let n = s.counters.get(reason).copied().unwrap_or(0);
            (Cow::Borrowed(reason), n)
        })
        .collect();
    samples.extend(
        s.counters
            .iter()
            .filter(|(reason, _)| !known.contains(&reason.as_str()))
            .map(|(reason, &n)| (Cow::Borrowed(reason.as_str()), n)),
    );
    Value::ByLabel("reason", samples)
}
