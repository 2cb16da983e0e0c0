//! Maglev lookup tables (Eisenbud et al., NSDI 2016), weighted as Katran's
//! `MaglevHashV2` does it.
//!
//! A table is `size` slots (a prime), each holding a backend id; the data
//! plane sends a new flow to `table[flow_hash % size]`. Every backend walks
//! its own permutation of the slots and, in turn, claims the next free slot
//! of its permutation, so each backend ends up with a near-equal share and
//! removing one backend moves little more than that backend's own slots.
//!
//! The permutation of a backend comes from a fixed-key hash of its address
//! and port, never of its id (ids are recycled and depend on the order in
//! which the daemon learnt backends), and the input is sorted before use:
//! the same set of backends therefore gives the same table after a restart
//! and on every xlb node with the same configuration, so a flow that moves
//! between nodes (ECMP rehash) still reaches the same backend.

use std::net::IpAddr;

/// Key of the hash that gives a backend's permutation offset. Fixed: changing
/// it changes every table, so nodes running different xlb versions would
/// disagree on where flows go. (ASCII "xlb-magl" "v-offset".)
const OFFSET_KEY: [u64; 2] = [0x786c_622d_6d61_676c, 0x762d_6f66_6673_6574];

/// Key of the hash that gives a backend's permutation skip; independent of
/// [`OFFSET_KEY`] so offset and skip are uncorrelated. (ASCII "xlb-magl" "v-skip--".)
const SKIP_KEY: [u64; 2] = [0x786c_622d_6d61_676c, 0x762d_736b_6970_2d2d];

/// One backend as the table builder sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaglevBackend {
    /// Backend id written into the table (index of `XLB_BACKENDS`; never 0).
    pub id: u32,
    /// Backend address: with `port`, the identity that fixes the permutation.
    pub addr: IpAddr,
    /// Backend port.
    pub port: u16,
    /// Relative weight; a backend's share of slots is `weight / Σ weight`.
    /// 0 = no slots (the backend takes no new flows).
    pub weight: u32,
}

/// The words hashed for a backend's permutation: the address in the
/// `lb_common::Addr` layout (IPv4 in the first 4 bytes), then port and family,
/// so 10.0.0.1 and ::a00:1 differ.
fn identity_words(addr: IpAddr, port: u16) -> [u64; 3] {
    let (bytes, family) = match addr {
        IpAddr::V4(a) => {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&a.octets());
            (b, lb_common::FAMILY_V4)
        }
        IpAddr::V6(a) => (a.octets(), lb_common::FAMILY_V6),
    };
    let lo = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    let hi = u64::from_le_bytes(bytes[8..].try_into().expect("8 bytes"));
    [lo, hi, u64::from(port) | (u64::from(family) << 16)]
}

/// Offset and skip of the permutation of backend (`addr`, `port`) in a table
/// of `size` slots: slot j of the permutation is `(offset + j × skip) % size`.
/// `skip` is in `1..size`, so for a prime `size` the permutation visits every slot.
fn permutation(addr: IpAddr, port: u16, size: u32) -> (u32, u32) {
    let words = identity_words(addr, port);
    let size = u64::from(size);
    let offset = lb_common::siphash13(&OFFSET_KEY, &words) % size;
    let skip = lb_common::siphash13(&SKIP_KEY, &words) % (size - 1) + 1;
    (offset as u32, skip as u32)
}

