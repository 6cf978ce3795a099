//! The feature vector pulse computes for one tenant's key at decision time. Pulse
//! extracts it from its sketches; the scoring model turns it into a confidence.

use serde::{Deserialize, Serialize};

macro_rules! features {
    ($( $(#[$doc:meta])* $name:ident ),+ $(,)?) => {
        /// The features of one key at one instant. Raw values: the model applies its
        /// own transforms (see [`crate::ScoringModel`]).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
        pub struct Features {
            $( $(#[$doc])* pub $name: f64, )+
        }

        /// Feature names in model order; the model file lists the same names.
        pub const FEATURE_NAMES: [&str; FEATURE_COUNT] = [$(stringify!($name)),+];

        impl Features {
            /// The values in [`FEATURE_NAMES`] order.
            pub fn values(&self) -> [f64; FEATURE_COUNT] {
                [$(self.$name),+]
            }

            /// Builds a vector from values in [`FEATURE_NAMES`] order.
            pub fn from_values(values: [f64; FEATURE_COUNT]) -> Self {
                let [$($name),+] = values;
                Features { $($name),+ }
            }
        }
    };
}

/// How many features the model reads.
pub const FEATURE_COUNT: usize = 18;

features! {
    /// Requests per second for the key over the last 200 ms, all outcomes.
    velocity_200ms,
    /// Requests per second over the last 1 s.
    velocity_1s,
    /// Requests per second over the last 10 s.
    velocity_10s,
    /// `ln((1 + v200ms) / (1 + v10s))`: positive while demand accelerates.
    acceleration,
    /// Share of the last second's requests that found no fresh copy (miss, collapsed, stale).
    miss_share_1s,
    /// Distinct regions that reported misses in the last 200 ms.
    miss_regions_200ms,
    /// Regions of the fleet that have not requested the key in the last 60 s: the ones a
    /// pre-warm would help.
    unseen_regions,
    /// Regions whose first request came in the last 10 s (a second or more after pulse
    /// began tracking the key) and that have asked at least 5 times since: the key is
    /// spreading.
    new_regions_10s,
    /// 1 at minute :00 of the hour, falling linearly to 0 at :30 (top-of-hour jobs).
    top_of_hour,
    /// Hour of day on the unit circle (sine), UTC.
    hour_sin,
    /// Hour of day on the unit circle (cosine), UTC.
    hour_cos,
    /// Day of week on the unit circle (sine).
    weekday_sin,
    /// Day of week on the unit circle (cosine).
    weekday_cos,
    /// How many times this key burst before at the same minute of the hour (cron-like).
    phase_bursts_before,
    /// Share of the last 10 s of requests from the key's single most common referrer domain.
    referrer_top_share,
    /// Share of the last 10 s of requests from social or news referrer domains.
    referrer_social_share,
    /// `referrer_top_share` minus that domain's share over the key's last 60 s (its baseline).
    referrer_lift,
    /// The tenant's burstiness at this hour of the week: an EWMA of the bursts it had then.
    tenant_burstiness,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values_share_one_order() {
        let values: [f64; FEATURE_COUNT] = std::array::from_fn(|i| i as f64);
        let features = Features::from_values(values);
        assert_eq!(features.values(), values);
        assert_eq!(features.acceleration, 3.0);
        assert_eq!(FEATURE_NAMES[3], "acceleration");
        assert_eq!(FEATURE_NAMES[FEATURE_COUNT - 1], "tenant_burstiness");
    }
}
