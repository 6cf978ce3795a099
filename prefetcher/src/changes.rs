//! What a reload changed, the node's and the edge agent's alike: which settings
//! differ between two configurations ([`differences`]), by the dotted names the config
//! file uses (`kafka.brokers`, `tenants`, `tls.cert_file`), reported as applied or as
//! needing a restart ([`Reloaded`]), logged and counted the same way.

use serde::Serialize;
use serde_json::Value;

use crate::config::ConfigError;
use crate::metrics::Metrics;

/// What a reload did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// The settings it changed, now in force for new requests (dotted names, as in
    /// the config file).
    pub applied: Vec<String>,
    /// The settings that differ from the running ones but need a restart: kept as
    /// they run.
    pub needs_restart: Vec<String>,
}

/// Logs what a reload put in force and what it kept for a restart.
pub(crate) fn log_reloaded(reloaded: &Reloaded) {
    for field in &reloaded.needs_restart {
        tracing::warn!(%field, "configuration reloaded, but this setting needs a restart: kept as it runs");
    }
    tracing::info!(applied = ?reloaded.applied, "configuration reloaded: new requests use it");
}

/// Counts a refused reload in `metrics` and logs it; returns `error`.
pub(crate) fn refused(metrics: &Metrics, error: ConfigError) -> ConfigError {
    metrics.config_reloads_refused.inc();
    tracing::warn!(%error, "configuration reload refused: the running configuration is kept");
    error
}

/// The dotted paths of the fields where `old` and `new` differ, sorted: a table's
/// fields one by one, a list or a value whole.
pub(crate) fn differences<T: Serialize>(old: &T, new: &T) -> Vec<String> {
    let (Ok(old), Ok(new)) = (serde_json::to_value(old), serde_json::to_value(new)) else {
        return vec!["(the whole configuration)".to_owned()];
    };
    let mut out = Vec::new();
    walk(&old, &new, "", &mut out);
    out
}

fn walk(old: &Value, new: &Value, path: &str, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().collect();
            keys.extend(b.keys().filter(|k| !a.contains_key(*k)));
            for key in keys {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                let missing = Value::Null;
                walk(
                    a.get(key).unwrap_or(&missing),
                    b.get(key).unwrap_or(&missing),
                    &child,
                    out,
                );
            }
        }
        (a, b) if a != b => out.push(path.to_owned()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Inner {
        a: u32,
        b: Option<String>,
    }

    #[derive(Serialize)]
    struct Outer {
        listen: String,
        inner: Inner,
        list: Vec<u32>,
        tls: Option<Inner>,
    }

    #[test]
    fn differing_fields_are_named_by_their_dotted_path() {
        let old = Outer {
            listen: "a".into(),
            inner: Inner { a: 1, b: None },
            list: vec![1, 2],
            tls: None,
        };
        let same = Outer {
            listen: "a".into(),
            inner: Inner { a: 1, b: None },
            list: vec![1, 2],
            tls: None,
        };
        assert!(differences(&old, &same).is_empty());
        let new = Outer {
            listen: "b".into(),
            inner: Inner {
                a: 1,
                b: Some("x".into()),
            },
            list: vec![1],
            tls: Some(Inner { a: 1, b: None }),
        };
        assert_eq!(
            differences(&old, &new),
            ["inner.b", "list", "listen", "tls"]
        );
    }
}
