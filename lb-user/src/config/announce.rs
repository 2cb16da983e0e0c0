//! `[announce]`: xlb decides when each VIP address is announced and hands
//! the announced ones to a BGP speaker (BIRD) as host routes in a kernel
//! routing table of their own (see `crate::announce`). Without the table
//! nothing is written and every VIP's announce state is `off`.
//!
//! Per VIP, `announce_min_up` overrides `min_up`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::Problems;
use super::raw::RawVip;

/// Defaults of the `[announce]` settings.
pub mod defaults {
    /// `announce.protocol`: the route protocol number xlb writes and
    /// recognises as its own. 252 is unassigned in `/etc/iproute2/rt_protos`
    /// and by the kernel (`include/uapi/linux/rtnetlink.h` names 0-4 and
    /// 8-192), so no other daemon writes it; BIRD's `learn` imports it.
    pub const PROTOCOL: u8 = 252;
    /// `announce.min_up` (and `vip.announce_min_up`): backends serving
    /// before a VIP is announced.
    pub const MIN_UP: u32 = 1;
}

/// Tables the kernel itself uses (`rtnetlink.h`: `RT_TABLE_UNSPEC`,
/// `RT_TABLE_DEFAULT`, `RT_TABLE_MAIN`, `RT_TABLE_LOCAL`), by name.
const RESERVED_TABLES: [(i64, &str); 4] = [
    (0, "unspec"),
    (253, "default"),
    (254, "main"),
    (255, "local"),
];

/// Route protocols that already mean something: the kernel's own
/// (`RTPROT_UNSPEC`, `REDIRECT`, `KERNEL`, `BOOT` = `ip route add`,
/// `STATIC`) and BIRD's (`RTPROT_BIRD` = 12, the routes it exports itself).
const RESERVED_PROTOCOLS: [(i64, &str); 6] = [
    (0, "unspec"),
    (1, "redirect"),
    (2, "kernel"),
    (3, "boot (ip route add)"),
    (4, "static"),
    (12, "bird"),
];

/// `[announce]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAnnounce {
    /// i64 rather than u32 so that -1 and 2^40 get a message of ours.
    pub(super) table: Option<i64>,
    pub(super) protocol: Option<i64>,
    pub(super) min_up: Option<i64>,
    pub(super) speaker_socket: Option<PathBuf>,
}

/// The validated `[announce]` table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AnnounceConfig {
    /// Kernel routing table the host routes of announced VIP addresses go
    /// to; xlb owns it (routes of another protocol there are an error).
    pub table: u32,
    /// Route protocol number of xlb's routes (default 252).
    pub protocol: u8,
    /// Backends that must serve before a VIP is announced (default 1).
    pub min_up: u32,
    /// BIRD's control socket, checked for liveness; `None` = not checked.
    pub speaker_socket: Option<PathBuf>,
    /// `vip.announce_min_up`, by VIP name, where set.
    pub vip_min_up: BTreeMap<String, u32>,
}

impl AnnounceConfig {
    /// The `min_up` that applies to VIP `name`.
    pub fn min_up_of(&self, name: &str) -> u32 {
        self.vip_min_up.get(name).copied().unwrap_or(self.min_up)
    }
}

/// Validates `[announce]` and every `vip.announce_min_up`.
pub(super) fn validate(
    raw: Option<&RawAnnounce>,
    vips: &[RawVip],
    p: &mut Problems<'_>,
) -> Option<AnnounceConfig> {
    let Some(raw) = raw else {
        for v in vips.iter().filter(|v| v.announce_min_up.is_some()) {
            p.error(
                &format!("vip {:?}", v.name),
                "announce_min_up is set but there is no [announce] table, so nothing is \
                 announced; add [announce] with a table, or remove announce_min_up",
            );
        }
        return None;
    };
    let table = table(raw, p);
    let protocol = protocol(raw, p);
    let min_up = parse_min_up(raw.min_up, "announce", "min_up", p);
    let speaker_socket = speaker_socket(raw, p);
    let mut vip_min_up = BTreeMap::new();
    for v in vips {
        if let Some(n) = v.announce_min_up {
            let ctx = format!("vip {:?}", v.name);
            let n = parse_min_up(Some(n), &ctx, "announce_min_up", p);
            if n as usize > v.backend.len() {
                p.warn(
                    &ctx,
                    format!(
                        "announce_min_up = {n} but the VIP has {} backends: it is never \
                         announced",
                        v.backend.len()
                    ),
                );
            }
            vip_min_up.insert(v.name.clone(), n);
        }
    }
    Some(AnnounceConfig {
        table: table?,
        protocol: protocol?,
        min_up,
        speaker_socket,
        vip_min_up,
    })
}

