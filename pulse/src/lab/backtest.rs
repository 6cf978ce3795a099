//! Replays a recorded or generated trace through the same heat map and predictor that
//! `pulse serve` runs, ticking on the trace's event time: for training (collect
//! labelled samples) and for the backtest (decisions at a range of thresholds, scored
//! against the trace's truth).

use std::io::{BufRead, BufWriter, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use models::{AccessEvent, PrewarmCommand, decode, encode};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use super::honest::{HonestOptions, score_commands};
use super::trace::Burst;
use crate::heat::{HeatConfig, HeatMap};
use crate::predict::{
    Decision, DecisionCounts, DecisionPolicy, HELD_OUT_SHARE, Predictor, PredictorConfig,
    RetrainOutcome, Sample, ScoringModel, next_generation, retrain,
};

/// How to replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// The sketches.
    pub heat: HeatConfig,
    /// The predictor (its decision history should hold every decision of the trace).
    pub predictor: PredictorConfig,
    /// Event time between ticks.
    pub tick_ms: u64,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            heat: HeatConfig::default(),
            predictor: PredictorConfig {
                policy: DecisionPolicy {
                    history: 1_000_000,
                    ..DecisionPolicy::default()
                },
                sample_capacity: 10_000_000,
                ..PredictorConfig::default()
            },
            tick_ms: crate::ticks::TICK_MS,
        }
    }
}

/// What a replay produced.
pub struct Replay {
    /// Commands in the order they were sent.
    pub commands: Vec<PrewarmCommand>,
    /// Every decision with its verdict, oldest first.
    pub decisions: Vec<Decision>,
    /// Labelled scoring moments, oldest first.
    pub samples: Vec<Sample>,
    /// Decision totals.
    pub counts: DecisionCounts,
    /// Events applied.
    pub applied: usize,
    /// Events the heat map refused (too old, tenant limit).
    pub refused: usize,
    /// Decision latency of each tick that sent commands.
    pub decision_times: Vec<Duration>,
    /// Each online retrain (`PredictorConfig::replay_retrain_every_ms`): its event time
    /// and outcome (`replaced`, `kept`, `not_enough_data`, as `pulse_model_retrains`).
    pub retrains: Vec<(u64, &'static str)>,
}

/// A heat map and a predictor fed one event at a time, ticking on event time: the
/// replay loop, also used by tests that need a predictor with history.
pub(crate) struct Replayer {
    /// The heat map.
    pub heat: HeatMap,
    /// The predictor.
    pub predictor: Predictor,
    tick_ms: u64,
    next_tick: Option<u64>,
    /// Events applied.
    pub applied: usize,
    /// Events the heat map refused.
    pub refused: usize,
    /// Wall time of each tick that sent commands: from the last event applied to the
    /// commands in hand (the decision latency).
    pub decision_times: Vec<Duration>,
    retrain_every_ms: Option<u64>,
    next_retrain: Option<u64>,
    /// Each online retrain: its event time and outcome.
    pub retrains: Vec<(u64, &'static str)>,
}

impl Replayer {
    /// An empty heat map and a fresh predictor.
    pub(crate) fn new(model: Option<Arc<ScoringModel>>, options: &ReplayOptions) -> Self {
        Replayer {
            heat: HeatMap::new(options.heat.clone()),
            predictor: Predictor::new(model, options.predictor.clone()),
            tick_ms: options.tick_ms,
            next_tick: None,
            applied: 0,
            refused: 0,
            decision_times: Vec::new(),
            retrain_every_ms: options
                .predictor
                .replay_retrain_every_ms
                .filter(|every| *every > 0),
            next_retrain: None,
            retrains: Vec::new(),
        }
    }

