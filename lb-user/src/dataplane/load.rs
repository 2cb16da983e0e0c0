//! Loading the object's programs into the kernel (the verifier runs here),
//! and the pinned counter maps a new binary cannot adopt.

use std::path::Path;

use aya::{
    Ebpf,
    maps::MapData,
    programs::{Program, ProgramError},
};

use super::{DataplaneError, Result, map_err};

/// Counter maps indexed by a reason enum of this binary: (name, entries).
const COUNTER_MAPS: [(&str, u32); 3] = [
    (lb_common::MAP_STATS, lb_common::STATS_LEN),
    (lb_common::MAP_HC_STATS, lb_common::HC_STATS_LEN),
    (lb_common::MAP_DECAP_STATS, lb_common::DECAP_STATS_LEN),
];

/// Unpins each counter map in `dir` whose size is not this binary's (one
/// pinned by a binary that counted fewer or other reasons), so the load
/// creates it anew: an upgrade that adds a counter keeps every flow, and
/// those counters alone restart at 0. The running program keeps the old
/// map until the new one replaces it. Returns the names renewed.
pub(super) fn renew_counter_pins(dir: &Path) -> Result<Vec<&'static str>> {
    let mut renewed = Vec::new();
    for (name, entries) in COUNTER_MAPS {
        let path = dir.join(name);
        if !path.exists() {
            continue;
        }
        let pinned = MapData::from_pin(&path)
            .and_then(|m| m.info())
            .map_err(map_err(name))?
            .max_entries();
        if pinned != entries {
            std::fs::remove_file(&path).map_err(|source| DataplaneError::Io { name, source })?;
            tracing::info!(
                "pinned counter map {name} has {pinned} entries, this binary counts {entries} \
                 reasons: created anew (its counters restart at 0; flows are kept)"
            );
            renewed.push(name);
        }
    }
    Ok(renewed)
}

/// Every program the daemon loads, in the order they are loaded.
pub(super) const ALL_PROGRAMS: [&str; 5] = [
    lb_common::PROG_LB,
    lb_common::PROG_DECAP,
    lb_common::PROG_MINIMAL,
    lb_common::PROG_PASS,
    lb_common::PROG_HC,
];

/// Loads `programs` of the object into the kernel (the verifier runs
/// here).
pub(super) fn load_programs(ebpf: &mut Ebpf, programs: &[&'static str]) -> Result<()> {
    for &name in programs {
        let err = |source| DataplaneError::Program { name, source };
        match ebpf.program_mut(name).ok_or(err(ProgramError::NotLoaded))? {
            Program::Xdp(prog) => retrying_eagain(|| prog.load()),
            Program::SchedClassifier(prog) => retrying_eagain(|| prog.load()),
            _ => Err(ProgramError::UnexpectedProgramType),
        }
        .map_err(err)?;
    }
    Ok(())
}

/// Loads of one program before an `EAGAIN` is given up on.
const LOAD_ATTEMPTS: u32 = 5;

/// `load`, again while the kernel answers `EAGAIN`: the verifier stops
/// with it when a signal is pending for the loading thread (it checks
/// during long verifications, and `xlb_lb` takes over a second), so a
/// daemon or test whose runtime handles signals (SIGCHLD of a child
/// process) can see a sound program refused. libbpf retries the same way.
fn retrying_eagain(
    mut load: impl FnMut() -> std::result::Result<(), ProgramError>,
) -> std::result::Result<(), ProgramError> {
    let mut attempt = 1;
    loop {
        match load() {
            Err(ProgramError::LoadError { io_error, .. })
                if io_error.kind() == std::io::ErrorKind::WouldBlock && attempt < LOAD_ATTEMPTS =>
            {
                attempt += 1;
            }
            other => return other,
        }
    }
}
