//! The `pulse` command line.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use models::TenantId;
use pulse::{
    DecisionPolicy, EVENTS_TOPIC, EmbeddedBroker, EventSource, FAMILIES, Family, HeatConfig,
    PREWARM_TOPIC, PredictorConfig, PulseConfig, RETRAIN_INTERVAL_SECS, ScoringModel, TraceSpec,
    TrainOptions,
};

/// Pulse watches edge access events and pre-warms hot keys across regions.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines are written to stderr: `text` (coloured on a terminal only) or
    /// `json` (one object per line: timestamp, level, target, message, fields).
    #[arg(long, global = true, env = pulse::LOG_FORMAT_ENV, value_enum, default_value_t)]
    log_format: pulse::LogFormat,
}

#[derive(Subcommand)]
enum Command {
    /// Run an embedded Kafka broker (librdkafka's mock cluster) on loopback with the
    /// `edge-events` and `prewarm` topics, print its address, and wait for Ctrl-C.
    Broker {
        /// Partitions per topic.
        #[arg(long, default_value_t = 4)]
        partitions: i32,
    },
    /// Consume access events into the heat map and serve the dashboard API.
    /// `--check-config` checks the settings as a start would, starting nothing.
    Serve(Box<ServeArgs>),
    /// Generate a synthetic trace: a Zipf background, viral events that spread across
    /// regions, cron-like bursts, and noise bursts that must not trigger.
    Trace(TraceArgs),
    /// Fit the scoring model to a recorded or generated event file and save it.
    Train(TrainArgs),
    /// Replay an event file through the predictor at several thresholds and print
    /// precision, recall, median lead time and wasted pre-warms.
    Backtest(BacktestArgs),
    /// Warm a tenant's keys (a list, or a prefix of the keys pulse knows) on the edges
    /// of some or all regions, from an instant on and at a pace: asks a running pulse
    /// (`POST /api/warm`), prints the warm-up's id; `--follow` shows its progress.
    Warm(pulse::WarmArgs),
}

/// librdkafka properties for every Kafka client a command makes: how pulse reaches a
/// broker that needs TLS or SASL, and any tuning.
#[derive(Args, Debug, Clone, Default)]
struct KafkaArgs {
    /// A librdkafka property for every Kafka client pulse makes, as KEY=VALUE (repeat
    /// the flag): security.protocol=SASL_SSL, ssl.ca.location=/path/ca.pem,
    /// sasl.mechanisms=PLAIN, sasl.username=..., tuning. It overrides pulse's own
    /// setting of that property on each client, except those pulse's correctness
    /// depends on (bootstrap.servers, group.id, enable.auto.commit, enable.auto.offset.store,
    /// group.protocol, partition.assignment.strategy, enable.partition.eof,
    /// auto.offset.reset, transactional.id), which are refused. Flags show in `ps`:
    /// put passwords in --kafka-properties.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE", value_parser = parse_kafka_property)]
    kafka_property: Vec<(String, String)>,
    /// A properties file, as Kafka's own tools take `--command-config`: `key=value`
    /// lines, `#` and `!` comments, blank lines. Read first: --kafka-property wins.
    #[arg(long, env = "PULSE_KAFKA_PROPERTIES", value_name = "FILE")]
    kafka_properties: Option<PathBuf>,
}

impl KafkaArgs {
    /// The file's properties, then the flags'; errors name the flag.
    fn properties(&self) -> anyhow::Result<BTreeMap<String, String>> {
        let mut properties = match &self.kafka_properties {
            Some(path) => pulse::read_properties_file(path)
                .map_err(|e| anyhow::anyhow!("--kafka-properties (PULSE_KAFKA_PROPERTIES): {e}"))?,
            None => BTreeMap::new(),
        };
        properties.extend(self.kafka_property.iter().cloned());
        pulse::check_properties(&properties)
            .map_err(|e| anyhow::anyhow!("{KAFKA_PROPERTY_FLAGS}: {e}"))?;
        Ok(properties)
    }
}

/// `source` reading a topic with the operator's `properties` (already checked by
/// [`KafkaArgs::properties`]); a file is left as it is.
fn with_properties(
    source: EventSource,
    properties: &BTreeMap<String, String>,
) -> anyhow::Result<EventSource> {
    Ok(match source {
        EventSource::Topic { kafka, topic } => EventSource::Topic {
            kafka: kafka
                .with_properties(properties.clone())
                .map_err(|e| anyhow::anyhow!("{KAFKA_PROPERTY_FLAGS}: {e}"))?,
            topic,
        },
        file => file,
    })
}

