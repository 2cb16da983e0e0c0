//! The throughput benchmark's frame generator (`xlb_bench_gen`,
//! `lb-ebpf/src/bench_gen.rs`) and `xlb-tput-bench`: the template it
//! restores every frame from, its map and program names, and where it writes
//! a new source.
//!
//! Why a generator: `BPF_PROG_TEST_RUN` in live-frames mode recycles its
//! pages without copying the frame again, so a program that rewrites or
//! encapsulates would see its own output on the next pass. The generator
//! writes the template back into every frame, optionally gives it a source
//! never seen before, and tail-calls the program under test.

/// Length of every generated frame: Ethernet + IPv4 (no options) + TCP (no
/// options) + 18 bytes of payload, the 72-byte frames of `xlb-bench`.
pub const BENCH_FRAME_LEN: usize = 72;

/// `BenchGen::flags`: give every frame a new source address and port (a
/// SYN from it misses conntrack), fixing the IPv4 and TCP checksums.
pub const GEN_MANY_SOURCES: u32 = 1;

/// Byte offsets in the frame of what [`GEN_MANY_SOURCES`] rewrites: the low
/// 16-bit word of the IPv4 source, the TCP source port, and the two
/// checksums that cover them.
pub const GEN_OFF_SRC_LOW: usize = 14 + 14;
pub const GEN_OFF_SPORT: usize = 14 + 20;
pub const GEN_OFF_IP_CHECK: usize = 14 + 10;
pub const GEN_OFF_TCP_CHECK: usize = 14 + 20 + 16;

/// The source the `n`th generated frame of a CPU gets with
/// [`GEN_MANY_SOURCES`]: (low 16 bits of the IPv4 source, TCP source port),
/// host order. Distinct for 2^31 frames: the port walks the ephemeral range
/// 32768–65535, the address word counts its laps.
#[inline(always)]
pub const fn gen_source(n: u32) -> (u16, u16) {
    ((n >> 15) as u16, 0x8000 | (n & 0x7fff) as u16)
}

/// The one entry of [`MAP_BENCH_GEN`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BenchGen {
    /// The frame as on the wire (checksums valid).
    pub frame: [u8; BENCH_FRAME_LEN],
    /// [`GEN_MANY_SOURCES`] or 0.
    pub flags: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<BenchGen>() == BENCH_FRAME_LEN + 8);

/// `Array<BenchGen>`, one entry: the template and flags.
pub const MAP_BENCH_GEN: &str = "XLB_BENCH_GEN";
/// `ProgramArray`, one slot: the program under test.
pub const MAP_BENCH_PROG: &str = "XLB_BENCH_PROG";
/// `PerCpuArray<u64>`, one entry: frames given a new source on this CPU.
pub const MAP_BENCH_SEQ: &str = "XLB_BENCH_SEQ";
const _: () =
    assert!(MAP_BENCH_GEN.len() <= 15 && MAP_BENCH_PROG.len() <= 15 && MAP_BENCH_SEQ.len() <= 15);

/// The generator (restore, new source, tail call into slot 0 of
/// [`MAP_BENCH_PROG`]).
pub const PROG_BENCH_GEN: &str = "xlb_bench_gen";
/// `XDP_DROP`: the "generator only" case.
pub const PROG_BENCH_DROP: &str = "xlb_bench_drop";

#[cfg(feature = "user")]
// SAFETY: repr(C), Copy, a byte array and two integers, no implicit padding.
unsafe impl aya::Pod for BenchGen {}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;

    #[test]
    fn sources_are_distinct_and_ephemeral() {
        let mut seen = std::collections::HashSet::new();
        for n in (0..200_000u32).chain([u32::MAX >> 1]) {
            let (word, port) = gen_source(n);
            assert!(port >= 0x8000, "{n}: port {port}");
            assert!(seen.insert((word, port)), "{n}: repeated");
        }
    }
}
