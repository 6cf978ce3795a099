//! `GET /api/predictions` (recent pre-warm decisions with their reasons and outcome)
//! and `GET /api/model` (the model card).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::Uri;
use serde::Deserialize;
use utoipa::IntoParams;

use super::{ApiError, AppState, ErrorBody, count_param, fleet, one, owned, tenant_param};
use crate::fleet::{DecisionTotals, ModelResponse, PredictionsResponse, Scope, ScopeQuery, merge};

/// Most decisions one request may ask for.
pub(crate) const MAX_PREDICTIONS: usize = 500;

/// Query of `GET /api/predictions`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PredictionsQuery {
    /// Only this tenant's decisions.
    pub tenant: Option<String>,
    /// Rows, 1 to 500 (default 50), newest first.
    pub limit: Option<usize>,
    /// `local` or `fleet` (default).
    pub scope: Option<Scope>,
}

/// Recent pre-warm decisions with confidence, per-feature contributions and outcome.
#[utoipa::path(
    get,
    path = "/api/predictions",
    params(PredictionsQuery),
    responses(
        (status = 200, body = PredictionsResponse),
        (status = 400, description = "bad parameter", body = ErrorBody),
        (status = 404, description = "prediction is off", body = ErrorBody)
    )
)]
pub(super) async fn predictions(
    State(state): State<AppState>,
    uri: Uri,
    query: Result<Query<PredictionsQuery>, QueryRejection>,
) -> Result<Json<PredictionsResponse>, ApiError> {
    let Query(q) = query?;
    let tenant = q.tenant.as_deref().map(tenant_param).transpose()?;
    let limit = count_param("limit", q.limit, 50, MAX_PREDICTIONS)?;
    let local = {
        let partitions = state.read();
        if !partitions.prediction_on() {
            return Err(ApiError::prediction_off());
        }
        let parts = partitions
            .states()
            .iter()
            .filter_map(|(&p, s)| {
                let predictor = s.predictor.as_ref()?;
                let predictor = predictor.lock().unwrap_or_else(|e| e.into_inner());
                Some(PredictionsResponse::of(
                    &predictor,
                    tenant.as_ref(),
                    limit,
                    one(p, &partitions),
                ))
            })
            .collect();
        merge::predictions(parts, limit).unwrap_or_else(|| PredictionsResponse {
            totals: DecisionTotals {
                sent: 0,
                useful: 0,
                wasted: 0,
                skipped: BTreeMap::new(),
                scored: 0,
            },
            decisions: Vec::new(),
            coverage: owned(&partitions),
        })
    };
    fleet::answer(&state, q.scope, &uri, Ok(local), |parts| {
        merge::predictions(parts, limit)
    })
    .await
    .map(Json)
}

/// The model card: features, coefficients, training metrics, and the rules in force.
#[utoipa::path(
    get,
    path = "/api/model",
    params(ScopeQuery),
    responses(
        (status = 400, description = "bad parameter", body = ErrorBody),
        (status = 200, body = ModelResponse),
        (status = 404, description = "prediction is off", body = ErrorBody)
    )
)]
pub(super) async fn model(
    State(state): State<AppState>,
    uri: Uri,
    query: Result<Query<ScopeQuery>, QueryRejection>,
) -> Result<Json<ModelResponse>, ApiError> {
    let Query(q) = query?;
    let card = {
        let partitions = state.read();
        let (Some(model), Some(policy)) = (partitions.model(), partitions.policy()) else {
            return Err(ApiError::prediction_off());
        };
        ModelResponse::new(model, policy, owned(&partitions))
    };
    fleet::answer(&state, q.scope, &uri, Ok(card), merge::model)
        .await
        .map(Json)
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::super::tests::{get, state};
    use crate::api::app;

    #[tokio::test]
    async fn prediction_off_is_a_404_that_says_so() {
        let app = app(state());
        for uri in ["/api/predictions", "/api/model"] {
            let (status, err) = get(&app, uri).await;
            assert_eq!(
                (status, err["error"].as_str()),
                (StatusCode::NOT_FOUND, Some("prediction_off")),
                "{uri}"
            );
        }
    }
}
