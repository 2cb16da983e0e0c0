//! NAT mode's daemon side (issue 27): what the NAT maps must hold for the
//! VIPs (pools, the reply filter, the pool-address and port marks), the
//! alarms (flow maps 90 % full, source ports exhausted), and what
//! `status` and metrics show. The sweep of expired flows is `nat_sweep`.

use std::time::{Duration, Instant};

use lb_common::nat::NatPool;
use lb_common::{PROTO_TCP, PROTO_UDP, VipAddrKey, addr16, family_of, port_index};

use super::Daemon;
use super::alarms::{Edge, Level};
use super::model::Vip;
use crate::config::{VipConfig, ip_proto};
use crate::ctl;
use crate::dataplane::nat::{NatWanted, vip_addr_nat_pool};
use crate::health::{datapath::probes_by_udp, spec::Via};

/// Fill of the NAT flow maps that raises an alarm, % of `daemon.nat_size`:
/// past it new flows are soon refused (the maps are not LRUs).
pub(super) const FILL_ALARM: u64 = 90;
/// How far below [`FILL_ALARM`] the alarm clears, percentage points.
const FILL_HYSTERESIS: u64 = 5;

/// The data plane's counters of new flows refused for want of a source
/// port, by label (`lb_common::Stat::label`): named by the NAT data path.
pub(super) const EXHAUSTED_LABELS: [&str; 2] = ["drop_nat_exhausted", "reset_nat_exhausted"];

/// An exhaustion alarm clears after this long without a refusal.
pub(super) const EXHAUSTED_QUIET: Duration = Duration::from_secs(60);

/// `ns` of a duration, saturated.
fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `XLB_NAT_POOL`'s entry for NAT VIP `vip` (zeroed for a DSR VIP):
/// addresses, ports and timeouts. `udp_timeout` is `daemon.udp_timeout`.
///
/// `response_timeout_ns` and `connect_timeout_ns` come from the VIP's
/// passive-detection settings (`[passive]`, `[vip.passive]`).
pub fn nat_pool(vip: &VipConfig, udp_timeout: Duration) -> NatPool {
    let Some(nat) = &vip.nat else {
        return NatPool::default();
    };
    let mut pool = NatPool {
        count: nat.snat.len() as u32,
        port_min: nat.port_min,
        port_max: nat.port_max,
        tcp_syn_timeout_ns: ns(nat.timeouts.syn),
        tcp_established_timeout_ns: ns(nat.timeouts.established),
        tcp_fin_timeout_ns: ns(nat.timeouts.fin),
        tcp_close_timeout_ns: ns(nat.timeouts.close),
        udp_timeout_ns: ns(udp_timeout),
        response_timeout_ns: 0,
        connect_timeout_ns: 0,
        addrs: Default::default(),
    };
    crate::config::apply_pool_timeouts(&mut pool, &vip.passive);
    for (slot, a) in pool.addrs.iter_mut().zip(&nat.snat) {
        *slot = addr16(*a);
    }
    pool
}

/// Everything NAT the maps must hold for `vips`: each NAT VIP's pool, the
/// reply filter (NAT backends per protocol and backend port, whatever
/// their state: a drained backend's flows still answer), each pool
/// address marked with its VIP, and each NAT VIP's port.
/// `vips` are (VIP id, configuration).
pub fn wanted<'a>(
    vips: impl IntoIterator<Item = (u32, &'a VipConfig)>,
    udp_timeout: Duration,
) -> NatWanted {
    let mut want = NatWanted::default();
    for (id, cfg) in vips {
        let Some(nat) = &cfg.nat else { continue };
        let proto = ip_proto(cfg.protocol);
        want.pools.insert(id, nat_pool(cfg, udp_timeout));
        for b in &cfg.backends {
            *want.sports.entry(port_index(proto, b.port)).or_default() += 1;
            // A data-path probe's answers come from its own port (the
            // backend's `health_port`) and protocol (`health::datapath`).
            let h = &b.health;
            let probe = if probes_by_udp(&h.kind) {
                PROTO_UDP
            } else {
                PROTO_TCP
            };
            if h.via == Via::Vip && (probe, h.port) != (proto, b.port) {
                *want.sports.entry(port_index(probe, h.port)).or_default() += 1;
            }
            let key = VipAddrKey {
                addr: addr16(b.addr),
                family: family_of(b.addr),
                _pad: [0; 3],
            };
            *want.backend_addrs.entry(key).or_default() += 1;
        }
        for a in &nat.snat {
            let key = VipAddrKey {
                addr: addr16(*a),
                family: family_of(*a),
                _pad: [0; 3],
            };
            want.pool_addrs.insert(key, vip_addr_nat_pool(id));
        }
        want.vip_ports.insert(port_index(proto, cfg.port));
    }
    want
}

