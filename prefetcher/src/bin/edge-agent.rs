//! `edge-agent`: runs beside an nginx or Varnish node so it feeds pulse and takes
//! pre-warms.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use models::{NodeId, RegionId};
use prefetcher::{
    AgentConfig, ConfigError, LogEncoding, LogFormat, check_agent_config, report_check,
    spawn_agent, until_shutdown,
};

/// The edge agent: an nginx or Varnish node as an edge of pulse.
///
/// It follows the node's access log (`--access-log-format nginx_json` with the
/// `log_format` of `prefetcher/deploy/nginx/edge.conf`, or `varnishncsa_json` written by
/// `varnishncsa -j -f prefetcher/deploy/varnish/varnishncsa.format`) and publishes
/// one access event per cacheable request to `kafka.events_topic`: the cache status
/// becomes pulse's outcome by the table in the README (HIT → hit, MISS → miss,
/// STALE/UPDATING → stale, ...; a request carrying the pre-warm marker that filled →
/// prefetch_fill). The tenant comes from the host map in the config, never from the
/// log alone; lines of unmapped hosts are skipped and counted.
///
/// It survives log rotation (rename: the old file is read to its end first;
/// copy-truncate: reading restarts at 0) and keeps its read position in
/// `state_path`, saved every second once the events before it are delivered or
/// counted as dropped, and at shutdown after the flush: after a crash some lines
/// are published again (at-least-once), none silently skipped. Malformed lines are
/// counted and skipped; a slow or absent broker drops and counts events, and never
/// touches the node.
///
/// It reads `kafka.prewarm_topic` with the prefetcher's checks (forged, expired,
/// other-region and unknown-tenant commands refused and counted) and sends each
/// accepted key as a background `GET` to `cache_url` with the tenant's first host
/// and `X-Edge-Pulse-Prewarm: 1`, within an adaptive limit of concurrent pre-warms
/// that shrinks when the node or its origin slows or fails.
///
/// With a `[warmup]` section it asks pulse for its region's hot keyset at start and
/// requests it of the local cache the same way before it reports ready: `/readyz`
/// answers 503 `{"state":"warming",...}` until then (at most `warmup.deadline_ms`),
/// 200 after (docs/warming.md).
///
/// `/metrics` (Prometheus), `/healthz` and `/readyz` are served on `admin_listen`. SIGINT or
/// SIGTERM stops it gracefully: events flushed, read position saved. SIGHUP reads the
/// config file (and these flags) again and puts its `tenants` in force for the next
/// lines and commands; a config that fails the check is refused and the running one
/// kept, other settings are reported as needing a restart
/// (`prefetcher_config_reloads_total` counts both). `--check-config` checks the
/// configuration as a start would, starting nothing, as `nginx -t` does. The agent's
/// own logs go to stderr as text (coloured on a terminal only) or JSON lines
/// (`--log-format json`).
///
/// Config is TOML (see the README's "Edge agent" section); the flags override it, and
/// every flag can also be set by its environment variable.
#[derive(Debug, Parser)]
#[command(name = "edge-agent", version)]
struct Cli {
    /// The TOML config file.
    #[arg(long, env = "EDGE_AGENT_CONFIG")]
    config: PathBuf,

    /// The access log to follow.
    #[arg(long, env = "EDGE_AGENT_LOG_PATH")]
    log_path: Option<PathBuf>,

    /// The access log's format (`log_format` in the config file).
    #[arg(long, env = "EDGE_AGENT_ACCESS_LOG_FORMAT", value_enum)]
    access_log_format: Option<LogFormat>,

    /// Where the read position is kept across restarts.
    #[arg(long, env = "EDGE_AGENT_STATE_PATH")]
    state_path: Option<PathBuf>,

    /// The local cache pre-warms go to (http://host:port).
    #[arg(long, env = "EDGE_AGENT_CACHE_URL")]
    cache_url: Option<String>,

