//! The daemon's end of the control socket.
//!
//! Anyone allowed to connect can drain backends, so the socket is created
//! with its final permissions before it becomes visible (bound under a
//! temporary name, chmod/chown, then renamed into place). Clients are not
//! trusted to behave: lines are bounded, idle connections time out, writes to
//! a client that does not read time out, and at most [`MAX_CONNECTIONS`] are
//! served at once, besides at most [`MAX_FOLLOWERS`] `events --follow`
//! streams (which stay open for as long as their clients like, and so must
//! not take the slots `reload` and `drain` need). Every request is checked
//! against the CLI's bounds ([`check_request`]), and a request whose client
//! left before it was answered is withdrawn, not applied.

use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{
    AsyncBufRead, AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader,
};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast};
use tokio::task::JoinSet;
use tokio::time::timeout;
use tracing::{debug, info, warn};

use super::{CtlError, Event, Request, Response, check_request, escape, parse_request};

/// Longest request line, bytes. Requests are tiny; this only stops a client
/// from making the daemon buffer without bound.
pub const MAX_LINE: usize = 64 * 1024;

/// A connection with no complete request for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A response (or streamed event) not accepted by the client within this
/// long closes the connection.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once; more are answered with an error and closed.
pub const MAX_CONNECTIONS: usize = 64;

/// `events --follow` streams at once, apart from [`MAX_CONNECTIONS`]: a
/// stream leaves its connection slot when it starts. More are answered with
/// an error and closed.
pub const MAX_FOLLOWERS: usize = 16;

/// How often a request waiting for its answer checks that its client is
/// still there.
const GONE_CHECK: Duration = Duration::from_millis(50);

/// Mode of the control socket without a `socket_group`: root only.
const MODE_PRIVATE: u32 = 0o600;
/// Mode with a `socket_group`: its members may connect too.
const MODE_GROUP: u32 = 0o660;

/// What [`Handler::handle`] returns.
pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = Response> + Send + 'a>>;

/// The daemon side of the protocol: answers requests.
pub trait Handler: Send + Sync + 'static {
    /// Answers one request. Never called with `Events { follow: true, .. }`:
    /// for those the server subscribes with [`Handler::subscribe_events`]
    /// first, then asks for the backlog with `follow: false` (so no event
    /// falls between the two), and streams the rest itself.
    fn handle(&self, req: Request) -> HandlerFuture<'_>;

    /// A receiver of every event from now on, for `events --follow`.
    fn subscribe_events(&self) -> broadcast::Receiver<Event>;
}

/// Creates the control socket at `path`: creates its parent directory,
/// replaces a stale socket left by a daemon that died (but refuses if a live
/// daemon answers on it), and sets mode 0600, or 0660 with group `group`.
/// Must be called within a tokio runtime.
pub fn bind(path: &Path, group: Option<&str>) -> Result<UnixListener, CtlError> {
    let io_err = |what, error| CtlError::Io {
        what,
        path: path.to_owned(),
        error,
    };
    // Resolve the group first: a typo should fail before anything is touched.
    let gid = match group {
        None => None,
        Some(name) => match nix::unistd::Group::from_name(name) {
            Ok(Some(g)) => Some(g.gid),
            Ok(None) => {
                return Err(CtlError::NoSuchGroup {
                    group: name.to_owned(),
                });
            }
            Err(e) => return Err(io_err("looking up the group of", io::Error::from(e))),
        },
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| CtlError::Io {
            what: "creating the directory",
            path: parent.to_owned(),
            error: e,
        })?;
        check_directory(parent)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => {
                    return Err(CtlError::AlreadyRunning {
                        path: path.to_owned(),
                    });
                }
                // Nobody listens: a daemon died without cleaning up.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    info!("removing stale control socket {}", path.display());
                    std::fs::remove_file(path)
                        .map_err(|e| io_err("removing the stale socket", e))?;
                }
                Err(e) => return Err(io_err("checking for a daemon on", e)),
            }
        }
        Ok(_) => {
            return Err(CtlError::NotASocket {
                path: path.to_owned(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("inspecting", e)),
    }

    let tmp = temporary_path(path);
    let bind_at = tmp.as_deref().unwrap_or(path);
    // A leftover from a crash between bind and rename: ours, by its name.
    let _ = std::fs::remove_file(bind_at);
    let listener = UnixListener::bind(bind_at).map_err(|e| io_err("binding", e))?;
    let finish = || -> Result<(), CtlError> {
        let mode = if gid.is_some() {
            MODE_GROUP
        } else {
            MODE_PRIVATE
        };
        std::fs::set_permissions(bind_at, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io_err("setting the mode of", e))?;
        if let Some(gid) = gid {
            nix::unistd::chown(bind_at, None, Some(gid))
                .map_err(|e| io_err("changing the group of", io::Error::from(e)))?;
        }
        if let Some(tmp) = &tmp {
            std::fs::rename(tmp, path).map_err(|e| io_err("renaming the socket into", e))?;
        }
        Ok(())
    };
    finish().inspect_err(|_| {
        let _ = std::fs::remove_file(bind_at);
    })?;
    Ok(listener)
}

/// The socket's directory must be ours (or root's) and not writable by
/// every user: whoever can write it can unlink the socket and bind their
/// own in its place, and the CLI would send drains and blocks to them and
/// print their answers. The sticky bit (`/tmp`) does not help: the name can
/// be taken before the daemon starts, or after it stops.
fn check_directory(dir: &Path) -> Result<(), CtlError> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(dir).map_err(|e| CtlError::Io {
        what: "inspecting the directory",
        path: dir.to_owned(),
        error: e,
    })?;
    let me = nix::unistd::geteuid().as_raw();
    let why = if meta.uid() != me && meta.uid() != 0 {
        format!("owned by uid {}", meta.uid())
    } else if meta.mode() & 0o002 != 0 {
        format!("writable by every user (mode {:o})", meta.mode() & 0o7777)
    } else {
        return Ok(());
    };
    Err(CtlError::UnsafeDirectory {
        dir: dir.to_owned(),
        why,
    })
}

