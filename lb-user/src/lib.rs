//! xlb userspace: configuration, Maglev, health checking, map access, the
//! daemon, its control socket and the CLI.

// The `xlb` binary sets up logging with it; named here so that
// `unused_crate_dependencies` holds for the library too.
use tracing_subscriber as _;
// Issue 25's probe kinds, landing one by one: each line goes when its
// crate is used (one per probe kind's owner, to keep merges apart).
use hickory_proto as _; // dns
use regex as _; // send/expect

pub mod cli;
pub mod config;
pub mod ctl;
pub mod daemon;
pub mod dataplane;
pub mod decap;
pub mod guard;
pub mod health;
pub mod host;
pub mod maglev;
pub mod metrics;
pub mod route;
