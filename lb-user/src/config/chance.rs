//! Second chance (`vip.second_chance`, `daemon.second_chance_window`):
//! whether a VIP's packets that miss conntrack may be handed to the
//! previous owner of their slot, and for how long a slot remembers it.

use std::time::Duration;

use super::raw::{RawDaemon, RawVip};
use super::vip::Mode;
use super::{Problems, duration_setting};

/// `daemon.second_chance_window`: how long a slot remembers its previous
/// owner. Ten minutes covers the reconnect storms and rolling deploys the
/// feature is for; a connection whose slot changed owner longer ago than
/// this (or twice) is not saved.
pub(crate) const DEFAULT_WINDOW: Duration = Duration::from_secs(600);

/// Longest window: a day. The daemon keeps one timestamp per slot; past a
/// day the previous owner of a slot is seldom still the one a surviving
/// connection is on.
pub(crate) const MAX_WINDOW: Duration = Duration::from_secs(86_400);

/// `second_chance` of VIP `raw` (context `ctx`): on by default for
/// `dsr-ipip` (its established path pays nothing, see the README's
/// benchmark), refused for `dsr-l2`, whose backends run no decapsulator.
pub(super) fn second_chance(raw: &RawVip, mode: Mode, ctx: &str, p: &mut Problems<'_>) -> bool {
    match (raw.second_chance, mode) {
        (Some(true), Mode::DsrL2) => {
            p.error(
                ctx,
                "second_chance = true needs mode = \"dsr-ipip\": it is the backends' \
                 decapsulator (`xlb decap`) that passes a packet on to the previous owner, \
                 and dsr-l2 backends run none; remove second_chance or use dsr-ipip",
            );
            false
        }
        (_, Mode::Nat) => {
            super::nat::refuse_second_chance(raw, ctx, p);
            false
        }
        (Some(on), _) => on,
        (None, Mode::DsrIpip) => true,
        (None, Mode::DsrL2) => false,
    }
}

/// `daemon.second_chance_window`; 0 turns previous owners off for every VIP.
pub(super) fn window(raw: &RawDaemon, ctx: &str, p: &mut Problems<'_>) -> Duration {
    let Some(text) = raw.second_chance_window.as_deref() else {
        return DEFAULT_WINDOW;
    };
    match duration_setting("second_chance_window", text, ctx, p) {
        Some(d) if d > MAX_WINDOW => {
            p.error(
                ctx,
                format!(
                    "second_chance_window {text:?} is too long: a slot remembers one previous \
                     owner, and after a day it is seldom the one a connection is on; \
                     use at most {}, or 0 to turn second chance off",
                    super::shown::duration(MAX_WINDOW)
                ),
            );
            DEFAULT_WINDOW
        }
        Some(d) => d,
        None => DEFAULT_WINDOW,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::Mode;
    use crate::config::tests::{DAEMON, api_with_backend, assert_rejected, ok};

    #[test]
    fn on_by_default_for_dsr_ipip_only() {
        let cases = [
            ("ipip default", "", Mode::DsrIpip, true),
            ("ipip off", "second_chance = false", Mode::DsrIpip, false),
            ("ipip on", "second_chance = true", Mode::DsrIpip, true),
            ("l2 default", "mode = \"dsr-l2\"", Mode::DsrL2, false),
            (
                "l2 off",
                "mode = \"dsr-l2\"\nsecond_chance = false",
                Mode::DsrL2,
                false,
            ),
        ];
        for (name, settings, mode, want) in cases {
            let c = ok(name, &api_with_backend(settings));
            assert_eq!(c.vips[0].mode, mode, "{name}");
            assert_eq!(c.vips[0].second_chance, want, "{name}");
        }
    }

    #[test]
    fn refused_for_dsr_l2() {
        assert_rejected(
            &api_with_backend("mode = \"dsr-l2\"\nsecond_chance = true"),
            &[
                "xlb.toml: vip \"api\": second_chance = true needs mode = \"dsr-ipip\": it is \
                 the backends' decapsulator (`xlb decap`) that passes a packet on to the \
                 previous owner, and dsr-l2 backends run none; remove second_chance or use \
                 dsr-ipip",
            ],
        );
    }

    #[test]
    fn window_default_set_and_bounds() {
        let c = ok("default", DAEMON);
        assert_eq!(c.daemon.live.second_chance_window, super::DEFAULT_WINDOW);
        let c = ok("90s", &format!("{DAEMON}second_chance_window = \"90s\"\n"));
        assert_eq!(c.daemon.live.second_chance_window, Duration::from_secs(90));
        let c = ok("0", &format!("{DAEMON}second_chance_window = \"0s\"\n"));
        assert!(c.daemon.live.second_chance_window.is_zero());
        assert_rejected(
            &format!("{DAEMON}second_chance_window = \"25h\"\n"),
            &[
                "xlb.toml: daemon: second_chance_window \"25h\" is too long: a slot remembers \
               one previous owner, and after a day it is seldom the one a connection is on; \
               use at most 1d, or 0 to turn second chance off",
            ],
        );
        assert_rejected(
            &format!("{DAEMON}second_chance_window = \"ten\"\n"),
            &[
                "xlb.toml: daemon: second_chance_window \"ten\" is not a duration; write a \
               number and a unit (ms, s, m, h or d), e.g. \"500ms\", \"2s\", \"1.5s\", \"1m\"",
            ],
        );
    }
}
