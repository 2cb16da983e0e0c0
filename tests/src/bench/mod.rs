//! What the benchmark binaries (`src/bin/xlb-*bench.rs`) share: the lines
//! that say how a run was started and how to reproduce it, pinning a thread
//! to a CPU and reading its CPU time, and the health benchmark itself, which
//! is long enough for a module per figure.

#![allow(clippy::print_stdout, reason = "the benchmarks' reports go to stdout")]

pub mod chance;
pub mod cluster;
pub mod cluster_lab;
pub mod dataplane;
pub mod figures;
pub mod health;
pub mod katran;
pub mod lab_cpu;
pub mod lab_proxies;
pub mod lab_wrk;
pub mod lru;
pub mod nat_detect;
pub mod nat_packet;
pub mod nat_tput;
pub mod tput;
pub mod twocore;

/// Runs thread `tid` (0 = the calling thread) on `cpu` only.
pub fn set_affinity(tid: u32, cpu: usize) -> anyhow::Result<()> {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the set outlives the call.
    let r = unsafe { libc::sched_setaffinity(tid as i32, size_of::<libc::cpu_set_t>(), &set) };
    anyhow::ensure!(
        r == 0,
        "sched_setaffinity of thread {tid} to CPU {cpu}: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// CPU time of the calling thread (user + system,
/// `CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu() -> std::time::Duration {
    // The calling thread's clock always exists.
    read_cpu_clock(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or_default()
}

/// CPU time of process `pid`, every thread (its CPU-time clock: what
/// `getrusage` sums for the process itself, at ns resolution).
pub fn process_cpu(pid: u32) -> anyhow::Result<std::time::Duration> {
    use anyhow::Context as _;
    let pid = libc::pid_t::try_from(pid).context("pid out of range")?;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `clock` is a valid, writable clockid_t for the call.
    let rc = unsafe { libc::clock_getcpuclockid(pid, &mut clock) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc))
            .with_context(|| format!("clock_getcpuclockid({pid})"));
    }
    read_cpu_clock(clock).with_context(|| format!("reading the CPU clock of pid {pid}"))
}

/// Reads CPU-time clock `clock`.
fn read_cpu_clock(clock: libc::clockid_t) -> std::io::Result<std::time::Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a clock id and a pointer to a live timespec.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(std::time::Duration::new(
        ts.tv_sec as u64,
        ts.tv_nsec as u32,
    ))
}

/// Prints the command line this process was started with and the `cargo
/// xtask bench` command that runs benchmark `bin` the same way, so that a
/// pasted result says where it came from.
pub fn print_command(bin: &str) {
    let argv: Vec<String> = std::env::args().collect();
    let shown: Vec<&str> = argv.iter().skip(1).map(String::as_str).collect();
    println!("command:   {}", argv.join(" "));
    println!(
        "reproduce: cargo xtask bench --bin {bin} -- {}",
        shown.join(" ")
    );
}

/// The value after `--name` on the command line (empty when it is last).
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let i = args.iter().position(|a| a == name)?;
    Some(args.get(i + 1).cloned().unwrap_or_default())
}

/// `--rounds N` (at least 1), or `default`.
pub fn rounds_arg(default: usize) -> anyhow::Result<usize> {
    match arg("--rounds").as_deref() {
        None => Ok(default),
        Some(v) => {
            let n: usize = v.parse().map_err(|_| {
                anyhow::anyhow!("--rounds {v:?}: a number of rounds (>= 1) expected")
            })?;
            anyhow::ensure!(n >= 1, "--rounds 0: at least one round is needed");
            Ok(n)
        }
    }
}
