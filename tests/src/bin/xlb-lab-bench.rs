//! `cargo xtask bench`: HTTP throughput through xlb in the lab, measured with
//! wrk from the client namespace, next to the same load sent straight to one
//! backend. A benchmark, not a test.
//!
//! Everything (wrk, three backends, the LB, the bridge) shares this
//! machine's CPUs, so the figures say what the whole lab sustains and how
//! much the XDP hop changes it, not the LB's own ceiling: that is
//! `xlb-bench`'s per-packet cost.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]
#![allow(clippy::print_stdout, reason = "a benchmark's report goes to stdout")]

use std::{process::Command, time::Duration};

use anyhow::{Context as _, bail};
use xlb_lab::scenario::{LabRun, Mode, XlbConfig, find_xlb};

const PREFIX: &str = "xlbw";
const DURATION: &str = "8s";
const THREADS: &str = "2";
const CONNECTIONS: &str = "32";

struct Row {
    label: &'static str,
    rps: f64,
    p50: String,
    p99: String,
    errors: String,
}

/// The number after `key` on wrk's line starting with `key`.
fn field<'a>(out: &'a str, key: &str) -> Option<&'a str> {
    out.lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
}

fn wrk(ns: &str, url: &str, close: bool) -> anyhow::Result<(f64, String, String, String)> {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/var/run/netns/{ns}")).args([
        "wrk",
        "-t",
        THREADS,
        "-c",
        CONNECTIONS,
        "-d",
        DURATION,
        "--latency",
    ]);
    if close {
        cmd.args(["-H", "Connection: close"]);
    }
    let out = cmd
        .arg(url)
        .output()
        .context("running wrk (Debian package `wrk`; `cargo xtask setup` installs it)")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "wrk {url}: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let rps: f64 = field(&text, "Requests/sec:")
        .context("wrk printed no Requests/sec")?
        .parse()?;
    let p50 = field(&text, "50%").unwrap_or("-").to_string();
    let p99 = field(&text, "99%").unwrap_or("-").to_string();
    let mut errors = Vec::new();
    for l in text.lines().map(str::trim) {
        if l.starts_with("Socket errors:") || l.starts_with("Non-2xx") {
            errors.push(l.to_string());
        }
    }
    let errors = if errors.is_empty() {
        "none".to_string()
    } else {
        errors.join("; ")
    };
    Ok((rps, p50, p99, errors))
}

fn main() -> anyhow::Result<()> {
    xlb_tests::require_root();
    let xlb = find_xlb()?;
    let cfg = XlbConfig::lab_default(PREFIX, Mode::DsrIpip, 3);
    let run = LabRun::up(PREFIX, &xlb, &cfg.render())?;
    run.wait_all_up(Duration::from_secs(20))?;
    let ns = run.lab().ns_client();
    let cases: [(&'static str, &str, bool); 5] = [
        (
            "direct to backend b1, keep-alive (no LB)",
            "http://10.99.0.11/api",
            false,
        ),
        (
            "VIP api, dsr-ipip, keep-alive",
            "http://10.100.0.1/api",
            false,
        ),
        (
            "VIP api2, dsr-l2, keep-alive",
            "http://10.100.0.2/api",
            false,
        ),
        (
            "VIP api6 (IPv6), dsr-ipip, keep-alive",
            "http://[fd00:100::1]/api",
            false,
        ),
        (
            "VIP api, dsr-ipip, new connection per request",
            "http://10.100.0.1/api",
            true,
        ),
    ];
    let mut rows = Vec::new();
    for (label, url, close) in cases {
        let (rps, p50, p99, errors) = wrk(&ns, url, close)?;
        rows.push(Row {
            label,
            rps,
            p50,
            p99,
            errors,
        });
    }
    let status = run.status_text().unwrap_or_default();
    run.shutdown()?;

    println!(
        "xlb lab throughput: wrk -t{THREADS} -c{CONNECTIONS} -d{DURATION} from the client \
         namespace; backends answer GET /api (all processes share this machine's CPUs)"
    );
    println!(
        "{:<48} {:>10} {:>9} {:>9}  errors",
        "case", "req/s", "p50", "p99"
    );
    for r in &rows {
        println!(
            "{:<48} {:>10.0} {:>9} {:>9}  {}",
            r.label, r.rps, r.p50, r.p99, r.errors
        );
    }
    println!("\nxlb status after the runs:\n{status}");
    Ok(())
}
