//! How long each peer has not been answering: a peer that stops answering because it
//! left the group (a scale-in, a rolling restart) is dropped by discovery within one
//! [`DISCOVERY_INTERVAL`](super::discovery) and is no fault; one that has not
//! answered for [`SILENCE_BEFORE_WARNING`] (killed, hung, a `--peers` entry that is
//! down) is, and is warned about.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::PeerUrl;

/// How long a peer may go unanswering before the fleet answers that leave it out
/// warn: longer than two descriptions of the group (2 s apart), so a peer that left
/// is gone from the peers first; shorter than the group's session timeout (6 s), so
/// a killed peer is warned about while it still holds its partitions.
pub(crate) const SILENCE_BEFORE_WARNING: Duration = Duration::from_secs(5);

/// When each peer that is not answering last answered (or was first asked).
#[derive(Debug, Default)]
pub(super) struct Silences {
    since: Mutex<HashMap<PeerUrl, Instant>>,
}

impl Silences {
    /// Notes `peer`'s outcome at `now`; for a failure, how long it has not answered.
    pub(super) fn note(&self, peer: &PeerUrl, answered: bool, now: Instant) -> Duration {
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        if answered {
            since.remove(peer);
            return Duration::ZERO;
        }
        now.saturating_duration_since(*since.entry(peer.clone()).or_insert(now))
    }

    /// Forgets the peers that are gone: one that comes back starts afresh.
    pub(super) fn keep_only(&self, peers: &[PeerUrl]) {
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        since.retain(|p, _| peers.contains(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silence_is_timed_from_the_first_failure_and_ends_with_an_answer() {
        let silences = Silences::default();
        let peer = PeerUrl::parse("http://10.0.0.2:8080").unwrap();
        let t0 = Instant::now();
        assert_eq!(silences.note(&peer, false, t0), Duration::ZERO);
        let later = t0 + SILENCE_BEFORE_WARNING;
        assert_eq!(silences.note(&peer, false, later), SILENCE_BEFORE_WARNING);
        assert_eq!(silences.note(&peer, true, later), Duration::ZERO);
        assert_eq!(silences.note(&peer, false, later), Duration::ZERO);
        // A peer discovery dropped starts afresh if it comes back.
        silences.keep_only(&[]);
        let much_later = later + SILENCE_BEFORE_WARNING * 2;
        assert_eq!(silences.note(&peer, false, much_later), Duration::ZERO);
    }
}
