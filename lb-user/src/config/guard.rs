//! `[guard]` and `[vip.guard]`: abuse control. The deny and allow lists
//! (`[[guard.deny]]`, `[[vip.guard.allow]]`, ...), how sources are keyed
//! and limited, when a heavy source raises an alert or is blocked.
//!
//! Settings merge key by key: built-in defaults ← `[guard]` ←
//! `[vip.guard]` (an inline table such as `new_flows_per_source` is one
//! key: the VIP's replaces the global one whole). Lists do not merge: the
//! global lists apply to every VIP ([`GuardConfig`]), each VIP's own lists
//! to it alone ([`VipGuardConfig`]).

use std::collections::HashMap;
use std::time::Duration;

use lb_ctl::GuardAction;
use serde::Serialize;

use super::raw::{RawAutoBlock, RawGuard, RawListRule, RawShare, RawSourceAlert, RawSourceLimit};
use super::{Problems, parse_percent, ser_duration};
use crate::guard::Prefix;

/// Defaults of the `[guard]` settings.
pub mod defaults {
    use std::time::Duration;

    /// `guard.track_sources`: count sources so that `xlb sources` works with
    /// no limit set (one LRU update per new flow).
    pub const TRACK_SOURCES: bool = true;
    /// `guard.source_v4_prefix`: an IPv4 source is one address.
    pub const SOURCE_V4_PREFIX: u8 = 32;
    /// `guard.source_v6_prefix`: an IPv6 source is a /64, what one host or
    /// one customer is usually given.
    pub const SOURCE_V6_PREFIX: u8 = 64;
    /// `source_alert.min_rate`: a VIP's new flows/s below which the share
    /// alert is not judged (one source is 100% of a quiet VIP).
    pub const ALERT_MIN_RATE: f64 = 10.0;
    /// `auto_block.for`.
    pub const AUTO_BLOCK_FOR: Duration = Duration::from_secs(10);
    /// `auto_block.ttl`.
    pub const AUTO_BLOCK_TTL: Duration = Duration::from_secs(15 * 60);
    /// `guard.ct_insert_cap`: conntrack inserts per CPU per second, Katran's
    /// default (`MAX_CONN_RATE`, 125,000 new flows/s per core). Far above
    /// what one core forwards in new flows of real clients, so it never
    /// touches them, and it bounds how fast a random-source flood turns the
    /// conntrack LRU over: at the default `conntrack_size` (1,048,576) and 8
    /// CPUs, a flood at the cap on every CPU replaces the table in about a
    /// second, where an uncapped one (millions of SYNs a second per core in
    /// XDP) does it many times a second. Sizing: README, `ct_insert_cap`.
    pub const CT_INSERT_CAP: u64 = 125_000;
}

/// Lowest rate of a limit, an alert or an auto block (one per minute).
const MIN_RATE: f64 = 1.0 / 60.0;
/// Highest rate of a limit: keeps the GCRA interval at 100 ns or more.
const MAX_RATE: f64 = 10_000_000.0;
/// Largest `burst`.
const MAX_BURST: i64 = 1_000_000;
/// Longest `reason`: it is shown in a table column.
const MAX_REASON: usize = 200;
/// Longest `auto_block.ttl` (and `xlb block --ttl`).
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// Longest `auto_block.for`.
const MAX_SUSTAIN: Duration = Duration::from_secs(3600);
/// Shortest `source_v4_prefix`: a /16 (65,536 addresses, a large
/// provider's block) is the widest network one source may stand for. Wider,
/// one client's flood, or forged SYNs anywhere in the network, would limit
/// and block everyone in it.
const MIN_SOURCE_V4_PREFIX: u8 = 16;
/// Shortest `source_v6_prefix`: a /32 is a whole provider's allocation
/// (RIR minimum), the widest that may still be one party.
const MIN_SOURCE_V6_PREFIX: u8 = 32;
/// Highest `ct_insert_cap` (inserts per CPU per second).
const MAX_INSERT_CAP: f64 = 100_000_000.0;

