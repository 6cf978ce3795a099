//! Optional bearer-token check for the dashboard API (`--api-token`).
//!
//! With a token, every `/api/*` request (routes, the OpenAPI document and unknown
//! paths alike, so nothing can be enumerated) needs `Authorization: Bearer <token>`;
//! anything else gets a 401 JSON [`ErrorBody`](super::ErrorBody) and a
//! `WWW-Authenticate: Bearer` header. `/healthz` and `/metrics` stay open for probes
//! and scrapers.

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::IntoResponse;

use super::ApiError;

/// Wraps `router` so `/api/*` requires `Authorization: Bearer <token>`; without a
/// token (or with an empty one) the router is returned unchanged.
pub fn require_api_token(router: Router, token: Option<&str>) -> Router {
    let Some(token) = token.filter(|t| !t.is_empty()) else {
        return router;
    };
    let token: Arc<[u8]> = Arc::from(token.as_bytes());
    router.layer(middleware::from_fn(move |request: Request, next: Next| {
        let token = token.clone();
        async move {
            let path = request.uri().path();
            let protected = path == "/api" || path.starts_with("/api/");
            if protected && !authorized(&request, &token) {
                let mut response = ApiError {
                    status: StatusCode::UNAUTHORIZED,
                    code: "unauthorized",
                    message: "this API needs an `Authorization: Bearer <token>` header".into(),
                }
                .into_response();
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                return response;
            }
            next.run(request).await
        }
    }))
}

fn authorized(request: &Request, token: &[u8]) -> bool {
    let Some(value) = request.headers().get(header::AUTHORIZATION) else {
        return false;
    };
    let value = value.as_bytes();
    // The scheme is case-insensitive (RFC 9110 §11.1); the token is compared exactly.
    if value.len() < 7 || !value[..7].eq_ignore_ascii_case(b"bearer ") {
        return false;
    }
    constant_time_eq(&value[7..], token)
}

/// Compares without an early exit, so response time does not leak how much of a
/// guessed token was right (the length is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;
    use crate::api::app;
    use crate::api::tests::state;

    async fn status(router: &Router, uri: &str, auth: Option<&str>) -> StatusCode {
        let mut request = Request::get(uri);
        if let Some(auth) = auth {
            request = request.header(header::AUTHORIZATION, auth);
        }
        let response = router
            .clone()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        response.status()
    }

    #[tokio::test]
    async fn with_a_token_every_api_route_needs_it_and_health_stays_open() {
        let router = require_api_token(app(state()), Some("s3cret-token"));
        let routes = [
            "/api/tenants",
            "/api/heatmap?tenant=acme",
            "/api/keys/acme/img/hot.png",
            "/api/openapi.json",
            "/api/predictions",
            "/api/model",
            "/api/no-such-route",
            "/api",
        ];
        for uri in routes {
            for auth in [
                None,
                Some("Bearer wrong"),
                Some("Bearer s3cret-toke"),
                Some("Bearer s3cret-token2"),
                Some("Basic czNjcmV0LXRva2Vu"),
                Some("s3cret-token"),
                Some("Bearer"),
            ] {
                assert_eq!(
                    status(&router, uri, auth).await,
                    StatusCode::UNAUTHORIZED,
                    "{uri} with {auth:?}"
                );
            }
            for auth in ["Bearer s3cret-token", "bearer s3cret-token"] {
                let got = status(&router, uri, Some(auth)).await;
                assert_ne!(got, StatusCode::UNAUTHORIZED, "{uri} with {auth:?}");
            }
        }
        assert_eq!(
            status(&router, "/api/tenants", Some("Bearer s3cret-token")).await,
            StatusCode::OK
        );
        assert_eq!(status(&router, "/healthz", None).await, StatusCode::OK);
        assert_eq!(status(&router, "/metrics", None).await, StatusCode::OK);

        let response = router
            .clone()
            .oneshot(Request::get("/api/tenants").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"], "unauthorized");
    }

    #[tokio::test]
    async fn without_a_token_nothing_changes() {
        for token in [None, Some("")] {
            let router = require_api_token(app(state()), token);
            assert_eq!(status(&router, "/api/tenants", None).await, StatusCode::OK);
        }
    }
}
