//! `GET /api/predictions` (recent pre-warm decisions with their reasons and outcome)
//! and `GET /api/model` (the model card).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::Uri;
use models::RegionTargets;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use models::TenantId;

use super::{ApiError, AppState, ErrorBody, count_param, fleet, one, owned, tenant_param};
use crate::fleet::{Coverage, Scope, ScopeQuery, merge};
use crate::predict::{
    Decision, DecisionPolicy, Evaluation, Predictor, ScoringModel, Transform, Verdict,
};

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

/// One feature's part in a decision.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ContributionView {
    /// The feature.
    pub name: String,
    /// Its value at decision time.
    pub value: f64,
    /// What it added to the regression output.
    pub contribution: f64,
}

/// A region's first request after a command.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LeadTime {
    /// The warmed region.
    pub region: String,
    /// Milliseconds from the command to the region's first request.
    pub ms: u64,
}

/// One pre-warm decision.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DecisionView {
    /// The command id.
    pub id: String,
    /// The tenant.
    pub tenant: String,
    /// The key.
    pub key: String,
    /// The model's confidence.
    pub confidence: f64,
    /// When the command was issued (event time, ms since the epoch).
    pub issued_at_ms: u64,
    /// When it expires.
    pub expires_at_ms: u64,
    /// The regions it warms (`["all"]` for every region).
    pub regions: Vec<String>,
    /// `pending`, `useful` or `wasted`.
    pub verdict: String,
    /// Lead time per warmed region that then asked for the key.
    pub lead_times: Vec<LeadTime>,
    /// The model that scored it.
    pub model: String,
    /// The model's intercept.
    pub intercept: f64,
    /// Each feature's value and contribution, largest contribution first.
    pub features: Vec<ContributionView>,
}

impl From<&Decision> for DecisionView {
    fn from(d: &Decision) -> Self {
        let c = &d.command;
        let mut features: Vec<ContributionView> = c
            .reason
            .features
            .iter()
            .map(|f| ContributionView {
                name: f.name.clone(),
                value: f.value,
                contribution: f.contribution,
            })
            .collect();
        features.sort_by(|a, b| b.contribution.abs().total_cmp(&a.contribution.abs()));
        DecisionView {
            id: c.id.clone(),
            tenant: c.tenant.to_string(),
            key: c.key.to_string(),
            confidence: c.confidence,
            issued_at_ms: c.issued_at_ms,
            expires_at_ms: c.expires_at_ms,
            regions: match &c.regions {
                RegionTargets::All => vec!["all".into()],
                RegionTargets::Only(r) => r.iter().map(ToString::to_string).collect(),
            },
            verdict: match d.verdict {
                Verdict::Pending => "pending",
                Verdict::Useful => "useful",
                Verdict::Wasted => "wasted",
            }
            .into(),
            lead_times: d
                .lead_times_ms
                .iter()
                .map(|(region, ms)| LeadTime {
                    region: region.to_string(),
                    ms: *ms,
                })
                .collect(),
            model: c.reason.model.clone(),
            intercept: c.reason.intercept,
            features,
        }
    }
}

/// Decision totals since pulse started.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DecisionTotals {
    /// Commands sent.
    pub sent: u64,
    /// Commands requested in a warmed region before expiry.
    pub useful: u64,
    /// Commands that expired unused.
    pub wasted: u64,
    /// Scored keys that got no command, by reason.
    pub skipped: BTreeMap<String, u64>,
    /// Keys scored.
    pub scored: u64,
}

/// `GET /api/predictions`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PredictionsResponse {
    /// The totals.
    pub totals: DecisionTotals,
    /// Recent decisions, newest first (issue time, then id).
    pub decisions: Vec<DecisionView>,
    /// The partitions the answer covers.
    pub coverage: Coverage,
}

impl PredictionsResponse {
    /// One predictor's totals and its newest `limit` decisions (of `tenant`, if given).
    pub(crate) fn of(
        p: &Predictor,
        tenant: Option<&TenantId>,
        limit: usize,
        coverage: Coverage,
    ) -> Self {
        let counts = p.counts();
        PredictionsResponse {
            totals: DecisionTotals {
                sent: counts.sent,
                useful: counts.useful,
                wasted: counts.wasted,
                skipped: counts
                    .skips()
                    .into_iter()
                    .map(|(skip, n)| (skip.as_str().to_owned(), n))
                    .collect(),
                scored: p.scored(),
            },
            decisions: p
                .decisions()
                .filter(|d| tenant.is_none_or(|t| &d.command.tenant == t))
                .take(limit)
                .map(DecisionView::from)
                .collect(),
            coverage,
        }
    }
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

/// One feature in the model card.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ModelFeature {
    /// The feature.
    pub name: String,
    /// `identity` or `log1p`.
    pub transform: String,
    /// Mean of the transformed value in training.
    pub mean: f64,
    /// Its standard deviation.
    pub std: f64,
    /// Coefficient on the standardised value.
    pub coefficient: f64,
}