    /// Retrains as `pulse serve` does (`prewarm::retrain_once`), at event time `now_ms`:
    /// on the newest labelled moments a live predictor would hold, the newest share
    /// held out, the candidate put in use only if it is not worse there.
    fn retrain(&mut self, now_ms: u64) {
        let Some(current) = self.predictor.model().cloned() else {
            return;
        };
        let held = self.predictor.samples().len();
        let live_capacity = PredictorConfig::default().sample_capacity;
        let samples: Vec<Sample> = self
            .predictor
            .samples()
            .skip(held.saturating_sub(live_capacity))
            .cloned()
            .collect();
        let options = next_generation(&current, self.predictor.policy().threshold, now_ms);
        let outcome = match retrain(&current, &samples, HELD_OUT_SHARE, &options) {
            RetrainOutcome::Replace { model, .. } => {
                self.predictor.set_model(Arc::new(*model));
                "replaced"
            }
            RetrainOutcome::Keep { .. } => "kept",
            RetrainOutcome::NotEnoughData(_) => "not_enough_data",
        };
        self.retrains.push((now_ms, outcome));
    }

    /// Applies one event, first ticking for every tick time it passes; returns the
    /// commands those ticks sent.
    pub(crate) fn feed(&mut self, event: &AccessEvent) -> Vec<PrewarmCommand> {
        let mut commands = Vec::new();
        let next_tick = self.next_tick.get_or_insert(event.ts_ms + self.tick_ms);
        while event.ts_ms >= *next_tick {
            let started = Instant::now();
            let sent = self.predictor.tick(&self.heat, self.heat.now_ms());
            if !sent.is_empty() {
                self.decision_times.push(started.elapsed());
            }
            commands.extend(sent);
            *next_tick += self.tick_ms;
        }
        if let Some(every) = self.retrain_every_ms {
            let due = *self.next_retrain.get_or_insert(event.ts_ms + every);
            if event.ts_ms >= due {
                self.next_retrain = Some(due + every * (1 + (event.ts_ms - due) / every));
                self.retrain(due);
            }
        }
        let event = event.borrowed();
        match self.heat.apply_ref(&event) {
            Ok(()) => {
                self.applied += 1;
                self.predictor.observe(&event);
            }
            Err(_) => self.refused += 1,
        }
        commands
    }

