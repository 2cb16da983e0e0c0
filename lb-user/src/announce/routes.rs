//! The hand-off to the BGP speaker: one host route (/32, /128) per
//! announced VIP address in xlb's own kernel routing table, with xlb's
//! route protocol number, written over rtnetlink (never by running `ip`).
//!
//! The routes are `blackhole` routes: BIRD's `kernel` protocol with `learn`
//! imports them as it imports any route of a foreign protocol (checked in
//! `tests/tests/daemon/announce.rs` with BIRD running), and no `ip rule`
//! points at the table, so the host's own forwarding never uses them: the
//! VIP's packets are XDP's, before any route lookup.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use futures_util::TryStreamExt as _;
use netlink_packet_route::{
    AddressFamily,
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteType},
};
use rtnetlink::{Handle, RouteMessageBuilder};

/// Where xlb's routes live and how they are marked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Table {
    pub id: u32,
    pub protocol: u8,
}

/// A route in the table that is not xlb's, named for the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Foreign {
    /// `10.1.0.0/16`, or `default`.
    pub dest: String,
    pub protocol: u8,
}

/// What the table holds: xlb's host routes and everything else.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub ours: BTreeSet<IpAddr>,
    pub foreign: Vec<Foreign>,
}

/// The routes to add and delete to go from `have` to `want`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub add: Vec<IpAddr>,
    pub delete: Vec<IpAddr>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.delete.is_empty()
    }
}

/// The difference, in address order (additions first when applied: a
/// moving address is never missing from every table at once).
pub fn plan(have: &BTreeSet<IpAddr>, want: &BTreeSet<IpAddr>) -> Plan {
    Plan {
        add: want.difference(have).copied().collect(),
        delete: have.difference(want).copied().collect(),
    }
}

/// The table holds routes of another protocol: someone else uses it.
pub fn in_use_error(table: Table, foreign: &[Foreign]) -> Option<String> {
    let first = foreign.first()?;
    Some(format!(
        "routing table {} holds {} route{} that xlb did not write (e.g. {} proto {}): another \
         program uses it; pick a table of xlb's own in [announce] table, or remove those \
         routes (ip route flush table {} proto {})",
        table.id,
        foreign.len(),
        if foreign.len() == 1 { "" } else { "s" },
        first.dest,
        first.protocol,
        table.id,
        first.protocol
    ))
}

/// A failed netlink request, said with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct RouteError {
    pub what: String,
    #[source]
    pub source: rtnetlink::Error,
}

/// The netlink side: list, add, delete, reconcile.
#[derive(Clone)]
pub struct Writer {
    handle: Handle,
    pub table: Table,
}

impl fmt::Debug for Writer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writer")
            .field("table", &self.table)
            .finish()
    }
}

impl Writer {
    /// Opens a netlink socket in the current network namespace; its
    /// connection runs as a task on the current tokio runtime.
    ///
    /// # Errors
    /// The socket cannot be opened.
    pub fn new(table: Table) -> std::io::Result<Self> {
        let (conn, handle, _) = rtnetlink::new_connection()?;
        tokio::spawn(conn);
        Ok(Self { handle, table })
    }

