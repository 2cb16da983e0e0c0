//! Katran's XDP balancer (`balancer.bpf.c`), built from its own source with
//! its default features and loaded beside xlb, so `xlb-katran-bench` can
//! run both on the same frames in the same run: the comparison issue 11's
//! per-packet targets stand for.
//!
//! Nothing of Katran is in this repository. The source comes from
//! `KATRAN_SRC` (a checkout) or is fetched at [`KATRAN_COMMIT`] into
//! `target/bench/katran/src`; clang builds it as Katran's `Makefile-bpf`
//! does (without `-DDEBUG`, which no code of the balancer reads; for the
//! compiler's own BPF CPU unless `KATRAN_MCPU` names one, see [`mcpu`]);
//! `bpftool` loads it and pins it under `/sys/fs/bpf/xlb-katran-<pid>`,
//! removed on drop.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail, ensure};
use aya::{
    maps::{Array, HashMap, Map, MapData},
    programs::Xdp,
};
use aya_obj::programs::XdpAttachType;
use lb_common::addr16;

use crate::packet::Flow;

/// The Katran commit the figures were measured at (2026-12-02).
pub const KATRAN_COMMIT: &str = "19f08fec82fb7b5fb14d935a80057bdc0897c8de";
const KATRAN_REPO: &str = "https://github.com/facebookincubator/katran";

/// Katran's ring size (`RING_SIZE` in `balancer_consts.h`).
const RING_SIZE: u32 = 65_537;

/// `target/bench/katran` of this workspace.
fn work_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench/katran")
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("running {shown}"))?;
    ensure!(
        out.status.success(),
        "{shown} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Katran's source tree: `KATRAN_SRC`, or a fetch of [`KATRAN_COMMIT`]
/// (once; later runs reuse it). Also says which commit it is, when known.
pub fn source() -> anyhow::Result<(PathBuf, String)> {
    let dir = match std::env::var_os("KATRAN_SRC") {
        Some(d) => PathBuf::from(d),
        None => {
            let dir = work_dir().join("src");
            if !dir.join("katran/lib/bpf/balancer.bpf.c").exists() {
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir)?;
                let git = |args: &[&str]| run(Command::new("git").arg("-C").arg(&dir).args(args));
                git(&["init", "-q"])?;
                git(&["fetch", "-q", "--depth", "1", KATRAN_REPO, KATRAN_COMMIT]).with_context(
                    || {
                        format!(
                            "fetching Katran {KATRAN_COMMIT} from {KATRAN_REPO} (or set KATRAN_SRC \
                             to a checkout)"
                        )
                    },
                )?;
                git(&["checkout", "-q", "FETCH_HEAD"])?;
            }
            dir
        }
    };
    ensure!(
        dir.join("katran/lib/bpf/balancer.bpf.c").exists(),
        "{} holds no katran/lib/bpf/balancer.bpf.c: KATRAN_SRC must be a Katran checkout",
        dir.display()
    );
    let commit = Command::new("git")
        .arg("-C")
        .arg(&dir)
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(
            || "commit unknown (not a git checkout)".to_string(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_string(),
        );
    Ok((dir, commit))
}

/// The BPF CPU Katran is built for: `KATRAN_MCPU` (`v1` to `v4`), or
/// `None` for the compiler's default, as Katran's `Makefile-bpf` builds
/// (v1 for the clang 14 of this project's machine). xlb's object is v3
/// (`lb-user/build.rs`): `KATRAN_MCPU=v3` holds both to the same
/// instruction set.
pub fn mcpu() -> anyhow::Result<Option<String>> {
    mcpu_of(std::env::var_os("KATRAN_MCPU").map(|c| c.to_string_lossy().into_owned()))
}

/// [`mcpu`] for the value `KATRAN_MCPU` has, if any.
fn mcpu_of(value: Option<String>) -> anyhow::Result<Option<String>> {
    let Some(cpu) = value else {
        return Ok(None);
    };
    ensure!(
        ["v1", "v2", "v3", "v4"].contains(&cpu.as_str()),
        "KATRAN_MCPU={cpu:?}: use v1, v2, v3 or v4 (or unset it for clang's default)"
    );
    Ok(Some(cpu))
}

/// `balancer.bpf.c` built with clang as Katran's `Makefile-bpf` does, for
/// BPF CPU `cpu` ([`mcpu`]; `None`: clang's default).
pub fn build(src: &Path, cpu: Option<&str>) -> anyhow::Result<PathBuf> {
    let out_dir = work_dir();
    // The BPF target is neither 32- nor 64-bit to glibc's headers, which
    // then ask for the 32-bit stubs; an empty one satisfies them.
    let stubs = out_dir.join("include");
    std::fs::create_dir_all(stubs.join("gnu"))?;
    std::fs::write(stubs.join("gnu/stubs-32.h"), "")?;
    let multiarch = Command::new("gcc").arg("-print-multiarch").output()?;
    let multiarch = String::from_utf8_lossy(&multiarch.stdout)
        .trim()
        .to_string();
    let obj = out_dir.join("balancer.bpf.o");
    run(Command::new("clang")
        .arg(format!("-I{}", src.display()))
        .arg(format!("-I{}", stubs.display()))
        .arg(format!("-I/usr/include/{multiarch}"))
        .args([
            "-D__KERNEL__",
            "-Wno-unused-value",
            "-Wno-pointer-sign",
            "-Wno-compare-distinct-pointer-types",
            "-O2",
            "-g",
            "-target",
            "bpf",
            "-c",
        ])
        .args(cpu.map(|c| format!("-mcpu={c}")))
        .arg(src.join("katran/lib/bpf/balancer.bpf.c"))
        .arg("-o")
        .arg(&obj))
    .context("building Katran's balancer (needs clang: `cargo xtask setup`)")?;
    Ok(obj)
}

/// Katran's balancer loaded and pinned, with one VIP (two reals, the ring
/// filled) and one established flow in its LRU.
pub struct Katran {
    pin: PathBuf,
    pub prog: Xdp,
}

impl Drop for Katran {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.pin);
    }
}

