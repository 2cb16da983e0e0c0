//! A lab with xlb running in it: what the end-to-end tests, `cargo xtask lab`
//! and `cargo xtask demo` share.
//!
//! [`LabRun::up`] builds the namespaces ([`Lab::up`]), starts `xlb-backend`
//! and `xlb decap --interface eth0` (allowing the LB's addresses as outer
//! sources and the lab's VIPs as inner destinations) in every backend namespace,
//! `xlb xdp-pass --interface v-lb` in the bridge namespace and `xlb run` in
//! the LB namespace, and waits until every backend is `up`. Dropping it stops
//! everything, runs `xlb detach --instance` and removes the namespaces.
//!
//! xlb is driven as a subprocess through its command line (this crate does
//! not depend on the rest of xlb but for its control protocol, `lb_ctl`):
//! `xlb status --json` and `xlb events --json` are read into the protocol's
//! own types.
//!
//! The pieces, re-exported here: `config` renders the configuration file,
//! `process` runs commands inside namespaces and records them, `run` holds
//! [`LabRun`]'s life cycle, `control` drives xlb's CLI, `traffic` the client
//! namespace, `status` parses xlb's JSON and `netdev` checks interfaces.
//!
//! Processes enter their namespace with `setns(2)` between fork and exec
//! rather than through `ip netns exec`: that command also unshares the mount
//! namespace and remounts `/sys`, so the bpffs that `xlb run` mounts and pins
//! into would be private to the daemon and vanish with it (no adoption after
//! a restart, nothing for `xlb detach` to find).

use std::{io, net::SocketAddr, path::PathBuf, time::Duration};

use crate::topology::LabError;

mod cluster;
mod config;
mod control;
mod netdev;
mod process;
mod run;
mod status;
mod traffic;

pub use cluster::{
    ClusterOptions, ClusterRun, LAB_ANNOUNCE_TABLE, LAB_HASH_SEED, LAB_ROUTE_PROTOCOL,
    SESSION_TIMEOUT, Speaker, node_b_instance, node_b_socket,
};
pub use config::{
    Health, LAB_CONNTRACK_SIZE, LAB_TABLE_SIZE, Mode, Protection, Protocol, Share, Vip, XlbConfig,
    backend_addr, instance_and_socket, instance_for, setting, socket_for,
};
pub use netdev::{set_tx_checksum_offload, xdp_attached};
pub use process::{Binaries, ProcRecord, StateFile, command_in, detach, find_xlb, log_tail};
pub use run::{LabRun, RunOptions};
pub use status::{
    BackendStatus, Event, EventKind, ProbeStatus, Status, VipStatus, parse_events, parse_status,
};
pub use traffic::{ClientRun, start_client_in};

/// Service ports every backend listens on (v4 and v6): 80 for the main VIPs,
/// 8080 so that one VIP address can be configured twice (e.g. fd00:100::1 in
/// both forwarding modes).
pub const SERVICE_PORTS: [u16; 2] = [80, 8080];

/// UDP ports every backend answers on (v4 and v6) with an echo naming the
/// backend (`xlb-backend --udp`), for UDP VIPs: two, like
/// [`SERVICE_PORTS`], so that one VIP address can serve UDP in both modes.
pub const UDP_PORTS: [u16; 2] = [5353, 5354];

/// Port of each backend's admin listener (fault switches, `/stats`).
pub const ADMIN_PORT: u16 = 9000;

/// How long [`LabRun::up`] waits for the daemon to answer and every backend
/// to be `up`, by default. Backends need `rise` probes; a daemon building
/// its maps on a loaded 2-CPU machine takes a few seconds.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a helper process (decap, xdp-pass, backend) gets to attach or
/// bind before `up` gives up on it. A two-node lab starts five XDP
/// programs at once (debug builds load slowly); on a shared 2-CPU machine
/// under a load average of 10 that took over 15 s.
const HELPER_START_TIMEOUT: Duration = Duration::from_secs(45);

/// Bound on one `xlb` CLI call (status, events, drain, reload...).
const CLI_TIMEOUT: Duration = Duration::from_secs(15);

/// Bound on one call to a backend's admin listener.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

/// How often waits poll.
const POLL: Duration = Duration::from_millis(100);

/// Lines of a log file quoted in errors.
const LOG_TAIL_LINES: usize = 25;

/// Name of the state file in the work directory: what `lab down` needs to
/// stop a lab that `lab up` left running (or that was interrupted).
pub const STATE_FILE: &str = "lab.json";

/// Everything that can go wrong running xlb in the lab.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error(transparent)]
    Lab(#[from] LabError),

    #[error("{what} not found at {path}; {hint}")]
    MissingBinary {
        what: String,
        path: PathBuf,
        hint: String,
    },

    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },

    #[error("{what} exited early ({status}); last lines of {log}:\n{tail}")]
    Exited {
        what: String,
        status: String,
        log: PathBuf,
        tail: String,
    },

    #[error("`{cmd}` failed ({status}): {stderr}")]
    Cli {
        cmd: String,
        status: String,
        stderr: String,
    },

    #[error("timed out after {after:?} waiting for {what}; last seen: {last}")]
    Timeout {
        what: String,
        after: Duration,
        last: String,
    },

    #[error("could not read the output of `{cmd}`: {reason}; output was: {output}")]
    Parse {
        cmd: String,
        reason: String,
        output: String,
    },

    #[error("backend b{backend} admin {addr}: {source}")]
    Admin {
        backend: usize,
        addr: SocketAddr,
        source: io::Error,
    },

    #[error("load client: {0}")]
    Client(String),

    #[error("invalid scenario: {0}")]
    Invalid(String),
}

type Result<T, E = ScenarioError> = std::result::Result<T, E>;

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ScenarioError {
    let what = what.into();
    move |source| ScenarioError::Io { what, source }
}
