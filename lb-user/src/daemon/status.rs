//! What operators and the metrics endpoint see: `xlb status` (built from
//! the model, the maps' counters and the rates sampled every tick) and the
//! per-backend extras only metrics show.

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicBool, Ordering},
    time::{Instant, SystemTime},
};

use lb_common::{Stat, TrafficStats};

use super::{
    Daemon,
    model::{Backend, Vip},
};
use tracing::warn;

use crate::{
    ctl::{self, BackendStatus, ProbeStatus, StatusReport, VipStatus},
    dataplane::Traffic,
    health::{policy, probe::ProbeClass, scheduler::effective_timeout},
    metrics::MetricsExtra,
};

/// Converts a monotonic instant to wall-clock milliseconds.
fn instant_ms(t: Instant) -> u64 {
    let now = Instant::now();
    let wall = SystemTime::now();
    let wall = if t <= now {
        wall - (now - t)
    } else {
        wall + (t - now)
    };
    ctl::unix_ms(wall)
}

/// Packets and new flows per second of a VIP or backend, from the
/// counters' last two samples.
#[derive(Default, Clone, Copy)]
pub(super) struct Rate {
    last: TrafficStats,
    pps: f64,
    nfps: f64,
}

impl Rate {
    fn update(&mut self, now: TrafficStats, secs: f64) {
        if secs > 0.0 {
            self.pps = now.packets.saturating_sub(self.last.packets) as f64 / secs;
            self.nfps = now.new_flows.saturating_sub(self.last.new_flows) as f64 / secs;
        }
        self.last = now;
    }
}

impl Daemon {
    /// Every tick: samples the rates and refreshes what the metrics
    /// endpoint serves.
    pub(super) fn sample(&mut self) {
        let secs = self.last_sample.elapsed().as_secs_f64();
        self.last_sample = Instant::now();
        // Every counter in two calls, for the rates and the status both.
        let traffic = self.traffic();
        for v in &self.vips {
            if let Some(s) = traffic.vip(v.id) {
                self.vip_rates.entry(v.id).or_default().update(s, secs);
            }
            for b in &v.backends {
                if let Some(s) = traffic.backend(b.id) {
                    self.be_rates.entry(b.id).or_default().update(s, secs);
                }
            }
        }
        let status = self.status_with(&traffic);
        let extra = self.metrics_extra();
        if let Ok(mut p) = self.published.lock() {
            *p = (status, extra);
        }
    }

    /// Every VIP's and backend's traffic counters now (empty if the read
    /// failed: the status then shows the last sampled totals).
    fn traffic(&self) -> Traffic {
        let ids = self
            .vips
            .iter()
            .flat_map(|v| v.backends.iter().map(|b| b.id + 1))
            .max()
            .unwrap_or(0);
        match self.dp.traffic(ids) {
            Ok(t) => t,
            Err(e) => {
                // Once: the next ticks would repeat it every second.
                static WARNED: AtomicBool = AtomicBool::new(false);
                if !WARNED.swap(true, Ordering::Relaxed) {
                    warn!("reading the traffic counters (status shows the last totals read): {e}");
                }
                Traffic::default()
            }
        }
    }

    /// Latency histograms and transition counts per backend: what only
    /// metrics show.
    fn metrics_extra(&self) -> MetricsExtra {
        let mut extra = MetricsExtra {
            guard: self.sources_metrics(),
            ..MetricsExtra::default()
        };
        for v in &self.vips {
            for b in &v.backends {
                let h = self.histograms.get(&b.id).cloned().unwrap_or_default();
                let t = self.transitions.get(&b.id).copied().unwrap_or(0);
                let key = (v.cfg.name.clone(), b.cfg.socket_addr().to_string());
                if let Some(f) = self.probe_failures.get(&b.id) {
                    extra.probe_failures.insert(key.clone(), f.clone());
                }
                extra.per_backend.insert(key, (h, t));
            }
        }
        extra
    }

    /// `xlb status`: the daemon, its counters, every VIP and backend.
    pub fn status(&self) -> StatusReport {
        self.status_with(&self.traffic())
    }

