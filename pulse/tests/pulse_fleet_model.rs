//! One model for the fleet, on the real broker: every `pulse::start` of a group follows
//! the group's compacted model topic (`{topic}.{group}.model`), so a model published
//! there is put in use by every instance, and an instance started later begins with
//! it. Another group on the same events topic has its own model topic and is not
//! touched.
//!
//! Needs a broker: `KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092`.

use std::time::{Duration, Instant};

use pulse::testing::TestKafka;
use pulse::testing::get_json as get;
use pulse::{KafkaClients, ModelPublisher, PulseConfig, PulseHandle, default_model};

/// The model `pulse`'s API and health report, waited for up to 30 s.
async fn model_becomes(pulse: &PulseHandle, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let router = pulse.router();
        let (_, card) = get(&router, "/api/model?scope=local").await;
        let (_, health) = get(&router, "/healthz").await;
        if card["name"] == name && health["model"] == name {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "model still {} (health: {}), not {name}",
            card["name"],
            health["model"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_on_the_fleet_topic_is_used_by_every_instance() {
    let kafka = TestKafka::start();
    assert!(kafka.is_real(), "this test needs KAFKA_BOOTSTRAP_SERVERS");
    let topic = kafka.unique_topic("pulse-fleet-model");
    let prewarm_topic = kafka.unique_topic("pulse-fleet-model-commands");
    kafka.create_topic(&topic, 2).await;
    kafka.create_topic(&prewarm_topic, 1).await;
    let config = PulseConfig {
        brokers: Some(kafka.bootstrap_servers().to_owned()),
        topic: topic.clone(),
        group: format!("{topic}-pulse"),
        prewarm_topic: prewarm_topic.clone(),
        retrain_interval_secs: 0,
        listen: "127.0.0.1:0".parse().unwrap(),
        ..PulseConfig::default()
    };
    let shipped = default_model().name;
    let a = pulse::start(config.clone())
        .await
        .expect("starting pulse a");
    model_becomes(&a, &shipped).await;
    let other_group = pulse::start(PulseConfig {
        group: format!("{topic}-other"),
        ..config.clone()
    })
    .await
    .expect("starting a pulse of another group");

    // What the fleet's trainer does after a retrain it keeps.
    let mut model = default_model();
    model.name = "fleet-model-test".to_owned();
    let publisher = ModelPublisher::new(
        &KafkaClients::new(kafka.bootstrap_servers()),
        &config.model_topic(),
    )
    .unwrap();
    publisher.publish(&model).await.expect("publishing a model");
    model_becomes(&a, &model.name).await;
    assert!(a.metrics().model_watch.applied.get() >= 1);

    // A later instance starts with the fleet's model, not its own file's.
    let b = pulse::start(config.clone())
        .await
        .expect("starting pulse b");
    model_becomes(&b, &model.name).await;

    // Another group's model is its own.
    let (_, card) = get(&other_group.router(), "/api/model?scope=local").await;
    assert_eq!(card["name"], shipped.as_str(), "{card}");

    // A message that is not a model changes nothing.
    let producer = kafka.producer();
    pulse::testing::produce(&producer, &config.model_topic(), "model", b"{ not a model").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.metrics().model_watch.rejected("invalid") == 0 {
        assert!(Instant::now() < deadline, "the bad model was not counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    model_becomes(&a, &model.name).await;

    for pulse in [a, b, other_group] {
        pulse.shutdown().await;
    }
}