/// The flags that give librdkafka properties, as errors name them.
const KAFKA_PROPERTY_FLAGS: &str = "--kafka-property/--kafka-properties (PULSE_KAFKA_PROPERTIES)";

/// `KEY=VALUE` of `--kafka-property`.
fn parse_kafka_property(s: &str) -> Result<(String, String), String> {
    pulse::parse_property(s).map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
struct TraceArgs {
    /// Where to write the events (JSON lines, the Kafka message format).
    #[arg(long, required_unless_present = "list_families")]
    out: Option<PathBuf>,
    /// Where to write the truth about the injected bursts (JSON), for `backtest --truth`.
    #[arg(long)]
    truth: Option<PathBuf>,
    /// A JSON file of generator settings (see `TraceSpec`); flags below override it.
    #[arg(long, conflicts_with = "family")]
    spec: Option<PathBuf>,
    /// A traffic family's settings (`pulse trace --list-families`); flags below
    /// override them.
    #[arg(long)]
    family: Option<String>,
    /// List the families and exit.
    #[arg(long)]
    list_families: bool,
    /// Random seed: the same seed gives the same trace.
    #[arg(long)]
    seed: Option<u64>,
    /// Time of the first event, ms since the Unix epoch (time-of-day features depend
    /// on it: train on traces spread over the week).
    #[arg(long)]
    start_ms: Option<u64>,
    /// Length of the trace in minutes.
    #[arg(long)]
    minutes: Option<u64>,
    /// Viral events to inject.
    #[arg(long)]
    virals: Option<usize>,
    /// Background requests per second over the fleet.
    #[arg(long)]
    background_rps: Option<f64>,
}

#[derive(Args, Debug)]
struct TrainArgs {
    /// The events to learn from: a JSON-lines file, or a topic read from its beginning
    /// to its end as `kafka://HOST:PORT/TOPIC`; repeat the flag for several.
    #[arg(long, required_unless_present = "families")]
    events: Vec<EventSource>,
    /// Of each `--events` source, the share from its start in time to learn from (0.5:
    /// its first half; the rest stays unseen for `pulse backtest`'s second half).
    #[arg(long, default_value_t = 1.0)]
    events_share: f64,
    /// Train on generated traffic families (comma-separated names, or `train` for every
    /// family marked for training), one trace per `--seeds` value each, besides any
    /// `--events`.
    #[arg(long, value_delimiter = ',')]
    families: Vec<String>,
    /// Seeds of the family traces.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    seeds: Vec<u64>,
    /// Events from another period (file or topic), only to measure the model on.
    #[arg(long)]
    held_out: Option<EventSource>,
    /// Where to write the model (JSON).
    #[arg(long)]
    out: PathBuf,
    /// The model's name, recorded in every decision it makes.
    #[arg(long, default_value = "model")]
    name: String,
    /// Ridge penalty on the standardised coefficients (larger: simpler model).
    #[arg(long, default_value_t = TrainOptions::default().ridge)]
    ridge: f64,
    #[command(flatten)]
    kafka: KafkaArgs,
}

#[derive(Args, Debug)]
struct BacktestArgs {
    /// The events to replay: a JSON-lines file, or `kafka://HOST:PORT/TOPIC` (read from
    /// its beginning to its end).
    #[arg(
        long,
        required_unless_present = "families",
        conflicts_with = "families"
    )]
    events: Option<EventSource>,
    /// Instead of `--events`: generate each of these traffic families (names, `all`,
    /// `train` or `held-out`) at `--seed` and print one row per family at `--threshold`.
    #[arg(long, value_delimiter = ',')]
    families: Vec<String>,
    /// The seed of the family traces (training uses 1 and 2).
    #[arg(long, default_value_t = 1000)]
    seed: u64,
    /// The truth file written by `pulse trace --truth`; without it, precision is the
    /// share of useful commands and recall is not known.
    #[arg(long)]
    truth: Option<PathBuf>,
    /// The model file; the built-in default model without it.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Confidence thresholds to try.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.5,0.6,0.7,0.8,0.85,0.9,0.95"
    )]
    thresholds: Vec<f64>,
    /// Write every command the replay sends at `--threshold` to this file (JSON lines,
    /// the `prewarm` topic's wire format), to score them another way.
    #[arg(long)]
    commands: Option<PathBuf>,
    /// The threshold whose commands `--commands` writes, and of `--families`' rows.
    #[arg(long, default_value_t = DecisionPolicy::default().threshold)]
    threshold: f64,
    /// Regions that must have asked for a key before it can get a command (2: wait for
    /// spread evidence).
    #[arg(long, default_value_t = DecisionPolicy::default().min_regions_reached)]
    min_regions_reached: usize,
    /// Consecutive scorings at the threshold before a command.
    #[arg(long, default_value_t = DecisionPolicy::default().confirmations)]
    confirmations: u32,
    /// What a wasted pre-warm fill costs, in client misses (as `pulse serve
    /// --wasted-fill-cost`): a higher cost names fewer regions, each likelier to ask.
    #[arg(long, default_value_t = DecisionPolicy::default().wasted_fill_cost)]
    wasted_fill_cost: f64,
    /// Seconds of event time between online retrains on the replay's own labelled
    /// moments, as `pulse serve --retrain-interval-secs` retrains live (0: never).
    #[arg(long, default_value_t = RETRAIN_INTERVAL_SECS)]
    retrain_interval_secs: u64,
    /// Keep the model's own confidence: no online recalibration from the outcomes the
    /// replay sees, and no cold-start wait for a second region (as `pulse serve
    /// --no-calibrate-online`).
    #[arg(long)]
    no_calibrate_online: bool,
    /// Replay `--events` in the order the file or topic holds them, not sorted by event
    /// time: an event delivered late reaches the predictor late, as it reaches `pulse
    /// serve` reading a partition (`scripts/reshape-traces late` makes such a file).
    #[arg(long)]
    as_delivered: bool,
    #[command(flatten)]
    kafka: KafkaArgs,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Kafka bootstrap servers (HOST:PORT,...). Without it, pulse starts an embedded
    /// broker and prints its address.
    #[arg(long, env = "PULSE_BROKERS")]
    brokers: Option<String>,
    #[command(flatten)]
    kafka: KafkaArgs,
    /// The events topic.
    #[arg(long, env = "PULSE_TOPIC", default_value = EVENTS_TOPIC)]
    topic: String,
    /// The consumer group.
    #[arg(long, env = "PULSE_GROUP", default_value = "pulse")]
    group: String,
    /// Where the dashboard API listens.
    #[arg(long, env = "PULSE_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Checkpoint file: each owned partition's heat map and offset, written
    /// periodically and at shutdown (offsets are committed after each checkpoint); a
    /// partition is restored from it when assigned.
    #[arg(long, env = "PULSE_CHECKPOINT")]
    checkpoint: Option<PathBuf>,
    /// Seconds between checkpoints.
    #[arg(long, env = "PULSE_CHECKPOINT_INTERVAL_SECS", default_value_t = 10)]
    checkpoint_interval_secs: u64,
    /// Seconds between offset commits when there is no checkpoint file.
    #[arg(long, env = "PULSE_COMMIT_INTERVAL_SECS", default_value_t = 2)]
    commit_interval_secs: u64,
    /// Forward rejected messages to this topic (with a `pulse-reject-reason` header).
    #[arg(long, env = "PULSE_DEAD_LETTER_TOPIC")]
    dead_letter_topic: Option<String>,
    /// Sketch error ε: additive error as a fraction of a window's events.
    #[arg(long, env = "PULSE_SKETCH_ERROR", default_value_t = HeatConfig::default().error)]
    sketch_error: f64,
    /// Sketch confidence 1 − δ.
    #[arg(long, env = "PULSE_SKETCH_CONFIDENCE", default_value_t = HeatConfig::default().confidence)]
    sketch_confidence: f64,
    /// Keys tracked per tenant per second (heat-map candidates).
    #[arg(long, env = "PULSE_TOP_K", default_value_t = HeatConfig::default().top_k)]
    top_k: usize,
    /// Keys tracked per region per second.
    #[arg(long, env = "PULSE_REGION_TOP_K", default_value_t = HeatConfig::default().region_top_k)]
    region_top_k: usize,
    /// Memory the heat map may hold, MiB; a new tenant past it is rejected.
    #[arg(long, env = "PULSE_MEMORY_BUDGET_MIB", default_value_t = HeatConfig::default().memory_budget_bytes >> 20)]
    memory_budget_mib: u64,
    /// Tenants with fewer events per 60 s share one sketch (0: each its own).
    #[arg(long, env = "PULSE_SHARED_SKETCH_BELOW", default_value_t = HeatConfig::default().shared_sketch_below)]
    shared_sketch_below: u64,
    /// Error of the shared sketch, as a fraction of all small tenants' events.
    #[arg(long, env = "PULSE_SHARED_SKETCH_ERROR", default_value_t = HeatConfig::default().shared_error)]
    shared_sketch_error: f64,
    /// Events stamped further ahead of the wall clock are rejected (`from_future`): a
    /// node whose clock runs further ahead would put the watermark past every other
    /// node's events, and pulse measures at most 1 s behind it.
    #[arg(long, env = "PULSE_MAX_CLOCK_SKEW_MS", default_value_t = HeatConfig::default().max_clock_skew_ms)]
    max_clock_skew_ms: u64,
    /// Only these tenants (comma-separated); others are rejected (`unknown_tenant`).
    #[arg(long, env = "PULSE_TENANTS", value_delimiter = ',')]
    tenants: Vec<String>,
    /// A file of allowed tenants, one per line (`#` comments); joins `--tenants`.
    #[arg(long, env = "PULSE_TENANTS_FILE")]
    tenants_file: Option<PathBuf>,
    /// Do not predict or send pre-warm commands: heat map and API only.
    #[arg(long, env = "PULSE_NO_PREWARM")]
    no_prewarm: bool,
    /// The topic pre-warm commands go to.
    #[arg(long, env = "PULSE_PREWARM_TOPIC", default_value = PREWARM_TOPIC)]
    prewarm_topic: String,
    /// Sign every pre-warm command with a key of this file (`KEY_ID SECRET_HEX` lines,
    /// `#` comments; the edges hold the same file): an HMAC-SHA256 of the payload in
    /// the `edge-pulse-sig` header. Needs --prewarm-signing-key-id.
    #[arg(long, env = "PULSE_PREWARM_SIGNING_KEYS")]
    prewarm_signing_keys: Option<PathBuf>,
    /// The id of the key in --prewarm-signing-keys that signs (the current one).
    #[arg(long, env = "PULSE_PREWARM_SIGNING_KEY_ID")]
    prewarm_signing_key_id: Option<String>,
    /// The scoring model file (JSON, from `pulse train`); the built-in model without it.
    #[arg(long, env = "PULSE_MODEL")]
    model: Option<PathBuf>,
    /// Minimum confidence for a pre-warm command, in [0, 1].
    #[arg(long, env = "PULSE_THRESHOLD", default_value_t = DecisionPolicy::default().threshold)]
    threshold: f64,
    /// Seconds a key waits after a command before it can get another (one per wave).
    #[arg(long, env = "PULSE_COOLDOWN_SECS", default_value_t = DecisionPolicy::default().cooldown_ms / 1000)]
    cooldown_secs: u64,
    /// Seconds a command stays valid at the edges.
    #[arg(long, env = "PULSE_COMMAND_TTL_SECS", default_value_t = DecisionPolicy::default().command_ttl_ms / 1000)]
    command_ttl_secs: u64,
    /// Each tenant's committed rate of commands per second, for the whole fleet (one
    /// bucket per tenant, at the fleet's gate).
    #[arg(long, env = "PULSE_TENANT_RATE", default_value_t = DecisionPolicy::default().tenant_rate_per_s)]
    tenant_rate: f64,
    /// Each tenant's burst allowance, in commands, for the whole fleet.
    #[arg(long, env = "PULSE_TENANT_BURST", default_value_t = DecisionPolicy::default().tenant_burst)]
    tenant_burst: f64,
    /// Each tenant's rate of operators' warm-up commands per second (`POST /api/warm`,
    /// `pulse warm`), a fleet bucket of its own: warm-ups and predictions never starve
    /// each other. A warm-up's `pace` may not exceed it.
    #[arg(long, env = "PULSE_WARM_RATE", default_value_t = DecisionPolicy::default().tenant_rate_per_s)]
    warm_rate: f64,
    /// Each tenant's burst allowance for warm-ups, in commands.
    #[arg(long, env = "PULSE_WARM_BURST", default_value_t = DecisionPolicy::default().tenant_burst)]
    warm_burst: f64,
    /// What a wasted pre-warm fill costs, in client misses: a command goes out only when
    /// confidence × misses it would save ≥ (1 − confidence) × this cost.
    #[arg(long, env = "PULSE_WASTED_FILL_COST", default_value_t = DecisionPolicy::default().wasted_fill_cost)]
    wasted_fill_cost: f64,
    /// A tenant's own wasted-fill cost, as TENANT=COST (repeat the flag for more).
    #[arg(long = "tenant-fill-cost", value_parser = parse_tenant_cost)]
    tenant_fill_costs: Vec<(TenantId, f64)>,
    /// Seconds between background retrains on pulse's own labelled decisions (0: never).
    #[arg(long, env = "PULSE_RETRAIN_INTERVAL_SECS", default_value_t = RETRAIN_INTERVAL_SECS)]
    retrain_interval_secs: u64,
    /// Require `Authorization: Bearer <token>` on every /api/* route (401 otherwise);
    /// /healthz and /metrics stay open. Prefer the variable: flags show in `ps`.
    #[arg(long, env = "PULSE_API_TOKEN", hide_env_values = true)]
    api_token: Option<String>,
    /// The other pulse instances of this group, as their API base URLs
    /// (http://10.0.0.2:8080,...): every /api answer gathers their parts, merged, and
    /// says in `coverage` which partitions it covers. Without it an instance answers for
    /// its own partitions only (still saying so).
    #[arg(long, env = "PULSE_PEERS", value_delimiter = ',')]
    peers: Vec<String>,
    /// This instance's API base URL as the others reach it (http://10.0.0.1:8080):
    /// carried in its consumer's client id, so the instances of a group find each
    /// other by describing it, with no --peers (which overrides it).
    #[arg(long, env = "PULSE_ADVERTISE_URL")]
    advertise_url: Option<String>,
    /// How long a peer may take to answer its part, in milliseconds.
    #[arg(long, env = "PULSE_PEER_TIMEOUT_MS", default_value_t = pulse::DEFAULT_PEER_TIMEOUT.as_millis() as u64)]
    peer_timeout_ms: u64,
    /// The compacted topic the fleet's one model goes through (default
    /// TOPIC.GROUP.model): the instance that owns partition 0 retrains and publishes,
    /// every instance uses the newest model on it.
    #[arg(long, env = "PULSE_MODEL_TOPIC")]
    model_topic: Option<String>,
    /// Keep and retrain this instance's own model (no model topic).
    #[arg(long, env = "PULSE_NO_MODEL_TOPIC")]
    no_model_topic: bool,
    /// Keep the model's own confidence: no online recalibration from the outcomes this
    /// instance sees (per partition and tenant, in bins of the model's output), and no
    /// wait for a second region while too few first-region outcomes are judged.
    #[arg(long, env = "PULSE_NO_CALIBRATE_ONLINE")]
    no_calibrate_online: bool,
    /// Check the settings as a start would (every flag, the Kafka properties file
    /// and properties, the tenants file, the model file, the checkpoint file),
    /// starting no broker, binding no port and connecting to nothing; print one line
    /// and exit: 0 when they are good, 1 naming the bad flag or field.
    #[arg(long)]
    check_config: bool,
    /// Partitions of the events and pre-warm topics when pulse creates them at start
    /// (on a broker that lacks them; an existing topic is used as it is).
    #[arg(long, env = "PULSE_TOPIC_PARTITIONS", default_value_t = PulseConfig::default().topic_partitions)]
    topic_partitions: i32,
    /// Retention of the topics pulse creates, in hours (the broker's default without it).
    #[arg(long, env = "PULSE_TOPIC_RETENTION_HOURS")]
    topic_retention_hours: Option<u64>,
}

