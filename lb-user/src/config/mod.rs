//! The configuration file: one TOML document.
//!
//! Parsing happens in two steps. serde reads the file into raw structs that
//! mirror it (module `raw`). Validation then checks everything it can, collecting
//! every problem instead of stopping at the first, and resolves defaults into
//! the structs the daemon uses ([`Config`]). Validation is a list of small
//! named checks that push to one collector (`Problems`), one module per
//! part of the file:
//!
//! - `daemon`: the `[daemon]` table ([`DaemonConfig`]);
//! - `vip`: each `[[vip]]` and its `[[vip.backend]]`s ([`VipConfig`]);
//! - `health`: the health_check tables, merged into each backend's
//!   [`CheckSpec`](crate::health::spec::CheckSpec);
//! - `protection`: the protection tables, merged into each VIP's policy;
//! - `guard`: `[guard]` ([`GuardConfig`]) and each `[vip.guard]`, merged
//!   into the VIP's [`VipGuardConfig`].
//!
//! Every default is a constant in [`defaults`] (or in
//! [`crate::health::spec::defaults`] for health checks) and is shown with a
//! comment in `examples/xlb.toml`.
//!
//! Health-check settings merge field by field, later winning:
//! built-in defaults ← `[health_check]` ← `[vip.health_check]` ←
//! `[vip.backend.health_check]`.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::{Serialize, Serializer};

use crate::maglev::is_prime;

/// Implements `Display` for a configuration enum as the file spells it.
macro_rules! display_as_toml {
    ($($ty:ty { $($variant:ident => $text:literal),* })*) => {$(
        impl std::fmt::Display for $ty {
            /// The spelling used in the configuration file.
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self { $(Self::$variant => $text),* })
            }
        }
    )*};
}

/// Test helper: one `#[test]` per invalid configuration, named after the
/// case, asserting the exact errors in order.
#[cfg(test)]
macro_rules! rejects {
    ($($(#[$attr:meta])* $name:ident: $text:expr => [$($want:expr),* $(,)?];)*) => {$(
        $(#[$attr])*
        #[test]
        fn $name() {
            $crate::config::tests::assert_rejected(&$text, &[$($want),*]);
        }
    )*};
}

mod address;
mod announce;
mod chance;
mod cluster;
mod collect;

/// `daemon.second_chance_window`'s default, in ns.
pub const fn chance_default_window_ns() -> u64 {
    chance::DEFAULT_WINDOW.as_secs() * 1_000_000_000
}
mod daemon;
mod dns;
mod grpc;
mod guard;
mod health;
mod keys;
mod nat;
mod passive;
mod protection;
mod raw;
mod shown;
mod tls;
mod vip;

pub use announce::{AnnounceConfig, defaults as announce_defaults};
pub use cluster::{
    ClusterConfig, MAX_PEER_TIMEOUT, defaults as cluster_defaults, host_name, parse_peer,
};
pub use daemon::{
    DaemonConfig, LiveSettings, MAX_CONNTRACK_SIZE, MAX_RING_STRIDE, MIN_CONNTRACK_SIZE,
    MIN_UDP_TIMEOUT, PinnedSettings, RestartSettings, XdpMode, check_instance,
    default_control_socket,
};
pub use guard::{
    AutoBlock, GuardConfig, ListRule, MAX_TTL, SourceAlert, SourceLimit, VipGuardConfig,
    defaults as guard_defaults, parse_rate,
};
pub use keys::{ConfigKey, accepted_keys};
pub use nat::{
    MAX_NAT_SIZE, MIN_NAT_SIZE, NatConfig, NatTimeouts, check_pools_local,
    defaults as nat_defaults, parse_port_range, pool_not_local_errors,
};
pub use passive::{PassiveConfig, apply_pool_timeouts, defaults as passive_defaults};
pub use shown::{duration as shown_duration, rate as shown_rate};
pub use vip::{
    BackendConfig, DownPolicy, MAX_WEIGHT, Mode, Protocol, VipConfig, check_weight, ip_proto,
};

/// The instance a command means: the one named, else the one `config`
/// runs, else the default one (`xlb detach`, `xlb trace`).
pub fn instance_of(instance: Option<&str>, config: Option<&Path>) -> anyhow::Result<String> {
    use anyhow::Context as _;
    Ok(match (instance, config) {
        (Some(name), _) => name.to_owned(),
        (None, Some(path)) => {
            Config::from_file(path)
                .with_context(|| format!("reading the instance name from {}", path.display()))?
                .daemon
                .pinned
                .instance
        }
        (None, None) => defaults::INSTANCE.to_owned(),
    })
}

use raw::RawConfig;

/// Defaults of the `[daemon]`, `[[vip]]` and `[[vip.backend]]` settings.
/// Health-check defaults are in [`crate::health::spec::defaults`].
pub mod defaults {
    use super::{DownPolicy, Mode, Protocol, XdpMode};
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    use std::time::Duration;

    /// `daemon.xdp_mode`: native (driver) XDP.
    pub const XDP_MODE: XdpMode = XdpMode::Native;
    /// `daemon.instance`: pins live under `/sys/fs/bpf/xlb/default/`.
    pub const INSTANCE: &str = lb_ctl::DEFAULT_INSTANCE;
    /// `daemon.control_socket`.
    pub const CONTROL_SOCKET: &str = lb_ctl::DEFAULT_CONTROL_SOCKET;
    /// `daemon.metrics_address`: Prometheus metrics on localhost only, since
    /// they name every VIP and backend.
    pub const METRICS_ADDRESS: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9813);
    /// `daemon.conntrack_size` (entries).
    pub const CONNTRACK_SIZE: u32 = lb_common::DEFAULT_CT_SIZE;
    /// `daemon.udp_timeout`.
    pub const UDP_TIMEOUT: Duration = Duration::from_nanos(lb_common::DEFAULT_UDP_TIMEOUT_NS);
    /// `daemon.max_table_size`: the ring stride.
    pub const MAX_TABLE_SIZE: u32 = lb_common::DEFAULT_TABLE_SIZE;
    /// `daemon.probe_concurrency`: health probes in flight at once.
    pub const PROBE_CONCURRENCY: u32 = 256;
    /// `daemon.reply_rate`: generated replies per second and CPU.
    pub const REPLY_RATE: u32 = lb_common::DEFAULT_REPLY_RATE;
    /// `vip.protocol`.
    pub const PROTOCOL: Protocol = Protocol::Tcp;
    /// `vip.mode`.
    pub const MODE: Mode = Mode::DsrIpip;
    /// `vip.down_policy`.
    pub const DOWN_POLICY: DownPolicy = DownPolicy::Rehash;
    /// `vip.table_size`, lowered to `daemon.max_table_size` when that is smaller.
    pub const TABLE_SIZE: u32 = lb_common::DEFAULT_TABLE_SIZE;
    /// `vip.backend.weight`.
    pub const WEIGHT: u32 = 1;
}

/// A validated configuration with every default resolved.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Config {
    pub daemon: DaemonConfig,
    /// In file order.
    pub vips: Vec<VipConfig>,
    /// `[guard]`: the daemon-wide abuse-control settings and the global
    /// deny and allow lists (each VIP's merged settings are its `guard`).
    pub guard: GuardConfig,
    /// `[cluster]`: this node's name and its peers' status addresses.
    pub cluster: ClusterConfig,
    /// `[announce]`: when VIPs are announced to the BGP speaker; `None` =
    /// not at all.
    pub announce: Option<AnnounceConfig>,
    /// Problems that do not stop xlb but that the operator should see (log
    /// them at start and reload), e.g. a VIP without backends.
    pub warnings: Vec<String>,
}

