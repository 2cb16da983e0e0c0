//! `xlb top`'s keys: what the operator chose to see (sort, VIP filter,
//! pause, help) and how each key changes it. Pure, so every key is tested.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::model::SortKey;

/// The keys, as the help line lists them.
pub const HELP: &str = "s sort by next column  v next VIP  / type a VIP (Enter; empty = all)  \
                        p or space pause  r refresh now  ? help  q Esc Ctrl-C quit";

/// What the operator chose to see.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ViewState {
    pub sort: SortKey,
    /// Only this VIP (its backends and events).
    pub filter: Option<String>,
    /// No polling: the screen keeps the last figures.
    pub paused: bool,
    /// The help line in place of the key summary.
    pub help: bool,
    /// A VIP name being typed after `/`.
    pub input: Option<String>,
    /// Said once, until the next key (e.g. no VIP matches what was typed).
    pub notice: Option<String>,
}

/// What the loop does after a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Redraw with the new view state.
    Redraw,
    /// Ask the daemon now (unpaused, or `r`).
    Refresh,
    Quit,
}

impl ViewState {
    /// Applies `key`; `vips` are the VIP names in configuration order.
    pub fn on_key(&mut self, key: KeyEvent, vips: &[String]) -> Action {
        if key.kind == KeyEventKind::Release {
            return Action::Redraw;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Action::Quit;
        }
        self.notice = None;
        if let Some(input) = self.input.as_mut() {
            match key.code {
                KeyCode::Esc => self.input = None,
                KeyCode::Enter => {
                    let typed = std::mem::take(input);
                    self.input = None;
                    self.choose_vip(typed.trim(), vips);
                }
                KeyCode::Backspace => {
                    input.pop();
                }
                KeyCode::Char(c) => input.push(c),
                _ => {}
            }
            return Action::Redraw;
        }
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => return Action::Quit,
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Char('v') => self.filter = next_vip(self.filter.as_deref(), vips),
            KeyCode::Char('/') => self.input = Some(String::new()),
            KeyCode::Char('p' | ' ') => {
                self.paused = !self.paused;
                if !self.paused {
                    return Action::Refresh;
                }
            }
            KeyCode::Char('r') => return Action::Refresh,
            KeyCode::Char('?') => self.help = !self.help,
            _ => {}
        }
        Action::Redraw
    }

    /// Filters on the VIP named `typed`, or the only one it begins with,
    /// or the only one containing it; empty = every VIP.
    fn choose_vip(&mut self, typed: &str, vips: &[String]) {
        if typed.is_empty() {
            self.filter = None;
            return;
        }
        let exact = vips.iter().find(|v| *v == typed);
        let prefixed: Vec<&String> = vips.iter().filter(|v| v.starts_with(typed)).collect();
        let containing: Vec<&String> = vips.iter().filter(|v| v.contains(typed)).collect();
        let choice = exact
            .or((prefixed.len() == 1).then(|| prefixed[0]))
            .or((containing.len() == 1).then(|| containing[0]));
        match choice {
            Some(v) => self.filter = Some(v.clone()),
            None if containing.is_empty() => {
                self.notice = Some(format!(
                    "no VIP matches {typed:?}; VIPs: {}",
                    vips.join(", ")
                ));
            }
            None => {
                let names: Vec<&str> = containing.iter().map(|s| s.as_str()).collect();
                self.notice = Some(format!(
                    "{typed:?} matches {}; type more of the name",
                    names.join(", ")
                ));
            }
        }
    }
}

