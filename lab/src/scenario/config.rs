//! The xlb configuration a lab runs, rendered as TOML ([`XlbConfig`]), and
//! the settings read back from a configuration text.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

/// Transport protocol of a VIP (`vip.protocol`): the control protocol's,
/// spelled as the configuration spells it.
pub use lb_ctl::Protocol;
use lb_ctl::{DEFAULT_CONTROL_SOCKET, DEFAULT_INSTANCE};

use crate::topology::{self, HOST_IFNAME};

/// Forwarding mode of a VIP, spelled as in xlb's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    DsrIpip,
    DsrL2,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::DsrIpip => "dsr-ipip",
            Mode::DsrL2 => "dsr-l2",
        }
    }

    /// The other mode (for a lab that shows both).
    pub fn other(self) -> Mode {
        match self {
            Mode::DsrIpip => Mode::DsrL2,
            Mode::DsrL2 => Mode::DsrIpip,
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "dsr-ipip" => Ok(Mode::DsrIpip),
            "dsr-l2" => Ok(Mode::DsrL2),
            _ => Err(format!("unknown mode {s:?}; use dsr-ipip or dsr-l2")),
        }
    }
}

/// The health-check settings the lab varies (`[health_check]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    /// `"http"` or `"tcp"`.
    pub kind: String,
    pub interval: Duration,
    pub timeout: Duration,
    /// Also used as `fast_interval` and `down_interval`, so that detection
    /// and recovery times follow from `interval` alone.
    pub rise: u32,
    pub fall: u32,
    /// `hang_timeout`: how long a probe may go on past `timeout` before it
    /// counts as no response. `None`: not written (xlb's default).
    pub hang_timeout: Option<Duration>,
    /// Write only `kind` (and `hang_timeout` when set), leaving every other
    /// key to xlb's defaults; see [`Health::xlb_defaults`].
    pub xlb_defaults: bool,
}

impl Health {
    /// xlb's own defaults: only `kind = "http"` is written. The fields hold
    /// the values xlb then uses (interval 2 s, timeout 1 s, rise 2, fall 3;
    /// also `fast_interval` 500 ms, `down_interval` 5 s and 10 % jitter,
    /// which the fields do not show), so tests can compute bounds.
    pub fn xlb_defaults() -> Self {
        Self {
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            rise: 2,
            fall: 3,
            xlb_defaults: true,
            ..Self::default()
        }
    }
}

impl Default for Health {
    /// HTTP `/health` every 500 ms, 500 ms timeout, rise 2, fall 2: the
    /// tests' settings, fast enough to keep each test short.
    fn default() -> Self {
        Self {
            kind: "http".to_string(),
            interval: Duration::from_millis(500),
            timeout: Duration::from_millis(500),
            rise: 2,
            fall: 2,
            hang_timeout: None,
            xlb_defaults: false,
        }
    }
}

/// A count or a share of a VIP's backends (`max_ejected`, `min_healthy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// Written as a bare integer: `min_healthy = 2`.
    Count(u32),
    /// Written as a string: `max_ejected = "10%"`.
    Percent(u32),
}

impl Share {
    fn toml(self) -> String {
        match self {
            Share::Count(n) => n.to_string(),
            Share::Percent(p) => format!("\"{p}%\""),
        }
    }
}

/// The cascade protections of a `[protection]` table (global) or a
/// `[vip.protection]` table (per VIP, merged with the global one field by
/// field). Only the fields that are set are written; xlb's defaults apply
/// to the rest.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Protection {
    /// Most backends out as slow outliers at once.
    pub max_ejected: Option<Share>,
    /// Fewer backends than this in the table: panic (0 disables).
    pub min_healthy: Option<Share>,
    /// An outlier's latency is more than this × its peers' median...
    pub outlier_factor: Option<f64>,
    /// ...and more than the median + this.
    pub outlier_margin: Option<Duration>,
    /// Weight ramp of a backend that enters the table (0: off).
    pub slow_start: Option<Duration>,
    pub flap_damping: Option<bool>,
    pub flap_half_life: Option<Duration>,
    pub flap_limit: Option<u32>,
}

