//! Data-path probes: connect to the VIP's address and port, and let the
//! data plane send the connection to one particular backend exactly as it
//! sends clients' (encapsulated for `dsr-ipip`, to the backend's MAC for
//! `dsr-l2`).
//!
//! A direct probe of a backend's own address passes when its decapsulator
//! is stopped or the VIP is missing from its `lo`, although every client
//! flow it gets is blackholed. A data-path probe reaches the application
//! only through what clients go through, and the backend answers (from the
//! VIP, straight back to the LB host: DSR) only if all of it works.
//!
//! How: the probe socket carries `SO_MARK` = [`lb_common::hc_mark`]`(backend
//! id)` and is bound to the daemon's interface (`SO_BINDTODEVICE`), so its
//! packets leave through that interface's egress, where the tc classifier
//! `xlb_hc` looks the mark up in `XLB_HC_REALS` (written by the daemon for
//! every backend) and redirects the packet to that backend. Replies come
//! from the VIP to the LB's own address: `xlb_lb` passes them (not to a VIP)
//! and strict `rp_filter` accepts them, because the route to the VIP leaves
//! by the same interface.
//!
//! NAT VIPs (`nat`, `nat` with `preserve_client`): the backend answers the
//! address the probe comes from, not the LB host's in general, so the probe
//! socket is bound before it connects, to the VIP's first pool address of
//! its family (`nat`) or to the LB's own address the kernel picks for the
//! VIP (`preserve_client`), on a port the kernel picks; the probe's NAT
//! flow is then written into the pinned flow maps as the data plane's
//! allocator would ([`NatFlows`], `dataplane::nat_probe`), `xlb_hc` rewrites
//! only the destination address (VIP → backend; the port is the backend's
//! `health_port`, as in DSR modes), and the backend's answer
//! to (pool address, probe port) is translated back to VIP → probe by
//! `xlb_lb`'s NAT reply path and passed to the host. A data-path probe of a
//! NAT VIP thus proves what a direct one does not: that the backend's route
//! back to the pool address goes through the LB, and that the service
//! answers on the backend port through the translation. Its flow is
//! deleted when the probe ends ([`NatRegistration`]).
//!
//! What the LB host needs: a route to the VIP out of the XDP interface
//! through a gateway whose neighbour resolves (its default route normally is
//! one). Without one, the kernel takes the VIP for a neighbour of the bound
//! interface (as with an on-link route), ARPs for it, and nobody answers:
//! probes end in EHOSTUNREACH or a timeout. That is this host's fault, not
//! the backend's: the prober then judges the backend by its direct probe and
//! the daemon raises an alarm (`probe::probe_reusing`, `crate::route`).

use std::{
    cell::RefCell,
    fmt, io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsRawFd as _, RawFd},
    sync::Arc,
};

use tokio::{
    net::{TcpSocket, TcpStream},
    time::{Instant, timeout_at},
};

use crate::config::Mode;

/// Where a data-path probe goes: the VIP service, and which backend the
/// data plane must send it to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatapathTarget {
    /// The VIP's address and port: what the probe connects to.
    pub vip: SocketAddr,
    /// `SO_MARK` of the probe socket: `lb_common::hc_mark(backend id)`.
    pub mark: u32,
    /// The daemon's interface (`daemon.interface`), where `xlb_hc` runs.
    pub interface: String,
    /// The VIP's forwarding mode, for operators' texts.
    pub mode: Mode,
    /// For a NAT VIP's backend: where the probe leaves from and the flow
    /// written for it.
    pub nat: Option<NatPath>,
}

/// The NAT side of a data-path probe of a NAT VIP's backend.
#[derive(Clone)]
pub struct NatPath {
    /// The VIP's first pool address of its family (`nat`); `None` with
    /// `preserve_client`: the LB's own address the kernel picks for the VIP
    /// out of the interface.
    pub source: Option<IpAddr>,
    /// The backend's address: the flow's destination, with the port the
    /// probe connects to (its `health_port`, default the service port).
    pub backend: IpAddr,
    /// Its `XLB_BACKENDS` id and generation, and the VIP's id, as the data
    /// plane records them in a flow.
    pub backend_id: u32,
    pub generation: u32,
    pub vip_id: u32,
    /// Where the flows are written.
    pub flows: Arc<dyn NatFlows>,
}

