//! Asking pulse's API in-process, as the tests do.

use axum::Router;
use axum::body::Body;
use hyper::{Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;

/// `GET uri` on `app` (no socket): the status and the body as JSON, or as a JSON
/// string when it is not JSON.
pub async fn get_json(app: &Router, uri: &str) -> (StatusCode, Value) {
    send_json(app, Request::get(uri).body(Body::empty()).unwrap()).await
}

/// `request` on `app` (no socket): the status and the body as [`get_json`] reads it.
pub async fn send_json(app: &Router, request: Request<Body>) -> (StatusCode, Value) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 16 << 20)
        .await
        .unwrap();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}
