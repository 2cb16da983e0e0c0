//! The lab's gRPC server (binary `xlb-grpc-health`), serving only the
//! standard `grpc.health.v1.Health` service as tonic-health implements it,
//! so that the `kind = "grpc"` probe is tested against a real
//! implementation, not one written here. h2c only: the lab's tonic has no
//! TLS feature; gRPC over TLS is covered by the probe's unit tests.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::signal::unix::{SignalKind, signal};
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// What to serve.
#[derive(Clone, Debug)]
pub struct GrpcHealthOptions {
    /// Addresses to serve on (h2c), each with the same statuses; port 0
    /// picks a free port (the bound addresses are printed).
    pub listen: Vec<SocketAddr>,
    /// Service names to report, besides the whole server ("").
    pub services: Vec<String>,
    /// Switch to NOT_SERVING this long after start.
    pub not_serving_after: Option<Duration>,
}

async fn set_all(reporter: &HealthReporter, services: &[String], status: ServingStatus) {
    reporter.set_service_status("", status).await;
    for service in services {
        reporter.set_service_status(service, status).await;
    }
    eprintln!("xlb-grpc-health: now {status}");
}

/// Serves until the process ends. The whole server and every service start
/// SERVING; SIGUSR1 switches them all to NOT_SERVING and back (so a lab
/// test can flip a running server without restarting it).
pub async fn serve(opts: GrpcHealthOptions) -> Result<()> {
    let (reporter, health) = tonic_health::server::health_reporter();
    set_all(&reporter, &opts.services, ServingStatus::Serving).await;
    let mut incomings = Vec::new();
    let mut bound = Vec::new();
    for addr in &opts.listen {
        let incoming = TcpIncoming::bind(*addr).with_context(|| format!("binding {addr}"))?;
        bound.push(incoming.local_addr().context("local address")?.to_string());
        incomings.push(incoming);
    }
    let mut usr1 = signal(SignalKind::user_defined1()).context("SIGUSR1 handler")?;
    let (toggler, services) = (reporter.clone(), opts.services.clone());
    tokio::spawn(async move {
        let mut serving = true;
        while usr1.recv().await.is_some() {
            serving = !serving;
            let status = if serving {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            set_all(&toggler, &services, status).await;
        }
    });
    if let Some(after) = opts.not_serving_after {
        let services = opts.services.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            set_all(&reporter, &services, ServingStatus::NotServing).await;
        });
    }
    // The line the lab (and the benchmark) waits for before probing.
    eprintln!("xlb-grpc-health: serving on {}", bound.join(" "));
    let mut servers = tokio::task::JoinSet::new();
    for incoming in incomings {
        let server = Server::builder().add_service(health.clone());
        servers.spawn(server.serve_with_incoming(incoming));
    }
    while let Some(done) = servers.join_next().await {
        done.context("a server task")?.context("serving")?;
    }
    Ok(())
}
