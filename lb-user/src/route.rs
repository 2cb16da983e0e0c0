//! The kernel's route to an address, asked over rtnetlink (`RTM_GETROUTE`,
//! what `ip route get` does): whether it goes through a gateway.
//!
//! - `dsr-l2` sends a client's frame unchanged to the backend's MAC, still
//!   addressed to the VIP, so its backends must be neighbours; a gateway on
//!   the way would route the frame back towards the VIP (a loop).
//! - Data-path probes connect to a VIP bound to the XDP interface
//!   (`health::datapath`), so the LB host needs a route to the VIP out of
//!   that interface through a gateway: with none, the kernel takes the VIP
//!   for on-link (`ip_route_output_key_hash_rcu`: a socket bound to a device
//!   with no route through it) and ARPs for it, and nobody answers (the LB
//!   does not hold the VIP, backends ignore ARP for it).

use std::{io, net::IpAddr};

use crate::{
    config::{Mode, VipConfig},
    health::spec::Via,
};

const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_VIA: u16 = 18;
/// `struct nlmsghdr` and `struct rtmsg`.
const NLMSG_HDR: usize = 16;
const RTMSG: usize = 12;

/// The gateway of the kernel's route to `addr`: `None` when `addr` is
/// on-link (a neighbour).
///
/// # Errors
/// No route (`ENETUNREACH`, ...) or the socket failed.
pub fn gateway_to(addr: IpAddr) -> io::Result<Option<IpAddr>> {
    route_get(addr, None)
}

/// The gateway of the kernel's route to `addr` out of `interface`, as a
/// socket bound to that interface (`SO_BINDTODEVICE`) gets it: `None` when
/// on-link, which is also what the kernel assumes when no route goes out of
/// `interface` at all.
///
/// # Errors
/// No such interface (`ENODEV`), no route, or the socket failed.
pub fn gateway_via(addr: IpAddr, interface: &str) -> io::Result<Option<IpAddr>> {
    let name = std::ffi::CString::new(interface)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in interface name"))?;
    // SAFETY: a NUL-terminated string that outlives the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(io::Error::last_os_error());
    }
    route_get(addr, Some(index))
}

/// `RTM_GETROUTE` for `addr`, out of interface `oif` if given.
fn route_get(addr: IpAddr, oif: Option<u32>) -> io::Result<Option<IpAddr>> {
    let (family, bytes) = match addr {
        IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec()),
        IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec()),
    };
    let attr_len = 4 + bytes.len();
    let len = NLMSG_HDR + RTMSG + attr_len + oif.map_or(0, |_| 8);
    let mut req = Vec::with_capacity(len);
    req.extend_from_slice(&(len as u32).to_ne_bytes());
    req.extend_from_slice(&RTM_GETROUTE.to_ne_bytes());
    req.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes()); // seq
    req.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel's
    // rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
    req.extend_from_slice(&[family, (bytes.len() * 8) as u8, 0, 0, 0, 0, 0, 0]);
    req.extend_from_slice(&0u32.to_ne_bytes());
    req.extend_from_slice(&(attr_len as u16).to_ne_bytes());
    req.extend_from_slice(&RTA_DST.to_ne_bytes());
    req.extend_from_slice(&bytes);
    if let Some(oif) = oif {
        req.extend_from_slice(&8u16.to_ne_bytes());
        req.extend_from_slice(&RTA_OIF.to_ne_bytes());
        req.extend_from_slice(&oif.to_ne_bytes());
    }
    let reply = exchange(&req)?;
    parse_reply(&reply)
}

/// What is wrong with the LB host's route to `vip` for data-path probes
/// bound to `interface`, as one sentence with the fix; `None` when the
/// route goes out of `interface` through a gateway.
pub fn vip_route_problem(vip: IpAddr, interface: &str) -> Option<String> {
    let what = match gateway_via(vip, interface) {
        Ok(Some(_)) => return None,
        Ok(None) => format!(
            "this host has no route to {vip} through a gateway out of {interface}, so it takes \
             the VIP for a neighbour and its ARP/ND for it goes unanswered"
        ),
        Err(e) => format!("this host has no route to {vip} out of {interface} ({e})"),
    };
    Some(format!(
        "{what}: data-path probes (via = \"vip\") cannot reach any backend. Add a route to the \
         VIPs out of {interface} through the upstream router, e.g. `ip route add {vip} via \
         ROUTER dev {interface}` (a default route through {interface} does it); check with \
         `ip route get {vip} oif {interface}`, which must show `via`"
    ))
}

/// One warning per VIP of `vips` probed through the data path whose route
/// [`vip_route_problem`] finds wrong, for `xlb run` to print at start.
pub fn vip_routes_missing(vips: &[VipConfig], interface: &str) -> Vec<String> {
    vips.iter()
        .filter(|v| v.backends.iter().any(|b| b.health.via == Via::Vip))
        .filter_map(|v| {
            let problem = vip_route_problem(v.addr, interface)?;
            Some(format!("vip {:?}: {problem}", v.name))
        })
        .collect()
}

/// Sends `req` on a fresh rtnetlink socket and returns the first reply.
fn exchange(req: &[u8]) -> io::Result<Vec<u8>> {
    // SAFETY: plain socket(2); the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just opened and nothing else owns.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    use std::os::fd::AsRawFd as _;
    // SAFETY: `req` is valid for its length; the kernel is the peer.
    if unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 8192];
    // SAFETY: `buf` is valid for writes of its length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

