//! The cost figure's backends: `--serve N` makes this benchmark a process
//! of N minimal HTTP servers, so that the prober's CPU time is its own.

use std::{
    io::{self, BufRead as _, Write as _},
    net::Ipv4Addr,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use anyhow::{Context as _, Result, ensure};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    time::{sleep, timeout},
};

/// The server child exits when its stdin closes (the parent is done or dead),
/// and in any case after this long.
const SERVE_LIMIT: Duration = Duration::from_secs(600);

/// How long the server child waits for a request head before dropping it.
const SERVE_REQUEST_WAIT: Duration = Duration::from_secs(2);

/// The answer of the cost figure's servers, as small as a real `/health`,
/// to a request that asked to close (a new connection per probe).
const HEALTH_RESPONSE_CLOSE: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nok";

/// The same answer on a kept-alive connection (`reuse_connection`).
const HEALTH_RESPONSE_KEEP: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok";

/// How long the server child keeps an idle kept-alive connection, as a
/// web server's keep-alive timeout (nginx: 75 s).
const SERVE_IDLE_LIMIT: Duration = Duration::from_secs(75);

/// Responses written so far, all listeners together.
static SERVED: AtomicU64 = AtomicU64::new(0);

/// The line on stdin that asks for [`SERVED`]; the answer is `served N`.
pub(super) const SERVED_QUERY: &str = "served";

/// `--serve N`: N HTTP listeners on 127.0.0.1 that answer any request with
/// 200, and close unless it is HTTP/1.1 without `Connection: close`. Prints
/// `ports P1 P2 …` once they are bound, then serves until stdin closes (at
/// most `SERVE_LIMIT`), answering each `served` line on stdin with the
/// responses written so far: a count of checks that needs nothing from
/// the checker (HAProxy's are counted so).
pub(super) fn serve_main(n: usize) -> Result<()> {
    ensure!(n > 0, "--serve needs at least one listener");
    // One thread: the server's CPU must not crowd out the prober it serves.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the server's Tokio runtime")?;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    // A std thread, not tokio's stdin: it must not keep the runtime from
    // shutting down if the limit passes first.
    std::thread::spawn(move || {
        for line in io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if line.trim() == SERVED_QUERY {
                let mut out = io::stdout().lock();
                let served = SERVED.load(Ordering::Relaxed);
                if writeln!(out, "{SERVED_QUERY} {served}")
                    .and_then(|()| out.flush())
                    .is_err()
                {
                    break;
                }
            }
        }
        let _ = done_tx.send(());
    });
    let result = runtime.block_on(async move {
        let mut ports = Vec::with_capacity(n);
        for i in 0..n {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .await
                .with_context(|| format!("listener {} of {n}: binding 127.0.0.1:0", i + 1))?;
            ports.push(listener.local_addr()?.port().to_string());
            tokio::spawn(accept_loop(listener));
        }
        let mut out = io::stdout().lock();
        writeln!(out, "ports {}", ports.join(" ")).context("writing the port list")?;
        out.flush().context("writing the port list")?;
        drop(out);
        let _ = timeout(SERVE_LIMIT, done_rx).await;
        anyhow::Ok(())
    });
    runtime.shutdown_background();
    result
}

async fn accept_loop(listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(answer(stream));
            }
            // EMFILE and friends: back off instead of spinning.
            Err(_) => sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn answer(mut stream: TcpStream) {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let mut wait = SERVE_REQUEST_WAIT;
    loop {
        let request = async {
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                if buf.len() > 8 * 1024 {
                    return false;
                }
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return false,
                    Ok(k) => buf.extend_from_slice(&chunk[..k]),
                }
            }
            true
        };
        if !matches!(timeout(wait, request).await, Ok(true)) {
            return;
        }
        let close = buf
            .to_ascii_lowercase()
            .windows(17)
            .any(|w| w == b"connection: close");
        buf.clear();
        if close {
            if stream.write_all(HEALTH_RESPONSE_CLOSE).await.is_ok() {
                SERVED.fetch_add(1, Ordering::Relaxed);
                let _ = stream.shutdown().await;
            }
            return;
        }
        if stream.write_all(HEALTH_RESPONSE_KEEP).await.is_err() {
            return;
        }
        SERVED.fetch_add(1, Ordering::Relaxed);
        wait = SERVE_IDLE_LIMIT;
    }
}
