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

/// User and system time from a `/proc/PID/stat` line (fields 14 and 15,
/// in clock ticks), after the command name, which may hold spaces.
pub(super) fn cpu_of_stat(stat: &str) -> Option<CpuTime> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|&h| h > 0)?;
    let ticks = |t: u64| Duration::from_nanos(t * 1_000_000_000 / hz);
    Some(CpuTime {
        user: ticks(utime),
        system: ticks(stime),
    })
}

/// CPU time so far of this process's threads named `name` (`comm`, as
/// `/proc/self/task/*/comm` shows it): the prober's own share of the
/// process's time. `None` when no thread has that name.
pub(super) fn thread_cpu(name: &str) -> Result<Option<CpuTime>> {
    let mut sum: Option<CpuTime> = None;
    for task in std::fs::read_dir("/proc/self/task").context("listing /proc/self/task")? {
        let dir = task?.path();
        // A thread that ends meanwhile is simply not counted.
        let (Ok(comm), Ok(stat)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("stat")),
        ) else {
            continue;
        };
        if comm.trim_end() != name {
            continue;
        }
        let cpu = cpu_of_stat(&stat).with_context(|| format!("{}: {stat:?}", dir.display()))?;
        sum = Some(match sum {
            Some(s) => CpuTime {
                user: s.user + cpu.user,
                system: s.system + cpu.system,
            },
            None => cpu,
        });
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_from_proc_stat() {
        // A command name with spaces and a parenthesis, as the kernel prints it.
        let stat = "4242 (ha (proxy) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 \
                    1 0 100 1000 100 18446744073709551615";
        let cpu = cpu_of_stat(stat).expect("parsed");
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        assert_eq!(cpu.user, Duration::from_nanos(250 * 1_000_000_000 / hz));
        assert_eq!(cpu.system, Duration::from_nanos(50 * 1_000_000_000 / hz));
        assert!(cpu_of_stat("4242 (x").is_none());
    }

    #[test]
    fn this_thread_is_found_by_name() {
        let name = "xlb-cpu-test";
        let found = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || thread_cpu(name))
            .expect("spawn")
            .join()
            .expect("join")
            .expect("read");
        assert!(found.is_some());
        assert!(thread_cpu("no-such-thread").expect("read").is_none());
    }
}
