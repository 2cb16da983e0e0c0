//! Health checking: probes (`probe`, through the data path: `datapath`),
//! the application's own word on it (`agent`),
//! the per-backend state machine (`machine`), the scheduler that runs
//! probes with bounded concurrency (`scheduler`), and the VIP policy that
//! decides what the table does with backends' health (`policy`); its
//! reports reach the daemon in batches (`batch`).
pub mod agent;
pub mod batch;
pub mod datapath;
pub mod machine;
pub mod passive;
pub mod policy;
pub mod probe;
pub mod scheduler;
pub mod spec;

#[cfg(test)]
pub(crate) mod testutil;

use std::time::Duration;

/// The median of `values` (the mean of the middle two for an even count);
/// `None` when there are none.
pub fn median(values: impl IntoIterator<Item = Duration>) -> Option<Duration> {
    let mut sorted: Vec<Duration> = values.into_iter().collect();
    sorted.sort_unstable();
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2),
    }
}