impl ServeArgs {
    /// The service config these flags give, checked; errors name the flag and its
    /// variable.
    fn into_config(self) -> anyhow::Result<PulseConfig> {
        let config = PulseConfig {
            brokers: self.brokers,
            kafka_properties: self.kafka.properties()?,
            topic: self.topic,
            group: self.group,
            listen: self.listen,
            checkpoint: self.checkpoint,
            checkpoint_interval_secs: self.checkpoint_interval_secs,
            commit_interval_secs: self.commit_interval_secs,
            dead_letter_topic: self.dead_letter_topic,
            heat: HeatConfig {
                error: self.sketch_error,
                confidence: self.sketch_confidence,
                top_k: self.top_k,
                region_top_k: self.region_top_k,
                shared_sketch_below: self.shared_sketch_below,
                shared_error: self.shared_sketch_error,
                memory_budget_bytes: self.memory_budget_mib.saturating_mul(1 << 20),
                max_clock_skew_ms: self.max_clock_skew_ms,
            },
            tenants: self.tenants,
            tenants_file: self.tenants_file,
            prewarm: !self.no_prewarm,
            prewarm_topic: self.prewarm_topic,
            prewarm_signing_keys: self.prewarm_signing_keys,
            prewarm_signing_key_id: self.prewarm_signing_key_id,
            model: self.model,
            threshold: self.threshold,
            cooldown_ms: self.cooldown_secs.saturating_mul(1000),
            command_ttl_ms: self.command_ttl_secs.saturating_mul(1000),
            tenant_rate_per_s: self.tenant_rate,
            tenant_burst: self.tenant_burst,
            warm_rate_per_s: self.warm_rate,
            warm_burst: self.warm_burst,
            wasted_fill_cost: self.wasted_fill_cost,
            tenant_fill_costs: self.tenant_fill_costs.into_iter().collect(),
            retrain_interval_secs: self.retrain_interval_secs,
            api_token: self.api_token,
            peers: self.peers,
            advertise_url: self.advertise_url,
            peer_timeout_ms: self.peer_timeout_ms,
            fleet_model: !self.no_model_topic,
            calibrate_online: !self.no_calibrate_online,
            model_topic: self.model_topic,
            topic_partitions: self.topic_partitions,
            topic_retention_ms: self
                .topic_retention_hours
                .map(|h| h.saturating_mul(3_600_000)),
            ..PulseConfig::default()
        };
        config.validate().map_err(|e| {
            let flag = match e.field {
                "brokers" => "--brokers (PULSE_BROKERS)",
                "kafka_properties" => KAFKA_PROPERTY_FLAGS,
                "topic" => "--topic (PULSE_TOPIC)",
                "group" => "--group (PULSE_GROUP)",
                "dead_letter_topic" => "--dead-letter-topic (PULSE_DEAD_LETTER_TOPIC)",
                "checkpoint_interval_secs" => {
                    "--checkpoint-interval-secs (PULSE_CHECKPOINT_INTERVAL_SECS)"
                }
                "commit_interval_secs" => "--commit-interval-secs (PULSE_COMMIT_INTERVAL_SECS)",
                "heat.error" => "--sketch-error (PULSE_SKETCH_ERROR)",
                "heat.confidence" => "--sketch-confidence (PULSE_SKETCH_CONFIDENCE)",
                "heat.top_k" => "--top-k (PULSE_TOP_K)",
                "heat.region_top_k" => "--region-top-k (PULSE_REGION_TOP_K)",
                "heat.shared_sketch_below" => "--shared-sketch-below (PULSE_SHARED_SKETCH_BELOW)",
                "heat.shared_error" => "--shared-sketch-error (PULSE_SHARED_SKETCH_ERROR)",
                "heat.memory_budget_bytes" => "--memory-budget-mib (PULSE_MEMORY_BUDGET_MIB)",
                "heat.max_clock_skew_ms" => "--max-clock-skew-ms (PULSE_MAX_CLOCK_SKEW_MS)",
                "tenants" => "--tenants (PULSE_TENANTS)",
                "threshold" => "--threshold (PULSE_THRESHOLD)",
                "command_ttl_ms" => "--command-ttl-secs (PULSE_COMMAND_TTL_SECS)",
                "tenant_rate_per_s" => "--tenant-rate (PULSE_TENANT_RATE)",
                "tenant_burst" => "--tenant-burst (PULSE_TENANT_BURST)",
                "warm_rate_per_s" => "--warm-rate (PULSE_WARM_RATE)",
                "warm_burst" => "--warm-burst (PULSE_WARM_BURST)",
                "wasted_fill_cost" => {
                    "--wasted-fill-cost (PULSE_WASTED_FILL_COST) or --tenant-fill-cost"
                }
                "prewarm_topic" => "--prewarm-topic (PULSE_PREWARM_TOPIC)",
                "prewarm_signing_key_id" => {
                    "--prewarm-signing-key-id (PULSE_PREWARM_SIGNING_KEY_ID)"
                }
                "peers" => "--peers (PULSE_PEERS)",
                "peer_timeout_ms" => "--peer-timeout-ms (PULSE_PEER_TIMEOUT_MS)",
                "advertise_url" => "--advertise-url (PULSE_ADVERTISE_URL)",
                "model_topic" => "--model-topic (PULSE_MODEL_TOPIC)",
                "topic_partitions" => "--topic-partitions (PULSE_TOPIC_PARTITIONS)",
                "topic_retention_ms" => "--topic-retention-hours (PULSE_TOPIC_RETENTION_HOURS)",
                other => other,
            };
            anyhow::anyhow!("{flag}: {}", e.reason)
        })?;
        Ok(config)
    }
}

