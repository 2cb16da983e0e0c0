//! The documentation against the code it describes, so the two cannot
//! drift apart again (issue 28, "README mismatches"). Each test reads a
//! part of the README, `examples/xlb.toml` or `docs/`, and the list it
//! documents from the code itself (lb-ctl's commands, lb-common's counters,
//! the configuration's own `Deserialize`), and names what is missing on
//! either side. No root, no network: plain file reads.
//!
//! The packages `cargo xtask setup` installs are checked against
//! `docs/development.md` by a unit test next to their list
//! (`xtask/src/setup.rs`, `development_md_names_every_package`): xtask is a
//! binary this crate cannot import.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use lb_common::Stat;
use lb_ctl::{COMMANDS, PROTOCOL_VERSION};
use lb_user::config::{Config, ConfigKey, accepted_keys};

/// A file of the repository, as text.
fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The part of `text` from the line starting with `start` to the next line
/// starting with `end` (excluded).
fn section<'t>(text: &'t str, start: &str, end: &str) -> &'t str {
    let from = text
        .find(&format!("\n{start}"))
        .unwrap_or_else(|| panic!("no line starting with {start:?}"))
        + 1;
    let len = text[from + 1..]
        .find(&format!("\n{end}"))
        .unwrap_or_else(|| panic!("no line starting with {end:?} after {start:?}"))
        + 1;
    &text[from..=from + len]
}

/// The words in backticks in `text`.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The first cell of each row of the markdown tables in `text`, header and
/// separator rows left out.
fn first_cells(text: &str) -> Vec<&str> {
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with('|')).collect();
    rows.iter()
        .zip(rows.iter().skip(1).map(Some).chain([None]))
        .filter(|(row, next)| {
            !row.starts_with("| ---") && !next.is_some_and(|n| n.starts_with("| ---"))
        })
        .filter_map(|(row, _)| row.split('|').nth(1).map(str::trim))
        .collect()
}

const README: &str = "README.md";

/// README, CLI reference, "Control socket": the version lb-ctl speaks, and
/// one row per command lb-ctl knows (`COMMANDS`, which lb-ctl checks
/// against its `Request` enum), no more, no fewer.
#[test]
fn control_protocol_section_matches_lb_ctl() {
    let readme = read(README);
    let text = section(&readme, "**Control socket.**", "### Logs");
    let version = format!("\"version\": {PROTOCOL_VERSION}");
    assert!(
        text.contains(&version),
        "the section does not say {version}"
    );
    for (i, _) in text.match_indices("\"version\":") {
        let rest = text[i + "\"version\":".len()..].trim_start();
        assert!(
            rest.starts_with(&PROTOCOL_VERSION.to_string()),
            "the section shows a version other than {PROTOCOL_VERSION}: {:?}",
            &text[i..(i + 20).min(text.len())]
        );
    }
    let documented: BTreeSet<&str> = first_cells(text).into_iter().flat_map(backticked).collect();
    let known: BTreeSet<&str> = COMMANDS.iter().copied().collect();
    let undocumented: Vec<_> = known.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&known).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "README's command table and lb_ctl::COMMANDS differ: not in the README {undocumented:?}, \
         not a command {unknown:?}"
    );
}

/// README, "Packet handling policy": every counter of lb-common's `Stat`
/// has a row in the table or is in the conntrack sentence under it, and
/// every counter named there exists.
#[test]
fn counter_table_lists_every_counter() {
    let readme = read(README);
    let text = section(&readme, "## Packet handling policy", "## Security model");
    let table_start = text.find("\n| packet |").expect("the counter table");
    let mut documented: BTreeSet<&str> = BTreeSet::new();
    for row in text[table_start..]
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with('|'))
    {
        let counter = row.rsplit('|').nth(1).expect("a row of three cells");
        documented.extend(backticked(counter).into_iter().filter(|c| !c.contains('*')));
    }
    let conntrack = text
        .find("The conntrack counters are")
        .expect("the conntrack counters' sentence");
    let sentence = &text[conntrack..];
    let sentence = &sentence[..sentence.find("\n\n").unwrap_or(sentence.len())];
    documented.extend(backticked(sentence));
    let known: BTreeSet<&str> = Stat::ALL.iter().map(|s| s.label()).collect();
    let undocumented: Vec<_> = known.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&known).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "README's counter table and lb_common::Stat differ: not in the README {undocumented:?}, \
         not a counter {unknown:?}"
    );
}