/// A name next to `path` to bind under until the permissions are set, so
/// the socket never exists at `path` with the umask's mode. `None` if that
/// name would not fit `sun_path` (then `path` is bound directly; the window
/// is tiny and the umask usually keeps others out anyway).
fn temporary_path(path: &Path) -> Option<PathBuf> {
    let name = format!(".xlb-{}.sock.tmp", std::process::id());
    let tmp = path.with_file_name(name);
    (tmp.as_os_str().len() <= 107).then_some(tmp)
}

/// Serves connections on `listener` until the returned future is dropped
/// (which also closes every connection it accepted).
pub async fn serve(listener: UnixListener, handler: Arc<dyn Handler>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let followers = Arc::new(Semaphore::new(MAX_FOLLOWERS));
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match slots.clone().try_acquire_owned() {
                    Ok(permit) => {
                        let handler = handler.clone();
                        let followers = followers.clone();
                        // The connection gives its permit back when it
                        // ends, or when it becomes a stream.
                        connections.spawn(connection(stream, handler, permit, followers));
                    }
                    Err(_) => {
                        connections.spawn(async move {
                            let msg = format!(
                                "too many control connections ({MAX_CONNECTIONS}); try again"
                            );
                            let (_, mut wr) = stream.into_split();
                            let _ = write(&mut wr, &Response::error(msg)).await;
                        });
                    }
                },
                Err(e) => {
                    // E.g. EMFILE: back off instead of spinning.
                    warn!("control socket: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(done) = connections.join_next() => {
                if let Err(e) = done
                    && e.is_panic()
                {
                    warn!("control connection task panicked: {e}");
                }
            }
        }
    }
}

/// Reads one line into `buf` (without the newline), at most `max` bytes.
enum Line {
    /// A full line, or the last bytes before EOF.
    Complete,
    Eof,
    TooLong,
}

async fn read_line(
    rd: &mut (impl AsyncBufRead + Unpin),
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<Line> {
    loop {
        let avail = rd.fill_buf().await?;
        if avail.is_empty() {
            return Ok(if buf.is_empty() {
                Line::Eof
            } else {
                Line::Complete
            });
        }
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (avail.len(), false),
        };
        if buf.len() + take > max {
            return Ok(Line::TooLong);
        }
        buf.extend_from_slice(&avail[..take]);
        rd.consume(if done { take + 1 } else { take });
        if done {
            return Ok(Line::Complete);
        }
    }
}

async fn write(wr: &mut OwnedWriteHalf, resp: &Response) -> io::Result<()> {
    match timeout(WRITE_TIMEOUT, wr.write_all(resp.to_line().as_bytes())).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "client did not read its response",
        )),
    }
}

