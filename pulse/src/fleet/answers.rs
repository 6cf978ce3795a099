//! The answers of the API, as every partition, and every instance, gives them: what
//! the handlers (`api`) serve, what [`merge`](super::merge) merges, and what peers
//! send each other. Each has an `of` (or `new`) that builds one partition's answer.

use std::collections::BTreeMap;

use models::{RegionId, RegionTargets, TenantId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::Coverage;
use crate::heat::{
    COARSE_BUCKETS, COARSE_MS, EdgeSummary, EvictedTenant, HeatMap, HotKey, KeyStats,
    MAX_NODES_PER_EDGE, NODE_WINDOW_S, QueryError, RATE_WINDOW_S, SketchKind, TenantSummary,
    Window,
};
use crate::predict::{
    Decision, DecisionPolicy, Evaluation, LastDecision, Predictor, ScoringModel, Stage, Transform,
    Verdict,
};

/// `GET /api/tenants`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct TenantsResponse {
    /// The watermark: newest event time applied, ms since the Unix epoch.
    pub now_ms: u64,
    /// Additive error of an estimate from a tenant's own sketches, as a fraction of
    /// the tenant's events in the window.
    pub error_bound: f64,
    /// Additive error of an estimate from the shared sketch, as a fraction of the
    /// events of *every* tenant in it in the window.
    pub shared_error_bound: f64,
    /// Probability that an estimate exceeds the error bound.
    pub failure_probability: f64,
    /// Approximate bytes held by the sketches, trackers and keys.
    pub memory_bytes: u64,
    /// The limit on `memory_bytes`: a new tenant past it is rejected.
    pub memory_budget_bytes: u64,
    /// Tenants, by name, each with its own error bound; counts added over the
    /// partitions, regions sorted by name.
    pub tenants: Vec<TenantSummary>,
    /// Tenants evicted after a minute without events, newest first (at most
    /// 10 000 summaries are kept).
    pub evicted: Vec<EvictedTenant>,
    /// The partitions the answer covers.
    pub coverage: Coverage,
}

impl TenantsResponse {
    /// One heat map's tenants.
    pub(crate) fn of(heat: &HeatMap, coverage: Coverage) -> Self {
        TenantsResponse {
            now_ms: heat.now_ms(),
            error_bound: heat.config().error_bound(),
            shared_error_bound: heat.config().shared_error_bound(),
            failure_probability: heat.config().failure_probability(),
            memory_bytes: heat.memory_bytes() as u64,
            memory_budget_bytes: heat.config().memory_budget_bytes,
            tenants: heat.tenants(),
            evicted: heat.evicted(),
            coverage,
        }
    }
}

/// `GET /api/heatmap`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct HeatmapResponse {
    /// The tenant.
    pub tenant: String,
    /// The region, when the query named one.
    pub region: Option<String>,
    /// The window.
    pub window: Window,
    /// Event time the window ends at.
    pub now_ms: u64,
    /// Where the tenant's counts are now: its own sketches or the shared one.
    pub sketch: SketchKind,
    /// The additive error bound of each whole-tenant count in the window, in events
    /// (see `TenantSummary::error_bound_events_60s`).
    pub error_bound_events: u64,
    /// The additive error bound of a row whose key was counted in several partitions
    /// (producers that do not keep a key on one partition): the sum of the parts'
    /// bounds, in events. Such a row can also miss the part of a partition where the
    /// key was outside the top `n`.
    #[serde(default)]
    pub split_error_bound_events: u64,
    /// Rows whose key was counted in several partitions (one row each, counts added).
    #[serde(default)]
    pub split_keys: u64,
    /// Hottest first (count, then key).
    pub keys: Vec<HotKey>,
    /// The partitions the answer covers.
    pub coverage: Coverage,
}

impl HeatmapResponse {
    /// One heat map's answer.
    pub(crate) fn of(
        heat: &HeatMap,
        tenant: &TenantId,
        region: Option<&RegionId>,
        window: Window,
        n: usize,
        now_ms: u64,
        coverage: Coverage,
    ) -> Result<Self, QueryError> {
        let keys = heat.hot_keys(tenant, region, window, n, now_ms)?;
        let error_bound_events = heat.error_bound_events(tenant, window, now_ms)?;
        let sketch = match heat.tenant(tenant) {
            Some(t) if t.has_own_sketch() => SketchKind::Own,
            _ => SketchKind::Shared,
        };
        Ok(HeatmapResponse {
            tenant: tenant.to_string(),
            region: region.map(|r| r.to_string()),
            window,
            now_ms,
            sketch,
            error_bound_events,
            split_error_bound_events: error_bound_events,
            split_keys: 0,
            keys,
            coverage,
        })
    }
}

