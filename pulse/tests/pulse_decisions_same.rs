//! Decisions are a function of the events, not of how they were read: the same trace,
//! read once as a backlog (large batches, no wall time between them) and once as edges
//! send it (a quarter second of event time at a time, four times real time: small
//! batches and pauses), gives the same decisions with the same command ids, because a
//! partition ticks on its event-time grid (`pulse/src/ticks.rs`) and a burst starts at
//! a tick of that grid.

use std::collections::BTreeSet;
use std::time::Duration;

use models::AccessEvent;
use pulse::testing::{TestKafka, produce_events, produce_paced, wall_ms};
use pulse::{PulseConfig, PulseHandle, TraceSpec, generate_trace};

/// A trace of a few virals over a minute, moved to end 2 s before now, its first event on
/// a whole second (so the quarter seconds the paced producer sends end between ticks).
fn trace() -> Vec<AccessEvent> {
    let spec = TraceSpec {
        seed: 29,
        duration_ms: 60_000,
        background_rps: 50.0,
        virals: 4,
        noise: 0,
        crons: 0,
        flash_crowds: 0,
        ..TraceSpec::default()
    };
    let trace = generate_trace(&spec);
    let first = trace.events.first().unwrap().ts_ms;
    let start = wall_ms() / 1_000 * 1_000 - spec.duration_ms - 2_000;
    trace
        .events
        .into_iter()
        .map(|mut e| {
            e.ts_ms = e.ts_ms - first + start;
            e
        })
        .collect()
}

async fn start(kafka: &TestKafka, topic: &str) -> PulseHandle {
    pulse::start(PulseConfig {
        brokers: Some(kafka.bootstrap_servers().to_owned()),
        topic: topic.to_owned(),
        group: format!("{topic}-pulse"),
        prewarm_topic: format!("{topic}-prewarm"),
        listen: "127.0.0.1:0".parse().unwrap(),
        topic_partitions: 1,
        retrain_interval_secs: 0,
        fleet_model: false,
        ..PulseConfig::default()
    })
    .await
    .expect("starting pulse")
}

/// Waits until `n` events were applied and the last ticks are done, then returns the
/// ids of every decision the partitions made.
async fn decided(pulse: PulseHandle, n: usize) -> BTreeSet<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while pulse.metrics().consumed.get() < n as u64 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "applied {} of {n} events",
            pulse.metrics().consumed.get()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The last events wait for the idle tick.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ids = {
        let partitions = pulse.partitions().read().unwrap();
        partitions
            .states()
            .values()
            .flat_map(|s| {
                let p = s.predictor.as_ref().unwrap().lock().unwrap();
                p.decisions()
                    .map(|d| d.command.id.clone())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    pulse.shutdown().await;
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_events_read_in_other_batches_give_the_same_command_ids() {
    let kafka = TestKafka::start();
    let events = trace();
    let producer = kafka.producer();

    // Read as a backlog: every event on the topic before pulse starts.
    let backlog = kafka.unique_topic("pulse-same-backlog");
    kafka.create_topic(&backlog, 1).await;
    produce_events(&producer, &backlog, &events).await;
    let pulse = start(&kafka, &backlog).await;
    let from_backlog = decided(pulse, events.len()).await;

    // Read as edges send it.
    let paced = kafka.unique_topic("pulse-same-paced");
    kafka.create_topic(&paced, 1).await;
    let pulse = start(&kafka, &paced).await;
    produce_paced(&producer, &paced, &events, 4).await;
    let from_paced = decided(pulse, events.len()).await;

    assert!(
        from_backlog.len() >= 2,
        "the trace must make decisions for the check to mean anything: {from_backlog:?}"
    );
    assert_eq!(
        from_backlog, from_paced,
        "the same events decided differently: read as a backlog (left) and paced (right)"
    );
}
