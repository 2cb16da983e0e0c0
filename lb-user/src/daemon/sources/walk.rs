//! The per-source map's walk, on a thread of its own.
//!
//! A full map (`MAX_SOURCES`, 65,536 entries) read with aya's iterator costs
//! a `BPF_MAP_GET_NEXT_KEY` and a `BPF_MAP_LOOKUP_ELEM` per entry: 90 to
//! 200 ms a walk on the 2-CPU test machine (the `walking_a_full_sources_map`
//! daemon test measures it), every second, which the main loop (health
//! reports, admin commands) must not wait for. So the walk runs on a thread
//! of its own, with `BPF_MAP_LOOKUP_BATCH` (16 calls for a full map, 12 to
//! 16 ms in the same test), key by key only on kernels without it, and
//! leaves the latest walk for the main loop's tick to take. The rates and
//! the per-VIP summaries are computed here too (pure, `guard::sources`):
//! with 10,000 active sources they cost a debug build a few hundred
//! milliseconds a walk, which `xlb status` must not wait for.

use std::{
    io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use std::collections::BTreeMap;

use lb_common::{SourceKey, SourceState};
use tracing::{debug, info, warn};

use crate::{
    daemon::TICK,
    dataplane::batch::{batch_unsupported, lookup_batch},
    guard::sources::{Rates, SourceRate, VipSummary, by_vip},
};

/// One walk of the map, with what it says.
#[derive(Clone, Debug, Default)]
pub(crate) struct Walk {
    /// How long it took.
    pub(crate) took: Duration,
    /// Entries read.
    pub(crate) entries: usize,
    /// The sources per VIP id; `None`: keep the last (a walk too close to
    /// the previous one gives no rates).
    pub(crate) summary: Option<BTreeMap<u32, VipSummary>>,
    /// Every source's rates over the interval (from, now] (since the
    /// thread started); `None` for the first walk and one too close to the
    /// previous.
    pub(crate) rated: Option<((Duration, Duration), Vec<SourceRate>)>,
}

/// Rates and summaries of successive walks, as [`Walk`] carries them.
#[derive(Debug)]
struct Rater {
    epoch: Instant,
    rates: Rates,
}

impl Rater {
    fn walk(&mut self, at: Instant, took: Duration, entries: &[(SourceKey, SourceState)]) -> Walk {
        let now = at.saturating_duration_since(self.epoch);
        let from = self.rates.last_walk();
        let rates = self.rates.update(entries, now);
        let (summary, rated) = match (rates, from) {
            (Some(rates), Some(from)) => {
                (Some(by_vip(entries, &rates)), Some(((from, now), rates)))
            }
            // The first walk: sources tracked, no rates yet.
            (_, None) => (Some(by_vip(entries, &[])), None),
            (None, Some(_)) => (None, None),
        };
        Walk {
            took,
            entries: entries.len(),
            summary,
            rated,
        }
    }
}

/// The latest walk, until the main loop takes it.
pub(crate) type Latest = Arc<Mutex<Option<Walk>>>;

/// Walks the map pinned at `pin` every [`TICK`] on a thread of its own,
/// leaving each walk in `latest`.
pub(crate) fn spawn(pin: PathBuf, latest: Latest) {
    let spawned = std::thread::Builder::new()
        .name("xlb-sources".into())
        .spawn(move || walk_for_ever(&pin, &latest));
    if let Err(e) = spawned {
        warn!("xlb sources, source alerts and auto_block will not work: starting a thread: {e}");
    }
}

/// Reads every entry of the per-source map pinned at `pin` once, as the
/// daemon's walking thread does (batch lookups, key by key without them);
/// for measuring a walk.
///
/// # Errors
/// The map cannot be opened or read.
pub fn walk_sources(pin: &Path) -> io::Result<Vec<(SourceKey, SourceState)>> {
    let data = aya::maps::MapData::from_pin(pin).map_err(io::Error::other)?;
    let mut entries = Vec::new();
    match lookup_batch(&data, |k, v| {
        entries.push((*k, *v));
        true
    }) {
        Err(e) if entries.is_empty() && batch_unsupported(&e) => {
            let map = aya::maps::Map::LruHashMap(data);
            let by_key = aya::maps::HashMap::<_, SourceKey, SourceState>::try_from(&map)
                .map_err(io::Error::other)?;
            Ok(by_key.iter().filter_map(Result::ok).collect())
        }
        r => r.map(|()| entries),
    }
}

fn walk_for_ever(pin: &Path, latest: &Latest) {
    let map = match aya::maps::MapData::from_pin(pin) {
        Ok(m) => aya::maps::Map::LruHashMap(m),
        Err(e) => {
            warn!(
                "xlb sources, source alerts and auto_block will not work: opening {}: {e}",
                pin.display()
            );
            return;
        }
    };
    let Ok(by_key) = aya::maps::HashMap::<_, SourceKey, SourceState>::try_from(&map) else {
        warn!(
            "xlb sources will not work: {} is not the per-source map",
            pin.display()
        );
        return;
    };
    let aya::maps::Map::LruHashMap(data) = &map else {
        return;
    };
    let mut batch = true;
    let mut last_error = String::new();
    let mut rater = Rater {
        epoch: Instant::now(),
        rates: Rates::default(),
    };
    loop {
        let started = Instant::now();
        let mut entries = Vec::new();
        let mut result = Ok(());
        if batch {
            result = lookup_batch(data, |k, v| {
                entries.push((*k, *v));
                true
            });
            if let Err(e) = &result
                && entries.is_empty()
                && batch_unsupported(e)
            {
                info!(
                    "sources walk: this kernel has no BPF_MAP_LOOKUP_BATCH for LRU hash maps \
                     ({e}); walking key by key instead"
                );
                batch = false;
            }
        }
        if !batch {
            entries = by_key.iter().filter_map(Result::ok).collect();
            result = Ok(());
        }
        match result {
            Ok(()) => {
                last_error.clear();
                let took = started.elapsed();
                debug!(
                    entries = entries.len(),
                    took_us = took.as_micros() as u64,
                    "sources walked"
                );
                let walk = rater.walk(started, took, &entries);
                if let Ok(mut l) = latest.lock() {
                    *l = Some(walk);
                }
            }
            Err(e) => {
                let text = e.to_string();
                if text != last_error {
                    warn!("walking the sources map {}: {text}", pin.display());
                    last_error = text;
                }
            }
        }
        std::thread::sleep(TICK.saturating_sub(started.elapsed()));
    }
}
