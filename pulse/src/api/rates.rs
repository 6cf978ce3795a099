//! `GET /api/rates`: requests/s and misses/s per second over the last 60 s of event
//! time, for the dashboard's load chart. Requests are client demand
//! ([`Outcome::is_demand`](models::Outcome::is_demand)): pre-warm fills do not count.
//!
//! The heat map keeps no per-second totals of a tenant, only sketches per bucket, so
//! the series is the sum over the tenant's hottest keys (the heat map's candidates
//! over the 60 s window). A key's count in second `s` is the difference of its 60 s
//! windows ending at `s` and at `s - 1`: the older window's extra bucket has already
//! left the ring, so the difference is exactly that second's estimate. Under a
//! stampede the misses that reach the origin are concentrated on those keys, which
//! is what the chart is for; the long tail of cold keys is not counted.
//!
//! Over several partitions the series is the sum over each partition's hottest keys
//! (keys live in one partition each), so it does not depend on which instance owns
//! which partition.
//!
//! Cost: 61 window queries per key under the heat map's read lock, so the number of
//! keys is capped at 100 (20 by default) per partition.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::Uri;
use serde::Deserialize;
use utoipa::IntoParams;

use super::{ApiError, AppState, ErrorBody, count_param, fleet, per_partition, required_tenant};
use crate::fleet::{RatesResponse, Scope, merge};
use crate::heat::QueryError;

/// Most keys one rates request may sum over.
const MAX_RATE_KEYS: usize = 100;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct RatesQuery {
    /// The tenant (required).
    tenant: Option<String>,
    /// Hottest keys summed per partition, 1 to 100 (default 20).
    keys: Option<usize>,
    /// Event time the last second ends at (default: the newest watermark), for
    /// replays and comparisons.
    now_ms: Option<u64>,
    /// `local` or `fleet` (default).
    scope: Option<Scope>,
}

