//! `xlb decap`: its arguments, its small configuration file, and the
//! settings both resolve to (checked here; `crate::decap` does the I/O).
//!
//! ```toml
//! interface = "eth0"
//! allow_source = ["10.99.0.2", "fd00:99::2"]   # the LBs' encapsulation sources
//! vips = ["10.100.0.1", "fd00:100::1"]         # VIP addresses this backend serves
//! # addresses = ["10.99.0.11"]                 # outer destinations; default: the interface's
//! ```

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::guard::Prefix;

/// On a backend: decapsulate dsr-ipip traffic in XDP.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct DecapArgs {
    /// Interface that receives the encapsulated traffic (or `interface` in
    /// --config).
    #[arg(long, short, value_name = "IF")]
    pub interface: Option<String>,
    /// Outer destination to accept (repeatable); default: every address
    /// of the interface.
    #[arg(long = "address", value_name = "ADDR")]
    pub addresses: Vec<IpAddr>,
    /// Outer source to accept: an address or prefix the load balancers
    /// encapsulate from (repeatable; at least one, here or in --config).
    #[arg(long = "allow-source", value_name = "PREFIX", value_parser = parse_prefix)]
    pub allow_sources: Vec<Prefix>,
    /// Inner destination to accept: a VIP address this backend serves
    /// (repeatable; at least one, here or in --config).
    #[arg(long = "vip", value_name = "ADDR")]
    pub vips: Vec<IpAddr>,
    /// Second chance (default on): a load balancer's tunnel inside the
    /// tunnel (a packet that missed its conntrack) is kept when this host
    /// has the connection and relayed to the slot's previous owner
    /// otherwise; `off` drops such packets (or `second_chance = false` in
    /// --config). Relaying needs forwarding on the interface.
    #[arg(long = "second-chance", value_name = "on|off", value_parser = parse_on_off)]
    pub second_chance: Option<bool>,
    /// TOML file with `interface`, `allow_source = [...]`, `vips = [...]`
    /// (and optionally `addresses = [...]`); arguments add to it, and
    /// --interface replaces its interface.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Logs on stderr as text (colour only on a terminal) or JSON (one
    /// object per line).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t)]
    pub log_format: crate::logging::LogFormat,
}

/// What `xlb decap` runs with, every field checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecapSettings {
    pub interface: String,
    /// Outer destinations; empty: every address of the interface.
    pub addresses: Vec<IpAddr>,
    /// Outer sources accepted (sorted, no duplicates).
    pub allow_sources: Vec<Prefix>,
    /// Inner destinations accepted (sorted, no duplicates).
    pub vips: Vec<IpAddr>,
    /// Second chance: relay a load balancer's double tunnel.
    pub second_chance: bool,
}

/// The configuration file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecapFile {
    interface: Option<String>,
    #[serde(default)]
    addresses: Vec<String>,
    #[serde(default)]
    allow_source: Vec<String>,
    #[serde(default)]
    vips: Vec<String>,
    second_chance: Option<bool>,
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?}: write on or off")),
    }
}

fn parse_prefix(s: &str) -> Result<Prefix, String> {
    s.parse::<Prefix>().map_err(|e| e.to_string())
}

fn parse_addr(s: &str, what: &str) -> Result<IpAddr, String> {
    s.trim().parse().map_err(|_| {
        format!("{s:?} is not an IP address; write the {what}, e.g. \"10.100.0.1\" or \"fd00::1\"")
    })
}

