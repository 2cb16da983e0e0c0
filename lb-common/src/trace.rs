//! Packet tracing (`xlb trace`): the configuration the data plane reads on
//! every packet of `xlb_lb`, the record it writes to a ring buffer for each
//! traced packet, and how a verdict carries its reason to the one place that
//! writes it.
//!
//! The verdict word: every verdict helper of `xlb_lb` (`pass`, `drop_with`,
//! `aborted`, the forward's `send`) already counts a [`Stat`]; it also ORs
//! that reason into the bits above the XDP action (a constant, folded at
//! compile time), and the forward ORs in the backend id. The program's entry
//! masks the action out ([`VERDICT_ACTION_MASK`]), so the reason travels to
//! the trace without a store on any path and without a second copy of the
//! decision logic.
//!
//! Off, a packet pays one test: the flag [`MAP_TRACE_ON`], a global the
//! program reads as a direct value; the configuration is read only once the
//! flag is set.
//!
//! The three maps are new pins beside the others; no existing layout
//! changed, so [`crate::LAYOUT_VERSION`] stays: a daemon that adopts the
//! pins of an older xlb without them creates them (aya's `map_pin_path`
//! creates and pins what is missing) and keeps every flow.

use crate::{FAMILY_V6, FlowKey, Stat};

/// Pinned `Array` of one [`TraceConfig`].
pub const MAP_TRACE_CONFIG: &str = "XLB_TRACE_CFG";
/// Pinned one-entry `Array` of one `u32`: non-zero while a trace is on. It
/// is the data section of the global `XLB_TRACE_ON` (aya names such a map
/// after its section, which must start with `.data`, hence the name). aya
/// writes the section's initial value (0) into it at every load, a pinned
/// one included: a daemon that restarts turns tracing off, and a running
/// `xlb trace` turns it on again at its next refresh (every second).
pub const MAP_TRACE_ON: &str = ".data.TRACE_ON";
/// The pin of [`MAP_TRACE_ON`]: bpffs refuses names with a dot (`EPERM`).
pub const PIN_TRACE_ON: &str = "XLB_TRACE_ON";

/// The file name map `name` is pinned under (its name, but for
/// [`MAP_TRACE_ON`]).
#[must_use]
pub fn pin_name(name: &str) -> &str {
    if name == MAP_TRACE_ON {
        PIN_TRACE_ON
    } else {
        name
    }
}
/// Pinned `BPF_MAP_TYPE_RINGBUF` of [`TraceEvent`] records.
pub const MAP_TRACE_EVENTS: &str = "XLB_TRACE";
/// Size of `XLB_TRACE` in bytes: a power of two and a multiple of the page
/// size (the kernel requires both). 4,096 records of 56 bytes (plus the
/// kernel's 8-byte header each): a second of a busy trace without sampling.
pub const TRACE_RING_BYTES: u32 = 256 * 1024;

/// `xlb_lb` without the trace hook, for the benchmark only (never loaded
/// by the daemon): the cost of tracing off is `xlb_lb`'s time against it.
pub const PROG_LB_UNTRACED: &str = "xlb_lb_untraced";

/// XDP actions as the kernel numbers them (`enum xdp_action`), for
/// userspace and the verdict mask.
pub const XDP_ABORTED: u8 = 0;
pub const XDP_DROP: u8 = 1;
pub const XDP_PASS: u8 = 2;
pub const XDP_TX: u8 = 3;
pub const XDP_REDIRECT: u8 = 4;

/// The XDP action in a verdict word (bits 0–2).
pub const VERDICT_ACTION_MASK: u32 = 0x7;
/// Trace flags in a verdict word (bits 3–7, [`TRACE_FLAG_PICKED`] …).
pub const VERDICT_FLAGS_SHIFT: u32 = 3;
/// The reason in a verdict word (bits 8–15): [`Stat`] index + 1, 0 = none.
pub const VERDICT_REASON_SHIFT: u32 = 8;
/// The backend id in a verdict word (bits 16–31), 0 = none.
pub const VERDICT_BACKEND_SHIFT: u32 = 16;
const _: () = assert!(Stat::ALL.len() < 255);
const _: () = assert!(crate::BACKEND_IDS <= 1 << 16);

/// Event flag: the backend was picked from the VIP's table (a new flow or a
/// conntrack miss), not found in conntrack.
pub const TRACE_FLAG_PICKED: u8 = 1;
/// Event flag: sent with a second chance to the slot's previous owner.
pub const TRACE_FLAG_CHANCE: u8 = 2;
/// Event flag: an ICMP error about a VIP flow (addresses and ports are the
/// quoted flow's, client → VIP).
pub const TRACE_FLAG_ICMP_ERROR: u8 = 4;

/// The verdict-word bits of `stat` as the reason (a constant when `stat` is).
#[inline(always)]
#[must_use]
pub const fn reason_bits(stat: Stat) -> u32 {
    (stat as u32 + 1) << VERDICT_REASON_SHIFT
}