/// A failed [`pulse::check_config`], naming the flag (and variable) of the field.
fn named_flag(error: pulse::StartError) -> anyhow::Error {
    use pulse::StartError;
    match error {
        StartError::Config(e) => {
            let flag = match e.field {
                "kafka_properties" => KAFKA_PROPERTY_FLAGS,
                "checkpoint" => "--checkpoint (PULSE_CHECKPOINT)",
                other => other,
            };
            anyhow::anyhow!("{flag}: {}", e.reason)
        }
        StartError::TenantsFile { path, reason } => anyhow::anyhow!(
            "--tenants-file (PULSE_TENANTS_FILE): {}: {reason}",
            path.display()
        ),
        e @ (StartError::ModelFile { .. } | StartError::Model { .. }) => {
            anyhow::anyhow!("--model (PULSE_MODEL): {e}")
        }
        e @ StartError::Checkpoint(_) => anyhow::anyhow!("--checkpoint (PULSE_CHECKPOINT): {e}"),
        other => other.into(),
    }
}

/// `TENANT=COST` of `--tenant-fill-cost`.
fn parse_tenant_cost(s: &str) -> Result<(TenantId, f64), String> {
    let (tenant, cost) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected TENANT=COST"))?;
    let tenant = tenant
        .parse()
        .map_err(|e| format!("{tenant:?}: not a tenant id: {e}"))?;
    let cost = cost
        .parse()
        .map_err(|e| format!("{cost:?}: not a number: {e}"))?;
    Ok((tenant, cost))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    pulse::init_logging(cli.log_format, "info");
    match cli.command {
        Command::Broker { partitions } => {
            let broker = EmbeddedBroker::start(1).context("starting the embedded broker")?;
            for topic in [EVENTS_TOPIC, PREWARM_TOPIC] {
                broker.create_topic(topic, partitions)?;
            }
            println!("{}", broker.bootstrap_servers());
            tracing::info!(
                bootstrap = broker.bootstrap_servers(),
                "embedded broker up; Ctrl-C stops it"
            );
            pulse::shutdown_signal().await;
            tracing::info!("stopping");
        }
        Command::Serve(args) => serve(*args).await?,
        Command::Trace(args) => trace(args)?,
        Command::Train(args) => train(args)?,
        Command::Backtest(args) => backtest(args)?,
        Command::Warm(args) => pulse::warm_command(args).await?,
    }
    Ok(())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    if args.check_config {
        let checked = args
            .into_config()
            .and_then(|config| pulse::check_config(&config).map_err(named_flag));
        match checked {
            Ok(()) => {
                println!("pulse serve: configuration (flags and PULSE_* variables) is OK");
                return Ok(());
            }
            Err(error) => {
                eprintln!("pulse serve: configuration is invalid: {error}");
                std::process::exit(1);
            }
        }
    }
    let pulse = pulse::start(args.into_config()?).await?;
    if pulse.embedded_broker() {
        println!("embedded broker: {}", pulse.brokers());
    }
    println!("dashboard: {}/api/tenants", pulse.api_url());
    pulse::shutdown_signal().await;
    // Final checkpoint and commit happen here.
    pulse.shutdown().await;
    Ok(())
}

