//! One poll of an agent: connect, send `agent_send` if any, read one line
//! (at most [`MAX_LINE`] bytes), close; all within `agent_timeout`.

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{Instant, timeout_at};

use super::{AgentCheck, AgentError, AgentReply, MAX_LINE, parse};

/// Polls the agent at `addr` (the backend's address and `agent_port`).
pub async fn poll(addr: SocketAddr, agent: &AgentCheck) -> Result<AgentReply, AgentError> {
    let deadline = Instant::now() + agent.timeout;
    let mut stream = match timeout_at(deadline, connect(addr)).await {
        Err(_elapsed) => {
            return Err(AgentError::ConnectTimeout {
                timeout: agent.timeout,
            });
        }
        Ok(stream) => stream?,
    };
    let no_answer = AgentError::NoAnswer {
        timeout: agent.timeout,
    };
    if !agent.send.is_empty() {
        timeout_at(deadline, stream.write_all(&agent.send))
            .await
            .map_err(|_| no_answer.clone())?
            .map_err(|e| io_fail(e, "sending agent_send"))?;
    }
    let line = timeout_at(deadline, read_line(&mut stream))
        .await
        .map_err(|_| no_answer)??;
    parse(&line)
}

async fn connect(addr: SocketAddr) -> Result<TcpStream, AgentError> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4(),
        SocketAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(|e| io_fail(e, "creating a socket"))?;
    // Closed with RST, as the main probe closes: the answer is in when we
    // close, and a TIME_WAIT socket per poll would only cost ports.
    socket
        .set_zero_linger()
        .map_err(|e| io_fail(e, "creating a socket"))?;
    socket
        .connect(addr)
        .await
        .map_err(|e| io_fail(e, "connecting"))
}

/// Reads up to the first `\n` (excluded), or to the end of the stream,
/// never more than [`MAX_LINE`] bytes.
async fn read_line(stream: &mut TcpStream) -> Result<Vec<u8>, AgentError> {
    let mut buf = vec![0u8; MAX_LINE];
    let mut len = 0;
    loop {
        if let Some(end) = buf[..len].iter().position(|&b| b == b'\n') {
            buf.truncate(end);
            return Ok(buf);
        }
        if len == MAX_LINE {
            return Err(AgentError::TooLong);
        }
        let n = stream
            .read(&mut buf[len..])
            .await
            .map_err(|e| io_fail(e, "reading the agent's line"))?;
        if n == 0 {
            // HAProxy takes a line ended by the close as well.
            buf.truncate(len);
            return if len == 0 {
                Err(AgentError::Empty)
            } else {
                Ok(buf)
            };
        }
        len += n;
    }
}

/// Out of descriptors, ports, buffers or memory (the prober's own list),
/// or no route from this host: this host, not the agent.
fn is_local(e: &io::Error) -> bool {
    e.raw_os_error()
        .is_some_and(|n| crate::health::probe::is_local_errno(n) || n == libc::ENETUNREACH)
}

fn io_fail(e: io::Error, during: &'static str) -> AgentError {
    if is_local(&e) {
        return AgentError::Local {
            during,
            error: e.to_string(),
        };
    }
    match e.kind() {
        io::ErrorKind::ConnectionRefused => AgentError::Refused,
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => AgentError::Reset,
        _ => AgentError::Io {
            during,
            error: e.to_string(),
        },
    }
}
