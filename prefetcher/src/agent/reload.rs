//! The agent's configuration checked as a start would check it
//! ([`check_agent_config`], `edge-agent --check-config`), and a new one put in force
//! in a running agent ([`AgentHandle::reload`](super::AgentHandle::reload), SIGHUP).
//!
//! A reload can change `tenants`: the host map the next log lines are mapped with,
//! and the tenants (and `Host`s) the next pre-warm commands are checked against. A
//! line or a command being handled finishes with the map it started with. Every other
//! setting needs a restart: reported, and kept as it runs. A configuration that fails
//! the check is refused, and the running one stays.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::config::AgentConfig;
use super::lines::LineMapper;
use super::warm::WarmTargets;
use crate::changes::{Reloaded, differences, log_reloaded, refused};
use crate::config::{ConfigError, invalid};
use crate::metrics::Metrics;
use crate::publisher::check_kafka_properties;

/// Checks `config` as [`spawn_agent`](super::spawn_agent) would before it starts
/// anything: every field ([`AgentConfig::validate`]), the librdkafka properties, and
/// that the folder of `state_path` exists. Binds no port and connects to nothing; the
/// error names the field.
pub fn check_agent_config(config: &AgentConfig) -> Result<(), ConfigError> {
    config.validate()?;
    check_kafka_properties(&config.kafka)?;
    let folder = config
        .state_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty());
    if let Some(folder) = folder
        && !folder.is_dir()
    {
        return Err(invalid(
            "state_path",
            format!("its folder {} does not exist", folder.display()),
        ));
    }
    Ok(())
}

/// What a reload replaces in a running agent, and the configuration in force.
pub(super) struct AgentReload {
    pub(super) running: Mutex<AgentConfig>,
    pub(super) mapper: Arc<ArcSwap<LineMapper>>,
    pub(super) targets: Arc<ArcSwap<WarmTargets>>,
    pub(super) metrics: Arc<Metrics>,
}

impl AgentReload {
    /// Puts `wanted`'s tenants in force, or refuses it; counted and logged.
    pub(super) fn reload(&self, wanted: AgentConfig) -> Result<Reloaded, ConfigError> {
        if let Err(error) = check_agent_config(&wanted) {
            return Err(refused(&self.metrics, error));
        }
        // One reload at a time: a short section, never held across an await.
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = running.clone();
        next.tenants = wanted.tenants.clone();
        let reloaded = Reloaded {
            applied: differences(&*running, &next),
            needs_restart: differences(&next, &wanted),
        };
        self.mapper.store(Arc::new(LineMapper::new(&next)));
        self.targets.store(Arc::new(WarmTargets::new(&next)));
        *running = next;
        self.metrics.config_reloads_ok.inc();
        log_reloaded(&reloaded);
        Ok(reloaded)
    }

    /// Counts and logs a reload refused before it could start.
    pub(super) fn refuse(&self, error: ConfigError) -> ConfigError {
        refused(&self.metrics, error)
    }
}
