//! The `kind = "grpc"` fields of a health_check table: `service` (the name
//! the health service is asked about) and `tls`, and the rule that they
//! apply to no other kind.

use super::Problems;
use super::raw::KindName;

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
pub(super) fn refuse_fields(fields: &[(&str, bool)], kind: KindName, ctx: &str, p: &mut Problems<'_>) {
    let kind = match kind {
        KindName::Http => "http",
        KindName::Tcp => "tcp",
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
