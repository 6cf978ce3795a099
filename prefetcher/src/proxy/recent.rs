//! Keys the node remembers for a while about what their last fill showed, so the
//! next requests skip a step that would only be undone: range requests for a key
//! too large to fill go straight to the origin (`range`), and a key whose last
//! response was per-user is fetched by each request on its own, without waiting on
//! a leader whose answer it could not share (`request`). Bounded in keys and time
//! (an object may shrink, a response become shareable again).

use std::time::Duration;

use crate::flight::FlightKey;

/// The most keys each memory holds.
const MAX_KEYS: u64 = 10_000;

/// Keys remembered for `ttl`.
#[derive(Clone)]
pub(super) struct RecentKeys {
    keys: moka::sync::Cache<FlightKey, ()>,
}

impl RecentKeys {
    pub(super) fn new(ttl: Duration) -> RecentKeys {
        RecentKeys {
            keys: moka::sync::Cache::builder()
                .max_capacity(MAX_KEYS)
                .time_to_live(ttl)
                .build(),
        }
    }

    pub(super) fn remember(&self, key: &FlightKey) {
        self.keys.insert(key.clone(), ());
    }

    pub(super) fn contains(&self, key: &FlightKey) -> bool {
        self.keys.contains_key(key)
    }

    pub(super) fn forget(&self, key: &FlightKey) {
        self.keys.invalidate(key);
    }
}