fn family(name: &str, flag: &str) -> anyhow::Result<&'static Family> {
    Family::named(name).with_context(|| {
        let names: Vec<_> = FAMILIES.iter().map(|f| f.name).collect();
        format!(
            "{flag}: no family {name:?} (families: {})",
            names.join(", ")
        )
    })
}

fn trace(args: TraceArgs) -> anyhow::Result<()> {
    if args.list_families {
        for f in &FAMILIES {
            let split = if f.train { "train" } else { "held out" };
            println!("{:<16} {:<9} {}", f.name, split, f.about);
        }
        return Ok(());
    }
    let out = args.out.clone().context("--out is required")?;
    let mut spec: TraceSpec = match (&args.spec, &args.family) {
        (Some(path), _) => serde_json::from_str(&std::fs::read_to_string(path)?)
            .with_context(|| format!("--spec: {}", path.display()))?,
        (None, Some(name)) => family(name, "--family")?.spec(args.seed.unwrap_or(1)),
        (None, None) => TraceSpec::default(),
    };
    if let (Some(seed), None) = (args.seed, &args.family) {
        spec.seed = seed;
    }
    if let Some(start) = args.start_ms {
        spec.start_ms = start;
    }
    if let Some(minutes) = args.minutes {
        spec.duration_ms = minutes * 60_000;
    }
    if let Some(virals) = args.virals {
        spec.virals = virals;
    }
    if let Some(rps) = args.background_rps {
        spec.background_rps = rps;
    }
    spec.validate()
        .map_err(|e| anyhow::anyhow!("trace settings: {e}"))?;
    let trace = pulse::generate_trace(&spec);
    pulse::write_trace(&trace, &out, args.truth.as_deref())
        .with_context(|| format!("--out/--truth: writing {}", out.display()))?;
    println!(
        "{} events, {} bursts -> {}",
        trace.events.len(),
        trace.bursts.len(),
        out.display()
    );
    Ok(())
}

