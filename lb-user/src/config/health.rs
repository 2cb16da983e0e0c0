//! The health_check tables: each parsed on its own into a [`HealthLayer`]
//! ([`parse`]), then the layers that apply to a backend merged over the
//! built-in defaults into its [`CheckSpec`] ([`resolve`]), which is where
//! rules involving several fields are checked.
//!
//! The rules for the HTTP request itself live in [`crate::health::spec`]
//! (the prober applies them too); this module applies them one field at a
//! time so that each message says where the value is and what to write.

mod expect;

use std::time::Duration;

use serde::{Serialize, Serializer};

mod agent;

use super::raw::{KindName, RawHealth, RawJitter, RawStatus, ViaName};
use super::{Problems, duration_setting, parse_percent, ser_duration};
use crate::health::spec::{self, CheckKind, CheckSpec, HttpCheck};

/// Longest `body_contains`: the prober reads only the first 4 KiB of a body.
const MAX_BODY_CONTAINS: usize = 4096;

/// One health_check table, values parsed, fields absent stay `None`.
#[derive(Clone, Debug, Default)]
pub(super) struct HealthLayer {
    kind: Option<KindName>,
    method: Option<String>,
    path: Option<String>,
    pub(super) host: Option<String>,
    expect_status: Option<Vec<(u16, u16)>>,
    body_contains: Option<String>,
    interval: Option<Duration>,
    timeout: Option<Duration>,
    /// `Some(true)` for `timeout = "auto"`, `Some(false)` for a duration.
    timeout_auto: Option<bool>,
    hang_timeout: Option<Duration>,
    rise: Option<u32>,
    fall: Option<u32>,
    fast_interval: Option<Duration>,
    down_interval: Option<Duration>,
    jitter: Option<f64>,
    via: Option<spec::Via>,
    reuse_connection: Option<bool>,
    reopen_every: Option<u32>,
    agent: agent::AgentLayer,
    /// `kind = "dns"` fields, and the names of those the table sets.
    pub(super) dns: super::dns::DnsLayer,
    pub(super) dns_set: Vec<&'static str>,
    expect: expect::ExpectLayer,
    /// `kind = "grpc"` (see `config::grpc`).
    pub(super) service: Option<String>,
    pub(super) tls: Option<bool>,
    pub(super) tls_verify: Option<bool>,
    pub(super) ca_file: Option<std::path::PathBuf>,
}

/// A layer and its place in the file (the context of its messages).
pub(super) type Layer<'a> = (&'a HealthLayer, &'a str);

/// The daemon-wide `[health_check]`, checked even if no backend inherits it.
pub(super) fn global_layer(raw: Option<&RawHealth>, p: &mut Problems<'_>) -> HealthLayer {
    let layer = parse(raw, "health_check", "each [[vip.backend]]", p);
    resolve(&[(&layer, "health_check")], 0, p);
    layer
}

/// Checks the values of one table (absent: an empty layer) on their own;
/// cross-field rules need the merged result (see [`resolve`]). An invalid
/// value is dropped after its error so the merged spec does not report it a
/// second time. `port_owner` says where `health_port` goes instead.
pub(super) fn parse(
    raw: Option<&RawHealth>,
    ctx: &str,
    port_owner: &str,
    p: &mut Problems<'_>,
) -> HealthLayer {
    let Some(raw) = raw else {
        return HealthLayer::default();
    };
    if raw.port.is_some() {
        p.error(
            ctx,
            format!("port is not allowed in a health_check table; set health_port on {port_owner}"),
        );
    }
    let interval = duration("interval", &raw.interval, ctx, p);
    let timeout_auto = raw.timeout.as_deref().map(|t| t.trim() == "auto");
    let timeout = if timeout_auto == Some(true) {
        None
    } else {
        duration("timeout", &raw.timeout, ctx, p)
    };
    let hang_timeout = duration("hang_timeout", &raw.hang_timeout, ctx, p);
    let fast_interval = duration("fast_interval", &raw.fast_interval, ctx, p);
    let down_interval = duration("down_interval", &raw.down_interval, ctx, p);
    let rise = at_least_one("rise", raw.rise, ctx, p);
    let fall = at_least_one("fall", raw.fall, ctx, p);
    let jitter = jitter(raw.jitter.as_ref(), ctx, p);
    let http = http_fields(raw, ctx, p);
    let (dns, dns_set) = super::dns::parse(raw, ctx, p);
    let (tls_verify, ca_file) = super::tls::tls_fields(raw, ctx, p);
    HealthLayer {
        dns,
        dns_set,
        tls_verify,
        ca_file,
        interval,
        timeout,
        timeout_auto,
        hang_timeout,
        fast_interval,
        down_interval,
        rise,
        fall,
        jitter,
        via: raw.via.map(|v| match v {
            ViaName::Direct => spec::Via::Direct,
            ViaName::Vip => spec::Via::Vip,
        }),
        agent: agent::parse(raw, ctx, p),
        expect: expect::parse(raw, ctx, p),
        ..http
    }
}

/// A period: a duration longer than 0.
fn duration(
    field: &str,
    value: &Option<String>,
    ctx: &str,
    p: &mut Problems<'_>,
) -> Option<Duration> {
    let d = duration_setting(field, value.as_deref()?, ctx, p)?;
    if d.is_zero() {
        p.error(ctx, format!("{field} must be longer than 0"));
        return None;
    }
    Some(d)
}

/// Largest `rise` and `fall`. A backend takes that many probes in a row to
/// change state: 100 at the default 2 s interval is over 3 minutes, already
/// past any use; 4,000,000,000 would keep a backend down for centuries.
pub(super) const MAX_PROBE_COUNT: u32 = 100;

