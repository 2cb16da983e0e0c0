//! The conntrack LRU two ways, for `xlb-lru-bench`: the kernel's common
//! LRU (one LRU list for all CPUs, what xlb ships) and a per-CPU LRU
//! (`BPF_F_NO_COMMON_LRU`: each CPU evicts only from the entries it
//! inserted). The object declares the common one; the per-CPU one is created
//! here with the same key, value and size and pinned where the loader looks,
//! so the loader adopts it instead (aya adopts a pinned map without
//! comparing its flags, as the daemon's restart does).

use std::{
    ffi::CString,
    fs,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use lb_common::{CtEntry, FlowKey, MAP_CT};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
/// `BPF_F_NO_COMMON_LRU`.
pub const NO_COMMON_LRU: u32 = 1 << 1;

fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> std::io::Result<i64> {
    // SAFETY: `attr` is a zero-padded `union bpf_attr` of 128 bytes, larger
    // than either command reads.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r)
}

fn put_u32(attr: &mut [u8; 128], at: usize, v: u32) {
    attr[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put_u64(attr: &mut [u8; 128], at: usize, v: u64) {
    attr[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// Writes `entries` into the conntrack map `ct` in one
/// `BPF_MAP_UPDATE_BATCH` (5.6): each goes through the same LRU insert as
/// the program's (`htab_lru_map_update_elem`), on the calling CPU, with no
/// syscall per entry. Returns how many were written.
pub fn update_batch(ct: BorrowedFd<'_>, entries: &[(FlowKey, CtEntry)]) -> std::io::Result<u32> {
    let keys: Vec<FlowKey> = entries.iter().map(|(k, _)| *k).collect();
    let values: Vec<CtEntry> = entries.iter().map(|(_, v)| *v).collect();
    // struct { u64 in_batch, out_batch, keys, values; u32 count, map_fd;
    //          u64 elem_flags, flags; }
    let mut attr = [0u8; 128];
    put_u64(&mut attr, 16, keys.as_ptr() as u64);
    put_u64(&mut attr, 24, values.as_ptr() as u64);
    put_u32(&mut attr, 32, entries.len() as u32);
    put_u32(&mut attr, 36, ct.as_raw_fd() as u32);
    bpf(BPF_MAP_UPDATE_BATCH, &mut attr)?;
    // The kernel writes back how many it processed.
    Ok(u32::from_ne_bytes(attr[32..36].try_into().unwrap()))
}

/// A pin directory on bpffs holding an LRU conntrack map of `entries`
/// created with `flags`; removed (with whatever the loader pinned next to
/// it) on drop.
pub struct PinnedCt {
    pub dir: PathBuf,
}

impl PinnedCt {
    pub fn new(tag: &str, entries: u32, flags: u32) -> anyhow::Result<Self> {
        let dir = Path::new("/sys/fs/bpf").join(format!("xlb-bench-{tag}-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let pinned = Self { dir };
        // struct { map_type, key_size, value_size, max_entries, map_flags, ... }
        let mut attr = [0u8; 128];
        put_u32(&mut attr, 0, BPF_MAP_TYPE_LRU_HASH);
        put_u32(&mut attr, 4, size_of::<FlowKey>() as u32);
        put_u32(&mut attr, 8, size_of::<CtEntry>() as u32);
        put_u32(&mut attr, 12, entries);
        put_u32(&mut attr, 16, flags);
        // map_name at offset 28 (after inner_map_fd and numa_node).
        attr[28..28 + MAP_CT.len()].copy_from_slice(MAP_CT.as_bytes());
        let fd = bpf(BPF_MAP_CREATE, &mut attr)?;
        // SAFETY: a descriptor the kernel just returned, owned here alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let path = CString::new(
            pinned
                .dir
                .join(MAP_CT)
                .into_os_string()
                .into_encoded_bytes(),
        )?;
        // struct { u64 pathname; u32 bpf_fd; u32 file_flags; }
        let mut attr = [0u8; 128];
        attr[..8].copy_from_slice(&(path.as_ptr() as u64).to_ne_bytes());
        put_u32(&mut attr, 8, fd.as_raw_fd() as u32);
        bpf(BPF_OBJ_PIN, &mut attr)?;
        Ok(pinned)
    }
}

impl Drop for PinnedCt {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}
