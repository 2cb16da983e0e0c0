//! `xlb top`'s screen: ratatui widgets drawn from the [`Model`] and the
//! [`ViewState`]. Tested against `ratatui::backend::TestBackend`.

use std::time::Duration;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, Wrap};

use super::keys::{HELP, ViewState};
use super::model::{BackendRow, Model, Rates, VipRow};
use crate::cli::{self as cli_text, latency, rate, span, state_style};

/// Smallest terminal the view fits in: the backend table's fixed columns
/// and a few rows of each part.
pub const MIN_WIDTH: u16 = 80;
pub const MIN_HEIGHT: u16 = 16;

/// Rows of the events box (its borders included).
const EVENTS_HEIGHT: u16 = 8;

/// Everything one frame shows.
pub struct Screen<'a> {
    pub model: &'a Model,
    pub view: &'a ViewState,
    pub now_unix_ms: u64,
    pub interval: Duration,
    /// The control socket, for the first frame and for messages.
    pub socket: &'a str,
    /// Why the last poll failed (the daemon not answering), if it did.
    pub problem: Option<&'a str>,
}

/// Draws the whole screen, or says the terminal is too small.
pub fn draw(frame: &mut Frame, s: &Screen) {
    let area = frame.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let text = format!(
            "terminal too small: {}x{}; xlb top needs at least {MIN_WIDTH}x{MIN_HEIGHT} \
             (columns x rows). Enlarge it, or press q to quit.",
            area.width, area.height
        );
        frame.render_widget(Paragraph::new(text).wrap(Wrap { trim: true }), area);
        return;
    }
    let filter = s.view.filter.as_deref();
    let vips = s.model.vip_rows(filter);
    let vip_height = (vips.len().max(1) as u16 + 3).min(area.height / 3);
    let [header, vip_area, backend_area, events_area, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(vip_height),
        Constraint::Min(4),
        Constraint::Length(EVENTS_HEIGHT),
        Constraint::Length(1),
    ])
    .areas(area);
    frame.render_widget(header_line(s), header);
    frame.render_widget(vip_table(&vips, s), vip_area);
    let backends = s.model.backend_rows(filter, s.view.sort, s.now_unix_ms);
    frame.render_widget(backend_table(&backends, s), backend_area);
    render_events(frame, events_area, s);
    frame.render_widget(footer_line(s), footer);
}

fn bold() -> Style {
    Style::new().add_modifier(Modifier::BOLD)
}

/// The CLI's state colours (`xlb status`), in ratatui's terms.
fn color_of(state: &str) -> Style {
    let fg = match state_style(state) {
        cli_text::Style::Green => Color::Green,
        cli_text::Style::Red => Color::Red,
        cli_text::Style::Yellow => Color::Yellow,
        cli_text::Style::Bold | cli_text::Style::Dim => Color::DarkGray,
    };
    Style::new().fg(fg)
}

fn header_line(s: &Screen) -> Line<'static> {
    let mut spans = vec![Span::styled("xlb top", bold())];
    match s.model.report() {
        Some(r) => {
            let ct = &r.conntrack;
            spans.push(Span::raw(format!(
                "  instance {} on {} ({} XDP)  up {}  conntrack {}/{}",
                r.instance,
                r.interface,
                r.xdp_mode,
                span(s.now_unix_ms.saturating_sub(r.started_unix_ms)),
                ct.entries,
                ct.capacity,
            )));
        }
        None => spans.push(Span::raw(format!("  connecting to {}", s.socket))),
    }
    spans.push(Span::raw(format!(
        "  sort {}  vip {}  every {}",
        s.view.sort.label(),
        s.view.filter.as_deref().unwrap_or("all"),
        super::interval_text(s.interval)
    )));
    if s.view.paused {
        spans.push(Span::raw("  "));
        spans.push(Span::styled(
            " PAUSED ",
            Style::new().fg(Color::Black).bg(Color::Yellow),
        ));
    }
    Line::from(spans)
}

fn right(text: impl Into<String>) -> Cell<'static> {
    Cell::from(Line::from(text.into()).right_aligned())
}

