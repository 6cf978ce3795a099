//! The event path end to end over Kafka: AccessEvents produced with rdkafka come back
//! out of a consumer group exactly as sent, and malformed messages on the same topic
//! are counted and skipped without stalling their partition.

use std::collections::BTreeMap;
use std::time::Duration;

use models::{
    AccessEvent, CacheKey, DecodeError, NodeId, Outcome, RegionId, TenantId, decode, encode,
};
use rdkafka::Message;
use rdkafka::consumer::{CommitMode, Consumer};
use tests::{TestKafka, produce};

fn event(i: u64) -> AccessEvent {
    let outcome = Outcome::ALL[i as usize % Outcome::ALL.len()];
    let mut e = AccessEvent::new(
        1_764_470_000_000 + i,
        TenantId::new(format!("tenant-{}", i % 3)).unwrap(),
        CacheKey::new(format!("/assets/{}.js", i % 7)).unwrap(),
        RegionId::new(["eu-west", "us-east", "ap-south"][i as usize % 3]).unwrap(),
        NodeId::new(format!("edge-{}", i % 4)).unwrap(),
        outcome,
    );
    e.bytes = i * 100;
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_survive_the_round_trip_and_bad_messages_are_skipped() {
    let kafka = TestKafka::start();
    let topic = kafka.unique_topic("edge-events");
    kafka.create_topic(&topic, 3).await;

    // Good events interleaved with bad ones, all on the same partition keys, so a bad
    // message sits in front of good ones on every partition.
    let sent: Vec<AccessEvent> = (0..60).map(event).collect();
    let bad: [&[u8]; 4] = [
        b"{not json",
        br#"{"v":1,"ts_ms":1,"tenant":"t","key":"http://evil/x","region":"r","node":"n","outcome":"hit"}"#,
        br#"{"v":9,"ts_ms":1,"tenant":"t","key":"/x","region":"r","node":"n","outcome":"hit"}"#,
        &[b'{'; 5000],
    ];
    let producer = kafka.producer();
    for (i, e) in sent.iter().enumerate() {
        let key = e.partition_key();
        if i % 15 == 0 {
            let payload = bad[i / 15];
            produce(&producer, &topic, &key, payload).await;
        }
        produce(&producer, &topic, &key, &encode(e)).await;
    }

    let consumer = kafka.consumer(&format!("{topic}-group"));
    consumer.subscribe(&[&topic]).unwrap();
    let mut received = Vec::new();
    let mut rejected: BTreeMap<&'static str, usize> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while received.len() + rejected.values().sum::<usize>() < sent.len() + bad.len() {
        let message = tokio::time::timeout_at(deadline, consumer.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "stalled after {} events and {rejected:?} rejections",
                    received.len()
                )
            })
            .expect("consuming");
        match decode::<AccessEvent>(message.payload().unwrap_or_default()) {
            Ok(e) => received.push(e),
            Err(e) => *rejected.entry(e.reason()).or_default() += 1,
        }
        consumer
            .commit_message(&message, CommitMode::Async)
            .unwrap();
    }

    let by_time = |v: &mut Vec<AccessEvent>| v.sort_by_key(|e| e.ts_ms);
    let mut expected = sent.clone();
    by_time(&mut expected);
    by_time(&mut received);
    assert_eq!(received, expected);
    let expected_rejections: BTreeMap<&'static str, usize> = [
        ("malformed", 1),
        ("invalid_field", 1),
        ("unsupported_version", 1),
        ("too_large", 1),
    ]
    .into();
    assert_eq!(rejected, expected_rejections);
    // Sanity: the reasons really come from the decoder.
    assert_eq!(DecodeError::Malformed(String::new()).reason(), "malformed");
}
