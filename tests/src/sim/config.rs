//! The simulation's settings.

use prefetcher::{FlightConfig, PrefetchConfig};
use serde::Serialize;

/// Background keys ranked this high or higher count as hot, with the viral key (as in
/// the reference scenario).
pub const HOT_RANKS: usize = crate::scenario::HOT_RANKS;

/// The origin: `capacity` concurrent fills at `base_latency_ms`; past that each fill
/// takes longer with the square of the overload (queues, thrashing), up to
/// `max_latency_ms`. Slower fills mean more fills at once: the death spiral.
#[derive(Debug, Clone, Serialize)]
pub struct OriginModel {
    /// Concurrent fills served at base latency.
    pub capacity: f64,
    /// Latency of a fill within capacity.
    pub base_latency_ms: u64,
    /// Latency never grows past this.
    pub max_latency_ms: u64,
    /// Body size of every object.
    pub object_bytes: u64,
}

impl OriginModel {
    /// Latency of a fill that starts with `active` fills in progress (itself included).
    pub fn latency_ms(&self, active: f64) -> u64 {
        let load = active / self.capacity.max(1.0);
        let factor = 1.0 + load * load;
        ((self.base_latency_ms as f64 * factor) as u64).min(self.max_latency_ms)
    }
}

/// Everything a run depends on (with the seed, the whole run).
#[derive(Debug, Clone, Serialize)]
pub struct SimConfig {
    /// Seed of every random draw.
    pub seed: u64,
    /// Regions, each with a shield in the regional set-ups.
    pub regions: usize,
    /// PoPs per region.
    pub pops_per_region: usize,
    /// Edge nodes per PoP.
    pub nodes_per_pop: usize,
    /// Virtual seconds per set-up.
    pub duration_s: u64,
    /// Virtual milliseconds per tick.
    pub tick_ms: u64,
    /// Background requests per second over the fleet.
    pub background_rps: f64,
    /// Distinct background keys.
    pub keys: usize,
    /// Zipf exponent of their popularity.
    pub zipf_exponent: f64,
    /// The most popular keys simulated per node exactly; the rest (the tail) sampled.
    pub hot_keys: usize,
    /// One simulated tail request stands for this many. Above 1 its fill weighs as
    /// many at the origin but holds one slot, and they arrive at one node at once:
    /// where the fill limits bind (`--tail-sample 1` in the death-spiral table) it
    /// must be 1, every request on its own.
    pub tail_sample: u32,
    /// Object TTL (`max-age`).
    pub ttl_s: u64,
    /// Each stored entry's TTL is scaled by a factor in `[1 - jitter, 1 + jitter]`.
    pub ttl_jitter: f64,
    /// When the viral key appears in region 0.
    pub viral_at_s: u64,
    /// Delay before it reaches each next region.
    pub spread_every_s: u64,
    /// Viral requests per second per region once it has arrived.
    pub viral_rps: f64,
    /// The origin.
    pub origin: OriginModel,
    /// A client gives up on a request after this long…
    pub client_timeout_ms: u64,
    /// …and retries after this times a jitter factor in [1, 2)…
    pub retry_backoff_ms: u64,
    /// …at most this many times.
    pub max_retries: u8,
    /// Each edge node's `[flight]` section.
    pub node_flight: FlightConfig,
    /// Each shield's `[flight]` section.
    pub shield_flight: FlightConfig,
    /// Every tier's `[prefetch]` section.
    pub prefetch: PrefetchConfig,
    /// From a command sent to the nodes acting on it.
    pub command_delay_ms: u64,
    /// One access event reaches pulse per this many requests.
    pub event_scale: f64,
    /// Replay this log instead of the synthetic load (background and viral rates are
    /// then ignored).
    #[serde(skip)]
    pub replay: Option<std::sync::Arc<super::replay::LogLoad>>,
    /// Write one CSV line per tick here: the origin's fills and latency, and the edge
    /// nodes' origin limits, user fills and queues summed over the fleet.
    #[serde(skip)]
    pub trace: Option<std::path::PathBuf>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 42,
            regions: 3,
            pops_per_region: 10,
            nodes_per_pop: 8,
            duration_s: 120,
            tick_ms: 50,
            background_rps: 100_000.0,
            keys: 20_000,
            zipf_exponent: 1.3,
            hot_keys: 1_000,
            tail_sample: 20,
            ttl_s: 300,
            ttl_jitter: 0.1,
            viral_at_s: 60,
            spread_every_s: 4,
            viral_rps: 50_000.0,
            origin: OriginModel {
                capacity: 1_000.0,
                base_latency_ms: 50,
                max_latency_ms: 30_000,
                object_bytes: 64 * 1024,
            },
            client_timeout_ms: 2_000,
            retry_backoff_ms: 500,
            max_retries: 3,
            node_flight: FlightConfig::default(),
            shield_flight: FlightConfig {
                max_fills: 1_024,
                reserved_for_user: 128,
                max_queued_fills: 8_192,
                ..FlightConfig::default()
            },
            prefetch: PrefetchConfig::default(),
            command_delay_ms: 200,
            event_scale: 100.0,
            replay: None,
            trace: None,
        }
    }
}

