//! The fill task: takes a fill slot for its class, fetches from the origin, streams
//! the response to every subscriber, and stores it unless it is private, too large
//! or an error.

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use models::{Outcome, Priority};
use tokio::time::Instant;

use super::response::{content_length, origin_head};
use super::{Node, millis};
use crate::cache::{Entry, Storability, classify};
use crate::events::{OutcomeRecord, unix_now_ms};
use crate::flight::{FillError, FillPermit, Head};
use crate::limits::FillSlot;
use crate::origin::{Tenant, strip_hop_by_hop};

impl Node {
    /// A fill slot for `permit`'s class. A background fill waits (bounded) for a
    /// prefetch slot; if a user request joins meanwhile, it leaves the prefetch queue
    /// and takes a user slot (priority inheritance).
    async fn fill_slot(&self, permit: &FillPermit) -> Result<FillSlot, FillError> {
        let limiter = self.inner.origin.limiter();
        if permit.priority() == Priority::User {
            return limiter.acquire_user().await;
        }
        let shed = tokio::select! {
            biased;
            () = permit.promoted() => None,
            slot = limiter.acquire_prefetch() => match slot {
                Ok(slot) => return Ok(slot),
                Err(e) => Some(e),
            },
        };
        if permit.priority() == Priority::User {
            self.inner.metrics.prefetches_promoted.inc();
            return limiter.acquire_user().await;
        }
        self.inner.metrics.prefetches_shed.inc();
        Err(shed.unwrap_or(FillError::NoCapacity))
    }

    /// Runs the fill in its own task: the leader's client may vanish, the fill goes on
    /// for the waiters and the cache. The permit's `Drop` covers a panic.
    pub(super) fn spawn_fill(&self, permit: FillPermit, tenant: Arc<Tenant>, force: bool) {
        let node = self.clone();
        tokio::spawn(async move { node.fill(permit, tenant, force).await });
    }

    /// One fill: a second look at the cache, a slot, the origin fetch, the response
    /// streamed to the subscribers as it arrives, then the store.
    async fn fill(&self, permit: FillPermit, tenant: Arc<Tenant>, force: bool) {
        let inner = &self.inner;
        let key = permit.key().clone();
        // Second look (double-checked locking): a fill may have completed between the
        // caller's cache miss and its leadership.
        if !force && let Some(entry) = inner.cache.get_fresh(&key) {
            permit.publish_head(Head {
                status: entry.status,
                headers: entry.headers.clone(),
                fetched_at: entry.fetched_at(),
                initial_age: entry.initial_age(),
            });
            permit.push_chunk(entry.body.clone());
            permit.complete(|| {});
            return;
        }
        let prewarm = permit.priority() == Priority::Background;
        let slot = match self.fill_slot(&permit).await {
            Ok(slot) => slot,
            Err(e) => return self.fail(permit, e),
        };
        inner.metrics.fills_started.inc();
        inner.metrics.flights.inc();
        let _flights = scopeguard(|| {
            inner.metrics.flights.dec();
        });
        let started = Instant::now();
        let response = match inner.origin.get(&tenant, key.key()).await {
            Ok(r) => {
                slot.record(Some(started.elapsed()));
                r
            }
            Err(e) => {
                slot.record(None);
                return self.fail(permit, e);
            }
        };
        let (parts, mut body) = response.into_parts();
        let mut headers = parts.headers;
        strip_hop_by_hop(&mut headers);
        let declared = content_length(&headers);
        let storability = classify(
            parts.status,
            &headers,
            &inner.config.cache,
            SystemTime::now(),
            rand::random::<f64>(),
        );
        let max = inner.config.cache.max_object_bytes;
        let head = origin_head(parts.status, headers);
        if storability == Storability::Private || declared.is_some_and(|l| l > max) {
            permit.bypass(head, Body::new(body));
            return;
        }
        let mut stored_headers = head.headers.clone();
        super::range::advertise(parts.status, &mut stored_headers);
        let (fetched_at, initial_age) = (head.fetched_at, head.initial_age);
        #[cfg(feature = "testing")]
        inner
            .faults
            .check(&key, crate::faults::PanicPoint::BeforeHead);
        permit.publish_head(head);
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut received = 0u64;
        loop {
            let frame =
                match tokio::time::timeout(inner.origin.body_idle_timeout(), body.frame()).await {
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
                received += data.len() as u64;
                if received > max {
                    return self.fail(permit, FillError::TooLarge(max));
                }
                chunks.push(data.clone());
                permit.push_chunk(data);
            }
        }
        if let Some(expected) = declared
            && expected != received
        {
            return self.fail(permit, FillError::Truncated { expected, received });
        }
        let fill_time = started.elapsed();
        inner.metrics.fill_seconds.observe(fill_time.as_secs_f64());
        // Only an entry no user has waited for is "prefetched"; a promoted fill served
        // its user already.
        let background = permit.priority() == Priority::Background;
        permit.complete(|| {
            if let Storability::Store { ttl, grace } = storability {
                let body = if chunks.len() == 1 {
                    chunks.pop().unwrap_or_default()
                } else {
                    let mut all = BytesMut::with_capacity(received as usize);
                    chunks.iter().for_each(|c| all.extend_from_slice(c));
                    all.freeze()
                };
                let entry = Entry::new(
                    parts.status,
                    stored_headers,
                    body,
                    ttl,
                    grace,
                    fill_time,
                    background,
                )
                .with_age(fetched_at, initial_age);
                inner.cache.insert(key.clone(), entry);
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

    fn fail(&self, permit: FillPermit, error: FillError) {
        tracing::debug!(key = %permit.key().key(), %error, "fill failed");
        self.inner.metrics.fill_failed(&error);
        permit.fail(error);
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