impl DecapArgs {
    /// The settings: the file (if any) read, the arguments added to it.
    pub fn settings(&self) -> Result<DecapSettings, String> {
        let text = match &self.config {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| format!("reading {}: {e}", path.display()))?,
            ),
            None => None,
        };
        self.resolve(self.config.as_deref().zip(text.as_deref()))
    }

    /// [`Self::settings`] with the file's `(path, text)` already read.
    fn resolve(&self, file: Option<(&Path, &str)>) -> Result<DecapSettings, String> {
        let (raw, name) = match file {
            Some((path, text)) => (
                toml::from_str::<DecapFile>(text)
                    .map_err(|e| format!("{}: {}", path.display(), e.message()))?,
                path.display().to_string(),
            ),
            None => (DecapFile::default(), String::new()),
        };
        let at = |key: &str, i: usize| format!("{name}: {key}[{i}]");
        let mut addresses = self.addresses.clone();
        for (i, a) in raw.addresses.iter().enumerate() {
            let addr = parse_addr(a, "tunnel endpoint (an address of this host)");
            addresses.push(addr.map_err(|e| format!("{}: {e}", at("addresses", i)))?);
        }
        let mut allow_sources = self.allow_sources.clone();
        for (i, p) in raw.allow_source.iter().enumerate() {
            allow_sources
                .push(parse_prefix(p).map_err(|e| format!("{}: {e}", at("allow_source", i)))?);
        }
        let mut vips = self.vips.clone();
        for (i, v) in raw.vips.iter().enumerate() {
            vips.push(parse_addr(v, "VIP address").map_err(|e| format!("{}: {e}", at("vips", i)))?);
        }
        let Some(interface) = self.interface.clone().or(raw.interface) else {
            return Err(
                "no interface: pass --interface IF (or interface = \"IF\" in --config FILE)"
                    .to_owned(),
            );
        };
        if allow_sources.is_empty() {
            return Err(
                "no allowed source: pass --allow-source PREFIX for each load balancer, the \
                 address (or encap_source_v4_prefix) it encapsulates from, e.g. --allow-source \
                 10.0.0.2 --allow-source fd00::2 (or allow_source = [...] in --config FILE); \
                 tunnels from any other source are dropped"
                    .to_owned(),
            );
        }
        if vips.is_empty() {
            return Err(
                "no VIP: pass --vip ADDR for each VIP address this backend serves, e.g. --vip \
                 10.100.0.1 (or vips = [...] in --config FILE); tunnels to any other inner \
                 destination are dropped"
                    .to_owned(),
            );
        }
        allow_sources.sort();
        allow_sources.dedup();
        vips.sort();
        vips.dedup();
        addresses.dedup();
        Ok(DecapSettings {
            interface,
            addresses,
            allow_sources,
            vips,
            second_chance: self.second_chance.or(raw.second_chance).unwrap_or(true),
        })
    }
}

