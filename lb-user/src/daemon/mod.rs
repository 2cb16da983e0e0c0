//! `xlb run`: the daemon. Loads and attaches the data plane (adopting what a
//! previous run pinned), probes every backend, rewrites the maps when health
//! changes, and answers the control socket.
//!
//! Everything that touches the maps runs on one task (the main loop); the
//! control socket and the metrics endpoint talk to it over channels, so no
//! lock is ever held across a map write and the packet path never waits.

mod api;
mod conntrack;
pub mod model;
pub mod persist;

use std::{
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use aya::{
    programs::{
        TcAttachType, XdpMode,
        links::{FdLink, PinnedLink},
        tc::{self, SchedClassifierLink},
        xdp::XdpLink,
    },
    util::KernelVersion,
};
use lb_common::{Globals, LAYOUT_VERSION};
use tracing::{info, warn};

use crate::{
    config::{Config, DaemonConfig, Mode, VipConfig, XdpMode as CfgXdpMode},
    dataplane::{Dataplane, LoadOptions},
};

pub use api::Daemon;

/// Capabilities `xlb run` needs, with why.
const NEEDED_CAPS: &[(u32, &str, &str)] = &[
    (
        21,
        "CAP_SYS_ADMIN",
        "load BPF programs and pin them in bpffs",
    ),
    (
        12,
        "CAP_NET_ADMIN",
        "attach XDP to an interface and set its forwarding sysctl",
    ),
];

/// Fails with the missing capabilities named, before anything is touched.
pub fn check_capabilities() -> anyhow::Result<()> {
    let status = fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .context("no CapEff line in /proc/self/status")?;
    let missing: Vec<String> = NEEDED_CAPS
        .iter()
        .filter(|(bit, _, _)| eff & (1u64 << bit) == 0)
        .map(|(_, name, why)| format!("{name} (to {why})"))
        .collect();
    if !missing.is_empty() {
        bail!(
            "xlb run lacks capabilities: {}; run it as root (e.g. `cargo xtask run -- run --config FILE`) \
             or grant them with setcap/systemd AmbientCapabilities",
            missing.join(", ")
        );
    }
    Ok(())
}

/// Mounts bpffs at /sys/fs/bpf if it is not there (pins need it).
fn ensure_bpffs() -> anyhow::Result<()> {
    if persist::is_bpffs(Path::new("/sys/fs/bpf")) {
        return Ok(());
    }
    nix::mount::mount(
        Some("bpf"),
        "/sys/fs/bpf",
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .context("mounting bpffs on /sys/fs/bpf (mount -t bpf bpf /sys/fs/bpf)")?;
    // `ip netns exec` gives its command a private mount namespace with a
    // fresh /sys: a bpffs mounted there dies with this process, and so would
    // the pins. Say so; `nsenter --net=/var/run/netns/NAME` keeps the host's.
    warn!(
        "mounted bpffs on /sys/fs/bpf; if this process runs in a private mount namespace \
         (ip netns exec), pinned state vanishes when it exits: start xlb with \
         `nsenter --net=/var/run/netns/NAME` instead"
    );
    Ok(())
}

/// `bpf_fib_lookup` from XDP answers "forwarding disabled" unless forwarding
/// is on for the ingress interface (checked on 6.18), so turn it on there,
/// and only there.
fn enable_forwarding(iface: &str, v6: bool) -> anyhow::Result<()> {
    let mut keys = vec![format!("/proc/sys/net/ipv4/conf/{iface}/forwarding")];
    if v6 {
        keys.push(format!("/proc/sys/net/ipv6/conf/{iface}/forwarding"));
    }
    for k in keys {
        let cur = fs::read_to_string(&k).with_context(|| format!("reading {k}"))?;
        if cur.trim() != "1" {
            fs::write(&k, "1").with_context(|| format!("writing 1 to {k}"))?;
            info!("set {k} = 1 (bpf_fib_lookup needs it for the XDP interface)");
        }
    }
    Ok(())
}

/// Every address of `iface`, in the order the kernel lists them.
pub(crate) fn interface_addresses(iface: &str) -> anyhow::Result<Vec<IpAddr>> {
    let mut out = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs().context("getifaddrs")? {
        if ifa.interface_name != iface {
            continue;
        }
        let Some(addr) = ifa.address else { continue };
        if let Some(sin) = addr.as_sockaddr_in() {
            out.push(IpAddr::V4(sin.ip()));
        } else if let Some(sin6) = addr.as_sockaddr_in6() {
            out.push(IpAddr::V6(sin6.ip()));
        }
    }
    Ok(out)
}

/// The interface's first IPv4 and first global IPv6 address.
fn interface_addrs(iface: &str) -> anyhow::Result<(Option<Ipv4Addr>, Option<Ipv6Addr>)> {
    let addrs = interface_addresses(iface)?;
    let v4 = addrs.iter().find_map(|a| match a {
        IpAddr::V4(v4) => Some(*v4),
        IpAddr::V6(_) => None,
    });
    let v6 = addrs.iter().find_map(|a| match a {
        IpAddr::V6(v6) if !v6.is_loopback() && !v6.is_unicast_link_local() => Some(*v6),
        _ => None,
    });
    Ok((v4, v6))
}

fn to16(a: IpAddr) -> [u8; 16] {
    model::addr16(a)
}

/// Writes `Globals`: keeps the pinned hash key unless the configuration sets
/// one (so a restart never moves flows), else draws a random one.
fn write_globals(dp: &mut Dataplane, d: &DaemonConfig, vips: &[VipConfig]) -> anyhow::Result<()> {
    let mut g = dp.globals()?;
    let (v4, v6) = interface_addrs(&d.interface)?;
    let key = match d.hash_seed {
        Some(k) => {
            if g.hash_key != [0, 0] && g.hash_key != k {
                warn!(
                    "daemon.hash_seed differs from the pinned hash key: new flows may move to other backends (established ones keep theirs)"
                );
            }
            k
        }
        None if g.hash_key != [0, 0] => g.hash_key,
        None => [rand::random(), rand::random()],
    };
    let src4 = d.encap_source_v4.or(v4);
    let src6 = d.encap_source_v6.or(v6);
    g = Globals {
        layout_version: LAYOUT_VERSION,
        ring_stride: dp.ring_stride(),
        hash_key: key,
        udp_timeout_ns: d.udp_timeout.as_nanos() as u64,
        encap_src_v4: src4.map(|a| to16(IpAddr::V4(a))).unwrap_or_default(),
        encap_src_v6: src6.map(|a| to16(IpAddr::V6(a))).unwrap_or_default(),
    };
    dp.set_globals(&g)?;
    let ipip = |v6: bool| {
        vips.iter()
            .any(|v| v.mode == Mode::DsrIpip && v.addr.is_ipv6() == v6)
    };
    if src4.is_none() && ipip(false) {
        warn!(interface = %d.interface, "no IPv4 address on the interface and no daemon.encap_source_v4: IPv4 dsr-ipip packets get source 0.0.0.0");
    }
    if src6.is_none() && ipip(true) {
        warn!(interface = %d.interface, "no global IPv6 address on the interface and no daemon.encap_source_v6: IPv6 dsr-ipip packets get source ::");
    }
    Ok(())
}

/// Attaches `xlb_lb`: adopts the pinned link if there is one (replacing its
/// program in place: no detach, no gap), else attaches and pins a new one.
/// Returns the link id.
fn attach(dp: &mut Dataplane, d: &DaemonConfig, pin_dir: &Path) -> anyhow::Result<(u32, bool)> {
    let link_path = pin_dir.join(persist::LINK_PIN);
    let prog = dp.program::<aya::programs::Xdp>(lb_common::PROG_LB)?;
    if link_path.exists() {
        let pinned = PinnedLink::from_pin(&link_path)
            .with_context(|| format!("opening pinned link {}", link_path.display()))?;
        let fd: FdLink = pinned.into();
        let id = fd.info().context("reading pinned link info")?.id();
        let link = XdpLink::try_from(fd).context("pinned link is not an XDP link")?;
        prog.attach_to_link(link)
            .context("replacing the program of the pinned XDP link")?;
        // The kernel holds the link through its pin; our descriptor may go.
        return Ok((id, true));
    }
    let mode = match d.xdp_mode {
        CfgXdpMode::Native => XdpMode::Driver,
        CfgXdpMode::Generic => {
            warn!(interface = %d.interface, "xdp_mode = generic: XDP runs in the skb path, far slower than native; for testing");
            XdpMode::Skb
        }
    };
    let link_id = prog.attach(&d.interface, mode).with_context(|| {
        format!(
            "attaching XDP to {} in {:?} mode (is the interface up and its driver XDP-capable? try xdp_mode = \"generic\")",
            d.interface, d.xdp_mode
        )
    })?;
    let link = prog.take_link(link_id)?;
    let fd = FdLink::try_from(link).context(
        "the kernel attached XDP through netlink, not a BPF link, so it cannot be pinned (kernel ≥ 5.9 needed)",
    )?;
    let id = fd.info()?.id();
    fd.pin(&link_path)
        .with_context(|| format!("pinning the XDP link at {}", link_path.display()))?;
    Ok((id, false))
}

/// `xlb run --config FILE`.
pub async fn run(config_path: PathBuf) -> anyhow::Result<()> {
    check_capabilities()?;
    let cfg = Config::from_file(&config_path).map_err(|e| anyhow::anyhow!("{e}"))?;
    for w in &cfg.warnings {
        warn!("{w}");
    }
    raise_nofile(&cfg);
    // The control socket first: a second daemon for the same socket stops
    // here, before it touches the maps or the link of the running one.
    let listener = crate::ctl::bind(
        &cfg.daemon.control_socket,
        cfg.daemon.socket_group.as_deref(),
    )?;
    let daemon = start(config_path, cfg)?;
    daemon.serve(listener).await
}

/// Descriptors wanted besides probes: maps, links, the control socket and
/// its clients, metrics connections.
const NOFILE_RESERVE: u64 = 1024;

/// Descriptors `cfg` may need: every probe holds a socket, and with
/// hang_timeout a backend can have `ceil(hang_timeout / interval) + 1`
/// probes in flight, so `probe_concurrency × that + NOFILE_RESERVE`.
fn nofile_wanted(cfg: &Config) -> u64 {
    let per_backend = cfg
        .vips
        .iter()
        .flat_map(|v| &v.backends)
        .map(|b| {
            let h = &b.health;
            h.hang_timeout
                .as_nanos()
                .div_ceil(h.interval.as_nanos().max(1))
                + 1
        })
        .max()
        .unwrap_or(1);
    let per_backend = u64::try_from(per_backend).unwrap_or(u64::MAX);
    u64::from(cfg.daemon.probe_concurrency)
        .saturating_mul(per_backend)
        .saturating_add(NOFILE_RESERVE)
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (systemd's default soft
/// limit is 1024) and logs what it got: a probe that cannot open a socket is
/// a local error, not the backend's fault, but it is a probe lost. Never
/// fails: the daemon runs with whatever it has.
/// Raises the soft RLIMIT_NOFILE to `target`, within the hard limit and
/// `fs.nr_open`, and returns the limits then in force (soft, hard).
/// Shared with the health benchmark, which needs as many descriptors.
///
/// # Errors
///
/// `getrlimit` or `setrlimit` failing.
pub fn raise_nofile_to(target: u64) -> std::io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the duration of the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // An unlimited hard limit cannot be the soft one: the kernel caps it at
    // fs.nr_open (setrlimit(2), EPERM above it).
    let nr_open = fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20);
    let target = target.min(lim.rlim_max).min(nr_open);
    if lim.rlim_cur < target {
        let raised = libc::rlimit {
            rlim_cur: target,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit; only the soft limit changed,
        // within the hard one.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        lim.rlim_cur = target;
    }
    Ok((lim.rlim_cur, lim.rlim_max))
}

/// Raises the descriptor limit as far as it goes and says whether it fits
/// what `probe_concurrency` and `hang_timeout` may need.
fn raise_nofile(cfg: &Config) {
    let wanted = nofile_wanted(cfg);
    let (soft, hard) = match raise_nofile_to(u64::MAX) {
        Ok(lim) => lim,
        Err(error) => {
            warn!(%error, "could not raise RLIMIT_NOFILE; keeping the descriptor limit as it is");
            return;
        }
    };
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    if lim.rlim_cur < wanted {
        warn!(
            soft = lim.rlim_cur,
            hard = lim.rlim_max,
            wanted,
            "descriptor limit below what probe_concurrency and hang_timeout may need: probes \
             may fail with local errors (too many open files); raise the hard limit \
             (systemd LimitNOFILE=, ulimit -Hn) or lower daemon.probe_concurrency"
        );
    } else {
        info!(
            soft = lim.rlim_cur,
            hard = lim.rlim_max,
            wanted,
            "descriptor limit"
        );
    }
}

/// Everything up to serving: maps, globals, VIPs, tables, attach.
pub fn start(config_path: PathBuf, cfg: Config) -> anyhow::Result<Daemon> {
    let d = &cfg.daemon;
    ensure_bpffs()?;
    let pin_dir = persist::pin_dir(&d.instance);
    fs::create_dir_all(&pin_dir).with_context(|| format!("creating {}", pin_dir.display()))?;
    let t0 = Instant::now();
    // aya adopts a pinned map whatever its size: check the one size that a
    // configuration can change.
    let ct_pin = pin_dir.join(lb_common::MAP_CT);
    if ct_pin.exists() {
        let pinned = aya::maps::MapData::from_pin(&ct_pin)
            .and_then(|m| m.info())
            .with_context(|| format!("reading {}", ct_pin.display()))?
            .max_entries();
        if pinned != d.conntrack_size {
            bail!(
                "pinned conntrack in {} holds {pinned} entries, the configuration says \
                 conntrack_size = {}: run `xlb detach --instance {}` first (this drops \
                 established flows) or restore the old value",
                pin_dir.display(),
                d.conntrack_size,
                d.instance
            );
        }
    }
    let mut dp = Dataplane::load(&LoadOptions {
        ct_size: d.conntrack_size,
        ring_stride: d.max_table_size,
        pin_dir: Some(pin_dir.clone()),
    })?;
    if dp.ring_stride() != dp.globals()?.ring_stride {
        bail!(
            "pinned maps in {} were made for max_table_size {}, the configuration says {}: \
             run `xlb detach --instance {}` first (this drops established flows) or restore the old value",
            pin_dir.display(),
            dp.globals()?.ring_stride,
            dp.ring_stride(),
            d.instance
        );
    }
    write_globals(&mut dp, d, &cfg.vips)?;
    enable_forwarding(&d.interface, cfg.vips.iter().any(|v| v.addr.is_ipv6()))?;
    let saved = persist::Saved::load(&persist::state_path(&d.instance))?;
    let daemon = Daemon::new(config_path, cfg, dp, saved)?;
    info!(took_ms = t0.elapsed().as_millis() as u64, "maps ready");
    Ok(daemon)
}

/// Attaches and returns (link id, adopted).
pub(crate) fn attach_lb(dp: &mut Dataplane, d: &DaemonConfig) -> anyhow::Result<(u32, bool)> {
    attach(dp, d, &persist::pin_dir(&d.instance))
}

/// Attaches `xlb_hc` (data-path probes) to the egress of the daemon's
/// interface. On kernel ≥ 6.6 it is a tcx link, pinned next to the XDP link
/// so a restart replaces its program in place and `xlb detach` removes it;
/// no qdisc is involved. Older kernels get a clsact qdisc and a netlink
/// filter, which outlives the daemon: a restart replaces a previous run's
/// filter, and `xlb detach` leaves it (it passes every unmarked packet).
pub(crate) fn attach_hc(dp: &mut Dataplane, d: &DaemonConfig) -> anyhow::Result<()> {
    let iface = &d.interface;
    let prog = dp.program::<aya::programs::SchedClassifier>(lb_common::PROG_HC)?;
    let attach_err = || format!("attaching {} to the egress of {iface}", lb_common::PROG_HC);
    // tcx: kernel 6.6, "bpf: Add fd-based tcx multi-prog infra with link
    // support". One decision for the qdisc, the attach mode and the pin.
    let tcx = KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0));
    if !tcx {
        match tc::qdisc_add_clsact(iface) {
            Ok(()) => {}
            // EEXIST: the qdisc is there already (ours from a previous run or
            // someone else's); filters share it.
            Err(tc::TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(e).with_context(|| format!("adding a clsact qdisc to {iface}")),
        }
        // A previous run's filter (killed before it could remove it).
        let _ = tc::qdisc_detach_program(iface, TcAttachType::Egress, lb_common::PROG_HC);
        let netlink = tc::TcAttachOptions::Netlink(tc::NlOptions::default());
        prog.attach_with_options(iface, TcAttachType::Egress, netlink)
            .with_context(attach_err)?;
        return Ok(());
    }
    let link_path = persist::pin_dir(&d.instance).join(persist::HC_LINK_PIN);
    if link_path.exists() {
        let pinned = PinnedLink::from_pin(&link_path)
            .with_context(|| format!("opening pinned link {}", link_path.display()))?;
        let link = SchedClassifierLink::try_from(FdLink::from(pinned))
            .context("pinned data-path probe link is not a tc link")?;
        prog.attach_to_link(link)
            .context("replacing the program of the pinned tc link")?;
        return Ok(());
    }
    let tcx_opts = tc::TcAttachOptions::TcxOrder(aya::programs::LinkOrder::default());
    let link_id = prog
        .attach_with_options(iface, TcAttachType::Egress, tcx_opts)
        .with_context(attach_err)?;
    let fd = FdLink::try_from(prog.take_link(link_id)?)
        .context("the tc program was attached without a BPF link, so it cannot be pinned")?;
    fd.pin(&link_path)
        .with_context(|| format!("pinning the tc link at {}", link_path.display()))?;
    Ok(())
}

/// `xlb detach`: removes everything `xlb run` pinned and attached for
/// `instance`. Established flows stop being balanced at once.
pub fn detach(instance: &str) -> anyhow::Result<()> {
    let dir = persist::pin_dir(instance);
    let mut removed = Vec::new();
    let links = [
        (persist::LINK_PIN, "XDP link"),
        (persist::HC_LINK_PIN, "tc link (data-path probes)"),
    ];
    for (pin, what) in links {
        let path = dir.join(pin);
        if !path.exists() {
            continue;
        }
        // Unpinning drops the last reference once our descriptor closes: the
        // program leaves the interface.
        let fd = PinnedLink::from_pin(&path)
            .with_context(|| format!("opening {}", path.display()))?
            .unpin()
            .with_context(|| format!("unpinning {}", path.display()))?;
        drop(fd);
        removed.push(what.to_string());
    }
    if dir.exists() {
        for entry in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let entry = entry?;
            fs::remove_file(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
            removed.push(entry.file_name().to_string_lossy().into_owned());
        }
        fs::remove_dir(&dir).with_context(|| format!("removing {}", dir.display()))?;
        // The shared root goes too once no instance is left.
        let _ = fs::remove_dir(persist::PIN_ROOT);
    }
    let state = persist::state_path(instance);
    // The state file, and a temporary one a kill mid-write left behind.
    for path in [state.clone(), state.with_extension("json.tmp")] {
        if path.exists() {
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
            removed.push(path.display().to_string());
        }
    }
    if removed.is_empty() {
        println!("xlb instance {instance:?}: nothing pinned, nothing to remove");
    } else {
        println!("xlb instance {instance:?}: removed {}", removed.join(", "));
    }
    Ok(())
}

/// How often rates are sampled and the state file is refreshed.
pub const TICK: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nofile_wanted_cases() {
        let vip = "[[vip]]\nname = \"a\"\naddress = \"10.100.0.1\"\nport = 80\n\
                   [[vip.backend]]\naddress = \"10.0.0.1\"\n";
        // (name, extra config, wanted)
        let cases = [
            ("no backends", String::new(), 256 + 1024),
            (
                "defaults: 3s hang, 2s interval",
                vip.to_owned(),
                256 * 3 + 1024,
            ),
            (
                "hang_timeout = timeout",
                format!("[health_check]\nhang_timeout = \"1s\"\n{vip}"),
                256 * 2 + 1024,
            ),
            (
                "long hang, small concurrency",
                format!("[health_check]\ninterval = \"1s\"\nhang_timeout = \"60s\"\n{vip}"),
                16 * 61 + 1024,
            ),
        ];
        for (name, extra, want) in cases {
            let concurrency = if name.contains("small") {
                "probe_concurrency = 16\n"
            } else {
                ""
            };
            let text = format!("[daemon]\ninterface = \"eth0\"\n{concurrency}{extra}");
            let cfg = Config::from_str(&text, "xlb.toml").unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(nofile_wanted(&cfg), want, "{name}");
        }
    }
}
