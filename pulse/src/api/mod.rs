//! The dashboard API: the heat map, per-key estimates, per-second rates, counters per
//! kind of edge, pre-warm decisions and the model card, health, metrics and an OpenAPI
//! description, and the dashboard page at `/` that shows them; built by [`app`] so
//! tests drive it with `oneshot`.

mod auth;
mod dashboard;
mod edges;
mod fleet;
mod predictions;
mod rates;

use auth::BearerTokenDoc;
pub use auth::require_api_token;

pub use predictions::{MAX_PREDICTIONS, PredictionsQuery};

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::{StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use models::{CacheKey, MAX_KEY_LEN, RegionId, TenantId};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, OpenApi, ToSchema};

use crate::fleet::{Coverage, Peers, Scope, ScopeQuery, merge, partition_for_key};
use crate::heat::{
    EdgeSummary, EvictedTenant, HeatMap, HotKey, KeyStats, OutcomeCounts, QueryError, RegionCount,
    SketchKind, TenantSummary, Trend, Velocities, Window, WindowStats,
};
use crate::metrics::{Metrics, RouteLabel};
use crate::partition::{PartitionHealth, Partitions, SharedPartitions};

pub use crate::fleet::{
    ContributionView, DecisionTotals, DecisionView, EdgesResponse, ErrorBody, EvaluationView,
    HeatmapResponse, KeyResponse, LeadTime, ModelFeature, ModelResponse, PredictionsResponse,
    RatePoint, RatesResponse, ReliabilityView, TenantsResponse,
};

/// Most rows one heat-map request may ask for.
pub const MAX_HEATMAP_ROWS: usize = 1_000;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The owned partitions the ingest thread writes.
    pub partitions: SharedPartitions,
    /// The metrics `/metrics` serves.
    pub metrics: Arc<Metrics>,
    /// The other instances, asked for their part of every fleet answer.
    pub peers: Option<Peers>,
}

impl AppState {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Partitions> {
        self.partitions.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// The coverage of one partition's part of an answer.
fn one(partition: i32, partitions: &Partitions) -> Coverage {
    Coverage::of(vec![partition], partitions.partition_count())
}

/// The coverage of an answer that needs no partition's state (the model card), or
/// of an answer from no partition at all.
fn owned(partitions: &Partitions) -> Coverage {
    Coverage::of(partitions.owned(), partitions.partition_count())
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

/// An error a handler returns; it becomes a JSON [`ErrorBody`].
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    coverage: Option<Coverage>,
}

impl ApiError {
    fn prediction_off() -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: "prediction_off",
            message: "prediction is off in this pulse (started with --no-prewarm)".into(),
            coverage: None,
        }
    }

    fn owner_unavailable(partition: i32, partitions: &Partitions) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "owner_unavailable",
            message: format!(
                "partition {partition}, which owns the key, is not assigned to this instance"
            ),
            coverage: Some(owned(partitions)),
        }
    }

    /// The same refusal, saying which partitions were asked.
    fn covering(self, coverage: Coverage) -> Self {
        ApiError {
            coverage: Some(coverage),
            ..self
        }
    }

    fn bad(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code,
            message: message.into(),
            coverage: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code.to_owned(),
            message: self.message,
            coverage: self.coverage,
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
            coverage: None,
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
    /// Event time the window ends at (default: the newest watermark of the
    /// partitions), for replays and comparisons.
    pub now_ms: Option<u64>,
    /// `local` or `fleet` (default).
    pub scope: Option<Scope>,
}

/// Query of `GET /api/keys/{tenant}/{key}`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct KeyQuery {
    /// Event time the windows end at (default: the newest watermark), for replays and
    /// comparisons.
    pub now_ms: Option<u64>,
    /// `local` or `fleet` (default).
    pub scope: Option<Scope>,
}

/// `GET /healthz`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok` when the process answers.
    pub status: String,
    /// The events topic's partition count (0 until the first assignment).
    pub partition_count: i32,
    /// The partitions this instance owns, with their applied offsets.
    pub partitions: Vec<PartitionHealth>,
    /// The model in use, if prediction is on.
    pub model: Option<String>,
    /// The other instances this one asks for fleet answers (`--peers`).
    pub peers: Vec<String>,
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
#[utoipa::path(
    get,
    path = "/api/tenants",
    params(ScopeQuery),
    responses(
        (status = 200, body = TenantsResponse),
        (status = 400, description = "bad parameter", body = ErrorBody)
    )
)]
async fn tenants(
    State(state): State<AppState>,
    uri: Uri,
    query: Result<Query<ScopeQuery>, QueryRejection>,
) -> Result<Json<TenantsResponse>, ApiError> {
    let Query(q) = query?;
    let local = {
        let partitions = state.read();
        let parts = partitions
            .states()
            .iter()
            .map(|(&p, s)| TenantsResponse::of(&s.heat, one(p, &partitions)))
            .collect();
        merge::tenants(parts).unwrap_or_else(|| {
            let config = partitions.partition_heat_config();
            TenantsResponse {
                now_ms: 0,
                error_bound: config.error_bound(),
                shared_error_bound: config.shared_error_bound(),
                failure_probability: config.failure_probability(),
                memory_bytes: 0,
                memory_budget_bytes: 0,
                tenants: Vec::new(),
                evicted: Vec::new(),
                coverage: owned(&partitions),
            }
        })
    };
    fleet::answer(&state, q.scope, &uri, Ok(local), merge::tenants)
        .await
        .map(Json)
}

