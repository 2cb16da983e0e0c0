//! An IPv4 or IPv6 prefix as the deny and allow lists key sources:
//! `"192.0.2.7"` (a bare address: its /32 or /128), `"192.0.2.0/24"`,
//! `"2001:db8:1:2::/64"`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Serialize, Serializer};

/// A network: an address with its host bits zero, and a length in bits
/// (0..=32 for IPv4, 0..=128 for IPv6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

/// Why a text is not a prefix; each message shows the text and what to
/// write instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    #[error(
        "{text:?} is not an IP address or prefix; write an address (\"192.0.2.7\", \
         \"2001:db8::1\") or a prefix (\"192.0.2.0/24\", \"2001:db8:1:2::/64\")"
    )]
    Address { text: String },
    #[error("{text:?}: prefix length {len:?} is not a number; use 0 to {max}")]
    LengthNotANumber { text: String, len: String, max: u8 },
    #[error("{text:?}: prefix length {len} is over {max} for an {family} address; use 0 to {max}")]
    LengthTooLong {
        text: String,
        len: u32,
        max: u8,
        family: &'static str,
    },
    #[error(
        "{text:?} has host bits set; write \"{network}\" for the network, or \"{host}\" \
         for the one address"
    )]
    HostBits {
        text: String,
        network: Prefix,
        host: Prefix,
    },
}

impl Prefix {
    /// The prefix of length `len` that contains `addr` (host bits cleared;
    /// `len` capped at the family's width).
    pub fn of(addr: IpAddr, len: u8) -> Prefix {
        let len = len.min(max_len(addr));
        Prefix {
            addr: mask(addr, len),
            len,
        }
    }

    /// `addr` alone: its /32 or /128.
    pub fn host(addr: IpAddr) -> Prefix {
        Prefix {
            addr,
            len: max_len(addr),
        }
    }

    /// Whether `addr` is in this network (never across families).
    pub fn contains(&self, addr: IpAddr) -> bool {
        addr.is_ipv4() == self.addr.is_ipv4() && mask(addr, self.len) == self.addr
    }

    /// Whether every address of `other` is in this network.
    pub fn covers(&self, other: &Prefix) -> bool {
        other.len >= self.len && self.contains(other.addr)
    }

    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }
}

/// 32 or 128.
fn max_len(addr: IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

fn mask(addr: IpAddr, len: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let m = u32::MAX
                .checked_shl(32 - u32::from(len.min(32)))
                .unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(bits & m))
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let m = u128::MAX
                .checked_shl(128 - u32::from(len.min(128)))
                .unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits & m))
        }
    }
}

impl FromStr for Prefix {
    type Err = PrefixError;

    fn from_str(text: &str) -> Result<Prefix, PrefixError> {
        let t = text.trim();
        let (addr_text, len_text) = match t.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (t, None),
        };
        let addr: IpAddr = addr_text.parse().map_err(|_| PrefixError::Address {
            text: text.to_owned(),
        })?;
        let max = max_len(addr);
        let Some(len_text) = len_text else {
            return Ok(Prefix::host(addr));
        };
        let len: u32 = len_text
            .parse()
            .ok()
            .filter(|_| len_text.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| PrefixError::LengthNotANumber {
                text: text.to_owned(),
                len: len_text.to_owned(),
                max,
            })?;
        if len > u32::from(max) {
            return Err(PrefixError::LengthTooLong {
                text: text.to_owned(),
                len,
                max,
                family: if addr.is_ipv4() { "IPv4" } else { "IPv6" },
            });
        }
        let network = Prefix::of(addr, len as u8);
        if network.addr != addr {
            return Err(PrefixError::HostBits {
                text: text.to_owned(),
                network,
                host: Prefix::host(addr),
            });
        }
        Ok(network)
    }
}

impl fmt::Display for Prefix {
    /// Always with its length: `192.0.2.7/32`, `2001:db8:1:2::/64`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl Serialize for Prefix {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Prefix {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn parses_and_displays() {
        let cases = [
            ("bare IPv4 address", "192.0.2.7", "192.0.2.7/32"),
            ("IPv4 network", "192.0.2.0/24", "192.0.2.0/24"),
            ("IPv4 everything", "0.0.0.0/0", "0.0.0.0/0"),
            ("bare IPv6 address", "2001:db8::1", "2001:db8::1/128"),
            ("IPv6 /64", "2001:db8:1:2::/64", "2001:db8:1:2::/64"),
            ("spaces around", " 10.0.0.0/8 ", "10.0.0.0/8"),
        ];
        for (name, text, shown) in cases {
            assert_eq!(p(text).to_string(), shown, "{name}");
        }
    }

    #[test]
    fn refusals_say_what_to_write() {
        let cases = [
            (
                "not an address",
                "192.0.2.300",
                r#""192.0.2.300" is not an IP address or prefix; write an address ("192.0.2.7", "2001:db8::1") or a prefix ("192.0.2.0/24", "2001:db8:1:2::/64")"#,
            ),
            (
                "empty",
                "",
                r#""" is not an IP address or prefix; write an address ("192.0.2.7", "2001:db8::1") or a prefix ("192.0.2.0/24", "2001:db8:1:2::/64")"#,
            ),
            (
                "IPv4 length over 32",
                "10.0.0.0/33",
                r#""10.0.0.0/33": prefix length 33 is over 32 for an IPv4 address; use 0 to 32"#,
            ),
            (
                "IPv6 length over 128",
                "2001:db8::/129",
                r#""2001:db8::/129": prefix length 129 is over 128 for an IPv6 address; use 0 to 128"#,
            ),
            (
                "length not a number",
                "10.0.0.0/x",
                r#""10.0.0.0/x": prefix length "x" is not a number; use 0 to 32"#,
            ),
            (
                "signed length",
                "10.0.0.0/+8",
                r#""10.0.0.0/+8": prefix length "+8" is not a number; use 0 to 32"#,
            ),
            (
                "IPv4 host bits",
                "192.0.2.7/24",
                r#""192.0.2.7/24" has host bits set; write "192.0.2.0/24" for the network, or "192.0.2.7/32" for the one address"#,
            ),
            (
                "IPv6 host bits",
                "2001:db8:1:2::9/64",
                r#""2001:db8:1:2::9/64" has host bits set; write "2001:db8:1:2::/64" for the network, or "2001:db8:1:2::9/128" for the one address"#,
            ),
        ];
        for (name, text, want) in cases {
            let e = text.parse::<Prefix>().expect_err(name);
            assert_eq!(e.to_string(), want, "{name}");
        }
    }

    #[test]
    fn contains_and_of() {
        let net = p("2001:db8:1:2::/64");
        assert!(net.contains("2001:db8:1:2:ffff::1".parse().unwrap()));
        assert!(!net.contains("2001:db8:1:3::1".parse().unwrap()));
        assert!(!p("0.0.0.0/0").contains("::1".parse().unwrap()));
        assert!(p("0.0.0.0/0").contains("203.0.113.9".parse().unwrap()));
        assert_eq!(Prefix::of("2001:db8:1:2:aaaa::1".parse().unwrap(), 64), net);
        assert_eq!(
            Prefix::of("192.0.2.77".parse().unwrap(), 24),
            p("192.0.2.0/24")
        );
        assert_eq!(
            Prefix::of("192.0.2.77".parse().unwrap(), 200),
            p("192.0.2.77")
        );
        assert!(p("10.0.0.0/8").covers(&p("10.1.0.0/16")));
        assert!(!p("10.1.0.0/16").covers(&p("10.0.0.0/8")));
    }
}
