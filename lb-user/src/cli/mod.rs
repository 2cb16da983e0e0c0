//! The `xlb` command line: arguments (clap derive; the `///` comments are the
//! help text) and the pure functions that turn protocol answers into what
//! an operator reads. `main.rs` does the I/O.

pub mod announce;
pub mod blocks;
pub mod decap;
mod drain;
mod events;
mod explain;
pub mod follow;
pub mod generate;
mod nat;
pub mod peers;
pub mod sources;
pub mod target;
pub mod top;
pub mod trace;
pub mod weight;

pub use drain::{DrainProgress, drain_progress};
pub use events::{format_utc, render_event, render_events};
pub use explain::render_explain;

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::config::{self, Config, ConfigErrors};
use crate::ctl::{BackendStatus, Protocol, Request, StatusReport, VipStatus};

/// xlb: an XDP layer-4 load balancer (Maglev hashing, direct server return).
#[derive(Debug, Parser)]
#[command(
    name = "xlb",
    version = crate::version::long(),
    propagate_version = true
)]
pub struct Cli {
    /// `xlb --socket PATH status`, as scripts wrote it when --socket was
    /// global: still accepted before a client command, hidden (each client
    /// command has its own --socket; see `target`).
    #[arg(long, value_name = "PATH", hide = true)]
    pub socket: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, PartialEq, Subcommand)]
pub enum Command {
    /// Run the daemon.
    ///
    /// Attaches the load balancer to the configured interface, health-checks
    /// backends, and serves the control socket and metrics. Stopping it leaves
    /// the data plane forwarding with the last state (`xlb detach` removes it).
    Run {
        /// The configuration file.
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
        /// Logs on stderr as text (colour only on a terminal) or JSON (one
        /// object per line, for log pipelines).
        #[arg(long, value_enum, value_name = "FORMAT", default_value_t)]
        log_format: crate::logging::LogFormat,
    },
    /// Check a configuration file.
    ///
    /// Prints every problem (and exits with 1), or a summary and any warnings.
    CheckConfig {
        /// The configuration file.
        #[arg(value_name = "FILE", required_unless_present = "config")]
        file: Option<PathBuf>,
        /// The configuration file, as `run -c` takes it.
        #[arg(long, short, value_name = "FILE", conflicts_with = "file")]
        config: Option<PathBuf>,
    },
    /// Check before restarting onto this binary (an upgrade): whether the
    /// restart keeps every established flow, and whether the host has the
    /// interface and socket_group the configuration names.
    ///
    /// Compares this binary's map layout version (`xlb --version`) and the
    /// configuration's conntrack_size and max_table_size with the maps
    /// pinned for the instance. Exits with 1 if flows would be lost or the
    /// host is not ready. Run it as root.
    CheckUpgrade {
        /// The configuration the restarted daemon will run.
        #[arg(long, short, value_name = "FILE", default_value = "/etc/xlb/xlb.toml")]
        config: PathBuf,
    },
    /// Show the daemon, its VIPs and their backends.
    Status {
        /// Print the daemon's report as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        watch: top::WatchArgs,
        /// Which daemon.
        #[command(flatten)]
        target: target::ClientTarget,
    },
    /// A full-screen live view: VIPs, backends, rates and the latest events.
    ///
    /// Refreshes every --interval over the control socket. Keys: s sorts
    /// by the next column, v shows the next VIP, / types a VIP's name, p
    /// pauses, ? lists the keys, q, Esc or Ctrl-C quits.
    Top(top::TopArgs),
    /// Show recent events: state changes, table rebuilds, drains, reloads.
    Events {
        /// Keep running and print each new event as it happens; when the
        /// daemon restarts, reconnect (for up to 30 s) and go on after the
        /// last event printed.
        #[arg(long, short)]
        follow: bool,
        /// Only events after SEQ (the number of the last event you saw).
        #[arg(long, value_name = "SEQ")]
        since: Option<u64>,
        /// Print events as JSON (with --follow, one object per line).
        #[arg(long)]
        json: bool,
        /// Which daemon.
        #[command(flatten)]
        target: target::ClientTarget,
    },
    /// Stop sending new flows to a backend; established flows continue.
    ///
    /// Lasts until `xlb enable`, whatever health checks say. With
    /// --deadline, the backend goes down when it passes: its remaining
    /// flows then follow the VIP's down_policy.
    Drain {
        /// VIP name, as in the configuration.
        vip: String,
        /// Backend address: IP:PORT, [IPv6]:PORT, or just the IP.
        #[arg(value_parser = parse_backend)]
        backend: String,
        /// Wait until the backend has no established flows (or its deadline
        /// passes), printing the count as it falls. A flow counts until 30 s
        /// after its last packet. Ctrl-C stops waiting, not the drain.
        #[arg(long)]
        wait: bool,
        /// After this long (e.g. 30s, 5m, 1h) the backend goes down and its
        /// remaining flows follow the VIP's down_policy. Survives restarts;
        /// `xlb enable` cancels it.
        #[arg(long, value_name = "DURATION", value_parser = parse_deadline)]
        deadline: Option<Duration>,
        /// Which daemon.
        #[command(flatten)]
        target: target::ClientTarget,
    },
    /// Undo `xlb drain`: the backend takes new flows again once healthy.
    Enable {
        /// VIP name, as in the configuration.
        vip: String,
        /// Backend address: IP:PORT, [IPv6]:PORT, or just the IP.
        #[arg(value_parser = parse_backend)]
        backend: String,
        /// Which daemon.
        #[command(flatten)]
        target: target::ClientTarget,
    },
    /// Show which backend a flow goes to, and why.
    Explain {
        /// tcp or udp.
        #[arg(value_parser = parse_protocol, value_name = "tcp|udp")]
        protocol: Protocol,
        /// The client's address and port, e.g. 192.0.2.10:51234.
        #[arg(value_parser = parse_endpoint, value_name = "SRC_IP:PORT")]
        client: SocketAddr,
        /// The VIP's address and port, e.g. 10.100.0.1:80.
        #[arg(value_parser = parse_endpoint, value_name = "VIP:PORT")]
        vip: SocketAddr,
        /// Print the daemon's report as JSON.
        #[arg(long)]
        json: bool,
        /// Which daemon.
        #[command(flatten)]
        target: target::ClientTarget,
    },
    /// Re-read the configuration file and apply the changes (as SIGHUP does).
    Reload {
        /// Which daemon.
        #[command(flatten)]
        target: target::ClientTarget,
    },
    /// Remove the XDP program and pinned maps that `xlb run` left behind.
    ///
    /// Established flows stop being balanced at once. Stop `xlb run` first:
    /// while it runs (it holds the instance lock) detach is refused.
    Detach {
        /// Instance name (daemon.instance).
        #[arg(long, value_name = "NAME", conflicts_with = "config")]
        instance: Option<String>,
        /// Take the instance name from this configuration file.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Detach even while `xlb run` runs the instance (it then runs
        /// with nothing attached until restarted).
        #[arg(long)]
        force: bool,
        /// With [announce]: after deleting the instance's routes (the
        /// routers stop sending flows here), wait this long before
        /// detaching XDP, so flows move to the other nodes first.
        #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = announce::parse_withdraw_wait)]
        withdraw_wait: Duration,
    },
    /// On a backend: decapsulate dsr-ipip traffic in XDP.
    ///
    /// Strips the IPIP / IPv6-in-IPv6 header of packets to this host, so no
    /// tunnel interface is needed, if they come from an allowed load
    /// balancer (--allow-source) and carry a packet to a VIP this backend
    /// serves (--vip); drops other tunnels to this host. Runs until stopped.
    Decap(decap::DecapArgs),
    /// Attach an XDP program that passes every packet (the peer of a veth).
    ///
    /// A veth delivers frames that the other end sent with XDP_TX or a
    /// redirect only if this end runs an XDP program: when `xlb run` is
    /// attached to a veth, run this on its peer (in the peer's namespace),
    /// or every forwarded frame is dropped (`xlb status` says so with an
    /// alarm). Runs until stopped.
    #[command(name = "xdp-pass")]
    XdpPass {
        /// Interface to attach to.
        #[arg(long, short, value_name = "IF")]
        interface: String,
    },
    /// Show the verdict, and its reason, for live packets.
    ///
    /// Prints one line per packet: time, verdict (drop, pass, tx,
    /// redirect), the reason counter it bumped, protocol, source ->
    /// destination, the backend and flags (ct hit, picked, second chance).
    /// Reads the pinned maps directly (root). One trace at a time; tracing
    /// stops when this exits (or within 3 s if it is killed).
    Trace(trace::TraceArgs),
    #[command(flatten)]
    Guard(blocks::GuardCommand),
    #[command(flatten)]
    Sources(sources::SourcesCommand),
    #[command(flatten)]
    Peers(peers::PeersCommand),
    #[command(flatten)]
    Announce(announce::AnnounceCommand),
    /// Write shell completions or man pages (for packaging).
    #[command(hide = true)]
    Generate {
        #[command(subcommand)]
        what: generate::Generate,
    },
    /// Change a backend's weight live: the VIP's table is rebuilt at once.
    ///
    /// Kept across restarts until the configuration changes that backend's
    /// weight (a reload or restart then drops the override and says so).
    /// `xlb status` shows the override and the configured weight.
    Weight(weight::WeightArgs),
}