/// The NAT alarms: the flow maps' fill, and refusals for want of ports.
#[derive(Debug, Default)]
pub(super) struct NatAlarms {
    fill: Level,
    exhausted: ExhaustedAlarm,
}

/// Raised by the first refusal the counters show, told again at most
/// once a minute while refusals go on, cleared after [`EXHAUSTED_QUIET`]
/// without one.
#[derive(Debug, Default)]
pub(super) struct ExhaustedAlarm {
    /// The counters' sum when last read.
    last: Option<u64>,
    /// When the alarm was raised (or last told), and the sum then.
    raised: Option<(Instant, u64)>,
    /// When the counters last grew.
    grew: Option<Instant>,
}

impl ExhaustedAlarm {
    /// Feeds the counters' sum `n` at `now`; the edge and its text, if any.
    /// The first reading only sets the baseline (refusals of a previous
    /// run are not news).
    pub(super) fn update(&mut self, n: u64, now: Instant) -> Option<(Edge, String)> {
        let last = self.last.replace(n)?;
        if n > last {
            self.grew = Some(now);
            if self.raised.is_none() {
                self.raised = Some((now, last));
                return Some((
                    Edge::Raised,
                    format!(
                        "NAT source ports exhausted: {} new flows refused (RST for TCP) \
                         because every port of their pool to that backend was taken; add \
                         snat addresses, widen snat_ports, or shorten the TCP timeouts",
                        n - last
                    ),
                ));
            }
        }
        let (since, at_raise) = self.raised?;
        let quiet = self
            .grew
            .is_none_or(|g| now.saturating_duration_since(g) >= EXHAUSTED_QUIET);
        if quiet {
            self.raised = None;
            let secs = now.saturating_duration_since(since).as_secs();
            return Some((
                Edge::Cleared,
                format!(
                    "NAT source ports free again: {} new flows were refused over {secs} s",
                    n - at_raise
                ),
            ));
        }
        None
    }
}

/// The fill alarm's edge for `entries` of `capacity`, with its text.
pub(super) fn fill_edge(level: &mut Level, entries: u64, capacity: u64) -> Option<(Edge, String)> {
    if capacity == 0 {
        return None;
    }
    let pct = entries * 100 / capacity;
    let edge = level.update(pct, FILL_ALARM, FILL_ALARM - FILL_HYSTERESIS)?;
    let text = match edge {
        Edge::Raised => format!(
            "NAT flow maps {pct}% full (at least {FILL_ALARM}%): {entries} flows of \
             daemon.nat_size {capacity}; when full, new NAT flows are refused. Raise nat_size \
             (needs xlb detach and a restart) or shorten the TCP timeouts"
        ),
        Edge::Cleared => format!(
            "NAT flow maps {pct}% full, below {}%: {entries} flows of {capacity}",
            FILL_ALARM - FILL_HYSTERESIS
        ),
    };
    Some((edge, text))
}

impl Daemon {
    /// Starts the sweep of the pinned NAT flow maps; its established
    /// flows per backend join the conntrack walk's (`xlb drain --wait`).
    pub(super) fn spawn_nat_sweep(&self) {
        let flows = std::sync::Arc::clone(&self.flows);
        super::nat_sweep::spawn(
            super::persist::pin_dir(&self.cfg.daemon.pinned.instance),
            std::sync::Arc::clone(&self.nat_flows),
            move |walk| flows.set_nat_flows(walk.per_backend.clone()),
        );
    }

    /// Makes the NAT maps follow the VIPs as they are now (start, after
    /// each reload, whatever it applied).
    pub(super) fn sync_nat(&mut self) -> anyhow::Result<()> {
        let vips = self.vips.iter().map(|v| (v.id, &v.cfg));
        let want = wanted(vips, self.cfg.daemon.live.udp_timeout);
        self.dp.sync_nat(&want)?;
        Ok(())
    }

    /// The sum of the exhaustion counters, by label.
    fn nat_exhausted(&self) -> Option<u64> {
        Some(exhausted(&self.dp.stats().ok()?))
    }

