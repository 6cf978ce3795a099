//! The access-event publisher: reads the proxy's [`ChannelSink`](crate::ChannelSink)
//! and produces one [`AccessEvent`](models::AccessEvent) per record to Kafka.
//!
//! The request path only ever `try_send`s into the bounded channel, so a slow or
//! absent broker never delays or fails a request: a full channel drops the event and
//! counts it. This task hands each event to a librdkafka producer whose own queue is
//! bounded (`queue.buffering.max.messages`) and batched (`linger.ms`); a full producer
//! queue, or an event not delivered within `message.timeout.ms`, is dropped and
//! counted too. Deliveries are acknowledged in the producer's polling thread, which
//! counts them as published. Events are keyed by `tenant/key`
//! ([`AccessEvent::partition_key`](models::AccessEvent::partition_key)), so one key's
//! events stay in order on one partition.

use std::time::Duration;

use models::{AccessEventRef, EdgeKind, NodeId, RegionId, SCHEMA_VERSION, encode_event_into};
use prometheus_client::metrics::counter::Counter;
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use tokio::sync::{mpsc, watch};

use crate::config::{Config, ConfigError, KafkaConfig};
use crate::events::{OutcomeRecord, OutcomeRef};
use crate::metrics::Metrics;

/// Counts deliveries in librdkafka's polling thread.
struct DeliveryCounter {
    published: Counter,
    dropped: Counter,
}

impl ClientContext for DeliveryCounter {}

impl ProducerContext for DeliveryCounter {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _opaque: ()) {
        match result {
            Ok(_) => {
                self.published.inc();
            }
            Err((error, _)) => {
                self.dropped.inc();
                tracing::debug!(%error, "access event not delivered");
            }
        }
    }
}

/// The librdkafka settings both Kafka clients share.
pub(crate) fn client_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", kafka.brokers.as_deref().unwrap_or(""));
    for (k, v) in &kafka.properties {
        config.set(k, v);
    }
    config
}

/// The event producer's librdkafka settings: [`client_config`], the producer's own
/// settings, then `kafka.properties` over them.
fn producer_config(kafka: &KafkaConfig, node: &NodeId) -> ClientConfig {
    let mut producer = client_config(kafka);
    producer
        .set("client.id", format!("prefetcher-{node}"))
        .set(
            "queue.buffering.max.messages",
            kafka.queue_max_messages.to_string(),
        )
        .set("linger.ms", kafka.linger_ms.to_string())
        .set("message.timeout.ms", kafka.message_timeout_ms.to_string())
        .set("compression.type", "lz4")
        // Events are statistics: one leader ack is enough, and a lost event is
        // counted, not retried forever.
        .set("acks", "1");
    // `kafka.properties` have the last word (compression, acks, batch sizes...).
    for (key, value) in &kafka.properties {
        producer.set(key, value);
    }
    producer
}

/// Checks `kafka.properties` as librdkafka reads them (an unknown property, a bad
/// value), for the event producer and a consumer, without creating a client: nothing
/// connects. The error names `kafka.properties`.
pub(crate) fn check_kafka_properties(kafka: &KafkaConfig) -> Result<(), ConfigError> {
    let node = NodeId::new("check").expect("a valid node id");
    let consumer = {
        let mut c = client_config(kafka);
        c.set("group.id", "check");
        c
    };
    for config in [producer_config(kafka, &node), consumer] {
        config
            .create_native_config()
            .map_err(|e| crate::config::invalid("kafka.properties", e.to_string()))?;
    }
    Ok(())
}

/// Produces the node's access events to `kafka.events_topic`.
pub struct EventPublisher {
    producer: ThreadedProducer<DeliveryCounter>,
    topic: String,
    region: RegionId,
    node: NodeId,
    edge: EdgeKind,
    dropped: Counter,
    /// The Kafka key and the payload of the event being sent, reused: an event
    /// costs the producer's own copies and no allocation here.
    key_buf: Vec<u8>,
    payload_buf: Vec<u8>,
}

/// Why the producer did not take an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotSent {
    /// Its queue is full (`kafka.queue_max_messages`): the caller may wait and retry.
    QueueFull,
    /// Refused for another reason: dropped and counted already.
    Refused,
}

