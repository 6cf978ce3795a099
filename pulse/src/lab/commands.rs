//! The offline commands as library calls: where `pulse train` and `pulse backtest`
//! read events from ([`EventSource`], [`load_events`]), fitting a model on replayed
//! traces ([`train_on`](super::train_on)), the backtest table ([`backtest_table`]), and writing a
//! generated trace with its truth ([`write_trace`]). The binary only turns flags into
//! these arguments.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use models::{AccessEvent, PrewarmCommand};

use super::backtest::{
    BacktestRow, ReplayOptions, read_events, read_topic, replay, score as score_replay, score_some,
};
use super::baseline::naive_commands;
use super::honest::{HonestOptions, score_commands};
use super::trace::{Burst, Family, Trace, generate as generate_trace};
use crate::predict::{DecisionPolicy, ModelError, PredictorConfig, ScoringModel, reliability};

/// Where events are read from: a JSON-lines file, or a Kafka topic read from its
/// beginning to its end (`kafka://HOST:PORT[,HOST:PORT…]/TOPIC`).
#[derive(Debug, Clone, PartialEq)]
pub enum EventSource {
    /// A JSON-lines file (the Kafka message format, one per line).
    File(PathBuf),
    /// Every partition of a topic, from its beginning to its end as it is now.
    Topic {
        /// The brokers (`bootstrap.servers`) and any librdkafka properties (the
        /// binary's `--kafka-property`).
        kafka: crate::kafka::KafkaClients,
        /// The topic.
        topic: String,
    },
}

impl std::str::FromStr for EventSource {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let Some(rest) = s.strip_prefix("kafka://") else {
            return Ok(EventSource::File(PathBuf::from(s)));
        };
        match rest.split_once('/') {
            Some((brokers, topic)) if !brokers.is_empty() && !topic.is_empty() => {
                Ok(EventSource::Topic {
                    kafka: crate::kafka::KafkaClients::new(brokers),
                    topic: topic.to_owned(),
                })
            }
            _ => Err(format!("{s}: expected kafka://HOST:PORT/TOPIC")),
        }
    }
}

impl std::fmt::Display for EventSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EventSource::File(path) => write!(f, "{}", path.display()),
            EventSource::Topic { kafka, topic } => write!(f, "kafka://{}/{topic}", kafka.brokers()),
        }
    }
}

/// Why an offline command failed. `what` names the argument (a flag, for the binary).
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// The file could not be read.
    #[error("{what}: {source_name}: {error}")]
    Read {
        /// The argument.
        what: String,
        /// The file or topic.
        source_name: String,
        /// The I/O or Kafka error, as text.
        error: String,
    },
    /// The source held no event that decodes.
    #[error("{what}: {source_name} holds no events")]
    Empty {
        /// The argument.
        what: String,
        /// The file or topic.
        source_name: String,
    },
    /// The model could not be fitted.
    #[error("training: {0}")]
    Model(#[from] ModelError),
    /// A threshold outside [0, 1].
    #[error("thresholds: {0} is outside [0, 1]")]
    Threshold(f64),
}

/// The order a replay takes events in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventOrder {
    /// Sorted by event time: every event arrives when it happened.
    ByTime,
    /// As the file or topic holds them: an event delivered late arrives late, as pulse
    /// serve reads a partition.
    AsDelivered,
}

/// Reads the events of `source` in `order`; messages that do not decode are logged
/// and skipped, and a source without any event is an error. `what` names the argument
/// in errors.
pub fn load_events(
    source: &EventSource,
    what: &str,
    order: EventOrder,
) -> Result<Vec<AccessEvent>, OfflineError> {
    let read = match source {
        EventSource::File(path) => read_events(path).map_err(|e| e.to_string()),
        EventSource::Topic { kafka, topic } => {
            read_topic(kafka, topic, Duration::from_secs(10)).map_err(|e| e.to_string())
        }
    };
    let mut read = read.map_err(|error| OfflineError::Read {
        what: what.to_owned(),
        source_name: source.to_string(),
        error,
    })?;
    if order == EventOrder::ByTime {
        read.sort();
    }
    if !read.rejected.is_empty() {
        tracing::warn!(%source, rejected = ?read.rejected, "skipped messages that do not decode");
    }
    if read.events.is_empty() {
        return Err(OfflineError::Empty {
            what: what.to_owned(),
            source_name: source.to_string(),
        });
    }
    Ok(read.events)
}

