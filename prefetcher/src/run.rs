//! Starting a whole node in-process: the proxy listener, the TLS listener when
//! configured, the admin listener, and with
//! Kafka on, the access-event publisher and the pre-warm consumer. The binary uses
//! it, and so can a demo or a test that runs several nodes in one process.
//!
//! ```no_run
//! # async fn demo() -> Result<(), prefetcher::StartError> {
//! use prefetcher::{Config, spawn_node};
//! let mut config = Config::single_origin(
//!     "127.0.0.1:0".parse().unwrap(),
//!     "acme".parse().unwrap(),
//!     "http://127.0.0.1:9000",
//! );
//! config.region = Some("eu-west".parse().unwrap());
//! config.node = Some("edge-1".parse().unwrap());
//! config.kafka.brokers = Some("127.0.0.1:9092".into());
//! let node = spawn_node(config).await?;
//! println!("edge-1 at {}", node.url());
//! node.shutdown().await;
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::KafkaError;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::changes::Reloaded;
use crate::config::{Config, ConfigError, WarmupConfig};
use crate::events::ChannelSink;
use crate::listener::{ServeOptions, serve};
use crate::prewarm::PrewarmConsumer;
use crate::proxy::{Node, admin_app};
use crate::proxy::{serve_node, serve_node_tls};
use crate::publisher::EventPublisher;
use crate::reload::{refuse_reload, reload_node};
use crate::tls::ListenerCert;
use crate::warmup::Warmup;

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A listener could not bind.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A Kafka client could not be created (bad librdkafka property and the like;
    /// an unreachable broker is *not* an error: the node serves and counts drops).
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
}

/// Options of [`spawn_node_with`].
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// HTTP serving options (drain grace, the HTTP/1 head buffer).
    pub serve: ServeOptions,
    /// How long the publisher may flush buffered events at shutdown.
    pub flush_grace: Duration,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            serve: ServeOptions::default(),
            flush_grace: Duration::from_secs(5),
        }
    }
}

/// A running node. Dropping it starts the shutdown; [`NodeHandle::shutdown`] also
/// waits for connections to drain and buffered events to flush.
#[derive(Debug)]
pub struct NodeHandle {
    addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    admin_addr: Option<SocketAddr>,
    node: Node,
    /// The TLS listener's certificate, which a reload replaces.
    tls_cert: Option<ListenerCert>,
    kafka: bool,
    shutdown_tx: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("node", &self.config().node)
            .field("region", &self.config().region)
            .finish_non_exhaustive()
    }
}

/// Starts a node with default [`NodeOptions`]. See [`spawn_node_with`].
pub async fn spawn_node(config: Config) -> Result<NodeHandle, StartError> {
    spawn_node_with(config, NodeOptions::default()).await
}

/// Validates `config`, reads the TLS listener's certificate and key (a bad file is
/// a [`StartError::Config`] naming `tls.cert_file` or `tls.key_file`) and, with
/// Kafka on, `kafka.prewarm_keys_file` (likewise), binds
/// `config.listen` (port 0 picks a free one), `tls.listen` and `config.admin_listen`,
/// and serves. With `kafka.brokers` set it also starts the
/// access-event publisher and the pre-warm consumer; without, no Kafka client exists.
pub async fn spawn_node_with(
    config: Config,
    options: NodeOptions,
) -> Result<NodeHandle, StartError> {
    config.validate()?;
    for deprecated in config.deprecations() {
        tracing::warn!("{deprecated}");
    }
    let (tls, tls_cert) = match &config.tls {
        Some(tls) => {
            let (server_config, cert) = crate::tls::server_config(tls)?;
            (Some((tls.listen, server_config)), Some(cert))
        }
        None => (None, None),
    };
    let token = match &config.warmup {
        Some(warmup) => warmup.token()?,
        None => None,
    };
    let kafka = config.kafka.enabled();
    let prewarm_keys = if kafka {
        config.kafka.prewarm_keys()?
    } else {
        None
    };
    let (node, events_rx) = if kafka {
        let (sink, events_rx) = ChannelSink::new(config.kafka.event_buffer);
        (
            Node::with_sink(config.clone(), std::sync::Arc::new(sink))?,
            Some(events_rx),
        )
    } else {
        (Node::new(config.clone())?, None)
    };
    let backlog = config.server.listen_backlog;
    let bind = |addr: SocketAddr| async move {
        listen(addr, backlog).map_err(|source| StartError::Bind { addr, source })
    };
    let listener = bind(config.listen).await?;
    let addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: config.listen,
        source,
    })?;
    let tls_listener = match tls {
        Some((addr, server_config)) => {
            let listener = bind(addr).await?;
            let local = listener
                .local_addr()
                .map_err(|source| StartError::Bind { addr, source })?;
            Some((listener, local, server_config))
        }
        None => None,
    };
    let tls_addr = tls_listener.as_ref().map(|(_, addr, _)| *addr);
    let admin_listener = match config.admin_listen {
        Some(a) => Some(bind(a).await?),
        None => None,
    };
    let admin_addr = admin_listener.as_ref().and_then(|l| l.local_addr().ok());
    // Create the Kafka clients before spawning anything, so a bad property fails the
    // start instead of leaving half a node running.
    let kafka_parts = match events_rx {
        Some(events_rx) => Some((
            EventPublisher::new(&config, node.metrics())?,
            events_rx,
            PrewarmConsumer::new(node.clone(), prewarm_keys)?,
        )),
        None => None,
    };
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let mut tasks = Vec::new();
    if let Some(admin_listener) = admin_listener {
        tasks.push(tokio::spawn(serve(
            admin_listener,
            admin_app(node.clone()),
            stopped(shutdown_rx.clone()),
            options.serve.clone(),
        )));
    }
    tasks.push(tokio::spawn(serve_node(
        listener,
        node.clone(),
        stopped(shutdown_rx.clone()),
        options.serve.clone(),
    )));
    if let Some((listener, _, server_config)) = tls_listener {
        tasks.push(tokio::spawn(serve_node_tls(
            listener,
            node.clone(),
            server_config,
            stopped(shutdown_rx.clone()),
            options.serve.clone(),
        )));
    }
    match &config.warmup {
        Some(warmup) => tasks.push(spawn_warmup(
            &node,
            &config,
            warmup.clone(),
            token,
            stopped(shutdown_rx.clone()),
        )),
        None => tracing::info!("no [warmup]: ready at once"),
    }
    if let Some((publisher, events_rx, consumer)) = kafka_parts {
        tasks.push(tokio::spawn(publisher.run(
            events_rx,
            shutdown_rx.clone(),
            options.flush_grace,
        )));
        tasks.push(tokio::spawn(consumer.run(shutdown_rx)));
    }
    tracing::info!(%addr, ?tls_addr, ?admin_addr, kafka, "node started");
    Ok(NodeHandle {
        addr,
        tls_addr,
        admin_addr,
        node,
        tls_cert,
        kafka,
        shutdown_tx,
        tasks,
    })
}