/// Fixture names the README's MTU paragraphs cite, and the fixture files.
const MTU_FIXTURES: &str = "tests/tests/fixtures/icmp.rs";

/// README, "Backends", MTU with `dsr-ipip`: says what the data plane does
/// with a packet too big to encapsulate (answered with ICMP, dropped only
/// when it cannot be told), and cites the fixtures that prove it, which
/// must exist and expect that verdict and counter.
#[test]
fn mtu_paragraph_matches_the_fixtures() {
    let readme = read(README);
    let start = readme
        .find("- **MTU with `dsr-ipip`.**")
        .expect("the MTU paragraph under Backends");
    let para = &readme[start..];
    let para = &para[..para.find("\n\n").unwrap_or(para.len())];
    assert!(
        !para.contains("no ICMP"),
        "the paragraph says no ICMP is sent, but too-big packets are answered:\n{para}"
    );
    let fixtures = read(MTU_FIXTURES);
    // (fixture, what its case must expect, what the paragraph must say).
    let cited = [
        (
            "too_big_v4_with_df_is_answered_with_frag_needed",
            "(IcmpTooBig, 1)",
            "icmp_too_big",
        ),
        (
            "too_big_v6_is_answered_with_packet_too_big",
            "(IcmpTooBig, 1)",
            "packet too big",
        ),
        (
            "too_big_v4_without_df_is_dropped",
            "(DropTooBig, 1)",
            "drop_too_big",
        ),
        (
            "too_big_over_the_reply_budget_is_dropped",
            "(DropReplyLimited, 1)",
            "drop_reply_limited",
        ),
    ];
    for (name, counter, said) in cited {
        assert!(
            para.contains(&format!("`{name}`")),
            "the paragraph does not cite {name}"
        );
        assert!(para.contains(said), "the paragraph does not say {said:?}");
        let Some(at) = fixtures.find(&format!("    {name} |")) else {
            panic!("{MTU_FIXTURES} has no fixture {name}");
        };
        let case = &fixtures[at..];
        let case = &case[..case.find("\n\n").unwrap_or(case.len())];
        assert!(case.contains(counter), "{name} does not expect {counter}");
    }
}

/// README: wherever it says `xlb detach` removes what xlb attached, the
/// same sentence says that the `xlb_hc` filter stays before Linux 6.6, as
/// long as the daemon attaches `xlb_hc` as a legacy clsact filter where
/// the kernel refuses a tcx link (`lb-user/src/daemon/links.rs`, falling
/// back with `kernel::TCX_FALLBACK`, whose text says the same).
#[test]
fn detach_caveat_matches_links_rs() {
    let links = read("lb-user/src/daemon/links.rs");
    assert!(
        links.contains("TCX_FALLBACK") && links.contains("qdisc_add_clsact"),
        "links.rs no longer attaches xlb_hc as a clsact filter before 6.6: \
         update the README's detach caveat and this test"
    );
    let fallback = lb_user::kernel::TCX_FALLBACK;
    assert!(
        fallback.feature.contains("6.6") && fallback.instead.contains("`xlb detach` leaves it"),
        "the logged tcx fallback no longer says what detach leaves: {fallback:?}"
    );
    let readme = read(README)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let claims = [
        "`xlb detach` removes",
        "then removes an instance's XDP link",
    ];
    let mut seen = 0;
    for claim in claims {
        for (at, _) in readme.match_indices(claim) {
            let sentence = &readme[at..];
            let sentence = &sentence[..sentence.find(". ").unwrap_or(sentence.len())];
            assert!(
                sentence.contains("6.6") && sentence.contains("xlb_hc"),
                "README says {claim:?} without the exception of xlb_hc before Linux 6.6:\n\
                 {sentence}"
            );
            seen += 1;
        }
    }
    assert!(seen >= 3, "README's detach claims moved: update this test");
}

