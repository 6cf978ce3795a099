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
pub const MAX_PREDICTIONS: usize = 500;

/// Query of `GET /api/predictions`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PredictionsQuery {
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
    use std::sync::Arc;

    use axum::http::StatusCode;

    use super::super::tests::{get, keys, properties, state};
    use crate::api::app;
    use crate::backtest::{ReplayOptions, Replayer};
    use crate::predict::{PredictorConfig, default_model};
    use crate::trace::{BurstKind, TraceSpec, generate as generate_trace};

    /// A predictor that has watched one viral event spread.
    fn state_with_decisions() -> (super::AppState, String) {
        let spec = TraceSpec {
            duration_ms: 60_000,
            background_rps: 100.0,
            virals: 1,
            noise: 0,
            crons: 0,
            flash_crowds: 0,
            ..TraceSpec::default()
        };
        let trace = generate_trace(&spec);
        let viral = trace
            .bursts
            .iter()
            .find(|b| b.kind == BurstKind::Viral)
            .unwrap();
        let options = ReplayOptions {
            predictor: PredictorConfig::default(),
            ..ReplayOptions::default()
        };
        let mut replayer = Replayer::new(Some(Arc::new(default_model())), &options);
        for event in &trace.events {
            replayer.feed(event);
        }
        replayer.finish(&options);
        let mut state = state();
        let heat = {
            let mut partitions = state.partitions.write().unwrap();
            std::mem::replace(
                &mut partitions.states_mut().get_mut(&0).unwrap().heat,
                crate::heat::HeatMap::new(Default::default()),
            )
        };
        state.partitions = crate::partition::Partitions::single(heat, Some(replayer.predictor));
        (state, viral.key.to_string())
    }

    #[tokio::test]
    async fn predictions_show_the_viral_key_with_its_reasons() {
        let (state, viral_key) = state_with_decisions();
        let app = app(state);
        let (status, body) = get(&app, "/api/predictions").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let decisions = body["decisions"].as_array().unwrap();
        let d = decisions
            .iter()
            .find(|d| d["key"] == viral_key.as_str())
            .unwrap_or_else(|| panic!("no decision for {viral_key}: {body}"));
        assert!(d["confidence"].as_f64().unwrap() >= 0.85);
        assert_eq!(d["verdict"], "useful");
        assert!(!d["lead_times"].as_array().unwrap().is_empty());
        let features = d["features"].as_array().unwrap();
        assert_eq!(features.len(), crate::predict::FEATURE_COUNT);
        let size = |f: &serde_json::Value| f["contribution"].as_f64().unwrap().abs();
        assert!(
            features.windows(2).all(|w| size(&w[0]) >= size(&w[1])),
            "largest first"
        );
        assert!(body["totals"]["sent"].as_u64().unwrap() >= 1);

        let (_, none) = get(&app, "/api/predictions?tenant=nobody").await;
        assert!(none["decisions"].as_array().unwrap().is_empty());
        let (status, err) = get(&app, "/api/predictions?limit=0").await;
        assert_eq!(
            (status, err["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some("bad_parameter"))
        );
        assert!(err["message"].as_str().unwrap().contains("limit"));
        let (status, err) = get(&app, "/api/predictions?tenant=no%20spaces").await;
        assert_eq!(
            (status, err["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_tenant"))
        );
    }

    #[tokio::test]
    async fn model_card_lists_features_and_rules() {
        let (state, _) = state_with_decisions();
        let app = app(state);
        let (status, card) = get(&app, "/api/model").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(card["name"], default_model().name.as_str());
        assert_eq!(
            card["features"].as_array().unwrap().len(),
            crate::predict::FEATURE_COUNT
        );
        assert_eq!(card["threshold"], 0.85);
    }

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

    #[tokio::test]
    async fn openapi_matches_the_prediction_handlers() {
        let (state, _) = state_with_decisions();
        let app = app(state);
        let (_, doc) = get(&app, "/api/openapi.json").await;
        for path in ["/api/predictions", "/api/model"] {
            assert!(doc["paths"][path]["get"].is_object(), "{path} missing");
        }
        let (_, body) = get(&app, "/api/predictions").await;
        assert_eq!(properties(&doc, "PredictionsResponse"), keys(&body));
        assert_eq!(properties(&doc, "DecisionTotals"), keys(&body["totals"]));
        let d = &body["decisions"][0];
        assert_eq!(properties(&doc, "DecisionView"), keys(d));
        assert_eq!(
            properties(&doc, "ContributionView"),
            keys(&d["features"][0])
        );
        assert_eq!(properties(&doc, "LeadTime"), keys(&d["lead_times"][0]));
        let (_, card) = get(&app, "/api/model").await;
        assert_eq!(properties(&doc, "ModelResponse"), keys(&card));
        assert_eq!(properties(&doc, "ModelFeature"), keys(&card["features"][0]));
        assert_eq!(properties(&doc, "EvaluationView"), keys(&card["train"]));
        assert_eq!(
            properties(&doc, "ReliabilityView"),
            keys(&card["reliability"][0])
        );
    }
}
