//! `xlb generate completions|man --out DIR` (hidden): shell completions and
//! man pages generated from the CLI's own definition, so they never drift
//! from `--help`. `cargo xtask dist` runs it to fill the package.

use std::{
    io,
    path::{Path, PathBuf},
};

use clap::{CommandFactory as _, Subcommand};
use clap_complete::Shell;

use super::Cli;

/// What to generate.
#[derive(Debug, PartialEq, Subcommand)]
pub enum Generate {
    /// Shell completions: `xlb.bash`, `_xlb` (zsh) and `xlb.fish`.
    Completions {
        /// Directory to write them to (it must exist).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Man pages: `xlb.1` and one `xlb-COMMAND.1` per command.
    Man {
        /// Directory to write them to (it must exist).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

impl Generate {
    /// Writes the files and returns their paths.
    pub fn run(&self) -> io::Result<Vec<PathBuf>> {
        match self {
            Generate::Completions { out } => completions(out),
            Generate::Man { out } => man_pages(out),
        }
    }
}

/// The shells packaged: the three Debian ships completion directories for.
const SHELLS: [Shell; 3] = [Shell::Bash, Shell::Zsh, Shell::Fish];

/// Writes bash, zsh and fish completions into `out`.
pub fn completions(out: &Path) -> io::Result<Vec<PathBuf>> {
    let mut cmd = Cli::command();
    SHELLS
        .into_iter()
        .map(|shell| clap_complete::generate_to(shell, &mut cmd, "xlb", out))
        .collect()
}

/// Writes `xlb.1` and a page for every visible command (`xlb-drain.1`, and
/// `xlb-a-b.1` for a nested one) into `out`. Hidden commands (`xdp-pass`,
/// `generate`) get none: they are not for operators.
pub fn man_pages(out: &Path) -> io::Result<Vec<PathBuf>> {
    // Built first: subcommands then carry their display names
    // (`xlb-drain`) and the global options and version.
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut written = Vec::new();
    let mut todo = vec![cmd];
    while let Some(cmd) = todo.pop() {
        todo.extend(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
        // No date: the same sources give the same pages (reproducible
        // packages).
        let man = clap_mangen::Man::new(cmd).source(format!("xlb {}", crate::version::long()));
        written.push(man.generate_to(out)?);
    }
    written.sort();
    Ok(written)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::fs;

    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xlb-gen-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn names(paths: &[PathBuf]) -> BTreeSet<String> {
        paths
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn completions_cover_three_shells_and_every_visible_command() {
        let dir = temp_dir("completions");
        let written = completions(&dir).unwrap();
        assert_eq!(
            names(&written),
            BTreeSet::from(["xlb.bash".into(), "_xlb".into(), "xlb.fish".into()])
        );
        for path in &written {
            let text = fs::read_to_string(path).unwrap();
            for word in ["drain", "check-config", "check-upgrade", "deadline"] {
                assert!(text.contains(word), "{}: no {word}", path.display());
            }
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn one_man_page_per_visible_command() {
        let dir = temp_dir("man");
        let written = man_pages(&dir).unwrap();
        let mut want: BTreeSet<String> = Cli::command()
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| format!("xlb-{}.1", s.get_name()))
            .collect();
        want.insert("xlb.1".into());
        assert_eq!(names(&written), want);
        assert!(!want.contains("xlb-generate.1") && want.contains("xlb-xdp-pass.1"));
        let drain = fs::read_to_string(dir.join("xlb-drain.1")).unwrap();
        assert!(drain.starts_with(".ie"), "{drain}");
        assert!(drain.contains(".TH xlb-drain 1"), "{drain}");
        assert!(drain.contains("deadline"), "{drain}");
        let top = fs::read_to_string(dir.join("xlb.1")).unwrap();
        assert!(top.contains("check\\-upgrade"), "{top}");
        assert!(
            top.contains(crate::version::COMMIT),
            "the version names the commit"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
