//! One traced packet as `xlb trace` prints it: a line
//! (`time verdict reason proto src -> dst backend flags`) or a JSON object.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lb_common::{
    FAMILY_V4, PROTO_TCP, PROTO_UDP,
    trace::{
        TRACE_FLAG_CHANCE, TRACE_FLAG_ICMP_ERROR, TRACE_FLAG_PICKED, TraceEvent, XDP_ABORTED,
        XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX, trace_reason,
    },
};
use serde::Serialize;

use crate::cli::format_utc;

/// A traced packet, ready to print.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceLine {
    /// When the data plane gave the verdict, ms since the Unix epoch.
    pub time_unix_ms: u64,
    /// `drop`, `pass`, `tx`, `redirect` or `aborted`.
    pub verdict: &'static str,
    /// The counter the verdict bumped (`xlb status` and the metrics use the
    /// same names), or `unknown`.
    pub reason: &'static str,
    /// `tcp`, `udp`, `icmp`, `icmpv6` or the protocol number.
    pub proto: String,
    pub src: IpAddr,
    pub sport: u16,
    /// The destination: the VIP, for a packet to one.
    pub dst: IpAddr,
    pub dport: u16,
    /// The backend the packet went (or would have gone) to: its id in the
    /// data plane, and its address when the maps still name it.
    pub backend_id: Option<u16>,
    pub backend: Option<IpAddr>,
    /// `ct` (conntrack hit), `picked` (from the table), `second_chance`,
    /// `icmp_error`.
    pub flags: Vec<&'static str>,
    /// TCP flags as tcpdump writes them (`S`, `S.`, `.`, `F.`, `R`); empty
    /// for other protocols.
    pub tcp: String,
    pub ifindex: u32,
}

/// The verdict name of an XDP action.
pub fn verdict_name(action: u8) -> &'static str {
    match action {
        XDP_ABORTED => "aborted",
        XDP_DROP => "drop",
        XDP_PASS => "pass",
        XDP_TX => "tx",
        XDP_REDIRECT => "redirect",
        _ => "unknown",
    }
}

/// The address in a 16-byte map field of `family`.
pub fn addr_of(bytes: &[u8; 16], family: u8) -> IpAddr {
    if family == FAMILY_V4 {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(*bytes))
    }
}

fn proto_name(proto: u8) -> String {
    match proto {
        PROTO_TCP => "tcp".to_owned(),
        PROTO_UDP => "udp".to_owned(),
        1 => "icmp".to_owned(),
        58 => "icmpv6".to_owned(),
        n => n.to_string(),
    }
}

/// TCP flags as tcpdump prints them: S, F, R, P, then `.` for ACK.
fn tcp_flags(f: u8) -> String {
    let mut s = String::new();
    for (bit, c) in [(0x02, 'S'), (0x01, 'F'), (0x04, 'R'), (0x08, 'P')] {
        if f & bit != 0 {
            s.push(c);
        }
    }
    if f & 0x10 != 0 {
        s.push('.');
    }
    s
}

impl TraceLine {
    /// `e`, its kernel time turned into wall time with `mono_to_unix_ns`
    /// (CLOCK_REALTIME − CLOCK_MONOTONIC), its backend id named by
    /// `backend` if it can.
    pub fn new(e: &TraceEvent, mono_to_unix_ns: i128, backend: Option<IpAddr>) -> Self {
        let unix_ns = i128::from(e.ktime_ns) + mono_to_unix_ns;
        let forwarded = e.action == XDP_TX || e.action == XDP_REDIRECT;
        let mut flags = Vec::new();
        if e.backend != 0 && forwarded && e.flags & TRACE_FLAG_PICKED == 0 {
            flags.push("ct");
        }
        for (bit, name) in [
            (TRACE_FLAG_PICKED, "picked"),
            (TRACE_FLAG_CHANCE, "second_chance"),
            (TRACE_FLAG_ICMP_ERROR, "icmp_error"),
        ] {
            if e.flags & bit != 0 {
                flags.push(name);
            }
        }
        TraceLine {
            time_unix_ms: u64::try_from(unix_ns / 1_000_000).unwrap_or(0),
            verdict: verdict_name(e.action),
            reason: trace_reason(e.reason).map_or("unknown", |s| s.label()),
            proto: proto_name(e.proto),
            src: addr_of(&e.src, e.family),
            sport: u16::from_be(e.sport),
            dst: addr_of(&e.dst, e.family),
            dport: u16::from_be(e.dport),
            backend_id: (e.backend != 0).then_some(e.backend),
            backend,
            flags,
            tcp: if e.proto == PROTO_TCP {
                tcp_flags(e.tcp_flags)
            } else {
                String::new()
            },
            ifindex: e.ifindex,
        }
    }

