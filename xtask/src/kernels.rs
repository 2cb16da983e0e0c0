//! The kernels of the matrix: Debian's stock kernels of the lines that
//! load-balancer hosts run, fetched from the Debian registry and unpacked
//! into a cache of xlb's own, then booted in QEMU by `matrix`. They are
//! never installed: the host's `/boot`, boot loader, module tree and apt
//! configuration stay as they are, so nothing here changes what the host
//! runs. The package lists used to pick them live in the cache too (a
//! private apt state, for the `linux-image-*` packages only).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime},
};

use anyhow::{Context as _, Result, bail};

use crate::util;

/// One kernel line of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kernel {
    /// The line, as `cargo xtask test --kernel` takes it and the README's
    /// "Supported kernels" table names it.
    pub(crate) line: &'static str,
    /// The Debian suite whose `linux-image-amd64` depends on the newest
    /// kernel of the line: the one the matrix boots.
    pub(crate) suite: &'static str,
    /// The distributions the line stands for (the README's table).
    pub(crate) stands_for: &'static str,
    /// Whether the packet fixtures run on it: they hand `BPF_PROG_TEST_RUN`
    /// the frame's ingress interface (an `xdp_md`), which kernels before
    /// 5.15 refuse with `EINVAL`. The lifecycle scenario, real packets
    /// through veths, runs on every line.
    pub(crate) fixtures: bool,
}

/// The matrix, oldest first. The README's "Supported kernels" table lists
/// exactly these lines and the host's (`docs.rs` checks it).
pub(crate) const KERNELS: [Kernel; 3] = [
    Kernel {
        line: "5.10",
        suite: "bullseye",
        stands_for: "Debian 11; the oldest line tested, below Ubuntu 22.04 (5.15) and RHEL 9 (5.14)",
        fixtures: false,
    },
    Kernel {
        line: "6.1",
        suite: "bookworm",
        stands_for: "Debian 12, Amazon Linux 2023",
        fixtures: true,
    },
    Kernel {
        line: "6.12",
        suite: "bookworm-backports",
        stands_for: "Debian 13, Ubuntu 24.10 and later",
        fixtures: true,
    },
];

/// The kernel of `line`, if the matrix has it.
pub(crate) fn by_line(line: &str) -> Option<&'static Kernel> {
    KERNELS.iter().find(|k| k.line == line)
}

/// virtme-ng's `vng`: on PATH, else in the scripts directory of the
/// `python3` that pip installed it with (a fresh pyenv shows a newly
/// installed script on PATH only after `pyenv rehash`).
pub(crate) fn vng() -> Option<PathBuf> {
    util::find_program("vng").or_else(|| {
        let dir = util::probe(util::command("python3").args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ]))?;
        let path = Path::new(dir.trim()).join("vng");
        path.is_file().then_some(path)
    })
}

/// Where the kernels are unpacked, one directory per line (and the private
/// apt state). Not under `/var/cache`: virtme-ng mounts a tmpfs there in
/// the guest, which would hide the modules from it.
pub(crate) fn cache_dir() -> PathBuf {
    std::env::var_os("XLB_KERNEL_CACHE")
        .map_or_else(|| PathBuf::from("/var/lib/xlb-kernels"), PathBuf::from)
}

/// A kernel unpacked in the cache.
#[derive(Debug, Clone)]
pub(crate) struct Unpacked {
    /// The kernel's release (`uname -r` in the guest), e.g. `6.1.0-50-amd64`.
    pub(crate) release: String,
    /// The directory the package was unpacked in (`boot/`, `lib/modules/`).
    pub(crate) root: PathBuf,
}

impl Unpacked {
    pub(crate) fn image(&self) -> PathBuf {
        self.root
            .join("boot")
            .join(format!("vmlinuz-{}", self.release))
    }

    pub(crate) fn modules(&self) -> PathBuf {
        self.root.join("lib/modules").join(&self.release)
    }
}

/// The file in a line's directory naming the release unpacked there.
const RELEASE_FILE: &str = "release";

/// The kernel of `k` in the cache, if one was unpacked whole.
pub(crate) fn unpacked(k: &Kernel) -> Option<Unpacked> {
    let root = cache_dir().join(k.line);
    let release = fs::read_to_string(root.join(RELEASE_FILE)).ok()?;
    let u = Unpacked {
        release: release.trim().to_string(),
        root,
    };
    (u.image().is_file() && u.modules().is_dir()).then_some(u)
}

