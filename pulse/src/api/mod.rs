//! The dashboard API: the heat map, per-key estimates, per-second rates, counters per
//! kind of edge, pre-warm decisions and the model card, health, metrics and an OpenAPI
//! description, and the dashboard page at `/` that shows them; built by [`app`] so
//! tests drive it with `oneshot`.
//!
//! - here: [`AppState`], the router ([`app`]) and the OpenAPI document ([`openapi`]).
//! - `error`: [`ApiError`] and the query-parameter checks.
//! - `heat`, `predictions`, `rates`, `edges`, `health`: the handlers, by resource.
//! - `fleet`: a `scope=fleet` answer, merged with the peers' parts.
//! - `auth`: the bearer-token check; `dashboard`: the page at `/`.
//! - `warm`: operators' warm-ups (`POST /api/warm`, `GET /api/warm/{id}`).
//! - `warmset`: a region's hot keyset, what a node starting cold warms.

mod auth;
mod dashboard;
mod edges;
mod error;
mod fleet;
mod health;
mod heat;
mod predictions;
mod purge;
mod rates;
mod warm;
mod warmset;

use auth::BearerTokenDoc;
pub(crate) use auth::require_api_token;
pub(crate) use error::ApiError;
use error::{count_param, required_tenant, tenant_param};
pub(crate) use health::Health;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use utoipa::OpenApi;

use crate::fleet::{Coverage, Peers, Scope};
use crate::heat::{
    EdgeSummary, EvictedTenant, HeatMap, HotKey, KeyStats, OutcomeCounts, RegionCount, SketchKind,
    TenantSummary, Trend, Velocities, Window, WindowStats,
};
use crate::metrics::{Metrics, RouteLabel};
use crate::partition::{PartitionHealth, Partitions, SharedPartitions};

pub(crate) use crate::fleet::{
    ContributionView, DecisionTotals, DecisionView, EdgesResponse, ErrorBody, EvaluationView,
    HeatmapResponse, KeyOwnership, KeyResponse, LeadTime, ModelFeature, ModelResponse,
    PredictionsResponse, RatePoint, RatesResponse, ReliabilityView, TenantsResponse,
};

/// Most rows one heat-map request may ask for.
pub(crate) const MAX_HEATMAP_ROWS: usize = 1_000;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The owned partitions the ingest thread writes.
    pub partitions: SharedPartitions,
    /// The metrics `/metrics` serves.
    pub metrics: Arc<Metrics>,
    /// The other instances, asked for their part of every fleet answer.
    pub peers: Option<Peers>,
    /// Operators' warm-ups (`None`: no fleet gate, pulse runs with `--no-prewarm`).
    pub(crate) warm: Option<Arc<crate::warm::WarmDesk>>,
}

