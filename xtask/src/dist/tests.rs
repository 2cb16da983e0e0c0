//! The package as an operator gets it: built from the debug binaries
//! (`cargo xtask test` builds them first; no release build needed), its
//! file list and control fields read back with dpkg-deb, then extracted
//! into a throwaway root and used from there: `xlb --version`,
//! `check-config` on the shipped configuration, the completions in their
//! shells, every man page through `man -l`, and the units through
//! `systemd-analyze verify`. Tools that are not installed are skipped with
//! a printed reason (setup installs them).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
    time::SystemTime,
};

use super::*;

/// The package, built once for every test here.
struct Built {
    dir: PathBuf,
    artifacts: Artifacts,
    /// The .deb extracted with `dpkg-deb -x`.
    root: PathBuf,
}

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let paths = Paths::find().unwrap();
        let bin_dir = paths.target.join("debug");
        refuse_stale(&paths.root, &bin_dir.join(NAME));
        // Under target/, replaced by each run: a debug package is large, and
        // one copy is enough to look at after a failure.
        let dir = paths.target.join("dist-test");
        let _ = fs::remove_dir_all(&dir);
        let artifacts = pack(&paths.root, &bin_dir, &dir.join("out"), true)
            .unwrap_or_else(|e| panic!("packing: {e:#}"));
        let root = dir.join("root");
        ok(Command::new("dpkg-deb")
            .arg("-x")
            .arg(&artifacts.deb)
            .arg(&root));
        Built {
            dir,
            artifacts,
            root,
        }
    })
}

/// A stale `xlb` would test old code: refuse one older than its sources.
fn refuse_stale(root: &Path, xlb: &Path) {
    let built = fs::metadata(xlb)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; build it: cargo build -p lb-user -p xlb-lab --bins",
                xlb.display()
            )
        });
    let mut stack: Vec<PathBuf> = [
        "lb-user/src",
        "lb-user/build.rs",
        "lb-common/src",
        "lb-ebpf/src",
    ]
    .iter()
    .map(|s| root.join(s))
    .collect();
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            stack.extend(fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
        } else if fs::metadata(&p)
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH)
            > built
        {
            panic!(
                "{} is older than {}: rebuild with `cargo build -p lb-user -p xlb-lab --bins`",
                xlb.display(),
                p.display()
            );
        }
    }
}

/// Runs `cmd` and returns its output, failing on a non-zero exit.
fn ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `program` is installed; says why a check is skipped if not.
fn have(program: &str, check: &str) -> bool {
    let found = util::find_program(program).is_some();
    if !found {
        eprintln!("skipped: {check} ({program} is not installed; `cargo xtask setup` installs it)");
    }
    found
}

#[test]
fn deb_holds_every_file_owned_by_root() {
    let b = built();
    let listing = stdout(&ok(Command::new("dpkg-deb")
        .arg("-c")
        .arg(&b.artifacts.deb)));
    let mut files = BTreeSet::new();
    for line in listing.lines() {
        // -rwxr-xr-x root/root 123 2026-01-01 00:00 ./usr/bin/xlb
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields[1], "root/root", "{line}");
        let path = fields[5].trim_start_matches("./").to_owned();
        if fields[0].starts_with('-') {
            if path == BIN {
                assert_eq!(fields[0], "-rwxr-xr-x", "{line}");
            } else if path == CONFIG {
                // It may hold `hash_seed`, a secret (issue 39).
                assert_eq!(fields[0], "-rw-r-----", "{line}");
            } else {
                assert_eq!(fields[0], "-rw-r--r--", "{line}");
            }
            files.insert(path);
        }
    }
    let mut want: BTreeSet<String> = [
        BIN,
        CONFIG,
        BASH_COMPLETION,
        ZSH_COMPLETION,
        FISH_COMPLETION,
        "usr/share/doc/xlb/copyright",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    want.extend(UNIT_FILES.iter().map(|u| format!("{UNITS}/{u}")));
    for page in [
        "xlb",
        "xlb-run",
        "xlb-drain",
        "xlb-check-config",
        "xlb-decap",
    ] {
        want.insert(format!("{MAN_DIR}/{page}.1.gz"));
    }
    let missing: Vec<_> = want.difference(&files).collect();
    assert!(missing.is_empty(), "missing {missing:?} in\n{listing}");
    let pages = files.iter().filter(|f| f.starts_with(MAN_DIR)).count();
    assert!(pages > 10, "{pages} man pages:\n{listing}");
}

