//! The connection an HTTP probe talks over: plain TCP (`kind = "http"`) or
//! TLS on TCP (`kind = "https"`). The exchange itself is generic over the
//! stream; this type is what a kept connection (`reuse_connection`) is
//! stored as between probes, whichever it is.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::tls::TlsStream;

pub(super) enum ProbeStream {
    Tcp(TcpStream),
    /// Boxed: a rustls client connection is some kilobytes of state.
    Tls(Box<TlsStream>),
}

impl From<TcpStream> for ProbeStream {
    fn from(stream: TcpStream) -> Self {
        Self::Tcp(stream)
    }
}

impl From<TlsStream> for ProbeStream {
    fn from(stream: TlsStream) -> Self {
        Self::Tls(Box::new(stream))
    }
}

impl ProbeStream {
    pub(super) fn is_tls(&self) -> bool {
        matches!(self, Self::Tls(_))
    }

    /// Whether the idle connection is still open and nothing came on it:
    /// one read that must not block. On TLS, records that carry no data
    /// for the application (session tickets, a key update) are consumed
    /// by rustls and leave the connection quiet; a `close_notify`, a FIN,
    /// an RST or application bytes nobody asked for do not. A read that
    /// took bytes leaves the connection unusable, and it is dropped.
    pub(super) fn is_quiet(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        let mut byte = [0u8; 1];
        let mut buf = ReadBuf::new(&mut byte);
        Pin::new(self).poll_read(&mut cx, &mut buf).is_pending()
    }
}

impl AsyncRead for ProbeStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ProbeStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
