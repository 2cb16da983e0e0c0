//! What a `kind = "dns"` check asks: one question (`dns_name`, `dns_type`,
//! class IN) and the response codes that pass (`dns_rcodes`). The rules for
//! each field live here, for `config` (at load time, with the field's
//! place) and the prober alike.

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{Name, RecordType};

/// A DNS check: the question and the accepted response codes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsCheck {
    /// The name asked for, fully qualified (`.` by default).
    pub name: Name,
    /// The record type asked for (`NS` by default).
    pub record_type: RecordType,
    /// Response codes that pass (by default NOERROR and NXDOMAIN: a server
    /// that says a name does not exist has answered).
    pub rcodes: Vec<ResponseCode>,
}

/// `dns_name` unless configured: the root, which every resolver knows.
pub const DEFAULT_NAME: &str = ".";
/// `dns_type` unless configured.
pub const DEFAULT_TYPE: &str = "NS";
/// `dns_rcodes` unless configured.
pub const DEFAULT_RCODES: [ResponseCode; 2] = [ResponseCode::NoError, ResponseCode::NXDomain];

impl Default for DnsCheck {
    fn default() -> Self {
        Self {
            name: Name::root(),
            record_type: RecordType::NS,
            rcodes: DEFAULT_RCODES.to_vec(),
        }
    }
}

impl DnsCheck {
    /// A check asking `name` `record_type` with the default rcodes (for
    /// callers that build a spec by hand, e.g. benchmarks).
    pub fn new(name: &str, record_type: &str) -> Result<Self, String> {
        Ok(Self {
            name: parse_name(name)?,
            record_type: parse_type(record_type)?,
            rcodes: DEFAULT_RCODES.to_vec(),
        })
    }
}

/// A domain name in presentation form (`lab.test`, `lab.test.`, `.`),
/// made fully qualified: a health check has no search list to complete it.
/// The error is hickory's own words.
pub fn parse_name(text: &str) -> Result<Name, String> {
    if text.is_empty() {
        return Err("the name is empty".to_owned());
    }
    let mut name = Name::from_ascii(text).map_err(|e| e.to_string())?;
    name.set_fqdn(true);
    Ok(name)
}

/// Record types a check cannot ask over UDP: zone transfers run over TCP,
/// and TSIG/OPT are not questions.
const UNASKABLE: [RecordType; 4] = [
    RecordType::AXFR,
    RecordType::IXFR,
    RecordType::TSIG,
    RecordType::OPT,
];

/// A record type by its name (`A`, `aaaa`, `NS`, `SOA`, `TXT`...), as
/// hickory names them; case does not matter.
pub fn parse_type(text: &str) -> Result<RecordType, String> {
    let upper = text.to_ascii_uppercase();
    match upper.parse::<RecordType>() {
        Ok(t) if UNASKABLE.contains(&t) => Err(format!("{upper} cannot be asked over UDP")),
        Ok(t) => Ok(t),
        Err(_) => Err(format!("unknown record type {text:?}")),
    }
}

/// The response codes by the names `dig` prints, in code order (0 to 10).
const RCODE_NAMES: [(&str, ResponseCode); 11] = [
    ("NOERROR", ResponseCode::NoError),
    ("FORMERR", ResponseCode::FormErr),
    ("SERVFAIL", ResponseCode::ServFail),
    ("NXDOMAIN", ResponseCode::NXDomain),
    ("NOTIMP", ResponseCode::NotImp),
    ("REFUSED", ResponseCode::Refused),
    ("YXDOMAIN", ResponseCode::YXDomain),
    ("YXRRSET", ResponseCode::YXRRSet),
    ("NXRRSET", ResponseCode::NXRRSet),
    ("NOTAUTH", ResponseCode::NotAuth),
    ("NOTZONE", ResponseCode::NotZone),
];

/// The names `dns_rcodes` accepts, for messages.
pub fn rcode_names() -> String {
    RCODE_NAMES.map(|(n, _)| n).join(", ")
}

/// A response code by its `dig` name (`NOERROR`, `nxdomain`...).
pub fn parse_rcode(text: &str) -> Option<ResponseCode> {
    RCODE_NAMES
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(text))
        .map(|&(_, code)| code)
}

/// The `dig` name of `rcode` (`SERVFAIL`), or `RCODE12` for one without.
pub fn rcode_name(rcode: ResponseCode) -> String {
    RCODE_NAMES.iter().find(|&&(_, c)| c == rcode).map_or_else(
        || format!("RCODE{}", u16::from(rcode)),
        |(n, _)| (*n).to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_fully_qualified() {
        assert_eq!(
            parse_name("lab.test").unwrap(),
            parse_name("lab.test.").unwrap()
        );
        assert!(parse_name("lab.test").unwrap().is_fqdn());
        assert!(parse_name(".").unwrap().is_root());
        assert_eq!(parse_name("").unwrap_err(), "the name is empty");
        let long = "a".repeat(64);
        assert!(parse_name(&long).is_err(), "a 64-byte label");
        assert!(parse_name("a..b").is_err(), "an empty label");
    }

    #[test]
    fn types_by_name() {
        assert_eq!(parse_type("a").unwrap(), RecordType::A);
        assert_eq!(parse_type("AAAA").unwrap(), RecordType::AAAA);
        assert_eq!(parse_type("soa").unwrap(), RecordType::SOA);
        assert_eq!(parse_type("Txt").unwrap(), RecordType::TXT);
        assert_eq!(
            parse_type("AXFR").unwrap_err(),
            "AXFR cannot be asked over UDP"
        );
        assert_eq!(parse_type("B").unwrap_err(), "unknown record type \"B\"");
    }

    #[test]
    fn rcodes_by_name() {
        assert_eq!(parse_rcode("noerror"), Some(ResponseCode::NoError));
        assert_eq!(parse_rcode("SERVFAIL"), Some(ResponseCode::ServFail));
        assert_eq!(parse_rcode("NOTZONE"), Some(ResponseCode::NotZone));
        assert_eq!(parse_rcode("OK"), None);
        assert_eq!(rcode_name(ResponseCode::Refused), "REFUSED");
        assert_eq!(rcode_name(ResponseCode::Unknown(12)), "RCODE12");
        assert_eq!(rcode_name(ResponseCode::BADCOOKIE), "RCODE23");
        for (name, code) in RCODE_NAMES {
            assert_eq!(rcode_name(code), name);
            assert_eq!(parse_rcode(name), Some(code));
        }
    }
}
