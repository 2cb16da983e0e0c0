//! Health checking: probes (`probe`), the per-backend state machine
//! (`machine`) and the scheduler that runs probes with bounded concurrency.
pub mod datapath;
pub mod machine;
pub mod policy;
pub mod probe;
pub mod scheduler;
pub mod spec;

#[cfg(test)]
mod testutil;