/// How long the package lists are trusted before setup asks the registry
/// again for a newer kernel of each line.
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// Makes sure every line's newest kernel is unpacked: asks the registry
/// (at most once a day) which one that is, and fetches and unpacks it when
/// the cache holds another.
pub(crate) fn ensure() -> Result<()> {
    let apt = Apt::new(&cache_dir().join("apt"))?;
    let fresh = apt.lists_age().is_some_and(|age| age < LISTS_MAX_AGE);
    let have_all = KERNELS.iter().all(|k| unpacked(k).is_some());
    if fresh && have_all {
        let list: Vec<String> = KERNELS
            .iter()
            .filter_map(unpacked)
            .map(|u| u.release)
            .collect();
        println!("setup: matrix kernels {}: present", list.join(" "));
        return Ok(());
    }
    apt.update()?;
    for k in &KERNELS {
        let release = apt.newest(k)?;
        if unpacked(k).is_some_and(|u| u.release == release) {
            println!("setup: kernel {release} ({}): present", k.line);
            continue;
        }
        println!(
            "setup: kernel {release} ({}, Debian {}): fetching",
            k.line, k.suite
        );
        apt.unpack(k, &release)?;
    }
    Ok(())
}

/// A private apt state for the kernel packages: its own sources, lists and
/// archive cache, and an empty dpkg status (nothing is installed).
struct Apt {
    dir: PathBuf,
}

/// The suites the kernels come from, as one sources list.
const SOURCES: &str = "\
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bullseye main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main
";

