//! The reference scenario in the test suite: the same harness as the `demo` binary, against
//! the broker under test, with a smaller load and bounds that hold on a noisy shared
//! machine. Pre-warming must keep the origin near its baseline and the hot keys in
//! cache; no collapsing must be clearly worse on both.

use std::time::Duration;

use tests::TestKafka;
use tests::scenario::{ScenarioConfig, ScenarioKafka, Setup, run_setup, table};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prewarm_keeps_the_origin_calm_and_no_collapsing_does_not() {
    let kafka = TestKafka::start();
    let scenario_kafka = ScenarioKafka {
        brokers: kafka.bootstrap_servers().to_owned(),
        events_topic: kafka.unique_topic("scenario-events"),
        prewarm_topic: kafka.unique_topic("scenario-prewarm"),
    };
    kafka.create_topic(&scenario_kafka.events_topic, 2).await;
    kafka.create_topic(&scenario_kafka.prewarm_topic, 1).await;

    let config = ScenarioConfig {
        duration: Duration::from_secs(24),
        viral_at: Duration::from_secs(10),
        spread_every: Duration::from_secs(4),
        background_rps: 80.0,
        viral_rps: 120.0,
        keys: 200,
        ..ScenarioConfig::default()
    };
    let mut reports = Vec::new();
    for setup in [Setup::Prewarm, Setup::NoCollapsing] {
        let report = run_setup(setup, &config, Some(&scenario_kafka), None, |_, _| {})
            .await
            .expect("running the scenario");
        reports.push(report);
    }
    eprintln!("{}", table(&reports));
    let (prewarm, none) = (&reports[0], &reports[1]);

    assert_eq!(prewarm.errors, 0, "{prewarm:?}");
    assert!(
        prewarm.prewarm_useful.unwrap_or(0) >= 1,
        "a pre-warm command must have reached a region before its first request: {prewarm:?}"
    );
    assert!(
        prewarm.peak_over_baseline() <= 3.0,
        "origin peak with pre-warm: {prewarm:?}"
    );
    assert!(
        prewarm.hot_hit_ratio >= 0.99,
        "hot-key hit ratio with pre-warm: {prewarm:?}"
    );
    assert!(
        none.peak_over_baseline() > prewarm.peak_over_baseline(),
        "no collapsing should load the origin more: {none:?} vs {prewarm:?}"
    );
    assert!(
        none.viral_hit_ratio < prewarm.viral_hit_ratio,
        "no collapsing should miss more on the viral key: {none:?} vs {prewarm:?}"
    );
}
