//! How a request was answered: the `x-cache` header's name and values, one enum for
//! the header, the metric labels and the access events alike, so the three never
//! disagree.

use models::Outcome;
use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

/// The response header naming how a request was answered.
pub const X_CACHE: &str = "x-cache";

/// [`X_CACHE`] as a ready-made name: the hit path then neither parses nor hashes a
/// string to find it.
pub(crate) static X_CACHE_NAME: http::HeaderName = http::HeaderName::from_static(X_CACHE);

/// The `x-cache` value of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheStatus {
    /// Served from the node's cache while fresh.
    Hit,
    /// Not cached: this request led an origin fill (or hedged, or was not shareable).
    Miss,
    /// Served an expired entry within its grace window while one refresh runs.
    Stale,
    /// Joined a fill already in flight and shared its response.
    Collapsed,
    /// The first user hit on an entry that a pre-warm (background fill) stored.
    Prefetched,
    /// Not cacheable by request (method, credentials, range): passed to the origin.
    Bypass,
}

impl CacheStatus {
    /// Every status, in declaration order (metrics pre-create one series each).
    pub const ALL: [CacheStatus; 6] = [
        CacheStatus::Hit,
        CacheStatus::Miss,
        CacheStatus::Stale,
        CacheStatus::Collapsed,
        CacheStatus::Prefetched,
        CacheStatus::Bypass,
    ];

    /// The header value, also the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Miss => "MISS",
            CacheStatus::Stale => "STALE",
            CacheStatus::Collapsed => "COLLAPSED",
            CacheStatus::Prefetched => "PREFETCHED",
            CacheStatus::Bypass => "BYPASS",
        }
    }

    /// Parses a header value (as a downstream node or a test reads it).
    pub fn parse(value: &str) -> Option<CacheStatus> {
        CacheStatus::ALL.into_iter().find(|s| s.as_str() == value)
    }

    /// The access-event outcome a user request with this status reports; `None` for
    /// requests that were never cacheable.
    pub fn outcome(self) -> Option<Outcome> {
        match self {
            CacheStatus::Hit => Some(Outcome::Hit),
            CacheStatus::Miss => Some(Outcome::Miss),
            CacheStatus::Stale => Some(Outcome::Stale),
            CacheStatus::Collapsed => Some(Outcome::Collapsed),
            CacheStatus::Prefetched => Some(Outcome::PrefetchUseful),
            CacheStatus::Bypass => None,
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl EncodeLabelValue for CacheStatus {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_round_trip_and_index_matches_order() {
        for (i, s) in CacheStatus::ALL.into_iter().enumerate() {
            assert_eq!(CacheStatus::parse(s.as_str()), Some(s));
            assert_eq!(s.index(), i);
        }
        assert_eq!(CacheStatus::parse("hit"), None);
        assert_eq!(
            CacheStatus::Prefetched.outcome(),
            Some(Outcome::PrefetchUseful)
        );
        assert_eq!(CacheStatus::Bypass.outcome(), None);
    }
}