/// `rise` and `fall`: a count of probes in a row, 1 to [`MAX_PROBE_COUNT`].
fn at_least_one(field: &str, value: Option<u32>, ctx: &str, p: &mut Problems<'_>) -> Option<u32> {
    match value {
        Some(0) => p.error(ctx, format!("{field} must be at least 1")),
        Some(n) if n > MAX_PROBE_COUNT => p.error(
            ctx,
            format!(
                "{field} {n} is too large: a backend would need {n} probes in a row to change \
                 state; use 1 to {MAX_PROBE_COUNT}"
            ),
        ),
        _ => {}
    }
    value.filter(|&v| (1..=MAX_PROBE_COUNT).contains(&v))
}

/// Up to half the period either way, as a fraction or a percentage.
fn jitter(raw: Option<&RawJitter>, ctx: &str, p: &mut Problems<'_>) -> Option<f64> {
    let raw = raw?;
    let value = match raw {
        RawJitter::Fraction(f) => Some(*f),
        RawJitter::Text(t) => parse_percent(t).map(|v| v / 100.0),
    };
    match value {
        Some(v) if (0.0..=0.5).contains(&v) => Some(v),
        _ => {
            p.error(
                ctx,
                format!(
                    "jitter {} is out of range; use a fraction from 0 to 0.5 \
                     or a percentage from \"0%\" to \"50%\"",
                    raw.shown()
                ),
            );
            None
        }
    }
}

/// The HTTP settings of one table: the request's fields by the rules of
/// [`spec`], with messages that say what to write instead, then
/// `expect_status`. Only the HTTP fields of the result are set.
fn http_fields(raw: &RawHealth, ctx: &str, p: &mut Problems<'_>) -> HealthLayer {
    let method = checked(&raw.method, spec::is_method, ctx, p, |m| {
        format!("method {m:?} is not an HTTP method; use e.g. \"GET\" or \"HEAD\"")
    });
    let path = checked(&raw.path, spec::is_path, ctx, p, |path| {
        format!(
            "path {path:?} is invalid; use a request target starting with '/', \
             in visible ASCII without spaces (percent-encode others), e.g. \"/health\""
        )
    });
    let host = checked(&raw.host, spec::is_host, ctx, p, |host| {
        format!(
            "host {host:?} is invalid; use a host name in visible ASCII without spaces, \
             or remove host to send the backend's address"
        )
    });
    let body_fits = |body: &str| !body.is_empty() && body.len() <= MAX_BODY_CONTAINS;
    let body_contains = checked(&raw.body_contains, body_fits, ctx, p, |_| {
        format!(
            "body_contains must be 1 to {MAX_BODY_CONTAINS} bytes (only the start of the \
             body is read); remove it to accept any body"
        )
    });
    HealthLayer {
        kind: raw.kind,
        method,
        path,
        host,
        expect_status: expect_status(raw.expect_status.as_deref(), ctx, p),
        body_contains,
        reuse_connection: raw.reuse_connection,
        reopen_every: reopen_every(raw.reopen_every, ctx, p),
        service: super::grpc::service(raw.service.as_deref(), ctx, p),
        tls: raw.tls,
        ..HealthLayer::default()
    }
}

/// Probes per reused connection: at least 2 (1 is no reuse at all).
fn reopen_every(value: Option<u32>, ctx: &str, p: &mut Problems<'_>) -> Option<u32> {
    let n = value?;
    if spec::is_reopen_every(n) {
        return Some(n);
    }
    p.error(
        ctx,
        format!(
            "reopen_every {n} is out of range; use {} to {} probes per connection (for a new \
             connection every probe, remove reuse_connection)",
            spec::MIN_REOPEN_EVERY,
            spec::MAX_REOPEN_EVERY
        ),
    );
    None
}

/// `value` if `valid`; otherwise the error `message` gives, and `None`.
fn checked(
    value: &Option<String>,
    valid: impl Fn(&str) -> bool,
    ctx: &str,
    p: &mut Problems<'_>,
    message: impl Fn(&str) -> String,
) -> Option<String> {
    let value = value.as_deref()?;
    if valid(value) {
        Some(value.to_owned())
    } else {
        p.error(ctx, message(value));
        None
    }
}

/// Every item reported; the list is kept only if all are valid.
fn expect_status(
    items: Option<&[RawStatus]>,
    ctx: &str,
    p: &mut Problems<'_>,
) -> Option<Vec<(u16, u16)>> {
    let items = items?;
    if items.is_empty() {
        p.error(
            ctx,
            "expect_status is empty; list at least one code or range, e.g. [\"200-299\"]",
        );
        return None;
    }
    let mut ranges = Vec::new();
    for item in items {
        match parse_status(item) {
            Some(r) => ranges.push(r),
            None => {
                let shown = item.shown();
                p.error(
                    ctx,
                    format!(
                        "expect_status {shown} is not a status code or range; \
                         write e.g. \"200\" or \"200-299\" (codes 100 to 599)"
                    ),
                );
            }
        }
    }
    (ranges.len() == items.len()).then_some(ranges)
}

/// `200`, `"200"` or `"200-299"` (spaces allowed around the numbers).
fn parse_status(item: &RawStatus) -> Option<(u16, u16)> {
    let code = |v: i64| u16::try_from(v).ok();
    let (lo, hi) = match item {
        RawStatus::Code(c) => (code(*c)?, code(*c)?),
        RawStatus::Text(t) => {
            let num = |s: &str| code(s.trim().parse::<i64>().ok()?);
            match t.split_once('-') {
                Some((lo, hi)) => (num(lo)?, num(hi)?),
                None => (num(t)?, num(t)?),
            }
        }
    };
    spec::is_status_range(lo, hi).then_some((lo, hi))
}

// ---------------------------------------------------------------------------
// Merging.

