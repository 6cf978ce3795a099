//! A connection's service behind its per-request checks ([`Gate`]): the header count
//! and the address's rate, and the request in flight until its response body is
//! done.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;

use super::activity::Activity;
use super::admission::ConnectionSlot;
use crate::status::ClientLimit;

/// A connection's service behind its per-request checks: the header count and the
/// address's rate, refused with 431 or 429 before the inner service sees the request;
/// every request it passes on is tracked in the connection's [`Activity`] until its
/// response body is done.
pub(crate) struct Gate<S> {
    inner: S,
    slot: ConnectionSlot,
    activity: Arc<Activity>,
    max_headers: usize,
}

impl<S> Gate<S> {
    pub(crate) fn new(
        inner: S,
        slot: ConnectionSlot,
        activity: Arc<Activity>,
        max_headers: usize,
    ) -> Self {
        Gate {
            inner,
            slot,
            activity,
            max_headers,
        }
    }
}

impl<S> hyper::service::Service<Request<Incoming>> for Gate<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<Body>, Error = Infallible>,
{
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = GateFuture<S::Future>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        // HTTP/1.1 heads past the count never get here (hyper's parser refuses them).
        if request.headers().len() > self.max_headers {
            self.slot.counters().count(ClientLimit::TooManyHeaders);
            return GateFuture::Refused {
                response: Some(refusal(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    None,
                    "too many header fields\n",
                )),
            };
        }
        if let Err(wait) = self.slot.check_rate() {
            return GateFuture::Refused {
                response: Some(refusal(
                    StatusCode::TOO_MANY_REQUESTS,
                    Some(wait),
                    "too many requests from this address\n",
                )),
            };
        }
        let activity = &self.activity;
        let h2 = request.version() == http::Version::HTTP_2;
        if h2 && !activity.h2.load(Ordering::Relaxed) {
            activity.h2.store(true, Ordering::Relaxed);
        }
        // Calls come from the connection's own task only: no read-modify-write needed.
        Activity::bump(&activity.started);
        GateFuture::Inner {
            future: self.inner.call(request),
            in_flight: Some(InFlight {
                activity: Arc::clone(activity),
                h2,
            }),
        }
    }
}

/// A refusal by a gate: small, never stored, `Retry-After` when there is a wait.
fn refusal(
    status: StatusCode,
    retry_after: Option<Duration>,
    message: &'static str,
) -> Response<Body> {
    let mut response = Response::new(Body::from(message));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(wait) = retry_after {
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    }
    response
}

/// One request in flight on its connection; finished when dropped.
pub(crate) struct InFlight {
    activity: Arc<Activity>,
    /// An HTTP/2 request: its response body is watched for a client that never
    /// opens its window ([`ResponseBody`]).
    h2: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // HTTP/2 drops response bodies in stream tasks: another thread, so an RMW.
        self.activity.finished.fetch_add(1, Ordering::Release);
    }
}

pin_project_lite::pin_project! {
    /// The future of a [`Gate`]'s response.
    #[project = GateFutureProj]
    pub(crate) enum GateFuture<F> {
        /// Passed to the inner service.
        Inner { #[pin] future: F, in_flight: Option<InFlight> },
        /// Refused by the gate.
        Refused { response: Option<Response<Body>> },
    }
}

impl<F> Future for GateFuture<F>
where
    F: Future<Output = Result<Response<Body>, Infallible>>,
{
    type Output = Result<Response<ResponseBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            GateFutureProj::Inner { future, in_flight } => {
                let Ok(response) = ready!(future.poll(cx));
                let in_flight = in_flight.take();
                Poll::Ready(Ok(response.map(|body| ResponseBody::new(body, in_flight))))
            }
            GateFutureProj::Refused { response } => {
                let response = response.take().expect("polled after completion");
                Poll::Ready(Ok(response.map(|body| ResponseBody::new(body, None))))
            }
        }
    }
}

/// Every response body a gated connection sends: it keeps its request in flight
/// until it is dropped (the sweeper's busy phase), and on HTTP/2 it tells the
/// connection's [`Activity`] whether the client is taking it. A body whose last poll
/// gave data (or that was never polled) waits for the client; one whose source is
/// pending (a slow origin) does not. The sweeper closes a connection whose client
/// held up a body so for the send timeout without taking any of any body: a zero
/// flow-control window never updated shows in no socket write.
pub(crate) struct ResponseBody {
    body: Body,
    in_flight: Option<InFlight>,
    /// The last poll was `Pending`: the wait is on the source, not the client.
    source_pending: bool,
}

impl ResponseBody {
    fn new(body: Body, in_flight: Option<InFlight>) -> Self {
        if let Some(watched) = in_flight.as_ref().filter(|f| f.h2) {
            watched.activity.bodies_owed.fetch_add(1, Ordering::Relaxed);
        }
        ResponseBody {
            body,
            in_flight,
            source_pending: false,
        }
    }

    /// The activity an HTTP/2 body reports to.
    fn watched(&self) -> Option<&Activity> {
        self.in_flight
            .as_ref()
            .filter(|f| f.h2)
            .map(|f| &*f.activity)
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        let Some(activity) = this.watched() else {
            return polled;
        };
        activity.body_polls.fetch_add(1, Ordering::Relaxed);
        let pending = polled.is_pending();
        if pending != this.source_pending {
            if pending {
                activity.bodies_owed.fetch_sub(1, Ordering::Relaxed);
            } else {
                activity.bodies_owed.fetch_add(1, Ordering::Relaxed);
            }
            this.source_pending = pending;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        if !self.source_pending
            && let Some(activity) = self.watched()
        {
            activity.bodies_owed.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
