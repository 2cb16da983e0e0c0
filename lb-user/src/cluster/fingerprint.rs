//! The configuration fingerprint: what a node's Maglev tables are built
//! from, hashed, so nodes behind one ECMP group can be compared without
//! showing their hash key.
//!
//! A flow that ECMP moves to another node finds no conntrack entry there
//! and is placed by that node's table: `slot = flow_hash(hash_key, flow)
//! scaled to table_size` (`lb_common::FlowKey::slot`), then the backend in
//! that slot (`maglev::build`). So the fingerprint covers exactly what
//! decides that backend, and nothing else:
//!
//! - the hash key (`Globals::hash_key`, the one in effect: the pinned one
//!   when the file sets none);
//! - per VIP: its data-plane key (address, port, protocol), its mode (how
//!   the packet reaches the backend) and its table size;
//! - per VIP, its backends with a weight above 0, as `maglev::build` sees
//!   them: address, port and weight. `build` sorts them by (address, port)
//!   and skips weight 0, and scaling every weight by one factor gives the
//!   same table (each round adds `weight` of credit against `max_weight`),
//!   so the backends are sorted, weight-0 ones left out and the weights
//!   divided by their greatest common divisor: two files give the same
//!   fingerprint if, and only if, they give the same tables.
//!
//! Left out on purpose: the ring stride (`daemon.max_table_size`; a slot
//! does not depend on it, `select.rs` `pick`), VIP and node names, health
//! and drain states, and everything else a file may say (probes,
//! protection, guard): two nodes may differ there without moving a flow.
//!
//! Each fingerprint is the first 8 bytes of a SHA-256 (16 hex digits):
//! enough to tell configurations apart, and 64 bits of a hash of a 128-bit
//! key do not give the key away.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use ring::digest::{Context, SHA256};

use crate::config::{VipConfig, ip_proto};

/// Prefixes of the hashed inputs: a change of encoding changes the
/// version, and a VIP's input can never read as a hash key's.
const DOMAIN_CONFIG: &[u8] = b"xlb-fingerprint-config-v1\0";
const DOMAIN_KEY: &[u8] = b"xlb-fingerprint-hash-key-v1\0";
const DOMAIN_VIP: &[u8] = b"xlb-fingerprint-vip-v1\0";

/// 64 bits of a SHA-256, shown as 16 hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fingerprint(pub [u8; 8]);

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// A node's fingerprints: the whole configuration, the hash key alone and
/// each VIP alone (without the key), so a comparison can say what differs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprints {
    /// Hash key and every VIP: equal on two nodes if, and only if, every
    /// flow maps to the same backend on both (health states aside).
    pub config: Fingerprint,
    /// The hash key alone.
    pub hash_key: Fingerprint,
    /// Each VIP by name, without the hash key.
    pub vips: BTreeMap<String, Fingerprint>,
}

/// The fingerprints of `vips` with hash key `hash_key`.
pub fn fingerprints(hash_key: [u64; 2], vips: &[VipConfig]) -> Fingerprints {
    let mut encoded: Vec<(Vec<u8>, &str)> = vips
        .iter()
        .map(|v| (vip_input(v), v.name.as_str()))
        .collect();
    // VIPs in file order would make the order count; their inputs start
    // with their data-plane key, which is unique, so sorting by input is a
    // canonical order.
    encoded.sort();
    let mut config = Context::new(&SHA256);
    config.update(DOMAIN_CONFIG);
    config.update(&key_bytes(hash_key));
    config.update(&(encoded.len() as u64).to_le_bytes());
    let mut by_name = BTreeMap::new();
    for (input, name) in &encoded {
        let digest = sha256(&[DOMAIN_VIP, input]);
        config.update(&digest);
        by_name.insert((*name).to_owned(), short(&digest));
    }
    Fingerprints {
        config: short(config.finish().as_ref()),
        hash_key: short(&sha256(&[DOMAIN_KEY, &key_bytes(hash_key)])),
        vips: by_name,
    }
}

/// The key as the data plane holds it (two little-endian words).
fn key_bytes(key: [u64; 2]) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&key[0].to_le_bytes());
    b[8..].copy_from_slice(&key[1].to_le_bytes());
    b
}

/// One VIP's canonical input: key, mode, table size, then its backends in
/// `maglev::build`'s order with their weights reduced.
fn vip_input(v: &VipConfig) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + 24 * v.backends.len());
    push_addr(&mut out, v.addr);
    out.extend_from_slice(&v.port.to_be_bytes());
    out.push(ip_proto(v.protocol));
    out.push(v.raw_mode());
    out.extend_from_slice(&v.table_size.to_be_bytes());
    let mut live: Vec<(IpAddr, u16, u32)> = v
        .backends
        .iter()
        .filter(|b| b.weight > 0)
        .map(|b| (b.addr, b.port, b.weight))
        .collect();
    live.sort_unstable();
    let divisor = live.iter().fold(0, |g, &(_, _, w)| gcd(g, w)).max(1);
    out.extend_from_slice(&(live.len() as u32).to_be_bytes());
    for (addr, port, weight) in live {
        push_addr(&mut out, addr);
        out.extend_from_slice(&port.to_be_bytes());
        out.extend_from_slice(&(weight / divisor).to_be_bytes());
    }
    out
}