impl fmt::Debug for NatPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatPath")
            .field("source", &self.source)
            .field("backend", &self.backend)
            .field("backend_id", &self.backend_id)
            .field("generation", &self.generation)
            .field("vip_id", &self.vip_id)
            .finish_non_exhaustive()
    }
}

/// Equal when the probes they make are: the maps' handle is not compared.
impl PartialEq for NatPath {
    fn eq(&self, o: &Self) -> bool {
        (
            self.source,
            self.backend,
            self.backend_id,
            self.generation,
            self.vip_id,
        ) == (o.source, o.backend, o.backend_id, o.generation, o.vip_id)
    }
}
impl Eq for NatPath {}

/// One data-path probe's NAT flow: its socket's own address and port, the
/// VIP address and port it connects to, the backend address and port the
/// flow goes to (`xlb_hc` rewrites the address only: both ports are the
/// probe's, the backend's `health_port`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeFlow {
    pub local: SocketAddr,
    pub vip: SocketAddr,
    pub backend: SocketAddr,
    pub udp: bool,
    pub backend_id: u32,
    pub generation: u32,
    pub vip_id: u32,
}

/// Writes and deletes probes' NAT flows (the pinned maps in the daemon:
/// `dataplane::nat_probe`), so that health checking itself stays free of
/// BPF.
pub trait NatFlows: Send + Sync {
    /// Writes `flow` as the data plane's allocator would: its reply key
    /// only if absent, then the flow.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::AlreadyExists`] when a NAT flow holds the reply key
    /// (the probe tries again from another port); any other error is this
    /// host's (maps not pinned, map full).
    fn register(&self, flow: &ProbeFlow) -> io::Result<()>;
    /// Deletes what [`Self::register`] wrote, if it still names `flow`.
    fn unregister(&self, flow: &ProbeFlow);
}

/// A probe's NAT flow, deleted when this is dropped (the probe ended: a
/// verdict, a timeout, or its future dropped).
#[must_use = "the probe's NAT flow is deleted when this is dropped"]
pub struct NatRegistration {
    flows: Arc<dyn NatFlows>,
    flow: ProbeFlow,
}

impl fmt::Debug for NatRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("NatRegistration").field(&self.flow).finish()
    }
}

impl Drop for NatRegistration {
    fn drop(&mut self) {
        self.flows.unregister(&self.flow);
    }
}

tokio::task_local! {
    /// The NAT flows of one probe's TCP connections ([`keeping_flows`]).
    static PROBE_FLOWS: RefCell<Vec<NatRegistration>>;
}

/// Runs probe `f`; with `nat`, the NAT flows its connections register
/// ([`keep_flow`]) are kept until it ends or is dropped, then deleted. The
/// TCP stream a probe opens passes through code that knows nothing of NAT
/// (HTTP, TLS, gRPC, expect): its flow stays beside the probe, not in it.
pub(crate) async fn keeping_flows<F: Future>(nat: bool, f: F) -> F::Output {
    if nat {
        PROBE_FLOWS.scope(RefCell::new(Vec::new()), f).await
    } else {
        f.await
    }
}

/// Keeps `registration` until the probe that runs this ends.
///
/// # Errors
///
/// Outside [`keeping_flows`] (a broken invariant): the flow is deleted at
/// once, and the probe would fail without its flow, so it fails here.
pub(crate) fn keep_flow(registration: NatRegistration) -> io::Result<()> {
    PROBE_FLOWS
        .try_with(|flows| flows.borrow_mut().push(registration))
        .map_err(|_| io::Error::other("a NAT probe flow registered outside a probe"))
}

/// Whether a probe of `kind` goes by UDP (`dns`, `udp`), else TCP: the
/// protocol of a NAT data-path probe's flow, whose answers the data plane
/// must recognise by their source port (`daemon::nat::wanted`).
pub fn probes_by_udp(kind: &crate::health::spec::CheckKind) -> bool {
    use crate::health::spec::{CheckKind, Transport};
    match kind {
        CheckKind::Dns(_) => true,
        CheckKind::Expect(e) => e.transport == Transport::Udp,
        _ => false,
    }
}

