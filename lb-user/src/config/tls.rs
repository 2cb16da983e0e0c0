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
