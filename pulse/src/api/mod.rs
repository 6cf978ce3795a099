//! The dashboard API: the heat map, per-key estimates, per-second rates, counters per
//! kind of edge, pre-warm decisions and the model card, health, metrics and an OpenAPI
//! description, and the dashboard page at `/` that shows them; built by [`app`] so
//! tests drive it with `oneshot`.

mod auth;
mod dashboard;
mod edges;
mod predictions;
mod rates;

use auth::BearerTokenDoc;
pub use auth::require_api_token;

pub use predictions::{
    ContributionView, DecisionTotals, DecisionView, EvaluationView, LeadTime, MAX_PREDICTIONS,
    ModelFeature, ModelResponse, PredictionsQuery, PredictionsResponse, ReliabilityView,
};

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use models::{CacheKey, MAX_KEY_LEN, RegionId, TenantId};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, OpenApi, ToSchema};

use crate::heat::{
    EdgeSummary, EvictedTenant, HotKey, KeyStats, OutcomeCounts, QueryError, RegionCount,
    SketchKind, TenantSummary, Trend, Velocities, Window, WindowStats,
};
use crate::ingest::SharedHeatMap;
use crate::metrics::{Metrics, RouteLabel};
use crate::prewarm::SharedPredictor;

/// Most rows one heat-map request may ask for.
pub const MAX_HEATMAP_ROWS: usize = 1_000;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The heat map the ingest thread writes.
    pub heat: SharedHeatMap,
    /// The metrics `/metrics` serves.
    pub metrics: Arc<Metrics>,
    /// The predictor, when prediction is on.
    pub predictor: Option<SharedPredictor>,
}

/// The error body of every 4xx.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// A stable code: `unknown_tenant`, `unknown_region`, `bad_window`,
    /// `key_too_long`, `invalid_key`, `invalid_tenant`, `invalid_region`,
    /// `bad_parameter`.
    pub error: String,
    /// What is wrong, naming the parameter.
    pub message: String,
}

/// An error a handler returns; it becomes a JSON [`ErrorBody`].
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn prediction_off() -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: "prediction_off",
            message: "prediction is off in this pulse (started with --no-prewarm)".into(),
        }
    }

    fn bad(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code.to_owned(),
            message: self.message,
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<QueryError> for ApiError {
    fn from(e: QueryError) -> Self {
        let code = match e {
            QueryError::UnknownTenant(_) => "unknown_tenant",
            QueryError::UnknownRegion(_) => "unknown_region",
        };
        ApiError {
            status: StatusCode::NOT_FOUND,
            code,
            message: e.to_string(),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> Self {
        ApiError::bad("bad_parameter", e.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(e: PathRejection) -> Self {
        ApiError::bad("bad_parameter", e.body_text())
    }
}

fn tenant_param(value: &str) -> Result<TenantId, ApiError> {
    TenantId::new(value).map_err(|e| ApiError::bad("invalid_tenant", format!("tenant: {e}")))
}

/// A `tenant` query parameter that must be present.
fn required_tenant(value: Option<&str>) -> Result<TenantId, ApiError> {
    tenant_param(value.ok_or_else(|| ApiError::bad("bad_parameter", "tenant: required"))?)
}

/// A count query parameter (`name`): `default` when absent, else within `1..=max`.
fn count_param(
    name: &str,
    value: Option<usize>,
    default: usize,
    max: usize,
) -> Result<usize, ApiError> {
    let n = value.unwrap_or(default);
    if !(1..=max).contains(&n) {
        return Err(ApiError::bad(
            "bad_parameter",
            format!("{name}: {n} is not in 1..={max}"),
        ));
    }
    Ok(n)
}

/// `GET /api/tenants`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TenantsResponse {
    /// The watermark: newest event time applied, ms since the Unix epoch.
    pub now_ms: u64,
    /// Additive error of an estimate from a tenant's own sketches, as a fraction of
    /// the tenant's events in the window.
    pub error_bound: f64,
    /// Additive error of an estimate from the shared sketch, as a fraction of the
    /// events of *every* tenant in it in the window.
    pub shared_error_bound: f64,
    /// Probability that an estimate exceeds the error bound.
    pub failure_probability: f64,
    /// Approximate bytes held by the sketches, trackers and keys.
    pub memory_bytes: u64,
    /// The limit on `memory_bytes`: a new tenant past it is rejected.
    pub memory_budget_bytes: u64,
    /// Tenants, by name, each with its own error bound.
    pub tenants: Vec<TenantSummary>,
    /// Tenants evicted after a minute without events, newest first (at most
    /// 10 000 summaries are kept).
    pub evicted: Vec<EvictedTenant>,
}

/// Query of `GET /api/heatmap`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HeatmapQuery {
    /// The tenant (required).
    pub tenant: Option<String>,
    /// Only this region's hot keys.
    pub region: Option<String>,
    /// `200ms`, `1s` (default), `10s` or `60s`.
    pub window: Option<String>,
    /// Rows, 1 to 1000 (default 20).
    pub n: Option<usize>,
    /// Event time the window ends at (default: the watermark), for replays.
    pub now_ms: Option<u64>,
}

/// `GET /api/heatmap`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HeatmapResponse {
    /// The tenant.
    pub tenant: String,
    /// The region, when the query named one.
    pub region: Option<String>,
    /// The window.
    pub window: Window,
    /// Event time the window ends at.
    pub now_ms: u64,
    /// Where the tenant's counts are now: its own sketches or the shared one.
    pub sketch: SketchKind,
    /// The additive error bound of each whole-tenant count in the window, in events
    /// (see `TenantSummary::error_bound_events_60s`).
    pub error_bound_events: u64,
    /// Hottest first.
    pub keys: Vec<HotKey>,
}

/// `GET /healthz`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok` when the process answers.
    pub status: String,
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
        tenants,
        heatmap,
        key_stats,
        predictions::predictions,
        predictions::model,
        rates::rates,
        edges::edges,
        healthz
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
        rates::RatesResponse,
        rates::RatePoint,
        edges::EdgesResponse,
        EdgeSummary,
        ErrorBody,
        TenantsResponse,
        HeatmapResponse,
        Health,
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
        Window
    )),
    modifiers(&BearerTokenDoc)
)]
struct ApiDoc;

