//! Second chance, the daemon's half: which backend held each slot of a
//! VIP's Maglev table before it last changed, and until when that is worth
//! remembering. Pure: the daemon feeds it the live table, the table it is
//! about to install and a clock; the data plane reads the answer from
//! `lb_common::RingSlot::prev_id`.
//!
//! A flow that lands on a node without its conntrack entry (ECMP moved it,
//! or the node restarted) is sent to its slot's current owner and, inside,
//! to the previous one; the current owner's decapsulator keeps it when it
//! has the connection and passes it to the previous owner otherwise. One
//! owner per slot is remembered: one reload's rebuilds within a minute count
//! as one change, and a flow older than two changes of its slot otherwise
//! is not saved.

/// What one VIP's live table remembers of its slots' previous owners.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// Per slot of the live table: the backend id that held it before it
    /// last changed, 0 = none (never changed, expired, or gone).
    pub prev: Vec<u32>,
    /// Per slot: when it last changed owner (ns on [`now_ns`]'s clock);
    /// meaningful where `prev` is not 0.
    pub changed_ns: Vec<u64>,
    /// The oldest change still remembered, kept so the daemon's tick does
    /// not walk every slot to learn nothing is due. `None`: none.
    oldest_ns: Option<u64>,
}

impl History {
    /// No previous owners, for a table of `len` slots.
    pub fn empty(len: usize) -> Self {
        Self {
            prev: vec![0; len],
            changed_ns: vec![0; len],
            oldest_ns: None,
        }
    }

    /// A history of these previous owners and change times.
    pub fn new(prev: Vec<u32>, changed_ns: Vec<u64>) -> Self {
        let oldest_ns = prev
            .iter()
            .zip(&changed_ns)
            .filter(|&(&p, _)| p != 0)
            .map(|(_, &t)| t)
            .min();
        Self {
            prev,
            changed_ns,
            oldest_ns,
        }
    }

    /// Adopted from the pinned ring at a restart: the previous owners the
    /// data plane already uses, their changes dated `now` (the daemon that
    /// saw them change is gone), so they live one window more at most.
    pub fn adopted(prev: Vec<u32>, now: u64) -> Self {
        let changed_ns = vec![now; prev.len()];
        Self::new(prev, changed_ns)
    }

    /// When the first remembered previous owner expires, given `window`;
    /// `None` if none is remembered.
    pub fn next_expiry(&self, window: u64) -> Option<u64> {
        self.oldest_ns.map(|t| t.saturating_add(window))
    }
}

/// The history of table `new` about to replace `old` (the live table,
/// whose history is `hist`) at `now`: a slot whose owner changes remembers
/// the old owner from now on (or, changing again within [`SETTLE_NS`] of
/// the reload at `reload_ns`, the owner from before the reload's first
/// change); a slot that keeps its owner keeps what it remembered. Then every remembered owner is forgotten if it is older
/// than `window`, is the slot's owner again, or is no longer one of the
/// VIP's backends (`is_member`: its id may be given to another backend).
///
/// When the size changes, slot `j` of `new` is compared with the slot of
/// `old` that most of its flows came from: a flow's slot is the high 32
/// bits of its hash scaled to the size (`FlowKey::slot`), so the old slot
/// of the flows in new slot `j` starts at `j × old / new`. Flows at the
/// edge of a slot may have come from the next one: they get no second
/// chance.
pub fn next(
    old: &[u32],
    new: &[u32],
    hist: &History,
    now: u64,
    window: u64,
    reload_ns: Option<u64>,
    is_member: impl Fn(u32) -> bool,
) -> History {
    let mut out = History::empty(new.len());
    if window == 0 || old.is_empty() {
        return out;
    }
    let known = hist.prev.len() == old.len() && hist.changed_ns.len() == old.len();
    for (j, &owner) in new.iter().enumerate() {
        let i = (j as u64 * old.len() as u64 / new.len() as u64) as usize;
        let before = old[i];
        let (prev, at) = if before != 0 && before != owner {
            settled(hist, known, i, owner, now, window, reload_ns).unwrap_or((before, now))
        } else if known {
            (hist.prev[i], hist.changed_ns[i])
        } else {
            (0, 0)
        };
        let forget = prev == owner || now.saturating_sub(at) >= window || !is_member(prev);
        if prev != 0 && !forget {
            out.prev[j] = prev;
            out.changed_ns[j] = at;
        }
    }
    History::new(out.prev, out.changed_ns)
}

