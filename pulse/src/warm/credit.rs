//! Crediting the edges' reports to the warm-ups: ingest hands every live event to the
//! [`Credit`] observer, which passes `prefetch_fill` and `prefetch_cached` events for
//! a warm-up's keys, in its regions, to the warm-up's progress, then lets the
//! predictions' observer see the batch as before.

use std::sync::Arc;

use models::{AccessEventRef, Outcome};

use super::WarmDesk;
use crate::ingest::BatchObserver;
use crate::partition::PartitionState;

/// The predictions' observer, with the warm-ups' crediting before it.
pub(crate) struct Credit {
    pub desk: Arc<WarmDesk>,
    pub inner: Box<dyn BatchObserver>,
}

impl BatchObserver for Credit {
    fn observe(&mut self, partition: &PartitionState, events: &[AccessEventRef<'_>]) {
        if self.desk.watching() {
            for event in events {
                if matches!(
                    event.outcome,
                    Outcome::PrefetchFill | Outcome::PrefetchCached
                ) {
                    self.desk.credit(event);
                }
            }
        }
        self.inner.observe(partition, events);
    }

    fn tick(&mut self, partition: &PartitionState, since: std::time::Instant) {
        self.inner.tick(partition, since);
    }
}
