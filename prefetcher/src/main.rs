//! The `prefetcher` command line: an edge caching proxy with single-flight request
//! collapsing.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use models::TenantId;
use models::{NodeId, RegionId};
use prefetcher::{
    Config, ConfigError, LogEncoding, WaitTimeoutPolicy, check_config, report_check, spawn_node,
    until_shutdown,
};

/// An edge caching proxy that collapses concurrent misses into one origin fill.
///
/// Run it for one tenant with `--origin URL`, or for several with `--config FILE`
/// (TOML: host names → tenant → origin). The tenant of a request comes only from that
/// mapping, never from a client header. GET and HEAD without credentials are cached
/// and collapsed; other requests pass through. Every response carries
/// `x-cache: HIT | MISS | STALE | COLLAPSED | PREFETCHED | BYPASS`.
///
/// Shield mode: point `--origin` at another prefetcher (the regional tier) and each
/// region makes one origin fill per key.
///
/// Kafka (optional): with `--brokers`, the node publishes one access event per
/// request outcome to `--events-topic` and pre-warms the keys named by commands on
/// `--prewarm-topic` (for its `--region`, at background priority, within spare
/// origin capacity); `--region` and `--node` are then required. Without `--brokers`
/// there is no Kafka at all: the proxy works the same, no events are published and
/// no pre-warm commands are read.
///
/// Warm-up at start (optional): with a `[warmup]` section in the config file, the
/// node asks pulse (`warmup.pulse`) for its region's hot keyset and fills it at
/// background priority before it reports ready: `/readyz` on `--admin-listen` answers
/// 503 `{"state":"warming","done":N,"of":M}` until then (at most
/// `warmup.deadline_ms`), 200 after; `/healthz` means alive. Without `[warmup]`, or
/// when pulse does not answer, the node is ready at once (docs/warming.md).
///
/// Purges: a purge command from pulse on `--prewarm-topic` (signed like pre-warms),
/// or `POST /purge` on `--admin-listen` with the bearer token of `purge.token_file`,
/// invalidates a tenant's prefix, hard or soft (stale until re-warmed), and may
/// re-warm it over a window at background priority, `purge.rewarm_concurrency` fills
/// at a time; an edge behind a shield sets `purge.behind_shield` (docs/warming.md).
///
/// Flags override the config file; every flag can also be set by its environment
/// variable. Metrics (Prometheus text) are on `--admin-listen` at `/metrics`.
///
/// Operating it: `--check-config` checks the configuration as a start would (files,
/// certificates, keys, tenants, limits, Kafka properties) without binding or
/// connecting, as `nginx -t` does. SIGHUP reads the config file (and these flags)
/// again and puts tenants, origins, `[limits]` and the TLS certificate in force for
/// new requests, while requests in flight finish on the old configuration; a
/// configuration that fails the check is refused and the running one kept; other
/// settings are reported as needing a restart (`prefetcher_config_reloads_total`
/// counts both). SIGINT or SIGTERM drains and stops. Logs go to stderr as text
/// (coloured on a terminal only) or JSON lines (`--log-format json`).
#[derive(Debug, Parser)]
#[command(name = "prefetcher", version)]
struct Cli {
    /// Address the proxy listens on (HTTP/1.1 and h2c).
    #[arg(long, env = "PREFETCHER_LISTEN")]
    listen: Option<SocketAddr>,

    /// Address of a TLS listener for clients (HTTP/1.1 and HTTP/2 by ALPN), beside
    /// the plain one; needs --tls-cert-file and --tls-key-file.
    #[arg(long, env = "PREFETCHER_TLS_LISTEN", requires_all = ["tls_cert_file", "tls_key_file"])]
    tls_listen: Option<SocketAddr>,

    /// PEM certificate chain of the TLS listener.
    #[arg(long, env = "PREFETCHER_TLS_CERT_FILE", requires = "tls_listen")]
    tls_cert_file: Option<PathBuf>,

    /// PEM private key of the TLS listener.
    #[arg(long, env = "PREFETCHER_TLS_KEY_FILE", requires = "tls_listen")]
    tls_key_file: Option<PathBuf>,