    /// Ticks at the last event, then after every command's expiry and every label's
    /// horizon, so every decision has its verdict and every sample its label.
    pub(crate) fn finish(&mut self, options: &ReplayOptions) -> Vec<PrewarmCommand> {
        let commands = self.predictor.tick(&self.heat, self.heat.now_ms());
        let p = &options.predictor;
        let end = self.heat.now_ms() + p.policy.command_ttl_ms + 1;
        self.predictor.tick(&self.heat, end);
        commands
    }
}

/// Replays `events` (in time order) and settles every decision and label at the end.
pub fn replay(
    events: &[AccessEvent],
    model: Option<Arc<ScoringModel>>,
    options: &ReplayOptions,
) -> Replay {
    let mut replayer = Replayer::new(model, options);
    let mut commands = Vec::new();
    for event in events {
        commands.extend(replayer.feed(event));
    }
    commands.extend(replayer.finish(options));
    let predictor = &mut replayer.predictor;
    let mut decisions: Vec<Decision> = predictor.decisions().cloned().collect();
    decisions.reverse();
    Replay {
        commands,
        decisions,
        counts: predictor.counts(),
        samples: predictor.take_samples(),
        applied: replayer.applied,
        refused: replayer.refused,
        decision_times: std::mem::take(&mut replayer.decision_times),
        retrains: std::mem::take(&mut replayer.retrains),
    }
}

/// One row of the backtest table: the honest scorer's figures ([`honest`]) for one
/// replay.
#[derive(Debug, Clone, Serialize)]
pub struct BacktestRow {
    /// The confidence threshold.
    pub threshold: f64,
    /// Commands sent.
    pub commands: usize,
    /// Useful judged commands / judged commands: a command is useful when a region it
    /// names asks for the key after it is issued (by at least the fill time) and before
    /// it expires; cron commands with nothing left to warm are not judged.
    pub precision: f64,
    /// Regions warmed in time / regions named, over judged commands.
    pub region_precision: f64,
    /// Share of the regions viral bursts reached after their first one that were
    /// warmed in time (needs a truth file).
    pub recall: Option<f64>,
    /// Median lead over the viral regions warmed in time: ms from the command to the
    /// region's first request.
    pub median_lead_ms: Option<u64>,
    /// Judged commands that warmed at least one region in time.
    pub useful: usize,
    /// Judged commands that warmed none.
    pub wasted: usize,
    /// Share of the fills commands caused that nobody asked for in time.
    pub wasted_share: f64,
    /// 99th percentile of the decision latency (last event applied → commands sent).
    pub decision_p99: Option<Duration>,
}

/// Scores one replay of `events` with the honest scorer, against the trace's truth (if
/// any).
pub(crate) fn score(
    replay: &Replay,
    events: &[AccessEvent],
    threshold: f64,
    truth: Option<&[Burst]>,
) -> BacktestRow {
    score_some(
        &replay.commands,
        events,
        threshold,
        truth,
        &replay.decision_times,
    )
}

/// Scores `commands` (a part of a replay's) with the honest scorer.
pub(crate) fn score_some(
    commands: &[PrewarmCommand],
    events: &[AccessEvent],
    threshold: f64,
    truth: Option<&[Burst]>,
    decision_times: &[Duration],
) -> BacktestRow {
    let (s, _) = score_commands(commands, events, truth, &HonestOptions::default());
    BacktestRow {
        threshold,
        commands: s.commands,
        precision: s.precision(),
        region_precision: s.region_precision(),
        recall: s.recall(),
        median_lead_ms: s.median_lead_ms(),
        useful: s.useful,
        wasted: s.judged - s.useful,
        wasted_share: s.wasted_share(),
        decision_p99: percentile(decision_times, 0.99),
    }
}

/// The `q` quantile of `times` (nearest rank).
pub fn percentile(times: &[Duration], q: f64) -> Option<Duration> {
    let mut sorted = times.to_vec();
    sorted.sort_unstable();
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied()
}

/// Replays once per threshold with `model` and scores each run.
#[cfg(test)]
pub(crate) fn backtest(
    events: &[AccessEvent],
    truth: Option<&[Burst]>,
    model: Arc<ScoringModel>,
    thresholds: &[f64],
    options: &ReplayOptions,
) -> Vec<BacktestRow> {
    thresholds
        .iter()
        .map(|threshold| {
            let mut options = options.clone();
            options.predictor.policy.threshold = *threshold;
            let run = replay(events, Some(model.clone()), &options);
            score(&run, events, *threshold, truth)
        })
        .collect()
}

/// Events read from a file or a topic, and how many messages were refused.
#[derive(Default)]
pub struct EventFile {
    /// The decoded events, in the order they were read.
    pub events: Vec<AccessEvent>,
    /// Lines or messages that did not decode, by reason.
    pub rejected: std::collections::BTreeMap<&'static str, usize>,
}

impl EventFile {
    /// Decodes one message: kept, or counted under its reason.
    fn push(&mut self, message: &[u8]) {
        match decode::<AccessEvent>(message) {
            Ok(e) => self.events.push(e),
            Err(e) => *self.rejected.entry(e.reason()).or_insert(0) += 1,
        }
    }

