//! What `xlb trace` asks the data plane for: its flags parsed, and the
//! `TraceConfig` they make.

use std::net::IpAddr;

use lb_common::{
    FAMILY_V4, FAMILY_V6, addr16,
    trace::{
        TRACE_VERDICT_ALL, TRACE_VERDICT_DROP, TRACE_VERDICT_PASS, TRACE_VERDICT_TX, TraceConfig,
    },
};

use crate::guard::Prefix;

/// A VIP to trace: its address, and its port if given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VipFilter {
    pub addr: IpAddr,
    pub port: Option<u16>,
}

/// `ADDR`, `ADDR:PORT`, `[IPv6]` or `[IPv6]:PORT`.
pub fn parse_vip(s: &str) -> Result<VipFilter, String> {
    if let Ok(addr) = s.parse::<IpAddr>() {
        return Ok(VipFilter { addr, port: None });
    }
    if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']'))
        && let Ok(addr @ IpAddr::V6(_)) = inner.parse::<IpAddr>()
    {
        return Ok(VipFilter { addr, port: None });
    }
    if let Ok(sa) = s.parse::<std::net::SocketAddr>() {
        return Ok(VipFilter {
            addr: sa.ip(),
            port: Some(sa.port()),
        });
    }
    Err(format!(
        "{s:?} is not a VIP address; write ADDR or ADDR:PORT (10.100.0.1, 10.100.0.1:80, \
         [fd00::1]:443); names are not resolved"
    ))
}

/// `drop`, `pass`, `tx` or `all`, or several joined by commas
/// (`drop,pass`): the `TraceConfig::verdicts` mask. `drop` includes
/// `XDP_ABORTED`, `tx` includes redirects to another interface.
pub fn parse_verdicts(s: &str) -> Result<u8, String> {
    let mut mask = 0;
    for word in s.split(',') {
        mask |= match word.trim().to_ascii_lowercase().as_str() {
            "drop" => TRACE_VERDICT_DROP,
            "pass" => TRACE_VERDICT_PASS,
            "tx" => TRACE_VERDICT_TX,
            "all" => TRACE_VERDICT_ALL,
            _ => {
                return Err(format!(
                    "{word:?} is not a verdict; use drop, pass, tx or all (or several: drop,pass)"
                ));
            }
        };
    }
    Ok(mask)
}

/// Everything `xlb trace` filters by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceFilter {
    pub vip: Option<VipFilter>,
    pub source: Option<Prefix>,
    /// `TraceConfig::verdicts`.
    pub verdicts: u8,
    /// One of every N matching packets; 1 = all.
    pub sample: u32,
}

impl TraceFilter {
    /// The configuration that turns this trace on until `until_ns`
    /// (CLOCK_MONOTONIC), owned by process `pid`.
    pub fn config(&self, until_ns: u64, pid: u32) -> TraceConfig {
        let mut c = TraceConfig {
            until_ns,
            verdicts: self.verdicts,
            sample: self.sample,
            owner_pid: pid,
            ..TraceConfig::default()
        };
        if let Some(v) = self.vip {
            c.vip_family = family(v.addr);
            c.vip_addr = addr16(v.addr);
            c.vip_port = v.port.unwrap_or(0).to_be();
        }
        if let Some(p) = self.source {
            c.src_family = family(p.addr);
            c.src_addr = addr16(p.addr);
            c.src_mask = mask16(p.is_ipv4(), p.len);
        }
        c
    }
}

fn family(a: IpAddr) -> u8 {
    if a.is_ipv4() { FAMILY_V4 } else { FAMILY_V6 }
}

/// The mask of a prefix of `len` bits, network order, in the first 4 bytes
/// for IPv4.
fn mask16(v4: bool, len: u8) -> [u8; 16] {
    let width = if v4 { 32 } else { 128 };
    let mut m = [0u8; 16];
    for bit in 0..usize::from(len.min(width)) {
        m[bit / 8] |= 0x80 >> (bit % 8);
    }
    m
}

#[cfg(test)]
mod tests {
    use lb_common::{FlowKey, PROTO_TCP, trace::trace_matches};

    use super::*;

