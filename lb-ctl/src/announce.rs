//! Announcements (issue 26): each VIP's announce state in `status`, and the
//! daemon's hand-off to the BGP speaker.

use serde::{Deserialize, Serialize};

/// Every value of [`VipAnnounce::state`], as spelled in JSON:
/// - `announced`: its address is in xlb's routing table (BIRD announces it);
/// - `withdrawn`: it does not want its address announced (see `code`);
/// - `off`: no `[announce]` in the configuration.
pub const ANNOUNCE_STATES: [&str; 3] = ["announced", "withdrawn", "off"];

/// Every value of [`VipAnnounce::code`], stable (metrics labels, scripts).
pub const ANNOUNCE_CODES: [&str; 6] = [
    "off",
    "starting",
    "serving",
    "panic",
    "too_few_up",
    "operator",
];

/// A VIP's announce state and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VipAnnounce {
    /// One of [`ANNOUNCE_STATES`].
    pub state: String,
    /// For the operator, e.g. `too_few_up: 0 of 3 backends up,
    /// announce_min_up = 1`.
    pub reason: String,
    /// One of [`ANNOUNCE_CODES`].
    pub code: String,
}

/// The daemon's side of the hand-off, present with `[announce]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnnounceStatus {
    /// `announce.table`.
    pub table: u32,
    /// `announce.protocol`.
    pub protocol: u8,
    /// xlb's routes in the table now (addresses), sorted.
    pub routes: Vec<String>,
    /// Whether routes are adopted and left alone until the first probe
    /// round is done (a restart).
    pub adopting: bool,
    /// The speaker check (`announce.speaker_socket`): `running (<its
    /// greeting>)` or `not running (<why>)`; `null` if not configured.
    pub speaker: Option<String>,
    /// The last route write's error; `null` when the table is as wanted.
    pub error: Option<String>,
}
