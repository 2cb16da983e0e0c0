use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use super::poll::poll;
use super::*;

fn ok(line: &[u8]) -> AgentReply {
    parse(line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
}

#[test]
fn every_word_is_understood_in_any_case() {
    let cases = [
        ("up", AgentWord::Up, AgentCondition::Normal),
        ("ready", AgentWord::Ready, AgentCondition::Normal),
        ("down", AgentWord::Down, AgentCondition::Down),
        ("fail", AgentWord::Fail, AgentCondition::Down),
        ("stopped", AgentWord::Stopped, AgentCondition::Down),
        ("drain", AgentWord::Drain, AgentCondition::Drain),
        ("maint", AgentWord::Maint, AgentCondition::Maint),
        ("DRAIN", AgentWord::Drain, AgentCondition::Drain),
        ("Maint", AgentWord::Maint, AgentCondition::Maint),
        ("UP", AgentWord::Up, AgentCondition::Normal),
    ];
    for (line, word, condition) in cases {
        let r = ok(line.as_bytes());
        assert_eq!(r.word, Some(word), "{line}");
        assert_eq!(word.condition(), condition, "{line}");
        assert_eq!(r.weight_percent, None, "{line}");
        assert!(r.ignored.is_empty(), "{line}");
    }
}

#[test]
fn combinations_weights_and_text() {
    let r = ok(b"75%, drain #deploy");
    assert_eq!(r.word, Some(AgentWord::Drain));
    assert_eq!(r.weight_percent, Some(75));
    assert_eq!(r.text.as_deref(), Some("deploy"));

    let r = ok(b"down#disk full");
    assert_eq!(r.word, Some(AgentWord::Down));
    assert_eq!(r.text.as_deref(), Some("disk full"));

    let r = ok(b"up\t50%\r");
    assert_eq!(r.word, Some(AgentWord::Up));
    assert_eq!(r.weight_percent, Some(50));
    assert_eq!(r.line, "up\\t50%", "CR dropped, tab escaped");

    // The most severe word decides, whatever the order.
    assert_eq!(ok(b"down up").word, Some(AgentWord::Down));
    assert_eq!(ok(b"up,drain").word, Some(AgentWord::Drain));
    assert_eq!(ok(b"maint drain").word, Some(AgentWord::Maint));

    // A weight alone changes no state; 0% is a weight too.
    let r = ok(b"0%");
    assert_eq!((r.word, r.weight_percent), (None, Some(0)));
    assert_eq!(ok(b"100%").weight_percent, Some(100));
    // Capped as HAProxy caps, even past u32.
    assert_eq!(ok(b"300%").weight_percent, Some(MAX_WEIGHT_PERCENT));
    assert_eq!(
        ok(b"99999999999999999999%").weight_percent,
        Some(MAX_WEIGHT_PERCENT)
    );
    // Empty text after '#' is no text.
    assert_eq!(ok(b"up #  ").text, None);
}

#[test]
fn unknown_words_are_ignored_and_shown() {
    let r = ok(b"up frobnicate -5% 1.5% %");
    assert_eq!(r.word, Some(AgentWord::Up));
    assert_eq!(r.weight_percent, None);
    assert_eq!(r.ignored, ["frobnicate", "-5%", "1.5%", "%"]);
}

#[test]
fn empty_and_malformed_lines_are_errors() {
    assert_eq!(parse(b""), Err(AgentError::Empty));
    assert_eq!(parse(b"\r"), Err(AgentError::Empty));
    let cases: [(&[u8], &str); 4] = [
        (b"hello", "hello"),
        (b" , \t", " , \\t"),
        (b"#just text", "#just text"),
        (b"HTTP/1.1 200 OK", "HTTP/1.1 200 OK"),
    ];
    for (line, shown) in cases {
        assert_eq!(
            parse(line),
            Err(AgentError::Malformed {
                line: shown.to_owned()
            }),
            "{line:?}"
        );
    }
    let e = parse(b"garbage\x1b[2J").unwrap_err();
    assert_eq!(e.code(), "agent_malformed");
    assert_eq!(
        e.to_string(),
        "no word of the agent protocol in \"garbage\\u{1b}[2J\""
    );
}

#[test]
fn hostile_bytes_are_escaped_never_passed_raw() {
    let r = ok(b"down #\x1b[31mred\x07\x00 \xff\xfe ok \xc3\xa9\nfake log line");
    assert_eq!(r.word, Some(AgentWord::Down));
    let text = r.text.unwrap();
    assert_eq!(
        text,
        "\\u{1b}[31mred\\u{7}\\u{0} \\xff\\xfe ok \u{e9}\\nfake log line"
    );
    assert!(!text.chars().any(char::is_control), "{text}");
    assert!(!r.line.chars().any(char::is_control), "{}", r.line);
    // Non-UTF-8 in the words: an ignored word, escaped.
    let r = ok(b"up \xff\x1b");
    assert_eq!(r.ignored, ["\\xff\\u{1b}"]);
    assert_eq!(escape(b"plain"), "plain");
}

#[test]
fn status_is_sticky_and_reports_only_changes() {
    let t = Instant::now();
    let mut s = AgentStatus::default();
    assert_eq!(s.weight_percent, 100);
    assert!(s.record(parse(b"drain #deploy"), t));
    assert_eq!(s.condition, AgentCondition::Drain);
    assert_eq!(s.says(), "agent says \"drain\" (deploy)");
    assert!(!s.record(parse(b"drain #deploy"), t), "same answer again");
    // A weight alone keeps the drain; the text stays the drain's.
    assert!(s.record(parse(b"50%"), t));
    assert_eq!((s.condition, s.weight_percent), (AgentCondition::Drain, 50));
    assert_eq!(s.text.as_deref(), Some("deploy"));
    // An error changes nothing but the error.
    assert!(s.record(Err(AgentError::Refused), t));
    assert_eq!((s.condition, s.weight_percent), (AgentCondition::Drain, 50));
    assert!(!s.record(Err(AgentError::Refused), t));
    assert_eq!((s.polls, s.errors), (5, 2));
    // `ready` undoes the drain and clears the error; the weight stands.
    assert!(s.record(parse(b"ready"), t));
    assert_eq!(
        (s.condition, s.weight_percent),
        (AgentCondition::Normal, 50)
    );
    assert_eq!(s.error, None);
}

#[test]
fn errors_have_codes_and_operator_text() {
    let cases = [
        (
            AgentError::Refused,
            "agent_refused",
            "unreachable (connection refused): is the agent running?",
        ),
        (
            AgentError::ConnectTimeout {
                timeout: Duration::from_secs(1),
            },
            "agent_connect_timeout",
            "unreachable (no connection within 1s)",
        ),
        (
            AgentError::NoAnswer {
                timeout: Duration::from_millis(300),
            },
            "agent_no_answer",
            "connected, no complete line within 300ms",
        ),
        (
            AgentError::TooLong,
            "agent_line_too_long",
            "no end of line within 256 bytes",
        ),
        (AgentError::Empty, "agent_empty", "closed without an answer"),
    ];
    for (e, code, text) in cases {
        assert_eq!((e.code(), e.to_string().as_str()), (code, text));
    }
}

/// An agent on 127.0.0.1 answering each connection with `answer` (after
/// reading `expect` bytes, if any), then closing; returns its port.
async fn agent_server(answer: &'static [u8], expect: usize, hang: bool) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut got = vec![0u8; expect];
                if expect > 0 && s.read_exact(&mut got).await.is_err() {
                    return;
                }
                if hang {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                let _ = s.write_all(answer).await;
            });
        }
    });
    port
}

