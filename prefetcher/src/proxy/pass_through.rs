//! A request the cache does not answer, passed to the origin ([`Node::pass_through`]):
//! its target checked, its body forwarded within an upload slot and under the body
//! timeout and deadline (none on `GET`/`HEAD`/`TRACE`), and, for a successful unsafe
//! request, the stored responses it invalidates (RFC 9111 §4.4).

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http::{HeaderValue, Method, StatusCode, Uri, header};

use super::Node;
use super::request::is_unsafe;
use super::response::error_response;
use super::upload::{BodyBounds, TimedBody, TimedOut, UploadRefused};
use crate::cache_key::{check_target, normalise_key};
use crate::flight::FlightKey;
use crate::forward::Peer;
use crate::origin::{Tenant, strip_hop_by_hop};
use crate::request_head::RefusalReason;
use crate::semantics::{self};
use crate::status::{CacheStatus, ClientLimit, X_CACHE};

impl Node {
    /// Passes `request` to `tenant`'s origin, for `peer`: its target checked first
    /// ([`check_target`]: `400` for one that could climb out of the origin's prefix),
    /// an upload only within its slots ([`UploadLimiter`](super::upload)) and time
    /// bounds.
    pub(super) async fn pass_through(
        &self,
        tenant: &Tenant,
        request: Request,
        peer: &Peer,
        max_body_bytes: u64,
    ) -> Response {
        if let Err(e) = check_target(request.uri().path()) {
            self.inner.metrics.refused(RefusalReason::BadTarget);
            return error_response(StatusCode::BAD_REQUEST, None, &e.to_string());
        }
        self.inner.metrics.request(CacheStatus::Bypass);
        let unsafe_target = is_unsafe(request.method())
            .then(|| normalise_key(request.uri()).ok())
            .flatten()
            .map(|key| {
                let host = request
                    .headers()
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .or_else(|| request.uri().authority().map(|a| a.as_str()))
                    .unwrap_or("")
                    .to_ascii_lowercase();
                (
                    FlightKey::new(tenant.id.clone(), key),
                    request.uri().clone(),
                    host,
                )
            });
        // A streamed (chunked) body past the limit is cut off: the upload fails.
        let max_body = usize::try_from(max_body_bytes).unwrap_or(usize::MAX);
        // A stalled or endless upload fails too, and is answered 408.
        let timed_out = TimedOut::default();
        let bodiless = matches!(
            *request.method(),
            Method::GET | Method::HEAD | Method::TRACE
        );
        let request = if bodiless || http_body::Body::is_end_stream(request.body()) {
            // No body is forwarded on a GET, HEAD or TRACE (`OriginClient::forward`).
            request.map(|body| Body::new(http_body_util::Limited::new(body, max_body)))
        } else {
            let slot = match self.inner.uploads.try_acquire(peer.addr().map(|a| a.ip())) {
                Ok(slot) => slot,
                Err(refused) => return self.upload_refused(refused),
            };
            let server = &self.inner.config.server;
            let bounds = BodyBounds {
                gap: Duration::from_millis(server.body_timeout_ms),
                whole: Duration::from_millis(server.body_deadline_ms),
            };
            request.map(|body| {
                Body::new(TimedBody::new(
                    http_body_util::Limited::new(body, max_body),
                    bounds,
                    timed_out.clone(),
                    self.clone(),
                    Some(slot),
                ))
            })
        };
        match self.inner.origin.forward(tenant, request, peer).await {
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                if let Some((target, uri, host)) = unsafe_target
                    && (parts.status.is_success() || parts.status.is_redirection())
                {
                    self.invalidate_after_unsafe(tenant, &target, &uri, &host, &parts.headers);
                }
                semantics::add_via(&mut parts.headers, http::Version::HTTP_11);
                parts.headers.insert(
                    X_CACHE,
                    HeaderValue::from_static(CacheStatus::Bypass.as_str()),
                );
                Response::from_parts(parts, Body::new(body))
            }
            Err(_) if timed_out.get() => error_response(
                StatusCode::REQUEST_TIMEOUT,
                Some(CacheStatus::Bypass),
                "request body not received in time",
            ),
            Err(e) => error_response(e.status(), Some(CacheStatus::Bypass), &e.to_string()),
        }
    }

    /// The answer to an upload refused a slot: 503 when the node's are taken, 429
    /// when its address's share is; counted either way.
    fn upload_refused(&self, refused: UploadRefused) -> Response {
        let (status, limit, message) = match refused {
            UploadRefused::Full => (
                StatusCode::SERVICE_UNAVAILABLE,
                ClientLimit::MaxUploads,
                "too many uploads in flight",
            ),
            UploadRefused::Address => (
                StatusCode::TOO_MANY_REQUESTS,
                ClientLimit::AddressUploads,
                "too many uploads in flight from this address",
            ),
        };
        self.inner.metrics.client_limit(limit);
        let mut response = error_response(status, Some(CacheStatus::Bypass), message);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(1u32));
        response
    }

    /// RFC 9111 §4.4: a successful unsafe request invalidates the stored responses of
    /// its URL and of the URLs in `Location` and `Content-Location` when they are of
    /// the same origin (a relative reference, or the request's own host and port), so
    /// a response can never invalidate another site's entries.
    pub(super) fn invalidate_after_unsafe(
        &self,
        tenant: &Tenant,
        target: &FlightKey,
        request_uri: &Uri,
        request_host: &str,
        response: &http::HeaderMap,
    ) {
        self.inner.cache.invalidate_url(target);
        for name in [header::LOCATION, header::CONTENT_LOCATION] {
            let Some(uri) = response
                .get(&name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<Uri>().ok())
            else {
                continue;
            };
            let same_origin = match uri.authority() {
                None => true,
                Some(authority) => authority.as_str().eq_ignore_ascii_case(request_host),
            };
            if !same_origin {
                continue;
            }
            let uri = if uri.path().starts_with('/') || uri.host().is_some() {
                uri
            } else {
                // A relative reference: resolved against the request's directory.
                let base = request_uri.path();
                let dir = &base[..base.rfind('/').map_or(0, |i| i + 1)];
                match format!("{dir}{uri}").parse::<Uri>() {
                    Ok(u) => u,
                    Err(_) => continue,
                }
            };
            if let Ok(key) = normalise_key(&uri) {
                self.inner
                    .cache
                    .invalidate_url(&FlightKey::new(tenant.id.clone(), key));
            }
        }
    }
}
