//! Which daemon a client command talks to: one rule for every command that
//! uses the control socket.
//!
//! `--socket PATH` names the socket itself and wins; otherwise `--instance
//! NAME` gives the socket that instance has by default, and `--config FILE`
//! the one its configuration sets (as `xlb detach` takes the instance from
//! either); otherwise `XLB_SOCKET`, then the default socket. The options
//! exist only on the commands that talk to the daemon: `run`,
//! `check-config`, `detach`, `decap` and `xdp-pass` refuse `--socket`.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

use super::Command;
use super::announce::AnnounceCommand;
use super::blocks::GuardCommand;
use super::peers::PeersCommand;
use super::sources::SourcesCommand;
use crate::config::{self, Config};

/// The daemon a client command talks to.
#[derive(Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientTarget {
    /// The daemon of this instance (daemon.instance), at the socket an
    /// instance has unless its configuration sets control_socket:
    /// /run/xlb/xlb.sock for "default", /run/xlb/NAME.sock for others.
    #[arg(long, value_name = "NAME", conflicts_with = "config")]
    pub instance: Option<String>,
    /// The daemon of this configuration file (its daemon.control_socket).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The control socket itself, over --instance, --config and
    /// XLB_SOCKET (default: /run/xlb/xlb.sock).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

impl ClientTarget {
    /// The socket to connect to; `outer` is a `--socket` written before the
    /// command (`xlb --socket PATH status`, as older scripts do).
    ///
    /// # Errors
    ///
    /// An invalid instance name, or a configuration that cannot be read.
    pub fn socket(&self, outer: Option<&PathBuf>) -> Result<PathBuf, String> {
        self.resolve(outer, std::env::var_os("XLB_SOCKET"))
    }

    /// [`ClientTarget::socket`] with the environment given.
    fn resolve(&self, outer: Option<&PathBuf>, env: Option<OsString>) -> Result<PathBuf, String> {
        if let Some(socket) = self.socket.as_ref().or(outer) {
            return Ok(socket.clone());
        }
        if let Some(instance) = &self.instance {
            config::check_instance(instance).map_err(|e| format!("--instance: {e}"))?;
            return Ok(config::default_control_socket(instance));
        }
        if let Some(path) = &self.config {
            return Config::from_file(path)
                .map(|c| c.daemon.restart.control_socket)
                .map_err(|e| {
                    format!(
                        "reading the control socket from {}:\n{e}\n(or give the socket \
                         itself with --socket PATH)",
                        path.display()
                    )
                });
        }
        Ok(env.filter(|v| !v.is_empty()).map_or_else(
            || PathBuf::from(config::defaults::CONTROL_SOCKET),
            PathBuf::from,
        ))
    }
}

impl Command {
    /// The daemon this command talks to; `None` for the commands that do
    /// not talk to one.
    pub fn target(&self) -> Option<&ClientTarget> {
        match self {
            Command::Status { target, .. }
            | Command::Events { target, .. }
            | Command::Drain { target, .. }
            | Command::Enable { target, .. }
            | Command::Explain { target, .. }
            | Command::Reload { target } => Some(target),
            Command::Guard(g) => Some(g.target()),
            Command::Sources(s) => Some(s.target()),
            Command::Peers(p) => Some(p.target()),
            Command::Announce(a) => Some(a.target()),
            Command::Top(t) => Some(&t.target),
            Command::Weight(w) => Some(&w.target),
            Command::Run { .. }
            | Command::CheckConfig { .. }
            | Command::CheckUpgrade { .. }
            | Command::Generate { .. }
            | Command::Trace(_)
            | Command::Detach { .. }
            | Command::Decap(_)
            | Command::XdpPass { .. } => None,
        }
    }
}

impl GuardCommand {
    pub fn target(&self) -> &ClientTarget {
        match self {
            GuardCommand::Block { target, .. }
            | GuardCommand::Allow { target, .. }
            | GuardCommand::Unblock { target, .. }
            | GuardCommand::Blocks { target, .. } => target,
        }
    }
}

impl SourcesCommand {
    pub fn target(&self) -> &ClientTarget {
        let SourcesCommand::Sources { target, .. } = self;
        target
    }
}

impl PeersCommand {
    pub fn target(&self) -> &ClientTarget {
        let PeersCommand::Peers { target, .. } = self;
        target
    }
}