/// Every problem found in a configuration, one line each, each naming the
/// file and where in it.
#[derive(Debug, thiserror::Error)]
#[error("{}", problems.join("\n"))]
pub struct ConfigErrors {
    pub problems: Vec<String>,
}

impl Config {
    /// Reads and validates the configuration file at `path`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, ConfigErrors> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigErrors {
            problems: vec![format!(
                "{}: cannot read the configuration: {e}",
                path.display()
            )],
        })?;
        let mut config = Config::from_str(&text, &path.display().to_string())?;
        warn_readable_secret(path, &config.daemon, &mut config.warnings);
        Ok(config)
    }

    /// Parses and validates configuration `text`; `origin` (usually the file
    /// name) prefixes every message.
    pub fn from_str(text: &str, origin: &str) -> Result<Config, ConfigErrors> {
        let raw: RawConfig =
            collect::deserialize(text, origin).map_err(|problems| ConfigErrors { problems })?;
        let mut p = Problems {
            origin,
            errors: Vec::new(),
            warnings: Vec::new(),
        };
        let config = validate(&raw, &mut p);
        if p.errors.is_empty() {
            Ok(Config {
                warnings: p.warnings,
                ..config
            })
        } else {
            Err(ConfigErrors { problems: p.errors })
        }
    }

    /// The VIP called `name`.
    pub fn vip(&self, name: &str) -> Option<&VipConfig> {
        self.vips.iter().find(|v| v.name == name)
    }
}

/// A file that holds `hash_seed` is a secret (whoever knows the key can aim
/// flows at one backend): warn when others, or a group other than root's,
/// may read it (the package ships it 0640 root:root). A warning, not an
/// error: a configuration management tool may need to read it, and the
/// operator knows who is in the group.
fn warn_readable_secret(path: &Path, daemon: &DaemonConfig, warnings: &mut Vec<String>) {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    if daemon.live.hash_seed.is_none() {
        return;
    }
    let Ok(meta) = std::fs::metadata(path) else {
        return;
    };
    let mode = meta.permissions().mode() & 0o777;
    let group_reads = mode & 0o040 != 0 && meta.gid() != 0;
    if mode & 0o004 != 0 || group_reads {
        warnings.push(format!(
            "{}: daemon: hash_seed is secret, but the file is mode {mode:o}, readable by {}; \
             chmod 600 {}",
            path.display(),
            if mode & 0o004 != 0 {
                "every user"
            } else {
                "its group"
            },
            path.display()
        ));
    }
}

