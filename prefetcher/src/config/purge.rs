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
    /// Most re-warm fills in flight on this node, all purges together (1 to 1000): a
    /// purge's re-warm adds at most this many fills to what the origin (or shield)
    /// sees, whatever its window; past it a key waits for a free slot. Like nginx's
    /// cache loader, one at a time by default.
    pub rewarm_concurrency: usize,
}

impl Default for PurgeConfig {
    fn default() -> Self {
        PurgeConfig {
            token_file: None,
            max_rewarm_urls: 10_000,
            behind_shield: false,
            rewarm_concurrency: 1,
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
        if !(1..=1_000).contains(&self.rewarm_concurrency) {
            return Err(invalid(
                "purge.rewarm_concurrency",
                format!("{}: must be in 1..=1000", self.rewarm_concurrency),
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