/// Sockets a probe tries before giving up when every port the kernel gave
/// it was one a NAT flow's reply key holds (ephemeral ports are outside
/// the pool's default range, so one try nearly always does).
pub const NAT_BIND_TRIES: usize = 4;

impl DatapathTarget {
    /// The target of backend `backend_id` of a VIP at `vip` in `mode`.
    pub fn new(vip: SocketAddr, backend_id: u32, interface: &str, mode: Mode) -> Self {
        Self {
            vip,
            mark: lb_common::hc_mark(backend_id),
            interface: interface.to_owned(),
            mode,
            nat: None,
        }
    }

    /// This target, for a NAT VIP's backend (see the module documentation).
    pub fn with_nat(self, nat: NatPath) -> Self {
        Self {
            nat: Some(nat),
            ..self
        }
    }

    /// Opens a TCP connection to the VIP whose packets the data plane sends
    /// to this target's backend (see the module documentation), within
    /// `deadline`. The prober does the same through [`Self::prepare`].
    ///
    /// # Errors
    ///
    /// - [`io::ErrorKind::TimedOut`] when no handshake completed by
    ///   `deadline`;
    /// - the error of `socket`, or of [`Self::prepare`]: local errors;
    /// - the error of `connect`: ENETUNREACH when the LB has no route to the
    ///   VIP through the interface (local), ECONNREFUSED when the backend's
    ///   VIP has nothing listening on the port, and so on.
    pub async fn connect(&self, deadline: Instant) -> io::Result<TcpStream> {
        if self.nat.is_some() {
            // The stream would outlive its flow: probes of NAT VIPs go
            // through `probe::probe_via`, which keeps both together.
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("DatapathTarget::connect {self}: NAT targets need probe::probe_via"),
            ));
        }
        let socket = if self.vip.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        self.prepare(&socket, self.vip)?;
        match timeout_at(deadline, socket.connect(self.vip)).await {
            Ok(r) => r,
            Err(_elapsed) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no handshake {self} by the deadline"),
            )),
        }
    }

    /// Marks `socket` for this target and binds it to the interface where
    /// `xlb_hc` runs; for a NAT target also binds it to its source address
    /// and writes its NAT flow ([`Self::register`]). Then connect it to the
    /// VIP, keeping the registration until the connection is done with.
    ///
    /// # Errors
    ///
    /// `setsockopt(SO_MARK)` (EPERM without CAP_NET_ADMIN),
    /// `SO_BINDTODEVICE` (no such interface), `bind`, or
    /// [`NatFlows::register`]'s (AlreadyExists: try another socket).
    pub fn prepare(
        &self,
        socket: &TcpSocket,
        to: SocketAddr,
    ) -> io::Result<Option<NatRegistration>> {
        set_mark(socket.as_raw_fd(), self.mark)?;
        // Only a packet leaving by this interface meets `xlb_hc`: any other
        // route would reach the VIP's owner on the network, i.e. the LB
        // itself or nobody, and fail every backend alike.
        socket.bind_device(Some(self.interface.as_bytes()))?;
        let Some(nat) = &self.nat else {
            return Ok(None);
        };
        socket.bind(SocketAddr::new(self.nat_source(nat)?, 0))?;
        self.register(nat, socket.local_addr()?, to, false)
            .map(Some)
    }

    /// A UDP socket of a datagram probe (`dns`, `udp`) prepared as
    /// [`Self::prepare`] prepares a TCP one (`xlb_hc` steers by mark
    /// whatever the protocol), bound, not connected; for a NAT target with
    /// its flow written, from another port if the first ones are held
    /// ([`NAT_BIND_TRIES`]).
    ///
    /// # Errors
    ///
    /// As [`Self::prepare`].
    pub fn udp_socket(
        &self,
        to: SocketAddr,
    ) -> io::Result<(std::net::UdpSocket, Option<NatRegistration>)> {
        let source = match &self.nat {
            Some(nat) => self.nat_source(nat)?,
            None if self.vip.is_ipv4() => Ipv4Addr::UNSPECIFIED.into(),
            None => Ipv6Addr::UNSPECIFIED.into(),
        };
        let mut tries = 0;
        loop {
            let socket = std::net::UdpSocket::bind(SocketAddr::new(source, 0))?;
            set_mark(socket.as_raw_fd(), self.mark)?;
            bind_device(socket.as_raw_fd(), &self.interface)?;
            let Some(nat) = &self.nat else {
                return Ok((socket, None));
            };
            tries += 1;
            match self.register(nat, socket.local_addr()?, to, true) {
                Ok(reg) => return Ok((socket, Some(reg))),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < NAT_BIND_TRIES => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The address a NAT probe leaves from: the pool address, or with
    /// `preserve_client` the one the kernel picks for the VIP out of the
    /// interface (a UDP `connect` sends nothing).
    fn nat_source(&self, nat: &NatPath) -> io::Result<IpAddr> {
        if let Some(addr) = nat.source {
            return Ok(addr);
        }
        let any: IpAddr = if self.vip.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv6Addr::UNSPECIFIED.into()
        };
        let s = std::net::UdpSocket::bind(SocketAddr::new(any, 0))?;
        set_mark(s.as_raw_fd(), self.mark)?;
        bind_device(s.as_raw_fd(), &self.interface)?;
        s.connect(self.vip)?;
        Ok(s.local_addr()?.ip())
    }

    /// Writes the NAT flow of a probe socket bound to `local` that
    /// connects to `to` (the VIP's address, the probe's port).
    fn register(
        &self,
        nat: &NatPath,
        local: SocketAddr,
        to: SocketAddr,
        udp: bool,
    ) -> io::Result<NatRegistration> {
        let flow = ProbeFlow {
            local,
            vip: to,
            backend: SocketAddr::new(nat.backend, to.port()),
            udp,
            backend_id: nat.backend_id,
            generation: nat.generation,
            vip_id: nat.vip_id,
        };
        nat.flows.register(&flow)?;
        Ok(NatRegistration {
            flows: Arc::clone(&nat.flows),
            flow,
        })
    }

    /// The reason shown when only the data-path probe fails:
    /// `no answer via VIP 10.100.0.1:80 through dsr-ipip; direct probe ok`.
    /// `what` is the probe's own failure text, e.g. "connect timeout after 1s".
    pub fn failure_reason(&self, what: &str, direct_ok: Option<bool>) -> String {
        let direct = match direct_ok {
            Some(true) => "; direct probe ok",
            Some(false) => "; direct probe fails too",
            None => "",
        };
        format!("no answer {self} ({what}){direct}")
    }
}

impl fmt::Display for DatapathTarget {
    /// `via VIP 10.100.0.1:80 through dsr-ipip`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "via VIP {} through {}", self.vip, self.mode)
    }
}

