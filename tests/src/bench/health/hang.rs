//! One repetition of figure 1: three lab backends on loopback, probed by
//! the real scheduler and judged by the real VIP policy, until the one
//! switched to `Fault::Hang` has left the table and gone hard down.

use std::{
    net::{Ipv4Addr, SocketAddr},
    time::Duration,
};

use anyhow::{Context as _, Result, bail, ensure};
use lb_user::health::{
    machine::{HealthSnapshot, HealthState},
    policy::{Change, Member, MemberState, Placement, Policy, VipState, evaluate},
    probe::ProbeClass,
    scheduler::{DEFAULT_MAX_CONCURRENT, Report, Scheduler},
    spec::CheckSpec,
};
use rand::Rng as _;
use tokio::{
    sync::mpsc::Receiver,
    time::{Instant, timeout_at},
};
use xlb_lab::backend::{BackendHandle, BackendOptions, Fault, serve};

use super::{
    detection::{Bounds, Detection, HUNG, VIP_BACKENDS},
    report::Secs,
};

struct VipModel {
    spec: CheckSpec,
    addrs: Vec<SocketAddr>,
    health: Vec<HealthState>,
    snapshots: Vec<Option<HealthSnapshot>>,
    states: Vec<MemberState>,
    vip: VipState,
    policy: Policy,
}

impl VipModel {
    fn new(spec: CheckSpec, addrs: Vec<SocketAddr>) -> Self {
        let now = std::time::Instant::now();
        let n = addrs.len();
        Self {
            spec,
            addrs,
            health: vec![HealthState::Unknown; n],
            snapshots: vec![None; n],
            states: (0..n)
                .map(|_| MemberState::new(Placement::Unknown, now))
                .collect(),
            vip: VipState::default(),
            policy: Policy::default(),
        }
    }

    /// Records `report` and runs the policy over the VIP, as the daemon's
    /// `on_report` does (it skips evaluations that cannot change anything;
    /// running them all changes no outcome).
    fn observe(&mut self, report: &Report) -> Vec<Change> {
        let i = report.id as usize;
        self.health[i] = report.snapshot.state;
        self.snapshots[i] = Some(report.snapshot.clone());
        let members: Vec<Member> = (0..self.addrs.len())
            .map(|i| {
                Member::from_snapshot(
                    self.addrs[i].to_string(),
                    1,
                    false,
                    self.health[i],
                    &self.spec,
                    self.snapshots[i].as_ref(),
                )
            })
            .collect();
        evaluate(
            &self.policy,
            &members,
            &mut self.states,
            &mut self.vip,
            std::time::Instant::now(),
        )
        .changes
    }

    fn all_serving(&self) -> bool {
        self.states
            .iter()
            .all(|s| s.placement == Placement::Serving)
    }
}

pub(super) async fn detect_once(template: &CheckSpec, rep: usize) -> Result<Detection> {
    let backends = start_backends(rep).await?;
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.service_addrs()[0]).collect();
    let (mut scheduler, mut rx) = Scheduler::new(DEFAULT_MAX_CONCURRENT);
    for (id, addr) in (0u64..).zip(&addrs) {
        let spec = CheckSpec {
            port: addr.port(),
            ..template.clone()
        };
        scheduler.upsert(id, *addr, spec, HealthState::Unknown);
    }
    let mut vip = VipModel::new(template.clone(), addrs);
    wait_all_serving(&mut vip, &mut rx).await?;
    wait_random_phase(&mut vip, &mut rx).await?;

    let t0 = Instant::now();
    backends[HUNG]
        .set_fault(Fault::Hang)
        .await
        .context("switching the backend to hang")?;
    let detection = watch_hang(&mut vip, &mut rx, t0).await?;
    drop(scheduler);
    for b in backends {
        b.shutdown().await;
    }
    Ok(detection)
}

async fn start_backends(rep: usize) -> Result<Vec<BackendHandle>> {
    let mut backends = Vec::new();
    for i in 0..VIP_BACKENDS {
        let b = serve(BackendOptions {
            name: format!("b{}-{rep}", i + 1),
            listen: vec![SocketAddr::from((Ipv4Addr::LOCALHOST, 0))],
            admin: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        })
        .await
        .context("starting a lab backend on 127.0.0.1")?;
        backends.push(b);
    }
    Ok(backends)
}

/// The next probe report before `deadline`; if none comes (or the
/// scheduler is gone), an error saying what was awaited.
async fn next_report(
    rx: &mut Receiver<Report>,
    deadline: Instant,
    waiting_for: impl FnOnce() -> String,
) -> Result<Report> {
    timeout_at(deadline, rx.recv())
        .await
        .ok()
        .flatten()
        .with_context(waiting_for)
}

