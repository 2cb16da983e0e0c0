//! `xlb sources`: per VIP, its new flows per second and tracked sources,
//! then a table of its heaviest sources.

use std::fmt::Write as _;

use clap::Subcommand;

use super::{Cell, Style, paint, rate, table};
use crate::ctl::{Request, SourceVerdict, VipSources};

#[derive(Debug, PartialEq, Subcommand)]
pub enum SourcesCommand {
    /// Show the heaviest sources of each VIP: new flows, packets and
    /// rate-limited flows per second, share, and whether each is limited,
    /// blocked or allowed.
    Sources {
        /// Only this VIP.
        #[arg(long, value_name = "NAME")]
        vip: Option<String>,
        /// Print the daemon's report as JSON.
        #[arg(long)]
        json: bool,
        /// Which daemon.
        #[command(flatten)]
        target: super::target::ClientTarget,
    },
}

impl SourcesCommand {
    pub fn request(&self) -> Request {
        let SourcesCommand::Sources { vip, .. } = self;
        Request::Sources { vip: vip.clone() }
    }

    /// Whether the answer is printed as JSON.
    pub fn json(&self) -> bool {
        let SourcesCommand::Sources { json, .. } = self;
        *json
    }
}

/// `xlb sources`: one block per VIP; the tables of all VIPs share their
/// columns.
pub fn render_sources(report: &[VipSources], color: bool) -> String {
    let mut out = String::new();
    if report.is_empty() {
        out.push_str("no VIPs configured\n");
        return out;
    }
    let header = ["PREFIX", "NEW/S", "PKT/S", "LIMITED/S", "SHARE", "VERDICT"];
    let mut rows = vec![header.map(Cell::plain).into()];
    for v in report {
        rows.extend(v.sources.iter().map(|s| {
            vec![
                Cell::plain(s.prefix.clone()),
                Cell::plain(rate(s.new_flows_per_s)),
                Cell::plain(rate(s.packets_per_s)),
                Cell::plain(rate(s.limited_per_s)),
                Cell::plain(format!("{:.0}%", s.share * 100.0)),
                verdict_cell(s.verdict),
            ]
        }));
    }
    let mut body = String::new();
    table(&mut body, "  ", &rows, color);
    let lines: Vec<&str> = body.lines().collect();
    let mut next = 1;
    for (i, v) in report.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "{}  new flows {}/s  tracked {}",
            paint(&format!("VIP {}", v.vip), Style::Bold, color),
            rate(v.new_flows_per_s),
            v.tracked
        );
        if v.sources.is_empty() {
            out.push_str("  no source opened flows or sent packets in the last second\n");
            continue;
        }
        out.push_str(lines[0]);
        out.push('\n');
        for line in &lines[next..next + v.sources.len()] {
            out.push_str(line);
            out.push('\n');
        }
        next += v.sources.len();
    }
    out
}

fn verdict_cell(v: SourceVerdict) -> Cell {
    match v {
        SourceVerdict::Ok => Cell::plain("ok"),
        SourceVerdict::Limited => Cell::styled("limited", Style::Yellow),
        SourceVerdict::Blocked => Cell::styled("blocked", Style::Red),
        SourceVerdict::Allowed => Cell::styled("allowed", Style::Green),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::SourceRow;

    fn row(prefix: &str, nf: f64, pk: f64, lim: f64, share: f64, v: SourceVerdict) -> SourceRow {
        SourceRow {
            prefix: prefix.to_owned(),
            new_flows_per_s: nf,
            packets_per_s: pk,
            limited_per_s: lim,
            share,
            verdict: v,
        }
    }

    #[test]
    fn sources_command_line() {
        use clap::Parser as _;

        use crate::cli::{Cli, Command};
        let cases: [(&[&str], Option<&str>, bool); 3] = [
            (&["xlb", "sources"], None, false),
            (&["xlb", "sources", "--vip", "api"], Some("api"), false),
            (
                &["xlb", "sources", "--json", "--vip", "web"],
                Some("web"),
                true,
            ),
        ];
        for (args, vip, json) in cases {
            let cli = Cli::try_parse_from(args).unwrap();
            let Command::Sources(s) = &cli.command else {
                panic!("{args:?}: {:?}", cli.command);
            };
            assert_eq!(s.json(), json, "{args:?}");
            assert_eq!(
                cli.command.request(),
                Some(Request::Sources {
                    vip: vip.map(str::to_owned)
                }),
                "{args:?}"
            );
        }
        assert!(Cli::try_parse_from(["xlb", "sources", "api"]).is_err());
    }

    #[test]
    fn sources_table_per_vip() {
        let report = [
            VipSources {
                vip: "api".to_owned(),
                new_flows_per_s: 1250.0,
                tracked: 812,
                sources: vec![
                    row(
                        "198.51.100.7/32",
                        1000.0,
                        1100.0,
                        800.0,
                        0.8,
                        SourceVerdict::Limited,
                    ),
                    row(
                        "2001:db8:1:2::/64",
                        120.0,
                        4032.0,
                        0.0,
                        0.096,
                        SourceVerdict::Ok,
                    ),
                    row("192.0.2.7/32", 0.0, 2.5, 0.0, 0.0, SourceVerdict::Blocked),
                ],
            },
            VipSources {
                vip: "web".to_owned(),
                new_flows_per_s: 0.0,
                tracked: 3,
                sources: vec![],
            },
        ];
        let want = "\
VIP api  new flows 1.2k/s  tracked 812
  PREFIX             NEW/S  PKT/S  LIMITED/S  SHARE  VERDICT
  198.51.100.7/32    1.0k   1.1k   800        80%    limited
  2001:db8:1:2::/64  120    4.0k   0          10%    ok
  192.0.2.7/32       0      2.5    0          0%     blocked

VIP web  new flows 0/s  tracked 3
  no source opened flows or sent packets in the last second
";
        assert_eq!(render_sources(&report, false), want);
        let colored = render_sources(&report, true);
        assert!(colored.contains("\x1b[31mblocked\x1b[0m"), "{colored}");
        assert_eq!(render_sources(&[], false), "no VIPs configured\n");
    }
}
