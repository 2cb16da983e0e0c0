//! Preparing the host for xlb: the capabilities it needs, bpffs for its
//! pins, the forwarding sysctl `bpf_fib_lookup` depends on, the addresses of
//! an interface, and the descriptor limit. Shared by the daemon, the
//! decapsulator and the benchmarks; nothing here knows about VIPs.

use std::{
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

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

/// Whether `path` is the root of a bpffs mount.
pub fn is_bpffs(path: &Path) -> bool {
    const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
    nix::sys::statfs::statfs(path).is_ok_and(|st| st.filesystem_type().0 == BPF_FS_MAGIC)
}

/// Mounts bpffs at /sys/fs/bpf if it is not there (pins need it).
pub fn ensure_bpffs() -> anyhow::Result<()> {
    if is_bpffs(Path::new("/sys/fs/bpf")) {
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

/// A sysctl `xlb run` changed: its path, its value before, and the network
/// namespace it belongs to (`/proc/sys/net` is per namespace). Kept in the
/// state file so `xlb detach` can put the value back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SysctlChange {
    /// `/proc/sys/net/ipv4/conf/eth0/forwarding`.
    pub path: String,
    /// The value before, as read (`"0"`).
    pub previous: String,
    /// The inode of the namespace's `/proc/self/ns/net`.
    pub netns: u64,
}

/// The current network namespace's identity (the inode of
/// `/proc/self/ns/net`).
pub fn netns_id() -> anyhow::Result<u64> {
    use std::os::unix::fs::MetadataExt as _;
    Ok(fs::metadata("/proc/self/ns/net")
        .context("reading /proc/self/ns/net")?
        .ino())
}

/// `bpf_fib_lookup` from XDP answers "forwarding disabled" unless forwarding
/// is on for the ingress interface (checked on 6.18), so turn it on there,
/// and only there. Returns what was changed (nothing if it was on), for
/// [`restore_sysctls`].
pub fn enable_forwarding(iface: &str, v6: bool) -> anyhow::Result<Vec<SysctlChange>> {
    let mut keys = vec![format!("/proc/sys/net/ipv4/conf/{iface}/forwarding")];
    if v6 {
        keys.push(format!("/proc/sys/net/ipv6/conf/{iface}/forwarding"));
    }
    let netns = netns_id()?;
    let mut changed = Vec::new();
    for k in keys {
        let cur = fs::read_to_string(&k).with_context(|| format!("reading {k}"))?;
        let cur = cur.trim();
        if cur != "1" {
            fs::write(&k, "1").with_context(|| format!("writing 1 to {k}"))?;
            info!(
                "set {k} = 1 (was {cur}): bpf_fib_lookup in XDP needs forwarding on the \
                 interface it runs on; `xlb detach` puts {cur} back"
            );
            changed.push(SysctlChange {
                path: k,
                previous: cur.to_string(),
                netns,
            });
        }
    }
    Ok(changed)
}

/// Where the sysctls live.
const PROC_SYS: &str = "/proc/sys";

/// Whether `path` is one of the sysctls [`enable_forwarding`] changes
/// (`<root>/net/ipv4/conf/<iface>/forwarding` or its ipv6 twin, `<iface>` a
/// valid interface name) and `value` a value it may hold. The state file
/// says what to write where; whoever could edit it must not get a root
/// write to any other file through `xlb detach`.
fn is_forwarding_sysctl(root: &Path, path: &str, value: &str) -> bool {
    let Ok(rest) = Path::new(path).strip_prefix(root) else {
        return false;
    };
    let parts: Vec<&str> = rest.iter().filter_map(|p| p.to_str()).collect();
    let known = match parts.as_slice() {
        ["net", "ipv4" | "ipv6", "conf", iface, "forwarding"] => is_interface_name(iface),
        _ => false,
    } && parts.len() == rest.iter().count();
    let number = !value.is_empty() && value.len() <= 3 && value.bytes().all(|b| b.is_ascii_digit());
    known && number
}

/// A name the kernel accepts for an interface (`dev_valid_name`): 1 to 15
/// bytes, not `.` or `..`, no `/`, `:` or white space.
fn is_interface_name(name: &str) -> bool {
    (1..16).contains(&name.len())
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
}

/// Puts back what [`enable_forwarding`] changed, where it still holds the
/// value xlb wrote and only in the namespace it was changed in (from any
/// other, `/proc/sys/net` names another interface, maybe the host's).
/// Writes nothing but the forwarding sysctls of an interface, whatever the
/// state file names. Never fails: returns one note per sysctl, also logged.
pub fn restore_sysctls(changes: &[SysctlChange]) -> Vec<String> {
    restore_sysctls_under(Path::new(PROC_SYS), changes)
}

fn restore_sysctls_under(root: &Path, changes: &[SysctlChange]) -> Vec<String> {
    let here = netns_id().ok();
    let mut notes = Vec::new();
    for c in changes {
        let note = if !is_forwarding_sysctl(root, &c.path, &c.previous) {
            format!(
                "{:?} = {:?} not restored: xlb changes only {}/net/ipv4|ipv6/conf/<interface>/\
                 forwarding, to a number; the state file was edited by hand or damaged: set the \
                 value by hand if needed",
                c.path,
                c.previous,
                root.display()
            )
        } else if here != Some(c.netns) {
            format!(
                "{} not restored to {}: it was changed in another network namespace \
                 (run `xlb detach` in the daemon's namespace, or set it by hand)",
                c.path, c.previous
            )
        } else {
            match fs::read_to_string(&c.path) {
                Err(e) => format!("{} not restored to {}: {e}", c.path, c.previous),
                Ok(cur) if cur.trim() != "1" => format!(
                    "{} left at {}: changed since xlb set it to 1",
                    c.path,
                    cur.trim()
                ),
                Ok(_) => match fs::write(&c.path, &c.previous) {
                    Ok(()) => format!("restored {} = {}", c.path, c.previous),
                    Err(e) => format!("{} not restored to {}: {e}", c.path, c.previous),
                },
            }
        };
        if note.starts_with("restored") {
            info!("{note}");
        } else {
            warn!("{note}");
        }
        notes.push(note);
    }
    notes
}

/// Makes `dir` (and its parents) exist, with `dir` itself owned by us and
/// mode 0700: the lock and state files inside it decide who may run an
/// instance, so no other user may even look up a name in it. A directory
/// another user owns is refused (they could swap its files); one of ours
/// with a looser mode (an earlier version's) is tightened.
///
/// # Errors
///
/// Creating or inspecting `dir` failing, or `dir` owned by another user,
/// or a symbolic link.
pub fn private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    let meta =
        fs::symlink_metadata(dir).with_context(|| format!("inspecting {}", dir.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != me {
        bail!(
            "{} is {}, not a directory of uid {me}: another user could replace the lock and \
             state files in it; remove it (rm -r {}) once no xlb runs, and start again",
            dir.display(),
            if meta.is_dir() {
                format!("owned by uid {}", meta.uid())
            } else {
                "not a directory".to_string()
            },
            dir.display()
        );
    }
    if meta.mode() & 0o777 != 0o700 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .with_context(|| format!("setting mode 0700 on {}", dir.display()))?;
        info!(
            "{}: mode set to 0700 (was {:o})",
            dir.display(),
            meta.mode() & 0o777
        );
    }
    Ok(())
}

/// Opens (creating it if needed) a file only we may read or write: mode
/// 0600, never through a symbolic link, and refused when another user owns
/// it (whoever owns it can `flock` it, or write what we read back). A file
/// of ours with a looser mode (an earlier version's 0644) is tightened.
///
/// # Errors
///
/// Opening or inspecting the file failing, or the file owned by another user.
pub fn open_private(path: &Path) -> anyhow::Result<fs::File> {
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("inspecting {}", path.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        bail!(
            "{} is owned by uid {}, not by uid {me} (root): another user could hold it to keep \
             xlb from starting; check that no xlb runs, remove it (rm {}) and start again",
            path.display(),
            meta.uid(),
            path.display()
        );
    }
    if meta.mode() & 0o077 != 0 {
        file.set_permissions(fs::Permissions::from_mode(0o600))
            .with_context(|| format!("setting mode 0600 on {}", path.display()))?;
    }
    Ok(file)
}

/// What `errors_of` finds wrong with this host's addresses
/// ([`host_addresses`]), each line prefixed with `origin`.
///
/// # Errors
/// The lines `errors_of` gives, or why the addresses could not be read.
pub fn check_addresses(
    origin: &str,
    errors_of: impl FnOnce(&[(String, IpAddr)]) -> Vec<String>,
) -> Result<(), Vec<String>> {
    let local = host_addresses()
        .map_err(|e| vec![format!("{origin}: reading this host's addresses: {e}")])?;
    let errors: Vec<String> = errors_of(&local)
        .into_iter()
        .map(|l| format!("{origin}: {l}"))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Every IPv4 and IPv6 address of this host with its interface's name, in
/// the order the kernel lists them.
///
/// # Errors
/// `getifaddrs` fails.
pub fn host_addresses() -> std::io::Result<Vec<(String, IpAddr)>> {
    let mut out = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs()? {
        let Some(addr) = ifa.address else { continue };
        if let Some(sin) = addr.as_sockaddr_in() {
            out.push((ifa.interface_name, IpAddr::V4(sin.ip())));
        } else if let Some(sin6) = addr.as_sockaddr_in6() {
            out.push((ifa.interface_name, IpAddr::V6(sin6.ip())));
        }
    }
    Ok(out)
}

/// Every address of `iface`, in the order the kernel lists them.
pub fn interface_addresses(iface: &str) -> anyhow::Result<Vec<IpAddr>> {
    Ok(host_addresses()
        .context("getifaddrs")?
        .into_iter()
        .filter(|(name, _)| name == iface)
        .map(|(_, ip)| ip)
        .collect())
}

/// The interface's first IPv4 and first global IPv6 address that can
/// source the LB's own packets (`dsr-ipip`'s outer header, data-path
/// probes' tunnels): in the kernel's order, leaving out the addresses in
/// `taken` (VIPs and NAT pools held on the interface) and IPv6 addresses
/// that are deprecated (`preferred_lft 0`), tentative or failed duplicate
/// address detection, which the kernel never picks as a source either.
pub fn interface_source_addrs(
    iface: &str,
    taken: &[IpAddr],
) -> anyhow::Result<(Option<Ipv4Addr>, Option<Ipv6Addr>)> {
    let addrs = interface_addresses(iface)?;
    // Without the file (no IPv6 in this kernel) there is no IPv6 address
    // to leave out either.
    let flags = fs::read_to_string("/proc/net/if_inet6").unwrap_or_default();
    let unusable = unusable_v6(&flags, iface);
    Ok(pick_sources(&addrs, &unusable, taken))
}

/// `IFA_F_DADFAILED`, `IFA_F_DEPRECATED` and `IFA_F_TENTATIVE`
/// (include/uapi/linux/if_addr.h).
const IFA_F_UNUSABLE: u32 = 0x08 | 0x20 | 0x40;

/// The IPv6 addresses of `iface` that `/proc/net/if_inet6` (`text`: the
/// address in 32 hex digits, interface index, prefix length, scope and
/// flags in hex, name) flags deprecated, tentative or failed DAD.
fn unusable_v6(text: &str, iface: &str) -> Vec<Ipv6Addr> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [addr, _, _, _, flags, name] = f.as_slice() else {
                return None;
            };
            let flags = u32::from_str_radix(flags, 16).ok()?;
            if *name != iface || flags & IFA_F_UNUSABLE == 0 {
                return None;
            }
            u128::from_str_radix(addr, 16).ok().map(Ipv6Addr::from)
        })
        .collect()
}

