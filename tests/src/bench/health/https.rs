//! `--only https`: CPU per `kind = "https"` check of xlb's prober against
//! HAProxy doing the same check (`option httpchk` with `check check-ssl
//! verify none`) of the same TLS listeners in the same run; issue 25's
//! goal is at most 1.2 × HAProxy's.
//!
//! The listeners: one more HAProxy, terminating TLS on a range of ports on
//! 127.0.0.1 (a certificate of the lab CA, `tests/tls/make-certs.sh`) and
//! answering `200 ok` with keep-alive; its CPU is not measured, and it
//! counts HAProxy's checks (its frontend's `req_tot`). Both checkers skip
//! certificate verification (HAProxy's `verify none`, xlb's `tls_verify =
//! false`). xlb resumes TLS sessions (rustls's ticket cache); whether
//! HAProxy's checks resume theirs is up to HAProxy's version and is not
//! verified here, so part of the difference may be resumption (a full
//! handshake's key exchange and signature check against a resumed one's
//! key exchange). xlb is measured with a fresh connection and
//! handshake per probe, and with `reuse_connection` (one handshake per
//! `reopen_every` probes), which HAProxy has no equivalent of.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use lb_user::health::spec::{CheckKind, CheckSpec, DEFAULT_REOPEN_EVERY, TlsCheck};
use tokio::time::{Instant, sleep};

use super::cost::{Measured, one_window};
use super::detection::http_spec;
use super::haproxy::Haproxy;
use super::report::{Row, Verdict};
use super::resources::CpuTime;
use crate::bench::figures::median;
use crate::tls::LabCerts;

/// TLS listeners checked (each every second).
const BACKENDS: usize = 200;
/// The first listener's port; the others follow. Below the kernel's
/// ephemeral range (32768-60999), where an outgoing connection's port can
/// make a bind fail.
const FIRST_PORT: u16 = 21_000;
/// The goal: xlb's CPU per https check at most this × HAProxy's.
const GOAL_RATIO: f64 = 1.2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    Fresh,
    Reuse,
    Haproxy,
}

impl Case {
    fn label(self) -> String {
        match self {
            Self::Fresh => "xlb https, new connection and handshake per probe".to_owned(),
            Self::Reuse => {
                format!("xlb https, reuse_connection (reopen_every {DEFAULT_REOPEN_EVERY})")
            }
            Self::Haproxy => "HAProxy check-ssl verify none, new connection per check".to_owned(),
        }
    }
}

/// The https check of every case: GET /health every second, no
/// certificate verification (as HAProxy's `verify none`).
fn https_spec(reuse: bool) -> CheckSpec {
    http_spec(|s| {
        s.interval = Duration::from_secs(1);
        let CheckKind::Http(http) = s.kind.clone() else {
            unreachable!("http_spec makes an HTTP check")
        };
        let mut http = http;
        http.reuse_connection = reuse.then_some(DEFAULT_REOPEN_EVERY);
        s.kind = CheckKind::Https {
            http,
            tls: TlsCheck {
                verify: false,
                ca_file: None,
                server_name: None,
            },
        };
    })
}

/// The listeners' HAProxy: TLS on `BACKENDS` ports, `200 ok` to anything.
fn server_config(cert: &Path, sock: &Path) -> String {
    let last = FIRST_PORT + BACKENDS as u16 - 1;
    format!(
        "# Written by xlb-health-bench: the https figure's listeners.\n\
         global\n    nbthread 1\n    maxconn 8000\n    stats socket {sock} mode 600\n\n\
         defaults\n    mode http\n    timeout client 30s\n    timeout connect 5s\n    \
         timeout server 5s\n    timeout http-keep-alive 30s\n\n\
         frontend listeners\n    bind 127.0.0.1:{FIRST_PORT}-{last} ssl crt {cert}\n    \
         http-request return status 200 content-type text/plain string ok\n",
        sock = sock.display(),
        cert = cert.display(),
    )
}