/// The gateway in an `RTM_NEWROUTE` answer, or the error of an
/// `NLMSG_ERROR` one.
fn parse_reply(b: &[u8]) -> io::Result<Option<IpAddr>> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "short rtnetlink answer");
    let kind = u16_at(b, 4).ok_or_else(bad)?;
    if kind == NLMSG_ERROR {
        let code = i32::from_ne_bytes(
            b.get(16..20)
                .ok_or_else(bad)?
                .try_into()
                .map_err(|_| bad())?,
        );
        return Err(io::Error::from_raw_os_error(-code));
    }
    if kind != RTM_NEWROUTE {
        return Err(bad());
    }
    let end = (u32::from_ne_bytes(b.get(..4).ok_or_else(bad)?.try_into().map_err(|_| bad())?)
        as usize)
        .min(b.len());
    let mut at = NLMSG_HDR + RTMSG;
    while at + 4 <= end {
        let len = usize::from(u16_at(b, at).ok_or_else(bad)?);
        let kind = u16_at(b, at + 2).ok_or_else(bad)?;
        if len < 4 || at + len > end {
            return Err(bad());
        }
        let value = &b[at + 4..at + len];
        match (kind, value.len()) {
            (RTA_GATEWAY, 4) => {
                return Ok(Some(IpAddr::from(
                    <[u8; 4]>::try_from(value).unwrap_or_default(),
                )));
            }
            (RTA_GATEWAY, 16) => {
                return Ok(Some(IpAddr::from(
                    <[u8; 16]>::try_from(value).unwrap_or_default(),
                )));
            }
            // An IPv4 route via an IPv6 next hop: a gateway all the same.
            (RTA_VIA, 6..) => return Ok(Some(IpAddr::from([0u8; 16]))),
            _ => {}
        }
        at += len.next_multiple_of(4);
    }
    Ok(None)
}

/// Every `dsr-l2` backend of `vips` that is not a neighbour of this host
/// (its route has a gateway, or there is no route), as one message per
/// backend saying what to do.
pub fn dsr_l2_off_link(vips: &[VipConfig]) -> Vec<String> {
    let mut out = Vec::new();
    for v in vips.iter().filter(|v| v.mode == Mode::DsrL2) {
        for b in &v.backends {
            let why = match gateway_to(b.addr) {
                Ok(None) => continue,
                Ok(Some(gw)) => format!("its route goes through the gateway {gw}"),
                Err(e) => format!("there is no route to it ({e})"),
            };
            out.push(format!(
                "vip {:?}: backend {} is not a neighbour of this host: {why}. dsr-l2 sends \
                 clients' frames unchanged to the backend's MAC, so its backends must be on \
                 a segment of this host; use mode = \"dsr-ipip\" for routed backends",
                v.name, b.addr
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_on_link() {
        assert_eq!(gateway_to("127.0.0.1".parse().unwrap()).unwrap(), None);
    }

    #[test]
    fn replies_are_parsed() {
        // An error answer: -ENETUNREACH.
        let mut err = vec![0u8; 36];
        err[..4].copy_from_slice(&36u32.to_ne_bytes());
        err[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        err[16..20].copy_from_slice(&(-libc::ENETUNREACH).to_ne_bytes());
        let e = parse_reply(&err).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENETUNREACH));
        // A route with RTA_DST and RTA_GATEWAY 10.0.0.254.
        let mut r = vec![0u8; NLMSG_HDR + RTMSG];
        r[4..6].copy_from_slice(&RTM_NEWROUTE.to_ne_bytes());
        for (kind, value) in [(RTA_DST, [10, 2, 0, 11]), (RTA_GATEWAY, [10, 0, 0, 254])] {
            r.extend_from_slice(&8u16.to_ne_bytes());
            r.extend_from_slice(&kind.to_ne_bytes());
            r.extend_from_slice(&value);
        }
        let len = r.len() as u32;
        r[..4].copy_from_slice(&len.to_ne_bytes());
        assert_eq!(
            parse_reply(&r).unwrap(),
            Some("10.0.0.254".parse().unwrap())
        );
        // Without the gateway: on-link.
        r.truncate(NLMSG_HDR + RTMSG + 8);
        let len = r.len() as u32;
        r[..4].copy_from_slice(&len.to_ne_bytes());
        assert_eq!(parse_reply(&r).unwrap(), None);
        // Truncated attributes are an error, not a panic.
        r[..4].copy_from_slice(&(len + 8).to_ne_bytes());
        r.extend_from_slice(&[12, 0, 5, 0]);
        assert!(parse_reply(&r).is_err());
    }

    /// A socket bound to a device with no route through it: the kernel
    /// assumes the address is on-link, and so does the check.
    #[test]
    fn vip_route_out_of_an_interface() {
        // Loopback: 127.0.0.1 is local, no gateway; 192.0.2.1 has no route
        // out of lo (the kernel's on-link guess).
        assert_eq!(
            gateway_via("192.0.2.1".parse().unwrap(), "lo").unwrap(),
            None
        );
        let problem = vip_route_problem("192.0.2.1".parse().unwrap(), "lo").unwrap();
        assert!(
            problem.starts_with(
                "this host has no route to 192.0.2.1 through a gateway out of lo, so it takes \
                 the VIP for a neighbour"
            ),
            "{problem}"
        );
        assert!(
            problem.contains("ip route add 192.0.2.1 via ROUTER dev lo"),
            "{problem}"
        );
        let missing = vip_route_problem("192.0.2.1".parse().unwrap(), "xlb-no-such-if0").unwrap();
        assert!(
            missing.starts_with("this host has no route to 192.0.2.1 out of xlb-no-such-if0 ("),
            "{missing}"
        );
    }
}
