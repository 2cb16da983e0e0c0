//! The lab's network: one L2 segment built from network namespaces.
//!
//! ```text
//!            {p}-br: bridge br0 (no addresses)
//!   ┌────────────┬────────┴───┬────────────┬────────────┐
//!  v-cl         v-lb         v-b1         v-b2   …     v-bN     (bridge side, MTU 1600)
//!   │            │            │            │            │
//!  eth0         eth0         eth0         eth0         eth0
//! {p}-cl       {p}-lb       {p}-b1       {p}-b2       {p}-bN
//! client        LB host      backends: VIPs on lo, never answer ARP for them
//! .10 / ::10   .2 / ::2     .11 / ::11   .12 / ::12   …
//! MTU 1500     MTU 1600     MTU 1600 (room for the +20/+40 bytes of IPIP/IP6IP6)
//! ```
//!
//! Every address exists only inside these namespaces, so labs with different
//! prefixes reuse the same addresses without seeing each other; the prefix
//! only keeps the namespace names apart.
//!
//! Two things the lab cannot do itself and leaves to whoever holds the eBPF
//! object (names exposed by [`Lab::lb_peer_ifname`] and [`BACKEND_IFNAME`]):
//! - A veth delivers frames sent with `XDP_TX` (or redirected) only if the
//!   receiving peer has an XDP program attached; otherwise they are counted as
//!   `xdp_tx_errors` and lost (veth_xdp_xmit, kernel 5.9+ behaviour). So the
//!   LB's peer `v-lb` in `{p}-br` needs any XDP program, e.g. `xlb_pass`.
//! - This kernel has neither `CONFIG_NET_IPIP` nor `CONFIG_IPV6_TUNNEL`, so a
//!   backend cannot decapsulate with a tunnel device: attach `xlb_decap` to
//!   each backend's `eth0`.

use std::{
    ffi::OsStr,
    fs::File,
    io::{self, ErrorKind},
    mem::MaybeUninit,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        Mutex,
        atomic::{AtomicU16, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use nix::{
    sched::{CloneFlags, setns},
    sys::signal::{Signal, kill, killpg},
    unistd::Pid,
};
use socket2::{Domain, Protocol, Socket, Type};

/// Where `ip netns add` bind-mounts namespaces (iproute2's NETNS_RUN_DIR).
pub const NETNS_RUN_DIR: &str = "/var/run/netns";

/// Default namespace-name prefix.
pub const DEFAULT_PREFIX: &str = "xlb";

/// Name of the bridge inside `{p}-br`.
pub const BRIDGE_IFNAME: &str = "br0";

/// Name of the lab interface inside the client, LB and backend namespaces.
pub const HOST_IFNAME: &str = "eth0";

/// A backend's lab interface, where the caller attaches the decap program.
pub const BACKEND_IFNAME: &str = HOST_IFNAME;

/// MTU of the bridge, every bridge-side veth and the LB's and backends' eth0:
/// a 1500-byte client packet plus a 40-byte IPv6 outer header fits.
pub const LAB_MTU: u32 = 1600;

/// MTU of the client's eth0, so that everything the client sends still fits
/// after the LB adds an outer header.
pub const CLIENT_MTU: u32 = 1500;

/// The lab segment, IPv4.
pub const NET_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 0);
pub const NET_V4_PREFIX: u8 = 24;
/// The lab segment, IPv6.
pub const NET_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0);
pub const NET_V6_PREFIX: u8 = 64;

pub const LB_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);
pub const LB_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x2);
pub const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
pub const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x10);

/// The main VIPs, held on every backend's `lo` and routed by the client via the LB.
pub const VIP_V4: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 1);
pub const VIP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x100, 0, 0, 0, 0, 0, 0x1);
/// A second IPv4 VIP (for reload tests), also on every backend's `lo`.
pub const VIP2_V4: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 2);

/// The LB host's stand-in for a default gateway towards the VIPs (see
/// `build`): an address no namespace holds, with a permanent neighbour
/// entry for [`LB_GW_MAC`], which no interface has.
pub const LB_GW_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
pub const LB_GW_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x1);
pub const LB_GW_MAC: [u8; 6] = [0x02, 0x99, 0, 0, 0, 0x01];

/// The VIP ranges the client routes via the LB.
pub const VIP_NET_V4: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 0);
pub const VIP_NET_V4_PREFIX: u8 = 24;
pub const VIP_NET_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x100, 0, 0, 0, 0, 0, 0);
pub const VIP_NET_V6_PREFIX: u8 = 64;