    /// PEM file of the CAs https:// origins are verified against, instead of the
    /// system's roots.
    #[arg(long, env = "PREFETCHER_ORIGIN_CA_FILE")]
    origin_ca_file: Option<PathBuf>,

    /// Origin URL (http:// or https://host[:port][/prefix]) for single-tenant mode.
    #[arg(long, env = "PREFETCHER_ORIGIN", conflicts_with = "config")]
    origin: Option<String>,

    /// Tenant id in single-tenant mode.
    #[arg(long, env = "PREFETCHER_TENANT", default_value = "default")]
    tenant: String,

    /// TOML config file mapping hosts to tenants and tenants to origins.
    #[arg(long, env = "PREFETCHER_CONFIG")]
    config: Option<PathBuf>,

    /// Address of the admin listener serving /metrics, /healthz and /readyz.
    #[arg(long, env = "PREFETCHER_ADMIN_LISTEN")]
    admin_listen: Option<SocketAddr>,

    /// Longest a request waits on another request's fill before --on-wait-timeout.
    #[arg(long, env = "PREFETCHER_WAIT_TIMEOUT_MS")]
    wait_timeout_ms: Option<u64>,

    /// What a waiter does after the wait bound: fetch on its own, or answer 504.
    #[arg(long, env = "PREFETCHER_ON_WAIT_TIMEOUT", value_enum)]
    on_wait_timeout: Option<WaitTimeoutPolicy>,

    /// Most concurrent origin fills.
    #[arg(long, env = "PREFETCHER_MAX_FILLS")]
    max_fills: Option<usize>,

    /// L1 cache size in bytes.
    #[arg(long, env = "PREFETCHER_CACHE_BYTES")]
    cache_bytes: Option<u64>,

    /// Freshness lifetime when the origin sends none, in milliseconds (0 = off: only
    /// the origin's headers and the RFC 9111 heuristic apply).
    #[arg(long, env = "PREFETCHER_DEFAULT_TTL_MS")]
    default_ttl_ms: Option<u64>,

    /// XFetch β for probabilistic early refresh (0 = off).
    #[arg(long, env = "PREFETCHER_XFETCH_BETA")]
    xfetch_beta: Option<f64>,

    /// Most concurrent pre-warm fills (the adaptive prefetch limit's ceiling).
    #[arg(long, env = "PREFETCHER_PREFETCH_MAX_FILLS")]
    prefetch_max_fills: Option<usize>,

    /// Kafka bootstrap servers (host:port,...). Without it (and without
    /// `kafka.brokers` in the config) the node uses no Kafka at all: no access events
    /// are published and no pre-warm commands are read.
    #[arg(long, env = "PREFETCHER_BROKERS")]
    brokers: Option<String>,

    /// This node's region: stamped on access events and matched against a pre-warm
    /// command's `regions`. Required with --brokers.
    #[arg(long, env = "PREFETCHER_REGION")]
    region: Option<RegionId>,

    /// This node's id, unique per node: stamped on access events; the pre-warm
    /// consumer group is `prefetcher-{node}`. Required with --brokers.
    #[arg(long, env = "PREFETCHER_NODE")]
    node: Option<NodeId>,

    /// Topic the access events are published to [default: edge-events].
    #[arg(long, env = "PREFETCHER_EVENTS_TOPIC")]
    events_topic: Option<String>,

    /// Topic the pre-warm commands are read from [default: prewarm].
    #[arg(long, env = "PREFETCHER_PREWARM_TOPIC")]
    prewarm_topic: Option<String>,

    /// Worker threads (default: one per core).
    #[arg(long, env = "PREFETCHER_WORKERS")]
    workers: Option<usize>,

    /// Check the configuration as a start would (every field, the TLS certificate and
    /// key, the origin CA file, the tenants' origins, the Kafka properties), binding
    /// no port and connecting to nothing; print one line and exit: 0 when it is
    /// good, 1 naming the bad field.
    #[arg(long)]
    check_config: bool,

    /// How log lines are written to stderr: `text` (coloured on a terminal only) or
    /// `json` (one object per line: timestamp, level, target, message, fields).
    #[arg(long, env = prefetcher::LOG_FORMAT_ENV, value_enum, default_value_t)]
    log_format: LogEncoding,
}

