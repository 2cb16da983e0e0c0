//! xlb userspace: configuration, Maglev, health checking, map access, the
//! daemon, its control socket and the CLI.

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
pub mod logging;
pub mod maglev;
pub mod metrics;
pub mod route;
