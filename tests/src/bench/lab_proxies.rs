//! What `xlb-lab-bench` compares xlb with, both full proxies in the LB
//! namespace in front of the same three backends: HAProxy in `mode tcp`
//! (round robin) and nftables DNAT (`numgen random mod 3`, masqueraded so
//! that answers come back through the LB).
//!
//! Both listen on the LB host's own addresses (HAProxy on its main one,
//! nftables on one of its own, see [`NFT_LISTEN`]), never on a VIP: xlb's XDP program stays attached to the LB's eth0 for the whole
//! run (the cases alternate round by round) and would take VIP traffic
//! before either saw it. Their packets still cross `xlb_lb` (passed: not a
//! VIP) and the decapsulators (passed: not a tunnel), as the direct case's
//! cross `xlb_decap`; the profile pass measures what that costs.

use std::{
    fs,
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use xlb_lab::{
    scenario::{LabRun, command_in, log_tail},
    topology::{HOST_IFNAME, in_netns},
};

/// HAProxy's listening port on the LB host's address.
pub const HAPROXY_PORT: u16 = 8081;

/// Where nftables DNATs, and the source it rewrites to: an address of the
/// LB host's own, added to its eth0 only while the table exists, a free host
/// of the lab's segment (.1 gateway, .2 LB, .9 flooder, .10 client, .11 and
/// up backends).
///
/// Not the LB's main address, which HAProxy connects from: a backend keeps
/// TIME_WAIT for every connection of the `Connection: close` runs, and a
/// SYN from a port HAProxy used moments ago, with the client's unrelated
/// sequence and timestamps, fails its TIME_WAIT check (PAWS) and waits for
/// a retransmission, in whichever of the two cases comes second: measured,
/// nftables fell from ~8,000 to ~350 req/s. Real deployments do not share
/// one source address between a proxy and a NAT either.
pub const NFT_LISTEN: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 99, 0, 3), 8082);

/// How long HAProxy (or a freshly installed DNAT) gets to answer its first
/// request.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Bound on one readiness request.
const GET_TIMEOUT: Duration = Duration::from_secs(2);

/// LB-namespace sysctls the DNAT path needs, with the values it needs:
/// forwarding on eth0, the interface DNATed packets come in by (xlb already
/// turns it on for `bpf_fib_lookup`, so this is normally a no-op), and no
/// ICMP redirects (a DNATed packet leaves by the interface it came in on,
/// which would make the kernel tell the client to go to the backend
/// directly; sent if either `all` or `eth0` allows it).
///
/// Not `net.ipv4.ip_forward`: writing it resets every interface's
/// `forwarding` (inet_forward_change, net/ipv4/devinet.c), so putting it
/// back to 0 would turn off eth0's, which xlb set, and `bpf_fib_lookup`
/// would fail from then on (the data-path health probes through `xlb_hc`
/// time out and every IPv4 backend goes down).
const DNAT_SYSCTLS: [(&str, &str); 3] = [
    ("net/ipv4/conf/eth0/forwarding", "1"),
    ("net/ipv4/conf/all/send_redirects", "0"),
    ("net/ipv4/conf/eth0/send_redirects", "0"),
];

/// HAProxy's configuration: `mode tcp`, round robin over `backends`, no
/// health checks (nftables has none either, and xlb's own are outside the
/// data path), no logging. Threads are HAProxy's default (one per CPU), as
/// an operator would start it. `maxconn` is far above wrk's connections but
/// low enough that the two fds per connection HAProxy reserves fit under a
/// container's hard fd limit (HAProxy refuses to start otherwise).
pub fn haproxy_config(listen: SocketAddrV4, backends: &[SocketAddrV4]) -> String {
    let mut cfg = format!(
        "# Written by xlb-lab-bench.\n\
         global\n    maxconn 4000\n\n\
         defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 30s\n    \
         timeout server 30s\n\n\
         frontend lab\n    bind {listen}\n    default_backend lab_backends\n\n\
         backend lab_backends\n    balance roundrobin\n"
    );
    for (i, b) in backends.iter().enumerate() {
        cfg.push_str(&format!("    server b{} {b}\n", i + 1));
    }
    cfg
}