#[test]
fn deb_control_fields_and_conffiles() {
    let b = built();
    let field = |name: &str| {
        stdout(&ok(Command::new("dpkg-deb")
            .arg("-f")
            .arg(&b.artifacts.deb)
            .arg(name)))
        .trim()
        .to_owned()
    };
    let arch = stdout(&ok(Command::new("dpkg").arg("--print-architecture")));
    assert_eq!(field("Package"), "xlb");
    assert_eq!(field("Version"), env!("CARGO_PKG_VERSION"));
    assert_eq!(field("Architecture"), arch.trim());
    assert_eq!(field("Section"), "net");
    assert_eq!(field("Priority"), "optional");
    let depends = field("Depends");
    assert!(depends.starts_with("libc6 (>= 2."), "{depends}");
    assert!(!field("Maintainer").is_empty());
    assert!(field("Description").starts_with("XDP layer-4 load balancer"));
    let conffiles = stdout(&ok(Command::new("dpkg-deb")
        .arg("-I")
        .arg(&b.artifacts.deb)
        .arg("conffiles")));
    assert_eq!(conffiles, format!("/{CONFIG}\n"));
    // The shipped configuration is the annotated example, byte for byte.
    let shipped = fs::read(b.root.join(CONFIG)).unwrap();
    let root = Paths::find().unwrap().root;
    assert_eq!(shipped, fs::read(root.join("examples/xlb.toml")).unwrap());
}

#[test]
fn extracted_xlb_runs() {
    let b = built();
    let xlb = b.root.join(BIN);
    let version = stdout(&ok(Command::new(&xlb).arg("--version")));
    let layout = version
        .strip_prefix(&format!("xlb {} (commit ", env!("CARGO_PKG_VERSION")))
        .and_then(|rest| rest.split_once(", map layout "))
        .map(|(_, layout)| layout.trim_end());
    assert!(
        layout.is_some_and(|l| l.ends_with(')') && l.trim_end_matches(')').parse::<u32>().is_ok()),
        "{version}"
    );
    let config = b.root.join(CONFIG);
    let report = stdout(&ok(Command::new(&xlb).arg("check-config").arg(&config)));
    assert!(
        report.starts_with(&format!("{}: ok (", config.display())),
        "{report}"
    );
}

#[test]
fn bash_completes_from_the_package() {
    let b = built();
    let file = b.root.join(BASH_COMPLETION);
    // What bash-completion does on `xlb dr<TAB>`: source the file, then
    // call the function `complete -p xlb` names.
    let script = format!(
        "source '{}' || exit 2\n\
         spec=$(complete -p xlb) || exit 3\n\
         echo \"$spec\"\n\
         fn=$(echo \"$spec\" | sed -n 's/.*-F \\([^ ]*\\).*/\\1/p')\n\
         COMP_WORDS=(xlb dr); COMP_CWORD=1; COMP_LINE='xlb dr'; COMP_POINT=6\n\
         \"$fn\" xlb dr xlb\n\
         printf 'offer:%s\\n' \"${{COMPREPLY[@]}}\"\n",
        file.display()
    );
    let out = stdout(&ok(Command::new("bash").args([
        "--noprofile",
        "--norc",
        "-c",
        &script,
    ])));
    let spec = out.lines().next().unwrap_or_default();
    assert!(
        spec.starts_with("complete ") && spec.contains(" -F _xlb ") && spec.ends_with(" xlb"),
        "{out}"
    );
    let offers: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("offer:"))
        .collect();
    assert_eq!(offers, ["drain"], "{out}");
}