/// The checking HAProxy's configuration: HAProxy's HTTP check of the cost
/// figure, over TLS.
fn checker_config(ports: &[u16], spec: &CheckSpec, sock: &Path) -> Result<String> {
    let CheckKind::Https { http, .. } = &spec.kind else {
        anyhow::bail!("an https spec");
    };
    let plain = CheckSpec {
        kind: CheckKind::Http(http.clone()),
        ..spec.clone()
    };
    let cfg = super::haproxy::config(ports, &plain, sock)?;
    ensure!(cfg.contains("default-server check "), "{cfg}");
    Ok(cfg.replace(
        "default-server check ",
        "default-server check check-ssl verify none ",
    ))
}

/// Requests the listeners answered so far (their frontend's `req_tot`).
async fn served(server: &Haproxy) -> Result<u64> {
    let csv = server.show_stat().await?;
    let mut lines = csv.lines();
    let header = lines.next().context("`show stat` printed nothing")?;
    let columns: Vec<&str> = header.trim_start_matches("# ").split(',').collect();
    let col = |name: &str| {
        columns
            .iter()
            .position(|c| *c == name)
            .context(name.to_owned())
    };
    let (sv, req) = (col("svname")?, col("req_tot")?);
    let row = lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .find(|f| f.get(sv) == Some(&"FRONTEND"))
        .context("no FRONTEND row in the listeners' stats")?;
    row.get(req)
        .and_then(|v| v.parse().ok())
        .context("the listeners' req_tot")
}

