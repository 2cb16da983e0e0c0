//! The `kind = "dns"` fields of a health_check table: `dns_name`,
//! `dns_type` and `dns_rcodes`, each checked by the rules of
//! [`crate::health::spec::dns`] when its table is parsed, so that a message
//! names the field and the table; merged over the defaults by [`resolve`].

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{Name, RecordType};

use super::Problems;
use super::health::Layer;
use super::raw::RawHealth;
use crate::health::spec::dns::{self as rules, DnsCheck};

/// The DNS fields of one table, values parsed, fields absent stay `None`.
#[derive(Clone, Debug, Default)]
pub(super) struct DnsLayer {
    name: Option<Name>,
    record_type: Option<RecordType>,
    rcodes: Option<Vec<ResponseCode>>,
}

impl DnsLayer {
    /// The fields this table sets, by their names in the file (valid or
    /// not: an invalid value is reported once, by [`parse`]).
    fn set_fields(raw: &RawHealth) -> impl Iterator<Item = &'static str> {
        [
            ("dns_name", raw.dns_name.is_some()),
            ("dns_type", raw.dns_type.is_some()),
            ("dns_rcodes", raw.dns_rcodes.is_some()),
        ]
        .into_iter()
        .filter_map(|(field, set)| set.then_some(field))
    }
}

/// The DNS fields of `raw` (the table at `ctx`), each checked on its own,
/// with the names of the fields it sets (for [`check_no_dns_fields`]).
pub(super) fn parse(
    raw: &RawHealth,
    ctx: &str,
    p: &mut Problems<'_>,
) -> (DnsLayer, Vec<&'static str>) {
    let name = raw.dns_name.as_deref().and_then(|text| {
        rules::parse_name(text)
            .map_err(|e| {
                p.error(
                    ctx,
                    format!(
                        "dns_name {text:?} is not a domain name ({e}); use e.g. \"example.com\", \
                         or \".\" for the root"
                    ),
                );
            })
            .ok()
    });
    let record_type = raw.dns_type.as_deref().and_then(|text| {
        rules::parse_type(text)
            .map_err(|e| {
                p.error(
                    ctx,
                    format!(
                        "dns_type {text:?} cannot be asked ({e}); use a record type such as \
                         \"A\", \"AAAA\", \"NS\", \"SOA\" or \"TXT\""
                    ),
                );
            })
            .ok()
    });
    let rcodes = raw
        .dns_rcodes
        .as_deref()
        .and_then(|items| rcodes(items, ctx, p));
    let layer = DnsLayer {
        name,
        record_type,
        rcodes,
    };
    (layer, DnsLayer::set_fields(raw).collect())
}

/// Every item reported; the list is kept only if all are valid.
fn rcodes(items: &[String], ctx: &str, p: &mut Problems<'_>) -> Option<Vec<ResponseCode>> {
    if items.is_empty() {
        p.error(
            ctx,
            "dns_rcodes is empty: no answer could pass; remove it to accept NOERROR and NXDOMAIN",
        );
        return None;
    }
    let mut codes = Vec::with_capacity(items.len());
    for item in items {
        match rules::parse_rcode(item) {
            Some(code) => codes.push(code),
            None => p.error(
                ctx,
                format!(
                    "dns_rcodes item {item:?} is not a response code; use names among {}",
                    rules::rcode_names()
                ),
            ),
        }
    }
    (codes.len() == items.len()).then_some(codes)
}

