//! `[passive]` and `[vip.passive]`: passive detection from the data path
//! (`health::passive`). Fields merge one by one: built-in defaults ←
//! `[passive]` ← `[vip.passive]`.
//!
//! Only NAT VIPs have it: in the DSR modes the backend answers the client
//! directly, so the data plane sees one direction and cannot tell an
//! answered request from an unanswered one. `[passive]` applies to the NAT
//! VIPs alone; `enabled = true` in a DSR VIP's own `[vip.passive]` is an
//! error (it asks for something that cannot be), and its other keys are a
//! warning (they do nothing).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Mode, Problems, parse_percent, ser_duration};
use crate::health::passive::Thresholds;
use crate::health::passive::sources::SourceRule;

/// A `[passive]` or `[vip.passive]` table as written.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPassive {
    pub(super) enabled: Option<bool>,
    pub(super) connect_timeout: Option<String>,
    pub(super) response_timeout: Option<String>,
    pub(super) window: Option<String>,
    /// i64 so that a negative number gets our message, not serde's.
    pub(super) min_requests: Option<i64>,
    pub(super) failure_threshold: Option<String>,
    pub(super) peer_factor: Option<f64>,
    pub(super) min_sources: Option<i64>,
    pub(super) source_cap: Option<i64>,
}

/// Defaults (documented in the README and `examples/xlb.toml`).
pub mod defaults {
    use std::time::Duration;
    /// On for NAT VIPs: it costs one array update per event, and catches
    /// a hung application seconds before a probe every few seconds can.
    pub const ENABLED: bool = true;
    /// A SYN retransmitted after a loss arrives 1 s later (RFC 6298's
    /// initial RTO): below that, one lost SYN would count as a failure.
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
    /// Most L4 services (HTTP APIs, databases) answer within it; a
    /// service whose requests legitimately take longer must raise it.
    pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
    /// Long enough to hold `MIN_REQUESTS` at modest rates, short enough
    /// that a backend ejected and back is judged on new traffic soon.
    pub const WINDOW: Duration = Duration::from_secs(2);
    /// Fewer than this is noise (one client's bad luck).
    pub const MIN_REQUESTS: u64 = 10;
    /// A fifth of its requests failing: far above a healthy backend's
    /// (about 0), and reached 0.4 s into a 2 s window once a backend hangs.
    pub const FAILURE_THRESHOLD: f64 = 0.2;
    /// Five times its peers' failure share: peers at 2 % leave a backend
    /// at 10 % alone, peers at 50 % (the fleet is failing) eject nobody.
    pub const PEER_FACTOR: f64 = 5.0;
    /// Client prefixes (IPv4 addresses, IPv6 /64s) a verdict needs among
    /// the flows failing at the moment (issue 38): one client, or two,
    /// cannot eject a backend; a hung backend fails for every client.
    pub const MIN_SOURCES: u32 = 3;
    /// Failing flows of one client prefix counted at most: beyond it one
    /// client's flows weigh no more than a few of anyone's.
    pub const SOURCE_CAP: u32 = 4;
}

/// Bounds of each setting.
const MIN_TIMEOUT: Duration = Duration::from_millis(100);
const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// At least five samples (`health::passive::SAMPLE_PERIOD`).
const MIN_WINDOW: Duration = Duration::from_millis(500);
const MAX_WINDOW: Duration = Duration::from_secs(60);
const MAX_MIN_REQUESTS: i64 = 1_000_000;
const MAX_MIN_SOURCES: i64 = 64;
const MAX_SOURCE_CAP: i64 = 1_000_000;

/// A VIP's passive detection settings, merged.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PassiveConfig {
    /// Whether the data plane counts and the daemon judges: only ever true
    /// for a NAT VIP.
    pub enabled: bool,
    #[serde(serialize_with = "ser_duration")]
    pub connect_timeout: Duration,
    #[serde(serialize_with = "ser_duration")]
    pub response_timeout: Duration,
    #[serde(serialize_with = "ser_duration")]
    pub window: Duration,
    pub min_requests: u64,
    /// 0–1 (written as a percentage).
    #[serde(serialize_with = "ser_share")]
    pub failure_threshold: f64,
    pub peer_factor: f64,
    /// Client prefixes a verdict needs (`health::passive::sources`).
    pub min_sources: u32,
    /// Failing flows of one client prefix counted at most.
    pub source_cap: u32,
}

