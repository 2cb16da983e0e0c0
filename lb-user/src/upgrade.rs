//! `xlb check-upgrade`: before restarting onto this binary, whether the
//! restart keeps every established flow, and whether the host is ready for
//! the configuration.
//!
//! A separate command rather than `check-config --host`: check-config
//! reads only the file and runs anywhere (CI, a laptop, a package build),
//! while this one reads the pinned maps of the instance and the host's
//! interfaces and groups, needs root, and answers a different question.
//!
//! A restart adopts the pinned maps only when they have this binary's
//! layout version (`lb_common::LAYOUT_VERSION`) and were made for the same
//! `max_table_size` and the sizes in `daemon::pin_sizes` (`conntrack_size`,
//! `nat_size`: the list `xlb run` checks); otherwise `xlb run` refuses to
//! start until `xlb detach`, which drops every established flow.

use std::{fmt::Write as _, path::Path};

use anyhow::Context as _;
use aya::maps::{Array, Map, MapData};
use lb_common::{Globals, LAYOUT_VERSION};

use crate::{
    config::Config,
    daemon::{persist, pin_sizes},
};

/// What the pin directory of the instance holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pinned {
    pub layout_version: u32,
    /// Slots per ring half (`max_table_size` of the run that made them).
    pub ring_stride: u32,
    /// The entries of each map whose size the configuration sets
    /// ([`pin_sizes::SIZED`]), those pinned.
    pub sizes: Vec<(&'static pin_sizes::SizedMap, u32)>,
    /// Whether the XDP link is pinned (the data plane is attached).
    pub attached: bool,
}

/// What the host says, gathered by [`gather`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// `None`: nothing pinned for the instance.
    pub pinned: Option<Pinned>,
    pub interface_exists: bool,
    /// `None`: no `socket_group` in the configuration.
    pub group_exists: Option<bool>,
    /// Whether /sys/fs/bpf is a bpffs mount.
    pub bpffs: bool,
}

/// The verdict: every line to print, and whether all is well.
#[derive(Debug, PartialEq, Eq)]
pub struct Verdict {
    pub text: String,
    pub ok: bool,
}

/// Reads the facts for `cfg` from this host (root needed for the pins).
pub fn gather(cfg: &Config) -> anyhow::Result<Facts> {
    let d = &cfg.daemon;
    let pin_dir = persist::pin_dir(&d.pinned.instance);
    Ok(Facts {
        pinned: read_pins(&pin_dir)?,
        interface_exists: nix::net::if_::if_nametoindex(d.pinned.interface.as_str()).is_ok(),
        group_exists: d
            .restart
            .socket_group
            .as_deref()
            .map(|g| matches!(nix::unistd::Group::from_name(g), Ok(Some(_)))),
        bpffs: crate::host::is_bpffs(Path::new("/sys/fs/bpf")),
    })
}

/// The globals, conntrack size and link pinned in `dir`, if any.
fn read_pins(dir: &Path) -> anyhow::Result<Option<Pinned>> {
    let path = dir.join(lb_common::MAP_GLOBALS);
    if !path.exists() {
        return Ok(None);
    }
    let open = |p: &Path| {
        MapData::from_pin(p).with_context(|| {
            format!(
                "opening {} (run as root: pinned maps need CAP_SYS_ADMIN)",
                p.display()
            )
        })
    };
    let globals: Array<MapData, Globals> = Array::try_from(Map::Array(open(&path)?))
        .with_context(|| format!("{} is not the globals array", path.display()))?;
    let g = globals
        .get(&0, 0)
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(Some(Pinned {
        layout_version: g.layout_version,
        ring_stride: g.ring_stride,
        sizes: pin_sizes::read(dir)?,
        attached: dir.join(persist::LINK_PIN).exists(),
    }))
}

/// The verdict on `facts` for `cfg`: first the flows, then the host.
pub fn verdict(cfg: &Config, facts: &Facts) -> Verdict {
    let mut text = String::new();
    let flows_ok = flows(cfg, facts.pinned.as_ref(), &mut text);
    let host_ok = host(cfg, facts, &mut text);
    let ok = flows_ok && host_ok;
    text += if ok {
        "ready to upgrade\n"
    } else {
        "not ready to upgrade\n"
    };
    Verdict { text, ok }
}

/// What a restart onto this binary does to the established flows.
fn flows(cfg: &Config, pinned: Option<&Pinned>, out: &mut String) -> bool {
    let d = &cfg.daemon.pinned;
    let instance = &d.instance;
    let dir = persist::pin_dir(instance);
    let Some(p) = pinned else {
        let _ = writeln!(
            out,
            "nothing pinned for instance {instance:?} ({}): the first start attaches afresh, \
             no flows to keep",
            dir.display()
        );
        return true;
    };
    if p.layout_version == 0 && !p.attached {
        let _ = writeln!(
            out,
            "the maps in {} come from a start that never finished (layout version 0, \
             nothing attached): the next start replaces them, no flows to keep",
            dir.display()
        );
        return true;
    }
    let detach = format!(
        "`xlb detach --instance {instance}` and a fresh start drop every established flow; \
         move the traffic away first (withdraw the VIPs, drain the node)"
    );
    if p.layout_version != LAYOUT_VERSION {
        let _ = writeln!(
            out,
            "flows lost: the pinned maps in {} have layout version {}, this binary has {}: \
             it refuses to adopt them. Keep the running build, or: {detach}",
            dir.display(),
            p.layout_version,
            LAYOUT_VERSION
        );
        return false;
    }
    let mut ok = true;
    if p.ring_stride != d.max_table_size {
        let _ = writeln!(
            out,
            "flows lost: the pinned maps were made for max_table_size {}, the configuration \
             says {}: restore the old value, or: {detach}",
            p.ring_stride, d.max_table_size
        );
        ok = false;
    }
    for m in pin_sizes::mismatches(&p.sizes, d) {
        let _ = writeln!(
            out,
            "flows lost: the {}: restore the old value, or: {detach}",
            m.text(&dir)
        );
        ok = false;
    }
    if ok {
        let _ = writeln!(
            out,
            "a restart keeps every flow: the pinned maps in {} have this binary's layout \
             version {LAYOUT_VERSION}{}",
            dir.display(),
            if p.attached {
                " and the data plane stays attached while it restarts"
            } else {
                ""
            }
        );
    }
    ok
}

