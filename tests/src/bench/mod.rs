//! What the benchmark binaries (`src/bin/xlb-*bench.rs`) share: the lines
//! that say how a run was started and how to reproduce it, and the health
//! benchmark itself, which is long enough for a module per figure.

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
