//! What pulse tells edge nodes to invalidate: a [`PurgeCommand`], on the same topic
//! and under the same signature as the pre-warm commands.
//!
//! The two kinds share the topic, so a reader must tell them apart before it decodes
//! one: [`command_kind`] reads the `kind` field (absent: a pre-warm). A purge carries
//! no `key`, `confidence`, `priority` nor `reason`, so a reader that predates purges
//! refuses it as an invalid pre-warm (counted, never acted on) instead of misreading it.

use serde::{Deserialize, Serialize};

use crate::SCHEMA_VERSION;
use crate::command::{MAX_COMMAND_ID_LEN, RegionTargets};
use crate::ids::{CacheKey, TenantId};

/// Longest purge prefix, in bytes: half a cache key's limit, so a prefix always
/// names something shorter than the keys it removes.
pub const MAX_PURGE_PREFIX_LEN: usize = 1024;

/// Longest purge tag, in bytes.
pub const MAX_PURGE_TAG_LEN: usize = 128;

/// Longest re-warm window a purge may ask for, in milliseconds (one hour).
pub const MAX_REWARM_WINDOW_MS: u64 = 3_600_000;

/// Which command a message on the command topic is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandKind {
    /// A [`crate::PrewarmCommand`]: the field is absent on every pre-warm.
    #[default]
    Prewarm,
    /// A [`PurgeCommand`].
    Purge,
}

/// The largest command on the topic (a pre-warm's limit): past it nothing is read.
const PEEK_LIMIT: usize = 16 * 1024;

/// The kind of the command in `bytes`: its `kind` field, a pre-warm when absent or
/// when the bytes are not an object (the pre-warm decoder then says what is wrong).
pub fn command_kind(bytes: &[u8]) -> CommandKind {
    #[derive(Deserialize)]
    struct Peek {
        #[serde(default)]
        kind: CommandKind,
    }
    if bytes.len() > PEEK_LIMIT {
        return CommandKind::Prewarm;
    }
    serde_json::from_slice::<Peek>(bytes).map_or(CommandKind::Prewarm, |p| p.kind)
}

/// How a purge treats the entries it matches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PurgeMode {
    /// Removed: the next request is a miss.
    #[default]
    Hard,
    /// Marked stale: served stale (`x-cache: STALE`) until its re-warm, at most
    /// `rewarm_window_ms` after the purge, then revalidated.
    Soft,
}

/// An invalidation of every key of `tenant` starting with `prefix`, on the nodes of
/// `regions`; with `rewarm_window_ms`, each node refills what it removed at background
/// priority, spread over that window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurgeCommand {
    /// Schema version; this build writes and accepts [`SCHEMA_VERSION`].
    pub v: u16,
    /// Always [`CommandKind::Purge`].
    pub kind: CommandKind,
    /// Unique id of this command.
    pub id: String,
    /// The tenant whose keys go.
    pub tenant: TenantId,
    /// Every key starting with it goes (`/` is the whole tenant).
    pub prefix: CacheKey,
    /// Only the keys under `prefix` whose stored response carries this tag (in its
    /// `Surrogate-Key` or `Cache-Tag` header, as Fastly and Cloudflare read them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Hard (removed) or soft (stale until re-warmed).
    #[serde(default)]
    pub mode: PurgeMode,
    /// With it, the keys removed are re-warmed at background priority, each at a
    /// random instant of this many milliseconds after the purge.
    #[serde(default)]
    pub rewarm_window_ms: Option<u64>,
    /// When pulse issued the command, in milliseconds since the Unix epoch.
    pub issued_at_ms: u64,
    /// After this instant nodes drop the command unexecuted.
    pub expires_at_ms: u64,
    /// The regions whose nodes purge.
    pub regions: RegionTargets,
}

impl PurgeCommand {
    /// Largest accepted encoding, in bytes: a prefix, ids and a few dozen regions.
    pub const MAX_BYTES: usize = 4 * 1024;

    /// A purge issued at `issued_at_ms`, valid for `ttl_ms`.
    pub fn new(
        id: String,
        tenant: TenantId,
        prefix: CacheKey,
        issued_at_ms: u64,
        ttl_ms: u64,
        regions: RegionTargets,
    ) -> PurgeCommand {
        PurgeCommand {
            v: SCHEMA_VERSION,
            kind: CommandKind::Purge,
            id,
            tenant,
            prefix,
            tag: None,
            mode: PurgeMode::Hard,
            rewarm_window_ms: None,
            issued_at_ms,
            expires_at_ms: issued_at_ms.saturating_add(ttl_ms.max(1)),
            regions,
        }
    }

