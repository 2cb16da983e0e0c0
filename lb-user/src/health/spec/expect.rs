//! The send/expect check (`kind = "tcp"` with `send`/`expect_*`, and
//! `kind = "udp"`), as HAProxy's `tcp-check send/expect`: the bytes to send,
//! the one matcher the answer must pass, and how much of it is read.
//!
//! Bytes are written in the file as text with escapes ([`unescape`]) or as
//! hex ([`parse_hex`]), and shown back to operators escaped ([`escape`]),
//! so that a binary answer or a control character never reaches a log line
//! raw.

use std::fmt;

use regex::bytes::{Regex, RegexBuilder};

/// Most bytes of answer read unless `expect_max` says otherwise: enough for
/// a banner or a short status line, little enough that a check costs no
/// more than an HTTP one.
pub const DEFAULT_EXPECT_MAX: usize = 1024;
/// Largest `expect_max`: the answer is kept in memory per probe in flight.
pub const MAX_EXPECT_MAX: usize = 64 * 1024;
/// Longest `send`: small enough to fit the socket send buffer at once, so a
/// hung application that never reads cannot make the write itself block,
/// and within one UDP datagram without fragmentation on any usual link.
pub const MAX_SEND: usize = 1024;
/// Largest compiled `expect_regex` (the regex crate's program size): a
/// pattern like `\w{1000}{1000}` would otherwise take hundreds of MiB and
/// seconds to build; real checks compile to a few KiB.
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Bytes of an answer shown in a failure reason (escaped).
pub const SHOWN_BYTES: usize = 64;

/// What the probe sends over which transport, and what must come back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpectCheck {
    pub transport: Transport,
    /// Sent once connected (TCP) or as the datagram (UDP, where it is
    /// required). `None` on TCP: a banner protocol, read only.
    pub send: Option<Vec<u8>>,
    /// `None`: any answer passes (at least one byte on TCP, a datagram on
    /// UDP).
    pub matcher: Option<Matcher>,
    /// Bytes of answer read at most (`expect_max`): the matcher sees no
    /// more than these.
    pub max: usize,
}

impl ExpectCheck {
    /// What `config` checks field by field, once more for the prober: a
    /// spec built some other way fails its probes with this text instead of
    /// sending nothing or reading without bound.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_EXPECT_MAX).contains(&self.max) {
            return Err(format!(
                "expect_max {} is out of range: use 1 to {MAX_EXPECT_MAX} bytes",
                self.max
            ));
        }
        match &self.send {
            None if self.transport == Transport::Udp => {
                Err("kind = \"udp\" needs send or send_hex".to_owned())
            }
            Some(send) if send.is_empty() || send.len() > MAX_SEND => {
                Err(format!("send is {} bytes: use 1 to {MAX_SEND}", send.len()))
            }
            _ => Ok(()),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Udp,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }
}

/// The test the answer must pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Matcher {
    /// `expect_prefix`: the answer starts with these bytes.
    Prefix(Vec<u8>),
    /// `expect_contains`: these bytes occur in the answer.
    Contains(Vec<u8>),
    /// `expect_regex`: the pattern matches somewhere in the answer (anchor
    /// it with `^` to match at the start).
    Regex(ExpectRegex),
}

/// How far an answer read so far got with a matcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Match,
    /// Cannot match whatever comes next (a prefix that diverged).
    Mismatch,
    /// No match yet; more bytes could still make one.
    Undecided,
}

impl Matcher {
    /// Judges `answer`, all the bytes read so far. `from` is where the
    /// bytes new since the last call start: `Contains` searches only where
    /// a match could not have been seen before, so a backend dripping its
    /// answer byte by byte costs linear, not quadratic, time.
    pub fn judge(&self, answer: &[u8], from: usize) -> Verdict {
        match self {
            Self::Prefix(prefix) => {
                let n = answer.len().min(prefix.len());
                if answer[..n] != prefix[..n] {
                    Verdict::Mismatch
                } else if n == prefix.len() {
                    Verdict::Match
                } else {
                    Verdict::Undecided
                }
            }
            Self::Contains(needle) => {
                let start = from.saturating_sub(needle.len().saturating_sub(1));
                if contains(&answer[start.min(answer.len())..], needle) {
                    Verdict::Match
                } else {
                    Verdict::Undecided
                }
            }
            Self::Regex(re) => {
                if re.0.is_match(answer) {
                    Verdict::Match
                } else {
                    Verdict::Undecided
                }
            }
        }
    }

