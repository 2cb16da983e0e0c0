//! What the daemon keeps across restarts besides the pinned maps: which VIP
//! and backend got which id, and each backend's health and admin state.
//! The maps hold what the data plane needs; this file holds what only the
//! daemon needs to carry on where the previous run stopped. Both live in
//! tmpfs-like places (bpffs, /run), so both vanish together at reboot.

use std::{
    collections::BTreeMap,
    fs,
    io::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use lb_ctl::{EntryOrigin, GuardAction, ListKind};
use serde::{Deserialize, Serialize};

use crate::health::machine::HealthState;

/// Root of the pinned objects: `/sys/fs/bpf/xlb/<instance>/`.
pub const PIN_ROOT: &str = "/sys/fs/bpf/xlb";
/// Root of the state files: `/run/xlb/state/<instance>.json`.
pub const STATE_ROOT: &str = "/run/xlb/state";
/// Name of the pinned XDP link inside the pin directory.
pub const LINK_PIN: &str = "XLB_LINK";
/// Name of the pinned tc link of `xlb_hc` (data-path probes).
pub const HC_LINK_PIN: &str = "XLB_HC_LINK";

/// Where pins go: `/sys/fs/bpf/xlb/<instance>/`.
pub fn pin_dir(instance: &str) -> PathBuf {
    Path::new(PIN_ROOT).join(instance)
}

pub fn state_path(instance: &str) -> PathBuf {
    Path::new(STATE_ROOT).join(format!("{instance}.json"))
}

/// Root of the instance locks: `/run/xlb/state/<instance>.lock`, next to
/// the state files in a directory of mode 0700 (`/run/xlb` itself holds the
/// control socket, which a `socket_group` must be able to reach).
pub const LOCK_ROOT: &str = STATE_ROOT;

pub fn lock_path(instance: &str) -> PathBuf {
    Path::new(LOCK_ROOT).join(format!("{instance}.lock"))
}

/// The exclusive lock of one instance, held by the daemon that owns its
/// pinned maps for as long as it runs (the kernel drops it when the process
/// exits, `kill -9` included). Two daemons with the same `instance` but
/// different control sockets would otherwise both adopt the same maps and
/// flip each other's tables.
#[derive(Debug)]
pub struct InstanceLock {
    _file: fs::File,
}

impl InstanceLock {
    /// Takes the lock at `path` without waiting, and writes our pid into
    /// the file; fails naming the holder's pid if another process has it.
    /// The file is mode 0600 in a directory of mode 0700, and one that
    /// another user owns is refused: anyone who can open it can `flock` it
    /// and keep every `xlb run` from starting.
    pub fn take(path: &Path, instance: &str) -> anyhow::Result<Self> {
        let dir = path.parent().context("lock path has no parent")?;
        crate::host::private_dir(dir)?;
        let mut file = crate::host::open_private(path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                let holder = fs::read_to_string(path).unwrap_or_default();
                let holder = match holder.trim() {
                    "" => "another process".to_string(),
                    pid => format!("xlb run (pid {pid})"),
                };
                anyhow::bail!(
                    "instance {instance:?} is in use by {holder}: it holds {}; stop it first, \
                     or give this daemon another daemon.instance (two daemons on one \
                     instance would both write its pinned maps)",
                    path.display()
                );
            }
            Err(fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", path.display()));
            }
        }
        file.set_len(0)
            .and_then(|()| file.write_all(format!("{}\n", std::process::id()).as_bytes()))
            .with_context(|| format!("writing our pid to {}", path.display()))?;
        Ok(Self { _file: file })
    }
}

/// Health of a backend as remembered between runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SavedHealth {
    Unknown,
    Up,
    Down,
}

impl From<HealthState> for SavedHealth {
    fn from(h: HealthState) -> Self {
        match h {
            HealthState::Up => Self::Up,
            HealthState::Down => Self::Down,
            HealthState::Unknown => Self::Unknown,
        }
    }
}

