//! The body of `POST /api/warm` and its checks: every refusal names the field it is
//! about (the API's error `message` starts with it).

use models::{CacheKey, RegionId, RegionTargets, TenantId};
use serde::Deserialize;
use utoipa::ToSchema;

use super::{MAX_DELAY_MS, MAX_KEYS, MAX_REGIONS};

/// `POST /api/warm`: what to warm, where, from when and how fast.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WarmRequest {
    /// The tenant whose origin serves the keys.
    pub tenant: String,
    /// The keys to warm (1 to 1000); or give `prefix`.
    #[serde(default)]
    pub keys: Option<Vec<String>>,
    /// Warm every key of the tenant the heat map knows (its hottest keys of the last
    /// 60 s, fleet-wide) that starts with this; or give `keys`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// `"all"` (default) or a list of region ids.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub regions: Option<serde_json::Value>,
    /// Send nothing before this instant, in milliseconds since the Unix epoch (default:
    /// now; at most 24 h ahead).
    #[serde(default)]
    pub not_before: Option<u64>,
    /// Keys sent per second (default, and at most: the tenant's warm budget,
    /// `--warm-rate`).
    #[serde(default)]
    pub pace: Option<f64>,
}

/// Why a request is refused: the API's error code, and a message that starts with the
/// field.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refusal {
    pub code: &'static str,
    pub message: String,
}

fn refuse(code: &'static str, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

/// What the keys are to be, before the heat map is asked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum KeySource {
    Keys(Vec<CacheKey>),
    Prefix(String),
}

/// A request that passed every check but the ones the heat map answers (the tenant
/// known, the prefix matching).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Checked {
    pub tenant: TenantId,
    pub keys: KeySource,
    pub regions: RegionTargets,
    pub not_before_ms: u64,
    pub pace: f64,
}

impl WarmRequest {
    /// Checks the request at `now_ms` against the tenant's warm budget `budget_per_s`.
    pub(crate) fn check(self, now_ms: u64, budget_per_s: f64) -> Result<Checked, Refusal> {
        let tenant = TenantId::new(&self.tenant)
            .map_err(|e| refuse("invalid_tenant", format!("tenant: {e}")))?;
        let keys = match (self.keys, self.prefix) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(refuse(
                    "bad_parameter",
                    "keys, prefix: give exactly one of them",
                ));
            }
            (Some(keys), None) => {
                if keys.is_empty() {
                    return Err(refuse("bad_parameter", "keys: the list is empty"));
                }
                if keys.len() > MAX_KEYS {
                    return Err(refuse(
                        "too_many_keys",
                        format!("keys: {} keys, at most {MAX_KEYS} a warm-up", keys.len()),
                    ));
                }
                let mut checked = Vec::with_capacity(keys.len());
                for (i, key) in keys.into_iter().enumerate() {
                    let key = CacheKey::new(key)
                        .map_err(|e| refuse("invalid_key", format!("keys[{i}]: {e}")))?;
                    if !checked.contains(&key) {
                        checked.push(key);
                    }
                }
                KeySource::Keys(checked)
            }
            (None, Some(prefix)) => {
                // A prefix is the start of a key: it obeys the keys' rules.
                CacheKey::new(prefix.as_str())
                    .map_err(|e| refuse("invalid_key", format!("prefix: {e}")))?;
                KeySource::Prefix(prefix)
            }
        };
        let regions = match self.regions {
            None => RegionTargets::All,
            Some(value) => regions(value)?,
        };
        let not_before_ms = match self.not_before {
            None => now_ms,
            Some(at) if at < now_ms => {
                return Err(refuse(
                    "in_the_past",
                    format!("not_before: {at} is in the past (now is {now_ms})"),
                ));
            }
            Some(at) if at > now_ms + MAX_DELAY_MS => {
                return Err(refuse(
                    "bad_parameter",
                    format!("not_before: {at} is more than 24 h ahead (now is {now_ms})"),
                ));
            }
            Some(at) => at,
        };
        let pace = self.pace.unwrap_or(budget_per_s);
        if !(pace > 0.0 && pace.is_finite()) {
            return Err(refuse(
                "bad_parameter",
                format!("pace: {pace} keys/s must be positive"),
            ));
        }
        if pace > budget_per_s {
            return Err(refuse(
                "over_budget",
                format!(
                    "pace: {pace} keys/s is over the tenant's warm budget of {budget_per_s} keys/s (--warm-rate)"
                ),
            ));
        }
        Ok(Checked {
            tenant,
            keys,
            regions,
            not_before_ms,
            pace,
        })
    }
}

/// A warm-up of `keys` at `pace` ends within the day it may wait: the desk's slots
/// are not held by a pace of one key a year.
pub(crate) fn check_duration(keys: usize, pace: f64) -> Result<(), Refusal> {
    if (keys as f64 - 1.0).max(0.0) / pace * 1000.0 > MAX_DELAY_MS as f64 {
        return Err(refuse(
            "bad_parameter",
            format!("pace: {keys} keys at {pace} keys/s would take more than 24 h"),
        ));
    }
    Ok(())
}