/// [`interface_source_addrs`]'s choice among `addrs` (the interface's, in
/// the kernel's order).
fn pick_sources(
    addrs: &[IpAddr],
    unusable: &[Ipv6Addr],
    taken: &[IpAddr],
) -> (Option<Ipv4Addr>, Option<Ipv6Addr>) {
    let free = |a: &IpAddr| !taken.contains(a);
    let v4 = addrs.iter().filter(|a| free(a)).find_map(|a| match a {
        IpAddr::V4(v4) => Some(*v4),
        IpAddr::V6(_) => None,
    });
    let v6 = addrs.iter().filter(|a| free(a)).find_map(|a| match a {
        IpAddr::V6(v6)
            if !v6.is_loopback() && !v6.is_unicast_link_local() && !unusable.contains(v6) =>
        {
            Some(*v6)
        }
        _ => None,
    });
    (v4, v6)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_skip_taken_and_unusable_addresses() {
        let text = "\
fd000099000000000000000000000005 02 80 00 a0 eth0
fd000099000000000000000000000002 02 40 00 80 eth0
fe800000000000000000000000000001 02 40 20 80 eth0
fd000099000000000000000000000009 03 40 00 40 eth1
";
        let unusable = unusable_v6(text, "eth0");
        let pool: Ipv6Addr = "fd00:99::5".parse().unwrap();
        assert_eq!(unusable, [pool], "deprecated (0x20) on eth0 only");
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // The kernel lists the IPv6 addresses added last first: a NAT pool
        // address (deprecated) and a VIP held on the interface come before
        // the LB's own.
        let addrs = [
            ip("10.100.0.3"),
            ip("10.99.0.2"),
            ip("fd00:99::5"),
            ip("fd00:100::1"),
            ip("fd00:99::2"),
            ip("fe80::1"),
        ];
        let taken = [ip("10.100.0.3"), ip("fd00:100::1")];
        assert_eq!(
            pick_sources(&addrs, &unusable, &taken),
            (
                Some("10.99.0.2".parse().unwrap()),
                Some("fd00:99::2".parse().unwrap())
            )
        );
        assert_eq!(
            pick_sources(&addrs, &[], &[]),
            (Some("10.100.0.3".parse().unwrap()), Some(pool)),
            "nothing left out: the kernel's first"
        );
        assert_eq!(
            pick_sources(&addrs[5..], &[], &[]),
            (None, None),
            "link-local only"
        );
    }

    #[test]
    fn restore_puts_back_only_what_xlb_set_in_its_own_namespace() {
        let root = std::env::temp_dir().join(format!("xlb-sysctl-{}", std::process::id()));
        let here = netns_id().unwrap();
        // (name, value now, namespace of the record, value after, note)
        let cases = [
            ("ours, still 1", Some("1\n"), here, Some("0"), "restored"),
            (
                "another namespace",
                Some("1\n"),
                here + 1,
                Some("1\n"),
                "another network namespace",
            ),
            ("changed since", Some("0\n"), here, Some("0\n"), "left at 0"),
            ("gone", None, here, None, "not restored to 0"),
        ];
        for (i, (name, now, netns, after, note)) in cases.into_iter().enumerate() {
            let dir = root.join(format!("net/ipv4/conf/eth{i}"));
            fs::create_dir_all(&dir).unwrap();
            let path = dir.join("forwarding");
            if let Some(now) = now {
                fs::write(&path, now).unwrap();
            }
            let change = SysctlChange {
                path: path.display().to_string(),
                previous: "0".into(),
                netns,
            };
            let notes = restore_sysctls_under(&root, &[change]);
            assert_eq!(notes.len(), 1, "{name}");
            assert!(notes[0].contains(note), "{name}: {notes:?}");
            assert_eq!(fs::read_to_string(&path).ok().as_deref(), after, "{name}");
        }
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn restore_writes_only_forwarding_sysctls() {
        let root = std::env::temp_dir().join(format!("xlb-sysctl-only-{}", std::process::id()));
        let here = netns_id().unwrap();
        let victim = root.join("victim");
        let r = root.display();
        // (name, path the state file names, previous value)
        let cases = [
            (
                "another file",
                victim.display().to_string(),
                "0".to_string(),
            ),
            (
                "walks out of conf",
                format!("{r}/net/ipv4/conf/../../../victim"),
                "0".into(),
            ),
            (
                "interface ..",
                format!("{r}/net/ipv4/conf/../forwarding"),
                "0".into(),
            ),
            (
                "another sysctl",
                format!("{r}/net/ipv4/conf/eth0/rp_filter"),
                "0".into(),
            ),
            (
                "ipv5",
                format!("{r}/net/ipv5/conf/eth0/forwarding"),
                "0".into(),
            ),
            (
                "a value that is not a number",
                format!("{r}/net/ipv4/conf/eth0/forwarding"),
                "0\nroot::0:0::/:/bin/sh".into(),
            ),
            (
                "interface name too long",
                format!("{r}/net/ipv4/conf/abcdefghijklmnop/forwarding"),
                "0".into(),
            ),
        ];
        for (name, path, previous) in cases {
            // Every target holds xlb's 1, so only the path check stops a write.
            if let Some(dir) = Path::new(&path).parent() {
                let _ = fs::create_dir_all(dir);
            }
            let _ = fs::write(&path, "1\n");
            fs::write(&victim, "1\n").unwrap();
            let change = SysctlChange {
                path: path.clone(),
                previous: previous.clone(),
                netns: here,
            };
            let notes = restore_sysctls_under(&root, &[change]);
            assert!(
                notes[0].contains("not restored: xlb changes only"),
                "{name}: {notes:?}"
            );
            assert_eq!(
                fs::read_to_string(&path).unwrap(),
                "1\n",
                "{name}: {path} written"
            );
            assert_eq!(
                fs::read_to_string(&victim).unwrap(),
                "1\n",
                "{name}: victim written"
            );
        }
        fs::remove_dir_all(root).unwrap();
    }
}
