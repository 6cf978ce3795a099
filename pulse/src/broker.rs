//! An embedded Kafka broker: librdkafka's in-process mock cluster, listening on
//! loopback, so `pulse` and every test speak the real Kafka protocol without an
//! installed broker.

use std::sync::mpsc;
use std::thread;

use rdkafka::error::KafkaError;
use rdkafka::mocking::MockCluster;

/// Why the embedded broker could not start or act.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// librdkafka refused to create the mock cluster or a topic.
    #[error("embedded broker: {0}")]
    Kafka(#[from] KafkaError),
    /// The thread that owns the cluster has gone.
    #[error("embedded broker has stopped")]
    Stopped,
}

enum Request {
    CreateTopic {
        name: String,
        partitions: i32,
        reply: mpsc::Sender<Result<(), KafkaError>>,
    },
}

/// A running mock cluster. It stops when dropped.
///
/// The cluster handle is not `Send`, so one thread owns it for its whole life and
/// this handle talks to that thread over a channel.
pub struct EmbeddedBroker {
    bootstrap_servers: String,
    requests_tx: Option<mpsc::Sender<Request>>,
    owner: Option<thread::JoinHandle<()>>,
}

impl EmbeddedBroker {
    /// Starts a mock cluster of `brokers` brokers on loopback ports.
    pub fn start(brokers: i32) -> Result<Self, BrokerError> {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (requests_tx, requests_rx) = mpsc::channel::<Request>();
        let owner = thread::Builder::new()
            .name("embedded-kafka".into())
            .spawn(move || {
                let cluster = match MockCluster::new(brokers) {
                    Ok(cluster) => cluster,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(cluster.bootstrap_servers()));
                // Serve requests until every handle is dropped, then drop the cluster.
                for request in requests_rx {
                    match request {
                        Request::CreateTopic {
                            name,
                            partitions,
                            reply,
                        } => {
                            let _ = reply.send(cluster.create_topic(&name, partitions, 1));
                        }
                    }
                }
            })
            .expect("spawning a thread");
        let bootstrap_servers = ready_rx.recv().map_err(|_| BrokerError::Stopped)??;
        Ok(EmbeddedBroker {
            bootstrap_servers,
            requests_tx: Some(requests_tx),
            owner: Some(owner),
        })
    }

    /// The `bootstrap.servers` list clients connect to.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap_servers
    }

    /// Creates a topic (the mock cluster does not implement the CreateTopics API).
    pub fn create_topic(&self, name: &str, partitions: i32) -> Result<(), BrokerError> {
        let (reply, reply_rx) = mpsc::channel();
        self.requests_tx
            .as_ref()
            .ok_or(BrokerError::Stopped)?
            .send(Request::CreateTopic {
                name: name.to_owned(),
                partitions,
                reply,
            })
            .map_err(|_| BrokerError::Stopped)?;
        Ok(reply_rx.recv().map_err(|_| BrokerError::Stopped)??)
    }
}

impl Drop for EmbeddedBroker {
    fn drop(&mut self) {
        // Closing the channel ends the owner's loop, which drops the cluster.
        self.requests_tx.take();
        if let Some(owner) = self.owner.take() {
            let _ = owner.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_on_loopback_and_creates_topics() {
        let broker = EmbeddedBroker::start(1).unwrap();
        assert!(
            broker.bootstrap_servers().starts_with("127.0.0.1:")
                || broker.bootstrap_servers().starts_with("localhost:"),
            "{}",
            broker.bootstrap_servers()
        );
        broker.create_topic("t", 3).unwrap();
    }
}