/// `setsockopt(SO_BINDTODEVICE)`: the socket's packets leave by `ifname`.
fn bind_device(fd: RawFd, ifname: &str) -> io::Result<()> {
    // SAFETY: a valid socket descriptor and a pointer to a live buffer of
    // the length given (the kernel copies at most IFNAMSIZ bytes).
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            ifname.as_ptr().cast(),
            ifname.len() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `setsockopt(SO_MARK)`: the mark every packet of the socket carries.
fn set_mark(fd: RawFd, mark: u32) -> io::Result<()> {
    // SAFETY: a valid socket descriptor and a pointer to a live u32 of the
    // length given.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_MARK,
            (&mark as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts() {
        let t = DatapathTarget::new("10.100.0.1:80".parse().unwrap(), 7, "eth0", Mode::DsrIpip);
        assert_eq!(t.mark, 0x584c_0007);
        let cases = [
            (
                Some(true),
                "no answer via VIP 10.100.0.1:80 through dsr-ipip (connect timeout after 1s); direct probe ok",
            ),
            (
                Some(false),
                "no answer via VIP 10.100.0.1:80 through dsr-ipip (connect timeout after 1s); direct probe fails too",
            ),
            (
                None,
                "no answer via VIP 10.100.0.1:80 through dsr-ipip (connect timeout after 1s)",
            ),
        ];
        for (direct, want) in cases {
            assert_eq!(
                t.failure_reason("connect timeout after 1s", direct),
                want,
                "{direct:?}"
            );
        }
    }

    /// Without a route through the interface, connect fails at once with a
    /// local error rather than waiting for the deadline.
    #[tokio::test]
    async fn no_such_interface_is_a_local_error() {
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        let err = DatapathTarget::new(
            "192.0.2.1:80".parse().unwrap(),
            1,
            "xlb-no-such-if0",
            Mode::DsrIpip,
        )
        .connect(deadline)
        .await
        .unwrap_err();
        // ENODEV from SO_BINDTODEVICE, or EPERM from SO_MARK when the test
        // runs without CAP_NET_ADMIN: never a timeout.
        assert_ne!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(Instant::now() < deadline);
    }

    /// A fake flow writer: refuses the first `held` registrations as taken
    /// (AlreadyExists), records what it wrote and deleted.
    #[derive(Default)]
    struct Fake {
        held: std::sync::Mutex<usize>,
        written: std::sync::Mutex<Vec<ProbeFlow>>,
        deleted: std::sync::Mutex<Vec<ProbeFlow>>,
    }

    impl NatFlows for Fake {
        fn register(&self, flow: &ProbeFlow) -> io::Result<()> {
            let mut held = self.held.lock().unwrap();
            if *held > 0 {
                *held -= 1;
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, "held"));
            }
            self.written.lock().unwrap().push(*flow);
            Ok(())
        }
        fn unregister(&self, flow: &ProbeFlow) {
            self.deleted.lock().unwrap().push(*flow);
        }
    }

    fn nat_target(fake: &Arc<Fake>) -> DatapathTarget {
        DatapathTarget::new("127.0.0.1:80".parse().unwrap(), 7, "lo", Mode::Nat).with_nat(NatPath {
            source: Some("127.0.0.1".parse().unwrap()),
            backend: "127.0.0.2".parse().unwrap(),
            backend_id: 7,
            generation: 2,
            vip_id: 3,
            flows: Arc::clone(fake) as Arc<dyn NatFlows>,
        })
    }

    /// A NAT probe's UDP socket is bound to the pool address, its flow
    /// written from its own port to the probe's port, from another socket
    /// while a port is held, and deleted when the registration goes.
    /// Needs CAP_NET_ADMIN (SO_MARK): skipped without it.
    #[test]
    fn nat_probe_flow_is_written_retried_and_deleted() {
        let fake = Arc::new(Fake {
            held: std::sync::Mutex::new(2),
            ..Fake::default()
        });
        let t = nat_target(&fake);
        let to: SocketAddr = "127.0.0.1:5354".parse().unwrap();
        let (socket, reg) = match t.udp_socket(to) {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return,
            r => r.unwrap(),
        };
        let local = socket.local_addr().unwrap();
        let want = ProbeFlow {
            local,
            vip: to,
            backend: "127.0.0.2:5354".parse().unwrap(),
            udp: true,
            backend_id: 7,
            generation: 2,
            vip_id: 3,
        };
        assert_eq!(local.ip(), "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(
            *fake.written.lock().unwrap(),
            [want],
            "after two held ports"
        );
        assert!(fake.deleted.lock().unwrap().is_empty());
        drop(reg);
        assert_eq!(*fake.deleted.lock().unwrap(), [want]);
        // Every port held: the probe gives up with the map's answer.
        *fake.held.lock().unwrap() = NAT_BIND_TRIES;
        let err = t.udp_socket(to).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists, "{err}");
    }

    /// Outside a probe (`keeping_flows`) a flow cannot be kept: it would be
    /// deleted at once.
    #[tokio::test]
    async fn flows_are_kept_for_the_probe_only() {
        let fake = Arc::new(Fake::default());
        let flow = ProbeFlow {
            local: "127.0.0.1:40000".parse().unwrap(),
            vip: "127.0.0.1:80".parse().unwrap(),
            backend: "127.0.0.2:80".parse().unwrap(),
            udp: false,
            backend_id: 1,
            generation: 0,
            vip_id: 0,
        };
        let reg = || NatRegistration {
            flows: Arc::clone(&fake) as Arc<dyn NatFlows>,
            flow,
        };
        assert!(keep_flow(reg()).is_err());
        assert_eq!(fake.deleted.lock().unwrap().len(), 1, "deleted at once");
        keeping_flows(true, async {
            keep_flow(reg()).unwrap();
            assert_eq!(
                fake.deleted.lock().unwrap().len(),
                1,
                "kept while the probe runs"
            );
        })
        .await;
        assert_eq!(
            fake.deleted.lock().unwrap().len(),
            2,
            "deleted when it ends"
        );
    }
}