/// One family's row of the per-family backtest.
#[derive(Debug, Clone)]
pub struct FamilyRow {
    /// The family.
    pub family: &'static str,
    /// Whether the model was trained on it.
    pub trained_on: bool,
    /// Regions of its fleet.
    pub regions: usize,
    /// The honest figures.
    pub row: BacktestRow,
    /// Each judged command's confidence and whether it proved useful.
    pub judged: Vec<(f64, bool)>,
    /// The honest figures of the trace's second half (after pulse has seen the first).
    pub second: BacktestRow,
    /// The naive baseline's figures ([`super::baseline`]): the whole trace, then its
    /// second half.
    pub baseline: [BacktestRow; 2],
}

/// Replays each family's trace at `seed` with `model` under `policy` and scores it.
pub fn family_rows(
    model: &ScoringModel,
    families: &[&'static Family],
    seed: u64,
    predictor: &PredictorConfig,
) -> Result<Vec<FamilyRow>, OfflineError> {
    let threshold = predictor.policy.threshold;
    if !(0.0..=1.0).contains(&threshold) {
        return Err(OfflineError::Threshold(threshold));
    }
    let model = Arc::new(model.clone());
    Ok(families
        .iter()
        .map(|family| {
            let spec = family.spec(seed);
            let trace = generate_trace(&spec);
            let options = options_at(predictor, threshold);
            let run = replay(&trace.events, Some(model.clone()), &options);
            let row = score_replay(&run, &trace.events, threshold, Some(&trace.bursts));
            let judged = judged_commands(&run.commands, &trace.events, Some(&trace.bursts));
            let truth = Some(&trace.bursts[..]);
            let [_, second] = halves(&run.commands, &trace.events, threshold, truth);
            let naive = naive_commands(&trace.events);
            let naive_whole = score_some(&naive, &trace.events, threshold, truth, &[]);
            let [_, naive_second] = halves(&naive, &trace.events, threshold, truth);
            FamilyRow {
                family: family.name,
                trained_on: model.metrics.families.iter().any(|f| f == family.name),
                regions: spec.regions,
                row,
                judged,
                second,
                baseline: [naive_whole, naive_second],
            }
        })
        .collect())
}

/// Each judged command's confidence and whether it proved useful (a named region asked
/// in time), by the honest scorer.
fn judged_commands(
    commands: &[PrewarmCommand],
    events: &[AccessEvent],
    truth: Option<&[Burst]>,
) -> Vec<(f64, bool)> {
    let (_, per_command) = score_commands(commands, events, truth, &HonestOptions::default());
    commands
        .iter()
        .zip(&per_command)
        .filter(|(_, s)| s.judged)
        .map(|(c, s)| (c.confidence, !s.warmed.is_empty()))
        .collect()
}

/// A reliability table in Markdown: per tenth of confidence, the judged commands, their
/// mean confidence, the share that proved useful, and that share's 95 % interval: a
/// bucket of few commands can lie far from its mean confidence by chance alone, and
/// shows a miscalibration only when the interval leaves the mean out.
fn reliability_table(judged: &[(f64, bool)]) -> String {
    let mut out = String::from(
        "| confidence | commands | mean confidence | useful share | 95 % interval |\n|---|---:|---:|---:|---|\n",
    );
    for bin in reliability(judged) {
        let useful = (bin.viral_share * bin.samples as f64).round() as usize;
        let (low, high) = wilson_interval(useful, bin.samples);
        out.push_str(&format!(
            "| {:.1}–{:.1} | {} | {:.3} | {:.3} | {low:.2}–{high:.2} |\n",
            bin.lower, bin.upper, bin.samples, bin.mean_confidence, bin.viral_share
        ));
    }
    out
}

/// The Wilson score interval, at 95 %, of a share of `successes` in `trials`: unlike
/// the share ± 1.96 standard errors, it stays within [0, 1] and is not empty at 0 or
/// at all of them.
fn wilson_interval(successes: usize, trials: usize) -> (f64, f64) {
    if trials == 0 {
        return (0.0, 1.0);
    }
    const Z: f64 = 1.96;
    let n = trials as f64;
    let share = successes as f64 / n;
    let spread = 1.0 + Z * Z / n;
    let centre = (share + Z * Z / (2.0 * n)) / spread;
    let half = Z * (share * (1.0 - share) / n + Z * Z / (4.0 * n * n)).sqrt() / spread;
    // It holds the share; rounding could put an end a hair inside it.
    (
        (centre - half).clamp(0.0, share),
        (centre + half).clamp(share, 1.0),
    )
}

/// The per-family Markdown table `pulse backtest --families` prints.
pub fn family_table(model: &ScoringModel, rows: &[FamilyRow], seed: u64) -> String {
    let mut out = format!(
        "model {}, family traces at seed {seed}, threshold {:.2}\n",
        model.name,
        rows.first().map_or(0.0, |r| r.row.threshold)
    );
    out.push_str("| family | split | regions | commands | precision | region precision | recall | median lead | wasted fills | decision p99 | second half P / R / W | baseline P / R / W | baseline second half P / R / W |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|\n");
    for r in rows {
        let row = &r.row;
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.3} | {:.3} | {} | {} | {:.1} % | {} | {} | {} | {} |\n",
            r.family,
            if r.trained_on { "train" } else { "held out" },
            r.regions,
            row.commands,
            row.precision,
            row.region_precision,
            row.recall.map_or("n/a".into(), |x| format!("{x:.3}")),
            lead(row.median_lead_ms),
            row.wasted_share * 100.0,
            p99(row.decision_p99),
            triple(&r.second),
            triple(&r.baseline[0]),
            triple(&r.baseline[1]),
        ));
    }
    let held_out: Vec<(f64, bool)> = rows
        .iter()
        .filter(|r| !r.trained_on)
        .flat_map(|r| r.judged.iter().copied())
        .collect();
    out.push_str("\nreliability of the held-out families' commands (useful = a named region asked in time)\n");
    out.push_str(&reliability_table(&held_out));
    out
}

