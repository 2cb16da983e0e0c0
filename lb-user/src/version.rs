//! What `xlb --version` says: the release, the commit it was built from
//! (`lb-user/build.rs`) and the map layout version, which decides whether a
//! restart onto this binary keeps established flows (`xlb check-upgrade`).

use std::sync::OnceLock;

/// The commit this binary was built from, or "unknown" outside git.
pub const COMMIT: &str = env!("XLB_GIT_COMMIT");

/// `0.1.0 (commit 0123456789ab, map layout 6)`.
pub fn long() -> &'static str {
    static LONG: OnceLock<String> = OnceLock::new();
    LONG.get_or_init(|| {
        format!(
            "{} (commit {COMMIT}, map layout {})",
            env!("CARGO_PKG_VERSION"),
            lb_common::LAYOUT_VERSION
        )
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::Cli;

    #[test]
    fn version_names_release_commit_and_layout() {
        let err = Cli::try_parse_from(["xlb", "--version"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::DisplayVersion);
        let shown = err.render().to_string();
        let want = format!(
            "xlb {} (commit {COMMIT}, map layout {})\n",
            env!("CARGO_PKG_VERSION"),
            lb_common::LAYOUT_VERSION
        );
        assert_eq!(shown, want);
        // Built in this repository, the commit is a real one.
        assert!(
            COMMIT == "unknown"
                || (COMMIT.len() == 12 && COMMIT.bytes().all(|b| b.is_ascii_hexdigit())),
            "{COMMIT:?}"
        );
    }

    #[test]
    fn subcommands_show_the_same_version() {
        let err = Cli::try_parse_from(["xlb", "status", "--version"]).unwrap_err();
        assert!(
            err.render().to_string().contains(long()),
            "{}",
            err.render()
        );
    }
}
