//! An embedded Kafka broker: librdkafka's in-process mock cluster, listening on
//! loopback, so `pulse` and every test speak the real Kafka protocol without an
//! installed broker.
//!
//! The mock cluster does not implement the admin API (CreateTopics, DescribeConfigs):
//! an admin request to it waits out its timeout. So each running broker is listed by
//! its bootstrap address, and code of this process that is given that address (the
//! demo hands it to [`crate::start`] as `brokers`) creates topics through
//! [`EmbeddedBroker::create_topic_at`] instead, at once.

use std::collections::HashMap;
use std::sync::{Mutex, mpsc};
use std::thread;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
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

/// The running embedded brokers of this process, by bootstrap address.
static RUNNING: Mutex<Option<HashMap<String, mpsc::Sender<Request>>>> = Mutex::new(None);

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
        let bootstrap_servers: String = ready_rx.recv().map_err(|_| BrokerError::Stopped)??;
        RUNNING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(bootstrap_servers.clone(), requests_tx.clone());
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
        create_on(
            self.requests_tx.as_ref().ok_or(BrokerError::Stopped)?,
            name,
            partitions,
        )
    }

    /// Whether `bootstrap_servers` is an embedded broker running in this process.
    pub fn is_running_at(bootstrap_servers: &str) -> bool {
        Self::sender_at(bootstrap_servers).is_some()
    }

    /// Creates a topic on the embedded broker of this process at `bootstrap_servers`;
    /// `None` when there is none there (a real broker: use the admin API). A topic
    /// that exists already is left as it is.
    pub fn create_topic_at(
        bootstrap_servers: &str,
        name: &str,
        partitions: i32,
    ) -> Option<Result<(), BrokerError>> {
        let sender = Self::sender_at(bootstrap_servers)?;
        Some(match create_on(&sender, name, partitions) {
            Err(BrokerError::Kafka(e))
                if e.rdkafka_error_code() == Some(RDKafkaErrorCode::TopicAlreadyExists) =>
            {
                Ok(())
            }
            other => other,
        })
    }

    fn sender_at(bootstrap_servers: &str) -> Option<mpsc::Sender<Request>> {
        RUNNING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()?
            .get(bootstrap_servers)
            .cloned()
    }
}

fn create_on(
    requests: &mpsc::Sender<Request>,
    name: &str,
    partitions: i32,
) -> Result<(), BrokerError> {
    {
        let (reply, reply_rx) = mpsc::channel();
        requests
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
        // Closing the channel (every sender: the listed one too) ends the owner's
        // loop, which drops the cluster.
        if let Some(running) = RUNNING.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            running.remove(&self.bootstrap_servers);
        }
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

    /// A broker of this process is found by its address, and a topic it has already is
    /// no error; once it stops it is not found.
    #[test]
    fn a_running_broker_is_found_by_its_address() {
        let broker = EmbeddedBroker::start(1).unwrap();
        let address = broker.bootstrap_servers().to_owned();
        assert!(EmbeddedBroker::is_running_at(&address));
        EmbeddedBroker::create_topic_at(&address, "t", 2)
            .unwrap()
            .unwrap();
        EmbeddedBroker::create_topic_at(&address, "t", 2)
            .unwrap()
            .unwrap();
        drop(broker);
        assert!(!EmbeddedBroker::is_running_at(&address));
        assert!(EmbeddedBroker::create_topic_at("127.0.0.1:9", "t", 1).is_none());
    }
}
