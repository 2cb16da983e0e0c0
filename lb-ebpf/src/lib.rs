//! Library target so lb-user can declare lb-ebpf as a build dependency
//! (cargo ignores a dependency with no lib); the programs are in main.rs.
#![no_std]
#![allow(
    unused_crate_dependencies,
    reason = "an empty library: the dependencies are the programs' (main.rs)"
)]