/// Family names from a flag: `train` (families marked for training), `held-out`
/// (the others), `all`, or names.
fn families(names: &[String], flag: &str) -> anyhow::Result<Vec<&'static Family>> {
    let mut out = Vec::new();
    for name in names {
        match name.as_str() {
            "all" => out.extend(FAMILIES.iter()),
            "train" => out.extend(FAMILIES.iter().filter(|f| f.train)),
            "held-out" => out.extend(FAMILIES.iter().filter(|f| !f.train)),
            name => out.push(family(name, flag)?),
        }
    }
    Ok(out)
}

fn train(args: TrainArgs) -> anyhow::Result<()> {
    let options = TrainOptions {
        name: args.name,
        trained_at_ms: pulse::wall_clock_ms(),
        ridge: args.ridge,
        ..TrainOptions::default()
    };
    // The properties file is read once, for every source.
    let properties = args.kafka.properties()?;
    let events = args
        .events
        .into_iter()
        .map(|source| with_properties(source, &properties))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let held_out = args
        .held_out
        .map(|s| with_properties(s, &properties))
        .transpose()?;
    if !(args.events_share > 0.0 && args.events_share <= 1.0) {
        bail!("--events-share: {} is outside (0, 1]", args.events_share);
    }
    let set = pulse::TrainingSet {
        families: if args.families.is_empty() {
            Vec::new()
        } else {
            families(&args.families, "--families")?
        },
        seeds: args.seeds,
        events,
        events_share: args.events_share,
    };
    let model = pulse::train_on(&set, held_out.as_ref(), &options)?;
    std::fs::write(&args.out, model.to_json())
        .with_context(|| format!("--out: writing {}", args.out.display()))?;
    println!("{}", pulse::train_summary(&model));
    println!("model -> {}", args.out.display());
    Ok(())
}