fn heading(cells: &[&'static str], right_from: usize) -> Row<'static> {
    Row::new(cells.iter().enumerate().map(|(i, &h)| {
        if i >= right_from && i < cells.len() - 1 {
            right(h)
        } else {
            Cell::from(h)
        }
    }))
    .style(bold())
}

fn rates_text(r: Option<Rates>, pick: fn(Rates) -> f64) -> String {
    r.map_or_else(|| "-".to_owned(), |r| rate(pick(r)))
}

fn count(n: Option<u64>) -> String {
    n.map_or_else(|| "-".to_owned(), |n| n.to_string())
}

/// Width of the widest of `texts` and `min`.
fn widest<'a>(texts: impl Iterator<Item = &'a str>, min: usize) -> u16 {
    texts.map(|t| t.chars().count()).max().unwrap_or(0).max(min) as u16
}

fn vip_table<'a>(vips: &'a [VipRow], s: &Screen) -> Table<'a> {
    let rows = vips.iter().map(|v| {
        let up = if v.up == v.total && v.total > 0 {
            Color::Green
        } else if v.up == 0 {
            Color::Red
        } else {
            Color::Yellow
        };
        let note_style = match &v.note {
            Some(n) if n.starts_with("PANIC") => Style::new().fg(Color::Red),
            _ => Style::new().fg(Color::Yellow),
        };
        Row::new([
            Cell::from(v.name.as_str()),
            Cell::from(v.endpoint.as_str()),
            Cell::from(v.mode.as_str()),
            Cell::from(Line::from(format!("{}/{} up", v.up, v.total)).right_aligned())
                .style(Style::new().fg(up)),
            right(rates_text(v.rates, |r| r.packets)),
            right(rates_text(v.rates, |r| r.new_flows)),
            right(count(v.flows)),
            Cell::from(v.note.clone().unwrap_or_default()).style(note_style),
        ])
    });
    let widths = [
        Constraint::Length(widest(vips.iter().map(|v| v.name.as_str()), 3)),
        Constraint::Length(widest(vips.iter().map(|v| v.endpoint.as_str()), 7)),
        Constraint::Length(8),
        Constraint::Length(widest(vips.iter().map(|_| "100/100 up"), 4)),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(7),
        Constraint::Fill(1),
    ];
    let title = match (&s.view.filter, vips.is_empty(), s.model.report()) {
        (Some(f), true, Some(_)) => format!(" VIPs: no VIP named {f:?} (v or / to change) "),
        (_, true, Some(_)) => " VIPs: none configured ".to_owned(),
        _ => " VIPs ".to_owned(),
    };
    Table::new(rows, widths)
        .header(heading(
            &[
                "VIP", "ADDRESS", "MODE", "UP", "PKT/S", "NEW/S", "FLOWS", "NOTE",
            ],
            3,
        ))
        .block(Block::bordered().title(title))
}

fn backend_table<'a>(rows: &'a [BackendRow], s: &Screen) -> Table<'a> {
    let lines = rows.iter().map(|b| {
        Row::new([
            Cell::from(b.vip.as_str()),
            Cell::from(b.address.as_str()),
            Cell::from(b.state.as_str()).style(color_of(&b.state)),
            right(b.for_ms.map_or_else(|| "-".to_owned(), span)),
            right(b.latency_ms.map_or_else(|| "-".to_owned(), latency)),
            right(rates_text(b.rates, |r| r.new_flows)),
            right(rates_text(b.rates, |r| r.packets)),
            right(count(b.flows)),
            Cell::from(b.reason.as_str()).style(color_of(&b.state)),
        ])
    });
    let widths = [
        Constraint::Length(widest(rows.iter().map(|b| b.vip.as_str()), 3)),
        Constraint::Length(widest(rows.iter().map(|b| b.address.as_str()), 7)),
        // `panic_restored`, the longest state.
        Constraint::Length(14),
        Constraint::Length(6),
        Constraint::Length(7),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(7),
        Constraint::Fill(1),
    ];
    let title = format!(" Backends (sorted by {}) ", s.view.sort.label());
    Table::new(lines, widths)
        .header(heading(
            &[
                "VIP", "BACKEND", "STATE", "FOR", "LATENCY", "NEW/S", "PKT/S", "FLOWS", "REASON",
            ],
            3,
        ))
        .block(Block::bordered().title(title))
}

fn render_events(frame: &mut Frame, area: Rect, s: &Screen) {
    let n = area.height.saturating_sub(2) as usize;
    let lines: Vec<Line> = s
        .model
        .latest_events(s.view.filter.as_deref(), n)
        .into_iter()
        .map(|e| {
            let text = cli_text::render_event(e, false);
            // The date is today's: the time of day is enough here.
            let text = text.get(11..).unwrap_or(&text).to_owned();
            match e.to.as_deref() {
                Some(to) if e.backend.is_some() => Line::styled(text, color_of(to)),
                _ => Line::from(text),
            }
        })
        .collect();
    let events = Paragraph::new(lines).block(Block::bordered().title(" Events "));
    frame.render_widget(events, area);
}

