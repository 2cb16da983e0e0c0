//! The kernel bits the loader wrote (`lb_common::kernel`): a constant to
//! the verifier, which drops the branches a kernel does not need.

/// Written by the loader (`EbpfLoader::override_global`) before the programs
/// load; 0 (nothing lacking) as built.
#[unsafe(no_mangle)]
static XLB_KERNEL: u32 = 0;

/// Whether the loader found the kernel lacking `bit`.
#[inline(always)]
pub(crate) fn lacks(bit: u32) -> bool {
    // SAFETY: a static's address, valid for the program's run. Volatile:
    // the value is the loader's, not the initializer LLVM would fold in.
    unsafe { core::ptr::read_volatile(&XLB_KERNEL) & bit != 0 }
}