/// The merged DNS check of `layers` (least specific first): each field
/// from the most specific table that sets it, else its default.
pub(super) fn resolve(layers: &[Layer<'_>]) -> DnsCheck {
    let pick =
        |field: fn(&DnsLayer) -> bool| layers.iter().rev().map(|l| &l.0.dns).find(|d| field(d));
    let defaults = DnsCheck::default();
    DnsCheck {
        name: pick(|d| d.name.is_some())
            .and_then(|d| d.name.clone())
            .unwrap_or(defaults.name),
        record_type: pick(|d| d.record_type.is_some())
            .and_then(|d| d.record_type)
            .unwrap_or(defaults.record_type),
        rcodes: pick(|d| d.rcodes.is_some())
            .and_then(|d| d.rcodes.clone())
            .unwrap_or(defaults.rcodes),
    }
}

/// DNS fields set alongside or below a table whose kind is `kind` (not
/// `"dns"`) are a mistake; inherited from a less specific one, they are
/// simply not used.
pub(super) fn check_no_dns_fields(layers: &[Layer<'_>], kind: &str, p: &mut Problems<'_>) {
    for (layer, ctx) in layers {
        for field in &layer.dns_set {
            p.error(
                ctx,
                format!(
                    "{field} applies only to kind = \"dns\", but this check's kind is \
                     \"{kind}\"; remove {field} or set kind = \"dns\""
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::tests::{DAEMON, api_vip, ok};
    use crate::health::spec::CheckKind;

    /// A UDP VIP "dns" on port 53 with one backend, and the given contents
    /// of `[health_check]`, `[vip.health_check]` and the backend's table.
    fn dns_vip(daemon: &str, vip: &str, backend: &str) -> String {
        format!(
            r#"{DAEMON}
[health_check]
{daemon}

[[vip]]
name = "dns"
address = "10.100.0.53"
port = 53
protocol = "udp"
[vip.health_check]
{vip}

[[vip.backend]]
address = "10.0.0.21"
[vip.backend.health_check]
{backend}
"#
        )
    }

    fn dns_of(text: &str) -> (DnsCheck, u16) {
        let config = ok("dns", text);
        let health = &config.vips[0].backends[0].health;
        match &health.kind {
            CheckKind::Dns(dns) => (dns.clone(), health.port),
            other => panic!("not a DNS check: {other:?}"),
        }
    }

    #[test]
    fn defaults_and_service_port() {
        let (dns, port) = dns_of(&dns_vip("", r#"kind = "dns""#, ""));
        assert_eq!(dns, DnsCheck::default());
        assert_eq!(dns.name.to_ascii(), ".");
        assert_eq!(dns.record_type, RecordType::NS);
        assert_eq!(port, 53, "health_port defaults to the service port");
    }

    #[test]
    fn fields_merge_by_table() {
        let (dns, _) = dns_of(&dns_vip(
            "kind = \"dns\"\ndns_rcodes = [\"noerror\"]",
            "kind = \"dns\"\ndns_name = \"lab.test\"\ndns_type = \"soa\"",
            r#"dns_type = "A""#,
        ));
        assert_eq!(dns.name, rules::parse_name("lab.test.").unwrap());
        assert_eq!(dns.record_type, RecordType::A);
        assert_eq!(dns.rcodes, [ResponseCode::NoError]);
        // `kind = "dns"` daemon-wide: every VIP's check asks the question.
        let (dns, _) = dns_of(&dns_vip(
            "kind = \"dns\"\ndns_name = \"example.com\"",
            "",
            "",
        ));
        assert_eq!(dns.name.to_ascii(), "example.com.");
        // A VIP that sets another kind inherits the DNS fields unused.
        let config = ok(
            "inherited",
            &dns_vip(
                "kind = \"dns\"\ndns_name = \"example.com\"",
                r#"kind = "tcp""#,
                "",
            ),
        );
        assert_eq!(config.vips[0].backends[0].health.kind, CheckKind::Tcp);
    }

    #[test]
    fn shown_with_the_file_spelling() {
        let config = ok(
            "show",
            &dns_vip(
                "",
                "kind = \"dns\"\ndns_name = \"Lab.Test\"\ndns_type = \"aaaa\"\n\
                 dns_rcodes = [\"NOERROR\", \"servfail\"]\ntimeout = \"300ms\"",
                "",
            ),
        );
        let json = serde_json::to_value(&config).unwrap();
        let health = &json["vips"][0]["backends"][0]["health"];
        assert_eq!(health["kind"], "dns");
        assert_eq!(health["dns_name"], "Lab.Test.");
        assert_eq!(health["dns_type"], "AAAA");
        assert_eq!(
            health["dns_rcodes"],
            serde_json::json!(["NOERROR", "SERVFAIL"])
        );
        assert_eq!(health["port"], 53);
        assert_eq!(health["hang_timeout"], "900ms");
        assert!(health.get("path").is_none(), "{health}");
        assert_eq!(
            config.vips[0].backends[0].health.timeout,
            Duration::from_millis(300)
        );
    }

    rejects! {
        bad_dns_fields: dns_vip(
            "",
            "kind = \"dns\"\ndns_name = \"a..b\"\ndns_type = \"AXFR\"\n\
             dns_rcodes = [\"NOERROR\", \"OK\"]",
            "dns_type = \"B\"\ndns_rcodes = []",
        ) => [
            r#"xlb.toml: vip "dns": health_check: dns_name "a..b" is not a domain name (Malformed label: ); use e.g. "example.com", or "." for the root"#,
            r#"xlb.toml: vip "dns": health_check: dns_type "AXFR" cannot be asked (AXFR cannot be asked over UDP); use a record type such as "A", "AAAA", "NS", "SOA" or "TXT""#,
            r#"xlb.toml: vip "dns": health_check: dns_rcodes item "OK" is not a response code; use names among NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED, YXDOMAIN, YXRRSET, NXRRSET, NOTAUTH, NOTZONE"#,
            r#"xlb.toml: vip "dns": backend 10.0.0.21:53: health_check: dns_type "B" cannot be asked (unknown record type "B"); use a record type such as "A", "AAAA", "NS", "SOA" or "TXT""#,
            r#"xlb.toml: vip "dns": backend 10.0.0.21:53: health_check: dns_rcodes is empty: no answer could pass; remove it to accept NOERROR and NXDOMAIN"#,
        ];
        empty_dns_name: dns_vip("", "kind = \"dns\"\ndns_name = \"\"", "") => [
            r#"xlb.toml: vip "dns": health_check: dns_name "" is not a domain name (the name is empty); use e.g. "example.com", or "." for the root"#,
        ];
        dns_fields_on_http_and_tcp: api_vip(r#"
[vip.health_check]
dns_name = "lab.test"
[[vip.backend]]
address = "10.0.0.11"
[[vip.backend]]
address = "10.0.0.12"
[vip.backend.health_check]
kind = "tcp"
dns_type = "A"
"#) => [
            r#"xlb.toml: vip "api": health_check: dns_name applies only to kind = "dns", but this check's kind is "http"; remove dns_name or set kind = "dns""#,
            r#"xlb.toml: vip "api": backend 10.0.0.12:80: health_check: dns_type applies only to kind = "dns", but this check's kind is "tcp"; remove dns_type or set kind = "dns""#,
        ];
        http_fields_on_dns: dns_vip(
            r#"path = "/inherited-and-unused""#,
            "kind = \"dns\"\nexpect_status = [\"200\"]",
            "body_contains = \"ok\"",
        ) => [
            r#"xlb.toml: vip "dns": health_check: expect_status applies only to kind = "http", but this check's kind is "dns"; remove expect_status or set kind = "http""#,
            r#"xlb.toml: vip "dns": backend 10.0.0.21:53: health_check: body_contains applies only to kind = "http", but this check's kind is "dns"; remove body_contains or set kind = "http""#,
        ];
        bad_kind_named: dns_vip("", r#"kind = "dnss""#, "") => [
            r#"xlb.toml:14:8: vip "dns": health_check: kind: unknown variant `dnss`, expected one of `http`, `https`, `grpc`, `tcp`, `udp`, `dns`"#,
        ];
    }
}
