//! `GET /api/warmset`: a region's hot keyset for some tenants, what a node that starts
//! cold fills before it takes traffic. The rows are the heat map's Top-K of that region
//! over the longest window (60 s), the tenants' together, hottest (highest rate) first.
//!
//! It is a fleet answer like `/api/heatmap`: each partition's rows, merged per
//! `(tenant, key)` (a key counted in several partitions adds up), then the peers'
//! `scope=local` answers merged the same way by `fleet::answer`, with the coverage
//! saying when a partition is missing. A tenant or region pulse has not seen gives no
//! rows (a region's first node has nothing to warm), never an error. Pulse keeps no
//! object sizes: the node bounds the bytes it warms by what it fills.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::Uri;
use models::{RegionId, TenantId};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::fleet::{self, Covered};
use super::{ApiError, AppState, ErrorBody, MAX_HEATMAP_ROWS, count_param, owned, tenant_param};
use crate::fleet::{Coverage, Scope, merge};
use crate::heat::Window;
use crate::partition::Partitions;

/// Most tenants one warm-set request may name.
pub(crate) const MAX_WARMSET_TENANTS: usize = 64;

/// The window a warm set's rates are measured over.
const WINDOW: Window = Window::S60;

/// Query of `GET /api/warmset` (documentation; the handler reads the pairs, since
/// `tenant` repeats).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct WarmsetQuery {
    /// The region (required).
    pub region: String,
    /// A tenant (required; repeat it for several, at most 64).
    pub tenant: Vec<String>,
    /// Rows, 1 to 1000 (default 100).
    pub limit: Option<usize>,
    /// Event time the window ends at (default: the newest watermark of the
    /// partitions).
    pub now_ms: Option<u64>,
    /// `local` or `fleet` (default).
    pub scope: Option<Scope>,
}

/// One key of a warm set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub(crate) struct WarmKey {
    /// The tenant.
    pub tenant: String,
    /// The cache key.
    pub key: String,
    /// Requests for it in the region over the window (Top-K count).
    pub count: u64,
    /// `count` per second of the window.
    pub rate: f64,
}

/// `GET /api/warmset`: a region's hottest keys for the tenants asked.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct WarmsetResponse {
    /// The region.
    pub region: String,
    /// The window the rates are over (`60s`).
    pub window: Window,
    /// Event time the window ends at.
    pub now_ms: u64,
    /// Hottest first (rate, then tenant and key), at most `limit`.
    pub keys: Vec<WarmKey>,
    /// The partitions the answer covers.
    pub coverage: Coverage,
}

impl Covered for WarmsetResponse {
    fn coverage_mut(&mut self) -> &mut Coverage {
        &mut self.coverage
    }
}

/// Partitions' or instances' warm sets as one: rows of one `(tenant, key)` added,
/// hottest first, the first `limit`. `None` when there is no part.
pub(crate) fn merge_warmsets(parts: Vec<WarmsetResponse>, limit: usize) -> Option<WarmsetResponse> {
    let coverage = merge::coverage(parts.iter().map(|p| &p.coverage));
    let mut parts = parts.into_iter();
    let mut out = parts.next()?;
    let mut rows: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut add = |keys: Vec<WarmKey>| {
        for k in keys {
            *rows.entry((k.tenant, k.key)).or_default() += k.count;
        }
    };
    add(std::mem::take(&mut out.keys));
    for part in parts {
        out.now_ms = out.now_ms.max(part.now_ms);
        add(part.keys);
    }
    out.keys = rows
        .into_iter()
        .map(|((tenant, key), count)| WarmKey {
            tenant,
            key,
            count,
            rate: count as f64 / WINDOW.seconds(),
        })
        .collect();
    // Counts order as rates do (one window); ties by tenant then key, so every
    // instance answers in the same order.
    out.keys.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| a.tenant.cmp(&b.tenant))
            .then_with(|| a.key.cmp(&b.key))
    });
    out.keys.truncate(limit);
    out.coverage = coverage;
    Some(out)
}

/// This instance's warm set: each owned partition's Top-K of `region` for each tenant.
fn local(
    partitions: &Partitions,
    region: &RegionId,
    tenants: &[TenantId],
    limit: usize,
    now_ms: u64,
) -> WarmsetResponse {
    let mut keys = Vec::new();
    for state in partitions.states().values() {
        for tenant in tenants {
            // A partition that has not seen the tenant or the region has no row.
            let Ok(rows) = state
                .heat
                .hot_keys(tenant, Some(region), WINDOW, limit, now_ms)
            else {
                continue;
            };
            keys.extend(rows.into_iter().map(|k| WarmKey {
                tenant: tenant.to_string(),
                key: k.key.to_string(),
                count: k.count,
                rate: 0.0,
            }));
        }
    }
    let part = WarmsetResponse {
        region: region.to_string(),
        window: WINDOW,
        now_ms,
        keys,
        coverage: owned(partitions),
    };
    merge_warmsets(vec![part], limit).expect("one part")
}