/// The reals behind Katran's VIP (ring slots alternate between them) and
/// the router MAC its encapsulated packets go to: any will do, Katran
/// looks no route up.
const REALS: [[u8; 4]; 2] = [[10, 0, 0, 2], [10, 0, 0, 3]];
const ROUTER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x09];

impl Katran {
    /// Loads `obj` (the verifier runs here) and configures it: `flow`'s
    /// destination as a VIP of its protocol with [`REALS`], and `flow`
    /// itself in its fallback LRU (Katran's own tests run without per-CPU
    /// LRUs, as here), on the first real.
    pub fn load(obj: &Path, flow: &Flow) -> anyhow::Result<Self> {
        // IPv6 VIPs and reals take Katran flags this setup does not write.
        ensure!(
            flow.dst.is_ipv4(),
            "Katran is set up here for an IPv4 VIP, not {}",
            flow.dst
        );
        let pin = PathBuf::from(format!("/sys/fs/bpf/xlb-katran-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&pin);
        std::fs::create_dir_all(&pin).with_context(|| format!("creating {}", pin.display()))?;
        let this = Self {
            prog: {
                let loaded = run(Command::new("bpftool")
                    .args(["prog", "load"])
                    .arg(obj)
                    .arg(pin.join("prog"))
                    .args(["type", "xdp", "pinmaps"])
                    .arg(pin.join("maps")))
                .context("loading Katran's balancer with bpftool (`cargo xtask setup`)");
                if let Err(e) = loaded {
                    let _ = std::fs::remove_dir_all(&pin);
                    return Err(e);
                }
                match Xdp::from_pin(pin.join("prog"), XdpAttachType::Interface) {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = std::fs::remove_dir_all(&pin);
                        bail!("opening Katran's pinned program: {e}");
                    }
                }
            },
            pin,
        };
        let map = |name: &str| -> anyhow::Result<MapData> {
            MapData::from_pin(this.pin.join("maps").join(name))
                .with_context(|| format!("Katran's map {name}"))
        };
        // struct vip_definition { addr[16]; u16 port (network order); u8
        // proto; } → struct vip_meta { u32 flags; u32 vip_num; }.
        let (vip, client) = (addr16(flow.dst), addr16(flow.src));
        let mut key = [0u8; 20];
        key[..16].copy_from_slice(&vip);
        key[16..18].copy_from_slice(&flow.dport.to_be_bytes());
        key[18] = flow.proto;
        let mut vips = HashMap::<_, [u8; 20], [u8; 8]>::try_from(Map::HashMap(map("vip_map")?))?;
        vips.insert(key, [0; 8], 0)?;
        // struct real_definition { addr[16]; u8 flags; }, reals 1 and 2.
        let mut r = Array::<_, [u8; 20]>::try_from(Map::Array(map("reals")?))?;
        for (i, a) in REALS.iter().enumerate() {
            let mut v = [0u8; 20];
            v[..4].copy_from_slice(a);
            r.set(i as u32 + 1, v, 0)?;
        }
        let mut ring = Array::<_, u32>::try_from(Map::Array(map("ch_rings")?))?;
        for i in 0..RING_SIZE {
            ring.set(i, 1 + i % 2, 0)?;
        }
        // ctl_array[0]: the default router's MAC, the encapsulated
        // packet's destination.
        let mut ctl = Array::<_, [u8; 8]>::try_from(Map::Array(map("ctl_array")?))?;
        let mut m = [0u8; 8];
        m[..6].copy_from_slice(&ROUTER_MAC);
        ctl.set(0, m, 0)?;
        // struct flow_key { src[16]; dst[16]; u16 ports[2]; u8 proto; }
        // → struct real_pos_lru { u32 pos; u64 atime; }.
        let mut key = [0u8; 40];
        key[..16].copy_from_slice(&client);
        key[16..32].copy_from_slice(&vip);
        key[32..34].copy_from_slice(&flow.sport.to_be_bytes());
        key[34..36].copy_from_slice(&flow.dport.to_be_bytes());
        key[36] = flow.proto;
        let mut pos = [0u8; 16];
        pos[..4].copy_from_slice(&1u32.to_ne_bytes());
        let mut lru =
            HashMap::<_, [u8; 40], [u8; 16]>::try_from(Map::LruHashMap(map("fallback_cache")?))?;
        lru.insert(key, pos, 0)?;
        Ok(this)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn katran_mcpu_is_a_bpf_cpu_or_the_default() {
        assert_eq!(mcpu_of(None).unwrap(), None);
        assert_eq!(mcpu_of(Some("v3".into())).unwrap().as_deref(), Some("v3"));
        for bad in ["v9", "", "generic", "-mcpu=v3"] {
            let e = mcpu_of(Some(bad.into())).unwrap_err().to_string();
            assert!(
                e.contains("KATRAN_MCPU") && e.contains("v1, v2, v3 or v4"),
                "{bad}: {e}"
            );
        }
    }
}
