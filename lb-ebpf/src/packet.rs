//! Packet memory: the one bounds-checked accessor, and the wire headers the
//! programs read and write, as named `#[repr(C)]` structs (the kernel's
//! `ethhdr`, `iphdr`, `ipv6hdr`, `tcphdr`, `udphdr`).
//!
//! The structs are ours rather than `network-types`': every field is a byte
//! or a byte array, so a struct has alignment 1 (a pointer anywhere in the
//! packet is a valid one), multi-byte fields stay in network order until read
//! with `from_be_bytes`, and the TCP data offset and flags are plain bytes
//! (network-types keeps them in a bindgen bitfield read bit by bit).

use aya_ebpf::programs::XdpContext;

/// A pointer to a `T` at byte `offset` of the packet, or `None` if any byte
/// of it lies past the end. Every packet access goes through here.
#[inline(always)]
pub(crate) fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Option<*mut T> {
    let start = ctx.data();
    let end = ctx.data_end();
    // verifier: compare the computed end against data_end before any access.
    if start + offset + core::mem::size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *mut T)
}

/// Swaps the Ethernet destination and source: a reply (`XDP_TX`) goes back
/// to the sender's MAC.
#[inline(always)]
pub(crate) fn swap_macs(ctx: &XdpContext) -> Option<()> {
    let eth = ptr_at::<EthHdr>(ctx, 0)?;
    // SAFETY: bounds checked by ptr_at.
    let eth = unsafe { &mut *eth };
    core::mem::swap(&mut eth.dst, &mut eth.src);
    Some(())
}

/// Copies the `L`-byte L2 header (Ethernet, and a VLAN tag if `L` has
/// room for one: 14 to 24 bytes) from byte `from` of the frame to byte `to`:
/// the move around `bpf_xdp_adjust_head` when an outer header is stripped or
/// one is made room for.
#[inline(always)]
pub(crate) fn copy_l2<const L: usize>(ctx: &XdpContext, from: usize, to: usize) -> Option<()> {
    const { assert!(L >= 14 && L <= 24) };
    let old = ptr_at::<[u8; L]>(ctx, from)?;
    let new = ptr_at::<[u8; L]>(ctx, to)?;
    // Three 8-byte words, the last two overlapping as `L` needs, all read
    // before any is written (the ranges may overlap): a plain copy of the
    // array compiles to a call of the byte-wise `memmove`.
    // SAFETY: both ranges checked by ptr_at; misaligned access is allowed
    // (see `key.rs`).
    unsafe {
        let (o, n) = (old.cast::<u8>(), new.cast::<u8>());
        let a = o.cast::<u64>().read_unaligned();
        let b = o.add(L / 2 - 4).cast::<u64>().read_unaligned();
        let c = o.add(L - 8).cast::<u64>().read_unaligned();
        n.cast::<u64>().write_unaligned(a);
        n.add(L / 2 - 4).cast::<u64>().write_unaligned(b);
        n.add(L - 8).cast::<u64>().write_unaligned(c);
    }
    Some(())
}

/// Length of the packet in bytes.
#[inline(always)]
pub(crate) fn len(ctx: &XdpContext) -> usize {
    ctx.data_end() - ctx.data()
}

pub(crate) const ETH_LEN: usize = core::mem::size_of::<EthHdr>();
pub(crate) const VLAN_LEN: usize = core::mem::size_of::<VlanHdr>();
pub(crate) const IPV4_LEN: usize = core::mem::size_of::<Ipv4Hdr>();
pub(crate) const IPV6_LEN: usize = core::mem::size_of::<Ipv6Hdr>();

/// Ethertypes, host order.
pub(crate) const ETH_P_IP: u16 = 0x0800;
pub(crate) const ETH_P_IPV6: u16 = 0x86dd;
pub(crate) const ETH_P_8021Q: u16 = 0x8100;
pub(crate) const ETH_P_8021AD: u16 = 0x88a8;

/// Ethernet header.
#[repr(C)]
pub(crate) struct EthHdr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    /// Network order.
    pub ethertype: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<EthHdr>() == 14);

impl EthHdr {
    /// The ethertype, host order.
    #[inline(always)]
    pub(crate) fn ethertype(&self) -> u16 {
        u16::from_be_bytes(self.ethertype)
    }
}

/// 802.1Q tag: the 4 bytes after the MACs' ethertype `ETH_P_8021Q`.
#[repr(C)]
pub(crate) struct VlanHdr {
    /// Priority, drop eligibility and VLAN id, network order.
    pub tci: [u8; 2],
    /// Ethertype of what follows, network order.
    pub ethertype: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<VlanHdr>() == 4);

impl VlanHdr {
    /// The inner ethertype, host order.
    #[inline(always)]
    pub(crate) fn ethertype(&self) -> u16 {
        u16::from_be_bytes(self.ethertype)
    }
}

