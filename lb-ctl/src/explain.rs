//! The answer to `explain`: which backend a flow goes to, and why.

use serde::{Deserialize, Serialize};

/// Every value of [`ExplainReport::via`], as spelled in JSON:
/// - `conntrack`: an existing conntrack entry;
/// - `table`: the VIP's Maglev table (a new flow, or no usable entry);
/// - `none`: no backend, the table slot is empty: the packet is dropped.
pub const VIA: [&str; 3] = ["conntrack", "table", "none"];

/// Answer to `explain`: the backend a flow goes to and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExplainReport {
    /// `"tcp"` or `"udp"`.
    pub protocol: String,
    /// The client's address and port.
    pub client: String,
    /// The VIP's address and port.
    pub vip: String,
    /// The VIP's name.
    pub vip_name: String,
    /// `"ip:port"` of the backend packets of this flow go to; `null` =
    /// dropped (no backend).
    pub backend: Option<String>,
    /// Where that choice comes from: one of [`VIA`].
    pub via: String,
    /// The flow's slot in the Maglev table (also shown for conntrack hits).
    /// The keyed hash itself is not shown (protocol 2): pairs of flows and
    /// hashes would be an oracle for the secret key.
    pub slot: Option<u32>,
    /// The VIP's table size.
    pub table_size: u32,
    /// State of `backend`: one of [`BACKEND_STATES`](crate::BACKEND_STATES).
    pub backend_state: Option<String>,
    /// One sentence for the operator: why this backend.
    pub detail: String,
}
