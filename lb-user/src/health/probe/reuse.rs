//! `reuse_connection`: one HTTP/1.1 keep-alive connection per backend,
//! carried from one probe to the next, so that most probes cost a write and
//! a read instead of a TCP handshake, a request and a teardown.
//!
//! What a reused connection still proves: the application reads a request
//! and answers it in time, so a hung event loop stalls it as it stalls a
//! fresh one (the probe ends in `no_response` at `hang_timeout`, the
//! connection is dropped, and the next probe opens a new one). What it does
//! not prove: that the backend accepts new connections. A listener that is
//! closed, an accept loop that is stuck while established connections are
//! still served, a full accept queue or SYN backlog, a firewall rule that
//! drops new flows: all go unseen until the connection is re-opened, which
//! happens every `reopen_every` probes, after any failure, and whenever the
//! backend closes it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::stream::ProbeStream;

use super::grpc::GrpcSlot;

/// A backend's idle keep-alive connection between two probes, if it has
/// one. Cheap to clone: the backend's task and its lingering probes share
/// it. A probe takes the connection out while it uses it, so two probes in
/// flight never share one (the second opens its own).
#[derive(Clone, Default)]
pub struct ConnSlot(Arc<Mutex<Option<Idle>>>, GrpcSlot);

struct Idle {
    stream: ProbeStream,
    /// Where it is connected: the backend, or the VIP for a data-path probe.
    addr: SocketAddr,
    /// Probes it has carried so far.
    used: u32,
}

impl std::fmt::Debug for ConnSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnSlot")
            .field("idle", &self.is_idle())
            .finish()
    }
}

impl ConnSlot {
    fn lock(&self) -> MutexGuard<'_, Option<Idle>> {
        // Every critical section is a plain take or store.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The idle connection to `addr` and the probes it has carried, if it
    /// is still open and quiet. One the backend has closed (its FIN or RST
    /// arrived while idle), or that received bytes nobody asked for (a `408`
    /// some servers send before an idle timeout), is dropped instead: read
    /// as the next probe's answer, it would be a false failure.
    ///
    /// `tls`: whether the probe speaks TLS; a connection of the other kind
    /// (kept before the check's kind changed) is dropped.
    pub(super) fn take(&self, addr: SocketAddr, tls: bool) -> Option<(ProbeStream, u32)> {
        let mut idle = self.lock().take()?;
        if idle.addr != addr || idle.stream.is_tls() != tls {
            return None;
        }
        // Costs a syscall only when the socket was last seen readable.
        idle.stream.is_quiet().then_some((idle.stream, idle.used))
    }

    /// Keeps `stream` (connected to `addr`, `used` probes carried) for the
    /// next probe, replacing (closing) any connection kept meanwhile.
    pub(super) fn put(&self, stream: ProbeStream, addr: SocketAddr, used: u32) {
        *self.lock() = Some(Idle { stream, addr, used });
    }

    /// Whether a connection is kept for the next probe.
    pub fn is_idle(&self) -> bool {
        self.lock().is_some() || self.1.is_idle()
    }

