//! The fill task: takes a fill slot for its class, fetches from the origin, streams
//! the response to every subscriber, and stores it unless it is private, too large
//! or an error (`cache.store_errors` off, the default).
//!
//! What is shared is decided before anything is shared: a per-user response
//! (`Set-Cookie`, `private`, `no-store`, `Vary: *`) goes to the leader only, whatever
//! its status: a `200` or a `304` revalidation, after which each waiter fetches on
//! its own (as many at once as there are fill slots), or an origin error, after which
//! each waiter gets the error without it (a failing origin is not asked once more per
//! waiter). A fill led for a client that every subscriber has left is dropped while
//! nothing of it is worth keeping: before its response head, or while streaming one
//! that will not be stored (`abandon`). A response too large to store is still one
//! origin stream for every subscriber, paced by the slowest
//! ([`FillPermit::share_window`](crate::flight::FillPermit::share_window)).

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::Body;
use futures::FutureExt;
use http_body_util::BodyExt;
use models::{Outcome, Priority};
use tokio::time::Instant;

use http::{HeaderMap, StatusCode, Uri, header};

use super::fill_body::FillBody;
use super::response::{content_length, origin_head};
use super::{Node, millis};
use crate::cache::{Entry, Storability, classify, origin_age};
use crate::events::{OutcomeRecord, unix_now_ms};
use crate::flight::{FillError, FillPermit, Head, VaryMatch};
use crate::limits::FillSlot;
use crate::origin::{Tenant, strip_hop_by_hop};
use crate::semantics::{self, Vary, variant_of};

/// What a fill sends and what it may fall back on.
pub(super) struct FillRequest {
    /// The fill request's headers (the leader's forwarded ones, or a pre-warm's);
    /// `Host` is added per tenant.
    pub headers: HeaderMap,
    /// The stored response this fill refreshes: its validators make the request
    /// conditional, and it may answer instead of an origin error (`stale-if-error`).
    pub stale: Option<Arc<Entry>>,
    /// Region peers whose caches are asked first (a warm-up at start's fill; none
    /// for any other): the first one holding the key answers instead of the origin.
    pub peers: Arc<[Uri]>,
}

impl Node {
    /// A fill slot for `permit`'s class. A user fill takes one in its tenant's
    /// share, with its route's priority class. A background fill waits (bounded) for
    /// a prefetch slot; if a user request joins meanwhile, it leaves the prefetch
    /// queue and takes a user slot (priority inheritance).
    async fn fill_slot(&self, permit: &FillPermit) -> Result<FillSlot, FillError> {
        let limiter = self.inner.origin.limiter();
        let key = permit.key();
        let class = limiter.class_of(key.tenant(), "GET", key.key().as_str());
        if permit.priority() == Priority::User {
            return limiter.acquire_user(key.tenant(), class).await;
        }
        let shed = tokio::select! {
            biased;
            () = permit.promoted() => None,
            slot = limiter.acquire_prefetch(Some(key.tenant())) => match slot {
                Ok(slot) => return Ok(slot),
                Err(e) => Some(e),
            },
        };
        if permit.priority() == Priority::User {
            self.inner.metrics.prefetches_promoted.inc();
            return limiter.acquire_user(key.tenant(), class).await;
        }
        self.inner.metrics.prefetches_shed.inc();
        Err(shed.unwrap_or(FillError::NoCapacity))
    }

    /// Runs the fill in its own task: the leader's client may vanish, the fill goes on
    /// for the waiters and the cache. The permit's `Drop` covers a panic.
    pub(super) fn spawn_fill(
        &self,
        permit: FillPermit,
        tenant: Arc<Tenant>,
        request: FillRequest,
        force: bool,
    ) -> tokio::task::JoinHandle<()> {
        let node = self.clone();
        tokio::spawn(async move { node.fill(permit, tenant, request, force).await })
    }