/// The daemon-wide part of `[guard]`: what is not merged into the VIPs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GuardConfig {
    /// Conntrack inserts per CPU per second above which new flows are
    /// forwarded but not tracked ([`defaults::CT_INSERT_CAP`] unless set);
    /// `None` = no cap (`ct_insert_cap = "off"`).
    pub ct_insert_cap: Option<u64>,
    /// `[[guard.deny]]`: refused at every VIP, in file order.
    pub deny: Vec<ListRule>,
    /// `[[guard.allow]]`: never refused by a deny entry, at every VIP.
    pub allow: Vec<ListRule>,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            ct_insert_cap: Some(defaults::CT_INSERT_CAP),
            deny: Vec::new(),
            allow: Vec::new(),
        }
    }
}

/// One VIP's guard: `[guard]` merged under `[vip.guard]` key by key, and
/// the VIP's own lists.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VipGuardConfig {
    /// Count new flows and packets per source for `xlb sources`.
    pub track_sources: bool,
    /// Sources are keyed by this many leading bits of an IPv4 address...
    pub v4_prefix: u8,
    /// ...and of an IPv6 address.
    pub v6_prefix: u8,
    /// `new_flows_per_source`.
    pub limit: Option<SourceLimit>,
    /// `source_alert`.
    pub alert: Option<SourceAlert>,
    /// `auto_block`.
    pub auto_block: Option<AutoBlock>,
    /// `[[vip.guard.deny]]`: this VIP's own deny list, in file order.
    pub deny: Vec<ListRule>,
    /// `[[vip.guard.allow]]`.
    pub allow: Vec<ListRule>,
}

impl Default for VipGuardConfig {
    fn default() -> Self {
        VipGuardConfig {
            track_sources: defaults::TRACK_SOURCES,
            v4_prefix: defaults::SOURCE_V4_PREFIX,
            v6_prefix: defaults::SOURCE_V6_PREFIX,
            limit: None,
            alert: None,
            auto_block: None,
            deny: Vec::new(),
            allow: Vec::new(),
        }
    }
}

/// One list entry of the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ListRule {
    pub prefix: Prefix,
    /// Deny entries: what a refused new flow gets (allow entries: `Drop`,
    /// unused).
    pub action: GuardAction,
    /// Shown by `xlb blocks`; may be empty.
    pub reason: String,
}

/// `new_flows_per_source`: a token bucket per source, in XDP.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SourceLimit {
    /// New flows per second a source may open on average.
    pub rate_per_s: f64,
    /// New flows it may open at once after being idle (default: one
    /// second's worth, at least 1).
    pub burst: u64,
    /// What a new flow over the rate gets.
    pub action: GuardAction,
}

/// `source_alert`: when one source is a problem.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SourceAlert {
    /// A source opening more new flows per second than this.
    pub rate_per_s: Option<f64>,
    /// A source opening more than this fraction (0..=1) of the VIP's new
    /// flows...
    pub share: Option<f64>,
    /// ...while the VIP takes at least this many new flows per second.
    pub min_rate_per_s: f64,
}

/// `auto_block`: a source above `above_per_s` for `sustained` is added to
/// the VIP's deny list for `ttl`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AutoBlock {
    pub above_per_s: f64,
    #[serde(serialize_with = "ser_duration")]
    pub sustained: Duration,
    #[serde(serialize_with = "ser_duration")]
    pub ttl: Duration,
    pub action: GuardAction,
}

/// Parses a rate such as `"200/s"`, `"30/min"` or `"1.5/s"` into events per
/// second. The error says what was wrong, without saying where.
pub fn parse_rate(text: &str) -> Result<f64, String> {
    let bad = || {
        format!(
            "{text:?} is not a rate; write a number per second or per minute, \
             e.g. \"200/s\", \"30/min\""
        )
    };
    let (number, unit) = text.trim().split_once('/').ok_or_else(bad)?;
    let per_s = match unit.trim() {
        "s" => 1.0,
        "min" => 1.0 / 60.0,
        _ => return Err(bad()),
    };
    let number = number.trim();
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(bad());
    }
    let n: f64 = number.parse().map_err(|_| bad())?;
    Ok(n * per_s)
}

/// The daemon-wide settings and lists; the mergeable keys of `[guard]` are
/// checked here too, so that a file without VIPs still has them checked.
pub(super) fn global(raw: Option<&RawGuard>, p: &mut Problems<'_>) -> GuardConfig {
    let Some(raw) = raw else {
        return GuardConfig::default();
    };
    let ctx = "guard";
    let mut scratch = VipGuardConfig::default();
    apply_layer(raw, ctx, &mut scratch, p);
    check_needs_counts(&scratch, ctx, p);
    GuardConfig {
        ct_insert_cap: insert_cap(raw.ct_insert_cap.as_deref(), ctx, p),
        deny: list(&raw.deny, "guard: deny", true, p),
        allow: list(&raw.allow, "guard: allow", false, p),
    }
}