/// The collector every check pushes to: errors (the file is refused) and
/// warnings (the file is used; the operator should see them).
struct Problems<'a> {
    origin: &'a str,
    errors: Vec<String>,
    warnings: Vec<String>,
}

impl Problems<'_> {
    fn line(&self, ctx: &str, msg: &dyn fmt::Display) -> String {
        if ctx.is_empty() {
            format!("{}: {msg}", self.origin)
        } else {
            format!("{}: {ctx}: {msg}", self.origin)
        }
    }

    /// Records an error once: a daemon-wide health setting is checked again
    /// for every backend that inherits it.
    fn error(&mut self, ctx: &str, msg: impl fmt::Display) {
        let line = self.line(ctx, &msg);
        if !self.errors.contains(&line) {
            self.errors.push(line);
        }
    }

    fn warn(&mut self, ctx: &str, msg: impl fmt::Display) {
        let line = self.line(ctx, &msg);
        if !self.warnings.contains(&line) {
            self.warnings.push(line);
        }
    }
}

/// The whole file: the daemon, the daemon-wide health defaults, the limits
/// on the number of VIPs and backends, then each VIP in file order.
fn validate(raw: &RawConfig, p: &mut Problems<'_>) -> Config {
    let daemon = daemon::validate(&raw.daemon, p);
    let global_health = health::global_layer(raw.health_check.as_ref(), p);
    check_vip_count(raw, p);
    check_backend_count(raw, p);
    let guard = guard::global(raw.guard.as_ref(), p);
    let globals = vip::Globals {
        health: &global_health,
        protection: raw.protection.as_ref(),
        passive: raw.passive.as_ref(),
        guard: raw.guard.as_ref(),
    };
    let vips = vip::validate_all(&raw.vip, &daemon, &globals, p);
    guard::check_rule_count(&guard, &vips, p);
    check_list_reasons(raw, p);
    let cluster = cluster::validate(raw.cluster.as_ref(), &daemon, p);
    let announce = announce::validate(raw.announce.as_ref(), &raw.vip, p);
    Config {
        daemon,
        vips,
        guard,
        cluster,
        announce,
        warnings: Vec::new(),
    }
}

/// A list entry's reason goes into `xlb blocks`, events and logs: one line
/// of text, as a reason given to `xlb block` (`ctl::check_reason`), so it
/// can neither forge a log line nor drive a terminal. (Its length is
/// checked with the entry, in `guard`.)
fn check_list_reasons(raw: &RawConfig, p: &mut Problems<'_>) {
    let global = raw.guard.as_ref().map(|g| ("guard".to_string(), g));
    let local = raw.vip.iter().filter_map(|v| {
        v.guard
            .as_ref()
            .map(|g| (format!("vip {:?}: guard", v.name), g))
    });
    for (ctx, g) in global.into_iter().chain(local) {
        for (list, rules) in [("deny", &g.deny), ("allow", &g.allow)] {
            for (i, r) in rules.iter().enumerate() {
                let reason = r.reason.as_deref().unwrap_or_default();
                if reason.chars().any(char::is_control) {
                    p.error(
                        &format!("{ctx}: {list} entry {}", i + 1),
                        format!(
                            "reason {:?} has control characters (a newline?); write it on \
                             one line",
                            reason
                        ),
                    );
                }
            }
        }
    }
}

/// None is allowed (a warning); more than the maps hold is not.
fn check_vip_count(raw: &RawConfig, p: &mut Problems<'_>) {
    if raw.vip.is_empty() {
        p.warn(
            "",
            "no [[vip]] configured; xlb will pass all traffic to the host",
        );
    }
    let count = raw.vip.len();
    if count > lb_common::MAX_VIPS as usize {
        p.error(
            "",
            format!(
                "{count} VIPs configured, but xlb supports at most {}; remove VIPs, or \
                 serve the others from an xlb instance on another interface (one XDP \
                 program per interface: two instances cannot share one), or raise \
                 lb_common::MAX_VIPS and rebuild (a compile-time constant that sizes the \
                 maps: bump LAYOUT_VERSION with it; that build starts on new maps after \
                 `xlb detach`, losing established flows once)",
                lb_common::MAX_VIPS
            ),
        );
    }
}

