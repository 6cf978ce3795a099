//! A request body the node forwards (a pass-through upload) under the body timeout:
//! when the client sends nothing for `server.body_timeout_ms`, the body ends in an
//! error, which aborts the origin request, and the client gets 408.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::Node;
use crate::status::ClientLimit;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The client sent no byte of its request body for the body timeout.
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

pin_project_lite::pin_project! {
    /// `body`, ending in [`BodyTimedOut`] when no frame arrives for `timeout`.
    pub(super) struct TimedBody<B> {
        #[pin]
        body: B,
        timeout: Duration,
        deadline: Instant,
        // Armed on the first wait only: a body that is always ready costs no timer.
        sleep: Option<Pin<Box<Sleep>>>,
        timed_out: TimedOut,
        node: Node,
        done: bool,
    }
}

impl<B> TimedBody<B> {
    pub(super) fn new(body: B, timeout: Duration, timed_out: TimedOut, node: Node) -> Self {
        TimedBody {
            body,
            timeout,
            deadline: Instant::now() + timeout,
            sleep: None,
            timed_out,
            node,
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
                *this.deadline = Instant::now() + *this.timeout;
                if let Some(sleep) = this.sleep {
                    sleep.as_mut().reset(*this.deadline);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(other) => Poll::Ready(other.map(|r| r.map_err(Into::into))),
            Poll::Pending => {
                let deadline = *this.deadline;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                *this.done = true;
                this.timed_out.0.store(true, Ordering::Release);
                this.node
                    .inner
                    .metrics
                    .client_limit(ClientLimit::BodyTimeout);
                Poll::Ready(Some(Err(BodyTimedOut(*this.timeout).into())))
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
