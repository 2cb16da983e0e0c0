//! Loading the object's programs into the kernel (the verifier runs here).

use aya::{
    Ebpf,
    programs::{Program, ProgramError},
};

use super::{DataplaneError, Result};

/// Loads every program of the object into the kernel (the verifier runs
/// here).
pub(super) fn load_programs(ebpf: &mut Ebpf) -> Result<()> {
    for name in [
        lb_common::PROG_LB,
        lb_common::PROG_DECAP,
        lb_common::PROG_MINIMAL,
        lb_common::PROG_PASS,
        lb_common::PROG_HC,
    ] {
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
