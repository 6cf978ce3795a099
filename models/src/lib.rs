//! Wire types shared by `pulse` and `prefetcher`: what travels over Kafka and how it
//! is checked.
//!
//! Every value that crosses a process boundary is untrusted. The identifiers here are
//! validated newtypes, so an invalid tenant, key, region or node cannot be
//! constructed, and the codec rejects malformed or oversized input with a
//! [`DecodeError`] that names what is wrong.
//!
//! ```
//! use models::{decode, encode, AccessEvent};
//!
//! let line = br#"{"v":1,"ts_ms":1764470000000,"tenant":"acme","key":"/img/logo.png",
//!   "region":"eu-west","node":"edge-1","outcome":"miss","bytes":5120,"fill_ms":42}"#;
//! let event: AccessEvent = decode(line)?;
//! assert_eq!(event.key.as_str(), "/img/logo.png");
//! assert_eq!(decode::<AccessEvent>(&encode(&event))?, event);
//! # Ok::<(), models::DecodeError>(())
//! ```
//!
//! # Layout
//! - `ids`: [`TenantId`], [`CacheKey`], [`RegionId`], [`NodeId`], [`Domain`], and
//!   their borrowed twins ([`TenantRef`], [`CacheKeyRef`], …) for zero-copy decoding.
//! - `event`: [`AccessEvent`], its [`Outcome`] and the [`EdgeKind`] that sent it
//!   (edge → pulse), and the borrowed [`AccessEventRef`].
//! - `command`: [`PrewarmCommand`] (pulse → prefetcher) and the gate budget
//!   [`CommandClass`] it is charged to.
//! - `purge`: [`PurgeCommand`] (pulse → prefetcher, on the pre-warm topic), told
//!   apart from a pre-warm by [`command_kind`].
//! - `codec`: the JSON codec ([`encode`], [`decode`], and [`decode_event_ref`] and
//!   [`encode_event_into`] that copy no string), its [`DecodeError`] and their
//!   [`DecodeReason`]s.
//! - `signature`: pre-warm command signatures: [`SigningKeys`] (key id → secret, from
//!   a key file's text), the [`Signer`] and [`SigningKeys::verify`], HMAC-SHA256 over
//!   the exact payload, carried in the [`SIGNATURE_HEADER`] message header.
//! - `topic`: the default topic names ([`EVENTS_TOPIC`], [`PREWARM_TOPIC`]) and the
//!   message-key rule ([`message_key`]).

mod codec;
mod command;
mod compact;
pub use compact::STRING_STOP;
mod event;
mod ids;
mod purge;
mod signature;
mod topic;

pub use codec::{
    DecodeError, DecodeReason, Wire, decode, decode_event_ref, encode, encode_event_into,
};
pub use command::MAX_COMMAND_ID_LEN;
pub use command::{
    CommandClass, FeatureContribution, PrewarmCommand, Priority, Reason, RegionTargets,
};
pub use event::{AccessEvent, AccessEventRef, EdgeKind, Outcome};
pub use ids::{
    CacheKey, CacheKeyRef, Domain, DomainRef, IdError, MAX_DOMAIN_LEN, MAX_ID_LEN, MAX_KEY_LEN,
    NodeId, NodeRef, RegionId, RegionRef, TenantId, TenantRef, is_topic_name,
};
pub use purge::{
    CommandKind, MAX_PURGE_PREFIX_LEN, MAX_PURGE_TAG_LEN, MAX_REWARM_WINDOW_MS, PurgeCommand,
    PurgeMode, check_prefix, check_tag, command_kind,
};

pub use signature::{
    KeyFileError, MAX_KEY_BYTES, MAX_KEY_ID_LEN, MIN_KEY_BYTES, SIGNATURE_HEADER, SignatureError,
    Signer, SigningKeys, is_key_id,
};
pub use topic::{EVENTS_TOPIC, PREWARM_TOPIC, message_key, write_message_key};

/// The schema version this build writes and accepts.
pub const SCHEMA_VERSION: u16 = 1;
