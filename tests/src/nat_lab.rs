//! NAT mode's lab (issue 27): the lab of `xlb_lab` with its backends made
//! plain servers, and the configuration of NAT VIPs.
//!
//! ```text
//!  {p}-cl client .10 ──┐
//!  {p}-lb LB .2, pool .4 / ::4 on eth0, xlb on eth0
//!  {p}-b1..bN backends .11.. : xlb-backend only (no decapsulator, no VIP,
//!                              no route via the LB: they have no default
//!                              route at all, and the pool is on-link)
//! ```
//!
//! [`up`] builds the usual lab without starting xlb, then undoes on every
//! backend what DSR needs: it stops the decapsulator (the XDP program
//! leaves eth0) and removes the VIPs from `lo`. It adds the pool
//! addresses to the LB's eth0 and, for `preserve_client`, a host route on
//! every backend that sends answers for the client through the LB (the
//! one thing DNAT-only asks of backends). Then it starts xlb and waits
//! for every backend to be up.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use xlb_lab::scenario::{
    LabRun, Protocol, RunOptions, StateFile, XlbConfig, command_in, set_tx_checksum_offload,
    xdp_attached,
};
use xlb_lab::topology::{
    self, BACKEND_IFNAME, CLIENT_V4, CLIENT_V6, HOST_IFNAME, LB_V4, LB_V6, VIP_V4, VIP_V6, VIP2_V4,
};

/// The NAT VIPs' source pool, an address of the LB's own on its eth0: a
/// free host of the segment (.1 gateway, .2 LB, .3 `xlb-lab-bench`'s
/// nftables address, .9 flooder, .10 client, .11 and up backends), so that
/// the backends' TIME_WAIT for a NAT flow never meets a connection of the
/// LB host's own (see `bench::lab_proxies::NFT_LISTEN`).
pub const POOL_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 4);
pub const POOL_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x4);
/// The second pool, for a second NAT VIP on the same backends: xlb
/// refuses two VIPs whose pools share an address and ports. UDP VIPs
/// ([`NatVip::udp`]) take it.
pub const POOL2_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 5);
pub const POOL2_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x5);
/// An address of the segment that no interface of the lab holds: a `snat`
/// address xlb must refuse.
pub const OFF_HOST_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 77);

/// The backends' TCP port behind a NAT VIP on port 80: another port than
/// the VIP's (`xlb-backend` serves HTTP on 80 and 8080).
pub const NAT_TCP_BACKEND_PORT: u16 = 8080;
/// The backends' UDP echo port behind a NAT VIP (`xlb-backend` echoes on
/// 5353 and 5354).
pub const NAT_UDP_BACKEND_PORT: u16 = 5354;
/// Where UDP backends are probed (HTTP).
pub const HEALTH_PORT: u16 = 80;

/// How long [`up`] waits for a decapsulator to take its program off eth0.
const DETACH_TIMEOUT: Duration = Duration::from_secs(10);

/// One `mode = "nat"` `[[vip]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct NatVip {
    pub name: String,
    pub address: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    /// Backend numbers (1-based), of the VIP's family.
    pub backends: Vec<usize>,
    /// Every backend's `port`.
    pub backend_port: u16,
    /// Every backend's `health_port`, when set.
    pub health_port: Option<u16>,
    /// `snat`; empty: not written.
    pub snat: Vec<IpAddr>,
    /// `snat_ports`, inclusive; `None`: xlb's default.
    pub snat_ports: Option<(u16, u16)>,
    pub preserve_client: bool,
    /// The body of `[vip.passive]`, written as it is; `None`: not written.
    pub passive: Option<String>,
    /// The body of `[vip.health_check]`, written as it is; `None`: not
    /// written.
    pub health_check: Option<String>,
    /// The body of `[vip.guard]`, written as it is; `None`: not written.
    pub guard: Option<String>,
}