impl Protection {
    /// The protections switched off as far as configuration allows: no
    /// panic (`min_healthy = 0`), no flap damping. With `hang_timeout =
    /// timeout` this is the behaviour before issue 7.
    pub fn off() -> Self {
        Self {
            min_healthy: Some(Share::Count(0)),
            flap_damping: Some(false),
            ..Self::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `key = value` lines for the fields that are set.
    fn render_keys(&self) -> String {
        let ms = |d: Duration| format!("\"{}ms\"", d.as_millis());
        let mut out = String::new();
        let mut line = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                out.push_str(&format!("{k} = {v}\n"));
            }
        };
        line("max_ejected", self.max_ejected.map(Share::toml));
        line("min_healthy", self.min_healthy.map(Share::toml));
        // `{:?}` keeps the decimal point TOML needs for a float (3.0).
        line(
            "outlier_factor",
            self.outlier_factor.map(|f| format!("{f:?}")),
        );
        line("outlier_margin", self.outlier_margin.map(ms));
        line("slow_start", self.slow_start.map(ms));
        line("flap_damping", self.flap_damping.map(|b| b.to_string()));
        line("flap_half_life", self.flap_half_life.map(ms));
        line("flap_limit", self.flap_limit.map(|n| n.to_string()));
        out
    }
}

/// One `[[vip]]` of a lab configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Vip {
    pub name: String,
    pub address: IpAddr,
    pub port: u16,
    pub mode: Mode,
    /// Backend numbers (1-based); their v4 or v6 address per the VIP's family.
    pub backends: Vec<usize>,
    /// `[vip.protection]`, written when set and not empty.
    pub protection: Option<Protection>,
    /// The body of `[vip.guard]` (abuse control), TOML lines written as
    /// they are, e.g. `new_flows_per_source = { rate = "50/s", burst = 50 }`;
    /// a `[[vip.guard.deny]]` table may follow them. `None`: not written.
    pub guard: Option<String>,
    /// `protocol`; written only when UDP.
    pub protocol: Protocol,
    /// `health_port` of every backend, when set (a UDP VIP's backends are
    /// probed over HTTP on another port, e.g. 80).
    pub health_port: Option<u16>,
    /// `weight` of the backends listed (by number); the others are not
    /// given one (xlb's default, 1).
    pub weights: BTreeMap<usize, u32>,
}

impl Vip {
    pub fn new(name: &str, address: IpAddr, port: u16, mode: Mode, backends: usize) -> Self {
        Self {
            name: name.to_string(),
            address,
            port,
            mode,
            backends: (1..=backends).collect(),
            protection: None,
            guard: None,
            protocol: Protocol::Tcp,
            health_port: None,
            weights: BTreeMap::new(),
        }
    }

    /// A UDP VIP whose backends are probed over HTTP on `health_port`.
    pub fn udp(
        name: &str,
        address: IpAddr,
        port: u16,
        mode: Mode,
        backends: usize,
        health_port: u16,
    ) -> Self {
        Self {
            protocol: Protocol::Udp,
            health_port: Some(health_port),
            ..Self::new(name, address, port, mode, backends)
        }
    }

    /// Where a client connects.
    pub fn target(&self) -> SocketAddr {
        SocketAddr::new(self.address, self.port)
    }

    /// The `address:port` xlb shows for backend `i` of this VIP.
    pub fn backend_addr(&self, i: usize) -> SocketAddr {
        backend_addr(self.address, self.port, i)
    }
}

