//! `[protection]` and `[vip.protection]`: what a VIP does when its backends
//! are slow or failing (see `health::policy`). Fields merge one by one:
//! built-in defaults ← `[protection]` ← `[vip.protection]`.

use std::time::Duration;

use serde::{Serialize, Serializer};

use super::raw::{RawLimit, RawProtection};
use super::{Problems, parse_percent, ser_duration};
use crate::health::policy::{Limit, Policy};

/// Longest `slow_start` and `flap_half_life`.
const MAX_PERIOD: Duration = Duration::from_secs(3600);

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

/// Each field `raw` sets, checked, overrides the value below it; an
/// invalid one is reported and leaves that value.
fn apply_layer(raw: &RawProtection, ctx: &str, policy: &mut Policy, p: &mut Problems<'_>) {
    let zero = Duration::ZERO;
    if let Some(l) = limit("max_ejected", raw.max_ejected.as_ref(), ctx, p) {
        policy.max_ejected = l;
    }
    if let Some(l) = limit("min_healthy", raw.min_healthy.as_ref(), ctx, p) {
        policy.min_healthy = l;
    }
    if let Some(f) = outlier_factor(raw.outlier_factor, ctx, p) {
        policy.outlier_factor = f;
    }
    if let Some(d) = duration("outlier_margin", &raw.outlier_margin, zero, ctx, p) {
        policy.outlier_margin = d;
    }
    if let Some(d) = duration("slow_start", &raw.slow_start, zero, ctx, p) {
        policy.slow_start = d;
    }
    if let Some(b) = raw.flap_damping {
        policy.flap_damping = b;
    }
    let min_half = Duration::from_secs(1);
    if let Some(d) = duration("flap_half_life", &raw.flap_half_life, min_half, ctx, p) {
        policy.flap_half_life = d;
    }
    if let Some(f) = flap_limit(raw.flap_limit, ctx, p) {
        policy.flap_limit = f;
    }
}

/// How many times slower than the peers' median makes an outlier.
fn outlier_factor(value: Option<f64>, ctx: &str, p: &mut Problems<'_>) -> Option<f64> {
    let f = value?;
    if f > 1.0 && f <= 100.0 {
        return Some(f);
    }
    p.error(
        ctx,
        format!(
            "outlier_factor {f} is out of range; use a number above 1 and at most 100 \
             (3 = three times slower than the peers' median)"
        ),
    );
    None
}

/// The flap penalty (about one per exit from the table) at which a backend
/// is held down.
fn flap_limit(value: Option<f64>, ctx: &str, p: &mut Problems<'_>) -> Option<f64> {
    let f = value?;
    if f.is_finite() && (1.0..=100.0).contains(&f) {
        return Some(f);
    }
    p.error(
        ctx,
        format!(
            "flap_limit {f} is out of range; use 1 to 100 (about one per exit from \
             the table; set flap_damping = false to turn damping off)"
        ),
    );
    None
}

fn limit(field: &str, raw: Option<&RawLimit>, ctx: &str, p: &mut Problems<'_>) -> Option<Limit> {
    let raw = raw?;
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
        let shown = raw.shown();
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
    super::bounded_duration(field, raw.as_deref()?, (min, MAX_PERIOD), ctx, p)
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
    use crate::config::tests::DAEMON;

    /// A configuration with `global` as its `[protection]` table (if any) and
    /// one VIP "api" whose own `[vip.protection]` is `local` (if any).
    fn config(global: &str, local: &str) -> String {
        let table = |header: &str, body: &str| {
            if body.is_empty() {
                String::new()
            } else {
                format!("{header}\n{body}\n")
            }
        };
        let global = table("[protection]", global);
        let local = table("[vip.protection]", local);
        format!(
            r#"{DAEMON}{global}
[[vip]]
name = "api"
address = "10.100.0.1"
port = 80
{local}
[[vip.backend]]
address = "10.0.0.11"
"#
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

    rejects! {
        negative_count: config("max_ejected = -1", "") => [
            r#"xlb.toml: protection: max_ejected -1 is invalid; use a number of backends from 0 to 4095 or a percentage from "0%" to "100%""#,
        ];
        percentage_above_100_in_the_vip: config("", r#"min_healthy = "150%""#) => [
            r#"xlb.toml: vip "api": protection: min_healthy "150%" is invalid; use a number of backends from 0 to 4095 or a percentage from "0%" to "100%""#,
        ];
        factor_of_1: config("outlier_factor = 1.0", "") => [
            "xlb.toml: protection: outlier_factor 1 is out of range; use a number above 1 and at most 100 (3 = three times slower than the peers' median)",
        ];
        half_life_of_zero: config("", r#"flap_half_life = "0s""#) => [
            r#"xlb.toml: vip "api": protection: flap_half_life "0s" is out of range; use 1s to 1h"#,
        ];
        slow_start_of_two_hours: config(r#"slow_start = "2h""#, "") => [
            r#"xlb.toml: protection: slow_start "2h" is out of range; use 0s to 1h"#,
        ];
        slow_start_not_a_duration: config(r#"slow_start = "soon""#, "") => [
            r#"xlb.toml: protection: slow_start "soon" is not a duration; write a number and a unit (ms, s, m, h or d), e.g. "500ms", "2s", "1.5s", "1m""#,
        ];
        flap_limit_below_1: config("flap_limit = 0.5", "") => [
            "xlb.toml: protection: flap_limit 0.5 is out of range; use 1 to 100 (about one per exit from the table; set flap_damping = false to turn damping off)",
        ];
    }

    #[test]
    fn unknown_keys_are_refused() {
        let unknown = Config::from_str(&config("max_eject = 1", ""), "xlb.toml")
            .expect_err("unknown key")
            .to_string();
        assert!(unknown.contains("unknown field `max_eject`"), "{unknown}");
    }
}
