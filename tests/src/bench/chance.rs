//! Second chance in `xlb-bench`, side by side with today's paths in the
//! same run: the established path of a VIP with second chance on (it must
//! cost nothing: the README's default rests on it), a conntrack miss with
//! and without a previous owner, and the decapsulator's plain strip
//! against second chance kept locally and relayed.

use std::net::{TcpListener, TcpStream};

use lb_common::{CtEntry, DOWN_POLICY_REHASH, MODE_DSR_IPIP, PROTO_TCP, RingSlot, VipInfo, VipKey};

use crate::{
    harness::{LB_MAC, LB_V4, PEER_MAC, World},
    packet::{self, ACK, ETH_P_IP, Flow},
};

/// VIP 2 of the benchmark world: `dsr-ipip`, second chance on, every
/// slot's previous owner the other backend.
pub const VIP: &str = "10.100.0.3";

/// What the cases send, and the sockets the local decap case needs open.
pub struct Chance {
    /// Established (in conntrack) to [`VIP`].
    pub est: Flow,
    /// Not in conntrack, to [`VIP`] (previous owners) and to VIP 0 of
    /// `dataplane::Flows` with second chance on and no previous owner.
    pub miss: Flow,
    pub miss_no_prev: Flow,
    /// Decap frames: a plain tunnel, a double one this host has the
    /// connection of, a double one to relay to backend 2.
    pub plain: Vec<u8>,
    pub local: Vec<u8>,
    pub relay: Vec<u8>,
    _sockets: (TcpListener, TcpStream, TcpStream),
}

/// Sets up [`VIP`], turns second chance on for VIP 0 (no previous owners),
/// and the decapsulator's maps, with a loopback connection for the local
/// case. Run on the world's thread (its namespace).
pub fn install(w: &mut World) -> anyhow::Result<Chance> {
    let size = lb_common::DEFAULT_TABLE_SIZE;
    let table: Vec<u32> = (0..size).map(|i| 1 + i % 2).collect();
    let key = w.add_vip(
        2,
        VIP,
        80,
        PROTO_TCP,
        MODE_DSR_IPIP,
        DOWN_POLICY_REHASH,
        &table,
    )?;
    let prev: Vec<(u32, RingSlot)> = (0..size)
        .map(|i| {
            let id = 1 + i % 2;
            (
                i,
                RingSlot {
                    backend_id: id,
                    prev_id: 3 - id,
                },
            )
        })
        .collect();
    w.dp.write_ring_slots(2, 0, &prev)?;
    second_chance_on(w, &key)?;
    second_chance_on(w, &VipKey::new("10.100.0.1".parse()?, 80, PROTO_TCP))?;
    let est = Flow::tcp("192.0.2.1", 40001, VIP, 80);
    w.dp.ct_insert(
        &est.key(),
        &CtEntry {
            backend_id: 1,
            generation: 0,
            vip_id: 2,
            flags: 0,
            last_seen_ns: 0,
        },
    )?;
    for a in [LB_V4] {
        w.dp.add_decap_addr_with(a.parse()?, true)?;
    }
    w.dp.add_decap_source("10.0.0.2".parse()?, 32)?;
    for v in ["10.100.0.1", "127.0.0.1"] {
        w.dp.add_decap_vip(v.parse()?)?;
    }
    let l = TcpListener::bind("127.0.0.1:0")?;
    let c = TcpStream::connect(l.local_addr()?)?;
    let (s, _) = l.accept()?;
    let conn = Flow::tcp(
        "127.0.0.1",
        c.local_addr()?.port(),
        "127.0.0.1",
        l.local_addr()?.port(),
    );
    let inner = |f: &Flow| f.ip(ACK, &[0u8; 18]);
    let ack = Flow::tcp("192.0.2.1", 40001, "10.100.0.1", 80);
    Ok(Chance {
        est,
        miss: Flow::tcp("192.0.2.1", 40002, VIP, 80),
        miss_no_prev: Flow::tcp("192.0.2.1", 40002, "10.100.0.1", 80),
        plain: tunnel(&[], &inner(&ack)),
        local: tunnel(&["10.0.0.12"], &inner(&conn)),
        relay: tunnel(&["10.0.0.12"], &inner(&ack)),
        _sockets: (l, c, s),
    })
}

fn second_chance_on(w: &mut World, key: &VipKey) -> anyhow::Result<()> {
    let info = w.dp.vip(key)?.expect("VIP configured");
    w.dp.set_vip(
        key,
        &VipInfo {
            second_chance: 1,
            ..info
        },
    )?;
    Ok(())
}

/// A frame from the LB 10.0.0.2 to us (`LB_V4`), with a middle header to
/// each of `middles` in turn, around `inner`.
fn tunnel(middles: &[&str], inner: &[u8]) -> Vec<u8> {
    let lb = "10.0.0.2".parse().unwrap();
    let mut p = inner.to_vec();
    for m in middles {
        p = packet::encap(lb, m.parse().unwrap(), &p);
    }
    let p = packet::encap(lb, LB_V4.parse().unwrap(), &p);
    packet::eth(LB_MAC, PEER_MAC, None, ETH_P_IP, &p)
}
