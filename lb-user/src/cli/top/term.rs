//! `xlb top`'s I/O: the terminal (raw mode, the alternate screen, always
//! restored), the keyboard (crossterm, on a thread of its own) and the
//! control socket, polled every interval.

use std::io::{self, IsTerminal as _, Stdout};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use crossterm::cursor::{Hide, Show};
use crossterm::event::{self, Event as TermEvent};
use crossterm::execute;
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use super::TopArgs;
use super::keys::{Action, ViewState};
use super::model::Model;
use super::poll::{self, Liveness};
use super::view::{self, Screen};
use crate::ctl;

/// `xlb top`: runs until a quit key, SIGTERM or SIGHUP (`Ok`), or until the
/// daemon is gone (`Err` with why, once the terminal is restored).
///
/// # Errors
/// Stdout is not a terminal, the daemon does not answer (at start, or for
/// [`super::GIVE_UP`]), or the terminal fails.
pub async fn run(socket: &Path, args: &TopArgs) -> anyhow::Result<()> {
    if !io::stdout().is_terminal() {
        bail!(
            "xlb top draws on a terminal and stdout is not one; use `xlb status --watch` \
             for a refreshing plain table, or `xlb status --json`"
        );
    }
    let mut top = Top {
        socket,
        interval: args.interval,
        model: Model::default(),
        view: ViewState {
            filter: args.vip.clone(),
            ..ViewState::default()
        },
        liveness: Liveness::default(),
        problem: None,
        started: Instant::now(),
    };
    // Before taking the screen, so that a wrong --socket is said plainly.
    top.refresh().await.map_err(anyhow::Error::msg)?;
    let mut guard = TerminalGuard::enter()?;
    let result = top.event_loop(&mut guard.terminal).await;
    drop(guard);
    result
}

struct Top<'a> {
    socket: &'a Path,
    interval: Duration,
    model: Model,
    view: ViewState,
    liveness: Liveness,
    /// Shown in the footer while the daemon does not answer.
    problem: Option<String>,
    /// The origin of the snapshots' clock.
    started: Instant,
}

impl Top<'_> {
    /// Asks for the status and the new events; `Err` when it is time to
    /// give up on the daemon.
    async fn refresh(&mut self) -> Result<(), String> {
        let answer = async {
            let report = poll::status(self.socket).await?;
            self.model.push_status(report, self.started.elapsed());
            let events = poll::events(self.socket, self.model.since_seq()).await?;
            self.model.push_events(events);
            Ok::<_, String>(())
        };
        match answer.await {
            Ok(()) => {
                self.liveness.ok();
                self.problem = None;
            }
            Err(e) => self.problem = Some(self.liveness.failed(&e, Instant::now())?),
        }
        Ok(())
    }

    fn draw(&self, terminal: &mut Terminal<CrosstermBackend<Stdout>>) -> anyhow::Result<()> {
        let socket = self.socket.display().to_string();
        let screen = Screen {
            model: &self.model,
            view: &self.view,
            now_unix_ms: ctl::now_unix_ms(),
            interval: self.interval,
            socket: &socket,
            problem: self.problem.as_deref(),
        };
        terminal
            .draw(|f| view::draw(f, &screen))
            .context("drawing on the terminal")?;
        Ok(())
    }

    async fn event_loop(
        &mut self,
        terminal: &mut Terminal<CrosstermBackend<Stdout>>,
    ) -> anyhow::Result<()> {
        let (keys, stop) = spawn_key_reader();
        let _stop = StopOnDrop(stop);
        let mut keys = keys;
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The first tick is now: the status is fresh from `run`.
        ticker.tick().await;
        let mut term = signal(SignalKind::terminate()).context("catching SIGTERM")?;
        let mut hup = signal(SignalKind::hangup()).context("catching SIGHUP")?;
        loop {
            self.draw(terminal)?;
            tokio::select! {
                _ = ticker.tick() => {
                    if !self.view.paused {
                        self.refresh().await.map_err(anyhow::Error::msg)?;
                    }
                }
                key = keys.recv() => match key {
                    Some(Ok(TermEvent::Key(k))) => {
                        match self.view.on_key(k, &self.model.vip_names()) {
                            Action::Quit => return Ok(()),
                            Action::Refresh => {
                                self.refresh().await.map_err(anyhow::Error::msg)?;
                                ticker.reset();
                            }
                            Action::Redraw => {}
                        }
                    }
                    // A resize, focus, mouse: the next draw fits the new size.
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e).context("reading the keyboard"),
                    None => bail!("the keyboard reader stopped"),
                },
                _ = term.recv() => return Ok(()),
                _ = hup.recv() => return Ok(()),
            }
        }
    }
}

/// How often the key reader looks at its stop flag.
const KEY_POLL: Duration = Duration::from_millis(100);

/// Reads terminal events on a thread (crossterm's reads block) until
/// stopped or the channel closes.
fn spawn_key_reader() -> (
    mpsc::UnboundedReceiver<io::Result<TermEvent>>,
    Arc<AtomicBool>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    std::thread::spawn(move || {
        while !flag.load(Ordering::Relaxed) {
            let next = match event::poll(KEY_POLL) {
                Ok(false) => continue,
                Ok(true) => event::read(),
                Err(e) => Err(e),
            };
            let failed = next.is_err();
            if tx.send(next).is_err() || failed {
                break;
            }
        }
    });
    (rx, stop)
}

/// Stops the key reader, so that it does not read what the shell gets
/// after `top` returns.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Whether the terminal is in `top`'s mode (raw, alternate screen).
static TAKEN: AtomicBool = AtomicBool::new(false);

/// Holds the terminal in raw mode on the alternate screen, and gives it
/// back when dropped, on any return path and on an unwinding panic; a
/// panic hook gives it back first, so that the panic's message lands on the
/// normal screen (and also under `panic = "abort"`).
struct TerminalGuard {
    terminal: Terminal<CrosstermBackend<Stdout>>,
}

impl TerminalGuard {
    fn enter() -> anyhow::Result<Self> {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
                previous(info);
            }));
        });
        // Marked first: a failure half-way still restores what was done.
        TAKEN.store(true, Ordering::SeqCst);
        let taken = (|| {
            enable_raw_mode()?;
            execute!(io::stdout(), EnterAlternateScreen, Hide)?;
            Terminal::new(CrosstermBackend::new(io::stdout()))
        })();
        match taken {
            Ok(terminal) => Ok(TerminalGuard { terminal }),
            Err(e) => {
                restore();
                Err(e).context("setting up the terminal")
            }
        }
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}

/// Leaves raw mode and the alternate screen and shows the cursor, once.
fn restore() {
    if TAKEN.swap(false, Ordering::SeqCst) {
        // Nothing better to do with an error here: the terminal is what
        // it is, and the process is on its way out.
        let _ = disable_raw_mode();
        let _ = execute!(io::stdout(), LeaveAlternateScreen, Show);
    }
}