/// `GET /api/keys/{tenant}/{key}`: the key's estimates, added over the partitions
/// that may hold it (its owner, when the producers' partitioner is known).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct KeyResponse {
    /// The estimates.
    #[serde(flatten)]
    pub stats: KeyStats,
    /// Where the key was looked for.
    pub ownership: KeyOwnership,
    /// The partitions the answer accounts for.
    pub coverage: Coverage,
}

/// How a key's partitions were found, and what that costs in accuracy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub(crate) struct KeyOwnership {
    /// The producers' partitioner the key was routed by (`consistent_random`,
    /// `murmur2_random`, `fnv1a`); null: none is known to place every message, so
    /// every partition was asked and their estimates added.
    pub partitioner: Option<String>,
    /// The partitions whose estimates were added, ascending.
    pub partitions: Vec<i32>,
    /// The additive error bound of the 60 s counts, in events: the sum of those
    /// partitions' bounds (each estimate is at most its partition's bound above the
    /// truth).
    pub error_bound_events_60s: u64,
}

impl KeyResponse {
    /// One partition's answer for a key.
    pub(crate) fn of(
        heat: &HeatMap,
        tenant: &TenantId,
        key: &models::CacheKey,
        now_ms: u64,
        coverage: Coverage,
    ) -> Result<Self, QueryError> {
        Ok(KeyResponse {
            stats: heat.key_stats(tenant, key, now_ms)?,
            ownership: KeyOwnership {
                partitioner: None,
                partitions: coverage.partitions.clone(),
                error_bound_events_60s: heat.error_bound_events(tenant, Window::S60, now_ms)?,
            },
            coverage,
        })
    }
}

/// One second of `GET /api/rates`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub(crate) struct RatePoint {
    /// Start of the second, ms since the Unix epoch (event time).
    pub start_ms: u64,
    /// Client requests (demand) in it.
    pub events: u64,
    /// Misses in it.
    pub misses: u64,
}

/// `GET /api/rates`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct RatesResponse {
    /// The tenant.
    pub tenant: String,
    /// Event time the series ends at.
    pub now_ms: u64,
    /// Keys summed: each partition's hottest `keys`, added over the partitions.
    pub keys: usize,
    /// The last 60 seconds, oldest first.
    pub seconds: Vec<RatePoint>,
    /// The partitions the answer covers.
    pub coverage: Coverage,
}

impl RatesResponse {
    /// One heat map's series over its `n` hottest keys, ending at `now_ms`.
    pub(crate) fn of(
        heat: &HeatMap,
        tenant: &TenantId,
        n: usize,
        now_ms: u64,
        coverage: Coverage,
    ) -> Result<Self, QueryError> {
        let hot = heat.hot_keys(tenant, None, Window::S60, n, now_ms)?;
        let last = now_ms / COARSE_MS;
        let buckets = COARSE_BUCKETS as u64;
        // Second `i` of the series is `last + 1 - buckets + i`; `ends[j]` is the end of
        // second `last - buckets + j`, one more than the series so each has a predecessor.
        let ends: Vec<Option<u64>> = (0..=buckets)
            .map(|j| {
                (last + j)
                    .checked_sub(buckets)
                    .map(|s| s * COARSE_MS + COARSE_MS - 1)
            })
            .collect();
        let mut events = vec![0u64; COARSE_BUCKETS];
        let mut misses = vec![0u64; COARSE_BUCKETS];
        for row in &hot {
            let window = |end: Option<u64>| -> Result<(u64, u64), QueryError> {
                let Some(end) = end else { return Ok((0, 0)) };
                let [w] = heat.key_windows(tenant, &row.key, [Window::S60], end)?;
                Ok((w.demand, w.misses))
            };
            let mut before = window(ends[0])?;
            for i in 0..COARSE_BUCKETS {
                let now = window(ends[i + 1])?;
                // A ring slot that kept an older bucket (a second with no event) can make
                // the older window the larger one; such a second had no event of the key.
                events[i] += now.0.saturating_sub(before.0);
                misses[i] += now.1.saturating_sub(before.1);
                before = now;
            }
        }
        let first = (last + 1).saturating_sub(buckets);
        Ok(RatesResponse {
            tenant: tenant.to_string(),
            now_ms,
            keys: hot.len(),
            seconds: (0..COARSE_BUCKETS)
                .map(|i| RatePoint {
                    start_ms: (first + i as u64) * COARSE_MS,
                    events: events[i],
                    misses: misses[i],
                })
                .collect(),
            coverage,
        })
    }
}

