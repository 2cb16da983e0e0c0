#![no_std]
//! Library target so lb-user can declare lb-ebpf as a build dependency
//! (cargo ignores a dependency with no lib); the programs are in main.rs.
