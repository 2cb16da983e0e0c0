//! `xlb explain`: which backend a flow goes to, and why.

use std::fmt::Write as _;

use super::{Cell, Style, paint, state_style, table};
use crate::ctl::ExplainReport;

/// `xlb explain`.
pub fn render_explain(r: &ExplainReport, color: bool) -> String {
    let mut out = format!(
        "{} {} → {} (vip {})\n",
        r.protocol, r.client, r.vip, r.vip_name
    );
    let backend = match (&r.backend, &r.backend_state) {
        (Some(b), Some(state)) => format!("{b} ({})", paint(state, state_style(state), color)),
        (Some(b), None) => b.clone(),
        (None, _) => paint("none: the packet is dropped", Style::Red, color),
    };
    let via = match (r.via.as_str(), r.slot) {
        ("table", Some(slot)) => format!("table, slot {slot} of {}", r.table_size),
        (via, Some(slot)) => format!("{via} (table slot {slot} of {})", r.table_size),
        (via, None) => via.to_owned(),
    };
    let rows = vec![
        vec![Cell::plain("backend"), Cell::plain(backend)],
        vec![Cell::plain("via"), Cell::plain(via)],
        vec![Cell::plain("flow hash"), Cell::plain(r.flow_hash.clone())],
    ];
    // Colored text is already in the cells; the table only pads.
    table(&mut out, "  ", &rows, false);
    let _ = writeln!(out, "  {}", r.detail);
    out
}
