//! `xlb run` up to the main loop: checks the host, raises the descriptor
//! limit, binds the control socket, then loads or adopts the maps, writes
//! the globals and builds the model ([`start`]).

use std::{
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context as _, bail};
use lb_common::{Globals, LAYOUT_VERSION, addr16};
use tracing::{info, warn};

use super::{Daemon, persist, pin_sizes};
use crate::{
    config::{Config, DaemonConfig, Mode, VipConfig},
    dataplane::{Dataplane, LoadOptions},
    host,
};

/// `xlb run --config FILE`.
pub async fn run(config_path: PathBuf) -> anyhow::Result<()> {
    host::check_capabilities()?;
    let cfg = Config::from_file(&config_path).map_err(|e| anyhow::anyhow!("{e}"))?;
    for w in &cfg.warnings {
        warn!("{w}");
    }
    super::announce::check_at_start(&cfg, &config_path.display().to_string()).await?;
    raise_nofile(&cfg);
    // The instance's lock first: a second daemon for the same instance stops
    // here, before it touches the maps or the link of the running one.
    // Held until this process exits.
    let instance = &cfg.daemon.pinned.instance;
    let _lock = persist::InstanceLock::take(&persist::lock_path(instance), instance)?;
    // Then the control socket: a second daemon for the same socket (another
    // instance) stops here.
    let listener = crate::ctl::bind(
        &cfg.daemon.restart.control_socket,
        cfg.daemon.restart.socket_group.as_deref(),
    )?;
    let daemon = start(config_path, cfg)?;
    daemon.main_loop(listener).await
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
    u64::from(cfg.daemon.restart.probe_concurrency)
        .saturating_mul(per_backend)
        .saturating_add(NOFILE_RESERVE)
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (systemd's default soft
/// limit is 1024) and says whether it fits what `probe_concurrency` and
/// `hang_timeout` may need: a probe that cannot open a socket is a local
/// error, not the backend's fault, but it is a probe lost. Never fails: the
/// daemon runs with whatever it has.
fn raise_nofile(cfg: &Config) {
    let wanted = nofile_wanted(cfg);
    let (soft, hard) = match host::raise_nofile_to(u64::MAX) {
        Ok(lim) => lim,
        Err(error) => {
            warn!(%error, "could not raise RLIMIT_NOFILE; keeping the descriptor limit as it is");
            return;
        }
    };
    if soft < wanted {
        warn!(
            soft,
            hard,
            wanted,
            "descriptor limit below what probe_concurrency and hang_timeout may need: probes \
             may fail with local errors (too many open files); raise the hard limit \
             (systemd LimitNOFILE=, ulimit -Hn) or lower daemon.probe_concurrency"
        );
    } else {
        info!(soft, hard, wanted, "descriptor limit");
    }
}

/// Writes `Globals` (see [`globals_for`]).
pub(super) fn write_globals(
    dp: &mut Dataplane,
    d: &DaemonConfig,
    vips: &[VipConfig],
) -> anyhow::Result<()> {
    let g = globals_for(dp, d, vips)?;
    dp.set_globals(&g)?;
    crate::chance::set_window(d.live.second_chance_window);
    Ok(())
}

/// The `Globals` for `d`: keeps the pinned hash key unless the
/// configuration sets one (so a restart never moves flows), else draws a
/// random one; the encapsulation sources from the configuration or the
/// interface. Writes nothing.
pub(super) fn globals_for(
    dp: &Dataplane,
    d: &DaemonConfig,
    vips: &[VipConfig],
) -> anyhow::Result<Globals> {
    let mut g = dp.globals()?;
    // A VIP or a NAT pool address held on the interface is no source of
    // the LB's own packets: backends accept tunnels from the LB's address.
    let taken: Vec<IpAddr> = vips
        .iter()
        .flat_map(|v| {
            let pool = v.nat.iter().flat_map(|n| n.snat.iter().copied());
            std::iter::once(v.addr).chain(pool)
        })
        .collect();
    let (v4, v6) = host::interface_source_addrs(&d.pinned.interface, &taken)?;
    let key = match d.live.hash_seed {
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
    let src4 = d
        .live
        .encap_source_v4
        .or(d.live.encap_source_v4_prefix.and_then(|pf| match pf.addr {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        }))
        .or(v4);
    let src6 = d.live.encap_source_v6.or(v6);
    let (reply_interval_ns, reply_tolerance_ns) = lb_common::reply_limit(d.live.reply_rate);
    g = Globals {
        layout_version: LAYOUT_VERSION,
        ring_stride: dp.ring_stride(),
        hash_key: key,
        udp_timeout_ns: d.live.udp_timeout.as_nanos() as u64,
        encap_src_v4: src4.map(|a| addr16(IpAddr::V4(a))).unwrap_or_default(),
        encap_src_v6: src6.map(|a| addr16(IpAddr::V6(a))).unwrap_or_default(),
        encap_v4_host_bits: 0,
        _pad: [0; 7],
        reply_interval_ns,
        reply_tolerance_ns,
    };
    if let Some(pf) = d.live.encap_source_v4_prefix {
        g.encap_src_v4 = addr16(pf.addr);
        g.encap_v4_host_bits = 32 - pf.len;
    }
    let ipip = |v6: bool| {
        vips.iter()
            .any(|v| v.mode == Mode::DsrIpip && v.addr.is_ipv6() == v6)
    };
    if src4.is_none() && ipip(false) {
        warn!(interface = %d.pinned.interface, "no IPv4 address on the interface and no daemon.encap_source_v4: IPv4 dsr-ipip packets get source 0.0.0.0");
    }
    if src6.is_none() && ipip(true) {
        warn!(interface = %d.pinned.interface, "no global IPv6 address on the interface and no daemon.encap_source_v6: IPv6 dsr-ipip packets get source ::");
    }
    Ok(g)
}

/// Removes maps pinned by a first start that never finished: their layout
/// version is still 0 (a verifier error, a memlock limit or `kill -9` hit
/// between creating the maps and stamping them) and no link is pinned, so
/// no program ever used them. Left there they would block every later
/// start with "layout version 0". Maps with a link, or a version, stay.
/// Runs under the instance's lock: no other daemon is creating them now.
fn discard_unfinished_pins(pin_dir: &Path) -> anyhow::Result<()> {
    if crate::dataplane::pinned_layout_version(pin_dir)? != Some(0) {
        return Ok(());
    }
    let links = [persist::LINK_PIN, persist::HC_LINK_PIN];
    if links.iter().any(|l| pin_dir.join(l).exists()) {
        return Ok(());
    }
    let mut removed = Vec::new();
    for entry in fs::read_dir(pin_dir).with_context(|| format!("listing {}", pin_dir.display()))? {
        let entry = entry?;
        fs::remove_file(entry.path())
            .with_context(|| format!("removing {}", entry.path().display()))?;
        removed.push(entry.file_name().to_string_lossy().into_owned());
    }
    warn!(
        dir = %pin_dir.display(),
        "maps pinned by a start that never finished (layout version 0, no program attached): \
         removed {} and starting afresh",
        removed.join(", ")
    );
    Ok(())
}

/// Everything up to serving: maps, globals, VIPs, tables, attach.
pub fn start(config_path: PathBuf, cfg: Config) -> anyhow::Result<Daemon> {
    let d = &cfg.daemon;
    let off_link = crate::route::dsr_l2_off_link(&cfg.vips);
    if !off_link.is_empty() {
        bail!("{}", off_link.join("\n"));
    }
    crate::config::check_pools_local(&cfg.vips, &config_path.display().to_string())
        .map_err(|lines| anyhow::anyhow!("{}", lines.join("\n")))?;
    // A warning, not a refusal: the route may come later (BGP), and until
    // then data-path probes fall back to judging backends directly.
    for problem in crate::route::vip_routes_missing(&cfg.vips, &d.pinned.interface) {
        warn!("{problem}");
    }
    crate::kernel::check_minimum()?;
    host::ensure_bpffs()?;
    let pin_dir = persist::pin_dir(&d.pinned.instance);
    fs::create_dir_all(&pin_dir).with_context(|| format!("creating {}", pin_dir.display()))?;
    let t0 = Instant::now();
    discard_unfinished_pins(&pin_dir)?;
    // aya adopts a pinned map whatever its size: the sizes a configuration
    // sets are checked (the list `xlb check-upgrade` checks too).
    if let Some(m) = pin_sizes::mismatches(&pin_sizes::read(&pin_dir)?, &d.pinned).first() {
        bail!(
            "{}: run `xlb detach --instance {}` first (this drops established flows) or \
             restore the old value",
            m.text(&pin_dir),
            d.pinned.instance
        );
    }
    let dp = Dataplane::load(&LoadOptions {
        ct_size: d.pinned.conntrack_size,
        nat_size: d.pinned.nat_size,
        ring_stride: d.pinned.max_table_size,
        pin_dir: Some(pin_dir.clone()),
        kernel: None,
    })?;
    if dp.ring_stride() != dp.globals()?.ring_stride {
        bail!(
            "pinned maps in {} were made for max_table_size {}, the configuration says {}: \
             run `xlb detach --instance {}` first (this drops established flows) or restore the old value",
            pin_dir.display(),
            dp.globals()?.ring_stride,
            dp.ring_stride(),
            d.pinned.instance
        );
    }
    // Computed now (a missing interface fails here), written only when the
    // start is known to succeed (`go_live`): until then the data plane
    // keeps the hash key and encapsulation sources it has.
    let globals = globals_for(&dp, d, &cfg.vips)?;
    let iface = d.pinned.interface.clone();
    let v6 = cfg.vips.iter().any(|v| v.addr.is_ipv6());
    let saved = persist::Saved::load_or_set_aside(&persist::state_path(&d.pinned.instance));
    let recorded = saved
        .as_ref()
        .map(|s| s.forwarding.clone())
        .unwrap_or_default();
    // Before the first tables are built: their rebuilds remember previous
    // owners for the configured window, not the default (a window of 0
    // must mean no second chance from the first rebuild on).
    crate::chance::set_window(d.live.second_chance_window);
    let mut daemon = Daemon::new(config_path, cfg, dp, saved)?;
    daemon.globals = globals;
    daemon.sync_nat()?;
    // Last, so a start that fails before has changed nothing on the host.
    let changed = host::enable_forwarding(&iface, v6)?;
    daemon.record_forwarding(recorded, changed);
    info!(took_ms = t0.elapsed().as_millis() as u64, "maps ready");
    Ok(daemon)
}

impl Daemon {
    /// Keeps what earlier runs recorded of the sysctls they changed (a
    /// restart finds forwarding on already and changes nothing) and adds
    /// what this run changed; a change is written to the state file at
    /// once, so a `kill -9` before going live does not lose it.
    fn record_forwarding(
        &mut self,
        mut recorded: Vec<host::SysctlChange>,
        changed: Vec<host::SysctlChange>,
    ) {
        for c in &changed {
            if !recorded
                .iter()
                .any(|r| r.path == c.path && r.netns == c.netns)
            {
                recorded.push(c.clone());
            }
        }
        self.forwarding = recorded;
        self.forwarding_changed = changed;
        if !self.forwarding_changed.is_empty() {
            self.save();
        }
    }

    /// After a failed start: puts back the sysctls this process changed
    /// and forgets them in the state file.
    pub(super) fn undo_forwarding(&mut self) {
        if self.forwarding_changed.is_empty() {
            return;
        }
        let changed = std::mem::take(&mut self.forwarding_changed);
        warn!("xlb run failed to start: putting back the forwarding sysctls it changed");
        host::restore_sysctls(&changed);
        self.forwarding.retain(|r| !changed.contains(r));
        self.save();
    }
}

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
