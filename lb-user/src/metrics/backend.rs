//! The metric families of each backend, labelled `vip` and `backend`.

use std::borrow::Cow;

use super::exposition::{Family, Kind, Subject, Value};
use super::{LatencyHistogram, MetricsExtra, ProbeFailures};
use crate::ctl::{BACKEND_STATES, BackendStatus, PLACEMENTS, PassiveTotals, StatusReport};

/// One backend of one VIP, with what the metrics add to its status. A copy
/// of the snapshot's parts, so that the family table can be a constant
/// (a view borrowing the snapshot would give it a lifetime).
pub(super) struct BackendView {
    vip: String,
    status: BackendStatus,
    latency: LatencyHistogram,
    transitions: u64,
    failures: ProbeFailures,
}

impl Subject for BackendView {
    fn labels(&self) -> Vec<(&'static str, &str)> {
        vec![("vip", &self.vip), ("backend", &self.status.address)]
    }
}

/// Every backend of every VIP, in configuration order. A backend without
/// extras still has its (empty) latency series.
pub(super) fn views(status: &StatusReport, extra: &MetricsExtra) -> Vec<BackendView> {
    let views = status.vips.iter().flat_map(|v| {
        v.backends.iter().map(|b| {
            let (latency, transitions) = extra
                .per_backend
                .get(&(v.name.clone(), b.address.clone()))
                .cloned()
                .unwrap_or_default();
            let key = (v.name.clone(), b.address.clone());
            BackendView {
                failures: extra.probe_failures.get(&key).cloned().unwrap_or_default(),
                vip: v.name.clone(),
                status: b.clone(),
                latency,
                transitions,
            }
        })
    });
    views.collect()
}

/// Every value of `xlb_backend_agent_state`'s `state` label.
const AGENT_STATES: [&str; 4] = ["normal", "drain", "maint", "down"];