/// The heat map: a tenant's (or one region's) hottest keys over a window, merged
/// over the partitions at one `now_ms`.
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
    uri: Uri,
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
    let local = {
        let partitions = state.read();
        let now_ms = q.now_ms.unwrap_or_else(|| partitions.now_ms());
        per_partition(&partitions, |heat, coverage| {
            Ok(HeatmapResponse::of(
                heat,
                &tenant,
                region.as_ref(),
                window,
                n,
                now_ms,
                coverage,
            )?)
        })
        .and_then(|(parts, coverage)| {
            let merged = merge::heatmap(parts, n).ok_or_else(|| {
                ApiError::from(QueryError::UnknownTenant(tenant.to_string()))
                    .covering(coverage.clone())
            })?;
            Ok(HeatmapResponse { coverage, ..merged })
        })
    };
    fleet::answer(&state, q.scope, &uri, local, |parts| {
        merge::heatmap(parts, n)
    })
    .await
    .map(Json)
}

/// Estimates for one key: per window and outcome, miss regions, acceleration, trend;
/// from the partition that owns `tenant/key` (librdkafka's default partitioner).
/// The key is the rest of the path (`/api/keys/acme/img/logo.png`) or one
/// URL-encoded segment (`/api/keys/acme/%2Fimg%2Flogo.png`); encode `?` as `%3F`.
#[utoipa::path(
    get,
    path = "/api/keys/{tenant}/{key}",
    params(
        ("tenant" = String, Path, description = "The tenant"),
        ("key" = String, Path, description = "The cache key, without or with its leading '/'"),
        KeyQuery
    ),
    responses(
        (status = 200, body = KeyResponse),
        (status = 400, description = "invalid or too long key", body = ErrorBody),
        (status = 404, description = "unknown tenant", body = ErrorBody),
        (status = 503, description = "the owning partition is not assigned here", body = ErrorBody)
    )
)]
async fn key_stats(
    State(state): State<AppState>,
    uri: Uri,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<KeyQuery>, QueryRejection>,
) -> Result<Json<KeyResponse>, ApiError> {
    let Path((tenant, key)) = path?;
    let Query(q) = query?;
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
    let local = {
        let partitions = state.read();
        let owner = partition_for_key(
            models::message_key(tenant.as_str(), key.as_str()).as_bytes(),
            partitions.partition_count(),
        );
        match partitions.get(owner) {
            // Elsewhere in the fleet: the owner among the peers answers.
            None => Err(ApiError::owner_unavailable(owner, &partitions)),
            Some(part) => {
                // The key's windows end at the newest watermark, as the heat map's do.
                let now_ms = q.now_ms.unwrap_or_else(|| partitions.now_ms());
                part.heat
                    .key_stats(&tenant, &key, now_ms)
                    .map(|stats| KeyResponse {
                        stats,
                        // The owner's answer is the whole answer.
                        coverage: Coverage {
                            complete: true,
                            ..one(owner, &partitions)
                        },
                    })
                    .map_err(|e| ApiError::from(e).covering(one(owner, &partitions)))
            }
        }
    };
    fleet::answer(&state, q.scope, &uri, local, merge::key)
        .await
        .map(Json)
}

/// Liveness, and the partitions this instance owns with their applied offsets.
#[utoipa::path(get, path = "/healthz", responses((status = 200, body = Health)))]
async fn healthz(State(state): State<AppState>) -> Json<Health> {
    let partitions = state.read();
    Json(Health {
        status: "ok".to_owned(),
        partition_count: partitions.partition_count(),
        partitions: partitions.health(),
        model: partitions
            .prediction_on()
            .then(|| partitions.model().map(|m| m.name.clone()))
            .flatten(),
        peers: state
            .peers
            .iter()
            .flat_map(|p| p.urls())
            .map(|u| u.to_string())
            .collect(),
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
pub(crate) mod tests {
    use std::collections::BTreeSet;

    use axum::body::Body;
    use axum::http::Request;
    use models::{AccessEvent, NodeId, Outcome};
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
