//! Property tests of [`Config::from_str`], which reads a file an operator
//! (or anyone who can write it) wrote: arbitrary text, TOML built from the
//! configuration's own sections and keys with arbitrary values, and
//! mutations of the committed corpus (`tests/fuzz-corpus/config/`) never
//! panic and always give a verdict (a configuration, or errors that each
//! name the file); and a valid configuration generated from its parts is
//! read back with exactly those parts.

use std::net::IpAddr;

use proptest::prelude::*;

use super::{Config, MAX_WEIGHT, Mode, Protocol};

const ORIGIN: &str = "fuzz.toml";

fn corpus() -> Vec<String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fuzz-corpus/config");
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    let texts: Vec<String> = paths
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert!(!texts.is_empty(), "{dir}: no files");
    texts
}

/// Never a panic; an error names the file on every line.
fn check(text: &str) -> Result<(), TestCaseError> {
    match Config::from_str(text, ORIGIN) {
        Ok(c) => prop_assert!(!c.daemon.pinned.interface.is_empty()),
        Err(e) => {
            prop_assert!(!e.problems.is_empty(), "an error without a problem");
            for p in &e.problems {
                prop_assert!(p.starts_with(ORIGIN), "problem without the file: {:?}", p);
            }
        }
    }
    Ok(())
}

fn section() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "[daemon]",
        "[health_check]",
        "[protection]",
        "[guard]",
        "[[guard.deny]]",
        "[[guard.allow]]",
        "[[vip]]",
        "[vip.health_check]",
        "[vip.protection]",
        "[vip.guard]",
        "[[vip.guard.deny]]",
        "[[vip.backend]]",
        "[vip.backend.health_check]",
    ])
}

fn key() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "interface",
        "instance",
        "control_socket",
        "metrics_address",
        "conntrack_size",
        "udp_timeout",
        "max_table_size",
        "xdp_mode",
        "probe_concurrency",
        "reply_rate",
        "name",
        "address",
        "port",
        "protocol",
        "mode",
        "down_policy",
        "table_size",
        "host_services",
        "weight",
        "health_port",
        "max_flows",
        "kind",
        "path",
        "expect_status",
        "interval",
        "timeout",
        "rise",
        "fall",
        "slow_start",
        "prefix",
        "action",
        "reason",
        "new_flows_per_source",
        "ct_insert_cap",
        "body_contains",
        "method",
        "host",
        "reuse_connection",
        "reopen_every",
        "dns_name",
        "dns_type",
        "dns_rcodes",
        "unknown",
    ])
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        (0u64..70_000).prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        any::<bool>().prop_map(|b| b.to_string()),
        prop::sample::select(vec![
            "\"eth0\"",
            "\"10.100.0.1\"",
            "\"fd00::1\"",
            "\"10.0.0.0/8\"",
            "\"2s\"",
            "\"0s\"",
            "\"1.5s\"",
            "\"50/s\"",
            "\"tcp\"",
            "\"udp\"",
            "\"http\"",
            "\"dns\"",
            "[\"NOERROR\", \"servfail\"]",
            "\"dsr-ipip\"",
            "\"dsr-l2\"",
            "\"keep\"",
            "\"rehash\"",
            "\"reset\"",
            "\"drop\"",
            "\"/healthz\"",
            "[\"200-299\", \"404\"]",
            "[]",
            "{}",
            "{ rate = \"5/s\", burst = 1 }",
            "\"\"",
        ])
        .prop_map(str::to_owned),
        "\"[^\"\\\\\\n]{0,16}\"",
    ]
}

/// A file of the configuration's sections, each with a few keys.
fn toml_shaped() -> impl Strategy<Value = String> {
    prop::collection::vec(
        (section(), prop::collection::vec((key(), value()), 0..5)),
        0..8,
    )
    .prop_map(|sections| {
        let mut text = String::from("[daemon]\ninterface = \"eth0\"\n");
        for (name, keys) in sections {
            if name != "[daemon]" {
                text.push_str(name);
                text.push('\n');
            }
            for (k, v) in keys {
                text.push_str(&format!("{k} = {v}\n"));
            }
        }
        text
    })
}

/// A corpus file with lines dropped, repeated or changed.
fn mutated() -> impl Strategy<Value = String> {
    (
        prop::sample::select(corpus()),
        prop::collection::vec((any::<prop::sample::Index>(), 0..4u8, value()), 1..5),
    )
        .prop_map(|(text, edits)| {
            let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
            for (at, kind, v) in edits {
                if lines.is_empty() {
                    break;
                }
                let i = at.index(lines.len());
                match kind {
                    0 => {
                        lines.remove(i);
                    }
                    1 => lines.insert(i, lines[i].clone()),
                    2 => {
                        // Keep the key, change the value.
                        if let Some((k, _)) = lines[i].split_once('=') {
                            lines[i] = format!("{k}= {v}");
                        }
                    }
                    _ => {
                        let cut = lines[i].len() / 2;
                        let cut = (0..=cut).rev().find(|&c| lines[i].is_char_boundary(c));
                        lines[i].truncate(cut.unwrap_or(0));
                    }
                }
            }
            lines.join("\n")
        })
}