const EXAMPLE: &str = "examples/xlb.toml";

/// Every `key = value` of `text`, commented out or not, as its dotted path
/// (`vip.backend.weight`), with the keys of inline tables
/// (`guard.auto_block.ttl`) and the headers of tables (`vip.guard.deny`).
fn shown_keys(text: &str) -> BTreeMap<String, usize> {
    let mut shown = BTreeMap::new();
    let mut table = String::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim().trim_start_matches('#').trim();
        if let Some(header) = line
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .map(|h| h.trim_matches(['[', ']']))
            .filter(|h| {
                h.chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.')
            })
        {
            table = header.to_owned();
            shown.insert(table.clone(), n + 1);
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        // A key starts with a letter: `# 0 = no limit` is prose.
        if !key.starts_with(|c: char| c.is_ascii_lowercase())
            || !key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            continue;
        }
        let path = format!("{table}.{key}");
        if let Some(inline) = value.trim().strip_prefix('{') {
            let inline = &inline[..inline.find('}').unwrap_or(inline.len())];
            for pair in inline.split(',') {
                if let Some((k, _)) = pair.split_once('=') {
                    shown.insert(format!("{path}.{}", k.trim()), n + 1);
                }
            }
        }
        shown.insert(path, n + 1);
    }
    shown
}

/// Keys the parser accepts only to refuse them with advice: the example
/// must not show them (and each is checked to be refused).
const REFUSED: &[(&str, &str, &str)] = &[(
    "RawHealth",
    "port",
    "[daemon]\ninterface = \"eth0\"\n[health_check]\nport = 8080\n",
)];

/// `examples/xlb.toml` "shows every setting": every key the configuration
/// accepts (read from its own `Deserialize`) appears there, commented out
/// or set, once per table type (a `[health_check]` key shown in any of the
/// three health-check tables); and every key it shows is one the
/// configuration accepts.
#[test]
fn example_config_shows_every_key() {
    let keys = accepted_keys();
    assert!(keys.len() > 100, "only {} keys found", keys.len());
    let by_path: BTreeMap<&str, &ConfigKey> = keys.iter().map(|k| (k.path.as_str(), k)).collect();
    let shown = shown_keys(&read(EXAMPLE));
    let mut covered = BTreeSet::new();
    let mut stale = Vec::new();
    for (path, line) in &shown {
        match by_path.get(path.as_str()) {
            Some(k) => {
                covered.insert((k.parent_type, k.name()));
            }
            None => stale.push(format!("{EXAMPLE}:{line}: {path}")),
        }
    }
    assert!(
        stale.is_empty(),
        "keys the configuration does not accept: {stale:#?}"
    );
    for (parent, name, text) in REFUSED {
        assert!(
            !covered.contains(&(*parent, *name)),
            "{EXAMPLE} shows {name}"
        );
        assert!(
            Config::from_str(text, "xlb.toml").is_err(),
            "{text} accepted"
        );
    }
    // One line per setting: the first path of each (table type, key).
    let mut missing: BTreeMap<(&str, &str), &str> = BTreeMap::new();
    for k in &keys {
        let setting = (k.parent_type, k.name());
        if !covered.contains(&setting) && !REFUSED.iter().any(|(p, n, _)| (*p, *n) == setting) {
            missing.entry(setting).or_insert(&k.path);
        }
    }
    let missing: Vec<&str> = missing.into_values().collect();
    assert!(missing.is_empty(), "{EXAMPLE} does not show: {missing:#?}");
}