pub(super) const FAMILIES: [Family<BackendView>; 26] = [
    Family {
        name: "xlb_backend_agent_state",
        kind: Kind::Gauge,
        help: "1 for what the backend's agent (agent_port) last asked for (normal, drain, maint, down), 0 for the others; absent without an agent.",
        value: |b| match &b.status.agent {
            Some(a) => Value::one_of("state", &AGENT_STATES, &a.state),
            None => Value::Absent,
        },
    },
    Family {
        name: "xlb_backend_agent_weight_percent",
        kind: Kind::Gauge,
        help: "Weight the backend's agent (agent_port) set, as a percentage of the configured one; absent without an agent.",
        value: |b| match &b.status.agent {
            Some(a) => Value::Int(u64::from(a.weight_percent)),
            None => Value::Absent,
        },
    },
    Family {
        name: "xlb_backend_up",
        kind: Kind::Gauge,
        help: "1 if the backend is in its VIP's table (takes new flows), else 0.",
        value: |b| Value::Int(u64::from(b.status.in_table)),
    },
    Family {
        name: "xlb_backend_state",
        kind: Kind::Gauge,
        help: "1 for the backend's current data-plane state (up, down, draining, unknown), 0 for the others.",
        value: |b| Value::one_of("state", &BACKEND_STATES, &b.status.state),
    },
    Family {
        name: "xlb_backend_placement",
        kind: Kind::Gauge,
        help: "1 for what the VIP's health policy does with the backend now (serving, ramping, ejected_slow, down, held_down, panic_restored, draining, unknown, agent_down, agent_drain, agent_maint), 0 for the others.",
        value: |b| Value::one_of("placement", &PLACEMENTS, &b.status.placement),
    },
    Family {
        name: "xlb_backend_probe_local_errors_total",
        kind: Kind::Counter,
        help: "Probes of the backend that failed for the load balancer's own reason (out of descriptors or buffers, no route from this host); never counted against the backend.",
        value: |b| Value::Int(b.status.probe_local_errors),
    },
    Family {
        name: "xlb_backend_effective_weight",
        kind: Kind::Gauge,
        help: "Weight of the backend in its VIP's table now: the configured weight, less while ramping up (slow start), 0 when out.",
        value: |b| Value::Float(b.status.effective_weight),
    },
    Family {
        name: "xlb_backend_admin_drained",
        kind: Kind::Gauge,
        help: "1 if an operator drained the backend (xlb drain).",
        value: |b| Value::Int(u64::from(b.status.admin_drained)),
    },
    Family {
        name: "xlb_backend_weight",
        kind: Kind::Gauge,
        help: "Configured weight of the backend.",
        value: |b| Value::Int(u64::from(b.status.weight)),
    },
    Family {
        name: "xlb_backend_flows",
        kind: Kind::Gauge,
        help: "Established flows of the backend: conntrack entries that carried a packet in the last 30 s \
               (UDP: within udp_timeout), from the periodic conntrack walk; absent before the first walk.",
        value: |b| b.status.flows.map_or(Value::Absent, Value::Int),
    },
    Family {
        name: "xlb_backend_max_flows",
        kind: Kind::Gauge,
        help: "The backend's max_flows: above it, an alarm event says it may run out of connection \
               slots; absent when not set.",
        value: |b| b.status.max_flows.map_or(Value::Absent, Value::Int),
    },
    Family {
        name: "xlb_backend_probe_latency_seconds",
        kind: Kind::Histogram,
        help: "Duration of health probes, failed ones included.",
        value: |b| Value::Histogram(&b.latency),
    },
    Family {
        name: "xlb_backend_transitions_total",
        kind: Kind::Counter,
        help: "State transitions of the backend since the daemon started.",
        value: |b| Value::Int(b.transitions),
    },
    Family {
        name: "xlb_backend_probe_failures_total",
        kind: Kind::Counter,
        help: "Failed health probes of the backend by reason code (connection_refused, no_response, unexpected_status, ...), each counted once; a code appears at its first failure.",
        value: |b| {
            let samples = b.failures.iter().map(|(c, n)| (Cow::Borrowed(c), n));
            Value::ByLabel("code", samples.collect())
        },
    },
    Family {
        name: "xlb_backend_packets_total",
        kind: Kind::Counter,
        help: "Packets forwarded to the backend.",
        value: |b| Value::Int(b.status.packets),
    },
    Family {
        name: "xlb_backend_bytes_total",
        kind: Kind::Counter,
        help: "Bytes forwarded to the backend (frame length as received).",
        value: |b| Value::Int(b.status.bytes),
    },
    Family {
        name: "xlb_backend_new_flows_total",
        kind: Kind::Counter,
        help: "Flows given to the backend from the table.",
        value: |b| Value::Int(b.status.new_flows),
    },
    Family {
        name: "xlb_backend_passive_connects_total",
        kind: Kind::Counter,
        help: "TCP connections to the backend the data plane saw start (SYN), from real traffic (passive detection, NAT VIPs).",
        value: |b| passive(b, |t| t.connects),
    },
    Family {
        name: "xlb_backend_passive_connected_total",
        kind: Kind::Counter,
        help: "SYN-ACKs from the backend answering those connections (passive detection, NAT VIPs).",
        value: |b| passive(b, |t| t.connected),
    },
    Family {
        name: "xlb_backend_passive_connect_timeouts_total",
        kind: Kind::Counter,
        help: "Connections to the backend found without a SYN-ACK after passive.connect_timeout (passive detection, NAT VIPs).",
        value: |b| passive(b, |t| t.connect_timeouts),
    },
    Family {
        name: "xlb_backend_passive_resets_total",
        kind: Kind::Counter,
        help: "RSTs from the backend (passive detection, NAT VIPs).",
        value: |b| passive(b, |t| t.resets),
    },
    Family {
        name: "xlb_backend_passive_requests_total",
        kind: Kind::Counter,
        help: "Client payloads that started a request to the backend (passive detection, NAT VIPs).",
        value: |b| passive(b, |t| t.requests),
    },
    Family {
        name: "xlb_backend_passive_responses_total",
        kind: Kind::Counter,
        help: "Backend payloads that answered a pending request (passive detection, NAT VIPs).",
        value: |b| passive(b, |t| t.responses),
    },
    Family {
        name: "xlb_backend_passive_unanswered_total",
        kind: Kind::Counter,
        help: "Pending requests older than passive.response_timeout when their flow closed (passive detection, NAT VIPs).",
        value: |b| passive(b, |t| t.unanswered),
    },
    Family {
        name: "xlb_backend_passive_abandoned_total",
        kind: Kind::Counter,
        help: "Pending requests younger than passive.response_timeout when their flow closed: the client gave up first (passive detection, NAT VIPs).",
        value: |b| passive(b, |t| t.abandoned),
    },
    Family {
        name: "xlb_backend_passive_evidence",
        kind: Kind::Gauge,
        help: "1 while passive evidence stands against the backend (its real requests failed while its peers' succeeded) until rise probes pass; absent without passive detection.",
        value: |b| match &b.status.passive {
            Some(p) => Value::Int(u64::from(p.evidence.is_some())),
            None => Value::Absent,
        },
    },
];

/// A passive counter of `b`, absent when its VIP has no passive detection.
fn passive(b: &BackendView, field: fn(&PassiveTotals) -> u64) -> Value<'static> {
    b.status
        .passive
        .as_ref()
        .map_or(Value::Absent, |p| Value::Int(field(&p.totals)))
}