    /// One line: `time verdict reason proto src -> dst backend flags`.
    pub fn render(&self) -> String {
        let time = format_utc(self.time_unix_ms);
        let mut line = format!(
            "{} {:<8} {:<20} {:<6} {} -> {}",
            &time[11..],
            self.verdict,
            self.reason,
            self.proto,
            endpoint(self.src, self.sport),
            endpoint(self.dst, self.dport),
        );
        match (self.backend_id, self.backend) {
            (Some(id), Some(addr)) => {
                let _ = write!(line, " backend {addr} (id {id})");
            }
            (Some(id), None) => {
                let _ = write!(line, " backend id {id}");
            }
            _ => {}
        }
        let mut flags: Vec<&str> = self.flags.clone();
        if !self.tcp.is_empty() {
            flags.push(&self.tcp);
        }
        if !flags.is_empty() {
            let _ = write!(line, " [{}]", flags.join(" "));
        }
        line
    }
}

fn endpoint(addr: IpAddr, port: u16) -> String {
    match addr {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use lb_common::{FAMILY_V6, Stat, addr16};

    use super::*;

    fn event(action: u8, reason: Stat, flags: u8, backend: u16) -> TraceEvent {
        TraceEvent {
            ktime_ns: 5_000_000_000,
            src: addr16("192.0.2.7".parse().unwrap()),
            dst: addr16("10.100.0.1".parse().unwrap()),
            sport: 40001u16.to_be(),
            dport: 80u16.to_be(),
            action,
            reason: reason as u8 + 1,
            flags,
            family: FAMILY_V4,
            proto: PROTO_TCP,
            tcp_flags: 0x10,
            backend,
            ifindex: 2,
        }
    }

    // 2026-12-03 18:00:00 UTC, less the 5 s of `ktime_ns`.
    const OFFSET: i128 = 1_796_320_800_000_000_000 - 5_000_000_000;

    #[test]
    fn lines() {
        let be = Some("10.0.0.12".parse().unwrap());
        let cases = [
            (
                "a conntrack hit",
                TraceLine::new(&event(XDP_TX, Stat::FwdTx, 0, 3), OFFSET, be),
                "18:00:00.000 tx       fwd_tx               tcp    192.0.2.7:40001 -> 10.100.0.1:80 backend 10.0.0.12 (id 3) [ct .]",
            ),
            (
                "a new flow, redirected",
                TraceLine::new(
                    &event(XDP_REDIRECT, Stat::FwdRedirect, TRACE_FLAG_PICKED, 3),
                    OFFSET,
                    None,
                ),
                "18:00:00.000 redirect fwd_redirect         tcp    192.0.2.7:40001 -> 10.100.0.1:80 backend id 3 [picked .]",
            ),
            (
                "no backend",
                TraceLine::new(&event(XDP_DROP, Stat::DropNoBackend, 0, 0), OFFSET, None),
                "18:00:00.000 drop     drop_no_backend      tcp    192.0.2.7:40001 -> 10.100.0.1:80 [.]",
            ),
        ];
        for (name, line, want) in cases {
            assert_eq!(line.render(), want, "{name}");
        }
    }

    #[test]
    fn json_fields() {
        let mut e = event(XDP_PASS, Stat::PassVipHost, 0, 0);
        e.family = FAMILY_V6;
        e.src = addr16("2001:db8::7".parse().unwrap());
        e.dst = addr16("fd00::1".parse().unwrap());
        e.proto = PROTO_UDP;
        e.reason = 0;
        let v = serde_json::to_value(TraceLine::new(&e, OFFSET, None)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "time_unix_ms": 1_796_320_800_000u64,
                "verdict": "pass",
                "reason": "unknown",
                "proto": "udp",
                "src": "2001:db8::7",
                "sport": 40001,
                "dst": "fd00::1",
                "dport": 80,
                "backend_id": null,
                "backend": null,
                "flags": [],
                "tcp": "",
                "ifindex": 2,
            })
        );
    }

    #[test]
    fn tcp_flag_letters() {
        assert_eq!(tcp_flags(0x02), "S");
        assert_eq!(tcp_flags(0x12), "S.");
        assert_eq!(tcp_flags(0x11), "F.");
        assert_eq!(tcp_flags(0x04), "R");
        assert_eq!(tcp_flags(0x18), "P.");
    }
}
