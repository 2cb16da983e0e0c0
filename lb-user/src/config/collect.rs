//! Every unknown key and value of the wrong type in one run.
//!
//! serde stops at the first error, so a file with three misspelt keys
//! would take three runs of `check-config` to fix. Instead: deserialize;
//! on an error, find the `key = value` entry it points at (through a tree
//! of the document that keeps every key's and value's byte span), record
//! the error with its line, column and key path, blank that entry out of
//! the text with spaces (so every later span still points into the file
//! as written) and deserialize again, until the file deserializes or an
//! error points at no entry (a missing field: its table has no entry to
//! blank). A required setting that was blanked would come back as
//! "missing field": it is replaced by a placeholder of a type that fits
//! instead, found by trying a few. Syntax errors still stop at the first:
//! past one, the parser cannot know what the rest means.

use std::fmt;
use std::ops::Range;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use toml::Spanned;

/// More errors than anyone reads in one go; also bounds the retries.
const MAX_ERRORS: usize = 50;

/// Placeholders for a required value of the wrong type, tried in order; the
/// first whose error is elsewhere (or none) stands in for it. Each must
/// fit in the span of the value it replaces.
const PLACEHOLDERS: &[&str] = &["0", "\"\"", "\"::\"", "\"0.0.0.0\"", "false", "[]", "{}"];

/// Deserializes `text` as a `T`, or every data error in it, each as
/// `origin:line:column: key path: message`. A syntax error is the one
/// error, in the toml crate's form (with an excerpt of the line).
pub(super) fn deserialize<T: DeserializeOwned>(text: &str, origin: &str) -> Result<T, Vec<String>> {
    let first = match toml::from_str::<T>(text) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    let Ok(tree) = toml::from_str::<Tree>(text) else {
        return Err(vec![format!("{origin}: {}", first.to_string().trim_end())]);
    };
    let mut masked = text.to_owned();
    let mut errors = Vec::new();
    let mut blanked: Vec<Entry> = Vec::new();
    let mut error = first;
    while errors.len() < MAX_ERRORS {
        if let Some(entry) = blanked_required(&error, &blanked) {
            // Already reported as what it was, not as missing.
            match placeholder::<T>(text, &mut masked, entry) {
                Some(Err(e)) => {
                    error = e;
                    continue;
                }
                Some(Ok(())) | None => break,
            }
        }
        errors.push(describe(&error, text, &tree, origin));
        let Some(entry) = error.span().and_then(|s| tree.entry_at(text, &s)) else {
            break;
        };
        blank(&mut masked, entry.whole.clone());
        if masked.parse::<toml::Table>().is_err() {
            // Blanking broke the syntax (a shape not foreseen here): what
            // the parser said next would be about our edit, not the file.
            break;
        }
        blanked.push(entry);
        error = match toml::from_str::<T>(&masked) {
            Ok(_) => break,
            Err(e) => e,
        };
    }
    Err(errors)
}

/// The blanked entry that error `e` says is missing (it is required): the
/// first of that key at or after the start of the table `e` points at.
fn blanked_required<'a>(e: &toml::de::Error, blanked: &'a [Entry]) -> Option<&'a Entry> {
    let table = e.span().map_or(0, |s| s.start);
    blanked
        .iter()
        .filter(|b| is_missing(e, &b.key) && b.key_span.start >= table)
        .min_by_key(|b| b.key_span.start)
}

/// After the entry was blanked, `e` says its key is missing: it is required.
fn is_missing(e: &toml::de::Error, key: &str) -> bool {
    e.message().starts_with(&format!("missing field `{key}`"))
}

/// Puts `key = <placeholder>` back where the entry was and deserializes
/// again: `Ok` if that went through, the next error otherwise, `None` when
/// no placeholder fits (the text is left blanked).
fn placeholder<T: DeserializeOwned>(
    text: &str,
    masked: &mut String,
    entry: &Entry,
) -> Option<Result<(), toml::de::Error>> {
    for p in PLACEHOLDERS.iter().filter(|p| p.len() <= entry.value.len()) {
        let mut attempt = masked.clone();
        let key_text = &text[entry.key_span.clone()];
        // The key as written (quoted or not), then ` = value` padded so
        // every later offset stays where it was.
        let mut line = format!("{key_text}=");
        line.push_str(p);
        if line.len() > entry.value.end - entry.key_span.start {
            continue;
        }
        attempt.replace_range(
            entry.key_span.start..entry.key_span.start + line.len(),
            &line,
        );
        match toml::from_str::<T>(&attempt) {
            Ok(_) => {
                *masked = attempt;
                return Some(Ok(()));
            }
            Err(e)
                if e.span()
                    .is_some_and(|s| overlaps(&s, &(entry.key_span.start..entry.value.end))) => {}
            Err(e) if is_missing(&e, &entry.key) => {}
            Err(e) => {
                *masked = attempt;
                return Some(Err(e));
            }
        }
    }
    None
}

