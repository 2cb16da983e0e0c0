//! The loopback cost figure's peer: HAProxy's own health checks of the same
//! 1,000 listeners, so that the prober's CPU is measured beside what the
//! checker operators would otherwise run costs on this machine, in the same
//! run (issue 11: "measured against the tools users would otherwise pick").
//!
//! HAProxy checks with `option httpchk` the request xlb sends (`GET
//! /health`, 2xx expected), every `interval`, failing at `hang_timeout`,
//! with `rise`/`fall` and `spread-checks` from the same spec; a new
//! connection per check (HAProxy has no kept-alive checks) closed with a
//! reset, as xlb's default. One thread (`nbthread 1`), HAProxy's cheapest
//! layout: its default of one thread per CPU cost more here (11.0 against
//! 9.2 % of a core in one measurement). No frontend: the stats socket,
//! which the benchmark reads, is HAProxy's only listener.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context as _, Result, bail, ensure};
use lb_user::health::spec::{CheckKind, CheckSpec};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::UnixStream,
    time::{Instant, sleep},
};

use super::{report::Secs, resources::CpuTime};
use crate::bench::{
    lab_cpu::{clock_ticks_per_second, process_user_system_ticks},
    lab_proxies::find_program,
};

/// The backend section's name in the configuration and the stats.
pub(super) const BACKEND: &str = "checks";

/// HAProxy's configuration: one backend of a server per port on
/// 127.0.0.1, each checked as `spec` says, and the stats socket `sock`.
pub(super) fn config(ports: &[u16], spec: &CheckSpec, sock: &Path) -> Result<String> {
    let CheckKind::Http(http) = &spec.kind else {
        bail!("HAProxy's checks mirror an HTTP check only");
    };
    // HAProxy takes a status range as a regular expression: the default
    // 2xx is `^2`.
    ensure!(
        http.expect_status == [(200, 299)],
        "HAProxy's checks mirror the default expected status 200-299 only, not {:?}",
        http.expect_status
    );
    // spread-checks: a random share of the interval either way, at most 50 %.
    let spread = (spec.jitter * 100.0).round().clamp(0.0, 50.0) as u32;
    let ms = |d: Duration| d.as_millis().max(1);
    let mut cfg = format!(
        "# Written by xlb-health-bench.\n\
         global\n    nbthread 1\n    maxconn 4000\n    spread-checks {spread}\n    \
         stats socket {sock} mode 600\n\n\
         defaults\n    mode http\n    timeout connect {hang}ms\n    timeout check {hang}ms\n    \
         timeout client 30s\n    timeout server 30s\n\n\
         backend {BACKEND}\n    option httpchk\n    \
         http-check send meth {method} uri {path} ver HTTP/1.1 hdr Host localhost\n    \
         http-check expect rstatus ^2\n    \
         default-server check inter {inter}ms rise {rise} fall {fall}\n",
        sock = sock.display(),
        hang = ms(spec.hang_timeout),
        inter = ms(spec.interval),
        method = http.method,
        path = http.path,
        rise = spec.rise,
        fall = spec.fall,
    );
    for (i, port) in ports.iter().enumerate() {
        cfg.push_str(&format!("    server s{i} 127.0.0.1:{port}\n"));
    }
    Ok(cfg)
}

/// What HAProxy's stats say of the backend's servers.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct ServerStats {
    pub(super) servers: usize,
    /// Servers up whose last check passed at layer 7.
    pub(super) passing: usize,
    /// Failed checks, summed over the servers (`chkfail`).
    pub(super) failed: u64,
}

