//! `xlb explain`: which backend the data plane would choose for a flow,
//! and why, computed the way the kernel does it (conntrack first, then the
//! flow hash into the VIP's live table).

use std::net::SocketAddr;

use anyhow::Context as _;
use lb_common::{CtEntry, FlowKey, Globals};

use super::{
    Daemon,
    model::{Backend, Vip},
};
use crate::{
    config::{self, DownPolicy, Protocol},
    ctl::ExplainReport,
    dataplane,
};

impl Daemon {
    /// `xlb explain`: which backend the data plane would choose, and why.
    pub(super) fn explain(
        &self,
        protocol: &str,
        client: SocketAddr,
        vipaddr: SocketAddr,
    ) -> anyhow::Result<ExplainReport> {
        let proto = match protocol {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            other => anyhow::bail!("protocol {other:?}: use tcp or udp"),
        };
        if client.is_ipv4() != vipaddr.is_ipv4() {
            anyhow::bail!("client {client} and VIP {vipaddr} are of different address families");
        }
        let vip = self
            .vips
            .iter()
            .find(|v| {
                v.cfg.addr == vipaddr.ip()
                    && v.cfg.port == vipaddr.port()
                    && v.cfg.protocol == proto
            })
            .with_context(|| format!("no VIP serves {vipaddr}/{protocol}"))?;
        let flow = FlowKey::new(client, vipaddr, config::ip_proto(proto));
        let g = self.dp.globals()?;
        let slot = flow.slot(&g.hash_key, vip.cfg.table_size);
        let mut report = ExplainReport {
            protocol: protocol.to_string(),
            client: client.to_string(),
            vip: vipaddr.to_string(),
            vip_name: vip.cfg.name.clone(),
            backend: None,
            via: "none".to_string(),
            slot: Some(slot),
            table_size: vip.cfg.table_size,
            backend_state: None,
            detail: String::new(),
        };
        if let Some(e) = self.dp.ct_get(&flow)? {
            if let Some(b) = self.conntrack_backend(vip, proto, &g, &e)? {
                report.backend = Some(b.cfg.socket_addr().to_string());
                report.via = "conntrack".into();
                report.backend_state = Some(b.state_name().into());
                report.detail = format!(
                    "established flow: its conntrack entry holds {} ({}); a SYN would instead take table slot {slot}",
                    b.cfg.socket_addr(),
                    b.state_name()
                );
                return Ok(report);
            }
            report.detail = "its conntrack entry is stale (backend replaced, down with policy rehash, or expired); ".into();
        }
        explain_table(vip, slot, &mut report);
        Ok(report)
    }

    /// The backend a flow's conntrack entry `e` still sends it to, by the
    /// data plane's own tests; `None` if the entry is stale.
    fn conntrack_backend<'v>(
        &self,
        vip: &'v Vip,
        proto: Protocol,
        g: &Globals,
        e: &CtEntry,
    ) -> anyhow::Result<Option<&'v Backend>> {
        let live = self.dp.backend(e.backend_id)?;
        // The kernel's UDP idle test, on the same clock.
        let expired = proto == Protocol::Udp
            && g.udp_timeout_ns != 0
            && dataplane::ktime_coarse_ns().saturating_sub(e.last_seen_ns) > g.udp_timeout_ns;
        let b = vip.backends.iter().find(|b| b.id == e.backend_id);
        Ok(b.filter(|b| {
            !expired
                && live.generation == e.generation
                && e.vip_id == vip.id
                && (b.dp_state() != lb_common::BACKEND_DOWN
                    || vip.cfg.down_policy == DownPolicy::Keep)
        }))
    }
}

/// A new flow: the backend in `slot` of the VIP's live table, if any.
fn explain_table(vip: &Vip, slot: u32, report: &mut ExplainReport) {
    let table = vip.halves[vip.active as usize & 1]
        .as_deref()
        .unwrap_or(&[]);
    let backend = table
        .get(slot as usize)
        .copied()
        .filter(|&id| id != 0)
        .and_then(|id| vip.backends.iter().find(|b| b.id == id));
    match backend {
        Some(b) => {
            report.backend = Some(b.cfg.socket_addr().to_string());
            report.via = "table".into();
            report.backend_state = Some(b.state_name().into());
            report.detail += &format!(
                "new flow: the keyed flow hash scaled to {} slots = slot {slot}, which holds {}",
                vip.cfg.table_size,
                b.cfg.socket_addr()
            );
        }
        None => {
            report.detail += &format!(
                "slot {slot} is empty: no backend of vip {:?} is up, the packet is dropped",
                vip.cfg.name
            );
        }
    }
}