    /// An address and port, or the start of the error.
    type Expected = Result<(&'static str, Option<u16>), &'static str>;

    #[test]
    fn vip_forms() {
        let cases: [(&str, Expected); 6] = [
            ("10.100.0.1", Ok(("10.100.0.1", None))),
            ("10.100.0.1:80", Ok(("10.100.0.1", Some(80)))),
            ("fd00::1", Ok(("fd00::1", None))),
            ("[fd00::1]", Ok(("fd00::1", None))),
            ("[fd00::1]:443", Ok(("fd00::1", Some(443)))),
            (
                "api",
                Err("\"api\" is not a VIP address; write ADDR or ADDR:PORT"),
            ),
        ];
        for (text, want) in cases {
            match (parse_vip(text), want) {
                (Ok(got), Ok((addr, port))) => {
                    assert_eq!(got.addr, addr.parse::<IpAddr>().unwrap(), "{text}");
                    assert_eq!(got.port, port, "{text}");
                }
                (Err(e), Err(start)) => assert!(e.starts_with(start), "{text}: {e}"),
                (got, _) => panic!("{text}: {got:?}"),
            }
        }
    }

    #[test]
    fn verdict_words() {
        assert_eq!(parse_verdicts("drop"), Ok(TRACE_VERDICT_DROP));
        assert_eq!(parse_verdicts("tx"), Ok(TRACE_VERDICT_TX));
        assert_eq!(
            parse_verdicts("Drop,pass"),
            Ok(TRACE_VERDICT_DROP | TRACE_VERDICT_PASS)
        );
        assert_eq!(parse_verdicts("all"), Ok(TRACE_VERDICT_ALL));
        assert_eq!(
            parse_verdicts("forward"),
            Err(
                "\"forward\" is not a verdict; use drop, pass, tx or all (or several: drop,pass)"
                    .to_owned()
            )
        );
    }

    fn flow(src: &str, dst: &str, dport: u16) -> FlowKey {
        let s: IpAddr = src.parse().unwrap();
        FlowKey {
            src: addr16(s),
            dst: addr16(dst.parse().unwrap()),
            sport: 1234u16.to_be(),
            dport: dport.to_be(),
            proto: PROTO_TCP,
            family: family(s),
            _pad: [0; 2],
        }
    }

    /// The flags, parsed and made into a `TraceConfig`, select what they
    /// say through the kernel's own test.
    #[test]
    fn flags_make_the_kernel_filter() {
        let filter = |vip: Option<&str>, source: Option<&str>| TraceFilter {
            vip: vip.map(|v| parse_vip(v).unwrap()),
            source: source.map(|s| s.parse().unwrap()),
            verdicts: TRACE_VERDICT_ALL,
            sample: 1,
        };
        let tx = u32::from(lb_common::trace::XDP_TX);
        let cases = [
            (
                "v4 /24",
                filter(None, Some("192.0.2.0/24")),
                "192.0.2.200",
                "10.0.0.1",
                80,
                true,
            ),
            (
                "v4 /24, outside",
                filter(None, Some("192.0.2.0/24")),
                "192.0.3.1",
                "10.0.0.1",
                80,
                false,
            ),
            (
                "v6 /64",
                filter(None, Some("2001:db8:0:7::/64")),
                "2001:db8:0:7::99",
                "fd00::1",
                80,
                true,
            ),
            (
                "v6 /64, next /64",
                filter(None, Some("2001:db8:0:7::/64")),
                "2001:db8:0:8::99",
                "fd00::1",
                80,
                false,
            ),
            (
                "v6 /61, odd bits",
                filter(None, Some("2001:db8:0:8::/61")),
                "2001:db8:0:f::1",
                "fd00::1",
                80,
                true,
            ),
            (
                "vip with port",
                filter(Some("10.0.0.1:80"), None),
                "192.0.2.1",
                "10.0.0.1",
                80,
                true,
            ),
            (
                "vip, other port",
                filter(Some("10.0.0.1:80"), None),
                "192.0.2.1",
                "10.0.0.1",
                443,
                false,
            ),
            (
                "vip, any port",
                filter(Some("10.0.0.1"), None),
                "192.0.2.1",
                "10.0.0.1",
                443,
                true,
            ),
            (
                "vip, other address",
                filter(Some("10.0.0.1"), None),
                "192.0.2.1",
                "10.0.0.2",
                80,
                false,
            ),
            (
                "v6 vip",
                filter(Some("[fd00::1]:80"), None),
                "2001:db8::1",
                "fd00::1",
                80,
                true,
            ),
        ];
        for (name, f, src, dst, port, want) in cases {
            let cfg = f.config(1, 1);
            assert_eq!(
                trace_matches(&cfg, &flow(src, dst, port), tx),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn masks() {
        assert_eq!(mask16(true, 24)[..5], [255, 255, 255, 0, 0]);
        assert_eq!(
            mask16(false, 61)[..9],
            [255, 255, 255, 255, 255, 255, 255, 0xf8, 0]
        );
        assert_eq!(mask16(true, 0), [0; 16]);
    }
}