impl AppState {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Partitions> {
        self.partitions.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// The coverage of one partition's part of an answer.
fn one(partition: i32, partitions: &Partitions) -> Coverage {
    Coverage::of(vec![partition], partitions.partition_count()).replaying(replaying(partitions))
}

/// The owned partitions still replaying.
fn replaying(partitions: &Partitions) -> Vec<i32> {
    partitions
        .states()
        .values()
        .filter(|s| s.replaying())
        .map(|s| s.partition)
        .collect()
}

/// The coverage of an answer that needs no partition's state (the model card), or
/// of an answer from no partition at all.
fn owned(partitions: &Partitions) -> Coverage {
    Coverage::of(partitions.owned(), partitions.partition_count()).replaying(replaying(partitions))
}

/// Runs `query` on every owned partition's heat map; partitions that do not know the
/// tenant (or the region) are left out of the merge but stay in its coverage, since
/// their answer is "nothing". All of them not knowing it is the error.
fn per_partition<T>(
    partitions: &Partitions,
    mut query: impl FnMut(&HeatMap, Coverage) -> Result<T, ApiError>,
) -> Result<(Vec<T>, Coverage), ApiError> {
    let mut parts = Vec::new();
    let mut error = None;
    for (&p, state) in partitions.states() {
        match query(&state.heat, one(p, partitions)) {
            Ok(part) => parts.push(part),
            // An unknown region is the more precise refusal: keep it over the tenant's.
            Err(e) if e.code == "unknown_region" || error.is_none() => error = Some(e),
            Err(_) => {}
        }
    }
    if parts.is_empty() {
        if let Some(e) = error {
            return Err(e.covering(owned(partitions)));
        }
    }
    Ok((parts, owned(partitions)))
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "pulse dashboard API",
        description = "Heat map, per-key estimates and per-second rates from windowed \
            Count-Min sketches; counters per kind of edge; pre-warm decisions and the \
            model card. The dashboard page at `/` shows them."
    ),
    paths(
        heat::tenants,
        heat::heatmap,
        heat::key_stats,
        predictions::predictions,
        predictions::model,
        rates::rates,
        edges::edges,
        health::healthz,
        warm::start,
        warm::progress,
        warm::list,
        warmset::warmset,
        purge::purge
    ),
    components(schemas(
        PredictionsResponse,
        DecisionTotals,
        DecisionView,
        ContributionView,
        LeadTime,
        ModelResponse,
        ModelFeature,
        EvaluationView,
        ReliabilityView,
        RatesResponse,
        RatePoint,
        EdgesResponse,
        EdgeSummary,
        ErrorBody,
        TenantsResponse,
        HeatmapResponse,
        Health,
        PartitionHealth,
        Coverage,
        Scope,
        KeyResponse,
        KeyOwnership,
        TenantSummary,
        SketchKind,
        EvictedTenant,
        HotKey,
        KeyStats,
        WindowStats,
        OutcomeCounts,
        RegionCount,
        Velocities,
        Trend,
        Window,
        crate::warm::WarmRequest,
        warm::WarmResponse,
        warm::WarmListResponse,
        crate::warm::Progress,
        crate::warm::RegionProgress,
        crate::warm::Phase,
        warmset::WarmsetResponse,
        warmset::WarmKey,
        purge::PurgeBody
    )),
    modifiers(&BearerTokenDoc)
)]
struct ApiDoc;

/// The OpenAPI description served at `/api/openapi.json`.
pub(crate) fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The router: every route, with request latency recorded per matched route. `/`
/// is the dashboard page (see `dashboard`).
pub fn app(state: AppState) -> Router {
    let mut router = Router::new()
        .route("/api/tenants", get(heat::tenants))
        .route("/api/heatmap", get(heat::heatmap))
        .route("/api/keys/{tenant}/{*key}", get(heat::key_stats))
        .route("/api/predictions", get(predictions::predictions))
        .route("/api/model", get(predictions::model))
        .route("/api/openapi.json", get(|| async { Json(openapi()) }))
        .route("/healthz", get(health::healthz))
        .route("/metrics", get(health::metrics))
        .route("/api/rates", get(rates::rates))
        .route("/api/edges", get(edges::edges))
        .route("/api/warm", post(warm::start).get(warm::list))
        .route("/api/warm/{id}", get(warm::progress))
        .route("/api/purge", post(purge::purge))
        .route("/api/warmset", get(warmset::warmset));
    for (path, content_type, body) in dashboard::ASSETS {
        router = router.route(
            path,
            get(move || async move { dashboard::asset(content_type, body) }),
        );
    }
    router
        .route_layer(middleware::from_fn_with_state(state.clone(), track))
        .with_state(state)
}

