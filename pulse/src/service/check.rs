//! [`check_config`]: everything [`start`](super::start) checks before it runs
//! anything, without starting anything (`pulse serve --check-config`).

use super::{PulseConfig, PulseConfigError, StartError, allowed_tenants, load_model, restore};
use crate::kafka::KafkaClients;

/// Checks `config` as [`start`](super::start) would: every field
/// ([`PulseConfig::validate`]), the librdkafka properties as librdkafka reads them,
/// the tenants file, the model file (with prediction on) and the checkpoint file
/// (its folder exists; a checkpoint there is readable). Starts no broker, binds no
/// port, connects to nothing. The error names the field.
pub fn check_config(config: &PulseConfig) -> Result<(), StartError> {
    config.validate()?;
    let kafka = KafkaClients::new(config.brokers.clone().unwrap_or_default())
        .with_properties(config.kafka_properties.clone())
        .map_err(|e| kafka_properties(e.to_string()))?;
    kafka
        .config(&[])
        .create_native_config()
        .map_err(|e| kafka_properties(e.to_string()))?;
    allowed_tenants(config)?;
    if config.prewarm {
        load_model(config)?;
    }
    if let Some(path) = &config.checkpoint {
        let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
        if let Some(folder) = folder
            && !folder.is_dir()
        {
            return Err(StartError::Config(PulseConfigError {
                field: "checkpoint",
                reason: format!("its folder {} does not exist", folder.display()),
            }));
        }
        restore(config)?;
    }
    Ok(())
}

fn kafka_properties(reason: String) -> StartError {
    StartError::Config(PulseConfigError {
        field: "kafka_properties",
        reason,
    })
}