/// IPv4 header without options.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Ipv4Hdr {
    /// Version (high 4 bits) and header length in 32-bit words (low 4).
    pub version_ihl: u8,
    pub tos: u8,
    /// Header + payload, bytes, network order.
    pub tot_len: [u8; 2],
    pub id: [u8; 2],
    /// Flags (high 3 bits) and fragment offset, network order.
    pub frag_off: [u8; 2],
    pub ttl: u8,
    pub protocol: u8,
    pub check: [u8; 2],
    pub saddr: [u8; 4],
    pub daddr: [u8; 4],
}
const _: () = assert!(core::mem::size_of::<Ipv4Hdr>() == 20);

/// `version_ihl` of a plain IPv4 header: version 4, 5 words, no options.
pub(crate) const IPV4_VERSION_IHL: u8 = 0x45;

impl Ipv4Hdr {
    #[inline(always)]
    pub(crate) fn version(&self) -> u8 {
        self.version_ihl >> 4
    }

    /// Header length in 32-bit words (5 without options).
    #[inline(always)]
    pub(crate) fn ihl(&self) -> u8 {
        self.version_ihl & 0x0f
    }

    /// Total length, host order.
    #[inline(always)]
    pub(crate) fn tot_len(&self) -> u16 {
        u16::from_be_bytes(self.tot_len)
    }

    /// A fragment: the MF flag or a non-zero fragment offset.
    #[inline(always)]
    pub(crate) fn is_fragment(&self) -> bool {
        u16::from_be_bytes(self.frag_off) & 0x3fff != 0
    }
}

/// IPv6 fixed header.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Ipv6Hdr {
    /// Version (high 4 bits), traffic class and flow label.
    pub version_tc_flow: [u8; 4],
    /// Bytes after this header, network order.
    pub payload_len: [u8; 2],
    pub nexthdr: u8,
    pub hop_limit: u8,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<Ipv6Hdr>() == 40);

impl Ipv6Hdr {
    #[inline(always)]
    pub(crate) fn version(&self) -> u8 {
        self.version_tc_flow[0] >> 4
    }

    /// Payload length, host order.
    #[inline(always)]
    pub(crate) fn payload_len(&self) -> u16 {
        u16::from_be_bytes(self.payload_len)
    }
}

/// TCP header without options.
#[repr(C)]
pub(crate) struct TcpHdr {
    /// Ports, network order.
    pub source: [u8; 2],
    pub dest: [u8; 2],
    pub seq: [u8; 4],
    pub ack_seq: [u8; 4],
    /// Data offset in 32-bit words (high 4 bits).
    pub doff_res: u8,
    /// `TCP_FIN`, `TCP_SYN`, ... bits.
    pub flags: u8,
    pub window: [u8; 2],
    pub check: [u8; 2],
    pub urg_ptr: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<TcpHdr>() == 20);

/// Bits of [`TcpHdr::flags`].
pub(crate) const TCP_FIN: u8 = 0x01;
pub(crate) const TCP_SYN: u8 = 0x02;
pub(crate) const TCP_RST: u8 = 0x04;
pub(crate) const TCP_ACK: u8 = 0x10;

impl TcpHdr {
    /// Header length in bytes, options included.
    #[inline(always)]
    pub(crate) fn header_len(&self) -> usize {
        (self.doff_res >> 4) as usize * 4
    }
}

/// UDP header.
#[repr(C)]
pub(crate) struct UdpHdr {
    /// Ports, network order.
    pub source: [u8; 2],
    pub dest: [u8; 2],
    /// Header + payload, bytes, network order.
    pub len: [u8; 2],
    pub check: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<UdpHdr>() == 8);

impl UdpHdr {
    /// Length, host order.
    #[inline(always)]
    pub(crate) fn length(&self) -> u16 {
        u16::from_be_bytes(self.len)
    }
}

/// ICMP / ICMPv6 header: type, code, checksum, and the 4 type-specific
/// bytes (echo: id and sequence; "fragmentation needed": unused and the
/// next-hop MTU; "packet too big": the MTU).
#[repr(C)]
pub(crate) struct IcmpHdr {
    pub kind: u8,
    pub code: u8,
    /// Network order.
    pub check: [u8; 2],
    pub rest: [u8; 4],
}
const _: () = assert!(core::mem::size_of::<IcmpHdr>() == 8);

pub(crate) const ICMP_LEN: usize = core::mem::size_of::<IcmpHdr>();

/// ICMP types (RFC 792) and ICMPv6 types (RFC 4443) xlb reads or writes.
pub(crate) const ICMP_ECHO_REPLY: u8 = 0;
pub(crate) const ICMP_DEST_UNREACH: u8 = 3;
pub(crate) const ICMP_FRAG_NEEDED: u8 = 4;
pub(crate) const ICMP_ECHO: u8 = 8;
pub(crate) const ICMP_TIME_EXCEEDED: u8 = 11;
pub(crate) const ICMP6_DEST_UNREACH: u8 = 1;
pub(crate) const ICMP6_PACKET_TOO_BIG: u8 = 2;
pub(crate) const ICMP6_TIME_EXCEEDED: u8 = 3;
pub(crate) const ICMP6_ECHO_REQUEST: u8 = 128;
pub(crate) const ICMP6_ECHO_REPLY: u8 = 129;
