//! xlb's test lab: a namespaced network with a client, an LB host and
//! backends ([`topology`]), a backend HTTP server with switchable faults
//! ([`backend`], binary `xlb-backend`) and a load client that records every
//! request's outcome ([`client`], binary `xlb-client`), and two bounded
//! floods for the abuse tests: spoofed TCP packets from a raw socket
//! ([`flood`]) and real connects as fast as the kernel opens them
//! ([`connect_flood`]); and for UDP, an echo on every backend that names it
//! ([`backend::serve_udp`]) and a client of many flows ([`udp_client`]).
//! A client that makes passive evidence on purpose, from one address
//! ([`evidence_attack`]). For several load-balancer nodes: connections held through a node's
//! death, timing every exchange ([`held`]), and the router's routes as
//! they change ([`route_watch`]).
//!
//! The lab does not depend on the rest of xlb, but for the control
//! protocol's types (`lb_ctl`) that it reads xlb's answers into: whoever
//! holds the eBPF object attaches programs to the interfaces the topology
//! names. [`scenario`] does that by running the `xlb` binary (given its
//! path) in the lab, for the end-to-end tests and `cargo xtask lab`/`demo`.

// The binaries (`xlb-backend`, `xlb-client`) parse arguments with clap and
// report errors with anyhow; named here so that `unused_crate_dependencies`
// holds for the library too.
use {anyhow as _, clap as _};
pub mod backend;
pub mod bird;
pub mod client;
pub mod connect_flood;
pub mod evidence_attack;
pub mod flood;
pub mod grpc_health;
pub mod held;
pub mod http;
pub mod route_watch;
pub mod scenario;
pub mod topology;
pub mod udp_client;

pub use backend::{BackendHandle, BackendOptions, BackendStats, Fault, serve};
pub use client::{LoadOptions, Outcome, Report, run_load};
pub use topology::{Lab, LabConfig, LabError};
