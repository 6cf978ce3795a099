//! Faults injected into a node's fill task (feature `testing`): a panic at a chosen
//! point of the next fill of a key, as a bug in the fill would, so tests can check
//! that its waiters are never stranded.
//!
//! This is the seam between the fill task and the test harness: the fill task calls
//! [`FillFaults::check`] at each [`PanicPoint`], tests arm a point through
//! `Node::panic_next_fill`. It lives in production code so the proxy never imports the
//! harness (`testing` re-exports [`PanicPoint`]); without the feature it is not built.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::flight::FlightKey;

/// Where an injected panic hits a fill task (`Node::panic_next_fill`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PanicPoint {
    /// With the origin's response head in hand, before any subscriber sees it: the
    /// waiters may take over leadership.
    BeforeHead,
    /// At a body chunk, before it goes out (the head did): the responses already
    /// started can only end in an error.
    MidBody,
}

/// Panics armed per flight key; each fires once.
#[derive(Default)]
pub(crate) struct FillFaults {
    armed: Mutex<HashMap<FlightKey, PanicPoint>>,
}

impl FillFaults {
    /// The next fill of `key` panics at `at`.
    pub(crate) fn arm(&self, key: FlightKey, at: PanicPoint) {
        self.armed().insert(key, at);
    }

    /// Panics if a panic is armed for `key` at `here` (and disarms it).
    pub(crate) fn check(&self, key: &FlightKey, here: PanicPoint) {
        let fire = {
            let mut armed = self.armed();
            let fire = armed.get(key) == Some(&here);
            if fire {
                armed.remove(key);
            }
            fire
        };
        if fire {
            panic!("injected panic in the fill of {} ({here:?})", key.key());
        }
    }

    /// The armed map; a poisoned lock is still usable (the panics are the point).
    fn armed(&self) -> std::sync::MutexGuard<'_, HashMap<FlightKey, PanicPoint>> {
        self.armed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use models::{CacheKey, TenantId};

    use super::*;

    #[test]
    fn an_armed_panic_fires_once_at_its_point_only() {
        let faults = FillFaults::default();
        let key = FlightKey::new(TenantId::new("t").unwrap(), CacheKey::new("/a").unwrap());
        faults.arm(key.clone(), PanicPoint::MidBody);
        faults.check(&key, PanicPoint::BeforeHead);
        let fired = std::panic::catch_unwind(|| faults.check(&key, PanicPoint::MidBody));
        assert!(fired.is_err());
        faults.check(&key, PanicPoint::MidBody);
    }
}