/// The backend's servers in the CSV of `show stat`.
pub(super) fn parse_stats(csv: &str) -> Result<ServerStats> {
    let mut lines = csv.lines();
    let header = lines.next().context("`show stat` printed nothing")?;
    let columns: Vec<&str> = header.trim_start_matches("# ").split(',').collect();
    let col = |name: &str| {
        columns
            .iter()
            .position(|c| *c == name)
            .with_context(|| format!("`show stat` has no {name} column: {header:?}"))
    };
    let (px, sv, status, check, chkfail) = (
        col("pxname")?,
        col("svname")?,
        col("status")?,
        col("check_status")?,
        col("chkfail")?,
    );
    let mut stats = ServerStats::default();
    for line in lines.filter(|l| !l.is_empty()) {
        let f: Vec<&str> = line.split(',').collect();
        let field = |i: usize| f.get(i).copied().unwrap_or("");
        if field(px) != BACKEND || matches!(field(sv), "FRONTEND" | "BACKEND") {
            continue;
        }
        stats.servers += 1;
        // "* L7OK" while the next check is running.
        if field(status) == "UP" && field(check).trim_start_matches("* ") == "L7OK" {
            stats.passing += 1;
        }
        stats.failed += field(chkfail).parse::<u64>().unwrap_or(0);
    }
    Ok(stats)
}

/// HAProxy checking the listeners, in a work directory of its own; killed
/// and cleaned up when dropped.
pub(super) struct Haproxy {
    child: tokio::process::Child,
    pid: u32,
    dir: PathBuf,
    sock: PathBuf,
}

impl Haproxy {
    /// `haproxy -v`'s name and version ("HAProxy 2.6.12-1+deb12u4"), or
    /// why HAProxy cannot be run.
    pub(super) fn version() -> Result<String> {
        let haproxy = find_program("haproxy")?;
        let out = std::process::Command::new(&haproxy)
            .arg("-v")
            .output()
            .with_context(|| format!("running {} -v", haproxy.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let first = text.lines().next().unwrap_or_default();
        let mut words = first.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some(name), Some("version"), Some(v)) => Ok(format!("{name} {v}")),
            _ => bail!("`{} -v` printed {first:?}", haproxy.display()),
        }
    }

    /// Starts HAProxy checking `ports` as `spec` says and waits until every
    /// server has passed a check.
    pub(super) async fn start(ports: &[u16], spec: &CheckSpec) -> Result<Self> {
        let config = |sock: &Path| config(ports, spec, sock);
        Self::start_with("haproxy", config, Some((ports.len(), spec))).await
    }