/// `range` and the comma that separates it from the next (or previous)
/// entry of an inline table on the same line, if there is one.
fn with_comma(text: &str, range: Range<usize>) -> Range<usize> {
    let blank = |c: char| c == ' ' || c == '\t';
    let after = &text[range.end..];
    let skipped = after.len() - after.trim_start_matches(blank).len();
    if after[skipped..].starts_with(',') {
        return range.start..range.end + skipped + 1;
    }
    let before = &text[..range.start];
    let trimmed = before.trim_end_matches(blank);
    if trimmed.ends_with(',') {
        return trimmed.len() - 1..range.end;
    }
    range
}

fn overlaps(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// Replaces `range` of `text` with spaces, keeping line breaks (so lines
/// and columns stay) and everything else where it was.
fn blank(text: &mut String, range: Range<usize>) {
    let replaced: String = text[range.clone()]
        .chars()
        .map(|c| if c == '\n' || c == '\r' { c } else { ' ' })
        .collect();
    // Multi-byte characters become one space each: pad to keep offsets.
    let pad = range.len() - replaced.len();
    text.replace_range(range, &format!("{replaced}{}", " ".repeat(pad)));
}

/// `origin:line:column: path: message`, the path as the semantic checks
/// write it (`vip "api": backend 10.0.0.1: weight`).
fn describe(e: &toml::de::Error, text: &str, tree: &Tree, origin: &str) -> String {
    let message = e.message().trim_end();
    let Some(span) = e.span() else {
        return format!("{origin}: {message}");
    };
    let (line, column) = line_column(text, span.start);
    let mut path = tree.path_at(&span);
    // "unknown field `xdp`" names the key already.
    if path
        .last()
        .is_some_and(|k| message.starts_with(&format!("unknown field `{k}`")))
    {
        path.pop();
    }
    if path.is_empty() {
        format!("{origin}:{line}:{column}: {message}")
    } else {
        format!("{origin}:{line}:{column}: {}: {message}", path.join(": "))
    }
}

/// 1-based line and column (in characters) of byte `offset`.
pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].chars().count() + 1)
}

/// One `key = value` of the document with where it is.
#[derive(Clone, Debug)]
struct Entry {
    key: String,
    key_span: Range<usize>,
    value: Range<usize>,
    /// The text to blank: key to value, with a separating comma of an
    /// inline table (a trailing comma there is a syntax error).
    whole: Range<usize>,
}

/// The document as a tree that keeps spans: what serde's error spans are
/// matched against.
#[derive(Debug)]
enum Tree {
    Table(Vec<(Spanned<String>, Spanned<Tree>)>),
    Array(Vec<Spanned<Tree>>),
    Scalar(Option<String>),
}

impl Tree {
    /// The innermost `key = value` whose key or value holds `span`, if
    /// it can be blanked: not a table under a header (the error is about a
    /// missing field of it, or the whole table is unknown).
    fn entry_at(&self, text: &str, span: &Range<usize>) -> Option<Entry> {
        let (_, mut entry) = self.find(span, &mut Vec::new())?;
        // A table header (`[vip.guard]`, `[[vips]]`): its body runs to the
        // next header, which this does not try to find.
        let line_start = text[..entry.key_span.start]
            .rfind('\n')
            .map_or(0, |i| i + 1);
        if text[line_start..].trim_start().starts_with('[') {
            return None;
        }
        entry.whole = with_comma(text, entry.whole);
        Some(entry)
    }

    /// The key path to `span`, innermost last.
    fn path_at(&self, span: &Range<usize>) -> Vec<String> {
        self.find(span, &mut Vec::new())
            .map(|(path, _)| path)
            .unwrap_or_default()
    }

    /// The innermost entry whose key or value holds `span`, and its path.
    /// Every child is searched, not only those whose span holds `span`: a
    /// table's span ends at the next header, so `[[vip.backend]]` lies
    /// outside the span of its `[[vip]]`.
    fn find(&self, span: &Range<usize>, path: &mut Vec<String>) -> Option<(Vec<String>, Entry)> {
        let inside = |r: &Range<usize>| r.start <= span.start && span.end <= r.end.max(r.start + 1);
        match self {
            Tree::Table(entries) => entries.iter().find_map(|(key, value)| {
                path.push(key.get_ref().clone());
                let found = value.get_ref().find(span, path).or_else(|| {
                    let (k, v) = (key.span(), value.span());
                    (inside(&k) || inside(&v)).then(|| {
                        let entry = Entry {
                            key: key.get_ref().clone(),
                            key_span: k.clone(),
                            value: v.clone(),
                            whole: k.start..v.end,
                        };
                        (path.clone(), entry)
                    })
                });
                path.pop();
                found
            }),
            Tree::Array(items) => {
                let name = path.pop()?;
                let found = items.iter().enumerate().find_map(|(i, item)| {
                    path.push(item.get_ref().label(&name, i));
                    let found = item.get_ref().find(span, path);
                    path.pop();
                    found
                });
                path.push(name);
                found
            }
            Tree::Scalar(_) => None,
        }
    }