/// VIP `vip_ctx`'s guard: `global` then `local` over the defaults, and the
/// VIP's own lists.
pub(super) fn resolve_vip(
    global: Option<&RawGuard>,
    local: Option<&RawGuard>,
    vip_ctx: &str,
    p: &mut Problems<'_>,
) -> VipGuardConfig {
    let mut g = VipGuardConfig::default();
    if let Some(raw) = global {
        apply_layer(raw, "guard", &mut g, p);
    }
    let ctx = format!("{vip_ctx}: guard");
    let Some(raw) = local else {
        return g;
    };
    if raw.ct_insert_cap.is_some() {
        p.error(
            &ctx,
            "ct_insert_cap is a daemon-wide setting (each CPU's conntrack inserts per \
             second, all VIPs together); set it in [guard]",
        );
    }
    apply_layer(raw, &ctx, &mut g, p);
    check_needs_counts(&g, &ctx, p);
    g.deny = list(&raw.deny, &format!("{ctx}: deny"), true, p);
    g.allow = list(&raw.allow, &format!("{ctx}: allow"), false, p);
    g
}

/// Each key `raw` sets, checked, overrides the value below it; an invalid
/// one is reported and leaves that value.
fn apply_layer(raw: &RawGuard, ctx: &str, g: &mut VipGuardConfig, p: &mut Problems<'_>) {
    if let Some(b) = raw.track_sources {
        g.track_sources = b;
    }
    let v4 = ("source_v4_prefix", MIN_SOURCE_V4_PREFIX, 32);
    if let Some(len) = source_prefix(v4, raw.source_v4_prefix, ctx, p) {
        g.v4_prefix = len;
    }
    let v6 = ("source_v6_prefix", MIN_SOURCE_V6_PREFIX, 128);
    if let Some(len) = source_prefix(v6, raw.source_v6_prefix, ctx, p) {
        g.v6_prefix = len;
    }
    if let Some(raw) = &raw.new_flows_per_source {
        g.limit = source_limit(raw, ctx, p).or(g.limit.take());
    }
    if let Some(raw) = &raw.source_alert {
        g.alert = source_alert(raw, ctx, p).or(g.alert.take());
    }
    if let Some(raw) = &raw.auto_block {
        g.auto_block = auto_block(raw, ctx, p).or(g.auto_block.take());
    }
}

/// Alerts and auto blocks judge the per-source counts, which exist when
/// sources are tracked or limited.
fn check_needs_counts(g: &VipGuardConfig, ctx: &str, p: &mut Problems<'_>) {
    if g.track_sources || g.limit.is_some() {
        return;
    }
    for (set, key) in [
        (g.alert.is_some(), "source_alert"),
        (g.auto_block.is_some(), "auto_block"),
    ] {
        if set {
            p.error(
                ctx,
                format!(
                    "{key} needs the per-source counts, but track_sources = false and no \
                     new_flows_per_source is set; remove track_sources = false or {key}"
                ),
            );
        }
    }
}

/// `field` = `value` within `min..=max`, or `None` after an error.
fn source_prefix(
    (field, min, max): (&str, u8, u8),
    value: Option<i64>,
    ctx: &str,
    p: &mut Problems<'_>,
) -> Option<u8> {
    let len = value?;
    if (i64::from(min)..=i64::from(max)).contains(&len) {
        return Some(len as u8);
    }
    p.error(
        ctx,
        format!(
            "{field} {len} is out of range; use {min} to {max} (the leading bits that name a \
             source: a shorter prefix makes a whole network one source, one bucket and one \
             block, which anyone in it, or forging an address in it, could exhaust or trigger)"
        ),
    );
    None
}

/// The rate setting `field` = `text` within [`MIN_RATE`]..=`max`, or
/// `None` after an error.
fn rate(field: &str, text: &str, max: f64, ctx: &str, p: &mut Problems<'_>) -> Option<f64> {
    let r = match parse_rate(text) {
        Ok(r) => r,
        Err(e) => {
            p.error(ctx, format!("{field} {e}"));
            return None;
        }
    };
    if (MIN_RATE..=max).contains(&r) {
        return Some(r);
    }
    p.error(
        ctx,
        format!(
            "{field} {text:?} is out of range; use {} to {}",
            super::shown::rate(MIN_RATE),
            super::shown::rate(max)
        ),
    );
    None
}