/// Backend `i`'s address in the family of `vip`, with `port`.
pub fn backend_addr(vip: IpAddr, port: u16, i: usize) -> SocketAddr {
    let ip: IpAddr = match vip {
        IpAddr::V4(_) => topology::backend_v4(i).into(),
        IpAddr::V6(_) => topology::backend_v6(i).into(),
    };
    SocketAddr::new(ip, port)
}

/// A configuration file for xlb in a lab, rendered by [`XlbConfig::render`].
#[derive(Debug, Clone, PartialEq)]
pub struct XlbConfig {
    pub instance: String,
    pub control_socket: PathBuf,
    /// `"native"` (works on veth) or `"generic"`.
    pub xdp_mode: String,
    /// `daemon.conntrack_size`: entries of the conntrack LRU
    /// ([`LAB_CONNTRACK_SIZE`] by default; the abuse tests make it small).
    pub conntrack_size: u32,
    /// `daemon.udp_timeout`; `None`: not written (xlb's default, 30 s).
    pub udp_timeout: Option<Duration>,
    pub health: Health,
    /// `[protection]`, written when not empty.
    pub protection: Protection,
    /// The body of `[guard]` (abuse control, every VIP's defaults), TOML
    /// lines written as they are. `None`: not written.
    pub guard: Option<String>,
    pub vips: Vec<Vip>,
}

/// The instance name `cargo xtask lab` and the tests use for a prefix:
/// `lab-<prefix>`, lowercased (instances allow only `[a-z0-9_-]`).
pub fn instance_for(prefix: &str) -> String {
    format!("lab-{}", prefix.to_ascii_lowercase())
}

/// The control socket `cargo xtask lab` and the tests use for a prefix.
pub fn socket_for(prefix: &str) -> PathBuf {
    PathBuf::from(format!("/run/xlb/lab-{prefix}.sock"))
}

impl XlbConfig {
    /// Instance and socket named after `prefix`, test health settings, and
    /// one VIP: `api`, 10.100.0.1:80, dsr-ipip, backends b1..b3.
    pub fn for_prefix(prefix: &str) -> Self {
        Self {
            instance: instance_for(prefix),
            control_socket: socket_for(prefix),
            xdp_mode: "native".to_string(),
            conntrack_size: LAB_CONNTRACK_SIZE,
            udp_timeout: None,
            health: Health::default(),
            protection: Protection::default(),
            guard: None,
            vips: vec![Vip::new(
                "api",
                topology::VIP_V4.into(),
                80,
                Mode::DsrIpip,
                3,
            )],
        }
    }

    /// What `cargo xtask lab up --mode M` runs: `api` (10.100.0.1:80) and
    /// `api6` ([fd00:100::1]:80) in mode `M`, `api2` (10.100.0.2:80) in the
    /// other mode, all on every backend, with 1 s probes.
    pub fn lab_default(prefix: &str, mode: Mode, backends: usize) -> Self {
        Self {
            health: Health {
                interval: Duration::from_secs(1),
                timeout: Duration::from_secs(1),
                ..Health::default()
            },
            vips: vec![
                Vip::new("api", topology::VIP_V4.into(), 80, mode, backends),
                Vip::new("api6", topology::VIP_V6.into(), 80, mode, backends),
                Vip::new("api2", topology::VIP2_V4.into(), 80, mode.other(), backends),
            ],
            ..Self::for_prefix(prefix)
        }
    }

    pub fn vip(&self, name: &str) -> Option<&Vip> {
        self.vips.iter().find(|v| v.name == name)
    }

