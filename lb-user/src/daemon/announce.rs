//! Announcements in the daemon: each VIP's decision (`crate::announce::state`)
//! from the model, one log line and one event per change, the wanted set
//! sent to the writer task at once, and `xlb withdraw` / `xlb announce`.
//!
//! Until the first probe round is done the writer is told to leave the
//! table alone: routes a previous run left stay announced (its data plane
//! kept forwarding), and only then does the table follow the decisions.

use std::collections::BTreeMap;

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::Daemon;
use crate::announce::{self, AnnounceState, Announcer, Reason, Table, VipFacts};
use crate::config::AnnounceConfig;
use crate::ctl::{self, EventKind, Response};
use crate::health::policy::Placement;

/// What `xlb detach` needs to withdraw, and the operators' withdrawals:
/// kept in the state file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedAnnounce {
    pub table: u32,
    pub protocol: u8,
    /// VIP name → the operator's reason (`xlb withdraw`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub withdrawn: BTreeMap<String, String>,
}

/// The daemon's announcement state.
#[derive(Debug, Default)]
pub(super) struct Announcing {
    /// The writer task; `None` without `[announce]` or before going live.
    announcer: Option<Announcer>,
    /// The programs are attached.
    live: bool,
    /// Every backend has had a probe result: the table follows decisions.
    first_round: bool,
    /// VIPs whose backends have all had a probe result since this start:
    /// a backend added later by a reload does not send its VIP back to
    /// `starting` (which would withdraw a VIP that serves).
    ready: std::collections::BTreeSet<String>,
    /// VIP name → the operator's reason.
    pub(super) withdrawn: BTreeMap<String, String>,
    /// VIP name → the last decision told.
    view: BTreeMap<String, (AnnounceState, Reason)>,
    /// The writer's error and the speaker check, as last told.
    told_error: Option<String>,
    told_speaker: Option<bool>,
}

impl Announcing {
    /// Operators' withdrawals of a previous run.
    pub(super) fn from_saved(saved: Option<&SavedAnnounce>) -> Self {
        Self {
            withdrawn: saved.map(|s| s.withdrawn.clone()).unwrap_or_default(),
            ..Self::default()
        }
    }
}

impl Daemon {
    /// Going live: starts the writer (adopting what the table holds) and
    /// makes the first decisions.
    pub(super) fn announce_go_live(&mut self) -> anyhow::Result<()> {
        self.announcing.live = true;
        if let Some(a) = &self.cfg.announce {
            let table = Table {
                id: a.table,
                protocol: a.protocol,
            };
            let w = announce::spawn(table, a.speaker_socket.clone())?;
            info!(
                "announce: VIP addresses go to routing table {} as proto {} routes; routes \
                 already there are kept until the first probe round is done",
                a.table, a.protocol
            );
            self.announcing.announcer = Some(w);
        }
        self.announce_update();
        Ok(())
    }