impl Default for PassiveConfig {
    fn default() -> Self {
        Self {
            enabled: defaults::ENABLED,
            connect_timeout: defaults::CONNECT_TIMEOUT,
            response_timeout: defaults::RESPONSE_TIMEOUT,
            window: defaults::WINDOW,
            min_requests: defaults::MIN_REQUESTS,
            failure_threshold: defaults::FAILURE_THRESHOLD,
            peer_factor: defaults::PEER_FACTOR,
            min_sources: defaults::MIN_SOURCES,
            source_cap: defaults::SOURCE_CAP,
        }
    }
}

impl PassiveConfig {
    /// What the estimator judges with.
    pub fn thresholds(&self) -> Thresholds {
        Thresholds {
            window: self.window,
            response_timeout: self.response_timeout,
            connect_timeout: self.connect_timeout,
            min_requests: self.min_requests,
            failure_threshold: self.failure_threshold,
            peer_factor: self.peer_factor,
        }
    }

    /// What a verdict needs of its failing flows' sources.
    pub fn source_rule(&self) -> SourceRule {
        SourceRule {
            min_sources: self.min_sources,
            cap: self.source_cap,
        }
    }

    /// How far back the daemon keeps samples: the window and the longer
    /// timeout before it, and one sample more.
    pub fn history(&self) -> Duration {
        self.window
            + self.response_timeout.max(self.connect_timeout)
            + crate::health::passive::SAMPLE_PERIOD
    }
}

/// Writes the thresholds the data plane needs into a NAT VIP's pool
/// (0 = off: nothing is counted as unanswered or timed out).
pub fn apply_pool_timeouts(pool: &mut lb_common::nat::NatPool, p: &PassiveConfig) {
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let (response, connect) = if p.enabled {
        (ns(p.response_timeout), ns(p.connect_timeout))
    } else {
        (0, 0)
    };
    pool.response_timeout_ns = response;
    pool.connect_timeout_ns = connect;
}

fn ser_share<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{}%", v * 100.0))
}

/// Merges `[passive]` (`global`) and the VIP's `[vip.passive]` (`local`,
/// in `ctx`) over the defaults for a VIP of `mode`.
pub(super) fn resolve(
    global: Option<&RawPassive>,
    local: Option<&RawPassive>,
    mode: Mode,
    ctx: &str,
    p: &mut Problems<'_>,
) -> PassiveConfig {
    let mut cfg = PassiveConfig::default();
    if let Some(raw) = global {
        apply_layer(raw, "passive", &mut cfg, p);
    }
    let local_ctx = format!("{ctx}: passive");
    if let Some(raw) = local {
        apply_layer(raw, &local_ctx, &mut cfg, p);
    }
    let nat = lb_common::nat::is_nat(mode.as_raw());
    if !nat {
        if let Some(raw) = local {
            refuse_on_dsr(raw, &local_ctx, p);
        }
        cfg.enabled = false;
    }
    cfg
}

/// A DSR VIP's own `[vip.passive]`: `enabled = true` cannot be honoured.
fn refuse_on_dsr(raw: &RawPassive, ctx: &str, p: &mut Problems<'_>) {
    const WHY: &str = "the backends of a DSR VIP answer clients directly, so the load \
                       balancer never sees their answers";
    if raw.enabled == Some(true) {
        p.error(
            ctx,
            format!(
                "enabled = true needs mode = \"nat\": {WHY}; set mode = \"nat\" or \
                 remove [vip.passive]"
            ),
        );
    } else if raw.enabled.is_none() {
        p.warn(
            ctx,
            format!("has no effect: passive detection needs mode = \"nat\" ({WHY})"),
        );
    }
}

