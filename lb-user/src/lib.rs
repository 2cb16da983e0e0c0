//! xlb userspace: configuration, Maglev, health checking, map access, the
//! daemon, its control socket and the CLI.
pub mod config;
pub mod dataplane;
pub mod health;
pub mod maglev;
