//! Network namespaces that tests create and always remove.

use std::{
    fs::File,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{Context as _, bail};

/// A named network namespace (`ip netns add`), deleted on drop.
pub struct NetNs {
    name: String,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

impl NetNs {
    /// Creates `xlbt-<tag>-<pid>-<n>`: unique per process and call, so
    /// parallel tests never share one.
    pub fn new(tag: &str) -> anyhow::Result<Self> {
        let name = format!(
            "xlbt-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        run(&["ip", "netns", "add", &name])?;
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n <ns> ARGS`.
    pub fn ip(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut full = vec!["ip", "-n", &self.name];
        full.extend_from_slice(args);
        run(&full)
    }

    /// Runs a command inside the namespace (`ip netns exec`).
    pub fn exec(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        run(&full)
    }

    /// Moves the calling thread into the namespace. Only this thread moves;
    /// use a dedicated thread.
    pub fn enter(&self) -> anyhow::Result<()> {
        let f = File::open(format!("/var/run/netns/{}", self.name))
            .with_context(|| format!("opening netns {}", self.name))?;
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
            .with_context(|| format!("setns into {}", self.name))?;
        Ok(())
    }

    /// The ifindex of `dev` inside the namespace.
    pub fn ifindex(&self, dev: &str) -> anyhow::Result<u32> {
        let out = self.exec(&["cat", &format!("/sys/class/net/{dev}/ifindex")])?;
        out.trim()
            .parse()
            .with_context(|| format!("ifindex of {dev}: {out:?}"))
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting the namespace destroys its veths and detaches their XDP
        // programs with them.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Runs a command, failing with its stderr.
pub fn run(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("running {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
