//! NAT mode in `xlb-tput-bench` (issue 27: live frames on the LB's CPU,
//! NAT against nftables DNAT + masquerade doing the same job): the
//! nftables half.
//!
//! The kernel reference translates both addresses as xlb's NAT mode does:
//! the `numgen random mod 3` DNAT of the VIP that the DSR comparison
//! already installs (`tput::topo::NatTable`), plus this table's
//! masquerade of what was DNATed, so the backends answer the LB, not the
//! client. Masquerade rather than SNAT to a fixed address: it is what an
//! operator writes, and it picks the outgoing interface's address, the
//! LB's own.

use std::{
    io::Write as _,
    process::{Command, Stdio},
};

use anyhow::Context as _;

/// The case's name in the report.
pub const NFT_MASQ: &str = "nftables DNAT + masquerade (full NAT)";

/// The masquerade table's name (family `ip`), apart from the DNAT one.
const TABLE: &str = "xlb_tput_masq";

/// The table: masquerade every connection that conntrack DNATed, on its
/// way out (postrouting, source-NAT priority).
pub fn masquerade_ruleset(table: &str) -> String {
    format!(
        "table ip {table} {{\n\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tct status dnat masquerade\n\
         \t}}\n\
         }}\n"
    )
}

/// The masquerade table in namespace `ns`, deleted on drop.
pub struct Masquerade {
    ns: String,
}

impl Masquerade {
    /// Installs the table in `ns` (one `nft -f` transaction).
    ///
    /// # Errors
    ///
    /// `nft` is missing or refuses the table.
    pub fn add(ns: &str) -> anyhow::Result<Self> {
        nft(ns, &["-f", "-"], Some(&masquerade_ruleset(TABLE)))?;
        Ok(Self { ns: ns.to_string() })
    }
}

impl Drop for Masquerade {
    fn drop(&mut self) {
        if let Err(e) = nft(&self.ns, &["delete", "table", "ip", TABLE], None) {
            eprintln!("xlb-tput-bench: {e:#}");
        }
    }
}

/// Runs `nft ARGS` in `ns`, `stdin` fed to it.
fn nft(ns: &str, args: &[&str], stdin: Option<&str>) -> anyhow::Result<()> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft (Debian package `nftables`; `cargo xtask setup` installs it)")?;
    let mut input = child.stdin.take().context("nft stdin")?;
    if let Some(s) = stdin {
        input.write_all(s.as_bytes())?;
    }
    drop(input);
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "nft {} in {ns} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masquerade_takes_only_what_was_dnated() {
        let rules = masquerade_ruleset("t");
        for want in [
            "table ip t {",
            "type nat hook postrouting priority srcnat; policy accept;",
            "ct status dnat masquerade",
        ] {
            assert!(rules.contains(want), "{want:?} missing from:\n{rules}");
        }
    }
}
