//! Health checking: probes (`probe`), the per-backend state machine
//! (`machine`) and the scheduler that runs probes with bounded concurrency.
pub mod spec;