/// Whether the host has what the configuration names.
fn host(cfg: &Config, facts: &Facts, out: &mut String) -> bool {
    let d = &cfg.daemon;
    let mut ok = true;
    if !facts.interface_exists {
        let _ = writeln!(
            out,
            "daemon.interface {:?} does not exist on this host (`ip link` lists the \
             interfaces): fix the name or create the interface first",
            d.pinned.interface
        );
        ok = false;
    }
    if facts.group_exists == Some(false) {
        let _ = writeln!(
            out,
            "daemon.socket_group {:?} is not a group on this host: create it (`groupadd \
             --system {0}`) or remove socket_group",
            d.restart.socket_group.as_deref().unwrap_or_default()
        );
        ok = false;
    }
    if !facts.bpffs {
        // `xlb run` mounts it itself; the packaged unit asserts it instead
        // (a mount made inside the unit would vanish with it).
        let _ = writeln!(
            out,
            "note: /sys/fs/bpf is not mounted: `xlb run` mounts it, but xlb.service \
             requires it (mount -t bpf bpf /sys/fs/bpf, or systemd's sys-fs-bpf.mount)"
        );
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOML: &str = r#"
[daemon]
interface = "eth0"
instance = "edge"
socket_group = "xlb"
conntrack_size = 4096
max_table_size = 251

[[vip]]
name = "api"
address = "10.100.0.1"
port = 80
table_size = 251
[[vip.backend]]
address = "10.0.0.11"
"#;

    fn facts() -> Facts {
        Facts {
            pinned: Some(Pinned {
                layout_version: LAYOUT_VERSION,
                ring_stride: 251,
                sizes: vec![
                    (&pin_sizes::SIZED[0], 4096),
                    (&pin_sizes::SIZED[1], 262_144),
                ],
                attached: true,
            }),
            interface_exists: true,
            group_exists: Some(true),
            bpffs: true,
        }
    }

    #[test]
    fn verdicts() {
        let cfg = Config::from_str(TOML, "xlb.toml").unwrap();
        let with = |f: fn(&mut Facts)| {
            let mut facts = facts();
            f(&mut facts);
            facts
        };
        let old = LAYOUT_VERSION - 1;
        let cases: Vec<(&str, Facts, bool, Vec<String>)> = vec![
            ("same layout", facts(), true, vec![
                "a restart keeps every flow: the pinned maps in /sys/fs/bpf/xlb/edge have this \
                 binary's layout version".into(),
                "ready to upgrade".into(),
            ]),
            ("nothing pinned", with(|f| f.pinned = None), true, vec![
                "nothing pinned for instance \"edge\"".into(),
            ]),
            ("unfinished start", with(|f| {
                let p = f.pinned.as_mut().unwrap();
                p.layout_version = 0;
                p.attached = false;
            }), true, vec!["never finished".into()]),
            ("other layout", with(|f| f.pinned.as_mut().unwrap().layout_version = LAYOUT_VERSION - 1), false, vec![
                format!("flows lost: the pinned maps in /sys/fs/bpf/xlb/edge have layout version {old}, this binary has {LAYOUT_VERSION}"),
                "`xlb detach --instance edge`".into(),
                "not ready to upgrade".into(),
            ]),
            ("table size changed", with(|f| f.pinned.as_mut().unwrap().ring_stride = 65537), false, vec![
                "made for max_table_size 65537, the configuration says 251".into(),
            ]),
            ("conntrack size changed", with(|f| f.pinned.as_mut().unwrap().sizes[0].1 = 8192), false, vec![
                "holds 8192 entries, the configuration says conntrack_size = 4096".into(),
            ]),
            // Issue 39: `xlb run` refused it, check-upgrade said "ready".
            ("NAT size changed", with(|f| f.pinned.as_mut().unwrap().sizes[1].1 = 65_536), false, vec![
                "flows lost: the pinned NAT flow map in /sys/fs/bpf/xlb/edge holds 65536 entries, \
                 the configuration says nat_size = 262144".into(),
            ]),
            ("no interface", with(|f| f.interface_exists = false), false, vec![
                "a restart keeps every flow".into(),
                "daemon.interface \"eth0\" does not exist on this host".into(),
            ]),
            ("no group", with(|f| f.group_exists = Some(false)), false, vec![
                "daemon.socket_group \"xlb\" is not a group on this host: create it (`groupadd --system xlb`)".into(),
            ]),
            ("no bpffs is a note", with(|f| f.bpffs = false), true, vec![
                "note: /sys/fs/bpf is not mounted".into(),
            ]),
        ];
        for (name, facts, ok, wants) in cases {
            let v = verdict(&cfg, &facts);
            assert_eq!(v.ok, ok, "{name}:\n{}", v.text);
            for want in wants {
                assert!(v.text.contains(&want), "{name}: no {want:?} in\n{}", v.text);
            }
        }
    }
}
