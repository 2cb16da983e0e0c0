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
//! What the LB host needs: a route to the VIP out of the XDP interface
//! through a gateway whose neighbour resolves (its default route normally is
//! one). Without one, the kernel takes the VIP for a neighbour of the bound
//! interface (as with an on-link route), ARPs for it, and nobody answers:
//! probes end in EHOSTUNREACH or a timeout. That is this host's fault, not
//! the backend's: the prober then judges the backend by its direct probe and
//! the daemon raises an alarm (`probe::probe_reusing`, `crate::route`).

use std::{
    fmt, io,
    net::SocketAddr,
    os::fd::{AsRawFd as _, RawFd},
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
}

impl DatapathTarget {
    /// The target of backend `backend_id` of a VIP at `vip` in `mode`.
    pub fn new(vip: SocketAddr, backend_id: u32, interface: &str, mode: Mode) -> Self {
        Self {
            vip,
            mark: lb_common::hc_mark(backend_id),
            interface: interface.to_owned(),
            mode,
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
        let socket = if self.vip.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        self.prepare(&socket)?;
        match timeout_at(deadline, socket.connect(self.vip)).await {
            Ok(r) => r,
            Err(_elapsed) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no handshake {self} by the deadline"),
            )),
        }
    }

    /// Marks `socket` for this target and binds it to the interface where
    /// `xlb_hc` runs; then connect it to the VIP.
    ///
    /// # Errors
    ///
    /// `setsockopt(SO_MARK)` (EPERM without CAP_NET_ADMIN) or
    /// `SO_BINDTODEVICE` (no such interface).
    pub fn prepare(&self, socket: &TcpSocket) -> io::Result<()> {
        set_mark(socket.as_raw_fd(), self.mark)?;
        // Only a packet leaving by this interface meets `xlb_hc`: any other
        // route would reach the VIP's owner on the network, i.e. the LB
        // itself or nobody, and fail every backend alike.
        socket.bind_device(Some(self.interface.as_bytes()))
    }

    /// [`Self::prepare`] for the UDP socket of a datagram probe (`dns`,
    /// `udp`): `xlb_hc` steers by mark whatever the protocol.
    ///
    /// # Errors
    ///
    /// As [`Self::prepare`].
    pub fn prepare_udp(&self, socket: &tokio::net::UdpSocket) -> io::Result<()> {
        set_mark(socket.as_raw_fd(), self.mark)?;
        socket.bind_device(Some(self.interface.as_bytes()))
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
}