/// Most backends a lab can have: host numbers 11..=60 keep every backend's
/// address, written with the same digits in v4, v6 and the MAC, valid.
pub const MAX_BACKENDS: usize = 50;

/// How long `up` waits for every eth0 to report carrier.
const LINK_UP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a spawned process gets between SIGTERM and SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// The lab's host numbers use the same digits in every notation: host 11 is
/// 10.99.0.11, fd00:99::11 (0x11) and MAC 02:99:00:00:00:11. `n` ≤ 99.
fn hex_digits(n: u8) -> u8 {
    (n / 10) * 16 + n % 10
}

/// Host number of backend `i` (1-based).
fn backend_host(i: usize) -> u8 {
    assert!(
        (1..=MAX_BACKENDS).contains(&i),
        "backend index {i} out of range 1..={MAX_BACKENDS}"
    );
    10 + i as u8
}

/// IPv4 address of backend `i` (1-based): 10.99.0.(10+i).
pub fn backend_v4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 99, 0, backend_host(i))
}

/// IPv6 address of backend `i` (1-based): fd00:99::(10+i), same digits as v4.
pub fn backend_v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(
        0xfd00,
        0x99,
        0,
        0,
        0,
        0,
        0,
        u16::from(hex_digits(backend_host(i))),
    )
}

fn host_mac(host: u8) -> [u8; 6] {
    [0x02, 0x99, 0, 0, 0, hex_digits(host)]
}

/// MAC address of the LB's eth0 (fixed, so configs can name it).
pub fn lb_mac() -> [u8; 6] {
    host_mac(2)
}

/// MAC address of the client's eth0.
pub fn client_mac() -> [u8; 6] {
    host_mac(10)
}

/// MAC address of backend `i`'s eth0 (1-based): 02:99:00:00:00:(10+i).
pub fn backend_mac(i: usize) -> [u8; 6] {
    host_mac(backend_host(i))
}

/// Formats a MAC the way `ip` writes it.
pub fn format_mac(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Everything that can go wrong building, using or removing a lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("invalid lab config: {reason}")]
    InvalidConfig { reason: String },

    #[error(
        "the lab needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network namespaces; run as root"
    )]
    NotRoot,

    #[error("could not run `{cmd}`: {source}; is iproute2 (`ip`) installed and on PATH?")]
    Spawn { cmd: String, source: io::Error },

    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        cmd: String,
        status: String,
        stderr: String,
    },

    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },

    #[error("namespace {ns} does not exist; run `Lab::up` (or `cargo xtask lab up`) first")]
    MissingNamespace { ns: String },

    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },

    #[error("unexpected output from `{cmd}`: {output}")]
    Parse { cmd: String, output: String },
}

type Result<T, E = LabError> = std::result::Result<T, E>;

/// What to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabConfig {
    /// Namespace-name prefix: namespaces are `{prefix}-br`, `-cl`, `-lb`,
    /// `-b1`…; 1 to 32 characters of `[A-Za-z0-9_]` or `-`.
    pub prefix: String,
    /// Number of backend namespaces, 1..=[`MAX_BACKENDS`].
    pub backends: usize,
}

impl Default for LabConfig {
    /// Prefix `xlb`, three backends.
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_string(),
            backends: 3,
        }
    }
}

impl LabConfig {
    /// The default config with another prefix.
    pub fn with_prefix(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            ..Self::default()
        }
    }

    pub fn validate(&self) -> Result<()> {
        validate_prefix(&self.prefix)?;
        if !(1..=MAX_BACKENDS).contains(&self.backends) {
            return Err(LabError::InvalidConfig {
                reason: format!(
                    "backends = {} is out of range; use 1..={MAX_BACKENDS}",
                    self.backends
                ),
            });
        }
        Ok(())
    }
}

fn validate_prefix(prefix: &str) -> Result<()> {
    let ok_chars = prefix
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if prefix.is_empty() || prefix.len() > 32 || !ok_chars {
        return Err(LabError::InvalidConfig {
            reason: format!(
                "prefix {prefix:?} must be 1 to 32 characters of letters, digits, '-' or '_'"
            ),
        });
    }
    Ok(())
}

/// True if `name` is one of the namespaces a lab with `prefix` creates.
fn is_lab_namespace(prefix: &str, name: &str) -> bool {
    let Some(role) = name
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('-'))
    else {
        return false;
    };
    match role {
        "br" | "cl" | "lb" => true,
        _ => role
            .strip_prefix('b')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
    }
}