/// Decisions against labels at one threshold.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EvaluationView {
    /// The threshold.
    pub threshold: f64,
    /// Precision.
    pub precision: f64,
    /// Recall.
    pub recall: f64,
    /// Viral and predicted.
    pub true_positives: usize,
    /// Predicted, not viral.
    pub false_positives: usize,
    /// Viral, not predicted.
    pub false_negatives: usize,
}

impl From<&Evaluation> for EvaluationView {
    fn from(e: &Evaluation) -> Self {
        EvaluationView {
            threshold: e.threshold,
            precision: e.precision(),
            recall: e.recall(),
            true_positives: e.true_positives,
            false_positives: e.false_positives,
            false_negatives: e.false_negatives,
        }
    }
}

/// One row of the model card's reliability table.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ReliabilityView {
    /// Lowest confidence of the bin.
    pub lower: f64,
    /// Upper bound of the bin.
    pub upper: f64,
    /// Samples scored in the bin.
    pub samples: usize,
    /// Their mean confidence.
    pub mean_confidence: f64,
    /// The share that went viral.
    pub viral_share: f64,
}

/// `GET /api/model`: the model card and the decision rules in force.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ModelResponse {
    /// The model's name.
    pub name: String,
    /// Model file format.
    pub format: u32,
    /// When it was trained, ms since the epoch.
    pub trained_at_ms: u64,
    /// The regression intercept.
    pub intercept: f64,
    /// Calibration slope: confidence = σ(slope · output + offset).
    pub calibration_slope: f64,
    /// Calibration offset.
    pub calibration_offset: f64,
    /// Features in model order.
    pub features: Vec<ModelFeature>,
    /// Training samples.
    pub samples: usize,
    /// Of which viral.
    pub positives: usize,
    /// R² on the training samples.
    pub r2: f64,
    /// Decisions on the training samples.
    pub train: EvaluationView,
    /// Decisions on held-out samples, if any.
    pub held_out: Option<EvaluationView>,
    /// The traffic families it was trained on (generated traces), if any.
    pub families: Vec<String>,
    /// Reliability: per tenth of the confidence range, the samples scored there and the
    /// share that went viral.
    pub reliability: Vec<ReliabilityView>,
    /// The confidence threshold in force.
    pub threshold: f64,
    /// Per-key cooldown, ms.
    pub cooldown_ms: u64,
    /// Command lifetime, ms.
    pub command_ttl_ms: u64,
    /// Each tenant's committed commands per second.
    pub tenant_rate_per_s: f64,
    /// Each tenant's burst allowance.
    pub tenant_burst: f64,
    /// The partitions the answer covers.
    pub coverage: Coverage,
}

impl ModelResponse {
    pub(crate) fn new(model: &ScoringModel, policy: &DecisionPolicy, coverage: Coverage) -> Self {
        let m = &model.metrics;
        ModelResponse {
            name: model.name.clone(),
            format: model.format,
            trained_at_ms: model.trained_at_ms,
            intercept: model.intercept,
            calibration_slope: model.calibration.slope,
            calibration_offset: model.calibration.offset,
            features: (0..model.features.len())
                .map(|i| ModelFeature {
                    name: model.features[i].clone(),
                    transform: match model.transforms[i] {
                        Transform::Identity => "identity",
                        Transform::Log1p => "log1p",
                    }
                    .into(),
                    mean: model.means[i],
                    std: model.stds[i],
                    coefficient: model.coefficients[i],
                })
                .collect(),
            samples: m.samples,
            positives: m.positives,
            r2: m.r2,
            train: (&m.train).into(),
            held_out: m.held_out.as_ref().map(Into::into),
            families: m.families.clone(),
            reliability: m
                .reliability
                .iter()
                .map(|b| ReliabilityView {
                    lower: b.lower,
                    upper: b.upper,
                    samples: b.samples,
                    mean_confidence: b.mean_confidence,
                    viral_share: b.viral_share,
                })
                .collect(),
            threshold: policy.threshold,
            cooldown_ms: policy.cooldown_ms,
            command_ttl_ms: policy.command_ttl_ms,
            tenant_rate_per_s: policy.tenant_rate_per_s,
            tenant_burst: policy.tenant_burst,
            coverage,
        }
    }
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