    /// The TOML text.
    pub fn render(&self) -> String {
        let ms = |d: Duration| format!("\"{}ms\"", d.as_millis());
        let h = &self.health;
        let mut out = format!(
            "# Written by xlb_lab::scenario for a namespaced lab.\n\
             [daemon]\n\
             interface = \"{HOST_IFNAME}\"\n\
             xdp_mode = \"{}\"\n\
             instance = \"{}\"\n\
             control_socket = \"{}\"\n\
             metrics_address = \"\"\n\
             # Small maps: a lab has a handful of flows, and each test builds them anew.\n\
             conntrack_size = {}\n\
             max_table_size = {LAB_TABLE_SIZE}\n\
             \n\
             [health_check]\n\
             kind = \"{}\"\n",
            self.xdp_mode,
            self.instance,
            self.control_socket.display(),
            self.conntrack_size,
            h.kind,
        );
        if let Some(t) = self.udp_timeout {
            // Before `[health_check]`: the key belongs to `[daemon]`.
            let at = out.find("\n[health_check]").unwrap_or(out.len());
            out.insert_str(at, &format!("udp_timeout = {}\n", ms(t)));
        }
        if !h.xlb_defaults {
            out.push_str(&format!(
                "interval = {}\n\
                 timeout = {}\n\
                 fast_interval = {}\n\
                 down_interval = {}\n\
                 rise = {}\n\
                 fall = {}\n\
                 jitter = 0\n",
                ms(h.interval),
                ms(h.timeout),
                ms(h.interval),
                ms(h.interval),
                h.rise,
                h.fall,
            ));
        }
        if let Some(hang) = h.hang_timeout {
            out.push_str(&format!("hang_timeout = {}\n", ms(hang)));
        }
        if !self.protection.is_empty() {
            out.push_str("\n[protection]\n");
            out.push_str(&self.protection.render_keys());
        }
        if let Some(g) = &self.guard {
            out.push_str("\n[guard]\n");
            out.push_str(&with_newline(g));
        }
        for v in &self.vips {
            out.push_str(&v.render());
        }
        out
    }
}

impl Vip {
    /// The `[[vip]]` table with its protection, guard and backends.
    fn render(&self) -> String {
        let mut out = format!(
            "\n[[vip]]\nname = \"{}\"\naddress = \"{}\"\nport = {}\nmode = \"{}\"\n",
            self.name,
            self.address,
            self.port,
            self.mode.as_str()
        );
        if self.protocol != Protocol::Tcp {
            out.push_str(&format!("protocol = \"{}\"\n", self.protocol.as_str()));
        }
        if let Some(p) = self.protection.as_ref().filter(|p| !p.is_empty()) {
            out.push_str("\n[vip.protection]\n");
            out.push_str(&p.render_keys());
        }
        if let Some(g) = &self.guard {
            out.push_str("\n[vip.guard]\n");
            out.push_str(&with_newline(g));
        }
        for &i in &self.backends {
            out.push_str(&format!(
                "\n[[vip.backend]]\naddress = \"{}\"\n",
                self.backend_addr(i).ip()
            ));
            if let Some(port) = self.health_port {
                out.push_str(&format!("health_port = {port}\n"));
            }
            if let Some(w) = self.weights.get(&i) {
                out.push_str(&format!("weight = {w}\n"));
            }
        }
        out
    }
}

/// `text` ending in exactly one newline.
fn with_newline(text: &str) -> String {
    format!("{}\n", text.trim_end())
}

/// `daemon.conntrack_size` of lab configurations unless a test asks for
/// another.
pub const LAB_CONNTRACK_SIZE: u32 = 65536;

/// `daemon.max_table_size` of lab configurations: a prime ≥ 10 × the lab's
/// backends per VIP, and small, so that maps are quick to build.
pub const LAB_TABLE_SIZE: u32 = 1009;