/// Builds a Maglev table of `size` slots holding backend ids.
///
/// Each backend's share of slots is proportional to its weight (within one
/// slot per round: a round gives every backend `weight / max_weight` of a
/// claim, Katran's MaglevV2). The input order does not matter. Backends with
/// weight 0 get no slot; if there is no backend with a weight above 0, every
/// slot is 0 ("no backend"). Otherwise every slot holds a backend id.
///
/// # Panics
///
/// If `size` is not a prime: a permutation would then not visit every slot
/// and the table could not be filled. Configuration validation guarantees a
/// prime.
pub fn build(backends: &[MaglevBackend], size: u32) -> Vec<u32> {
    assert!(is_prime(size), "Maglev table size {size} is not a prime");
    let mut table = vec![0u32; size as usize];

    let mut live: Vec<&MaglevBackend> = backends.iter().filter(|b| b.weight > 0).collect();
    if live.is_empty() {
        return table;
    }
    // Sorting by identity makes the claiming order, and so the table,
    // independent of the caller's order; the id only breaks ties between
    // duplicate entries (which configuration validation rejects anyway).
    live.sort_by_key(|b| (b.addr, b.port, b.id));
    let max_weight = live.iter().map(|b| b.weight).max().unwrap_or(1);

    struct Walker {
        id: u32,
        weight: u32,
        credit: u32,
        pos: u32,
        skip: u32,
    }
    let mut walkers: Vec<Walker> = live
        .iter()
        .map(|b| {
            let (offset, skip) = permutation(b.addr, b.port, size);
            Walker {
                id: b.id,
                weight: b.weight,
                credit: 0,
                pos: offset,
                skip,
            }
        })
        .collect();

    let mut taken = vec![false; size as usize];
    let mut filled = 0u32;
    // Terminates: the heaviest backend claims a slot every round, and a
    // permutation of a prime-sized table reaches every free slot.
    loop {
        for w in &mut walkers {
            w.credit += w.weight;
            if w.credit < max_weight {
                continue;
            }
            w.credit -= max_weight;
            while taken[w.pos as usize] {
                w.pos = step(w.pos, w.skip, size);
            }
            taken[w.pos as usize] = true;
            table[w.pos as usize] = w.id;
            w.pos = step(w.pos, w.skip, size);
            filled += 1;
            if filled == size {
                return table;
            }
        }
    }
}

fn step(pos: u32, skip: u32, size: u32) -> u32 {
    ((u64::from(pos) + u64::from(skip)) % u64::from(size)) as u32
}

/// Whether `n` is a prime (trial division; fast enough for table sizes).
pub fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    if n < 4 {
        return true;
    }
    if n.is_multiple_of(2) || n.is_multiple_of(3) {
        return false;
    }
    let n = u64::from(n);
    let mut d = 5u64;
    while d * d <= n {
        if n % d == 0 || n % (d + 2) == 0 {
            return false;
        }
        d += 6;
    }
    true
}

