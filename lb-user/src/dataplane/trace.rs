//! The maps of `xlb trace` in a loaded object: its configuration and ring
//! buffer. The daemon only creates and pins them; `xlb trace` opens the pins
//! (`crate::trace`), and the fixtures use these handles.

use aya::{
    Ebpf,
    maps::{Array, MapData, RingBuf},
};
use lb_common::trace::{MAP_TRACE_CONFIG, MAP_TRACE_EVENTS, TraceConfig, TraceEvent};

use super::{Dataplane, DataplaneError, Result, map_err};

/// `XLB_TRACE_CFG` and `XLB_TRACE`, typed.
pub(super) struct TraceMaps {
    config: Array<MapData, TraceConfig>,
    events: RingBuf<MapData>,
}

impl TraceMaps {
    pub(super) fn take(ebpf: &mut Ebpf) -> Result<Self> {
        let mut take = |name: &'static str| {
            ebpf.take_map(name)
                .ok_or(DataplaneError::MissingMap { name })
        };
        let config = take(MAP_TRACE_CONFIG)?;
        let events = take(MAP_TRACE_EVENTS)?;
        Ok(Self {
            config: config.try_into().map_err(map_err(MAP_TRACE_CONFIG))?,
            events: events.try_into().map_err(map_err(MAP_TRACE_EVENTS))?,
        })
    }
}

impl Dataplane {
    /// The trace configuration the data plane reads.
    pub fn trace_config(&self) -> Result<TraceConfig> {
        self.trace
            .config
            .get(&0, 0)
            .map_err(map_err(MAP_TRACE_CONFIG))
    }

    /// Writes the trace configuration (`until_ns` 0 turns tracing off).
    pub fn set_trace_config(&mut self, cfg: &TraceConfig) -> Result<()> {
        self.trace
            .config
            .set(0, cfg, 0)
            .map_err(map_err(MAP_TRACE_CONFIG))
    }

    /// Every record waiting in the ring buffer, oldest first.
    pub fn trace_events(&mut self) -> Vec<TraceEvent> {
        let mut out = Vec::new();
        while let Some(item) = self.trace.events.next() {
            out.extend(crate::trace::decode(&item));
        }
        out
    }
}
