//! A tenant's origin hints (`[tenants.origin_hints]`): which successors named by its
//! origin's responses the node fills ahead, and how many. Off unless the section is
//! there.

use serde::{Deserialize, Serialize};

use super::{Result, invalid};

/// How far a tenant's origin may steer the node's pre-warm fills.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OriginHintsConfig {
    /// Hints followed per response; the rest are refused (and counted).
    pub max_per_response: usize,
    /// Hinted fills started per second for the tenant (a token bucket holding one
    /// second's worth); hints past it are refused.
    pub fills_per_s: f64,
}

impl Default for OriginHintsConfig {
    fn default() -> Self {
        OriginHintsConfig {
            max_per_response: 4,
            fills_per_s: 10.0,
        }
    }
}

/// Checks tenant `i`'s origin hints, naming the field at fault.
pub(crate) fn check_origin_hints(i: usize, hints: &OriginHintsConfig) -> Result<()> {
    if !(1..=64).contains(&hints.max_per_response) {
        return Err(invalid(
            format!("tenants[{i}].origin_hints.max_per_response"),
            format!("{} must be in [1, 64]", hints.max_per_response),
        ));
    }
    if !(hints.fills_per_s.is_finite() && hints.fills_per_s > 0.0 && hints.fills_per_s <= 10_000.0)
    {
        return Err(invalid(
            format!("tenants[{i}].origin_hints.fills_per_s"),
            format!("{} must be a number in (0, 10000]", hints.fills_per_s),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn origin_hints_are_read_per_tenant_and_bad_bounds_are_named() {
        let c: Config = toml::from_str(
            r#"
            [[tenants]]
            id = "video"
            hosts = ["*"]
            origin = "http://origin.example"
            [tenants.origin_hints]
            max_per_response = 2
            "#,
        )
        .unwrap();
        let hints = c.tenants[0].origin_hints.clone().unwrap();
        assert_eq!(hints.max_per_response, 2);
        assert_eq!(hints.fills_per_s, 10.0, "the default");
        c.validate().unwrap();
        for (hints, field) in [
            (
                OriginHintsConfig {
                    max_per_response: 0,
                    ..hints.clone()
                },
                "tenants[0].origin_hints.max_per_response",
            ),
            (
                OriginHintsConfig {
                    fills_per_s: f64::NAN,
                    ..hints.clone()
                },
                "tenants[0].origin_hints.fills_per_s",
            ),
        ] {
            let mut bad = c.clone();
            bad.tenants[0].origin_hints = Some(hints);
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }
}
