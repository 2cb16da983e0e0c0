//! Driving a running xlb through its command line: `status`, `events`,
//! `drain`, `enable`, `reload`, the abuse controls (`block`, `unblock`,
//! `blocks`, `sources`), and waiting for a state.

use std::{
    fs,
    net::SocketAddr,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use lb_ctl::{BlockEntry, VipSources};
use serde::de::DeserializeOwned;

use super::process::run_bounded;
use super::status::unwrap_envelope;
use super::{
    CLI_TIMEOUT, Event, LabRun, POLL, Result, ScenarioError, Status, io_err, parse_events,
    parse_status,
};

impl LabRun {
    /// Runs `xlb ARGS --socket <socket>` (a control command) and returns stdout.
    pub fn ctl(&self, args: &[&str]) -> Result<String> {
        self.ctl_within(args, CLI_TIMEOUT)
    }

    /// [`LabRun::ctl`] for a command that may take longer than a status
    /// call (e.g. `drain --wait`), killed after `timeout`.
    pub fn ctl_within(&self, args: &[&str], timeout: Duration) -> Result<String> {
        let mut cmd = Command::new(self.xlb_path());
        cmd.args(args).arg("--socket").arg(self.socket());
        run_bounded(cmd, timeout)
    }

    /// A data-plane counter from `status` (0 when absent).
    pub fn counter(&self, name: &str) -> Result<u64> {
        Ok(self.status()?.counters.get(name).copied().unwrap_or(0))
    }

    /// `xlb status --json`, raw.
    pub fn status_json(&self) -> Result<serde_json::Value> {
        let out = self.ctl(&["status", "--json"])?;
        serde_json::from_str::<serde_json::Value>(out.trim())
            .map(unwrap_envelope)
            .map_err(|e| ScenarioError::Parse {
                cmd: "xlb status --json".to_string(),
                reason: e.to_string(),
                output: out,
            })
    }

    /// `xlb status --json`, the parts the lab reads.
    pub fn status(&self) -> Result<Status> {
        let out = self.ctl(&["status", "--json"])?;
        parse_status(&out).map_err(|reason| ScenarioError::Parse {
            cmd: "xlb status --json".to_string(),
            reason,
            output: out,
        })
    }

    /// `xlb status` as printed for an operator.
    pub fn status_text(&self) -> Result<String> {
        self.ctl(&["status"])
    }

    /// `xlb events --json`: every event the daemon retains.
    pub fn events(&self) -> Result<Vec<Event>> {
        let out = self.ctl(&["events", "--json"])?;
        parse_events(&out).map_err(|reason| ScenarioError::Parse {
            cmd: "xlb events --json".to_string(),
            reason,
            output: out,
        })
    }

    /// `xlb blocks --json`: every deny and allow entry.
    pub fn blocks(&self) -> Result<Vec<BlockEntry>> {
        self.ctl_json(&["blocks", "--json"])
    }

    /// `xlb sources --json [--vip NAME]`: the heaviest sources per VIP.
    pub fn sources(&self, vip: Option<&str>) -> Result<Vec<VipSources>> {
        match vip {
            Some(v) => self.ctl_json(&["sources", "--json", "--vip", v]),
            None => self.ctl_json(&["sources", "--json"]),
        }
    }

    /// `xlb block PREFIX EXTRA...` (e.g. `--vip api --action reset`).
    pub fn block(&self, prefix: &str, extra: &[&str]) -> Result<String> {
        let mut args = vec!["block", prefix];
        args.extend_from_slice(extra);
        self.ctl(&args)
    }

    /// `xlb unblock PREFIX EXTRA...` (e.g. `--vip api`).
    pub fn unblock(&self, prefix: &str, extra: &[&str]) -> Result<String> {
        let mut args = vec!["unblock", prefix];
        args.extend_from_slice(extra);
        self.ctl(&args)
    }

    /// A control command whose `--json` output is `T` (plain, or inside
    /// the protocol's envelope).
    fn ctl_json<T: DeserializeOwned>(&self, args: &[&str]) -> Result<T> {
        let out = self.ctl(args)?;
        let parse_err = |reason: String| ScenarioError::Parse {
            cmd: format!("xlb {}", args.join(" ")),
            reason,
            output: out.clone(),
        };
        let v: serde_json::Value =
            serde_json::from_str(out.trim()).map_err(|e| parse_err(e.to_string()))?;
        serde_json::from_value(unwrap_envelope(v)).map_err(|e| parse_err(e.to_string()))
    }

    /// `xlb drain VIP BACKEND`.
    pub fn drain(&self, vip: &str, backend: SocketAddr) -> Result<String> {
        self.ctl(&["drain", vip, &backend.to_string()])
    }

    /// `xlb drain VIP BACKEND EXTRA...` (e.g. `--wait --deadline 20s`),
    /// bounded by `timeout`.
    pub fn drain_with(
        &self,
        vip: &str,
        backend: SocketAddr,
        extra: &[&str],
        timeout: Duration,
    ) -> Result<String> {
        let addr = backend.to_string();
        let mut args = vec!["drain", vip, addr.as_str()];
        args.extend_from_slice(extra);
        self.ctl_within(&args, timeout)
    }

    /// `xlb enable VIP BACKEND`.
    pub fn enable(&self, vip: &str, backend: SocketAddr) -> Result<String> {
        self.ctl(&["enable", vip, &backend.to_string()])
    }

    /// Writes `config` over the configuration file and runs `xlb reload`.
    pub fn reload(&self, config: &str) -> Result<String> {
        fs::write(self.config_path(), config)
            .map_err(io_err(format!("writing {}", self.config_path().display())))?;
        self.ctl(&["reload"])
    }

    /// Polls `status` until `done` holds, for at most `timeout`. Returns the
    /// status that satisfied it and when (time since the call).
    pub fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&Status) -> bool,
    ) -> Result<(Status, Duration)> {
        let start = Instant::now();
        loop {
            if let Some(pid) = self.daemon_pid() {
                self.check_alive("xlb run", pid, &self.daemon_log())?;
            }
            let last = match self.status() {
                Ok(s) if done(&s) => return Ok((s, start.elapsed())),
                Ok(s) => s.summary(),
                Err(e) => e.to_string(),
            };
            if start.elapsed() >= timeout {
                return Err(ScenarioError::Timeout {
                    what: what.to_string(),
                    after: timeout,
                    last,
                });
            }
            thread::sleep(POLL);
        }
    }

    /// Waits until every backend of every VIP is `up`.
    pub fn wait_all_up(&self, timeout: Duration) -> Result<Status> {
        self.wait_until("every backend to be up", timeout, Status::all_up)
            .map(|(s, _)| s)
    }

    /// Waits until backend `addr` of `vip` is in `state`.
    pub fn wait_backend_state(
        &self,
        vip: &str,
        addr: SocketAddr,
        state: &str,
        timeout: Duration,
    ) -> Result<(Status, Duration)> {
        self.wait_until(
            &format!("{vip} backend {addr} to be {state}"),
            timeout,
            |s| s.backend(vip, addr).is_some_and(|b| b.state == state),
        )
    }
}
