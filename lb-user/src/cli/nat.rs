//! `xlb status` lines of NAT mode: the NAT flow maps under the daemon's
//! line, and each NAT VIP's pool and flows under its VIP line.

use crate::ctl::{StatusReport, VipStatus};

/// `nat flows 1200/262144 (0.5%)  swept 5400  refused (ports exhausted) 0`,
/// with its newline; empty without NAT VIPs.
pub(super) fn daemon_line(report: &StatusReport) -> String {
    let Some(n) = &report.nat else {
        return String::new();
    };
    let flows = match n.entries {
        Some(e) if n.capacity > 0 => format!(
            "{e}/{} ({:.1}%)",
            n.capacity,
            e as f64 * 100.0 / n.capacity as f64
        ),
        Some(e) => e.to_string(),
        None => format!("?/{} (not counted yet)", n.capacity),
    };
    let embryonic = if n.embryonic_swept > 0 {
        format!(
            " (and {} unfinished handshakes, map over 3/4 full)",
            n.embryonic_swept
        )
    } else {
        String::new()
    };
    format!(
        "nat flows {flows}  swept {}{embryonic}  refused (ports exhausted) {}\n",
        n.swept, n.exhausted
    )
}

/// `  nat: snat 10.0.0.2, 10.0.0.3 ports 10000-32767 (45536 per backend port)  flows 12`
/// (no newline); `None` for a DSR VIP.
pub(super) fn vip_line(vip: &VipStatus) -> Option<String> {
    let n = vip.nat.as_ref()?;
    let pool = if n.preserve_client {
        "preserve_client (destination NAT only: backends see clients)".to_owned()
    } else {
        format!(
            "snat {} ports {} ({} per backend port)",
            n.snat.join(", "),
            n.snat_ports,
            n.ports_per_backend
        )
    };
    let flows = match (n.flows, n.embryonic) {
        (None, _) => "?".to_owned(),
        (Some(f), Some(e)) if e > 0 => format!("{f} ({e} unfinished handshakes or unanswered)"),
        (Some(f), _) => f.to_string(),
    };
    Some(format!("  nat: {pool}  flows {flows}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::{NatStatus, VipNatStatus};

    #[test]
    fn lines_of_a_nat_daemon_and_vip() {
        let mut report = StatusReport::default();
        assert_eq!(daemon_line(&report), "");
        report.nat = Some(Box::new(NatStatus {
            entries: Some(1310),
            capacity: 262_144,
            swept: 54,
            orphans_swept: 0,
            embryonic_swept: 0,
            exhausted: 3,
        }));
        assert_eq!(
            daemon_line(&report),
            "nat flows 1310/262144 (0.5%)  swept 54  refused (ports exhausted) 3\n"
        );
        if let Some(n) = report.nat.as_mut() {
            n.embryonic_swept = 7;
        }
        assert_eq!(
            daemon_line(&report),
            "nat flows 1310/262144 (0.5%)  swept 54 (and 7 unfinished handshakes, map over 3/4 full)  \
             refused (ports exhausted) 3\n"
        );
        let mut vip = VipStatus::default();
        assert_eq!(vip_line(&vip), None);
        vip.nat = Some(VipNatStatus {
            preserve_client: false,
            snat: vec!["10.0.0.2".into(), "10.0.0.3".into()],
            snat_ports: "10000-32767".into(),
            flows: Some(12),
            embryonic: Some(0),
            ports_per_backend: 45_536,
        });
        assert_eq!(
            vip_line(&vip).unwrap(),
            "  nat: snat 10.0.0.2, 10.0.0.3 ports 10000-32767 (45536 per backend port)  flows 12"
        );
        if let Some(n) = vip.nat.as_mut() {
            n.embryonic = Some(5);
        }
        assert!(
            vip_line(&vip)
                .unwrap()
                .ends_with("flows 12 (5 unfinished handshakes or unanswered)"),
            "{:?}",
            vip_line(&vip)
        );
        vip.nat = Some(VipNatStatus {
            preserve_client: true,
            flows: None,
            ..VipNatStatus::default()
        });
        assert_eq!(
            vip_line(&vip).unwrap(),
            "  nat: preserve_client (destination NAT only: backends see clients)  flows ?"
        );
    }
}
