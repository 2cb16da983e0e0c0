//! What the loader tells the programs about the running kernel: a word of
//! bits in the object's read-only data (the global [`KERNEL_GLOBAL`]),
//! written by the loader after probing the kernel and frozen before the
//! programs load. The verifier reads it as a constant, so a fallback for
//! an older kernel is dead code on a newer one: it costs the newer kernels
//! neither time nor verification.

/// Name of the global the loader writes (a `u32` of the bits below).
pub const KERNEL_GLOBAL: &str = "XLB_KERNEL";

/// `bpf_fib_lookup` does not report the egress MTU (`mtu_result`, with
/// `bpf_check_mtu` in 5.12): the programs find it by trying the usual
/// MTUs ([`FALLBACK_MTUS`]) on a next hop's refresh.
pub const KERNEL_NO_FIB_MTU: u32 = 1 << 0;

/// No `bpf_ktime_get_coarse_ns` (5.11): the programs read
/// `bpf_ktime_get_ns` once per tick instead.
pub const KERNEL_NO_COARSE_CLOCK: u32 = 1 << 1;

/// The MTUs a next hop is tried at, largest first, when the kernel does not
/// report the egress MTU ([`KERNEL_NO_FIB_MTU`]): jumbo frames, Ethernet,
/// Ethernet less an IPIP header, IPv6's minimum, IPv4's minimum. The egress
/// MTU is taken as the largest one a packet of that length passes: exact
/// on links of these MTUs, below the real one on others (packets larger
/// than the figure are answered "too big", and the sender's path MTU
/// discovery settles on it).
pub const FALLBACK_MTUS: [u16; 5] = [9000, 1500, 1480, 1280, 576];
