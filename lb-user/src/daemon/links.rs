//! The programs' links: attaching `xlb_lb` (XDP) and `xlb_hc` (tc egress),
//! adopting the links a previous run pinned so a restart replaces programs
//! in place, and `xlb detach`, which removes all of it.

use std::{
    fs,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use aya::programs::{
    ProgramError, TcAttachType, XdpMode,
    links::{FdLink, PinnedLink},
    tc::{self, SchedClassifierLink},
    xdp::XdpLink,
};
use tracing::warn;

use super::persist;
use crate::{
    config::{DaemonConfig, XdpMode as CfgXdpMode},
    dataplane::Dataplane,
    kernel,
};

/// Attaches `xlb_lb`: adopts the pinned link if there is one (replacing its
/// program in place: no detach, no gap), else attaches and pins a new one.
/// Returns the link id.
fn attach(dp: &mut Dataplane, d: &DaemonConfig, pin_dir: &Path) -> anyhow::Result<(u32, bool)> {
    let link_path = pin_dir.join(persist::LINK_PIN);
    let prog = dp.program::<aya::programs::Xdp>(lb_common::PROG_LB)?;
    if link_path.exists() {
        let pinned = PinnedLink::from_pin(&link_path)
            .with_context(|| format!("opening pinned link {}", link_path.display()))?;
        let fd: FdLink = pinned.into();
        let id = fd.info().context("reading pinned link info")?.id();
        let link = XdpLink::try_from(fd).context("pinned link is not an XDP link")?;
        prog.attach_to_link(link)
            .context("replacing the program of the pinned XDP link")?;
        // The kernel holds the link through its pin; our descriptor may go.
        return Ok((id, true));
    }
    let mode = match d.pinned.xdp_mode {
        CfgXdpMode::Native => XdpMode::Driver,
        CfgXdpMode::Generic => {
            warn!(interface = %d.pinned.interface, "xdp_mode = generic: XDP runs in the skb path, far slower than native; for testing");
            XdpMode::Skb
        }
    };
    let link_id = prog.attach(&d.pinned.interface, mode).with_context(|| {
        format!(
            "attaching XDP to {} in {:?} mode (is the interface up and its driver XDP-capable? try xdp_mode = \"generic\")",
            d.pinned.interface, d.pinned.xdp_mode
        )
    })?;
    let link = prog.take_link(link_id)?;
    let fd = FdLink::try_from(link).context(
        "the kernel attached XDP through netlink, not a BPF link, so it cannot be pinned (kernel ≥ 5.9 needed)",
    )?;
    let id = fd.info()?.id();
    fd.pin(&link_path)
        .with_context(|| format!("pinning the XDP link at {}", link_path.display()))?;
    Ok((id, false))
}

/// Attaches and returns (link id, adopted).
pub(super) fn attach_lb(dp: &mut Dataplane, d: &DaemonConfig) -> anyhow::Result<(u32, bool)> {
    attach(dp, d, &persist::pin_dir(&d.pinned.instance))
}

/// Attaches `xlb_hc` (data-path probes) to the egress of the daemon's
/// interface. Where the kernel has tcx links (6.6) it is one, pinned next
/// to the XDP link so a restart replaces its program in place and `xlb
/// detach` removes it; no qdisc is involved. The kernel is asked, not its
/// version: a tcx attach the kernel does not know (`EINVAL`) falls back to
/// a clsact qdisc and a netlink filter, logged once
/// ([`kernel::TCX_FALLBACK`]); the filter outlives the daemon: a restart
/// replaces a previous run's filter, and `xlb detach` leaves it (it passes
/// every unmarked packet).
pub(super) fn attach_hc(dp: &mut Dataplane, d: &DaemonConfig) -> anyhow::Result<()> {
    let iface = &d.pinned.interface;
    let prog = dp.program::<aya::programs::SchedClassifier>(lb_common::PROG_HC)?;
    let attach_err = || format!("attaching {} to the egress of {iface}", lb_common::PROG_HC);
    let link_path = persist::pin_dir(&d.pinned.instance).join(persist::HC_LINK_PIN);
    if link_path.exists() {
        let pinned = PinnedLink::from_pin(&link_path)
            .with_context(|| format!("opening pinned link {}", link_path.display()))?;
        let link = SchedClassifierLink::try_from(FdLink::from(pinned))
            .context("pinned data-path probe link is not a tc link")?;
        prog.attach_to_link(link)
            .context("replacing the program of the pinned tc link")?;
        return Ok(());
    }
    let tcx_opts = tc::TcAttachOptions::TcxOrder(aya::programs::LinkOrder::default());
    let link_id = match prog.attach_with_options(iface, TcAttachType::Egress, tcx_opts) {
        Ok(id) => id,
        Err(e) if no_tcx(&e) => {
            kernel::log_fallback(&kernel::TCX_FALLBACK);
            return attach_hc_clsact(prog, iface).with_context(attach_err);
        }
        Err(e) => return Err(e).with_context(attach_err),
    };
    let fd = FdLink::try_from(prog.take_link(link_id)?)
        .context("the tc program was attached without a BPF link, so it cannot be pinned")?;
    fd.pin(&link_path)
        .with_context(|| format!("pinning the tc link at {}", link_path.display()))?;
    Ok(())
}

/// Whether a tcx attach failed because the kernel has no tcx (6.6): it
/// refuses the attach type as an invalid argument.
fn no_tcx(e: &ProgramError) -> bool {
    matches!(e, ProgramError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::EINVAL))
}