    /// Kafka bootstrap servers.
    #[arg(long, env = "EDGE_AGENT_BROKERS")]
    brokers: Option<String>,

    /// The node's region.
    #[arg(long, env = "EDGE_AGENT_REGION")]
    region: Option<RegionId>,

    /// The node's id.
    #[arg(long, env = "EDGE_AGENT_NODE")]
    node: Option<NodeId>,

    /// Address of the admin listener serving /metrics and /healthz.
    #[arg(long, env = "EDGE_AGENT_ADMIN_LISTEN")]
    admin_listen: Option<SocketAddr>,

    /// Topic the access events go to.
    #[arg(long, env = "EDGE_AGENT_EVENTS_TOPIC")]
    events_topic: Option<String>,

    /// Topic the pre-warm commands come from.
    #[arg(long, env = "EDGE_AGENT_PREWARM_TOPIC")]
    prewarm_topic: Option<String>,

    /// Check the configuration as a start would (every field, the Kafka properties,
    /// the state file's folder), starting nothing and connecting to nothing; print one
    /// line and exit: 0 when it is good, 1 naming the bad field.
    #[arg(long)]
    check_config: bool,

    /// How the agent's own log lines are written to stderr: `text` (coloured on a
    /// terminal only) or `json` (one object per line: timestamp, level, target,
    /// message, fields). Not the access log's format: that is --access-log-format.
    #[arg(long, env = prefetcher::LOG_FORMAT_ENV, value_enum, default_value_t)]
    log_format: LogEncoding,
}

impl Cli {
    /// The config file with the flags over it, not yet checked.
    fn config(&self) -> Result<AgentConfig, ConfigError> {
        let mut config = AgentConfig::from_file(&self.config)?;
        if let Some(v) = &self.log_path {
            config.log_path = v.clone();
        }
        if let Some(v) = self.access_log_format {
            config.log_format = v;
        }
        if let Some(v) = &self.state_path {
            config.state_path = v.clone();
        }
        if let Some(v) = &self.cache_url {
            config.cache_url = v.clone();
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
        if let Some(v) = self.admin_listen {
            config.admin_listen = Some(v);
        }
        if let Some(v) = &self.events_topic {
            config.kafka.events_topic = v.clone();
        }
        if let Some(v) = &self.prewarm_topic {
            config.kafka.prewarm_topic = v.clone();
        }
        Ok(config)
    }
}

/// The variable the access log's format had before `--log-format` meant the agent's
/// own logs: refused with the new name rather than silently ignored.
const RENAMED_ENV: &str = "EDGE_AGENT_LOG_FORMAT";

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if std::env::var_os(RENAMED_ENV).is_some() {
        anyhow::bail!(
            "{RENAMED_ENV} is now EDGE_AGENT_ACCESS_LOG_FORMAT (the access log's format); \
             {} sets the agent's own log format",
            prefetcher::LOG_FORMAT_ENV
        );
    }
    // The library's lines and this binary's own (its target is `edge_agent`).
    prefetcher::init_logging(cli.log_format, "prefetcher=info,edge_agent=info");
    let checked = cli.config().and_then(|config| {
        check_agent_config(&config)?;
        Ok(config)
    });
    if cli.check_config {
        let name = cli.config.display().to_string();
        std::process::exit(report_check("edge-agent", &name, &checked));
    }
    let config = checked.context("invalid configuration")?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(async {
            let handle = spawn_agent(config).await?;
            tracing::info!(admin = ?handle.admin_addr(), "edge agent running");
            until_shutdown(|| {
                // Logged and counted either way; the agent goes on.
                let _ = match cli.config() {
                    Ok(config) => handle.reload(config),
                    Err(error) => Err(handle.refuse_reload(error)),
                };
            })
            .await?;
            tracing::info!("shutting down: flushing events, saving the read position");
            let position = handle.shutdown().await;
            tracing::info!(inode = position.inode, offset = position.offset, "stopped");
            Ok(())
        })
}
