//! xlb userspace: configuration, Maglev, health checking, map access, the
//! daemon, its control socket and the CLI.
pub mod cli;
pub mod config;
pub mod ctl;
pub mod daemon;
pub mod dataplane;
pub mod decap;
pub mod health;
pub mod host;
pub mod maglev;
pub mod metrics;