/// `"all"` or a non-empty list of region ids.
pub(crate) fn regions(value: serde_json::Value) -> Result<RegionTargets, Refusal> {
    let bad = |m: String| refuse("invalid_region", m);
    match value {
        serde_json::Value::String(word) if word == "all" => Ok(RegionTargets::All),
        serde_json::Value::Array(list) => {
            if list.is_empty() {
                return Err(bad(
                    "regions: an empty list targets nobody; use \"all\"".into()
                ));
            }
            if list.len() > MAX_REGIONS {
                return Err(bad(format!(
                    "regions: {} regions, at most {MAX_REGIONS}; use \"all\"",
                    list.len()
                )));
            }
            let mut regions = Vec::with_capacity(list.len());
            for (i, region) in list.into_iter().enumerate() {
                let name = region
                    .as_str()
                    .ok_or_else(|| bad(format!("regions[{i}]: expected a region id")))?;
                let region = RegionId::new(name).map_err(|e| bad(format!("regions[{i}]: {e}")))?;
                if !regions.contains(&region) {
                    regions.push(region);
                }
            }
            Ok(RegionTargets::Only(regions))
        }
        _ => Err(bad(
            "regions: expected \"all\" or a list of region ids".into()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_764_470_000_000;

    fn request(body: serde_json::Value) -> Result<Checked, Refusal> {
        serde_json::from_value::<WarmRequest>(body)
            .unwrap()
            .check(NOW, 10.0)
    }

    #[test]
    fn a_good_request_is_checked_with_its_defaults() {
        let checked = request(serde_json::json!({
            "tenant": "acme", "keys": ["/a", "/b", "/a"]
        }))
        .unwrap();
        assert_eq!(checked.tenant.as_str(), "acme");
        assert_eq!(
            checked.keys,
            KeySource::Keys(vec!["/a".parse().unwrap(), "/b".parse().unwrap()])
        );
        assert_eq!(
            (checked.regions, checked.not_before_ms, checked.pace),
            (RegionTargets::All, NOW, 10.0)
        );
        let checked = request(serde_json::json!({
            "tenant": "acme", "prefix": "/img/", "regions": ["eu-west"],
            "not_before": NOW + 60_000, "pace": 2.5
        }))
        .unwrap();
        assert_eq!(checked.keys, KeySource::Prefix("/img/".into()));
        assert!(checked.regions.includes("eu-west") && !checked.regions.includes("us-east"));
        assert_eq!((checked.not_before_ms, checked.pace), (NOW + 60_000, 2.5));
    }

    /// Each bad input is refused with a message that starts with its field.
    #[test]
    fn every_refusal_names_its_field() {
        let many: Vec<String> = (0..=MAX_KEYS).map(|i| format!("/k{i}")).collect();
        let cases = [
            (
                serde_json::json!({"tenant": "a b", "keys": ["/a"]}),
                "tenant:",
            ),
            (serde_json::json!({"tenant": "acme"}), "keys, prefix:"),
            (
                serde_json::json!({"tenant": "acme", "keys": ["/a"], "prefix": "/"}),
                "keys, prefix:",
            ),
            (serde_json::json!({"tenant": "acme", "keys": []}), "keys:"),
            (serde_json::json!({"tenant": "acme", "keys": many}), "keys:"),
            (
                serde_json::json!({"tenant": "acme", "keys": ["/a", "/../etc"]}),
                "keys[1]:",
            ),
            (
                serde_json::json!({"tenant": "acme", "prefix": "/a/../b"}),
                "prefix:",
            ),
            (
                serde_json::json!({"tenant": "acme", "keys": ["/a"], "regions": []}),
                "regions:",
            ),
            (
                serde_json::json!({"tenant": "acme", "keys": ["/a"], "regions": ["eu", "b c"]}),
                "regions[1]:",
            ),
            (
                serde_json::json!({"tenant": "acme", "keys": ["/a"], "regions": "most"}),
                "regions:",
            ),
            (
                serde_json::json!({"tenant": "acme", "keys": ["/a"], "regions": vec!["eu"; MAX_REGIONS + 1]}),
                "regions:",
            ),
            (
                serde_json::json!({"tenant": "acme", "keys": ["/a"], "not_before": NOW - 1}),
                "not_before:",
            ),
            (
                serde_json::json!({"tenant": "acme", "keys": ["/a"], "not_before": NOW + MAX_DELAY_MS + 1}),
                "not_before:",
            ),
            (
                serde_json::json!({"tenant": "acme", "keys": ["/a"], "pace": 0.0}),
                "pace:",
            ),
            (
                serde_json::json!({"tenant": "acme", "keys": ["/a"], "pace": 10.5}),
                "pace:",
            ),
        ];
        for (body, field) in cases {
            let refusal = request(body.clone()).unwrap_err();
            assert!(refusal.message.starts_with(field), "{body}: {refusal:?}");
        }
        let slow = check_duration(1000, 0.01).unwrap_err();
        assert!(slow.message.starts_with("pace:"), "{slow:?}");
        assert!(check_duration(1000, 0.02).is_ok() && check_duration(1, 1e-9).is_ok());
        let typo = serde_json::json!({"tenant": "acme", "keys": ["/a"], "not_after": 1});
        let error = serde_json::from_value::<WarmRequest>(typo).unwrap_err();
        assert!(error.to_string().contains("not_after"), "{error}");
    }
}