/// Precision / recall / wasted fills, the figures the targets name.
pub(crate) fn triple(row: &BacktestRow) -> String {
    format!(
        "{:.3} / {} / {:.1} %",
        row.precision,
        row.recall.map_or("n/a".into(), |r| format!("{r:.3}")),
        row.wasted_share * 100.0
    )
}

fn lead(ms: Option<u64>) -> String {
    ms.map_or("n/a".into(), |ms| format!("{:.1} s", ms as f64 / 1000.0))
}

fn p99(d: Option<Duration>) -> String {
    d.map_or("n/a".into(), |d| {
        format!("{:.2} ms", d.as_secs_f64() * 1000.0)
    })
}

/// The lines `pulse train` prints about a fitted model.
pub fn train_summary(model: &ScoringModel) -> String {
    let m = &model.metrics;
    let mut out = format!(
        "{}: {} samples ({} viral), R² {:.3}; at {:.2}: train precision {:.3} recall {:.3}",
        model.name,
        m.samples,
        m.positives,
        m.r2,
        m.train.threshold,
        m.train.precision(),
        m.train.recall()
    );
    if let Some(h) = &m.held_out {
        out.push_str(&format!(
            "\nheld out: precision {:.3} recall {:.3}",
            h.precision(),
            h.recall()
        ));
    }
    out
}

