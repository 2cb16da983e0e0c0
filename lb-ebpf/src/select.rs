//! Select: is the packet for a VIP, and which backend takes a new flow
//! (the flow's slot in the VIP's live Maglev table).

use lb_common::{
    BackendInfo, FlowKey, Globals, RingSlot, VIP_INDEX_MANY, VipAddrKey, VipInfo, VipKey,
    ring_index, vip_index_slot,
};

use crate::{
    XLB_BACKENDS, XLB_RING, XLB_VIP_ADDRS, XLB_VIP_AINDEX, XLB_VIP_INDEX, XLB_VIP_INFO,
    XLB_VIP_PORTS, XLB_VIPS,
    key::{WordKey, addr_eq, addr_key, addr_words},
};

/// Which VIPs listen on the flow's (protocol, port): decided without
/// a hash lookup, so the host's own traffic pays almost nothing.
#[inline(always)]
/// The value is the count of VIPs, with `lb_common::nat::VIP_PORT_NAT` set
/// when one of them is a NAT VIP (0: none).
pub(crate) fn port_vips(flow: &FlowKey) -> u32 {
    let port = lb_common::port_index(flow.proto, u16::from_be(flow.dport));
    XLB_VIP_PORTS.get(port).copied().unwrap_or(0)
}

/// The id and settings of the VIP the flow is addressed to, if there is
/// one: from the direct-mapped index when its slot holds one VIP, else
/// from the hash map; either way a VIP whose own key is the flow's. The
/// settings are copied once, so a rewrite by the daemon cannot change them
/// between the checks here and their use.
#[inline(always)]
pub(crate) fn vip(flow: &FlowKey) -> Option<(u32, VipInfo)> {
    let slot = vip_index_slot(&flow.dst, flow.dport, flow.proto);
    match XLB_VIP_INDEX.get(slot).copied() {
        // No VIP's key falls in this slot.
        Some(0) => return None,
        Some(n) if n != VIP_INDEX_MANY => {
            let id = n - 1;
            if let Some(&vip) = XLB_VIP_INFO.get(id)
                && vip.mode != 0
                && is_key(&vip.key, flow)
            {
                return Some((id, vip));
            }
            // Another VIP's slot, or one being rewritten: the hash map
            // decides.
        }
        _ => {}
    }
    vip_by_key(flow)
}

/// The VIP of the flow by `XLB_VIPS`, the hash map of every VIP key.
#[inline(always)]
fn vip_by_key(flow: &FlowKey) -> Option<(u32, VipInfo)> {
    let key = VipKey {
        addr: flow.dst,
        port: flow.dport,
        proto: flow.proto,
        family: flow.family,
    };
    // SAFETY: a u32 copied out at once.
    let &id = unsafe { XLB_VIPS.get(&key) }?;
    let &vip = XLB_VIP_INFO.get(id)?;
    // Mode 0: the id is unused (a removed VIP). Another key: the id was
    // given to another VIP and this key's entry is not rewritten yet.
    if vip.mode == 0 || !is_key(&vip.key, flow) {
        return None;
    }
    Some((id, vip))
}

/// Whether `key` is the flow's destination: address (two 8-byte words),
/// port, protocol and family.
#[inline(always)]
fn is_key(key: &VipKey, flow: &FlowKey) -> bool {
    addr_eq(&key.addr, &flow.dst)
        && key.port == flow.dport
        && key.proto == flow.proto
        && key.family == flow.family
}

/// Whether `addr` carries any VIP: tells a malformed packet to a VIP from
/// traffic that is not ours.
#[inline(always)]
pub(crate) fn is_vip_addr(addr: &[u8; 16], family: u8) -> bool {
    // A NAT pool address alone is the host's own: not a VIP's.
    vip_addr(addr, family).is_some_and(|b| b & lb_common::VIP_ADDR_BALANCED != 0)
}

/// The `lb_common::VIP_ADDR_*` bits of `addr` if it carries any VIP. An
/// address in no VIP address's `XLB_VIP_AINDEX` slot (the host's own
/// traffic) is answered by the array alone, without the hash lookup.
#[inline(always)]
pub(crate) fn vip_addr(addr: &[u8; 16], family: u8) -> Option<u32> {
    let slot = lb_common::vip_addr_slot(addr);
    if XLB_VIP_AINDEX.get(slot).is_none_or(|n| *n == 0) {
        return None;
    }
    let mut key = WordKey::uninit();
    let key: &VipAddrKey = addr_key(&mut key, addr_words(addr), family);
    // SAFETY: a u32 copied out at once.
    unsafe { XLB_VIP_ADDRS.get(key) }.copied()
}

/// The backend in the flow's slot of the VIP's live table: its id and
/// entry, and the slot's previous owner (id, 0 = none; unchecked), or
/// `None` when the table is empty or the slot holds no live id.
#[inline(always)]
pub(crate) fn pick(
    flow: &FlowKey,
    vip: &VipInfo,
    g: &Globals,
) -> Option<(u32, &'static BackendInfo, u32)> {
    if vip.table_size == 0 || vip.table_size > g.ring_stride {
        return None;
    }
    let slot = flow.slot(&g.hash_key, vip.table_size);
    let idx = ring_index(vip.vip_id, vip.active & 1, g.ring_stride, slot);
    // One 8-byte read: the owner and the previous owner of one table.
    let RingSlot {
        backend_id: id,
        prev_id,
    } = *XLB_RING.get(idx)?;
    if id == 0 {
        return None;
    }
    let be = XLB_BACKENDS.get(id)?;
    if be.state == 0 {
        return None;
    }
    Some((id, be, prev_id))
}