/// Backend ids of all VIPs index one map, and id 0 means "no backend".
fn check_backend_count(raw: &RawConfig, p: &mut Problems<'_>) {
    let total: usize = raw.vip.iter().map(|v| v.backend.len()).sum();
    let max_backends = lb_common::MAX_BACKENDS as usize - 1;
    if total > max_backends {
        p.error(
            "",
            format!(
                "{total} backends in total across all VIPs, but xlb supports at most \
                 {max_backends}; remove backends, or split the VIPs across xlb instances on \
                 other interfaces (two instances cannot share one)"
            ),
        );
    }
}

// ---------------------------------------------------------------------------
// Value forms shared by several tables.

/// Parses a duration such as `"500ms"`, `"2s"`, `"1.5s"`, `"1m"`, `"1h"` or
/// `"7d"`: one decimal number and one unit (`ms`, `s`, `m`, `h`, `d`). The error says
/// what was wrong, without saying where.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "{text:?} is not a duration; write a number and a unit (ms, s, m, h or d), \
             e.g. \"500ms\", \"2s\", \"1.5s\", \"1m\""
        )
    };
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .ok_or_else(bad)?;
    let (number, unit) = t.split_at(split);
    let unit_ns: u128 = match unit {
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        // Block TTLs run to days (`--ttl 7d`); weeks are left out: no
        // bound in the file reaches one.
        "d" => 86_400_000_000_000,
        _ => return Err(bad()),
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    // "1." and ".5" are fine, "." and "1.2.3" are not; more than nine
    // decimals is below a nanosecond at any unit.
    if (int.is_empty() && frac.is_empty()) || !digits_ok(int) || !digits_ok(frac) || frac.len() > 9
    {
        return Err(bad());
    }
    let int: u128 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| bad())?
    };
    let frac_value: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| bad())?
    };
    let nanos = int
        .checked_mul(unit_ns)
        .and_then(|n| n.checked_add(frac_value * unit_ns / 10u128.pow(frac.len() as u32)))
        .filter(|&n| n <= u128::from(u64::MAX))
        .ok_or_else(|| format!("{text:?} is too long a duration"))?;
    Ok(Duration::from_nanos(nanos as u64))
}

/// `"10%"` (spaces allowed around the number) → 10.0; `None` if not that
/// form. Ranges are the caller's.
fn parse_percent(text: &str) -> Option<f64> {
    text.trim()
        .strip_suffix('%')
        .and_then(|n| n.trim().parse::<f64>().ok())
}

/// The duration setting `field` = `text`, or `None` after an error that
/// says what was wrong with it. Ranges are the caller's.
fn duration_setting(field: &str, text: &str, ctx: &str, p: &mut Problems<'_>) -> Option<Duration> {
    parse_duration(text)
        .map_err(|e| p.error(ctx, format!("{field} {e}")))
        .ok()
}

/// The duration setting `field` = `text` within `min..=max`, or `None`
/// after an error that says what was wrong with it, the bounds as a
/// person writes them.
fn bounded_duration(
    field: &str,
    text: &str,
    (min, max): (Duration, Duration),
    ctx: &str,
    p: &mut Problems<'_>,
) -> Option<Duration> {
    let d = duration_setting(field, text, ctx, p)?;
    if d < min || d > max {
        p.error(
            ctx,
            format!(
                "{field} {text:?} is out of range; use {} to {}",
                shown::duration(min),
                shown::duration(max)
            ),
        );
        return None;
    }
    Some(d)
}

fn ser_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    // Debug prints "2s", "500ms", "1.5s": readable and parseable back.
    s.collect_str(&format_args!("{d:?}"))
}

