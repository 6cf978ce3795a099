//! What the generator is asked for: [`TraceSpec`], every setting with its default
//! (a ten-minute trace) and its check.

use serde::{Deserialize, Serialize};

/// What to generate. Every field has a default that makes a ten-minute trace.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TraceSpec {
    /// Seed of the random stream: the same spec and seed give the same trace.
    pub seed: u64,
    /// First event time, ms since the epoch.
    pub start_ms: u64,
    /// Length of the trace.
    pub duration_ms: u64,
    /// Number of tenants.
    pub tenants: usize,
    /// Distinct background keys per tenant.
    pub keys_per_tenant: usize,
    /// Number of regions.
    pub regions: usize,
    /// Edge nodes per region.
    pub nodes_per_region: usize,
    /// Background requests per second over the whole fleet.
    pub background_rps: f64,
    /// Zipf exponent of key popularity.
    pub zipf_exponent: f64,
    /// Viral events to inject.
    pub virals: usize,
    /// Cron-like bursts to inject.
    pub crons: usize,
    /// Noise bursts to inject.
    pub noise: usize,
    /// Seconds of origin fill at a node (misses within it collapse).
    pub fill_ms: u64,
    /// How long a node keeps a filled key.
    pub node_ttl_ms: u64,
    /// Where viral events' visitors come from.
    pub viral_referrers: ViralReferrers,
    /// Least and most time between a viral reaching one region and the next, ms.
    pub spread_ms: (u64, u64),
    /// How long a viral takes to reach its peak rate in a region, ms.
    pub ramp_ms: u64,
    /// Share of the fleet a viral reaches (at least two regions), in regions drawn at
    /// random; with several audiences, a viral reaches its own audience instead.
    pub spread_share: f64,
    /// Audiences the fleet's regions split into (consecutive regions, as a language
    /// or a continent would group them). Each has its own taste (which background
    /// keys are popular), and a viral spreads through every region of the audience it
    /// starts in and to no other. 1: one audience, the whole fleet.
    pub audiences: usize,
    /// One-region flash crowds to inject: many nodes, referred by the region's local
    /// news site, never spread.
    pub flash_crowds: usize,
    /// Single-node hammers to inject: one node asks for one key, fast, for seconds.
    pub hammers: usize,
    /// Crawlers to inject: one node walks many keys once each, a minute long.
    pub crawlers: usize,
    /// Crons fire at this second of their minute; at :00 without it.
    pub cron_second: Option<u64>,
    /// Amplitude of the background's load cycle over the trace (0: flat, 0.8: the rate
    /// swings ±80 %).
    pub diurnal: f64,
    /// Tenant sizes: tenant `i` gets a share ∝ 1 / (i + 1)^skew of the background (0:
    /// all the same).
    pub tenant_skew: f64,
}

/// Where a viral event's visitors come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ViralReferrers {
    /// 75 % of virals come with a social or news referrer spike.
    Social,
    /// No referrer at all (apps, copied links).
    None,
    /// A newsletter's link: one non-social domain.
    Newsletter,
}

impl Default for TraceSpec {
    fn default() -> Self {
        TraceSpec {
            seed: 7,
            start_ms: 1_764_460_740_000, // 2025-11-30 00:59:00 UTC: a top of the hour inside.
            duration_ms: 600_000,
            tenants: 3,
            keys_per_tenant: 5_000,
            regions: 6,
            nodes_per_region: 4,
            background_rps: 300.0,
            zipf_exponent: 1.1,
            virals: 12,
            crons: 6,
            noise: 36,
            fill_ms: 50,
            node_ttl_ms: 60_000,
            viral_referrers: ViralReferrers::Social,
            spread_ms: (2_000, 4_000),
            ramp_ms: 1_000,
            spread_share: 1.0,
            audiences: 1,
            flash_crowds: 3,
            hammers: 0,
            crawlers: 0,
            cron_second: None,
            diurnal: 0.0,
            tenant_skew: 0.0,
        }
    }
}

impl TraceSpec {
    /// Checks the settings; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("duration_ms", self.duration_ms as f64),
            ("tenants", self.tenants as f64),
            ("keys_per_tenant", self.keys_per_tenant as f64),
            ("regions", self.regions as f64),
            ("nodes_per_region", self.nodes_per_region as f64),
            ("background_rps", self.background_rps),
            ("zipf_exponent", self.zipf_exponent),
        ];
        if let Some((field, _)) = positive.iter().find(|(_, v)| !(*v > 0.0 && v.is_finite())) {
            return Err(format!("{field}: must be positive"));
        }
        if !(self.spread_share > 0.0 && self.spread_share <= 1.0) {
            return Err("spread_share: must be in (0, 1]".into());
        }
        if self.spread_ms.0 >= self.spread_ms.1 {
            return Err("spread_ms: the least must be below the most".into());
        }
        if self.ramp_ms == 0 {
            return Err("ramp_ms: must be positive".into());
        }
        if !(0.0..1.0).contains(&self.diurnal) {
            return Err("diurnal: must be in [0, 1)".into());
        }
        if !(self.tenant_skew >= 0.0 && self.tenant_skew.is_finite()) {
            return Err("tenant_skew: must be 0 or more".into());
        }
        if self.cron_second.is_some_and(|s| s >= 55) {
            return Err("cron_second: must be below 55".into());
        }
        if self.regions < 2 {
            return Err("regions: at least 2 (a viral spreads)".into());
        }
        if self.audiences == 0 || self.regions < 2 * self.audiences {
            return Err("audiences: at least 1, and at least 2 regions each".into());
        }
        if self.regions > 64 {
            return Err("regions: at most 64".into());
        }
        if self.duration_ms < 60_000 {
            return Err("duration_ms: at least 60000 (bursts need room)".into());
        }
        Ok(())
    }
}