impl DecapSettings {
    /// What the operator should know before traffic is dropped: a VIP
    /// family no allowed source can reach (IPIP stays within a family), and
    /// a source prefix that lets everyone in.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (v4, family, tunnel) in [(true, "IPv4", "IPIP"), (false, "IPv6", "IP6IP6")] {
            let vips: Vec<String> = self
                .vips
                .iter()
                .filter(|v| v.is_ipv4() == v4)
                .map(ToString::to_string)
                .collect();
            if !vips.is_empty() && !self.allow_sources.iter().any(|p| p.is_ipv4() == v4) {
                out.push(format!(
                    "{family} VIPs ({}) but no {family} --allow-source: every {tunnel} packet \
                     to them is dropped (drop_source)",
                    vips.join(", ")
                ));
            }
        }
        for p in self.allow_sources.iter().filter(|p| p.len == 0) {
            out.push(format!(
                "--allow-source {p} accepts tunnels from anyone who can reach this host; give \
                 the load balancers' addresses instead"
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    fn args(a: &[&str]) -> Result<DecapArgs, String> {
        let cli = Cli::try_parse_from(["xlb", "decap"].iter().chain(a).copied())
            .map_err(|e| e.to_string())?;
        match cli.command {
            Command::Decap(d) => Ok(d),
            other => panic!("{other:?}"),
        }
    }

    fn settings(a: &[&str], file: Option<&str>) -> Result<DecapSettings, String> {
        args(a)?.resolve(file.map(|t| (Path::new("decap.toml"), t)))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn pfx(s: &str) -> Prefix {
        s.parse().unwrap()
    }

    #[test]
    fn arguments_resolve() {
        let s = settings(
            &[
                "-i",
                "eth0",
                "--address",
                "10.0.0.5",
                "--allow-source",
                "10.0.0.0/24",
                "--allow-source",
                "fd00::2",
                "--vip",
                "10.100.0.1",
                "--vip",
                "fd00:100::1",
                "--vip",
                "10.100.0.1",
            ],
            None,
        )
        .unwrap();
        assert_eq!(
            s,
            DecapSettings {
                interface: "eth0".into(),
                addresses: vec![ip("10.0.0.5")],
                allow_sources: vec![pfx("10.0.0.0/24"), pfx("fd00::2")],
                vips: vec![ip("10.100.0.1"), ip("fd00:100::1")],
                second_chance: true,
            }
        );
        assert!(s.warnings().is_empty(), "{:?}", s.warnings());
    }

    #[test]
    fn file_and_arguments_add_up() {
        let file = r#"
            interface = "eth1"
            allow_source = ["10.99.0.2"]
            vips = ["10.100.0.1"]
            addresses = ["10.99.0.11"]
        "#;
        let s = settings(
            &["--config", "decap.toml", "--vip", "10.100.0.2"],
            Some(file),
        )
        .unwrap();
        assert_eq!(s.interface, "eth1");
        assert_eq!(s.allow_sources, vec![pfx("10.99.0.2")]);
        assert_eq!(s.vips, vec![ip("10.100.0.1"), ip("10.100.0.2")]);
        assert_eq!(s.addresses, vec![ip("10.99.0.11")]);
        let s = settings(&["--config", "decap.toml", "-i", "eth9"], Some(file)).unwrap();
        assert_eq!(s.interface, "eth9", "--interface replaces the file's");
    }

    #[test]
    fn second_chance_is_on_unless_turned_off() {
        let base = [
            "-i",
            "eth0",
            "--allow-source",
            "10.0.0.2",
            "--vip",
            "10.100.0.1",
        ];
        let with = |extra: &[&str], file: Option<&str>| {
            let a: Vec<&str> = base.iter().chain(extra).copied().collect();
            settings(&a, file).map(|s| s.second_chance)
        };
        assert_eq!(with(&[], None), Ok(true));
        assert_eq!(with(&["--second-chance", "off"], None), Ok(false));
        assert_eq!(with(&["--second-chance", "on"], None), Ok(true));
        let off = "second_chance = false";
        assert_eq!(with(&["--config", "decap.toml"], Some(off)), Ok(false));
        assert_eq!(
            with(
                &["--config", "decap.toml", "--second-chance", "on"],
                Some(off)
            ),
            Ok(true),
            "the argument overrides the file"
        );
        let err = with(&["--second-chance", "maybe"], None).unwrap_err();
        assert!(
            err.contains(
                "invalid value 'maybe' for '--second-chance <on|off>': \"maybe\": write on or off"
            ),
            "{err}"
        );
    }

    #[test]
    fn missing_or_bad_settings_are_explained() {
        let base = [
            "-i",
            "eth0",
            "--allow-source",
            "10.0.0.2",
            "--vip",
            "10.100.0.1",
        ];
        let cases: &[(&str, Vec<&str>, Option<&str>, &str)] = &[
            (
                "no allowed source",
                vec!["-i", "eth0", "--vip", "10.100.0.1"],
                None,
                "no allowed source: pass --allow-source PREFIX",
            ),
            (
                "no vip",
                vec!["-i", "eth0", "--allow-source", "10.0.0.2"],
                None,
                "no VIP: pass --vip ADDR",
            ),
            (
                "no interface",
                vec!["--allow-source", "10.0.0.2", "--vip", "10.100.0.1"],
                None,
                "no interface: pass --interface IF",
            ),
            (
                "host bits",
                vec![
                    "-i",
                    "eth0",
                    "--allow-source",
                    "10.0.0.2/24",
                    "--vip",
                    "10.100.0.1",
                ],
                None,
                "has host bits set; write \"10.0.0.0/24\"",
            ),
            (
                "bad vip",
                vec![
                    "-i",
                    "eth0",
                    "--allow-source",
                    "10.0.0.2",
                    "--vip",
                    "10.100.0.300",
                ],
                None,
                "invalid IP address syntax",
            ),
            (
                "bad address",
                vec!["-i", "eth0", "--address", "10.0.0.300"],
                None,
                "invalid IP address syntax",
            ),
            (
                "file prefix",
                base.to_vec(),
                Some("allow_source = [\"10.0.0.2\", \"10.0.0.0/33\"]"),
                "decap.toml: allow_source[1]: \"10.0.0.0/33\": prefix length 33 is over 32",
            ),
            (
                "file vip",
                base.to_vec(),
                Some("vips = [\"api\"]"),
                "decap.toml: vips[0]: \"api\" is not an IP address; write the VIP address",
            ),
            (
                "file typo",
                base.to_vec(),
                Some("allow_sources = [\"10.0.0.2\"]"),
                "decap.toml: unknown field `allow_sources`",
            ),
        ];
        for (name, a, file, want) in cases {
            let err = settings(a, *file).expect_err(name);
            assert!(err.contains(want), "{name}: {want:?} not in {err}");
        }
    }

    #[test]
    fn a_vip_family_without_a_source_and_an_open_prefix_are_warned() {
        let s = settings(
            &[
                "-i",
                "e",
                "--allow-source",
                "0.0.0.0/0",
                "--vip",
                "fd00::1",
                "--vip",
                "10.0.0.1",
            ],
            None,
        )
        .unwrap();
        let w = s.warnings();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].contains("IPv6 VIPs (fd00::1) but no IPv6 --allow-source"),
            "{w:?}"
        );
        assert!(w[1].contains("accepts tunnels from anyone"), "{w:?}");
    }
}
