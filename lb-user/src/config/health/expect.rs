//! The send/expect fields of a health_check table (`send`, `send_hex`,
//! `expect_prefix`, `expect_contains`, `expect_regex`, `expect_max`), for
//! `kind = "tcp"` and `kind = "udp"`: parsed per table, merged per group
//! (the most specific table that sets a `send*` field gives the bytes, the
//! most specific that sets a matcher gives the matcher), and refused on
//! other kinds.

use serde::Serialize;

use super::super::Problems;
use super::super::raw::RawHealth;
use super::{Layer, pick, place};
use crate::health::spec::expect::{
    self, DEFAULT_EXPECT_MAX, ExpectCheck, MAX_EXPECT_MAX, MAX_SEND, Matcher, Transport,
};

/// The send/expect settings of one table, values parsed and checked on
/// their own.
#[derive(Clone, Debug, Default)]
pub(super) struct ExpectLayer {
    send: Option<Vec<u8>>,
    matcher: Option<Matcher>,
    max: Option<usize>,
    /// The fields the table sets, valid or not: each is refused on a kind
    /// it does not apply to.
    set: Vec<&'static str>,
}

/// Parses the send/expect fields of `raw` (the table at `ctx`).
pub(super) fn parse(raw: &RawHealth, ctx: &str, p: &mut Problems<'_>) -> ExpectLayer {
    let fields: [(&'static str, bool); 6] = [
        ("send", raw.send.is_some()),
        ("send_hex", raw.send_hex.is_some()),
        ("expect_prefix", raw.expect_prefix.is_some()),
        ("expect_contains", raw.expect_contains.is_some()),
        ("expect_regex", raw.expect_regex.is_some()),
        ("expect_max", raw.expect_max.is_some()),
    ];
    ExpectLayer {
        send: send(raw, ctx, p),
        matcher: matcher(raw, ctx, p),
        max: raw.expect_max.and_then(|n| max(n, ctx, p)),
        set: fields.iter().filter(|f| f.1).map(|f| f.0).collect(),
    }
}

const ESCAPES: &str = r"text with escapes \r, \n, \t, \0, \\ and \xHH";

fn send(raw: &RawHealth, ctx: &str, p: &mut Problems<'_>) -> Option<Vec<u8>> {
    let bytes = match (&raw.send, &raw.send_hex) {
        (None, None) => return None,
        (Some(_), Some(_)) => {
            p.error(
                ctx,
                format!(
                    "send and send_hex are both set; use one of them (send: {ESCAPES}; send_hex: \
                     hex digits)"
                ),
            );
            return None;
        }
        (Some(text), None) => match expect::unescape(text) {
            Ok(bytes) => bytes,
            Err(e) => {
                p.error(ctx, format!("send {e}"));
                return None;
            }
        },
        (None, Some(hex)) => match expect::parse_hex(hex) {
            Some(bytes) => bytes,
            None => {
                p.error(
                    ctx,
                    "send_hex is not hex bytes; write pairs of hex digits, spaces allowed \
                     between bytes, e.g. \"2a310d0a\"",
                );
                return None;
            }
        },
    };
    if bytes.is_empty() || bytes.len() > MAX_SEND {
        let field = if raw.send.is_some() {
            "send"
        } else {
            "send_hex"
        };
        p.error(
            ctx,
            format!(
                "{field} is {} bytes; send 1 to {MAX_SEND} bytes (for a banner protocol, remove \
                 it and set only the expect_* matcher)",
                bytes.len()
            ),
        );
        return None;
    }
    Some(bytes)
}

fn matcher(raw: &RawHealth, ctx: &str, p: &mut Problems<'_>) -> Option<Matcher> {
    let set: Vec<&str> = [
        ("expect_prefix", raw.expect_prefix.is_some()),
        ("expect_contains", raw.expect_contains.is_some()),
        ("expect_regex", raw.expect_regex.is_some()),
    ]
    .iter()
    .filter(|f| f.1)
    .map(|f| f.0)
    .collect();
    if set.len() > 1 {
        p.error(
            ctx,
            format!("{} are set together; use one matcher", set.join(" and ")),
        );
        return None;
    }
    let literal = |field: &str, text: &str, p: &mut Problems<'_>| match expect::unescape(text) {
        Ok(bytes) if bytes.is_empty() => {
            p.error(
                ctx,
                format!(
                    "{field} is empty and would match anything; remove it to accept any answer"
                ),
            );
            None
        }
        Ok(bytes) => Some(bytes),
        Err(e) => {
            p.error(ctx, format!("{field} {e}"));
            None
        }
    };
    if let Some(text) = &raw.expect_prefix {
        return literal("expect_prefix", text, p).map(Matcher::Prefix);
    }
    if let Some(text) = &raw.expect_contains {
        return literal("expect_contains", text, p).map(Matcher::Contains);
    }
    let pattern = raw.expect_regex.as_deref()?;
    match expect::compile_regex(pattern) {
        Ok(re) => Some(Matcher::Regex(re)),
        Err(e) => {
            p.error(ctx, format!("expect_regex does not compile: {e}"));
            None
        }
    }
}