/// Each field `raw` sets, checked, overrides the value below it; an
/// invalid one is reported and leaves that value.
fn apply_layer(raw: &RawPassive, ctx: &str, cfg: &mut PassiveConfig, p: &mut Problems<'_>) {
    if let Some(b) = raw.enabled {
        cfg.enabled = b;
    }
    let (lo, hi) = (MIN_TIMEOUT, MAX_TIMEOUT);
    if let Some(d) = duration("connect_timeout", &raw.connect_timeout, (lo, hi), ctx, p) {
        cfg.connect_timeout = d;
    }
    if let Some(d) = duration("response_timeout", &raw.response_timeout, (lo, hi), ctx, p) {
        cfg.response_timeout = d;
    }
    let bounds = (MIN_WINDOW, MAX_WINDOW);
    if let Some(d) = duration("window", &raw.window, bounds, ctx, p) {
        cfg.window = d;
    }
    if let Some(n) = raw.min_requests {
        match u64::try_from(n) {
            Ok(n) if (1..=MAX_MIN_REQUESTS as u64).contains(&n) => cfg.min_requests = n,
            _ => p.error(
                ctx,
                format!(
                    "min_requests {n} is out of range; use 1 to {MAX_MIN_REQUESTS} \
                     (requests and connections judged in the window before a verdict)"
                ),
            ),
        }
    }
    if let Some(text) = &raw.failure_threshold {
        match parse_percent(text).filter(|v| *v >= 1.0 && *v <= 100.0) {
            Some(v) => cfg.failure_threshold = v / 100.0,
            None => p.error(
                ctx,
                format!(
                    "failure_threshold {text:?} is invalid; use a percentage from \"1%\" to \
                     \"100%\" (the share of a backend's requests that must fail)"
                ),
            ),
        }
    }
    if let Some(f) = raw.peer_factor {
        if f.is_finite() && f > 1.0 && f <= 100.0 {
            cfg.peer_factor = f;
        } else {
            p.error(
                ctx,
                format!(
                    "peer_factor {f} is out of range; use a number above 1 and at most 100 \
                     (5 = failing five times as often as its peers)"
                ),
            );
        }
    }
    let meaning = "client prefixes a verdict needs among the failing flows";
    if let Some(n) = bounded(
        "min_sources",
        raw.min_sources,
        (1, MAX_MIN_SOURCES),
        meaning,
        ctx,
        p,
    ) {
        cfg.min_sources = n;
    }
    let meaning = "failing flows of one client prefix counted at most";
    if let Some(n) = bounded(
        "source_cap",
        raw.source_cap,
        (1, MAX_SOURCE_CAP),
        meaning,
        ctx,
        p,
    ) {
        cfg.source_cap = n;
    }
}

/// An integer setting within `lo..=hi`, or an error saying what it means.
fn bounded(
    field: &str,
    raw: Option<i64>,
    (lo, hi): (i64, i64),
    meaning: &str,
    ctx: &str,
    p: &mut Problems<'_>,
) -> Option<u32> {
    let n = raw?;
    match u32::try_from(n) {
        Ok(v) if (lo..=hi).contains(&n) => Some(v),
        _ => {
            p.error(
                ctx,
                format!("{field} {n} is out of range; use {lo} to {hi} ({meaning})"),
            );
            None
        }
    }
}