impl AnnounceCommand {
    pub fn target(&self) -> &ClientTarget {
        match self {
            AnnounceCommand::Withdraw { target, .. } | AnnounceCommand::Announce { target, .. } => {
                target
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::Cli;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("xlb").chain(args.iter().copied()))
    }

    /// Every client command, as typed (with the arguments it needs).
    const CLIENT_COMMANDS: &[&[&str]] = &[
        &["status"],
        &["events"],
        &["drain", "api", "10.0.0.1:80"],
        &["enable", "api", "10.0.0.1:80"],
        &["explain", "tcp", "192.0.2.1:1000", "10.100.0.1:80"],
        &["reload"],
        &["block", "192.0.2.7"],
        &["allow", "192.0.2.7"],
        &["unblock", "192.0.2.7"],
        &["blocks"],
        &["sources"],
        &["peers"],
        &["withdraw", "api"],
        &["announce", "api"],
    ];

    fn target_of(args: &[&str]) -> ClientTarget {
        let cli = parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        cli.command
            .target()
            .unwrap_or_else(|| panic!("{args:?} has no target"))
            .clone()
    }

    #[test]
    fn every_client_command_takes_instance_config_and_socket() {
        for command in CLIENT_COMMANDS {
            let with = |extra: &[&str]| target_of(&[*command, extra].concat());
            assert_eq!(
                with(&["--instance", "edge"]).instance.as_deref(),
                Some("edge"),
                "{command:?}"
            );
            assert_eq!(
                with(&["--config", "/etc/xlb/edge.toml"]).config,
                Some(PathBuf::from("/etc/xlb/edge.toml")),
                "{command:?}"
            );
            assert_eq!(
                with(&["-c", "/etc/xlb/edge.toml"]).config,
                Some(PathBuf::from("/etc/xlb/edge.toml")),
                "{command:?}"
            );
            assert_eq!(
                with(&["--socket", "/tmp/x.sock"]).socket,
                Some(PathBuf::from("/tmp/x.sock")),
                "{command:?}"
            );
            let both = parse(&[*command, &["--instance", "a", "--config", "b.toml"]].concat());
            assert!(
                both.is_err(),
                "{command:?}: --instance with --config accepted"
            );
        }
    }

    #[test]
    fn commands_that_do_not_talk_to_the_daemon_refuse_socket() {
        for args in [
            &["run", "-c", "x.toml", "--socket", "/tmp/x.sock"][..],
            &["check-config", "x.toml", "--socket", "/tmp/x.sock"],
            &["detach", "--socket", "/tmp/x.sock"],
            &["decap", "--interface", "eth0", "--socket", "/tmp/x.sock"],
            &["xdp-pass", "--interface", "eth0", "--socket", "/tmp/x.sock"],
        ] {
            let e = parse(args).expect_err(&format!("{args:?} accepted --socket"));
            assert!(
                e.to_string().contains("unexpected argument '--socket'"),
                "{args:?}: {e}"
            );
        }
    }

    #[test]
    fn help_of_run_does_not_show_socket() {
        let e = parse(&["run", "--help"]).unwrap_err();
        assert!(!e.to_string().contains("--socket"), "{e}");
        let e = parse(&["status", "--help"]).unwrap_err();
        assert!(e.to_string().contains("--socket"), "{e}");
    }

    #[test]
    fn the_socket_is_derived_in_order_of_precedence() {
        let env = || Some(OsString::from("/run/env.sock"));
        let t = |args: &[&str]| target_of(&[&["status"], args].concat());
        let outer = PathBuf::from("/run/outer.sock");
        type Case<'a> = (
            &'a str,
            ClientTarget,
            Option<&'a PathBuf>,
            Option<OsString>,
            &'a str,
        );
        let cases: [Case<'_>; 7] = [
            ("default", t(&[]), None, None, "/run/xlb/xlb.sock"),
            ("XLB_SOCKET", t(&[]), None, env(), "/run/env.sock"),
            (
                "empty XLB_SOCKET",
                t(&[]),
                None,
                Some(OsString::new()),
                "/run/xlb/xlb.sock",
            ),
            (
                "instance over env",
                t(&["--instance", "edge"]),
                None,
                env(),
                "/run/xlb/edge.sock",
            ),
            (
                "default instance",
                t(&["--instance", "default"]),
                None,
                env(),
                "/run/xlb/xlb.sock",
            ),
            (
                "--socket over all",
                t(&["--socket", "/s", "--instance", "e"]),
                Some(&outer),
                env(),
                "/s",
            ),
            (
                "socket before the command",
                t(&["--instance", "e"]),
                Some(&outer),
                env(),
                "/run/outer.sock",
            ),
        ];
        for (name, target, outer, env, want) in cases {
            assert_eq!(
                target.resolve(outer, env),
                Ok(PathBuf::from(want)),
                "{name}"
            );
        }
        assert_eq!(
            t(&["--instance", "../x"]).resolve(None, None),
            Err(
                "--instance: instance \"../x\" is invalid; use 1 to 32 characters from a-z 0-9 _ -"
                    .to_owned()
            )
        );
    }

    #[test]
    fn config_gives_its_socket_or_its_instances_socket() {
        let dir = TempDir::new();
        let write = |name: &str, daemon: &str| {
            let path = dir.0.join(name);
            std::fs::write(&path, format!("[daemon]\ninterface = \"eth0\"\n{daemon}")).unwrap();
            path
        };
        let cases = [
            (
                "set",
                write("a.toml", "control_socket = \"/run/a/ctl.sock\"\n"),
                "/run/a/ctl.sock",
            ),
            (
                "instance",
                write("b.toml", "instance = \"edge\"\n"),
                "/run/xlb/edge.sock",
            ),
            ("defaults", write("c.toml", ""), "/run/xlb/xlb.sock"),
        ];
        for (name, path, want) in cases {
            let target = ClientTarget {
                config: Some(path),
                ..ClientTarget::default()
            };
            let env = Some(OsString::from("/run/env.sock"));
            assert_eq!(target.resolve(None, env), Ok(PathBuf::from(want)), "{name}");
        }
        let missing = ClientTarget {
            config: Some(dir.0.join("none.toml")),
            ..ClientTarget::default()
        };
        let e = missing.resolve(None, None).unwrap_err();
        assert!(e.starts_with("reading the control socket from "), "{e}");
        assert!(e.contains("cannot read the configuration"), "{e}");
    }

    /// A directory of this test process, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            let dir = std::env::temp_dir().join(format!("xlb-target-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
