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
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use lb_common::{SourceKey, SourceState};
use tracing::{debug, info, warn};

use crate::daemon::TICK;

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
    match walk_batch(data.fd().as_fd(), &mut entries) {
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
    let fd = data.fd().as_fd();
    let mut batch = true;
    let mut last_error = String::new();
    loop {
        let started = Instant::now();
        let mut entries = Vec::new();
        let mut result = Ok(());
        if batch {
            result = walk_batch(fd, &mut entries);
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

/// `BPF_MAP_LOOKUP_BATCH` in `enum bpf_cmd` (include/uapi/linux/bpf.h);
/// hash and LRU hash maps have it since Linux 5.6 (commit 057996380a42).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// The kernel's internal ENOTSUPP, which `bpf(2)` returns for a map type
/// without batch operations.
const ENOTSUPP: i32 = 524;

/// Entries per call: a full map in 16 calls.
const BATCH: usize = 4096;

/// The `batch` member of `union bpf_attr` (the kernel reads the rest of
/// its union as zero).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

fn batch_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP | ENOTSUPP)
    )
}

/// Reads every entry with `BPF_MAP_LOOKUP_BATCH`, bucket by bucket.
fn walk_batch(fd: BorrowedFd<'_>, out: &mut Vec<(SourceKey, SourceState)>) -> io::Result<()> {
    let mut keys = vec![SourceKey::default(); BATCH];
    let mut values = vec![SourceState::default(); BATCH];
    // The hash map's cursor is a bucket index (a u32); leave room anyway.
    let mut cursor = [0u64; 8];
    let mut next = [0u64; 8];
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { cursor.as_ptr() as u64 },
            out_batch: next.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: BATCH as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is a valid `batch` attribute of its stated size;
        // `keys` and `values` hold `count` elements of the map's key and
        // value sizes (aya checked both when it opened the map as
        // `HashMap<SourceKey, SourceState>`), and both cursors are 64
        // bytes: the kernel writes nothing beyond them.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>() as u32,
            )
        };
        // ENOENT: past the last bucket; `count` says how many entries this
        // last call returned.
        let done = if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e);
            }
            true
        } else {
            false
        };
        let n = (attr.count as usize).min(BATCH);
        out.extend(keys[..n].iter().copied().zip(values[..n].iter().copied()));
        if done {
            return Ok(());
        }
        cursor = next;
        first = false;
    }
}