    /// The file's name of this matcher.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Prefix(_) => "expect_prefix",
            Self::Contains(_) => "expect_contains",
            Self::Regex(_) => "expect_regex",
        }
    }

    /// The matcher's value as the file writes it (escaped bytes, or the
    /// pattern).
    pub fn shown(&self) -> String {
        match self {
            Self::Prefix(b) | Self::Contains(b) => escape(b),
            Self::Regex(re) => re.0.as_str().to_owned(),
        }
    }
}

/// `prefix "+PONG"`, `substring "OK"`, `regex "^2\d\d"`: for reasons.
impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self {
            Self::Prefix(_) => "prefix",
            Self::Contains(_) => "substring",
            Self::Regex(_) => "regex",
        };
        write!(f, "{what} \"{}\"", self.shown())
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// A compiled `expect_regex`, equal to another with the same pattern (the
/// regex crate's type has no equality; the spec needs it to tell a changed
/// check on reload).
#[derive(Clone, Debug)]
pub struct ExpectRegex(pub Regex);

impl PartialEq for ExpectRegex {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Eq for ExpectRegex {}

/// Compiles `pattern` for matching raw bytes, within [`REGEX_SIZE_LIMIT`];
/// the error is the regex crate's own words on one line.
pub fn compile_regex(pattern: &str) -> Result<ExpectRegex, String> {
    RegexBuilder::new(pattern)
        // Answers are bytes, not necessarily UTF-8: `.` and classes match
        // any byte unless the pattern turns Unicode on with `(?u)`.
        .unicode(false)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map(ExpectRegex)
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(limit) => format!(
                "it compiles to more than {limit} bytes; simplify it (e.g. fewer or smaller \
                 repetitions)"
            ),
            other => regex_words(&other.to_string()),
        })
}

/// The regex crate's parse error is several lines (the pattern, a caret,
/// `error: ...`); a config problem is one line: the `error:` text, else all
/// lines joined.
fn regex_words(message: &str) -> String {
    message
        .lines()
        .find_map(|l| l.trim().strip_prefix("error: "))
        .map_or_else(
            || message.split_whitespace().collect::<Vec<_>>().join(" "),
            str::to_owned,
        )
}

/// Why text with escapes is not a byte string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EscapeError {
    /// `\` followed by something not in the list.
    Unknown(String),
    /// `\x` not followed by two hex digits.
    BadHex(String),
    /// `\` at the very end.
    Trailing,
}

impl fmt::Display for EscapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = r"use \r, \n, \t, \0, \\ or \xHH (two hex digits)";
        match self {
            Self::Unknown(s) => write!(f, "has an unknown escape \\{s}; {list}"),
            Self::BadHex(s) => write!(f, "has \\x{s} without two hex digits; {list}"),
            Self::Trailing => write!(f, "ends with a lone \\; {list}"),
        }
    }
}

/// Text with escapes (`\r`, `\n`, `\t`, `\0`, `\\`, `\xHH`) to bytes; any
/// other character is its UTF-8 bytes. TOML strings have their own escapes:
/// these are for literal strings (`'PING\r\n'`) and for `\\x00` in basic
/// ones.
pub fn unescape(text: &str) -> Result<Vec<u8>, EscapeError> {
    let mut out = Vec::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        match chars.next() {
            None => return Err(EscapeError::Trailing),
            Some('r') => out.push(b'\r'),
            Some('n') => out.push(b'\n'),
            Some('t') => out.push(b'\t'),
            Some('0') => out.push(0),
            Some('\\') => out.push(b'\\'),
            Some('x') => {
                let digits: String = chars.by_ref().take(2).collect();
                match u8::from_str_radix(&digits, 16) {
                    Ok(b) if digits.len() == 2 && digits.bytes().all(|d| d.is_ascii_hexdigit()) => {
                        out.push(b);
                    }
                    _ => return Err(EscapeError::BadHex(digits)),
                }
            }
            Some(other) => return Err(EscapeError::Unknown(other.to_string())),
        }
    }
    Ok(out)
}