async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let start = Instant::now();
    let response = next.run(request).await;
    state
        .metrics
        .request_seconds
        .get_or_create(&RouteLabel {
            route,
            status: response.status().as_u16(),
        })
        .observe(start.elapsed().as_secs_f64());
    response
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeSet;

    use axum::body::Body;
    use axum::http::Request;
    use axum::http::StatusCode;
    use models::{AccessEvent, CacheKey, MAX_KEY_LEN, NodeId, Outcome, RegionId, TenantId};
    use serde_json::Value;
    use tower::ServiceExt;

    use super::*;
    use crate::heat::{HeatConfig, HeatMap};

    const T0: u64 = 1_764_470_000_000;

    pub(crate) fn state() -> AppState {
        let mut heat = HeatMap::new(HeatConfig::default());
        for i in 0..40u64 {
            let (key, region) = if i % 4 == 0 {
                ("/cold.css", "us-east")
            } else {
                (
                    "/img/hot.png",
                    ["eu-west", "us-east", "ap-south"][i as usize % 3],
                )
            };
            let e = AccessEvent::new(
                T0 + i,
                TenantId::new("acme").unwrap(),
                CacheKey::new(key).unwrap(),
                RegionId::new(region).unwrap(),
                NodeId::new("edge-1").unwrap(),
                if i % 2 == 0 {
                    Outcome::Miss
                } else {
                    Outcome::Hit
                },
            );
            heat.apply(&e).unwrap();
        }
        AppState {
            partitions: crate::partition::Partitions::single(heat, None),
            metrics: Arc::new(Metrics::new()),
            peers: None,
            warm: None,
        }
    }

    pub(crate) async fn get(app: &Router, uri: &str) -> (StatusCode, Value) {
        let response = app
            .clone()
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, value)
    }

    #[tokio::test]
    async fn tenants_and_heatmap() {
        let app = app(state());
        let (status, body) = get(&app, "/api/tenants").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["tenants"][0]["tenant"], "acme");
        assert_eq!(body["tenants"][0]["events"], 40);
        assert_eq!(body["now_ms"], T0 + 39);

        let (status, body) = get(&app, "/api/heatmap?tenant=acme&window=10s&n=5").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["window"], "10s");
        let keys = body["keys"].as_array().unwrap();
        assert_eq!(keys[0]["key"], "/img/hot.png");
        assert_eq!(keys[0]["count"], 30);
        assert_eq!(keys[1]["key"], "/cold.css");
        assert_eq!(keys[0]["regions"].as_array().unwrap().len(), 3);
        assert!(keys[0]["velocities"]["10s"].as_f64().unwrap() > 0.0);

        let (status, body) = get(&app, "/api/heatmap?tenant=acme&region=us-east&window=60s").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["keys"][0]["key"], "/cold.css");
        assert_eq!(body["keys"][0]["count"], 10);
    }

    #[tokio::test]
    async fn key_stats_by_path_or_encoded_segment() {
        let app = app(state());
        let (status, a) = get(&app, "/api/keys/acme/img/hot.png").await;
        assert_eq!(status, StatusCode::OK, "{a}");
        let (_, b) = get(&app, "/api/keys/acme/%2Fimg%2Fhot.png").await;
        assert_eq!(a, b);
        assert_eq!(a["key"], "/img/hot.png");
        assert_eq!(a["windows"][3]["window"], "60s");
        assert_eq!(a["windows"][3]["total"], 30);
        assert_eq!(a["windows"][3]["counts"]["miss"], 10);
        assert_eq!(a["windows"][0]["miss_regions"].as_array().unwrap().len(), 3);
    }

    #[tokio::test]
    async fn bad_parameters_get_a_json_error_naming_the_problem() {
        let app = app(state());
        let long = "a".repeat(MAX_KEY_LEN + 1);
        let cases = [
            (
                "/api/heatmap?tenant=nobody",
                StatusCode::NOT_FOUND,
                "unknown_tenant",
                "nobody",
            ),
            (
                "/api/heatmap?tenant=acme&window=5m",
                StatusCode::BAD_REQUEST,
                "bad_window",
                "window",
            ),
            (
                "/api/heatmap?tenant=acme&region=mars",
                StatusCode::NOT_FOUND,
                "unknown_region",
                "mars",
            ),
            (
                "/api/heatmap?tenant=acme&n=0",
                StatusCode::BAD_REQUEST,
                "bad_parameter",
                "n:",
            ),
            (
                "/api/heatmap?tenant=acme&n=x",
                StatusCode::BAD_REQUEST,
                "bad_parameter",
                "n",
            ),
            (
                "/api/heatmap",
                StatusCode::BAD_REQUEST,
                "bad_parameter",
                "tenant",
            ),
            (
                "/api/heatmap?tenant=a%20b",
                StatusCode::BAD_REQUEST,
                "invalid_tenant",
                "tenant",
            ),
            (
                "/api/keys/nobody/x",
                StatusCode::NOT_FOUND,
                "unknown_tenant",
                "nobody",
            ),
            (
                &format!("/api/keys/acme/{long}"),
                StatusCode::BAD_REQUEST,
                "key_too_long",
                "2048",
            ),
            (
                "/api/keys/acme/a/../b",
                StatusCode::BAD_REQUEST,
                "invalid_key",
                "..",
            ),
        ];
        for (uri, status, code, needle) in cases {
            let (got, body) = get(&app, uri).await;
            assert_eq!(got, status, "{uri}: {body}");
            assert_eq!(body["error"], code, "{uri}: {body}");
            assert!(
                body["message"].as_str().unwrap().contains(needle),
                "{uri}: {body}"
            );
        }
    }

    #[tokio::test]
    async fn health_metrics_and_latency() {
        let app = app(state());
        let (status, body) = get(&app, "/healthz").await;
        assert_eq!(
            (status, body["status"].as_str()),
            (StatusCode::OK, Some("ok"))
        );
        let (status, body) = get(&app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        let text = body.as_str().unwrap();
        assert!(text.contains("pulse_events_consumed_total"), "{text}");
        assert!(
            text.contains(
                "pulse_http_request_duration_seconds_count{route=\"/healthz\",status=\"200\"} 1"
            ),
            "{text}"
        );
    }

    pub(crate) fn properties(doc: &Value, schema: &str) -> BTreeSet<String> {
        doc["components"]["schemas"][schema]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("no schema {schema}"))
            .keys()
            .cloned()
            .collect()
    }

    pub(crate) fn keys(v: &Value) -> BTreeSet<String> {
        v.as_object().unwrap().keys().cloned().collect()
    }

    /// The OpenAPI document lists every route, and its schemas name exactly the
    /// fields the handlers return.
    #[tokio::test]
    async fn openapi_matches_the_handlers() {
        let app = app(state());
        let (status, doc) = get(&app, "/api/openapi.json").await;
        assert_eq!(status, StatusCode::OK);
        for path in [
            "/api/tenants",
            "/api/heatmap",
            "/api/keys/{tenant}/{key}",
            "/healthz",
        ] {
            assert!(doc["paths"][path]["get"].is_object(), "{path} missing");
        }
        let (_, tenants) = get(&app, "/api/tenants").await;
        assert_eq!(properties(&doc, "TenantsResponse"), keys(&tenants));
        assert_eq!(
            properties(&doc, "TenantSummary"),
            keys(&tenants["tenants"][0])
        );
        let (_, heat) = get(&app, "/api/heatmap?tenant=acme&region=eu-west").await;
        assert_eq!(properties(&doc, "HeatmapResponse"), keys(&heat));
        let row = &heat["keys"][0];
        assert_eq!(properties(&doc, "HotKey"), keys(row));
        assert_eq!(properties(&doc, "Velocities"), keys(&row["velocities"]));
        assert_eq!(properties(&doc, "RegionCount"), keys(&row["regions"][0]));
        let (_, stats) = get(&app, "/api/keys/acme/img/hot.png").await;
        // `KeyResponse` is `KeyStats` with the coverage beside it.
        let parts = doc["components"]["schemas"]["KeyResponse"]["allOf"]
            .as_array()
            .expect("KeyResponse is KeyStats and more");
        assert_eq!(
            parts[0]["$ref"], "#/components/schemas/KeyStats",
            "{parts:?}"
        );
        let mut expected = properties(&doc, "KeyStats");
        expected.extend(parts[1]["properties"].as_object().unwrap().keys().cloned());
        assert_eq!(expected, keys(&stats));
        assert_eq!(properties(&doc, "Coverage"), keys(&stats["coverage"]));
        assert_eq!(properties(&doc, "TenantsResponse"), keys(&tenants));
        let (_, health) = get(&app, "/healthz").await;
        assert_eq!(properties(&doc, "Health"), keys(&health));
        assert_eq!(
            properties(&doc, "PartitionHealth"),
            keys(&health["partitions"][0])
        );
        for scope in ["local", "fleet"] {
            let (status, body) = get(&app, &format!("/api/tenants?scope={scope}")).await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
        let (status, body) = get(&app, "/api/tenants?scope=galaxy").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(properties(&doc, "WindowStats"), keys(&stats["windows"][0]));
        assert_eq!(
            properties(&doc, "OutcomeCounts"),
            keys(&stats["windows"][0]["counts"])
        );
        let (_, err) = get(&app, "/api/heatmap?tenant=nobody").await;
        assert_eq!(properties(&doc, "ErrorBody"), keys(&err));
    }
}
