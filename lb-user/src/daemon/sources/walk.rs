//! The per-source map's walk, on a thread of its own.
//!
//! A full map (`MAX_SOURCES`, 65,536 entries) read with aya's iterator costs
//! a `BPF_MAP_GET_NEXT_KEY` and a `BPF_MAP_LOOKUP_ELEM` per entry: 90 to
//! 200 ms a walk on the 2-CPU test machine (the `walking_a_full_sources_map`
//! daemon test measures it), every second, which the main loop (health
//! reports, admin commands) must not wait for. So the walk runs on a thread
//! of its own, with `BPF_MAP_LOOKUP_BATCH` (16 calls for a full map, 12 to
//! 16 ms in the same test), key by key only on kernels without it, and
//! leaves the latest walk for the main loop's tick to take.

use std::{
    io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use lb_common::{SourceKey, SourceState};
use tracing::{debug, info, warn};

use crate::{
    daemon::TICK,
    dataplane::batch::{batch_unsupported, lookup_batch},
};

/// One walk of the map.
#[derive(Clone, Debug, Default)]
pub(crate) struct Walk {
    /// When it started.
    pub(crate) at: Option<Instant>,
    /// How long it took.
    pub(crate) took: Duration,
    pub(crate) entries: Vec<(SourceKey, SourceState)>,
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
                let walk = Walk {
                    at: Some(started),
                    took,
                    entries,
                };
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