impl Command {
    /// How the command logs: `--log-format` of `run` and `decap`, text
    /// for every other.
    pub fn log_format(&self) -> crate::logging::LogFormat {
        match self {
            Command::Run { log_format, .. } => *log_format,
            Command::Decap(d) => d.log_format,
            _ => crate::logging::LogFormat::Text,
        }
    }

    /// The control request of a client command; `None` for commands that
    /// do not talk to the daemon.
    pub fn request(&self) -> Option<Request> {
        Some(match self {
            Command::Status { .. } => Request::Status,
            Command::Events { follow, since, .. } => Request::Events {
                since_seq: *since,
                follow: *follow,
            },
            Command::Drain {
                vip,
                backend,
                deadline,
                ..
            } => Request::Drain {
                vip: vip.clone(),
                backend: backend.clone(),
                // Rounded up: a sub-millisecond deadline is not "now".
                deadline_ms: deadline.map(|d| d.as_nanos().div_ceil(1_000_000) as u64),
            },
            Command::Enable { vip, backend, .. } => Request::Enable {
                vip: vip.clone(),
                backend: backend.clone(),
            },
            Command::Explain {
                protocol,
                client,
                vip,
                ..
            } => Request::Explain {
                protocol: *protocol,
                client: *client,
                vip: *vip,
            },
            Command::Reload { .. } => Request::Reload,
            Command::Sources(s) => s.request(),
            Command::Guard(g) => g.request(),
            Command::Announce(a) => a.request(),
            Command::Weight(w) => w.request(),
            Command::Run { .. }
            | Command::Top(_)
            | Command::Peers(_)
            | Command::CheckConfig { .. }
            | Command::CheckUpgrade { .. }
            | Command::Detach { .. }
            | Command::Decap(_)
            | Command::Trace(_)
            | Command::XdpPass { .. }
            | Command::Generate { .. } => return None,
        })
    }
}

/// A backend as `drain` and `enable` name it (the daemon checks the same).
pub fn parse_backend(s: &str) -> Result<String, String> {
    crate::ctl::check_backend_name(s)?;
    Ok(s.to_owned())
}

/// `tcp` or `udp`, any case.
pub fn parse_protocol(s: &str) -> Result<Protocol, String> {
    match s.to_ascii_lowercase().as_str() {
        "tcp" => Ok(Protocol::Tcp),
        "udp" => Ok(Protocol::Udp),
        _ if s.contains(':') || s.parse::<IpAddr>().is_ok() => Err(
            "the protocol comes first: xlb explain tcp|udp SRC_IP:PORT VIP:PORT, \
             e.g. xlb explain tcp 192.0.2.10:51234 10.100.0.1:80"
                .to_owned(),
        ),
        _ => Err("the protocol is tcp or udp".to_owned()),
    }
}

/// A drain deadline: a duration as in the configuration (`30s`, `5m`,
/// `1h`), more than zero.
pub fn parse_deadline(s: &str) -> Result<Duration, String> {
    let d = config::parse_duration(s)?;
    if d.is_zero() {
        return Err(
            "a deadline of 0 would send the backend's flows away at once; give a positive \
             duration, e.g. 5m, or leave --deadline out to drain without one"
                .to_owned(),
        );
    }
    Ok(d)
}

/// `IP:PORT` or `[IPv6]:PORT`, with a message that says what is missing.
pub fn parse_endpoint(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let bare = s
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(s);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Err(match ip {
            IpAddr::V4(_) => format!("no port; write IP:PORT, e.g. {ip}:80"),
            IpAddr::V6(_) => format!("no port; write [IPv6]:PORT, e.g. [{ip}]:80"),
        });
    }
    if let Some((host, port)) = s.rsplit_once(':') {
        let unbracketed = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
        let ip_ok = unbracketed.unwrap_or(host).parse::<IpAddr>();
        match ip_ok {
            Ok(IpAddr::V6(_)) if unbracketed.is_none() => {
                return Err(format!("put an IPv6 address in brackets: [{host}]:{port}"));
            }
            Ok(_) if port.parse::<u16>().is_err() => {
                return Err(format!("{port:?} is not a port; use 0 to 65535"));
            }
            Ok(_) => {}
            Err(_) => {
                return Err(format!(
                    "{host:?} is not an IP address (names are not resolved); \
                     write IP:PORT, e.g. 192.0.2.10:51234"
                ));
            }
        }
    }
    Err("not an address and port; write IP:PORT or [IPv6]:PORT, e.g. 192.0.2.10:51234".to_owned())
}