/// A region's hot keyset for some tenants, over the fleet: what a starting node
/// warms before it reports ready.
#[utoipa::path(
    get,
    path = "/api/warmset",
    params(WarmsetQuery),
    responses(
        (status = 200, body = WarmsetResponse),
        (status = 400, description = "bad parameter (named in the message)", body = ErrorBody)
    )
)]
pub(super) async fn warmset(
    State(state): State<AppState>,
    uri: Uri,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<WarmsetResponse>, ApiError> {
    let Query(pairs) = query?;
    let mut region = None;
    let mut tenants = Vec::new();
    let mut limit = None;
    let mut now_ms = None;
    let mut scope = None;
    for (name, value) in &pairs {
        match name.as_str() {
            "region" => {
                region = Some(
                    RegionId::new(value.as_str())
                        .map_err(|e| ApiError::bad("invalid_region", format!("region: {e}")))?,
                )
            }
            "tenant" => tenants.push(tenant_param(value)?),
            "limit" => limit = Some(number::<usize>("limit", value)?),
            "now_ms" => now_ms = Some(number::<u64>("now_ms", value)?),
            "scope" => {
                scope = Some(
                    serde_json::from_value::<Scope>(serde_json::Value::String(value.clone()))
                        .map_err(|_| {
                            ApiError::bad(
                                "bad_parameter",
                                format!("scope: {value:?} is not local or fleet"),
                            )
                        })?,
                )
            }
            _ => {}
        }
    }
    let region = region.ok_or_else(|| ApiError::bad("bad_parameter", "region: required"))?;
    if tenants.is_empty() {
        return Err(ApiError::bad("bad_parameter", "tenant: required"));
    }
    if tenants.len() > MAX_WARMSET_TENANTS {
        return Err(ApiError::bad(
            "bad_parameter",
            format!(
                "tenant: {} named, at most {MAX_WARMSET_TENANTS}",
                tenants.len()
            ),
        ));
    }
    tenants.sort();
    tenants.dedup();
    let limit = count_param("limit", limit, 100, MAX_HEATMAP_ROWS)?;
    let local = {
        let partitions = state.read();
        let now_ms = now_ms.unwrap_or_else(|| partitions.now_ms());
        local(&partitions, &region, &tenants, limit, now_ms)
    };
    fleet::answer(&state, scope, &uri, Ok(local), |parts| {
        merge_warmsets(parts, limit)
    })
    .await
    .map(Json)
}

fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, ApiError>
where
    T::Err: std::fmt::Display,
{
    value
        .parse()
        .map_err(|e| ApiError::bad("bad_parameter", format!("{name}: {value:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;
    use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId};

    use super::super::tests::{get, keys, properties};
    use crate::api::{AppState, app};
    use crate::heat::{HeatConfig, HeatMap};

    const T0: u64 = 1_764_470_000_000;

    /// `acme` in eu-west: /a 30 times, /b 20, /c 10; in us-east /z 50 times;
    /// `globex` in eu-west: /g 25 times.
    fn state() -> AppState {
        let mut heat = HeatMap::new(HeatConfig::default());
        let mut t = T0;
        let rows = [
            ("acme", "eu-west", "/a", 30),
            ("acme", "eu-west", "/b", 20),
            ("acme", "eu-west", "/c", 10),
            ("acme", "us-east", "/z", 50),
            ("globex", "eu-west", "/g", 25),
        ];
        for (tenant, region, key, n) in rows {
            for _ in 0..n {
                t += 10;
                let e = AccessEvent::new(
                    t,
                    TenantId::new(tenant).unwrap(),
                    CacheKey::new(key).unwrap(),
                    RegionId::new(region).unwrap(),
                    NodeId::new("edge-1").unwrap(),
                    Outcome::Hit,
                );
                heat.apply(&e).unwrap();
            }
        }
        let mut state = crate::api::tests::state();
        state.partitions = crate::partition::Partitions::single(heat, None);
        state
    }

    fn rows(body: &serde_json::Value) -> Vec<(String, String, u64)> {
        body["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| {
                (
                    k["tenant"].as_str().unwrap().to_string(),
                    k["key"].as_str().unwrap().to_string(),
                    k["count"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn the_regions_keys_of_the_tenants_asked_hottest_first() {
        let app = app(state());
        let (status, body) = get(
            &app,
            "/api/warmset?region=eu-west&tenant=acme&tenant=globex",
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let r = |t: &str, k: &str, n| (t.to_string(), k.to_string(), n);
        assert_eq!(
            rows(&body),
            vec![
                r("acme", "/a", 30),
                r("globex", "/g", 25),
                r("acme", "/b", 20),
                r("acme", "/c", 10)
            ]
        );
        assert_eq!(body["window"], "60s");
        assert!((body["keys"][0]["rate"].as_f64().unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(body["coverage"]["complete"], true);

        // Bounded by `limit`, only the tenants asked, only the region asked.
        let (_, body) = get(&app, "/api/warmset?region=eu-west&tenant=acme&limit=2").await;
        assert_eq!(rows(&body), vec![r("acme", "/a", 30), r("acme", "/b", 20)]);
        let (_, body) = get(&app, "/api/warmset?region=us-east&tenant=acme").await;
        assert_eq!(rows(&body), vec![r("acme", "/z", 50)]);

        // Nothing seen there yet: no rows, not an error.
        for uri in [
            "/api/warmset?region=ap-south&tenant=acme",
            "/api/warmset?region=eu-west&tenant=nobody",
        ] {
            let (status, body) = get(&app, uri).await;
            assert_eq!(status, StatusCode::OK, "{uri}: {body}");
            assert_eq!(rows(&body), vec![], "{uri}");
        }
    }

    /// Parts from several partitions or instances: a key counted in two adds up, the
    /// order is by the sum, the coverage is the union, the cut is after the merge.
    #[test]
    fn parts_merge_per_tenant_and_key() {
        use super::{WarmKey, WarmsetResponse, merge_warmsets};
        use crate::fleet::Coverage;
        let part = |p: i32, rows: &[(&str, &str, u64)]| WarmsetResponse {
            region: "eu-west".into(),
            window: crate::heat::Window::S60,
            now_ms: T0 + p as u64,
            keys: rows
                .iter()
                .map(|(t, k, n)| WarmKey {
                    tenant: t.to_string(),
                    key: k.to_string(),
                    count: *n,
                    rate: 0.0,
                })
                .collect(),
            coverage: Coverage::of(vec![p], 2),
        };
        let merged = merge_warmsets(
            vec![
                part(0, &[("acme", "/a", 10), ("acme", "/b", 8)]),
                part(1, &[("acme", "/a", 5), ("globex", "/b", 12)]),
            ],
            2,
        )
        .unwrap();
        let rows: Vec<(&str, &str, u64)> = merged
            .keys
            .iter()
            .map(|k| (k.tenant.as_str(), k.key.as_str(), k.count))
            .collect();
        assert_eq!(rows, [("acme", "/a", 15), ("globex", "/b", 12)]);
        assert!((merged.keys[0].rate - 0.25).abs() < 1e-9);
        assert!(merged.coverage.complete);
        assert_eq!(merged.now_ms, T0 + 1);
    }

    #[tokio::test]
    async fn bad_input_is_a_400_naming_the_field() {
        let app = app(state());
        let many: String = (0..65).map(|i| format!("&tenant=t{i}")).collect();
        let many = format!("/api/warmset?region=eu-west{many}");
        let cases = [
            ("/api/warmset?tenant=acme", "bad_parameter", "region"),
            (
                "/api/warmset?region=eu%20west&tenant=acme",
                "invalid_region",
                "region",
            ),
            ("/api/warmset?region=eu-west", "bad_parameter", "tenant"),
            (
                "/api/warmset?region=eu-west&tenant=a%20b",
                "invalid_tenant",
                "tenant",
            ),
            (
                "/api/warmset?region=eu-west&tenant=acme&limit=0",
                "bad_parameter",
                "limit",
            ),
            (
                "/api/warmset?region=eu-west&tenant=acme&limit=1001",
                "bad_parameter",
                "limit",
            ),
            (
                "/api/warmset?region=eu-west&tenant=acme&limit=x",
                "bad_parameter",
                "limit",
            ),
            (
                "/api/warmset?region=eu-west&tenant=acme&scope=galaxy",
                "bad_parameter",
                "scope",
            ),
            (many.as_str(), "bad_parameter", "tenant"),
        ];
        for (uri, code, field) in cases {
            let (status, body) = get(&app, uri).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
            assert_eq!(body["error"], code, "{uri}: {body}");
            assert!(
                body["message"].as_str().unwrap().starts_with(field),
                "{uri}: {body}"
            );
        }
    }

    #[tokio::test]
    async fn behind_the_api_token_and_in_the_openapi_document() {
        let app = crate::api::require_api_token(app(state()), Some("s3cret"));
        let (status, _) = get(&app, "/api/warmset?region=eu-west&tenant=acme").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let response = tower::ServiceExt::oneshot(
            app.clone(),
            axum::http::Request::get("/api/warmset?region=eu-west&tenant=acme")
                .header("authorization", "Bearer s3cret")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(response.status(), StatusCode::OK);

        let app = crate::api::app(state());
        let (_, doc) = get(&app, "/api/openapi.json").await;
        assert!(doc["paths"]["/api/warmset"]["get"].is_object());
        let (_, body) = get(&app, "/api/warmset?region=eu-west&tenant=acme").await;
        assert_eq!(properties(&doc, "WarmsetResponse"), keys(&body));
        assert_eq!(properties(&doc, "WarmKey"), keys(&body["keys"][0]));
    }
}
