//! The status page, `GET /` on the metrics listener: every VIP and backend
//! with its state, reason, weight, probe latency, rates and flows, and the
//! latest events, in the spirit of HAProxy's stats page.
//!
//! The server sends one fixed document; the page's own script fetches
//! `/status` (and `/events`) from the same origin every 2 s and builds the
//! tables with `textContent`, so nothing the daemon reports (a backend's
//! reason can hold text a backend sent) is ever parsed as HTML. Its inline
//! style and script are allowed by their SHA-256 hashes in a strict
//! `Content-Security-Policy`: no other script, no external asset, no
//! framing, and Trusted Types refuse every HTML sink.

use std::sync::LazyLock;

use ring::digest::{SHA256, digest};

/// The page's style sheet, inlined.
const STYLE: &str = include_str!("page/status.css");

/// The page's script, inlined.
const SCRIPT: &str = include_str!("page/status.js");

/// The document, with [`STYLE`] and [`SCRIPT`] in place.
static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>xlb status</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>xlb status</h1>\n<p id=\"summary\" class=\"meta\">loading /status…</p>\n\
         <p id=\"updated\" class=\"meta\"></p>\n<div id=\"vips\"></div>\n\
         <h2>Latest events</h2>\n<div id=\"events\"></div>\n\
         <noscript><p>This page needs JavaScript; the same data is at \
         <a href=\"/status\">/status</a> (JSON) and <a href=\"/metrics\">/metrics</a>.</p></noscript>\n\
         <script>{SCRIPT}</script>\n</body>\n</html>\n"
    )
});

/// The `Content-Security-Policy`: only the inline style and script whose
/// hashes it names, fetches to this origin only, nothing else.
static CSP: LazyLock<String> = LazyLock::new(|| {
    format!(
        "default-src 'none'; script-src 'sha256-{}'; style-src 'sha256-{}'; \
         connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'; \
         frame-ancestors 'none'; require-trusted-types-for 'script'; trusted-types 'none'",
        sha256_base64(SCRIPT),
        sha256_base64(STYLE)
    )
});

/// The response to `method /`, with the head and, for `GET`, the document.
pub(super) fn respond(method: &str) -> Vec<u8> {
    if method != "GET" && method != "HEAD" {
        return super::endpoint::plain(
            405,
            "Method Not Allowed",
            "only GET and HEAD\n",
            &["Allow: GET, HEAD"],
        );
    }
    let body = DOCUMENT.as_str();
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\
         Content-Security-Policy: {}\r\nX-Content-Type-Options: nosniff\r\n\
         X-Frame-Options: DENY\r\nReferrer-Policy: no-referrer\r\n\
         Cache-Control: no-store\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        CSP.as_str(),
        body.len()
    )
    .into_bytes();
    if method == "GET" {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

/// Base64 (standard alphabet, padded) of the SHA-256 of `text`, as CSP
/// hash sources are written.
fn sha256_base64(text: &str) -> String {
    base64(digest(&SHA256, text.as_bytes()).as_ref())
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(resp: &[u8]) -> (String, String) {
        let text = String::from_utf8(resp.to_vec()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        (head.to_owned(), body.to_owned())
    }

    fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
        head.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
    }

    #[test]
    fn base64_matches_rfc_4648() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (input, want) in cases {
            assert_eq!(base64(input.as_bytes()), want, "{input:?}");
        }
        // SHA-256 of "abc" (FIPS 180-2's example), as `openssl dgst -sha256
        // -binary | base64` prints it.
        assert_eq!(
            sha256_base64("abc"),
            "ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0="
        );
    }

    #[test]
    fn headers_confine_the_page() {
        let (head, body) = split(&respond("GET"));
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        let cases = [
            ("Content-Type", "text/html; charset=utf-8".to_owned()),
            ("X-Content-Type-Options", "nosniff".to_owned()),
            ("X-Frame-Options", "DENY".to_owned()),
            ("Referrer-Policy", "no-referrer".to_owned()),
            ("Cache-Control", "no-store".to_owned()),
            ("Content-Length", body.len().to_string()),
            ("Connection", "close".to_owned()),
        ];
        for (name, want) in cases {
            assert_eq!(header(&head, name), Some(want.as_str()), "{name} in {head}");
        }
        let csp = header(&head, "Content-Security-Policy").expect("a CSP");
        let directives: Vec<&str> = csp.split("; ").collect();
        let want = [
            "default-src 'none'".to_owned(),
            format!("script-src 'sha256-{}'", sha256_base64(SCRIPT)),
            format!("style-src 'sha256-{}'", sha256_base64(STYLE)),
            "connect-src 'self'".to_owned(),
            "img-src 'none'".to_owned(),
            "base-uri 'none'".to_owned(),
            "form-action 'none'".to_owned(),
            "frame-ancestors 'none'".to_owned(),
            "require-trusted-types-for 'script'".to_owned(),
            "trusted-types 'none'".to_owned(),
        ];
        assert_eq!(directives, want);
        // Nothing looser slipped in.
        for loose in [
            "unsafe-inline",
            "unsafe-eval",
            "*",
            "http:",
            "https:",
            "data:",
        ] {
            assert!(!csp.contains(loose), "{loose} in {csp}");
        }
    }

    #[test]
    fn head_has_no_body_and_other_methods_are_refused() {
        let (head, body) = split(&respond("HEAD"));
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert_eq!(
            header(&head, "Content-Length"),
            Some(DOCUMENT.len().to_string().as_str())
        );
        assert_eq!(body, "");
        for method in ["POST", "PUT", "DELETE", ""] {
            let (head, _) = split(&respond(method));
            assert!(head.starts_with("HTTP/1.1 405 "), "{method}: {head}");
            assert_eq!(header(&head, "Allow"), Some("GET, HEAD"), "{method}");
        }
    }

    /// The hashes in the CSP are of exactly what the document inlines, and
    /// the document has no other script or style and nothing external.
    #[test]
    fn document_inlines_exactly_the_hashed_assets() {
        let doc = DOCUMENT.as_str();
        assert!(doc.contains(&format!("<script>{SCRIPT}</script>")));
        assert!(doc.contains(&format!("<style>{STYLE}</style>")));
        assert_eq!(doc.matches("<script").count(), 1, "one script element");
        assert_eq!(doc.matches("<style").count(), 1, "one style element");
        for external in ["src=", "http://", "https://", "<link", "@import", "url("] {
            assert!(!doc.contains(external), "{external} in the page");
        }
        // A `</script>` inside the script would end it early.
        assert!(!SCRIPT.contains("</"), "the script must not contain \"</\"");
        assert!(!STYLE.contains("</"), "the style must not contain \"</\"");
    }

    /// The script never hands data to an HTML parser: no HTML sinks, only
    /// `textContent` and element construction.
    #[test]
    fn script_uses_no_html_sinks() {
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
            "setAttribute(\"on",
            "srcdoc",
        ] {
            assert!(!SCRIPT.contains(sink), "{sink} in the page script");
        }
        assert!(SCRIPT.contains(".textContent = "));
        // It reads the status from this origin, relative paths only.
        assert!(SCRIPT.contains("getJson(\"/status\")"));
        assert!(SCRIPT.contains("\"/events?since=\""));
    }
}