    /// Starts HAProxy with the configuration `config` writes for its stats
    /// socket, in a work directory named after `tag` (one per HAProxy of a
    /// run); with `wait_for`, waits until that many servers pass `spec`.
    pub(super) async fn start_with(
        tag: &str,
        config: impl FnOnce(&Path) -> Result<String>,
        wait_for: Option<(usize, &CheckSpec)>,
    ) -> Result<Self> {
        let haproxy = find_program("haproxy")?;
        let dir =
            std::env::temp_dir().join(format!("xlb-health-bench-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let sock = dir.join("stats.sock");
        let cfg = dir.join("haproxy.cfg");
        std::fs::write(&cfg, config(&sock)?)
            .with_context(|| format!("writing {}", cfg.display()))?;
        let log = dir.join("haproxy.log");
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        // -db: in the foreground, owned (and killed) by this process.
        let child = tokio::process::Command::new(&haproxy)
            .arg("-db")
            .arg("-f")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} -db -f {}", haproxy.display(), cfg.display()))?;
        let pid = child.id().context("HAProxy exited at once")?;
        let mut me = Self {
            child,
            pid,
            dir,
            sock,
        };
        let Some((n, spec)) = wait_for else {
            return Ok(me);
        };
        me.wait_all_passing(n, spec).await.with_context(|| {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            format!(
                "HAProxy's log {}:\n{log}",
                me.dir.join("haproxy.log").display()
            )
        })?;
        Ok(me)
    }

    /// Waits until all `n` servers are up with a passing check: every
    /// server's first check lands within one interval and its spread.
    async fn wait_all_passing(&mut self, n: usize, spec: &CheckSpec) -> Result<()> {
        let limit = spec.interval * 2 + spec.hang_timeout + Duration::from_secs(5);
        let deadline = Instant::now() + limit;
        let mut last = ServerStats::default();
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bail!("HAProxy exited: {status}");
            }
            if let Ok(stats) = self.stats().await {
                if stats.servers == n && stats.passing == n {
                    return Ok(());
                }
                last = stats;
            }
            sleep(Duration::from_millis(200)).await;
        }
        bail!(
            "HAProxy's checks passed for only {} of {n} servers ({} listed) within {}",
            last.passing,
            last.servers,
            Secs(limit)
        )
    }

    /// `show stat` on the stats socket, parsed.
    pub(super) async fn stats(&self) -> Result<ServerStats> {
        parse_stats(&self.show_stat().await?)
    }

    /// `show stat` on the stats socket: its CSV.
    pub(super) async fn show_stat(&self) -> Result<String> {
        let mut s = UnixStream::connect(&self.sock)
            .await
            .with_context(|| format!("connecting to HAProxy's {}", self.sock.display()))?;
        s.write_all(b"show stat\n").await?;
        let mut csv = String::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut csv))
            .await
            .context("HAProxy's `show stat` did not end within 5 s")??;
        Ok(csv)
    }

    /// HAProxy's CPU time so far, all threads (`/proc/PID/stat`).
    pub(super) fn cpu(&self) -> Result<CpuTime> {
        let (user, system) = process_user_system_ticks(&self.pid.to_string(), false)
            .with_context(|| format!("reading HAProxy's /proc/{}/stat", self.pid))?;
        let time = |ticks: u64| Duration::from_secs_f64(ticks as f64 / clock_ticks_per_second());
        Ok(CpuTime {
            user: time(user),
            system: time(system),
        })
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> CheckSpec {
        super::super::detection::http_spec(|s| {
            s.interval = Duration::from_secs(1);
            s.jitter = 0.1;
        })
    }

    #[test]
    fn config_mirrors_the_check() {
        let spec = spec();
        let cfg = config(&[4001, 4002], &spec, Path::new("/tmp/x/stats.sock")).expect("config");
        for want in [
            "nbthread 1",
            "spread-checks 10",
            "stats socket /tmp/x/stats.sock mode 600",
            "option httpchk",
            "http-check send meth GET uri /health ver HTTP/1.1",
            "http-check expect rstatus ^2",
            &format!(
                "default-server check inter 1000ms rise {} fall {}",
                spec.rise, spec.fall
            ),
            &format!("timeout check {}ms", spec.hang_timeout.as_millis()),
            "server s0 127.0.0.1:4001\n",
            "server s1 127.0.0.1:4002\n",
        ] {
            assert!(cfg.contains(want), "{want:?} missing from:\n{cfg}");
        }
        assert_eq!(cfg.matches("\n    server ").count(), 2);
    }

    #[test]
    fn config_refuses_what_it_cannot_mirror() {
        let mut spec = spec();
        if let CheckKind::Http(http) = &mut spec.kind {
            http.expect_status = vec![(204, 204)];
        }
        assert!(config(&[1], &spec, Path::new("/s")).is_err());
    }

    #[test]
    fn stats_count_the_backend_servers_only() {
        let csv = "# pxname,svname,qcur,status,check_status,chkfail,\n\
                   stats,FRONTEND,,OPEN,,,\n\
                   checks,s0,0,UP,L7OK,0,\n\
                   checks,s1,0,UP,* L7OK,2,\n\
                   checks,s2,0,DOWN,L4CON,5,\n\
                   checks,s3,0,UP,INI,0,\n\
                   checks,BACKEND,0,UP,,,\n";
        assert_eq!(
            parse_stats(csv).expect("parsed"),
            ServerStats {
                servers: 4,
                passing: 2,
                failed: 7
            }
        );
        assert!(parse_stats("").is_err());
        assert!(parse_stats("# pxname,svname\n").is_err());
    }
}
