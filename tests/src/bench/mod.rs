//! What the benchmark binaries (`src/bin/xlb-*bench.rs`) share: the lines
//! that say how a run was started and how to reproduce it, pinning a thread
//! to a CPU and reading its CPU time, and the health benchmark itself, which
//! is long enough for a module per figure.

#![allow(clippy::print_stdout, reason = "the benchmarks' reports go to stdout")]

pub mod dataplane;
pub mod figures;
pub mod health;
pub mod lab_cpu;
pub mod lab_proxies;
pub mod lab_wrk;
pub mod lru;
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
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a pointer to a live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
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
