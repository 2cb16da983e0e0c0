//! The lab as `xlb-tput-bench` uses it: the LB namespace as a router (for
//! the kernel-forwarding and nftables cases) that also runs xlb, the
//! downstream on its own CPU, and what is counted around each run.
//!
//! ```text
//!  CPU 0: bench thread in {p}-lb ── test_run(xlb_bench_gen) ──▶ eth0 (TX / stack)
//!  CPU 1: {p}-br: v-lb (xlb_pass, threaded NAPI) ──▶ br0 ──▶ v-b1..3 ──▶ backends
//! ```

use std::{
    collections::HashSet,
    io::Write as _,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};
use xlb_lab::{
    Lab,
    topology::{VIP_NET_V4, VIP_NET_V4_PREFIX, backend_mac, backend_v4, client_mac, format_mac},
};

use crate::netns::run;

/// Makes the LB namespace a router towards the backends, with every
/// neighbour and bridge port fixed so no frame waits for ARP or floods.
pub(crate) fn prepare(lab: &Lab) -> anyhow::Result<()> {
    let (lb, br, lb_if) = (lab.ns_lb(), lab.ns_bridge(), lab.lb_ifname());
    run(&[
        "ip",
        "netns",
        "exec",
        &lb,
        "sysctl",
        "-q",
        "-w",
        // Kernel forwarding is case 7 and 8; bpf_fib_lookup (xlb) also
        // needs forwarding on for the ingress device.
        "net.ipv4.ip_forward=1",
        // Out the interface it came in on: no redirects to the sender.
        "net.ipv4.conf.all.send_redirects=0",
        &format!("net.ipv4.conf.{lb_if}.send_redirects=0"),
        // The generated sources are not routed back via eth0.
        "net.ipv4.conf.all.rp_filter=0",
        &format!("net.ipv4.conf.{lb_if}.rp_filter=0"),
    ])?;
    // The lab routes the VIPs to a gateway nobody owns (for health probes);
    // without that route, a frame to a VIP that nftables did not translate
    // is dropped here instead of flooding the bridge, so backends receiving
    // anything in the DNAT case proves the translation.
    let vips = format!("{VIP_NET_V4}/{VIP_NET_V4_PREFIX}");
    run(&["ip", "-n", &lb, "route", "del", &vips])?;
    for i in 1..=lab.backend_count() {
        let mac = format_mac(backend_mac(i));
        let addr = backend_v4(i).to_string();
        run(&[
            "ip",
            "-n",
            &lb,
            "neigh",
            "replace",
            &addr,
            "lladdr",
            &mac,
            "dev",
            lb_if,
            "nud",
            "permanent",
        ])?;
        let port = lab.backend_peer_ifname(i);
        run(&[
            "ip", "netns", "exec", &br, "bridge", "fdb", "replace", &mac, "dev", &port, "master",
            "static",
        ])?;
    }
    let client = format_mac(client_mac());
    run(&[
        "ip", "netns", "exec", &br, "bridge", "fdb", "replace", &client, "dev", "v-cl", "master",
        "static",
    ])?;
    Ok(())
}

/// Pids of the kernel's threaded-NAPI threads (`napi/<dev>-<id>`).
fn napi_threads() -> HashSet<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return HashSet::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("napi/"))
        })
        .collect()
}

/// Moves `dev`'s NAPI polling (in namespace `ns`; it needs an XDP program
/// attached first, which gives a veth its NAPI) into a kernel thread of its
/// own and pins that thread to `cpu`. Returns the thread's pid.
pub(crate) fn threaded_napi(ns: &str, dev: &str, cpu: usize) -> anyhow::Result<u32> {
    let before = napi_threads();
    run(&[
        "ip",
        "netns",
        "exec",
        ns,
        "sh",
        "-c",
        &format!("echo 1 > /sys/class/net/{dev}/threaded"),
    ])?;
    let new: Vec<u32> = napi_threads().difference(&before).copied().collect();
    let [pid] = new[..] else {
        bail!(
            "expected one new NAPI thread for {dev} in {ns}, found {new:?}: \
             is an XDP program attached to it?"
        );
    };
    crate::bench::set_affinity(pid, cpu)
        .with_context(|| format!("pinning NAPI thread {pid} to CPU {cpu}"))?;
    Ok(pid)
}

/// CPU time thread `pid` has used (user + system), in clock ticks' precision.
pub(crate) fn task_cpu(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised comm: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    anyhow::ensure!(f.len() == 2, "/proc/{pid}/stat: {stat:?}");
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(Duration::from_secs_f64((f[0] + f[1]) as f64 / hz))
}

/// Frames the bridge has sent to the backends so far (tx of their ports).
pub(crate) fn delivered(lab: &Lab) -> anyhow::Result<u64> {
    let br = lab.ns_bridge();
    let mut args = vec![
        "ip".to_string(),
        "netns".into(),
        "exec".into(),
        br,
        "cat".into(),
    ];
    for i in 1..=lab.backend_count() {
        args.push(format!(
            "/sys/class/net/{}/statistics/tx_packets",
            lab.backend_peer_ifname(i)
        ));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(&args)?;
    out.split_whitespace()
        .map(|n| n.parse::<u64>().context("tx_packets"))
        .sum()
}

/// The nftables table of case 8, in the LB namespace; deleted on drop.
pub(crate) struct NatTable {
    ns: String,
}

/// The table's name (in family `ip`).
const NFT_TABLE: &str = "xlb_tput";

impl NatTable {
    /// DNAT of `vip:port` (TCP) to one of `backends`, `numgen random`.
    pub(crate) fn add(ns: &str, vip: &str, port: u16, backends: &[String]) -> anyhow::Result<Self> {
        let map: Vec<String> = backends
            .iter()
            .enumerate()
            .map(|(i, b)| format!("{i} : {b}"))
            .collect();
        let script = format!(
            "table ip {NFT_TABLE} {{\n\
             \tchain prerouting {{\n\
             \t\ttype nat hook prerouting priority dstnat; policy accept;\n\
             \t\tip daddr {vip} tcp dport {port} dnat to numgen random mod {} map {{ {} }}\n\
             \t}}\n\
             }}\n",
            backends.len(),
            map.join(", ")
        );
        nft(ns, &["-f", "-"], Some(&script))?;
        Ok(Self { ns: ns.to_string() })
    }
}

impl Drop for NatTable {
    fn drop(&mut self) {
        if let Err(e) = nft(&self.ns, &["delete", "table", "ip", NFT_TABLE], None) {
            eprintln!("xlb-tput-bench: {e:#}");
        }
    }
}

/// Runs `nft ARGS` in `ns`, `stdin` fed to it.
pub(crate) fn nft(ns: &str, args: &[&str], stdin: Option<&str>) -> anyhow::Result<()> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft (Debian package `nftables`; `cargo xtask setup` installs it)")?;
    let mut input = child.stdin.take().context("nft stdin")?;
    if let Some(s) = stdin {
        input.write_all(s.as_bytes())?;
    }
    drop(input);
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "nft {} in {ns} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}