impl Apt {
    fn new(dir: &Path) -> Result<Self> {
        for sub in ["lists/partial", "archives/partial"] {
            let d = dir.join(sub);
            fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        }
        let sources = dir.join("sources.list");
        fs::write(&sources, SOURCES).with_context(|| format!("writing {}", sources.display()))?;
        let status = dir.join("status");
        if !status.exists() {
            fs::write(&status, "").with_context(|| format!("writing {}", status.display()))?;
        }
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// `program` (apt-get, apt-cache) on this state only.
    fn command(&self, program: &str) -> Command {
        let d = |sub: &str| self.dir.join(sub).display().to_string();
        let mut cmd = util::command(program);
        for (key, value) in [
            ("Dir::Etc::sourcelist", d("sources.list")),
            ("Dir::Etc::sourceparts", "-".to_string()),
            ("Dir::State::Lists", d("lists")),
            ("Dir::State::status", d("status")),
            ("Dir::Cache::archives", d("archives")),
            ("Dir::Cache::pkgcache", String::new()),
            ("Dir::Cache::srcpkgcache", String::new()),
            ("APT::Sandbox::User", "root".to_string()),
        ] {
            cmd.arg("-o").arg(format!("{key}={value}"));
        }
        cmd
    }

    fn stamp(&self) -> PathBuf {
        self.dir.join("updated")
    }

    fn lists_age(&self) -> Option<Duration> {
        let modified = fs::metadata(self.stamp()).ok()?.modified().ok()?;
        SystemTime::now().duration_since(modified).ok()
    }

    fn update(&self) -> Result<()> {
        let mut cmd = self.command("apt-get");
        cmd.args(["-q", "update"]);
        let line = util::render(&cmd);
        util::run(&mut cmd).with_context(|| {
            format!(
                "fetching the package lists of the matrix kernels failed (`{line}`): the Debian \
                 registry must be reachable"
            )
        })?;
        fs::write(self.stamp(), "").context("stamping the kernel package lists")
    }

    /// The newest kernel release of `k`'s line: what its suite's
    /// `linux-image-amd64` depends on (`linux-image-6.1.0-50-amd64` gives
    /// `6.1.0-50-amd64`).
    fn newest(&self, k: &Kernel) -> Result<String> {
        let mut cmd = self.command("apt-cache");
        cmd.args(["show", &format!("linux-image-amd64/{}", k.suite)]);
        let out = util::probe(&mut cmd).with_context(|| {
            format!(
                "`{}` failed: no linux-image-amd64 in {}",
                util::render(&cmd),
                k.suite
            )
        })?;
        let release = release_from_show(&out).with_context(|| {
            format!(
                "linux-image-amd64 in {} depends on no linux-image-*-amd64",
                k.suite
            )
        })?;
        if !release.starts_with(&format!("{}.", k.line)) {
            bail!(
                "linux-image-amd64 in Debian {} is {release} now, not of line {}: update \
                 xtask/src/kernels.rs",
                k.suite,
                k.line
            );
        }
        Ok(release)
    }

    /// Fetches `linux-image-RELEASE` and unpacks it into `k`'s directory,
    /// replacing what was there only once it is whole.
    fn unpack(&self, k: &Kernel, release: &str) -> Result<()> {
        let cache = cache_dir();
        let tmp = cache.join(format!(".{}-new", k.line));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let package = format!("linux-image-{release}");
        let mut get = self.command("apt-get");
        get.args(["-q", "download", &package]).current_dir(&tmp);
        let line = util::render(&get);
        util::run(&mut get).with_context(|| format!("fetching {package} failed (`{line}`)"))?;
        let deb = fs::read_dir(&tmp)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .with_context(|| format!("`{line}` left no .deb in {}", tmp.display()))?;
        let root = tmp.join("root");
        util::run(util::command("dpkg-deb").arg("-x").arg(&deb).arg(&root))
            .with_context(|| format!("unpacking {}", deb.display()))?;
        fs::write(root.join(RELEASE_FILE), format!("{release}\n"))?;
        let u = Unpacked {
            release: release.to_string(),
            root: root.clone(),
        };
        if !u.image().is_file() || !u.modules().is_dir() {
            bail!(
                "{package} holds no {} or {}",
                u.image().display(),
                u.modules().display()
            );
        }
        let dest = cache.join(k.line);
        let _ = fs::remove_dir_all(&dest);
        fs::rename(&root, &dest)
            .with_context(|| format!("moving {} to {}", root.display(), dest.display()))?;
        let _ = fs::remove_dir_all(&tmp);
        Ok(())
    }
}

/// The kernel release that `apt-cache show linux-image-amd64/SUITE` output
/// depends on, from its first `Depends:` line.
fn release_from_show(show: &str) -> Option<String> {
    let depends = show.lines().find_map(|l| l.strip_prefix("Depends:"))?;
    depends.split(',').find_map(|d| {
        let name = d.split_whitespace().next()?;
        let release = name.strip_prefix("linux-image-")?;
        (release.ends_with("-amd64") && !release.contains("cloud") && !release.contains("rt-"))
            .then(|| release.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_from_show_cases() {
        let cases = [
            (
                "bookworm",
                "Package: linux-image-amd64\nVersion: 6.1.176-1\nDepends: linux-image-6.1.0-50-amd64 (= 6.1.176-1)\n",
                Some("6.1.0-50-amd64"),
            ),
            (
                "backports",
                "Depends: linux-image-6.12.95+deb12-amd64 (= 6.12.95-1~bpo12+1)\n",
                Some("6.12.95+deb12-amd64"),
            ),
            (
                "several",
                "Depends: foo, linux-image-5.10.0-32-amd64 (= 5.10.223-1)\n",
                Some("5.10.0-32-amd64"),
            ),
            ("no depends", "Package: linux-image-amd64\n", None),
            (
                "other flavour",
                "Depends: linux-image-6.1.0-50-cloud-amd64\n",
                None,
            ),
        ];
        for (name, show, want) in cases {
            assert_eq!(release_from_show(show).as_deref(), want, "case {name}");
        }
    }

    /// The README's "Supported kernels" table is the matrix: a row per line
    /// with its own "stands for", the host's row, and any other row marked
    /// as not tested; the minimum the Requirements state is the oldest line.
    #[test]
    fn readme_supported_kernels_is_the_matrix() {
        let readme = include_str!("../../README.md");
        let section = readme
            .split_once("\n### Supported kernels\n")
            .and_then(|(_, rest)| rest.split_once("\n### ").map(|(s, _)| s))
            .expect("README has a \"### Supported kernels\" section");
        let rows: Vec<Vec<&str>> = section
            .lines()
            .filter(|l| l.starts_with('|') && !l.starts_with("| ---"))
            .skip(1)
            .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
            .collect();
        for k in &KERNELS {
            let row = rows
                .iter()
                .find(|r| r[0] == k.line)
                .unwrap_or_else(|| panic!("README's table has no row for {}", k.line));
            assert_eq!(row[1], k.stands_for, "row {}: stands for", k.line);
            assert!(
                row[2].contains("cargo xtask test"),
                "row {}: {:?}",
                k.line,
                row[2]
            );
            let fixtures = row[2].contains("packet fixtures and");
            assert_eq!(
                fixtures, k.fixtures,
                "row {}: fixtures run or not: {:?}",
                k.line, row[2]
            );
        }
        for r in &rows {
            let known = KERNELS.iter().any(|k| k.line == r[0]) || r[0] == "host";
            assert!(
                known || r[2].contains("not tested"),
                "README claims kernel {} tested, the matrix has no such line: {r:?}",
                r[0]
            );
        }
        assert!(
            readme.contains(&format!("Linux ≥ {}, tested on", KERNELS[0].line)),
            "the README's Requirements do not state the oldest line, {}",
            KERNELS[0].line
        );
    }

    #[test]
    fn lines_are_distinct_and_oldest_first() {
        let lines: Vec<&str> = KERNELS.iter().map(|k| k.line).collect();
        let mut sorted = lines.clone();
        sorted.sort_by_key(|l| {
            let mut it = l.split('.').map(|n| n.parse::<u32>().unwrap());
            (it.next().unwrap(), it.next().unwrap())
        });
        sorted.dedup();
        assert_eq!(lines, sorted);
        assert!(by_line("6.1").is_some() && by_line("4.19").is_none());
    }
}
