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
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};

use super::ApiError;

/// The name of the bearer scheme in the OpenAPI description.
const SCHEME: &str = "bearer";

/// Describes the optional token in the OpenAPI document: a `bearer` security scheme,
/// every `/api/*` operation secured by it or by nothing (the token is off unless
/// pulse runs with one), and the 401 those operations answer without it.
pub(super) struct BearerTokenDoc;

impl utoipa::Modify for BearerTokenDoc {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "Needed only when pulse runs with `--api-token` (or \
                         `PULSE_API_TOKEN`): then every `/api/*` path answers 401 without \
                         `Authorization: Bearer <token>`. `/healthz` and `/metrics` stay open.",
                    ))
                    .build(),
            ),
        );
        let unauthorized = ResponseBuilder::new()
            .description("pulse runs with `--api-token` and the request lacks it")
            .header("WWW-Authenticate", Default::default())
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build();
        for (path, item) in openapi.paths.paths.iter_mut() {
            if !path.starts_with("/api/") {
                continue;
            }
            let operations = [
                &mut item.get,
                &mut item.head,
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
                &mut item.options,
                &mut item.trace,
            ];
            for operation in operations.into_iter().flatten() {
                operation.security = Some(vec![
                    SecurityRequirement::default(),
                    SecurityRequirement::new(SCHEME, Vec::<String>::new()),
                ]);
                operation
                    .responses
                    .responses
                    .insert("401".into(), unauthorized.clone().into());
            }
        }
    }
}

/// Wraps `router` so `/api/*` requires `Authorization: Bearer <token>`; without a
/// token (or with an empty one) the router is returned unchanged.
pub(crate) fn require_api_token(router: Router, token: Option<&str>) -> Router {
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
                    coverage: None,
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
            "/api/rates?tenant=acme",
            "/api/edges",
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

    /// Every `/api/*` operation in the OpenAPI document names the bearer scheme (or
    /// none) and describes its 401; `/healthz` needs nothing.
    #[test]
    fn the_openapi_document_describes_the_token() {
        let doc = serde_json::to_value(crate::api::openapi()).unwrap();
        let scheme = &doc["components"]["securitySchemes"][SCHEME];
        assert_eq!(scheme["type"], "http");
        assert_eq!(scheme["scheme"], "bearer");
        let paths = doc["paths"].as_object().unwrap();
        let api: Vec<_> = paths.keys().filter(|p| p.starts_with("/api/")).collect();
        assert!(api.len() >= 6, "{api:?}");
        for path in api {
            // Every operation of the path (`POST /api/purge` has no GET).
            for (method, op) in paths[path].as_object().unwrap() {
                assert_eq!(
                    op["security"],
                    serde_json::json!([{}, { SCHEME: [] }]),
                    "{method} {path}"
                );
                assert_eq!(
                    op["responses"]["401"]["content"]["application/json"]["schema"]["$ref"],
                    "#/components/schemas/ErrorBody",
                    "{method} {path}"
                );
            }
        }
        assert!(paths["/healthz"]["get"]["security"].is_null());
        assert!(paths["/healthz"]["get"]["responses"]["401"].is_null());
    }

    #[tokio::test]
    async fn without_a_token_nothing_changes() {
        for token in [None, Some("")] {
            let router = require_api_token(app(state()), token);
            assert_eq!(status(&router, "/api/tenants", None).await, StatusCode::OK);
        }
    }
}