/// Whether the client closed its end entirely (POLLHUP: the kernel sets it
/// on a Unix stream socket once the peer's socket is released). A client
/// that only shut down its writing side (`socat` at the end of its input)
/// still waits for the answer, and is not gone.
fn client_gone(wr: &OwnedWriteHalf) -> bool {
    use std::os::fd::AsRawFd as _;
    let stream: &UnixStream = wr.as_ref();
    let mut fds = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call; timeout 0.
    let n = unsafe { libc::poll(&mut fds, 1, 0) };
    n > 0 && fds.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

/// The handler's answer to `req`, or `None` if the client goes away first:
/// then the handler's future is dropped, which withdraws the request (the
/// daemon's main loop skips a request nobody waits for). A client that gave
/// up (its timeout, Ctrl-C) must not see its drain or block applied later.
async fn answer(handler: &dyn Handler, req: Request, wr: &OwnedWriteHalf) -> Option<Response> {
    // Read after the client left (the daemon was busy, or stopped).
    if client_gone(wr) {
        return None;
    }
    let mut fut = handler.handle(req);
    let mut check = tokio::time::interval(GONE_CHECK);
    loop {
        tokio::select! {
            resp = &mut fut => return Some(resp),
            _ = check.tick() => if client_gone(wr) {
                return None;
            },
        }
    }
}

/// Reads the next request line into `buf`; `false` when the connection is
/// to close (idle, closed, unreadable, or a line too long, which is
/// answered first).
async fn next_line(
    rd: &mut BufReader<OwnedReadHalf>,
    wr: &mut OwnedWriteHalf,
    buf: &mut Vec<u8>,
    peer: &str,
) -> bool {
    match timeout(IDLE_TIMEOUT, read_line(rd, buf, MAX_LINE)).await {
        Err(_) => {
            debug!("control: closing idle connection of {peer}");
            false
        }
        Ok(Err(e)) => {
            debug!("control: reading from {peer}: {e}");
            false
        }
        Ok(Ok(Line::Eof)) => false,
        Ok(Ok(Line::TooLong)) => {
            // The rest of the line is unread: no way to find the next
            // request, so answer and close.
            let msg = format!("request longer than {MAX_LINE} bytes; closing the connection");
            let _ = write(wr, &Response::error(msg)).await;
            false
        }
        Ok(Ok(Line::Complete)) => true,
    }
}

async fn connection(
    stream: UnixStream,
    handler: Arc<dyn Handler>,
    slot: OwnedSemaphorePermit,
    followers: Arc<Semaphore>,
) {
    let peer = match stream.peer_cred() {
        Ok(c) => format!("uid {} pid {}", c.uid(), c.pid().unwrap_or(0)),
        Err(_) => "an unknown peer".to_owned(),
    };
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if !next_line(&mut rd, &mut wr, &mut buf, &peer).await {
            return;
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let req = match parse_request(&buf).and_then(|r| check_request(&r).map(|()| r)) {
            Ok(req) => req,
            Err(msg) => {
                // The message may quote what the client wrote.
                info!("control: refused a request of {peer}: {}", escape(&msg));
                if write(&mut wr, &Response::error(msg)).await.is_err() {
                    return;
                }
                continue;
            }
        };
        let what = escape(&req.to_string()).into_owned();
        if req.is_mutating() {
            info!("control: {what} requested by {peer}");
        } else {
            debug!("control: {what} requested by {peer}");
        }
        if let Request::Events {
            since_seq,
            follow: true,
        } = req
        {
            let Ok(stream_slot) = followers.try_acquire_owned() else {
                let msg = format!(
                    "too many `events --follow` streams ({MAX_FOLLOWERS}); close one, or \
                     ask for `events` without follow"
                );
                let _ = write(&mut wr, &Response::error(msg)).await;
                return;
            };
            drop(slot);
            follow(rd, wr, &*handler, since_seq).await;
            drop(stream_slot);
            return;
        }
        let Some(resp) = answer(&*handler, req, &wr).await else {
            info!("control: {what} of {peer} withdrawn: the client left before it was answered");
            return;
        };
        if write(&mut wr, &resp).await.is_err() {
            return;
        }
    }
}

/// Streams events until the client closes, the daemon stops, or the client
/// stops reading.
async fn follow(
    mut rd: BufReader<OwnedReadHalf>,
    mut wr: OwnedWriteHalf,
    handler: &dyn Handler,
    since_seq: Option<u64>,
) {
    let mut events = handler.subscribe_events();
    let mut last = since_seq;
    match handler
        .handle(Request::Events {
            since_seq,
            follow: false,
        })
        .await
    {
        Response::Events(backlog) => {
            for e in backlog {
                last = last.max(Some(e.seq));
                if write(&mut wr, &Response::Event(e)).await.is_err() {
                    return;
                }
            }
        }
        other => {
            let _ = write(&mut wr, &other).await;
            return;
        }
    }
    let mut scratch = [0u8; 512];
    loop {
        tokio::select! {
            received = events.recv() => {
                let resp = match received {
                    // Already sent with the backlog.
                    Ok(e) if last.is_some_and(|l| e.seq <= l) => continue,
                    Ok(e) => {
                        last = Some(e.seq);
                        Response::Event(e)
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => Response::error(format!(
                        "{n} events were skipped because this client read too slowly; \
                         `xlb events --since {}` lists them",
                        last.unwrap_or(0)
                    )),
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                if write(&mut wr, &resp).await.is_err() {
                    return;
                }
            }
            // Nothing more is expected from the client; a read returning
            // means it closed (or sent junk, which is ignored).
            n = rd.read(&mut scratch) => match n {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{sample_event, sample_report};
    use super::super::{Client, EventKind, parse_response};
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A unique, short directory under /tmp (sun_path is 108 bytes).
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            static N: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "xlb-ctl-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A handler that answers from fixed data and records mutating requests.
    struct Fake {
        events: broadcast::Sender<Event>,
        backlog: Vec<Event>,
        seen: Mutex<Vec<Request>>,
    }

    impl Fake {
        fn new(backlog: Vec<Event>) -> Arc<Self> {
            Arc::new(Fake {
                events: broadcast::channel(16).0,
                backlog,
                seen: Mutex::new(Vec::new()),
            })
        }
    }

    impl Handler for Fake {
        fn handle(&self, req: Request) -> HandlerFuture<'_> {
            Box::pin(async move {
                self.seen.lock().unwrap().push(req.clone());
                match req {
                    Request::Status => Response::Status(sample_report()),
                    Request::Events {
                        since_seq,
                        follow: false,
                    } => Response::Events(
                        self.backlog
                            .iter()
                            .filter(|e| since_seq.is_none_or(|s| e.seq > s))
                            .cloned()
                            .collect(),
                    ),
                    Request::Drain {
                        vip,
                        backend,
                        deadline_ms: None,
                    } => Response::ok(format!("drained {backend} of vip {vip}")),
                    Request::Drain {
                        vip,
                        backend,
                        deadline_ms: Some(ms),
                    } => Response::ok(format!("drained {backend} of vip {vip}, down in {ms} ms")),
                    other => Response::error(format!("fake cannot {other}")),
                }
            })
        }

        fn subscribe_events(&self) -> broadcast::Receiver<Event> {
            self.events.subscribe()
        }
    }

    fn start(dir: &TempDir, handler: Arc<Fake>) -> (PathBuf, tokio::task::JoinHandle<()>) {
        let path = dir.0.join("xlb.sock");
        let listener = bind(&path, None).unwrap();
        let task = tokio::spawn(serve(listener, handler));
        (path, task)
    }

    /// A raw connection, to send arbitrary bytes.
    struct Raw {
        rd: BufReader<OwnedReadHalf>,
        wr: OwnedWriteHalf,
    }

    impl Raw {
        async fn connect(path: &Path) -> Self {
            let (rd, wr) = UnixStream::connect(path).await.unwrap().into_split();
            Raw {
                rd: BufReader::new(rd),
                wr,
            }
        }

        async fn send(&mut self, bytes: &[u8]) {
            self.wr.write_all(bytes).await.unwrap();
        }

        async fn recv(&mut self) -> Option<Response> {
            let mut line = String::new();
            let n = timeout(Duration::from_secs(5), self.rd.read_line(&mut line))
                .await
                .expect("no answer within 5 s")
                .unwrap();
            (n > 0).then(|| parse_response(line.as_bytes()).unwrap())
        }
    }

    fn error_message(resp: Option<Response>) -> String {
        match resp {
            Some(Response::Error { message }) => message,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn requests_and_responses() {
        let dir = TempDir::new();
        let fake = Fake::new(vec![]);
        let (path, task) = start(&dir, fake.clone());
        let resp = super::super::request(&path, &Request::Status)
            .await
            .unwrap();
        assert_eq!(resp, Response::Status(sample_report()));
        let drain = Request::Drain {
            vip: "api".to_owned(),
            backend: "10.99.0.12:80".to_owned(),
            deadline_ms: None,
        };
        let resp = super::super::request(&path, &drain).await.unwrap();
        assert_eq!(resp, Response::ok("drained 10.99.0.12:80 of vip api"));
        let with_deadline = Request::Drain {
            vip: "api".to_owned(),
            backend: "10.99.0.12:80".to_owned(),
            deadline_ms: Some(300_000),
        };
        let resp = super::super::request(&path, &with_deadline).await.unwrap();
        assert_eq!(
            resp,
            Response::ok("drained 10.99.0.12:80 of vip api, down in 300000 ms")
        );
        assert_eq!(
            *fake.seen.lock().unwrap(),
            [Request::Status, drain, with_deadline]
        );
        task.abort();
    }

    #[tokio::test]
    async fn bad_lines_get_errors_and_the_connection_stays_usable() {
        let dir = TempDir::new();
        let (path, task) = start(&dir, Fake::new(vec![]));
        let mut c = Raw::connect(&path).await;
        let cases: &[(&str, &[u8], &str)] = &[
            ("bad json", b"{\"version\":1,\"command\":}\n", "column 24"),
            (
                "other version",
                b"{\"version\":7,\"command\":\"status\"}\n",
                "unsupported protocol version 7",
            ),
            (
                "unknown command",
                b"{\"version\":1,\"command\":\"restart\"}\n",
                "unknown command \"restart\"",
            ),
        ];
        for (name, line, want) in cases {
            c.send(line).await;
            let msg = error_message(c.recv().await);
            assert!(msg.contains(want), "{name}: {want:?} not in {msg:?}");
        }
        // Blank lines are skipped, and the connection still answers.
        c.send(b"\n\r\n{\"version\":1,\"command\":\"status\"}\n")
            .await;
        assert_eq!(c.recv().await, Some(Response::Status(sample_report())));
        // A last request without a newline is answered before the close.
        c.send(b"{\"version\":1,\"command\":\"status\"}").await;
        c.wr.shutdown().await.unwrap();
        assert_eq!(c.recv().await, Some(Response::Status(sample_report())));
        assert_eq!(c.recv().await, None);
        task.abort();
    }

    #[tokio::test]
    async fn overlong_lines_are_refused() {
        let dir = TempDir::new();
        let (path, task) = start(&dir, Fake::new(vec![]));
        let mut c = Raw::connect(&path).await;
        let long = vec![b'x'; MAX_LINE + 1];
        // The server may close before reading all of it.
        let _ = c.wr.write_all(&long).await;
        let msg = error_message(c.recv().await);
        assert!(msg.contains("longer than 65536 bytes"), "{msg}");
        assert_eq!(c.recv().await, None);
        task.abort();
    }

    #[tokio::test]
    async fn socket_mode_is_0600() {
        let dir = TempDir::new();
        let path = dir.0.join("sub/dir/xlb.sock");
        let _listener = bind(&path, None).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // Nothing but the socket is left in the directory.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["xlb.sock"]);
    }

    #[tokio::test]
    async fn socket_group_mode_is_0660() {
        let dir = TempDir::new();
        let path = dir.0.join("xlb.sock");
        // The primary group of the user running the tests: chown to it is
        // allowed without privileges.
        let gid = nix::unistd::getegid();
        let group = nix::unistd::Group::from_gid(gid).unwrap().unwrap();
        let _listener = bind(&path, Some(&group.name)).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o660);
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(meta.gid(), gid.as_raw());
    }

    #[tokio::test]
    async fn bind_refusals() {
        let dir = TempDir::new();
        let path = dir.0.join("xlb.sock");
        let err = bind(&path, Some("no-such-group-xlb-test")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "socket_group \"no-such-group-xlb-test\" does not exist; create it (groupadd \
             no-such-group-xlb-test), or remove daemon.socket_group to keep the control socket root-only"
        );
        assert!(
            !path.exists(),
            "nothing created before the group is checked"
        );

        let file = dir.0.join("file");
        std::fs::write(&file, "precious").unwrap();
        let err = bind(&file, None).unwrap_err();
        assert!(matches!(err, CtlError::NotASocket { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "precious");
    }

    #[tokio::test]
    async fn a_socket_directory_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = TempDir::new();
        let is_root = nix::unistd::geteuid().is_root();
        // (name, mode of the socket's directory, its owner, the refusal)
        let cases = [
            (
                "world-writable",
                0o777,
                None,
                Some("writable by every user (mode 777)"),
            ),
            (
                "world-writable and sticky, as /tmp",
                0o1777,
                None,
                Some("(mode 1777)"),
            ),
            (
                "another user's",
                0o755,
                Some(65534),
                Some("owned by uid 65534"),
            ),
            ("root's, group-writable", 0o775, None, None),
            ("root's", 0o755, None, None),
        ];
        for (i, (name, mode, owner, want)) in cases.into_iter().enumerate() {
            if owner.is_some() && !is_root {
                eprintln!("{name}: skipped, only root can give a directory away");
                continue;
            }
            let sub = dir.0.join(format!("d{i}"));
            std::fs::create_dir(&sub).unwrap();
            std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(mode)).unwrap();
            if let Some(uid) = owner {
                nix::unistd::chown(&sub, Some(nix::unistd::Uid::from_raw(uid)), None).unwrap();
            }
            let path = sub.join("xlb.sock");
            match (bind(&path, None), want) {
                (Ok(_), None) => assert!(path.exists(), "{name}"),
                (Err(e), Some(w)) => {
                    let msg = e.to_string();
                    assert!(msg.contains(w), "{name}: {msg}");
                    assert!(msg.contains("set daemon.control_socket"), "{name}: {msg}");
                    assert!(!path.exists(), "{name}: nothing bound");
                }
                (got, _) => panic!("{name}: {got:?}"),
            }
        }
    }

    #[tokio::test]
    async fn live_socket_is_not_taken_over_but_a_stale_one_is() {
        let dir = TempDir::new();
        let (path, task) = start(&dir, Fake::new(vec![]));
        let err = bind(&path, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "another xlb is running on {}; stop it, or give this one another daemon.control_socket",
                path.display()
            )
        );
        // The first daemon still answers.
        assert!(matches!(
            super::super::request(&path, &Request::Status).await,
            Ok(Response::Status(_))
        ));
        task.abort();
        let _ = task.await;

        // A socket file nobody listens on, as a killed daemon leaves.
        let stale = dir.0.join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        assert!(stale.exists());
        let listener = bind(&stale, None).unwrap();
        let task = tokio::spawn(serve(listener, Fake::new(vec![])));
        assert!(matches!(
            super::super::request(&stale, &Request::Status).await,
            Ok(Response::Status(_))
        ));
        task.abort();
    }

    #[tokio::test]
    async fn client_errors() {
        let dir = TempDir::new();
        let missing = dir.0.join("missing.sock");
        let err = super::super::request(&missing, &Request::Status)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "no xlb daemon listening on {}: is `xlb run` running? (--socket, --instance or --config to choose another)",
                missing.display()
            )
        );
        // A socket whose server accepts and never answers.
        let silent = dir.0.join("silent.sock");
        let _l = std::os::unix::net::UnixListener::bind(&silent).unwrap();
        let mut client = Client::connect(&silent).await.unwrap();
        client.send(&Request::Status).await.unwrap();
        let got = timeout(Duration::from_millis(200), client.recv()).await;
        assert!(got.is_err(), "recv waits for the daemon");
    }

    #[tokio::test]
    async fn follow_streams_backlog_then_new_events() {
        let dir = TempDir::new();
        let fake = Fake::new(vec![sample_event(1), sample_event(2), sample_event(3)]);
        let (path, task) = start(&dir, fake.clone());
        let mut client = Client::connect(&path).await.unwrap();
        client
            .send(&Request::Events {
                since_seq: Some(1),
                follow: true,
            })
            .await
            .unwrap();
        let mut seqs = vec![];
        for _ in 0..2 {
            match timeout(Duration::from_secs(5), client.recv())
                .await
                .unwrap()
                .unwrap()
            {
                Some(Response::Event(e)) => seqs.push(e.seq),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(seqs, [2, 3]);
        // The server subscribed before asking for the backlog, so a repeat of
        // seq 3 is skipped and new events follow in order.
        let mut start = sample_event(4);
        start.kind = EventKind::Start;
        for e in [sample_event(3), start.clone(), sample_event(5)] {
            fake.events.send(e).unwrap();
        }
        let mut got = vec![];
        for _ in 0..2 {
            match timeout(Duration::from_secs(5), client.recv())
                .await
                .unwrap()
                .unwrap()
            {
                Some(Response::Event(e)) => got.push(e),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(got, [start, sample_event(5)]);
        // Closing the client ends the stream: the server drops its receiver.
        drop(client);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while fake.events.receiver_count() > 0 {
            assert!(tokio::time::Instant::now() < deadline, "stream not ended");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The handler only ever saw the backlog request.
        assert_eq!(
            *fake.seen.lock().unwrap(),
            [Request::Events {
                since_seq: Some(1),
                follow: false
            }]
        );
        task.abort();
    }

    #[tokio::test]
    async fn slow_followers_are_told_what_they_missed() {
        let dir = TempDir::new();
        let fake = Fake::new(vec![]);
        let (path, task) = start(&dir, fake.clone());
        let mut client = Client::connect(&path).await.unwrap();
        client
            .send(&Request::Events {
                since_seq: None,
                follow: true,
            })
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while fake.events.receiver_count() == 0 {
            assert!(tokio::time::Instant::now() < deadline, "not subscribed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A burst larger than the channel (16) before the server can forward it.
        for seq in 1..=40 {
            fake.events.send(sample_event(seq)).unwrap();
        }
        let mut lagged = false;
        let mut last = 0;
        while last < 40 {
            match timeout(Duration::from_secs(5), client.recv())
                .await
                .unwrap()
                .unwrap()
            {
                Some(Response::Event(e)) => {
                    assert!(e.seq > last);
                    last = e.seq;
                }
                Some(Response::Error { message }) => {
                    assert!(message.contains("events were skipped"), "{message}");
                    lagged = true;
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(lagged, "a lag was reported");
        task.abort();
    }

    #[tokio::test]
    async fn stopping_the_server_closes_its_connections() {
        let dir = TempDir::new();
        let fake = Fake::new(vec![]);
        let (path, task) = start(&dir, fake.clone());
        let mut client = Client::connect(&path).await.unwrap();
        client
            .send(&Request::Events {
                since_seq: None,
                follow: true,
            })
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while fake.events.receiver_count() == 0 {
            assert!(tokio::time::Instant::now() < deadline, "not subscribed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        task.abort();
        let got = timeout(Duration::from_secs(5), client.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, None);
        assert_eq!(fake.events.receiver_count(), 0);
    }

    #[tokio::test]
    async fn requests_out_of_bounds_are_refused_before_the_handler() {
        let dir = TempDir::new();
        let fake = Fake::new(vec![]);
        let (path, task) = start(&dir, fake.clone());
        let mut raw = Raw::connect(&path).await;
        let block = |fields: &str| {
            format!(
                r#"{{"version":2,"command":"block","list":"deny","prefix":"192.0.2.7",{fields}}}"#
            )
        };
        let long = "x".repeat(201);
        // (name, line as a client other than the CLI may write it, error)
        let cases = [
            (
                "ttl 0",
                block(r#""ttl_ms":0"#),
                "ttl_ms: a TTL of 0 ms is out of range; use 1s to 30d",
            ),
            (
                "ttl u64::MAX",
                block(r#""ttl_ms":18446744073709551615"#),
                "ttl_ms: a TTL of 18446744073709551615 ms is out of range",
            ),
            (
                "reason with a newline",
                block(r#""reason":"x\n2026-12-03 INFO forged line""#),
                "the reason has control characters",
            ),
            (
                "reason of 201 characters",
                block(&format!(r#""reason":"{long}""#)),
                "the reason is 201 characters long; use at most 200",
            ),
            (
                "vip with an escape sequence",
                r#"{"version":2,"command":"drain","vip":"api\u001b[2J","backend":"10.0.0.1:80"}"#
                    .to_owned(),
                r"vip api\u{1b}[2J has control characters",
            ),
        ];
        for (name, line, want) in cases {
            raw.send(format!("{line}\n").as_bytes()).await;
            let msg = error_message(raw.recv().await);
            assert!(msg.starts_with(want), "{name}: {msg}");
        }
        assert_eq!(*fake.seen.lock().unwrap(), [], "the handler saw none");
        // The connection stays usable.
        raw.send(Request::Status.to_line().as_bytes()).await;
        assert_eq!(raw.recv().await, Some(Response::Status(sample_report())));
        task.abort();
    }

    /// Applies a request only once let through, and records what it applied.
    struct Gated {
        gate: Semaphore,
        waiting: AtomicU32,
        applied: Mutex<Vec<Request>>,
        events: broadcast::Sender<Event>,
    }

    impl Handler for Gated {
        fn handle(&self, req: Request) -> HandlerFuture<'_> {
            Box::pin(async move {
                self.waiting.fetch_add(1, Ordering::SeqCst);
                let _pass = self.gate.acquire().await.unwrap();
                self.applied.lock().unwrap().push(req);
                Response::ok("applied")
            })
        }

        fn subscribe_events(&self) -> broadcast::Receiver<Event> {
            self.events.subscribe()
        }
    }

    #[tokio::test]
    async fn a_request_whose_client_left_is_not_applied() {
        let dir = TempDir::new();
        let gated = Arc::new(Gated {
            gate: Semaphore::new(0),
            waiting: AtomicU32::new(0),
            applied: Mutex::new(vec![]),
            events: broadcast::channel(16).0,
        });
        let path = dir.0.join("xlb.sock");
        let task = tokio::spawn(serve(bind(&path, None).unwrap(), gated.clone()));
        let drain = |backend: &str| Request::Drain {
            vip: "api".to_owned(),
            backend: backend.to_owned(),
            deadline_ms: None,
        };
        // Left while its request waited for the daemon (a reload running).
        let mut raw = Raw::connect(&path).await;
        raw.send(drain("10.0.0.1:80").to_line().as_bytes()).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while gated.waiting.load(Ordering::SeqCst) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "never asked");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(raw);
        // Sent and closed at once: the server reads it after the client left.
        let mut gone = std::os::unix::net::UnixStream::connect(&path).unwrap();
        std::io::Write::write_all(&mut gone, drain("10.0.0.2:80").to_line().as_bytes()).unwrap();
        drop(gone);
        tokio::time::sleep(GONE_CHECK * 6).await;
        gated.gate.add_permits(10);
        // A client that waits gets its answer.
        let resp = super::super::request(&path, &drain("10.0.0.3:80"))
            .await
            .unwrap();
        assert_eq!(resp, Response::ok("applied"));
        assert_eq!(*gated.applied.lock().unwrap(), [drain("10.0.0.3:80")]);
        task.abort();
    }

    #[tokio::test]
    async fn a_client_that_only_stops_writing_still_gets_its_answer() {
        let dir = TempDir::new();
        let fake = Fake::new(vec![]);
        let (path, task) = start(&dir, fake.clone());
        let drain = Request::Drain {
            vip: "api".to_owned(),
            backend: "10.99.0.12:80".to_owned(),
            deadline_ms: None,
        };
        // As `echo '{...}' | socat - UNIX-CONNECT:/run/xlb/xlb.sock` does.
        let line = drain.to_line();
        let answer = tokio::task::spawn_blocking(move || {
            use std::io::{Read as _, Write as _};
            let mut c = std::os::unix::net::UnixStream::connect(&path).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            c.write_all(line.as_bytes()).unwrap();
            c.shutdown(std::net::Shutdown::Write).unwrap();
            let mut answer = String::new();
            c.read_to_string(&mut answer).unwrap();
            answer
        })
        .await
        .unwrap();
        assert_eq!(
            parse_response(answer.as_bytes()),
            Ok(Response::ok("drained 10.99.0.12:80 of vip api"))
        );
        assert_eq!(*fake.seen.lock().unwrap(), [drain]);
        task.abort();
    }

    #[tokio::test]
    async fn followers_cannot_take_the_slots_of_other_requests() {
        let dir = TempDir::new();
        let fake = Fake::new(vec![sample_event(1)]);
        let (path, task) = start(&dir, fake.clone());
        let follow = Request::Events {
            since_seq: None,
            follow: true,
        };
        let mut streams = vec![];
        for i in 0..MAX_CONNECTIONS {
            let mut c = Client::connect(&path).await.unwrap();
            c.send(&follow).await.unwrap();
            match timeout(Duration::from_secs(5), c.recv()).await.unwrap() {
                Ok(Some(Response::Event(_))) if i < MAX_FOLLOWERS => {}
                Ok(Some(Response::Error { message })) if i >= MAX_FOLLOWERS => assert!(
                    message.starts_with("too many `events --follow` streams (16)"),
                    "{i}: {message}"
                ),
                other => panic!("follower {i}: {other:?}"),
            }
            streams.push(c);
        }
        let drain = Request::Drain {
            vip: "api".to_owned(),
            backend: "10.99.0.12:80".to_owned(),
            deadline_ms: None,
        };
        let resp = super::super::request(&path, &drain).await.unwrap();
        assert_eq!(resp, Response::ok("drained 10.99.0.12:80 of vip api"));
        task.abort();
    }
}