impl NatVip {
    /// A TCP VIP on `port` to backends `1..=backends` on
    /// [`NAT_TCP_BACKEND_PORT`], from the pool address of its family.
    pub fn tcp(name: &str, address: IpAddr, port: u16, backends: usize) -> Self {
        Self {
            name: name.to_string(),
            address,
            port,
            protocol: Protocol::Tcp,
            backends: (1..=backends).collect(),
            backend_port: NAT_TCP_BACKEND_PORT,
            health_port: None,
            snat: vec![pool_of(address)],
            snat_ports: None,
            preserve_client: false,
            passive: None,
            health_check: None,
            guard: None,
        }
    }

    /// A UDP VIP to the backends' echo on [`NAT_UDP_BACKEND_PORT`], probed
    /// over HTTP on [`HEALTH_PORT`], from the second pool address of its
    /// family.
    pub fn udp(name: &str, address: IpAddr, port: u16, backends: usize) -> Self {
        Self {
            protocol: Protocol::Udp,
            snat: vec![pool2_of(address)],
            backend_port: NAT_UDP_BACKEND_PORT,
            health_port: Some(HEALTH_PORT),
            ..Self::tcp(name, address, port, backends)
        }
    }

    /// DNAT only: no pool, the backends see the client.
    pub fn preserving(mut self) -> Self {
        self.preserve_client = true;
        self.snat.clear();
        self
    }

    /// Where a client connects.
    pub fn target(&self) -> SocketAddr {
        SocketAddr::new(self.address, self.port)
    }

    /// The `address:port` xlb shows for backend `i` of this VIP: the
    /// backend's address of the VIP's family, with the backend port.
    pub fn backend_addr(&self, i: usize) -> SocketAddr {
        let ip: IpAddr = match self.address {
            IpAddr::V4(_) => topology::backend_v4(i).into(),
            IpAddr::V6(_) => topology::backend_v6(i).into(),
        };
        SocketAddr::new(ip, self.backend_port)
    }

    /// The `[[vip]]` table with its passive table and backends.
    pub fn render(&self) -> String {
        let mut out = format!(
            "\n[[vip]]\nname = \"{}\"\naddress = \"{}\"\nport = {}\nmode = \"nat\"\n",
            self.name, self.address, self.port
        );
        if self.protocol != Protocol::Tcp {
            out.push_str(&format!("protocol = \"{}\"\n", self.protocol.as_str()));
        }
        if !self.snat.is_empty() {
            let list: Vec<String> = self.snat.iter().map(|a| format!("\"{a}\"")).collect();
            out.push_str(&format!("snat = [{}]\n", list.join(", ")));
        }
        if let Some((lo, hi)) = self.snat_ports {
            out.push_str(&format!("snat_ports = \"{lo}-{hi}\"\n"));
        }
        if self.preserve_client {
            out.push_str("preserve_client = true\n");
        }
        if let Some(p) = &self.passive {
            out.push_str(&format!("\n[vip.passive]\n{}\n", p.trim_end()));
        }
        if let Some(h) = &self.health_check {
            out.push_str(&format!("\n[vip.health_check]\n{}\n", h.trim_end()));
        }
        if let Some(g) = &self.guard {
            out.push_str(&format!("\n[vip.guard]\n{}\n", g.trim_end()));
        }
        for &i in &self.backends {
            out.push_str(&format!(
                "\n[[vip.backend]]\naddress = \"{}\"\nport = {}\n",
                self.backend_addr(i).ip(),
                self.backend_port
            ));
            if let Some(port) = self.health_port {
                out.push_str(&format!("health_port = {port}\n"));
            }
        }
        out
    }
}

/// The pool address of `vip`'s family.
pub fn pool_of(vip: IpAddr) -> IpAddr {
    match vip {
        IpAddr::V4(_) => POOL_V4.into(),
        IpAddr::V6(_) => POOL_V6.into(),
    }
}

/// The second pool address of `vip`'s family.
pub fn pool2_of(vip: IpAddr) -> IpAddr {
    match vip {
        IpAddr::V4(_) => POOL2_V4.into(),
        IpAddr::V6(_) => POOL2_V6.into(),
    }
}

/// A lab configuration whose VIPs are NAT VIPs: `base` gives `[daemon]`,
/// `[health_check]`, `[protection]` (its own VIPs are ignored).
#[derive(Debug, Clone, PartialEq)]
pub struct NatConfig {
    pub base: XlbConfig,
    /// The body of `[passive]`, written as it is; `None`: not written.
    pub passive: Option<String>,
    pub vips: Vec<NatVip>,
}

