//! The `kind = "grpc"` fields of a health_check table: `service` (the name
//! the health service is asked about) and `tls`, and the rule that they
//! apply to no other kind.

use super::Problems;
use super::health::{Layer, check_no_http_fields, pick, reuse_connection};
use super::raw::KindName;
use crate::health::spec::GrpcCheck;

/// The merged `kind = "grpc"` check of `layers`; `below` are the layers
/// from the one that set the kind, where HTTP request fields are refused.
pub(super) fn grpc_check(
    layers: &[Layer<'_>],
    below: &[Layer<'_>],
    p: &mut Problems<'_>,
) -> GrpcCheck {
    let allowed = ["host", "reuse_connection", "reopen_every"];
    check_no_http_fields(below, "grpc", &allowed, p);
    let (tls, tls_src) = pick(layers, |l| &l.tls);
    let tls = if tls == Some(true) {
        Some(super::tls::tls_check(layers, p))
    } else {
        // Inherited from above the table that turned TLS off: not used.
        for (layer, ctx) in &layers[tls_src.unwrap_or(0)..] {
            for (field, set) in [
                ("tls_verify", layer.tls_verify.is_some()),
                ("ca_file", layer.ca_file.is_some()),
            ] {
                if set {
                    p.error(
                        ctx,
                        format!(
                            "{field} applies only with tls = true on kind = \"grpc\" (this \
                             check is h2c, without TLS); set tls = true or remove {field}"
                        ),
                    );
                }
            }
        }
        None
    };
    GrpcCheck {
        service: pick(layers, |l| &l.service).0.unwrap_or_default(),
        host: pick(layers, |l| &l.host).0,
        reuse_connection: reuse_connection(layers, p),
        tls,
    }
}

/// Longest `service`: a fully qualified gRPC service name is far shorter;
/// anything longer is a mistake (and every probe would send it).
const MAX_SERVICE: usize = 256;

/// `service`, checked on its own: "" (the whole server) or a name of
/// printable characters, as servers register them.
pub(super) fn service(value: Option<&str>, ctx: &str, p: &mut Problems<'_>) -> Option<String> {
    let value = value?;
    if value.len() <= MAX_SERVICE && !value.chars().any(char::is_control) {
        return Some(value.to_owned());
    }
    p.error(
        ctx,
        format!(
            "service {value:?} is invalid; use the name the server registers its health status \
             under (at most {MAX_SERVICE} bytes, no control characters), e.g. \
             \"grpc.health.v1.Health\", or \"\" for the whole server"
        ),
    );
    None
}

/// Refuses the gRPC `fields` (name, set in this table) of a table whose
/// check is of another `kind`.
pub(super) fn refuse_fields(
    fields: &[(&str, bool)],
    kind: KindName,
    ctx: &str,
    p: &mut Problems<'_>,
) {
    let kind = match kind {
        KindName::Http => "http",
        KindName::Tcp => "tcp",
        KindName::Https => "https",
        KindName::Dns => "dns",
        KindName::Udp => "udp",
        KindName::Grpc => return,
    };
    for &(field, set) in fields {
        if set {
            p.error(
                ctx,
                format!(
                    "{field} applies only to kind = \"grpc\", but this check's kind is \
                     \"{kind}\"; remove {field} or set kind = \"grpc\""
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{api_with_backend, assert_rejected, ok};
    use crate::health::spec::{CheckKind, GrpcCheck, TlsCheck};

    #[test]
    fn grpc_check_is_built_and_shown() {
        let config = ok(
            "grpc",
            &api_with_backend(
                r#"
[vip.health_check]
kind = "grpc"
service = "shop.Cart"
host = "cart.internal"
reuse_connection = true
reopen_every = 5
"#,
            ),
        );
        let health = &config.vips[0].backends[0].health;
        assert_eq!(
            health.kind,
            CheckKind::Grpc(GrpcCheck {
                service: "shop.Cart".into(),
                host: Some("cart.internal".into()),
                reuse_connection: Some(5),
                tls: None,
            })
        );
        let json = serde_json::to_value(&config).expect("json");
        let shown = &json["vips"][0]["backends"][0]["health"];
        assert_eq!(shown["kind"], "grpc");
        assert_eq!(shown["service"], "shop.Cart");
        assert_eq!(shown["tls"], false);
        assert_eq!(shown["host"], "cart.internal");
        assert_eq!(shown["reopen_every"], 5);
        assert!(shown.get("path").is_none(), "{shown}");

        // Defaults: the whole server, a fresh connection per probe.
        let config = ok(
            "grpc defaults",
            &api_with_backend("[vip.health_check]\nkind = \"grpc\""),
        );
        assert_eq!(
            config.vips[0].backends[0].health.kind,
            CheckKind::Grpc(GrpcCheck {
                service: String::new(),
                host: None,
                reuse_connection: None,
                tls: None,
            })
        );
    }

    #[test]
    fn http_fields_refused_on_grpc() {
        assert_rejected(
            &api_with_backend(
                r#"
[vip.health_check]
kind = "grpc"
path = "/health"
method = "GET"
expect_status = ["200"]
body_contains = "ok"
"#,
            ),
            &[
                r#"xlb.toml: vip "api": health_check: method applies only to kind = "http", but this check's kind is "grpc"; remove method or set kind = "http""#,
                r#"xlb.toml: vip "api": health_check: path applies only to kind = "http", but this check's kind is "grpc"; remove path or set kind = "http""#,
                r#"xlb.toml: vip "api": health_check: expect_status applies only to kind = "http", but this check's kind is "grpc"; remove expect_status or set kind = "http""#,
                r#"xlb.toml: vip "api": health_check: body_contains applies only to kind = "http", but this check's kind is "grpc"; remove body_contains or set kind = "http""#,
            ],
        );
    }

    #[test]
    fn grpc_fields_refused_on_other_kinds() {
        assert_rejected(
            &api_with_backend("[vip.health_check]\nservice = \"shop.Cart\"\ntls = true"),
            &[
                r#"xlb.toml: vip "api": health_check: service applies only to kind = "grpc", but this check's kind is "http"; remove service or set kind = "grpc""#,
                r#"xlb.toml: vip "api": health_check: tls applies only to kind = "grpc", but this check's kind is "http"; remove tls or set kind = "grpc""#,
            ],
        );
        assert_rejected(
            &api_with_backend("[vip.health_check]\nkind = \"tcp\"\nservice = \"\""),
            &[
                r#"xlb.toml: vip "api": health_check: service applies only to kind = "grpc", but this check's kind is "tcp"; remove service or set kind = "grpc""#,
            ],
        );
    }

    #[test]
    fn tls_fields_on_grpc() {
        let config = ok(
            "grpc tls",
            &api_with_backend(
                "[vip.health_check]\nkind = \"grpc\"\ntls = true\ntls_verify = false\nhost = \"cart.test\"",
            ),
        );
        let CheckKind::Grpc(grpc) = &config.vips[0].backends[0].health.kind else {
            panic!("not grpc");
        };
        assert_eq!(
            grpc.tls,
            Some(TlsCheck {
                verify: false,
                ca_file: None,
                server_name: Some("cart.test".into()),
            })
        );
        let json = serde_json::to_value(&config).expect("json");
        assert_eq!(json["vips"][0]["backends"][0]["health"]["tls"], true);
        assert_rejected(
            &api_with_backend(
                "[vip.health_check]\nkind = \"grpc\"\ntls_verify = false\nca_file = \"/x.pem\"",
            ),
            &[
                r#"xlb.toml: vip "api": health_check: tls_verify applies only with tls = true on kind = "grpc" (this check is h2c, without TLS); set tls = true or remove tls_verify"#,
                r#"xlb.toml: vip "api": health_check: ca_file applies only with tls = true on kind = "grpc" (this check is h2c, without TLS); set tls = true or remove ca_file"#,
            ],
        );
        let missing = "/nonexistent/xlb-grpc-ca.pem";
        let text = api_with_backend(&format!(
            "[vip.health_check]\nkind = \"grpc\"\ntls = true\nca_file = \"{missing}\""
        ));
        let errors = crate::config::tests::parse(&text)
            .expect_err("accepted")
            .problems;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains(missing), "{errors:?}");
    }

    #[test]
    fn bad_service_names() {
        let long = "s".repeat(257);
        for bad in ["bad\\nname", long.as_str()] {
            let shown = format!("{:?}", bad.replace("\\n", "\n"));
            assert_rejected(
                &api_with_backend(&format!(
                    "[vip.health_check]\nkind = \"grpc\"\nservice = \"{bad}\""
                )),
                &[&format!(
                    r#"xlb.toml: vip "api": health_check: service {shown} is invalid; use the name the server registers its health status under (at most 256 bytes, no control characters), e.g. "grpc.health.v1.Health", or "" for the whole server"#
                )],
            );
        }
    }
}
