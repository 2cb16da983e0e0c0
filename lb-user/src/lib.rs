//! xlb userspace: configuration, Maglev, health checking, map access, the
//! daemon, its control socket and the CLI.

// The `xlb` binary sets up logging with it; named here so that
// `unused_crate_dependencies` holds for the library too.
use tracing_subscriber as _;
// Issue 28 placeholders: whoever first uses one of these deletes its line.
use clap_complete as _;
use clap_mangen as _;
use crossterm as _;
use ratatui as _;
use sd_notify as _;

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
pub mod maglev;
pub mod metrics;
pub mod route;
pub mod trace;