/// A valid VIP: its parts, written as TOML by [`vip_toml`].
#[derive(Clone, Debug)]
struct Vip {
    addr: IpAddr,
    port: u16,
    udp: bool,
    l2: bool,
    table_size: u32,
    /// Host parts of the backends (distinct), with weights.
    backends: Vec<(u8, u32)>,
}

fn vip() -> impl Strategy<Value = Vip> {
    (
        any::<bool>(),
        1u16..,
        any::<bool>(),
        any::<bool>(),
        prop::sample::select(vec![13u32, 251, 1009, 65537]),
        prop::collection::btree_map(1u8..=254, 0..=MAX_WEIGHT, 0..6),
    )
        .prop_map(|(v6, port, udp, l2, table_size, backends)| Vip {
            addr: if v6 {
                "fd00:100::1".parse().unwrap()
            } else {
                "10.100.0.1".parse().unwrap()
            },
            port,
            udp,
            l2,
            table_size,
            backends: backends.into_iter().collect(),
        })
}

fn backend_addr(vip: &Vip, host: u8) -> IpAddr {
    if vip.addr.is_ipv6() {
        format!("fd00::{host:x}").parse().unwrap()
    } else {
        format!("10.0.0.{host}").parse().unwrap()
    }
}

fn vip_toml(i: usize, v: &Vip) -> String {
    let mut t = format!(
        "[[vip]]\nname = \"vip-{i}\"\naddress = \"{}\"\nport = {}\nprotocol = \"{}\"\n\
         mode = \"{}\"\ntable_size = {}\n",
        v.addr,
        v.port,
        if v.udp { "udp" } else { "tcp" },
        if v.l2 { "dsr-l2" } else { "dsr-ipip" },
        v.table_size
    );
    if v.udp {
        t.push_str("[vip.health_check]\nkind = \"tcp\"\n");
    }
    for &(host, weight) in &v.backends {
        t.push_str(&format!(
            "[[vip.backend]]\naddress = \"{}\"\nweight = {weight}\n",
            backend_addr(v, host)
        ));
    }
    t
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn arbitrary_text_gets_a_verdict(text in ".{0,300}") {
        check(&text)?;
    }

    #[test]
    fn toml_shaped_text_gets_a_verdict(text in toml_shaped()) {
        check(&text)?;
    }

    #[test]
    fn mutated_corpus_gets_a_verdict(text in mutated()) {
        check(&text)?;
    }

    /// Distinct VIPs (each on its own port) are read back as written.
    #[test]
    fn valid_configurations_read_back(vips in prop::collection::btree_map(1u16.., vip(), 1..4)) {
        let vips: Vec<Vip> = vips
            .into_iter()
            .map(|(port, v)| Vip { port, ..v })
            .collect();
        let mut text = String::from("[daemon]\ninterface = \"eth0\"\n");
        for (i, v) in vips.iter().enumerate() {
            text.push_str(&vip_toml(i, v));
        }
        let c = Config::from_str(&text, ORIGIN)
            .map_err(|e| TestCaseError::fail(format!("{e}\nfor:\n{text}")))?;
        prop_assert_eq!(c.vips.len(), vips.len());
        for (i, (got, want)) in c.vips.iter().zip(&vips).enumerate() {
            prop_assert_eq!(&got.name, &format!("vip-{i}"));
            prop_assert_eq!(got.addr, want.addr);
            prop_assert_eq!(got.port, want.port);
            let proto = if want.udp { Protocol::Udp } else { Protocol::Tcp };
            prop_assert_eq!(got.protocol, proto);
            let mode = if want.l2 { Mode::DsrL2 } else { Mode::DsrIpip };
            prop_assert_eq!(got.mode, mode);
            prop_assert_eq!(got.table_size, want.table_size);
            let backends: Vec<(IpAddr, u16, u32)> =
                got.backends.iter().map(|b| (b.addr, b.port, b.weight)).collect();
            let expected: Vec<(IpAddr, u16, u32)> = want
                .backends
                .iter()
                .map(|&(h, w)| (backend_addr(want, h), want.port, w))
                .collect();
            prop_assert_eq!(backends, expected);
        }
    }
}

/// Every corpus file, as it is.
#[test]
fn corpus_files_get_a_verdict() {
    for text in corpus() {
        check(&text).unwrap_or_else(|e| panic!("{e}\nfor:\n{text}"));
    }
}
