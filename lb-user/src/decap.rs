//! `xlb decap`: attaches the decapsulator to a backend's interface, so the
//! backend receives `dsr-ipip` traffic without a tunnel module.

use std::net::IpAddr;

use anyhow::Context as _;
use aya::programs::XdpMode;
use lb_common::{DecapAddrKey, addr16, family_of};
use tracing::info;

use crate::{
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

/// `xlb decap --interface IF [--address A ...]`: strips IPIP/IP6IP6 addressed
/// to `addresses` (default: every address of the interface).
pub async fn run(interface: String, addresses: Vec<IpAddr>) -> anyhow::Result<()> {
    let addrs = if addresses.is_empty() {
        // The addresses IPIP packets to this backend are sent to.
        host::interface_addresses(&interface)?
    } else {
        addresses
    };
    anyhow::ensure!(
        !addrs.is_empty(),
        "{interface} has no address: give the tunnel endpoint with --address"
    );
    let list: Vec<String> = addrs.iter().map(std::string::ToString::to_string).collect();
    info!("decapsulating IPIP/IP6IP6 to {}", list.join(", "));
    let dp = attach_until_stopped(&interface, lb_common::PROG_DECAP, |dp| {
        for a in &addrs {
            dp.add_decap_addr(&DecapAddrKey {
                addr: addr16(*a),
                family: family_of(*a),
                _pad: [0; 3],
            })?;
        }
        Ok(())
    })
    .await?;
    let s = dp.decap_stats()?;
    info!(
        decapsulated = s[0],
        passed = s[1],
        dropped = s[2],
        "decapsulator stopping"
    );
    Ok(())
}

/// `xlb xdp-pass --interface IF`: attaches an `XDP_PASS` program. veth
/// delivers frames another veth sent with `XDP_TX` or a redirect only if the
/// receiving end runs an XDP program; the lab puts this one there.
pub async fn run_pass(interface: String) -> anyhow::Result<()> {
    attach_until_stopped(&interface, lb_common::PROG_PASS, |_| Ok(())).await?;
    Ok(())
}