/// The verdict-word bits of event flag `flag`.
#[inline(always)]
#[must_use]
pub const fn flag_bits(flag: u8) -> u32 {
    (flag as u32) << VERDICT_FLAGS_SHIFT
}

/// The reason a [`TraceEvent::reason`] names, if any.
#[must_use]
pub fn trace_reason(reason: u8) -> Option<Stat> {
    Stat::ALL.get(usize::from(reason).checked_sub(1)?).copied()
}

/// `TraceConfig::verdicts` bit for each verdict `xlb trace --verdict` names.
pub const TRACE_VERDICT_DROP: u8 = 1 << XDP_ABORTED | 1 << XDP_DROP;
pub const TRACE_VERDICT_PASS: u8 = 1 << XDP_PASS;
pub const TRACE_VERDICT_TX: u8 = 1 << XDP_TX | 1 << XDP_REDIRECT;
pub const TRACE_VERDICT_ALL: u8 = TRACE_VERDICT_DROP | TRACE_VERDICT_PASS | TRACE_VERDICT_TX;

/// Value of `XLB_TRACE_CFG` (one entry). Written by `xlb trace`, read by
/// `xlb_lb` for each packet while [`MAP_TRACE_ON`] is set.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceConfig {
    /// CLOCK_MONOTONIC (`bpf_ktime_get_ns`) ns until which the trace is
    /// on; 0 = off. `xlb trace` pushes it forward every second, so a trace
    /// whose process died stops by itself (the first packet past it clears
    /// [`MAP_TRACE_ON`]).
    pub until_ns: u64,
    /// Packets that matched but found the ring buffer full (the kernel adds
    /// atomically; `xlb trace` reports it).
    pub lost: u64,
    /// Source prefix, network order, already masked with `src_mask`.
    pub src_addr: [u8; 16],
    /// Mask of the source prefix, network order (a v4 prefix in the first
    /// 4 bytes).
    pub src_mask: [u8; 16],
    /// VIP address, network order (v4 in the first 4 bytes).
    pub vip_addr: [u8; 16],
    /// VIP port, network order; 0 = any port.
    pub vip_port: u16,
    /// [`FAMILY_V4`] or [`FAMILY_V6`] of the source filter; 0 = any source.
    pub src_family: u8,
    /// Family of the VIP filter; 0 = any destination.
    pub vip_family: u8,
    /// One bit per XDP action traced (`1 << action`, see
    /// [`TRACE_VERDICT_ALL`]).
    pub verdicts: u8,
    pub _pad: [u8; 3],
    /// Trace one of every `sample` matching packets (at random); 0 and 1
    /// trace each.
    pub sample: u32,
    /// Process id of the `xlb trace` that owns the trace (a second one
    /// names it when it refuses to start).
    pub owner_pid: u32,
}
const _: () = assert!(core::mem::size_of::<TraceConfig>() == 80);

/// One traced packet: a record of `XLB_TRACE`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceEvent {
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC, ns) when the verdict was given.
    pub ktime_ns: u64,
    /// Source (client) address, network order; v4 in the first 4 bytes. For
    /// an ICMP error about a VIP flow: the quoted flow's client.
    pub src: [u8; 16],
    /// Destination (VIP) address, network order.
    pub dst: [u8; 16],
    /// Source port, network order (0 where the packet has none).
    pub sport: u16,
    /// Destination port, network order.
    pub dport: u16,
    /// The XDP action ([`XDP_DROP`] …).
    pub action: u8,
    /// [`Stat`] index + 1 of the counter the verdict bumped; 0 = none.
    pub reason: u8,
    /// [`TRACE_FLAG_PICKED`] | [`TRACE_FLAG_CHANCE`].
    pub flags: u8,
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u8,
    /// IP protocol (TCP, UDP, ICMP for an ICMP error about a flow: its flow's).
    pub proto: u8,
    /// TCP flags byte of the packet (0 for UDP).
    pub tcp_flags: u8,
    /// Backend id the packet went to (or would have gone to); 0 = none.
    pub backend: u16,
    /// Interface the packet arrived on.
    pub ifindex: u32,
}
const _: () = assert!(core::mem::size_of::<TraceEvent>() == 56);

/// Whether a packet of `flow` with XDP action `action` passes the filters of
/// `cfg`. The kernel's test, and userspace's in unit tests.
#[inline(always)]
#[must_use]
pub fn trace_matches(cfg: &TraceConfig, flow: &FlowKey, action: u32) -> bool {
    if action > 7 || cfg.verdicts & (1 << action) == 0 {
        return false;
    }
    if cfg.vip_family != 0
        && (cfg.vip_family != flow.family
            || (cfg.vip_port != 0 && cfg.vip_port != flow.dport)
            || !same_addr(&cfg.vip_addr, &flow.dst, flow.family))
    {
        return false;
    }
    cfg.src_family == 0
        || (cfg.src_family == flow.family && in_prefix(&flow.src, &cfg.src_addr, &cfg.src_mask))
}