    /// The fill's response, and whether a peer's cache gave it: each peer is asked
    /// once for its cached copy (a plain fetch only: a conditional one revalidates at
    /// the origin), starting at one chosen by the key so that a warm-up spreads over
    /// them; the origin when none holds the key.
    async fn fetch(
        &self,
        tenant: &Tenant,
        key: &crate::flight::FlightKey,
        headers: HeaderMap,
        peers: &[Uri],
        plain: bool,
    ) -> Result<(http::Response<hyper::body::Incoming>, bool), FillError> {
        let origin = &self.inner.origin;
        if plain && !peers.is_empty() {
            let warmup = &self.inner.metrics.warmup;
            let first = first_peer(key.key().as_str(), peers.len());
            for peer in peers.iter().cycle().skip(first).take(peers.len()) {
                match origin
                    .get_cached(peer, tenant, key.key(), headers.clone())
                    .await
                {
                    Ok(r) if r.status() == StatusCode::OK => {
                        warmup.peer_ask("hit");
                        return Ok((r, true));
                    }
                    _ => warmup.peer_ask("miss"),
                }
            }
        }
        origin
            .get(tenant, key.key(), headers)
            .await
            .map(|r| (r, false))
    }

    /// Publishes a stored response to the flight's subscribers, then runs `store`.
    fn publish_entry(permit: FillPermit, entry: &Entry, store: impl FnOnce()) {
        permit.publish_head(Head {
            status: entry.status,
            headers: entry.headers.clone(),
            fetched_at: entry.fetched_at(),
            initial_age: entry.initial_age(),
            vary: None,
        });
        permit.push_chunk(entry.body.clone());
        permit.complete(store);
    }