/// `xlb check-config`: the report for a valid file, or every problem.
pub fn check_config(path: &Path) -> Result<String, ConfigErrors> {
    let config = Config::from_file(path)?;
    crate::announce::check_local_addresses(&config, &path.display().to_string())
        .map_err(|problems| ConfigErrors { problems })?;
    crate::config::check_pools_local(&config.vips, &path.display().to_string())
        .map_err(|problems| ConfigErrors { problems })?;
    let backends: usize = config.vips.iter().map(|v| v.backends.len()).sum();
    let mut out = format!(
        "{}: ok ({}, {})\n",
        path.display(),
        plural(config.vips.len(), "VIP"),
        plural(backends, "backend")
    );
    for w in &config.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    Ok(out)
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// ANSI styles, applied only when printing to a terminal.
#[derive(Clone, Copy)]
pub(crate) enum Style {
    Bold,
    Dim,
    Red,
    Green,
    Yellow,
}

pub(crate) fn paint(text: &str, style: Style, color: bool) -> String {
    if !color || text.is_empty() {
        return text.to_owned();
    }
    let code = match style {
        Style::Bold => "1",
        Style::Dim => "2",
        Style::Red => "31",
        Style::Green => "32",
        Style::Yellow => "33",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}

pub(crate) fn state_style(state: &str) -> Style {
    match state {
        "up" | "ramping" => Style::Green,
        "down" | "agent_down" => Style::Red,
        "draining" | "ejected_slow" | "held_down" | "panic_restored" | "agent_drain"
        | "agent_maint" => Style::Yellow,
        _ => Style::Dim,
    }
}

/// A table cell: its text and style. Widths count characters, so "µs" and
/// "→" take one column each.
struct Cell {
    text: String,
    style: Option<Style>,
}

impl Cell {
    fn plain(text: impl Into<String>) -> Self {
        Cell {
            text: text.into(),
            style: None,
        }
    }

    fn styled(text: impl Into<String>, style: Style) -> Self {
        Cell {
            text: text.into(),
            style: Some(style),
        }
    }
}

/// Lays out rows in columns two spaces apart, each line indented by
/// `indent`; the last column is not padded.
fn table(out: &mut String, indent: &str, rows: &[Vec<Cell>], color: bool) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.text.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let mut line = indent.to_owned();
        for (c, cell) in row.iter().enumerate() {
            let text = match cell.style {
                Some(style) => paint(&cell.text, style, color),
                None => cell.text.clone(),
            };
            line.push_str(&text);
            if c + 1 < row.len() {
                let pad = widths[c] - cell.text.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

/// `xlb status`: the daemon line, nonzero drop counters, then each VIP with
/// a table of its backends. `now_unix_ms` dates the FOR column.
pub fn render_status(report: &StatusReport, now_unix_ms: u64, color: bool) -> String {
    let mut out = daemon_lines(report, now_unix_ms, color);
    out.push_str(&announce::status_lines(report));
    if report.vips.is_empty() {
        out.push_str("no VIPs configured: all traffic passes to the host\n");
    }

    // One table for all VIPs, so columns line up across them.
    let mut rows = vec![
        [
            "BACKEND",
            "STATE",
            "FOR",
            "LAST PROBE",
            "OK/FAIL",
            "NEW/S",
            "PKT/S",
            "FLOWS",
        ]
        .map(Cell::plain)
        .into(),
    ];
    let mut vip_rows = Vec::new();
    for vip in &report.vips {
        vip_rows.push(rows.len());
        rows.extend(vip.backends.iter().map(|b| backend_row(b, now_unix_ms)));
    }
    let mut body = String::new();
    table(&mut body, "  ", &rows, color);
    let lines: Vec<&str> = body.lines().collect();
    for (i, vip) in report.vips.iter().enumerate() {
        out.push('\n');
        out.push_str(&vip_line(vip, color));
        out.push('\n');
        out.push_str(&announce::vip_line(vip).unwrap_or_default());
        if vip.backends.is_empty() {
            out.push_str("  no backends\n");
            continue;
        }
        out.push_str(lines[0]);
        out.push('\n');
        for line in &lines[vip_rows[i]..vip_rows[i] + vip.backends.len()] {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The daemon's line (instance, interface, uptime, conntrack, config), and
/// a line of the nonzero drop counters if any.
fn daemon_lines(report: &StatusReport, now_unix_ms: u64, color: bool) -> String {
    let mut out = String::new();
    let ct = &report.conntrack;
    let ct_pct = if ct.capacity > 0 {
        ct.entries as f64 * 100.0 / ct.capacity as f64
    } else {
        0.0
    };
    let _ = write!(
        out,
        "{} on {} ({} XDP)  up {}  conntrack {}/{} ({ct_pct:.1}%)  config {}",
        paint(
            &format!("xlb instance {}", report.instance),
            Style::Bold,
            color
        ),
        report.interface,
        report.xdp_mode,
        span(now_unix_ms.saturating_sub(report.started_unix_ms)),
        ct.entries,
        ct.capacity,
        report.config_path,
    );
    if report.adopted {
        out.push_str(" (adopted pinned state)");
    }
    out.push('\n');
    out.push_str(&nat::daemon_line(report));
    if let Some(alarm) = &report.tx_alarm {
        let _ = writeln!(out, "{} {alarm}", paint("ALARM:", Style::Red, color));
    }
    out.push_str(&peers::node_line(report));
    let drops: Vec<String> = report
        .counters
        .iter()
        .filter(|&(k, &v)| v > 0 && (k.starts_with("drop_") || k == "aborted"))
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    if !drops.is_empty() {
        let _ = writeln!(
            out,
            "{} {}",
            paint("dropped:", Style::Red, color),
            drops.join(", ")
        );
    }
    out
}

fn vip_line(vip: &VipStatus, color: bool) -> String {
    let addr = match vip.address.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!("[{}]:{}", vip.address, vip.port),
        _ => format!("{}:{}", vip.address, vip.port),
    };
    let up = format!("{}/{} up", vip.backends_up, vip.backends_total);
    let up_style = if vip.backends_up == vip.backends_total && vip.backends_total > 0 {
        Style::Green
    } else if vip.backends_up == 0 {
        Style::Red
    } else {
        Style::Yellow
    };
    let mut line = format!(
        "{}  {addr}/{}  {}",
        paint(&format!("VIP {}", vip.name), Style::Bold, color),
        vip.protocol,
        vip.mode,
    );
    if vip.down_policy != "rehash" {
        let _ = write!(line, " (down_policy {})", vip.down_policy);
    }
    let _ = write!(
        line,
        "  {}  table {}  {} pkt/s  {} new/s{}",
        paint(&up, up_style, color),
        vip.table_size,
        rate(vip.packets_per_sec),
        rate(vip.new_flows_per_sec),
        peers::vip_note(vip),
    );
    if let Some(nat) = nat::vip_line(vip) {
        let _ = write!(line, "\n{nat}");
    }
    if let Some(reason) = &vip.panic_reason {
        let _ = write!(line, "\n  {} {reason}", paint("PANIC:", Style::Red, color));
    }
    if let Some(slow) = &vip.fleet_slow {
        let _ = write!(line, "\n  {} {slow}", paint("slow:", Style::Yellow, color));
    }
    line
}

/// The STATE column: the data-plane state, or the policy's placement where
/// it says more (a slow outlier, a held-down flapper, a ramp, panic).
fn state_label(b: &BackendStatus) -> &str {
    match b.placement.as_str() {
        p @ ("ramping" | "ejected_slow" | "held_down" | "panic_restored" | "agent_down"
        | "agent_drain" | "agent_maint") => p,
        _ => &b.state,
    }
}

fn backend_row(b: &BackendStatus, now_unix_ms: u64) -> Vec<Cell> {
    let since = if b.since_unix_ms == 0 {
        "-".to_owned()
    } else {
        span(now_unix_ms.saturating_sub(b.since_unix_ms))
    };
    let (mut probe, probe_style) = match &b.last_probe {
        None => ("not probed yet".to_owned(), None),
        Some(p) if p.ok && p.code == "slow" => (p.reason.clone(), Some(Style::Yellow)),
        Some(p) if p.ok => {
            let status = p.status.map(|s| format!(" {s}")).unwrap_or_default();
            (format!("ok{status} in {}", latency(p.latency_ms)), None)
        }
        Some(p) => (p.reason.clone(), Some(Style::Red)),
    };
    let mut notes = Vec::new();
    if b.admin_drained {
        notes.push(match b.drain_deadline_unix_ms {
            Some(t) if t <= now_unix_ms => "admin drain, deadline passed".to_owned(),
            Some(t) => format!("admin drain, down in {}", span(t - now_unix_ms)),
            None => "admin drain".to_owned(),
        });
    }
    match b.placement.as_str() {
        "ramping" => notes.push(format!(
            "slow start: weight {:.1} of {}",
            b.effective_weight, b.weight
        )),
        "ejected_slow" | "held_down" | "panic_restored" | "agent_down" | "agent_drain"
        | "agent_maint" => {
            notes.extend(b.placement_reason.clone());
        }
        _ if b.weight != 1 && b.configured_weight.is_none() => {
            notes.push(format!("weight {}", b.weight));
        }
        _ => {}
    }
    if let Some(configured) = b.configured_weight {
        notes.push(format!(
            "weight {} by xlb weight, configured {configured}",
            b.weight
        ));
    }
    notes.extend(b.agent.as_ref().and_then(crate::ctl::AgentStatus::note));
    notes.extend(b.passive.as_ref().and_then(crate::ctl::PassiveStatus::note));
    if !notes.is_empty() {
        let _ = write!(probe, "  ({})", notes.join(", "));
    }
    vec![
        Cell::plain(b.address.clone()),
        Cell::styled(state_label(b).to_owned(), state_style(state_label(b))),
        Cell::plain(since),
        Cell {
            text: probe,
            style: probe_style,
        },
        Cell::plain(format!("{}/{}", b.consecutive_ok, b.consecutive_fail)),
        Cell::plain(rate(b.new_flows_per_sec)),
        Cell::plain(rate(b.packets_per_sec)),
        Cell::plain(b.flows.map_or_else(|| "-".to_owned(), |n| n.to_string())),
    ]
}

/// A duration for humans, two units at most: `35s`, `12m4s`, `3h2m`, `2d5h`.
fn span(ms: u64) -> String {
    let s = ms / 1000;
    let (d, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    let two = |a: u64, ua: &str, b: u64, ub: &str| {
        if b == 0 {
            format!("{a}{ua}")
        } else {
            format!("{a}{ua}{b}{ub}")
        }
    };
    if d > 0 {
        two(d, "d", h, "h")
    } else if h > 0 {
        two(h, "h", m, "m")
    } else if m > 0 {
        two(m, "m", s, "s")
    } else {
        format!("{s}s")
    }
}

/// A probe latency: `850µs`, `1.2ms`, `35ms`, `1.5s`.
fn latency(ms: f64) -> String {
    if ms < 1.0 {
        format!("{:.0}µs", ms * 1000.0)
    } else if ms < 10.0 {
        format!("{ms:.1}ms")
    } else if ms < 1000.0 {
        format!("{ms:.0}ms")
    } else {
        format!("{:.1}s", ms / 1000.0)
    }
}

/// A rate: `0`, `0.4`, `35`, `1.2k`, `3.4M`.
fn rate(r: f64) -> String {
    if r <= 0.0 || !r.is_finite() {
        "0".to_owned()
    } else if r < 10.0 && r.fract() != 0.0 {
        format!("{r:.1}")
    } else if r < 1000.0 {
        format!("{r:.0}")
    } else if r < 1e6 {
        format!("{:.1}k", r / 1e3)
    } else if r < 1e9 {
        format!("{:.1}M", r / 1e6)
    } else {
        format!("{:.1}G", r / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::tests::{SAMPLE_NOW_MS, sample_event, sample_report};
    use crate::ctl::{EventKind, ExplainReport};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("xlb").chain(args.iter().copied()))
    }

    #[test]
    fn subcommands_parse() {
        let cases: Vec<(&str, Vec<&str>, Command)> = vec![
            (
                "run",
                vec!["run", "--config", "/etc/xlb.toml"],
                Command::Run {
                    config: "/etc/xlb.toml".into(),
                    log_format: crate::logging::LogFormat::Text,
                },
            ),
            (
                "run -c",
                vec!["run", "-c", "x.toml"],
                Command::Run {
                    config: "x.toml".into(),
                    log_format: crate::logging::LogFormat::Text,
                },
            ),
            (
                "run --log-format json",
                vec!["run", "-c", "x.toml", "--log-format", "json"],
                Command::Run {
                    config: "x.toml".into(),
                    log_format: crate::logging::LogFormat::Json,
                },
            ),
            (
                "check-config",
                vec!["check-config", "x.toml"],
                Command::CheckConfig {
                    file: Some("x.toml".into()),
                    config: None,
                },
            ),
            (
                "check-config -c, as run -c",
                vec!["check-config", "-c", "x.toml"],
                Command::CheckConfig {
                    file: None,
                    config: Some("x.toml".into()),
                },
            ),
            (
                "check-config --config",
                vec!["check-config", "--config", "x.toml"],
                Command::CheckConfig {
                    file: None,
                    config: Some("x.toml".into()),
                },
            ),
            (
                "status",
                vec!["status"],
                Command::Status {
                    target: Default::default(),
                    json: false,
                    watch: top::WatchArgs::default(),
                },
            ),
            (
                "status --json",
                vec!["status", "--json"],
                Command::Status {
                    json: true,
                    watch: top::WatchArgs::default(),
                    target: Default::default(),
                },
            ),
            (
                "events",
                vec!["events"],
                Command::Events {
                    target: Default::default(),
                    follow: false,
                    since: None,
                    json: false,
                },
            ),
            (
                "events all flags",
                vec!["events", "-f", "--since", "42", "--json"],
                Command::Events {
                    target: Default::default(),
                    follow: true,
                    since: Some(42),
                    json: true,
                },
            ),
            (
                "drain",
                vec!["drain", "api", "10.99.0.12:80"],
                Command::Drain {
                    target: Default::default(),
                    vip: "api".into(),
                    backend: "10.99.0.12:80".into(),
                    wait: false,
                    deadline: None,
                },
            ),
            (
                "drain --wait --deadline",
                vec![
                    "drain",
                    "api",
                    "10.99.0.12:80",
                    "--wait",
                    "--deadline",
                    "5m",
                ],
                Command::Drain {
                    target: Default::default(),
                    vip: "api".into(),
                    backend: "10.99.0.12:80".into(),
                    wait: true,
                    deadline: Some(Duration::from_secs(300)),
                },
            ),
            (
                "drain --deadline before the arguments",
                vec!["drain", "--deadline", "1.5s", "api", "10.99.0.12"],
                Command::Drain {
                    target: Default::default(),
                    vip: "api".into(),
                    backend: "10.99.0.12".into(),
                    wait: false,
                    deadline: Some(Duration::from_millis(1500)),
                },
            ),
            (
                "enable v6",
                vec!["enable", "api", "[fd00::2]:80"],
                Command::Enable {
                    target: Default::default(),
                    vip: "api".into(),
                    backend: "[fd00::2]:80".into(),
                },
            ),
            (
                "explain",
                vec!["explain", "tcp", "192.0.2.10:51234", "10.100.0.1:80"],
                Command::Explain {
                    target: Default::default(),
                    protocol: Protocol::Tcp,
                    client: "192.0.2.10:51234".parse().unwrap(),
                    vip: "10.100.0.1:80".parse().unwrap(),
                    json: false,
                },
            ),
            (
                "explain udp v6 json",
                vec![
                    "explain",
                    "UDP",
                    "[2001:db8::1]:5353",
                    "[2001:db8::100]:53",
                    "--json",
                ],
                Command::Explain {
                    target: Default::default(),
                    protocol: Protocol::Udp,
                    client: "[2001:db8::1]:5353".parse().unwrap(),
                    vip: "[2001:db8::100]:53".parse().unwrap(),
                    json: true,
                },
            ),
            (
                "reload",
                vec!["reload"],
                Command::Reload {
                    target: Default::default(),
                },
            ),
            (
                "detach",
                vec!["detach"],
                Command::Detach {
                    instance: None,
                    config: None,
                    force: false,
                    withdraw_wait: Duration::from_secs(3),
                },
            ),
            (
                "detach instance",
                vec!["detach", "--instance", "prod"],
                Command::Detach {
                    instance: Some("prod".into()),
                    config: None,
                    force: false,
                    withdraw_wait: Duration::from_secs(3),
                },
            ),
            (
                "detach config",
                vec!["detach", "--config", "x.toml"],
                Command::Detach {
                    instance: None,
                    config: Some("x.toml".into()),
                    force: false,
                    withdraw_wait: Duration::from_secs(3),
                },
            ),
            (
                "detach under a running daemon",
                vec!["detach", "--instance", "prod", "--force"],
                Command::Detach {
                    instance: Some("prod".into()),
                    config: None,
                    force: true,
                    withdraw_wait: Duration::from_secs(3),
                },
            ),
        ];
        for (name, args, want) in cases {
            let cli = parse(&args).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(cli.command, want, "{name}");
        }
    }

    #[test]
    fn socket_flag_after_or_before_the_command() {
        let cli = parse(&["status", "--socket", "/tmp/x.sock"]).unwrap();
        let target = cli.command.target().unwrap();
        assert_eq!(target.socket, Some(PathBuf::from("/tmp/x.sock")));
        let cli = parse(&["--socket", "/tmp/y.sock", "reload"]).unwrap();
        assert_eq!(cli.socket, Some(PathBuf::from("/tmp/y.sock")));
    }

    #[test]
    fn bad_arguments_are_explained() {
        let cases: &[(&str, &[&str], &str)] = &[
            (
                "drain of a backend that is not an address",
                &["drain", "api", "notanip"],
                "backend \"notanip\" is not an address; write IP:PORT, [IPv6]:PORT or just the IP",
            ),
            (
                "enable of a backend that is not an address",
                &["enable", "api", "web-1"],
                "backend \"web-1\" is not an address",
            ),
            (
                "protocol missing",
                &["explain", "192.0.2.10:51234", "10.100.0.1:80"],
                "the protocol comes first: xlb explain tcp|udp SRC_IP:PORT VIP:PORT",
            ),
            (
                "unknown protocol",
                &["explain", "sctp", "192.0.2.10:1", "10.0.0.1:80"],
                "the protocol is tcp or udp",
            ),
            (
                "client without port",
                &["explain", "tcp", "192.0.2.10", "10.0.0.1:80"],
                "no port; write IP:PORT, e.g. 192.0.2.10:80",
            ),
            (
                "vip v6 without port",
                &["explain", "tcp", "192.0.2.10:1", "[fd00::1]"],
                "no port; write [IPv6]:PORT, e.g. [fd00::1]:80",
            ),
            (
                "v6 without brackets",
                &["explain", "tcp", "192.0.2.10:1", "fd00::1:99999"],
                "put an IPv6 address in brackets: [fd00::1]:99999",
            ),
            (
                "port out of range",
                &["explain", "tcp", "192.0.2.10:70000", "10.0.0.1:80"],
                "\"70000\" is not a port; use 0 to 65535",
            ),
            (
                "host name",
                &["explain", "tcp", "client.example:80", "10.0.0.1:80"],
                "\"client.example\" is not an IP address (names are not resolved)",
            ),
            (
                "garbage",
                &["explain", "tcp", "nonsense", "10.0.0.1:80"],
                "not an address and port",
            ),
            (
                "missing vip",
                &["explain", "tcp", "192.0.2.10:1"],
                "VIP:PORT",
            ),
            ("drain without backend", &["drain", "api"], "<BACKEND>"),
            (
                "deadline without unit",
                &["drain", "api", "10.0.0.1:80", "--deadline", "5"],
                "\"5\" is not a duration; write a number and a unit (ms, s, m, h or d)",
            ),
            (
                "deadline zero",
                &["drain", "api", "10.0.0.1:80", "--deadline", "0s"],
                "a deadline of 0 would send the backend's flows away at once",
            ),
            (
                "deadline missing its value",
                &["drain", "api", "10.0.0.1:80", "--deadline"],
                "a value is required for '--deadline <DURATION>'",
            ),
            (
                "wait on enable",
                &["enable", "api", "10.0.0.1:80", "--wait"],
                "unexpected argument '--wait'",
            ),
            (
                "detach both",
                &["detach", "--instance", "a", "--config", "b"],
                "cannot be used with",
            ),
            (
                "since not a number",
                &["events", "--since", "last"],
                "invalid digit",
            ),
            ("no command", &[], "Usage"),
        ];
        for (name, args, want) in cases {
            let err = parse(args).expect_err(name).to_string();
            assert!(err.contains(want), "{name}: {want:?} not in {err}");
        }
    }

    #[test]
    fn requests_of_commands() {
        let cli = parse(&["events", "--since", "9", "-f"]).unwrap();
        assert_eq!(
            cli.command.request(),
            Some(Request::Events {
                since_seq: Some(9),
                follow: true
            })
        );
        let cli = parse(&["explain", "udp", "192.0.2.1:5", "10.0.0.1:53"]).unwrap();
        assert_eq!(
            cli.command.request(),
            Some(Request::Explain {
                protocol: Protocol::Udp,
                client: "192.0.2.1:5".parse().unwrap(),
                vip: "10.0.0.1:53".parse().unwrap(),
            })
        );
        assert_eq!(
            parse(&["check-config", "x"]).unwrap().command.request(),
            None
        );
        let drains = [
            ("no deadline", vec![], None),
            ("--wait alone", vec!["--wait"], None),
            ("minutes", vec!["--deadline", "5m"], Some(300_000)),
            (
                "sub-millisecond rounds up",
                vec!["--deadline", "0.5ms"],
                Some(1),
            ),
        ];
        for (name, extra, want) in drains {
            let mut args = vec!["drain", "api", "10.99.0.12:80"];
            args.extend(extra);
            assert_eq!(
                parse(&args).unwrap().command.request(),
                Some(Request::Drain {
                    vip: "api".to_owned(),
                    backend: "10.99.0.12:80".to_owned(),
                    deadline_ms: want,
                }),
                "{name}"
            );
        }
    }

    #[test]
    fn drain_progress_of_status() {
        use DrainProgress::{Done, Gone, Waiting};
        let now = SAMPLE_NOW_MS;
        // The sample's third backend is drained, 37 flows, down in 4 min.
        let with = |f: &dyn Fn(&mut BackendStatus)| {
            let mut r = sample_report();
            f(&mut r.vips[0].backends[2]);
            r
        };
        let cases: Vec<(&str, StatusReport, &str, DrainProgress)> = vec![
            (
                "counting down",
                sample_report(),
                "10.99.0.13:80",
                Waiting("10.99.0.13:80 of vip \"api\": 37 flows".to_owned()),
            ),
            (
                "by address alone",
                with(&|b| b.flows = Some(1)),
                "10.99.0.13",
                Waiting("10.99.0.13:80 of vip \"api\": 1 flow".to_owned()),
            ),
            (
                "not counted yet",
                with(&|b| b.flows = None),
                "10.99.0.13:80",
                Waiting(
                    "10.99.0.13:80 of vip \"api\": flows not counted yet (the daemon walks \
                     conntrack every few seconds)"
                        .to_owned(),
                ),
            ),
            (
                "drained",
                with(&|b| b.flows = Some(0)),
                "10.99.0.13:80",
                Done("10.99.0.13:80 of vip \"api\": 0 flows; drained".to_owned()),
            ),
            (
                "deadline passed",
                with(&|b| {
                    b.state = "down".to_owned();
                    b.flows = Some(5);
                    b.drain_deadline_unix_ms = Some(now - 1000);
                }),
                "10.99.0.13:80",
                Done(
                    "10.99.0.13:80 of vip \"api\": drain deadline passed with 5 flows left; the \
                     backend is down and its remaining flows follow down_policy rehash"
                        .to_owned(),
                ),
            ),
            (
                "deadline reached but not applied yet",
                with(&|b| b.drain_deadline_unix_ms = Some(now)),
                "10.99.0.13:80",
                Waiting("10.99.0.13:80 of vip \"api\": 37 flows".to_owned()),
            ),
            (
                "enabled meanwhile",
                with(&|b| b.admin_drained = false),
                "10.99.0.13:80",
                Gone(
                    "10.99.0.13:80 of vip \"api\" is no longer draining (someone ran `xlb \
                     enable`?); stopped waiting"
                        .to_owned(),
                ),
            ),
            (
                "backend removed",
                sample_report(),
                "10.99.0.99:80",
                Gone(
                    "vip \"api\" no longer has backend 10.99.0.99:80 (reloaded?); stopped waiting"
                        .to_owned(),
                ),
            ),
        ];
        for (name, report, backend, want) in cases {
            assert_eq!(drain_progress(&report, "api", backend, now), want, "{name}");
        }
        assert_eq!(
            drain_progress(&sample_report(), "web", "10.99.0.13:80", now),
            Gone("vip \"web\" is no longer configured (reloaded?); stopped waiting".to_owned())
        );
    }

    /// Issue 39: forwarded frames dropped on transmit show under the
    /// daemon's line while the alarm stands, and not otherwise.
    #[test]
    fn status_shows_the_tx_alarm() {
        let mut report = sample_report();
        let text = render_status(&report, SAMPLE_NOW_MS, false);
        assert!(!text.contains("ALARM:"), "{text}");
        report.tx_alarm = Some("forwarded frames are not leaving: 100 of the 100".into());
        let text = render_status(&report, SAMPLE_NOW_MS, false);
        let second = text.lines().nth(1).unwrap_or_default();
        assert_eq!(
            second,
            "ALARM: forwarded frames are not leaving: 100 of the 100"
        );
    }

    #[test]
    fn status_text() {
        let report = sample_report();
        let text = render_status(&report, SAMPLE_NOW_MS, false);
        // Every drop reason the sample has, in name order, with its value:
        // the line follows the counters as they are added.
        let mut drops: Vec<(&String, &u64)> = report
            .counters
            .iter()
            .filter(|(k, v)| (k.starts_with("drop_") || *k == "aborted") && **v > 0)
            .collect();
        drops.sort();
        let dropped: Vec<String> = drops.iter().map(|(k, v)| format!("{k} {v}")).collect();
        assert!(
            dropped.iter().any(|d| d.starts_with("drop_denied ")),
            "{dropped:?}"
        );
        let want = "\
xlb instance default on eth0 (native XDP)  up 3h2m  conntrack 1234/1048576 (0.1%)  config /etc/xlb/xlb.toml (adopted pinned state)
node lb-a  fingerprint 1f2e3d4c5b6a7988 (hash key 0a1b2c3d4e5f6071)  1 peer
dropped: {}

VIP api  10.100.0.1:80/tcp  dsr-ipip  2/3 up  table 65537  1.2k pkt/s  35 new/s  fingerprint 5a6b7c8d9e0f1a2b
  BACKEND        STATE     FOR    LAST PROBE                                            OK/FAIL  NEW/S  PKT/S  FLOWS
  10.99.0.11:80  up        12m4s  ok 200 in 1.2ms                                       41/0     12     400    3712
  10.99.0.12:80  down      35s    connected, no HTTP response within 1s                 0/7      0      0      -
  10.99.0.13:80  draining  2m     ok 200 in 900µs  (admin drain, down in 4m, weight 2)  60/0     0      834    37
"
        .replace("{}", &dropped.join(", "));
        assert_eq!(text, want, "got:\n{text}");
    }

    #[test]
    fn status_text_shows_the_agent() {
        let mut report = sample_report();
        let vip = &mut report.vips[0];
        vip.backends[0].placement = "agent_drain".to_owned();
        vip.backends[0].state = "draining".to_owned();
        vip.backends[0].placement_reason = Some("agent says \"drain\" (deploy)".to_owned());
        if let Some(a) = vip.backends[0].agent.as_mut() {
            a.weight_percent = 50;
            a.error = Some("unreachable (connection refused): is the agent running?".to_owned());
        }
        let text = render_status(&report, SAMPLE_NOW_MS, false);
        let row = text.lines().find(|l| l.contains("10.99.0.11:80")).unwrap();
        for want in [
            "agent_drain",
            "agent says \"drain\" (deploy)",
            "agent weight 50%",
            "agent: unreachable (connection refused)",
        ] {
            assert!(row.contains(want), "{want:?} in {row}");
        }
    }

    #[test]
    fn status_text_shows_the_policy() {
        let mut report = sample_report();
        let vip = &mut report.vips[0];
        vip.panic = true;
        vip.panic_reason = Some("1 of 3 backends healthy (min_healthy 2); keeping …".to_owned());
        vip.fleet_slow = Some("all 3 backends slow, median 2.5s; not ejecting".to_owned());
        vip.backends[0].placement = "ramping".to_owned();
        vip.backends[0].effective_weight = 0.3;
        vip.backends[1].placement = "ejected_slow".to_owned();
        vip.backends[1].state = "draining".to_owned();
        vip.backends[1].placement_reason = Some("slow outlier: answers in 2s".to_owned());
        let text = render_status(&report, SAMPLE_NOW_MS, false);
        let lines: Vec<&str> = text.lines().collect();
        for want in [
            "  PANIC: 1 of 3 backends healthy (min_healthy 2); keeping …",
            "  slow: all 3 backends slow, median 2.5s; not ejecting",
        ] {
            assert!(lines.contains(&want), "{want:?} in\n{text}");
        }
        let row = |addr: &str| lines.iter().find(|l| l.contains(addr)).copied().unwrap();
        let ramping = row("10.99.0.11:80");
        assert!(
            ramping.contains("ramping") && ramping.contains("(slow start: weight 0.3 of 1)"),
            "{ramping}"
        );
        let ejected = row("10.99.0.12:80");
        assert!(
            ejected.contains("ejected_slow") && ejected.contains("(slow outlier: answers in 2s)"),
            "{ejected}"
        );
    }

    #[test]
    fn status_text_edge_cases() {
        let mut report = sample_report();
        report.counters.clear();
        report.adopted = false;
        let mut empty = report.vips[0].clone();
        empty.name = "v6".to_owned();
        empty.address = "2001:db8::100".to_owned();
        empty.port = 53;
        empty.protocol = "udp".to_owned();
        empty.down_policy = "keep".to_owned();
        empty.backends.clear();
        empty.backends_up = 0;
        empty.backends_total = 0;
        // From a daemon that reports no fingerprint: nothing to show.
        empty.fingerprint.clear();
        empty.packets_per_sec = 0.4;
        empty.new_flows_per_sec = 2_500_000.0;
        report.vips.push(empty);
        report.vips[0].backends[0].last_probe = None;
        report.vips[0].backends[0].since_unix_ms = 0;
        let text = render_status(&report, SAMPLE_NOW_MS, false);
        let lines: Vec<&str> = text.lines().collect();
        assert!(!lines[0].contains("adopted"), "{text}");
        assert!(!text.contains("dropped:"), "{text}");
        assert!(
            lines.contains(&"VIP v6  [2001:db8::100]:53/udp  dsr-ipip (down_policy keep)  0/0 up  table 65537  0.4 pkt/s  2.5M new/s"),
            "{text}"
        );
        assert!(lines.contains(&"  no backends"), "{text}");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("  10.99.0.11:80  up        -    not probed yet   ")),
            "{text}"
        );
        report.vips.clear();
        let text = render_status(&report, SAMPLE_NOW_MS, false);
        assert!(
            text.ends_with("no VIPs configured: all traffic passes to the host\n"),
            "{text}"
        );
    }

    #[test]
    fn status_colors_only_when_asked() {
        let plain = render_status(&sample_report(), SAMPLE_NOW_MS, false);
        assert!(!plain.contains('\x1b'));
        let colored = render_status(&sample_report(), SAMPLE_NOW_MS, true);
        assert!(colored.contains("\x1b[32mup\x1b[0m"), "{colored}");
        assert!(colored.contains("\x1b[31mdown\x1b[0m"), "{colored}");
        assert!(colored.contains("\x1b[33mdraining\x1b[0m"), "{colored}");
        assert!(colored.contains("\x1b[33m2/3 up\x1b[0m"), "{colored}");
        // Stripping the codes gives the plain layout back.
        let stripped = strip_ansi(&colored);
        assert_eq!(stripped, plain);
    }

    fn strip_ansi(s: &str) -> String {
        let mut out = String::new();
        let mut chars = s.chars();
        while let Some(c) = chars.next() {
            if c == '\x1b' {
                for c in chars.by_ref() {
                    if c == 'm' {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    #[test]
    fn events_text() {
        let mut e = sample_event(1);
        e.at_unix_ms = 1_796_000_000_000 + 3_120; // 2026-11-30 00:53:20.000 + 3.12 s
        let mut table = sample_event(2);
        table.kind = EventKind::Table;
        table.backend = None;
        table.from = None;
        table.to = None;
        table.reason = "1 of 3 backends up".to_owned();
        table.table_build_us = Some(12_345);
        let mut start = sample_event(3);
        start.kind = EventKind::Start;
        start.vip = None;
        start.backend = None;
        start.from = None;
        start.to = None;
        start.reason = "xlb started on eth0".to_owned();
        start.table_build_us = None;
        start.table_slots_changed = None;
        let text = render_events(&[e, table, start], false);
        assert_eq!(
            text,
            "2026-11-30 00:53:23.120 transition api 10.99.0.12:80 up→down: connected, no HTTP response within 1s (table rebuilt in 0.4 ms, 1312 slots changed)\n\
             2026-11-30 00:53:20.002 table api: 1 of 3 backends up (table rebuilt in 12.3 ms, 1312 slots changed)\n\
             2026-11-30 00:53:20.003 start: xlb started on eth0\n"
        );
        assert_eq!(render_events(&[], false), "");
        let colored = render_event(&sample_event(1), true);
        assert!(
            colored.contains("\x1b[32mup\x1b[0m→\x1b[31mdown\x1b[0m"),
            "{colored}"
        );
    }

    #[test]
    fn explain_text() {
        let r = ExplainReport {
            protocol: "tcp".to_owned(),
            client: "192.0.2.10:51234".to_owned(),
            vip: "10.100.0.1:80".to_owned(),
            vip_name: "api".to_owned(),
            backend: Some("10.99.0.11:80".to_owned()),
            via: "table".to_owned(),
            slot: Some(4242),
            table_size: 65537,
            backend_state: Some("up".to_owned()),
            detail: "new flow: the keyed flow hash scaled to 65537 slots = slot 4242, which holds 10.99.0.11:80".to_owned(),
        };
        assert_eq!(
            render_explain(&r, false),
            "tcp 192.0.2.10:51234 → 10.100.0.1:80 (vip api)\n\
             \x20 backend  10.99.0.11:80 (up)\n\
             \x20 via      table, slot 4242 of 65537\n\
             \x20 new flow: the keyed flow hash scaled to 65537 slots = slot 4242, which holds 10.99.0.11:80\n"
        );
        let ct = ExplainReport {
            via: "conntrack".to_owned(),
            ..r.clone()
        };
        assert!(
            render_explain(&ct, false)
                .contains("  via      conntrack (table slot 4242 of 65537)\n")
        );
        let none = ExplainReport {
            backend: None,
            backend_state: None,
            via: "none".to_owned(),
            ..r
        };
        assert!(render_explain(&none, false).contains("  backend  none: the packet is dropped\n"));
    }

    #[test]
    fn utc_dates() {
        let cases = [
            ("epoch", 0, "1970-01-01 00:00:00.000"),
            ("leap day", 951_782_400_000 + 1, "2000-02-29 00:00:00.001"),
            (
                "end of a leap year",
                1_735_603_199_999,
                "2024-12-30 23:59:59.999",
            ),
            ("2038", 2_147_483_647_000, "2038-01-19 03:14:07.000"),
            ("sample", 1_796_000_000_000, "2026-11-30 00:53:20.000"),
            ("far future", 32_503_680_000_000, "3000-01-01 00:00:00.000"),
        ];
        for (name, ms, want) in cases {
            assert_eq!(format_utc(ms), want, "{name}");
        }
    }

    #[test]
    fn human_numbers() {
        let spans = [
            (0, "0s"),
            (35_000, "35s"),
            (120_000, "2m"),
            (724_000, "12m4s"),
            (3_600_000 * 3 + 120_000, "3h2m"),
            (86_400_000 * 2 + 3_600_000 * 5 + 59_000, "2d5h"),
        ];
        for (ms, want) in spans {
            assert_eq!(span(ms), want, "{ms}");
        }
        let rates = [
            (0.0, "0"),
            (-1.0, "0"),
            (f64::NAN, "0"),
            (0.4, "0.4"),
            (3.0, "3"),
            (35.2, "35"),
            (999.0, "999"),
            (1234.0, "1.2k"),
            (3_400_000.0, "3.4M"),
            (5e9, "5.0G"),
        ];
        for (r, want) in rates {
            assert_eq!(rate(r), want, "{r}");
        }
        let latencies = [
            (0.9, "900µs"),
            (1.2, "1.2ms"),
            (35.4, "35ms"),
            (1500.0, "1.5s"),
        ];
        for (ms, want) in latencies {
            assert_eq!(latency(ms), want, "{ms}");
        }
    }

    #[test]
    fn check_config_reports() {
        let dir = std::env::temp_dir().join(format!("xlb-cli-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.toml");
        std::fs::write(
            &good,
            "[daemon]\ninterface = \"eth0\"\n\
             [[vip]]\nname = \"api\"\naddress = \"10.100.0.1\"\nport = 80\n\
             [[vip.backend]]\naddress = \"10.99.0.11\"\n[[vip.backend]]\naddress = \"10.99.0.12\"\n\
             [[vip]]\nname = \"empty\"\naddress = \"10.100.0.2\"\nport = 80\n",
        )
        .unwrap();
        assert_eq!(
            check_config(&good).unwrap(),
            format!(
                "{}: ok (2 VIPs, 2 backends)\nwarning: {}: vip \"empty\" has no backends; it will drop new flows until backends are added\n",
                good.display(),
                good.display()
            )
        );
        let bad = dir.join("bad.toml");
        std::fs::write(
            &bad,
            "[daemon]\ninterface = \"eth0\"\n[[vip]]\nname = \"api\"\naddress = \"10.100.0.1\"\nport = 80\ntable_size = 10\n\
             [[vip.backend]]\naddress = \"10.99.0.11\"\n",
        )
        .unwrap();
        let err = check_config(&bad).unwrap_err();
        assert_eq!(
            err.problems,
            [format!(
                "{}: vip \"api\": table_size 10 is not prime; use a prime such as 11",
                bad.display()
            )]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
