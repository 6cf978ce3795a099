//! The `pulse` command line.

use anyhow::Context;
use clap::{Parser, Subcommand};
use pulse::{EVENTS_TOPIC, EmbeddedBroker, PREWARM_TOPIC};

/// Pulse watches edge access events and pre-warms hot keys across regions.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an embedded Kafka broker (librdkafka's mock cluster) on loopback with the
    /// `edge-events` and `prewarm` topics, print its address, and wait for Ctrl-C.
    Broker {
        /// Partitions per topic.
        #[arg(long, default_value_t = 4)]
        partitions: i32,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    match Cli::parse().command {
        Command::Broker { partitions } => {
            let broker = EmbeddedBroker::start(1).context("starting the embedded broker")?;
            for topic in [EVENTS_TOPIC, PREWARM_TOPIC] {
                broker.create_topic(topic, partitions)?;
            }
            println!("{}", broker.bootstrap_servers());
            tracing::info!(
                bootstrap = broker.bootstrap_servers(),
                "embedded broker up; Ctrl-C stops it"
            );
            tokio::signal::ctrl_c().await?;
            tracing::info!("stopping");
        }
    }
    Ok(())
}