    /// [`Self::status`] with the traffic counters `traffic`.
    fn status_with(&self, traffic: &Traffic) -> StatusReport {
        let counters: BTreeMap<String, u64> = self
            .dp
            .stats()
            .map(|m| {
                Stat::ALL
                    .iter()
                    .map(|s| (s.label().to_string(), m.get(s).copied().unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default();
        let vips = self
            .vips
            .iter()
            .map(|v| self.vip_status(v, traffic))
            .collect();
        let mut report = StatusReport {
            version: ctl::PROTOCOL_VERSION,
            instance: self.cfg.daemon.pinned.instance.clone(),
            interface: self.cfg.daemon.pinned.interface.clone(),
            xdp_mode: self.cfg.daemon.pinned.xdp_mode.to_string(),
            started_unix_ms: ctl::unix_ms(self.started),
            adopted: self.adopted,
            config_path: self.config_path.display().to_string(),
            conntrack: ctl::ConntrackStatus {
                entries: self.ct_entries.load(Ordering::Relaxed),
                capacity: u64::from(self.cfg.daemon.pinned.conntrack_size),
                established: self.established_flows(),
            },
            counters,
            fingerprint: ctl::FingerprintStatus::default(),
            cluster: ctl::ClusterStatus::default(),
            nat: self.nat_status(),
            tx_alarm: self.tx_alarm.clone(),
            vips,
            announce: self.announce_status(),
        };
        self.add_cluster_status(&mut report);
        report
    }

    /// One VIP: its settings, totals read now, rates from the last sample.
    fn vip_status(&self, v: &Vip, traffic: &Traffic) -> VipStatus {
        let vr = self.vip_rates.get(&v.id).copied().unwrap_or_default();
        let live = traffic.vip(v.id).unwrap_or(vr.last);
        VipStatus {
            name: v.cfg.name.clone(),
            address: v.cfg.addr.to_string(),
            port: v.cfg.port,
            protocol: v.cfg.protocol.to_string(),
            mode: v.cfg.mode.to_string(),
            down_policy: v.cfg.down_policy.to_string(),
            second_chance: v.cfg.second_chance,
            table_size: v.cfg.table_size,
            fingerprint: String::new(),
            backends_up: v.up_count() as u32,
            backends_total: v.backends.len() as u32,
            packets_per_sec: vr.pps,
            new_flows_per_sec: vr.nfps,
            packets: live.packets,
            bytes: live.bytes,
            new_flows: live.new_flows,
            panic: v.policy.panic.is_some(),
            panic_reason: v.policy.panic.clone(),
            fleet_slow: v.policy.fleet_slow.clone(),
            nat: self.vip_nat_status(v),
            ejected_slow: v
                .backends
                .iter()
                .filter(|b| b.policy.placement == policy::Placement::EjectedSlow)
                .count() as u32,
            max_ejected: v.cfg.protection.max_ejected.max_of(v.eligible_count()) as u32,
            min_healthy: v.cfg.protection.min_healthy.min_of(v.eligible_count()) as u32,
            auto_timeout_ms: v
                .backends
                .iter()
                .any(|b| b.cfg.health.auto_timeout)
                .then(|| v.auto_timeout.load(Ordering::Relaxed) as f64 / 1e6)
                .filter(|&ms| ms > 0.0),
            backends: v
                .backends
                .iter()
                .map(|b| self.backend_status(v, b, traffic))
                .collect(),
            announce: self.announce_of(&v.cfg.name),
        }
    }

    /// One backend: state, placement, last probe, traffic, flows.
    fn backend_status(&self, v: &Vip, b: &Backend, traffic: &Traffic) -> BackendStatus {
        let member = b.member();
        let r = self.be_rates.get(&b.id).copied().unwrap_or_default();
        // Totals as read with the status, rates from the last 1 s sample.
        let live = traffic.backend(b.id).unwrap_or(r.last);
        let snap = b.snapshot.as_ref();
        BackendStatus {
            address: b.cfg.socket_addr().to_string(),
            weight: b.cfg.weight,
            configured_weight: self.configured_weight(&v.cfg.name, b),
            state: b.state_name().to_string(),
            health: b.health.as_str().to_string(),
            admin_drained: b.admin_drained,
            in_table: b.in_table(),
            since_unix_ms: instant_ms(b.since),
            last_transition_reason: snap.and_then(|s| s.last_transition_reason.clone()),
            last_probe: snap.and_then(|s| {
                let res = s.last_result.as_ref()?;
                let class = res.class(effective_timeout(&b.cfg.health, Some(&v.auto_timeout)));
                Some(ProbeStatus {
                    ok: res.outcome.is_ok(),
                    reason: match (&res.outcome, &class) {
                        // "answered in 2.5s (slower than timeout 1s)"
                        (Ok(_), ProbeClass::Slow { .. }) => class.to_string(),
                        (Ok(ok), _) => match ok.status {
                            Some(code) => format!("ok {code}"),
                            None => "ok".to_string(),
                        },
                        (Err(e), _) => e.to_string(),
                    },
                    code: class.code().to_string(),
                    status: res.outcome.as_ref().ok().and_then(|o| o.status),
                    latency_ms: res.latency.as_secs_f64() * 1e3,
                    at_unix_ms: s.last_probe_at.map_or(0, instant_ms),
                })
            }),
            consecutive_ok: snap.map_or(0, |s| s.consecutive_ok),
            consecutive_fail: snap.map_or(0, |s| s.consecutive_fail),
            new_flows_per_sec: r.nfps,
            packets_per_sec: r.pps,
            packets: live.packets,
            bytes: live.bytes,
            new_flows: live.new_flows,
            placement: b.policy.placement.as_str().to_string(),
            placement_reason: b.policy.reason.clone(),
            effective_weight: f64::from(b.cfg.weight)
                * b.policy.weight_fraction(&v.cfg.protection, Instant::now()),
            consecutive_slow: member.consecutive_slow,
            latency_ms: member.latency.map(|d| d.as_secs_f64() * 1e3),
            probe_local_errors: snap.map_or(0, |s| s.local_errors),
            flows: self.flows_of(b),
            max_flows: b.cfg.max_flows,
            drain_deadline_unix_ms: b
                .drain_deadline
                .filter(|_| b.admin_drained)
                .map(ctl::unix_ms),
            agent: snap.and_then(|s| s.agent.as_ref().map(|a| a.to_ctl(instant_ms))),
            passive: self.passive_status(v, b),
        }
    }
}