    /// The NAT alarms (every tick), when the configuration has NAT VIPs.
    pub(super) fn check_nat_alarms(&mut self, counters: Option<&super::alarms::Counters>) {
        if !self.vips.iter().any(|v| v.cfg.nat.is_some()) {
            return;
        }
        let mut edges = Vec::new();
        if let Some(walk) = self.nat_flows.latest() {
            let cap = u64::from(self.cfg.daemon.pinned.nat_size);
            edges.extend(fill_edge(&mut self.nat_alarms.fill, walk.entries, cap));
        }
        if let Some(n) = counters.map(exhausted) {
            edges.extend(self.nat_alarms.exhausted.update(n, Instant::now()));
        }
        for (edge, text) in edges {
            self.tell_alarm(edge, None, None, text);
        }
    }

    /// `status`'s NAT block; `None` without NAT VIPs.
    pub(super) fn nat_status(&self) -> Option<Box<ctl::NatStatus>> {
        if !self.vips.iter().any(|v| v.cfg.nat.is_some()) {
            return None;
        }
        let walk = self.nat_flows.latest();
        Some(Box::new(ctl::NatStatus {
            entries: walk.as_ref().map(|w| w.entries),
            capacity: u64::from(self.cfg.daemon.pinned.nat_size),
            swept: walk.as_ref().map_or(0, |w| w.swept),
            orphans_swept: walk.as_ref().map_or(0, |w| w.orphans),
            embryonic_swept: walk.as_ref().map_or(0, |w| w.embryonic_swept),
            exhausted: self.nat_exhausted().unwrap_or(0),
        }))
    }

    /// A VIP's NAT block in `status`; `None` for a DSR VIP.
    pub(super) fn vip_nat_status(&self, v: &Vip) -> Option<ctl::VipNatStatus> {
        let nat = v.cfg.nat.as_ref()?;
        let ports = u64::from(nat.port_max - nat.port_min) + 1;
        let walk = self.nat_flows.latest();
        Some(ctl::VipNatStatus {
            preserve_client: nat.preserve_client,
            snat: nat.snat.iter().map(ToString::to_string).collect(),
            snat_ports: format!("{}-{}", nat.port_min, nat.port_max),
            flows: walk
                .as_ref()
                .map(|w| w.per_vip.get(&v.id).copied().unwrap_or(0)),
            embryonic: walk
                .as_ref()
                .map(|w| w.embryonic_per_vip.get(&v.id).copied().unwrap_or(0)),
            ports_per_backend: nat.snat.len() as u64 * ports,
        })
    }
}

/// The sum of the exhaustion counters among `stats`.
fn exhausted(stats: &super::alarms::Counters) -> u64 {
    stats
        .iter()
        .filter(|(s, _)| EXHAUSTED_LABELS.contains(&s.label()))
        .map(|(_, n)| n)
        .sum()
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet, HashMap};

    use lb_common::{FAMILY_V4, PROTO_TCP};

    use super::*;
    use crate::config::Config;

    const S: u64 = 1_000_000_000;

    fn config(vips: &str) -> Config {
        Config::from_str(
            &format!("[daemon]\ninterface = \"eth0\"\n{vips}"),
            "xlb.toml",
        )
        .unwrap()
    }

    const TWO_VIPS: &str = r#"