/// Family, then 16 bytes (IPv4 in the first 4, as `lb_common::Addr`), so
/// 10.0.0.1 and ::a00:1 differ as they do in `maglev::build`.
fn push_addr(out: &mut Vec<u8>, addr: IpAddr) {
    let mut bytes = [0u8; 16];
    let family = match addr {
        IpAddr::V4(a) => {
            bytes[..4].copy_from_slice(&a.octets());
            lb_common::FAMILY_V4
        }
        IpAddr::V6(a) => {
            bytes = a.octets();
            lb_common::FAMILY_V6
        }
    };
    out.push(family);
    out.extend_from_slice(&bytes);
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut c = Context::new(&SHA256);
    for p in parts {
        c.update(p);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(c.finish().as_ref());
    out
}

fn short(digest: &[u8]) -> Fingerprint {
    let mut f = [0u8; 8];
    f.copy_from_slice(&digest[..8]);
    Fingerprint(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::maglev::{self, MaglevBackend};

    const KEY: [u64; 2] = [0x0001_0203_0405_0607, 0x0809_0a0b_0c0d_0e0f];

    /// A file with VIP "web" on 10.100.0.2:80 holding `backends`
    /// (`(address, weight)`), `extra` lines in the VIP's table, and a
    /// second VIP "api" after it unless `one_vip`.
    fn config(backends: &[(&str, u32)], extra: &str, one_vip: bool) -> Config {
        let mut s = String::from("[daemon]\ninterface = \"eth0\"\nmax_table_size = 65537\n");
        s += &format!("[[vip]]\nname = \"web\"\naddress = \"10.100.0.2\"\nport = 80\n{extra}\n");
        for (addr, weight) in backends {
            s += &format!("[[vip.backend]]\naddress = \"{addr}\"\nweight = {weight}\n");
        }
        if !one_vip {
            s += "[[vip]]\nname = \"api\"\naddress = \"10.100.0.1\"\nport = 80\n\
                  [[vip.backend]]\naddress = \"10.0.0.21\"\n";
        }
        Config::from_str(&s, "xlb.toml").unwrap()
    }

    const THREE: [(&str, u32); 3] = [("10.0.0.11", 1), ("10.0.0.12", 2), ("10.0.0.13", 3)];

    fn fp(c: &Config) -> Fingerprints {
        fingerprints(KEY, &c.vips)
    }

    #[test]
    fn same_tables_give_the_same_fingerprint() {
        let base = fp(&config(&THREE, "", false));
        let reversed: Vec<_> = THREE.iter().rev().copied().collect();
        let cases: Vec<(&str, Config)> = vec![
            ("backends in another order", config(&reversed, "", false)),
            (
                "every weight doubled",
                config(
                    &[("10.0.0.11", 2), ("10.0.0.12", 4), ("10.0.0.13", 6)],
                    "",
                    false,
                ),
            ),
            (
                "a backend of weight 0 added",
                config(&[THREE[0], THREE[1], THREE[2], ("10.0.0.14", 0)], "", false),
            ),
            (
                "health check and down_policy changed",
                config(
                    &THREE,
                    "down_policy = \"keep\"\n[vip.health_check]\nkind = \"tcp\"\n",
                    false,
                ),
            ),
        ];
        for (name, c) in &cases {
            assert_eq!(fp(c), base, "{name}");
        }
        // VIPs in another order: the file lists "api" first.
        let mut swapped = config(&THREE, "", false);
        swapped.vips.reverse();
        assert_eq!(fp(&swapped), base, "VIPs in another order");
    }

    #[test]
    fn a_change_that_moves_flows_changes_it() {
        let base = fp(&config(&THREE, "", false));
        let cases: Vec<(&str, Config)> = vec![
            (
                "a weight changed",
                config(
                    &[("10.0.0.11", 1), ("10.0.0.12", 2), ("10.0.0.13", 4)],
                    "",
                    false,
                ),
            ),
            (
                "a backend added",
                config(&[THREE[0], THREE[1], THREE[2], ("10.0.0.14", 1)], "", false),
            ),
            ("a backend removed", config(&THREE[..2], "", false)),
            (
                "a backend replaced",
                config(&[THREE[0], THREE[1], ("10.0.0.14", 3)], "", false),
            ),
            (
                "table size changed",
                config(&THREE, "table_size = 65521", false),
            ),
            ("mode changed", config(&THREE, "mode = \"dsr-l2\"", false)),
            (
                "protocol changed",
                config(&THREE, "protocol = \"udp\"", false),
            ),
            ("a VIP removed", config(&THREE, "", true)),
        ];
        for (name, c) in &cases {
            let got = fp(c);
            assert_ne!(got.config, base.config, "{name}");
            assert_eq!(
                got.hash_key, base.hash_key,
                "{name}: the key did not change"
            );
            if *name != "a VIP removed" {
                assert_ne!(got.vips["web"], base.vips["web"], "{name}: vip web");
                assert_eq!(got.vips["api"], base.vips["api"], "{name}: vip api");
            }
        }
    }

    #[test]
    fn the_hash_key_changes_the_config_and_key_fingerprints_only() {
        let c = config(&THREE, "", false);
        let a = fingerprints(KEY, &c.vips);
        let b = fingerprints([KEY[0], KEY[1] ^ 1], &c.vips);
        assert_ne!(a.config, b.config);
        assert_ne!(a.hash_key, b.hash_key);
        assert_eq!(a.vips, b.vips, "a VIP's fingerprint leaves the key out");
    }

    #[test]
    fn the_ring_stride_and_names_do_not_change_it() {
        let base = config(&THREE, "table_size = 251", false);
        let mut other = base.clone();
        other.daemon.pinned.max_table_size = 251;
        for v in &mut other.vips {
            v.name.push_str("-renamed");
        }
        assert_eq!(fp(&other).config, fp(&base).config);
    }

    #[test]
    fn the_key_never_appears() {
        let shown = fp(&config(&THREE, "", false));
        let text = format!("{} {} {:?}", shown.config, shown.hash_key, shown.vips);
        for word in KEY {
            for needle in [
                format!("{word:016x}"),
                format!("{:016x}", word.swap_bytes()),
            ] {
                for half in [&needle[..8], &needle[8..]] {
                    assert!(!text.contains(half), "{half} in {text}");
                }
            }
        }
        assert_eq!(shown.config.to_string().len(), 16);
        assert!(
            shown
                .hash_key
                .to_string()
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
    }

    /// The promise itself, against `maglev::build`: over pairs of backend
    /// sets (orders, weight scalings, weight-0 entries, real changes), the
    /// fingerprints are equal exactly when the tables, read as addresses,
    /// are.
    #[test]
    fn equal_fingerprints_iff_equal_tables() {
        const SIZE: u32 = 251;
        let sets: Vec<Vec<(&str, u32)>> = vec![
            vec![("10.0.0.1", 1), ("10.0.0.2", 1), ("10.0.0.3", 1)],
            vec![("10.0.0.3", 5), ("10.0.0.1", 5), ("10.0.0.2", 5)],
            vec![
                ("10.0.0.1", 1),
                ("10.0.0.2", 1),
                ("10.0.0.3", 1),
                ("10.0.0.4", 0),
            ],
            vec![("10.0.0.1", 1), ("10.0.0.2", 1), ("10.0.0.3", 2)],
            vec![("10.0.0.1", 3), ("10.0.0.2", 3), ("10.0.0.3", 6)],
            vec![("10.0.0.1", 1), ("10.0.0.2", 1)],
            vec![("10.0.0.1", 1), ("10.0.0.2", 1), ("10.0.0.4", 1)],
            vec![("10.0.0.1", 2), ("10.0.0.2", 3), ("10.0.0.3", 1)],
            vec![("10.0.0.1", 4), ("10.0.0.2", 6), ("10.0.0.3", 2)],
        ];
        let table = |set: &[(&str, u32)]| -> Vec<Option<IpAddr>> {
            // Ids as another node would give them: in reverse order.
            let backends: Vec<MaglevBackend> = set
                .iter()
                .rev()
                .enumerate()
                .map(|(i, (a, w))| MaglevBackend {
                    id: i as u32 + 1,
                    addr: a.parse().unwrap(),
                    port: 80,
                    weight: *w,
                })
                .collect();
            maglev::build(&backends, SIZE)
                .iter()
                .map(|&id| backends.iter().find(|b| b.id == id).map(|b| b.addr))
                .collect()
        };
        let fps: Vec<Fingerprint> = sets
            .iter()
            .map(|s| {
                let c = config(s, &format!("table_size = {SIZE}"), true);
                fingerprints(KEY, &c.vips).config
            })
            .collect();
        for (i, a) in sets.iter().enumerate() {
            for (j, b) in sets.iter().enumerate() {
                assert_eq!(
                    fps[i] == fps[j],
                    table(a) == table(b),
                    "sets {i} {a:?} and {j} {b:?}"
                );
            }
        }
    }
}
