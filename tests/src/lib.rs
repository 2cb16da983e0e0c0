//! Shared pieces of xlb's integration tests and benchmarks: network namespace
//! guards, a packet builder, and a harness that runs the XDP programs through
//! `BPF_PROG_TEST_RUN` inside a namespace of its own.

// A dev-dependency of the integration tests, which the library's own unit
// tests see too.
#[cfg(test)]
use serde_json as _;

pub mod bench;
pub mod harness;
pub mod lab;
pub mod nat_lab;
pub mod nat_world;
pub mod netns;
pub mod packet;
pub mod tls;

/// Whether this process may load BPF programs and create namespaces. Tests
/// that need it fail with a clear message otherwise (`cargo xtask test` runs
/// them as root), rather than silently passing.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test loads XDP programs and creates network namespaces: run it as root \
         (`cargo xtask test` does)"
    );
}
