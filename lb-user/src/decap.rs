//! `xlb decap`: attaches the decapsulator to a backend's interface, so the
//! backend receives `dsr-ipip` traffic without a tunnel module.

use std::net::IpAddr;

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
    let mut dp = Dataplane::load_programs(
        &LoadOptions {
            ct_size: 1,
            nat_size: 1,
            ring_stride: 2,
            pin_dir: None,
            kernel: None,
        },
        &[program],
    )?;
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
    if s.second_chance {
        let v6 = s.vips.iter().any(IpAddr::is_ipv6);
        if let Some(w) =
            forwarding_advice(interface, v6, &|path| std::fs::read_to_string(path).ok())
        {
            warn!("{w}");
        }
    }
    let dp = attach_until_stopped(interface, lb_common::PROG_DECAP, |dp| {
        for a in &addrs {
            dp.add_decap_addr_with(*a, s.second_chance)?;
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

/// Second chance relays packets with `bpf_fib_lookup`, which answers
/// "forwarding disabled" unless forwarding is on on the interface the
/// packet came in on (checked on kernel 6.18: `bpf_ipv4_fib_lookup` and
/// `bpf_ipv6_fib_lookup` test it whatever the flags). Not set here: on a
/// backend it changes more than xlb's packets (IPv6 stops taking router
/// advertisements unless `accept_ra = 2`), so the operator decides. Without
/// it the packets go up (`second_chance_no_route`) as without second
/// chance. `read` reads a sysctl file.
pub fn forwarding_advice(
    iface: &str,
    v6: bool,
    read: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    let mut keys = vec![("ipv4", format!("net.ipv4.conf.{iface}.forwarding"))];
    if v6 {
        keys.push(("ipv6", format!("net.ipv6.conf.{iface}.forwarding")));
    }
    let off: Vec<String> = keys
        .into_iter()
        .filter(|(family, _)| {
            let path = format!("/proc/sys/net/{family}/conf/{iface}/forwarding");
            read(&path).is_none_or(|v| v.trim() == "0")
        })
        .map(|(_, key)| key)
        .collect();
    if off.is_empty() {
        return None;
    }
    Some(format!(
        "second chance cannot relay packets to their previous backend while forwarding is off on \
         {iface} (bpf_fib_lookup needs it): they go up here instead (second_chance_no_route), \
         where a connection the previous backend holds is reset; run `sysctl -w {}` (with \
         net.ipv6.conf.{iface}.accept_ra = 2 if {iface} takes router advertisements), or \
         pass --second-chance off",
        off.iter()
            .map(|k| format!("{k}=1"))
            .collect::<Vec<_>>()
            .join(" ")
    ))
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
    fn forwarding_advice_names_what_to_set() {
        let sysctls = |v4: &'static str, v6: &'static str| {
            move |path: &str| -> Option<String> {
                Some(if path.contains("ipv4") { v4 } else { v6 }.to_owned())
            }
        };
        assert_eq!(
            super::forwarding_advice("eth0", true, &sysctls("1\n", "1\n")),
            None
        );
        assert_eq!(
            super::forwarding_advice("eth0", false, &sysctls("1\n", "0\n")),
            None
        );
        let w = super::forwarding_advice("eth0", true, &sysctls("0\n", "1\n")).unwrap();
        assert!(
            w.contains("`sysctl -w net.ipv4.conf.eth0.forwarding=1`"),
            "{w}"
        );
        let w = super::forwarding_advice("eth0", true, &sysctls("0\n", "0\n")).unwrap();
        assert!(
            w.contains(
                "`sysctl -w net.ipv4.conf.eth0.forwarding=1 net.ipv6.conf.eth0.forwarding=1`"
            ),
            "{w}"
        );
        assert!(w.ends_with("or pass --second-chance off"), "{w}");
        // Unreadable: said, not guessed.
        assert!(super::forwarding_advice("eth0", false, &|_| None).is_some());
    }

    #[test]
    fn stats_name_every_counter() {
        assert_eq!(
            super::render_stats(&[1, 2, 3, 4, 5, 6, 7, 8, 9]),
            "decap=1 pass=2 drop_malformed=3 drop_source=4 drop_inner_dst=5 drop_unchecked=6 \
             second_chance_local=7 second_chance_forward=8 second_chance_no_route=9"
        );
    }
}