fn duration(
    field: &str,
    raw: &Option<String>,
    bounds: (Duration, Duration),
    ctx: &str,
    p: &mut Problems<'_>,
) -> Option<Duration> {
    super::bounded_duration(field, raw.as_deref()?, bounds, ctx, p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::config::tests::DAEMON;

    /// A configuration with `global` as its `[passive]` table (if any) and
    /// one VIP "api" of `mode` whose `[vip.passive]` is `local` (if any).
    fn config(global: &str, local: &str, mode: &str) -> String {
        let table = |header: &str, body: &str| {
            if body.is_empty() {
                String::new()
            } else {
                format!("{header}\n{body}\n")
            }
        };
        let global = table("[passive]", global);
        let local = table("[vip.passive]", local);
        format!(
            r#"{DAEMON}{global}
[[vip]]
name = "api"
address = "10.100.0.1"
port = 80
mode = "{mode}"
{local}
[[vip.backend]]
address = "10.0.0.11"
"#
        )
    }

    fn passive(global: &str, local: &str) -> PassiveConfig {
        let cfg = Config::from_str(&config(global, local, "dsr-ipip"), "xlb.toml").expect("valid");
        cfg.vips[0].passive.clone()
    }

    /// Merging, as a NAT VIP would see it (the DSR VIP forces `enabled`
    /// off, which `a_dsr_vip_never_has_it` checks).
    #[test]
    fn the_source_rule_merges_like_the_rest() {
        let d = merged("", "").source_rule();
        assert_eq!((d.min_sources, d.cap), (3, 4));
        let r = merged("min_sources = 2\nsource_cap = 10", "min_sources = 1").source_rule();
        assert_eq!((r.min_sources, r.cap), (1, 10));
    }

    fn merged(global: &str, local: &str) -> PassiveConfig {
        let mut p = Problems {
            origin: "xlb.toml",
            errors: Vec::new(),
            warnings: Vec::new(),
        };
        let parse = |t: &str| toml::from_str::<RawPassive>(t).expect("parses");
        let (g, l) = (parse(global), parse(local));
        let mut cfg = PassiveConfig::default();
        apply_layer(&g, "passive", &mut cfg, &mut p);
        apply_layer(&l, "vip \"api\": passive", &mut cfg, &mut p);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        cfg
    }

    #[test]
    fn defaults_and_merge() {
        assert_eq!(merged("", ""), PassiveConfig::default());
        let m = merged(
            "window = \"4s\"\nresponse_timeout = \"500ms\"\nmin_requests = 20",
            "response_timeout = \"3s\"\nfailure_threshold = \"50%\"\nenabled = false",
        );
        assert_eq!(
            m,
            PassiveConfig {
                enabled: false,
                window: Duration::from_secs(4),
                response_timeout: Duration::from_secs(3),
                min_requests: 20,
                failure_threshold: 0.5,
                ..PassiveConfig::default()
            }
        );
        let t = merged("peer_factor = 3.0\nconnect_timeout = \"2s\"", "").thresholds();
        assert_eq!(
            (t.peer_factor, t.connect_timeout),
            (3.0, Duration::from_secs(2))
        );
    }

    #[test]
    fn a_dsr_vip_never_has_it() {
        assert!(!passive("enabled = true", "").enabled);
        let cfg = Config::from_str(&config("", "window = \"3s\"", "dsr-l2"), "xlb.toml")
            .expect("a warning only");
        assert!(!cfg.vips[0].passive.enabled);
        assert_eq!(
            cfg.warnings,
            [
                "xlb.toml: vip \"api\": passive: has no effect: passive detection needs \
                 mode = \"nat\" (the backends of a DSR VIP answer clients directly, so the \
                 load balancer never sees their answers)"
            ]
        );
    }

    #[test]
    fn pool_timeouts_follow_the_settings() {
        let mut pool = lb_common::nat::NatPool::default();
        let on = merged(
            "response_timeout = \"1500ms\"\nconnect_timeout = \"2s\"",
            "",
        );
        apply_pool_timeouts(&mut pool, &on);
        assert_eq!(
            (pool.response_timeout_ns, pool.connect_timeout_ns),
            (1_500_000_000, 2_000_000_000)
        );
        apply_pool_timeouts(&mut pool, &merged("enabled = false", ""));
        assert_eq!((pool.response_timeout_ns, pool.connect_timeout_ns), (0, 0));
    }

    rejects! {
        enabled_on_a_dsr_vip: config("", "enabled = true", "dsr-ipip") => [
            r#"xlb.toml: vip "api": passive: enabled = true needs mode = "nat": the backends of a DSR VIP answer clients directly, so the load balancer never sees their answers; set mode = "nat" or remove [vip.passive]"#,
        ];
        window_too_short: config(r#"window = "100ms""#, "", "dsr-ipip") => [
            r#"xlb.toml: passive: window "100ms" is out of range; use 500ms to 1m"#,
        ];
        response_timeout_not_a_duration: config("", "response_timeout = \"soon\"\nenabled = false", "dsr-ipip") => [
            r#"xlb.toml: vip "api": passive: response_timeout "soon" is not a duration; write a number and a unit (ms, s, m, h or d), e.g. "500ms", "2s", "1.5s", "1m""#,
        ];
        min_requests_of_zero: config("min_requests = 0", "", "dsr-ipip") => [
            "xlb.toml: passive: min_requests 0 is out of range; use 1 to 1000000 (requests and connections judged in the window before a verdict)",
        ];
        failure_threshold_above_100: config(r#"failure_threshold = "120%""#, "", "dsr-ipip") => [
            r#"xlb.toml: passive: failure_threshold "120%" is invalid; use a percentage from "1%" to "100%" (the share of a backend's requests that must fail)"#,
        ];
        peer_factor_of_1: config("peer_factor = 1.0", "", "dsr-ipip") => [
            "xlb.toml: passive: peer_factor 1 is out of range; use a number above 1 and at most 100 (5 = failing five times as often as its peers)",
        ];
        min_sources_of_0: config("min_sources = 0", "", "dsr-ipip") => [
            "xlb.toml: passive: min_sources 0 is out of range; use 1 to 64 (client prefixes a verdict needs among the failing flows)",
        ];
        source_cap_negative: config("source_cap = -1", "", "dsr-ipip") => [
            "xlb.toml: passive: source_cap -1 is out of range; use 1 to 1000000 (failing flows of one client prefix counted at most)",
        ];
    }

    #[test]
    fn unknown_keys_are_refused() {
        let unknown = Config::from_str(&config("windows = \"2s\"", "", "dsr-ipip"), "xlb.toml")
            .expect_err("unknown key")
            .to_string();
        assert!(unknown.contains("unknown field `windows`"), "{unknown}");
    }
}
