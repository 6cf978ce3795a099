//! A request body the node forwards (a pass-through upload), bounded three ways:
//! - a gap: when the client sends nothing for `server.body_timeout_ms`;
//! - a deadline: when the whole body has not arrived `server.body_deadline_ms` after
//!   its head, however steadily it trickles (1 byte every 2 s never trips the gap);
//! - a count: each upload holds an [`UploadSlot`] (and so one origin connection)
//!   until its body ends: at most `server.max_uploads` at once, and
//!   `server.max_uploads_per_address` from one client address.
//!
//! Past a time bound the body ends in an error, which aborts the origin request, and
//! the client gets 408. Uploads have slots of their own rather than fill slots: a
//! slow upload holds its slot for as long as the deadline allows, and fills (what
//! everyone's cache misses wait on) must not queue behind it; the per-address share
//! keeps one client from taking every upload slot.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::Node;
use crate::config::{ConnectionLimits, IpNetwork};
use crate::status::ClientLimit;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The client sent no byte of its request body for the body timeout, or not the
/// whole body by the deadline.
#[derive(Debug, thiserror::Error)]
#[error("request body not received within {0:?}")]
pub(super) struct BodyTimedOut(Duration);

/// Whether a forwarded body timed out, for the answer to its request.
#[derive(Debug, Clone, Default)]
pub(super) struct TimedOut(Arc<AtomicBool>);

impl TimedOut {
    pub(super) fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The time bounds of one forwarded body.
#[derive(Debug, Clone, Copy)]
pub(super) struct BodyBounds {
    /// Longest gap between two frames.
    pub gap: Duration,
    /// Longest the whole body may take.
    pub whole: Duration,
}

pin_project_lite::pin_project! {
    /// `body`, ending in [`BodyTimedOut`] when no frame arrives for the gap or the
    /// whole body has not by the deadline; holding its upload slot until it ends.
    pub(super) struct TimedBody<B> {
        #[pin]
        body: B,
        gap: Duration,
        whole: Duration,
        // The next gap deadline and the whole body's.
        deadline: Instant,
        end_by: Instant,
        // Armed on the first wait only: a body that is always ready costs no timer.
        sleep: Option<Pin<Box<Sleep>>>,
        timed_out: TimedOut,
        node: Node,
        slot: Option<UploadSlot>,
        done: bool,
    }
}

impl<B> TimedBody<B> {
    pub(super) fn new(
        body: B,
        bounds: BodyBounds,
        timed_out: TimedOut,
        node: Node,
        slot: Option<UploadSlot>,
    ) -> Self {
        let now = Instant::now();
        let end_by = now + bounds.whole;
        TimedBody {
            body,
            gap: bounds.gap,
            whole: bounds.whole,
            deadline: (now + bounds.gap).min(end_by),
            end_by,
            sleep: None,
            timed_out,
            node,
            slot,
            done: false,
        }
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        match this.body.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                *this.deadline = (Instant::now() + *this.gap).min(*this.end_by);
                if let Some(sleep) = this.sleep {
                    sleep.as_mut().reset(*this.deadline);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(other) => {
                // The body is over (or broke): its slot is free for the next upload.
                this.slot.take();
                Poll::Ready(other.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                let deadline = *this.deadline;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                *this.done = true;
                this.slot.take();
                this.timed_out.0.store(true, Ordering::Release);
                let (limit, bound) = if Instant::now() >= *this.end_by {
                    (ClientLimit::BodyDeadline, *this.whole)
                } else {
                    (ClientLimit::BodyTimeout, *this.gap)
                };
                this.node.inner.metrics.client_limit(limit);
                Poll::Ready(Some(Err(BodyTimedOut(bound).into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Why an upload was refused a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UploadRefused {
    /// `max_uploads` in flight.
    Full,
    /// `max_uploads_per_address` in flight from this address.
    Address,
}

/// The upload slots of a node: a count for the node and one per client address.
pub(super) struct UploadLimiter {
    inner: Arc<UploadsInner>,
}

struct UploadsInner {
    max: usize,
    per_address: usize,
    exempt: Box<[IpNetwork]>,
    // A std Mutex: two counter updates per upload, never held across an `.await`.
    state: Mutex<UploadState>,
}

#[derive(Default)]
struct UploadState {
    total: usize,
    /// Only addresses with an upload in flight: at most `max` entries.
    by_address: HashMap<IpAddr, usize>,
}

impl UploadsInner {
    fn lock(&self) -> std::sync::MutexGuard<'_, UploadState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One upload in flight; its slot is free again on drop.
pub(super) struct UploadSlot {
    inner: Arc<UploadsInner>,
    address: Option<IpAddr>,
}

impl Drop for UploadSlot {
    fn drop(&mut self) {
        let mut state = self.inner.lock();
        state.total -= 1;
        if let Some(address) = self.address
            && let Some(n) = state.by_address.get_mut(&address)
        {
            *n -= 1;
            if *n == 0 {
                state.by_address.remove(&address);
            }
        }
    }
}

/// An address as the per-address share sees it: an IPv4 address, or an IPv6 /64.
fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
        v4 => v4,
    }
}

impl UploadLimiter {
    /// The limiter of `server`'s `max_uploads`, `max_uploads_per_address` and
    /// `exempt`.
    pub(super) fn new(server: &ConnectionLimits) -> UploadLimiter {
        UploadLimiter {
            inner: Arc::new(UploadsInner {
                max: server.max_uploads,
                per_address: server.max_uploads_per_address,
                exempt: server
                    .exempt
                    .iter()
                    .filter_map(|n| IpNetwork::parse(n).ok())
                    .collect(),
                state: Mutex::new(UploadState::default()),
            }),
        }
    }

    /// A slot for an upload from `ip` (unknown: counted for the node only).
    pub(super) fn try_acquire(&self, ip: Option<IpAddr>) -> Result<UploadSlot, UploadRefused> {
        let inner = &self.inner;
        let address = ip
            .filter(|ip| inner.per_address > 0 && !inner.exempt.iter().any(|n| n.contains(*ip)))
            .map(address_key);
        let mut state = inner.lock();
        if state.total >= inner.max {
            return Err(UploadRefused::Full);
        }
        if let Some(address) = address {
            let n = state.by_address.entry(address).or_default();
            if *n >= inner.per_address {
                return Err(UploadRefused::Address);
            }
            *n += 1;
        }
        state.total += 1;
        Ok(UploadSlot {
            inner: Arc::clone(inner),
            address,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploads_are_bounded_per_node_and_per_address_and_freed_on_drop() {
        let server = ConnectionLimits {
            max_uploads: 3,
            max_uploads_per_address: 2,
            exempt: vec!["10.0.0.0/8".into()],
            ..ConnectionLimits::default()
        };
        let limiter = UploadLimiter::new(&server);
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let a_too: IpAddr = "2001:db8::2".parse().unwrap();
        let first = limiter.try_acquire(Some(a)).unwrap();
        let _second = limiter.try_acquire(Some(a_too)).unwrap();
        // One /64 is one client.
        assert_eq!(
            limiter.try_acquire(Some(a)).err(),
            Some(UploadRefused::Address)
        );
        let _exempt = limiter
            .try_acquire(Some("10.1.1.1".parse().unwrap()))
            .unwrap();
        assert_eq!(
            limiter
                .try_acquire(Some("192.0.2.1".parse().unwrap()))
                .err(),
            Some(UploadRefused::Full)
        );
        drop(first);
        let _again = limiter.try_acquire(Some(a)).unwrap();
        assert!(limiter.inner.lock().by_address.len() == 1);
    }
}