fn source_limit(raw: &RawSourceLimit, ctx: &str, p: &mut Problems<'_>) -> Option<SourceLimit> {
    let field = "new_flows_per_source";
    let rate_per_s = rate(&format!("{field}.rate"), &raw.rate, MAX_RATE, ctx, p);
    let burst = match raw.burst {
        None => rate_per_s.map(|r| (r.ceil() as u64).max(1)),
        Some(b) if (1..=MAX_BURST).contains(&b) => Some(b as u64),
        Some(b) => {
            p.error(
                ctx,
                format!(
                    "{field}.burst {b} is out of range; use 1 to {MAX_BURST} (new flows a \
                     source may open at once)"
                ),
            );
            None
        }
    };
    Some(SourceLimit {
        rate_per_s: rate_per_s?,
        burst: burst?,
        action: raw.action.unwrap_or_default(),
    })
}

fn source_alert(raw: &RawSourceAlert, ctx: &str, p: &mut Problems<'_>) -> Option<SourceAlert> {
    let field = "source_alert";
    if raw.rate.is_none() && raw.share.is_none() {
        p.error(
            ctx,
            format!(
                "{field} sets neither rate nor share; set one or both, e.g. \
                 {{ rate = \"500/s\", share = \"50%\" }}"
            ),
        );
        return None;
    }
    let rate_per_s = raw
        .rate
        .as_deref()
        .map(|t| rate(&format!("{field}.rate"), t, MAX_RATE, ctx, p));
    let share = raw.share.as_ref().map(|s| share(s, ctx, p));
    let min_rate_per_s = match raw.min_rate.as_deref() {
        None => Some(defaults::ALERT_MIN_RATE),
        Some(t) => match parse_rate(t) {
            Ok(r) => Some(r),
            Err(e) => {
                p.error(ctx, format!("{field}.min_rate {e}"));
                None
            }
        },
    };
    Some(SourceAlert {
        rate_per_s: rate_per_s.map_or(Some(None), |r| r.map(Some))?,
        share: share.map_or(Some(None), |s| s.map(Some))?,
        min_rate_per_s: min_rate_per_s?,
    })
}

/// A fraction above 0 and at most 1.
fn share(raw: &RawShare, ctx: &str, p: &mut Problems<'_>) -> Option<f64> {
    let fraction = match raw {
        RawShare::Fraction(f) => Some(*f),
        RawShare::Text(t) => parse_percent(t).map(|v| v / 100.0),
    };
    let ok = fraction.filter(|f| f.is_finite() && *f > 0.0 && *f <= 1.0);
    if ok.is_none() {
        p.error(
            ctx,
            format!(
                "source_alert.share {} is invalid; use a fraction above 0 and at most 1 \
                 or a percentage above \"0%\" and at most \"100%\"",
                raw.shown()
            ),
        );
    }
    ok
}

fn auto_block(raw: &RawAutoBlock, ctx: &str, p: &mut Problems<'_>) -> Option<AutoBlock> {
    let above = rate("auto_block.above", &raw.above, MAX_RATE, ctx, p);
    let sustained = bounded_duration(
        "auto_block.for",
        raw.sustained.as_deref(),
        defaults::AUTO_BLOCK_FOR,
        (Duration::from_secs(1), MAX_SUSTAIN),
        ctx,
        p,
    );
    let ttl = bounded_duration(
        "auto_block.ttl",
        raw.ttl.as_deref(),
        defaults::AUTO_BLOCK_TTL,
        (Duration::from_secs(1), MAX_TTL),
        ctx,
        p,
    );
    Some(AutoBlock {
        above_per_s: above?,
        sustained: sustained?,
        ttl: ttl?,
        action: raw.action.unwrap_or_default(),
    })
}

fn bounded_duration(
    field: &str,
    text: Option<&str>,
    default: Duration,
    bounds: (Duration, Duration),
    ctx: &str,
    p: &mut Problems<'_>,
) -> Option<Duration> {
    match text {
        None => Some(default),
        Some(text) => super::bounded_duration(field, text, bounds, ctx, p),
    }
}

