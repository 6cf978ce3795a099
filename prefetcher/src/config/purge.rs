//! `[purge]`: who may purge this node from its admin listener, and how much a purge
//! may re-warm (`crate::purge`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Result, invalid};

/// Most URLs one purge may re-warm, whatever the configuration says.
const MAX_REWARM_URLS: usize = 100_000;

/// Purges: the admin endpoint's token and the re-warm bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PurgeConfig {
    /// A file whose first line is the bearer token `POST /purge` needs on the admin
    /// listener; none: the endpoint is off (purge commands from pulse still apply).
    pub token_file: Option<PathBuf>,
    /// Most URLs a purge re-warms (and, when soft, marks stale); the URLs past it are
    /// removed and left to the next request.
    pub max_rewarm_urls: usize,
    /// This node fills from a regional shield (another edge-pulse node that gets the
    /// same purges): it re-warms in the window after the shield's, so the shield
    /// refills each key first and this node then finds it there.
    pub behind_shield: bool,
}

impl Default for PurgeConfig {
    fn default() -> Self {
        PurgeConfig {
            token_file: None,
            max_rewarm_urls: 10_000,
            behind_shield: false,
        }
    }
}

impl PurgeConfig {
    /// Checks every field; the error names it (`purge.<field>`).
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_REWARM_URLS).contains(&self.max_rewarm_urls) {
            return Err(invalid(
                "purge.max_rewarm_urls",
                format!("{}: must be in 1..={MAX_REWARM_URLS}", self.max_rewarm_urls),
            ));
        }
        Ok(())
    }

    /// The token `POST /purge` needs, read from `token_file` (its first line,
    /// trimmed); an unreadable or empty file is an error naming the field.
    pub fn token(&self) -> Result<Option<String>> {
        let Some(path) = &self.token_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| invalid("purge.token_file", format!("{}: {e}", path.display())))?;
        let token = text.lines().next().unwrap_or_default().trim().to_owned();
        if token.is_empty() {
            return Err(invalid("purge.token_file", "the first line is empty"));
        }
        Ok(Some(token))
    }
}
