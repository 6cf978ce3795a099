//! The `prefetcher` command line: an edge caching proxy with single-flight request
//! collapsing.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use models::TenantId;
use prefetcher::{Config, Node, ServeOptions, WaitTimeoutPolicy, admin_app, app, serve};
use tokio::net::TcpListener;
use tokio::sync::watch;

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
/// Flags override the config file; every flag can also be set by its environment
/// variable. Metrics (Prometheus text) are on `--admin-listen` at `/metrics`.
#[derive(Debug, Parser)]
#[command(name = "prefetcher", version)]
struct Cli {
    /// Address the proxy listens on (HTTP/1.1 and h2c).
    #[arg(long, env = "PREFETCHER_LISTEN")]
    listen: Option<SocketAddr>,

    /// Origin URL (http://host[:port][/prefix]) for single-tenant mode.
    #[arg(long, env = "PREFETCHER_ORIGIN", conflicts_with = "config")]
    origin: Option<String>,

    /// Tenant id in single-tenant mode.
    #[arg(long, env = "PREFETCHER_TENANT", default_value = "default")]
    tenant: String,

    /// TOML config file mapping hosts to tenants and tenants to origins.
    #[arg(long, env = "PREFETCHER_CONFIG")]
    config: Option<PathBuf>,

    /// Address of the admin listener serving /metrics and /healthz.
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

    /// TTL when the origin sends none, in milliseconds.
    #[arg(long, env = "PREFETCHER_DEFAULT_TTL_MS")]
    default_ttl_ms: Option<u64>,

    /// XFetch β for probabilistic early refresh (0 = off).
    #[arg(long, env = "PREFETCHER_XFETCH_BETA")]
    xfetch_beta: Option<f64>,

    /// Worker threads (default: one per core).
    #[arg(long, env = "PREFETCHER_WORKERS")]
    workers: Option<usize>,
}

impl Cli {
    fn config(&self) -> anyhow::Result<Config> {
        let mut config = match (&self.config, &self.origin) {
            (Some(path), _) => Config::from_file(path)?,
            (None, Some(origin)) => Config::single_origin(
                Config::default().listen,
                TenantId::new(self.tenant.as_str()).context("--tenant")?,
                origin.clone(),
            ),
            (None, None) => anyhow::bail!("give --origin URL or --config FILE (see --help)"),
        };
        if let Some(v) = self.listen {
            config.listen = v;
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
        config.validate()?;
        Ok(config)
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "prefetcher=info".into()),
        )
        .init();
    let config = cli.config()?;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = cli.workers {
        runtime.worker_threads(n);
    }
    runtime.enable_all().build()?.block_on(run(config))
}

async fn run(config: Config) -> anyhow::Result<()> {
    let node = Node::new(config.clone())?;
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    tracing::info!(listen = %listener.local_addr()?, tenants = config.tenants.len(), "proxy listening");
    // One signal future fanned out to every listener.
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let wait_for = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let mut tasks = Vec::new();
    if let Some(admin) = config.admin_listen {
        let admin_listener = TcpListener::bind(admin)
            .await
            .with_context(|| format!("binding {admin}"))?;
        tracing::info!(listen = %admin_listener.local_addr()?, "admin (/metrics) listening");
        tasks.push(tokio::spawn(serve(
            admin_listener,
            admin_app(node.clone()),
            wait_for(shutdown_rx.clone()),
            ServeOptions::default(),
        )));
    }
    tasks.push(tokio::spawn(serve(
        listener,
        app(node),
        wait_for(shutdown_rx),
        ServeOptions::default(),
    )));
    prefetcher::shutdown_signal().await;
    tracing::info!("shutting down: draining connections");
    let _ = shutdown_tx.send(true);
    for task in tasks {
        let _ = task.await;
    }
    Ok(())
}