/// Whether `a` and `b` are the same address of `family` (v4 compares the
/// first 4 bytes).
#[inline(always)]
fn same_addr(a: &[u8; 16], b: &[u8; 16], family: u8) -> bool {
    let n = if family == FAMILY_V6 { 4 } else { 1 };
    let mut i = 0;
    while i < 4 {
        if i < n && word(a, i) != word(b, i) {
            return false;
        }
        i += 1;
    }
    true
}

/// Whether `addr` masked with `mask` is `prefix` (already masked).
#[inline(always)]
fn in_prefix(addr: &[u8; 16], prefix: &[u8; 16], mask: &[u8; 16]) -> bool {
    let mut i = 0;
    while i < 4 {
        if word(addr, i) & word(mask, i) != word(prefix, i) {
            return false;
        }
        i += 1;
    }
    true
}

/// The `i`th 4-byte word of `a`, in memory order.
#[inline(always)]
fn word(a: &[u8; 16], i: usize) -> u32 {
    let o = i * 4;
    u32::from_ne_bytes([a[o], a[o + 1], a[o + 2], a[o + 3]])
}

#[cfg(feature = "user")]
// SAFETY: repr(C), Copy, integers and byte arrays only, padding explicit.
unsafe impl aya::Pod for TraceConfig {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for TraceEvent {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FAMILY_V4, PROTO_TCP, addr16};

    fn flow(src: &str, dst: &str, dport: u16) -> FlowKey {
        let src: core::net::IpAddr = src.parse().unwrap();
        let fam = if src.is_ipv4() { FAMILY_V4 } else { FAMILY_V6 };
        FlowKey {
            src: addr16(src),
            dst: addr16(dst.parse().unwrap()),
            sport: 40000u16.to_be(),
            dport: dport.to_be(),
            proto: PROTO_TCP,
            family: fam,
            _pad: [0; 2],
        }
    }

    fn all() -> TraceConfig {
        TraceConfig {
            until_ns: 1,
            verdicts: TRACE_VERDICT_ALL,
            ..TraceConfig::default()
        }
    }

    #[test]
    fn filters_match_what_they_name() {
        let v4 = flow("192.0.2.7", "10.0.0.1", 80);
        let v6 = flow("2001:db8:1:2::9", "fd00::1", 443);
        let mut src_v4 = all();
        src_v4.src_family = FAMILY_V4;
        src_v4.src_addr[..4].copy_from_slice(&[192, 0, 2, 0]);
        src_v4.src_mask[..4].copy_from_slice(&[255, 255, 255, 0]);
        let mut src_v6 = all();
        src_v6.src_family = FAMILY_V6;
        src_v6.src_addr[..8].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 2]);
        src_v6.src_mask[..8].copy_from_slice(&[0xff; 8]);
        let mut vip = all();
        vip.vip_family = FAMILY_V4;
        vip.vip_addr[..4].copy_from_slice(&[10, 0, 0, 1]);
        vip.vip_port = 80u16.to_be();
        let mut vip_other_port = vip;
        vip_other_port.vip_port = 81u16.to_be();
        let mut drops = all();
        drops.verdicts = TRACE_VERDICT_DROP;
        let tx = u32::from(XDP_TX);
        let cases: [(&str, &TraceConfig, &FlowKey, u32, bool); 10] = [
            ("everything, v4", &all(), &v4, tx, true),
            ("everything, v6", &all(), &v6, tx, true),
            ("v4 /24 holds the source", &src_v4, &v4, tx, true),
            ("v4 prefix, v6 packet", &src_v4, &v6, tx, false),
            ("v6 /64 holds the source", &src_v6, &v6, tx, true),
            ("v6 /64, v4 packet", &src_v6, &v4, tx, false),
            ("vip address and port", &vip, &v4, tx, true),
            ("vip, another port", &vip_other_port, &v4, tx, false),
            ("drops only, a forward", &drops, &v4, tx, false),
            ("drops only, a drop", &drops, &v4, u32::from(XDP_DROP), true),
        ];
        for (name, cfg, f, action, want) in cases {
            assert_eq!(trace_matches(cfg, f, action), want, "{name}");
        }
        let mut other = v6;
        other.src[7] = 3;
        assert!(!trace_matches(&src_v6, &other, tx), "v6 outside the /64");
    }

    #[test]
    fn reason_round_trips_through_the_verdict_word() {
        for &stat in Stat::ALL {
            let word = reason_bits(stat) | u32::from(XDP_TX);
            let reason = (word >> VERDICT_REASON_SHIFT) as u8;
            assert_eq!(trace_reason(reason), Some(stat));
            assert_eq!(word & VERDICT_ACTION_MASK, u32::from(XDP_TX));
        }
        assert_eq!(trace_reason(0), None);
    }
}
