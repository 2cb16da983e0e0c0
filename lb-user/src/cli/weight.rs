//! `xlb weight VIP BACKEND N`: change a backend's weight live.

use clap::Args;

use crate::ctl::Request;

/// The arguments of `xlb weight`.
#[derive(Debug, PartialEq, Args)]
pub struct WeightArgs {
    /// VIP name, as in the configuration.
    pub vip: String,
    /// Backend address: IP:PORT, [IPv6]:PORT, or just the IP.
    pub backend: String,
    /// The new weight, 0 to 1000 as in the configuration (0 takes no new
    /// flows). The configured weight removes the override.
    #[arg(value_parser = parse_weight, allow_hyphen_values = true, value_name = "N")]
    pub weight: u32,
    /// Print the daemon's answer as JSON.
    #[arg(long)]
    pub json: bool,
    /// Which daemon.
    #[command(flatten)]
    pub target: crate::cli::target::ClientTarget,
}

impl WeightArgs {
    pub fn request(&self) -> Request {
        Request::Weight {
            vip: self.vip.clone(),
            backend: self.backend.clone(),
            weight: self.weight,
        }
    }
}

/// A whole number; the daemon checks its range (and words a refusal as
/// `xlb check-config` does).
pub fn parse_weight(s: &str) -> Result<u32, String> {
    s.parse::<u32>().map_err(|_| {
        format!(
            "{s:?} is not a weight; use a whole number, 0 to {} (weights are relative; 0 \
             takes no new flows)",
            crate::config::MAX_WEIGHT
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_parse() {
        let bad = |s: &str| {
            format!(
                "{s:?} is not a weight; use a whole number, 0 to 1000 (weights are relative; 0 \
                 takes no new flows)"
            )
        };
        // (input, result)
        let cases = [
            ("0", Ok(0)),
            ("3", Ok(3)),
            // Out of range is the daemon's to refuse, in its words.
            ("1001", Ok(1001)),
            ("-1", Err(bad("-1"))),
            ("1.5", Err(bad("1.5"))),
            ("", Err(bad(""))),
        ];
        for (input, want) in cases {
            assert_eq!(parse_weight(input), want, "{input:?}");
        }
    }

    #[test]
    fn status_text_shows_an_override_and_the_configured_weight() {
        use crate::ctl::tests::{SAMPLE_NOW_MS, sample_report};
        let mut report = sample_report();
        let b = &mut report.vips[0].backends[0];
        b.weight = 3;
        b.configured_weight = Some(1);
        let text = crate::cli::render_status(&report, SAMPLE_NOW_MS, false);
        let line = text.lines().find(|l| l.contains("10.99.0.11:80")).unwrap();
        assert!(
            line.contains("ok 200 in 1.2ms  (weight 3 by xlb weight, configured 1)"),
            "{line}"
        );
        // Without an override, a weight of 1 says nothing.
        let plain = crate::cli::render_status(&sample_report(), SAMPLE_NOW_MS, false);
        assert!(!plain.contains("by xlb weight"), "{plain}");
    }
}
