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
use xlb_lab::backend::{BackendOptions, serve, serve_udp};

/// HTTP/1.1 backend for the xlb lab: /health, /api, /stream on the service
/// listeners; /fault/{hang,slow?ms=N,503,crash,recover} and /stats on the
/// admin listener; a UDP echo that names the backend on each `--udp`.
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
    /// UDP address to answer on (repeatable): each datagram P is answered
    /// with `<name> P` from the address it was sent to.
    #[arg(long)]
    udp: Vec<SocketAddr>,
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
    let udp = serve_udp(&args.name, &args.udp)?;
    let service: Vec<String> = handle
        .service_addrs()
        .iter()
        .map(ToString::to_string)
        .collect();
    let udp_addrs: Vec<String> = udp.addrs().iter().map(ToString::to_string).collect();
    eprintln!(
        "xlb-backend {}: serving on {}, admin on {}, UDP echo on [{}]",
        handle.name(),
        service.join(", "),
        handle.admin_addr(),
        udp_addrs.join(", ")
    );
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for ctrl-c")?,
        _ = term.recv() => {}
    }
    drop(udp);
    handle.shutdown().await;
    Ok(())
}