    /// Every route of the table, both families.
    ///
    /// # Errors
    /// The dump fails.
    pub async fn list(&self) -> Result<Listing, RouteError> {
        let mut out = Listing::default();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut query = RouteMessage::default();
            query.header.address_family = family;
            let mut routes = self.handle.route().get(query).execute();
            while let Some(r) = routes.try_next().await.map_err(|source| RouteError {
                what: format!("listing routing table {}", self.table.id),
                source,
            })? {
                self.sort(&r, &mut out);
            }
        }
        Ok(out)
    }

    /// Files route `r` (of any table: the dump is not filtered by the
    /// kernel without strict checking) as ours, foreign or not this table.
    fn sort(&self, r: &RouteMessage, out: &mut Listing) {
        if table_of(r) != self.table.id {
            return;
        }
        let protocol = u8::from(r.header.protocol);
        let dest = destination(r);
        let full = match dest {
            Some(IpAddr::V4(_)) => 32,
            Some(IpAddr::V6(_)) => 128,
            None => 0,
        };
        if protocol == self.table.protocol
            && r.header.destination_prefix_length == full
            && let Some(addr) = dest
        {
            out.ours.insert(addr);
            return;
        }
        out.foreign.push(Foreign {
            dest: dest.map_or_else(
                || "default".to_string(),
                |a| format!("{a}/{}", r.header.destination_prefix_length),
            ),
            protocol,
        });
    }

    fn message(&self, addr: IpAddr) -> RouteMessage {
        let len = if addr.is_ipv4() { 32 } else { 128 };
        RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(addr, len)
            .expect("a host prefix length is valid for its family")
            .table_id(self.table.id)
            .protocol(RouteProtocol::from(self.table.protocol))
            .kind(RouteType::BlackHole)
            .build()
    }

    /// Adds the host route of `addr` (an existing one is replaced, so a
    /// route left by a previous run is not an error).
    ///
    /// # Errors
    /// The kernel refuses it.
    pub async fn add(&self, addr: IpAddr) -> Result<(), RouteError> {
        self.handle
            .route()
            .add(self.message(addr))
            .replace()
            .execute()
            .await
            .map_err(|source| RouteError {
                what: format!("adding the route of {addr} to table {}", self.table.id),
                source,
            })
    }

    /// Deletes the host route of `addr`; one already gone is no error.
    ///
    /// # Errors
    /// The kernel refuses it for another reason.
    pub async fn delete(&self, addr: IpAddr) -> Result<(), RouteError> {
        match self.handle.route().del(self.message(addr)).execute().await {
            Err(rtnetlink::Error::NetlinkError(e))
                if e.raw_code() == -libc::ESRCH || e.raw_code() == -libc::ENOENT =>
            {
                Ok(())
            }
            r => r.map_err(|source| RouteError {
                what: format!("deleting the route of {addr} from table {}", self.table.id),
                source,
            }),
        }
    }

    /// Makes the table's routes of xlb's protocol exactly `want`; returns
    /// what it changed. Additions first.
    ///
    /// # Errors
    /// The first request that fails (the others are still tried at the
    /// next reconcile).
    pub async fn reconcile(&self, want: &BTreeSet<IpAddr>) -> Result<Plan, RouteError> {
        let have = self.list().await?.ours;
        let p = plan(&have, want);
        for &a in &p.add {
            self.add(a).await?;
        }
        for &a in &p.delete {
            self.delete(a).await?;
        }
        Ok(p)
    }

    /// Deletes every route of xlb's protocol in the table (`xlb detach`).
    ///
    /// # Errors
    /// As [`Writer::reconcile`].
    pub async fn delete_all(&self) -> Result<Vec<IpAddr>, RouteError> {
        Ok(self.reconcile(&BTreeSet::new()).await?.delete)
    }
}

/// The route's table: `RTA_TABLE` when present (ids above 255 are only
/// there), else the header's byte.
fn table_of(r: &RouteMessage) -> u32 {
    r.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(r.header.table))
}

fn destination(r: &RouteMessage) -> Option<IpAddr> {
    r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
        RouteAttribute::Destination(RouteAddress::Inet6(v6)) => Some(IpAddr::V6(*v6)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(addrs: &[&str]) -> BTreeSet<IpAddr> {
        addrs.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn plans() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let cases = [
            ("nothing to do", set(&[]), set(&[]), vec![], vec![]),
            (
                "adopted routes kept",
                set(&["10.0.0.1", "fd00::1"]),
                set(&["10.0.0.1", "fd00::1"]),
                vec![],
                vec![],
            ),
            (
                "first announcement",
                set(&[]),
                set(&["10.0.0.1"]),
                vec![ip("10.0.0.1")],
                vec![],
            ),
            (
                "one moves",
                set(&["10.0.0.1", "10.0.0.2"]),
                set(&["10.0.0.2", "fd00::3"]),
                vec![ip("fd00::3")],
                vec![ip("10.0.0.1")],
            ),
            (
                "all withdrawn",
                set(&["10.0.0.1", "fd00::1"]),
                set(&[]),
                vec![],
                vec![ip("10.0.0.1"), ip("fd00::1")],
            ),
        ];
        for (name, have, want, add, delete) in cases {
            assert_eq!(plan(&have, &want), Plan { add, delete }, "{name}");
        }
    }

    #[test]
    fn a_table_in_use_is_named_with_one_route() {
        let t = Table {
            id: 100,
            protocol: 252,
        };
        assert_eq!(in_use_error(t, &[]), None);
        let foreign = vec![
            Foreign {
                dest: "default".into(),
                protocol: 3,
            },
            Foreign {
                dest: "10.1.0.0/16".into(),
                protocol: 12,
            },
        ];
        assert_eq!(
            in_use_error(t, &foreign).unwrap(),
            "routing table 100 holds 2 routes that xlb did not write (e.g. default proto 3): \
             another program uses it; pick a table of xlb's own in [announce] table, or remove \
             those routes (ip route flush table 100 proto 3)"
        );
    }
}
