//! The per-tick trace (`simulate --trace PREFIX`): one CSV per set-up,
//! `PREFIX-<set-up>.csv`, a line per tick with the origin's fills and the latency a
//! fill sent now would take, and the edge nodes' adaptive origin limits, user fills
//! and queued fills summed over the fleet: what a limiter saw and did, tick by tick.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use models::TenantId;
use prefetcher::FillLimiter;

use crate::scenario::Setup;

pub(super) struct Trace {
    out: BufWriter<File>,
}

impl Trace {
    pub(super) fn create(prefix: &Path, setup: Setup) -> std::io::Result<Trace> {
        let name = setup.as_str().replace([' ', '+'], "-");
        let path = format!("{}-{name}.csv", prefix.display());
        let mut out = BufWriter::new(File::create(path)?);
        writeln!(
            out,
            "ms,origin_fills,origin_latency_ms,limit_sum,limit_max,user_fills,queued"
        )?;
        Ok(Trace { out })
    }

    pub(super) fn row<'a>(
        &mut self,
        now: u64,
        origin_fills: f64,
        latency_ms: u64,
        tenant: &TenantId,
        nodes: impl Iterator<Item = &'a FillLimiter>,
    ) {
        let (mut sum, mut max, mut active, mut queued) = (0, 0, 0, 0);
        for tenant in nodes.filter_map(|l| l.tenant_fills(tenant)) {
            sum += tenant.origin_limit;
            max = max.max(tenant.origin_limit);
            active += tenant.active;
            queued += tenant.queued;
        }
        // A trace is a diagnostic: a write error loses the trace, not the run.
        let _ = writeln!(
            self.out,
            "{now},{origin_fills},{latency_ms},{sum},{max},{active},{queued}"
        );
    }
}
