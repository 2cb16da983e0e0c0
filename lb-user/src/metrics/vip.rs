//! The metric families of each VIP, labelled `vip`.

use super::exposition::{Family, Kind, Subject, Value};
use crate::ctl::VipStatus;

impl Subject for VipStatus {
    fn labels(&self) -> Vec<(&'static str, &str)> {
        vec![("vip", &self.name)]
    }
}

pub(super) const FAMILIES: [Family<VipStatus>; 15] = [
    Family {
        name: "xlb_vip_info",
        kind: Kind::Gauge,
        help: "Always 1; the labels describe the VIP.",
        value: |v| {
            Value::Info(vec![
                ("address", v.address.as_str().into()),
                ("port", v.port.to_string().into()),
                ("protocol", v.protocol.as_str().into()),
                ("mode", v.mode.as_str().into()),
                ("down_policy", v.down_policy.as_str().into()),
            ])
        },
    },
    Family {
        name: "xlb_vip_config_info",
        kind: Kind::Gauge,
        help: "Always 1; fingerprint (16 hex digits) of the VIP's key, mode, table size and backends, without the hash key.",
        value: |v| Value::Info(vec![("fingerprint", v.fingerprint.as_str().into())]),
    },
    Family {
        name: "xlb_vip_announced",
        kind: Kind::Gauge,
        help: "1 while the VIP wants its address announced to the routers ([announce]); 0 when withdrawn or off.",
        value: |v| {
            Value::Int(u64::from(
                v.announce.as_ref().is_some_and(|a| a.state == "announced"),
            ))
        },
    },
    Family {
        name: "xlb_vip_announce_info",
        kind: Kind::Gauge,
        help: "Always 1; state (announced, withdrawn, off) and code (serving, panic, starting, too_few_up, operator, off) say why.",
        value: |v| {
            let (state, code) = v
                .announce
                .as_ref()
                .map_or(("off", "off"), |a| (a.state.as_str(), a.code.as_str()));
            Value::Info(vec![("state", state.into()), ("code", code.into())])
        },
    },
    Family {
        name: "xlb_vip_nat_flows",
        kind: Kind::Gauge,
        help: "Unexpired NAT flows of a mode = \"nat\" VIP; absent for DSR VIPs or before the first walk.",
        value: |v| {
            v.nat
                .as_ref()
                .and_then(|n| n.flows)
                .map_or(Value::Absent, Value::Int)
        },
    },
    Family {
        name: "xlb_vip_nat_embryonic_flows",
        kind: Kind::Gauge,
        help: "Those of xlb_vip_nat_flows whose TCP handshake the client has not completed, or UDP flows never \
               answered: they give their port to a new flow when the pool is full; absent for DSR VIPs or before the first walk.",
        value: |v| {
            v.nat
                .as_ref()
                .and_then(|n| n.embryonic)
                .map_or(Value::Absent, Value::Int)
        },
    },
    Family {
        name: "xlb_vip_table_size",
        kind: Kind::Gauge,
        help: "Maglev table size of the VIP (slots).",
        value: |v| Value::Int(u64::from(v.table_size)),
    },
    Family {
        name: "xlb_vip_backends_up",
        kind: Kind::Gauge,
        help: "Backends of the VIP in its table (taking new flows).",
        value: |v| Value::Int(u64::from(v.backends_up)),
    },
    Family {
        name: "xlb_vip_backends",
        kind: Kind::Gauge,
        help: "Backends configured for the VIP.",
        value: |v| Value::Int(u64::from(v.backends_total)),
    },
    Family {
        name: "xlb_vip_packets_total",
        kind: Kind::Counter,
        help: "Packets forwarded for the VIP.",
        value: |v| Value::Int(v.packets),
    },
    Family {
        name: "xlb_vip_bytes_total",
        kind: Kind::Counter,
        help: "Bytes forwarded for the VIP (frame length as received).",
        value: |v| Value::Int(v.bytes),
    },
    Family {
        name: "xlb_vip_new_flows_total",
        kind: Kind::Counter,
        help: "Flows of the VIP given a backend from its table.",
        value: |v| Value::Int(v.new_flows),
    },
    Family {
        name: "xlb_vip_panic",
        kind: Kind::Gauge,
        help: "1 while the VIP is in panic: fewer than min_healthy backends healthy, the least-bad failing ones kept in the table.",
        value: |v| Value::Int(u64::from(v.panic)),
    },
    Family {
        name: "xlb_vip_fleet_slow",
        kind: Kind::Gauge,
        help: "1 while at least half of the VIP's backends answer probes slower than their timeout (load, not failure: nobody is ejected for it).",
        value: |v| Value::Int(u64::from(v.fleet_slow.is_some())),
    },
    Family {
        name: "xlb_vip_backends_ejected_slow",
        kind: Kind::Gauge,
        help: "Backends of the VIP out of its table as slow outliers (at most max_ejected).",
        value: |v| Value::Int(u64::from(v.ejected_slow)),
    },
];