/// True if this process runs as root; the lab needs it.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` to completion; returns its stdout, or an error carrying stderr.
fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LabError::Spawn {
            cmd: describe(cmd),
            source,
        })?;
    if !out.status.success() {
        return Err(LabError::Command {
            cmd: describe(cmd),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `ip ARGS…`.
fn ip<S: AsRef<OsStr>>(args: &[S]) -> Result<String> {
    run(Command::new("ip").args(args))
}

/// Runs `ip -n NS ARGS…`.
fn ip_in<S: AsRef<OsStr>>(ns: &str, args: &[S]) -> Result<String> {
    run(Command::new("ip").args(["-n", ns]).args(args))
}

/// Sets sysctls inside `ns` in one `sysctl` call.
fn sysctl_in(ns: &str, settings: &[(&str, &str)]) -> Result<()> {
    let mut cmd = Lab::exec(ns, ["sysctl", "-q", "-w"]);
    for (k, v) in settings {
        cmd.arg(format!("{k}={v}"));
    }
    run(&mut cmd).map(drop)
}

/// Reads one sysctl inside `ns` (e.g. `net.ipv4.ip_forward`).
pub fn sysctl_get(ns: &str, key: &str) -> Result<String> {
    run(&mut Lab::exec(ns, ["sysctl", "-n", key])).map(|s| s.trim().to_string())
}

/// Names of all named network namespaces (`ip netns list`).
pub fn list_namespaces() -> Result<Vec<String>> {
    let out = ip(&["netns", "list"])?;
    // Lines look like `name` or `name (id: 3)`.
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

fn namespace_exists(name: &str) -> bool {
    PathBuf::from(NETNS_RUN_DIR).join(name).exists()
}

/// Opens a handle on a named network namespace, for `setns(2)`.
pub fn netns_fd(ns: &str) -> Result<File> {
    let path = PathBuf::from(NETNS_RUN_DIR).join(ns);
    File::open(&path).map_err(|source| {
        if source.kind() == ErrorKind::NotFound {
            LabError::MissingNamespace { ns: ns.to_string() }
        } else {
            LabError::Io {
                what: format!("opening {}", path.display()),
                source,
            }
        }
    })
}

/// Runs `f` on a new thread that has entered network namespace `ns`, and
/// returns its result. Sockets keep the namespace they were created in, and
/// threads inherit their creator's, so `f` may build a tokio runtime and run
/// a whole client or server inside the namespace.
pub fn in_netns<F, R>(ns: &str, f: F) -> Result<R>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    let fd = netns_fd(ns)?;
    thread::scope(|s| {
        let worker = s.spawn(move || {
            setns(&fd, CloneFlags::CLONE_NEWNET).map_err(|e| LabError::Io {
                what: format!("entering network namespace {ns} (setns)"),
                source: e.into(),
            })?;
            Ok(f())
        });
        match worker.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Sends one ICMP (v4) or ICMPv6 echo request from inside `ns` to `dst` and
/// waits up to `timeout` for the reply; returns the round-trip time. A
/// replacement for `ping -c1`, which this machine does not have.
pub fn ping(ns: &str, dst: IpAddr, timeout: Duration) -> Result<Duration> {
    in_netns(ns, || ping_here(dst, timeout))?.map_err(|source| LabError::Io {
        what: format!("ping {dst} from namespace {ns}"),
        source,
    })
}

fn inet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

static PING_SEQ: AtomicU16 = AtomicU16::new(1);

fn ping_here(dst: IpAddr, timeout: Duration) -> io::Result<Duration> {
    let (domain, proto, request_type, reply_type) = match dst {
        IpAddr::V4(_) => (Domain::IPV4, Protocol::ICMPV4, 8u8, 0u8),
        IpAddr::V6(_) => (Domain::IPV6, Protocol::ICMPV6, 128, 129),
    };
    // A raw socket (root) rather than a ping socket: new namespaces start
    // with ping_group_range "1 0", which allows nobody.
    let sock = Socket::new(domain, Type::RAW, Some(proto))?;
    let id = (std::process::id() as u16) ^ 0x5a5a;
    let seq = PING_SEQ.fetch_add(1, Ordering::Relaxed);
    let mut pkt = vec![request_type, 0, 0, 0];
    pkt.extend_from_slice(&id.to_be_bytes());
    pkt.extend_from_slice(&seq.to_be_bytes());
    pkt.extend_from_slice(b"xlb-lab-ping-pad");
    if dst.is_ipv4() {
        // The kernel fills in the ICMPv6 checksum (it needs the pseudo-header);
        // ICMPv4's is ours.
        let csum = inet_checksum(&pkt);
        pkt[2..4].copy_from_slice(&csum.to_be_bytes());
    }
    let start = Instant::now();
    sock.send_to(&pkt, &SocketAddr::new(dst, 0).into())?;
    let mut buf = [MaybeUninit::<u8>::uninit(); 2048];
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(io::Error::new(
                ErrorKind::TimedOut,
                format!("no echo reply within {timeout:?}"),
            ));
        }
        sock.set_read_timeout(Some(left))?;
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) => return Err(e),
        };
        // SAFETY: recv_from initialised the first n bytes.
        let data: &[u8] = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), n) };
        // Raw IPv4 sockets deliver the IP header too; IPv6 ones do not.
        let icmp = if dst.is_ipv4() {
            let ihl = usize::from(data.first().copied().unwrap_or(0) & 0x0f) * 4;
            data.get(ihl..).unwrap_or(&[])
        } else {
            data
        };
        let from_ip = from.as_socket().map(|a| a.ip());
        if icmp.len() >= 8
            && icmp[0] == reply_type
            && icmp[4..6] == id.to_be_bytes()
            && icmp[6..8] == seq.to_be_bytes()
            && from_ip == Some(dst)
        {
            return Ok(start.elapsed());
        }
    }
}