/// How long after a reload its rebuilds count as one change. One reload is
/// several rebuilds in a few seconds (a backend leaves at once, a new one
/// joins after its first probes, then ramps through slow start), and a
/// slot can change at each: the flows it held before the reload are what a
/// second chance is for, so within this time a slot keeps the owner it
/// remembered from the reload's first change. Outside a reload (the start,
/// health changes) a change remembers the owner it displaced: flows may
/// have been made on it in between.
pub const SETTLE_NS: u64 = 60_000_000_000;

/// The owner slot `i` remembers from a change made since the reload at
/// `reload_ns` (if that is less than [`SETTLE_NS`] ago, and within
/// `window`), to keep across its change to `owner` now.
fn settled(
    hist: &History,
    known: bool,
    i: usize,
    owner: u32,
    now: u64,
    window: u64,
    reload_ns: Option<u64>,
) -> Option<(u32, u64)> {
    let start = reload_ns.filter(|&r| now.saturating_sub(r) < SETTLE_NS)?;
    if !known {
        return None;
    }
    let (p, t) = (hist.prev[i], hist.changed_ns[i]);
    (p != 0 && p != owner && t >= start && now.saturating_sub(t) < window).then_some((p, t))
}

/// When the last reload began (ns on [`now_ns`]'s clock, + 1; 0: none).
static RELOAD_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Marks the start of a reload: its rebuilds count as one change.
pub fn mark_reload() {
    RELOAD_NS.store(now_ns() + 1, std::sync::atomic::Ordering::Relaxed);
}

/// When the last reload began, if one did.
pub fn reload_ns() -> Option<u64> {
    match RELOAD_NS.load(std::sync::atomic::Ordering::Relaxed) {
        0 => None,
        t => Some(t - 1),
    }
}

/// `daemon.second_chance_window` in ns, as last applied (start, reload).
/// One setting of the whole daemon, read wherever a table is rebuilt.
static WINDOW_NS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(crate::config::chance_default_window_ns());