/// The OpenAPI description served at `/api/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The router: every route, with request latency recorded per matched route. `/`
/// is the dashboard page (see `dashboard`).
pub fn app(state: AppState) -> Router {
    let mut router = Router::new()
        .route("/api/tenants", get(tenants))
        .route("/api/heatmap", get(heatmap))
        .route("/api/keys/{tenant}/{*key}", get(key_stats))
        .route("/api/predictions", get(predictions::predictions))
        .route("/api/model", get(predictions::model))
        .route("/api/openapi.json", get(|| async { Json(openapi()) }))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/api/rates", get(rates::rates))
        .route("/api/edges", get(edges::edges));
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

/// Tenants seen, with the sketches' error bound and memory.
#[utoipa::path(get, path = "/api/tenants", responses((status = 200, body = TenantsResponse)))]
async fn tenants(State(state): State<AppState>) -> Json<TenantsResponse> {
    let heat = state.heat.read().unwrap_or_else(|e| e.into_inner());
    Json(TenantsResponse {
        now_ms: heat.now_ms(),
        error_bound: heat.config().error_bound(),
        shared_error_bound: heat.config().shared_error_bound(),
        failure_probability: heat.config().failure_probability(),
        memory_bytes: heat.memory_bytes() as u64,
        memory_budget_bytes: heat.config().memory_budget_bytes,
        tenants: heat.tenants(),
        evicted: heat.evicted(),
    })
}

/// The heat map: a tenant's (or one region's) hottest keys over a window.
#[utoipa::path(
    get,
    path = "/api/heatmap",
    params(HeatmapQuery),
    responses(
        (status = 200, body = HeatmapResponse),
        (status = 400, description = "bad parameter", body = ErrorBody),
        (status = 404, description = "unknown tenant or region", body = ErrorBody)
    )
)]
async fn heatmap(
    State(state): State<AppState>,
    query: Result<Query<HeatmapQuery>, QueryRejection>,
) -> Result<Json<HeatmapResponse>, ApiError> {
    let Query(q) = query?;
    let tenant = required_tenant(q.tenant.as_deref())?;
    let region = q
        .region
        .as_deref()
        .map(RegionId::new)
        .transpose()
        .map_err(|e| ApiError::bad("invalid_region", format!("region: {e}")))?;
    let window = match q.window.as_deref() {
        None => Window::S1,
        Some(w) => w
            .parse()
            .map_err(|e| ApiError::bad("bad_window", format!("window: {e}")))?,
    };
    let n = count_param("n", q.n, 20, MAX_HEATMAP_ROWS)?;
    let heat = state.heat.read().unwrap_or_else(|e| e.into_inner());
    let now_ms = q.now_ms.unwrap_or_else(|| heat.now_ms());
    let keys = heat.hot_keys(&tenant, region.as_ref(), window, n, now_ms)?;
    let error_bound_events = heat.error_bound_events(&tenant, window, now_ms)?;
    let sketch = match heat.tenant(&tenant) {
        Some(t) if t.has_own_sketch() => SketchKind::Own,
        _ => SketchKind::Shared,
    };
    Ok(Json(HeatmapResponse {
        tenant: tenant.to_string(),
        region: region.map(|r| r.to_string()),
        window,
        now_ms,
        sketch,
        error_bound_events,
        keys,
    }))
}

