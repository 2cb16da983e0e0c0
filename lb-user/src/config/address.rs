//! Addresses that parse but cannot work as a VIP or a backend: loopback,
//! link-local and IPv4-mapped ones, and a backend that is another VIP.
//! (Unspecified, multicast and broadcast addresses are refused where each
//! address is read, in `vip`.)

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use super::Problems;
use super::raw::RawVip;

/// Why `addr` can be neither a VIP nor a backend, if it cannot: the end of
/// a sentence "address X cannot be a VIP: …".
pub(super) fn unroutable(addr: IpAddr) -> Option<String> {
    match addr {
        IpAddr::V4(a) if a.is_loopback() => {
            Some("it is a loopback address, which never leaves this host".into())
        }
        IpAddr::V6(a) if a.is_loopback() => {
            Some("it is the loopback address, which never leaves this host".into())
        }
        // The data plane has no interface to scope it to, and routers do not
        // forward it (RFC 3927, RFC 4291 2.5.6).
        IpAddr::V4(a) if a.is_link_local() => {
            Some("it is link-local (169.254.0.0/16), which is not routed".into())
        }
        IpAddr::V6(a) if a.is_unicast_link_local() => {
            Some("it is link-local (fe80::/10), which is not routed".into())
        }
        // The kernel never sends ::ffff:a.b.c.d on the wire: an IPv4 peer is
        // reached over IPv4, so the VIP's key or the encapsulation would be
        // in the wrong family.
        IpAddr::V6(a) if a.to_ipv4_mapped().is_some() => Some(format!(
            "it is an IPv4-mapped IPv6 address, which no packet carries; write the IPv4 \
             address {}",
            a.to_ipv4_mapped()
                .map_or_else(String::new, |v4| v4.to_string())
        )),
        _ => None,
    }
}

/// A backend whose address is another VIP's: the load balancer would send
/// its packets to itself (the VIP's route leads here), or into a loop.
pub(super) fn check_backends_are_not_vips(raw: &[RawVip], p: &mut Problems<'_>) {
    let mut vips: HashMap<IpAddr, &str> = HashMap::new();
    for v in raw {
        vips.entry(v.address).or_insert(&v.name);
    }
    for v in raw {
        for b in &v.backend {
            // The VIP's own address is refused where the backend is read.
            let Some(other) = vips.get(&b.address).filter(|_| b.address != v.address) else {
                continue;
            };
            let port = b.port.unwrap_or(v.port);
            p.error(
                &format!(
                    "vip {:?}: backend {}",
                    v.name,
                    SocketAddr::new(b.address, port)
                ),
                format!(
                    "the backend address is the address of vip {other:?}; its packets would \
                     come back to this load balancer: name a real server"
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{DAEMON, ONE_BACKEND, api_vip};

    /// [`DAEMON`] and VIP "api" at `address` with [`ONE_BACKEND`].
    fn vip_at(address: &str) -> String {
        format!(
            "{DAEMON}\n[[vip]]\nname = \"api\"\naddress = \"{address}\"\nport = 80\n{ONE_BACKEND}"
        )
    }

    /// VIP "api" (10.100.0.1) with one backend at `address`.
    fn backend_at(address: &str) -> String {
        api_vip(&format!("[[vip.backend]]\naddress = \"{address}\"\n"))
    }

    /// VIP "v6" at `vip` with one backend at `backend`.
    fn v6(vip: &str, backend: &str) -> String {
        format!(
            "{DAEMON}\n[[vip]]\nname = \"v6\"\naddress = \"{vip}\"\nport = 80\n\
             [[vip.backend]]\naddress = \"{backend}\"\n"
        )
    }

    rejects! {
        vip_on_loopback: vip_at("127.0.0.1") => [
            r#"xlb.toml: vip "api": address 127.0.0.1 cannot be a VIP: it is a loopback address, which never leaves this host"#,
        ];
        vip_on_ipv6_loopback: v6("::1", "fd00::11") => [
            r#"xlb.toml: vip "v6": address ::1 cannot be a VIP: it is the loopback address, which never leaves this host"#,
        ];
        vip_link_local: vip_at("169.254.10.1") => [
            r#"xlb.toml: vip "api": address 169.254.10.1 cannot be a VIP: it is link-local (169.254.0.0/16), which is not routed"#,
        ];
        vip_ipv6_link_local: v6("fe80::1", "fd00::11") => [
            r#"xlb.toml: vip "v6": address fe80::1 cannot be a VIP: it is link-local (fe80::/10), which is not routed"#,
        ];
        vip_ipv4_mapped: v6("::ffff:10.100.0.1", "fd00::11") => [
            r#"xlb.toml: vip "v6": address ::ffff:10.100.0.1 cannot be a VIP: it is an IPv4-mapped IPv6 address, which no packet carries; write the IPv4 address 10.100.0.1"#,
        ];
        backend_on_loopback: backend_at("127.0.0.2") => [
            r#"xlb.toml: vip "api": backend 127.0.0.2:80: address 127.0.0.2 cannot be a backend: it is a loopback address, which never leaves this host"#,
        ];
        backend_link_local: backend_at("169.254.0.7") => [
            r#"xlb.toml: vip "api": backend 169.254.0.7:80: address 169.254.0.7 cannot be a backend: it is link-local (169.254.0.0/16), which is not routed"#,
        ];
        backend_ipv6_link_local: v6("fd00:100::1", "fe80::11") => [
            r#"xlb.toml: vip "v6": backend [fe80::11]:80: address fe80::11 cannot be a backend: it is link-local (fe80::/10), which is not routed"#,
        ];
        backend_ipv4_mapped: v6("fd00:100::1", "::ffff:10.0.0.11") => [
            r#"xlb.toml: vip "v6": backend [::ffff:10.0.0.11]:80: address ::ffff:10.0.0.11 cannot be a backend: it is an IPv4-mapped IPv6 address, which no packet carries; write the IPv4 address 10.0.0.11"#,
        ];
        backend_is_another_vip: format!(
            "{}\n[[vip]]\nname = \"web\"\naddress = \"10.100.0.2\"\nport = 443\n\
             [[vip.backend]]\naddress = \"10.0.0.12\"\n",
            backend_at("10.100.0.2")
        ) => [
            r#"xlb.toml: vip "api": backend 10.100.0.2:80: the backend address is the address of vip "web"; its packets would come back to this load balancer: name a real server"#,
        ];
    }
}
