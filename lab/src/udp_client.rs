//! A small UDP client for the lab: many flows (one socket, so one source
//! port, each) to one target, opened inside a namespace, and a round of
//! questions over any of them that collects which backend answered each
//! (the lab backends' UDP echo answers `<name> <payload>`, see
//! `backend::serve_udp`).

use std::{
    collections::BTreeMap,
    io,
    net::{SocketAddr, UdpSocket},
    sync::atomic::{AtomicU64, Ordering},
    thread,
    time::{Duration, Instant},
};

use crate::topology::{LabError, in_netns};

/// How often a round looks at its sockets for answers.
const SWEEP: Duration = Duration::from_millis(2);

/// Makes every round's payloads unique, so a late answer to an earlier
/// round is never taken for an answer to this one.
static ROUND: AtomicU64 = AtomicU64::new(1);

/// One UDP flow: a socket connected to the target, so its 5-tuple is fixed.
#[derive(Debug)]
pub struct UdpFlow {
    sock: UdpSocket,
    /// The client address and source port of the flow.
    pub local: SocketAddr,
    pub target: SocketAddr,
}

/// Opens `n` flows from namespace `ns` to `target` (sockets keep the
/// namespace they were created in, so they can be used from any thread).
pub fn open_flows(ns: &str, target: SocketAddr, n: usize) -> Result<Vec<UdpFlow>, LabError> {
    let open = || -> io::Result<Vec<UdpFlow>> {
        let any: SocketAddr = if target.is_ipv4() {
            "0.0.0.0:0".parse().expect("literal")
        } else {
            "[::]:0".parse().expect("literal")
        };
        (0..n)
            .map(|_| {
                let sock = UdpSocket::bind(any)?;
                sock.connect(target)?;
                sock.set_nonblocking(true)?;
                Ok(UdpFlow {
                    local: sock.local_addr()?,
                    sock,
                    target,
                })
            })
            .collect()
    };
    in_netns(ns, open)?.map_err(|source| LabError::Io {
        what: format!("opening {n} UDP sockets to {target} in namespace {ns}"),
        source,
    })
}

/// Sends one question on every flow of `flows` and collects the answers
/// for up to `timeout`, sending again to the flows without one every
/// `timeout / (resends + 1)`. The result is, per flow in order, the name of
/// the backend that answered (`None`: no answer in time). Other answers
/// (late ones to earlier rounds, garbage) are skipped.
pub fn ask(flows: &[&UdpFlow], timeout: Duration, resends: u32) -> Vec<Option<String>> {
    let round = ROUND.fetch_add(1, Ordering::Relaxed);
    let payloads: Vec<String> = (0..flows.len()).map(|i| format!("q{round}.{i}")).collect();
    let mut answers: Vec<Option<String>> = vec![None; flows.len()];
    let start = Instant::now();
    let resend_every = timeout / (resends + 1);
    let mut sent_at: Option<Instant> = None;
    let mut buf = [0u8; 2048];
    while start.elapsed() < timeout {
        if sent_at.is_none_or(|t| t.elapsed() >= resend_every) {
            for (i, f) in flows.iter().enumerate() {
                if answers[i].is_none() {
                    // A lost send is a missing answer, which the round shows.
                    let _ = f.sock.send(payloads[i].as_bytes());
                }
            }
            sent_at = Some(Instant::now());
        }
        for (i, f) in flows.iter().enumerate() {
            // Drain what arrived; errors (an ICMP error reported on a
            // connected socket, EAGAIN) just mean no answer yet.
            while answers[i].is_none()
                && let Ok(n) = f.sock.recv(&mut buf)
            {
                answers[i] = parse_answer(&buf[..n], &payloads[i]);
            }
        }
        if answers.iter().all(Option::is_some) {
            break;
        }
        thread::sleep(SWEEP);
    }
    answers
}

/// The backend name of an answer `<name> <payload>` to `payload`.
pub fn parse_answer(datagram: &[u8], payload: &str) -> Option<String> {
    let text = std::str::from_utf8(datagram).ok()?;
    let (name, echoed) = text.split_once(' ')?;
    (echoed == payload && !name.is_empty()).then(|| name.to_string())
}

/// How many answers each backend gave (unanswered flows under `None`).
pub fn tally(answers: &[Option<String>]) -> BTreeMap<Option<String>, usize> {
    let mut t = BTreeMap::new();
    for a in answers {
        *t.entry(a.clone()).or_default() += 1;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_matched_to_their_question() {
        let cases = [
            ("its answer", &b"b2 q7.3"[..], "q7.3", Some("b2")),
            ("an earlier round's", b"b2 q6.3", "q7.3", None),
            ("no name", b" q7.3", "q7.3", None),
            ("no space", b"b2q7.3", "q7.3", None),
            ("not text", b"\xff\xfe q7.3", "q7.3", None),
        ];
        for (name, datagram, payload, want) in cases {
            assert_eq!(parse_answer(datagram, payload).as_deref(), want, "{name}");
        }
    }
}
