//! `kind = "dns"`: one query over UDP, judged by the answer's header and
//! question, as a resolver judges it before trusting the records.
//!
//! The query carries a fresh random id and leaves from a fresh random
//! source port (the transport, [`super::udp`]), with RD set (a recursive
//! server answers from cache or recursion; an authoritative one ignores
//! it). An answer passes when it is a response (QR set) with the query's id,
//! the same question (name compared case-insensitively: servers that
//! randomise case (DNS 0x20) echo it as they received it) and an accepted
//! response code. The records themselves are only decoded, never judged: a
//! check proves that the server answers, not that its data is right.
//!
//! No EDNS is advertised, so a server sends at most 512 bytes and sets TC
//! when the answer is longer; at most [`MAX_ANSWER`] bytes are read
//! whatever it sends. A truncated answer (TC set, or cut at
//! [`MAX_ANSWER`]) passes on its header and question: the server has
//! answered, which is what the check asks; its records are not decoded.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::op::{Header, Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::DNSClass;
use hickory_proto::serialize::binary::{BinDecodable as _, BinDecoder};
use tokio::time::Instant;

use super::udp::exchange;
use super::{FailReason, ProbeOk};
use crate::health::datapath::DatapathTarget;
use crate::health::spec::DnsCheck;
use crate::health::spec::dns::rcode_name;

/// Bytes of an answer read at most: 8 times what a server sends without
/// EDNS, so a server that ignores the limit is still judged on its header.
pub(crate) const MAX_ANSWER: usize = 4096;

/// Why a DNS answer failed the check. `Display` is the operator's text;
/// [`DnsFail::code`] the stable id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DnsFail {
    /// A well-formed answer with a response code outside `dns_rcodes`.
    Rcode { rcode: ResponseCode },
    /// An answer whose id is not the query's (a confused or spoofing
    /// server: the socket takes datagrams from the backend's address only).
    IdMismatch { sent: u16, received: u16 },
    /// An answer to another question (or to none).
    QuestionMismatch { asked: String, answered: String },
    /// A datagram with QR clear: a query, not a response.
    NotResponse,
    /// Bytes that are not a DNS message (hickory's words, escaped).
    Malformed { reason: String },
}

impl DnsFail {
    /// Stable snake_case identifier.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Rcode { .. } => "dns_rcode",
            Self::IdMismatch { .. } => "dns_id_mismatch",
            Self::QuestionMismatch { .. } => "dns_question_mismatch",
            Self::NotResponse => "dns_not_response",
            Self::Malformed { .. } => "dns_malformed",
        }
    }
}

impl fmt::Display for DnsFail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rcode { rcode } => write!(
                f,
                "DNS answer {} ({}), not in dns_rcodes",
                rcode_name(*rcode),
                rcode.to_str()
            ),
            Self::IdMismatch { sent, received } => write!(
                f,
                "DNS answer has id {received:#06x}, the query had {sent:#06x}"
            ),
            Self::QuestionMismatch { asked, answered } => write!(
                f,
                "DNS answer is for another question: asked {asked}, answered {answered}"
            ),
            Self::NotResponse => f.write_str("DNS packet with QR clear: a query, not an answer"),
            Self::Malformed { reason } => write!(f, "malformed DNS answer: {reason}"),
        }
    }
}

impl From<DnsFail> for FailReason {
    fn from(fail: DnsFail) -> Self {
        Self::Dns(fail)
    }
}

/// Asks `addr` the check's question (through the data path with `path`)
/// and judges the first answer by `deadline`.
pub(super) async fn dns_probe(
    addr: SocketAddr,
    path: Option<&DatapathTarget>,
    check: &DnsCheck,
    deadline: Instant,
    limit: Duration,
) -> Result<ProbeOk, FailReason> {
    let (id, request) = query(check)?;
    let answer = exchange(addr, path, &request, MAX_ANSWER, deadline, limit).await?;
    judge(check, id, &answer.bytes, answer.truncated)?;
    Ok(ProbeOk { status: None })
}

