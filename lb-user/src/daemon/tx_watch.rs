//! Frames forwarded that do not leave (issue 39): a VIP black-holed while
//! every backend shows `up`. The data plane counts a frame `fwd_tx` (or
//! `fwd_redirect`) when it returns `XDP_TX` (or redirects); whether the
//! driver then sends it, the program cannot see. A veth whose peer has no
//! XDP program drops every such frame, and so does a driver without
//! `XDP_TX` in the mode chosen, or a full TX ring; the data-path probes
//! never take that path (they leave through the tc program `xlb_hc`), so
//! the backends stay `up` while every client times out. The drivers count
//! those frames in the interface's TX drops (veth among them), so every
//! tick the daemon compares what the data plane forwarded with what the
//! host's interfaces dropped on transmit: when half or more of the
//! forwarded frames are dropped, two samples in a row, it raises an
//! `alarm` (event, warning, `xlb status` line, metric), and clears it after
//! [`CLEAR_AFTER`] samples in a row without.

use super::Daemon;
use super::alarms::{Counters, Edge};

/// Fewest frames forwarded in a sample for it to be judged.
pub(super) const MIN_FRAMES: u64 = 20;
/// Samples in a row with the drops before the alarm is raised.
pub(super) const RAISE_AFTER: u32 = 2;
/// Samples in a row without them before it clears.
pub(super) const CLEAR_AFTER: u32 = 5;

/// The TX watch's state.
#[derive(Debug, Default)]
pub(super) struct TxWatch {
    /// Forwarded and TX-dropped totals at the last sample.
    last: Option<(u64, u64)>,
    bad: u32,
    good: u32,
    /// Frames dropped since the alarm was raised, and forwarded.
    raised: Option<(u64, u64)>,
}

impl TxWatch {
    /// Feeds one sample: `forwarded` (`fwd_tx` + `fwd_redirect`) and
    /// `dropped` (the interfaces' TX drops), both totals. The edge to tell,
    /// if any, with its text (`iface` names the interface).
    pub(super) fn update(
        &mut self,
        forwarded: u64,
        dropped: u64,
        iface: &str,
    ) -> Option<(Edge, String)> {
        let (f0, d0) = self.last.replace((forwarded, dropped))?;
        // A total that went back: counters re-created; a new baseline.
        let (df, dd) = (forwarded.checked_sub(f0)?, dropped.checked_sub(d0)?);
        let bad = df >= MIN_FRAMES && dd.saturating_mul(2) >= df;
        if bad {
            self.bad += 1;
            self.good = 0;
        } else {
            self.good += 1;
            self.bad = 0;
        }
        if let Some((fwd, drop)) = self.raised.as_mut() {
            *fwd += df;
            *drop += dd;
        }
        match self.raised {
            None if self.bad >= RAISE_AFTER => {
                self.raised = Some((df, dd));
                Some((
                    Edge::Raised,
                    format!(
                        "forwarded frames are not leaving: {dd} of the {df} frames the data \
                         plane forwarded in the last sample were dropped on transmit (TX \
                         drops of this host's interfaces). Clients of every VIP on {iface} \
                         time out while the backends show up. On a veth, the peer needs an \
                         XDP program for XDP_TX frames (`xlb xdp-pass --interface PEER` in \
                         the peer's namespace); on a NIC, check its XDP_TX support in this \
                         XDP mode (`ethtool -S {iface}`, xdp_tx errors) and its TX ring"
                    ),
                ))
            }
            Some((fwd, drop)) if self.good >= CLEAR_AFTER => {
                self.raised = None;
                Some((
                    Edge::Cleared,
                    format!(
                        "forwarded frames leave again: {drop} of {fwd} forwarded frames were \
                         dropped on transmit while the alarm stood"
                    ),
                ))
            }
            _ => None,
        }
    }

    /// Whether the alarm stands.
    #[cfg(test)]
    pub(super) fn raised(&self) -> bool {
        self.raised.is_some()
    }
}

