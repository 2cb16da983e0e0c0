//! The oracle: what the README's "Packet handling policy" says `xlb_lb`
//! must do with a frame in the fixture world, written from the policy
//! table (not from the data plane's code), and the checks of what it did:
//! the verdict, the counter it moved, and the bytes it sent.

use lb_common::Stat;

use xlb_tests::harness::{LB_MAC, XG_MAC};

use crate::world::{XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX};

/// The fixture world's VIP addresses (`world.rs`), as the wire carries them.
pub(crate) const VIP4: &[u8] = &[10, 100, 0, 1];
pub(crate) const VIP4_L2: &[u8] = &[10, 100, 0, 2];
pub(crate) const VIP4_EMPTY: &[u8] = &[10, 100, 0, 3];
pub(crate) const VIP4_NONEIGH: &[u8] = &[10, 100, 0, 4];
pub(crate) const VIP4_OTHER_IF: &[u8] = &[10, 100, 0, 5];
/// VIPs whose one backend (7) is behind a router: `dsr-l2` (dropped, not
/// on-link) and `dsr-ipip` (sent to the router).
pub(crate) const VIP4_ROUTED_L2: &[u8] = &[10, 100, 0, 6];
pub(crate) const VIP4_ROUTED: &[u8] = &[10, 100, 0, 7];
pub(crate) const VIP6: &[u8] = &[0xfd, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
pub(crate) const VIP6_L2: &[u8] = &[0xfd, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

/// Egress MTU of the fixture interfaces.
const MTU: usize = 1500;

/// A VIP of the fixture world as the oracle needs it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Vip {
    addr: &'static [u8],
    port: u16,
    proto: u8,
    l2: bool,
    /// Backend ids of its table.
    backends: &'static [u32],
}

#[rustfmt::skip]
const VIPS: [Vip; 10] = [
    Vip { addr: VIP4, port: 80, proto: 6, l2: false, backends: &[1, 2] },
    Vip { addr: VIP4, port: 53, proto: 17, l2: false, backends: &[1, 2] },
    Vip { addr: VIP6, port: 80, proto: 6, l2: false, backends: &[4, 5] },
    Vip { addr: VIP4_L2, port: 80, proto: 6, l2: true, backends: &[1, 2] },
    Vip { addr: VIP6_L2, port: 80, proto: 6, l2: true, backends: &[4, 5] },
    Vip { addr: VIP4_EMPTY, port: 80, proto: 6, l2: false, backends: &[] },
    Vip { addr: VIP4_OTHER_IF, port: 80, proto: 6, l2: false, backends: &[6] },
    Vip { addr: VIP4_NONEIGH, port: 80, proto: 6, l2: false, backends: &[3] },
    Vip { addr: VIP4_ROUTED_L2, port: 80, proto: 6, l2: true, backends: &[7] },
    Vip { addr: VIP4_ROUTED, port: 80, proto: 6, l2: false, backends: &[7] },
];

/// What the policy says about a frame.
#[derive(Debug)]
pub(crate) enum Expect {
    Pass(Stat),
    Drop(Stat),
    /// An echo request to a VIP address: answered in place.
    Echo {
        l3off: usize,
        v6: bool,
    },
    /// A VIP flow (or an ICMP error about one): balanced.
    Balanced(Flow),
}

/// A packet to a VIP, as the oracle parsed it.
#[derive(Debug)]
pub(crate) struct Flow {
    vip: Vip,
    l3off: usize,
    ip_len: usize,
    v6: bool,
    df: bool,
}

fn is_vip_addr(dst: &[u8]) -> bool {
    VIPS.iter().any(|v| v.addr == dst)
}

fn vip(dst: &[u8], port: u16, proto: u8) -> Option<Vip> {
    VIPS.iter()
        .find(|v| v.addr == dst && v.port == port && v.proto == proto)
        .copied()
}

fn be16(f: &[u8], at: usize) -> usize {
    usize::from(u16::from_be_bytes([f[at], f[at + 1]]))
}

/// Malformed: dropped if to a VIP address, else passed as not ours.
fn bad(dst: &[u8], why: Stat) -> Expect {
    if is_vip_addr(dst) {
        Expect::Drop(why)
    } else {
        Expect::Pass(Stat::PassNotVip)
    }
}

/// The VIP addresses whose VIPs the fuzzer gives `host_services`
/// (`main.rs`): what no VIP balances there goes to the host.
pub(crate) const HOST_SERVICES: [&[u8]; 2] = [VIP4_NONEIGH, VIP6_L2];

/// Not balanced: passed if to no VIP address (not ours), passed as `host`
/// to an address with host services, else dropped: the host would route it
/// back to the router.
fn unbalanced(dst: &[u8], host: Stat) -> Expect {
    if !is_vip_addr(dst) {
        Expect::Pass(Stat::PassNotVip)
    } else if HOST_SERVICES.contains(&dst) {
        Expect::Pass(host)
    } else {
        Expect::Drop(Stat::DropVipUnbalanced)
    }
}

/// The policy's verdict for `f`.
pub(crate) fn expect(f: &[u8]) -> Expect {
    let Some(mut et) = (f.len() >= 14).then(|| be16(f, 12)) else {
        return Expect::Pass(Stat::PassTruncatedL2);
    };
    let mut l3off = 14;
    if et == 0x88a8 {
        return Expect::Pass(Stat::PassQinQ);
    }
    if et == 0x8100 {
        if f.len() < 18 {
            return Expect::Pass(Stat::PassTruncatedL2);
        }
        et = be16(f, 16);
        if et == 0x8100 || et == 0x88a8 {
            return Expect::Pass(Stat::PassQinQ);
        }
        l3off = 18;
    }
    match et {
        0x0800 => ipv4(f, l3off),
        0x86dd => ipv6(f, l3off),
        _ => Expect::Pass(Stat::PassNotIp),
    }
}

fn ipv4(f: &[u8], l3: usize) -> Expect {
    if f.len() < l3 + 20 {
        return Expect::Pass(Stat::PassTruncatedL3);
    }
    let dst = &f[l3 + 16..l3 + 20];
    let (version, ihl) = (f[l3] >> 4, f[l3] & 0xf);
    if version != 4 || ihl < 5 {
        return bad(dst, Stat::DropBadIhl);
    }
    if ihl != 5 {
        return bad(dst, Stat::DropIpOptions);
    }
    let tot = be16(f, l3 + 2);
    if tot < 20 || l3 + tot > f.len() {
        return bad(dst, Stat::DropBadLength);
    }
    if be16(f, l3 + 6) & 0x3fff != 0 {
        return bad(dst, Stat::DropFragment);
    }
    let df = be16(f, l3 + 6) & 0x4000 != 0;
    let proto = f[l3 + 9];
    let pkt = &f[l3..l3 + tot];
    match proto {
        1 => icmp(pkt, l3, false, df),
        6 | 17 => l4(pkt, l3, 20, proto, false, df),
        _ => unbalanced(dst, Stat::PassVipHost),
    }
}

fn ipv6(f: &[u8], l3: usize) -> Expect {
    if f.len() < l3 + 40 {
        return Expect::Pass(Stat::PassTruncatedL3);
    }
    let dst = &f[l3 + 24..l3 + 40];
    if f[l3] >> 4 != 6 {
        return bad(dst, Stat::DropBadIhl);
    }
    let tot = 40 + be16(f, l3 + 4);
    if l3 + tot > f.len() {
        return bad(dst, Stat::DropBadLength);
    }
    let next = f[l3 + 6];
    let pkt = &f[l3..l3 + tot];
    match next {
        44 => bad(dst, Stat::DropFragment),
        58 => icmp(pkt, l3, true, false),
        6 | 17 => l4(pkt, l3, 40, next, true, false),
        0 | 43 | 60 | 51 | 135 | 139 | 140 => unbalanced(dst, Stat::PassIpv6Ext),
        // ESP, anything else.
        _ => unbalanced(dst, Stat::PassVipHost),
    }
}

/// Destination address of the IP packet `pkt`.
fn dst_of(pkt: &[u8], v6: bool) -> &[u8] {
    if v6 { &pkt[24..40] } else { &pkt[16..20] }
}

fn l4(pkt: &[u8], l3: usize, hl: usize, proto: u8, v6: bool, df: bool) -> Expect {
    let dst = dst_of(pkt, v6);
    let seg = &pkt[hl..];
    let ok = if proto == 6 {
        seg.len() >= 20 && (20..=seg.len()).contains(&(usize::from(seg[12] >> 4) * 4))
    } else {
        seg.len() >= 8 && (8..=seg.len()).contains(&be16(seg, 4))
    };
    if !ok {
        return bad(dst, Stat::DropBadL4);
    }
    // SYN with FIN or RST, on a port some VIP uses.
    let port_has_vip = VIPS
        .iter()
        .any(|v| v.port == be16(seg, 2) as u16 && v.proto == proto);
    if proto == 6 && seg[13] & 0x02 != 0 && seg[13] & 0x05 != 0 && port_has_vip {
        return bad(dst, Stat::DropBadTcpFlags);
    }
    match vip(dst, be16(seg, 2) as u16, proto) {
        Some(vip) => Expect::Balanced(Flow {
            vip,
            l3off: l3,
            ip_len: pkt.len(),
            v6,
            df,
        }),
        None => unbalanced(dst, Stat::PassVipHost),
    }
}

/// ICMP to a VIP address: echo answered; an error quoting a packet sent
/// from that address to a VIP port goes where the flow goes; the rest is
/// unbalanced. The message and its quote must lie inside the IP packet.
fn icmp(pkt: &[u8], l3: usize, v6: bool, df: bool) -> Expect {
    let dst = dst_of(pkt, v6);
    let hl = if v6 { 40 } else { 20 };
    let m = &pkt[hl..];
    let (echo, errors): (u8, &[u8]) = if v6 { (128, &[1, 2, 3]) } else { (8, &[3, 11]) };
    if m.len() < 8 || (m[0] != echo && !errors.contains(&m[0])) {
        return unbalanced(dst, Stat::PassIcmp);
    }
    if !is_vip_addr(dst) {
        return Expect::Pass(Stat::PassNotVip);
    }
    if m[0] == echo {
        return Expect::Echo { l3off: l3, v6 };
    }
    let q = &m[8..];
    if q.len() < hl + 4 {
        return unbalanced(dst, Stat::PassIcmp);
    }
    let (qproto, qsrc, qok) = if v6 {
        (q[6], &q[8..24], true)
    } else {
        (q[9], &q[12..16], q[0] == 0x45)
    };
    if !qok || !(qproto == 6 || qproto == 17) || qsrc != dst {
        return unbalanced(dst, Stat::PassIcmp);
    }
    // The quoted packet's source port is the flow's VIP port.
    match vip(dst, be16(q, hl) as u16, qproto) {
        Some(vip) => Expect::Balanced(Flow {
            vip,
            l3off: l3,
            ip_len: pkt.len(),
            v6,
            df,
        }),
        None => unbalanced(dst, Stat::PassIcmp),
    }
}

/// Checks what `xlb_lb` did with `input` against the policy; returns the
/// counter its verdict must have moved.
pub(crate) fn check(
    exp: &Expect,
    input: &[u8],
    verdict: u32,
    out: &[u8],
    backends: &dyn Fn(u32) -> (Vec<u8>, [u8; 6]),
) -> Result<Stat, String> {
    match (exp, verdict) {
        (Expect::Pass(s), XDP_PASS) => {
            if out != input {
                return Err("passed, but the frame was changed".into());
            }
            Ok(*s)
        }
        (Expect::Drop(s), XDP_DROP) => Ok(*s),
        (Expect::Echo { l3off, v6 }, XDP_TX) => {
            check_echo(input, out, *l3off, *v6)?;
            Ok(Stat::IcmpEchoReply)
        }
        (Expect::Balanced(flow), _) => check_balanced(flow, input, verdict, out, backends),
        _ => Err(format!("policy says {exp:?}, verdict {verdict}")),
    }
}

fn check_echo(input: &[u8], out: &[u8], l3: usize, v6: bool) -> Result<(), String> {
    let (sa, da, ty) = if v6 {
        (l3 + 8..l3 + 24, l3 + 24..l3 + 40, l3 + 40)
    } else {
        (l3 + 12..l3 + 16, l3 + 16..l3 + 20, l3 + 20)
    };
    if out.len() != input.len()
        || out[sa.clone()] != input[da.clone()]
        || out[da] != input[sa]
        || out[ty] != if v6 { 129 } else { 0 }
        || out[..6] != input[6..12]
    {
        return Err("echo reply: addresses not swapped or type not a reply".into());
    }
    Ok(())
}

/// A balanced packet: forwarded intact to one of its VIP's backends, or
/// dropped/answered for the reason its VIP or size gives.
fn check_balanced(
    flow: &Flow,
    input: &[u8],
    verdict: u32,
    out: &[u8],
    backends: &dyn Fn(u32) -> (Vec<u8>, [u8; 6]),
) -> Result<Stat, String> {
    let overhead = match (flow.vip.l2, flow.v6) {
        (true, _) => 0,
        (false, false) => 20,
        (false, true) => 40,
    };
    // `dsr-l2` sends the frame out as large as it came in: no MTU check.
    let too_big = !flow.vip.l2 && flow.ip_len + overhead > MTU;
    let vip = flow.vip;
    match verdict {
        XDP_DROP if vip.backends.is_empty() => Ok(Stat::DropNoBackend),
        XDP_DROP if vip.addr == VIP4_NONEIGH => Ok(Stat::DropNoRoute),
        XDP_DROP if vip.addr == VIP4_ROUTED_L2 => Ok(Stat::DropNotOnLink),
        XDP_DROP if too_big && !flow.v6 && !flow.df => Ok(Stat::DropTooBig),
        XDP_TX if too_big && (flow.v6 || flow.df) => {
            check_too_big(flow, input, out)?;
            Ok(Stat::IcmpTooBig)
        }
        XDP_TX | XDP_REDIRECT if !too_big && !vip.backends.is_empty() => {
            let other_if = vip.addr == VIP4_OTHER_IF;
            if (verdict == XDP_REDIRECT) != other_if {
                return Err(format!(
                    "verdict {verdict} for a VIP on the other interface: {other_if}"
                ));
            }
            check_forward(flow, input, out, backends)?;
            Ok(if other_if {
                Stat::FwdRedirect
            } else {
                Stat::FwdTx
            })
        }
        _ => Err(format!(
            "balanced packet for {:?}:{}/{} (too big: {too_big}), verdict {verdict}",
            vip.addr, vip.port, vip.proto
        )),
    }
}

fn check_too_big(flow: &Flow, input: &[u8], out: &[u8]) -> Result<(), String> {
    let l3 = flow.l3off;
    let (sa, da, ty, want) = if flow.v6 {
        (8..24, 24..40, 40, 2)
    } else {
        (12..16, 16..20, 20, 3)
    };
    let shift = |r: std::ops::Range<usize>| l3 + r.start..l3 + r.end;
    if out.len() <= l3 + ty
        || out[shift(sa.clone())] != input[shift(da.clone())]
        || out[shift(da)] != input[shift(sa)]
        || out[l3 + ty] != want
    {
        return Err("too big: not an ICMP error from the VIP back to the client".into());
    }
    Ok(())
}

/// The forwarded frame: to a backend of the VIP, the input's IP packet
/// carried intact (behind an outer header in `dsr-ipip`), and that packet
/// well-formed.
fn check_forward(
    flow: &Flow,
    input: &[u8],
    out: &[u8],
    backends: &dyn Fn(u32) -> (Vec<u8>, [u8; 6]),
) -> Result<(), String> {
    let Some(&id) = flow
        .vip
        .backends
        .iter()
        .find(|&&id| out[..6] == backends(id).1)
    else {
        return Err("forwarded to a MAC that is none of the VIP's backends".into());
    };
    let (be_addr, _) = backends(id);
    let src_mac = if flow.vip.addr == VIP4_OTHER_IF {
        XG_MAC
    } else {
        LB_MAC
    };
    if out[6..12] != src_mac {
        return Err("forwarded from the wrong source MAC".into());
    }
    let l3 = flow.l3off;
    if out[12..l3] != input[12..l3] {
        return Err("VLAN tag or ethertype not kept".into());
    }
    let inner_at = if flow.vip.l2 {
        l3
    } else {
        check_outer(&out[l3..], &be_addr, flow)?;
        l3 + if flow.v6 { 40 } else { 20 }
    };
    let inner = out
        .get(inner_at..inner_at + flow.ip_len)
        .ok_or("forwarded frame shorter than its packet")?;
    if inner != &input[l3..l3 + flow.ip_len] {
        return Err("the client's packet was not carried intact".into());
    }
    well_formed(inner, flow.v6)
}

fn check_outer(o: &[u8], be_addr: &[u8], flow: &Flow) -> Result<(), String> {
    let ok = if flow.v6 {
        o.len() >= 40
            && o[0] >> 4 == 6
            && be16(o, 4) == flow.ip_len
            && o[6] == 41
            && o[24..40] == *be_addr
    } else {
        o.len() >= 20
            && o[0] == 0x45
            && be16(o, 2) == flow.ip_len + 20
            && be16(o, 6) & 0x3fff == 0
            && o[9] == 4
            && o[16..20] == *be_addr
            && xlb_tests::packet::csum(&o[..20]) == 0
    };
    if ok {
        Ok(())
    } else {
        Err("outer header wrong (version, length, protocol, destination or checksum)".into())
    }
}

/// Independent of the policy: the packet a backend receives is an unfragmented
/// IPv4 (no options) or IPv6 packet to a VIP address whose length fields agree
/// with its size, carrying a whole TCP/UDP header or an ICMP message with a
/// whole quote.
fn well_formed(p: &[u8], v6: bool) -> Result<(), String> {
    let hl = if v6 { 40 } else { 20 };
    let ok_ip = if v6 {
        p.len() >= 40 && p[0] >> 4 == 6 && 40 + be16(p, 4) == p.len()
    } else {
        p.len() >= 20 && p[0] == 0x45 && be16(p, 2) == p.len() && be16(p, 6) & 0x3fff == 0
    };
    if !ok_ip {
        return Err("forwarded IP header malformed".into());
    }
    if !is_vip_addr(dst_of(p, v6)) {
        return Err("forwarded packet not to a VIP address".into());
    }
    let proto = if v6 { p[6] } else { p[9] };
    let seg = &p[hl..];
    let ok = match proto {
        6 => seg.len() >= 20 && (20..=seg.len()).contains(&(usize::from(seg[12] >> 4) * 4)),
        17 => seg.len() >= 8 && (8..=seg.len()).contains(&be16(seg, 4)),
        1 | 58 => seg.len() >= 8 + hl + 4,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "forwarded protocol {proto} header malformed or truncated"
        ))
    }
}
