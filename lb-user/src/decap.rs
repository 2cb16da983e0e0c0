//! `xlb decap`: attaches the decapsulator to a backend's interface, so the
//! backend receives `dsr-ipip` traffic without a tunnel module.

use anyhow::Context as _;
use aya::programs::XdpMode;
use lb_common::{DECAP_STATS_LEN, DecapStat};
use tracing::{info, warn};

use crate::{
    cli::decap::DecapSettings,
    dataplane::{Dataplane, LoadOptions},
    host,
};

/// Loads the object with minimal map sizes (only the decapsulator's maps are
/// used), attaches `program` to `interface`, and keeps it attached until
/// SIGTERM/SIGINT; the link goes with the process.
async fn attach_until_stopped(
    interface: &str,
    program: &'static str,
    setup: impl FnOnce(&mut Dataplane) -> anyhow::Result<()>,
) -> anyhow::Result<Dataplane> {
    let mut dp = Dataplane::load(&LoadOptions {
        ct_size: 1,
        ring_stride: 2,
        pin_dir: None,
    })?;
    setup(&mut dp)?;
    let prog = dp.program::<aya::programs::Xdp>(program)?;
    prog.attach(interface, XdpMode::Default)
        .with_context(|| format!("attaching {program} to {interface}"))?;
    info!("{program} attached to {interface}; Ctrl-C or SIGTERM detaches it");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(dp)
}

/// `xlb decap`: strips IPIP/IP6IP6 addressed to `s.addresses` (default:
/// every address of the interface) from `s.allow_sources` to `s.vips`.
pub async fn run(s: DecapSettings) -> anyhow::Result<()> {
    let interface = s.interface.as_str();
    let addrs = if s.addresses.is_empty() {
        // The addresses IPIP packets to this backend are sent to.
        host::interface_addresses(interface)?
    } else {
        s.addresses.clone()
    };
    anyhow::ensure!(
        !addrs.is_empty(),
        "{interface} has no address: give the tunnel endpoint with --address"
    );
    info!(
        "decapsulating IPIP/IP6IP6 to {} from {} to VIPs {}",
        list(&addrs),
        list(&s.allow_sources),
        list(&s.vips)
    );
    for w in s.warnings() {
        warn!("{w}");
    }
    let dp = attach_until_stopped(interface, lb_common::PROG_DECAP, |dp| {
        for a in &addrs {
            dp.add_decap_addr(*a)?;
        }
        for p in &s.allow_sources {
            dp.add_decap_source(p.addr, p.len)?;
        }
        for v in &s.vips {
            dp.add_decap_vip(*v)?;
        }
        Ok(())
    })
    .await?;
    info!(
        "decapsulator stopping: {}",
        render_stats(&dp.decap_stats()?)
    );
    Ok(())
}

fn list<T: std::fmt::Display>(items: &[T]) -> String {
    let v: Vec<String> = items.iter().map(ToString::to_string).collect();
    v.join(", ")
}

/// The counters as `name=value` pairs, in index order.
pub fn render_stats(stats: &[u64; DECAP_STATS_LEN as usize]) -> String {
    let v: Vec<String> = DecapStat::ALL
        .iter()
        .map(|s| format!("{}={}", s.name(), stats[*s as usize]))
        .collect();
    v.join(" ")
}

/// `xlb xdp-pass --interface IF`: attaches an `XDP_PASS` program. veth
/// delivers frames another veth sent with `XDP_TX` or a redirect only if the
/// receiving end runs an XDP program; the lab puts this one there.
pub async fn run_pass(interface: String) -> anyhow::Result<()> {
    attach_until_stopped(&interface, lb_common::PROG_PASS, |_| Ok(())).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn stats_name_every_counter() {
        assert_eq!(
            super::render_stats(&[1, 2, 3, 4, 5, 6, 7, 8, 9]),
            "decap=1 pass=2 drop_malformed=3 drop_source=4 drop_inner_dst=5 drop_unchecked=6 \
             second_chance_local=7 second_chance_forward=8 second_chance_no_route=9"
        );
    }
}