fn max(n: i64, ctx: &str, p: &mut Problems<'_>) -> Option<usize> {
    match usize::try_from(n) {
        Ok(n) if (1..=MAX_EXPECT_MAX).contains(&n) => Some(n),
        _ => {
            p.error(
                ctx,
                format!(
                    "expect_max {n} is out of range; read 1 to {MAX_EXPECT_MAX} bytes of answer \
                     (default {DEFAULT_EXPECT_MAX})"
                ),
            );
            None
        }
    }
}

/// The merged check of `kind = "tcp"` (set in `layers[kind_src]`): `None`
/// without `send` and matcher, a plain connect check.
pub(super) fn tcp(
    layers: &[Layer<'_>],
    kind_src: Option<usize>,
    p: &mut Problems<'_>,
) -> Option<ExpectCheck> {
    let check = merged(layers, Transport::Tcp, p);
    if check.send.is_some() || check.matcher.is_some() {
        return Some(check);
    }
    for (layer, ctx) in &layers[kind_src.unwrap_or(0)..] {
        if layer.expect.set.contains(&"expect_max") && layer.expect.max.is_some() {
            p.error(
                ctx,
                "expect_max applies only with send, send_hex or an expect_* matcher; remove \
                 expect_max (kind = \"tcp\" alone is a connect check)",
            );
        }
    }
    None
}

/// The merged check of `kind = "udp"` (set in `layers[kind_src]`), which
/// must send something.
pub(super) fn udp(
    layers: &[Layer<'_>],
    kind_src: Option<usize>,
    p: &mut Problems<'_>,
) -> ExpectCheck {
    let check = merged(layers, Transport::Udp, p);
    let send_set = layers
        .iter()
        .any(|(l, _)| l.expect.set.contains(&"send") || l.expect.set.contains(&"send_hex"));
    if check.send.is_none() && !send_set {
        let matcher = pick(layers, |l| &l.expect.matcher).1;
        let what = match matcher {
            Some(i) => format!(
                "{} without send",
                layers[i]
                    .0
                    .expect
                    .matcher
                    .as_ref()
                    .map_or("expect", Matcher::field)
            ),
            None => "no send".to_owned(),
        };
        p.error(
            place(layers, kind_src.max(matcher)),
            format!(
                "{what} on kind = \"udp\": UDP has no handshake to check, so the probe is a \
                 datagram and its answer; set send ({ESCAPES}) or send_hex"
            ),
        );
    }
    check
}

fn merged(layers: &[Layer<'_>], transport: Transport, p: &mut Problems<'_>) -> ExpectCheck {
    let (max, max_src) = pick(layers, |l| &l.expect.max);
    let (matcher, matcher_src) = pick(layers, |l| &l.expect.matcher);
    let max = max.unwrap_or(DEFAULT_EXPECT_MAX);
    if let Some(Matcher::Prefix(b) | Matcher::Contains(b)) = &matcher
        && b.len() > max
    {
        let field = matcher.as_ref().map_or("expect", Matcher::field);
        p.error(
            place(layers, matcher_src.max(max_src)),
            format!(
                "{field} is {} bytes, more than expect_max {max}: it could never match; raise \
                 expect_max",
                b.len()
            ),
        );
    }
    ExpectCheck {
        transport,
        send: pick(layers, |l| &l.expect.send).0,
        matcher,
        max,
    }
}

/// Send/expect fields set alongside or below `kind = "{kind}"` (`layers`)
/// are a mistake; inherited from a less specific table, they are not used.
pub(super) fn check_no_expect_fields(layers: &[Layer<'_>], kind: &str, p: &mut Problems<'_>) {
    for (layer, ctx) in layers {
        for field in &layer.expect.set {
            p.error(
                ctx,
                format!(
                    "{field} applies only to kind = \"tcp\" or \"udp\", but this check's kind is \
                     \"{kind}\"; remove {field} or set kind = \"tcp\""
                ),
            );
        }
    }
}

/// The send/expect fields of a [`CheckSpec`](crate::health::spec::CheckSpec)
/// as the file writes them (bytes escaped), for `ser_check_spec`.
#[derive(Serialize)]
pub(super) struct View {
    #[serde(skip_serializing_if = "Option::is_none")]
    send: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expect_prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expect_contains: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expect_regex: Option<String>,
    expect_max: usize,
}

impl View {
    pub(super) fn of(check: &ExpectCheck) -> Self {
        let mut view = Self {
            send: check.send.as_deref().map(expect::escape),
            expect_prefix: None,
            expect_contains: None,
            expect_regex: None,
            expect_max: check.max,
        };
        if let Some(m) = &check.matcher {
            let slot = match m {
                Matcher::Prefix(_) => &mut view.expect_prefix,
                Matcher::Contains(_) => &mut view.expect_contains,
                Matcher::Regex(_) => &mut view.expect_regex,
            };
            *slot = Some(m.shown());
        }
        view
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{DAEMON, assert_rejected, ok};
    use crate::health::spec::CheckKind;
    use crate::health::spec::expect::{
        DEFAULT_EXPECT_MAX, ExpectCheck, Matcher, Transport, compile_regex,
    };

    /// VIP "r" (UDP if `udp`) with one backend 10.0.0.1 and the given
    /// `[health_check]`, `[vip.health_check]` and backend tables.
    fn config(daemon: &str, vip: &str, backend: &str) -> String {
        format!(
            r#"{DAEMON}
[health_check]
{daemon}

[[vip]]
name = "r"
address = "10.1.0.1"
port = 6379
[vip.health_check]
{vip}

[[vip.backend]]
address = "10.0.0.1"
[vip.backend.health_check]
{backend}
"#
        )
    }

    fn kind_of(text: &str) -> CheckKind {
        ok("expect", text).vips[0].backends[0].health.kind.clone()
    }

    #[test]
    fn accepted_checks() {
        let redis = ExpectCheck {
            transport: Transport::Tcp,
            send: Some(b"PING\r\n".to_vec()),
            matcher: Some(Matcher::Prefix(b"+PONG".to_vec())),
            max: DEFAULT_EXPECT_MAX,
        };
        // (name, daemon, vip, backend, want)
        let cases = [
            (
                "redis, literal string escapes",
                "",
                "kind = \"tcp\"\nsend = 'PING\\r\\n'\nexpect_prefix = \"+PONG\"",
                "",
                CheckKind::Expect(redis.clone()),
            ),
            (
                "redis, TOML's escapes give the same bytes",
                "",
                "kind = \"tcp\"\nsend = \"PING\\r\\n\"\nexpect_prefix = \"+PONG\"",
                "",
                CheckKind::Expect(redis.clone()),
            ),
            (
                "send inherited from the daemon table, matcher from the backend's",
                "kind = \"tcp\"\nsend_hex = \"50 49 4e 47 0d 0a\"",
                "",
                "expect_prefix = '+PONG'",
                CheckKind::Expect(redis.clone()),
            ),
            (
                "smtp banner: no send",
                "",
                "kind = \"tcp\"\nexpect_regex = '^220[ -]'\nexpect_max = 512",
                "",
                CheckKind::Expect(ExpectCheck {
                    transport: Transport::Tcp,
                    send: None,
                    matcher: Some(Matcher::Regex(compile_regex("^220[ -]").unwrap())),
                    max: 512,
                }),
            ),
            (
                "udp: any datagram",
                "",
                "kind = \"udp\"\nsend_hex = \"00\"",
                "",
                CheckKind::Expect(ExpectCheck {
                    transport: Transport::Udp,
                    send: Some(vec![0]),
                    matcher: None,
                    max: DEFAULT_EXPECT_MAX,
                }),
            ),
            (
                "plain tcp stays a connect check",
                "",
                "kind = \"tcp\"",
                "",
                CheckKind::Tcp,
            ),
        ];
        for (name, daemon, vip, backend, want) in cases {
            assert_eq!(kind_of(&config(daemon, vip, backend)), want, "{name}");
        }
    }

    #[test]
    fn shown_as_written() {
        let text = config(
            "",
            "kind = \"udp\"\nsend = 'hi\\x00\\n'\nexpect_contains = 'OK'\nexpect_max = 100",
            "",
        );
        let json = serde_json::to_value(&ok("show", &text).vips[0].backends[0]).unwrap();
        let health = &json["health"];
        assert_eq!(health["kind"], "udp", "{json}");
        assert_eq!(health["send"], r"hi\0\n", "{json}");
        assert_eq!(health["expect_contains"], "OK", "{json}");
        assert_eq!(health["expect_max"], 100, "{json}");
        assert!(health.get("expect_prefix").is_none(), "{json}");
        assert!(health.get("method").is_none(), "{json}");
    }

    macro_rules! rejects {
        ($($name:ident: $text:expr => [$($want:expr),* $(,)?];)*) => {$(
            #[test]
            fn $name() {
                assert_rejected(&$text, &[$($want),*]);
            }
        )*};
    }

    rejects! {
        udp_without_send: config("", "kind = \"udp\"", "") => [
            r#"xlb.toml: vip "r": health_check: no send on kind = "udp": UDP has no handshake to check, so the probe is a datagram and its answer; set send (text with escapes \r, \n, \t, \0, \\ and \xHH) or send_hex"#,
        ];
        // The VIP's table is checked on its own too: it lacks send as well.
        udp_expect_without_send: config("", "kind = \"udp\"", "expect_prefix = 'x'") => [
            r#"xlb.toml: vip "r": health_check: no send on kind = "udp": UDP has no handshake to check, so the probe is a datagram and its answer; set send (text with escapes \r, \n, \t, \0, \\ and \xHH) or send_hex"#,
            r#"xlb.toml: vip "r": backend 10.0.0.1:6379: health_check: expect_prefix without send on kind = "udp": UDP has no handshake to check, so the probe is a datagram and its answer; set send (text with escapes \r, \n, \t, \0, \\ and \xHH) or send_hex"#,
        ];
        send_and_send_hex: config("", "kind = \"tcp\"\nsend = 'a'\nsend_hex = '61'", "") => [
            r#"xlb.toml: vip "r": health_check: send and send_hex are both set; use one of them (send: text with escapes \r, \n, \t, \0, \\ and \xHH; send_hex: hex digits)"#,
        ];
        two_matchers: config("", "kind = \"tcp\"\nexpect_prefix = 'a'\nexpect_regex = 'b'", "") => [
            r#"xlb.toml: vip "r": health_check: expect_prefix and expect_regex are set together; use one matcher"#,
        ];
        three_matchers: config(
            "",
            "kind = \"tcp\"\nexpect_prefix = 'a'\nexpect_contains = 'c'\nexpect_regex = 'b'",
            "",
        ) => [
            r#"xlb.toml: vip "r": health_check: expect_prefix and expect_contains and expect_regex are set together; use one matcher"#,
        ];
        regex_that_does_not_compile: config("", "kind = \"tcp\"\nexpect_regex = '(+PONG'", "") => [
            r#"xlb.toml: vip "r": health_check: expect_regex does not compile: repetition operator missing expression"#,
        ];
        regex_too_big: config("", "kind = \"tcp\"\nexpect_regex = '\\w{1000}{1000}'", "") => [
            r#"xlb.toml: vip "r": health_check: expect_regex does not compile: it compiles to more than 1048576 bytes; simplify it (e.g. fewer or smaller repetitions)"#,
        ];
        expect_max_out_of_range: config(
            "kind = \"tcp\"\nexpect_prefix = 'a'\nexpect_max = 0",
            "expect_max = 65537",
            "expect_max = -1",
        ) => [
            r#"xlb.toml: health_check: expect_max 0 is out of range; read 1 to 65536 bytes of answer (default 1024)"#,
            r#"xlb.toml: vip "r": health_check: expect_max 65537 is out of range; read 1 to 65536 bytes of answer (default 1024)"#,
            r#"xlb.toml: vip "r": backend 10.0.0.1:6379: health_check: expect_max -1 is out of range; read 1 to 65536 bytes of answer (default 1024)"#,
        ];
        prefix_longer_than_the_cap: config("", "kind = \"tcp\"\nexpect_prefix = 'abcd'\nexpect_max = 3", "") => [
            r#"xlb.toml: vip "r": health_check: expect_prefix is 4 bytes, more than expect_max 3: it could never match; raise expect_max"#,
        ];
        bad_escapes_and_hex: config("", "kind = \"tcp\"\nsend = 'PING\\q'\nexpect_contains = '\\x4'", "send_hex = '0x12'") => [
            r#"xlb.toml: vip "r": health_check: send has an unknown escape \q; use \r, \n, \t, \0, \\ or \xHH (two hex digits)"#,
            r#"xlb.toml: vip "r": health_check: expect_contains has \x4 without two hex digits; use \r, \n, \t, \0, \\ or \xHH (two hex digits)"#,
            r#"xlb.toml: vip "r": backend 10.0.0.1:6379: health_check: send_hex is not hex bytes; write pairs of hex digits, spaces allowed between bytes, e.g. "2a310d0a""#,
        ];
        empty_and_huge_values: config(
            "",
            &format!("kind = \"tcp\"\nsend = '{}'\nexpect_prefix = ''", "a".repeat(1025)),
            "send = ''",
        ) => [
            r#"xlb.toml: vip "r": health_check: send is 1025 bytes; send 1 to 1024 bytes (for a banner protocol, remove it and set only the expect_* matcher)"#,
            r#"xlb.toml: vip "r": health_check: expect_prefix is empty and would match anything; remove it to accept any answer"#,
            r#"xlb.toml: vip "r": backend 10.0.0.1:6379: health_check: send is 0 bytes; send 1 to 1024 bytes (for a banner protocol, remove it and set only the expect_* matcher)"#,
        ];
        expect_fields_on_http: config("", "send = 'PING'\nexpect_regex = 'x'", "") => [
            r#"xlb.toml: vip "r": health_check: send applies only to kind = "tcp" or "udp", but this check's kind is "http"; remove send or set kind = "tcp""#,
            r#"xlb.toml: vip "r": health_check: expect_regex applies only to kind = "tcp" or "udp", but this check's kind is "http"; remove expect_regex or set kind = "tcp""#,
        ];
        http_fields_on_udp: config("", "kind = \"udp\"\nsend = 'x'\npath = '/h'", "") => [
            r#"xlb.toml: vip "r": health_check: path applies only to kind = "http", but this check's kind is "udp"; remove path or set kind = "http""#,
        ];
        expect_max_alone_on_tcp: config("", "kind = \"tcp\"\nexpect_max = 10", "") => [
            r#"xlb.toml: vip "r": health_check: expect_max applies only with send, send_hex or an expect_* matcher; remove expect_max (kind = "tcp" alone is a connect check)"#,
        ];
    }
}