    /// Checks the rules that span fields or that types cannot hold.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.kind != CommandKind::Purge {
            return Err("kind: must be \"purge\"".into());
        }
        if self.id.is_empty() || self.id.len() > MAX_COMMAND_ID_LEN {
            return Err(format!("id: must be 1-{MAX_COMMAND_ID_LEN} bytes"));
        }
        check_prefix(self.prefix.as_str())?;
        if let Some(tag) = &self.tag {
            check_tag(tag)?;
        }
        if let Some(w) = self.rewarm_window_ms
            && !(1..=MAX_REWARM_WINDOW_MS).contains(&w)
        {
            return Err(format!(
                "rewarm_window_ms: {w} is outside 1..={MAX_REWARM_WINDOW_MS}"
            ));
        }
        if self.expires_at_ms <= self.issued_at_ms {
            return Err("expires_at_ms: must be after issued_at_ms".into());
        }
        if matches!(&self.regions, RegionTargets::Only(r) if r.is_empty()) {
            return Err("regions: an empty list targets nobody; use \"all\"".into());
        }
        Ok(())
    }

    /// Whether the command has expired at `now_ms`.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        now_ms >= self.expires_at_ms
    }

    /// The Kafka message key: `tenant/prefix`.
    pub fn partition_key(&self) -> String {
        crate::topic::message_key(self.tenant.as_str(), self.prefix.as_str())
    }
}

/// The rules of a purge prefix beyond a cache key's: at most
/// [`MAX_PURGE_PREFIX_LEN`] bytes. The message starts with the field name.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.len() > MAX_PURGE_PREFIX_LEN {
        return Err(format!(
            "prefix: {} bytes, longer than {MAX_PURGE_PREFIX_LEN}",
            prefix.len()
        ));
    }
    Ok(())
}

/// The rules of a purge tag: 1 to [`MAX_PURGE_TAG_LEN`] bytes of visible ASCII but
/// `,` (the separators of `Surrogate-Key` and `Cache-Tag`). The message starts with
/// the field name.
pub fn check_tag(tag: &str) -> Result<(), String> {
    if tag.is_empty() || tag.len() > MAX_PURGE_TAG_LEN {
        return Err(format!("tag: must be 1-{MAX_PURGE_TAG_LEN} bytes"));
    }
    if !tag.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
        return Err("tag: visible ASCII only, no space nor comma".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{DecodeReason, decode, encode};
    use crate::command::PrewarmCommand;

    fn purge() -> PurgeCommand {
        let mut p = PurgeCommand::new(
            "pg-1".into(),
            TenantId::new("acme").unwrap(),
            CacheKey::new("/assets/").unwrap(),
            1_000,
            60_000,
            RegionTargets::All,
        );
        p.mode = PurgeMode::Soft;
        p.rewarm_window_ms = Some(10_000);
        p
    }

    /// A purge goes round the codec, and its kind is read before it is decoded.
    #[test]
    fn a_purge_round_trips_and_says_its_kind() {
        let bytes = encode(&purge());
        assert_eq!(decode::<PurgeCommand>(&bytes).unwrap(), purge());
        assert_eq!(command_kind(&bytes), CommandKind::Purge);
        assert_eq!(
            command_kind(br#"{"v":1,"id":"pw-1"}"#),
            CommandKind::Prewarm
        );
        assert_eq!(command_kind(b"not json"), CommandKind::Prewarm);
    }

    /// A reader that knows only pre-warms refuses a purge as an invalid command: it is
    /// never read as a pre-warm of some key.
    #[test]
    fn an_old_reader_refuses_a_purge() {
        let err = decode::<PrewarmCommand>(&encode(&purge())).unwrap_err();
        assert_eq!(err.kind(), DecodeReason::InvalidField, "{err}");
    }

    /// The prefix, the tag, the window and the size are bounded; each refusal names
    /// its field.
    #[test]
    fn a_purge_is_bounded() {
        let mut long = purge();
        long.prefix = CacheKey::new(format!("/{}", "a".repeat(MAX_PURGE_PREFIX_LEN))).unwrap();
        let err = decode::<PurgeCommand>(&encode(&long)).unwrap_err();
        assert!(err.to_string().contains("prefix:"), "{err}");
        let mut slow = purge();
        slow.rewarm_window_ms = Some(MAX_REWARM_WINDOW_MS + 1);
        let err = decode::<PurgeCommand>(&encode(&slow)).unwrap_err();
        assert!(err.to_string().contains("rewarm_window_ms:"), "{err}");
        let mut wide = purge();
        wide.regions = RegionTargets::Only(
            (0..400)
                .map(|i| crate::ids::RegionId::new(format!("region-{i:04}")).unwrap())
                .collect(),
        );
        let err = decode::<PurgeCommand>(&encode(&wide)).unwrap_err();
        assert_eq!(err.kind(), DecodeReason::TooLarge);
        for bad in ["", "a b", "a,b", &"t".repeat(MAX_PURGE_TAG_LEN + 1)] {
            let mut tagged = purge();
            tagged.tag = Some(bad.to_owned());
            let err = decode::<PurgeCommand>(&encode(&tagged)).unwrap_err();
            assert!(err.to_string().contains("tag:"), "{bad:?}: {err}");
        }
        let mut tagged = purge();
        tagged.tag = Some("product-42".into());
        assert_eq!(decode::<PurgeCommand>(&encode(&tagged)).unwrap(), tagged);
        let mut extra = serde_json::to_value(purge()).unwrap();
        extra["key"] = "/x".into();
        assert!(decode::<PurgeCommand>(&serde_json::to_vec(&extra).unwrap()).is_err());
    }
}
