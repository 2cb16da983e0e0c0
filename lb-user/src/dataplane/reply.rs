//! `XLB_REPLY_RATE`: each CPU's budget of replies the data plane generates
//! (its rate is in `Globals`). The daemon never writes it; tests set it to
//! put a CPU's budget where they need it.

use aya::maps::PerCpuValues;
use lb_common::ReplyRate;

use super::{Dataplane, DataplaneError, Result, map_err};

impl Dataplane {
    /// Sets every CPU's reply budget (tests: a controlled budget).
    pub fn set_reply_rate(&mut self, rate: ReplyRate) -> Result<()> {
        let n = aya::util::nr_cpus().map_err(|(_, e)| DataplaneError::Cpus(e))?;
        let v = PerCpuValues::try_from(vec![rate; n]).map_err(DataplaneError::Cpus)?;
        self.reply_rate
            .set(0, v, 0)
            .map_err(map_err(lb_common::MAP_REPLY_RATE))
    }

    /// Each CPU's reply budget.
    pub fn reply_rate(&self) -> Result<Vec<ReplyRate>> {
        let v = self
            .reply_rate
            .get(&0, 0)
            .map_err(map_err(lb_common::MAP_REPLY_RATE))?;
        Ok(v.iter().copied().collect())
    }
}