    /// Sorts the events by time, the order they happened in.
    pub(crate) fn sort(&mut self) {
        // Stable: events of one millisecond keep the order they were read in.
        self.events.sort_by_key(|e| e.ts_ms);
    }
}

/// Reads a JSON-lines event file (the Kafka message format, one per line), in the
/// file's order. Lines that do not decode are counted and skipped.
pub(crate) fn read_events(path: &Path) -> std::io::Result<EventFile> {
    let file = std::io::BufReader::new(std::fs::File::open(path)?);
    let mut events = EventFile::default();
    for line in file.split(b'\n') {
        let line = line?;
        if !line.iter().all(u8::is_ascii_whitespace) {
            events.push(&line);
        }
    }
    Ok(events)
}

/// Reads every partition of an events topic from its beginning to its end as it is
/// now (later messages are not waited for), without joining a consumer group or
/// committing anything, in the order they were polled. Messages that do not decode are
/// counted and skipped.
/// `timeout` bounds each broker request and each wait for the next message.
pub fn read_topic(
    kafka: &crate::kafka::KafkaClients,
    topic: &str,
    timeout: Duration,
) -> Result<EventFile, KafkaError> {
    let consumer: BaseConsumer = kafka
        .config(&[
            ("group.id", "pulse-read-topic"), // required by librdkafka; never joined
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
        ])
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
    let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Err(KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownTopic));
    };
    if let Some(error) = found.error() {
        return Err(KafkaError::MetadataFetch(error.into()));
    }
    // Where each non-empty partition ends now: reading stops there.
    let mut ends = std::collections::HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for partition in found.partitions().iter().map(|p| p.id()) {
        let (low, high) = consumer.fetch_watermarks(topic, partition, timeout)?;
        if high > low {
            ends.insert(partition, high);
            assignment.add_partition_offset(topic, partition, Offset::Offset(low))?;
        }
    }
    consumer.assign(&assignment)?;
    let mut events = EventFile::default();
    while !ends.is_empty() {
        let message = consumer
            .poll(timeout)
            .ok_or(KafkaError::MessageConsumption(
                RDKafkaErrorCode::RequestTimedOut,
            ))??;
        events.push(message.payload().unwrap_or_default());
        if ends
            .get(&message.partition())
            .is_some_and(|end| message.offset() + 1 >= *end)
        {
            ends.remove(&message.partition());
        }
    }
    Ok(events)
}

