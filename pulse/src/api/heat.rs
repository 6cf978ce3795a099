//! The heat-map resources: `/api/tenants`, `/api/heatmap` and `/api/keys/{tenant}/{key}`.

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::Uri;
use models::{CacheKey, MAX_KEY_LEN, RegionId, TenantId};
use serde::Deserialize;
use utoipa::IntoParams;

use super::{
    ApiError, AppState, ErrorBody, HeatmapResponse, KeyResponse, MAX_HEATMAP_ROWS, TenantsResponse,
    count_param, fleet, one, owned, per_partition, required_tenant, tenant_param,
};
use crate::fleet::{Scope, ScopeQuery, merge};
use crate::heat::{QueryError, Window};
use crate::partition::Partitions;

/// Query of `GET /api/heatmap`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct HeatmapQuery {
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
pub(crate) struct KeyQuery {
    /// Event time the windows end at (default: the newest watermark), for replays and
    /// comparisons.
    pub now_ms: Option<u64>,
    /// `local` or `fleet` (default).
    pub scope: Option<Scope>,
    /// Only these partitions, comma-separated (what a fleet question routed by the
    /// producers' partitioner asks its peers); default: the key's owners if the
    /// partitioner is known, else every partition.
    pub partitions: Option<String>,
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
pub(super) async fn tenants(
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
/// The tenant's `n` hottest keys of the last 60 s, fleet-wide, as `/api/heatmap`
/// answers them: how a warm-up or a purge learns that the tenant is known (else the
/// heat map's 404, its message naming `tenant`) and which keys it holds.
pub(super) async fn known_keys(
    state: &AppState,
    tenant: &str,
    n: usize,
) -> Result<HeatmapResponse, ApiError> {
    let uri: Uri = format!("/api/heatmap?tenant={tenant}&window=60s&n={n}")
        .parse()
        .map_err(|_| ApiError::bad("invalid_tenant", "tenant: not usable in a query"))?;
    let query = HeatmapQuery {
        tenant: Some(tenant.to_owned()),
        region: None,
        window: Some("60s".into()),
        n: Some(n),
        now_ms: None,
        scope: None,
    };
    let Json(known) = heatmap(State(state.clone()), uri, Ok(Query(query)))
        .await
        .map_err(|e| ApiError {
            message: format!("tenant: {}", e.message),
            ..e
        })?;
    Ok(known)
}

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
pub(super) async fn heatmap(
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
/// from the partitions that may hold `tenant/key`: its owner when the producers'
/// partitioner is known (learnt from the messages consumed), else every partition.
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
pub(super) async fn key_stats(
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
    let asked = q
        .partitions
        .as_deref()
        .map(|list| {
            list.split(',')
                .map(|p| p.trim().parse::<i32>())
                .collect::<Result<Vec<i32>, _>>()
                .map_err(|e| ApiError::bad("bad_partitions", format!("partitions: {e}")))
        })
        .transpose()?;
    let (local, route, partitioner, partition_count, owned_here) = {
        let partitions = state.read();
        let message_key = models::message_key(tenant.as_str(), key.as_str());
        let partitioner = partitions.ownership().fitting();
        // The partitions that may hold the key: those the asker routed to, or its
        // owners under every count the topic had, or (partitioner unknown) all.
        let route = asked.or_else(|| partitions.ownership().route(message_key.as_bytes()));
        let local = local_key(&partitions, &tenant, &key, q.now_ms, route.as_deref());
        (
            local,
            route,
            partitioner,
            partitions.partition_count(),
            partitions.owned(),
        )
    };
    // The peers are asked for the same partitions, so every instance's answer is the
    // sum of the same parts.
    let uri = match (&route, &q.partitions) {
        (Some(route), None) => {
            let list: Vec<String> = route.iter().map(i32::to_string).collect();
            let sep = if uri.query().is_some() { '&' } else { '?' };
            let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
            format!("{path}{sep}partitions={}", list.join(","))
                .parse()
                .unwrap_or(uri)
        }
        _ => uri,
    };
    // The key's owners, when the group said which peer each of its partitions is
    // on: only they are asked.
    let only: Option<std::sync::Arc<[crate::fleet::PeerUrl]>> = match (&route, &state.peers) {
        (Some(route), Some(peers)) if q.partitions.is_none() => {
            let owners: Option<Vec<_>> = route
                .iter()
                .filter(|p| !owned_here.contains(p))
                .map(|&p| peers.owner_of(p))
                .collect();
            owners.map(|mut urls| {
                urls.sort();
                urls.dedup();
                urls.into()
            })
        }
        _ => None,
    };
    let asked_owners = only.is_some();
    let mut answer = fleet::answer_from(&state, q.scope, &uri, local, merge::key, only).await;
    if let (true, Some(route), Some(peers)) = (asked_owners, &route, &state.peers) {
        if let Ok(out) = &mut answer {
            // Only the owners were asked: whole when each of the key's partitions
            // was covered once, none replaying, every owner asked answering.
            out.coverage.complete =
                merge::key_complete(route, &out.ownership.partitions, &out.coverage);
        }
        // The owners the group's description named may have moved since (it is
        // read every 2 s): when they did not make the answer whole, and no partition
        // of the key is replaying (that answer stays partial anyway), every peer that
        // did not fail is asked, and the answer is whole if every partition is
        // covered once.
        let coverage = match &answer {
            Ok(out) => Some(&out.coverage),
            Err(e) if matches!(e.code, "incomplete" | "owner_unavailable") => e.coverage.as_deref(),
            Err(_) => None,
        };
        let retry = coverage.filter(|c| {
            q.scope != Some(Scope::Local)
                && !c.complete
                && !route.iter().any(|p| c.replaying.contains(p))
        });
        if let Some(first) = retry {
            let failed = first.missing_peers.clone();
            let others: std::sync::Arc<[crate::fleet::PeerUrl]> = peers
                .urls()
                .iter()
                .filter(|u| !failed.iter().any(|f| f == u.as_str()))
                .cloned()
                .collect();
            let local = local_key(&state.read(), &tenant, &key, q.now_ms, Some(route));
            answer = fleet::answer_from(&state, q.scope, &uri, local, merge::key, Some(others))
                .await
                .map(|mut out| {
                    out.coverage.missing_peers.extend(failed);
                    out.coverage.missing_peers.sort();
                    out.coverage.missing_peers.dedup();
                    out
                });
        }
    }
    answer.map(|mut out| {
        // A peer's answer (the asker named the partitions) says which it counted, so
        // the asker's merge sees each partition once; this instance's own answer names
        // the key's partitions.
        if q.partitions.is_none() {
            out.ownership.partitioner = partitioner.map(|p| p.as_str().to_string());
            out.ownership.partitions = route.unwrap_or_else(|| (0..partition_count).collect());
        }
        Json(out)
    })
}

/// This instance's answer for `tenant/key` from its partitions on `route` (all when
/// `None`): their estimates added, covering every owned partition (those off the route
/// hold nothing of the key); a refusal when none has the tenant, or none is owned.
fn local_key(
    partitions: &Partitions,
    tenant: &TenantId,
    key: &CacheKey,
    now_ms: Option<u64>,
    route: Option<&[i32]>,
) -> Result<KeyResponse, ApiError> {
    let now_ms = now_ms.unwrap_or_else(|| partitions.now_ms());
    let mut parts = Vec::new();
    let mut refusal = None;
    for (&p, state) in partitions.states() {
        if route.is_some_and(|r| !r.contains(&p)) {
            continue;
        }
        match KeyResponse::of(&state.heat, tenant, key, now_ms, one(p, partitions)) {
            Ok(part) => parts.push(part),
            Err(e) => refusal = Some(ApiError::from(e)),
        }
    }
    let coverage = owned(partitions);
    match merge::key(parts) {
        Some(merged) => Ok(KeyResponse { coverage, ..merged }),
        None => Err(match refusal {
            Some(e) => e.covering(coverage),
            None => ApiError::owner_unavailable(route.unwrap_or(&[]), partitions),
        }),
    }
}