/// `send_hex`: pairs of hex digits, with spaces, tabs or newlines allowed
/// between pairs (not inside one). `None` if anything else is there.
pub fn parse_hex(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for word in text.split_whitespace() {
        if word.len() % 2 != 0 || !word.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        for pair in word.as_bytes().chunks(2) {
            let pair = std::str::from_utf8(pair).ok()?;
            out.push(u8::from_str_radix(pair, 16).ok()?);
        }
    }
    Some(out)
}

/// Bytes as operators can read them safely: printable ASCII as is, `\\`,
/// `\r`, `\n`, `\t`, `\0`, `\"` and `\xHH` for the rest; [`unescape`] reads
/// it back (but `\"`, there for quoting, which TOML basic strings undo).
pub fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'\\' => out.push_str(r"\\"),
            b'"' => out.push_str("\\\""),
            b'\r' => out.push_str(r"\r"),
            b'\n' => out.push_str(r"\n"),
            b'\t' => out.push_str(r"\t"),
            0 => out.push_str(r"\0"),
            0x20..=0x7e => out.push(char::from(b)),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}

/// The first [`SHOWN_BYTES`] of an answer, escaped, with `...` if there
/// was more: what a failure reason shows of it.
pub fn shown_answer(answer: &[u8]) -> String {
    let head = &answer[..answer.len().min(SHOWN_BYTES)];
    let more = if answer.len() > SHOWN_BYTES {
        "..."
    } else {
        ""
    };
    format!("\"{}{more}\"", escape(head))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescape_cases() {
        let cases: &[(&str, &[u8])] = &[
            ("plain", b"plain"),
            (r"PING\r\n", b"PING\r\n"),
            (r"a\tb\\c\0", b"a\tb\\c\0"),
            (r"\x00\xff\x7F", b"\x00\xff\x7f"),
            ("é", "é".as_bytes()),
            ("", b""),
        ];
        for (text, want) in cases {
            assert_eq!(unescape(text).as_deref(), Ok(*want), "{text}");
        }
        let bad = [
            (r"\q", EscapeError::Unknown("q".into())),
            (r"\x4", EscapeError::BadHex("4".into())),
            (r"\xg0", EscapeError::BadHex("g0".into())),
            (r"\x+1", EscapeError::BadHex("+1".into())),
            (r"abc\", EscapeError::Trailing),
        ];
        for (text, want) in bad {
            assert_eq!(unescape(text), Err(want), "{text}");
        }
        assert_eq!(
            EscapeError::Unknown("q".into()).to_string(),
            r"has an unknown escape \q; use \r, \n, \t, \0, \\ or \xHH (two hex digits)"
        );
    }

    #[test]
    fn escape_round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let shown = escape(&all);
        assert!(shown.bytes().all(|b| (0x20..=0x7e).contains(&b)), "{shown}");
        let back = unescape(&shown.replace("\\\"", "\"")).unwrap();
        assert_eq!(back, all);
        assert_eq!(escape(b"+PONG\r\n\x1b[2J"), r"+PONG\r\n\x1b[2J");
    }

    #[test]
    fn hex_cases() {
        assert_eq!(parse_hex("0d0A"), Some(vec![0x0d, 0x0a]));
        assert_eq!(parse_hex(" 12 34\n56 "), Some(vec![0x12, 0x34, 0x56]));
        assert_eq!(parse_hex(""), Some(vec![]));
        for bad in ["0", "1 2", "zz", "0x12", "12-34", "é1"] {
            assert_eq!(parse_hex(bad), None, "{bad}");
        }
    }

    #[test]
    fn shown_answer_is_capped_and_escaped() {
        assert_eq!(shown_answer(b"-ERR\r\n"), r#""-ERR\r\n""#);
        let long = vec![b'a'; 100];
        assert_eq!(shown_answer(&long), format!("\"{}...\"", "a".repeat(64)));
        let garbage: Vec<u8> = (0..64).map(|i| 0x80 | i).collect();
        let shown = shown_answer(&garbage);
        assert!(shown.starts_with(r#""\x80\x81"#), "{shown}");
        assert!(!shown.ends_with("...\""), "{shown}");
    }

    #[test]
    fn matcher_verdicts() {
        let prefix = Matcher::Prefix(b"+PONG".to_vec());
        let contains = Matcher::Contains(b"OK".to_vec());
        let regex = Matcher::Regex(compile_regex(r"^220[ -]").unwrap());
        // (name, matcher, answer, from, verdict)
        let cases = [
            (
                "prefix exact",
                &prefix,
                &b"+PONG\r\n"[..],
                0,
                Verdict::Match,
            ),
            ("prefix partial", &prefix, b"+PO", 0, Verdict::Undecided),
            (
                "prefix diverged early",
                &prefix,
                b"-E",
                0,
                Verdict::Mismatch,
            ),
            (
                "prefix error reply",
                &prefix,
                b"-LOADING\r\n",
                0,
                Verdict::Mismatch,
            ),
            ("prefix nothing yet", &prefix, b"", 0, Verdict::Undecided),
            ("contains", &contains, b"+OK\r\n", 0, Verdict::Match),
            (
                "contains across reads",
                &contains,
                b"xxO K",
                4,
                Verdict::Undecided,
            ),
            (
                "contains split by reads",
                &contains,
                b"xxOK",
                3,
                Verdict::Match,
            ),
            (
                "contains not yet",
                &contains,
                b"xxxx",
                2,
                Verdict::Undecided,
            ),
            (
                "regex banner",
                &regex,
                b"220 mx ESMTP\r\n",
                0,
                Verdict::Match,
            ),
            (
                "regex other code",
                &regex,
                b"554 no\r\n",
                0,
                Verdict::Undecided,
            ),
            (
                "regex on binary",
                &regex,
                b"\xff\xfe220 ",
                0,
                Verdict::Undecided,
            ),
        ];
        for (name, m, answer, from, want) in cases {
            assert_eq!(m.judge(answer, from), want, "{name}");
        }
        // `.` matches any byte, not only UTF-8 characters.
        let any = Matcher::Regex(compile_regex("^a.b").unwrap());
        assert_eq!(any.judge(b"a\xffb", 0), Verdict::Match);
    }

    #[test]
    fn contains_scan_is_linear_on_a_drip() {
        // 64 KiB dripped one byte per read: each call looks at the new
        // byte and the needle's length before it only.
        let needle = Matcher::Contains(b"needle".to_vec());
        let mut answer = Vec::new();
        for i in 0..MAX_EXPECT_MAX {
            answer.push(b'x');
            assert_eq!(needle.judge(&answer, i), Verdict::Undecided);
        }
        answer.extend_from_slice(b"needle");
        assert_eq!(needle.judge(&answer, MAX_EXPECT_MAX), Verdict::Match);
    }

    #[test]
    fn regex_errors_are_one_line() {
        assert_eq!(compile_regex("(").unwrap_err(), "unclosed group");
        assert_eq!(
            compile_regex(r"\w{1000}{1000}").unwrap_err(),
            format!(
                "it compiles to more than {REGEX_SIZE_LIMIT} bytes; simplify it (e.g. fewer or \
                 smaller repetitions)"
            )
        );
        assert_eq!(
            compile_regex("a").unwrap(),
            compile_regex("a").unwrap(),
            "equal by pattern"
        );
        assert_ne!(compile_regex("a").unwrap(), compile_regex("b").unwrap());
    }

    #[test]
    fn matcher_display() {
        assert_eq!(
            Matcher::Prefix(b"+PONG".to_vec()).to_string(),
            r#"prefix "+PONG""#
        );
        assert_eq!(
            Matcher::Contains(b"a\"\n".to_vec()).to_string(),
            r#"substring "a\"\n""#
        );
        assert_eq!(
            Matcher::Regex(compile_regex(r"^\d+").unwrap()).to_string(),
            r#"regex "^\d+""#
        );
    }
}
