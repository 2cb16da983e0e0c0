//! The TLS fields of a health check (`tls_verify`, `ca_file`, and the
//! server name taken from `host`), for the kinds that speak TLS: parsed per
//! table, merged into a [`TlsCheck`], and refused on the kinds that do not.
//!
//! The trusted certificates are read here, at load time (`probe::tls::load`),
//! so that a CA file that is missing, unreadable or not PEM, or a host
//! without system roots, is a configuration error rather than every probe
//! failing.

use std::path::PathBuf;

use super::Problems;
use super::health::{Layer, pick, place};
use super::raw::RawHealth;
use crate::health::probe::tls;
use crate::health::spec::TlsCheck;

/// `tls_verify` and `ca_file` of one table, as written (`ca_file` is
/// checked once merged, when it is known whether it is used).
pub(super) fn tls_fields(
    raw: &RawHealth,
    ctx: &str,
    p: &mut Problems<'_>,
) -> (Option<bool>, Option<PathBuf>) {
    let ca_file = match raw.ca_file.as_deref() {
        Some("") => {
            p.error(
                ctx,
                "ca_file is empty; give the path of a PEM file of CA certificates, or remove \
                 ca_file to verify against the system roots",
            );
            None
        }
        other => other.map(PathBuf::from),
    };
    (raw.tls_verify, ca_file)
}

/// The merged TLS settings of `layers`, with the trusted certificates read
/// (an error names the file and what to do).
pub(super) fn tls_check(layers: &[Layer<'_>], p: &mut Problems<'_>) -> TlsCheck {
    let (verify, verify_src) = pick(layers, |l| &l.tls_verify);
    let (ca_file, ca_src) = pick(layers, |l| &l.ca_file);
    let (host, host_src) = pick(layers, |l| &l.host);
    let verify = verify.unwrap_or(true);
    if !verify && ca_file.is_some() {
        p.error(
            place(layers, ca_src.max(verify_src)),
            "ca_file is not used with tls_verify = false (no certificate is checked); remove \
             ca_file, or tls_verify to verify against it",
        );
    }
    let server_name = host.and_then(|host| {
        let name = sni_name(&host);
        match tls::parse_server_name(name) {
            Ok(_) => Some(name.to_owned()),
            Err(why) => {
                p.error(
                    place(layers, host_src),
                    format!(
                        "host {host:?} cannot name the TLS server: {why}; set host to the name \
                         the backends' certificate holds, or remove host to check their IP \
                         addresses"
                    ),
                );
                None
            }
        }
    });
    let check = TlsCheck {
        verify,
        ca_file: ca_file.filter(|_| verify),
        server_name,
    };
    if let Err(why) = tls::load(&check) {
        let at = if check.ca_file.is_some() {
            place(layers, ca_src)
        } else {
            layers.last().map_or("health_check", |l| l.1)
        };
        p.error(at, why);
    }
    check
}

/// The host part of a Host header value: `name:port` and `[v6]:port` lose
/// the port, `[v6]` its brackets (SNI and certificates name no port).
fn sni_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(addr, _)| addr);
    }
    match host.split_once(':') {
        Some((name, port)) if !port.contains(':') => name,
        _ => host,
    }
}

