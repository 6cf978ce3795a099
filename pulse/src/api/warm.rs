//! The warm-up resources: `POST /api/warm` (an operator's warm-up, see `crate::warm`),
//! `GET /api/warm/{id}` (its progress) and `GET /api/warm` (the instance's warm-ups).

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use models::CacheKey;
use serde::Serialize;
use utoipa::ToSchema;

use super::heat;
use super::{ApiError, AppState, ErrorBody, MAX_HEATMAP_ROWS};
use crate::clock::wall_clock_ms;
use crate::warm::{Job, KeySource, MAX_KEYS, Progress, Refusal, WarmRequest};

/// A warm-up: what was asked and how far it got.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WarmResponse {
    /// The warm-up's id, for `GET /api/warm/{id}`.
    pub id: String,
    pub tenant: String,
    /// `"all"` or the region ids.
    #[schema(value_type = Object)]
    pub regions: serde_json::Value,
    pub not_before: u64,
    /// Keys proposed per second.
    pub pace: f64,
    pub created_ms: u64,
    pub progress: Progress,
}

impl WarmResponse {
    fn of(job: &Job) -> Self {
        WarmResponse {
            id: job.id.clone(),
            tenant: job.tenant.to_string(),
            regions: serde_json::to_value(&job.regions).unwrap_or_default(),
            not_before: job.not_before_ms,
            pace: job.pace,
            created_ms: job.created_ms,
            progress: job.progress(),
        }
    }
}

/// `GET /api/warm`: this instance's warm-ups, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WarmListResponse {
    pub warmups: Vec<WarmResponse>,
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        let status = match r.code {
            "too_many_jobs" => StatusCode::TOO_MANY_REQUESTS,
            "no_match" => StatusCode::UNPROCESSABLE_ENTITY,
            _ => StatusCode::BAD_REQUEST,
        };
        ApiError {
            status,
            ..ApiError::bad(r.code, r.message)
        }
    }
}

fn warm_off() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        ..ApiError::bad(
            "warm_off",
            "warm-ups need the fleet gate: this pulse runs with --no-prewarm",
        )
    }
}

/// Starts a warm-up: its commands go, paced, through the fleet's gate on the tenant's
/// warm budget. The tenant must be known to the heat map; a `prefix` is expanded to
/// the tenant's keys the heat map knows (its top 1000 of the last 60 s, fleet-wide)
/// that start with it.
#[utoipa::path(
    post,
    path = "/api/warm",
    request_body = WarmRequest,
    responses(
        (status = 202, description = "accepted; follow it at /api/warm/{id}", body = WarmResponse),
        (status = 400, description = "bad field (the message starts with it)", body = ErrorBody),
        (status = 404, description = "unknown tenant, or warm-ups off", body = ErrorBody),
        (status = 422, description = "the prefix matches no known key", body = ErrorBody),
        (status = 429, description = "too many unfinished warm-ups", body = ErrorBody)
    )
)]
pub(super) async fn start(
    State(state): State<AppState>,
    body: Result<Json<WarmRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<WarmResponse>), ApiError> {
    let desk = state.warm.clone().ok_or_else(warm_off)?;
    let Json(request) = body.map_err(|e| ApiError::bad("bad_body", e.body_text()))?;
    let checked = request.check(wall_clock_ms(), desk.rules().rate_per_s)?;
    // The heat map answers, fleet-wide, whether the tenant is known and what it holds.
    let rows = match &checked.keys {
        KeySource::Keys(_) => 1,
        KeySource::Prefix(_) => MAX_KEYS.min(MAX_HEATMAP_ROWS),
    };
    let tenant = checked.tenant.as_str();
    let known = heat::known_keys(&state, tenant, rows).await?;
    let keys: Vec<CacheKey> = match &checked.keys {
        KeySource::Keys(keys) => keys.clone(),
        KeySource::Prefix(prefix) => {
            let keys: Vec<CacheKey> = known
                .keys
                .into_iter()
                .map(|row| row.key)
                .filter(|key| key.as_str().starts_with(prefix.as_str()))
                .collect();
            if keys.is_empty() {
                return Err(Refusal {
                    code: "no_match",
                    message: format!(
                        "prefix: no key of tenant {tenant} known to the heat map starts with {prefix:?}"
                    ),
                }
                .into());
            }
            keys
        }
    };
    let job = desk.submit(checked, keys)?;
    Ok((StatusCode::ACCEPTED, Json(WarmResponse::of(&job))))
}

/// A warm-up's progress: commands proposed and failed, and per region what its edges
/// reported for the warm-up's keys (filled, already cached).
#[utoipa::path(
    get,
    path = "/api/warm/{id}",
    params(("id" = String, Path, description = "The warm-up's id")),
    responses(
        (status = 200, body = WarmResponse),
        (status = 404, description = "no such warm-up on this instance", body = ErrorBody)
    )
)]
pub(super) async fn progress(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<WarmResponse>, ApiError> {
    let Path(id) = id?;
    let desk = state.warm.clone().ok_or_else(warm_off)?;
    let job = desk.get(&id).ok_or_else(|| ApiError {
        status: StatusCode::NOT_FOUND,
        ..ApiError::bad(
            "unknown_warmup",
            format!("id: no warm-up {id:?} on this instance"),
        )
    })?;
    Ok(Json(WarmResponse::of(&job)))
}

/// This instance's warm-ups, newest first (at most 64).
#[utoipa::path(
    get,
    path = "/api/warm",
    responses((status = 200, body = WarmListResponse))
)]
pub(super) async fn list(State(state): State<AppState>) -> Json<WarmListResponse> {
    let warmups = state
        .warm
        .as_ref()
        .map(|desk| desk.list().iter().map(|j| WarmResponse::of(j)).collect())
        .unwrap_or_default();
    Json(WarmListResponse { warmups })
}