#[utoipa::path(
    get,
    path = "/api/rates",
    params(RatesQuery),
    responses(
        (status = 200, body = RatesResponse),
        (status = 400, description = "bad parameter", body = ErrorBody),
        (status = 404, description = "unknown tenant", body = ErrorBody)
    )
)]
pub(super) async fn rates(
    State(state): State<AppState>,
    uri: Uri,
    query: Result<Query<RatesQuery>, QueryRejection>,
) -> Result<Json<RatesResponse>, ApiError> {
    let Query(q) = query?;
    let tenant = required_tenant(q.tenant.as_deref())?;
    let n = count_param("keys", q.keys, 20, MAX_RATE_KEYS)?;
    let local = {
        let partitions = state.read();
        let now_ms = q.now_ms.unwrap_or_else(|| partitions.now_ms());
        per_partition(&partitions, |heat, coverage| {
            Ok(RatesResponse::of(heat, &tenant, n, now_ms, coverage)?)
        })
        .and_then(|(parts, coverage)| {
            let merged = merge::rates(parts).ok_or_else(|| {
                ApiError::from(QueryError::UnknownTenant(tenant.to_string()))
                    .covering(coverage.clone())
            })?;
            Ok(RatesResponse { coverage, ..merged })
        })
    };
    fleet::answer(&state, q.scope, &uri, local, merge::rates)
        .await
        .map(Json)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::http::StatusCode;
    use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId};

    use super::super::tests::{get, keys, properties};
    use crate::api::app;
    use crate::heat::{HeatConfig, HeatMap};
    use crate::metrics::Metrics;

    /// Start of a second, so event `i` of second `s` is at `T0 + s * 1000 + i`.
    const T0: u64 = 1_764_470_000_000;

    /// Second `s` (0..10) has `s + 1` events of `/hot` (one miss) and one of `/cold`
    /// in even seconds; seconds 3 to 5 have none of `/hot` (a gap in the ring). Every
    /// second also has two pre-warm fills of `/hot`, which are no requests.
    fn state() -> super::AppState {
        let mut heat = HeatMap::new(HeatConfig::default());
        let event = |ts, key: &str, outcome| {
            AccessEvent::new(
                ts,
                TenantId::new("acme").unwrap(),
                CacheKey::new(key).unwrap(),
                RegionId::new("eu-west").unwrap(),
                NodeId::new("edge-1").unwrap(),
                outcome,
            )
        };
        for s in 0..10u64 {
            if !(3..=5).contains(&s) {
                for i in 0..=s {
                    let outcome = if i == 0 { Outcome::Miss } else { Outcome::Hit };
                    heat.apply(&event(T0 + s * 1000 + i, "/hot", outcome))
                        .unwrap();
                }
            }
            if s % 2 == 0 {
                heat.apply(&event(T0 + s * 1000 + 500, "/cold", Outcome::Hit))
                    .unwrap();
            }
            for _ in 0..2 {
                heat.apply(&event(T0 + s * 1000, "/hot", Outcome::PrefetchFill))
                    .unwrap();
            }
        }
        super::AppState {
            partitions: crate::partition::Partitions::single(heat, None),
            metrics: Arc::new(Metrics::new()),
            peers: None,
            warm: None,
        }
    }

    #[tokio::test]
    async fn rates_give_each_seconds_events_and_misses() {
        let app = app(state());
        let (status, body) = get(&app, "/api/rates?tenant=acme").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["tenant"], "acme");
        assert_eq!(body["keys"], 2);
        assert_eq!(body["now_ms"], T0 + 9 * 1000 + 9);
        let seconds = body["seconds"].as_array().unwrap();
        assert_eq!(seconds.len(), 60);
        // The last ten seconds are the trace's; the fifty before are empty.
        let tail = &seconds[50..];
        for (s, point) in tail.iter().enumerate() {
            let s = s as u64;
            assert_eq!(point["start_ms"], T0 + s * 1000, "second {s}");
            let hot = if (3..=5).contains(&s) { 0 } else { s + 1 };
            let cold = u64::from(s % 2 == 0);
            assert_eq!(point["events"], hot + cold, "second {s}: {point}");
            assert_eq!(point["misses"], u64::from(hot > 0), "second {s}: {point}");
        }
        assert!(
            seconds[..50]
                .iter()
                .all(|p| p["events"] == 0 && p["misses"] == 0)
        );

        let (_, one) = get(&app, "/api/rates?tenant=acme&keys=1").await;
        assert_eq!(one["keys"], 1);
        assert_eq!(one["seconds"][59]["events"], 10, "only /hot: {one}");
        assert_eq!(one["seconds"][50]["events"], 1, "only /hot: {one}");
    }

    #[tokio::test]
    async fn rates_refuse_bad_parameters() {
        let app = app(state());
        for (uri, status, code) in [
            ("/api/rates", StatusCode::BAD_REQUEST, "bad_parameter"),
            (
                "/api/rates?tenant=acme&keys=0",
                StatusCode::BAD_REQUEST,
                "bad_parameter",
            ),
            (
                "/api/rates?tenant=acme&keys=101",
                StatusCode::BAD_REQUEST,
                "bad_parameter",
            ),
            (
                "/api/rates?tenant=nobody",
                StatusCode::NOT_FOUND,
                "unknown_tenant",
            ),
            (
                "/api/rates?tenant=a%20b",
                StatusCode::BAD_REQUEST,
                "invalid_tenant",
            ),
        ] {
            let (got, body) = get(&app, uri).await;
            assert_eq!((got, body["error"].as_str()), (status, Some(code)), "{uri}");
        }
    }

    #[tokio::test]
    async fn openapi_matches_the_rates_handler() {
        let app = app(state());
        let (_, doc) = get(&app, "/api/openapi.json").await;
        assert!(doc["paths"]["/api/rates"]["get"].is_object());
        let (_, body) = get(&app, "/api/rates?tenant=acme").await;
        assert_eq!(properties(&doc, "RatesResponse"), keys(&body));
        assert_eq!(properties(&doc, "RatePoint"), keys(&body["seconds"][0]));
    }
}