    /// One VIP's facts.
    fn announce_facts(&self, vi: usize) -> VipFacts<'_> {
        let v = &self.vips[vi];
        let up = v
            .backends
            .iter()
            .filter(|b| {
                matches!(
                    b.policy.placement,
                    Placement::Serving | Placement::Ramping | Placement::PanicRestored
                )
            })
            .count() as u32;
        VipFacts {
            enabled: self.cfg.announce.is_some(),
            attached: self.announcing.live,
            probed: self.announcing.ready.contains(&v.cfg.name)
                || v.backends.iter().all(|b| b.snapshot.is_some()),
            up,
            total: v.backends.len() as u32,
            panic: v.policy.panic.is_some(),
            min_up: self
                .cfg
                .announce
                .as_ref()
                .map_or(1, |a| a.min_up_of(&v.cfg.name)),
            operator: self
                .announcing
                .withdrawn
                .get(&v.cfg.name)
                .map(String::as_str),
        }
    }

    /// Decides every VIP, tells each change once, and sends the wanted
    /// addresses to the writer. Cheap: called after every batch of health
    /// reports, request and reload, so a transition reaches the table
    /// without waiting for the tick.
    pub(super) fn announce_update(&mut self) {
        let mut now = BTreeMap::new();
        let mut addrs = Vec::new();
        let live = self.announcing.live;
        for v in &self.vips {
            if live && v.backends.iter().all(|b| b.snapshot.is_some()) {
                self.announcing.ready.insert(v.cfg.name.clone());
            }
        }
        for vi in 0..self.vips.len() {
            let (s, r) = announce::decide(&self.announce_facts(vi));
            addrs.push((self.vips[vi].cfg.addr, s));
            now.insert(self.vips[vi].cfg.name.clone(), (s, r));
        }
        let before = std::mem::take(&mut self.announcing.view);
        for (name, (s, r)) in &now {
            let old = before.get(name);
            if old.is_none_or(|(os, or)| os != s || or.code() != r.code()) {
                let from = old.map_or("none", |(os, _)| os.as_str());
                self.tell_announce(name, from, s.as_str(), r.to_string());
            }
        }
        for (name, (s, _)) in &before {
            if !now.contains_key(name) && *s == AnnounceState::Announced {
                self.tell_announce(name, s.as_str(), "withdrawn", Reason::Removed.to_string());
            }
        }
        self.announcing.view = now;
        if !self.announcing.first_round
            && self.announcing.live
            && self
                .vips
                .iter()
                .all(|v| v.backends.iter().all(|b| b.snapshot.is_some()))
        {
            self.announcing.first_round = true;
            if self.announcing.announcer.is_some() {
                info!("announce: first probe round done; the routing table now follows the VIPs");
            }
        }
        if let Some(a) = &self.announcing.announcer {
            let want = announce::wanted_addresses(addrs);
            a.want(self.announcing.first_round.then_some(want));
        }
    }

    /// One log line and one event for a VIP's change.
    fn tell_announce(&mut self, vip: &str, from: &str, to: &str, reason: String) {
        if self.cfg.announce.is_none() && from == "none" {
            return; // `off` from the start is no news
        }
        info!(vip = %vip, "announce: {from} -> {to}: {reason}");
        self.event(
            EventKind::Announce,
            Some(vip),
            None,
            Some(from),
            Some(to),
            reason,
            None,
        );
    }

    /// Every tick: the writer's errors and the speaker check, told when
    /// they change.
    pub(super) fn announce_tick(&mut self) {
        let Some(a) = &self.announcing.announcer else {
            return;
        };
        let o = a.outcome();
        if o.error != self.announcing.told_error {
            let (to, reason) = match &o.error {
                Some(e) => ("error", format!("routes not written: {e}")),
                None => ("ok", "routes written again".to_string()),
            };
            self.announcing.told_error = o.error.clone();
            self.event(
                EventKind::Announce,
                None,
                None,
                None,
                Some(to),
                reason,
                None,
            );
        }
        if let Some(speaker) = &o.speaker {
            let up = speaker.is_ok();
            if self.announcing.told_speaker != Some(up) {
                let line = speaker_line(speaker);
                if up {
                    info!("announce: {line}");
                } else {
                    warn!(
                        "announce: {line}; routes are still written, but nothing announces \
                         them to the routers"
                    );
                }
                let first_and_fine = self.announcing.told_speaker.is_none() && up;
                self.announcing.told_speaker = Some(up);
                if !first_and_fine {
                    let to = if up { "speaker_up" } else { "speaker_down" };
                    self.event(EventKind::Announce, None, None, None, Some(to), line, None);
                }
            }
        }
    }

    /// Each VIP's state for `status`.
    pub(super) fn announce_of(&self, name: &str) -> Option<ctl::VipAnnounce> {
        let (s, r) = self.announcing.view.get(name)?;
        Some(ctl::VipAnnounce {
            state: s.as_str().to_string(),
            reason: r.to_string(),
            code: r.code().to_string(),
        })
    }

    /// The daemon's hand-off for `status`.
    pub(super) fn announce_status(&self) -> Option<ctl::AnnounceStatus> {
        let cfg = self.cfg.announce.as_ref()?;
        let o = self
            .announcing
            .announcer
            .as_ref()
            .map(Announcer::outcome)
            .unwrap_or_default();
        Some(ctl::AnnounceStatus {
            table: cfg.table,
            protocol: cfg.protocol,
            routes: o.routes.iter().map(ToString::to_string).collect(),
            adopting: !self.announcing.first_round,
            speaker: o.speaker.as_ref().map(speaker_line),
            error: o.error,
        })
    }

    /// What the state file keeps.
    pub(super) fn announce_saved(&self) -> Option<SavedAnnounce> {
        let a = self.cfg.announce.as_ref()?;
        Some(SavedAnnounce {
            table: a.table,
            protocol: a.protocol,
            withdrawn: self.announcing.withdrawn.clone(),
        })
    }

    /// `xlb withdraw VIP|--all [--reason]`.
    pub(super) fn withdraw(&mut self, vip: Option<String>, reason: Option<String>) -> Response {
        if let Err(e) = self.announce_request_ok(vip.as_deref()) {
            return Response::error(e);
        }
        let reason = reason.unwrap_or_else(|| "withdrawn with xlb withdraw".to_string());
        if let Err(e) = crate::ctl::check_reason(&reason) {
            return Response::error(e);
        }
        let names = self.named(vip.as_deref());
        for n in &names {
            self.announcing.withdrawn.insert(n.clone(), reason.clone());
        }
        self.announce_update();
        self.save();
        Response::Ok {
            message: format!(
                "withdrew {} ({reason}); `xlb announce` undoes it, a restart keeps it",
                names.join(", ")
            ),
        }
    }

    /// `xlb announce VIP|--all`.
    pub(super) fn announce_again(&mut self, vip: Option<String>) -> Response {
        if let Err(e) = self.announce_request_ok(vip.as_deref()) {
            return Response::error(e);
        }
        let names = self.named(vip.as_deref());
        let undone: Vec<String> = names
            .into_iter()
            .filter(|n| self.announcing.withdrawn.remove(n).is_some())
            .collect();
        self.announce_update();
        self.save();
        let message = if undone.is_empty() {
            "no VIP was withdrawn by an operator; nothing changed".to_string()
        } else {
            format!(
                "{} announced again when their backends allow (see xlb status)",
                undone.join(", ")
            )
        };
        Response::Ok { message }
    }

    fn announce_request_ok(&self, vip: Option<&str>) -> Result<(), String> {
        if self.cfg.announce.is_none() {
            return Err(format!(
                "{}: no [announce] table: this daemon announces nothing, so there is nothing \
                 to withdraw or announce; add [announce] to the configuration and reload",
                self.config_path.display()
            ));
        }
        if let Some(v) = vip
            && self.cfg.vip(v).is_none()
        {
            let names: Vec<&str> = self.vips.iter().map(|v| v.cfg.name.as_str()).collect();
            return Err(format!(
                "no VIP named {v:?}; the VIPs are: {}",
                names.join(", ")
            ));
        }
        Ok(())
    }

    fn named(&self, vip: Option<&str>) -> Vec<String> {
        match vip {
            Some(v) => vec![v.to_string()],
            None => self.vips.iter().map(|v| v.cfg.name.clone()).collect(),
        }
    }

    /// After a reload: withdrawals of VIPs that left are forgotten.
    pub(super) fn announce_after_reload(&mut self) {
        let vips = &self.vips;
        self.announcing
            .withdrawn
            .retain(|n, _| vips.iter().any(|v| v.cfg.name == *n));
        self.announcing
            .ready
            .retain(|n| vips.iter().any(|v| v.cfg.name == *n));
        self.announce_update();
    }
}

