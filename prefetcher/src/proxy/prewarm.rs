//! The pre-warm entry: a key warmed through the request path's single flight at
//! background priority. The Kafka consumer that calls it is `crate::prewarm`.

use std::sync::Arc;

use http::Uri;
use models::{CacheKey, Outcome, Priority, TenantId};

use super::Node;
use super::fill::FillRequest;
use crate::cache::Lookup;
use crate::cache_key::normalise_key;
use crate::events::{OutcomeRecord, unix_now_ms};
use crate::flight::{Acquire, FlightKey, FlightSubscriber, HeadOutcome};
use crate::forward::prewarm_headers;
use crate::status::RejectReason;
use crate::warmup::WarmFill;

/// What [`Node::prewarm`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrewarmOutcome {
    /// A fresh entry is already cached: nothing to fetch (a `prefetch_cached` event
    /// says so).
    Cached,
    /// A fill is already in flight: the pre-warm joined it.
    Joined,
    /// A background fill started.
    Started,
}

/// Why a pre-warm was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrewarmError {
    /// The tenant is not in this node's configuration.
    #[error("unknown tenant {0}")]
    UnknownTenant(String),
    /// The key is not a valid cache key once normalised.
    #[error("invalid key: {0}")]
    InvalidKey(String),
    /// Too many keys in flight.
    #[error("too many fills in flight")]
    Full,
}

impl PrewarmError {
    /// The reason it is counted under.
    pub fn reason(&self) -> RejectReason {
        match self {
            PrewarmError::UnknownTenant(_) => RejectReason::UnknownTenant,
            PrewarmError::InvalidKey(_) => RejectReason::InvalidField,
            PrewarmError::Full => RejectReason::Full,
        }
    }
}

/// A pre-warm once started: what [`Node::prewarm`] reports, and what
/// [`Node::warm`] waits on.
enum Started {
    Cached,
    Lead(tokio::task::JoinHandle<()>),
    Join(FlightSubscriber),
}

impl Node {
    /// Pre-warms `key` through the same single-flight path at background priority:
    /// joins a fill in flight instead of starting another, and marks the stored entry
    /// so the first user hit reports `PREFETCHED`. The origin is the tenant's own
    /// from configuration; the key is normalised like a request's (sorted query).
    /// Counted in the `prefetches_{started,joined,cached}` metrics.
    pub fn prewarm(
        &self,
        tenant: &TenantId,
        key: CacheKey,
    ) -> Result<PrewarmOutcome, PrewarmError> {
        Ok(match self.start_prewarm(tenant, key, Arc::from([]))?.0 {
            Started::Cached => PrewarmOutcome::Cached,
            Started::Lead(_) => PrewarmOutcome::Started,
            Started::Join(_) => PrewarmOutcome::Joined,
        })
    }

    /// [`Node::prewarm`], waiting for the fill to end: what a warm-up at start
    /// (`crate::warmup`) counts. `Filled` with the stored body's size when the key is
    /// fresh in the cache afterwards.
    /// `peers` (a warm-up's `warmup.peers`) are asked for their cached copy first.
    pub async fn warm(
        &self,
        tenant: &TenantId,
        key: CacheKey,
        peers: Arc<[Uri]>,
    ) -> Result<WarmFill, PrewarmError> {
        let (started, primary) = self.start_prewarm(tenant, key, peers)?;
        match started {
            Started::Cached => return Ok(WarmFill::Cached),
            Started::Lead(fill) => {
                let _ = fill.await;
            }
            Started::Join(mut subscriber) => {
                if let HeadOutcome::Head(_) = subscriber.head().await {
                    while let Some(Ok(_)) = subscriber.next_chunk().await {}
                }
            }
        }
        let fkey = self
            .inner
            .cache
            .key_for(&primary, &prewarm_headers(primary.scheme()));
        Ok(match self.inner.cache.lookup(&fkey) {
            Lookup::Fresh { entry, .. } => WarmFill::Filled {
                bytes: entry.body.len() as u64,
            },
            _ => WarmFill::Failed,
        })
    }

    /// Starts a pre-warm; also returns the key's primary flight key.
    fn start_prewarm(
        &self,
        tenant: &TenantId,
        key: CacheKey,
        peers: Arc<[Uri]>,
    ) -> Result<(Started, FlightKey), PrewarmError> {
        let Some(t) = self.live().by_id.get(tenant).cloned() else {
            return Err(PrewarmError::UnknownTenant(tenant.to_string()));
        };
        let key = key
            .as_str()
            .parse::<Uri>()
            .map_err(|e| e.to_string())
            .and_then(|uri| normalise_key(&uri).map_err(|e| e.to_string()))
            .map_err(PrewarmError::InvalidKey)?;
        // A URL whose responses vary is warmed in the variant a plain GET selects.
        let scheme = self.prewarm_scheme();
        let headers = prewarm_headers(scheme);
        let primary = FlightKey::new(tenant.clone(), key.clone()).with_scheme(scheme);
        let fkey = self.inner.cache.key_for(&primary, &headers);
        let metrics = &self.inner.metrics;
        // An expired entry is warmed by revalidating it (a 304 costs the origin less).
        let stale = match self.inner.cache.lookup(&fkey) {
            Lookup::Fresh { .. } => {
                metrics.prefetches_cached.inc();
                // Told to pulse, so that a warm-up can count the key as in place.
                if self.inner.sink.enabled() {
                    self.emit(OutcomeRecord {
                        ts_ms: unix_now_ms(),
                        tenant: tenant.clone(),
                        key,
                        outcome: Outcome::PrefetchCached,
                        bytes: 0,
                        fill_ms: None,
                        referrer: None,
                    });
                }
                return Ok((Started::Cached, primary));
            }
            Lookup::Stale(entry) | Lookup::Expired(entry) => Some(entry),
            Lookup::Miss => None,
        };
        match self.inner.registry.acquire(&fkey, Priority::Background) {
            Acquire::Lead(permit) => {
                metrics.prefetches_started.inc();
                let request = FillRequest {
                    headers,
                    stale,
                    peers,
                };
                let fill = self.spawn_fill(permit, t, request, false);
                Ok((Started::Lead(fill), primary))
            }
            Acquire::Join(subscriber) => {
                metrics.prefetches_joined.inc();
                Ok((Started::Join(subscriber), primary))
            }
            Acquire::Full => Err(PrewarmError::Full),
        }
    }
}