    /// One fill: a second look at the cache, a slot, the origin fetch (conditional
    /// when a stored response has validators), then a `304` merged into the stored
    /// response, or the response streamed to the subscribers as it arrives and stored.
    async fn fill(
        &self,
        permit: FillPermit,
        tenant: Arc<Tenant>,
        request: FillRequest,
        force: bool,
    ) {
        let inner = &self.inner;
        let key = permit.key().clone();
        // Second look (double-checked locking): a fill may have completed between the
        // caller's cache miss and its leadership.
        if !force && let Some(entry) = inner.cache.get_fresh(&key) {
            return Self::publish_entry(permit, &entry, || {});
        }
        let prewarm = permit.priority() == Priority::Background;
        let abandoned = permit.abandoned();
        tokio::pin!(abandoned);
        let slot = tokio::select! {
            biased;
            slot = self.fill_slot(&permit) => slot,
            () = &mut abandoned => Err(FillError::Aborted),
        };
        let slot = match slot {
            Ok(slot) => slot,
            Err(FillError::Aborted) => return self.abandon(permit),
            Err(e) => return self.fail(permit, e),
        };
        inner.metrics.fills_started.inc();
        inner.metrics.flights.inc();
        let _flights = scopeguard(|| {
            inner.metrics.flights.dec();
        });
        let FillRequest {
            headers: mut request_headers,
            stale,
            peers,
        } = request;
        // The leader's variant, from its request as forwarded (before validators).
        let selecting = request_headers.clone();
        let validating = stale.as_ref().filter(|e| e.has_validators());
        if let Some(entry) = validating {
            // RFC 9111 §4.3.1: validate with the stored validators.
            for (from, to) in [
                (header::ETAG, header::IF_NONE_MATCH),
                (header::LAST_MODIFIED, header::IF_MODIFIED_SINCE),
            ] {
                if let Some(v) = entry.headers.get(&from) {
                    request_headers.insert(to, v.clone());
                }
            }
        }
        let started = Instant::now();
        let fetched = tokio::select! {
            biased;
            fetched = self.fetch(&tenant, &key, request_headers, &peers, validating.is_none()) => Some(fetched),
            () = &mut abandoned => None,
        };
        let Some(fetched) = fetched else {
            // Dropping the request closes (or resets) its origin exchange. Nothing is
            // recorded: a client's cancellation says nothing of the origin's health,
            // and must not shrink the prefetch class.
            drop(slot);
            return self.abandon(permit);
        };
        let response = match fetched {
            Ok((r, _)) if r.status().is_server_error() => {
                slot.record(None);
                inner
                    .metrics
                    .fill_failed(&FillError::Upstream(r.status().as_u16()));
                r
            }
            Ok((r, from_peer)) => {
                // A peer's answer says nothing of the origin's latency.
                if !from_peer {
                    slot.record(Some(started.elapsed()));
                }
                r
            }
            Err(e) => {
                slot.record(None);
                // stale-if-error (or the config's grace): the stored response instead.
                if let Some(entry) = stale.filter(|e| e.usable_on_error(Instant::now())) {
                    return Self::publish_entry(permit, &entry, || {});
                }
                return self.fail(permit, e);
            }
        };
        let (parts, mut body) = response.into_parts();
        let mut headers = parts.headers;
        strip_hop_by_hop(&mut headers);
        if parts.status.is_server_error()
            && let Some(entry) = stale.as_ref().filter(|e| e.usable_on_error(Instant::now()))
        {
            return Self::publish_entry(permit, entry, || {});
        }
        if parts.status == StatusCode::NOT_MODIFIED
            && let Some(entry) = validating
        {
            let fill_time = started.elapsed();
            return self.merge_not_modified(permit, entry, headers, &selecting, fill_time);
        }
        let declared = content_length(&headers);
        let storability = storability_of(parts.status, &headers, &inner.config.cache);
        let max = inner.config.cache.max_object_bytes;
        let mut head = origin_head(parts.status, headers);
        let primary = key.primary();
        if let Vary::Fields(names) = Vary::parse(&head.headers) {
            let variant = variant_of(&names, &selecting);
            if matches!(storability, Storability::Store(_)) {
                // Known before the head goes out, so a waiter of another variant finds
                // its own flight when it tries again.
                inner.cache.note_vary(&primary, Arc::clone(&names));
            }
            head.vary = Some(Arc::new(VaryMatch { names, variant }));
        }
        if storability == Storability::Private && parts.status.is_server_error() {
            // Per-user and an error: the waiters get the error, not the response.
            let error = FillError::Upstream(parts.status.as_u16());
            permit.bypass_failing(head, Body::new(body), error);
            return;
        }
        if storability == Storability::Private {
            permit.bypass(head, Body::new(body));
            return;
        }
        // Too large to store: streamed to every subscriber, paced by the slowest; a
        // fill no client waits on (a pre-warm, a hint, a warm-up) would stream it to
        // no one, so it ends here.
        let too_large = declared.is_some_and(|l| l > max);
        if let Some(length) =
            declared.filter(|_| too_large && permit.priority() == Priority::Background)
        {
            return self.fail(permit, FillError::TooLarge(length));
        }
        let mut stored_headers = head.headers.clone();
        super::range::advertise(parts.status, &mut stored_headers);
        let vary = head.vary.clone();
        let (fetched_at, initial_age) = (head.fetched_at, head.initial_age);
        #[cfg(feature = "testing")]
        inner
            .faults
            .check(&key, crate::faults::PanicPoint::BeforeHead);
        // A user's fill (or a pre-warm a user joined) reads the origin's hints.
        if permit.priority() == Priority::User && parts.status.is_success() {
            self.follow_hints(key.tenant(), key.key(), &head.headers);
        }
        permit.publish_head(head);
        // A body that will be stored is worth finishing for the next request; one
        // that will not be is worth nothing once no one reads it.
        let mut held = FillBody::new(
            matches!(storability, Storability::Store(_)) && !too_large,
            inner.metrics.fill_bytes_held.clone(),
        );
        if too_large {
            permit.share_window(max);
        }
        let patience = inner.origin.body_idle_timeout();
        let mut received = 0u64;
        loop {
            // More of the body ready at once is coalesced; when the origin has
            // nothing ready, what is pending goes out before the wait.
            let ready = if held.has_pending() {
                body.frame().now_or_never()
            } else {
                None
            };
            let next = match ready {
                Some(frame) => Ok(frame),
                None => {
                    if let Some(chunk) = held.flush() {
                        permit.send_chunk(chunk, patience).await;
                    }
                    tokio::select! {
                        biased;
                        next = tokio::time::timeout(inner.origin.body_idle_timeout(), body.frame()) => next,
                        () = &mut abandoned, if !held.storing() => return self.abandon(permit),
                    }
                }
            };
            let frame = match next {
                Err(_) => return self.fail(permit, FillError::Timeout),
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    let error = match declared {
                        Some(expected) if received < expected => {
                            FillError::Truncated { expected, received }
                        }
                        _ => FillError::Body(e.to_string()),
                    };
                    return self.fail(permit, error);
                }
                Ok(Some(Ok(frame))) => frame,
            };
            if let Ok(data) = frame.into_data() {
                #[cfg(feature = "testing")]
                inner.faults.check(&key, crate::faults::PanicPoint::MidBody);
                let before = received;
                received += data.len() as u64;
                if before <= max && received > max && declared.is_none() {
                    // An unsized body past the largest stored object: not stored,
                    // still streamed whole to every subscriber, if it has any.
                    if permit.priority() == Priority::Background {
                        return self.fail(permit, FillError::TooLarge(received));
                    }
                    held.stop_storing();
                    permit.share_window(max);
                }
                if let Some(chunk) = held.push(data) {
                    permit.send_chunk(chunk, patience).await;
                }
            }
        }
        if let Some(chunk) = held.flush() {
            permit.send_chunk(chunk, patience).await;
        }
        if let Some(expected) = declared
            && expected != received
        {
            return self.fail(permit, FillError::Truncated { expected, received });
        }
        let stored = held.storing();
        let fill_time = started.elapsed();
        inner.metrics.fill_seconds.observe(fill_time.as_secs_f64());
        // Only an entry no user has waited for is "prefetched"; a promoted fill served
        // its user already.
        let background = permit.priority() == Priority::Background;
        permit.complete(|| {
            if let (Storability::Store(freshness), true) = (storability, stored) {
                let body = held.into_stored();
                let entry = Entry::stored(
                    parts.status,
                    stored_headers,
                    body,
                    freshness,
                    fill_time,
                    background,
                )
                .with_age(fetched_at, initial_age);
                match vary {
                    Some(vary) => inner.cache.insert_variant(
                        &primary,
                        Arc::clone(&vary.names),
                        Arc::clone(&vary.variant),
                        entry,
                    ),
                    None => inner.cache.insert(primary.clone(), entry),
                }
            }
        });
        if prewarm && inner.sink.enabled() {
            self.emit(OutcomeRecord {
                ts_ms: unix_now_ms(),
                tenant: key.tenant().clone(),
                key: key.key().clone(),
                outcome: Outcome::PrefetchFill,
                bytes: received,
                fill_ms: Some(millis(fill_time)),
                referrer: None,
            });
        }
    }

    /// RFC 9111 §4.3.4: a `304` to a revalidation updates the stored response with
    /// its fields, which then answers every subscriber and is stored again with the
    /// freshness the merged fields give (or dropped, if they now forbid storing). A
    /// `Vary` in the merged fields is the leader's variant (`selecting`, its request):
    /// it is checked for every waiter and selects the key the entry is stored under.
    fn merge_not_modified(
        &self,
        permit: FillPermit,
        stored: &Entry,
        update: http::HeaderMap,
        selecting: &HeaderMap,
        fill_time: std::time::Duration,
    ) {
        let inner = &self.inner;
        let initial_age = origin_age(&update);
        let mut merged = semantics::merge_not_modified(&stored.headers, &update);
        merged.remove(crate::status::X_CACHE);
        merged.remove(header::AGE);
        if update.contains_key(header::VIA) {
            // The 304's `Via` replaced the stored one, which had this hop.
            semantics::add_via(&mut merged, http::Version::HTTP_11);
        }
        // A revalidated entry serves ranges as the entry it replaces did.
        super::range::advertise(stored.status, &mut merged);
        let storability = classify(
            stored.status,
            &merged,
            &inner.config.cache,
            SystemTime::now(),
            rand::random::<f64>(),
        );
        let freshness = match storability {
            Storability::Store(f) => f,
            _ => Default::default(),
        };
        let entry = Entry::stored(
            stored.status,
            merged,
            stored.body.clone(),
            freshness,
            fill_time,
            false,
        )
        .with_age(Instant::now(), initial_age);
        if storability == Storability::Private {
            // The update is per-user (`Set-Cookie`, `private` …): the leader gets the
            // merged response, waiters fetch on their own, and nothing is stored.
            let head = Head {
                status: entry.status,
                headers: entry.headers.clone(),
                fetched_at: entry.fetched_at(),
                initial_age: entry.initial_age(),
                vary: None,
            };
            inner.cache.invalidate(permit.key());
            permit.bypass(head, Body::from(entry.body.clone()));
            return;
        }
        let key = permit.key().clone();
        let primary = key.primary();
        let cache = &inner.cache;
        let vary = match Vary::parse(&entry.headers) {
            Vary::Fields(names) => {
                let variant = variant_of(&names, selecting);
                Some(Arc::new(VaryMatch { names, variant }))
            }
            _ => None,
        };
        if let (Some(vary), Storability::Store(_)) = (&vary, storability) {
            // As for a fill: known before the head goes out.
            cache.note_vary(&primary, Arc::clone(&vary.names));
        }
        permit.publish_head(Head {
            status: entry.status,
            headers: entry.headers.clone(),
            fetched_at: entry.fetched_at(),
            initial_age: entry.initial_age(),
            vary: vary.clone(),
        });
        permit.push_chunk(entry.body.clone());
        permit.complete(move || match (storability, vary) {
            (Storability::Store(_), Some(vary)) => cache.insert_variant(
                &primary,
                Arc::clone(&vary.names),
                Arc::clone(&vary.variant),
                entry,
            ),
            (Storability::Store(_), None) if key.variant().is_some() => {
                cache.invalidate_url(&primary)
            }
            (Storability::Store(_), None) => cache.insert(primary, entry),
            _ => cache.invalidate(&key),
        });
    }

    /// Drops a fill every client left while it was not worth finishing: a request
    /// that joins it meanwhile sees `Aborted` and leads afresh.
    fn abandon(&self, permit: FillPermit) {
        tracing::debug!(key = %permit.key().key(), "fill abandoned by its clients");
        self.inner.metrics.fills_abandoned.inc();
        permit.fail(FillError::Aborted);
    }

    fn fail(&self, permit: FillPermit, error: FillError) {
        tracing::debug!(key = %permit.key().key(), %error, "fill failed");
        self.inner.metrics.fill_failed(&error);
        permit.fail(error);
    }
}

/// What may be done with an origin response: RFC 9111's rules (`classify`), except
/// that a 5xx is never stored unless `cache.store_errors` is on. The per-user check
/// comes first for every status, so a per-user error is never shared either.
fn storability_of(
    status: StatusCode,
    headers: &HeaderMap,
    config: &crate::config::CacheConfig,
) -> Storability {
    let storability = classify(
        status,
        headers,
        config,
        SystemTime::now(),
        rand::random::<f64>(),
    );
    match storability {
        Storability::Store(_) if status.is_server_error() && !config.store_errors => {
            Storability::ShareOnly
        }
        other => other,
    }
}

/// Runs a closure on drop (a gauge decrement that must survive early returns).
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// Which of `n` peers a warm fill of `key` asks first: the same one for a key, spread
/// over the peers across keys.
fn first_peer(key: &str, n: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % n as u64) as usize
}