[[vip]]
name = "api"
address = "10.100.0.1"
port = 80
mode = "nat"
snat = ["10.0.0.2", "10.0.0.3"]
snat_ports = "20000-29999"
tcp_timeout = "1h"
[[vip.backend]]
address = "10.0.0.11"
port = 8080
[[vip.backend]]
address = "10.0.0.12"
port = 8080
[[vip]]
name = "web"
address = "10.100.0.2"
port = 443
[[vip.backend]]
address = "10.0.0.21"
"#;

    #[test]
    fn a_nat_vips_pool_has_its_addresses_ports_and_timeouts_in_ns() {
        let cfg = config(TWO_VIPS);
        let pool = nat_pool(&cfg.vips[0], Duration::from_secs(30));
        assert_eq!(pool.count, 2);
        assert_eq!((pool.port_min, pool.port_max), (20_000, 29_999));
        assert_eq!(pool.addrs[0], addr16("10.0.0.2".parse().unwrap()));
        assert_eq!(pool.addrs[1], addr16("10.0.0.3".parse().unwrap()));
        assert_eq!(pool.addrs[2], [0; 16]);
        assert_eq!(pool.tcp_established_timeout_ns, 3600 * S);
        assert_eq!(pool.tcp_syn_timeout_ns, 60 * S);
        assert_eq!(pool.tcp_fin_timeout_ns, 120 * S);
        assert_eq!(pool.tcp_close_timeout_ns, 10 * S);
        assert_eq!(pool.udp_timeout_ns, 30 * S);
        // Passive detection's thresholds, from `[passive]`'s defaults.
        assert_eq!((pool.response_timeout_ns, pool.connect_timeout_ns), (S, S));
        assert_eq!(
            nat_pool(&cfg.vips[1], Duration::from_secs(30)),
            NatPool::default(),
            "a DSR VIP has no pool"
        );
    }

    #[test]
    fn wanted_maps_follow_the_nat_vips_only() {
        let cfg = config(TWO_VIPS);
        let want = wanted(
            [(3, &cfg.vips[0]), (4, &cfg.vips[1])],
            Duration::from_secs(30),
        );
        assert_eq!(want.pools.keys().copied().collect::<Vec<_>>(), [3]);
        assert_eq!(
            want.sports,
            BTreeMap::from([(port_index(PROTO_TCP, 8080), 2)]),
            "two NAT backends on tcp/8080; the DSR backend on 443 is no reply port"
        );
        let key = |a: &str| VipAddrKey {
            addr: addr16(a.parse().unwrap()),
            family: FAMILY_V4,
            _pad: [0; 3],
        };
        assert_eq!(
            want.pool_addrs,
            HashMap::from([
                (key("10.0.0.2"), vip_addr_nat_pool(3)),
                (key("10.0.0.3"), vip_addr_nat_pool(3)),
            ])
        );
        assert_eq!(want.vip_ports, BTreeSet::from([port_index(PROTO_TCP, 80)]));
        assert_eq!(
            wanted([(4, &cfg.vips[1])], Duration::ZERO),
            NatWanted::default()
        );
    }

    /// A data-path probe's answers come from its own port and protocol: a
    /// `health_port` other than the service's, or a UDP VIP probed over
    /// HTTP, is a reply port too; a direct probe's is not.
    #[test]
    fn data_path_probes_add_their_own_reply_ports() {
        let cfg = config(
            r#"[[vip]]
name = "dns"
address = "10.100.0.1"
port = 53
protocol = "udp"
mode = "nat"
snat = ["10.0.0.2"]
[vip.health_check]
via = "vip"
[[vip.backend]]
address = "10.0.0.11"
port = 5354
health_port = 80
[[vip.backend]]
address = "10.0.0.12"
port = 5354
health_port = 80
[vip.backend.health_check]
via = "direct"
"#,
        );
        let want = wanted([(0, &cfg.vips[0])], Duration::from_secs(30));
        assert_eq!(
            want.sports,
            BTreeMap::from([
                (port_index(PROTO_UDP, 5354), 2),
                (port_index(PROTO_TCP, 80), 1),
            ]),
            "the service's port for both backends, the HTTP probe's for the one probed via the VIP"
        );
    }

    #[test]
    fn exhaustion_is_raised_by_new_refusals_and_cleared_after_a_quiet_minute() {
        let t0 = Instant::now();
        let mut a = ExhaustedAlarm::default();
        assert_eq!(
            a.update(500, t0),
            None,
            "refusals of a previous run are no news"
        );
        assert_eq!(a.update(500, t0 + Duration::from_secs(1)), None);
        let (edge, text) = a.update(503, t0 + Duration::from_secs(2)).unwrap();
        assert_eq!(edge, Edge::Raised);
        assert!(
            text.starts_with("NAT source ports exhausted: 3 new flows refused"),
            "{text}"
        );
        assert_eq!(
            a.update(510, t0 + Duration::from_secs(30)),
            None,
            "told once"
        );
        assert_eq!(
            a.update(510, t0 + Duration::from_secs(80)),
            None,
            "50 s quiet"
        );
        let (edge, text) = a.update(510, t0 + Duration::from_secs(90)).unwrap();
        assert_eq!(edge, Edge::Cleared);
        assert_eq!(
            text,
            "NAT source ports free again: 10 new flows were refused over 88 s"
        );
        assert_eq!(a.update(510, t0 + Duration::from_secs(91)), None);
    }

    #[test]
    fn fill_alarm_at_90_percent_clears_below_85() {
        let mut l = Level::default();
        let cases = [
            (899, None),
            (900, Some(Edge::Raised)),
            (990, None),
            (850, None),
            (849, Some(Edge::Cleared)),
        ];
        for (entries, want) in cases {
            let got = fill_edge(&mut l, entries, 1000).map(|(e, _)| e);
            assert_eq!(got, want, "{entries}");
        }
        assert_eq!(fill_edge(&mut l, 5, 0), None, "no capacity, no alarm");
    }
}
