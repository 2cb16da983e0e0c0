//! Abuse control in userspace: source prefixes, the model of the deny and
//! allow lists (what the daemon installs in the tries, with its rule ids and
//! expiry), and the per-source statistics.
//!
//! Everything here is pure: the daemon (`daemon::guard`) applies it to the
//! maps.

pub mod prefix;

pub use prefix::{Prefix, PrefixError};
