//! The flooder's wire: a switch at the bridge port of the flooding client
//! (`v-fl` in `{p}-br`) that forwards its TCP to the segment or drops it
//! there, before any other host sees a packet (nftables, `bridge` family,
//! forward hook). ARP, neighbour discovery and everything but TCP always
//! pass, so the flooder's neighbour entries stay fresh across a switch.
//!
//! The abuse tests use it to take a flood off the load balancer while the
//! flooder keeps running: in a 2-CPU lab the flooding client's own kernel
//! work (its sockets, its SYNs, its timers) shares the CPUs with the
//! well-behaved client and the backends, which a real attacker, on another
//! machine, cannot do. With the flood dropped at its own wire, what the
//! well-behaved client sees is the attacker's cost; with it forwarded, the
//! attacker's cost plus what the flood costs the service. Both states have
//! one rule with one counter, so the bridge does the same work per frame
//! either way.
//!
//! One table per lab, `xlb_wire`, removed with the switch (and with the
//! bridge namespace in any case).

use std::process::Command;

use super::{
    Lab, LabError, Result,
    netns::{describe, run},
};

/// Name of the nftables table (family `bridge`) in the bridge namespace.
const TABLE: &str = "xlb_wire";
/// Its one chain.
const CHAIN: &str = "wire";
/// The named counters: TCP frames from the port forwarded, and dropped.
const PASSED: &str = "passed";
const DROPPED: &str = "dropped";

/// The switch on one bridge port; see the module documentation. Dropping
/// it removes the table (forwarding everything again).
#[derive(Debug)]
pub struct WireSwitch {
    ns: String,
    port: String,
}

/// TCP frames the switch forwarded and dropped since it was installed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireCounts {
    pub passed: u64,
    pub dropped: u64,
}

impl WireCounts {
    /// What was counted between `before` and these counts.
    pub fn since(&self, before: &Self) -> Self {
        Self {
            passed: self.passed - before.passed,
            dropped: self.dropped - before.dropped,
        }
    }
}

impl Lab {
    /// Installs a [`WireSwitch`] on the flooding client's bridge port,
    /// forwarding.
    ///
    /// # Errors
    ///
    /// The lab has no flooder, or `nft` failed (not installed: Debian
    /// package `nftables`, which `cargo xtask setup` installs).
    pub fn flood_wire(&self) -> Result<WireSwitch> {
        if self.ns_flood().is_none() {
            return Err(LabError::InvalidConfig {
                reason: "this lab has no flooding client (LabConfig::flooder)".to_string(),
            });
        }
        WireSwitch::install(&self.ns_bridge(), "v-fl")
    }
}

impl WireSwitch {
    /// Creates the table on bridge port `port` in namespace `ns`,
    /// forwarding.
    fn install(ns: &str, port: &str) -> Result<Self> {
        let s = Self {
            ns: ns.to_string(),
            port: port.to_string(),
        };
        s.nft(&format!(
            "add table bridge {TABLE}; \
             add counter bridge {TABLE} {PASSED}; \
             add counter bridge {TABLE} {DROPPED}; \
             add chain bridge {TABLE} {CHAIN} {{ type filter hook forward priority 0; }}; \
             {}",
            s.rule(false)
        ))?;
        Ok(s)
    }

    /// Drops the port's TCP at the bridge (`true`) or forwards it
    /// (`false`), in one nftables transaction.
    ///
    /// # Errors
    ///
    /// `nft` failed.
    pub fn set_dropping(&self, dropping: bool) -> Result<()> {
        self.nft(&format!(
            "flush chain bridge {TABLE} {CHAIN}; {}",
            self.rule(dropping)
        ))
        .map(drop)
    }

    /// The counts since [`Lab::flood_wire`].
    ///
    /// # Errors
    ///
    /// `nft` failed, or printed what this does not read.
    pub fn counts(&self) -> Result<WireCounts> {
        Ok(WireCounts {
            passed: self.counter(PASSED)?,
            dropped: self.counter(DROPPED)?,
        })
    }

    fn rule(&self, dropping: bool) -> String {
        let (counter, verdict) = if dropping {
            (DROPPED, "drop")
        } else {
            (PASSED, "accept")
        };
        format!(
            "add rule bridge {TABLE} {CHAIN} iifname \"{}\" meta l4proto tcp counter name \"{counter}\" {verdict}",
            self.port
        )
    }

    fn counter(&self, name: &str) -> Result<u64> {
        let out = self.nft(&format!("list counter bridge {TABLE} {name}"))?;
        parse_packets(&out).ok_or_else(|| LabError::Parse {
            cmd: format!("nft list counter bridge {TABLE} {name} in {}", self.ns),
            output: out,
        })
    }

    fn nft(&self, script: &str) -> Result<String> {
        let mut cmd: Command = Lab::exec(&self.ns, ["nft", script]);
        run(&mut cmd).map_err(|e| match e {
            LabError::Spawn { source, .. } => LabError::Spawn {
                cmd: format!(
                    "{} (nft is the Debian package `nftables`; `cargo xtask setup` installs it)",
                    describe(&cmd)
                ),
                source,
            },
            e => e,
        })
    }
}

impl Drop for WireSwitch {
    fn drop(&mut self) {
        if let Err(e) = self.nft(&format!("delete table bridge {TABLE}")) {
            eprintln!(
                "xlb-lab: could not remove the wire switch on {} in {}: {e}",
                self.port, self.ns
            );
        }
    }
}

/// The packet count in `nft list counter` output (`packets N bytes M`).
fn parse_packets(out: &str) -> Option<u64> {
    let mut words = out.split_whitespace();
    words.find(|w| *w == "packets")?;
    words.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_packet_count() {
        let out =
            "table bridge xlb_wire {\n\tcounter dropped {\n\t\tpackets 4096 bytes 245760\n\t}\n}\n";
        assert_eq!(parse_packets(out), Some(4096));
        assert_eq!(parse_packets("counter x { }"), None);
        assert_eq!(parse_packets("packets many bytes 1"), None);
    }

    #[test]
    fn rules_differ_only_in_counter_and_verdict() {
        let s = WireSwitch {
            ns: "x-br".into(),
            port: "v-fl".into(),
        };
        let pass = s.rule(false);
        let drop = s.rule(true);
        assert!(pass.contains("iifname \"v-fl\" meta l4proto tcp"), "{pass}");
        assert!(pass.ends_with("counter name \"passed\" accept"), "{pass}");
        assert!(drop.ends_with("counter name \"dropped\" drop"), "{drop}");
        // Not to run `nft delete table` in a namespace this test never made.
        std::mem::forget(s);
    }
}
