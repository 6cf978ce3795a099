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

use models::{EdgeKind, NodeId, RegionId, encode};
use prometheus_client::metrics::counter::Counter;
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use tokio::sync::{mpsc, watch};

use crate::config::{Config, KafkaConfig};
use crate::events::OutcomeRecord;
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

/// Produces the node's access events to `kafka.events_topic`.
pub struct EventPublisher {
    producer: ThreadedProducer<DeliveryCounter>,
    topic: String,
    region: RegionId,
    node: NodeId,
    edge: EdgeKind,
    dropped: Counter,
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
        let producer = client_config(kafka)
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
            .set("acks", "1")
            .create_with_context(context)?;
        Ok(EventPublisher {
            producer,
            topic: kafka.events_topic.clone(),
            region,
            node,
            edge,
            dropped: metrics.events_dropped.clone(),
        })
    }

    /// Hands one record to the producer; never blocks.
    fn publish(&self, record: OutcomeRecord) {
        // The record's own time: when it was answered, not now (a backlog would shift it).
        let mut event = record.into_event(self.region.clone(), self.node.clone());
        event.edge = Some(self.edge);
        let key = event.partition_key();
        let payload = encode(&event);
        if let Err((error, _)) = self
            .producer
            .send(BaseRecord::to(&self.topic).key(&key).payload(&payload))
        {
            self.dropped.inc();
            if error.rdkafka_error_code() != Some(RDKafkaErrorCode::QueueFull) {
                tracing::debug!(%error, "access event refused by the producer");
            }
        }
    }

    /// Publishes records from `events_rx` until `shutdown` turns true (or every sender
    /// is gone), then publishes what is still buffered and flushes the producer for up
    /// to `grace`.
    pub async fn run(
        self,
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
