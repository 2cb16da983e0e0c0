//! `xlb-grpc-health`: the lab's gRPC health server (see
//! `xlb_lab::grpc_health`).

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use xlb_lab::grpc_health::{GrpcHealthOptions, serve};

/// gRPC health server (grpc.health.v1, tonic-health) for the xlb lab. The
/// whole server (service "") and each `--service` start SERVING; SIGUSR1
/// switches them all to NOT_SERVING and back.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address to serve on (h2c); repeatable; port 0 picks one (the bound
    /// addresses are printed on stderr: `serving on A B ...`).
    #[arg(long, required = true)]
    listen: Vec<SocketAddr>,
    /// A service name to report (repeatable), besides the whole server ("").
    #[arg(long)]
    service: Vec<String>,
    /// Switch to NOT_SERVING this many milliseconds after start.
    #[arg(long)]
    not_serving_after_ms: Option<u64>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    serve(GrpcHealthOptions {
        listen: args.listen,
        services: args.service,
        not_serving_after: args.not_serving_after_ms.map(Duration::from_millis),
    })
    .await
}