fn check(port: u16, send: &[u8]) -> AgentCheck {
    AgentCheck {
        port,
        interval: Duration::from_secs(1),
        timeout: Duration::from_millis(300),
        send: send.to_vec(),
    }
}

async fn poll_port(port: u16, send: &[u8]) -> Result<AgentReply, AgentError> {
    poll(([127, 0, 0, 1], port).into(), &check(port, send)).await
}

#[tokio::test]
async fn poll_reads_one_line_sends_first_and_is_bounded() {
    let port = agent_server(b"75% drain #deploy\r\nignored second line\n", 0, false).await;
    let r = poll_port(port, b"").await.unwrap();
    assert_eq!(
        (r.word, r.weight_percent),
        (Some(AgentWord::Drain), Some(75))
    );

    // agent_send is sent before reading (the server waits for 5 bytes).
    let port = agent_server(b"up", 5, false).await;
    assert_eq!(
        poll_port(port, b"ping\n").await.unwrap().word,
        Some(AgentWord::Up)
    );

    let port = agent_server(b"", 0, false).await;
    assert_eq!(poll_port(port, b"").await, Err(AgentError::Empty));

    static LONG: [u8; 600] = [b'u'; 600];
    let port = agent_server(&LONG, 0, false).await;
    assert_eq!(poll_port(port, b"").await, Err(AgentError::TooLong));

    let port = agent_server(b"up\n", 0, true).await;
    let started = Instant::now();
    assert_eq!(
        poll_port(port, b"").await,
        Err(AgentError::NoAnswer {
            timeout: Duration::from_millis(300)
        })
    );
    assert!(started.elapsed() < Duration::from_secs(2));

    // Nothing listens: refused.
    let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    assert_eq!(poll_port(port, b"").await, Err(AgentError::Refused));
}

#[test]
fn status_for_the_cli_and_events() {
    let t = Instant::now();
    let mut s = AgentStatus::default();
    s.record(parse(b"75% drain #deploy\x1b[0m"), t);
    s.record(Err(AgentError::Refused), t);
    let c = s.to_ctl(|_| 42);
    assert_eq!(c.state, "drain");
    assert_eq!(c.word.as_deref(), Some("drain"));
    assert_eq!(c.text.as_deref(), Some("deploy\\u{1b}[0m"));
    assert_eq!(c.weight_percent, 75);
    assert_eq!(c.error_code.as_deref(), Some("agent_refused"));
    assert_eq!((c.answered_unix_ms, c.polls, c.errors), (Some(42), 2, 1));
    assert_eq!(
        s.change_text(),
        "agent says \"75% drain #deploy\\u{1b}[0m\"; weight 75%; last poll: unreachable \
         (connection refused): is the agent running? (its last words stand)"
    );
    let json = serde_json::to_string(&c).unwrap();
    assert!(!json.contains('\x1b'), "{json}");
}

#[test]
fn changes_are_what_the_agent_says_not_its_counters() {
    let t = Instant::now();
    let mut a = AgentStatus::default();
    a.record(parse(b"up"), t);
    let mut b = a.clone();
    b.record(parse(b"up"), t);
    assert_eq!(b.polls, 2);
    assert_eq!(AgentChange::between(Some(&a), Some(&b)), None);
    b.record(parse(b"maint #disk"), t);
    let c = AgentChange::between(Some(&a), Some(&b)).unwrap();
    assert_eq!((c.from, c.to), ("normal", "maint"));
    assert_eq!(c.text, "agent says \"maint #disk\"");
    let gone = AgentChange::between(Some(&b), None).unwrap();
    assert_eq!(
        (gone.from, gone.to, gone.text.as_str()),
        ("maint", "none", "agent check removed")
    );
    assert_eq!(AgentChange::between(None, None), None);
}