impl NatConfig {
    /// The lab's defaults for `prefix` (instance, socket, fast probes) with
    /// one VIP, `web`: 10.100.0.1:80 to backends 1–3 on port 8080.
    pub fn for_prefix(prefix: &str) -> Self {
        Self {
            base: XlbConfig::for_prefix(prefix),
            passive: None,
            vips: vec![NatVip::tcp("web", VIP_V4.into(), 80, 3)],
        }
    }

    pub fn vip(&self, name: &str) -> &NatVip {
        self.vips
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("no NAT VIP {name:?} in the configuration"))
    }

    /// The TOML text.
    pub fn render(&self) -> String {
        let mut out = XlbConfig {
            vips: Vec::new(),
            ..self.base.clone()
        }
        .render();
        if let Some(p) = &self.passive {
            out.push_str(&format!("\n[passive]\n{}\n", p.trim_end()));
        }
        for v in &self.vips {
            out.push_str(&v.render());
        }
        out
    }
}

/// How to build a NAT lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatLabOptions {
    pub backends: usize,
    /// Route the client's answers from every backend through the LB
    /// (`preserve_client`).
    pub route_via_lb: bool,
    /// Bound on the daemon answering and every backend becoming up.
    pub ready_timeout: Duration,
}

impl Default for NatLabOptions {
    fn default() -> Self {
        Self {
            backends: 3,
            route_via_lb: false,
            ready_timeout: Duration::from_secs(30),
        }
    }
}

/// Brings a NAT lab up with xlb running `cfg` and every backend up.
///
/// # Errors
///
/// Any step of the lab, the backends' conversion or xlb's start; the
/// returned run's `Drop` tears everything down on the way out.
pub fn up(prefix: &str, cfg: &NatConfig, opts: NatLabOptions) -> anyhow::Result<LabRun> {
    up_with_xlb(prefix, cfg, opts, &crate::lab::xlb_binary())
}

/// [`up`] with the `xlb` binary given (a benchmark's `find_xlb`), rather
/// than the tests' fresh one.
///
/// # Errors
///
/// As [`up`].
pub fn up_with_xlb(
    prefix: &str,
    cfg: &NatConfig,
    opts: NatLabOptions,
    xlb: &std::path::Path,
) -> anyhow::Result<LabRun> {
    crate::require_root();
    let t0 = Instant::now();
    let mut run = LabRun::up_with(RunOptions {
        backends: opts.backends,
        start_daemon: false,
        ready_timeout: opts.ready_timeout,
        ..RunOptions::new(prefix, xlb, &cfg.render())
    })
    .context("bringing the lab up")?;
    make_backends_plain(&run)?;
    add_pool_addresses(&run)?;
    if opts.route_via_lb {
        route_clients_via_lb(&run)?;
    }
    run.start_daemon().context("starting xlb run")?;
    run.wait_all_up(opts.ready_timeout)
        .context("waiting for every backend to be up")?;
    eprintln!(
        "[{prefix}] NAT lab up (plain backends{}), every backend up, in {:.1} s",
        if opts.route_via_lb {
            ", client routed via the LB"
        } else {
            ""
        },
        t0.elapsed().as_secs_f64()
    );
    Ok(run)
}

