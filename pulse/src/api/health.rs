//! Liveness (`/healthz`) and the Prometheus metrics (`/metrics`).

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use crate::partition::PartitionHealth;

/// `GET /healthz`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct Health {
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

/// Liveness, and the partitions this instance owns with their applied offsets.
#[utoipa::path(get, path = "/healthz", responses((status = 200, body = Health)))]
pub(super) async fn healthz(State(state): State<AppState>) -> Json<Health> {
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
            .flat_map(|p| p.urls().iter().map(|u| u.to_string()).collect::<Vec<_>>())
            .collect(),
    })
}

pub(super) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}
