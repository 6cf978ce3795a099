//! The traffic families: the default mix changed in one direction each, trained on or
//! held out ([`FAMILIES`], a data table).

use super::{TraceSpec, ViralReferrers};

/// A family of traffic: a way to set the generator, trained on or held out. Each
/// family is the default mix changed in one direction, so a model's score on a family
/// it never saw says how it copes with that kind of traffic.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// The name `pulse trace --family` and `pulse backtest --families` take.
    pub name: &'static str,
    /// What is different about it.
    pub about: &'static str,
    /// Whether `scripts/train-default-model` trains on it.
    pub train: bool,
    tweak: fn(&mut TraceSpec),
}

/// Every family, training ones first.
pub const FAMILIES: [Family; 18] = [
    Family {
        name: "mixed-4",
        about: "the default mix on 4 regions",
        train: true,
        tweak: |s| s.regions = 4,
    },
    Family {
        name: "mixed-8",
        about: "the default mix on 8 regions",
        train: true,
        tweak: |s| s.regions = 8,
    },
    Family {
        name: "mixed-5-quiet",
        about: "5 regions, 100 events/s, spread 1-6 s",
        train: true,
        tweak: |s| {
            s.regions = 5;
            s.background_rps = 100.0;
            s.spread_ms = (1_000, 6_000);
        },
    },
    Family {
        name: "fleet-3",
        about: "the default mix on 3 regions",
        train: false,
        tweak: |s| s.regions = 3,
    },
    Family {
        name: "fleet-6",
        about: "the default mix on 6 regions",
        train: false,
        tweak: |s| s.regions = 6,
    },
    Family {
        name: "fleet-12",
        about: "the default mix on 12 regions",
        train: false,
        tweak: |s| s.regions = 12,
    },
    Family {
        name: "referrerless",
        about: "virals with no referrer at all",
        train: false,
        tweak: |s| s.viral_referrers = ViralReferrers::None,
    },
    Family {
        name: "newsletter",
        about: "virals from one newsletter's (non-social) link",
        train: false,
        tweak: |s| s.viral_referrers = ViralReferrers::Newsletter,
    },
    Family {
        name: "slow-ramp",
        about: "virals take 8 s to peak in each region",
        train: false,
        tweak: |s| s.ramp_ms = 8_000,
    },
    Family {
        name: "fast-spread",
        about: "virals reach the next region every 0.3-1 s",
        train: false,
        tweak: |s| s.spread_ms = (300, 1_000),
    },
    Family {
        name: "slow-spread",
        about: "virals reach the next region every 6-12 s",
        train: false,
        tweak: |s| s.spread_ms = (6_000, 12_000),
    },
    Family {
        name: "partial-spread",
        about: "8 regions in 2 audiences of their own taste; virals reach their audience only",
        train: false,
        tweak: |s| {
            s.regions = 8;
            s.audiences = 2;
        },
    },
    Family {
        name: "scattered-spread",
        about: "virals reach 2 to 4 of 8 regions drawn at random, no audience",
        train: false,
        tweak: |s| {
            s.regions = 8;
            s.spread_share = 0.5;
        },
    },
    Family {
        name: "flash-crowds",
        about: "12 one-region crowds (many nodes, local news referrers, 20 s) beside 6 virals",
        train: false,
        tweak: |s| {
            s.virals = 6;
            s.noise = 12;
            s.flash_crowds = 12;
        },
    },
    Family {
        name: "hammers",
        about: "12 single-node hammers (30-150 requests/s, 10-30 s) beside 6 virals",
        train: false,
        tweak: |s| {
            s.virals = 6;
            s.noise = 12;
            s.hammers = 12;
        },
    },
    Family {
        name: "crawlers",
        about: "6 crawlers walking pages from one node, and crons at :17",
        train: false,
        tweak: |s| {
            s.crawlers = 6;
            s.crons = 8;
            s.cron_second = Some(17);
        },
    },
    Family {
        name: "heavy-load",
        about: "one tenant at 2 400 events/s (and two small ones)",
        train: false,
        tweak: |s| {
            s.background_rps = 2_400.0;
            s.tenant_skew = 3.0;
            s.duration_ms = 300_000;
            s.virals = 8;
            s.noise = 16;
        },
    },
    Family {
        name: "many-tenants",
        about: "12 tenants of very different sizes, a load cycle of ±60 %",
        train: false,
        tweak: |s| {
            s.tenants = 12;
            s.tenant_skew = 1.2;
            s.diurnal = 0.6;
        },
    },
];

impl Family {
    /// The family by name.
    pub fn named(name: &str) -> Option<&'static Family> {
        FAMILIES.iter().find(|f| f.name == name)
    }

    /// The family's generator settings for `seed`. The start time moves with the seed
    /// (hour of the week and minute of the hour), so no calendar feature can tell one
    /// family or split from another.
    pub fn spec(&self, seed: u64) -> TraceSpec {
        const WEEK_START_MS: u64 = 1_764_547_200_000; // Monday 2025-12-01 00:00 UTC
        let mut spec = TraceSpec {
            seed,
            start_ms: WEEK_START_MS
                + (seed.wrapping_mul(37) % 168) * 3_600_000
                + (seed.wrapping_mul(13) % 60) * 60_000,
            ..TraceSpec::default()
        };
        (self.tweak)(&mut spec);
        // One family, one stream: the same seed in two families gives other traces.
        spec.seed = seed ^ fnv(self.name);
        spec
    }
}

fn fnv(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_valid_and_named_once() {
        for family in &FAMILIES {
            family
                .spec(1)
                .validate()
                .unwrap_or_else(|e| panic!("{}: {e}", family.name));
            assert_eq!(Family::named(family.name).unwrap().name, family.name);
        }
        let names: std::collections::HashSet<_> = FAMILIES.iter().map(|f| f.name).collect();
        assert_eq!(names.len(), FAMILIES.len());
        assert_ne!(
            Family::named("fleet-3").unwrap().spec(1).start_ms,
            Family::named("fleet-3").unwrap().spec(2).start_ms
        );
    }
}
