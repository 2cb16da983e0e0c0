//! The main loop: goes live (attaches the programs, starts the probes, the
//! control socket, metrics and the conntrack walk), then applies health
//! reports, answers requests, reloads on SIGHUP and runs the 1 s tick (and
//! passive detection's 100 ms one) until SIGTERM or SIGINT. It is the only task that writes the maps.

use crate::ctl::EventKind;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::{
    net::UnixListener,
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};
use tracing::{error, info};

use super::{
    Daemon, TICK, conntrack,
    control::{self, Call},
    links, persist,
};
use crate::health::scheduler::Report;

/// Most probe reports applied in one go of the main loop: a mass flap is
/// coalesced into one table rebuild per VIP per batch, and a control
/// request waits at most one batch.
const REPORT_BATCH: usize = 1024;

impl Daemon {
    /// Goes live and runs the main loop until SIGTERM/SIGINT. On exit
    /// nothing is detached: the data plane keeps forwarding with the last
    /// written state.
    pub async fn main_loop(mut self, listener: UnixListener) -> anyhow::Result<()> {
        if let Err(e) = self.go_live() {
            self.undo_forwarding();
            return Err(e);
        }
        let calls = control::spawn_control(listener, self.events_tx.clone());
        if let Some(addr) = self.cfg.daemon.restart.metrics_address {
            control::spawn_metrics(
                addr,
                Arc::clone(&self.published),
                self.events_shared.clone(),
            );
        }
        conntrack::spawn(
            persist::pin_dir(&self.cfg.daemon.pinned.instance).join(lb_common::MAP_CT),
            self.cfg.daemon.pinned.conntrack_size,
            self.ct_entries.clone(),
            self.flows.clone(),
        );
        // Always: a reload may add the first NAT VIP, and flows of NAT VIPs
        // removed before a restart still need sweeping. An empty map costs
        // one call a second.
        self.spawn_nat_sweep();
        // Deadlines that passed while no daemon ran apply now.
        self.check_drains();
        self.sample();
        let reports = self.reports.take().context("probes not started")?;
        self.select_loop(reports, calls).await?;
        self.notify_stopping();
        info!(
            "xlb stopping; the XDP program stays attached with the last state (xlb detach removes it)"
        );
        self.seq_stop();
        self.save();
        let _ = std::fs::remove_file(&self.cfg.daemon.restart.control_socket);
        Ok(())
    }

    /// Attaches the programs (adopting pinned links), says so once, and
    /// starts probing.
    fn go_live(&mut self) -> anyhow::Result<()> {
        // The hash key and encapsulation sources change only now, with every
        // table installed; a start that fails to attach puts them back.
        let before = self.dp.globals()?;
        self.dp.set_globals(&self.globals)?;
        let attached = links::attach_lb(&mut self.dp, &self.cfg.daemon).and_then(|lb| {
            links::attach_hc(&mut self.dp, &self.cfg.daemon)?;
            Ok(lb)
        });
        let (link_id, adopted_link) = match attached {
            Ok(lb) => lb,
            Err(e) => {
                if let Err(undo) = self.dp.set_globals(&before) {
                    error!("putting back the hash key and encapsulation sources: {undo:#}");
                }
                return Err(e);
            }
        };
        self.link_id = link_id;
        self.adopted |= adopted_link;
        let vcount = self.vips.len();
        let bcount: usize = self.vips.iter().map(|v| v.backends.len()).sum();
        let msg = format!(
            "xlb started on {} (link {link_id}, {}): {vcount} VIPs, {bcount} backends",
            self.cfg.daemon.pinned.interface,
            if adopted_link {
                "adopted the pinned link and maps"
            } else {
                "attached"
            }
        );
        info!(event = "start", link_id, adopted = adopted_link, "{msg}");
        self.event(EventKind::Start, None, None, None, None, msg, None);
        self.save();
        self.start_probes();
        self.announce_go_live()
    }

    /// One thing at a time, until SIGTERM or SIGINT: a health report, a
    /// control request, SIGHUP, or the tick.
    async fn select_loop(
        &mut self,
        mut reports: mpsc::Receiver<Report>,
        mut calls: mpsc::Receiver<Call>,
    ) -> anyhow::Result<()> {
        let mut hup = signal(SignalKind::hangup())?;
        let mut term = signal(SignalKind::terminate())?;
        let mut tick = tokio::time::interval(TICK);
        // Passive detection's samples: a late one is skipped, not doubled.
        let mut passive_tick = tokio::time::interval(crate::health::passive::SAMPLE_PERIOD);
        passive_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                Some(r) = reports.recv() => {
                    // Every report already queued joins this one: each VIP
                    // is evaluated (its table rebuilt) once per batch.
                    let mut batch = vec![r];
                    while batch.len() < REPORT_BATCH
                        && let Ok(r) = reports.try_recv()
                    {
                        batch.push(r);
                    }
                    if let Err(e) = self.on_reports(batch) {
                        error!("applying health reports: {e:#}");
                    }
                    self.announce_update();
                }
                Some((req, reply)) = calls.recv() => {
                    let resp = self.handle(req);
                    let _ = reply.send(resp);
                    self.announce_update();
                }
                _ = hup.recv() => {
                    // Logged, and recorded as an event, by `reload_by`.
                    let _ = self.reload_by("SIGHUP");
                }
                _ = tick.tick() => self.on_tick(),
                _ = passive_tick.tick() => self.on_passive_tick(),
                _ = term.recv() => return Ok(()),
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
        }
    }

    /// Every [`TICK`]: drain deadlines, then the policy of every VIP (slow-
    /// start steps and flap-penalty decay move with time, and automatic
    /// timeouts follow the VIPs' latency), then the rates.
    fn on_tick(&mut self) {
        self.check_drains();
        self.guard_tick();
        self.check_alarms();
        // The data plane's counters, read once for the alarms on them.
        let counters = self.dp.stats().ok();
        self.check_nat_alarms(counters.as_ref());
        if let Some(c) = &counters {
            self.check_tx(c);
        }
        self.check_sources(counters.as_ref());
        self.expire_second_chance();
        for v in &self.vips {
            v.update_auto_timeout();
        }
        for vi in 0..self.vips.len() {
            if let Err(e) = self.evaluate_vip(vi) {
                error!("applying the health policy: {e:#}");
            }
        }
        self.announce_update();
        self.announce_tick();
        self.sample();
        self.notify_tick();
        self.seq_tick();
    }
}