impl From<SavedHealth> for HealthState {
    fn from(h: SavedHealth) -> Self {
        match h {
            SavedHealth::Up => Self::Up,
            SavedHealth::Down => Self::Down,
            SavedHealth::Unknown => Self::Unknown,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedBackend {
    pub vip: String,
    pub addr: SocketAddr,
    pub id: u32,
    pub health: SavedHealth,
    pub admin_drained: bool,
    /// When the drain's deadline passes (`xlb drain --deadline`), ms since
    /// the Unix epoch: wall-clock time, so it holds across a restart.
    /// Absent in files of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_deadline_unix_ms: Option<u64>,
    /// The deadline has passed and was applied (the backend is `down`), so a
    /// restart does not report it again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain_expired: bool,
}

/// A runtime or automatic deny/allow entry (`xlb block`, `auto_block`).
/// The pinned tries hold it too, but only the daemon knows its origin,
/// reason and expiry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedListEntry {
    pub list: ListKind,
    /// `None` = every VIP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip: Option<String>,
    /// `"192.0.2.7/32"`.
    pub prefix: String,
    pub action: GuardAction,
    pub origin: EntryOrigin,
    #[serde(default)]
    pub reason: String,
    pub created_unix_ms: u64,
    /// Wall-clock time, ms since the Unix epoch, so a TTL runs on while no
    /// daemon runs; `None` = never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_unix_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saved {
    /// `lb_common::LAYOUT_VERSION` of the maps this describes.
    pub layout_version: u32,
    /// VIP name → VIP id.
    pub vips: BTreeMap<String, u32>,
    pub backends: Vec<SavedBackend>,
    /// Runtime and automatic list entries. Absent in files of earlier
    /// versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lists: Vec<SavedListEntry>,
    /// Sysctls `xlb run` changed on the host (forwarding on its interface)
    /// and their values before, which `xlb detach` puts back. Absent in
    /// files of earlier versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forwarding: Vec<crate::host::SysctlChange>,
    /// The announce table and protocol (for `xlb detach`) and the
    /// operators' withdrawals. Absent in files of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announce: Option<super::announce::SavedAnnounce>,
    /// Weights set by `xlb weight`, each with the configured weight it was
    /// made against. Absent in files of earlier versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<super::weight::SavedWeight>,
    /// The next start numbers its events from here (see `event_seq`).
    /// Absent (0) in files of earlier versions: from 1.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub next_event_seq: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Saved {
    /// Reads the state file; `None` if there is none.
    ///
    /// # Errors
    /// The file cannot be read, or is not a state file (see
    /// [`Saved::load_or_set_aside`], which a start uses).
    pub fn load(path: &Path) -> anyhow::Result<Option<Self>> {
        match fs::read(path) {
            Ok(bytes) => {
                let s = serde_json::from_slice(&bytes)
                    .with_context(|| format!("{}: unreadable state file", path.display()))?;
                Ok(Some(s))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// [`Saved::load`] for a start: a file that cannot be read or parsed
    /// does not stop it (the daemon then adopts from the pinned maps
    /// alone, see `model::adopt_all`); it is moved aside as
    /// `<name>.bad-<UTC time>` for a post-mortem, with a warning, so the
    /// next save does not overwrite it.
    pub fn load_or_set_aside(path: &Path) -> Option<Self> {
        let error = match Self::load(path) {
            Ok(saved) => return saved,
            Err(e) => e,
        };
        let stamp = crate::cli::format_utc(crate::ctl::now_unix_ms())
            .replace(['-', ':'], "")
            .replace(' ', "T");
        let stamp = stamp.split('.').next().unwrap_or_default();
        let aside = path.with_extension(format!("json.bad-{stamp}Z"));
        let moved = match fs::rename(path, &aside) {
            Ok(()) => format!("moved it to {}", aside.display()),
            Err(e) => format!("could not move it aside ({e}); the next save replaces it"),
        };
        tracing::warn!(
            "STATE FILE UNREADABLE: {error:#}; {moved}. Starting from the pinned maps alone: \
             VIPs and backends are matched by VIP address and port and by backend address, \
             backends keep the state the data plane has for them; admin drains, drain \
             deadlines and runtime deny/allow entries recorded only in the file are lost"
        );
        None
    }

    /// Writes the state file atomically (temporary file, then rename), so a
    /// crash never leaves half a file.
    pub fn store(&self, path: &Path) -> anyhow::Result<()> {
        let dir = path.parent().context("state path has no parent")?;
        // Mode 0700 and 0600: the file names the sysctls `xlb detach` writes.
        crate::host::private_dir(dir)?;
        let tmp = path.with_extension("json.tmp");
        let mut f = crate::host::open_private(&tmp)?;
        f.set_len(0)?;
        f.write_all(&serde_json::to_vec_pretty(self)?)?;
        f.sync_all()?;
        fs::rename(&tmp, path).with_context(|| format!("renaming {} into place", tmp.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_of_an_instance_is_refused_with_the_holders_pid() {
        let dir = std::env::temp_dir().join(format!("xlb-lock-{}", std::process::id()));
        let path = dir.join("i.lock");
        let first = InstanceLock::take(&path, "i").unwrap();
        // flock locks belong to the open file description: a second open in
        // the same process conflicts as another process's would.
        let err = InstanceLock::take(&path, "i").unwrap_err().to_string();
        let pid = std::process::id();
        assert!(
            err.contains(&format!("instance \"i\" is in use by xlb run (pid {pid})")),
            "{err}"
        );
        assert!(err.contains(&path.display().to_string()), "{err}");
        drop(first);
        let again = InstanceLock::take(&path, "i").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), format!("{pid}\n"));
        drop(again);
        fs::remove_dir_all(dir).unwrap();
    }

    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt as _;
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn lock_and_state_files_are_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("xlb-private-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let lock = dir.join("state").join("i.lock");
        let state = dir.join("state").join("i.json");
        /// Makes what an earlier run left at the lock and state paths.
        type Before = fn(&Path, &Path);
        // (name, what was there before)
        let cases: [(&str, Before); 2] = [
            ("fresh", |_, _| {}),
            (
                "an earlier version's 0755 dir and 0644 files",
                |lock, state| {
                    let d = lock.parent().unwrap();
                    fs::create_dir_all(d).unwrap();
                    fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
                    for f in [lock, state] {
                        fs::write(f, "").unwrap();
                        fs::set_permissions(f, fs::Permissions::from_mode(0o644)).unwrap();
                    }
                },
            ),
        ];
        for (name, before) in cases {
            let _ = fs::remove_dir_all(&dir);
            before(&lock, &state);
            let held = InstanceLock::take(&lock, "i").unwrap();
            Saved::default().store(&state).unwrap();
            assert_eq!(mode(lock.parent().unwrap()), 0o700, "{name}: directory");
            assert_eq!(mode(&lock), 0o600, "{name}: lock file");
            assert_eq!(mode(&state), 0o600, "{name}: state file");
            drop(held);
        }
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_lock_another_user_owns_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: only root can give a file to another user");
            return;
        }
        let dir = std::env::temp_dir().join(format!("xlb-owner-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let nobody = Some(nix::unistd::Uid::from_raw(65534));
        let lock = dir.join("state").join("i.lock");
        // (name, which path another user owns)
        let cases = [
            ("the lock file", lock.clone()),
            ("its directory", dir.join("state")),
        ];
        for (name, theirs) in cases {
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(lock.parent().unwrap()).unwrap();
            fs::write(&lock, "").unwrap();
            nix::unistd::chown(&theirs, nobody, None).unwrap();
            let err = format!("{:#}", InstanceLock::take(&lock, "i").unwrap_err());
            let want = format!("{} is owned by uid 65534", theirs.display());
            assert!(err.starts_with(&want), "{name}: {err}");
            assert!(err.contains("rm "), "{name}: says what to do: {err}");
            // Nothing was written into the file of the other user.
            assert_eq!(fs::read_to_string(&lock).unwrap(), "", "{name}");
        }
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn round_trip_and_missing_file() {
        let dir = std::env::temp_dir().join(format!("xlb-persist-{}", std::process::id()));
        let path = dir.join("t.json");
        assert_eq!(Saved::load(&path).unwrap(), None);
        let s = Saved {
            layout_version: 1,
            vips: [("api".to_string(), 3)].into(),
            backends: vec![SavedBackend {
                vip: "api".into(),
                addr: "10.0.0.1:80".parse().unwrap(),
                id: 7,
                health: SavedHealth::Down,
                admin_drained: true,
                drain_deadline_unix_ms: None,
                drain_expired: false,
            }],
            lists: vec![SavedListEntry {
                list: ListKind::Deny,
                vip: None,
                prefix: "192.0.2.7/32".into(),
                action: GuardAction::Reset,
                origin: EntryOrigin::Runtime,
                reason: "seed 001".into(),
                created_unix_ms: 1_800_000_000_000,
                expires_unix_ms: Some(1_800_003_600_000),
            }],
            forwarding: vec![crate::host::SysctlChange {
                path: "/proc/sys/net/ipv4/conf/eth0/forwarding".into(),
                previous: "0".into(),
                netns: 4_026_531_840,
            }],
            announce: Some(crate::daemon::announce::SavedAnnounce {
                table: 100,
                protocol: 252,
                withdrawn: [("api".to_string(), "rack 4".to_string())].into(),
            }),
            weights: vec![super::super::weight::SavedWeight {
                vip: "api".into(),
                backend: "10.0.0.1:80".parse().unwrap(),
                weight: 5,
                configured: 1,
            }],
            next_event_seq: 100_042,
        };
        s.store(&path).unwrap();
        assert_eq!(Saved::load(&path).unwrap(), Some(s));
        fs::write(&path, b"{not json").unwrap();
        let err = Saved::load(&path).unwrap_err().to_string();
        assert!(err.contains("unreadable state file"), "{err}");
        // A start sets it aside and goes on.
        assert_eq!(Saved::load_or_set_aside(&path), None);
        assert!(!path.exists(), "moved aside");
        let aside: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("t.json.bad-"))
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
        let kept = fs::read(dir.join(&aside[0])).unwrap();
        assert_eq!(kept, b"{not json", "the bad file is kept as it was");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn drain_deadlines_round_trip_and_old_files_load() {
        let dir = std::env::temp_dir().join(format!("xlb-persist-dl-{}", std::process::id()));
        let path = dir.join("t.json");
        let backend = |deadline, expired| SavedBackend {
            vip: "api".into(),
            addr: "10.0.0.1:80".parse().unwrap(),
            id: 7,
            health: SavedHealth::Up,
            admin_drained: true,
            drain_deadline_unix_ms: deadline,
            drain_expired: expired,
        };
        let cases = [
            ("no deadline", backend(None, false)),
            ("pending deadline", backend(Some(1_800_000_300_000), false)),
            ("passed deadline", backend(Some(1_800_000_300_000), true)),
        ];
        for (name, b) in cases {
            let s = Saved {
                layout_version: 1,
                vips: [("api".to_string(), 3)].into(),
                backends: vec![b],
                lists: vec![],
                forwarding: vec![],
                announce: None,
                weights: vec![],
                next_event_seq: 0,
            };
            s.store(&path).unwrap();
            assert_eq!(Saved::load(&path).unwrap(), Some(s), "{name}");
        }
        // A file written before deadlines existed.
        fs::write(
            &path,
            br#"{"layout_version":1,"vips":{"api":3},"backends":[
                {"vip":"api","addr":"10.0.0.1:80","id":7,"health":"up","admin_drained":true}]}"#,
        )
        .unwrap();
        let old = Saved::load(&path).unwrap().unwrap();
        assert_eq!(old.backends, [backend(None, false)]);
        // And a file without a deadline is written as before.
        old.store(&path).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(!text.contains("drain_"), "{text}");
        fs::remove_dir_all(dir).unwrap();
    }
}