/// `ct_insert_cap`: the default when absent, `None` for `"off"`.
fn insert_cap(text: Option<&str>, ctx: &str, p: &mut Problems<'_>) -> Option<u64> {
    let Some(text) = text else {
        return Some(defaults::CT_INSERT_CAP);
    };
    if text.trim() == "off" {
        return None;
    }
    let r = rate("ct_insert_cap", text, MAX_INSERT_CAP, ctx, p)?;
    if r < 1.0 {
        p.error(
            ctx,
            format!(
                "ct_insert_cap {text:?} is below 1/s; the cap counts each CPU's inserts per \
                 second, so use at least \"1/s\" (or \"off\" for no cap)"
            ),
        );
        return None;
    }
    Some(r.round() as u64)
}

/// One list's entries in file order; `ctx` is e.g. `guard: deny`, and
/// entries are numbered from 1 in messages.
fn list(raw: &[RawListRule], ctx: &str, deny: bool, p: &mut Problems<'_>) -> Vec<ListRule> {
    let mut seen: HashMap<Prefix, usize> = HashMap::new();
    let mut out = Vec::new();
    for (i, r) in raw.iter().enumerate() {
        let ectx = format!("{ctx} entry {}", i + 1);
        let prefix = match r.prefix.parse::<Prefix>() {
            Ok(prefix) => prefix,
            Err(e) => {
                p.error(&ectx, format!("prefix {e}"));
                continue;
            }
        };
        if let Some(first) = seen.insert(prefix, i + 1) {
            p.error(
                &ectx,
                format!("{prefix} is listed twice (also entry {first}); remove one"),
            );
        }
        if !deny && r.action.is_some() {
            p.error(
                &ectx,
                "action applies to deny entries only (an allow entry lets its sources \
                 through); remove it",
            );
        }
        let reason = r.reason.clone().unwrap_or_default();
        if reason.chars().count() > MAX_REASON {
            p.error(
                &ectx,
                format!(
                    "reason is {} characters long; use at most {MAX_REASON}",
                    reason.chars().count()
                ),
            );
        }
        out.push(ListRule {
            prefix,
            action: r.action.unwrap_or_default(),
            reason,
        });
    }
    out
}

