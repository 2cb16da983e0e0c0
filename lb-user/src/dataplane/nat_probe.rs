//! The NAT flows of data-path probes (`via = "vip"` on a NAT VIP): written
//! into the pinned `XLB_NAT_FLOWS` / `XLB_NAT_REPLY` exactly as `xlb_lb`'s
//! allocator writes a client's (`lb-ebpf/src/nat/alloc.rs`), so the
//! backend's answer to the probe's own address and port is translated back
//! to VIP → probe by the data plane's reply path.
//!
//! The reply key is the lock, as in the data plane: inserted with
//! `BPF_NOEXIST` first (a key held by a client flow is never taken; the
//! probe retries from another port), the flow second. Deleted in the same
//! order as the daemon's sweep deletes (reply key, then flow), each only
//! while it still names this probe's flow; the sweep (`daemon::nat_sweep`)
//! is the backstop for a process that died mid-probe.

use std::{
    io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use aya::maps::{HashMap, Map, MapData, MapError};
use lb_common::{
    FlowKey, PROTO_TCP, PROTO_UDP, addr16,
    nat::{
        MAP_NAT_FLOWS, MAP_NAT_REPLY, NAT_FLAG_ANSWERED, NAT_TCP_ESTABLISHED, NAT_UDP, NatFlow,
        reply_key,
    },
};

use crate::health::datapath::{NatFlows, ProbeFlow};

/// `BPF_NOEXIST` (uapi `linux/bpf.h`): insert only if the key is absent.
const BPF_NOEXIST: u64 = 1;

/// The two NAT flow maps of one instance, opened from their pins on first
/// use (the daemon pins them before any probe starts).
pub struct NatProbeMaps {
    dir: PathBuf,
    maps: Mutex<Option<Maps>>,
}

struct Maps {
    flows: HashMap<MapData, FlowKey, NatFlow>,
    reply: HashMap<MapData, FlowKey, FlowKey>,
}

impl NatProbeMaps {
    /// The maps pinned in `dir` (`/sys/fs/bpf/xlb/INSTANCE`), shared by
    /// every probe of the process: one pair of descriptors, not one per
    /// backend.
    pub fn shared(dir: &Path) -> Arc<Self> {
        static SHARED: Mutex<Option<Arc<NatProbeMaps>>> = Mutex::new(None);
        let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        match shared.as_ref() {
            Some(m) if m.dir == dir => Arc::clone(m),
            _ => {
                let m = Arc::new(Self {
                    dir: dir.to_owned(),
                    maps: Mutex::new(None),
                });
                *shared = Some(Arc::clone(&m));
                m
            }
        }
    }

    fn open(&self) -> io::Result<MutexGuard<'_, Option<Maps>>> {
        let mut maps = self.maps.lock().unwrap_or_else(PoisonError::into_inner);
        if maps.is_none() {
            let open = |name: &str| {
                let path = self.dir.join(name);
                MapData::from_pin(&path)
                    .map(Map::HashMap)
                    .map_err(|e| pin_error(&path, &e))
            };
            let typed = |e: MapError| io::Error::other(format!("NAT flow map: {e}"));
            *maps = Some(Maps {
                flows: open(MAP_NAT_FLOWS)?.try_into().map_err(typed)?,
                reply: open(MAP_NAT_REPLY)?.try_into().map_err(typed)?,
            });
        }
        Ok(maps)
    }
}

fn pin_error(path: &Path, e: &MapError) -> io::Error {
    io::Error::other(format!(
        "opening the pinned NAT flow map {}: {e}; is `xlb run` loaded with this instance?",
        path.display()
    ))
}

