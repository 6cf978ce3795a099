//! `GET /api/edges`: events, hits, misses, bytes, a recent rate and the nodes seen,
//! per kind of edge (prefetcher, nginx, Varnish), for the dashboard's panel that shows
//! them side by side. Counted as events apply (`heat::edges`); this only reads them.

use super::{ApiError, AppState, ErrorBody, fleet, one, owned};
use crate::fleet::{EdgesResponse, ScopeQuery, merge};
use crate::heat::{MAX_NODES_PER_EDGE, NODE_WINDOW_S, RATE_WINDOW_S};
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::Uri;

/// `GET /api/edges`.
#[utoipa::path(
    get,
    path = "/api/edges",
    params(ScopeQuery),
    responses(
        (status = 200, body = EdgesResponse),
        (status = 400, description = "bad parameter", body = ErrorBody)
    )
)]
pub(super) async fn edges(
    State(state): State<AppState>,
    uri: Uri,
    query: Result<Query<ScopeQuery>, QueryRejection>,
) -> Result<Json<EdgesResponse>, ApiError> {
    let Query(q) = query?;
    let local = {
        let partitions = state.read();
        let parts = partitions
            .states()
            .iter()
            .map(|(&p, s)| EdgesResponse::of(&s.heat, one(p, &partitions)))
            .collect();
        merge::edges(parts).unwrap_or_else(|| EdgesResponse {
            now_ms: 0,
            rate_window_s: RATE_WINDOW_S,
            node_window_s: NODE_WINDOW_S,
            max_nodes: MAX_NODES_PER_EDGE as u64,
            edges: Vec::new(),
            coverage: owned(&partitions),
        })
    };
    fleet::answer(&state, q.scope, &uri, Ok(local), merge::edges)
        .await
        .map(Json)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::http::StatusCode;
    use models::{AccessEvent, CacheKey, EdgeKind, NodeId, Outcome, RegionId, TenantId};

    use super::super::tests::{get, keys, properties};
    use crate::api::{AppState, app};
    use crate::heat::{HeatConfig, HeatMap};
    use crate::metrics::Metrics;

    const T0: u64 = 1_764_470_000_000;

    /// Two nginx nodes (3 hits, 1 miss), one Varnish node (1 miss), one prefetcher
    /// node (1 pre-warm fill), and one event that names no kind.
    fn state() -> AppState {
        let mut heat = HeatMap::new(HeatConfig::default());
        let sent = [
            (Some(EdgeKind::Nginx), "ngx-1", Outcome::Hit),
            (Some(EdgeKind::Nginx), "ngx-2", Outcome::Hit),
            (Some(EdgeKind::Nginx), "ngx-1", Outcome::Hit),
            (Some(EdgeKind::Nginx), "ngx-2", Outcome::Miss),
            (Some(EdgeKind::Varnish), "vc-1", Outcome::Miss),
            (Some(EdgeKind::Prefetcher), "pf-1", Outcome::PrefetchFill),
            (None, "old-1", Outcome::Hit),
        ];
        for (i, (edge, node, outcome)) in sent.into_iter().enumerate() {
            let mut e = AccessEvent::new(
                T0 + i as u64,
                TenantId::new("acme").unwrap(),
                CacheKey::new("/a.js").unwrap(),
                RegionId::new("eu-west").unwrap(),
                NodeId::new(node).unwrap(),
                outcome,
            );
            e.edge = edge;
            e.bytes = 10;
            heat.apply(&e).unwrap();
        }
        AppState {
            partitions: crate::partition::Partitions::single(heat, None),
            metrics: Arc::new(Metrics::new()),
            peers: None,
            warm: None,
        }
    }

    #[tokio::test]
    async fn edges_are_counted_per_kind_side_by_side() {
        let app = app(state());
        let (status, body) = get(&app, "/api/edges").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["now_ms"], T0 + 6);
        let edges = body["edges"].as_array().unwrap();
        let names: Vec<&str> = edges.iter().map(|e| e["edge"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            ["prefetcher", "nginx", "varnish", "other", "unspecified"]
        );
        let nginx = &edges[1];
        assert_eq!(
            (&nginx["events"], &nginx["hits"], &nginx["misses"]),
            (&4.into(), &3.into(), &1.into())
        );
        assert_eq!(nginx["hit_ratio"], 0.75);
        assert_eq!(nginx["nodes"], 2);
        assert_eq!(nginx["bytes"], 40);
        assert_eq!(nginx["rate_per_s"], 0.4);
        assert_eq!(edges[2]["events"], 1);
        assert_eq!(edges[0]["prefetch_fills"], 1);
        assert_eq!(edges[0]["hit_ratio"], serde_json::Value::Null);
        assert_eq!(edges[3]["events"], 0);
        assert_eq!(edges[3]["last_event_ms"], serde_json::Value::Null);
        assert_eq!(edges[4]["events"], 1);
    }

    #[tokio::test]
    async fn openapi_matches_the_edges_handler() {
        let app = app(state());
        let (_, doc) = get(&app, "/api/openapi.json").await;
        assert!(doc["paths"]["/api/edges"]["get"].is_object());
        let (_, body) = get(&app, "/api/edges").await;
        assert_eq!(properties(&doc, "EdgesResponse"), keys(&body));
        assert_eq!(properties(&doc, "EdgeSummary"), keys(&body["edges"][0]));
        assert_eq!(
            properties(&doc, "OutcomeCounts"),
            keys(&body["edges"][0]["outcomes"])
        );
    }
}