/// Interface index of `ifname` inside `ns`.
pub fn ifindex(ns: &str, ifname: &str) -> Result<u32> {
    let out = ip_in(ns, &["-o", "link", "show", "dev", ifname])?;
    // `7: eth0@if8: <BROADCAST,…`
    out.split(':')
        .next()
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| LabError::Parse {
            cmd: format!("ip -n {ns} -o link show dev {ifname}"),
            output: out.clone(),
        })
}

/// One host namespace's end of the segment.
struct HostSpec {
    ns: String,
    /// Name of the veth peer in the bridge namespace.
    peer: String,
    v4: Ipv4Addr,
    v6: Ipv6Addr,
    mac: [u8; 6],
    mtu: u32,
}

/// A running lab. Dropping it kills what [`Lab::spawn`] started and removes
/// every namespace, unless [`Lab::keep`] was called.
#[derive(Debug)]
pub struct Lab {
    cfg: LabConfig,
    keep: bool,
    children: Mutex<Vec<Child>>,
}

impl Lab {
    /// Builds the lab. Any namespaces left with this prefix (a previous run
    /// that was interrupted or kept) are removed first, with the processes
    /// still running in them.
    pub fn up(cfg: &LabConfig) -> Result<Lab> {
        cfg.validate()?;
        if !is_root() {
            return Err(LabError::NotRoot);
        }
        Lab::down(&cfg.prefix)?;
        // From here on a failure drops `lab`, which removes what was built.
        let lab = Lab {
            cfg: cfg.clone(),
            keep: false,
            children: Mutex::new(Vec::new()),
        };
        lab.build()?;
        Ok(lab)
    }

    /// A handle on a lab that already exists (e.g. built by an earlier
    /// `cargo xtask lab up`). It is kept: dropping it removes nothing.
    pub fn attach(cfg: &LabConfig) -> Result<Lab> {
        cfg.validate()?;
        let lab = Lab {
            cfg: cfg.clone(),
            keep: true,
            children: Mutex::new(Vec::new()),
        };
        for ns in lab.namespaces() {
            if !namespace_exists(&ns) {
                return Err(LabError::MissingNamespace { ns });
            }
        }
        Ok(lab)
    }

