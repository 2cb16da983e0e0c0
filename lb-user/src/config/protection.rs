//! `[protection]` and `[vip.protection]`: what a VIP does when its backends
//! are slow or failing (see `health::policy`). Fields merge one by one:
//! built-in defaults ← `[protection]` ← `[vip.protection]`.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use super::{Problems, parse_duration, parse_percent, ser_duration};
use crate::health::policy::{Limit, Policy};

/// Longest `slow_start` and `flap_half_life`.
const MAX_PERIOD: Duration = Duration::from_secs(3600);

#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProtection {
    max_ejected: Option<RawLimit>,
    min_healthy: Option<RawLimit>,
    outlier_factor: Option<f64>,
    outlier_margin: Option<String>,
    slow_start: Option<String>,
    flap_damping: Option<bool>,
    flap_half_life: Option<String>,
    flap_limit: Option<f64>,
}

/// `2` or `"10%"`.
#[derive(Clone)]
enum RawLimit {
    Count(i64),
    Text(String),
}

impl<'de> Deserialize<'de> for RawLimit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawLimit;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of backends or a percentage such as \"10%\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawLimit, E> {
                Ok(RawLimit::Count(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawLimit, E> {
                Ok(RawLimit::Count(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawLimit, E> {
                Ok(RawLimit::Text(v.to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}

/// Merges `layers` (least specific first, each with its place for messages)
/// over the defaults and checks every value.
pub(super) fn resolve(layers: &[(Option<&RawProtection>, &str)], p: &mut Problems<'_>) -> Policy {
    let mut policy = Policy::default();
    for (raw, ctx) in layers {
        let Some(raw) = raw else { continue };
        apply_layer(raw, ctx, &mut policy, p);
    }
    policy
}

fn apply_layer(raw: &RawProtection, ctx: &str, policy: &mut Policy, p: &mut Problems<'_>) {
    if let Some(v) = &raw.max_ejected
        && let Some(l) = limit("max_ejected", v, ctx, p)
    {
        policy.max_ejected = l;
    }
    if let Some(v) = &raw.min_healthy
        && let Some(l) = limit("min_healthy", v, ctx, p)
    {
        policy.min_healthy = l;
    }
    if let Some(f) = raw.outlier_factor {
        if f > 1.0 && f <= 100.0 {
            policy.outlier_factor = f;
        } else {
            p.error(
                ctx,
                format!(
                    "outlier_factor {f} is out of range; use a number above 1 and at most 100 \
                     (3 = three times slower than the peers' median)"
                ),
            );
        }
    }
    if let Some(d) = duration(
        "outlier_margin",
        &raw.outlier_margin,
        Duration::ZERO,
        ctx,
        p,
    ) {
        policy.outlier_margin = d;
    }
    if let Some(d) = duration("slow_start", &raw.slow_start, Duration::ZERO, ctx, p) {
        policy.slow_start = d;
    }
    if let Some(b) = raw.flap_damping {
        policy.flap_damping = b;
    }
    let min_half = Duration::from_secs(1);
    if let Some(d) = duration("flap_half_life", &raw.flap_half_life, min_half, ctx, p) {
        policy.flap_half_life = d;
    }
    if let Some(f) = raw.flap_limit {
        if f.is_finite() && (1.0..=100.0).contains(&f) {
            policy.flap_limit = f;
        } else {
            p.error(
                ctx,
                format!(
                    "flap_limit {f} is out of range; use 1 to 100 (about one per exit from \
                     the table; set flap_damping = false to turn damping off)"
                ),
            );
        }
    }
}

fn limit(field: &str, raw: &RawLimit, ctx: &str, p: &mut Problems<'_>) -> Option<Limit> {
    let max = lb_common::MAX_BACKENDS - 1;
    let parsed = match raw {
        RawLimit::Count(c) => u32::try_from(*c)
            .ok()
            .filter(|&c| c <= max)
            .map(Limit::Count),
        RawLimit::Text(t) => parse_percent(t)
            .filter(|v| v.is_finite() && (0.0..=100.0).contains(v))
            .map(Limit::Percent),
    };
    if parsed.is_none() {
        let shown = match raw {
            RawLimit::Count(c) => c.to_string(),
            RawLimit::Text(t) => format!("{t:?}"),
        };
        p.error(
            ctx,
            format!(
                "{field} {shown} is invalid; use a number of backends from 0 to {max} \
                 or a percentage from \"0%\" to \"100%\""
            ),
        );
    }
    parsed
}

fn duration(
    field: &str,
    raw: &Option<String>,
    min: Duration,
    ctx: &str,
    p: &mut Problems<'_>,
) -> Option<Duration> {
    let text = raw.as_deref()?;
    match parse_duration(text) {
        Ok(d) if d < min || d > MAX_PERIOD => {
            p.error(
                ctx,
                format!("{field} {text:?} is out of range; use {min:?} to {MAX_PERIOD:?}"),
            );
            None
        }
        Ok(d) => Some(d),
        Err(e) => {
            p.error(ctx, format!("{field} {e}"));
            None
        }
    }
}

pub(super) fn ser_policy<S: Serializer>(policy: &Policy, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Shown {
        max_ejected: String,
        min_healthy: String,
        outlier_factor: f64,
        #[serde(serialize_with = "ser_duration")]
        outlier_margin: Duration,
        #[serde(serialize_with = "ser_duration")]
        slow_start: Duration,
        flap_damping: bool,
        #[serde(serialize_with = "ser_duration")]
        flap_half_life: Duration,
        flap_limit: f64,
    }
    Shown {
        max_ejected: policy.max_ejected.to_string(),
        min_healthy: policy.min_healthy.to_string(),
        outlier_factor: policy.outlier_factor,
        outlier_margin: policy.outlier_margin,
        slow_start: policy.slow_start,
        flap_damping: policy.flap_damping,
        flap_half_life: policy.flap_half_life,
        flap_limit: policy.flap_limit,
    }
    .serialize(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const BASE: &str = r#"
[daemon]
interface = "eth0"
"#;

    /// A configuration with `global` as its `[protection]` table (if any) and
    /// one VIP "api" whose own `[vip.protection]` is `local` (if any).
    fn config(global: &str, local: &str) -> String {
        let global = if global.is_empty() {
            String::new()
        } else {
            format!("[protection]\n{global}\n")
        };
        let local = if local.is_empty() {
            String::new()
        } else {
            format!("[vip.protection]\n{local}\n")
        };
        format!(
            "{BASE}{global}[[vip]]\nname = \"api\"\naddress = \"10.100.0.1\"\nport = 80\n\
             {local}[[vip.backend]]\naddress = \"10.0.0.11\"\n"
        )
    }

    fn policy(global: &str, local: &str) -> Policy {
        let cfg = Config::from_str(&config(global, local), "xlb.toml").expect("valid");
        cfg.vips[0].protection.clone()
    }

    #[test]
    fn defaults_and_merge() {
        assert_eq!(policy("", ""), Policy::default());
        let merged = policy(
            "max_ejected = 2\nmin_healthy = \"50%\"\nslow_start = \"30s\"",
            "max_ejected = \"20%\"\nflap_damping = false\noutlier_margin = \"0s\"",
        );
        assert_eq!(
            merged,
            Policy {
                max_ejected: Limit::Percent(20.0),
                min_healthy: Limit::Percent(50.0),
                slow_start: Duration::from_secs(30),
                flap_damping: false,
                outlier_margin: Duration::ZERO,
                ..Policy::default()
            }
        );
        let all = policy(
            "outlier_factor = 5.0\nflap_half_life = \"2m\"\nflap_limit = 6.0\nmin_healthy = 0",
            "",
        );
        assert_eq!(all.outlier_factor, 5.0);
        assert_eq!(all.flap_half_life, Duration::from_secs(120));
        assert_eq!(all.flap_limit, 6.0);
        assert_eq!(all.min_healthy, Limit::Count(0));
    }

    #[test]
    fn invalid_values_are_named() {
        let cases = [
            (
                "negative count",
                config("max_ejected = -1", ""),
                r#"xlb.toml: protection: max_ejected -1 is invalid; use a number of backends from 0 to 4095 or a percentage from "0%" to "100%""#,
            ),
            (
                "percentage above 100, in the VIP",
                config("", "min_healthy = \"150%\""),
                r#"xlb.toml: vip "api": protection: min_healthy "150%" is invalid; use a number of backends from 0 to 4095 or a percentage from "0%" to "100%""#,
            ),
            (
                "factor of 1",
                config("outlier_factor = 1.0", ""),
                "xlb.toml: protection: outlier_factor 1 is out of range; use a number above 1 and at most 100 (3 = three times slower than the peers' median)",
            ),
            (
                "half-life of zero",
                config("", "flap_half_life = \"0s\""),
                r#"xlb.toml: vip "api": protection: flap_half_life "0s" is out of range; use 1s to 3600s"#,
            ),
            (
                "slow start not a duration",
                config("slow_start = \"soon\"", ""),
                r#"xlb.toml: protection: slow_start "soon" is not a duration; write a number and a unit (ms, s, m or h), e.g. "500ms", "2s", "1.5s", "1m""#,
            ),
            (
                "flap limit below 1",
                config("flap_limit = 0.5", ""),
                "xlb.toml: protection: flap_limit 0.5 is out of range; use 1 to 100 (about one per exit from the table; set flap_damping = false to turn damping off)",
            ),
        ];
        for (name, text, want) in cases {
            let err = Config::from_str(&text, "xlb.toml").expect_err(name);
            assert_eq!(err.to_string(), want, "{name}");
        }
        let unknown = Config::from_str(&config("max_eject = 1", ""), "xlb.toml")
            .expect_err("unknown key")
            .to_string();
        assert!(unknown.contains("unknown field `max_eject`"), "{unknown}");
    }
}