/// The client key and the flow a probe's NAT flow is written as, and its
/// reply key.
pub fn entries(p: &ProbeFlow, now_ns: u64) -> (FlowKey, NatFlow, FlowKey) {
    let proto = if p.udp { PROTO_UDP } else { PROTO_TCP };
    let client = FlowKey::new(p.local, p.vip, proto);
    let flow = NatFlow {
        backend_id: p.backend_id,
        generation: p.generation,
        vip_id: p.vip_id,
        // Established from the start, not SYN_SENT: the probe's SYN never
        // crossed `xlb_lb`, so its SYN-ACK must not count as a connection
        // made (`PassiveStats::connected` without its `connects`), which
        // would hide real clients' failed connects from passive detection.
        state: if p.udp { NAT_UDP } else { NAT_TCP_ESTABLISHED },
        // Answered from the start too: the daemon's own flow is no forged
        // client's, and is never evicted as embryonic.
        flags: if p.udp { NAT_FLAG_ANSWERED } else { 0 },
        nat_port: client.sport,
        nat_addr: client.src,
        backend_port: p.backend.port().to_be(),
        _pad: [0; 2],
        backend_isn: 0,
        last_seen_ns: now_ns,
        request_ns: 0,
    };
    let reply = reply_key(&client, &flow, &addr16(p.backend.ip()));
    (client, flow, reply)
}

impl NatFlows for NatProbeMaps {
    fn register(&self, p: &ProbeFlow) -> io::Result<()> {
        let mut guard = self.open()?;
        let Some(m) = guard.as_mut() else {
            return Err(io::Error::other("NAT flow maps not open"));
        };
        let (client, flow, reply) = entries(p, super::ktime_coarse_ns());
        if let Err(e) = m.reply.insert(reply, client, BPF_NOEXIST) {
            return Err(match &e {
                MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::EEXIST) => {
                    io::Error::new(io::ErrorKind::AlreadyExists, "reply key held by a NAT flow")
                }
                _ => io::Error::other(format!("inserting a probe's NAT reply key: {e}")),
            });
        }
        if let Err(e) = m.flows.insert(client, flow, 0) {
            let _ = m.reply.remove(&reply);
            return Err(io::Error::other(format!(
                "inserting a probe's NAT flow: {e} (NAT flow map full? see daemon.nat_size)"
            )));
        }
        Ok(())
    }

    fn unregister(&self, p: &ProbeFlow) {
        let Ok(mut guard) = self.open() else { return };
        let Some(m) = guard.as_mut() else { return };
        let (client, flow, reply) = entries(p, 0);
        // Only what still names this probe: after an expiry the data plane
        // may have given the port to a client.
        if m.reply.get(&reply, 0).is_ok_and(|c| c == client) {
            let _ = m.reply.remove(&reply);
        }
        if m.flows.get(&client, 0).is_ok_and(|f| {
            f.nat_port == flow.nat_port
                && f.nat_addr == flow.nat_addr
                && f.backend_id == flow.backend_id
        }) {
            let _ = m.flows.remove(&client);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_the_allocators() {
        let p = ProbeFlow {
            local: "10.0.0.2:41000".parse().unwrap(),
            vip: "10.100.0.1:80".parse().unwrap(),
            backend: "10.1.0.5:8080".parse().unwrap(),
            udp: false,
            backend_id: 7,
            generation: 3,
            vip_id: 2,
        };
        let (client, flow, reply) = entries(&p, 99);
        assert_eq!(client.sport, 41000u16.to_be());
        assert_eq!(client.dport, 80u16.to_be());
        assert_eq!(client.proto, PROTO_TCP);
        assert_eq!(
            (flow.state, flow.nat_port, flow.nat_addr),
            (NAT_TCP_ESTABLISHED, client.sport, client.src)
        );
        assert_eq!(flow.last_seen_ns, 99);
        // What the backend answers to: backend:8080 → 10.0.0.2:41000.
        assert_eq!(reply.src, addr16("10.1.0.5".parse().unwrap()));
        assert_eq!(
            (reply.sport, reply.dport),
            (8080u16.to_be(), 41000u16.to_be())
        );
        assert_eq!(reply.dst, client.src);
        let udp = ProbeFlow { udp: true, ..p };
        let (c, f, _) = entries(&udp, 0);
        assert_eq!((c.proto, f.state), (PROTO_UDP, NAT_UDP));
    }
}