fn backtest(args: BacktestArgs) -> anyhow::Result<()> {
    if let Some(t) = args.thresholds.iter().find(|t| !(0.0..=1.0).contains(*t)) {
        bail!("--thresholds: {t} is outside [0, 1]");
    }
    if !(args.wasted_fill_cost >= 0.0 && args.wasted_fill_cost.is_finite()) {
        bail!("--wasted-fill-cost: must be 0 or more");
    }
    let model = match &args.model {
        Some(path) => ScoringModel::from_json(&std::fs::read_to_string(path)?)
            .with_context(|| format!("--model: {}", path.display()))?,
        None => pulse::default_model(),
    };
    let properties = args.kafka.properties()?;
    let source = args
        .events
        .clone()
        .map(|s| with_properties(s, &properties))
        .transpose()?;
    let predictor = PredictorConfig {
        policy: DecisionPolicy {
            threshold: args.threshold,
            min_regions_reached: args.min_regions_reached,
            confirmations: args.confirmations,
            wasted_fill_cost: args.wasted_fill_cost,
            ..DecisionPolicy::default()
        },
        calibrate_online: !args.no_calibrate_online,
        replay_retrain_every_ms: Some(args.retrain_interval_secs.saturating_mul(1000)),
        ..PredictorConfig::default()
    };
    let Some(source) = &source else {
        let families = families(&args.families, "--families")?;
        let rows = pulse::family_rows(&model, &families, args.seed, &predictor)?;
        print!("{}", pulse::family_table(&model, &rows, args.seed));
        return Ok(());
    };
    let order = if args.as_delivered {
        pulse::EventOrder::AsDelivered
    } else {
        pulse::EventOrder::ByTime
    };
    let events = pulse::load_events(source, "--events", order)?;
    let truth: Option<Vec<pulse::Burst>> = match &args.truth {
        Some(path) => Some(
            serde_json::from_str(&std::fs::read_to_string(path)?)
                .with_context(|| format!("--truth: {}", path.display()))?,
        ),
        None => None,
    };
    if let Some(path) = &args.commands {
        let commands =
            pulse::backtest_commands(&events, model.clone(), &predictor).context("--threshold")?;
        pulse::write_commands(path, &commands)
            .with_context(|| format!("--commands: writing {}", path.display()))?;
        println!(
            "{} commands at {:.2} -> {}",
            commands.len(),
            args.threshold,
            path.display()
        );
    }
    print!(
        "{}",
        pulse::backtest_table(
            &events,
            truth.as_deref(),
            model,
            &args.thresholds,
            args.threshold,
            &predictor,
        )?
    );
    Ok(())
}