impl Cli {
    /// The config file with the flags over it, not yet checked ([`check_config`]).
    fn config(&self) -> Result<Config, ConfigError> {
        let mut config = match (&self.config, &self.origin) {
            (Some(path), _) => Config::from_file(path)?,
            (None, Some(origin)) => Config::single_origin(
                Config::default().listen,
                TenantId::new(self.tenant.as_str()).map_err(|e| ConfigError::Invalid {
                    field: "--tenant (PREFETCHER_TENANT)".into(),
                    reason: e.to_string(),
                })?,
                origin.clone(),
            ),
            (None, None) => {
                return Err(ConfigError::Invalid {
                    field: "--origin/--config".into(),
                    reason: "give --origin URL or --config FILE (see --help)".into(),
                });
            }
        };
        if let Some(v) = self.listen {
            config.listen = v;
        }
        if let (Some(listen), Some(cert_file), Some(key_file)) =
            (self.tls_listen, &self.tls_cert_file, &self.tls_key_file)
        {
            config.tls = Some(prefetcher::TlsListenConfig {
                listen,
                cert_file: cert_file.clone(),
                key_file: key_file.clone(),
            });
        }
        if let Some(v) = &self.origin_ca_file {
            config.origin.ca_file = Some(v.clone());
        }
        if let Some(v) = self.admin_listen {
            config.admin_listen = Some(v);
        }
        if let Some(v) = self.wait_timeout_ms {
            config.flight.wait_timeout_ms = v;
        }
        if let Some(v) = self.on_wait_timeout {
            config.flight.on_wait_timeout = v;
        }
        if let Some(v) = self.max_fills {
            config.flight.max_fills = v;
            config.flight.reserved_for_user = config.flight.reserved_for_user.min(v / 4);
        }
        if let Some(v) = self.cache_bytes {
            config.cache.max_bytes = v;
            config.cache.max_object_bytes = config.cache.max_object_bytes.min(v);
        }
        if let Some(v) = self.default_ttl_ms {
            config.cache.default_ttl_ms = v;
        }
        if let Some(v) = self.xfetch_beta {
            config.cache.xfetch_beta = v;
        }
        if let Some(v) = self.prefetch_max_fills {
            config.prefetch.max_fills = v;
            config.prefetch.min_fills = config.prefetch.min_fills.min(v);
        }
        if let Some(v) = &self.brokers {
            config.kafka.brokers = Some(v.clone());
        }
        if let Some(v) = &self.region {
            config.region = Some(v.clone());
        }
        if let Some(v) = &self.node {
            config.node = Some(v.clone());
        }
        if let Some(v) = &self.events_topic {
            config.kafka.events_topic = v.clone();
        }
        if let Some(v) = &self.prewarm_topic {
            config.kafka.prewarm_topic = v.clone();
        }
        Ok(config)
    }

    /// What the configuration is called in messages: its file, or the flags.
    fn config_name(&self) -> String {
        match &self.config {
            Some(path) => path.display().to_string(),
            None => "the command-line flags".to_owned(),
        }
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    prefetcher::init_logging(cli.log_format, "prefetcher=info");
    let checked = cli.config().and_then(|config| {
        check_config(&config)?;
        Ok(config)
    });
    if cli.check_config {
        let name = cli.config_name();
        std::process::exit(report_check("prefetcher", &name, &checked));
    }
    let config = checked?;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = cli.workers {
        runtime.worker_threads(n);
    }
    runtime.enable_all().build()?.block_on(run(&cli, config))
}

async fn run(cli: &Cli, config: Config) -> anyhow::Result<()> {
    let tenants = config.tenants.len();
    let handle = spawn_node(config).await?;
    tracing::info!(
        listen = %handle.addr(),
        tls_listen = ?handle.tls_addr(),
        admin = ?handle.admin_addr(),
        tenants,
        kafka = handle.kafka_enabled(),
        "proxy listening"
    );
    until_shutdown(|| {
        // Logged and counted either way; the node goes on serving.
        let _ = match cli.config() {
            Ok(config) => handle.reload(config),
            Err(error) => Err(handle.refuse_reload(error)),
        };
    })
    .await?;
    tracing::info!("shutting down: draining connections, flushing events");
    handle.shutdown().await;
    Ok(())
}