/// The value of `key` in the top-level table `[table]` of a TOML text: a
/// string as it is (`"1s"` → `1s`), anything else as TOML writes it (`2` →
/// `2`). `None` when absent, or when the text is not TOML (xlb itself says
/// what is wrong with it).
pub fn setting(config: &str, table: &str, key: &str) -> Option<String> {
    let doc: toml::Table = config.parse().ok()?;
    match doc.get(table)?.get(key)? {
        toml::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// The instance and control socket a configuration names (xlb's defaults
/// when absent).
pub fn instance_and_socket(config: &str) -> (String, PathBuf) {
    let daemon = |key: &str, default: &str| {
        setting(config, "daemon", key).unwrap_or_else(|| default.to_string())
    };
    (
        daemon("instance", DEFAULT_INSTANCE),
        PathBuf::from(daemon("control_socket", DEFAULT_CONTROL_SOCKET)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_read_from_their_table_only() {
        let text = "# comment\n[daemon]\ninterface = \"eth0\"\n\
                    instance = \"lab-x\"  # trailing comment\n\
                    control_socket=\"/run/xlb/lab-x.sock\"\n\
                    [health_check]\ninstance = \"not-this\"\nfall = 2 # why\n";
        let cases = [
            ("string", "daemon", "instance", Some("lab-x")),
            (
                "no spaces around =",
                "daemon",
                "control_socket",
                Some("/run/xlb/lab-x.sock"),
            ),
            ("absent", "daemon", "metrics_address", None),
            ("other table's key is ignored", "daemon", "fall", None),
            (
                "same key in another table",
                "health_check",
                "instance",
                Some("not-this"),
            ),
            ("number", "health_check", "fall", Some("2")),
        ];
        for (name, table, key, want) in cases {
            assert_eq!(setting(text, table, key).as_deref(), want, "{name}");
        }
        assert_eq!(
            instance_and_socket("[daemon]\ninterface = \"eth0\"\n"),
            ("default".to_string(), PathBuf::from("/run/xlb/xlb.sock")),
            "xlb's defaults"
        );
    }

    #[test]
    fn rendered_config_names_what_the_run_reads() {
        let cfg = XlbConfig::lab_default("Demo_1", Mode::DsrL2, 2);
        let text = cfg.render();
        assert_eq!(
            instance_and_socket(&text),
            (
                "lab-demo_1".to_string(),
                PathBuf::from("/run/xlb/lab-Demo_1.sock")
            )
        );
        for want in [
            "interface = \"eth0\"",
            "interval = \"1000ms\"",
            "fall = 2",
            "name = \"api\"\naddress = \"10.100.0.1\"\nport = 80\nmode = \"dsr-l2\"",
            "name = \"api6\"\naddress = \"fd00:100::1\"",
            "name = \"api2\"\naddress = \"10.100.0.2\"\nport = 80\nmode = \"dsr-ipip\"",
            "address = \"fd00:99::12\"",
            "address = \"10.99.0.12\"",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        assert!(!text.contains("10.99.0.13"), "only two backends:\n{text}");
    }

    #[test]
    fn protection_and_hang_timeout_are_written_only_when_set() {
        let plain = XlbConfig::for_prefix("p").render();
        for absent in ["hang_timeout", "[protection]", "[vip.protection]"] {
            assert!(!plain.contains(absent), "{absent} in:\n{plain}");
        }

        let mut cfg = XlbConfig::for_prefix("p");
        cfg.health = Health {
            hang_timeout: Some(Duration::from_secs(1)),
            ..Health::xlb_defaults()
        };
        cfg.protection = Protection {
            max_ejected: Some(Share::Percent(10)),
            outlier_factor: Some(3.0),
            slow_start: Some(Duration::from_secs(10)),
            flap_damping: Some(false),
            ..Protection::default()
        };
        cfg.vips[0].protection = Some(Protection {
            min_healthy: Some(Share::Count(2)),
            flap_limit: Some(4),
            ..Protection::default()
        });
        let text = cfg.render();
        for want in [
            "[health_check]\nkind = \"http\"\nhang_timeout = \"1000ms\"\n",
            "\n[protection]\nmax_ejected = \"10%\"\noutlier_factor = 3.0\n\
             slow_start = \"10000ms\"\nflap_damping = false\n",
            "mode = \"dsr-ipip\"\n\n[vip.protection]\nmin_healthy = 2\nflap_limit = 4\n\n[[vip.backend]]",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        for absent in ["interval", "\ntimeout = ", "fall", "min_healthy = 0"] {
            assert!(!text.contains(absent), "{absent:?} in:\n{text}");
        }
        let off = Protection::off().render_keys();
        assert_eq!(off, "min_healthy = 0\nflap_damping = false\n");
    }

    #[test]
    fn guard_tables_are_written_as_given_and_parse() {
        let plain = XlbConfig::for_prefix("p").render();
        assert!(!plain.contains("guard"), "{plain}");
        let mut cfg = XlbConfig::for_prefix("p");
        cfg.guard = Some("track_sources = true".to_string());
        cfg.vips[0].guard = Some(
            "new_flows_per_source = { rate = \"50/s\", burst = 50, action = \"drop\" }\n\n\
             [[vip.guard.deny]]\nprefix = \"10.99.0.9/32\"\n"
                .to_string(),
        );
        let text = cfg.render();
        let doc: toml::Table = text.parse().unwrap_or_else(|e| panic!("{e}:\n{text}"));
        assert_eq!(doc["guard"]["track_sources"].as_bool(), Some(true));
        let vip = &doc["vip"][0];
        assert_eq!(
            vip["guard"]["new_flows_per_source"]["rate"].as_str(),
            Some("50/s")
        );
        assert_eq!(
            vip["guard"]["deny"][0]["prefix"].as_str(),
            Some("10.99.0.9/32")
        );
        assert_eq!(vip["backend"].as_array().map(Vec::len), Some(3), "{text}");
    }

    #[test]
    fn udp_vips_write_protocol_health_port_and_weights() {
        let mut cfg = XlbConfig::for_prefix("p");
        let mut dns = Vip::udp("dns", topology::VIP2_V4.into(), 5353, Mode::DsrL2, 2, 80);
        dns.weights.insert(2, 4);
        cfg.vips.push(dns);
        assert!(
            !cfg.render().contains("udp_timeout"),
            "not written unless set"
        );
        cfg.udp_timeout = Some(Duration::from_secs(2));
        let text = cfg.render();
        let doc: toml::Table = text.parse().unwrap_or_else(|e| panic!("{e}:\n{text}"));
        assert_eq!(
            doc["daemon"]["udp_timeout"].as_str(),
            Some("2000ms"),
            "{text}"
        );
        let vips = doc["vip"].as_array().unwrap();
        assert!(
            vips[0].get("protocol").is_none(),
            "tcp is not written:\n{text}"
        );
        assert!(vips[0]["backend"][0].get("health_port").is_none(), "{text}");
        let dns = &vips[1];
        assert_eq!(dns["protocol"].as_str(), Some("udp"), "{text}");
        let backends = dns["backend"].as_array().unwrap();
        assert_eq!(backends[0]["health_port"].as_integer(), Some(80), "{text}");
        assert_eq!(backends[1]["health_port"].as_integer(), Some(80), "{text}");
        assert!(backends[0].get("weight").is_none(), "{text}");
        assert_eq!(backends[1]["weight"].as_integer(), Some(4), "{text}");
    }

    #[test]
    fn backend_addresses_follow_the_vip_family() {
        let cases = [
            ("v4", "10.100.0.1", 80, 2, "10.99.0.12:80"),
            ("v6", "fd00:100::1", 8080, 3, "[fd00:99::13]:8080"),
        ];
        for (name, vip, port, i, want) in cases {
            assert_eq!(
                backend_addr(vip.parse().unwrap(), port, i).to_string(),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn modes_parse_and_flip() {
        assert_eq!("dsr-ipip".parse::<Mode>(), Ok(Mode::DsrIpip));
        assert_eq!("dsr-l2".parse::<Mode>(), Ok(Mode::DsrL2));
        assert!("nat".parse::<Mode>().is_err());
        assert_eq!(Mode::DsrIpip.other(), Mode::DsrL2);
    }
}