/// The query's id and wire bytes: a fresh random id each call.
pub(super) fn query(check: &DnsCheck) -> Result<(u16, Vec<u8>), FailReason> {
    let mut message = Message::query();
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(check.name.clone(), check.record_type));
    // Only a name longer than 255 bytes could fail, and `parse_name` refuses
    // those at load time.
    let bytes = message.to_vec().map_err(|e| FailReason::InvalidCheck {
        reason: format!("the DNS query cannot be encoded: {e}"),
    })?;
    Ok((message.metadata.id, bytes))
}

/// Judges `bytes`, the answer to query `id` (`cut`: longer than read).
pub(super) fn judge(check: &DnsCheck, id: u16, bytes: &[u8], cut: bool) -> Result<(), DnsFail> {
    let mut decoder = BinDecoder::new(bytes);
    let header = Header::read(&mut decoder).map_err(malformed)?;
    let meta = header.metadata;
    if meta.message_type != MessageType::Response {
        return Err(DnsFail::NotResponse);
    }
    if meta.id != id {
        return Err(DnsFail::IdMismatch {
            sent: id,
            received: meta.id,
        });
    }
    let queries = Message::read_queries(&mut decoder, usize::from(header.counts.queries))
        .map_err(malformed)?;
    // A server refusing or failing a query may leave the question out
    // (RFC 1035 does not require it): its rcode is then the verdict.
    if queries.is_empty() && !check.rcodes.contains(&meta.response_code) {
        return Err(DnsFail::Rcode {
            rcode: meta.response_code,
        });
    }
    check_question(check, &queries)?;
    let rcode = if meta.truncation || cut {
        meta.response_code
    } else {
        // The whole message decodes (a malformed record is the server's
        // fault too), and EDNS may extend the rcode.
        Message::from_vec(bytes).map_err(malformed)?.response_code
    };
    if !check.rcodes.contains(&rcode) {
        return Err(DnsFail::Rcode { rcode });
    }
    Ok(())
}

fn check_question(check: &DnsCheck, queries: &[Query]) -> Result<(), DnsFail> {
    if let [q] = queries
        && q.name() == &check.name
        && q.query_type() == check.record_type
        && q.query_class() == DNSClass::IN
    {
        return Ok(());
    }
    let asked = question_text(&Query::query(check.name.clone(), check.record_type));
    let answered = match queries {
        [] => "no question".to_owned(),
        [q] => question_text(q),
        _ => format!("{} questions", queries.len()),
    };
    Err(DnsFail::QuestionMismatch { asked, answered })
}

/// `"lab.test." A IN`, the name escaped (a hostile server chooses it).
fn question_text(q: &Query) -> String {
    format!(
        "{:?} {} {}",
        q.name().to_ascii(),
        q.query_type(),
        q.query_class()
    )
}

