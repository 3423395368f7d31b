//! The operator's files (issue 57): every metric the alert rules and the Grafana dashboard
//! use is one keel exports, and every series a rule selects exists on a fresh instance
//! before anything happened (an alert never waits for its series to appear).
//! (`promtool check rules`/`test rules` and `systemd-analyze verify` run in `.ci/run`.)

use std::collections::{BTreeMap, BTreeSet};

use crate::helpers::*;

const RULES: &str = include_str!("../../deploy/prometheus/keel.rules.yml");
const DASHBOARD: &str = include_str!("../../deploy/grafana/keel.json");

/// Metric names of a /metrics text, and the label sets of each name's series.
fn exported(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut series: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = match line[name_end..].starts_with('{') {
            true => line[name_end + 1..line.find('}').unwrap_or(line.len())].to_owned(),
            false => String::new(),
        };
        series
            .entry(line[..name_end].to_owned())
            .or_default()
            .push(labels);
    }
    series
}

/// The `keel_...` metric names a text uses.
fn names_in(text: &str) -> BTreeSet<String> {
    let name = regex::Regex::new(r"\bkeel_[a-z0-9_]+").unwrap();
    name.find_iter(text).map(|m| m.as_str().to_owned()).collect()
}

#[actix_web::test]
async fn every_metric_of_the_rules_and_the_dashboard_is_exported_and_the_rules_from_start_up() {
    let (app, _provider) = crate::proxy::proxy_app().await;
    // Before anything happened: every series a rule selects is there.
    let series = exported(&app.metrics_text().await);
    let rules = names_in(RULES);
    assert!(rules.len() >= 15, "{rules:?}");
    let missing: Vec<&String> = rules.iter().filter(|n| !series.contains_key(*n)).collect();
    assert!(
        missing.is_empty(),
        "a rule's metric not exported at start-up: {missing:?}"
    );
    // Each selector of a rule (`name{label="v"}` or `label=~"a|b"`) has its series already,
    // but for the labels Prometheus adds (instance, job).
    let selector = regex::Regex::new(r#"(keel_[a-z0-9_]+)\{([^}]*)\}"#).unwrap();
    let matcher = regex::Regex::new(r#"(\w+)\s*(=~|=)\s*"([^"]*)""#).unwrap();
    let mut checked = 0;
    for found in selector.captures_iter(RULES) {
        let name = &found[1];
        for m in matcher.captures_iter(&found[2]) {
            if matches!(&m[1], "instance" | "job") {
                continue;
            }
            for value in m[3].split('|') {
                let wanted = format!("{}=\"{value}\"", &m[1]);
                assert!(
                    series[name].iter().any(|labels| labels.contains(&wanted)),
                    "no series {name}{{{wanted}}} at start-up"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 8, "{checked}");

    // The dashboard's metrics, once keel has answered and recorded a call (a vector's first
    // series is made by its first observation: a call's tokens, a request's time).
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    assert!(dashboard["panels"].as_array().unwrap().len() >= 18);
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let answered = crate::proxy::sdk_request(
        &app,
        &org,
        Some(&project),
        &crate::proxy::chat("gpt-4o-mini", "hi"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(answered.status(), reqwest::StatusCode::OK);
    assert!(
        eventually(|| async { app.metrics_text().await.contains("keel_proxy_tokens_total{") }).await,
        "the call's tokens are counted"
    );
    let series = exported(&app.metrics_text().await);
    let used = names_in(DASHBOARD);
    assert!(used.len() >= 30, "{used:?}");
    let missing: Vec<&String> = used.iter().filter(|n| !series.contains_key(*n)).collect();
    assert!(
        missing.is_empty(),
        "a dashboard's metric keel does not export: {missing:?}"
    );
}