/// The value from the most specific layer that sets it, and that layer.
pub(super) fn pick<T: Clone>(
    layers: &[Layer<'_>],
    field: impl Fn(&HealthLayer) -> &Option<T>,
) -> (Option<T>, Option<usize>) {
    layers
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, (l, _))| field(l).clone().map(|v| (Some(v), Some(i))))
        .unwrap_or((None, None))
}

/// The place of the layer `pick` found (the daemon-wide table if none).
pub(super) fn place<'a>(layers: &[Layer<'a>], i: Option<usize>) -> &'a str {
    i.map_or("health_check", |i| layers[i].1)
}

/// Merges `layers` (least specific first) over the built-in defaults, checks
/// the rules that involve several fields, and returns the spec for a backend
/// probed on `port`. A problem is reported against the most specific layer
/// that set one of the fields involved, so it is reported once.
pub(super) fn resolve(layers: &[Layer<'_>], port: u16, p: &mut Problems<'_>) -> CheckSpec {
    let (interval, timeout, auto_timeout) = timeouts(layers, p);
    let hang_timeout = hang_timeout(layers, timeout, p);
    let kind = kind(layers, p);
    CheckSpec {
        kind,
        port,
        interval,
        timeout,
        hang_timeout,
        rise: pick(layers, |l| &l.rise).0.unwrap_or(spec::defaults::RISE),
        fall: pick(layers, |l| &l.fall).0.unwrap_or(spec::defaults::FALL),
        // Never slower than `interval`: a fast profile (interval 200ms) must
        // not confirm a failure more slowly than its steady probing.
        fast_interval: pick(layers, |l| &l.fast_interval)
            .0
            .unwrap_or(spec::defaults::FAST_INTERVAL.min(interval)),
        down_interval: pick(layers, |l| &l.down_interval)
            .0
            .unwrap_or(spec::defaults::DOWN_INTERVAL),
        jitter: pick(layers, |l| &l.jitter)
            .0
            .unwrap_or(spec::defaults::JITTER),
        via: pick(layers, |l| &l.via).0.unwrap_or(spec::defaults::VIA),
        auto_timeout,
        agent: agent::resolve(layers, port, interval, timeout, p),
    }
}

/// `(interval, timeout, auto)`: a probe must end before the next starts.
fn timeouts(layers: &[Layer<'_>], p: &mut Problems<'_>) -> (Duration, Duration, bool) {
    let (interval, interval_src) = pick(layers, |l| &l.interval);
    let (timeout, timeout_src) = pick(layers, |l| &l.timeout);
    let interval = interval.unwrap_or(spec::defaults::INTERVAL);
    // `timeout = "auto"` in the most specific layer that sets a timeout:
    // the default is where the deadline starts (never past the interval).
    let auto_timeout = pick(layers, |l| &l.timeout_auto).0.unwrap_or(false);
    let timeout = if auto_timeout {
        spec::defaults::TIMEOUT.min(interval)
    } else {
        timeout.unwrap_or(spec::defaults::TIMEOUT)
    };
    if timeout > interval {
        p.error(
            place(layers, interval_src.max(timeout_src)),
            format!(
                "timeout {timeout:?} is longer than interval {interval:?}; the timeout must be \
                 at most the interval, so a probe ends before the next one starts"
            ),
        );
    }
    (interval, timeout, auto_timeout)
}

/// Derived from the merged `timeout` unless set; `timeout` ≤ it ≤
/// [`spec::MAX_HANG_TIMEOUT`].
fn hang_timeout(layers: &[Layer<'_>], timeout: Duration, p: &mut Problems<'_>) -> Duration {
    let timeout_src = pick(layers, |l| &l.timeout).1;
    let (hang_timeout, hang_src) = pick(layers, |l| &l.hang_timeout);
    match hang_timeout {
        None => spec::default_hang_timeout(timeout),
        Some(hang) if hang < timeout => {
            p.error(
                place(layers, hang_src.max(timeout_src)),
                format!(
                    "hang_timeout {hang:?} is shorter than timeout {timeout:?}; use at least the \
                     timeout (equal to it makes a late answer a failure, as without hang_timeout)"
                ),
            );
            timeout
        }
        Some(hang) if hang > spec::MAX_HANG_TIMEOUT => {
            p.error(
                place(layers, hang_src),
                format!(
                    "hang_timeout {} is longer than {}; a backend that has not answered \
                     in a minute is hung, and each waiting probe holds a socket: use at most \"{}\"",
                    super::shown::duration(hang),
                    super::shown::duration(spec::MAX_HANG_TIMEOUT),
                    super::shown::duration(spec::MAX_HANG_TIMEOUT)
                ),
            );
            spec::MAX_HANG_TIMEOUT
        }
        Some(hang) => hang,
    }
}

/// HTTP (the default) with its merged request, TCP (with send/expect if
/// set), UDP or DNS; each kind refuses the others' fields set alongside or
/// below it.
fn kind(layers: &[Layer<'_>], p: &mut Problems<'_>) -> CheckKind {
    let (kind, kind_src) = pick(layers, |l| &l.kind);
    let kind = kind.unwrap_or(KindName::Http);
    let below = &layers[kind_src.unwrap_or(0)..];
    if kind != KindName::Grpc {
        for (layer, ctx) in below {
            let grpc = [
                ("service", layer.service.is_some()),
                ("tls", layer.tls.is_some()),
            ];
            super::grpc::refuse_fields(&grpc, kind, ctx, p);
        }
    }
    match kind {
        KindName::Tcp => {
            check_no_http_fields(below, "tcp", &[], p);
            super::dns::check_no_dns_fields(below, "tcp", p);
            super::tls::check_no_tls_fields(below, "tcp", p);
            expect::tcp(layers, kind_src, p).map_or(CheckKind::Tcp, CheckKind::Expect)
        }
        KindName::Udp => {
            check_no_http_fields(below, "udp", &[], p);
            super::dns::check_no_dns_fields(below, "udp", p);
            super::tls::check_no_tls_fields(below, "udp", p);
            CheckKind::Expect(expect::udp(layers, kind_src, p))
        }
        KindName::Http => {
            super::dns::check_no_dns_fields(below, "http", p);
            expect::check_no_expect_fields(below, "http", p);
            super::tls::check_no_tls_fields(below, "http", p);
            CheckKind::Http(http_check(layers, p))
        }
        KindName::Https => {
            super::dns::check_no_dns_fields(below, "https", p);
            expect::check_no_expect_fields(below, "https", p);
            CheckKind::Https {
                http: http_check(layers, p),
                tls: super::tls::tls_check(layers, p),
            }
        }
        KindName::Dns => {
            check_no_http_fields(below, "dns", &[], p);
            expect::check_no_expect_fields(below, "dns", p);
            super::tls::check_no_tls_fields(below, "dns", p);
            CheckKind::Dns(super::dns::resolve(layers))
        }
        KindName::Grpc => {
            super::dns::check_no_dns_fields(below, "grpc", p);
            expect::check_no_expect_fields(below, "grpc", p);
            CheckKind::Grpc(super::grpc::grpc_check(layers, below, p))
        }
    }
}

/// HTTP settings inherited from a less specific layer than `kind = "tcp"`
/// (or another non-HTTP `kind`; `"grpc"` but for the fields it has too:
/// `allowed`) are simply not used; ones set alongside or below it
/// (`layers`) are a mistake.
pub(super) fn check_no_http_fields(
    layers: &[Layer<'_>],
    kind: &str,
    allowed: &[&str],
    p: &mut Problems<'_>,
) {
    for (layer, ctx) in layers {
        let http_fields = [
            ("method", layer.method.is_some()),
            ("path", layer.path.is_some()),
            ("host", layer.host.is_some()),
            ("expect_status", layer.expect_status.is_some()),
            ("body_contains", layer.body_contains.is_some()),
            ("reuse_connection", layer.reuse_connection.is_some()),
            ("reopen_every", layer.reopen_every.is_some()),
        ];
        for (field, set) in http_fields {
            if set && !allowed.contains(&field) {
                p.error(
                    ctx,
                    format!(
                        "{field} applies only to kind = \"http\", but this check's kind is \
                         \"{kind}\"; remove {field} or set kind = \"http\""
                    ),
                );
            }
        }
    }
}

/// The merged HTTP settings of `layers`, checked once more as the prober
/// will check them.
fn http_check(layers: &[Layer<'_>], p: &mut Problems<'_>) -> HttpCheck {
    let check = HttpCheck {
        method: pick(layers, |l| &l.method)
            .0
            .unwrap_or_else(|| spec::defaults::HTTP_METHOD.to_owned()),
        path: pick(layers, |l| &l.path)
            .0
            .unwrap_or_else(|| spec::defaults::HTTP_PATH.to_owned()),
        host: pick(layers, |l| &l.host).0,
        expect_status: pick(layers, |l| &l.expect_status)
            .0
            .unwrap_or_else(|| vec![spec::defaults::EXPECT_STATUS]),
        body_contains: pick(layers, |l| &l.body_contains).0,
        reuse_connection: reuse_connection(layers, p),
    };
    // Unreachable while `parse` applies the same rules field by field; kept
    // so that a rule added to `HttpCheck::validate` alone cannot let a config
    // through that every probe fails.
    if let Err(e) = check.validate() {
        p.error(
            layers.last().map_or("health_check", |l| l.1),
            format!("{e}"),
        );
    }
    check
}

/// `reopen_every` (or its default) when the merged `reuse_connection` is
/// true. `reopen_every` set where it cannot apply (alongside or below the
/// table that leaves reuse off) is a mistake; inherited from a less
/// specific table that turned reuse on, it is simply not used.
pub(super) fn reuse_connection(layers: &[Layer<'_>], p: &mut Problems<'_>) -> Option<u32> {
    let (reuse, reuse_src) = pick(layers, |l| &l.reuse_connection);
    let reopen = pick(layers, |l| &l.reopen_every).0;
    if reuse == Some(true) {
        return Some(reopen.unwrap_or(spec::DEFAULT_REOPEN_EVERY));
    }
    for (layer, ctx) in &layers[reuse_src.unwrap_or(0)..] {
        if layer.reopen_every.is_some() {
            p.error(
                ctx,
                "reopen_every applies only with reuse_connection = true; set \
                 reuse_connection = true or remove reopen_every",
            );
        }
    }
    None
}

/// A [`CheckSpec`] as the file writes it: each kind's fields, the others
/// left out.
#[derive(Serialize)]
struct View<'a> {
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expect_status: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body_contains: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reuse_connection: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reopen_every: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dns_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dns_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dns_rcodes: Option<Vec<String>>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    expect: Option<expect::View>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_verify: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_file: Option<&'a std::path::Path>,
    #[serde(skip_serializing_if = "Option::is_none")]
    service: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls: Option<bool>,
    port: u16,
    #[serde(serialize_with = "ser_duration")]
    interval: Duration,
    #[serde(serialize_with = "ser_duration")]
    timeout: Duration,
    #[serde(serialize_with = "ser_duration")]
    hang_timeout: Duration,
    rise: u32,
    fall: u32,
    #[serde(serialize_with = "ser_duration")]
    fast_interval: Duration,
    #[serde(serialize_with = "ser_duration")]
    down_interval: Duration,
    jitter: f64,
    via: &'static str,
    auto_timeout: bool,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    agent: Option<agent::AgentView>,
}

/// Serializes a [`CheckSpec`] with the file's names and spellings (for
/// `xlb config` and the control API).
pub(super) fn ser_check_spec<S: Serializer>(spec: &CheckSpec, s: S) -> Result<S::Ok, S::Error> {
    let (kind, http, expect) = match &spec.kind {
        CheckKind::Http(h) => ("http", Some(h), None),
        CheckKind::Https { http, .. } => ("https", Some(http), None),
        CheckKind::Tcp => ("tcp", None, None),
        CheckKind::Dns(_) => ("dns", None, None),
        CheckKind::Grpc(_) => ("grpc", None, None),
        CheckKind::Expect(c) => (c.transport.as_str(), None, Some(expect::View::of(c))),
    };
    let dns = match &spec.kind {
        CheckKind::Dns(d) => Some(d),
        _ => None,
    };
    let grpc = match &spec.kind {
        CheckKind::Grpc(g) => Some(g),
        _ => None,
    };
    let tls = match &spec.kind {
        CheckKind::Https { tls, .. } => Some(tls),
        CheckKind::Grpc(g) => g.tls.as_ref(),
        _ => None,
    };
    let reuse = http
        .map(|h| h.reuse_connection)
        .or(grpc.map(|g| g.reuse_connection));
    View {
        kind,
        method: http.map(|h| h.method.as_str()),
        path: http.map(|h| h.path.as_str()),
        host: http.map_or(grpc.and_then(|g| g.host.as_deref()), |h| h.host.as_deref()),
        expect_status: http.map(|h| h.expect_status.iter().map(|&r| status_text(r)).collect()),
        body_contains: http.and_then(|h| h.body_contains.as_deref()),
        reuse_connection: reuse.map(|r| r.is_some()),
        reopen_every: reuse.flatten(),
        dns_name: dns.map(|d| d.name.to_ascii()),
        dns_type: dns.map(|d| d.record_type.to_string()),
        dns_rcodes: dns.map(|d| d.rcodes.iter().map(|&r| spec::dns::rcode_name(r)).collect()),
        expect,
        tls_verify: tls.map(|t| t.verify),
        ca_file: tls.and_then(|t| t.ca_file.as_deref()),
        service: grpc.map(|g| g.service.as_str()),
        tls: grpc.map(|g| g.tls.is_some()),
        port: spec.port,
        interval: spec.interval,
        timeout: spec.timeout,
        hang_timeout: spec.hang_timeout,
        rise: spec.rise,
        fall: spec.fall,
        fast_interval: spec.fast_interval,
        down_interval: spec.down_interval,
        jitter: spec.jitter,
        via: spec.via.as_str(),
        auto_timeout: spec.auto_timeout,
        agent: spec.agent.as_ref().map(agent::AgentView::of),
    }
    .serialize(s)
}

/// `"200"` or `"200-299"`, as the file writes it.
fn status_text((lo, hi): (u16, u16)) -> String {
    if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}-{hi}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{
        DAEMON, api_vip, api_with_backend, default_check, default_http, ok,
    };

    /// VIP "a" with one backend, 10.0.0.1, and the given contents of the
    /// three health_check tables: `[health_check]`, `[vip.health_check]`
    /// and `[vip.backend.health_check]`.
    fn layered(daemon: &str, vip: &str, backend: &str) -> String {
        format!(
            r#"{DAEMON}
[health_check]
{daemon}

[[vip]]
name = "a"
address = "10.1.0.1"
port = 80
[vip.health_check]
{vip}

[[vip.backend]]
address = "10.0.0.1"
[vip.backend.health_check]
{backend}
"#
        )
    }

    #[test]
    fn health_merges_field_by_field() {
        let config = ok(
            "merge",
            r#"
            [daemon]
            interface = "eth0"

            [health_check]
            path = "/daemon"
            interval = "4s"
            rise = 4
            jitter = "20%"

            [[vip]]
            name = "api"
            address = "10.100.0.1"
            port = 80
            [vip.health_check]
            path = "/vip"
            timeout = "3s"
            fall = 7

            [[vip.backend]]
            address = "10.0.0.11"

            [[vip.backend]]
            address = "10.0.0.12"
            health_port = 9000
            [vip.backend.health_check]
            rise = 1
            host = "be2"
            expect_status = ["204"]
            hang_timeout = "4s"

            [[vip]]
            name = "other"
            address = "10.100.0.2"
            port = 80
            [[vip.backend]]
            address = "10.0.0.13"
            "#,
        );
        let http = |path: &str, host: Option<&str>, status: (u16, u16)| {
            CheckKind::Http(HttpCheck {
                method: "GET".into(),
                path: path.into(),
                host: host.map(Into::into),
                expect_status: vec![status],
                body_contains: None,
                reuse_connection: None,
            })
        };
        let base = CheckSpec {
            interval: Duration::from_secs(4),
            rise: 4,
            jitter: 0.2,
            via: spec::defaults::VIA,
            auto_timeout: false,
            ..default_check(80)
        };
        let cases = [
            (
                "vip overrides daemon, daemon overrides defaults",
                &config.vips[0].backends[0].health,
                CheckSpec {
                    kind: http("/vip", None, spec::defaults::EXPECT_STATUS),
                    timeout: Duration::from_secs(3),
                    // Derived from the merged timeout, not the default one.
                    hang_timeout: Duration::from_secs(9),
                    fall: 7,
                    ..base.clone()
                },
            ),
            (
                "backend overrides vip and daemon",
                &config.vips[0].backends[1].health,
                CheckSpec {
                    kind: http("/vip", Some("be2"), (204, 204)),
                    port: 9000,
                    timeout: Duration::from_secs(3),
                    hang_timeout: Duration::from_secs(4),
                    fall: 7,
                    rise: 1,
                    ..base.clone()
                },
            ),
            (
                "another vip sees only the daemon layer",
                &config.vips[1].backends[0].health,
                CheckSpec {
                    kind: http("/daemon", None, spec::defaults::EXPECT_STATUS),
                    ..base.clone()
                },
            ),
        ];
        for (name, got, want) in cases {
            assert_eq!(got, &want, "{name}");
        }
    }

    #[test]
    fn tcp_kind_at_each_level() {
        // (name, [health_check], [vip.health_check], backend's, want)
        let cases = [
            ("daemon tcp", r#"kind = "tcp""#, "", "", CheckKind::Tcp),
            (
                "vip tcp over daemon http path",
                r#"path = "/d""#,
                r#"kind = "tcp""#,
                "",
                CheckKind::Tcp,
            ),
            (
                "backend http over vip tcp",
                "",
                r#"kind = "tcp""#,
                r#"
kind = "http"
path = "/b"
"#,
                CheckKind::Http(HttpCheck {
                    path: "/b".into(),
                    ..default_http()
                }),
            ),
        ];
        for (name, daemon, vip_layer, backend, want) in cases {
            let config = ok(name, &layered(daemon, vip_layer, backend));
            assert_eq!(config.vips[0].backends[0].health.kind, want, "{name}");
        }
    }

    /// `timeout = "auto"`: starts at the default timeout (never past the
    /// interval), and the most specific layer that sets a timeout decides.
    #[test]
    fn auto_timeout_resolution() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // (name, [health_check], [vip.health_check], backend's,
        //  want (auto, starting timeout, hang_timeout))
        let cases = [
            ("fixed by default", "", "", "", (false, s(1), s(3))),
            (
                "auto: starts at the default, hang_timeout from it",
                r#"timeout = "auto""#,
                "",
                "",
                (true, s(1), s(3)),
            ),
            (
                "auto never starts past the interval",
                r#"
timeout = "auto"
interval = "500ms"
"#,
                "",
                "",
                (true, ms(500), ms(1500)),
            ),
            (
                "a fixed timeout below overrides auto above",
                r#"timeout = "auto""#,
                r#"timeout = "300ms""#,
                "",
                (false, ms(300), ms(900)),
            ),
            (
                "auto below overrides a fixed timeout above",
                r#"timeout = "2s""#,
                "",
                r#"
timeout = "auto"
hang_timeout = "5s"
"#,
                (true, s(1), s(5)),
            ),
        ];
        for (name, daemon, vip_layer, backend, want) in cases {
            let h = ok(name, &layered(daemon, vip_layer, backend)).vips[0].backends[0]
                .health
                .clone();
            assert_eq!((h.auto_timeout, h.timeout, h.hang_timeout), want, "{name}");
        }
    }

    /// `hang_timeout`: derived from the merged `timeout` unless set, merged
    /// field by field, `timeout` ≤ it ≤ 60 s.
    #[test]
    fn hang_timeout_resolution() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // (name, [health_check], [vip.health_check], backend's, want)
        let cases = [
            ("default: 3 × the default timeout", "", "", "", s(3)),
            (
                "derived from a merged timeout",
                "",
                r#"timeout = "500ms""#,
                "",
                ms(1500),
            ),
            (
                "derived default capped at 60s",
                r#"
interval = "1m"
timeout = "30s"
"#,
                "",
                "",
                s(60),
            ),
            (
                "equal to the timeout: strict",
                r#"hang_timeout = "1s""#,
                "",
                "",
                s(1),
            ),
            ("the maximum", r#"hang_timeout = "60s""#, "", "", s(60)),
            (
                "above the interval is fine",
                r#"hang_timeout = "10s""#,
                "",
                "",
                s(10),
            ),
            (
                "vip overrides daemon",
                r#"hang_timeout = "5s""#,
                r#"hang_timeout = "2s""#,
                "",
                s(2),
            ),
            (
                "backend overrides vip, with the vip's timeout",
                "",
                r#"
timeout = "2s"
hang_timeout = "8s"
"#,
                r#"hang_timeout = "2s""#,
                s(2),
            ),
            (
                "an explicit value survives a lower timeout below it",
                r#"hang_timeout = "4s""#,
                r#"timeout = "200ms""#,
                "",
                s(4),
            ),
        ];
        for (name, daemon, vip_layer, backend, want) in cases {
            let config = ok(name, &layered(daemon, vip_layer, backend));
            assert_eq!(
                config.vips[0].backends[0].health.hang_timeout, want,
                "{name}"
            );
        }
    }

    /// `reuse_connection` and `reopen_every`, merged like the HTTP fields:
    /// the most specific table that sets each decides.
    #[test]
    fn reuse_connection_resolution() {
        let every = spec::DEFAULT_REOPEN_EVERY;
        // (name, [health_check], [vip.health_check], backend's, want)
        let cases = [
            ("off by default", "", "", "", None),
            (
                "on, default reopen_every",
                "reuse_connection = true",
                "",
                "",
                Some(every),
            ),
            (
                "on with reopen_every",
                "reuse_connection = true\nreopen_every = 50",
                "",
                "",
                Some(50),
            ),
            (
                "reopen_every below, reuse above",
                "reuse_connection = true",
                "",
                "reopen_every = 2",
                Some(2),
            ),
            (
                "turned off below: the inherited reopen_every is unused",
                "reuse_connection = true\nreopen_every = 5",
                "reuse_connection = false",
                "",
                None,
            ),
            ("explicitly off", "reuse_connection = false", "", "", None),
        ];
        for (name, daemon, vip_layer, backend, want) in cases {
            let config = ok(name, &layered(daemon, vip_layer, backend));
            let got = match &config.vips[0].backends[0].health.kind {
                CheckKind::Http(h) => h.reuse_connection,
                _ => panic!("{name}: not HTTP"),
            };
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn value_forms() {
        type Check = fn(&CheckSpec) -> bool;
        let cases: [(&str, &str, Check); 9] = [
            ("jitter as percentage", r#"jitter = "10%""#, |c| {
                c.jitter == 0.1
            }),
            ("jitter as fraction", "jitter = 0.5", |c| c.jitter == 0.5),
            ("jitter as integer zero", "jitter = 0", |c| c.jitter == 0.0),
            ("duration in minutes", r#"interval = "1m""#, |c| {
                c.interval == Duration::from_secs(60)
            }),
            ("fractional seconds", r#"timeout = ".25s""#, |c| {
                c.timeout == Duration::from_millis(250)
            }),
            (
                "status as integer",
                "expect_status = [200]",
                |c| matches!(&c.kind, CheckKind::Http(h) if h.expect_status == [(200, 200)]),
            ),
            (
                "status range with spaces",
                r#"expect_status = ["200 - 204"]"#,
                |c| matches!(&c.kind, CheckKind::Http(h) if h.expect_status == [(200, 204)]),
            ),
            (
                "several ranges",
                r#"expect_status = ["200-299", "301", "404"]"#,
                |c| matches!(&c.kind, CheckKind::Http(h) if h.expect_status == [(200, 299), (301, 301), (404, 404)]),
            ),
            (
                "custom method",
                r#"method = "OPTIONS""#,
                |c| matches!(&c.kind, CheckKind::Http(h) if h.method == "OPTIONS"),
            ),
        ];
        for (name, line, check) in cases {
            let config = ok(name, &layered(line, "", ""));
            assert!(
                check(&config.vips[0].backends[0].health),
                "{name}: {:?}",
                config.vips[0].backends[0].health
            );
        }
    }

    rejects! {
        hang_timeout_shorter_than_the_timeout: layered(r#"hang_timeout = "500ms""#, "", "") => [
            r#"xlb.toml: health_check: hang_timeout 500ms is shorter than timeout 1s; use at least the timeout (equal to it makes a late answer a failure, as without hang_timeout)"#,
        ];
        /// Reported where the timeout is, the more specific of the two.
        hang_timeout_shorter_than_a_timeout_set_below_it: layered(
            r#"hang_timeout = "2s""#,
            r#"
timeout = "3s"
interval = "5s"
"#,
            "",
        ) => [
            r#"xlb.toml: vip "a": health_check: hang_timeout 2s is shorter than timeout 3s; use at least the timeout (equal to it makes a late answer a failure, as without hang_timeout)"#,
        ];
        hang_timeout_longer_than_a_minute: layered(r#"hang_timeout = "2m""#, "", "") => [
            r#"xlb.toml: health_check: hang_timeout 2m is longer than 1m; a backend that has not answered in a minute is hung, and each waiting probe holds a socket: use at most "1m""#,
        ];
        hang_timeout_zero: layered(r#"hang_timeout = "0s""#, "", "") => [
            r#"xlb.toml: health_check: hang_timeout must be longer than 0"#,
        ];
        hang_timeout_not_a_duration: layered(r#"hang_timeout = "3""#, "", "") => [
            r#"xlb.toml: health_check: hang_timeout "3" is not a duration; write a number and a unit (ms, s, m, h or d), e.g. "500ms", "2s", "1.5s", "1m""#,
        ];

        rise_of_four_billion: api_with_backend(r#"
[vip.health_check]
rise = 4000000000
fall = 101
"#) => [
            r#"xlb.toml: vip "api": health_check: rise 4000000000 is too large: a backend would need 4000000000 probes in a row to change state; use 1 to 100"#,
            r#"xlb.toml: vip "api": health_check: fall 101 is too large: a backend would need 101 probes in a row to change state; use 1 to 100"#,
        ];
        rise_and_fall_zero: api_with_backend(r#"
[vip.health_check]
rise = 0
fall = 0
"#) => [
            r#"xlb.toml: vip "api": health_check: rise must be at least 1"#,
            r#"xlb.toml: vip "api": health_check: fall must be at least 1"#,
        ];
        /// Both backends inherit it; the message names the table once.
        timeout_longer_than_interval_reported_once_at_the_daemon_level: format!(r#"{DAEMON}
[health_check]
timeout = "3s"

[[vip]]
name = "a"
address = "10.100.0.1"
port = 80
[[vip.backend]]
address = "10.0.0.1"
[[vip.backend]]
address = "10.0.0.2"
"#) => [
            r#"xlb.toml: health_check: timeout 3s is longer than interval 2s; the timeout must be at most the interval, so a probe ends before the next one starts"#,
        ];
        timeout_longer_than_an_interval_set_on_a_backend: api_vip(r#"
[vip.health_check]
timeout = "1.5s"
[[vip.backend]]
address = "10.0.0.11"
[vip.backend.health_check]
interval = "1s"
"#) => [
            r#"xlb.toml: vip "api": backend 10.0.0.11:80: health_check: timeout 1.5s is longer than interval 1s; the timeout must be at most the interval, so a probe ends before the next one starts"#,
        ];
        jitter_out_of_range_both_forms: format!(r#"{DAEMON}
[health_check]
jitter = 0.6

[[vip]]
name = "api"
address = "10.100.0.1"
port = 80
[vip.health_check]
jitter = "60%"

[[vip.backend]]
address = "10.0.0.11"
[vip.backend.health_check]
jitter = -0.1
"#) => [
            r#"xlb.toml: health_check: jitter 0.6 is out of range; use a fraction from 0 to 0.5 or a percentage from "0%" to "50%""#,
            r#"xlb.toml: vip "api": health_check: jitter "60%" is out of range; use a fraction from 0 to 0.5 or a percentage from "0%" to "50%""#,
            r#"xlb.toml: vip "api": backend 10.0.0.11:80: health_check: jitter -0.1 is out of range; use a fraction from 0 to 0.5 or a percentage from "0%" to "50%""#,
        ];
        bad_durations: format!(r#"{DAEMON}
[health_check]
interval = "2x"
fast_interval = "0ms"
"#) => [
            r#"xlb.toml: health_check: interval "2x" is not a duration; write a number and a unit (ms, s, m, h or d), e.g. "500ms", "2s", "1.5s", "1m""#,
            r#"xlb.toml: health_check: fast_interval must be longer than 0"#,
        ];
        bad_status_codes: api_with_backend(r#"
[vip.health_check]
expect_status = ["2xx", 600, "299-200"]
"#) => [
            r#"xlb.toml: vip "api": health_check: expect_status "2xx" is not a status code or range; write e.g. "200" or "200-299" (codes 100 to 599)"#,
            r#"xlb.toml: vip "api": health_check: expect_status 600 is not a status code or range; write e.g. "200" or "200-299" (codes 100 to 599)"#,
            r#"xlb.toml: vip "api": health_check: expect_status "299-200" is not a status code or range; write e.g. "200" or "200-299" (codes 100 to 599)"#,
        ];
        empty_status_list: api_with_backend(r#"
[vip.health_check]
expect_status = []
"#) => [
            r#"xlb.toml: vip "api": health_check: expect_status is empty; list at least one code or range, e.g. ["200-299"]"#,
        ];
        bad_http_fields: format!(r#"{DAEMON}
[health_check]
method = "GE T"
path = "health"
host = "a b"
body_contains = ""
"#) => [
            r#"xlb.toml: health_check: method "GE T" is not an HTTP method; use e.g. "GET" or "HEAD""#,
            r#"xlb.toml: health_check: path "health" is invalid; use a request target starting with '/', in visible ASCII without spaces (percent-encode others), e.g. "/health""#,
            r#"xlb.toml: health_check: host "a b" is invalid; use a host name in visible ASCII without spaces, or remove host to send the backend's address"#,
            r#"xlb.toml: health_check: body_contains must be 1 to 4096 bytes (only the start of the body is read); remove it to accept any body"#,
        ];
        non_ascii_path_reported_once_for_two_backends: api_vip(r#"
[vip.health_check]
path = "/santé"
[[vip.backend]]
address = "10.0.0.1"
[[vip.backend]]
address = "10.0.0.2"
"#) => [
            r#"xlb.toml: vip "api": health_check: path "/santé" is invalid; use a request target starting with '/', in visible ASCII without spaces (percent-encode others), e.g. "/health""#,
        ];
        http_fields_with_kind_tcp: api_vip(r#"
[vip.health_check]
kind = "tcp"
path = "/x"
[[vip.backend]]
address = "10.0.0.11"
[vip.backend.health_check]
expect_status = ["200"]
"#) => [
            r#"xlb.toml: vip "api": health_check: path applies only to kind = "http", but this check's kind is "tcp"; remove path or set kind = "http""#,
            r#"xlb.toml: vip "api": backend 10.0.0.11:80: health_check: expect_status applies only to kind = "http", but this check's kind is "tcp"; remove expect_status or set kind = "http""#,
        ];
        reopen_every_out_of_range: layered(
            "reuse_connection = true\nreopen_every = 1",
            "reopen_every = 1001",
            "",
        ) => [
            r#"xlb.toml: health_check: reopen_every 1 is out of range; use 2 to 1000 probes per connection (for a new connection every probe, remove reuse_connection)"#,
            r#"xlb.toml: vip "a": health_check: reopen_every 1001 is out of range; use 2 to 1000 probes per connection (for a new connection every probe, remove reuse_connection)"#,
        ];
        reopen_every_without_reuse: layered("", "reopen_every = 20", "") => [
            r#"xlb.toml: vip "a": health_check: reopen_every applies only with reuse_connection = true; set reuse_connection = true or remove reopen_every"#,
        ];
        reopen_every_where_reuse_is_turned_off: layered(
            "reuse_connection = true",
            "",
            "reuse_connection = false\nreopen_every = 20",
        ) => [
            r#"xlb.toml: vip "a": backend 10.0.0.1:80: health_check: reopen_every applies only with reuse_connection = true; set reuse_connection = true or remove reopen_every"#,
        ];
        reuse_connection_with_kind_tcp: layered(
            "",
            "kind = \"tcp\"\nreuse_connection = true\nreopen_every = 4",
            "",
        ) => [
            r#"xlb.toml: vip "a": health_check: reuse_connection applies only to kind = "http", but this check's kind is "tcp"; remove reuse_connection or set kind = "http""#,
            r#"xlb.toml: vip "a": health_check: reopen_every applies only to kind = "http", but this check's kind is "tcp"; remove reopen_every or set kind = "http""#,
        ];
        reuse_connection_not_a_boolean: layered("reuse_connection = \"yes\"", "", "") => [
            r#"xlb.toml:6:20: health_check: reuse_connection: invalid type: string "yes", expected a boolean"#,
        ];
        port_in_health_check_tables: api_vip(r#"
[vip.health_check]
port = 8081
[[vip.backend]]
address = "10.0.0.11"
[vip.backend.health_check]
port = 8081
"#) => [
            r#"xlb.toml: vip "api": health_check: port is not allowed in a health_check table; set health_port on each [[vip.backend]]"#,
            r#"xlb.toml: vip "api": backend 10.0.0.11:80: health_check: port is not allowed in a health_check table; set health_port on this backend"#,
        ];
    }
}