/// Every backend is probed within one interval and enters the table.
async fn wait_all_serving(vip: &mut VipModel, rx: &mut Receiver<Report>) -> Result<()> {
    let up_limit = vip.spec.interval + vip.spec.hang_timeout + Duration::from_secs(2);
    let up_deadline = Instant::now() + up_limit;
    while !vip.all_serving() {
        let report = next_report(rx, up_deadline, || {
            format!(
                "the VIP's backends were not all serving within {}: {:?}",
                Secs(up_limit),
                vip.states.iter().map(|s| s.placement).collect::<Vec<_>>()
            )
        })
        .await?;
        vip.observe(&report);
    }
    Ok(())
}

/// The hang starts at a random phase of the probe period, as it would in
/// production, so the repetitions sample the whole range.
async fn wait_random_phase(vip: &mut VipModel, rx: &mut Receiver<Report>) -> Result<()> {
    let phase = vip
        .spec
        .interval
        .mul_f64(rand::thread_rng().gen_range(0.0..1.0));
    let phase_end = Instant::now() + phase;
    while let Ok(Some(report)) = timeout_at(phase_end, rx.recv()).await {
        if !matches!(report.class, ProbeClass::Ok) {
            bail!(
                "healthy backend {} answered a probe {} before the hang",
                report.addr,
                report.class
            );
        }
        vip.observe(&report);
    }
    ensure!(
        vip.all_serving() && vip.vip.panic.is_none(),
        "the VIP is not steadily serving before the hang: {:?}",
        vip.states.iter().map(|s| s.placement).collect::<Vec<_>>()
    );
    Ok(())
}

/// Feeds reports to the VIP from the hang at `t0` until the hung backend
/// has both left the table and gone hard down.
async fn watch_hang(
    vip: &mut VipModel,
    rx: &mut Receiver<Report>,
    t0: Instant,
) -> Result<Detection> {
    let hung = vip.addrs[HUNG];
    let mut watch = HangWatch::default();
    let limit = Bounds::of(&vip.spec).schedule * 2 + Duration::from_secs(5);
    let deadline = Instant::now() + limit;
    while watch.out.is_none() || watch.down.is_none() {
        let report = next_report(rx, deadline, || {
            format!(
                "hung backend {hung}: out of the table {}, down {} after {}",
                watch.out.is_some(),
                watch.down.is_some(),
                Secs(limit)
            )
        })
        .await?;
        let at = Instant::now() - t0;
        let changes = vip.observe(&report);
        watch.report(&report, at, hung)?;
        watch.changes(changes, at, &vip.addrs)?;
    }
    let HangWatch {
        late,
        failures,
        out: Some((out, out_as, out_reason)),
        down: Some((down, down_reason)),
    } = watch
    else {
        unreachable!("the loop ends when both are set")
    };
    Ok(Detection {
        out,
        out_as,
        out_reason,
        down,
        down_reason,
        late,
        failures,
    })
}

/// What has been seen of the hung backend since the hang.
#[derive(Default)]
struct HangWatch {
    /// Late interim reports and failed probes before it left the table.
    late: u32,
    failures: u32,
    /// When it left the table, as what, and why.
    out: Option<(Duration, Placement, String)>,
    /// When it went hard down, and why.
    down: Option<(Duration, String)>,
}

impl HangWatch {
    /// Counts the hung backend's late and failed probes until it leaves the
    /// table, and records its Up→Down transition.
    fn report(&mut self, report: &Report, at: Duration, hung: SocketAddr) -> Result<()> {
        if report.id as usize != HUNG {
            return Ok(());
        }
        if self.out.is_none() {
            match report.class {
                ProbeClass::Late { .. } => self.late += 1,
                ref c if c.is_failure() => self.failures += 1,
                _ => {}
            }
        }
        if let Some(t) = &report.transition {
            ensure!(
                (t.from, t.to) == (HealthState::Up, HealthState::Down),
                "hung backend {hung}: expected up → down, got {} → {}: {}",
                t.from,
                t.to,
                t.reason
            );
            self.down = Some((at, t.reason.clone()));
        }
        Ok(())
    }

    /// Records the hung backend's first move out of the table; an answering
    /// peer leaving it, or the VIP panicking, spoils the figure.
    fn changes(&mut self, changes: Vec<Change>, at: Duration, addrs: &[SocketAddr]) -> Result<()> {
        for change in changes {
            match change {
                Change::Placement {
                    member,
                    from,
                    to,
                    reason,
                } if member == HUNG && self.out.is_none() && from.in_table() && !to.in_table() => {
                    self.out = Some((at, to, reason));
                }
                Change::Placement { member, to, .. } if member != HUNG && !to.in_table() => {
                    bail!("answering peer {} left the table as {to}", addrs[member])
                }
                Change::PanicEnter(why) => bail!("the VIP entered panic: {why}"),
                _ => {}
            }
        }
        Ok(())
    }
}