/// `examples/xlb.toml` passes `xlb check-config` (the same function),
/// without a warning.
#[test]
fn example_config_passes_check_config() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(EXAMPLE);
    let out = lb_user::cli::check_config(&path)
        .unwrap_or_else(|e| panic!("{EXAMPLE} is refused:\n{}", e.problems.join("\n")));
    assert!(out.contains(": ok (3 VIPs, "), "{out}");
    assert!(!out.contains("warning"), "{out}");
}

const BENCHMARKS: &str = "docs/benchmarks.md";

/// docs/benchmarks.md: every benchmark binary of this crate
/// (`tests/src/bin/xlb-*-bench`) is described under "What each benchmark
/// measures" and has a row in "Current figures" run by `--bin NAME`, and
/// every `--bin NAME` the file names is a binary.
#[test]
fn benchmarks_doc_covers_every_benchmark() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bin");
    let bins: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").file_name())
        .map(|n| n.to_string_lossy().trim_end_matches(".rs").to_owned())
        .filter(|n| n.starts_with("xlb-") && n.ends_with("-bench"))
        .collect();
    assert!(bins.len() >= 10, "{bins:?}");
    let doc = read(BENCHMARKS);
    let figures = section(&doc, "## Current figures", "## Method");
    let measures = section(&doc, "## What each benchmark measures", "## Decisions");
    for bin in &bins {
        assert!(
            measures.contains(&format!("- **`{bin}")),
            "{BENCHMARKS} does not describe {bin} under \"What each benchmark measures\""
        );
        assert!(
            figures.contains(&format!("--bin {bin}`"))
                || figures.contains(&format!("--bin {bin} ")),
            "{BENCHMARKS} has no row run by `--bin {bin}` under \"Current figures\""
        );
    }
    for (at, _) in doc.match_indices("--bin ") {
        let name: String = doc[at + "--bin ".len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        assert!(
            name == "NAME" || bins.contains(&name),
            "{BENCHMARKS} runs `--bin {name}`, which is not a benchmark binary"
        );
    }
}

#[test]
fn helpers() {
    assert_eq!(backticked("a `b` c `d`"), ["b", "d"]);
    assert_eq!(
        first_cells("| h | x |\n| --- | --- |\n| `a` | 1 |\n| b | 2 |\n"),
        ["`a`", "b"]
    );
    let shown = shown_keys(
        "[daemon]\n# interface = \"x\"\n# [vip.guard]\nlimit = { rate = \"1/s\", burst = 2 }\n\
         # 0 = no limit\n",
    );
    let paths: Vec<&str> = shown.keys().map(String::as_str).collect();
    assert_eq!(
        paths,
        [
            "daemon",
            "daemon.interface",
            "vip.guard",
            "vip.guard.limit",
            "vip.guard.limit.burst",
            "vip.guard.limit.rate"
        ]
    );
    assert_eq!(section("x\nA b\nc\nB d\n", "A", "B"), "A b\nc\n");
}

/// The minimum kernel the README states is the one `xlb run` enforces
/// (`lb_user::kernel::MINIMUM`); the README's table is checked against the
/// matrix by `xtask/src/kernels.rs` (`readme_supported_kernels_is_the_matrix`).
#[test]
fn readme_minimum_kernel_is_the_enforced_one() {
    let readme = read("README.md");
    let (major, minor) = lb_user::kernel::MINIMUM;
    let want = format!("Linux ≥ {major}.{minor}, tested on");
    assert!(
        readme.contains(&want),
        "README's Requirements do not say {want:?}"
    );
    assert!(
        readme.contains(&format!("Below {major}.{minor} `xlb run` refuses to start")),
        "README's Supported kernels do not say what happens below {major}.{minor}"
    );
}