/// `xlb_hc` on a clsact qdisc of `iface`, as a netlink filter (kernels
/// without tcx), replacing a previous run's.
fn attach_hc_clsact(prog: &mut aya::programs::SchedClassifier, iface: &str) -> anyhow::Result<()> {
    match tc::qdisc_add_clsact(iface) {
        Ok(()) => {}
        // EEXIST: the qdisc is there already (ours from a previous run or
        // someone else's); filters share it.
        Err(tc::TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => return Err(e).with_context(|| format!("adding a clsact qdisc to {iface}")),
    }
    // A previous run's filter (killed before it could remove it).
    let _ = tc::qdisc_detach_program(iface, TcAttachType::Egress, lb_common::PROG_HC);
    let netlink = tc::TcAttachOptions::Netlink(tc::NlOptions::default());
    prog.attach_with_options(iface, TcAttachType::Egress, netlink)?;
    Ok(())
}

/// The instance lock as `xlb detach` finds it.
enum Lock {
    /// No lock file: no daemon ran since the last detach (or reboot).
    Absent,
    /// Nobody holds it; we do now, until the detach is done, so no `xlb
    /// run` starts in its middle.
    Free(fs::File),
    /// A running daemon holds it: who, as its pid in the file says.
    Held(String),
}

/// How long `xlb detach` waits for a daemon that is stopping (`kill PID;
/// xlb detach`) to let go of the lock before it refuses: a daemon stopped
/// by SIGTERM saves its state and exits well within it.
const STOPPING_GRACE: Duration = Duration::from_secs(3);

/// The lock, waiting up to [`STOPPING_GRACE`] for a holder to go (unless
/// `force`, which does not care).
fn lock_state_after_grace(path: &Path, force: bool) -> anyhow::Result<Lock> {
    let deadline = Instant::now() + STOPPING_GRACE;
    loop {
        let lock = lock_state(path)?;
        if force || !matches!(lock, Lock::Held(_)) || Instant::now() >= deadline {
            return Ok(lock);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn lock_state(path: &Path) -> anyhow::Result<Lock> {
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Lock::Absent),
        Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
    };
    match file.try_lock() {
        Ok(()) => Ok(Lock::Free(file)),
        Err(fs::TryLockError::WouldBlock) => {
            let pid = fs::read_to_string(path).unwrap_or_default();
            Ok(Lock::Held(match pid.trim() {
                "" => "another process".to_string(),
                pid => format!("xlb run (pid {pid})"),
            }))
        }
        Err(fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

/// Unpins the links (the programs leave the interface) and removes every
/// pin of `instance`; what it removed.
fn remove_pins(instance: &str) -> anyhow::Result<Vec<String>> {
    let dir = persist::pin_dir(instance);
    let mut removed = Vec::new();
    let links = [
        (persist::LINK_PIN, "XDP link"),
        (persist::HC_LINK_PIN, "tc link (data-path probes)"),
    ];
    for (pin, what) in links {
        let path = dir.join(pin);
        if !path.exists() {
            continue;
        }
        // Unpinning drops the last reference once our descriptor closes: the
        // program leaves the interface.
        let fd = PinnedLink::from_pin(&path)
            .with_context(|| format!("opening {}", path.display()))?
            .unpin()
            .with_context(|| format!("unpinning {}", path.display()))?;
        drop(fd);
        removed.push(what.to_string());
    }
    if dir.exists() {
        for entry in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let entry = entry?;
            fs::remove_file(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
            removed.push(entry.file_name().to_string_lossy().into_owned());
        }
        fs::remove_dir(&dir).with_context(|| format!("removing {}", dir.display()))?;
        // The shared root goes too once no instance is left.
        let _ = fs::remove_dir(persist::PIN_ROOT);
    }
    Ok(removed)
}

/// `xlb detach`: removes everything `xlb run` pinned and attached for
/// `instance`, and says what it removed. Established flows stop being
/// balanced at once. Refused while a daemon runs the instance (it holds the
/// instance lock) unless `force`: XDP would go from under it while it goes
/// on probing and reporting a VIP that no longer forwards.
pub fn detach(
    instance: &str,
    force: bool,
    withdraw_wait: std::time::Duration,
) -> anyhow::Result<String> {
    // The name becomes part of paths under /sys/fs/bpf/xlb and /run/xlb:
    // `../..` must not walk out of them.
    crate::config::check_instance(instance)
        .map_err(|e| anyhow::anyhow!("xlb detach --instance: {e}"))?;
    let lock_path = persist::lock_path(instance);
    let lock = lock_state_after_grace(&lock_path, force)?;
    if let Lock::Held(holder) = &lock
        && !force
    {
        anyhow::bail!(
            "xlb detach: instance {instance:?} is in use by {holder}, which still holds {} \
             after {}s; detaching would stop its forwarding under it. Stop the daemon first (XDP \
             keeps forwarding when it stops) and run `xlb detach` again, or pass --force \
             to detach anyway",
            lock_path.display(),
            STOPPING_GRACE.as_secs()
        );
    }
    let state = persist::state_path(instance);
    // Routes first: the routers move flows to the other nodes while XDP
    // still forwards what reaches this one.
    let withdrawn = super::announce::withdraw_for_detach(&state, withdraw_wait);
    let mut removed = remove_pins(instance)?;
    // The sysctls `xlb run` changed go back before the state file that
    // records them goes.
    let restored = match persist::Saved::load(&state) {
        Ok(saved) => saved.map_or_else(Vec::new, |s| crate::host::restore_sysctls(&s.forwarding)),
        Err(e) => vec![format!("forwarding sysctls not restored: {e:#}")],
    };
    // The state file, and a temporary one a kill mid-write left behind.
    for path in [state.clone(), state.with_extension("json.tmp")] {
        if path.exists() {
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
            removed.push(path.display().to_string());
        }
    }
    // Removed while we hold it: a daemon starting now finds no file and
    // creates its own, never one we are about to unlink.
    if let Lock::Free(held) = &lock {
        fs::remove_file(&lock_path).with_context(|| format!("removing {}", lock_path.display()))?;
        held.unlock()
            .with_context(|| format!("unlocking {}", lock_path.display()))?;
        removed.push(lock_path.display().to_string());
    }
    let mut out = withdrawn.map_or_else(String::new, |w| format!("{w}\n"));
    out += &if removed.is_empty() {
        format!("xlb instance {instance:?}: nothing pinned, nothing to remove")
    } else {
        format!("xlb instance {instance:?}: removed {}", removed.join(", "))
    };
    if let Lock::Held(holder) = &lock {
        out.push_str(&format!(
            "\n--force: {holder} still runs with nothing attached; stop it, or restart it to \
             attach again"
        ));
    }
    for note in restored {
        out.push_str(&format!("\n{note}"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detach_refuses_a_name_that_is_not_an_instance() {
        let long = "a".repeat(33);
        for name in ["../..", "..", "a/../../b", "", "Prod", "x y", long.as_str()] {
            let err = detach(name, false, std::time::Duration::ZERO)
                .unwrap_err()
                .to_string();
            assert_eq!(
                err,
                format!(
                    "xlb detach --instance: instance {name:?} is invalid; use 1 to 32 \
                     characters from a-z 0-9 _ -"
                ),
                "{name:?}"
            );
        }
    }
}
