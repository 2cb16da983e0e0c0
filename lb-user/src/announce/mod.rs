//! Announcing VIPs to the routers (issue 26): xlb decides *when* each VIP
//! address is announced (`state`), and hands the announced addresses to
//! the BGP speaker as host routes in a kernel table of its own (`routes`),
//! which BIRD's `kernel` protocol learns and exports to its peers.
//!
//! The writer runs as a task of its own ([`spawn`]): the main loop sends it
//! the wanted set over a `watch` channel the moment a decision changes (no
//! timer between a health transition and the route change), and reads back
//! what the table holds and whether the speaker answers.
//!
//! A start adopts the routes it finds: the wanted set is `None` ("leave the
//! table alone") until the first probe round is done, so a restart or a
//! `kill -9` never withdraws and re-announces while the data plane keeps
//! forwarding.

pub mod routes;
pub mod state;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt as _;
use tokio::sync::watch;
use tracing::{error, info};

use crate::config::Config;

pub use self::routes::{Table, Writer};
pub use self::state::{AnnounceState, Reason, VipFacts, decide, wanted_addresses};

/// How often the speaker's control socket is checked.
const SPEAKER_PERIOD: Duration = Duration::from_secs(2);
/// How long the speaker has to greet a connection.
const SPEAKER_TIMEOUT: Duration = Duration::from_secs(1);
/// How soon a failed reconcile is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// Every VIP whose address is an address of this host, one error line
/// each: an address the host holds is reachable (ARP/ND, BIRD's `direct`
/// protocol) whatever xlb announces, so withdrawing it would not move
/// traffic away. `local` is (interface, address).
pub fn local_vip_errors(cfg: &Config, local: &[(String, IpAddr)]) -> Vec<String> {
    if cfg.announce.is_none() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for v in &cfg.vips {
        if let Some((iface, _)) = local.iter().find(|(_, a)| *a == v.addr) {
            let line = format!(
                "vip {:?}: address {} is an address of interface {iface} on this host; an \
                 announced VIP must not be one (the host would attract its traffic whatever \
                 xlb announces): remove it from {iface} (ip addr del {}/{} dev {iface}) or \
                 remove [announce]",
                v.name,
                v.addr,
                v.addr,
                if v.addr.is_ipv4() { 32 } else { 128 }
            );
            if !out.contains(&line) {
                out.push(line);
            }
        }
    }
    out
}

/// [`local_vip_errors`] on this host, each prefixed with `origin`.
///
/// # Errors
/// One line per VIP on a local address, or why the addresses could not be
/// read.
pub fn check_local_addresses(cfg: &Config, origin: &str) -> Result<(), Vec<String>> {
    crate::host::check_addresses(origin, |local| local_vip_errors(cfg, local))
}

/// Whether BIRD answers on its control socket: it greets every connection
/// with `0001 BIRD <version> ready.`.
///
/// # Errors
/// Why not, for the operator.
pub async fn speaker_alive(path: &Path) -> Result<String, String> {
    let check = async {
        let mut s = tokio::net::UnixStream::connect(path)
            .await
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let mut buf = [0u8; 128];
        let n = s
            .read(&mut buf)
            .await
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let greeting = String::from_utf8_lossy(&buf[..n]);
        match greeting.lines().next() {
            Some(l) if l.starts_with("0001 ") => Ok(l[5..].trim().to_string()),
            _ => Err(format!(
                "{}: answered {:?}, not a BIRD greeting",
                path.display(),
                greeting.trim()
            )),
        }
    };
    tokio::time::timeout(SPEAKER_TIMEOUT, check)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "{}: no greeting within {SPEAKER_TIMEOUT:?}",
                path.display()
            ))
        })
}

/// What the writer task reports back to the main loop.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// xlb's routes in the table after the last list or reconcile.
    pub routes: BTreeSet<IpAddr>,
    /// The last reconcile's error; `None` after one that worked.
    pub error: Option<String>,
    /// The speaker check: `Ok(greeting)` or `Err(why)`; `None` = not
    /// configured or not checked yet.
    pub speaker: Option<Result<String, String>>,
    /// Reconciles done (tests and status wait on it).
    pub reconciles: u64,
}

/// The main loop's end of the writer task.
#[derive(Debug)]
pub struct Announcer {
    want: watch::Sender<Option<BTreeSet<IpAddr>>>,
    pub outcome: Arc<Mutex<Outcome>>,
    pub table: Table,
}

impl Announcer {
    /// Sends the wanted set (`None`: adopt, leave the table alone); the
    /// task acts on it at once. A set equal to the last one wakes nobody.
    pub fn want(&self, set: Option<BTreeSet<IpAddr>>) {
        self.want.send_if_modified(|cur| {
            if *cur == set {
                false
            } else {
                *cur = set;
                true
            }
        });
    }

