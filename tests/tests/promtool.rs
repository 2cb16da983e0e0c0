//! Issue 28: the Grafana dashboard and the Prometheus alert rules shipped
//! in `contrib/`. The rules pass `promtool check rules` and their unit
//! tests (`promtool test rules`: each alert fires on its case and not on
//! the healthy one beside it), every alert has a test, and every metric
//! name the dashboard and the rules use is one xlb exports
//! (`lb_user::metrics::series_names`), so neither can drift from the code.
//!
//! Needs `promtool` (Debian package `prometheus`, installed by `cargo
//! xtask setup`); no root: `cargo test -p xlb-tests --test promtool`.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn contrib(path: &str) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .unwrap_or(manifest)
        .join("contrib")
        .join(path)
}

fn read(path: &str) -> String {
    let p = contrib(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Runs promtool with `args` in `dir`; fails the test with its output
/// unless it succeeds.
fn promtool(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool (Debian package prometheus; `cargo xtask setup` installs it): {e}")
        });
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {args:?} ({}):\n{said}",
        out.status
    );
    said
}

#[test]
fn alert_rules_pass_promtool_check() {
    let said = promtool(
        &contrib("prometheus"),
        &["check", "rules", "xlb-alerts.yml"],
    );
    assert!(said.contains("SUCCESS: 9 rules found"), "{said}");
}

#[test]
fn alert_rules_pass_their_unit_tests() {
    let said = promtool(
        &contrib("prometheus"),
        &["test", "rules", "xlb-alerts.test.yml"],
    );
    assert!(said.contains("SUCCESS"), "{said}");
}

/// The `- alert: Name` lines of the rules file.
fn alert_names(rules: &str) -> Vec<&str> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect()
}

#[test]
fn every_alert_is_unit_tested_firing_and_silent() {
    let rules = read("prometheus/xlb-alerts.yml");
    let tests = read("prometheus/xlb-alerts.test.yml");
    let alerts = alert_names(&rules);
    let want = [
        "XlbVipNoBackendUp",
        "XlbVipPanic",
        "XlbBackendFlapping",
        "XlbConntrackNearFull",
        "XlbNoBackendDrops",
        "XlbSourceRateLimited",
        "XlbSourceOverAlert",
        "XlbDown",
        "XlbNotScraped",
    ];
    assert_eq!(alerts, want);
    // Each alert's test cases, as (alertname, whether alerts are expected).
    let mut cases: Vec<(String, bool)> = Vec::new();
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    for (i, line) in lines.iter().enumerate() {
        if let Some(name) = line.strip_prefix("alertname: ") {
            let next = lines.get(i + 1).copied().unwrap_or("");
            cases.push((name.to_owned(), next != "exp_alerts: []"));
        }
    }
    for alert in alerts {
        for fires in [true, false] {
            assert!(
                cases.contains(&(alert.to_owned(), fires)),
                "{alert} has no case where it {}",
                if fires { "fires" } else { "stays silent" }
            );
        }
    }
}

/// The `xlb_…` metric names in `text` that xlb does not export.
fn unknown_names(text: &str) -> BTreeSet<String> {
    let known = lb_user::metrics::series_names();
    let mut unknown = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("xlb_") {
        let start = i + at;
        let boundary = start == 0 || {
            let c = bytes[start - 1];
            !(c.is_ascii_alphanumeric() || c == b'_')
        };
        let end = text[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(text.len(), |n| start + n);
        let name = &text[start..end];
        if boundary && !known.iter().any(|k| k == name) {
            unknown.insert(name.to_owned());
        }
        i = end;
    }
    unknown
}

#[test]
fn dashboard_and_rules_use_only_real_metric_names() {
    // The check itself catches a misspelt or removed metric.
    let probe = "rate(xlb_vip_packet_total[5m]) + xlb_backend_probe_latency_seconds_bucket \
                 + xlb_backend_up_count";
    assert_eq!(
        unknown_names(probe),
        BTreeSet::from([
            "xlb_backend_up_count".to_owned(),
            "xlb_vip_packet_total".to_owned()
        ])
    );

    let rules = read("prometheus/xlb-alerts.yml");
    let tests = read("prometheus/xlb-alerts.test.yml");
    let dashboard = read("grafana/xlb.json");
    for (file, text) in [
        ("xlb-alerts.yml", &rules),
        ("xlb-alerts.test.yml", &tests),
        ("xlb.json", &dashboard),
    ] {
        let unknown = unknown_names(text);
        assert!(
            unknown.is_empty(),
            "{file} uses metrics xlb does not export: {unknown:?}"
        );
    }

    // The dashboard is Grafana JSON whose every query names an xlb metric
    // (or Prometheus's own `up`), and it covers what the issue asks for.
    let dash: serde_json::Value = serde_json::from_str(&dashboard).expect("valid JSON");
    let panels = dash["panels"].as_array().expect("panels");
    let mut exprs = Vec::new();
    for p in panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("a PromQL expr");
            assert!(
                expr.contains("xlb_") || expr.starts_with("up{"),
                "{}: {expr}",
                p["title"]
            );
            exprs.push(expr.to_owned());
        }
    }
    // Grafana's own constraints: unique panel ids, panels within the
    // 24-column grid, every query on the dashboard's data source variable
    // (so an import asks for a Prometheus, not a uid of ours).
    let mut ids = BTreeSet::new();
    for p in panels {
        let id = p["id"].as_u64().expect("a panel id");
        assert!(ids.insert(id), "panel id {id} twice");
        let (x, w) = (p["gridPos"]["x"].as_u64(), p["gridPos"]["w"].as_u64());
        let (x, w) = (x.expect("gridPos.x"), w.expect("gridPos.w"));
        assert!(w >= 1 && x + w <= 24, "{}: x {x} w {w}", p["title"]);
        if p["type"] != "row" {
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        }
    }
    let all = exprs.join("\n");
    for needed in [
        "xlb_backend_state",
        "xlb_vip_backends_up",
        "xlb_vip_packets_total",
        "reason=~\"drop_.*\"",
        "xlb_conntrack_established_flows",
        "xlb_backend_probe_latency_seconds_bucket",
        "xlb_backend_probe_failures_total",
        "xlb_vip_announced",
    ] {
        assert!(all.contains(needed), "the dashboard shows no {needed}");
    }
}

/// README, "Metrics": its table names every metric family xlb exports (a
/// histogram by its family name), so a new metric is documented with it.
#[test]
fn readme_metrics_table_names_every_family() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = manifest.parent().unwrap_or(manifest).join("README.md");
    let readme = std::fs::read_to_string(&readme).unwrap();
    let table = readme
        .split_once("\n## Metrics\n")
        .and_then(|(_, rest)| rest.split_once("\n## ").map(|(t, _)| t))
        .expect("README has a \"## Metrics\" section");
    let series = lb_user::metrics::series_names();
    let families: BTreeSet<&str> = series
        .iter()
        .map(|s| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|x| {
                    let base = s.strip_suffix(x)?;
                    series.contains(&format!("{base}_bucket")).then_some(base)
                })
                .unwrap_or(s)
        })
        .collect();
    let missing: Vec<&&str> = families
        .iter()
        .filter(|f| !table.contains(&format!("`{f}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "README's metrics table lacks {missing:?}"
    );
    assert!(families.contains("xlb_backend_probe_latency_seconds"));
}
