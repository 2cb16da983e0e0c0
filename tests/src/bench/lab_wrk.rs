//! `xlb-lab-bench`'s load: one wrk run from the client namespace and what
//! its report says (requests, req/s, latency percentiles, errors).

use std::{process::Command, time::Duration};

use anyhow::{Context as _, bail};

/// The shape of every wrk run of the benchmark: the same for every case, so
/// that only the path the requests take differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrkLoad {
    pub threads: u32,
    pub connections: u32,
    pub duration: Duration,
}

impl Default for WrkLoad {
    /// `wrk -t2 -c32 -d8s`: what the benchmark has always run.
    fn default() -> Self {
        Self {
            threads: 2,
            connections: 32,
            duration: Duration::from_secs(8),
        }
    }
}

impl WrkLoad {
    /// `-t2 -c32 -d8s`, for the report.
    pub fn describe(&self) -> String {
        format!(
            "-t{} -c{} -d{}s",
            self.threads,
            self.connections,
            self.duration.as_secs()
        )
    }
}

/// What one wrk run reported.
#[derive(Clone, Debug, PartialEq)]
pub struct WrkResult {
    /// Completed requests over the run.
    pub requests: u64,
    pub rps: f64,
    /// Latency percentiles in milliseconds (`None` if wrk printed none).
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Socket errors (connect, read, write, timeout) plus non-2xx/3xx
    /// answers.
    pub errors: u64,
    /// wrk's own error lines, `none` without errors.
    pub error_text: String,
}

/// Runs wrk inside namespace `ns` against `url`; `close` adds
/// `Connection: close`, so that every request opens a new connection.
///
/// `nsenter` execs wrk in place (no `--fork`), so wrk is this process's
/// child: its CPU time shows in this process's `cutime`/`cstime` once reaped
/// (what `lab_cpu` counts as wrk's).
pub fn run(ns: &str, url: &str, close: bool, load: &WrkLoad) -> anyhow::Result<WrkResult> {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/var/run/netns/{ns}"))
        .arg("wrk")
        .args(["-t", &load.threads.to_string()])
        .args(["-c", &load.connections.to_string()])
        .args(["-d", &format!("{}s", load.duration.as_secs())])
        .arg("--latency");
    if close {
        cmd.args(["-H", "Connection: close"]);
    }
    let out = cmd
        .arg(url)
        .output()
        .context("running wrk (Debian package `wrk`; `cargo xtask setup` installs it)")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "wrk {url} in {ns} failed ({}): {}{}",
            out.status,
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse(&text).with_context(|| format!("reading wrk's report for {url}:\n{text}"))
}

/// The first word after `key` on the first line that starts with `key`.
fn field<'a>(out: &'a str, key: &str) -> Option<&'a str> {
    out.lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
}

/// wrk's latency (`812.00us`, `1.23ms`, `2.01s`) in milliseconds.
fn latency_ms(s: &str) -> Option<f64> {
    let (number, scale) = if let Some(n) = s.strip_suffix("us") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e3)
    } else {
        return None;
    };
    number.parse::<f64>().ok().map(|v| v * scale)
}

/// The sum of the numbers in `Socket errors: connect 0, read 1, write 0,
/// timeout 2`.
fn socket_errors(line: &str) -> u64 {
    line.split([',', ':'])
        .filter_map(|part| part.split_whitespace().last()?.parse::<u64>().ok())
        .sum()
}

/// Reads wrk's `--latency` report.
pub fn parse(text: &str) -> anyhow::Result<WrkResult> {
    let rps: f64 = field(text, "Requests/sec:")
        .context("wrk printed no `Requests/sec:`")?
        .parse()
        .context("wrk's `Requests/sec:` is not a number")?;
    // `  123456 requests in 8.00s, 12.34MB read`
    let requests = text
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .context("wrk printed no `N requests in` line")?;
    let mut errors = 0;
    let mut lines = Vec::new();
    for l in text.lines().map(str::trim) {
        if l.starts_with("Socket errors:") {
            errors += socket_errors(l);
            lines.push(l.to_string());
        } else if let Some(n) = l.strip_prefix("Non-2xx or 3xx responses:") {
            errors += n.trim().parse::<u64>().unwrap_or(0);
            lines.push(l.to_string());
        }
    }
    Ok(WrkResult {
        requests,
        rps,
        p50_ms: field(text, "50%").and_then(latency_ms),
        p99_ms: field(text, "99%").and_then(latency_ms),
        errors,
        error_text: if lines.is_empty() {
            "none".to_string()
        } else {
            lines.join("; ")
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "Running 8s test @ http://10.100.0.1/api
  2 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   512.33us  201.10us   9.87ms   88.00%
    Req/Sec    31.90k     2.01k   36.00k    70.00%
  Latency Distribution
     50%  480.00us
     75%  600.00us
     90%  750.00us
     99%    1.21ms
  508213 requests in 8.00s, 60.10MB read
  Socket errors: connect 0, read 3, write 0, timeout 2
  Non-2xx or 3xx responses: 4
Requests/sec:  63526.62
Transfer/sec:      7.51MB
";

    #[test]
    fn reads_a_report() {
        let r = parse(REPORT).unwrap();
        assert_eq!(r.requests, 508_213);
        assert!((r.rps - 63_526.62).abs() < 1e-6);
        assert!((r.p50_ms.unwrap() - 0.48).abs() < 1e-9);
        assert!((r.p99_ms.unwrap() - 1.21).abs() < 1e-9);
        assert_eq!(r.errors, 9);
        assert!(r.error_text.contains("read 3"), "{}", r.error_text);
    }

    #[test]
    fn latency_units() {
        let cases = [
            ("micro", "812.00us", Some(0.812)),
            ("milli", "1.50ms", Some(1.5)),
            ("seconds", "2.00s", Some(2000.0)),
            ("minutes are not a latency wrk prints here", "1.00m", None),
            ("garbage", "fast", None),
        ];
        for (name, s, want) in cases {
            let got = latency_ms(s);
            match (got, want) {
                (Some(g), Some(w)) => assert!((g - w).abs() < 1e-9, "{name}: {g}"),
                (g, w) => assert_eq!(g, w, "{name}"),
            }
        }
    }

    #[test]
    fn a_clean_run_has_no_errors() {
        let clean: String = REPORT
            .lines()
            .filter(|l| !l.contains("errors") && !l.contains("Non-2xx"))
            .map(|l| format!("{l}\n"))
            .collect();
        let r = parse(&clean).unwrap();
        assert_eq!((r.errors, r.error_text.as_str()), (0, "none"));
        assert!(parse("Running 8s test").is_err());
    }
}