/// The nftables table: DNAT of `listen` to one of `backends` at random, and
/// SNAT of what was DNATed to `listen`'s address, so that backends answer
/// the LB and the LB answers the client (a full proxy's path, as HAProxy's).
pub fn nft_ruleset(table: &str, listen: SocketAddrV4, backends: &[SocketAddrV4]) -> String {
    let map: Vec<String> = backends
        .iter()
        .enumerate()
        .map(|(i, b)| format!("{i} : {} . {}", b.ip(), b.port()))
        .collect();
    let daddrs: Vec<String> = backends.iter().map(|b| b.ip().to_string()).collect();
    format!(
        "table ip {table} {{\n\
         \x20 chain pre {{\n\
         \x20   type nat hook prerouting priority dstnat; policy accept;\n\
         \x20   ip daddr {} tcp dport {} dnat ip addr . port to numgen random mod {} map {{ {} }}\n\
         \x20 }}\n\
         \x20 chain post {{\n\
         \x20   type nat hook postrouting priority srcnat; policy accept;\n\
         \x20   ct status dnat ip daddr {{ {} }} snat ip to {}\n\
         \x20 }}\n\
         }}\n",
        listen.ip(),
        listen.port(),
        backends.len(),
        map.join(", "),
        daddrs.join(", "),
        listen.ip(),
    )
}

/// `name` on PATH or in the sbin directories a root shell has (HAProxy and
/// nft live in /usr/sbin, which a non-login PATH may lack).
pub fn find_program(name: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| {
            format!("`{name}` not found on PATH or in /usr/sbin; `cargo xtask setup` installs it")
        })
}

/// Runs `cmd` and fails with its stderr if it fails.
fn run_checked(mut cmd: Command, what: &str) -> anyhow::Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Starts HAProxy in the LB namespace, listening on `listen`, owned by
/// `run` (stopped when the lab is torn down), and waits until a request
/// through it from the client namespace succeeds. Returns its pid.
pub fn start_haproxy(
    run: &mut LabRun,
    listen: SocketAddrV4,
    backends: &[SocketAddrV4],
) -> anyhow::Result<u32> {
    let haproxy = find_program("haproxy")?;
    let cfg_path = run.work_dir().join("haproxy.cfg");
    fs::write(&cfg_path, haproxy_config(listen, backends))
        .with_context(|| format!("writing {}", cfg_path.display()))?;
    let mut check = Command::new(&haproxy);
    check.args(["-q", "-c", "-f"]).arg(&cfg_path);
    run_checked(check, &format!("`haproxy -c -f {}`", cfg_path.display()))?;
    let ns = run.lab().ns_lb();
    // -db: stay in the foreground, so that the lab's process guard owns it.
    let args = [
        "-db".to_string(),
        "-f".to_string(),
        cfg_path.display().to_string(),
    ];
    let pid = run.spawn_in("haproxy", &ns, &haproxy, &args)?;
    let client = run.lab().ns_client();
    // The lab removes its work directory on teardown: quote the log here.
    let log = run.work_dir().join("haproxy.log");
    wait_answering(&client, listen, "HAProxy")
        .with_context(|| format!("HAProxy's log {}:\n{}", log.display(), log_tail(&log)))?;
    Ok(pid)
}

