//! Map keys built on the stack where the verifier accepts them.
//!
//! xlb's object is compiled with LLVM's `allows-misaligned-mem-access`
//! (`build.rs`): byte arrays in packets and map values are then read and
//! written a word at a time instead of byte by byte, which the JIT and the
//! CPU handle at any alignment. The verifier still requires every *stack*
//! access to be aligned to its size, and a key with byte-array fields
//! behind a 4-byte one (aya's packed LPM `Key<K>`, `DecapAddrKey`'s family
//! and padding) would otherwise be merged into 8-byte stores at offset 4,
//! or zeroed by a call of the byte-wise `memset`. So such keys are built
//! here: in 8-byte aligned slots, one volatile 4-byte store per word,
//! which LLVM may neither merge nor turn into a call.

use core::mem::MaybeUninit;

use aya_ebpf::maps::lpm_trie::Key;

/// A map key of up to `2 * N` 4-byte words, in `N` 8-byte slots: a whole
/// number of 8-byte words, so that a move of the key is copied in aligned
/// 8-byte words too.
#[repr(C, align(8))]
pub(crate) struct WordKey<const N: usize>(MaybeUninit<[u64; N]>);

impl<const N: usize> WordKey<N> {
    /// An empty slot, to [`fill`](Self::fill) where it stays: a key is
    /// never moved once written (LLVM may copy a moved one in misaligned
    /// 8-byte words).
    #[inline(always)]
    pub(crate) const fn uninit() -> Self {
        WordKey(MaybeUninit::uninit())
    }

    /// Writes `words`, each once, and zeroes the rest of the slots.
    #[inline(always)]
    pub(crate) fn fill<const W: usize>(&mut self, words: [u32; W]) -> &Self {
        const { assert!(W <= 2 * N) };
        let mut i = 0;
        while i < 2 * N {
            self.set(i, if i < W { words[i] } else { 0 });
            i += 1;
        }
        self
    }

    /// Replaces word `i` (`i < 2 * N`: callers pass constants).
    #[inline(always)]
    pub(crate) fn set(&mut self, i: usize, w: u32) {
        // SAFETY: a 4-byte aligned word of the slots, `i < 2 * N`.
        unsafe { self.0.as_mut_ptr().cast::<u32>().add(i).write_volatile(w) };
    }

    /// The key as a map keyed by `T` takes it (its first bytes).
    #[inline(always)]
    pub(crate) fn as_key<T>(&self) -> &T {
        const {
            assert!(core::mem::size_of::<T>() <= 8 * N);
            assert!(core::mem::align_of::<T>() <= 8);
        };
        // SAFETY: every word was written by `fill`; `T` fits in the slots
        // and is aligned no more; the keys built here are plain integers
        // and byte arrays, valid for any bytes.
        unsafe { &*(self as *const Self).cast::<T>() }
    }

    /// The key as an LPM trie of `K` takes it: the prefix length, then `K`.
    #[inline(always)]
    pub(crate) fn as_trie_key<K>(&self) -> &Key<K> {
        self.as_key()
    }
}

/// Word `i` of a byte array (an address), in memory order, as a key or a
/// header stores it.
#[inline(always)]
pub(crate) fn word<const L: usize>(b: &[u8; L], i: usize) -> u32 {
    u32::from_ne_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// Whether two addresses are equal, compared as two 8-byte words (an
/// array comparison would be a call of `bcmp`).
#[inline(always)]
pub(crate) fn addr_eq(a: &[u8; 16], b: &[u8; 16]) -> bool {
    let w = |x: &[u8; 16], i: usize| {
        // SAFETY: within the 16 bytes, read unaligned (one 8-byte load:
        // the object allows misaligned access, `build.rs`).
        unsafe { x.as_ptr().cast::<u64>().add(i).read_unaligned() }
    };
    w(a, 0) == w(b, 0) && w(a, 1) == w(b, 1)
}

/// `*dst = *src` for a 16-byte address, as four 4-byte words. A plain
/// assignment between a packet header and a map value (which LLVM cannot
/// prove distinct) compiles to a call of `memmove`, a bpf-to-bpf call whose
/// frame counts 32 bytes against the 512-byte stack of the call chain on
/// kernels before 6.8 (which round every frame up to 32, empty ones too).
/// For packets and map values only: LLVM may merge the words into wider
/// accesses, and the verifier refuses a stack access that is not aligned
/// to its size.
#[inline(always)]
pub(crate) fn copy_addr(dst: &mut [u8; 16], src: &[u8; 16]) {
    // SAFETY: within both 16-byte arrays, read and written unaligned (the
    // object allows misaligned access, `build.rs`); every word is read
    // before any is written, so an overlap copies as `memmove` would.
    unsafe {
        let s = src.as_ptr().cast::<u32>();
        let w = [
            s.read_unaligned(),
            s.add(1).read_unaligned(),
            s.add(2).read_unaligned(),
            s.add(3).read_unaligned(),
        ];
        let d = dst.as_mut_ptr().cast::<u32>();
        d.write_unaligned(w[0]);
        d.add(1).write_unaligned(w[1]);
        d.add(2).write_unaligned(w[2]);
        d.add(3).write_unaligned(w[3]);
    }
}

/// The four words of a 16-byte address, in memory order.
#[inline(always)]
pub(crate) fn addr_words(a: &[u8; 16]) -> [u32; 4] {
    [word(a, 0), word(a, 1), word(a, 2), word(a, 3)]
}

/// A key laid out as a 16-byte address (`a`, as words), a family byte and
/// 3 zero bytes (`VipAddrKey`, `DecapAddrKey`), written in `k`.
#[inline(always)]
pub(crate) fn addr_key<T>(k: &mut WordKey<3>, a: [u32; 4], family: u8) -> &T {
    k.fill([
        a[0],
        a[1],
        a[2],
        a[3],
        u32::from_ne_bytes([family, 0, 0, 0]),
    ])
    .as_key()
}

/// A `T` zeroed on the stack with volatile 8-byte stores: zeroing it any
/// plainer way compiles to a call of the byte-wise `memset` (a 64-byte
/// `bpf_fib_lookup` block: some 320 instructions). For C structs of
/// integers, valid all-zero.
#[repr(C, align(8))]
pub(crate) struct Zeroed<T>(MaybeUninit<T>);

impl<T> Zeroed<T> {
    /// An empty slot, to [`zero`](Self::zero) where it stays.
    #[inline(always)]
    pub(crate) const fn uninit() -> Self {
        Zeroed(MaybeUninit::uninit())
    }

    /// Zeroes the slot, padding included, and returns the `T` in it.
    #[inline(always)]
    pub(crate) fn zero(&mut self) -> &mut T {
        let words = core::mem::size_of::<Self>() / 8;
        let p = (self as *mut Self).cast::<u64>();
        let mut i = 0;
        while i < words {
            // SAFETY: within the slot, whose size is a multiple of its
            // 8-byte alignment.
            unsafe { p.add(i).write_volatile(0) };
            i += 1;
        }
        // SAFETY: every byte is zero, a valid `T` (see above).
        unsafe { self.0.assume_init_mut() }
    }
}