fn footer_line(s: &Screen) -> Line<'static> {
    let v = s.view;
    if let Some(input) = &v.input {
        return Line::from(format!(
            "VIP: {input}_   Enter filters (empty = every VIP), Esc cancels"
        ));
    }
    if let Some(notice) = &v.notice {
        return Line::styled(notice.clone(), Style::new().fg(Color::Yellow));
    }
    if let Some(problem) = s.problem {
        return Line::styled(problem.to_owned(), Style::new().fg(Color::Red));
    }
    if v.help {
        return Line::from(HELP);
    }
    Line::from("q quit  ? keys  s sort  v VIP  p pause")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::top::model::SortKey;
    use crate::ctl::tests::{SAMPLE_NOW_MS, sample_event, sample_report};
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    use ratatui::buffer::Buffer;

    fn model() -> Model {
        let mut m = Model::default();
        m.push_status(sample_report(), Duration::from_secs(1));
        let mut r = sample_report();
        r.vips[0].packets += 2000;
        r.vips[0].new_flows += 70;
        r.vips[0].backends[0].packets += 800;
        r.vips[0].backends[0].new_flows += 24;
        m.push_status(r, Duration::from_secs(3));
        m.push_events(vec![sample_event(1)]);
        m
    }

    fn render(w: u16, h: u16, model: &Model, view: &ViewState, problem: Option<&str>) -> Buffer {
        let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
        let screen = Screen {
            model,
            view,
            now_unix_ms: SAMPLE_NOW_MS,
            interval: Duration::from_secs(1),
            socket: "/run/xlb/xlb.sock",
            problem,
        };
        term.draw(|f| draw(f, &screen)).unwrap();
        term.backend().buffer().clone()
    }

    fn lines(buf: &Buffer) -> Vec<String> {
        (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol())
                    .collect::<String>()
                    .trim_end()
                    .to_owned()
            })
            .collect()
    }

    /// Where `text` starts on the screen.
    fn find(buf: &Buffer, text: &str) -> Option<(u16, u16)> {
        lines(buf).iter().enumerate().find_map(|(y, l)| {
            let col = l.find(text)?;
            // Columns count characters, not bytes (`µs`, `→`).
            Some((l[..col].chars().count() as u16, y as u16))
        })
    }

    fn fg_at(buf: &Buffer, text: &str, nth_line_from: u16) -> Color {
        let (x, y) = lines(buf)
            .iter()
            .enumerate()
            .skip(nth_line_from as usize)
            .find_map(|(y, l)| Some((l[..l.find(text)?].chars().count() as u16, y as u16)))
            .unwrap_or_else(|| panic!("{text:?} not on screen:\n{}", lines(buf).join("\n")));
        buf[(x, y)].fg
    }

    #[test]
    fn the_screen_shows_vips_backends_and_events() {
        let buf = render(140, 30, &model(), &ViewState::default(), None);
        let screen = lines(&buf).join("\n");
        for want in [
            "xlb top  instance default on eth0 (native XDP)  up 3h2m  conntrack 1234/1048576  sort config  vip all  every 1s",
            " VIPs ",
            " Backends (sorted by config) ",
            " Events ",
            "q quit  ? keys  s sort  v VIP  p pause",
        ] {
            assert!(screen.contains(want), "{want:?} in\n{screen}");
        }
        let row = |text: &str| -> String {
            let (_, y) = find(&buf, text).unwrap_or_else(|| panic!("{text:?} in\n{screen}"));
            lines(&buf)[y as usize].clone()
        };
        // Headings in the order of the columns.
        let words = |l: String| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            words(row("BACKEND")).join(" "),
            "│VIP BACKEND STATE FOR LATENCY NEW/S PKT/S FLOWS REASON │"
        );
        assert_eq!(
            words(row("ADDRESS")).join(" "),
            "│VIP ADDRESS MODE UP PKT/S NEW/S FLOWS NOTE │"
        );
        // Rates from the two snapshots 2 s apart: 1000 pkt/s, 35 new/s.
        assert_eq!(
            words(row("10.100.0.1:80/tcp")).join(" "),
            "│api 10.100.0.1:80/tcp dsr-ipip 2/3 up 1.0k 35 - │"
        );
        assert_eq!(
            words(row("10.99.0.11:80")).join(" "),
            "│api 10.99.0.11:80 up 12m4s 1.2ms 12 400 3712 │"
        );
        // The down backend says why.
        assert_eq!(
            words(row("10.99.0.12:80")).join(" "),
            "│api 10.99.0.12:80 down 35s 1.0s 0 0 - connected, no HTTP response within 1s │"
        );
        assert!(row("10.99.0.13:80").contains("admin drain, down in 4m"));
        // The event, without its date.
        assert!(
            screen.contains("00:53:20.001 transition api 10.99.0.12:80 up→down: connected"),
            "{screen}"
        );
    }

    #[test]
    fn states_are_coloured() {
        let buf = render(140, 30, &model(), &ViewState::default(), None);
        let (_, table) = find(&buf, "BACKEND").unwrap();
        let cases = [
            ("up ", Color::Green),
            ("down ", Color::Red),
            ("draining ", Color::Yellow),
            ("connected, no HTTP", Color::Red),
            ("2/3 up", Color::Yellow),
        ];
        for (text, want) in cases {
            let from = if text == "2/3 up" { 0 } else { table };
            assert_eq!(fg_at(&buf, text, from), want, "{text:?}");
        }
        // The down event is red too; headings are plain.
        assert_eq!(fg_at(&buf, "00:53:20.001", 0), Color::Red);
        assert_eq!(fg_at(&buf, "BACKEND", 0), Color::Reset);
        let (x, y) = find(&buf, "BACKEND").unwrap();
        assert!(buf[(x, y)].modifier.contains(Modifier::BOLD));
    }

    #[test]
    fn too_small_says_the_minimum() {
        for (w, h) in [(79, 30), (140, 15), (20, 5)] {
            let buf = render(w, h, &model(), &ViewState::default(), None);
            let screen = lines(&buf).join(" ");
            let screen = screen.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(
                screen.contains(&format!(
                    "terminal too small: {w}x{h}; xlb top needs at least 80x16"
                )) || w < 40,
                "{w}x{h}: {screen}"
            );
            assert!(!screen.contains("BACKEND"), "{w}x{h}: {screen}");
        }
        let buf = render(80, 16, &model(), &ViewState::default(), None);
        assert!(find(&buf, "BACKEND").is_some(), "80x16 is enough");
    }

    #[test]
    fn view_state_shows_in_header_and_footer() {
        let m = model();
        let view = ViewState {
            sort: SortKey::State,
            filter: Some("api".to_owned()),
            paused: true,
            ..ViewState::default()
        };
        let buf = render(140, 30, &m, &view, None);
        let screen = lines(&buf).join("\n");
        assert!(
            screen.contains("sort STATE  vip api  every 1s   PAUSED"),
            "{screen}"
        );
        assert!(screen.contains(" Backends (sorted by STATE) "), "{screen}");
        let (x, y) = find(&buf, "PAUSED").unwrap();
        assert_eq!(buf[(x, y)].bg, Color::Yellow);
        let down = find(&buf, "10.99.0.12:80").unwrap().1;
        let up = find(&buf, "10.99.0.11:80").unwrap().1;
        assert!(down < up, "sorted by state: down first\n{screen}");

        let gone = ViewState {
            filter: Some("web".to_owned()),
            ..ViewState::default()
        };
        let screen = lines(&render(140, 30, &m, &gone, None)).join("\n");
        assert!(
            screen.contains("no VIP named \"web\" (v or / to change)"),
            "{screen}"
        );
        assert!(!screen.contains("10.99.0.11:80"), "{screen}");

        let footers = [
            (
                ViewState {
                    help: true,
                    ..ViewState::default()
                },
                None,
                HELP,
            ),
            (
                ViewState {
                    input: Some("ap".to_owned()),
                    ..ViewState::default()
                },
                None,
                "VIP: ap_   Enter filters (empty = every VIP), Esc cancels",
            ),
            (
                ViewState::default(),
                Some("no answer from the daemon for 2s: boom"),
                "no answer from the daemon for 2s: boom",
            ),
        ];
        for (view, problem, want) in footers {
            let buf = render(200, 30, &m, &view, problem);
            let last = lines(&buf).last().cloned().unwrap_or_default();
            assert_eq!(last, want);
        }
        let buf = render(200, 30, &m, &ViewState::default(), Some("boom"));
        assert_eq!(fg_at(&buf, "boom", 29), Color::Red);
    }

    #[test]
    fn before_the_first_answer_it_says_where_it_connects() {
        let buf = render(100, 20, &Model::default(), &ViewState::default(), None);
        let screen = lines(&buf).join("\n");
        assert!(
            screen.contains("xlb top  connecting to /run/xlb/xlb.sock"),
            "{screen}"
        );
    }
}