    /// How the semantic checks name an element of array `name`:
    /// `vip "api"`, `backend 10.0.0.1`, `deny entry 2`.
    fn label(&self, name: &str, index: usize) -> String {
        let field = |f: &str| match self {
            Tree::Table(entries) => {
                entries
                    .iter()
                    .find(|(k, _)| k.get_ref() == f)
                    .and_then(|(_, v)| match v.get_ref() {
                        Tree::Scalar(s) => s.clone(),
                        _ => None,
                    })
            }
            _ => None,
        };
        match (name, field("name"), field("address")) {
            ("vip", Some(n), _) => format!("vip {n:?}"),
            ("backend", _, Some(a)) => format!("backend {a}"),
            _ => format!("{name} entry {}", index + 1),
        }
    }
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any TOML value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<String>>()? {
            entries.push((key, map.next_value::<Spanned<Tree>>()?));
        }
        Ok(Tree::Table(entries))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Tree>>()? {
            items.push(item);
        }
        Ok(Tree::Array(items))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Tree, E> {
        Ok(Tree::Scalar(Some(v.to_owned())))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Tree, E> {
        Ok(Tree::Scalar(None))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Tree, E> {
        Ok(Tree::Scalar(None))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Tree, E> {
        Ok(Tree::Scalar(None))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Tree, E> {
        Ok(Tree::Scalar(None))
    }
}

#[cfg(test)]
mod tests {
    use super::line_column;
    use crate::config::tests::{DAEMON, api_vip, assert_rejected};

    #[test]
    fn three_misspelt_keys_in_three_sections_are_all_reported() {
        assert_rejected(
            &api_vip(
                r#"
[vip.health_check]
intreval = "2s"

[[vip.backend]]
address = "10.0.0.1"
wieght = 2
"#,
            )
            .replace(
                "interface = \"eth0\"",
                "interface = \"eth0\"\nxdp = \"native\"",
            ),
            &[
                "xlb.toml:4:1: daemon: unknown field `xdp`, expected one of `interface`, `xdp_mode`, `instance`, `control_socket`, `socket_group`, `metrics_address`, `conntrack_size`, `udp_timeout`, `max_table_size`, `hash_seed`, `encap_source_v4`, `encap_source_v6`, `encap_source_v4_prefix`, `probe_concurrency`, `reply_rate`, `second_chance_window`, `nat_size`, `tcp_syn_timeout`, `tcp_timeout`, `tcp_fin_timeout`, `tcp_close_timeout`",
                "xlb.toml:12:1: vip \"api\": health_check: unknown field `intreval`, expected one of `kind`, `method`, `path`, `host`, `expect_status`, `body_contains`, `interval`, `timeout`, `hang_timeout`, `rise`, `fall`, `fast_interval`, `down_interval`, `jitter`, `via`, `reuse_connection`, `reopen_every`, `agent_port`, `agent_interval`, `agent_timeout`, `agent_send`, `dns_name`, `dns_type`, `dns_rcodes`, `send`, `send_hex`, `expect_prefix`, `expect_contains`, `expect_regex`, `expect_max`, `service`, `tls`, `tls_verify`, `ca_file`, `port`",
                "xlb.toml:16:1: vip \"api\": backend 10.0.0.1: unknown field `wieght`, expected one of `address`, `port`, `weight`, `health_port`, `health_check`, `max_flows`",
            ],
        );
    }

    #[test]
    fn type_errors_of_required_and_optional_values_and_inline_tables() {
        assert_rejected(
            &format!(
                r#"{DAEMON}
[guard]
new_flows_per_source = {{ rate = "1/s", per = "s", burst = 3 }}

[[vip]]
name = "api"
address = "10.100.0.300"
port = "80"
[[vip.backend]]
address = "10.0.0.1"
weight = -1
"#
            ),
            &[
                "xlb.toml:6:40: guard: new_flows_per_source: unknown field `per`, expected one of `rate`, `burst`, `action`",
                "xlb.toml:10:11: vip \"api\": address: invalid IP address syntax",
                "xlb.toml:11:8: vip \"api\": port: invalid type: string \"80\", expected u16",
                "xlb.toml:14:10: vip \"api\": backend 10.0.0.1: weight: invalid value: integer `-1`, expected u32",
            ],
        );
    }

    #[test]
    fn a_syntax_error_is_the_one_error() {
        let e = crate::config::tests::parse(&format!("{DAEMON}[[vip]\nfoo = 1\n")).unwrap_err();
        assert_eq!(e.problems.len(), 1, "{e}");
        assert!(
            e.problems[0].starts_with("xlb.toml: TOML parse error at line 4, column 6"),
            "{e}"
        );
    }

    #[test]
    fn line_and_column_count_characters_from_one() {
        assert_eq!(line_column("ab\ncé d", 0), (1, 1));
        assert_eq!(line_column("ab\ncé d", 3), (2, 1));
        assert_eq!(line_column("ab\ncé d", 7), (2, 4));
    }
}
