//! The lab's addresses: the segment, the LB, the client, the VIPs and every
//! backend, each host written with the same digits in IPv4, IPv6 and its MAC.

use std::net::{Ipv4Addr, Ipv6Addr};

/// The lab segment, IPv4.
pub const NET_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 0);
pub const NET_V4_PREFIX: u8 = 24;
/// The lab segment, IPv6.
pub const NET_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0);
pub const NET_V6_PREFIX: u8 = 64;

pub const LB_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);
pub const LB_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x2);
pub const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
pub const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x10);
/// More addresses of the client, added on demand
/// ([`Lab::add_client_sources`](super::Lab::add_client_sources)): hosts
/// 101 to 100 + [`CLIENT_SOURCES`] of the segment, so that one client
/// namespace can be several clients to the load balancer.
pub const CLIENT_SOURCES: u8 = 16;

/// Client source `i` (1-based, up to [`CLIENT_SOURCES`]): 10.99.0.(100+i).
pub fn client_source_v4(i: u8) -> Ipv4Addr {
    assert!(
        (1..=CLIENT_SOURCES).contains(&i),
        "client source {i} out of range 1..={CLIENT_SOURCES}"
    );
    Ipv4Addr::new(10, 99, 0, 100 + i)
}

/// The flooding client (only in a lab built with
/// [`LabConfig::flooder`](super::LabConfig::flooder)): host 9 of the segment.
pub const FLOOD_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 9);
pub const FLOOD_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x9);

/// The flooding client's own IPv6 /64, on-link on the segment next to the
/// segment's /64: a source prefix that no other host shares, so that a
/// per-/64 limit on it touches nobody else (the well-behaved client is in
/// fd00:99::/64). The flood namespace holds [`FLOOD_V6_SOURCES`] addresses
/// of it ([`flood_v6_source`]); the backends route it on-link.
pub const FLOOD_NET_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0x1, 0, 0, 0, 0);
pub const FLOOD_NET_V6_PREFIX: u8 = 64;

/// Addresses of [`FLOOD_NET_V6`] on the flood namespace's eth0: enough that
/// a limit per address would let the flood through 64 times over, few
/// enough that neighbour discovery on every backend stays small.
pub const FLOOD_V6_SOURCES: u16 = 64;

/// Source `i` (1-based, up to [`FLOOD_V6_SOURCES`]) of the flood /64:
/// fd00:99:0:1::i (hex).
pub fn flood_v6_source(i: u16) -> Ipv6Addr {
    assert!(
        (1..=FLOOD_V6_SOURCES).contains(&i),
        "flood source {i} out of range 1..={FLOOD_V6_SOURCES}"
    );
    let n = FLOOD_NET_V6.segments();
    Ipv6Addr::new(n[0], n[1], n[2], n[3], 0, 0, 0, i)
}

/// Every address of the flood /64 the flood namespace holds, 1 first.
pub fn flood_v6_sources() -> Vec<Ipv6Addr> {
    (1..=FLOOD_V6_SOURCES).map(flood_v6_source).collect()
}

/// The main VIPs, held on every backend's `lo` and routed by the client via the LB.
pub const VIP_V4: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 1);
pub const VIP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x100, 0, 0, 0, 0, 0, 0x1);
/// A second IPv4 VIP (for reload tests), also on every backend's `lo`.
pub const VIP2_V4: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 2);

/// The LB host's stand-in for a default gateway towards the VIPs (see
/// `build`): an address no namespace holds, with a permanent neighbour
/// entry for [`LB_GW_MAC`], which no interface has.
pub const LB_GW_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
pub const LB_GW_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x1);
pub const LB_GW_MAC: [u8; 6] = [0x02, 0x99, 0, 0, 0, 0x01];

/// The VIP ranges the client routes via the LB.
pub const VIP_NET_V4: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 0);
pub const VIP_NET_V4_PREFIX: u8 = 24;
pub const VIP_NET_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x100, 0, 0, 0, 0, 0, 0);
pub const VIP_NET_V6_PREFIX: u8 = 64;