/// Applies `daemon.second_chance_window`.
pub fn set_window(window: std::time::Duration) {
    WINDOW_NS.store(
        window.as_nanos() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// The window a reload's rebuilds use, set before them (so a reload that
/// changes `second_chance_window` builds its tables' histories with the
/// new one) and put back when dropped unless the reload [`kept`] it.
///
/// [`kept`]: StagedWindow::keep
#[must_use = "dropping it puts the old window back"]
pub struct StagedWindow {
    before: u64,
    keep: bool,
}

impl StagedWindow {
    /// Applies `window` until this is dropped or kept.
    pub fn stage(window: std::time::Duration) -> Self {
        let before = window_ns();
        set_window(window);
        Self {
            before,
            keep: false,
        }
    }

    /// The reload succeeded: the window stays.
    pub fn keep(mut self) {
        self.keep = true;
    }
}

impl Drop for StagedWindow {
    fn drop(&mut self) {
        if !self.keep {
            WINDOW_NS.store(self.before, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// `daemon.second_chance_window` in ns.
pub fn window_ns() -> u64 {
    WINDOW_NS.load(std::sync::atomic::Ordering::Relaxed)
}

/// What each ring half of a VIP holds in its previous-owner column, as
/// far as this process knows (`None`: unknown, rewrite it whole); the live
/// half's is the VIP's history.
#[derive(Clone, Debug, Default)]
pub struct Halves(pub [Option<History>; 2]);

impl Halves {
    /// Whether a remembered previous owner of the live half `live` has
    /// expired by `now`: the table must be written again without it.
    pub fn due(&self, live: usize, now: u64) -> bool {
        self.0[live & 1]
            .as_ref()
            .and_then(|h| h.next_expiry(window_ns()))
            .is_some_and(|t| t <= now)
    }
}

/// Nanoseconds since this process first asked, on the monotonic clock
/// (which does not jump with the wall clock). Dates need not survive a
/// restart: an adopted history is dated at adoption ([`History::adopted`]).
pub fn now_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000_000_000;
    const WINDOW: u64 = 10 * MIN;

    fn all(_: u32) -> bool {
        true
    }

    /// Name, old table, new table, previous owners wanted.
    type Case<'a> = (&'a str, &'a [u32], &'a [u32], &'a [u32]);

    #[test]
    fn a_changed_slot_remembers_its_old_owner() {
        let cases: &[Case<'_>] = &[
            ("nothing changes", &[1, 2, 3], &[1, 2, 3], &[0, 0, 0]),
            ("backend 4 takes slot 1", &[1, 2, 3], &[1, 4, 3], &[0, 2, 0]),
            ("2 removed", &[1, 2, 2], &[1, 3, 1], &[0, 2, 2]),
            ("table was empty", &[0, 0, 0], &[1, 2, 3], &[0, 0, 0]),
            ("table empties", &[1, 2, 3], &[0, 0, 0], &[1, 2, 3]),
            ("first table", &[], &[1, 2], &[0, 0]),
        ];
        for &(name, old, new, want) in cases {
            let h = next(old, new, &History::empty(old.len()), 5, WINDOW, None, all);
            assert_eq!(h.prev, want, "{name}");
            for (p, t) in h.prev.iter().zip(&h.changed_ns) {
                assert_eq!(*t, if *p == 0 { 0 } else { 5 }, "{name}");
            }
        }
    }

    #[test]
    fn remembered_owners_carry_then_expire() {
        let t0 = 1_000;
        let h1 = next(&[1, 2], &[1, 3], &History::empty(2), t0, WINDOW, None, all);
        assert_eq!(h1.prev, [0, 2]);
        // An unrelated rebuild later keeps slot 1's memory and its date.
        let h2 = next(&[1, 3], &[4, 3], &h1, t0 + MIN, WINDOW, None, all);
        assert_eq!(h2.prev, [1, 2]);
        assert_eq!(h2.changed_ns, [t0 + MIN, t0]);
        assert_eq!(h2.next_expiry(WINDOW), Some(t0 + WINDOW));
        // Just before the window ends, still there; at its end, gone.
        let h3 = next(&[4, 3], &[4, 3], &h2, t0 + WINDOW - 1, WINDOW, None, all);
        assert_eq!(h3.prev, [1, 2]);
        let h4 = next(&[4, 3], &[4, 3], &h2, t0 + WINDOW, WINDOW, None, all);
        assert_eq!(h4.prev, [1, 0]);
        assert_eq!(h4.next_expiry(WINDOW), Some(t0 + MIN + WINDOW));
        let h5 = next(&[4, 3], &[4, 3], &h4, t0 + MIN + WINDOW, WINDOW, None, all);
        assert_eq!(h5.prev, [0, 0]);
        assert_eq!(h5.next_expiry(WINDOW), None);
    }

    #[test]
    fn outside_a_reload_a_change_remembers_the_owner_it_displaced() {
        // Backends coming up one after the other at the start: flows are
        // made on each owner in turn, so the last displaced one counts.
        let h1 = next(&[1], &[2], &History::empty(1), 1, WINDOW, None, all);
        let h2 = next(&[2], &[3], &h1, 2, WINDOW, None, all);
        assert_eq!((h2.prev[0], h2.changed_ns[0]), (2, 2));
        // Back to its previous owner: nothing to pass on.
        let h3 = next(&[3], &[2], &h2, 3, WINDOW, None, all);
        assert_eq!(h3.prev, [3]);
        let h4 = next(
            &[2],
            &[2],
            &History::new(vec![2], vec![3]),
            4,
            WINDOW,
            None,
            all,
        );
        assert_eq!(h4.prev, [0]);
    }

    #[test]
    fn a_reloads_rebuilds_keep_the_owner_from_before_it() {
        // Startup changes (before the reload) are not the reload's.
        let h0 = next(&[1], &[3], &History::empty(1), 5, WINDOW, None, all);
        // The reload at 10: backend 3 leaves (slot → 1), then backend 4
        // joins and takes the slot a second later: the flows are still
        // backend 3's.
        let r = Some(10);
        let h1 = next(&[3], &[1], &h0, 10, WINDOW, r, all);
        assert_eq!(h1.prev, [3]);
        let h2 = next(&[1], &[4], &h1, 10 + SETTLE_NS / 60, WINDOW, r, all);
        assert_eq!((h2.prev[0], h2.changed_ns[0]), (3, 10));
        // Back to the first owner within the minute: nothing to pass on.
        let h3 = next(&[4], &[3], &h2, 10 + SETTLE_NS / 30, WINDOW, r, all);
        assert_eq!(h3.prev, [4]);
        // A minute after the reload, a change is an event of its own.
        let h4 = next(&[1], &[4], &h1, 10 + SETTLE_NS, WINDOW, r, all);
        assert_eq!(h4.prev, [1]);
        // An owner remembered from before the reload is not kept.
        let h5 = next(&[3], &[2], &h0, 10, WINDOW, r, all);
        assert_eq!(h5.prev, [3]);
        // A window shorter than the time since the change bounds it too.
        let short = SETTLE_NS / 2;
        let h1 = next(&[3], &[1], &History::empty(1), 10, short, r, all);
        let h2 = next(&[1], &[4], &h1, 10 + short, short, r, all);
        assert_eq!(h2.prev, [1]);
    }

    #[test]
    fn ids_that_leave_the_vip_are_forgotten() {
        let h = next(
            &[1, 2, 3],
            &[4, 4, 4],
            &History::empty(3),
            1,
            WINDOW,
            None,
            |id| id != 2,
        );
        assert_eq!(h.prev, [1, 0, 3]);
    }

    #[test]
    fn window_zero_remembers_nothing() {
        let h = next(&[1, 2], &[2, 1], &History::empty(2), 1, 0, None, all);
        assert_eq!(h, History::empty(2));
    }

    #[test]
    fn a_resized_table_compares_scaled_slots() {
        // 3 slots to 7: new slot j came from old slot j*3/7.
        let old = [1, 2, 3];
        let new = [1, 1, 1, 1, 1, 1, 1];
        let h = next(&old, &new, &History::empty(3), 1, WINDOW, None, all);
        assert_eq!(h.prev, [0, 0, 0, 2, 2, 3, 3]);
        // And the other way, with what the old slots remembered.
        let hist = History::new(vec![0, 9, 9, 0, 0, 0, 5], vec![1; 7]);
        let h = next(&new, &[1, 1, 7], &hist, 2, WINDOW, None, all);
        // new slot j ← old slot j*7/3: 0, 2, 4.
        assert_eq!(h.prev, [0, 9, 1]);
    }

    #[test]
    fn adopted_history_expires_one_window_after_adoption() {
        let h = History::adopted(vec![0, 7], 100);
        assert_eq!(h.next_expiry(WINDOW), Some(100 + WINDOW));
        let h = next(&[1, 2], &[1, 2], &h, 100 + WINDOW, WINDOW, None, all);
        assert_eq!(h.prev, [0, 0]);
    }
}