/// The slots whose id differs between `old` and `new`, as `(slot, new id)`
/// in slot order: what must be written to turn `old` into `new`. Slots of
/// `new` beyond the end of `old` count as changed.
pub fn diff(old: &[u32], new: &[u32]) -> Vec<(u32, u32)> {
    new.iter()
        .enumerate()
        .filter(|&(slot, id)| old.get(slot) != Some(id))
        .map(|(slot, &id)| (slot as u32, id))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lb_common::FlowKey;
    use rand::{Rng, RngCore, SeedableRng, rngs::StdRng};
    use std::collections::HashMap;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const SIZE: u32 = lb_common::DEFAULT_TABLE_SIZE;

    fn v4(last: u32, weight: u32) -> MaglevBackend {
        MaglevBackend {
            id: last,
            addr: IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + last)),
            port: 80,
            weight,
        }
    }

    fn counts(table: &[u32]) -> HashMap<u32, usize> {
        let mut c = HashMap::new();
        for &id in table {
            *c.entry(id).or_insert(0) += 1;
        }
        c
    }

    /// A deliberately plain re-implementation of weighted Maglev from the
    /// paper and Katran's MaglevHashV2: full permutation lists, an index per
    /// backend, weight credit per round. Shares no code with `build` except
    /// the SipHash function itself.
    fn reference(backends: &[MaglevBackend], size: u32) -> Vec<u32> {
        let mut live: Vec<MaglevBackend> =
            backends.iter().copied().filter(|b| b.weight > 0).collect();
        let mut table = vec![0u32; size as usize];
        if live.is_empty() {
            return table;
        }
        live.sort_by(|a, b| a.addr.cmp(&b.addr).then(a.port.cmp(&b.port)));
        let perms: Vec<Vec<u32>> = live
            .iter()
            .map(|b| {
                let mut bytes = [0u8; 16];
                let family: u64 = match b.addr {
                    IpAddr::V4(a) => {
                        bytes[0..4].copy_from_slice(&a.octets());
                        4
                    }
                    IpAddr::V6(a) => {
                        bytes = a.octets();
                        6
                    }
                };
                let mut words = [0u64; 3];
                for (i, byte) in bytes.iter().enumerate() {
                    words[i / 8] |= u64::from(*byte) << (8 * (i % 8));
                }
                words[2] = u64::from(b.port) + (family << 16);
                let offset = lb_common::siphash13(&OFFSET_KEY, &words) % u64::from(size);
                let skip = lb_common::siphash13(&SKIP_KEY, &words) % u64::from(size - 1) + 1;
                (0..u64::from(size))
                    .map(|j| ((offset + j * skip) % u64::from(size)) as u32)
                    .collect()
            })
            .collect();
        let max = live.iter().map(|b| b.weight).max().unwrap();
        let mut next = vec![0usize; live.len()];
        let mut credit = vec![0u32; live.len()];
        let mut filled = 0;
        let mut used = vec![false; size as usize];
        while filled < size {
            for i in 0..live.len() {
                if filled == size {
                    break;
                }
                credit[i] += live[i].weight;
                if credit[i] >= max {
                    credit[i] -= max;
                    let mut c = perms[i][next[i]];
                    while used[c as usize] {
                        next[i] += 1;
                        c = perms[i][next[i]];
                    }
                    used[c as usize] = true;
                    table[c as usize] = live[i].id;
                    next[i] += 1;
                    filled += 1;
                }
            }
        }
        table
    }

    #[test]
    fn is_prime_cases() {
        let cases: [(&str, u32, bool); 12] = [
            ("zero", 0, false),
            ("one", 1, false),
            ("two", 2, true),
            ("three", 3, true),
            ("four", 4, false),
            ("25 = 5 × 5", 25, false),
            ("small prime", 251, true),
            ("default table size", 65_537, true),
            ("one below the default", 65_536, false),
            ("square of a prime, 65521²", 4_293_001_441, false),
            ("largest u32 prime", 4_294_967_291, true),
            ("u32::MAX", u32::MAX, false),
        ];
        for (name, n, want) in cases {
            // Cross-check against naive trial division where that is cheap.
            if n < 1_000_000 {
                let naive = n >= 2 && (2..n).all(|d| n % d != 0);
                assert_eq!(naive, want, "{name}: bad expectation");
            }
            assert_eq!(is_prime(n), want, "{name}: is_prime({n})");
        }
    }

    #[test]
    fn matches_reference_implementation() {
        let v6 = |last: u16, port: u16, weight: u32, id: u32| MaglevBackend {
            id,
            addr: IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last)),
            port,
            weight,
        };
        let cases: Vec<(&str, Vec<MaglevBackend>, u32)> = vec![
            ("one backend", vec![v4(1, 1)], 13),
            ("three equal", vec![v4(1, 1), v4(2, 1), v4(3, 1)], 13),
            ("weighted", vec![v4(1, 1), v4(2, 2), v4(3, 3), v4(4, 4)], 31),
            (
                "zero weight skipped",
                vec![v4(1, 0), v4(2, 5), v4(3, 5)],
                17,
            ),
            (
                "ipv6 and ports",
                vec![v6(1, 80, 1, 7), v6(1, 81, 1, 8), v6(2, 80, 3, 9)],
                101,
            ),
            ("table size two", vec![v4(1, 1), v4(2, 1)], 2),
            (
                "many backends, big table",
                (1..=40).map(|i| v4(i, 1 + i % 7)).collect(),
                SIZE,
            ),
        ];
        for (name, backends, size) in cases {
            assert_eq!(build(&backends, size), reference(&backends, size), "{name}");
        }
    }

    /// The table for a given configuration must never change between xlb
    /// versions: nodes of a cluster upgraded one by one would disagree on
    /// where flows go. If this fails, the change to the permutation or the
    /// claiming order is a breaking change and needs a release note.
    #[test]
    fn table_is_stable_across_versions() {
        let backends = [v4(1, 1), v4(2, 1), v4(3, 2)];
        assert_eq!(build(&backends, 13), GOLDEN_13);
    }
    const GOLDEN_13: [u32; 13] = [1, 1, 1, 3, 2, 3, 3, 3, 3, 2, 2, 3, 3];

    #[test]
    fn input_order_does_not_matter() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut backends: Vec<MaglevBackend> = (1..=50).map(|i| v4(i, 1 + i % 4)).collect();
        let want = build(&backends, SIZE);
        for round in 0..5 {
            // Fisher–Yates with the test's own RNG (rand's SliceRandom would do too).
            for i in (1..backends.len()).rev() {
                backends.swap(i, rng.gen_range(0..=i));
            }
            assert_eq!(build(&backends, SIZE), want, "shuffle {round}");
        }
        let mut reversed = backends.clone();
        reversed.reverse();
        assert_eq!(build(&reversed, SIZE), want, "reversed");
    }

    #[test]
    fn permutation_follows_address_not_id() {
        let a = [v4(1, 1), v4(2, 1), v4(3, 1)];
        // Same addresses with other ids: the same slots, with the ids renamed.
        let renamed: Vec<MaglevBackend> = a
            .iter()
            .map(|b| MaglevBackend {
                id: b.id + 100,
                ..*b
            })
            .collect();
        let ta = build(&a, SIZE);
        let tr = build(&renamed, SIZE);
        assert!(ta.iter().zip(&tr).all(|(x, y)| x + 100 == *y));
        // Another port is another identity: the table changes.
        let other_port: Vec<MaglevBackend> = a
            .iter()
            .map(|b| MaglevBackend { port: 8080, ..*b })
            .collect();
        assert_ne!(build(&other_port, SIZE), ta);
    }

    #[test]
    fn empty_or_zero_weight_gives_all_zero() {
        let cases: [(&str, Vec<MaglevBackend>); 3] = [
            ("no backends", vec![]),
            ("one zero-weight backend", vec![v4(1, 0)]),
            ("all zero weight", vec![v4(1, 0), v4(2, 0), v4(3, 0)]),
        ];
        for (name, backends) in cases {
            for size in [2, 13, SIZE] {
                let t = build(&backends, size);
                assert_eq!(t.len(), size as usize, "{name}, size {size}");
                assert!(t.iter().all(|&id| id == 0), "{name}, size {size}");
            }
        }
    }

    #[test]
    fn every_slot_filled() {
        let cases: [(&str, Vec<MaglevBackend>); 4] = [
            ("one backend", vec![v4(1, 1)]),
            ("one live among zeros", vec![v4(1, 0), v4(2, 3), v4(3, 0)]),
            ("weights 1 and 1000", vec![v4(1, 1), v4(2, 1000)]),
            ("100 backends", (1..=100).map(|i| v4(i, 1)).collect()),
        ];
        for (name, backends) in cases {
            for size in [2, 3, 13, 1009, SIZE] {
                let t = build(&backends, size);
                assert_eq!(t.len(), size as usize, "{name}, size {size}");
                let live: Vec<u32> = backends
                    .iter()
                    .filter(|b| b.weight > 0)
                    .map(|b| b.id)
                    .collect();
                assert!(t.iter().all(|id| live.contains(id)), "{name}, size {size}");
            }
        }
    }

    #[test]
    fn shares_follow_weights() {
        let cases: [(&str, Vec<MaglevBackend>); 3] = [
            (
                "weights 1, 2, 3, 4",
                vec![v4(1, 1), v4(2, 2), v4(3, 3), v4(4, 4)],
            ),
            ("10 equal", (1..=10).map(|i| v4(i, 1)).collect()),
            (
                "mixed with a zero",
                vec![v4(1, 5), v4(2, 0), v4(3, 10), v4(4, 1000)],
            ),
        ];
        let seed: u64 = rand::random();
        let mut rng = StdRng::seed_from_u64(seed);
        const FLOWS: usize = 1_000_000;
        for (name, backends) in cases {
            let table = build(&backends, SIZE);
            let hash_key = [rng.next_u64(), rng.next_u64()];
            let mut hits: HashMap<u32, usize> = HashMap::new();
            for _ in 0..FLOWS {
                let mut src = [0u8; 16];
                rng.fill_bytes(&mut src[..4]);
                let flow = FlowKey {
                    src,
                    dst: [10, 100, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    sport: rng.r#gen(),
                    dport: 80u16.to_be(),
                    proto: lb_common::PROTO_TCP,
                    family: lb_common::FAMILY_V4,
                    _pad: [0; 2],
                };
                let slot = flow.slot(&hash_key, SIZE);
                // The data plane's reduction: the hash's high 32 bits scaled.
                assert_eq!(
                    u64::from(slot),
                    ((lb_common::flow_hash(&hash_key, &flow) >> 32) * u64::from(SIZE)) >> 32
                );
                *hits.entry(table[slot as usize]).or_insert(0) += 1;
            }
            let total_weight: u32 = backends.iter().map(|b| b.weight).sum();
            let slots = counts(&table);
            for b in &backends {
                let want = 100.0 * f64::from(b.weight) / f64::from(total_weight);
                let got = 100.0 * *hits.get(&b.id).unwrap_or(&0) as f64 / FLOWS as f64;
                assert!(
                    (got - want).abs() <= 2.0,
                    "{name}: backend {} (weight {}) got {got:.2} % of flows, want {want:.2} % ± 2 (seed {seed})",
                    b.id,
                    b.weight
                );
                // The table itself is proportional within a slot per round.
                let in_table = 100.0 * *slots.get(&b.id).unwrap_or(&0) as f64 / f64::from(SIZE);
                assert!(
                    (in_table - want).abs() <= 0.1,
                    "{name}: backend {} has {in_table:.3} % of slots, want {want:.3} %",
                    b.id
                );
            }
        }
    }

    #[test]
    fn removing_a_backend_moves_little_else() {
        for n in [3u32, 10, 50, 100] {
            let all: Vec<MaglevBackend> = (1..=n).map(|i| v4(i, 1)).collect();
            let old = build(&all, SIZE);
            // Remove first, a middle one and the last, in sorted order.
            for gone in [1, n / 2 + 1, n] {
                let rest: Vec<MaglevBackend> =
                    all.iter().copied().filter(|b| b.id != gone).collect();
                let new = build(&rest, SIZE);
                let changed = diff(&old, &new);
                let owned = old.iter().filter(|&&id| id == gone).count();
                let moved_owned = changed
                    .iter()
                    .filter(|&&(s, _)| old[s as usize] == gone)
                    .count();
                assert_eq!(
                    moved_owned, owned,
                    "n={n}, removed {gone}: its slots must all move"
                );
                let collateral = changed.len() - owned;
                assert!(
                    collateral as f64 <= 0.01 * f64::from(SIZE),
                    "n={n}, removed {gone}: {collateral} other slots moved (> 1 % of {SIZE})"
                );
                assert!(
                    new.iter().all(|&id| id != gone && id != 0),
                    "n={n}, removed {gone}"
                );
            }
        }
    }

    #[test]
    fn diff_cases() {
        type Case<'a> = (&'a str, &'a [u32], &'a [u32], Vec<(u32, u32)>);
        let cases: [Case; 5] = [
            ("identical", &[1, 2, 3], &[1, 2, 3], vec![]),
            ("one slot", &[1, 2, 3], &[1, 4, 3], vec![(1, 4)]),
            ("all slots", &[1, 1], &[2, 2], vec![(0, 2), (1, 2)]),
            ("from empty", &[], &[5, 6], vec![(0, 5), (1, 6)]),
            ("to zero", &[5, 6], &[0, 6], vec![(0, 0)]),
        ];
        for (name, old, new, want) in cases {
            assert_eq!(diff(old, new), want, "{name}");
        }
        // Applying a diff to the old table gives the new one.
        let old = build(&(1..=5).map(|i| v4(i, 1)).collect::<Vec<_>>(), 1009);
        let new = build(&(2..=6).map(|i| v4(i, 1)).collect::<Vec<_>>(), 1009);
        let mut patched = old.clone();
        for (slot, id) in diff(&old, &new) {
            patched[slot as usize] = id;
        }
        assert_eq!(patched, new);
    }
}
