//! The size limits of the codebase (issue 8), checked by `cargo xtask test`:
//! no production function longer than [`MAX_FN_LINES`] lines and no file with
//! more than [`MAX_FILE_LINES`] lines of production code. Production code is
//! every `.rs` file of the workspace but integration tests (`tests/` folders
//! of a crate), up to its `#[cfg(test)] mod` block; test tables are exempt.
//!
//! The reader is deliberately simple, line based: a function starts at a line
//! whose first word (after `pub`, `const`, `async`, `unsafe`, `extern "C"`)
//! is `fn`, and ends where its braces balance, counted outside strings,
//! character literals and `//` comments.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

/// Longest production function, in lines (signature to closing brace).
pub(crate) const MAX_FN_LINES: usize = 80;
/// Most production lines in one file.
pub(crate) const MAX_FILE_LINES: usize = 800;

/// The workspace's crates whose sources are checked.
const CRATES: &[&str] = &[
    "lb-common",
    "lb-ebpf",
    "lb-ctl",
    "lb-user",
    "lab",
    "tests",
    "xtask",
];

/// One limit exceeded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Oversize {
    Function {
        path: String,
        name: String,
        line: usize,
        lines: usize,
    },
    File {
        path: String,
        lines: usize,
    },
}

impl std::fmt::Display for Oversize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Oversize::Function {
                path,
                name,
                line,
                lines,
            } => write!(
                f,
                "{path}:{line}: fn {name} is {lines} lines (at most {MAX_FN_LINES}): \
                 split it into named steps"
            ),
            Oversize::File { path, lines } => write!(
                f,
                "{path}: {lines} lines of production code (at most {MAX_FILE_LINES}): \
                 split it by concept into modules"
            ),
        }
    }
}

/// Checks every production source under `root` (the workspace).
pub(crate) fn check(root: &Path) -> Result<()> {
    let mut found = Vec::new();
    for krate in CRATES {
        for path in sources(&root.join(krate))? {
            let text =
                fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            let shown = path.strip_prefix(root).unwrap_or(&path).display();
            found.extend(oversize(&shown.to_string(), &text));
        }
    }
    if found.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = found.iter().map(ToString::to_string).collect();
    bail!(
        "the codebase's size limits are exceeded:\n{}",
        list.join("\n")
    )
}

/// The `.rs` files under `dir`, integration tests (`tests/` of the crate)
/// and build output left out.
fn sources(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                let integration = name == "tests" && d == dir;
                if !integration && name != "target" && !name.starts_with('.') {
                    stack.push(path);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// What in one file's `text` exceeds a limit.
pub(crate) fn oversize(path: &str, text: &str) -> Vec<Oversize> {
    let prod = production(text);
    let mut found = Vec::new();
    if prod.len() > MAX_FILE_LINES {
        found.push(Oversize::File {
            path: path.to_owned(),
            lines: prod.len(),
        });
    }
    for (i, line) in prod.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        let Some(lines) = body_lines(&prod[i..]) else {
            continue;
        };
        if lines > MAX_FN_LINES {
            found.push(Oversize::Function {
                path: path.to_owned(),
                name: name.to_owned(),
                line: i + 1,
                lines,
            });
        }
    }
    found
}

/// The lines before the file's `#[cfg(test)]` module.
fn production(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| {
            let next = w[1].trim_start();
            w[0].trim() == "#[cfg(test)]"
                && (next.starts_with("mod ") || next.starts_with("pub(crate) mod "))
        })
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// The name of the function this line starts, if it starts one.
fn fn_name(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    loop {
        let before = rest;
        for word in [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "const ",
            "async ",
            "unsafe ",
        ] {
            rest = rest.strip_prefix(word).unwrap_or(rest);
        }
        rest = rest.strip_prefix("extern \"C\" ").unwrap_or(rest);
        if rest == before {
            break;
        }
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// How many lines the function starting at `lines[0]` spans, or `None` for
/// a declaration without a body (a trait method).
fn body_lines(lines: &[&str]) -> Option<usize> {
    let mut depth = 0i64;
    let mut opened = false;
    for (i, line) in lines.iter().enumerate() {
        let code = code_of(line);
        for c in code.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        if opened && depth <= 0 {
            return Some(i + 1);
        }
        if !opened && code.trim_end().ends_with(';') {
            return None;
        }
    }
    None
}

/// `line` without string and character literals and `//` comments, so
/// braces inside them do not count.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                while let Some(s) = chars.next() {
                    match s {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '\'' => {
                // A char literal ('{', '\n'), or a lifetime ('a): skip only
                // the literal.
                let lookahead: String = chars.clone().take(3).collect();
                let mut it = lookahead.chars();
                match (it.next(), it.next(), it.next()) {
                    (Some('\\'), _, _) => {
                        chars.next();
                        chars.next();
                        for s in chars.by_ref() {
                            if s == '\'' {
                                break;
                            }
                        }
                    }
                    (Some(_), Some('\''), _) => {
                        chars.next();
                        chars.next();
                    }
                    _ => out.push(c),
                }
            }
            '/' if chars.peek() == Some(&'/') => break,
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn function(name: &str, body_lines: usize) -> String {
        let mut f = format!("pub(crate) async fn {name}(x: u32) -> u32 {{\n");
        for i in 0..body_lines {
            f.push_str(&format!(
                "    let _y{i} = \"{{ not a brace\"; // }} nor this\n"
            ));
        }
        f.push_str("    x\n}\n");
        f
    }

    #[test]
    fn a_long_function_is_named_with_its_length() {
        let text = format!("{}\n{}", function("short", 10), function("long", 79));
        assert_eq!(
            oversize("a.rs", &text),
            vec![Oversize::Function {
                path: "a.rs".into(),
                name: "long".into(),
                line: 15,
                lines: 82,
            }]
        );
    }

    #[test]
    fn tests_and_declarations_do_not_count() {
        let text = format!(
            "trait T {{\n    fn declared(&self);\n}}\n#[cfg(test)]\nmod tests {{\n{}}}\n",
            function("long_test", 200)
        );
        assert_eq!(oversize("b.rs", &text), vec![]);
    }

    #[test]
    fn a_long_file_is_reported() {
        let text = "const X: u8 = 0;\n".repeat(MAX_FILE_LINES + 1);
        assert_eq!(
            oversize("c.rs", &text),
            vec![Oversize::File {
                path: "c.rs".into(),
                lines: MAX_FILE_LINES + 1,
            }]
        );
    }

    #[test]
    fn braces_in_literals_and_lifetimes_are_not_code() {
        assert_eq!(
            code_of(r#"let s = "{"; let c = '{'; // }"#),
            "let s = ; let c = ; "
        );
        assert_eq!(code_of("fn f<'a>(x: &'a str) {"), "fn f<'a>(x: &'a str) {");
        assert_eq!(code_of(r"let c = '\'';{"), "let c = ;{");
    }

    #[test]
    fn the_workspace_is_within_its_limits() {
        if let Err(e) = check(&crate::util::workspace_root()) {
            panic!("{e:#}");
        }
    }
}