/// Most backends a lab can have: host numbers 11..=60 keep every backend's
/// address, written with the same digits in v4, v6 and the MAC, valid.
pub const MAX_BACKENDS: usize = 50;

/// The lab's host numbers use the same digits in every notation: host 11 is
/// 10.99.0.11, fd00:99::11 (0x11) and MAC 02:99:00:00:00:11. `n` ≤ 99.
fn hex_digits(n: u8) -> u8 {
    (n / 10) * 16 + n % 10
}

/// Host number of backend `i` (1-based).
fn backend_host(i: usize) -> u8 {
    assert!(
        (1..=MAX_BACKENDS).contains(&i),
        "backend index {i} out of range 1..={MAX_BACKENDS}"
    );
    10 + i as u8
}

/// IPv4 address of backend `i` (1-based): 10.99.0.(10+i).
pub fn backend_v4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 99, 0, backend_host(i))
}

/// IPv6 address of backend `i` (1-based): fd00:99::(10+i), same digits as v4.
pub fn backend_v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(
        0xfd00,
        0x99,
        0,
        0,
        0,
        0,
        0,
        u16::from(hex_digits(backend_host(i))),
    )
}

fn host_mac(host: u8) -> [u8; 6] {
    [0x02, 0x99, 0, 0, 0, hex_digits(host)]
}

/// MAC address of the LB's eth0 (fixed, so configs can name it).
pub fn lb_mac() -> [u8; 6] {
    host_mac(2)
}

/// MAC address of the client's eth0.
pub fn client_mac() -> [u8; 6] {
    host_mac(10)
}

/// MAC address of the flooding client's eth0.
pub fn flood_mac() -> [u8; 6] {
    host_mac(9)
}

/// MAC address of backend `i`'s eth0 (1-based): 02:99:00:00:00:(10+i).
pub fn backend_mac(i: usize) -> [u8; 6] {
    host_mac(backend_host(i))
}

/// Formats a MAC the way `ip` writes it.
pub fn format_mac(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_use_the_same_digits_everywhere() {
        let cases = [
            ("b1", 1, "10.99.0.11", "fd00:99::11", "02:99:00:00:00:11"),
            ("b3", 3, "10.99.0.13", "fd00:99::13", "02:99:00:00:00:13"),
            ("b10", 10, "10.99.0.20", "fd00:99::20", "02:99:00:00:00:20"),
            ("b50", 50, "10.99.0.60", "fd00:99::60", "02:99:00:00:00:60"),
        ];
        for (name, i, v4, v6, mac) in cases {
            assert_eq!(backend_v4(i).to_string(), v4, "{name}");
            assert_eq!(backend_v6(i).to_string(), v6, "{name}");
            assert_eq!(format_mac(backend_mac(i)), mac, "{name}");
        }
        assert_eq!(LB_V6.to_string(), "fd00:99::2");
        assert_eq!(CLIENT_V6.to_string(), "fd00:99::10");
        assert_eq!(VIP_V6.to_string(), "fd00:100::1");
        assert_eq!(format_mac(lb_mac()), "02:99:00:00:00:02");
        assert_eq!(format_mac(client_mac()), "02:99:00:00:00:10");
        assert_eq!(FLOOD_V6.to_string(), "fd00:99::9");
        assert_eq!(format_mac(flood_mac()), "02:99:00:00:00:09");
    }

    #[test]
    fn flood_sources_share_one_64_that_nobody_else_is_in() {
        let sources = flood_v6_sources();
        assert_eq!(sources.len(), usize::from(FLOOD_V6_SOURCES));
        assert_eq!(sources[0].to_string(), "fd00:99:0:1::1");
        assert_eq!(sources[63].to_string(), "fd00:99:0:1::40");
        let net64 = |a: Ipv6Addr| a.segments()[..4].to_vec();
        for s in &sources {
            assert_eq!(net64(*s), net64(FLOOD_NET_V6), "{s}");
        }
        for other in [CLIENT_V6, LB_V6, FLOOD_V6, backend_v6(1), VIP_V6] {
            assert_ne!(net64(other), net64(FLOOD_NET_V6), "{other}");
        }
    }
}