/// Writes commands as JSON lines (the `prewarm` topic's wire format).
pub fn write_commands(path: &Path, commands: &[PrewarmCommand]) -> std::io::Result<()> {
    let mut out = BufWriter::new(std::fs::File::create(path)?);
    for command in commands {
        out.write_all(&encode(command))?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// Writes events as JSON lines.
pub(crate) fn write_events(path: &Path, events: &[AccessEvent]) -> std::io::Result<()> {
    let mut out = BufWriter::new(std::fs::File::create(path)?);
    for event in events {
        out.write_all(&encode(event))?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::trace::{BurstKind, TraceSpec, generate as generate_trace};
    use crate::predict::TrainOptions;

    fn spec(seed: u64) -> TraceSpec {
        TraceSpec {
            seed,
            duration_ms: 240_000,
            background_rps: 150.0,
            virals: 6,
            noise: 6,
            crons: 2,
            ..TraceSpec::default()
        }
    }

    fn train(seed: u64) -> Arc<ScoringModel> {
        let trace = generate_trace(&spec(seed));
        let run = replay(&trace.events, None, &ReplayOptions::default());
        let samples: Vec<_> = run.samples.iter().map(|s| (s.features, s.viral)).collect();
        Arc::new(ScoringModel::train(&samples, &[], &TrainOptions::default()).unwrap())
    }

    #[test]
    fn replay_labels_viral_keys_and_not_noise() {
        let trace = generate_trace(&spec(11));
        let run = replay(&trace.events, None, &ReplayOptions::default());
        assert_eq!(run.applied, trace.events.len());
        assert!(run.commands.is_empty(), "no model, no commands");
        let label_of = |kind| {
            let keys: Vec<_> = trace
                .bursts
                .iter()
                .filter(|b| b.kind == kind)
                .map(|b| &b.key)
                .collect();
            run.samples
                .iter()
                .filter(|s| keys.contains(&&s.key))
                .any(|s| s.viral)
        };
        assert!(
            label_of(BurstKind::Viral),
            "a spreading key must be labelled viral at some point"
        );
        assert!(
            !label_of(BurstKind::Noise),
            "a one-region spike must never be labelled viral"
        );
    }

    #[test]
    fn a_trained_model_prewarms_spreading_keys_ahead_of_demand() {
        let model = train(21);
        let trace = generate_trace(&spec(22)); // held out: another seed
        let rows = backtest(
            &trace.events,
            Some(&trace.bursts),
            model,
            &[0.85],
            &ReplayOptions::default(),
        );
        let row = &rows[0];
        assert!(row.commands > 0, "{row:?}");
        assert!(row.recall.unwrap() >= 0.8, "{row:?}");
        assert!(row.precision >= 0.8, "{row:?}");
        assert!(row.median_lead_ms.unwrap() >= 1_000, "{row:?}");
    }

    /// Just after start the heat map's minute holds a second or two: a key that was
    /// always this busy must not look like it bursts (every popular key would be
    /// scored, and warmed everywhere, at start); a key that jumps later still does.
    #[test]
    fn a_busy_key_does_not_burst_because_pulse_just_started() {
        use models::{NodeId, Outcome};
        let event = |ts_ms: u64, key: &str, region: &str| {
            AccessEvent::new(
                ts_ms,
                "acme".parse().unwrap(),
                key.parse().unwrap(),
                region.parse().unwrap(),
                "n1".parse::<NodeId>().unwrap(),
                Outcome::Hit,
            )
        };
        let mut events = Vec::new();
        for ms in (0..120_000).step_by(25) {
            // 40 requests/s from the first event on; and from 90 s another key.
            events.push(event(ms, "/steady", "r0"));
            if ms >= 90_000 {
                events.push(event(ms, "/late", "r0"));
            }
            if ms % 1_000 == 0 {
                for region in ["r1", "r2", "r3"] {
                    events.push(event(ms, "/other", region));
                }
            }
        }
        let run = replay(&events, None, &ReplayOptions::default());
        let scored = |key: &str| run.samples.iter().any(|s| s.key.as_str() == key);
        assert!(scored("/late"), "a key that jumps is scored");
        assert!(!scored("/steady"), "a key as busy as ever is not");
    }

    /// Online retraining (`retrain`, as `pulse serve` runs it, on the same labels)
    /// learns a family the model never saw: a model trained without one-region flash
    /// crowds warms the whole fleet for them; retrained on moments that include a
    /// crowd trace, it stops, and does no worse on the traffic it knew.
    #[test]
    fn a_model_retrained_on_a_new_family_improves_on_it_and_not_on_the_others() {
        use crate::predict::{RetrainOutcome, retrain};
        let known = |seed| TraceSpec {
            flash_crowds: 0,
            ..spec(seed)
        };
        let crowds = |seed| TraceSpec {
            flash_crowds: 8,
            virals: 3,
            ..spec(seed)
        };
        let samples = |spec: &TraceSpec| {
            let trace = generate_trace(spec);
            replay(&trace.events, None, &ReplayOptions::default()).samples
        };
        let fit = |samples: &[crate::predict::Sample]| {
            let pairs: Vec<_> = samples.iter().map(|s| (s.features, s.viral)).collect();
            ScoringModel::train(&pairs, &[], &TrainOptions::default()).unwrap()
        };
        let before = samples(&known(41));
        let base = fit(&before);
        // What pulse serve would hold at its next retrain: older moments first, the
        // crowds' moments the newest (part of them held out to judge the candidate).
        let mut seen = before;
        seen.extend(samples(&crowds(42)));
        let retrained = match retrain(&base, &seen, 0.2, &TrainOptions::default()) {
            RetrainOutcome::Replace { model, .. } => *model,
            other => panic!("the retrain kept the old model: {other:?}"),
        };
        // Each model's own confidence: the online calibration (and its wait for
        // first-region outcomes) would hide what the model learnt.
        let mut own_confidence = ReplayOptions::default();
        own_confidence.predictor.calibrate_online = false;
        let row = |model: &ScoringModel, spec: &TraceSpec| {
            let trace = generate_trace(spec);
            let run = replay(
                &trace.events,
                Some(Arc::new(model.clone())),
                &own_confidence,
            );
            score(&run, &trace.events, 0.85, Some(&trace.bursts))
        };
        // Seeds neither model trained on.
        let (new_before, new_after) = (row(&base, &crowds(43)), row(&retrained, &crowds(43)));
        assert!(
            new_after.precision > new_before.precision + 0.2 && new_after.precision >= 0.9,
            "on the new family: {new_before:?} -> {new_after:?}"
        );
        assert!(new_after.recall >= Some(0.9), "{new_after:?}");
        let (old_before, old_after) = (row(&base, &known(44)), row(&retrained, &known(44)));
        assert!(
            old_after.precision >= old_before.precision
                && old_after.recall >= old_before.recall
                && old_after.wasted_share <= old_before.wasted_share,
            "on the known family: {old_before:?} -> {old_after:?}"
        );
    }

    /// A replay retrains as `pulse serve` does, every `replay_retrain_every_ms` of event
    /// time, on its own labelled moments; a candidate not worse on the newest ones is
    /// put in use, and the commands after it carry its name. Without the setting it
    /// never retrains.
    #[test]
    fn a_replay_retrains_on_its_own_moments_as_pulse_serve_does() {
        let model = train(21);
        let trace = generate_trace(&TraceSpec {
            duration_ms: 600_000,
            virals: 24,
            noise: 24,
            ..spec(31)
        });
        let mut options = ReplayOptions::default();
        assert!(
            replay(&trace.events, Some(model.clone()), &options)
                .retrains
                .is_empty()
        );
        options.predictor.replay_retrain_every_ms = Some(120_000);
        let run = replay(&trace.events, Some(model.clone()), &options);
        let times: Vec<u64> = run.retrains.iter().map(|(t, _)| *t).collect();
        let start = trace.events[0].ts_ms;
        let every: Vec<u64> = (1..=4).map(|i| start + i * 120_000).collect();
        assert_eq!(times, every, "{:?}", run.retrains);
        let replaced = run.retrains.iter().find(|(_, o)| *o == "replaced");
        let Some((at, _)) = replaced else {
            panic!("no retrain replaced the model: {:?}", run.retrains);
        };
        let online = format!("{}-online-1", model.name);
        assert!(
            run.commands
                .iter()
                .filter(|c| c.issued_at_ms > *at)
                .all(|c| c
                    .reason
                    .model
                    .starts_with(&format!("{}-online-", model.name))),
            "a command after the swap from another model"
        );
        assert!(
            run.commands.iter().any(|c| c.reason.model == online)
                || run
                    .retrains
                    .iter()
                    .filter(|(_, o)| *o == "replaced")
                    .count()
                    > 1,
            "no command from {online}"
        );
    }

    /// `--commands` writes the wire format: every line decodes back to the command,
    /// and the honest scorer gives the same figures from the file as from the replay.
    #[test]
    fn commands_file_is_the_wire_format_and_scores_the_same() {
        let model = train(21);
        let trace = generate_trace(&TraceSpec {
            duration_ms: 90_000,
            virals: 2,
            noise: 2,
            crons: 0,
            ..spec(23)
        });
        let run = replay(&trace.events, Some(model), &ReplayOptions::default());
        assert!(!run.commands.is_empty());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("commands.jsonl");
        write_commands(&path, &run.commands).unwrap();
        let read: Vec<PrewarmCommand> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|line| decode(line.as_bytes()).unwrap())
            .collect();
        assert_eq!(read, run.commands);
        let options = HonestOptions::default();
        assert_eq!(
            score_commands(&read, &trace.events, Some(&trace.bursts), &options),
            score_commands(&run.commands, &trace.events, Some(&trace.bursts), &options)
        );
    }

    #[test]
    fn event_files_round_trip_and_count_bad_lines() {
        let trace = generate_trace(&TraceSpec {
            duration_ms: 30_000,
            virals: 1,
            noise: 0,
            crons: 0,
            flash_crowds: 0,
            ..spec(3)
        });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        write_events(&path, &trace.events).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{oops\n\n")
            .unwrap();
        let read = read_events(&path).unwrap();
        assert_eq!(read.events, trace.events);
        assert_eq!(read.rejected.get("malformed"), Some(&1));
    }
}
