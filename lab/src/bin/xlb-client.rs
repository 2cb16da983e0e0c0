//! `xlb-client`: load against a target, recording every request's outcome
//! (see `xlb_lab::client`).

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]
#![allow(clippy::print_stdout, reason = "the load client prints its report")]

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::{Context, Result};
use clap::Parser;
use xlb_lab::client::{LoadOptions, parse_duration, run_load};

/// Load client for the xlb lab: short connections at a fixed rate,
/// keep-alive connections and long-lived /stream connections, with a
/// per-slice timeline of outcomes (ok, refused, reset, timed_out, http_5xx,
/// closed, other_error) and which backend answered.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address to load, e.g. `10.100.0.1:80` or `[fd00:100::1]:80`.
    #[arg(long)]
    target: SocketAddr,
    /// How long to start requests (e.g. 10s, 500ms).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// New short connections per second, one request each.
    #[arg(long, default_value_t = 200)]
    rate: u32,
    /// Keep-alive connections doing back-to-back requests.
    #[arg(long, default_value_t = 10)]
    keepalive: u32,
    /// Pause between requests on a keep-alive connection.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    keepalive_interval: Duration,
    /// Long-lived /stream connections, each watched for stalls.
    #[arg(long, default_value_t = 0)]
    long: u32,
    /// Line interval asked of the server on /stream.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    stream_interval: Duration,
    /// A long connection with no bytes for longer than this has stalled.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    stall_after: Duration,
    /// Bound on one request, connect included.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    timeout: Duration,
    /// Most short connections in flight; further starts are skipped and counted.
    #[arg(long, default_value_t = 2000)]
    max_in_flight: usize,
    /// Path requested by short and keep-alive connections.
    #[arg(long, default_value = "/api")]
    path: String,
    /// Width of one timeline slice.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    slice: Duration,
    /// Source address for the connections, one per flag; they are taken in
    /// turn (each must be this host's own). Default: the kernel picks.
    #[arg(long = "source", value_name = "ADDR")]
    sources: Vec<std::net::IpAddr>,
    /// Also write the full report (summary and timeline) as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = Args::parse();
    let opts = LoadOptions {
        target: a.target,
        duration: a.duration,
        rate: a.rate,
        keepalive: a.keepalive,
        keepalive_interval: a.keepalive_interval,
        long: a.long,
        stream_interval: a.stream_interval,
        stall_after: a.stall_after,
        timeout: a.timeout,
        max_in_flight: a.max_in_flight,
        path: a.path,
        slice: a.slice,
        sources: a.sources,
    };
    let report = run_load(opts).await.context("running the load")?;
    print!("{}", report.render_text());
    if let Some(path) = a.json {
        let json = serde_json::to_vec_pretty(&report).context("serialising the report")?;
        std::fs::write(&path, json)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    Ok(())
}