/// Every list entry of the file takes a rule id of the data plane, as does
/// every runtime entry.
pub(super) fn check_rule_count(
    global: &GuardConfig,
    vips: &[super::VipConfig],
    p: &mut Problems<'_>,
) {
    let count = global.deny.len()
        + global.allow.len()
        + vips
            .iter()
            .map(|v| v.guard.deny.len() + v.guard.allow.len())
            .sum::<usize>();
    let max = lb_common::MAX_LIST_RULES as usize;
    if count > max {
        p.error(
            "",
            format!(
                "{count} deny and allow entries in total, but the lists hold at most {max} \
                 (runtime entries included); merge entries into wider prefixes"
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::config::tests::{DAEMON, ORIGIN};

    /// A configuration with `global` as its `[guard]` body (tables such as
    /// `[[guard.deny]]` may follow it) and one VIP "api" whose `[vip.guard]`
    /// body is `local`; an empty body leaves its table out.
    fn config(global: &str, local: &str) -> String {
        let global = if global.is_empty() {
            String::new()
        } else {
            format!("[guard]\n{global}\n")
        };
        let local = if local.is_empty() {
            String::new()
        } else {
            format!("[vip.guard]\n{local}\n")
        };
        format!(
            r#"{DAEMON}{global}
[[vip]]
name = "api"
address = "10.100.0.1"
port = 80
[[vip.backend]]
address = "10.0.0.11"
{local}"#
        )
    }

    fn parse(global: &str, local: &str) -> Config {
        Config::from_str(&config(global, local), ORIGIN)
            .unwrap_or_else(|e| panic!("unexpected errors:\n{e}"))
    }

    fn rule(prefix: &str, action: GuardAction, reason: &str) -> ListRule {
        ListRule {
            prefix: prefix.parse().unwrap(),
            action,
            reason: reason.to_owned(),
        }
    }

    #[test]
    fn ct_insert_cap_defaults_to_katrans_and_may_be_turned_off() {
        let cases = [
            ("no [guard] at all", "", Some(125_000)),
            ("[guard] without it", "track_sources = true", Some(125_000)),
            ("set", r#"ct_insert_cap = "250000/s""#, Some(250_000)),
            ("off", r#"ct_insert_cap = "off""#, None),
        ];
        for (name, global, want) in cases {
            assert_eq!(parse(global, "").guard.ct_insert_cap, want, "{name}");
        }
    }

    #[test]
    fn defaults() {
        let cfg = parse("", "");
        assert_eq!(cfg.guard, GuardConfig::default());
        assert_eq!(cfg.vips[0].guard, VipGuardConfig::default());
        let g = VipGuardConfig::default();
        assert_eq!((g.track_sources, g.v4_prefix, g.v6_prefix), (true, 32, 64));
    }

    #[test]
    fn the_brief_example_and_merge() {
        let cfg = parse(
            r#"ct_insert_cap = "250000/s"
track_sources = true
source_v4_prefix = 32
source_v6_prefix = 64
new_flows_per_source = { rate = "200/s", burst = 400, action = "drop" }
source_alert = { rate = "500/s", share = "50%", min_rate = "20/s" }
auto_block = { above = "1000/s", for = "10s", ttl = "15m", action = "drop" }
[[guard.deny]]
prefix = "192.0.2.7/32"
action = "reset"
reason = "seed 001"
[[guard.allow]]
prefix = "10.0.0.0/8"
reason = "our monitoring"
"#,
            r#"new_flows_per_source = { rate = "50/s", burst = 100, action = "reset" }
source_v6_prefix = 56
[[vip.guard.deny]]
prefix = "2001:db8:1:2::/64"
"#,
        );
        assert_eq!(
            cfg.guard,
            GuardConfig {
                ct_insert_cap: Some(250_000),
                deny: vec![rule("192.0.2.7", GuardAction::Reset, "seed 001")],
                allow: vec![rule("10.0.0.0/8", GuardAction::Drop, "our monitoring")],
            }
        );
        assert_eq!(
            cfg.vips[0].guard,
            VipGuardConfig {
                track_sources: true,
                v4_prefix: 32,
                v6_prefix: 56,
                limit: Some(SourceLimit {
                    rate_per_s: 50.0,
                    burst: 100,
                    action: GuardAction::Reset,
                }),
                alert: Some(SourceAlert {
                    rate_per_s: Some(500.0),
                    share: Some(0.5),
                    min_rate_per_s: 20.0,
                }),
                auto_block: Some(AutoBlock {
                    above_per_s: 1000.0,
                    sustained: Duration::from_secs(10),
                    ttl: Duration::from_secs(900),
                    action: GuardAction::Drop,
                }),
                deny: vec![rule("2001:db8:1:2::/64", GuardAction::Drop, "")],
                allow: vec![],
            }
        );
    }

    #[test]
    fn value_defaults() {
        let cfg = parse(
            r#"new_flows_per_source = { rate = "90/min" }
source_alert = { share = 0.25 }
auto_block = { above = "100/s" }"#,
            "",
        );
        let g = &cfg.vips[0].guard;
        assert_eq!(
            g.limit,
            Some(SourceLimit {
                rate_per_s: 1.5,
                burst: 2,
                action: GuardAction::Drop
            })
        );
        assert_eq!(
            g.alert,
            Some(SourceAlert {
                rate_per_s: None,
                share: Some(0.25),
                min_rate_per_s: 10.0
            })
        );
        let auto = g.auto_block.as_ref().unwrap();
        assert_eq!(
            (auto.sustained, auto.ttl, auto.action),
            (
                Duration::from_secs(10),
                Duration::from_secs(900),
                GuardAction::Drop
            )
        );
    }

    #[test]
    fn a_vip_may_track_nothing() {
        let g = parse("", "track_sources = false").vips[0].guard.clone();
        assert!(!g.track_sources);
    }

    #[test]
    fn parse_rate_cases() {
        let good = [
            ("per second", "200/s", 200.0),
            ("per minute", "30/min", 0.5),
            ("decimal", "1.5/s", 1.5),
            ("spaces", " 10 / s ", 10.0),
        ];
        for (name, text, want) in good {
            assert_eq!(parse_rate(text), Ok(want), "{name}");
        }
        for (name, text) in [
            ("no unit", "200"),
            ("unknown unit", "200/h"),
            ("negative", "-1/s"),
            ("no number", "/s"),
            ("exponent", "1e3/s"),
        ] {
            assert_eq!(
                parse_rate(text),
                Err(format!(
                    "{text:?} is not a rate; write a number per second or per minute, e.g. \
                     \"200/s\", \"30/min\""
                )),
                "{name}"
            );
        }
    }

    rejects! {
        guard_deny_prefix_not_an_address: config(r#"
[[guard.deny]]
prefix = "192.0.2.300""#, "") => [
            r#"xlb.toml: guard: deny entry 1: prefix "192.0.2.300" is not an IP address or prefix; write an address ("192.0.2.7", "2001:db8::1") or a prefix ("192.0.2.0/24", "2001:db8:1:2::/64")"#,
        ];
        guard_deny_prefix_with_host_bits: config(r#"
[[guard.deny]]
prefix = "192.0.2.0/24"
[[guard.deny]]
prefix = "192.0.2.7/24""#, "") => [
            r#"xlb.toml: guard: deny entry 2: prefix "192.0.2.7/24" has host bits set; write "192.0.2.0/24" for the network, or "192.0.2.7/32" for the one address"#,
        ];
        guard_deny_prefix_too_long: config(r#"
[[guard.deny]]
prefix = "10.0.0.0/33""#, "") => [
            r#"xlb.toml: guard: deny entry 1: prefix "10.0.0.0/33": prefix length 33 is over 32 for an IPv4 address; use 0 to 32"#,
        ];
        vip_guard_deny_v6_prefix_too_long: config("", r#"
[[vip.guard.deny]]
prefix = "2001:db8::/129""#) => [
            r#"xlb.toml: vip "api": guard: deny entry 1: prefix "2001:db8::/129": prefix length 129 is over 128 for an IPv6 address; use 0 to 128"#,
        ];
        guard_deny_listed_twice: config(r#"
[[guard.deny]]
prefix = "192.0.2.7"
[[guard.deny]]
prefix = "192.0.2.7/32""#, "") => [
            "xlb.toml: guard: deny entry 2: 192.0.2.7/32 is listed twice (also entry 1); remove one",
        ];
        guard_allow_with_an_action: config(r#"
[[guard.allow]]
prefix = "10.0.0.0/8"
action = "reset""#, "") => [
            "xlb.toml: guard: allow entry 1: action applies to deny entries only (an allow entry lets its sources through); remove it",
        ];
        guard_deny_reason_too_long: config(&format!(r#"
[[guard.deny]]
prefix = "192.0.2.7"
reason = "{}""#, "x".repeat(201)), "") => [
            "xlb.toml: guard: deny entry 1: reason is 201 characters long; use at most 200",
        ];
        ct_insert_cap_in_a_vip: config("", r#"ct_insert_cap = "1000/s""#) => [
            r#"xlb.toml: vip "api": guard: ct_insert_cap is a daemon-wide setting (each CPU's conntrack inserts per second, all VIPs together); set it in [guard]"#,
        ];
        ct_insert_cap_below_one_per_second: config(r#"ct_insert_cap = "30/min""#, "") => [
            r#"xlb.toml: guard: ct_insert_cap "30/min" is below 1/s; the cap counts each CPU's inserts per second, so use at least "1/s" (or "off" for no cap)"#,
        ];
        source_v4_prefix_over_32: config("source_v4_prefix = 33", "") => [
            "xlb.toml: guard: source_v4_prefix 33 is out of range; use 16 to 32 (the leading bits that name a source: a shorter prefix makes a whole network one source, one bucket and one block, which anyone in it, or forging an address in it, could exhaust or trigger)",
        ];
        source_v4_prefix_below_16: config("source_v4_prefix = 15", "") => [
            "xlb.toml: guard: source_v4_prefix 15 is out of range; use 16 to 32 (the leading bits that name a source: a shorter prefix makes a whole network one source, one bucket and one block, which anyone in it, or forging an address in it, could exhaust or trigger)",
        ];
        source_v6_prefix_below_32_in_a_vip: config("", "source_v6_prefix = 31") => [
            r#"xlb.toml: vip "api": guard: source_v6_prefix 31 is out of range; use 32 to 128 (the leading bits that name a source: a shorter prefix makes a whole network one source, one bucket and one block, which anyone in it, or forging an address in it, could exhaust or trigger)"#,
        ];
        source_v6_prefix_zero_in_a_vip: config("", "source_v6_prefix = 0") => [
            r#"xlb.toml: vip "api": guard: source_v6_prefix 0 is out of range; use 32 to 128 (the leading bits that name a source: a shorter prefix makes a whole network one source, one bucket and one block, which anyone in it, or forging an address in it, could exhaust or trigger)"#,
        ];
        limit_rate_not_a_rate: config(r#"new_flows_per_source = { rate = "200" }"#, "") => [
            r#"xlb.toml: guard: new_flows_per_source.rate "200" is not a rate; write a number per second or per minute, e.g. "200/s", "30/min""#,
        ];
        limit_rate_zero: config("", r#"new_flows_per_source = { rate = "0/s" }"#) => [
            r#"xlb.toml: vip "api": guard: new_flows_per_source.rate "0/s" is out of range; use "1/min" to "10000000/s""#,
        ];
        limit_burst_zero: config(r#"new_flows_per_source = { rate = "10/s", burst = 0 }"#, "") => [
            "xlb.toml: guard: new_flows_per_source.burst 0 is out of range; use 1 to 1000000 (new flows a source may open at once)",
        ];
        alert_without_rate_or_share: config("source_alert = { min_rate = \"5/s\" }", "") => [
            r#"xlb.toml: guard: source_alert sets neither rate nor share; set one or both, e.g. { rate = "500/s", share = "50%" }"#,
        ];
        alert_share_over_100_percent: config(r#"source_alert = { share = "150%" }"#, "") => [
            r#"xlb.toml: guard: source_alert.share "150%" is invalid; use a fraction above 0 and at most 1 or a percentage above "0%" and at most "100%""#,
        ];
        alert_share_zero: config("", "source_alert = { share = 0 }") => [
            r#"xlb.toml: vip "api": guard: source_alert.share 0 is invalid; use a fraction above 0 and at most 1 or a percentage above "0%" and at most "100%""#,
        ];
        alert_min_rate_not_a_rate: config(r#"source_alert = { rate = "5/s", min_rate = "ten" }"#, "") => [
            r#"xlb.toml: guard: source_alert.min_rate "ten" is not a rate; write a number per second or per minute, e.g. "200/s", "30/min""#,
        ];
        auto_block_for_zero: config(r#"auto_block = { above = "100/s", for = "0s" }"#, "") => [
            r#"xlb.toml: guard: auto_block.for "0s" is out of range; use 1s to 1h"#,
        ];
        auto_block_ttl_too_long: config("", r#"auto_block = { above = "100/s", ttl = "31d" }"#) => [
            r#"xlb.toml: vip "api": guard: auto_block.ttl "31d" is out of range; use 1s to 30d"#,
        ];
        auto_block_ttl_over_30_days: config(r#"auto_block = { above = "100/s", ttl = "721h" }"#, "") => [
            r#"xlb.toml: guard: auto_block.ttl "721h" is out of range; use 1s to 30d"#,
        ];
        auto_block_above_zero_names_bounds_a_person_writes: config(r#"auto_block = { above = "0/s" }"#, "") => [
            r#"xlb.toml: guard: auto_block.above "0/s" is out of range; use "1/min" to "10000000/s""#,
        ];
        auto_block_above_beyond_any_source: config(r#"auto_block = { above = "20000000/s" }"#, "") => [
            r#"xlb.toml: guard: auto_block.above "20000000/s" is out of range; use "1/min" to "10000000/s""#,
        ];
        alert_rate_too_high: config("", r#"source_alert = { rate = "99999999/s" }"#) => [
            r#"xlb.toml: vip "api": guard: source_alert.rate "99999999/s" is out of range; use "1/min" to "10000000/s""#,
        ];
        auto_block_without_counts: config("", r#"track_sources = false
    auto_block = { above = "100/s" }"#) => [
            r#"xlb.toml: vip "api": guard: auto_block needs the per-source counts, but track_sources = false and no new_flows_per_source is set; remove track_sources = false or auto_block"#,
        ];
        alert_without_counts: config(r#"track_sources = false
    source_alert = { rate = "100/s" }"#, "") => [
            "xlb.toml: guard: source_alert needs the per-source counts, but track_sources = false and no new_flows_per_source is set; remove track_sources = false or source_alert",
        ];
    }
}
