//! `xlb`: the daemon (`xlb run`), the decapsulator (`xlb decap`) and the
//! operator commands that talk to a running daemon over its control socket.
//! Parsing and rendering live in `lb_user::cli`; this file does the I/O.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]
#![allow(clippy::print_stdout, reason = "the CLI: its output is the product")]

use std::io::{IsTerminal as _, Write as _};
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Parser as _;
use lb_user::cli::{self, Cli, Command, blocks::GuardCommand};
use lb_user::config::{self, Config};
use lb_user::ctl::{self, Client, Request, Response};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    lb_user::logging::init(cli.command.log_format());
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        // Said already; only the status is left to give (`xlb peers`).
        Err(e) if let Some(&ExitWith(code)) = e.downcast_ref() => ExitCode::from(code),
        Err(e) => {
            eprintln!("xlb: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Color only for a terminal, and never when `NO_COLOR` is set (no-color.org).
fn color() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let socket = client_socket(&cli)?;
    let socket = socket.as_path();
    match &cli.command {
        Command::Run { config, .. } => lb_user::daemon::run(config.clone()).await,
        Command::CheckConfig { file, config } => {
            // One of the two: clap requires it.
            let file = file.as_ref().or(config.as_ref()).context("no FILE")?;
            check_config(file)
        }
        Command::CheckUpgrade { config } => check_upgrade(config),
        Command::Detach {
            instance,
            config,
            force,
            withdraw_wait,
        } => detach(
            instance.as_deref(),
            config.as_deref(),
            *force,
            *withdraw_wait,
        ),
        Command::Decap(args) => {
            let settings = args.settings().map_err(anyhow::Error::msg)?;
            lb_user::decap::run(settings).await
        }
        Command::XdpPass { interface } => lb_user::decap::run_pass(interface.clone()).await,
        Command::Generate { what } => {
            for path in what.run().context("generating")? {
                println!("{}", path.display());
            }
            Ok(())
        }
        Command::Top(args) => cli::top::run(socket, args).await,
        Command::Status { watch, .. } if watch.watch => {
            cli::top::watch(socket, watch.interval, color()).await
        }
        Command::Peers(cli::peers::PeersCommand::Peers { json, .. }) => peers(socket, *json).await,
        Command::Trace(args) => lb_user::trace::run(args).await,
        Command::Events {
            follow: true, json, ..
        } => {
            let req = cli
                .command
                .request()
                .context("events is a control request")?;
            follow_events(socket, &req, *json).await
        }
        command => {
            let req = command
                .request()
                .context("every other command is a control request")?;
            // What the daemon would refuse is refused here, with its words.
            ctl::check_request(&req).map_err(anyhow::Error::msg)?;
            let sent_unix_ms = ctl::now_unix_ms();
            let resp = ctl::request(socket, &req).await?;
            let purging = matches!(&resp, Response::Ok { message } if message.contains(PURGING));
            print_response(command, resp)?;
            match command {
                Command::Drain {
                    vip,
                    backend,
                    wait: true,
                    ..
                } => wait_drained(socket, vip, backend).await,
                Command::Guard(GuardCommand::Block { prefix, .. }) if purging => {
                    wait_flows_cut(socket, &prefix.to_string(), sent_unix_ms).await
                }
                _ => Ok(()),
            }
        }
    }
}

/// `xlb detach`: the instance named, or the one `config` runs, or the
/// default one.
fn detach(
    instance: Option<&str>,
    config: Option<&Path>,
    force: bool,
    withdraw_wait: std::time::Duration,
) -> anyhow::Result<()> {
    let instance = config::instance_of(instance, config)?;
    println!(
        "{}",
        lb_user::daemon::detach(&instance, force, withdraw_wait)?
    );
    Ok(())
}

/// The control socket of a client command (`cli::target`); empty for the
/// others.
fn client_socket(cli: &Cli) -> anyhow::Result<std::path::PathBuf> {
    match (cli.command.target(), &cli.socket) {
        (Some(target), outer) => target.socket(outer.as_ref()).map_err(anyhow::Error::msg),
        // `xlb --socket PATH run`: clap refuses --socket after the command.
        (None, Some(_)) => bail!(
            "--socket is for the commands that talk to a running daemon (status, drain, \
             block, ...); this one does not use it: leave it out"
        ),
        (None, None) => Ok(std::path::PathBuf::new()),
    }
}

/// An exit status other than 0 or 1, once everything is printed.
#[derive(Debug, thiserror::Error)]
#[error("exit status {0}")]
struct ExitWith(u8);

/// `xlb peers`: prints the comparison, exits with its status.
async fn peers(socket: &Path, json: bool) -> anyhow::Result<()> {
    let nodes = lb_user::cluster::peers::gather(socket).await?;
    let report = cli::peers::peers_report(&nodes);
    if json {
        emit(&pretty(&report)?)?;
    } else {
        emit(&cli::peers::render_peers(&report, color()))?;
    }
    match report.exit_status {
        0 => Ok(()),
        code => Err(ExitWith(code).into()),
    }
}

fn check_config(file: &Path) -> anyhow::Result<()> {
    match cli::check_config(file) {
        Ok(report) => emit(&report),
        Err(errors) => {
            for problem in &errors.problems {
                eprintln!("{problem}");
            }
            let n = errors.problems.len();
            bail!(
                "{}: {n} problem{} in the configuration",
                file.display(),
                if n == 1 { "" } else { "s" }
            )
        }
    }
}

/// `xlb check-upgrade`: prints the verdict; exit 1 unless all is well.
fn check_upgrade(file: &Path) -> anyhow::Result<()> {
    let cfg = Config::from_file(file).map_err(|e| anyhow::anyhow!("{e}"))?;
    let verdict = lb_user::upgrade::verdict(&cfg, &lb_user::upgrade::gather(&cfg)?);
    emit(&verdict.text)?;
    if verdict.ok {
        Ok(())
    } else {
        Err(ExitWith(1).into())
    }
}

/// Prints the daemon's answer to `command` as text or JSON.
fn print_response(command: &Command, resp: Response) -> anyhow::Result<()> {
    let json = matches!(
        command,
        Command::Status { json: true, .. }
            | Command::Events { json: true, .. }
            | Command::Explain { json: true, .. }
            | Command::Guard(GuardCommand::Blocks { json: true, .. })
            | Command::Weight(cli::weight::WeightArgs { json: true, .. })
    ) || matches!(command, Command::Sources(s) if s.json())
        || matches!(command, Command::Announce(a) if a.json());
    let text = match resp {
        Response::Error { message } => bail!("{message}"),
        Response::Ok { message } if json => pretty(&serde_json::json!({ "message": message }))?,
        Response::Ok { message } => format!("{message}\n"),
        Response::Status(r) if json => pretty(&r)?,
        Response::Status(r) => cli::render_status(&r, ctl::now_unix_ms(), color()),
        Response::Events(events) if json => pretty(&events)?,
        Response::Events(events) => cli::render_events(&events, color()),
        Response::Explain(r) if json => pretty(&r)?,
        Response::Explain(r) => cli::render_explain(&r, color()),
        Response::Blocks(b) if json => pretty(&b)?,
        Response::Blocks(b) => cli::blocks::render_blocks(&b, ctl::now_unix_ms(), color()),
        Response::Sources(s) if json => pretty(&s)?,
        Response::Sources(s) => cli::sources::render_sources(&s, color()),
        Response::Weight(w) if json => pretty(&w)?,
        Response::Weight(w) => format!("{}\n", w.summary()),
        Response::Event(e) => bail!(
            "the daemon answered with a single event (seq {}) instead of a list",
            e.seq
        ),
    };
    emit(&text)
}

fn emit(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing to stdout")
}

fn pretty<T: serde::Serialize>(value: &T) -> anyhow::Result<String> {
    let mut s = serde_json::to_string_pretty(value).context("encoding JSON")?;
    s.push('\n');
    Ok(s)
}

/// `xlb events --follow`: prints events as they come, reconnecting when
/// the daemon restarts, until the user interrupts (or the daemon stays
/// away).
async fn follow_events(socket: &Path, req: &Request, json: bool) -> anyhow::Result<()> {
    let Request::Events { since_seq, .. } = req else {
        bail!("follow_events needs an events request");
    };
    let color = color();
    let mut failed = None;
    cli::follow::follow(socket, *since_seq, cli::follow::GIVE_UP, |f| {
        let line = match f {
            cli::follow::Followed::Event(e) if json => match serde_json::to_string(&e) {
                Ok(line) => line,
                Err(e) => {
                    failed = Some(anyhow::Error::new(e).context("encoding JSON"));
                    return false;
                }
            },
            cli::follow::Followed::Event(e) => cli::render_event(&e, color),
            cli::follow::Followed::Note(note) => {
                eprintln!("xlb: {note}");
                return true;
            }
        };
        let mut out = std::io::stdout().lock();
        // A closed pipe (`xlb events -f | head`) ends the command quietly.
        writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
    })
    .await?;
    failed.map_or(Ok(()), Err)
}

/// `xlb drain --wait`: polls `status` every second and prints the backend's
/// flow count each time it changes, until it reaches 0 or the drain's
/// deadline passes (both exit 0), or the drain is undone (exit 1).
async fn wait_drained(socket: &Path, vip: &str, backend: &str) -> anyhow::Result<()> {
    const POLL: std::time::Duration = std::time::Duration::from_secs(1);
    // A daemon restarting (the drain persists) is worth waiting out.
    const GIVE_UP: std::time::Duration = std::time::Duration::from_secs(30);
    emit("waiting for its flows to end (Ctrl-C stops waiting; the drain goes on)\n")?;
    let mut last = String::new();
    let mut failing_since: Option<std::time::Instant> = None;
    loop {
        let line = match ctl::request(socket, &Request::Status).await {
            Ok(Response::Status(report)) => {
                failing_since = None;
                match cli::drain_progress(&report, vip, backend, ctl::now_unix_ms()) {
                    cli::DrainProgress::Waiting(line) => line,
                    cli::DrainProgress::Done(line) => return emit(&format!("{line}\n")),
                    cli::DrainProgress::Gone(why) => bail!("{why}"),
                }
            }
            Ok(Response::Error { message }) => bail!("{message}"),
            Ok(other) => bail!(
                "the daemon answered status with {}",
                other.to_line().trim_end()
            ),
            Err(e) => {
                let since = *failing_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() >= GIVE_UP {
                    return Err(e).context("stopped waiting for the drain");
                }
                tokio::time::sleep(POLL).await;
                continue;
            }
        };
        if line != last {
            emit(&format!("{line}\n"))?;
            last = line;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// What the daemon's answer to `xlb block` says when it cuts the prefix's
/// established flows in the background.
const PURGING: &str = "cutting the established flows";

/// `xlb block`: waits (a few seconds at most) for the `block` event that
/// says how many established flows of `prefix` were cut, and prints it.
async fn wait_flows_cut(socket: &Path, prefix: &str, since_unix_ms: u64) -> anyhow::Result<()> {
    const WAIT: std::time::Duration = std::time::Duration::from_secs(10);
    let watch = async {
        let mut client = Client::connect(socket).await?;
        let req = Request::Events {
            since_seq: None,
            follow: true,
        };
        client.send(&req).await?;
        while let Some(resp) = client.recv().await? {
            if let Response::Event(e) = resp
                && e.kind == ctl::EventKind::Block
                && e.at_unix_ms >= since_unix_ms
                && e.reason.contains(&format!(" {prefix} "))
                && e.reason.contains("established flows")
            {
                return Ok::<_, anyhow::Error>(Some(e.reason));
            }
        }
        Ok(None)
    };
    match tokio::time::timeout(WAIT, watch).await {
        Ok(Ok(Some(reason))) => emit(&format!("{reason}\n")),
        Ok(Ok(None)) | Err(_) => {
            emit("(the flows are still being cut; `xlb events` will say how many)\n")
        }
        Ok(Err(e)) => Err(e).context("waiting for the count of cut flows"),
    }
}
