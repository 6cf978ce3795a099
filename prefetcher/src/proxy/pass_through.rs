//! A request the cache does not answer, passed to the origin ([`Node::pass_through`]):
//! its body forwarded under the body timeout, and, for a successful unsafe request,
//! the stored responses it invalidates (RFC 9111 §4.4).

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http::{HeaderValue, StatusCode, Uri, header};

use super::Node;
use super::request::is_unsafe;
use super::response::error_response;
use super::upload::{TimedBody, TimedOut};
use crate::cache_key::normalise_key;
use crate::flight::FlightKey;
use crate::origin::{ClientAddr, Tenant, strip_hop_by_hop};
use crate::semantics::{self};
use crate::status::{CacheStatus, X_CACHE};

impl Node {
    pub(super) async fn pass_through(
        &self,
        tenant: &Tenant,
        request: Request,
        client_addr: Option<ClientAddr>,
        max_body_bytes: u64,
    ) -> Response {
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
        // A stalled upload fails too, and is answered 408.
        let timed_out = TimedOut::default();
        let request = if http_body::Body::is_end_stream(request.body()) {
            request.map(|body| Body::new(http_body_util::Limited::new(body, max_body)))
        } else {
            let timeout = Duration::from_millis(self.inner.config.server.body_timeout_ms);
            request.map(|body| {
                Body::new(TimedBody::new(
                    http_body_util::Limited::new(body, max_body),
                    timeout,
                    timed_out.clone(),
                    self.clone(),
                ))
            })
        };
        match self
            .inner
            .origin
            .forward(tenant, request, client_addr)
            .await
        {
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
