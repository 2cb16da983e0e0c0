//! xlb userspace: configuration, Maglev, health checking, map access, the
//! daemon, its control socket and the CLI.

pub mod announce;
pub mod chance;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod ctl;
pub mod daemon;
pub mod dataplane;
pub mod decap;
pub mod guard;
pub mod health;
pub mod host;
pub mod kernel;
pub mod logging;
pub mod maglev;
pub mod metrics;
pub mod route;
pub mod trace;
pub mod upgrade;
pub mod version;
