//! Reading a whole hash map with `BPF_MAP_LOOKUP_BATCH`, for the daemon's
//! walking threads (conntrack, per-source counters), and the first entries
//! of a per-CPU array in one call, for its counters (every tick).
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
        // SAFETY: `keys` and `values` hold `count` elements of the map's
        // key and value sizes (checked above), and both cursors are 64
        // bytes.
        let done = unsafe { lookup_batch_call(&mut attr) }?;
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

/// One `BPF_MAP_LOOKUP_BATCH` call: `Ok(true)` when it reached the end of
/// the map (ENOENT; `attr.count` still says how many entries it returned).
///
/// # Safety
/// `attr.keys` and `attr.values` hold `attr.count` keys and values of the
/// map's sizes (per-CPU values: one per possible CPU), and `attr.in_batch`
/// (unless 0) and `attr.out_batch` point to 64 bytes: the kernel writes
/// nothing beyond them.
unsafe fn lookup_batch_call(attr: &mut BatchAttr) -> io::Result<bool> {
    // SAFETY: a valid `batch` attribute of its stated size, whose buffers
    // the caller vouches for.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_BATCH,
            attr as *mut BatchAttr,
            size_of::<BatchAttr>() as u32,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOENT) {
            return Err(e);
        }
        return Ok(true);
    }
    Ok(false)
}

/// Entries `0..n` of the per-CPU array `map` (values `V`), each folded over
/// the CPUs by `add`: one `BPF_MAP_LOOKUP_BATCH` call, where a lookup per
/// entry costs a syscall each (the daemon reads every backend's counters
/// every tick).
///
/// # Errors
/// `V` is not the map's value size or not a multiple of 8 bytes (the
/// kernel's per-CPU stride), `n` is over the map's size (nothing is read),
/// or the syscall failed ([`batch_unsupported`] tells a kernel without
/// batch operations for arrays, before 5.7).
pub fn percpu_array_sums<V: Pod + Default, S: Default>(
    map: &MapData,
    n: u32,
    add: impl Fn(&mut S, &V),
) -> io::Result<Vec<S>> {
    let info = map.info().map_err(io::Error::other)?;
    if info.value_size() as usize != size_of::<V>() || !size_of::<V>().is_multiple_of(8) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "map has {}-byte values, not {} (a multiple of 8)",
                info.value_size(),
                size_of::<V>()
            ),
        ));
    }
    if n > info.max_entries() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{n} entries asked of a map of {}", info.max_entries()),
        ));
    }
    let mut sums: Vec<S> = (0..n).map(|_| S::default()).collect();
    if n == 0 {
        return Ok(sums);
    }
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
    let fd = map.fd().as_fd().as_raw_fd();
    let mut keys = vec![0u32; n as usize];
    let mut values = vec![V::default(); n as usize * cpus];
    let mut next = [0u64; 8];
    let mut attr = BatchAttr {
        // From the first entry: an array's cursor is the last index read.
        in_batch: 0,
        out_batch: next.as_mut_ptr() as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count: n,
        map_fd: fd as u32,
        ..BatchAttr::default()
    };
    // SAFETY: `keys` holds `n` u32 indices and `values` `n` entries of
    // `cpus` values of the map's value size (checked above, and 8-byte
    // multiples, so the kernel's per-CPU stride is the value size); the
    // cursor is 64 bytes. The array cannot end before `n` (checked), and
    // `count` says how many entries came anyway.
    unsafe { lookup_batch_call(&mut attr) }?;
    let got = (attr.count as usize).min(n as usize);
    for (&k, per_cpu) in keys[..got].iter().zip(values.chunks_exact(cpus)) {
        if let Some(s) = sums.get_mut(k as usize) {
            for v in per_cpu {
                add(s, v);
            }
        }
    }
    if got < n as usize {
        return Err(io::Error::other(format!(
            "the kernel returned {got} entries of {n}"
        )));
    }
    Ok(sums)
}

/// A fresh map made with `BPF_MAP_CREATE`, for tests; `None` without the
/// privilege to make one.
#[cfg(test)]
pub(crate) fn test_map(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
) -> Option<MapData> {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    #[repr(C)]
    struct CreateAttr {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
    }
    const BPF_MAP_CREATE: libc::c_long = 0;
    let mut attr = CreateAttr {
        map_type,
        key_size,
        value_size,
        max_entries,
        map_flags: 0,
    };
    // SAFETY: a valid `BPF_MAP_CREATE` attribute of its stated size.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            &mut attr as *mut CreateAttr,
            size_of::<CreateAttr>() as u32,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    MapData::from_fd(fd).ok()
}

#[cfg(test)]
mod tests {
    use aya::maps::{Map, PerCpuArray, PerCpuValues};
    use lb_common::TrafficStats;

    use super::*;

    const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;

    /// The batch read of a per-CPU array against aya's lookup of each
    /// entry, on a real map with a different value on every CPU. Needs
    /// root (CAP_BPF); says so and passes without it.
    #[test]
    fn percpu_array_sums_match_lookups() {
        let size = size_of::<TrafficStats>() as u32;
        let Some(data) = test_map(BPF_MAP_TYPE_PERCPU_ARRAY, 4, size, 4096) else {
            eprintln!("skipped: creating a BPF map needs root");
            return;
        };
        let mut map = Map::PerCpuArray(data);
        let cpus = aya::util::nr_cpus().unwrap();
        let mut typed = PerCpuArray::<_, TrafficStats>::try_from(&mut map).unwrap();
        for i in 0..300u64 {
            let per_cpu: Vec<TrafficStats> = (0..cpus as u64)
                .map(|c| TrafficStats {
                    packets: i * 1000 + c,
                    bytes: i << 20 | c,
                    new_flows: i + 7 * c,
                })
                .collect();
            typed
                .set(i as u32, PerCpuValues::try_from(per_cpu).unwrap(), 0)
                .unwrap();
        }
        let Map::PerCpuArray(data) = &map else {
            unreachable!()
        };
        let add = |s: &mut TrafficStats, v: &TrafficStats| {
            s.packets += v.packets;
            s.bytes += v.bytes;
            s.new_flows += v.new_flows;
        };
        // Fewer than were written, more than were written, the whole map.
        for n in [257, 1000, 4096] {
            let sums = percpu_array_sums(data, n, add).unwrap();
            assert_eq!(sums.len(), n as usize);
            let ro = PerCpuArray::<_, TrafficStats>::try_from(&map).unwrap();
            for (i, s) in sums.iter().enumerate() {
                let mut want = TrafficStats::default();
                for v in ro.get(&(i as u32), 0).unwrap().iter() {
                    add(&mut want, v);
                }
                assert_eq!(*s, want, "entry {i} of {n}");
            }
        }
        assert_eq!(
            percpu_array_sums(data, 5, add).unwrap()[4].packets,
            4000 * cpus as u64 + (0..cpus as u64).sum::<u64>()
        );
        assert!(percpu_array_sums(data, 0, add).unwrap().is_empty());
        // Bad requests read nothing and say why.
        let e = percpu_array_sums(data, 4097, add).unwrap_err();
        assert!(
            e.to_string()
                .contains("4097 entries asked of a map of 4096"),
            "{e}"
        );
        let e = percpu_array_sums(data, 1, |s: &mut u64, v: &u64| *s += v).unwrap_err();
        assert!(e.to_string().contains("24-byte values, not 8"), "{e}");
    }
}
