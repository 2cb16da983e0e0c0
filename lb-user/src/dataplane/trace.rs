//! The maps of `xlb trace` in a loaded object: its flag, configuration and
//! ring buffer. The daemon only creates and pins them; `xlb trace` opens the pins
//! (`crate::trace`), and the fixtures use these handles.

use aya::{
    Ebpf,
    maps::{Array, MapData, RingBuf},
};
use lb_common::trace::{MAP_TRACE_CONFIG, MAP_TRACE_EVENTS, MAP_TRACE_ON, TraceConfig, TraceEvent};

use super::{Dataplane, DataplaneError, Result, map_err};

/// `XLB_TRACE_CFG`, `XLB_TRACE` and the flag, typed.
pub(super) struct TraceMaps {
    config: Array<MapData, TraceConfig>,
    events: RingBuf<MapData>,
    on: Array<MapData, u32>,
}

impl TraceMaps {
    pub(super) fn take(ebpf: &mut Ebpf) -> Result<Self> {
        let mut take = |name: &'static str| {
            ebpf.take_map(name)
                .ok_or(DataplaneError::MissingMap { name })
        };
        let config = take(MAP_TRACE_CONFIG)?;
        let events = take(MAP_TRACE_EVENTS)?;
        let on = take(MAP_TRACE_ON)?;
        Ok(Self {
            config: config.try_into().map_err(map_err(MAP_TRACE_CONFIG))?,
            events: events.try_into().map_err(map_err(MAP_TRACE_EVENTS))?,
            on: on.try_into().map_err(map_err(MAP_TRACE_ON))?,
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

    /// Whether the data plane's trace flag is set.
    pub fn trace_on(&self) -> Result<bool> {
        let on = self.trace.on.get(&0, 0).map_err(map_err(MAP_TRACE_ON))?;
        Ok(on != 0)
    }

    /// Writes the trace configuration and sets the flag (`until_ns` 0
    /// turns tracing off), in the order `xlb trace` does: the flag set
    /// after the configuration, cleared before it.
    pub fn set_trace_config(&mut self, cfg: &TraceConfig) -> Result<()> {
        let write_config =
            |t: &mut TraceMaps| t.config.set(0, cfg, 0).map_err(map_err(MAP_TRACE_CONFIG));
        if cfg.until_ns == 0 {
            self.set_trace_on(false)?;
            write_config(&mut self.trace)
        } else {
            write_config(&mut self.trace)?;
            self.set_trace_on(true)
        }
    }

    /// Sets or clears the trace flag alone (the fixtures test the states
    /// the flag and the configuration can disagree in).
    pub fn set_trace_on(&mut self, on: bool) -> Result<()> {
        self.trace
            .on
            .set(0, u32::from(on), 0)
            .map_err(map_err(MAP_TRACE_ON))
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
