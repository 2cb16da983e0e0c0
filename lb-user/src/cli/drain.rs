//! `xlb drain --wait`: where a drain stands in one `status` answer.

use crate::ctl::StatusReport;

/// What `xlb drain --wait` makes of one `status` answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrainProgress {
    /// Still draining: print the line when it differs from the last one.
    Waiting(String),
    /// Finished (no flows left, or the deadline passed): print, exit 0.
    Done(String),
    /// Waiting makes no sense any more (enabled, removed): fail with this.
    Gone(String),
}

/// Where the drain of `backend` (as given to `xlb drain`: IP:PORT or just
/// the IP) of VIP `vip` stands in `report`.
pub fn drain_progress(
    report: &StatusReport,
    vip: &str,
    backend: &str,
    now_unix_ms: u64,
) -> DrainProgress {
    let Some(v) = report.vip(vip) else {
        return DrainProgress::Gone(format!(
            "vip {vip:?} is no longer configured (reloaded?); stopped waiting"
        ));
    };
    let Some(b) = v.backends.iter().find(|b| {
        b.address
            .parse()
            .is_ok_and(|addr| crate::daemon::model::names_backend(backend, addr))
    }) else {
        return DrainProgress::Gone(format!(
            "vip {vip:?} no longer has backend {backend} (reloaded?); stopped waiting"
        ));
    };
    let who = format!("{} of vip {vip:?}", b.address);
    if !b.admin_drained {
        return DrainProgress::Gone(format!(
            "{who} is no longer draining (someone ran `xlb enable`?); stopped waiting"
        ));
    }
    let flows = |n: u64| {
        if n == 1 {
            "1 flow".to_owned()
        } else {
            format!("{n} flows")
        }
    };
    if b.state == "down" && b.drain_deadline_unix_ms.is_some_and(|t| t <= now_unix_ms) {
        let left = match b.flows {
            Some(n) => format!(" with {} left", flows(n)),
            None => String::new(),
        };
        return DrainProgress::Done(format!(
            "{who}: drain deadline passed{left}; the backend is down and its remaining flows \
             follow down_policy {}",
            v.down_policy
        ));
    }
    match b.flows {
        Some(0) => DrainProgress::Done(format!("{who}: 0 flows; drained")),
        Some(n) => DrainProgress::Waiting(format!("{who}: {}", flows(n))),
        None => DrainProgress::Waiting(format!(
            "{who}: flows not counted yet (the daemon walks conntrack every few seconds)"
        )),
    }
}
