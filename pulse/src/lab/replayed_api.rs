//! The prediction API over a predictor that has replayed a generated viral: the lab
//! drives the online API here, so the API's own tests need no lab.

use std::sync::Arc;

use axum::http::StatusCode;

use super::backtest::{ReplayOptions, Replayer};
use super::trace::{BurstKind, TraceSpec, generate as generate_trace};
use crate::api::tests::{get, keys, properties, state};
use crate::api::{AppState, app};
use crate::predict::{PredictorConfig, default_model};

/// A predictor that has watched one viral event spread.
fn state_with_decisions() -> (AppState, String) {
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
    let stages = ["candidate", "score", "regions", "gate"];
    assert!(stages.contains(&d["last_stage"].as_str().unwrap()), "{d}");
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