/// An nftables DNAT table in the LB namespace, with the sysctls it needs;
/// dropping it deletes the table and puts the sysctls back, so that the
/// other cases run on the lab as built (no conntrack or NAT hooks).
pub struct NftDnat {
    ns: String,
    table: String,
    nft: PathBuf,
    installed: bool,
    saved: Vec<(&'static str, String)>,
    /// `10.99.0.3/32`, once added to eth0.
    address: Option<String>,
}

impl NftDnat {
    /// Installs the table (named after this process, so that two runs never
    /// share one) and waits until a request through it from `client_ns`
    /// succeeds.
    pub fn up(
        ns: &str,
        client_ns: &str,
        work_dir: &Path,
        listen: SocketAddrV4,
        backends: &[SocketAddrV4],
    ) -> anyhow::Result<Self> {
        let mut guard = Self {
            ns: ns.to_string(),
            table: format!("xlb_lab_bench_{}", std::process::id()),
            nft: find_program("nft")?,
            installed: false,
            saved: Vec::new(),
            address: None,
        };
        let address = format!("{}/32", listen.ip());
        ip_addr(ns, "add", &address)?;
        guard.address = Some(address);
        for (key, value) in DNAT_SYSCTLS {
            let old = sysctl(ns, key, None)?;
            guard.saved.push((key, old));
            sysctl(ns, key, Some(value))?;
        }
        let path = work_dir.join("dnat.nft");
        fs::write(&path, nft_ruleset(&guard.table, listen, backends))
            .with_context(|| format!("writing {}", path.display()))?;
        let mut cmd = command_in(ns, &guard.nft)?;
        cmd.arg("-f").arg(&path);
        // `nft -f` applies the file as one transaction: all of it or nothing.
        run_checked(cmd, &format!("`nft -f {}` in {ns}", path.display()))?;
        guard.installed = true;
        wait_answering(client_ns, listen, "nftables DNAT")?;
        Ok(guard)
    }
}

impl Drop for NftDnat {
    fn drop(&mut self) {
        if self.installed {
            let deleted = command_in(&self.ns, &self.nft)
                .map_err(anyhow::Error::from)
                .and_then(|mut cmd| {
                    cmd.args(["delete", "table", "ip", &self.table]);
                    run_checked(cmd, "`nft delete table`")
                });
            if let Err(e) = deleted {
                eprintln!(
                    "xlb-lab-bench: could not delete nft table {} in {}: {e:#}",
                    self.table, self.ns
                );
            }
        }
        if let Some(address) = self.address.take()
            && let Err(e) = ip_addr(&self.ns, "del", &address)
        {
            eprintln!("xlb-lab-bench: {e:#}");
        }
        for (key, old) in self.saved.drain(..).rev() {
            if let Err(e) = sysctl(&self.ns, key, Some(&old)) {
                eprintln!(
                    "xlb-lab-bench: could not restore {key} in {}: {e:#}",
                    self.ns
                );
            }
        }
    }
}

/// `ip -n NS addr add|del ADDRESS dev eth0`.
fn ip_addr(ns: &str, verb: &str, address: &str) -> anyhow::Result<()> {
    let mut cmd = Command::new("ip");
    cmd.args(["-n", ns, "addr", verb, address, "dev", HOST_IFNAME]);
    run_checked(
        cmd,
        &format!("`ip -n {ns} addr {verb} {address} dev {HOST_IFNAME}`"),
    )
}

/// Reads (`value` `None`) or writes a sysctl of namespace `ns` through
/// `/proc/sys`, which shows the network namespace of the thread that opens
/// it; returns the value read or written.
fn sysctl(ns: &str, key: &str, value: Option<&str>) -> anyhow::Result<String> {
    let path = Path::new("/proc/sys").join(key);
    let r = in_netns(ns, || match value {
        Some(v) => fs::write(&path, v).map(|()| v.to_string()),
        None => fs::read_to_string(&path).map(|s| s.trim().to_string()),
    })?;
    r.with_context(|| format!("sysctl {} in {ns}", path.display()))
}

/// Polls `GET /api` on `addr` from namespace `ns` until it answers 200.
fn wait_answering(ns: &str, addr: SocketAddrV4, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let last = match in_netns(ns, || http_get(addr.into()))? {
            Ok(status) if status.contains(" 200 ") => return Ok(()),
            Ok(status) => format!("answered {status:?}"),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            bail!(
                "{what} on {addr} did not answer GET /api from {ns} within {READY_TIMEOUT:?}: {last}"
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// One `GET /api` with `Connection: close`; returns the status line.
fn http_get(addr: SocketAddr) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, GET_TIMEOUT)?;
    s.set_read_timeout(Some(GET_TIMEOUT))?;
    s.set_write_timeout(Some(GET_TIMEOUT))?;
    s.write_all(b"GET /api HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    Ok(text.lines().next().unwrap_or_default().to_string())
}

/// `addr:port` of every backend's service port.
pub fn backend_addrs(lab: &xlb_lab::Lab, port: u16) -> Vec<SocketAddrV4> {
    (1..=lab.backend_count())
        .map(|i| SocketAddrV4::new(lab.backend_v4(i), port))
        .collect()
}

/// The LB host's address with `port`.
pub fn on_lb(lab: &xlb_lab::Lab, port: u16) -> SocketAddrV4 {
    let ip: Ipv4Addr = lab.lb_v4();
    SocketAddrV4::new(ip, port)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backends() -> Vec<SocketAddrV4> {
        (11..=13)
            .map(|h| SocketAddrV4::new(Ipv4Addr::new(10, 99, 0, h), 80))
            .collect()
    }

    #[test]
    fn haproxy_balances_every_backend_in_tcp_mode() {
        let cfg = haproxy_config("10.99.0.2:8081".parse().unwrap(), &backends());
        for want in [
            "mode tcp",
            "balance roundrobin",
            "bind 10.99.0.2:8081",
            "server b1 10.99.0.11:80",
            "server b3 10.99.0.13:80",
        ] {
            assert!(cfg.contains(want), "{want:?} missing from:\n{cfg}");
        }
    }

    #[test]
    fn nft_dnat_picks_one_of_three_and_snats() {
        let rules = nft_ruleset("t", "10.99.0.2:8082".parse().unwrap(), &backends());
        for want in [
            "table ip t {",
            "ip daddr 10.99.0.2 tcp dport 8082 dnat ip addr . port to numgen random mod 3 map \
             { 0 : 10.99.0.11 . 80, 1 : 10.99.0.12 . 80, 2 : 10.99.0.13 . 80 }",
            "ct status dnat ip daddr { 10.99.0.11, 10.99.0.12, 10.99.0.13 } snat ip to 10.99.0.2",
        ] {
            assert!(rules.contains(want), "{want:?} missing from:\n{rules}");
        }
    }
}