/// Replays `events` with `model` at each threshold and returns the Markdown table
/// `pulse backtest` prints (a model line, then one row per threshold), then the
/// reliability table of the commands sent at `reliability_at` (replayed once more if it
/// is not one of `thresholds`).
pub fn backtest_table(
    events: &[AccessEvent],
    truth: Option<&[Burst]>,
    model: ScoringModel,
    thresholds: &[f64],
    reliability_at: f64,
    predictor: &PredictorConfig,
) -> Result<String, OfflineError> {
    if let Some(t) = thresholds
        .iter()
        .chain([&reliability_at])
        .find(|t| !(0.0..=1.0).contains(*t))
    {
        return Err(OfflineError::Threshold(*t));
    }
    let mut out = format!("model {}, {} events\n", model.name, events.len());
    out.push_str(TABLE_HEADER);
    let model = Arc::new(model);
    let run_at = |threshold: f64| {
        replay(
            events,
            Some(model.clone()),
            &options_at(predictor, threshold),
        )
    };
    let mut at_reliability = None;
    for threshold in thresholds {
        let run = run_at(*threshold);
        out.push_str(&table_row(&score_replay(&run, events, *threshold, truth)));
        if *threshold == reliability_at && at_reliability.is_none() {
            at_reliability = Some(run);
        }
    }
    let run = at_reliability.unwrap_or_else(|| run_at(reliability_at));
    out.push_str(&format!(
        "\nthe first and second half of the trace at {reliability_at:.2} (commands sent, and bursts begun, in each)\n"
    ));
    out.push_str(&TABLE_HEADER.replacen("threshold", "half", 1));
    for (half, row) in
        ["first", "second"]
            .iter()
            .zip(halves(&run.commands, events, reliability_at, truth))
    {
        out.push_str(&table_row(&row).replacen(&format!("{reliability_at:.2}"), half, 1));
    }
    // The naive baseline on the same events, by the same scorer.
    let naive = naive_commands(events);
    out.push_str(
        "\nthe naive baseline (a new key's 15 requests in 5 s at one region, fewer than 3 regions reached: every unseen region for 60 s), the whole trace, then its first and second half\n",
    );
    out.push_str(&TABLE_HEADER.replacen("threshold", "baseline", 1));
    let whole = score_some(&naive, events, reliability_at, truth, &[]);
    for (part, row) in ["whole", "first", "second"]
        .iter()
        .zip(std::iter::once(whole).chain(halves(&naive, events, reliability_at, truth)))
    {
        out.push_str(&table_row(&row).replacen(&format!("{reliability_at:.2}"), part, 1));
    }
    let judged = judged_commands(&run.commands, events, truth);
    out.push_str(&format!(
        "\nreliability of the commands at {reliability_at:.2} (useful = a named region asked in time)\n"
    ));
    out.push_str(&reliability_table(&judged));
    if let Some(every) = predictor.replay_retrain_every_ms.filter(|e| *e > 0) {
        out.push_str(&retrain_summary(&run.retrains, every));
    }
    Ok(out)
}