fn table(raw: &RawAnnounce, p: &mut Problems<'_>) -> Option<u32> {
    let Some(t) = raw.table else {
        p.error(
            "announce",
            "table is missing; set the kernel routing table xlb writes announced VIPs \
             to, e.g. table = 100, and let BIRD's kernel protocol learn it",
        );
        return None;
    };
    if let Some((_, name)) = RESERVED_TABLES.iter().find(|(n, _)| *n == t) {
        p.error(
            "announce",
            format!(
                "table = {t} is the kernel's {name:?} table; xlb needs a table of its own: \
                 pick an unused id such as 100"
            ),
        );
        return None;
    }
    match u32::try_from(t) {
        Ok(t) => Some(t),
        Err(_) => {
            p.error(
                "announce",
                format!("table = {t} is not a routing table id; use 1 to 4294967295"),
            );
            None
        }
    }
}

fn protocol(raw: &RawAnnounce, p: &mut Problems<'_>) -> Option<u8> {
    let Some(n) = raw.protocol else {
        return Some(defaults::PROTOCOL);
    };
    if let Some((_, name)) = RESERVED_PROTOCOLS.iter().find(|(r, _)| *r == n) {
        p.error(
            "announce",
            format!(
                "protocol = {n} is the route protocol {name:?}, which others write; \
                 use a number of xlb's own such as the default {}",
                defaults::PROTOCOL
            ),
        );
        return None;
    }
    match u8::try_from(n) {
        Ok(n) => Some(n),
        Err(_) => {
            p.error(
                "announce",
                format!(
                    "protocol = {n} is not a route protocol number; use 5 to 255 \
                     (default {})",
                    defaults::PROTOCOL
                ),
            );
            None
        }
    }
}

/// `min_up` of `[announce]` or `announce_min_up` of a VIP: at least 1, since
/// a VIP announced with no backend serving draws traffic it drops.
fn parse_min_up(value: Option<i64>, ctx: &str, field: &str, p: &mut Problems<'_>) -> u32 {
    let Some(n) = value else {
        return defaults::MIN_UP;
    };
    match u32::try_from(n) {
        Ok(n) if n >= 1 => n,
        _ => {
            p.error(
                ctx,
                format!(
                    "{field} = {n}: a VIP needs at least 1 backend serving to be announced \
                     (routers would send it traffic it cannot serve); use 1 or more"
                ),
            );
            defaults::MIN_UP
        }
    }
}

