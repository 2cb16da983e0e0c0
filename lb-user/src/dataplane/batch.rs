//! Reading a whole hash map with `BPF_MAP_LOOKUP_BATCH`, for the daemon's
//! walking threads (conntrack, per-source counters).
//!
//! aya 0.14 has no batch lookup: its `HashMap::iter` costs a
//! `BPF_MAP_GET_NEXT_KEY` and a `BPF_MAP_LOOKUP_ELEM` per entry (two million
//! syscalls for a full default conntrack), and `get_next_key` restarts from
//! the first key whenever the LRU evicted the key it was given, so under
//! churn a key-by-key walk may never end. A batch walk reads up to
//! [`BATCH`] entries per call, bucket by bucket, and ends.

use std::{
    io,
    os::fd::{AsFd as _, AsRawFd as _},
};

use aya::{Pod, maps::MapData};

/// `BPF_MAP_LOOKUP_BATCH` in `enum bpf_cmd` (include/uapi/linux/bpf.h);
/// hash and LRU hash maps have it since Linux 5.6 (commit 057996380a42,
/// "bpf: Add batch ops to all htab bpf map").
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// The kernel's internal ENOTSUPP, which `bpf(2)` returns for a map type
/// without batch operations.
const ENOTSUPP: i32 = 524;

/// Entries per call: a million-entry conntrack in 256 calls, a full
/// per-source map in 16.
pub const BATCH: usize = 4096;

/// The `batch` member of `union bpf_attr`. The kernel accepts an attribute
/// shorter than its own union (the rest reads as zero).
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

/// Whether `e`, from [`lookup_batch`], says the kernel has no batch lookup
/// for this map (then walk key by key).
pub fn batch_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP | ENOTSUPP)
    )
}

/// Calls `each` with every entry of the hash map `map` (keys `K`, values
/// `V`), bucket by bucket, until it returns `false` or the map ends.
///
/// # Errors
/// The map's key or value size is not `K`'s or `V`'s (nothing is read), or
/// the syscall failed ([`batch_unsupported`] tells a kernel without it).
pub fn lookup_batch<K: Pod + Default, V: Pod + Default>(
    map: &MapData,
    mut each: impl FnMut(&K, &V) -> bool,
) -> io::Result<()> {
    let info = map.info().map_err(io::Error::other)?;
    if info.key_size() as usize != size_of::<K>() || info.value_size() as usize != size_of::<V>() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "map has {}-byte keys and {}-byte values, not {} and {}",
                info.key_size(),
                info.value_size(),
                size_of::<K>(),
                size_of::<V>()
            ),
        ));
    }
    let fd = map.fd().as_fd().as_raw_fd();
    let mut keys = vec![K::default(); BATCH];
    let mut values = vec![V::default(); BATCH];
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
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is a valid `batch` attribute of its stated size;
        // `keys` and `values` hold `count` elements of the map's key and
        // value sizes (checked above), and both cursors are 64 bytes: the
        // kernel writes nothing beyond them.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                size_of::<BatchAttr>() as u32,
            )
        };
        // ENOENT: past the last bucket; `count` still says how many
        // entries this last call returned.
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
        for (k, v) in keys[..n].iter().zip(&values[..n]) {
            if !each(k, v) {
                return Ok(());
            }
        }
        if done {
            return Ok(());
        }
        cursor = next;
        first = false;
    }
}