/// The TX drops of every interface, summed, from the text of
/// `/proc/net/dev` (the reading process's network namespace, unlike
/// `/sys/class/net`, which is the mounting one's); `None` without any.
pub(super) fn tx_dropped(proc_net_dev: &str) -> Option<u64> {
    // "  eth0: rx bytes packets errs drop fifo frame compressed multicast
    //  tx bytes packets errs drop …": TX drop is the 12th number.
    let mut total = None;
    for line in proc_net_dev.lines() {
        let Some((_, numbers)) = line.split_once(':') else {
            continue;
        };
        if let Some(n) = numbers
            .split_whitespace()
            .nth(11)
            .and_then(|t| t.parse::<u64>().ok())
        {
            *total.get_or_insert(0) += n;
        }
    }
    total
}

impl Daemon {
    /// Every tick: the data plane's forwarded frames against the host's TX
    /// drops.
    pub(super) fn check_tx(&mut self, stats: &Counters) {
        let Some(dropped) = std::fs::read_to_string("/proc/net/dev")
            .ok()
            .and_then(|t| tx_dropped(&t))
        else {
            return;
        };
        let forwarded = [lb_common::Stat::FwdTx, lb_common::Stat::FwdRedirect]
            .iter()
            .map(|s| stats.get(s).copied().unwrap_or(0))
            .sum();
        let iface = self.cfg.daemon.pinned.interface.clone();
        if let Some((edge, text)) = self.tx_watch.update(forwarded, dropped, &iface) {
            self.tx_alarm = (edge == Edge::Raised).then(|| text.clone());
            self.tell_alarm(edge, None, None, text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raised_after_two_samples_of_drops_and_cleared_after_five_without() {
        let mut w = TxWatch::default();
        assert_eq!(w.update(1000, 7, "eth0"), None, "the baseline");
        // Normal traffic: a few drops (other traffic) are no alarm.
        assert_eq!(w.update(2000, 9, "eth0"), None);
        // Every forwarded frame dropped: raised at the second sample.
        assert_eq!(w.update(2100, 109, "eth0"), None);
        assert!(!w.raised());
        let (edge, text) = w.update(2200, 209, "eth0").unwrap();
        assert_eq!(edge, Edge::Raised);
        assert!(
            text.starts_with(
                "forwarded frames are not leaving: 100 of the 100 frames the data plane \
                 forwarded in the last sample were dropped on transmit"
            ),
            "{text}"
        );
        assert!(text.contains("xlb xdp-pass"), "{text}");
        assert!(w.raised());
        // Still dropping: told once.
        assert_eq!(w.update(2300, 309, "eth0"), None);
        // Fixed: cleared after five clean samples (idle ones count).
        for i in 0..4 {
            assert_eq!(w.update(2400 + 100 * i, 309, "eth0"), None, "{i}");
        }
        let (edge, text) = w.update(2800, 309, "eth0").unwrap();
        assert_eq!(edge, Edge::Cleared);
        assert_eq!(
            text,
            "forwarded frames leave again: 200 of 700 forwarded frames were dropped on \
             transmit while the alarm stood"
        );
        assert!(!w.raised());
    }

    #[test]
    fn little_traffic_and_counters_that_go_back_are_not_judged() {
        let mut w = TxWatch::default();
        w.update(0, 0, "eth0");
        // Fewer than MIN_FRAMES forwarded: a handful of drops is noise.
        for i in 1..=5 {
            assert_eq!(w.update(10 * i, 10 * i, "eth0"), None);
        }
        // Counters re-created (a new program): a new baseline, no alarm.
        assert_eq!(w.update(0, 0, "eth0"), None);
        assert_eq!(w.update(100, 100, "eth0"), None);
        assert!(!w.raised());
    }

    #[test]
    fn the_tx_drops_of_every_interface_are_summed() {
        let text = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  eth0:  218880    2906    0    5    0     0          0         0   288104    2631    0  328    0     0       0          0
 veth9:     100       1    0    0    0     0          0         0      200       2    0   14    0     0       0          0
";
        assert_eq!(tx_dropped(text), Some(342));
        assert_eq!(tx_dropped("Inter-|   Receive\n"), None);
    }
}