/// Waits (at most 10 s) until every port accepts a connection.
async fn wait_listening(ports: &[u16]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    for port in ports {
        while tokio::net::TcpStream::connect(("127.0.0.1", *port))
            .await
            .is_err()
        {
            ensure!(
                Instant::now() < deadline,
                "the TLS listeners' port {port} refuses connections after 10 s"
            );
            sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// One HAProxy checker window: CPU per check and checks.
async fn haproxy_window(
    server: &Haproxy,
    ports: &[u16],
    spec: &CheckSpec,
    warmup: Duration,
    window: Duration,
) -> Result<(f64, u64)> {
    let config = |sock: &Path| checker_config(ports, spec, sock);
    let checker = Haproxy::start_with("https-checker", config, Some((ports.len(), spec))).await?;
    sleep(warmup).await;
    let (failed_before, served_before) = (checker.stats().await?.failed, served(server).await?);
    let cpu_start: CpuTime = checker.cpu()?;
    sleep(window).await;
    let cpu = checker.cpu()? - cpu_start;
    let (failed, checks) = (checker.stats().await?.failed, served(server).await?);
    ensure!(
        failed == failed_before,
        "HAProxy's checks failed {} times",
        failed - failed_before
    );
    let checks = checks.saturating_sub(served_before);
    Ok((
        cpu.total().as_secs_f64() * 1e6 / checks.max(1) as f64,
        checks,
    ))
}

/// The figure: `rounds` windows of each case, alternated.
pub(super) async fn https_cost(quick: bool) -> Result<Vec<Row>> {
    let (rounds, window, warmup) = if quick {
        (2, Duration::from_secs(5), Duration::from_secs(1))
    } else {
        (5, Duration::from_secs(10), Duration::from_secs(2))
    };
    let certs = LabCerts::make("https-bench");
    let full = certs.path("good-full.pem");
    let pem = [certs.path("good.pem"), certs.path("good.key")]
        .iter()
        .map(std::fs::read)
        .collect::<Result<Vec<_>, _>>()
        .context("reading the listeners' certificate")?
        .concat();
    std::fs::write(&full, pem).context("writing the listeners' certificate")?;
    let server = Haproxy::start_with("https-listeners", |s| Ok(server_config(&full, s)), None)
        .await
        .context("the TLS listeners (HAProxy)")?;
    let ports: Vec<u16> = (0..BACKENDS as u16).map(|i| FIRST_PORT + i).collect();
    wait_listening(&ports).await?;
    println!();
    println!(
        "figure https: CPU per check, {BACKENDS} TLS listeners (HAProxy, TLS 1.3, ECDSA P-256) \
         on 127.0.0.1 checked every second; {rounds} rounds of {}s windows after {}s of \
         warm-up, cases alternated; xlb's CPU = this process (getrusage), HAProxy's = its \
         /proc/PID/stat; medians over the rounds",
        window.as_secs(),
        warmup.as_secs()
    );
    let mut us: [Vec<f64>; 3] = Default::default();
    let cases = [Case::Fresh, Case::Reuse, Case::Haproxy];
    for round in 0..rounds {
        let mut order = cases;
        if round % 2 == 1 {
            order.reverse();
        }
        for case in order {
            let (per_check, checks) = match case {
                Case::Haproxy => {
                    haproxy_window(&server, &ports, &https_spec(false), warmup, window).await?
                }
                _ => {
                    let spec = https_spec(case == Case::Reuse);
                    let m: Measured = one_window(BACKENDS, &spec, &ports, warmup, window).await?;
                    let failures = m.failures();
                    ensure!(
                        failures.is_empty(),
                        "{}: failed probes: {failures:?}",
                        case.label()
                    );
                    (m.cpu_per_probe_us(), u64::from(m.probes()))
                }
            };
            println!(
                "  round {}/{rounds}, {}: {per_check:.1} µs per check ({checks} checks)",
                round + 1,
                case.label()
            );
            let slot = cases.iter().position(|c| *c == case).expect("a case");
            us[slot].push(per_check);
        }
    }
    drop(server);
    Ok(rows(&us))
}

fn rows(us: &[Vec<f64>; 3]) -> Vec<Row> {
    let haproxy = median(&us[2]);
    let mut rows = vec![Row {
        figure: format!("https CPU per check, {}", Case::Haproxy.label()),
        value: format!("{haproxy:.1} µs"),
        target: "none set (the reference)".to_owned(),
        verdict: Verdict::Info,
    }];
    for (i, case) in [Case::Fresh, Case::Reuse].into_iter().enumerate() {
        let xlb = median(&us[i]);
        let ratio = xlb / haproxy;
        rows.push(Row {
            figure: format!("https CPU per check, {}", case.label()),
            value: format!("{xlb:.1} µs, {ratio:.2} × HAProxy's"),
            target: format!("≤ {GOAL_RATIO} × HAProxy's (issue 25)"),
            verdict: Verdict::of(ratio <= GOAL_RATIO),
        });
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checker_mirrors_the_check_over_tls() {
        let cfg =
            checker_config(&[21000, 21001], &https_spec(false), Path::new("/s")).expect("config");
        for want in [
            "option httpchk",
            "http-check send meth GET uri /health ver HTTP/1.1",
            "default-server check check-ssl verify none inter 1000ms",
            "server s1 127.0.0.1:21001\n",
        ] {
            assert!(cfg.contains(want), "{want:?} missing from:\n{cfg}");
        }
        let plain = http_spec(|_| {});
        assert!(checker_config(&[1], &plain, Path::new("/s")).is_err());
    }

    #[test]
    fn listeners_on_a_port_range() {
        let cfg = server_config(Path::new("/c/full.pem"), Path::new("/s"));
        assert!(
            cfg.contains("bind 127.0.0.1:21000-21199 ssl crt /c/full.pem\n"),
            "{cfg}"
        );
    }

    #[test]
    fn goal_verdicts() {
        let rows = rows(&[vec![110.0, 130.0], vec![50.0], vec![100.0]]);
        let verdicts: Vec<_> = rows.iter().map(|r| (r.value.clone(), r.verdict)).collect();
        assert_eq!(
            verdicts,
            [
                ("100.0 µs".to_owned(), Verdict::Info),
                ("120.0 µs, 1.20 × HAProxy's".to_owned(), Verdict::Met),
                ("50.0 µs, 0.50 × HAProxy's".to_owned(), Verdict::Met),
            ]
        );
        let missed = super::rows(&[vec![130.0], vec![50.0], vec![100.0]]);
        assert_eq!(missed[1].verdict, Verdict::Missed);
    }
}