fn speaker_socket(raw: &RawAnnounce, p: &mut Problems<'_>) -> Option<PathBuf> {
    let path = raw.speaker_socket.clone()?;
    if !path.is_absolute() {
        p.error(
            "announce",
            format!(
                "speaker_socket {:?} is not an absolute path; write BIRD's control socket \
                 in full, e.g. \"/run/bird/bird.ctl\"",
                path.display().to_string()
            ),
        );
        return None;
    }
    Some(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{DAEMON, ONE_BACKEND, api_with_backend, ok};

    fn with_announce(announce: &str, vip_settings: &str) -> String {
        format!(
            "{}\n[announce]\n{announce}\n",
            api_with_backend(vip_settings)
        )
    }

    #[test]
    fn without_the_table_nothing_is_announced() {
        let c = ok("none", &api_with_backend(""));
        assert_eq!(c.announce, None);
    }

    #[test]
    fn defaults_and_overrides() {
        let c = ok(
            "announce",
            &with_announce("table = 100", "announce_min_up = 1"),
        );
        let want = AnnounceConfig {
            table: 100,
            protocol: 252,
            min_up: 1,
            speaker_socket: None,
            vip_min_up: BTreeMap::from([("api".to_string(), 1)]),
        };
        assert_eq!(c.announce, Some(want));
        let c = ok(
            "all set",
            &format!(
                "{DAEMON}\n[announce]\ntable = 4000\nprotocol = 200\nmin_up = 2\n\
                 speaker_socket = \"/run/bird/bird.ctl\"\n\
                 [[vip]]\nname = \"a\"\naddress = \"10.100.0.1\"\nport = 80\n{ONE_BACKEND}\
                 [[vip]]\nname = \"b\"\naddress = \"10.100.0.1\"\nport = 81\n\
                 announce_min_up = 1\n{ONE_BACKEND}"
            ),
        );
        let a = c.announce.unwrap();
        assert_eq!((a.table, a.protocol, a.min_up), (4000, 200, 2));
        assert_eq!(a.speaker_socket, Some(PathBuf::from("/run/bird/bird.ctl")));
        assert_eq!((a.min_up_of("a"), a.min_up_of("b")), (2, 1));
        assert_eq!(
            c.warnings,
            Vec::<String>::new(),
            "min_up is not checked against backends"
        );
    }

    #[test]
    fn min_up_above_the_backends_is_a_warning() {
        let c = ok("warn", &with_announce("table = 100", "announce_min_up = 3"));
        assert_eq!(
            c.warnings,
            [
                "xlb.toml: vip \"api\": announce_min_up = 3 but the VIP has 1 backends: it is \
              never announced"
            ]
        );
    }

    rejects! {
        table_missing: with_announce("", "") => [
            "xlb.toml: announce: table is missing; set the kernel routing table xlb writes \
             announced VIPs to, e.g. table = 100, and let BIRD's kernel protocol learn it",
        ];
        table_main: with_announce("table = 254", "") => [
            "xlb.toml: announce: table = 254 is the kernel's \"main\" table; xlb needs a \
             table of its own: pick an unused id such as 100",
        ];
        table_local: with_announce("table = 255", "") => [
            "xlb.toml: announce: table = 255 is the kernel's \"local\" table; xlb needs a \
             table of its own: pick an unused id such as 100",
        ];
        table_default: with_announce("table = 253", "") => [
            "xlb.toml: announce: table = 253 is the kernel's \"default\" table; xlb needs a \
             table of its own: pick an unused id such as 100",
        ];
        table_zero: with_announce("table = 0", "") => [
            "xlb.toml: announce: table = 0 is the kernel's \"unspec\" table; xlb needs a \
             table of its own: pick an unused id such as 100",
        ];
        table_negative: with_announce("table = -1", "") => [
            "xlb.toml: announce: table = -1 is not a routing table id; use 1 to 4294967295",
        ];
        protocol_boot: with_announce("table = 100\nprotocol = 3", "") => [
            "xlb.toml: announce: protocol = 3 is the route protocol \"boot (ip route add)\", \
             which others write; use a number of xlb's own such as the default 252",
        ];
        protocol_bird: with_announce("table = 100\nprotocol = 12", "") => [
            "xlb.toml: announce: protocol = 12 is the route protocol \"bird\", which others \
             write; use a number of xlb's own such as the default 252",
        ];
        protocol_too_big: with_announce("table = 100\nprotocol = 256", "") => [
            "xlb.toml: announce: protocol = 256 is not a route protocol number; use 5 to 255 \
             (default 252)",
        ];
        min_up_zero: with_announce("table = 100\nmin_up = 0", "") => [
            "xlb.toml: announce: min_up = 0: a VIP needs at least 1 backend serving to be \
             announced (routers would send it traffic it cannot serve); use 1 or more",
        ];
        vip_min_up_zero: with_announce("table = 100", "announce_min_up = 0") => [
            "xlb.toml: vip \"api\": announce_min_up = 0: a VIP needs at least 1 backend \
             serving to be announced (routers would send it traffic it cannot serve); use 1 \
             or more",
        ];
        vip_min_up_without_announce: api_with_backend("announce_min_up = 2") => [
            "xlb.toml: vip \"api\": announce_min_up is set but there is no [announce] table, \
             so nothing is announced; add [announce] with a table, or remove announce_min_up",
        ];
        relative_speaker_socket: with_announce(
            "table = 100\nspeaker_socket = \"bird.ctl\"", "") => [
            "xlb.toml: announce: speaker_socket \"bird.ctl\" is not an absolute path; write \
             BIRD's control socket in full, e.g. \"/run/bird/bird.ctl\"",
        ];
        unknown_field: with_announce("table = 100\ntabel = 1", "") => [
            "xlb.toml:16:1: announce: unknown field `tabel`, expected one of `table`, `protocol`, \
             `min_up`, `speaker_socket`",
        ];
    }
}
