//! Prediction end to end over Kafka: a generated viral event, produced to the events
//! topic, is consumed by pulse (started as it ships, `pulse::start`), scored on the
//! ingest thread, and a pre-warm
//! command for the spreading key comes out on the prewarm topic, aimed at the regions
//! the key has not reached, with its reasons.

use std::time::Duration;

use models::{PrewarmCommand, RegionTargets, decode};
use pulse::testing::TestKafka;
use pulse::{BurstKind, FEATURE_COUNT, PulseConfig, TraceSpec, generate_trace};
use rdkafka::Message;
use rdkafka::consumer::Consumer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spreading_key_gets_a_prewarm_command_for_the_regions_it_has_not_reached() {
    let kafka = TestKafka::start();
    let events_topic = kafka.unique_topic("pulse-prewarm-events");
    let prewarm_topic = kafka.unique_topic("pulse-prewarm-commands");
    kafka.create_topic(&events_topic, 1).await;
    kafka.create_topic(&prewarm_topic, 1).await;

    let trace = generate_trace(&TraceSpec {
        duration_ms: 60_000,
        background_rps: 50.0,
        virals: 1,
        noise: 0,
        crons: 0,
        flash_crowds: 0,
        ..TraceSpec::default()
    });
    let viral = trace
        .bursts
        .iter()
        .find(|b| b.kind == BurstKind::Viral)
        .unwrap()
        .clone();

    let pulse = pulse::start(PulseConfig {
        brokers: Some(kafka.bootstrap_servers().to_owned()),
        topic: events_topic.clone(),
        group: format!("{events_topic}-pulse"),
        prewarm_topic: prewarm_topic.clone(),
        listen: "127.0.0.1:0".parse().unwrap(),
        ..PulseConfig::default()
    })
    .await
    .expect("starting pulse");
    let metrics = pulse.metrics().clone();
    let partitions = pulse.partitions().clone();
    assert!(partitions.read().unwrap().prediction_on());

    let consumer = kafka.consumer(&format!("{prewarm_topic}-edge"));
    consumer.subscribe(&[&prewarm_topic]).unwrap();
    // The events as edges send them, at four times the pace of event time, once pulse
    // runs: it scores the bursts as they unfold. (A backlog read in big batches is
    // scored once per batch, by when a burst is history.)
    let producer = kafka.producer();
    let events = trace.events.clone();
    let topic = events_topic.clone();
    let produced =
        tokio::spawn(
            async move { pulse::testing::produce_paced(&producer, &topic, &events, 4).await },
        );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let command: PrewarmCommand = loop {
        let message = tokio::time::timeout_at(deadline, consumer.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no pre-warm command for {}; consumed {} events; metrics:\n{}",
                    viral.key,
                    metrics.consumed.get(),
                    metrics.encode()
                )
            })
            .expect("consuming the prewarm topic");
        let command: PrewarmCommand =
            decode(message.payload().unwrap_or_default()).expect("a valid command");
        assert_eq!(
            message.key(),
            Some(command.partition_key().as_bytes()),
            "keyed by tenant and key"
        );
        if command.key == viral.key {
            break command;
        }
    };
    produced.await.expect("producing the trace");
    pulse.shutdown().await;

    assert_eq!(command.tenant, viral.tenant);
    assert!(command.confidence >= 0.85, "{command:?}");
    assert_eq!(command.priority, models::Priority::Background);
    let RegionTargets::Only(targets) = &command.regions else {
        panic!("expected named regions: {command:?}");
    };
    let first_region = &viral.regions[0].0;
    assert!(
        !targets.contains(first_region),
        "the region where it started is not warmed"
    );
    assert!(!targets.is_empty());
    // Every target region was one the viral had not yet reached when the command left.
    for target in targets {
        let reached = viral.regions.iter().find(|(r, _)| r == target).unwrap().1;
        assert!(
            reached > command.issued_at_ms,
            "{target} was reached before the command"
        );
    }
    assert_eq!(command.reason.features.len(), FEATURE_COUNT);
    assert!(metrics.prewarm_sent.get() >= 1);
    let text = metrics.encode();
    assert!(
        text.contains("pulse_decision_duration_seconds_count"),
        "{text}"
    );
    let partitions = partitions.read().unwrap();
    let decided = partitions.states().values().any(|s| {
        let p = s.predictor.as_ref().unwrap().lock().unwrap();
        p.decisions().any(|d| d.command.id == command.id)
    });
    assert!(decided, "the command is one of the partitions' decisions");
}