#[test]
fn zsh_and_fish_completions_parse() {
    let b = built();
    for (path, shell) in [(ZSH_COMPLETION, "zsh"), (FISH_COMPLETION, "fish")] {
        let file = b.root.join(path);
        let text = fs::read_to_string(&file).unwrap();
        assert!(text.contains("drain"), "{}", file.display());
        if have(shell, &format!("{shell} -n on its completion")) {
            ok(Command::new(shell).arg("-n").arg(&file));
        }
    }
}

#[test]
fn every_man_page_renders_without_warnings() {
    let b = built();
    if !have("man", "man -l on every page") {
        return;
    }
    let mut pages: Vec<PathBuf> = fs::read_dir(b.root.join(MAN_DIR))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    pages.sort();
    for page in &pages {
        let out = ok(Command::new("man")
            .arg("-l")
            .arg(page)
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "80"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.trim().is_empty(), "{}: {stderr}", page.display());
        let text = stdout(&out);
        let name = page
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace(".1.gz", "");
        assert!(text.contains(&name), "{}:\n{text}", page.display());
    }
}

#[test]
fn units_pass_systemd_analyze_verify() {
    let b = built();
    if !have("systemd-analyze", "systemd-analyze verify on the units") {
        return;
    }
    // The units name /usr/bin/xlb, which verify checks is executable:
    // point them at the extracted binary, nothing else changed.
    let dir = b.dir.join("units");
    fs::create_dir_all(&dir).unwrap();
    let xlb = b.root.join(BIN);
    let mut names = Vec::new();
    for (unit, name) in [
        ("xlb.service", "xlb.service"),
        ("xlb-decap@.service", "xlb-decap@lo.service"),
    ] {
        let text = fs::read_to_string(b.root.join(UNITS).join(unit)).unwrap();
        assert!(text.contains("/usr/bin/xlb "), "{unit}");
        let text = text.replace("/usr/bin/xlb ", &format!("{} ", xlb.display()));
        fs::write(dir.join(name), text).unwrap();
        names.push(dir.join(name));
    }
    let out = ok(Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&names));
    // verify exits 0 on unknown keys and bad values: only its silence
    // says the units are clean.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.trim().is_empty(), "{stderr}");
}

#[test]
fn tarball_holds_xlb_the_lab_binaries_and_the_package_files() {
    let b = built();
    let listing = stdout(&ok(Command::new("tar")
        .arg("-tzf")
        .arg(&b.artifacts.tarball)));
    let top = format!("{NAME}-{}/", env!("CARGO_PKG_VERSION"));
    let files: BTreeSet<&str> = listing
        .lines()
        .filter_map(|l| l.strip_prefix(&top))
        .collect();
    for bin in std::iter::once(NAME).chain(LAB_BINARIES.iter().copied()) {
        assert!(
            files.contains(format!("bin/{bin}").as_str()),
            "bin/{bin}:\n{listing}"
        );
    }
    for f in [CONFIG, BASH_COMPLETION, "lib/systemd/system/xlb.service"] {
        assert!(files.contains(f), "{f}:\n{listing}");
    }
}

#[test]
fn min_glibc_takes_the_newest_version() {
    let cases: &[(&str, &[u8], &str)] = &[
        ("none", b"no versions here", "2.17"),
        ("one", b"\0GLIBC_2.28\0", "2.28"),
        (
            "newest wins",
            b"GLIBC_2.34\0GLIBC_2.2.5\0GLIBC_2.4\0GLIBC_2.33",
            "2.34",
        ),
        ("private tag ignored", b"GLIBC_PRIVATE\0GLIBC_2.3", "2.17"),
    ];
    for (name, bytes, want) in cases {
        assert_eq!(min_glibc(bytes), *want, "{name}");
    }
}
