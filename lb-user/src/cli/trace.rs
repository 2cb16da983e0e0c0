//! `xlb trace`: its arguments. The trace itself (pins, loop, output) is in
//! `crate::trace`.

use std::path::PathBuf;

use clap::Args;

use crate::cli::blocks::parse_prefix;
use crate::guard::Prefix;
use crate::trace::filter::{TraceFilter, VipFilter, parse_verdicts, parse_vip};

/// Show the verdict, and why, for live packets of the load balancer.
#[derive(Debug, PartialEq, Args)]
pub struct TraceArgs {
    /// Only packets to this VIP: ADDR or ADDR:PORT ([IPv6]:PORT).
    #[arg(long, value_name = "ADDR[:PORT]", value_parser = parse_vip)]
    pub vip: Option<VipFilter>,
    /// Only packets from this source: an address or a prefix
    /// (192.0.2.0/24, 2001:db8:1:2::/64).
    #[arg(long, value_name = "PREFIX", value_parser = parse_prefix)]
    pub source: Option<Prefix>,
    /// Only these verdicts: drop, pass, tx (forwarded, redirects included)
    /// or all; several joined by commas.
    #[arg(long, value_name = "drop|pass|tx|all", default_value = "all", value_parser = parse_verdicts)]
    pub verdict: u8,
    /// Exit after N packets (else run until Ctrl-C).
    #[arg(long, short = 'n', value_name = "N")]
    pub count: Option<u64>,
    /// Trace one of every N matching packets, at random.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub sample: u32,
    /// One JSON object per packet and line.
    #[arg(long)]
    pub json: bool,
    /// Instance name (daemon.instance): whose pinned maps to read.
    #[arg(long, value_name = "NAME", conflicts_with = "config")]
    pub instance: Option<String>,
    /// Take the instance name from this configuration file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

impl TraceArgs {
    /// The filters the data plane applies.
    pub fn filter(&self) -> TraceFilter {
        TraceFilter {
            vip: self.vip,
            source: self.source,
            verdicts: self.verdict,
            sample: self.sample,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<super::TraceArgs, String> {
        let mut argv = vec!["xlb", "trace"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv) {
            Ok(Cli {
                command: Command::Trace(t),
                ..
            }) => Ok(t),
            Ok(other) => Err(format!("{other:?}")),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn arguments() {
        let t = parse(&[
            "--vip",
            "10.100.0.1:80",
            "--source",
            "192.0.2.0/24",
            "-n",
            "3",
        ])
        .unwrap();
        assert_eq!(t.count, Some(3));
        let f = t.filter();
        assert_eq!(f.vip.unwrap().port, Some(80));
        assert_eq!(f.source.unwrap().len, 24);
        assert_eq!(f.verdicts, lb_common::trace::TRACE_VERDICT_ALL);
        assert_eq!(f.sample, 1);
        let t = parse(&["--verdict", "drop", "--json", "--instance", "edge"]).unwrap();
        assert_eq!(t.verdict, lb_common::trace::TRACE_VERDICT_DROP);
        assert!(t.json);
        let cases = [
            (
                &["--verdict", "dropped"][..],
                "\"dropped\" is not a verdict",
            ),
            (&["--source", "192.0.2.1/24"][..], "has host bits set"),
            (&["--vip", "api"][..], "\"api\" is not a VIP address"),
            (&["--sample", "0"][..], "0 is not in 1.."),
            (
                &["--instance", "a", "--config", "x.toml"][..],
                "cannot be used with",
            ),
        ];
        for (args, want) in cases {
            let e = parse(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }
}