fn malformed(e: impl fmt::Display) -> DnsFail {
    DnsFail::Malformed {
        reason: e.to_string().escape_debug().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::spec::dns::{parse_name, parse_rcode, parse_type};

    /// Answers recorded from dnsmasq 2.90 (`--no-resolv --no-hosts
    /// --address=/lab.test/10.0.0.1 --address=/nx.test/`), to queries
    /// with RD set and the ids below.
    /// `lab.test A`, id 0x1234: NOERROR, one A record 10.0.0.1.
    const A_LAB: &str = "123485800001000100000000036c616204746573740000010001\
                         c00c000100010000000000040a000001";
    /// `nx.test A`, id 0x2345: NXDOMAIN.
    const NX: &str = "234581830001000000000000026e7804746573740000010001";
    /// `. NS`, id 0x3456: REFUSED (no upstream server configured).
    const REFUSED_ROOT: &str = "3456818500010000000000000000020001";
    /// `sf.test A`, id 0x4567, forwarded to a dnsmasq that knows nothing:
    /// REFUSED passed on.
    const REFUSED_FWD: &str = "45678185000100000000000002736604746573740000010001";

    fn bytes(hex: &str) -> Vec<u8> {
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    fn check(name: &str, rtype: &str) -> DnsCheck {
        DnsCheck::new(name, rtype).unwrap()
    }

    #[test]
    fn query_wire_bytes_and_fresh_ids() {
        let lab = check("lab.test", "A");
        let (id, wire) = query(&lab).unwrap();
        assert_eq!(&wire[..2], &id.to_be_bytes());
        // RD only, one question, no other records.
        assert_eq!(&wire[2..12], &[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&wire[12..], &bytes("036c616204746573740000010001")[..]);
        let root = check(".", "NS");
        let (_, wire) = query(&root).unwrap();
        assert_eq!(&wire[12..], &[0, 0, 2, 0, 1]);
        // 16 random ids all equal: 2^-240.
        let ids: std::collections::HashSet<u16> = (0..16).map(|_| query(&lab).unwrap().0).collect();
        assert!(ids.len() > 1, "ids repeat: {ids:?}");
    }

    #[test]
    fn recorded_answers() {
        assert_eq!(
            judge(&check("lab.test", "A"), 0x1234, &bytes(A_LAB), false),
            Ok(())
        );
        assert_eq!(
            judge(&check("nx.test", "A"), 0x2345, &bytes(NX), false),
            Ok(())
        );
        let refused = judge(&check(".", "NS"), 0x3456, &bytes(REFUSED_ROOT), false).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "DNS answer REFUSED (Query Refused), not in dns_rcodes"
        );
        assert_eq!(refused.code(), "dns_rcode");
        let fwd = judge(&check("sf.test", "A"), 0x4567, &bytes(REFUSED_FWD), false);
        assert_eq!(
            fwd,
            Err(DnsFail::Rcode {
                rcode: ResponseCode::Refused
            })
        );
        // NXDOMAIN fails once only NOERROR is accepted.
        let strict = DnsCheck {
            rcodes: vec![ResponseCode::NoError],
            ..check("nx.test", "A")
        };
        let nx = judge(&strict, 0x2345, &bytes(NX), false).unwrap_err();
        assert_eq!(
            nx.to_string(),
            "DNS answer NXDOMAIN (Non-Existent Domain), not in dns_rcodes"
        );
        // REFUSED passes when accepted.
        let lenient = DnsCheck {
            rcodes: vec![parse_rcode("refused").unwrap()],
            ..check(".", "NS")
        };
        assert_eq!(judge(&lenient, 0x3456, &bytes(REFUSED_ROOT), false), Ok(()));
    }

    #[test]
    fn other_rcodes_named() {
        for (code, text) in [
            (1, "DNS answer FORMERR (Form Error), not in dns_rcodes"),
            (2, "DNS answer SERVFAIL (Server Failure), not in dns_rcodes"),
            (4, "DNS answer NOTIMP (Not Implemented), not in dns_rcodes"),
            (
                12,
                "DNS answer RCODE12 (Unknown response code), not in dns_rcodes",
            ),
        ] {
            // The recorded REFUSED answer with its rcode nibble replaced.
            let mut answer = bytes(REFUSED_ROOT);
            answer[3] = (answer[3] & 0xf0) | (code & 0x0f);
            let fail = judge(&check(".", "NS"), 0x3456, &answer, false).unwrap_err();
            assert_eq!(fail.to_string(), text, "rcode {code}");
            assert_eq!(FailReason::Dns(fail).code(), "dns_rcode");
        }
        // A SERVFAIL with no question is judged by its rcode.
        let bare = bytes("345681820000000000000000");
        let fail = judge(&check(".", "NS"), 0x3456, &bare, false).unwrap_err();
        assert_eq!(
            fail,
            DnsFail::Rcode {
                rcode: ResponseCode::ServFail
            }
        );
    }

    #[test]
    fn wrong_id() {
        let fail = judge(&check("lab.test", "A"), 0xabcd, &bytes(A_LAB), false).unwrap_err();
        assert_eq!(
            fail.to_string(),
            "DNS answer has id 0x1234, the query had 0xabcd"
        );
        assert_eq!(fail.code(), "dns_id_mismatch");
    }

    #[test]
    fn question_must_match_but_not_in_case() {
        let lab = bytes(A_LAB);
        let fail = judge(&check("lab.test", "AAAA"), 0x1234, &lab, false).unwrap_err();
        assert_eq!(
            fail.to_string(),
            "DNS answer is for another question: asked \"lab.test.\" AAAA IN, \
             answered \"lab.test.\" A IN"
        );
        assert_eq!(fail.code(), "dns_question_mismatch");
        let fail = judge(&check("lab.tesu", "A"), 0x1234, &lab, false).unwrap_err();
        assert_eq!(fail.code(), "dns_question_mismatch");
        // Class CH instead of IN.
        let mut chaos = lab.clone();
        chaos[25] = 3;
        let fail = judge(&check("lab.test", "A"), 0x1234, &chaos, false).unwrap_err();
        assert!(
            fail.to_string().ends_with("answered \"lab.test.\" A CH"),
            "{fail}"
        );
        // DNS 0x20: the name echoed in the case the server chose.
        let mut mixed = lab.clone();
        mixed[13] = b'L';
        mixed[15] = b'B';
        mixed[18] = b'E';
        assert_eq!(
            judge(&check("lab.test", "A"), 0x1234, &mixed, false),
            Ok(())
        );
        // An accepted rcode with no question: not an answer to ours.
        let bare = &bytes(REFUSED_ROOT)[..12];
        let mut bare = bare.to_vec();
        bare[3] &= 0xf0;
        bare[5] = 0;
        let fail = judge(&check(".", "NS"), 0x3456, &bare, false).unwrap_err();
        assert!(fail.to_string().ends_with("answered no question"), "{fail}");
    }

    #[test]
    fn not_a_response() {
        let mut q = bytes(A_LAB);
        q[2] &= 0x7f;
        let fail = judge(&check("lab.test", "A"), 0x1234, &q, false).unwrap_err();
        assert_eq!(
            fail.to_string(),
            "DNS packet with QR clear: a query, not an answer"
        );
        assert_eq!(fail.code(), "dns_not_response");
    }

    #[test]
    fn truncated_answers_pass_on_header() {
        let lab = check("lab.test", "A");
        let full = bytes(A_LAB);
        // TC set and the record cut off: the server answered.
        let mut tc = full[..full.len() - 6].to_vec();
        tc[2] |= 0x02;
        assert_eq!(judge(&lab, 0x1234, &tc, false), Ok(()));
        // Cut by the reader (longer than MAX_ANSWER): judged on the header.
        assert_eq!(judge(&lab, 0x1234, &full[..full.len() - 6], true), Ok(()));
        // Cut without TC: a record is missing its bytes.
        let fail = judge(&lab, 0x1234, &full[..full.len() - 1], false).unwrap_err();
        assert_eq!(fail.code(), "dns_malformed");
    }

    #[test]
    fn hostile_answers() {
        let lab = check("lab.test", "A");
        // A header cut short.
        let fail = judge(&lab, 0x1234, &bytes(A_LAB)[..5], false).unwrap_err();
        assert_eq!(fail.code(), "dns_malformed");
        assert!(
            fail.to_string().starts_with("malformed DNS answer: "),
            "{fail}"
        );
        // The question's name a compression pointer to itself.
        let looped = bytes(
            "12348180000100000000000 0c00c00010001"
                .replace(' ', "")
                .as_str(),
        );
        let fail = judge(&lab, 0x1234, &looped, false).unwrap_err();
        assert_eq!(fail.code(), "dns_malformed", "{fail}");
        // An answer record's name pointing forward into itself.
        let mut forward = bytes(A_LAB);
        let at = forward.len() - 16;
        forward[at..at + 2].copy_from_slice(&[0xc0, u8::try_from(at).unwrap()]);
        let fail = judge(&lab, 0x1234, &forward, false).unwrap_err();
        assert_eq!(fail.code(), "dns_malformed", "{fail}");
        // Control characters in a label come back escaped.
        let mut ctrl = bytes(A_LAB);
        ctrl[13] = 0x1b;
        let fail = judge(&lab, 0x1234, &ctrl, false).unwrap_err();
        assert!(!fail.to_string().contains('\u{1b}'), "{fail}");
    }

    #[test]
    fn garbage_gets_a_verdict() {
        // 64 KiB of xorshift noise, with our id and QR set and without.
        let mut x: u32 = 0x9e37_79b9;
        let noise: Vec<u8> = (0..65536)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x.to_le_bytes()[0]
            })
            .collect();
        let lab = check("lab.test", "A");
        for cut in [false, true] {
            let len = if cut { MAX_ANSWER } else { noise.len() };
            assert!(judge(&lab, 0x1234, &noise[..len], cut).is_err());
            let mut ours = noise[..len].to_vec();
            ours[..3].copy_from_slice(&[0x12, 0x34, 0x80]);
            let fail = judge(&lab, 0x1234, &ours, cut).unwrap_err();
            assert!(
                matches!(
                    fail,
                    DnsFail::Malformed { .. } | DnsFail::QuestionMismatch { .. }
                ),
                "{fail}"
            );
        }
        // Every prefix of a real answer: a verdict, never a panic.
        let full = bytes(A_LAB);
        for n in 0..full.len() {
            let _ = judge(&lab, 0x1234, &full[..n], false);
        }
        assert!(judge(&lab, 0x1234, &[], false).is_err());
    }

    #[test]
    fn parsed_fields_build_the_query() {
        let check = DnsCheck {
            name: parse_name("Lab.Test").unwrap(),
            record_type: parse_type("txt").unwrap(),
            rcodes: vec![ResponseCode::NoError],
        };
        let (_, wire) = query(&check).unwrap();
        assert_eq!(&wire[12..], &bytes("034c616204546573740000100001")[..]);
    }

    /// A server on a loopback socket that answers each query with `answer`
    /// (the recorded `lab.test A` answer) carrying the query's id plus
    /// `id_offset`.
    async fn server(answer: Vec<u8>, id_offset: u16) -> SocketAddr {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0; 512];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                let mut reply = answer.clone();
                if n >= 2 {
                    let id = u16::from_be_bytes([buf[0], buf[1]]).wrapping_add(id_offset);
                    reply[..2].copy_from_slice(&id.to_be_bytes());
                }
                let _ = socket.send_to(&reply, from).await;
            }
        });
        addr
    }

    async fn ask(addr: SocketAddr) -> Result<ProbeOk, FailReason> {
        let limit = Duration::from_millis(200);
        dns_probe(
            addr,
            None,
            &check("lab.test", "A"),
            Instant::now() + limit,
            limit,
        )
        .await
    }

    #[tokio::test]
    async fn over_a_socket() {
        let good = server(bytes(A_LAB), 0).await;
        assert_eq!(ask(good).await, Ok(ProbeOk { status: None }));
        let stale = server(bytes(A_LAB), 1).await;
        let fail = ask(stale).await.unwrap_err();
        assert_eq!(fail.code(), "dns_id_mismatch", "{fail}");
        // Bound and silent: a hung server.
        let silent = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let fail = ask(silent.local_addr().unwrap()).await.unwrap_err();
        assert_eq!(fail.to_string(), "no answer within 200ms");
        assert_eq!(fail.code(), "no_answer");
        // Nothing listens: ICMP port unreachable.
        let port = silent.local_addr().unwrap();
        drop(silent);
        let fail = ask(port).await.unwrap_err();
        assert_eq!(fail, FailReason::PortUnreachable);
    }
}