/// Estimates for one key: per window and outcome, miss regions, acceleration, trend.
/// The key is the rest of the path (`/api/keys/acme/img/logo.png`) or one
/// URL-encoded segment (`/api/keys/acme/%2Fimg%2Flogo.png`); encode `?` as `%3F`.
#[utoipa::path(
    get,
    path = "/api/keys/{tenant}/{key}",
    params(
        ("tenant" = String, Path, description = "The tenant"),
        ("key" = String, Path, description = "The cache key, without or with its leading '/'")
    ),
    responses(
        (status = 200, body = KeyStats),
        (status = 400, description = "invalid or too long key", body = ErrorBody),
        (status = 404, description = "unknown tenant", body = ErrorBody)
    )
)]
async fn key_stats(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<KeyStats>, ApiError> {
    let Path((tenant, key)) = path?;
    let tenant = tenant_param(&tenant)?;
    let key = if key.starts_with('/') {
        key
    } else {
        format!("/{key}")
    };
    if key.len() > MAX_KEY_LEN {
        return Err(ApiError::bad(
            "key_too_long",
            format!("key: {} bytes, longer than {MAX_KEY_LEN}", key.len()),
        ));
    }
    let key = CacheKey::new(key).map_err(|e| ApiError::bad("invalid_key", format!("key: {e}")))?;
    let heat = state.heat.read().unwrap_or_else(|e| e.into_inner());
    let now_ms = heat.now_ms();
    Ok(Json(heat.key_stats(&tenant, &key, now_ms)?))
}

/// Liveness.
#[utoipa::path(get, path = "/healthz", responses((status = 200, body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".to_owned(),
    })
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::RwLock;

    use axum::body::Body;
    use axum::http::Request;
    use models::{AccessEvent, NodeId, Outcome};
    use serde_json::Value;
    use tower::ServiceExt;

    use super::*;
    use crate::heat::{HeatConfig, HeatMap};

    const T0: u64 = 1_764_470_000_000;

    pub(super) fn state() -> AppState {
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
            heat: Arc::new(RwLock::new(heat)),
            metrics: Arc::new(Metrics::new()),
            predictor: None,
        }
    }

    pub(super) async fn get(app: &Router, uri: &str) -> (StatusCode, Value) {
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

    pub(super) fn properties(doc: &Value, schema: &str) -> BTreeSet<String> {
        doc["components"]["schemas"][schema]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("no schema {schema}"))
            .keys()
            .cloned()
            .collect()
    }

    pub(super) fn keys(v: &Value) -> BTreeSet<String> {
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
        assert_eq!(properties(&doc, "KeyStats"), keys(&stats));
        assert_eq!(properties(&doc, "WindowStats"), keys(&stats["windows"][0]));
        assert_eq!(
            properties(&doc, "OutcomeCounts"),
            keys(&stats["windows"][0]["counts"])
        );
        let (_, err) = get(&app, "/api/heatmap?tenant=nobody").await;
        assert_eq!(properties(&doc, "ErrorBody"), keys(&err));
    }
}