impl SimConfig {
    /// The scale: 300 PoPs × 8 nodes, 1 M requests per second, 10 minutes.
    pub fn internet_scale() -> SimConfig {
        SimConfig {
            pops_per_region: 100,
            duration_s: 600,
            viral_at_s: 300,
            background_rps: 800_000.0,
            viral_rps: 66_667.0,
            origin: OriginModel {
                capacity: 2_000.0,
                ..SimConfig::default().origin
            },
            event_scale: 1_000.0,
            tail_sample: 200,
            ..SimConfig::default()
        }
    }

    /// Seed 002's fleet: the default load, but edge nodes without a bound on their
    /// origin fills (no `Overloaded` answer to push clients back, no adaptive origin
    /// limit), so a stampede is
    /// limited only by what the four set-ups do about it.
    pub fn seed_002() -> SimConfig {
        let unbounded = FlightConfig {
            max_fills: 100_000,
            reserved_for_user: 0,
            max_queued_fills: 100_000,
            adaptive_origin_limit: false,
            ..FlightConfig::default()
        };
        SimConfig {
            node_flight: unbounded.clone(),
            shield_flight: unbounded,
            ..SimConfig::default()
        }
    }

    /// Checks the settings; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("regions", self.regions as f64),
            ("pops_per_region", self.pops_per_region as f64),
            ("nodes_per_pop", self.nodes_per_pop as f64),
            ("duration_s", self.duration_s as f64),
            ("tick_ms", self.tick_ms as f64),
            ("keys", self.keys as f64),
            ("ttl_s", self.ttl_s as f64),
            ("origin.capacity", self.origin.capacity),
            ("event_scale", self.event_scale),
        ];
        if let Some((field, _)) = positive.iter().find(|(_, v)| v.is_nan() || *v <= 0.0) {
            return Err(format!("{field}: must be positive"));
        }
        if self.tick_ms > 1_000 || 1_000 % self.tick_ms != 0 {
            return Err("tick_ms: must divide 1000".into());
        }
        if !(0.0..1.0).contains(&self.ttl_jitter) {
            return Err("ttl_jitter: must be in [0, 1)".into());
        }
        if self.viral_at_s < 2 || self.viral_at_s >= self.duration_s {
            return Err("viral_at_s: at least 2 s, and before the end of the run".into());
        }
        if !(self.background_rps >= 0.0 && self.viral_rps >= 0.0) {
            return Err("background_rps, viral_rps: must not be negative".into());
        }
        if self.hot_keys < HOT_RANKS {
            return Err(format!("hot_keys: at least {HOT_RANKS}"));
        }
        if !(self.prefetch.latency_tolerance > 1.0 && self.prefetch.latency_tolerance <= 100.0) {
            return Err("prefetch.latency_tolerance: must be in (1, 100]".into());
        }
        Ok(())
    }

    /// Edge nodes in the fleet.
    pub fn nodes(&self) -> usize {
        self.regions * self.nodes_per_region()
    }

    /// Edge nodes per region.
    pub fn nodes_per_region(&self) -> usize {
        self.pops_per_region * self.nodes_per_pop
    }

    /// The region of node `n` (nodes are numbered region by region).
    pub fn region_of(&self, n: usize) -> usize {
        n / self.nodes_per_region()
    }

    /// The TTL in ms.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_s * 1000
    }

    /// When the viral key reaches region `r`.
    pub fn viral_start_ms(&self, r: usize) -> u64 {
        (self.viral_at_s + self.spread_every_s * r as u64) * 1000
    }

    /// The path of background key `i`.
    pub fn key_path(&self, i: usize) -> String {
        format!("/assets/{i}.js")
    }
}