/// TLS settings set alongside or below a `kind` that does not speak TLS
/// (`layers`, from the table that set the kind) are a mistake; inherited
/// from a less specific table they are simply not used.
pub(super) fn check_no_tls_fields(layers: &[Layer<'_>], kind: &str, p: &mut Problems<'_>) {
    for (layer, ctx) in layers {
        let fields = [
            ("tls_verify", layer.tls_verify.is_some()),
            ("ca_file", layer.ca_file.is_some()),
        ];
        for (field, set) in fields {
            if set {
                p.error(
                    ctx,
                    format!(
                        "{field} applies only to kinds that use TLS (\"https\"), but this \
                         check's kind is \"{kind}\"; remove {field} or set kind = \"https\""
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{api_with_backend, assert_rejected, default_http, ok};
    use crate::health::probe::tls::testutil::{TempDir, pem};
    use crate::health::spec::{CheckKind, HttpCheck};

    /// VIP "api" with one backend and `check` as its `[vip.health_check]`.
    fn with_check(check: &str) -> String {
        api_with_backend(&format!("[vip.health_check]\n{check}"))
    }

    /// The check of the only backend of `text`.
    fn kind(text: &str) -> CheckKind {
        ok("https", text).vips[0].backends[0].health.kind.clone()
    }

    #[test]
    fn https_settings() {
        let dir = TempDir::new("config");
        let ca = dir.file("ca.pem", pem("ca.pem"));
        let https = |http: HttpCheck, tls: TlsCheck| CheckKind::Https { http, tls };
        let text = with_check(&format!(
            "kind = \"https\"\nhost = \"good.test:8443\"\nca_file = {:?}",
            ca.display().to_string()
        ));
        let want = https(
            HttpCheck {
                host: Some("good.test:8443".to_owned()),
                ..default_http()
            },
            TlsCheck {
                verify: true,
                ca_file: Some(ca.clone()),
                server_name: Some("good.test".to_owned()),
            },
        );
        assert_eq!(kind(&text), want);
        // Defaults: the system roots, the backend's address as the name.
        let system = TlsCheck {
            verify: true,
            ca_file: None,
            server_name: None,
        };
        let text = with_check("kind = \"https\"");
        assert_eq!(kind(&text), https(default_http(), system.clone()));
        let text = with_check("kind = \"https\"\ntls_verify = false\nreuse_connection = true");
        let reuse = HttpCheck {
            reuse_connection: Some(crate::health::spec::DEFAULT_REOPEN_EVERY),
            ..default_http()
        };
        let any = TlsCheck {
            verify: false,
            ..system
        };
        assert_eq!(kind(&text), https(reuse, any));
    }

    #[test]
    fn https_shown_with_its_tls_settings() {
        let dir = TempDir::new("config-show");
        let ca = dir.file("ca.pem", pem("ca.pem"));
        let text = with_check(&format!(
            "kind = \"https\"\nca_file = {:?}",
            ca.display().to_string()
        ));
        let json = serde_json::to_value(ok("show", &text)).expect("serialize");
        let health = &json["vips"][0]["backends"][0]["health"];
        assert_eq!(health["kind"], "https");
        assert_eq!(health["tls_verify"], true);
        assert_eq!(health["ca_file"], ca.display().to_string());
        assert_eq!(health["path"], "/health");
        let json = serde_json::to_value(ok("show", &with_check("kind = \"tcp\""))).expect("json");
        let health = &json["vips"][0]["backends"][0]["health"];
        assert!(health.get("tls_verify").is_none(), "{health}");
        assert!(health.get("ca_file").is_none(), "{health}");
    }

    #[test]
    fn ca_file_that_does_not_exist() {
        assert_rejected(
            &with_check("kind = \"https\"\nca_file = \"/nonexistent/xlb/ca.pem\""),
            &[
                r#"xlb.toml: vip "api": health_check: ca_file /nonexistent/xlb/ca.pem cannot be read: No such file or directory (os error 2); give the path of a PEM file holding the CA certificates that signed the backends' certificates"#,
            ],
        );
    }

    #[test]
    fn ca_file_not_pem() {
        let dir = TempDir::new("config-not-pem");
        let key = dir.file("key.pem", pem("ca.key"));
        assert_rejected(
            &with_check(&format!(
                "kind = \"https\"\nca_file = {:?}",
                key.display().to_string()
            )),
            &[&format!(
                r#"xlb.toml: vip "api": health_check: ca_file {} holds no PEM certificate (no "-----BEGIN CERTIFICATE-----" block); give the CA certificates in PEM form"#,
                key.display()
            )],
        );
    }

    rejects! {
        tls_verify_on_tcp: with_check("kind = \"tcp\"\ntls_verify = false") => [
            r#"xlb.toml: vip "api": health_check: tls_verify applies only to kinds that use TLS ("https"), but this check's kind is "tcp"; remove tls_verify or set kind = "https""#,
        ];
        ca_file_on_http_below_https: api_with_backend(
            "[vip.health_check]\nkind = \"https\"\n[[vip.backend]]\naddress = \"10.0.0.12\"\n[vip.backend.health_check]\nkind = \"http\"\nca_file = \"/x.pem\""
        ) => [
            r#"xlb.toml: vip "api": backend 10.0.0.12:80: health_check: ca_file applies only to kinds that use TLS ("https"), but this check's kind is "http"; remove ca_file or set kind = "https""#,
        ];
        ca_file_without_verify: with_check("kind = \"https\"\ntls_verify = false\nca_file = \"/x.pem\"") => [
            r#"xlb.toml: vip "api": health_check: ca_file is not used with tls_verify = false (no certificate is checked); remove ca_file, or tls_verify to verify against it"#,
        ];
        empty_ca_file: with_check("kind = \"https\"\nca_file = \"\"") => [
            r#"xlb.toml: vip "api": health_check: ca_file is empty; give the path of a PEM file of CA certificates, or remove ca_file to verify against the system roots"#,
        ];
        host_that_cannot_be_a_server_name: with_check("kind = \"https\"\nhost = \"a..b\"") => [
            r#"xlb.toml: vip "api": health_check: host "a..b" cannot name the TLS server: "a..b" is not a DNS name or IP address the certificate can be checked against; set host to the name the backends' certificate holds, or remove host to check their IP addresses"#,
        ];
    }

    #[test]
    fn sni_names() {
        let cases = [
            ("example.com", "example.com"),
            ("example.com:8443", "example.com"),
            ("10.0.0.1:443", "10.0.0.1"),
            ("[2001:db8::1]:443", "2001:db8::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("2001:db8::1", "2001:db8::1"),
        ];
        for (host, want) in cases {
            assert_eq!(sni_name(host), want, "{host}");
        }
    }
}