    pub fn outcome(&self) -> Outcome {
        self.outcome.lock().map(|o| o.clone()).unwrap_or_default()
    }
}

/// Starts the writer task on the current runtime.
///
/// # Errors
/// The netlink socket cannot be opened.
pub fn spawn(table: Table, speaker: Option<PathBuf>) -> std::io::Result<Announcer> {
    let writer = Writer::new(table)?;
    let (tx, rx) = watch::channel(None);
    let outcome = Arc::new(Mutex::new(Outcome::default()));
    tokio::spawn(run(writer, rx, Arc::clone(&outcome)));
    if let Some(path) = speaker {
        tokio::spawn(watch_speaker(path, Arc::clone(&outcome)));
    }
    Ok(Announcer {
        want: tx,
        outcome,
        table,
    })
}

/// Reconciles whenever the wanted set changes, and again after a failure.
async fn run(
    writer: Writer,
    mut rx: watch::Receiver<Option<BTreeSet<IpAddr>>>,
    outcome: Arc<Mutex<Outcome>>,
) {
    let mut failed = false;
    // The adopted routes are shown from the start.
    if let Ok(l) = writer.list().await
        && let Ok(mut o) = outcome.lock()
    {
        o.routes = l.ours;
    }
    loop {
        let changed = if failed {
            tokio::time::timeout(RETRY, rx.changed()).await.ok()
        } else {
            Some(rx.changed().await)
        };
        if matches!(changed, Some(Err(_))) {
            return; // the daemon is gone
        }
        let Some(want) = rx.borrow_and_update().clone() else {
            continue;
        };
        let r = writer.reconcile(&want).await;
        failed = r.is_err();
        let listed = writer.list().await.map(|l| l.ours).ok();
        let Ok(mut o) = outcome.lock() else { return };
        o.reconciles += 1;
        if let Some(l) = listed {
            o.routes = l;
        }
        match r {
            Ok(p) => {
                for a in &p.add {
                    info!("announce: route {a} added to table {}", writer.table.id);
                }
                for a in &p.delete {
                    info!("announce: route {a} deleted from table {}", writer.table.id);
                }
                o.error = None;
            }
            Err(e) => {
                if o.error.as_deref() != Some(&e.to_string()) {
                    error!("announce: {e}");
                }
                o.error = Some(e.to_string());
            }
        }
    }
}

/// Checks the speaker every [`SPEAKER_PERIOD`].
async fn watch_speaker(path: PathBuf, outcome: Arc<Mutex<Outcome>>) {
    loop {
        let r = speaker_alive(&path).await;
        match outcome.lock() {
            Ok(mut o) => o.speaker = Some(r),
            Err(_) => return,
        }
        tokio::time::sleep(SPEAKER_PERIOD).await;
    }
}

/// `xlb detach`: deletes the instance's routes (the routers move flows
/// away), in the current network namespace, on a runtime of its own.
///
/// # Errors
/// The socket or a request fails.
pub fn delete_all_blocking(table: Table) -> anyhow::Result<Vec<IpAddr>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let w = Writer::new(table)?;
        Ok(w.delete_all().await?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vip_on_a_local_address_is_named() {
        let mut text = "[daemon]\ninterface = \"eth0\"\n[announce]\ntable = 100\n".to_string();
        for (name, addr) in [("api", "10.100.0.1"), ("web", "10.100.0.2")] {
            text += &format!(
                "[[vip]]\nname = \"{name}\"\naddress = \"{addr}\"\nport = 80\n\
                 [[vip.backend]]\naddress = \"10.0.0.11\"\n"
            );
        }
        let cfg = Config::from_str(&text, "xlb.toml").unwrap();
        let local = vec![
            ("lo".to_string(), "127.0.0.1".parse().unwrap()),
            ("eth0".to_string(), "10.100.0.2".parse().unwrap()),
        ];
        assert_eq!(
            local_vip_errors(&cfg, &local),
            [
                "vip \"web\": address 10.100.0.2 is an address of interface eth0 on this host; an \
              announced VIP must not be one (the host would attract its traffic whatever xlb \
              announces): remove it from eth0 (ip addr del 10.100.0.2/32 dev eth0) or remove \
              [announce]"
            ]
        );
        let off = Config {
            announce: None,
            ..cfg
        };
        assert_eq!(local_vip_errors(&off, &local), Vec::<String>::new());
    }

    #[tokio::test]
    async fn speaker_check_says_why() {
        let dir = std::env::temp_dir().join(format!("xlb-speaker-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bird.ctl");
        let err = speaker_alive(&path).await.unwrap_err();
        assert!(err.contains("No such file or directory"), "{err}");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt as _;
            let (mut s, _) = listener.accept().await.unwrap();
            s.write_all(b"0001 BIRD 2.0.12 ready.\n").await.unwrap();
        });
        assert_eq!(speaker_alive(&path).await, Ok("BIRD 2.0.12 ready.".into()));
        server.await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
