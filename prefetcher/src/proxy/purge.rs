//! The node's side of a purge (`crate::purge` states the model): [`Node::purge`],
//! its re-warm, and `POST /purge` on the admin listener.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};
use models::{CacheKey, PurgeMode, TenantId};
use tokio::time::Instant;

use super::Node;
use crate::cache::SoftPurge;
use crate::purge::{
    MAX_PURGE_BODY, PurgeError, PurgeReport, PurgeRequest, rewarm_plan, same_token,
};
use crate::status::RejectReason;
use crate::warmup::WarmFill;

impl Node {
    /// Purges `request.prefix` of `request.tenant` on this node, and schedules the
    /// re-warm it asks for. `source` labels the metric (`admin`, `command`).
    pub fn purge(
        &self,
        request: &PurgeRequest,
        source: &'static str,
    ) -> Result<PurgeReport, PurgeError> {
        request.check().map_err(PurgeError::InvalidField)?;
        if !self.config_has_tenant(&request.tenant) {
            return Err(PurgeError::UnknownTenant(request.tenant.to_string()));
        }
        let window = request.rewarm_window_ms.map(Duration::from_millis);
        let config = self.config();
        let max_urls = config.purge.max_rewarm_urls;
        // Behind a shield, the re-warm comes in the window after the shield's.
        let after = match (config.purge.behind_shield, window) {
            (true, Some(w)) => w,
            _ => Duration::ZERO,
        };
        let soft = match (request.mode, window) {
            (PurgeMode::Soft, Some(w)) => Some(SoftPurge {
                until: Instant::now() + after + w,
                max_urls,
            }),
            _ => None,
        };
        let purged = self.cache().purge_prefix(
            &request.tenant,
            request.prefix.as_str(),
            request.tag.as_deref(),
            soft,
        );
        let metrics = &self.metrics().purge;
        metrics.purged(source);
        metrics.urls("hard").inc_by(purged.hard.len() as u64);
        metrics.urls("soft").inc_by(purged.soft.len() as u64);
        let report = PurgeReport {
            removed: purged.hard.len(),
            stale: purged.soft.len(),
            rewarm: 0,
        };
        let Some(window) = window else {
            return Ok(report);
        };
        let mut keys = purged.soft;
        keys.extend(purged.hard);
        keys.truncate(max_urls);
        let plan = rewarm_plan(keys, window, after, &mut rand::rng());
        let report = PurgeReport {
            rewarm: plan.len(),
            ..report
        };
        tracing::info!(tenant = %request.tenant, prefix = %request.prefix, source, removed = report.removed, stale = report.stale, rewarm = report.rewarm, window_ms = window.as_millis() as u64, "purge");
        self.spawn_rewarm(request.tenant.clone(), plan);
        Ok(report)
    }

    fn config_has_tenant(&self, tenant: &TenantId) -> bool {
        self.config().tenants.iter().any(|t| &t.id == tenant)
    }

    /// Refills each key of `plan` at its instant from now (or once a re-warm slot is
    /// free, if later), through [`Node::warm`].
    fn spawn_rewarm(&self, tenant: TenantId, plan: Vec<(Duration, CacheKey)>) {
        let node = self.clone();
        node.metrics()
            .purge
            .rewarm_pending
            .inc_by(plan.len() as i64);
        tokio::spawn(async move {
            let start = Instant::now();
            for (at, key) in plan {
                tokio::time::sleep_until(start + at).await;
                // At most `purge.rewarm_concurrency` re-warm fills in flight on the
                // node, whatever the window: a late key waits for a slot.
                let Ok(slot) = Arc::clone(&node.inner.rewarm_slots).acquire_owned().await else {
                    return;
                };
                let node = node.clone();
                let tenant = tenant.clone();
                tokio::spawn(async move {
                    let _slot = slot;
                    let result = match node.warm(&tenant, key, Arc::from([])).await {
                        Ok(WarmFill::Filled { .. }) => "filled",
                        Ok(WarmFill::Cached) => "cached",
                        _ => "failed",
                    };
                    node.metrics().purge.rewarm_done(result);
                });
            }
        });
    }
}

/// `POST /purge` on the admin listener: a JSON [`PurgeRequest`] with
/// `Authorization: Bearer <purge.token_file's token>`. 200 with the
/// [`PurgeReport`]; 401 without the token; 404 when no token is configured (the
/// endpoint is off) or the tenant is unknown; 413 over [`MAX_PURGE_BODY`]; 400
/// naming the field otherwise.
pub(super) async fn purge_endpoint(State(node): State<Node>, request: Request) -> Response {
    let Some(token) = node.purge_token() else {
        return error(
            StatusCode::NOT_FOUND,
            "off",
            "no purge.token_file: purges are off",
        );
    };
    let offered = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if !offered.is_some_and(|o| same_token(o.as_bytes(), token.as_bytes())) {
        node.metrics().purge.rejected(RejectReason::BadSignature);
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a bearer token is required",
        );
    }
    let body = match axum::body::to_bytes(request.into_body(), MAX_PURGE_BODY).await {
        Ok(body) => body,
        Err(_) => {
            node.metrics().purge.rejected(RejectReason::TooLarge);
            let why = format!("body: larger than {MAX_PURGE_BODY} bytes");
            return error(StatusCode::PAYLOAD_TOO_LARGE, "too_large", &why);
        }
    };
    let request: PurgeRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            node.metrics().purge.rejected(RejectReason::InvalidField);
            return error(StatusCode::BAD_REQUEST, "invalid_field", &e.to_string());
        }
    };
    match node.purge(&request, "admin") {
        Ok(report) => (StatusCode::OK, axum::Json(report)).into_response(),
        Err(e) => {
            node.metrics().purge.rejected(e.reason());
            let status = match e {
                PurgeError::UnknownTenant(_) => StatusCode::NOT_FOUND,
                PurgeError::InvalidField(_) => StatusCode::BAD_REQUEST,
            };
            error(status, e.reason().as_str(), &e.to_string())
        }
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({"error": code, "message": message});
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}