/// Stops every backend's decapsulator and takes the VIPs off its `lo`, then
/// checks that no backend has an XDP program, a VIP or a default route.
pub fn make_backends_plain(run: &LabRun) -> anyhow::Result<()> {
    let state = StateFile::load(run.work_dir())?.context("the lab wrote no state file")?;
    for i in 1..=run.backend_count() {
        let role = format!("decap-b{i}");
        let decap = state
            .procs
            .iter()
            .find(|p| p.role == role)
            .with_context(|| format!("no {role} recorded in the lab's state file"))?;
        run.lab()
            .kill(decap.pid)
            .with_context(|| format!("stopping {role}"))?;
    }
    for i in 1..=run.backend_count() {
        let ns = run.lab().ns_backend(i);
        let deadline = Instant::now() + DETACH_TIMEOUT;
        while xdp_attached(&ns, BACKEND_IFNAME) {
            if Instant::now() >= deadline {
                bail!(
                    "an XDP program is still on {BACKEND_IFNAME} in {ns} {DETACH_TIMEOUT:?} after its decapsulator stopped"
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
        for vip in [
            format!("{VIP_V4}/32"),
            format!("{VIP2_V4}/32"),
            format!("{VIP_V6}/128"),
        ] {
            ip(&ns, &["addr", "del", &vip, "dev", "lo"])?;
        }
        // The backends' answers now cross the LB's XDP program, which
        // turns them into raw frames: a veth's partial checksum (left to
        // "the hardware") would reach the client as a corrupt one. Real
        // NICs put complete checksums on the wire; as for the client
        // (`LabRun::up_with`), the backends compute their own.
        set_tx_checksum_offload(&ns, BACKEND_IFNAME, false)?;
        check_plain(&ns)?;
    }
    Ok(())
}

/// Fails unless backend namespace `ns` holds no VIP and has no default
/// route (so nothing routes its answers through the LB but NAT itself).
pub fn check_plain(ns: &str) -> anyhow::Result<()> {
    let addrs = ip(ns, &["-o", "addr", "show"])?;
    let [a, b, c, _] = VIP_V4.octets();
    let (net4, net6) = (format!(" {a}.{b}.{c}."), format!(" {}", vip_net6_head()));
    if addrs.contains(&net4) || addrs.contains(&net6) {
        bail!("backend {ns} still holds a VIP address:\n{addrs}");
    }
    for family in ["-4", "-6"] {
        let default = ip(ns, &[family, "route", "show", "default"])?;
        if !default.trim().is_empty() {
            bail!("backend {ns} has a default route ({family}): {default}");
        }
    }
    Ok(())
}

/// The VIPs' IPv6 /64 as `ip` writes its addresses' start (`fd00:100:`).
fn vip_net6_head() -> String {
    let s = VIP_V6.segments();
    format!("{:x}:{:x}:", s[0], s[1])
}

/// The pool addresses on the LB's eth0, host routes only (as
/// `bench::lab_proxies` adds its nftables address). The IPv6 ones are
/// deprecated at once (`preferred_lft 0`): still the LB's, never chosen
/// as the source of its own connections (the probes), which the kernel
/// would otherwise do for a backend's address that shares more leading
/// bits with a pool address than with the LB's.
///
/// # Errors
///
/// `ip` refuses an address (e.g. added twice).
pub fn add_pool_addresses(run: &LabRun) -> anyhow::Result<()> {
    let lb = run.lab().ns_lb();
    for a in [format!("{POOL_V4}/32"), format!("{POOL2_V4}/32")] {
        ip(&lb, &["addr", "add", &a, "dev", HOST_IFNAME])?;
    }
    for a in [format!("{POOL_V6}/128"), format!("{POOL2_V6}/128")] {
        ip(
            &lb,
            &[
                "-6",
                "addr",
                "add",
                &a,
                "dev",
                HOST_IFNAME,
                "nodad",
                "preferred_lft",
                "0",
            ],
        )?;
    }
    Ok(())
}

/// `preserve_client`'s routing requirement: every backend reaches the
/// client through the LB (a host route, more specific than the segment's
/// on-link route).
fn route_clients_via_lb(run: &LabRun) -> anyhow::Result<()> {
    for ns in run.lab().backend_namespaces() {
        ip(
            &ns,
            &[
                "route",
                "add",
                &format!("{CLIENT_V4}/32"),
                "via",
                &LB_V4.to_string(),
            ],
        )?;
        ip(
            &ns,
            &[
                "-6",
                "route",
                "add",
                &format!("{CLIENT_V6}/128"),
                "via",
                &LB_V6.to_string(),
            ],
        )?;
    }
    Ok(())
}

/// `ip -n NS ARGS`, failing with its stderr.
fn ip(ns: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut full = vec!["ip", "-n", ns];
    full.extend_from_slice(args);
    crate::netns::run(&full)
}

/// `xlb check-config FILE` run in the LB namespace (where the pool
/// addresses are): `Ok(stdout)` when it accepts the file, `Err(stdout and
/// stderr)` when it refuses it.
///
/// # Errors
///
/// The outer error: the command could not run at all.
pub fn check_config(run: &LabRun, text: &str) -> anyhow::Result<Result<String, String>> {
    let path = run.work_dir().join("check.toml");
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    let mut cmd: Command = command_in(&run.lab().ns_lb(), run.xlb_path())?;
    cmd.arg("check-config").arg(&path);
    let out = cmd
        .output()
        .with_context(|| format!("running xlb check-config {}", path.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nat_vips_render_their_pool_ports_and_backends() {
        let mut cfg = NatConfig::for_prefix("p");
        let mut dns = NatVip::udp("dns6", VIP_V6.into(), 53, 2);
        dns.snat_ports = Some((20000, 20003));
        cfg.vips.push(dns);
        cfg.vips
            .push(NatVip::tcp("keep", VIP2_V4.into(), 80, 1).preserving());
        cfg.passive = Some("response_timeout = \"250ms\"\n".to_string());
        let text = cfg.render();
        let tables: Vec<&str> = text.split("\n[[vip]]\n").collect();
        let [head, web, dns, keep] = tables[..] else {
            panic!("three [[vip]] tables expected:\n{text}");
        };
        assert!(
            head.contains("\n[passive]\nresponse_timeout = \"250ms\"\n"),
            "{head}"
        );
        assert!(
            head.contains("[daemon]") && head.contains("[health_check]"),
            "{head}"
        );
        for want in [
            "name = \"web\"\naddress = \"10.100.0.1\"\nport = 80\nmode = \"nat\"\nsnat = [\"10.99.0.4\"]\n",
            "\n[[vip.backend]]\naddress = \"10.99.0.13\"\nport = 8080\n",
        ] {
            assert!(web.contains(want), "{want:?} not in:\n{web}");
        }
        for absent in ["protocol", "snat_ports", "preserve_client", "health_port"] {
            assert!(!web.contains(absent), "{absent} in:\n{web}");
        }
        for want in [
            "mode = \"nat\"\nprotocol = \"udp\"\nsnat = [\"fd00:99::5\"]\nsnat_ports = \"20000-20003\"\n",
            "address = \"fd00:99::12\"\nport = 5354\nhealth_port = 80\n",
        ] {
            assert!(dns.contains(want), "{want:?} not in:\n{dns}");
        }
        assert!(!dns.contains("fd00:99::13"), "two backends:\n{dns}");
        assert!(keep.contains("preserve_client = true\n"), "{keep}");
        assert!(!keep.contains("snat"), "{keep}");
    }

    #[test]
    fn backend_addresses_carry_the_backend_port() {
        let v4 = NatVip::tcp("a", VIP_V4.into(), 80, 3);
        let v6 = NatVip::udp("b", VIP_V6.into(), 53, 3);
        assert_eq!(v4.backend_addr(2).to_string(), "10.99.0.12:8080");
        assert_eq!(v6.backend_addr(3).to_string(), "[fd00:99::13]:5354");
        assert_eq!(v4.target().to_string(), "10.100.0.1:80");
    }

    #[test]
    fn pool_addresses_are_free_hosts_of_the_segment() {
        let taken: Vec<IpAddr> = vec![
            LB_V4.into(),
            CLIENT_V4.into(),
            topology::LB_GW_V4.into(),
            topology::FLOOD_V4.into(),
            crate::bench::lab_proxies::NFT_LISTEN.ip().to_owned().into(),
            topology::backend_v4(1).into(),
        ];
        for pool in [POOL_V4, POOL2_V4, OFF_HOST_V4] {
            assert!(!taken.contains(&pool.into()), "{pool}");
            assert_eq!(pool.octets()[..3], topology::NET_V4.octets()[..3], "{pool}");
        }
        for pool in [POOL_V6, POOL2_V6] {
            assert!(
                ![LB_V6, CLIENT_V6, topology::backend_v6(1)].contains(&pool),
                "{pool}"
            );
        }
    }
}
