//! `xlb-backend`: the lab's HTTP backend with fault switches (see
//! `xlb_lab::backend` for the endpoints).

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::net::SocketAddr;

use anyhow::{Context, Result};
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use xlb_lab::backend::{BackendOptions, serve};

/// HTTP/1.1 backend for the xlb lab: /health, /api, /stream on the service
/// listeners; /fault/{hang,slow?ms=N,503,crash,recover} and /stats on the
/// admin listener.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Name reported in the X-Backend header, /api bodies and /stats.
    #[arg(long)]
    name: String,
    /// Service address; repeat for several (e.g. `0.0.0.0:80` and `[::]:80`).
    #[arg(long, required = true)]
    listen: Vec<SocketAddr>,
    /// Admin address (fault switches and stats; answers during faults).
    #[arg(long, default_value = "0.0.0.0:9000")]
    admin: SocketAddr,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let handle = serve(BackendOptions {
        name: args.name.clone(),
        listen: args.listen,
        admin: args.admin,
    })
    .await
    .with_context(|| format!("starting backend {}", args.name))?;
    let service: Vec<String> = handle
        .service_addrs()
        .iter()
        .map(ToString::to_string)
        .collect();
    eprintln!(
        "xlb-backend {}: serving on {}, admin on {}",
        handle.name(),
        service.join(", "),
        handle.admin_addr()
    );
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for ctrl-c")?,
        _ = term.recv() => {}
    }
    handle.shutdown().await;
    Ok(())
}
