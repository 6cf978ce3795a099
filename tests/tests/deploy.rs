//! The operator's files under each service's `deploy/` agree with each other: every
//! query of a dashboard panel is a series its rules record (or an expression they use),
//! and every alert carries a one-line runbook. (`scripts/test-prometheus` loads them in
//! a real Prometheus; this catches a dashboard that drifted from its rules without one.)

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_owned()
}

/// Each dashboard and the rule file its panels query.
const DASHBOARDS: [(&str, &str); 3] = [
    (
        "pulse/deploy/pulse.dashboard.json",
        "pulse/deploy/pulse.rules.yml",
    ),
    (
        "prefetcher/deploy/prefetcher.dashboard.json",
        "prefetcher/deploy/prefetcher.rules.yml",
    ),
    (
        "prefetcher/deploy/edge-agent.dashboard.json",
        "prefetcher/deploy/edge-agent.rules.yml",
    ),
];

/// Every panel query of `dashboard` (nested rows included).
fn panel_exprs(dashboard: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack: Vec<&serde_json::Value> = dashboard["panels"]
        .as_array()
        .map(|p| p.iter().collect())
        .unwrap_or_default();
    while let Some(panel) = stack.pop() {
        if let Some(inner) = panel["panels"].as_array() {
            stack.extend(inner);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                out.push(expr.to_owned());
            }
        }
    }
    out
}

/// The names after `record:` in a rule file.
fn recorded(rules: &str) -> Vec<&str> {
    rules
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("- record:")
                .or(l.trim().strip_prefix("record:"))
        })
        .map(str::trim)
        .collect()
}

/// A panel query is a recorded series, or appears in the rules as it is written.
fn unknown_queries(dashboard: &serde_json::Value, rules: &str) -> Vec<String> {
    let recorded = recorded(rules);
    panel_exprs(dashboard)
        .into_iter()
        .filter(|expr| !recorded.contains(&expr.trim()) && !rules.contains(expr.trim()))
        .collect()
}

#[test]
fn every_panel_queries_what_the_rules_record() {
    for (dashboard, rules) in DASHBOARDS {
        let text = std::fs::read_to_string(root().join(dashboard)).expect(dashboard);
        let json: serde_json::Value = serde_json::from_str(&text).expect(dashboard);
        let rules_text = std::fs::read_to_string(root().join(rules)).expect(rules);
        let exprs = panel_exprs(&json);
        assert!(!exprs.is_empty(), "{dashboard} has no panel queries");
        let unknown = unknown_queries(&json, &rules_text);
        assert!(
            unknown.is_empty(),
            "{dashboard}: panel queries that {rules} neither records nor uses: {unknown:?}"
        );
    }
}

/// The check itself: a query the rules do not know is caught.
#[test]
fn a_panel_the_rules_do_not_know_is_caught() {
    let rules = "groups:\n  - name: g\n    rules:\n      - record: job:x:rate5m\n        expr: sum(rate(x_total[5m]))\n";
    let known = serde_json::json!({"panels": [{"targets": [{"expr": "job:x:rate5m"}]},
        {"panels": [{"targets": [{"expr": "sum(rate(x_total[5m]))"}]}]}]});
    assert!(unknown_queries(&known, rules).is_empty());
    let drifted = serde_json::json!({"panels": [{"type": "row", "panels": [
        {"targets": [{"expr": "sum(rate(x_total[1m]))"}]}]}]});
    assert_eq!(unknown_queries(&drifted, rules), ["sum(rate(x_total[1m]))"]);
}

/// Every alert has a `runbook` annotation of one line.
#[test]
fn every_alert_has_a_one_line_runbook() {
    for (_, rules) in DASHBOARDS {
        let text = std::fs::read_to_string(root().join(rules)).expect(rules);
        let mut alerts = 0;
        for block in text.split("- alert:").skip(1) {
            alerts += 1;
            let name = block.lines().next().unwrap_or("").trim();
            let runbook = block
                .lines()
                .find_map(|l| l.trim().strip_prefix("runbook:"))
                .unwrap_or_else(|| panic!("{rules}: {name} has no runbook"));
            let runbook = runbook.trim().trim_matches('"');
            assert!(
                runbook.len() > 20 && !runbook.starts_with('|') && !runbook.starts_with('>'),
                "{rules}: {name}: the runbook is one line of advice, got {runbook:?}"
            );
        }
        assert!(alerts > 0, "{rules} has no alerts");
    }
}