/// The warm-up at start (`crate::warmup`): `/readyz` says warming from now until the
/// region's warm set is in through [`Node::warm`] (or the deadline passes); stops
/// early at shutdown.
fn spawn_warmup(
    node: &Node,
    config: &Config,
    warmup: WarmupConfig,
    token: Option<String>,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    node.readiness().start_warming();
    let node = node.clone();
    let region = config
        .region
        .clone()
        .expect("validated: [warmup] needs region");
    let tenants = config
        .tenants
        .iter()
        .map(|t| (t.id.clone(), t.weight))
        .collect();
    let peers: Arc<[http::Uri]> = warmup.peer_urls().expect("validated: warmup.peers").into();
    tokio::spawn(async move {
        let run = Warmup {
            config: &warmup,
            token,
            region: &region,
            tenants,
            readiness: node.readiness(),
            metrics: &node.metrics().warmup,
        }
        .run(
            || node.origin().limiter().prefetch_limit(),
            |tenant, key| {
                let node = node.clone();
                let peers = Arc::clone(&peers);
                async move {
                    node.warm(&tenant, key, peers)
                        .await
                        .unwrap_or(crate::warmup::WarmFill::Failed)
                }
            },
        );
        tokio::select! {
            () = run => {}
            () = stopped => {}
        }
    })
}

/// A listener on `addr` with this backlog (tokio's `bind` fixes it at 1024).
fn listen(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a restarted node can bind while old connections
    // linger in TIME_WAIT.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

impl NodeHandle {
    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://` + the proxy's address.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The TLS listener's address, if configured.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
    }

    /// The admin listener's address (`/metrics`, `/healthz`), if configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The node (metrics, cache, registry, `prewarm`).
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Whether the Kafka publisher and consumer run.
    pub fn kafka_enabled(&self) -> bool {
        self.kafka
    }

    /// Puts `config` in force for new requests (tenants, `[limits]`, the TLS
    /// listener's certificate, read again), while requests and fills in flight finish
    /// on the old one; settings that need a restart are reported and kept. A config
    /// that fails [`check_config`](crate::check_config) is refused and the running one
    /// stays. Counted in `prefetcher_config_reloads_total{result}` and logged. See
    /// the `reload` module.
    pub fn reload(&self, config: Config) -> Result<Reloaded, ConfigError> {
        reload_node(&self.node, self.tls_cert.as_ref(), config)
    }

    /// Counts and logs a reload refused before it could start (the config file could
    /// not be read or parsed); the running configuration stays. Returns `error`.
    pub fn refuse_reload(&self, error: ConfigError) -> ConfigError {
        refuse_reload(&self.node, error)
    }

    /// Stops accepting, drains connections, flushes events and commits offsets.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown_tx.send(true);
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
    }
}

impl Drop for NodeHandle {
    fn drop(&mut self) {
        let _ = self.shutdown_tx.send(true);
    }
}