/// One line on a replay's online retrains: how many swapped the model in, how many
/// kept the one in use, and how far into the replay the first swap came (what learning
/// on the job waited for: a model fits only once enough moments are labelled).
fn retrain_summary(retrains: &[(u64, &'static str)], every_ms: u64) -> String {
    let count = |outcome| retrains.iter().filter(|(_, o)| *o == outcome).count();
    // Retrains fall every `every_ms` from the replay's first event.
    let started_ms = retrains.first().map(|(at, _)| at.saturating_sub(every_ms));
    let first_swap = retrains
        .iter()
        .find(|(_, o)| *o == "replaced")
        .zip(started_ms)
        .map(|((at, _), start)| format!(", the first {} s in", (at - start) / 1000))
        .unwrap_or_default();
    format!(
        "\nonline retrains every {} s of event time, as pulse serve: {} replaced the model{first_swap}, {} kept it, {} had too little data\n",
        every_ms / 1000,
        count("replaced"),
        count("kept"),
        count("not_enough_data"),
    )
}

/// The honest figures of the commands sent, and the bursts begun, in each half of the
/// trace's time (the replay ran over all of it, so the second half is scored with
/// everything pulse learned in the first).
fn halves(
    commands: &[PrewarmCommand],
    events: &[AccessEvent],
    threshold: f64,
    truth: Option<&[Burst]>,
) -> [BacktestRow; 2] {
    // The span of event time, whatever order the events were replayed in.
    let first = events.iter().map(|e| e.ts_ms).min().unwrap_or_default();
    let last = events.iter().map(|e| e.ts_ms).max().unwrap_or_default();
    let middle = first + (last - first) / 2;
    [false, true].map(|second| {
        let commands: Vec<PrewarmCommand> = commands
            .iter()
            .filter(|c| (c.issued_at_ms >= middle) == second)
            .cloned()
            .collect();
        let bursts: Option<Vec<Burst>> = truth.map(|t| {
            t.iter()
                .filter(|b| (b.start_ms >= middle) == second)
                .cloned()
                .collect()
        });
        score_some(&commands, events, threshold, bursts.as_deref(), &[])
    })
}

const TABLE_HEADER: &str = "| threshold | commands | precision | region precision | recall | median lead | useful | wasted | wasted fills | decision p99 |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";

fn table_row(row: &BacktestRow) -> String {
    format!(
        "| {:.2} | {} | {:.3} | {:.3} | {} | {} | {} | {} | {:.1} % | {} |\n",
        row.threshold,
        row.commands,
        row.precision,
        row.region_precision,
        row.recall.map_or("n/a".into(), |r| format!("{r:.3}")),
        lead(row.median_lead_ms),
        row.useful,
        row.wasted,
        row.wasted_share * 100.0,
        p99(row.decision_p99),
    )
}

/// The commands a replay of `events` with `model` sends under `predictor`'s rules, in order.
pub fn backtest_commands(
    events: &[AccessEvent],
    model: ScoringModel,
    predictor: &PredictorConfig,
) -> Result<Vec<PrewarmCommand>, OfflineError> {
    let threshold = predictor.policy.threshold;
    if !(0.0..=1.0).contains(&threshold) {
        return Err(OfflineError::Threshold(threshold));
    }
    let options = options_at(predictor, threshold);
    Ok(replay(events, Some(Arc::new(model)), &options).commands)
}

/// A replay with `predictor`'s rules at `threshold`, keeping every decision and sample
/// of the trace as [`ReplayOptions::default`] does.
fn options_at(predictor: &PredictorConfig, threshold: f64) -> ReplayOptions {
    let keep = ReplayOptions::default();
    ReplayOptions {
        predictor: PredictorConfig {
            policy: DecisionPolicy {
                threshold,
                history: keep.predictor.policy.history,
                ..predictor.policy.clone()
            },
            sample_capacity: keep.predictor.sample_capacity,
            ..predictor.clone()
        },
        ..keep
    }
}

/// Writes a generated trace's events (JSON lines) and, if asked, its truth (JSON).
pub fn write_trace(trace: &Trace, out: &Path, truth: Option<&Path>) -> std::io::Result<()> {
    super::backtest::write_events(out, &trace.events)?;
    if let Some(path) = truth {
        let json = serde_json::to_string_pretty(&trace.bursts).map_err(std::io::Error::other)?;
        std::fs::write(path, json)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_sources_parse_files_and_topics() {
        assert_eq!(
            "events.jsonl".parse::<EventSource>(),
            Ok(EventSource::File("events.jsonl".into()))
        );
        assert_eq!(
            "kafka://127.0.0.1:9092/edge-events".parse::<EventSource>(),
            Ok(EventSource::Topic {
                kafka: crate::kafka::KafkaClients::new("127.0.0.1:9092"),
                topic: "edge-events".into()
            })
        );
        assert!("kafka://127.0.0.1:9092".parse::<EventSource>().is_err());
        assert!("kafka:///t".parse::<EventSource>().is_err());
    }

    /// A replay takes events by event time unless asked to take them as delivered: then
    /// a late event stays where the file put it, as a partition delivers it.
    #[test]
    fn events_are_sorted_by_time_unless_taken_as_delivered() {
        use crate::lab::trace::TraceSpec;
        let trace = generate_trace(&TraceSpec {
            seed: 5,
            duration_ms: 10_000,
            virals: 1,
            noise: 0,
            crons: 0,
            flash_crowds: 0,
            ..TraceSpec::default()
        });
        let mut delivered = trace.events.clone();
        let late = delivered.remove(0);
        delivered.push(late.clone());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("late.jsonl");
        crate::lab::backtest::write_events(&path, &delivered).unwrap();
        let source = EventSource::File(path);

        let as_delivered = load_events(&source, "events", EventOrder::AsDelivered).unwrap();
        assert_eq!(as_delivered, delivered);
        let by_time = load_events(&source, "events", EventOrder::ByTime).unwrap();
        assert_eq!(by_time.len(), delivered.len());
        assert!(by_time.windows(2).all(|w| w[0].ts_ms <= w[1].ts_ms));
        assert_eq!(by_time[0].ts_ms, late.ts_ms);
    }

    /// After the threshold rows, `pulse backtest` prints the reliability of the commands
    /// sent at `--threshold`: every judged command in one confidence bucket.
    #[test]
    fn the_backtest_prints_the_reliability_of_its_commands() {
        use crate::lab::trace::TraceSpec;
        let trace = generate_trace(&TraceSpec {
            seed: 23,
            duration_ms: 90_000,
            background_rps: 150.0,
            virals: 2,
            noise: 2,
            crons: 0,
            ..TraceSpec::default()
        });
        let model = crate::predict::default_model();
        let table = backtest_table(
            &trace.events,
            Some(&trace.bursts),
            model,
            &[0.85],
            0.85,
            &PredictorConfig::default(),
        )
        .unwrap();
        let (rows, reliability) = table
            .split_once("reliability of the commands at 0.85")
            .unwrap_or_else(|| panic!("no reliability table:\n{table}"));
        // The threshold row: | 0.85 | commands | … | useful | wasted | …
        let row: Vec<&str> = rows
            .lines()
            .find(|l| l.starts_with("| 0.85 |"))
            .unwrap()
            .split('|')
            .map(str::trim)
            .collect();
        let judged: usize = row[7].parse::<usize>().unwrap() + row[8].parse::<usize>().unwrap();
        let bucketed: usize = reliability
            .lines()
            .filter(|l| l.starts_with("| 0.") || l.starts_with("| 1."))
            .map(|l| {
                l.split('|')
                    .nth(2)
                    .unwrap()
                    .trim()
                    .parse::<usize>()
                    .unwrap()
            })
            .sum();
        assert!(judged > 0, "{table}");
        assert_eq!(bucketed, judged, "{table}");
    }

    /// Three of three useful cannot tell 0.87 from 1.0; thirty of thirty can; none
    /// of ten puts the share below 0.28; the interval always holds the share.
    #[test]
    fn the_useful_shares_interval_is_wide_for_few_commands_and_narrow_for_many() {
        let (low, high) = wilson_interval(3, 3);
        assert!((low - 0.438).abs() < 0.001 && high == 1.0, "{low} {high}");
        assert!(wilson_interval(30, 30).0 > 0.88);
        let (low, high) = wilson_interval(0, 10);
        assert!(low == 0.0 && (high - 0.278).abs() < 0.001, "{low} {high}");
        for (k, n) in [(1, 2), (7, 9), (31, 31), (27, 31)] {
            let (low, high) = wilson_interval(k, n);
            let share = k as f64 / n as f64;
            assert!(low <= share && share <= high, "{k}/{n}: {low}–{high}");
        }
    }

    /// The summary says when the first retrain swapped a model in, counted from the
    /// replay's start (a retrain every minute from the first event).
    #[test]
    fn the_retrain_summary_says_when_the_first_swap_came() {
        let start = 1_764_838_020_003;
        let at = |minute: u64| start + minute * 60_000;
        let line = retrain_summary(
            &[
                (at(1), "not_enough_data"),
                (at(2), "not_enough_data"),
                (at(3), "kept"),
                (at(4), "replaced"),
                (at(5), "replaced"),
            ],
            60_000,
        );
        assert!(
            line.contains(
                "2 replaced the model, the first 240 s in, 1 kept it, 2 had too little data"
            ),
            "{line}"
        );
        let none = retrain_summary(&[(at(1), "not_enough_data")], 60_000);
        assert!(!none.contains("the first"), "{none}");
    }

    #[test]
    fn a_threshold_outside_the_unit_interval_is_refused() {
        let model = crate::predict::default_model();
        assert!(matches!(
            backtest_table(&[], None, model, &[0.5, 1.5], 0.85, &PredictorConfig::default()),
            Err(OfflineError::Threshold(t)) if t == 1.5
        ));
    }
}