/// The filter after `v`: all → the first VIP → … → the last → all. A
/// filter on a VIP that is gone (reloaded away) goes back to all.
fn next_vip(current: Option<&str>, vips: &[String]) -> Option<String> {
    match current {
        None => vips.first().cloned(),
        Some(c) => {
            let i = vips.iter().position(|v| v == c)?;
            vips.get(i + 1).cloned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn vips() -> Vec<String> {
        ["api", "api6", "web"].map(String::from).to_vec()
    }

    fn typed(s: &mut ViewState, text: &str) -> Action {
        let vips = vips();
        s.on_key(key(KeyCode::Char('/')), &vips);
        for c in text.chars() {
            s.on_key(key(KeyCode::Char(c)), &vips);
        }
        s.on_key(key(KeyCode::Enter), &vips)
    }

    #[test]
    fn quit_keys() {
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        let cases = [
            ("q", key(KeyCode::Char('q'))),
            ("Esc", key(KeyCode::Esc)),
            ("Ctrl-C", ctrl_c),
        ];
        for (name, k) in cases {
            assert_eq!(
                ViewState::default().on_key(k, &vips()),
                Action::Quit,
                "{name}"
            );
        }
        // While typing, q is a letter and Esc cancels; Ctrl-C still quits.
        let mut s = ViewState {
            input: Some(String::new()),
            ..ViewState::default()
        };
        assert_eq!(s.on_key(key(KeyCode::Char('q')), &vips()), Action::Redraw);
        assert_eq!(s.input.as_deref(), Some("q"));
        assert_eq!(s.on_key(key(KeyCode::Esc), &vips()), Action::Redraw);
        assert_eq!(s.input, None);
        s.input = Some(String::new());
        assert_eq!(s.on_key(ctrl_c, &vips()), Action::Quit);
        let c = key(KeyCode::Char('c'));
        assert_eq!(ViewState::default().on_key(c, &vips()), Action::Redraw);
    }

    #[test]
    fn sort_pause_and_help_toggle() {
        let mut s = ViewState::default();
        let v = vips();
        assert_eq!(s.on_key(key(KeyCode::Char('s')), &v), Action::Redraw);
        assert_eq!(s.sort, SortKey::State);
        assert_eq!(s.on_key(key(KeyCode::Char('p')), &v), Action::Redraw);
        assert!(s.paused);
        assert_eq!(s.on_key(key(KeyCode::Char(' ')), &v), Action::Refresh);
        assert!(!s.paused);
        assert_eq!(s.on_key(key(KeyCode::Char('r')), &v), Action::Refresh);
        s.on_key(key(KeyCode::Char('?')), &v);
        assert!(s.help);
        s.on_key(key(KeyCode::Char('?')), &v);
        assert!(!s.help);
        let mut released = key(KeyCode::Char('s'));
        released.kind = KeyEventKind::Release;
        s.on_key(released, &v);
        assert_eq!(s.sort, SortKey::State, "a key release is not a key");
    }

    #[test]
    fn v_cycles_the_vip_filter() {
        let mut s = ViewState::default();
        let mut seen = Vec::new();
        for _ in 0..5 {
            s.on_key(key(KeyCode::Char('v')), &vips());
            seen.push(s.filter.clone().unwrap_or_else(|| "all".to_owned()));
        }
        assert_eq!(seen, ["api", "api6", "web", "all", "api"]);
        s.filter = Some("gone".to_owned());
        s.on_key(key(KeyCode::Char('v')), &vips());
        assert_eq!(s.filter, None);
        s.on_key(key(KeyCode::Char('v')), &[]);
        assert_eq!(s.filter, None, "no VIPs: nothing to filter on");
    }

    #[test]
    fn typing_a_vip_filters_on_it() {
        let cases = [
            (
                "exact, though a prefix of another",
                "api",
                Some("api"),
                None,
            ),
            ("unique prefix", "w", Some("web"), None),
            ("unique substring", "6", Some("api6"), None),
            (
                "ambiguous",
                "ap",
                Some("web"),
                Some("\"ap\" matches api, api6; type more of the name"),
            ),
            (
                "no match",
                "db",
                Some("web"),
                Some("no VIP matches \"db\"; VIPs: api, api6, web"),
            ),
            ("empty: every VIP", "", None, None),
            ("spaces trimmed", " web ", Some("web"), None),
        ];
        for (name, text, want, notice) in cases {
            let mut s = ViewState {
                filter: Some("web".to_owned()),
                ..ViewState::default()
            };
            assert_eq!(typed(&mut s, text), Action::Redraw, "{name}");
            assert_eq!(s.filter.as_deref(), want, "{name}");
            assert_eq!(s.notice.as_deref(), notice, "{name}");
            assert_eq!(s.input, None, "{name}");
        }
        let mut s = ViewState::default();
        s.on_key(key(KeyCode::Char('/')), &vips());
        for c in ['x', 'w'] {
            s.on_key(key(KeyCode::Char(c)), &vips());
        }
        s.on_key(key(KeyCode::Backspace), &vips());
        s.on_key(key(KeyCode::Backspace), &vips());
        s.on_key(key(KeyCode::Char('w')), &vips());
        assert_eq!(s.input.as_deref(), Some("w"));
        s.on_key(key(KeyCode::Enter), &vips());
        assert_eq!(s.filter.as_deref(), Some("web"));
        // The notice lasts until the next key.
        typed(&mut s, "db");
        assert!(s.notice.is_some());
        s.on_key(key(KeyCode::Char('?')), &vips());
        assert_eq!(s.notice, None);
    }
}
