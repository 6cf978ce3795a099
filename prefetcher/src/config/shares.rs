//! A tenant's share of the origin path (`weight`, `peak_fills`) and its routes'
//! priority classes (`[[tenants.routes]]`), read with the rest of `[[tenants]]`.

use serde::{Deserialize, Serialize};

use super::{Result, TenantConfig, invalid};

/// The priority class of a user fill, from its tenant's routes: under pressure the
/// lowest class is refused first. Pre-warm fills are below every class.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum TrafficClass {
    /// Work that may wait: refused first.
    Background,
    /// Static assets (the class of a path no route names).
    #[default]
    Static,
    /// Stateful API calls.
    Api,
    /// Health checks: refused last.
    Critical,
}

impl TrafficClass {
    /// Every class, lowest first.
    pub const ALL: [TrafficClass; 4] = [
        TrafficClass::Background,
        TrafficClass::Static,
        TrafficClass::Api,
        TrafficClass::Critical,
    ];

    /// The class's name in the configuration and in metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            TrafficClass::Background => "background",
            TrafficClass::Static => "static",
            TrafficClass::Api => "api",
            TrafficClass::Critical => "critical",
        }
    }
}

/// One route of a tenant: requests whose path starts with `prefix` (and whose
/// method is one of `methods`, when given) are of `class`; the longest prefix wins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Path prefix, starting with `/`.
    pub prefix: String,
    /// Upper-case methods this route is for; empty for every method.
    #[serde(default)]
    pub methods: Vec<String>,
    /// The class of the route's requests.
    pub class: TrafficClass,
}

/// Checks tenant `i`'s share and routes, naming the field at fault.
pub(crate) fn check_tenant_share(i: usize, t: &TenantConfig) -> Result<()> {
    if !(t.weight.is_finite() && t.weight > 0.0 && t.weight <= 1_000_000.0) {
        return Err(invalid(
            format!("tenants[{i}].weight"),
            format!("{} must be a number in (0, 1000000]", t.weight),
        ));
    }
    if t.peak_fills == Some(0) {
        return Err(invalid(
            format!("tenants[{i}].peak_fills"),
            "must be positive (leave it out for no peak below flight.max_fills)",
        ));
    }
    for (j, route) in t.routes.iter().enumerate() {
        if !route.prefix.starts_with('/') {
            return Err(invalid(
                format!("tenants[{i}].routes[{j}].prefix"),
                format!("{:?} must start with '/'", route.prefix),
            ));
        }
        for (k, method) in route.methods.iter().enumerate() {
            if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(invalid(
                    format!("tenants[{i}].routes[{j}].methods[{k}]"),
                    format!("{method:?} is not an upper-case method name"),
                ));
            }
        }
    }
    Ok(())
}

/// The class of a request for `method` and `path` by `routes`: the longest matching
/// prefix's, else [`TrafficClass::Static`]. A `HEAD` matches a route for `GET`.
pub fn class_of(routes: &[RouteConfig], method: &str, path: &str) -> TrafficClass {
    routes
        .iter()
        .filter(|r| path.starts_with(&r.prefix))
        .filter(|r| {
            r.methods.is_empty()
                || r.methods
                    .iter()
                    .any(|m| m == method || (method == "HEAD" && m == "GET"))
        })
        .max_by_key(|r| r.prefix.len())
        .map_or(TrafficClass::Static, |r| r.class)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(prefix: &str, methods: &[&str], class: TrafficClass) -> RouteConfig {
        RouteConfig {
            prefix: prefix.into(),
            methods: methods.iter().map(|m| m.to_string()).collect(),
            class,
        }
    }

    #[test]
    fn the_longest_matching_route_gives_the_class() {
        let routes = [
            route("/api/", &[], TrafficClass::Api),
            route("/api/health", &["GET"], TrafficClass::Critical),
            route("/batch/", &["POST"], TrafficClass::Background),
        ];
        assert_eq!(class_of(&routes, "GET", "/api/x"), TrafficClass::Api);
        assert_eq!(
            class_of(&routes, "HEAD", "/api/health"),
            TrafficClass::Critical
        );
        assert_eq!(class_of(&routes, "POST", "/api/health"), TrafficClass::Api);
        assert_eq!(class_of(&routes, "GET", "/batch/1"), TrafficClass::Static);
        assert_eq!(class_of(&routes, "GET", "/a.js"), TrafficClass::Static);
        assert!(TrafficClass::Background < TrafficClass::Static);
        assert!(TrafficClass::Api < TrafficClass::Critical);
    }

    fn config(tenant_extra: &str) -> std::result::Result<super::super::Config, String> {
        let text = format!(
            "[[tenants]]\nid = \"a\"\nhosts = [\"*\"]\norigin = \"http://127.0.0.1:1\"\n{tenant_extra}"
        );
        let config: super::super::Config = toml::from_str(&text).map_err(|e| e.to_string())?;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    #[test]
    fn bad_weights_and_routes_are_refused_naming_the_field() {
        let good = config(
            "weight = 2.5\npeak_fills = 10\n[[tenants.routes]]\nprefix = \"/api/\"\n\
             methods = [\"GET\"]\nclass = \"api\"\n",
        )
        .unwrap();
        assert_eq!(good.tenants[0].weight, 2.5);
        assert_eq!(good.tenants[0].routes[0].class, TrafficClass::Api);
        for (extra, field) in [
            ("weight = 0.0\n", "tenants[0].weight"),
            ("weight = -1.0\n", "tenants[0].weight"),
            ("weight = nan\n", "tenants[0].weight"),
            ("peak_fills = 0\n", "tenants[0].peak_fills"),
            (
                "[[tenants.routes]]\nprefix = \"api\"\nclass = \"api\"\n",
                "tenants[0].routes[0].prefix",
            ),
            (
                "[[tenants.routes]]\nprefix = \"/\"\nmethods = [\"get\"]\nclass = \"api\"\n",
                "tenants[0].routes[0].methods[0]",
            ),
            (
                "[[tenants.routes]]\nprefix = \"/\"\nclass = \"urgent\"\n",
                "unknown variant `urgent`",
            ),
        ] {
            let error = config(extra).unwrap_err();
            assert!(error.contains(field), "{extra}: {error}");
        }
    }
}