/// A reload keeps the running `[announce]` table, protocol and speaker
/// (and whether announcing is on): the writer owns them until the next
/// restart. `min_up` and `announce_min_up` apply at once. The note, if
/// anything was kept.
pub(super) fn keep_running_table(
    old: Option<&AnnounceConfig>,
    new: &mut Option<AnnounceConfig>,
) -> Option<String> {
    let same = |a: &AnnounceConfig, b: &AnnounceConfig| {
        (a.table, a.protocol, &a.speaker_socket) == (b.table, b.protocol, &b.speaker_socket)
    };
    match (old, new.as_mut()) {
        (None, None) => None,
        (Some(o), Some(n)) if same(o, n) => None,
        (Some(o), Some(n)) => {
            n.table = o.table;
            n.protocol = o.protocol;
            n.speaker_socket = o.speaker_socket.clone();
            Some(
                "[announce] table, protocol and speaker_socket changes take effect at the \
                 next restart"
                    .to_string(),
            )
        }
        (o, _) => {
            *new = o.cloned();
            Some(
                "turning [announce] on or off takes effect at the next restart (xlb detach \
                 withdraws the routes)"
                    .to_string(),
            )
        }
    }
}

/// `xlb run` before it touches anything: no VIP on a local address, and
/// the table is xlb's alone.
///
/// # Errors
/// Either, said for the operator.
pub(super) async fn check_at_start(
    cfg: &crate::config::Config,
    origin: &str,
) -> anyhow::Result<()> {
    let Some(a) = &cfg.announce else {
        return Ok(());
    };
    announce::check_local_addresses(cfg, origin).map_err(|l| anyhow::anyhow!(l.join("\n")))?;
    let table = Table {
        id: a.table,
        protocol: a.protocol,
    };
    let listing = announce::Writer::new(table)?.list().await?;
    if let Some(e) = announce::routes::in_use_error(table, &listing.foreign) {
        anyhow::bail!("{origin}: announce: {e}");
    }
    Ok(())
}

/// `xlb detach`, before XDP goes: deletes the routes of the table and
/// protocol the state file names, then waits `wait` if there were any.
/// What was done (or why not), for the operator; `None` without
/// `[announce]` in the state file.
pub(super) fn withdraw_for_detach(state: &std::path::Path, wait: Duration) -> Option<String> {
    let a = super::persist::Saved::load(state).ok()??.announce?;
    let table = Table {
        id: a.table,
        protocol: a.protocol,
    };
    // A runtime of its own on a thread of its own: the CLI already runs one.
    let deleted = std::thread::spawn(move || announce::delete_all_blocking(table))
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("the route writer panicked")));
    match deleted {
        Ok(addrs) if addrs.is_empty() => Some(format!(
            "announce: no routes in table {} to withdraw",
            a.table
        )),
        Ok(addrs) => {
            let list: Vec<String> = addrs.iter().map(ToString::to_string).collect();
            info!(
                "announce: withdrew {} from table {}; waiting {wait:?} before detaching",
                list.join(", "),
                a.table
            );
            std::thread::sleep(wait);
            Some(format!(
                "announce: withdrew {} from table {}, then waited {wait:?} for the routers",
                list.join(", "),
                a.table
            ))
        }
        Err(e) => Some(format!(
            "announce: routes in table {} NOT withdrawn ({e:#}); delete them with `ip route \
             flush table {} proto {}`",
            a.table, a.table, a.protocol
        )),
    }
}

fn speaker_line(s: &Result<String, String>) -> String {
    match s {
        Ok(greeting) => format!("speaker: running ({greeting})"),
        Err(why) => format!("speaker: not running ({why})"),
    }
}