    /// Removes every namespace of `prefix` and kills the processes running
    /// in them. Fine if there are none.
    pub fn down(prefix: &str) -> Result<()> {
        validate_prefix(prefix)?;
        if !PathBuf::from(NETNS_RUN_DIR).exists() {
            return Ok(());
        }
        let me = std::process::id();
        for ns in list_namespaces()? {
            if !is_lab_namespace(prefix, &ns) {
                continue;
            }
            // Processes keep a namespace (and its veths) alive after its name
            // is gone; a lab that is down must not leave servers running.
            let pids = ip(&["netns", "pids", &ns]).unwrap_or_default();
            for pid in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                if pid as u32 != me {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
            match ip(&["netns", "del", &ns]) {
                Ok(_) => {}
                // Removed concurrently or already half gone: the goal is met.
                Err(_) if !namespace_exists(&ns) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Leaves the namespaces and spawned processes in place when this handle
    /// is dropped (for `cargo xtask lab up`).
    pub fn keep(&mut self) {
        self.keep = true;
    }

    fn build(&self) -> Result<()> {
        let br = self.ns_bridge();
        for ns in self.namespaces() {
            ip(&["netns", "add", &ns])?;
            ip_in(&ns, &["link", "set", "lo", "up"])?;
        }
        // The bridge namespace only switches frames; no IPv6 link-local
        // chatter from its ports.
        sysctl_in(
            &br,
            &[
                ("net.ipv6.conf.all.disable_ipv6", "1"),
                ("net.ipv6.conf.default.disable_ipv6", "1"),
            ],
        )?;
        let mtu = LAB_MTU.to_string();
        // STP off and forward_delay 0: ports forward as soon as they are up.
        // Multicast snooping off: neighbour discovery must reach every port
        // whatever the bridge has (not) learnt about MLD listeners.
        ip_in(
            &br,
            &[
                "link",
                "add",
                BRIDGE_IFNAME,
                "mtu",
                &mtu,
                "type",
                "bridge",
                "stp_state",
                "0",
                "forward_delay",
                "0",
                "mcast_snooping",
                "0",
            ],
        )?;
        ip_in(&br, &["link", "set", BRIDGE_IFNAME, "up"])?;

        let client = self.ns_client();
        let lb = self.ns_lb();
        let mut hosts = vec![
            HostSpec {
                ns: client.clone(),
                peer: "v-cl".to_string(),
                v4: CLIENT_V4,
                v6: CLIENT_V6,
                mac: client_mac(),
                mtu: CLIENT_MTU,
            },
            HostSpec {
                ns: lb.clone(),
                peer: self.lb_peer_ifname().to_string(),
                v4: LB_V4,
                v6: LB_V6,
                mac: lb_mac(),
                mtu: LAB_MTU,
            },
        ];
        hosts.extend((1..=self.cfg.backends).map(|i| HostSpec {
            ns: self.ns_backend(i),
            peer: self.backend_peer_ifname(i),
            v4: backend_v4(i),
            v6: backend_v6(i),
            mac: backend_mac(i),
            mtu: LAB_MTU,
        }));
        for HostSpec {
            ns,
            peer,
            v4,
            v6,
            mac,
            mtu: host_mtu,
        } in &hosts
        {
            // Addresses go on with nodad, but eth0's link-local would still
            // be tentative for a second; no DAD at all in the lab.
            sysctl_in(
                ns,
                &[
                    ("net.ipv6.conf.all.accept_dad", "0"),
                    ("net.ipv6.conf.default.accept_dad", "0"),
                ],
            )?;
            // Created inside the namespaces directly, so nothing ever appears
            // in the root namespace and parallel labs cannot clash on names.
            ip_in(
                ns,
                &[
                    "link",
                    "add",
                    HOST_IFNAME,
                    "mtu",
                    &host_mtu.to_string(),
                    "address",
                    &format_mac(*mac),
                    "type",
                    "veth",
                    "peer",
                    "name",
                    peer,
                    "mtu",
                    &mtu,
                    "netns",
                    &br,
                ],
            )?;
            ip_in(&br, &["link", "set", peer, "master", BRIDGE_IFNAME, "up"])?;
            ip_in(
                ns,
                &[
                    "addr",
                    "add",
                    &format!("{v4}/{NET_V4_PREFIX}"),
                    "dev",
                    HOST_IFNAME,
                ],
            )?;
            ip_in(
                ns,
                &[
                    "addr",
                    "add",
                    &format!("{v6}/{NET_V6_PREFIX}"),
                    "dev",
                    HOST_IFNAME,
                    "nodad",
                ],
            )?;
            ip_in(ns, &["link", "set", HOST_IFNAME, "up"])?;
        }

        ip_in(
            &client,
            &[
                "route",
                "add",
                &format!("{VIP_NET_V4}/{VIP_NET_V4_PREFIX}"),
                "via",
                &LB_V4.to_string(),
                "dev",
                HOST_IFNAME,
            ],
        )?;
        ip_in(
            &client,
            &[
                "-6",
                "route",
                "add",
                &format!("{VIP_NET_V6}/{VIP_NET_V6_PREFIX}"),
                "via",
                &LB_V6.to_string(),
                "dev",
                HOST_IFNAME,
            ],
        )?;

        // The LB host never routes: forwarding is XDP's job, and a kernel
        // that forwarded would hide a data-plane bug.
        sysctl_in(
            &lb,
            &[
                ("net.ipv4.ip_forward", "0"),
                ("net.ipv6.conf.all.forwarding", "0"),
            ],
        )?;

        // Data-path health probes: the LB host connects to the VIPs itself
        // and `xlb_hc` takes the marked packets on eth0's egress. So, like a
        // real LB host with its default route, it needs a route to the VIPs
        // out of eth0 whose next hop resolves (an on-link route would wait
        // forever for an ARP answer nobody gives: backends ignore ARP for
        // VIPs). The lab has no router: the next hop is a fixed neighbour
        // whose MAC nobody owns, so an unmarked packet from the LB host to a
        // VIP is flooded by the bridge and dropped everywhere, as a real
        // gateway would send it back to the LB's XDP program (never to a
        // backend directly). Replies from the VIP then also pass strict
        // rp_filter: their source routes back out of eth0.
        let gw_mac = format_mac(LB_GW_MAC);
        for (family, gw, net) in [
            (
                "-4",
                LB_GW_V4.to_string(),
                format!("{VIP_NET_V4}/{VIP_NET_V4_PREFIX}"),
            ),
            (
                "-6",
                LB_GW_V6.to_string(),
                format!("{VIP_NET_V6}/{VIP_NET_V6_PREFIX}"),
            ),
        ] {
            ip_in(
                &lb,
                &[
                    family,
                    "neigh",
                    "add",
                    &gw,
                    "lladdr",
                    &gw_mac,
                    "dev",
                    HOST_IFNAME,
                    "nud",
                    "permanent",
                ],
            )?;
            ip_in(
                &lb,
                &[family, "route", "add", &net, "via", &gw, "dev", HOST_IFNAME],
            )?;
        }

        for i in 1..=self.cfg.backends {
            let ns = self.ns_backend(i);
            for vip in [
                format!("{VIP_V4}/32"),
                format!("{VIP2_V4}/32"),
                format!("{VIP_V6}/128"),
            ] {
                ip_in(&ns, &["addr", "add", &vip, "dev", "lo"])?;
            }
            sysctl_in(
                &ns,
                &[
                    // Answer ARP only for addresses on the receiving interface
                    // (not the VIPs on lo), and source ARP from eth0's own
                    // address: the LB alone owns the VIPs on the segment.
                    ("net.ipv4.conf.all.arp_ignore", "1"),
                    ("net.ipv4.conf.eth0.arp_ignore", "1"),
                    ("net.ipv4.conf.all.arp_announce", "2"),
                    ("net.ipv4.conf.eth0.arp_announce", "2"),
                    // Decapsulated packets (client → VIP) arrive on eth0; no
                    // reverse-path check may drop them. The effective value
                    // is max(all, iface), so both.
                    ("net.ipv4.conf.all.rp_filter", "0"),
                    ("net.ipv4.conf.default.rp_filter", "0"),
                    ("net.ipv4.conf.eth0.rp_filter", "0"),
                    ("net.ipv4.conf.lo.rp_filter", "0"),
                ],
            )?;
        }
        self.wait_links_up()
    }

    fn wait_links_up(&self) -> Result<()> {
        let start = Instant::now();
        for ns in self.host_namespaces() {
            loop {
                let out = ip_in(&ns, &["-o", "link", "show", "dev", HOST_IFNAME])?;
                if out.contains("state UP") {
                    break;
                }
                if start.elapsed() > LINK_UP_TIMEOUT {
                    return Err(LabError::Timeout {
                        what: format!("{HOST_IFNAME} in {ns} to come up (last: {})", out.trim()),
                        after: LINK_UP_TIMEOUT,
                    });
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// A `Command` running `args[0] args[1..]` inside namespace `ns`
    /// (`ip netns exec ns …`).
    pub fn exec<I, S>(ns: &str, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).args(args);
        cmd
    }

    /// Starts `cmd` in its own process group and owns it: it is killed
    /// (SIGTERM, then SIGKILL after 2 s) when the lab is dropped, unless kept.
    /// Build `cmd` with [`Lab::exec`] to run it inside a namespace. Returns
    /// the pid (also the process group id).
    pub fn spawn(&self, mut cmd: Command) -> Result<u32> {
        cmd.process_group(0);
        let child = cmd.spawn().map_err(|source| LabError::Spawn {
            cmd: describe(&cmd),
            source,
        })?;
        let pid = child.id();
        self.children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(child);
        Ok(pid)
    }

    /// Starts `program args…` in the background inside `ns` (stdin closed,
    /// stdout and stderr inherited); see [`Lab::spawn`].
    pub fn spawn_in<I, S>(&self, ns: &str, program: impl AsRef<OsStr>, args: I) -> Result<u32>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Lab::exec(ns, [program.as_ref()]);
        cmd.args(args).stdin(Stdio::null());
        self.spawn(cmd)
    }

    /// Stops one process started by [`Lab::spawn`] (SIGTERM to its group,
    /// SIGKILL after 2 s) and reaps it. Unknown pids are an error.
    pub fn kill(&self, pid: u32) -> Result<()> {
        let child = {
            let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
            let pos = children.iter().position(|c| c.id() == pid).ok_or_else(|| {
                LabError::InvalidConfig {
                    reason: format!("pid {pid} was not started by this lab"),
                }
            })?;
            children.swap_remove(pos)
        };
        stop_children(vec![child]);
        Ok(())
    }

    /// True while a process started by [`Lab::spawn`] is still running.
    pub fn is_running(&self, pid: u32) -> bool {
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        children
            .iter_mut()
            .find(|c| c.id() == pid)
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn config(&self) -> &LabConfig {
        &self.cfg
    }

    pub fn prefix(&self) -> &str {
        &self.cfg.prefix
    }

    pub fn backend_count(&self) -> usize {
        self.cfg.backends
    }

    /// The namespace holding the bridge.
    pub fn ns_bridge(&self) -> String {
        format!("{}-br", self.cfg.prefix)
    }

    pub fn ns_client(&self) -> String {
        format!("{}-cl", self.cfg.prefix)
    }

    pub fn ns_lb(&self) -> String {
        format!("{}-lb", self.cfg.prefix)
    }

    /// Namespace of backend `i`, 1-based.
    pub fn ns_backend(&self, i: usize) -> String {
        assert!(
            (1..=self.cfg.backends).contains(&i),
            "backend {i} out of range 1..={}",
            self.cfg.backends
        );
        format!("{}-b{i}", self.cfg.prefix)
    }

    /// Every backend namespace, b1 first.
    pub fn backend_namespaces(&self) -> Vec<String> {
        (1..=self.cfg.backends)
            .map(|i| self.ns_backend(i))
            .collect()
    }

    /// Client, LB and backend namespaces (everything with an eth0).
    pub fn host_namespaces(&self) -> Vec<String> {
        let mut v = vec![self.ns_client(), self.ns_lb()];
        v.extend(self.backend_namespaces());
        v
    }

    /// Every namespace of the lab, bridge first.
    pub fn namespaces(&self) -> Vec<String> {
        let mut v = vec![self.ns_bridge()];
        v.extend(self.host_namespaces());
        v
    }

    /// The bridge-side peer of the LB's eth0 (in [`Lab::ns_bridge`]); it needs
    /// an XDP program for the LB's XDP_TX frames to arrive (see module docs).
    pub fn lb_peer_ifname(&self) -> &'static str {
        "v-lb"
    }

    /// The bridge-side peer of backend `i`'s eth0 (in [`Lab::ns_bridge`]).
    pub fn backend_peer_ifname(&self, i: usize) -> String {
        assert!(
            (1..=self.cfg.backends).contains(&i),
            "backend {i} out of range 1..={}",
            self.cfg.backends
        );
        format!("v-b{i}")
    }

    /// The LB's interface (in [`Lab::ns_lb`]), where the XDP LB attaches.
    pub fn lb_ifname(&self) -> &'static str {
        HOST_IFNAME
    }

    pub fn lb_v4(&self) -> Ipv4Addr {
        LB_V4
    }

    pub fn lb_v6(&self) -> Ipv6Addr {
        LB_V6
    }

    pub fn client_v4(&self) -> Ipv4Addr {
        CLIENT_V4
    }

    pub fn client_v6(&self) -> Ipv6Addr {
        CLIENT_V6
    }

    /// Backend `i`'s IPv4 address, 1-based.
    pub fn backend_v4(&self, i: usize) -> Ipv4Addr {
        assert!(i <= self.cfg.backends, "backend {i} out of range");
        backend_v4(i)
    }

    /// Backend `i`'s IPv6 address, 1-based.
    pub fn backend_v6(&self, i: usize) -> Ipv6Addr {
        assert!(i <= self.cfg.backends, "backend {i} out of range");
        backend_v6(i)
    }

    pub fn vip_v4(&self) -> Ipv4Addr {
        VIP_V4
    }

    pub fn vip2_v4(&self) -> Ipv4Addr {
        VIP2_V4
    }

    pub fn vip_v6(&self) -> Ipv6Addr {
        VIP_V6
    }

    /// Opens namespace `ns` for `setns(2)`; see also [`in_netns`].
    pub fn netns_fd(&self, ns: &str) -> Result<File> {
        netns_fd(ns)
    }
}

/// SIGTERM to each child's process group, SIGKILL to those still running
/// after [`KILL_GRACE`], then reap them all.
fn stop_children(mut children: Vec<Child>) {
    for c in &children {
        let _ = killpg(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
    }
    let deadline = Instant::now() + KILL_GRACE;
    while Instant::now() < deadline
        && children
            .iter_mut()
            .any(|c| matches!(c.try_wait(), Ok(None)))
    {
        thread::sleep(Duration::from_millis(10));
    }
    for c in &mut children {
        if matches!(c.try_wait(), Ok(None)) {
            let _ = killpg(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
            let _ = c.kill();
        }
        let _ = c.wait();
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let children = std::mem::take(self.children.get_mut().unwrap_or_else(|e| e.into_inner()));
        stop_children(children);
        if let Err(e) = Lab::down(&self.cfg.prefix) {
            eprintln!(
                "xlb-lab: removing lab {:?} failed: {e}; run `ip netns list` and delete its namespaces by hand",
                self.cfg.prefix
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_use_the_same_digits_everywhere() {
        let cases = [
            ("b1", 1, "10.99.0.11", "fd00:99::11", "02:99:00:00:00:11"),
            ("b3", 3, "10.99.0.13", "fd00:99::13", "02:99:00:00:00:13"),
            ("b10", 10, "10.99.0.20", "fd00:99::20", "02:99:00:00:00:20"),
            ("b50", 50, "10.99.0.60", "fd00:99::60", "02:99:00:00:00:60"),
        ];
        for (name, i, v4, v6, mac) in cases {
            assert_eq!(backend_v4(i).to_string(), v4, "{name}");
            assert_eq!(backend_v6(i).to_string(), v6, "{name}");
            assert_eq!(format_mac(backend_mac(i)), mac, "{name}");
        }
        assert_eq!(LB_V6.to_string(), "fd00:99::2");
        assert_eq!(CLIENT_V6.to_string(), "fd00:99::10");
        assert_eq!(VIP_V6.to_string(), "fd00:100::1");
        assert_eq!(format_mac(lb_mac()), "02:99:00:00:00:02");
        assert_eq!(format_mac(client_mac()), "02:99:00:00:00:10");
    }

    #[test]
    fn lab_namespace_names() {
        let cases = [
            ("bridge", "xlb", "xlb-br", true),
            ("client", "xlb", "xlb-cl", true),
            ("lb", "xlb", "xlb-lb", true),
            ("backend", "xlb", "xlb-b2", true),
            ("backend two digits", "xlb", "xlb-b12", true),
            ("other prefix sharing a start", "xlb", "xlbt1-b1", false),
            ("longer prefix", "xlb", "xlb-b1-br", false),
            ("bare b", "xlb", "xlb-b", false),
            ("unknown role", "xlb", "xlb-foo", false),
            ("no dash", "xlb", "xlbbr", false),
            ("prefix with dash", "xlb-x", "xlb-x-cl", true),
        ];
        for (name, prefix, ns, want) in cases {
            assert_eq!(is_lab_namespace(prefix, ns), want, "{name}");
        }
    }

    #[test]
    fn config_validation() {
        let cases = [
            ("default", LabConfig::default(), true),
            ("empty prefix", LabConfig::with_prefix(""), false),
            ("slash", LabConfig::with_prefix("a/b"), false),
            ("space", LabConfig::with_prefix("a b"), false),
            ("too long", LabConfig::with_prefix("x".repeat(33)), false),
            (
                "zero backends",
                LabConfig {
                    backends: 0,
                    ..LabConfig::default()
                },
                false,
            ),
            (
                "max backends",
                LabConfig {
                    backends: MAX_BACKENDS,
                    ..LabConfig::default()
                },
                true,
            ),
            (
                "too many",
                LabConfig {
                    backends: MAX_BACKENDS + 1,
                    ..LabConfig::default()
                },
                false,
            ),
        ];
        for (name, cfg, ok) in cases {
            assert_eq!(cfg.validate().is_ok(), ok, "{name}");
        }
    }

    #[test]
    fn checksum_of_known_echo_request() {
        // Echo request, id 0x1234, seq 1, no payload: 0x08 0x00 + 0x12 0x34 + 0x00 0x01
        // sum = 0x0800 + 0x1234 + 0x0001 = 0x1a35 → !0x1a35 = 0xe5ca.
        let pkt = [8, 0, 0, 0, 0x12, 0x34, 0, 1];
        assert_eq!(inet_checksum(&pkt), 0xe5ca);
        // An odd length pads with a zero byte.
        assert_eq!(inet_checksum(&[0xff]), !0xff00);
    }
}
