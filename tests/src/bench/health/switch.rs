//! Figure 3 (hook): health change to data plane.

use std::time::Duration;

use anyhow::{Context as _, Result};

use super::report::{Row, Secs, Summary, Verdict};

/// Backend counts of figure 3 (see [`table_switch_rows`]).
const SWITCH_BACKENDS: [usize; 3] = [10, 100, 1_000];

/// Figure 3, to be wired to the daemon's table swap: the time from the probe
/// result that crosses `fall` to the data plane using the new table, with
/// 10, 100 and 1,000 backends behind a VIP.
///
/// `measure(n)` sets up `n` healthy backends, makes one cross `fall` as many
/// times as it likes, and returns one duration per time: from the report of
/// the Up→Down transition to the moment the data plane uses the rebuilt
/// table. Each count becomes one row judged on its max against `target`.
/// `run` does not call this yet, so nothing is printed for figure 3.
#[expect(
    dead_code,
    reason = "figure 3 hook: the lead wires it to the daemon's table swap"
)]
async fn table_switch_rows(
    target: Duration,
    mut measure: impl AsyncFnMut(usize) -> Result<Vec<Duration>>,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for n in SWITCH_BACKENDS {
        let samples = measure(n)
            .await
            .with_context(|| format!("figure 3 with {n} backends"))?;
        let summary = Summary::of(samples)
            .with_context(|| format!("figure 3 with {n} backends: no samples"))?;
        rows.push(Row {
            figure: format!(
                "fall crossed → data plane on new table, {n} backends (n={})",
                summary.n
            ),
            value: summary.to_string(),
            target: format!("max <= {}", Secs(target)),
            verdict: Verdict::of(summary.max <= target),
        });
    }
    Ok(rows)
}
