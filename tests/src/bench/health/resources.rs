//! What the cost figure reads about this process: CPU time, resident set
//! size, and the file descriptors it may open.

use std::{io, time::Duration};

use anyhow::{Context as _, Result, ensure};

use super::COST_BACKENDS;

/// File descriptors each process asks for: 1,000 listeners in the server, up
/// to `DEFAULT_MAX_CONCURRENT` probes plus the accepted connections, with room.
const NOFILE_WANTED: u64 = 16_384;

/// CPU time of this process, all threads.
#[derive(Clone, Copy, Debug)]
pub(super) struct CpuTime {
    pub(super) user: Duration,
    pub(super) system: Duration,
}

impl CpuTime {
    pub(super) fn total(self) -> Duration {
        self.user + self.system
    }
}

impl std::ops::Sub for CpuTime {
    type Output = Self;
    fn sub(self, earlier: Self) -> Self {
        Self {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }
}

pub(super) fn cpu_time() -> Result<CpuTime> {
    // SAFETY: rusage is plain integers, for which all-zero bytes are valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage for the duration of the call.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    if rc != 0 {
        return Err(io::Error::last_os_error()).context("getrusage(RUSAGE_SELF)");
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    Ok(CpuTime {
        user: tv(usage.ru_utime),
        system: tv(usage.ru_stime),
    })
}

/// Resident set size of this process now, in KiB.
pub(super) fn rss_kib() -> Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .context("/proc/self/status has no readable VmRSS line")
}

/// Raises the soft RLIMIT_NOFILE towards `NOFILE_WANTED` (within the hard
/// limit): 1,000 listeners or probes exceed the usual soft limit of 1,024.
pub(super) fn raise_nofile() -> Result<()> {
    let (soft, hard) =
        lb_user::daemon::raise_nofile_to(NOFILE_WANTED).context("raising RLIMIT_NOFILE")?;
    ensure!(
        soft >= (COST_BACKENDS as u64) * 2,
        "RLIMIT_NOFILE hard limit is {hard}, too low for {COST_BACKENDS} backends; raise it \
         (ulimit -Hn) to at least {}",
        COST_BACKENDS * 2
    );
    Ok(())
}