/// A prime near `n` to suggest: the next one up, or the previous one if the
/// next is above `max`.
fn suggest_prime(n: u32, max: u32) -> u32 {
    let up = (n.max(2)..=u32::MAX)
        .find(|&c| is_prime(c))
        .unwrap_or(u32::MAX);
    if up <= max {
        return up;
    }
    (2..=n.min(max)).rev().find(|&c| is_prime(c)).unwrap_or(2)
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    //! Helpers shared by the tests of every `config` module, and the tests
    //! of the whole file: defaults, a full file, the example, loading.

    use std::net::{IpAddr, Ipv4Addr};
    use std::path::PathBuf;

    use super::*;
    use crate::health::policy::Policy;
    use crate::health::spec::{self, CheckKind, CheckSpec, HttpCheck};

    pub(in crate::config) const ORIGIN: &str = "xlb.toml";

    /// The smallest `[daemon]` table.
    pub(in crate::config) const DAEMON: &str = r#"
[daemon]
interface = "eth0"
"#;

    /// One backend for VIP "api".
    pub(in crate::config) const ONE_BACKEND: &str = r#"
[[vip.backend]]
address = "10.0.0.11"
"#;

    pub(in crate::config) fn parse(text: &str) -> Result<Config, ConfigErrors> {
        Config::from_str(text, ORIGIN)
    }

    pub(in crate::config) fn ok(name: &str, text: &str) -> Config {
        parse(text).unwrap_or_else(|e| panic!("{name}: unexpected errors:\n{e}"))
    }

    /// `text` is refused with exactly the errors `want`, in this order.
    #[track_caller]
    pub(in crate::config) fn assert_rejected(text: &str, want: &[&str]) {
        match parse(text) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => assert_eq!(e.problems, want, "for:\n{text}"),
        }
    }

    /// [`DAEMON`] and a VIP "api" on 10.100.0.1:80 whose table continues
    /// with `body` (settings, sub-tables, backends).
    pub(in crate::config) fn api_vip(body: &str) -> String {
        format!(
            r#"{DAEMON}
[[vip]]
name = "api"
address = "10.100.0.1"
port = 80
{body}"#
        )
    }

    /// [`api_vip`] with `settings` in its table and [`ONE_BACKEND`].
    pub(in crate::config) fn api_with_backend(settings: &str) -> String {
        api_vip(&format!("{settings}\n{ONE_BACKEND}"))
    }

    pub(in crate::config) fn default_http() -> HttpCheck {
        HttpCheck {
            method: spec::defaults::HTTP_METHOD.to_owned(),
            path: spec::defaults::HTTP_PATH.to_owned(),
            host: None,
            expect_status: vec![spec::defaults::EXPECT_STATUS],
            body_contains: None,
            reuse_connection: None,
        }
    }

    pub(in crate::config) fn default_check(port: u16) -> CheckSpec {
        CheckSpec {
            kind: CheckKind::Http(default_http()),
            port,
            interval: spec::defaults::INTERVAL,
            timeout: spec::defaults::TIMEOUT,
            hang_timeout: spec::defaults::TIMEOUT * spec::defaults::HANG_TIMEOUT_FACTOR,
            rise: spec::defaults::RISE,
            fall: spec::defaults::FALL,
            fast_interval: spec::defaults::FAST_INTERVAL,
            down_interval: spec::defaults::DOWN_INTERVAL,
            jitter: spec::defaults::JITTER,
            via: spec::defaults::VIA,
            auto_timeout: false,
            agent: None,
        }
    }

    pub(in crate::config) fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    rejects! {
        reason_of_a_global_deny_entry_with_a_newline: format!(r#"{DAEMON}
[[guard.deny]]
prefix = "192.0.2.0/24"
reason = "scanner\n2026-12-03 INFO forged line"
"#) => [
            r#"xlb.toml: guard: deny entry 1: reason "scanner\n2026-12-03 INFO forged line" has control characters (a newline?); write it on one line"#,
        ];
        reason_of_a_vip_allow_entry_with_an_escape: api_with_backend(r#"
[[vip.guard.allow]]
prefix = "10.0.0.0/8"
reason = "ok"
[[vip.guard.allow]]
prefix = "10.1.0.0/16"
reason = "\u001b[2J"
"#) => [
            r#"xlb.toml: vip "api": guard: allow entry 2: reason "\u{1b}[2J" has control characters (a newline?); write it on one line"#,
        ];
    }

    #[test]
    fn a_readable_file_with_a_hash_seed_is_a_warning() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("xlb-cfg-mode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("xlb.toml");
        let seed = "hash_seed = \"000102030405060708090a0b0c0d0e0f\"\n";
        let p = path.display();
        // (name, hash_seed line, mode, warning)
        let cases = [
            (
                "seed, world-readable",
                seed,
                0o644,
                Some(format!(
                    "{p}: daemon: hash_seed is secret, but the file is mode 644, readable by \
                     every user; chmod 600 {p}"
                )),
            ),
            (
                "seed, group-readable",
                seed,
                0o640,
                Some(format!(
                    "{p}: daemon: hash_seed is secret, but the file is mode 640, readable by \
                     its group; chmod 600 {p}"
                )),
            ),
            ("seed, private", seed, 0o600, None),
            ("no seed, world-readable", "", 0o644, None),
        ];
        // The group-readable case needs a group other than root's: as
        // root (the suite's tests run so), the file's group is set to 1.
        let root = nix::unistd::Uid::effective().is_root();
        for (name, line, mode, want) in cases {
            std::fs::write(&path, format!("{DAEMON}{line}")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            if root {
                std::os::unix::fs::chown(&path, None, Some(1)).unwrap();
            }
            let config = Config::from_file(&path).unwrap();
            let got: Vec<&String> = config
                .warnings
                .iter()
                .filter(|w| w.contains("hash_seed"))
                .collect();
            assert_eq!(got, want.iter().collect::<Vec<_>>(), "{name}");
        }
        // As the package ships it, 0640 root:root: only root reads it.
        if root {
            std::fs::write(&path, format!("{DAEMON}{seed}")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
            std::os::unix::fs::chown(&path, None, Some(0)).unwrap();
            let config = Config::from_file(&path).unwrap();
            assert!(
                !config.warnings.iter().any(|w| w.contains("hash_seed")),
                "{:?}",
                config.warnings
            );
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn minimal_config_resolves_every_default() {
        let config = ok(
            "minimal",
            r#"
            [daemon]
            interface = "eth0"

            [[vip]]
            name = "api"
            address = "10.100.0.1"
            port = 80

            [[vip.backend]]
            address = "10.0.0.11"
            "#,
        );
        let want = Config {
            daemon: DaemonConfig {
                pinned: PinnedSettings {
                    interface: "eth0".into(),
                    xdp_mode: XdpMode::Native,
                    instance: "default".into(),
                    conntrack_size: 1_048_576,
                    max_table_size: 65_537,
                    nat_size: lb_common::nat::DEFAULT_NAT_SIZE,
                },
                restart: RestartSettings {
                    control_socket: PathBuf::from("/run/xlb/xlb.sock"),
                    socket_group: None,
                    metrics_address: Some("127.0.0.1:9813".parse().unwrap()),
                    probe_concurrency: 256,
                },
                live: LiveSettings {
                    udp_timeout: Duration::from_secs(30),
                    hash_seed: None,
                    encap_source_v4: None,
                    encap_source_v6: None,
                    encap_source_v4_prefix: None,
                    reply_rate: 1000,
                    second_chance_window: chance::DEFAULT_WINDOW,
                    nat_timeouts: NatTimeouts::default(),
                },
            },
            vips: vec![VipConfig {
                name: "api".into(),
                addr: ip("10.100.0.1"),
                port: 80,
                protocol: Protocol::Tcp,
                mode: Mode::DsrIpip,
                down_policy: DownPolicy::Rehash,
                table_size: 65_537,
                host_services: false,
                second_chance: true,
                nat: None,
                protection: Policy::default(),
                // A DSR VIP: never on.
                passive: PassiveConfig {
                    enabled: false,
                    ..PassiveConfig::default()
                },
                guard: VipGuardConfig::default(),
                backends: vec![BackendConfig {
                    addr: ip("10.0.0.11"),
                    port: 80,
                    weight: 1,
                    health: default_check(80),
                    max_flows: None,
                }],
            }],
            guard: GuardConfig::default(),
            cluster: ClusterConfig::default(),
            announce: None,
            warnings: vec![],
        };
        assert_eq!(config, want);
        // The health defaults themselves (owned by health::spec), as documented.
        let h = &config.vips[0].backends[0].health;
        assert_eq!(
            (
                h.interval,
                h.timeout,
                h.hang_timeout,
                h.rise,
                h.fall,
                h.fast_interval,
                h.down_interval,
                h.jitter
            ),
            (
                Duration::from_secs(2),
                Duration::from_secs(1),
                Duration::from_secs(3),
                2,
                3,
                Duration::from_millis(500),
                Duration::from_secs(5),
                0.1
            )
        );
    }
    #[test]
    fn full_config() {
        let config = ok(
            "full",
            r#"
            [daemon]
            interface = "ens5f0"
            xdp_mode = "generic"
            instance = "edge_1"
            control_socket = "/run/xlb-edge/ctl.sock"
            socket_group = "xlbops"
            metrics_address = "[::1]:9900"
            conntrack_size = 4096
            udp_timeout = "1m"
            max_table_size = 131071
            hash_seed = "000102030405060708090a0b0c0d0e0F"
            encap_source_v4 = "10.0.0.2"
            encap_source_v6 = "fd00::2"
            probe_concurrency = 16

            [health_check]
            kind = "http"
            method = "HEAD"
            path = "/ready"
            host = "svc.internal"
            expect_status = ["200-299", "404", 302]
            body_contains = "ok"
            interval = "3s"
            timeout = "1.5s"
            hang_timeout = "2s"
            rise = 1
            fall = 5
            fast_interval = "250ms"
            down_interval = "10s"
            jitter = 0.25

            [[vip]]
            name = "web.v6"
            address = "fd00:100::1"
            port = 443
            protocol = "udp"
            mode = "dsr-l2"
            down_policy = "keep"
            table_size = 131071

            [[vip.backend]]
            address = "fd00::11"
            port = 443
            weight = 0
            health_port = 8443

            [[vip.backend]]
            address = "fd00::12"
            weight = 1000
            "#,
        );
        let check = |port| CheckSpec {
            kind: CheckKind::Http(HttpCheck {
                method: "HEAD".into(),
                path: "/ready".into(),
                host: Some("svc.internal".into()),
                expect_status: vec![(200, 299), (404, 404), (302, 302)],
                body_contains: Some("ok".into()),
                reuse_connection: None,
            }),
            port,
            interval: Duration::from_secs(3),
            timeout: Duration::from_millis(1500),
            hang_timeout: Duration::from_secs(2),
            rise: 1,
            fall: 5,
            fast_interval: Duration::from_millis(250),
            down_interval: Duration::from_secs(10),
            jitter: 0.25,
            via: spec::defaults::VIA,
            auto_timeout: false,
            agent: None,
        };
        let want = Config {
            daemon: DaemonConfig {
                pinned: PinnedSettings {
                    interface: "ens5f0".into(),
                    xdp_mode: XdpMode::Generic,
                    instance: "edge_1".into(),
                    conntrack_size: 4096,
                    max_table_size: 131_071,
                    nat_size: lb_common::nat::DEFAULT_NAT_SIZE,
                },
                restart: RestartSettings {
                    control_socket: PathBuf::from("/run/xlb-edge/ctl.sock"),
                    socket_group: Some("xlbops".into()),
                    metrics_address: Some("[::1]:9900".parse().unwrap()),
                    probe_concurrency: 16,
                },
                live: LiveSettings {
                    udp_timeout: Duration::from_secs(60),
                    hash_seed: Some([0x0001_0203_0405_0607, 0x0809_0a0b_0c0d_0e0f]),
                    encap_source_v4: Some(Ipv4Addr::new(10, 0, 0, 2)),
                    encap_source_v6: Some("fd00::2".parse().unwrap()),
                    encap_source_v4_prefix: None,
                    reply_rate: 1000,
                    second_chance_window: chance::DEFAULT_WINDOW,
                    nat_timeouts: NatTimeouts::default(),
                },
            },
            vips: vec![VipConfig {
                name: "web.v6".into(),
                addr: ip("fd00:100::1"),
                port: 443,
                protocol: Protocol::Udp,
                mode: Mode::DsrL2,
                down_policy: DownPolicy::Keep,
                table_size: 131_071,
                host_services: false,
                second_chance: false,
                nat: None,
                protection: Policy::default(),
                // A DSR VIP: never on.
                passive: PassiveConfig {
                    enabled: false,
                    ..PassiveConfig::default()
                },
                guard: VipGuardConfig::default(),
                backends: vec![
                    BackendConfig {
                        addr: ip("fd00::11"),
                        port: 443,
                        weight: 0,
                        health: check(8443),
                        max_flows: None,
                    },
                    BackendConfig {
                        addr: ip("fd00::12"),
                        port: 443,
                        weight: 1000,
                        health: check(443),
                        max_flows: None,
                    },
                ],
            }],
            guard: GuardConfig::default(),
            cluster: ClusterConfig::default(),
            announce: None,
            warnings: vec![
                "xlb.toml: daemon: xdp_mode = \"generic\" runs XDP after the kernel has built an \
                 skb: much slower than \"native\"; use it for testing only"
                    .into(),
            ],
        };
        assert_eq!(config, want);
    }

    #[test]
    fn errors_display_one_per_line() {
        let e = parse(&api_vip(
            r#"
table_size = 4
[vip.health_check]
rise = 0
[[vip.backend]]
address = "10.0.0.11"
"#,
        ))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "xlb.toml: vip \"api\": table_size 4 is not prime; use a prime such as 5\n\
             xlb.toml: vip \"api\": health_check: rise must be at least 1"
        );
    }

    #[test]
    fn parse_duration_cases() {
        let good = [
            ("milliseconds", "500ms", Duration::from_millis(500)),
            ("seconds", "2s", Duration::from_secs(2)),
            ("decimal seconds", "1.5s", Duration::from_millis(1500)),
            ("minutes", "1m", Duration::from_secs(60)),
            ("hours", "2h", Duration::from_secs(7200)),
            ("days", "7d", Duration::from_secs(7 * 86_400)),
            ("zero", "0s", Duration::ZERO),
            ("leading dot", ".5s", Duration::from_millis(500)),
            ("trailing dot", "3.s", Duration::from_secs(3)),
            (
                "nanosecond precision",
                "0.000000001s",
                Duration::from_nanos(1),
            ),
            ("surrounding spaces", " 3s ", Duration::from_secs(3)),
        ];
        for (name, text, want) in good {
            assert_eq!(parse_duration(text), Ok(want), "{name}");
        }
        let bad = [
            ("no unit", "5"),
            ("no number", "s"),
            ("empty", ""),
            ("unknown unit", "5w"),
            ("space before unit", "5 s"),
            ("negative", "-1s"),
            ("two dots", "1.2.3s"),
            ("lone dot", ".s"),
            ("compound", "1m30s"),
            ("too precise", "0.0000000001s"),
        ];
        for (name, text) in bad {
            assert_eq!(
                parse_duration(text),
                Err(format!(
                    "{text:?} is not a duration; write a number and a unit (ms, s, m, h or d), \
                     e.g. \"500ms\", \"2s\", \"1.5s\", \"1m\""
                )),
                "{name}"
            );
        }
        assert_eq!(
            parse_duration("9999999999h"),
            Err("\"9999999999h\" is too long a duration".to_owned())
        );
    }

    /// One VIP more than the maps hold, each without backends.
    fn too_many_vips() -> String {
        let vips: String = (0..=lb_common::MAX_VIPS)
            .map(|i| {
                format!(
                    r#"
[[vip]]
name = "v{i}"
address = "10.100.0.{i}"
port = 80
"#
                )
            })
            .collect();
        format!("{DAEMON}{vips}")
    }

    /// VIP "api" with one backend more than the maps hold.
    fn too_many_backends() -> String {
        let backends: String = (0..lb_common::MAX_BACKENDS)
            .map(|i| {
                format!(
                    r#"
[[vip.backend]]
address = "10.1.{}.{}"
"#,
                    i / 256,
                    i % 256
                )
            })
            .collect();
        api_vip(&backends)
    }

    rejects! {
        too_many_vips_are_refused: too_many_vips() => [
            "xlb.toml: 65 VIPs configured, but xlb supports at most 64; remove VIPs, or serve the others from an xlb instance on another interface (one XDP program per interface: two instances cannot share one), or raise lb_common::MAX_VIPS and rebuild (a compile-time constant that sizes the maps: bump LAYOUT_VERSION with it; that build starts on new maps after `xlb detach`, losing established flows once)",
        ];
        too_many_backends_are_refused: too_many_backends() => [
            "xlb.toml: 4096 backends in total across all VIPs, but xlb supports at most 4095; remove backends, or split the VIPs across xlb instances on other interfaces (two instances cannot share one)",
        ];
    }

    #[test]
    fn no_vips_is_a_warning() {
        assert_eq!(
            ok("no VIPs", DAEMON).warnings,
            ["xlb.toml: no [[vip]] configured; xlb will pass all traffic to the host"]
        );
    }

    #[test]
    fn serialized_config_hides_the_hash_seed() {
        let config = ok(
            "seeded",
            r#"
[daemon]
interface = "eth0"
hash_seed = "00000000000000ff00000000000000ee"

[[vip]]
name = "a"
address = "10.1.0.1"
port = 80

[[vip.backend]]
address = "10.0.0.11"
"#,
        );
        assert_eq!(config.daemon.live.hash_seed, Some([0xff, 0xee]));
        let json = serde_json::to_value(&config).unwrap();
        assert!(json["daemon"].get("hash_seed").is_none(), "{json}");
        assert_eq!(json["daemon"]["udp_timeout"], "30s");
        let health = &json["vips"][0]["backends"][0]["health"];
        assert_eq!(health["kind"], "http");
        assert_eq!(health["fast_interval"], "500ms");
        assert_eq!(health["hang_timeout"], "3s");
        assert_eq!(health["port"], 80);
        assert_eq!(json["vips"][0]["mode"], "dsr-ipip");
    }

    #[test]
    fn example_file_parses() {
        let config = ok(
            "examples/xlb.toml",
            include_str!("../../../examples/xlb.toml"),
        );
        assert_eq!(config.warnings, Vec::<String>::new());
        let names: Vec<&str> = config.vips.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["api", "dns", "api-v6"]);
        let api = config.vip("api").unwrap();
        assert_eq!(api.backends[1].weight, 2);
        assert_eq!(api.backends[1].health.timeout, Duration::from_millis(1500));
        assert_eq!(api.backends[0].health.port, 8080);
        assert!(matches!(
            config.vip("dns").unwrap().backends[0].health.kind,
            CheckKind::Dns(_)
        ));
        assert_eq!(config.guard.deny.len(), 1);
        assert_eq!(config.guard.allow.len(), 1);
        let guard = &api.guard;
        assert_eq!(guard.limit.as_ref().map(|l| l.burst), Some(100));
        assert_eq!(guard.deny[0].prefix.to_string(), "2001:db8:77:1::/64");
        assert_eq!(config.vip("dns").unwrap().guard.limit, None);
    }

    #[test]
    fn from_file() {
        let dir = std::env::temp_dir().join(format!("xlb-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("xlb.toml");
        let bad = api_vip(&format!("table_size = 10\n{ONE_BACKEND}"));
        std::fs::write(&path, bad).unwrap();
        let e = Config::from_file(&path).unwrap_err();
        assert_eq!(
            e.problems,
            [format!(
                "{}: vip \"api\": table_size 10 is not prime; use a prime such as 11",
                path.display()
            )]
        );
        std::fs::write(&path, api_vip(ONE_BACKEND)).unwrap();
        assert_eq!(Config::from_file(&path).unwrap().vips.len(), 1);
        let missing = dir.join("missing.toml");
        let e = Config::from_file(&missing).unwrap_err();
        assert_eq!(
            e.problems,
            [format!(
                "{}: cannot read the configuration: No such file or directory (os error 2)",
                missing.display()
            )]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
