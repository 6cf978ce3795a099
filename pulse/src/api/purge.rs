//! `POST /api/purge`: a tenant's prefix purged on the edges of some or all regions,
//! and re-warmed by them over a window if asked (`docs/warming.md#purges`). The
//! command is signed with pulse's key and sent to the pre-warm topic; it passes no
//! gate (a purge spends no fill budget; its re-warm runs on each edge at background
//! priority, spread over the window).

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use models::{
    CacheKey, DecodeError, PurgeCommand, PurgeMode, RegionTargets, TenantId, decode, encode,
};
use serde::Deserialize;
use utoipa::ToSchema;

use super::heat;
use super::{ApiError, AppState, ErrorBody};
use crate::clock::wall_clock_ms;

/// `POST /api/purge`: what to purge, where, and the re-warm.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PurgeBody {
    /// A tenant the heat map knows.
    pub tenant: String,
    /// Every key of the tenant that starts with it (at most 1024 bytes).
    pub prefix: String,
    /// Only the keys whose responses carried this tag (`Surrogate-Key`, `Cache-Tag`).
    #[serde(default)]
    pub tag: Option<String>,
    /// `"all"` (default) or a list of region ids.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub regions: Option<serde_json::Value>,
    /// `"hard"` (default: removed) or `"soft"` (served stale until re-warmed; needs
    /// `rewarm_window_ms`).
    #[serde(default)]
    #[schema(value_type = String)]
    pub mode: Option<PurgeMode>,
    /// Each edge re-warms what it purged over this many milliseconds (1 to 3 600 000).
    #[serde(default)]
    pub rewarm_window_ms: Option<u64>,
}

fn purges_off() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        ..ApiError::bad(
            "purge_off",
            "purges need the pre-warm topic: this pulse runs with --no-prewarm",
        )
    }
}

/// Purges a tenant's prefix on the fleet's edges: one signed command on the pre-warm
/// topic. Answers 202 with the command sent.
#[utoipa::path(
    post,
    path = "/api/purge",
    request_body = PurgeBody,
    responses(
        (status = 202, description = "sent to the fleet", body = Object),
        (status = 400, description = "bad field (the message starts with it)", body = ErrorBody),
        (status = 404, description = "unknown tenant, or purges off", body = ErrorBody)
    )
)]
pub(super) async fn purge(
    State(state): State<AppState>,
    body: Result<Json<PurgeBody>, JsonRejection>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let desk = state.warm.clone().ok_or_else(purges_off)?;
    let Json(body) = body.map_err(|e| ApiError::bad("bad_body", e.body_text()))?;
    let tenant = TenantId::new(&body.tenant)
        .map_err(|e| ApiError::bad("invalid_tenant", format!("tenant: {e}")))?;
    let prefix = CacheKey::new(&body.prefix)
        .map_err(|e| ApiError::bad("bad_parameter", format!("prefix: {e}")))?;
    let regions = match body.regions {
        None => RegionTargets::All,
        Some(v) => crate::warm::regions(v)?,
    };
    // The tenant must be known to the heat map, fleet-wide, as for a warm-up.
    heat::known_keys(&state, tenant.as_str(), 1).await?;
    let now = wall_clock_ms();
    let mut command = PurgeCommand::new(
        format!("purge-{now}-{:08x}", rand::random::<u32>()),
        tenant,
        prefix,
        now,
        desk.command_ttl_ms(),
        regions,
    );
    command.tag = body.tag;
    command.mode = body.mode.unwrap_or_default();
    command.rewarm_window_ms = body.rewarm_window_ms;
    if command.mode == PurgeMode::Soft && command.rewarm_window_ms.is_none() {
        return Err(ApiError::bad(
            "bad_parameter",
            "rewarm_window_ms: a soft purge needs one (stale is served only until the re-warm)",
        ));
    }
    // The wire checks (prefix length, window, size) are the edges' own.
    let command: PurgeCommand = decode(&encode(&command)).map_err(|e| match e {
        DecodeError::InvalidField(m) => ApiError::bad("bad_parameter", m),
        other => ApiError::bad("bad_parameter", other.to_string()),
    })?;
    desk.purge(&command).map_err(|why| ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        ..ApiError::bad("send_failed", why)
    })?;
    tracing::info!(id = %command.id, tenant = %command.tenant, prefix = %command.prefix, "purge sent");
    let value = serde_json::to_value(&command).unwrap_or_default();
    Ok((StatusCode::ACCEPTED, Json(value)))
}
