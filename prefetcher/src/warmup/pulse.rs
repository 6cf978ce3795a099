//! Asking pulse for the warm set: one `GET /api/warmset` under
//! `warmup.request_timeout_ms`, its body read up to a bound, each row checked (a
//! tenant the node did not ask for, or a key that is not a valid cache key, is
//! dropped): pulse's answer is input like any other.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use models::{CacheKey, RegionId, TenantId};
use serde::Deserialize;

use crate::config::WarmupConfig;

/// Largest warm-set body read: 1000 rows of the longest keys, with room.
const MAX_BODY_BYTES: usize = 4 << 20;

#[derive(Deserialize)]
struct Answer {
    keys: Vec<Row>,
    #[serde(default)]
    coverage: Option<Coverage>,
}

/// Whether every partition of the heat map answered.
#[derive(Deserialize)]
struct Coverage {
    #[serde(default)]
    complete: bool,
}

#[derive(Deserialize)]
struct Row {
    tenant: String,
    key: String,
}

/// The warm set of `region` for `tenants`, hottest first, at most `limit` rows; an
/// error saying why when pulse gives none (unreachable, timeout, not 200, a body
/// that is not a warm set).
pub(crate) async fn fetch_warmset(
    config: &WarmupConfig,
    token: Option<&str>,
    region: &RegionId,
    tenants: &[TenantId],
    limit: usize,
) -> Result<Vec<(TenantId, CacheKey)>, String> {
    let mut uri = format!(
        "{}/api/warmset?region={region}&limit={limit}",
        config.pulse.trim_end_matches('/')
    );
    for t in tenants {
        uri.push_str("&tenant=");
        uri.push_str(t.as_str());
    }
    let mut request = Request::get(&uri);
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(Duration::from_millis(config.request_timeout_ms)));
    let client = Client::builder(TokioExecutor::new()).build(connector);
    let ask = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        if status != http::StatusCode::OK {
            return Err(format!("{uri}: status {status}"));
        }
        let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|e| format!("{uri}: body: {e}"))?
            .to_bytes();
        serde_json::from_slice::<Answer>(&body).map_err(|e| format!("{uri}: not a warm set: {e}"))
    };
    let answer = tokio::time::timeout(Duration::from_millis(config.request_timeout_ms), ask)
        .await
        .map_err(|_| format!("{uri}: no answer in {} ms", config.request_timeout_ms))??;
    if answer.coverage.is_some_and(|c| !c.complete) {
        tracing::info!(%uri, "warm set from pulse is partial: not every partition answered");
    }
    Ok(answer
        .keys
        .into_iter()
        .filter_map(|row| {
            let tenant = TenantId::new(row.tenant).ok()?;
            let key = CacheKey::new(row.key).ok()?;
            tenants.contains(&tenant).then_some((tenant, key))
        })
        .take(limit)
        .collect())
}