    /// The kept HTTP/2 connection of a `kind = "grpc"` check.
    pub(super) fn grpc(&self) -> &GrpcSlot {
        &self.1
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::super::super::spec::CheckSpec;
    use super::super::super::testutil::{Behaviour, KeepAliveServer, http_check, http_spec};
    use super::super::{FailReason, ProbeOk, probe_reusing};
    use super::*;

    const T: Duration = Duration::from_millis(300);
    const OK: Result<ProbeOk, FailReason> = Ok(ProbeOk { status: Some(200) });

    fn reusing(port: u16, every: u32) -> CheckSpec {
        let mut spec = http_spec(port, T);
        http_check(&mut spec).reuse_connection = Some(every);
        spec
    }

    /// Probes `server` once with `spec` on `slot`.
    async fn once(
        server: &KeepAliveServer,
        spec: &CheckSpec,
        slot: &ConnSlot,
    ) -> Result<ProbeOk, FailReason> {
        probe_reusing(server.addr, spec, None, Some(slot))
            .await
            .outcome
    }

    fn connections(server: &KeepAliveServer) -> usize {
        server.connections.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn one_connection_carries_probe_after_probe() {
        let server = KeepAliveServer::start(Behaviour::Answer).await;
        let (spec, slot) = (reusing(server.addr.port(), 10), ConnSlot::default());
        for i in 0..5 {
            assert_eq!(once(&server, &spec, &slot).await, OK, "probe {i}");
            assert!(slot.is_idle(), "probe {i} did not keep its connection");
        }
        assert_eq!(connections(&server), 1);
        assert_eq!(server.requests.load(Ordering::SeqCst), 5);
        let request = server.last_request.lock().expect("lock").clone();
        let request = String::from_utf8(request.expect("a request")).expect("ASCII");
        assert!(
            !request.to_ascii_lowercase().contains("connection:"),
            "a reused probe must not ask to close: {request:?}"
        );
    }

    /// `reopen_every = 3`: probes 1-3 on one connection, 4-6 on the next, 7
    /// on a third, so a dead listener is seen within 3 probes.
    #[tokio::test]
    async fn reopened_every_n_probes() {
        let server = KeepAliveServer::start(Behaviour::Answer).await;
        let (spec, slot) = (reusing(server.addr.port(), 3), ConnSlot::default());
        let mut seen = Vec::new();
        for _ in 0..7 {
            assert_eq!(once(&server, &spec, &slot).await, OK);
            seen.push(connections(&server));
        }
        assert_eq!(seen, [1, 1, 1, 2, 2, 2, 3]);
    }

    /// After anything but a clean, passing exchange the connection is
    /// dropped; the next probe opens a new one and passes.
    #[tokio::test]
    async fn reopened_after_a_failure_a_timeout_or_close() {
        // (name, what the second request meets, its verdict's code)
        let cases = [
            ("503", Behaviour::Fail, Some("unexpected_status")),
            ("hung", Behaviour::Hang, Some("no_response")),
            ("Connection: close", Behaviour::AnswerAndClose, None),
        ];
        for (name, second, code) in cases {
            let server = KeepAliveServer::start(Behaviour::Answer).await;
            let (spec, slot) = (reusing(server.addr.port(), 10), ConnSlot::default());
            assert_eq!(once(&server, &spec, &slot).await, OK, "{name}");
            server.set(second);
            let verdict = once(&server, &spec, &slot).await;
            assert_eq!(verdict.as_ref().err().map(FailReason::code), code, "{name}");
            assert!(!slot.is_idle(), "{name}: connection kept");
            server.set(Behaviour::Answer);
            assert_eq!(once(&server, &spec, &slot).await, OK, "{name}");
            assert_eq!(connections(&server), 2, "{name}");
        }
    }

    /// A server closing a kept connection (its idle timeout) is not the
    /// backend failing: the probe goes out on a fresh connection instead,
    /// whether the close came before the probe, with an unsolicited 408, or
    /// just as the request arrived.
    #[tokio::test]
    async fn a_kept_connection_the_server_closed_is_replaced() {
        // (name, first request's behaviour, wait before the second probe)
        let cases = [
            ("idle close", Behaviour::AnswerThenIdleClose, 100),
            ("408 at idle timeout", Behaviour::AnswerThen408, 100),
        ];
        for (name, first, wait) in cases {
            let server = KeepAliveServer::start(first).await;
            let (spec, slot) = (reusing(server.addr.port(), 10), ConnSlot::default());
            assert_eq!(once(&server, &spec, &slot).await, OK, "{name}");
            tokio::time::sleep(Duration::from_millis(wait)).await;
            server.set(Behaviour::Answer);
            assert_eq!(once(&server, &spec, &slot).await, OK, "{name}");
            assert_eq!(connections(&server), 2, "{name}");
        }
        // Closed as the request arrives: the request is sent again, once.
        let server = KeepAliveServer::start(Behaviour::Answer).await;
        let (spec, slot) = (reusing(server.addr.port(), 10), ConnSlot::default());
        assert_eq!(once(&server, &spec, &slot).await, OK);
        server.set(Behaviour::CloseUnanswered);
        let retried = once(&server, &spec, &slot).await;
        assert_eq!(
            retried.as_ref().err().map(FailReason::code),
            Some("connection_closed"),
            "a fresh connection closed unanswered is a failure"
        );
        assert_eq!(
            connections(&server),
            2,
            "sent again on one fresh connection"
        );
        assert_eq!(server.requests.load(Ordering::SeqCst), 3);
    }

    /// Without `reuse_connection` the slot is never used.
    #[tokio::test]
    async fn off_by_default() {
        let server = KeepAliveServer::start(Behaviour::Answer).await;
        let (spec, slot) = (http_spec(server.addr.port(), T), ConnSlot::default());
        for _ in 0..3 {
            assert_eq!(once(&server, &spec, &slot).await, OK);
        }
        assert!(!slot.is_idle());
        assert_eq!(connections(&server), 3);
    }
}