/// `GET /api/edges`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct EdgesResponse {
    /// The newest watermark, ms since the Unix epoch.
    pub now_ms: u64,
    /// Seconds `rate_per_s` averages over.
    pub rate_window_s: u64,
    /// Seconds a node counts in `nodes` after its last event.
    pub node_window_s: u64,
    /// Nodes remembered per kind at most.
    pub max_nodes: u64,
    /// Counters added over the partitions; `nodes` is the largest partition's count
    /// (a node sends to every partition), a lower bound of the distinct nodes.
    pub edges: Vec<EdgeSummary>,
    /// The partitions the answer covers.
    pub coverage: Coverage,
}

impl EdgesResponse {
    /// One heat map's counters.
    pub(crate) fn of(heat: &HeatMap, coverage: Coverage) -> Self {
        EdgesResponse {
            now_ms: heat.now_ms(),
            rate_window_s: RATE_WINDOW_S,
            node_window_s: NODE_WINDOW_S,
            max_nodes: MAX_NODES_PER_EDGE as u64,
            edges: heat.edges(),
            coverage,
        }
    }
}

/// One feature's part in a decision.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct ContributionView {
    /// The feature.
    pub name: String,
    /// Its value at decision time.
    pub value: f64,
    /// What it added to the regression output.
    pub contribution: f64,
}

/// A region's first request after a command.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct LeadTime {
    /// The warmed region.
    pub region: String,
    /// Milliseconds from the command to the region's first request.
    pub ms: u64,
}

/// One pre-warm decision.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct DecisionView {
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
    /// The key's last decision (this command's, or a later one): the pipeline stage
    /// it ended at, `candidate`, `score`, `regions` or `gate` (`gate` with no
    /// `last_skip`: a command was sent).
    pub last_stage: String,
    /// Why that decision sent no command (a `pulse_prewarm_skipped` reason), or null.
    pub last_skip: Option<String>,
    /// When that decision was made (event time, ms since the epoch).
    pub last_decided_at_ms: u64,
}

impl DecisionView {
    /// A decision, with its key's last decision (`None`: the command itself).
    fn new(d: &Decision, last: Option<LastDecision>) -> Self {
        let last = last.unwrap_or(LastDecision {
            at_ms: d.command.issued_at_ms,
            stage: Stage::Gate,
            skip: None,
        });
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
            last_stage: last.stage.as_str().to_owned(),
            last_skip: last.skip.map(|skip| skip.as_str().to_owned()),
            last_decided_at_ms: last.at_ms,
        }
    }
}

/// Decision totals since pulse started.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct DecisionTotals {
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
pub(crate) struct PredictionsResponse {
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
                .map(|d| DecisionView::new(d, p.last_decision(&d.command.tenant, &d.command.key)))
                .collect(),
            coverage,
        }
    }
}

/// One feature in the model card.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct ModelFeature {
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
pub(crate) struct EvaluationView {
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
pub(crate) struct ReliabilityView {
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
pub(crate) struct ModelResponse {
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

/// The error body of every 4xx.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// A stable code: `unknown_tenant`, `unknown_region`, `bad_window`,
    /// `key_too_long`, `invalid_key`, `invalid_tenant`, `invalid_region`,
    /// `bad_parameter`, `prediction_off`, `owner_unavailable`, `incomplete`, `unauthorized`.
    pub error: String,
    /// What is wrong, naming the parameter.
    pub message: String,
    /// For "not here" answers (`unknown_tenant`, `unknown_region`, `owner_unavailable`):
    /// the partitions that were asked, so a fleet answer can say what it covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<Coverage>,
}