impl std::fmt::Debug for EventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPublisher")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl EventPublisher {
    /// A publisher for a validated `config` with Kafka on (`region` and `node` set),
    /// counting into `metrics`; its events say they come from a prefetcher. It creates
    /// the producer; nothing is sent yet.
    pub fn new(config: &Config, metrics: &Metrics) -> Result<EventPublisher, KafkaError> {
        let (Some(region), Some(node)) = (config.region.clone(), config.node.clone()) else {
            return Err(KafkaError::ClientCreation(
                "the event publisher needs `region` and `node` in the config".into(),
            ));
        };
        EventPublisher::with_ids(&config.kafka, region, node, EdgeKind::Prefetcher, metrics)
    }

    /// A publisher from the narrower parts [`EventPublisher::new`] reads from a node's
    /// config: the Kafka settings and what events are stamped with (the edge agent has
    /// no node config, and its edge is nginx or Varnish).
    pub fn with_ids(
        kafka: &KafkaConfig,
        region: RegionId,
        node: NodeId,
        edge: EdgeKind,
        metrics: &Metrics,
    ) -> Result<EventPublisher, KafkaError> {
        let context = DeliveryCounter {
            published: metrics.events_published.clone(),
            dropped: metrics.events_dropped.clone(),
        };
        let producer = producer_config(kafka, &node);
        let producer = producer.create_with_context(context)?;
        Ok(EventPublisher {
            producer,
            topic: kafka.events_topic.clone(),
            region,
            node,
            edge,
            dropped: metrics.events_dropped.clone(),
            key_buf: Vec::with_capacity(256),
            payload_buf: Vec::with_capacity(512),
        })
    }

    /// Encodes one event (stamped with this node's region, node id and edge kind, and
    /// the record's own time) and hands it to the producer; never blocks. A full queue
    /// is left to the caller to count or wait out; any other refusal is counted here.
    pub(crate) fn send(&mut self, record: &OutcomeRef<'_>) -> Result<(), NotSent> {
        self.stamp(record);
        let sent = self.producer.send(
            BaseRecord::to(&self.topic)
                .key(&self.key_buf[..])
                .payload(&self.payload_buf[..]),
        );
        match sent {
            Ok(()) => Ok(()),
            Err((error, _)) if error.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                Err(NotSent::QueueFull)
            }
            Err((error, _)) => {
                self.dropped.inc();
                tracing::debug!(%error, "access event refused by the producer");
                Err(NotSent::Refused)
            }
        }
    }

    /// Writes the event's Kafka key and payload into the reused buffers.
    fn stamp(&mut self, record: &OutcomeRef<'_>) {
        let event = AccessEventRef {
            v: SCHEMA_VERSION,
            ts_ms: record.ts_ms,
            tenant: record.tenant.clone(),
            key: record.key.clone(),
            region: self.region.borrowed(),
            node: self.node.borrowed(),
            outcome: record.outcome,
            referrer: record.referrer.clone(),
            bytes: record.bytes,
            fill_ms: record.fill_ms,
            edge: Some(self.edge),
        };
        models::write_message_key(event.tenant.as_str(), event.key.as_str(), &mut self.key_buf);
        self.payload_buf.clear();
        encode_event_into(&event, &mut self.payload_buf);
    }

    /// Counts an event the caller gave up on (a full queue it would not wait out).
    pub(crate) fn count_dropped(&self) {
        self.dropped.inc();
    }

    /// Waits up to `timeout` for every event handed over to be delivered (or to
    /// fail and be counted). Blocks.
    pub(crate) fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.producer.flush(timeout)
    }

    /// Hands one record to the producer; never blocks: a full queue drops it (counted).
    fn publish(&mut self, record: OutcomeRecord) {
        // The record's own time: when it was answered, not now (a backlog would shift it).
        if self.send(&record.borrowed()) == Err(NotSent::QueueFull) {
            self.count_dropped();
        }
    }

    /// Publishes records from `events_rx` until `shutdown` turns true (or every sender
    /// is gone), then publishes what is still buffered and flushes the producer for up
    /// to `grace`.
    pub async fn run(
        mut self,
        mut events_rx: mpsc::Receiver<OutcomeRecord>,
        mut shutdown: watch::Receiver<bool>,
        grace: Duration,
    ) {
        tracing::info!(topic = %self.topic, "access-event publisher started");
        loop {
            tokio::select! {
                record = events_rx.recv() => match record {
                    Some(record) => self.publish(record),
                    None => break,
                },
                _ = shutdown.wait_for(|stop| *stop) => break,
            }
        }
        while let Ok(record) = events_rx.try_recv() {
            self.publish(record);
        }
        // `flush` blocks while librdkafka delivers: keep it off the async threads.
        let producer = self.producer;
        let flushed = tokio::task::spawn_blocking(move || producer.flush(grace)).await;
        match flushed {
            Ok(Ok(())) => tracing::info!("access-event publisher flushed and stopped"),
            Ok(Err(error)) => tracing::warn!(%error, "access events left unflushed at shutdown"),
            Err(error) => tracing::warn!(%error, "flushing access events failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use models::{CacheKey, Domain, Outcome, TenantId, encode};

    use super::*;

    /// What the publisher sends is the record as an `AccessEvent` stamped with the
    /// node's ids and edge kind, keyed `tenant/key`, byte for byte as `encode` and
    /// `partition_key` make them.
    #[test]
    fn an_event_is_stamped_keyed_and_encoded_as_the_wire_type_says() {
        let kafka = KafkaConfig {
            brokers: Some("127.0.0.1:9".into()),
            ..KafkaConfig::default()
        };
        let (region, node) = (
            RegionId::new("eu-west").unwrap(),
            NodeId::new("n-1").unwrap(),
        );
        let mut publisher = EventPublisher::with_ids(
            &kafka,
            region.clone(),
            node.clone(),
            EdgeKind::Varnish,
            &Metrics::new(),
        )
        .unwrap();
        for (referrer, fill_ms) in [(None, None), (Some("news.example"), Some(12))] {
            let record = OutcomeRecord {
                ts_ms: 1_700_000_000_123,
                tenant: TenantId::new("acme").unwrap(),
                key: CacheKey::new("/a?b=1").unwrap(),
                outcome: Outcome::Miss,
                bytes: 512,
                fill_ms,
                referrer: referrer.map(|d| Domain::new(d).unwrap()),
            };
            publisher.stamp(&record.borrowed());
            let mut event = record.into_event(region.clone(), node.clone());
            event.edge = Some(EdgeKind::Varnish);
            assert_eq!(publisher.payload_buf, encode(&event));
            assert_eq!(publisher.key_buf, event.partition_key().into_bytes());
        }
    }
}
