//! The JSON codec: one JSON object per Kafka message, so kcat and any other producer
//! can speak it. Unknown fields are ignored (a newer minor producer stays readable);
//! everything else that is wrong is an error that says what.

use serde::{Serialize, de::DeserializeOwned};

use crate::SCHEMA_VERSION;
use crate::command::PrewarmCommand;
use crate::event::{AccessEvent, AccessEventRef};
use crate::purge::PurgeCommand;

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The message is larger than the type allows.
    #[error("message is {len} bytes, larger than the {max}-byte limit")]
    TooLarge {
        /// The message length.
        len: usize,
        /// The limit for this message type.
        max: usize,
    },
    /// The bytes are not a JSON object (syntax error, truncation, not UTF-8).
    #[error("malformed JSON: {0}")]
    Malformed(String),
    /// The JSON is well formed but a field is missing, mistyped or invalid.
    #[error("invalid field: {0}")]
    InvalidField(String),
    /// The message carries a schema version this build does not speak.
    #[error("unsupported schema version {found} (this build speaks {SCHEMA_VERSION})")]
    UnsupportedVersion {
        /// The version in the message.
        found: u16,
    },
}

impl DecodeError {
    /// Which kind of error this is, without its details.
    pub fn kind(&self) -> DecodeReason {
        match self {
            DecodeError::TooLarge { .. } => DecodeReason::TooLarge,
            DecodeError::Malformed(_) => DecodeReason::Malformed,
            DecodeError::InvalidField(_) => DecodeReason::InvalidField,
            DecodeError::UnsupportedVersion { .. } => DecodeReason::UnsupportedVersion,
        }
    }

    /// A short stable name for the metric label `reason`: [`DecodeReason::as_str`].
    pub fn reason(&self) -> &'static str {
        self.kind().as_str()
    }
}

/// The kinds of [`DecodeError`], one per variant: what a consumer counts refused
/// messages by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecodeReason {
    /// [`DecodeError::TooLarge`].
    TooLarge,
    /// [`DecodeError::Malformed`].
    Malformed,
    /// [`DecodeError::InvalidField`].
    InvalidField,
    /// [`DecodeError::UnsupportedVersion`].
    UnsupportedVersion,
}

impl DecodeReason {
    /// Every kind, in declaration order (for metrics that list all of them).
    pub const ALL: [DecodeReason; 4] = [
        DecodeReason::TooLarge,
        DecodeReason::Malformed,
        DecodeReason::InvalidField,
        DecodeReason::UnsupportedVersion,
    ];

    /// The metric label (and dead-letter header) value.
    pub fn as_str(self) -> &'static str {
        match self {
            DecodeReason::TooLarge => "too_large",
            DecodeReason::Malformed => "malformed",
            DecodeReason::InvalidField => "invalid_field",
            DecodeReason::UnsupportedVersion => "unsupported_version",
        }
    }
}

/// A message type carried on a topic: its size limit and its cross-field rules.
pub trait Wire: Serialize + DeserializeOwned {
    /// Largest accepted encoding, in bytes.
    const MAX_BYTES: usize;
    /// How much longer than its input the canonical encoding of an accepted message
    /// can be (defaults filled in, `0` written `0.0`). [`decode`] checks the canonical
    /// size only for inputs within this of the limit; the default checks every one.
    const CANONICAL_SLACK: usize = Self::MAX_BYTES;
    /// The message's schema version.
    fn version(&self) -> u16;
    /// Rules that span fields; the message names the field.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

impl Wire for AccessEvent {
    // A 2 KiB key plus ids and numbers fits easily; anything bigger is not ours.
    const MAX_BYTES: usize = 4 * 1024;
    // Only an absent `bytes` (`,"bytes":0`) and an unknown edge kind (`""` becomes
    // `"other"`) grow: keep the hot path free of a re-encode.
    const CANONICAL_SLACK: usize = 64;
    fn version(&self) -> u16 {
        self.v
    }
}

impl Wire for PrewarmCommand {
    // Room for a 2 KiB key, a few dozen regions and the feature breakdown.
    const MAX_BYTES: usize = 16 * 1024;
    fn version(&self) -> u16 {
        self.v
    }
    fn check(&self) -> Result<(), String> {
        PrewarmCommand::check(self)
    }
}

impl Wire for PurgeCommand {
    const MAX_BYTES: usize = PurgeCommand::MAX_BYTES;
    fn version(&self) -> u16 {
        self.v
    }
    fn check(&self) -> Result<(), String> {
        PurgeCommand::check(self)
    }
}

/// Encodes a message as one line of compact JSON.
pub fn encode<T: Wire>(message: &T) -> Vec<u8> {
    // Serialising these types cannot fail: every field is a string, number or list.
    serde_json::to_vec(message).expect("wire types always serialise")
}

/// Decodes and validates one message; never panics, whatever the bytes.
pub fn decode<T: Wire>(bytes: &[u8]) -> Result<T, DecodeError> {
    if bytes.len() > T::MAX_BYTES {
        return Err(DecodeError::TooLarge {
            len: bytes.len(),
            max: T::MAX_BYTES,
        });
    }
    refuse_array(bytes)?;
    let message: T = serde_json::from_slice(bytes).map_err(classify)?;
    if message.version() != SCHEMA_VERSION {
        return Err(DecodeError::UnsupportedVersion {
            found: message.version(),
        });
    }
    message.check().map_err(DecodeError::InvalidField)?;
    // The limit holds for the canonical encoding too, so whatever is accepted can be
    // re-encoded and forwarded (found by fuzzing: a 16 377-byte command of `0`s re-encoded
    // to 17 891 bytes, which `decode` then refused).
    if bytes.len() + T::CANONICAL_SLACK > T::MAX_BYTES {
        let len = encode(&message).len();
        if len > T::MAX_BYTES {
            return Err(DecodeError::TooLarge {
                len,
                max: T::MAX_BYTES,
            });
        }
    }
    Ok(message)
}

/// Appends one [`AccessEvent`], given borrowed, to `out`: exactly the bytes
/// [`encode`] writes for the owned event, without building it or going through serde.
/// The per-event path of producers that stamp many events (the edge agent), which
/// reuse one buffer.
///
/// ```
/// use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId, encode, encode_event_into};
///
/// let event = AccessEvent::new(5, TenantId::new("acme")?, CacheKey::new("/a.js")?,
///     RegionId::new("eu")?, NodeId::new("n1")?, Outcome::Hit);
/// let mut out = Vec::new();
/// encode_event_into(&event.borrowed(), &mut out);
/// assert_eq!(out, encode(&event));
/// # Ok::<(), models::IdError>(())
/// ```
pub fn encode_event_into(event: &AccessEventRef<'_>, out: &mut Vec<u8>) {
    crate::compact::write(event, out);
}

/// Decodes and validates one [`AccessEvent`] without copying its strings: the
/// per-message path of pulse. It accepts and refuses exactly what
/// `decode::<AccessEvent>` does, with the same errors; the compact shape producers
/// write (no whitespace, no escapes, only the event's fields) is read by a
/// hand-written reader, about three times faster than serde_json.
///
/// ```
/// use models::{AccessEvent, decode, decode_event_ref};
///
/// let line = br#"{"v":1,"ts_ms":5,"tenant":"acme","key":"/a.js","region":"eu","node":"n1","outcome":"miss"}"#;
/// let event = decode_event_ref(line)?;
/// assert_eq!(event.key.as_str(), "/a.js");
/// assert_eq!(event.to_owned_event(), decode::<AccessEvent>(line)?);
/// # Ok::<(), models::DecodeError>(())
/// ```
pub fn decode_event_ref(bytes: &[u8]) -> Result<AccessEventRef<'_>, DecodeError> {
    if bytes.len() > AccessEvent::MAX_BYTES {
        return Err(DecodeError::TooLarge {
            len: bytes.len(),
            max: AccessEvent::MAX_BYTES,
        });
    }
    // The shape producers write takes the hand-written reader; anything else, and
    // every error, is serde's.
    if let Some(event) = crate::compact::parse(bytes) {
        return Ok(event);
    }
    refuse_array(bytes)?;
    let event: AccessEventRef<'_> = serde_json::from_slice(bytes).map_err(classify)?;
    if event.v != SCHEMA_VERSION {
        return Err(DecodeError::UnsupportedVersion { found: event.v });
    }
    // `AccessEvent` has no cross-field rule (`Wire::check` is the default).
    Ok(event)
}

/// serde reads a struct from a JSON array of its fields in order too; a message is
/// one JSON object, so an array is refused before serde sees it (found by fuzzing,
/// where the owned and the borrowed decoder worded a short array's error differently).
fn refuse_array(bytes: &[u8]) -> Result<(), DecodeError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => Err(DecodeError::InvalidField(
            "expected a JSON object, found an array".into(),
        )),
        _ => Ok(()),
    }
}

fn classify(e: serde_json::Error) -> DecodeError {
    use serde_json::error::Category;
    match e.classify() {
        Category::Data => DecodeError::InvalidField(e.to_string()),
        Category::Syntax | Category::Eof | Category::Io => DecodeError::Malformed(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::command::{CommandClass, FeatureContribution, Priority, Reason, RegionTargets};
    use crate::event::{EdgeKind, Outcome};
    use crate::ids::{CacheKey, Domain, NodeId, RegionId, TenantId};

    /// One error of each variant gives each reason of `ALL`, in order, with the
    /// labels metrics and dead-letter headers have always used.
    #[test]
    fn each_decode_error_has_its_reason_label() {
        let errors = [
            DecodeError::TooLarge { len: 2, max: 1 },
            DecodeError::Malformed("x".into()),
            DecodeError::InvalidField("x".into()),
            DecodeError::UnsupportedVersion { found: 9 },
        ];
        let kinds: Vec<DecodeReason> = errors.iter().map(DecodeError::kind).collect();
        assert_eq!(kinds, DecodeReason::ALL);
        let labels: Vec<&str> = errors.iter().map(DecodeError::reason).collect();
        assert_eq!(
            labels,
            [
                "too_large",
                "malformed",
                "invalid_field",
                "unsupported_version"
            ]
        );
    }

    fn event() -> AccessEvent {
        let mut e = AccessEvent::new(
            1_764_470_000_000,
            TenantId::new("acme").unwrap(),
            CacheKey::new("/img/logo.png?v=2").unwrap(),
            RegionId::new("eu-west").unwrap(),
            NodeId::new("edge-1").unwrap(),
            Outcome::Miss,
        );
        e.referrer = Some(Domain::new("news.example.com").unwrap());
        e.bytes = 5120;
        e.fill_ms = Some(42);
        e
    }

    fn command() -> PrewarmCommand {
        PrewarmCommand::new(
            "c-1".into(),
            TenantId::new("acme").unwrap(),
            CacheKey::new("/live/score.json").unwrap(),
            0.91,
            1_000,
            31_000,
            RegionTargets::Only(vec![RegionId::new("ap-south").unwrap()]),
            Reason {
                model: "default-1".into(),
                intercept: -0.2,
                features: vec![FeatureContribution {
                    name: "velocity_200ms".into(),
                    value: 250.0,
                    contribution: 0.7,
                }],
            },
        )
    }

    #[test]
    fn event_round_trips() {
        let e = event();
        assert_eq!(decode::<AccessEvent>(&encode(&e)).unwrap(), e);
    }

    #[test]
    fn command_round_trips_with_both_target_forms() {
        let mut c = command();
        assert_eq!(decode::<PrewarmCommand>(&encode(&c)).unwrap(), c);
        c.regions = RegionTargets::All;
        let bytes = encode(&c);
        assert!(String::from_utf8_lossy(&bytes).contains(r#""regions":"all""#));
        assert_eq!(decode::<PrewarmCommand>(&bytes).unwrap(), c);
        assert_eq!(c.priority, Priority::Background);
    }

    /// The class is typed on the wire; a command without it (an older pulse) is a
    /// prediction.
    #[test]
    fn command_class_travels_and_defaults_to_prediction() {
        let mut c = command();
        c.class = CommandClass::Warm;
        let bytes = encode(&c);
        assert!(String::from_utf8_lossy(&bytes).contains(r#""class":"warm""#));
        assert_eq!(decode::<PrewarmCommand>(&bytes).unwrap(), c);
        let text = String::from_utf8_lossy(&bytes).replace(r#","class":"warm""#, "");
        let old: PrewarmCommand = decode(text.as_bytes()).unwrap();
        assert_eq!(old.class, CommandClass::Prediction);
        let bad = String::from_utf8_lossy(&bytes).replace(r#""warm""#, r#""launch""#);
        assert!(decode::<PrewarmCommand>(bad.as_bytes()).is_err());
    }

    #[test]
    fn minimal_kcat_line_decodes_with_defaults() {
        let line = br#"{"v":1,"ts_ms":5,"tenant":"t","key":"/k","region":"r","node":"n","outcome":"hit","extra":true}"#;
        let e: AccessEvent = decode(line).unwrap();
        assert_eq!(
            (e.bytes, e.referrer, e.fill_ms, e.edge),
            (0, None, None, None)
        );
    }

    /// The edge kind is optional and written only when known; each kind's name reads
    /// back as itself, and `null` is "not said".
    #[test]
    fn edge_kinds_round_trip_by_name() {
        let mut e = event();
        assert!(
            !String::from_utf8(encode(&e))
                .unwrap()
                .contains(r#""edge":"#)
        );
        for kind in EdgeKind::ALL {
            e.edge = Some(kind);
            let bytes = encode(&e);
            let name = format!(r#""edge":"{}""#, kind.as_str());
            assert!(String::from_utf8_lossy(&bytes).contains(&name), "{name}");
            assert_eq!(decode::<AccessEvent>(&bytes).unwrap(), e);
            assert_eq!(EdgeKind::from_name(kind.as_str()), kind);
        }
        let null = decode::<AccessEvent>(&event_json_with("edge", serde_json::Value::Null));
        assert_eq!(null.unwrap().edge, None);
    }

    /// A newer producer's edge kind is read as `other`, not refused (the codec keeps
    /// newer producers readable); a value that is no string is an invalid field.
    #[test]
    fn an_unknown_edge_kind_is_other_and_a_non_string_is_refused() {
        for name in ["haproxy", "", "Nginx", "NGINX"] {
            let e = decode::<AccessEvent>(&event_json_with("edge", name.into())).unwrap();
            assert_eq!(e.edge, Some(EdgeKind::Other), "{name:?}");
            assert!(String::from_utf8_lossy(&encode(&e)).contains(r#""edge":"other""#));
        }
        for value in [
            serde_json::json!(7),
            serde_json::json!(["nginx"]),
            serde_json::json!(true),
        ] {
            let err = reject::<AccessEvent>(&event_json_with("edge", value.clone()));
            assert_eq!(err.reason(), "invalid_field", "{value}");
            assert!(err.to_string().contains("edge kind"), "{value}: {err}");
        }
    }

    fn reject<T: Wire + std::fmt::Debug>(bytes: &[u8]) -> DecodeError {
        decode::<T>(bytes).expect_err("must be rejected")
    }

    fn event_json_with(field: &str, value: serde_json::Value) -> Vec<u8> {
        let mut json = serde_json::to_value(event()).unwrap();
        json[field] = value;
        serde_json::to_vec(&json).unwrap()
    }

    #[test]
    fn rejects_oversized_before_parsing() {
        let big = vec![b' '; AccessEvent::MAX_BYTES + 1];
        assert_eq!(
            reject::<AccessEvent>(&big),
            DecodeError::TooLarge {
                len: AccessEvent::MAX_BYTES + 1,
                max: AccessEvent::MAX_BYTES
            }
        );
    }

    #[test]
    fn rejects_malformed_json() {
        for bad in [&b""[..], b"{", b"not json", b"\xff\xfe", b"{\"v\":1,}"] {
            assert_eq!(reject::<AccessEvent>(bad).reason(), "malformed", "{bad:?}");
        }
    }

    #[test]
    fn invalid_fields_are_named() {
        let cases = [
            ("tenant", serde_json::json!("bad tenant"), "invalid tenant"),
            (
                "key",
                serde_json::json!("https://evil/x"),
                "invalid cache key",
            ),
            ("region", serde_json::json!(""), "invalid region"),
            ("node", serde_json::json!(7), "invalid type"),
            (
                "outcome",
                serde_json::json!("teleported"),
                "unknown variant",
            ),
            ("referrer", serde_json::json!("a b"), "invalid domain"),
            ("ts_ms", serde_json::json!(-1), "invalid value"),
        ];
        for (field, value, expected) in cases {
            let err = reject::<AccessEvent>(&event_json_with(field, value));
            assert_eq!(err.reason(), "invalid_field", "{field}");
            assert!(err.to_string().contains(expected), "{field}: {err}");
        }
    }

    #[test]
    fn missing_field_is_named() {
        let mut json = serde_json::to_value(event()).unwrap();
        json.as_object_mut().unwrap().remove("tenant");
        let err = reject::<AccessEvent>(&serde_json::to_vec(&json).unwrap());
        assert!(err.to_string().contains("missing field `tenant`"), "{err}");
    }

    #[test]
    fn rejects_other_schema_versions() {
        let err = reject::<AccessEvent>(&event_json_with("v", serde_json::json!(2)));
        assert_eq!(err, DecodeError::UnsupportedVersion { found: 2 });
    }

    #[test]
    fn command_cross_field_rules_are_checked() {
        type Spoil = fn(&mut PrewarmCommand);
        let cases: [(Spoil, &str); 6] = [
            (|c| c.confidence = 1.5, "confidence"),
            (|c| c.expires_at_ms = c.issued_at_ms, "expires_at_ms"),
            (|c| c.regions = RegionTargets::Only(vec![]), "regions"),
            (|c| c.id = String::new(), "id"),
            (|c| c.id = "x".repeat(65), "id"),
            (
                |c| c.reason.features[0].contribution = f64::NAN,
                "not finite",
            ),
        ];
        for (spoil, expected) in cases {
            let mut c = command();
            spoil(&mut c);
            // NaN cannot be written as JSON, so that case is checked on the value.
            let err = match serde_json::to_vec(&c) {
                Ok(bytes) if !bytes.windows(4).any(|w| w == b"null") => {
                    reject::<PrewarmCommand>(&bytes)
                }
                _ => DecodeError::InvalidField(c.check().unwrap_err()),
            };
            assert!(err.to_string().contains(expected), "{expected}: {err}");
        }
    }

    #[test]
    fn command_rejects_bad_region_targets_and_urls() {
        let mut json = serde_json::to_value(command()).unwrap();
        json["regions"] = serde_json::json!("everywhere");
        let err = reject::<PrewarmCommand>(&serde_json::to_vec(&json).unwrap());
        assert!(err.to_string().contains("regions"), "{err}");
        json["regions"] = serde_json::json!("all");
        json["key"] = serde_json::json!("http://169.254.169.254/latest");
        let err = reject::<PrewarmCommand>(&serde_json::to_vec(&json).unwrap());
        assert!(err.to_string().contains("invalid cache key"), "{err}");
    }

    fn id() -> impl Strategy<Value = String> {
        "[A-Za-z0-9._-]{1,64}"
    }

    fn arb_event() -> impl Strategy<Value = AccessEvent> {
        let outcome = proptest::sample::select(Outcome::ALL.to_vec());
        let edge = proptest::option::of(proptest::sample::select(EdgeKind::ALL.to_vec()));
        (
            any::<u64>(),
            (id(), "/[A-Za-z0-9/._~%?=&-]{0,200}", id(), id()),
            (outcome, edge),
            proptest::option::of("[a-z0-9.-]{1,60}"),
            any::<u64>(),
            proptest::option::of(any::<u32>()),
        )
            .prop_filter_map(
                "key with a '..' segment",
                |(ts, (t, k, r, n), (o, edge), refr, b, f)| {
                    let mut e = AccessEvent::new(
                        ts,
                        t.parse().ok()?,
                        k.parse().ok()?,
                        r.parse().ok()?,
                        n.parse().ok()?,
                        o,
                    );
                    e.edge = edge;
                    e.referrer = refr.map(|d| d.parse().unwrap());
                    e.bytes = b;
                    e.fill_ms = f;
                    Some(e)
                },
            )
    }

    /// Found by fuzzing: serde reads a struct from an array of its fields too, and
    /// the two decoders worded a short array's error differently. Arrays are refused.
    #[test]
    fn arrays_are_refused_by_both_decoders() {
        for bytes in [
            &b"[]"[..],
            b" [1]",
            br#"[1,5,"t","/k","r","n","hit"]"#,
            br#"[1,5,"t","/k","r","n","hit",null,0,null]"#,
        ] {
            let refused =
                DecodeError::InvalidField("expected a JSON object, found an array".into());
            assert_eq!(
                decode::<AccessEvent>(bytes),
                Err(refused.clone()),
                "{bytes:?}"
            );
            assert_eq!(decode_ref_owned(bytes), Err(refused.clone()), "{bytes:?}");
            assert_eq!(decode::<PrewarmCommand>(bytes), Err(refused), "{bytes:?}");
        }
    }

    fn decode_ref_owned(bytes: &[u8]) -> Result<AccessEvent, DecodeError> {
        decode_event_ref(bytes).map(|e| e.to_owned_event())
    }

    fn field_name() -> impl Strategy<Value = String> {
        prop_oneof![
            8 => proptest::sample::select(vec![
                "v", "ts_ms", "tenant", "key", "region", "node", "edge", "outcome",
                "referrer", "bytes", "fill_ms",
            ])
            .prop_map(str::to_owned),
            1 => "[a-z_]{1,8}",
        ]
    }

    /// JSON value texts: valid ids and keys, near misses, escapes, other types.
    fn json_value() -> impl Strategy<Value = String> {
        let string = prop_oneof![
            "[A-Za-z0-9._-]{1,64}",
            "[A-Za-z0-9._ /-]{0,70}",
            "/[A-Za-z0-9/._~%?=&#\\\\ -]{0,40}",
            "/(\\.\\.|%2[eE]%2[eE]|[a-z]){0,6}(/(\\.\\.|x)){0,3}",
            "(hit|miss|stale|collapsed|prefetch_fill|prefetch_useful|Hit|teleported)",
            "(prefetcher|nginx|varnish|other|haproxy|Nginx|)",
            "[a-z0-9.-]{1,60}",
            any::<String>(),
        ];
        prop_oneof![
            4 => string.prop_map(|s| serde_json::to_string(&s).unwrap()),
            // Escaped forms of valid text (\u002f is '/') cannot be borrowed.
            1 => "(/|\\\\u002f)[a-z]{0,5}(\\\\/[a-z]{1,5}){0,2}".prop_map(|s| format!("\"{s}\"")),
            1 => "/[a-z]{1,3}".prop_map(|s| format!("\"{}\"", s.repeat(1_100))),
            2 => any::<i64>().prop_map(|n| n.to_string()),
            1 => (0u64..3).prop_map(|n| n.to_string()),
            1 => any::<u64>().prop_map(|n| n.to_string()),
            1 => Just("1.5".to_owned()),
            1 => Just("null".to_owned()),
            1 => Just("true".to_owned()),
            1 => Just("[\"a\"]".to_owned()),
            1 => Just("{\"x\":1}".to_owned()),
        ]
    }

    proptest! {
        #[test]
        fn decode_inverts_encode(e in arb_event()) {
            prop_assert_eq!(decode::<AccessEvent>(&encode(&e)).unwrap(), e);
        }

        #[test]
        fn command_decode_inverts_encode(
            conf in 0.0f64..=1.0,
            issued in 0u64..u64::MAX / 2,
            ttl in 1u64..1_000_000,
            values in proptest::collection::vec((-1e9f64..1e9, -1e3f64..1e3), 0..12),
        ) {
            let mut c = command();
            c.confidence = conf;
            c.issued_at_ms = issued;
            c.expires_at_ms = issued + ttl;
            c.reason.features = values.into_iter().enumerate()
                .map(|(i, (value, contribution))| FeatureContribution { name: format!("f{i}"), value, contribution })
                .collect();
            prop_assert_eq!(decode::<PrewarmCommand>(&encode(&c)).unwrap(), c);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..6000)) {
            let _ = decode::<AccessEvent>(&bytes);
            let _ = decode::<PrewarmCommand>(&bytes);
        }

        #[test]
        fn borrowed_decode_agrees_on_arbitrary_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..6000)
        ) {
            prop_assert_eq!(decode_ref_owned(&bytes), decode::<AccessEvent>(&bytes));
        }

        #[test]
        fn the_fast_writer_writes_what_encode_writes(e in arb_event()) {
            let mut out = b"kept".to_vec();
            encode_event_into(&e.borrowed(), &mut out);
            prop_assert_eq!(&out[..4], b"kept");
            prop_assert_eq!(&out[4..], &encode(&e)[..]);
        }

        #[test]
        fn borrowed_decode_agrees_on_valid_events(e in arb_event()) {
            let bytes = encode(&e);
            // What `encode` writes takes the fast path.
            prop_assert!(crate::compact::parse(&bytes).is_some());
            prop_assert_eq!(&e.borrowed().to_owned_event(), &e);
            prop_assert_eq!(decode_ref_owned(&bytes), Ok(e));
        }

        /// Objects made of the event's fields (repeated, missing, unknown) with values
        /// that are right, wrong, escaped, oversized or of the wrong type: the
        /// borrowed decoder accepts and refuses exactly what the owned one does, with
        /// the same error.
        #[test]
        fn borrowed_decode_agrees_on_arbitrary_event_like_objects(
            fields in proptest::collection::vec((field_name(), json_value()), 0..14),
            tail in proptest::option::of("[\\] ,}\"]{1,3}"),
        ) {
            let mut text = String::from("{");
            for (i, (name, value)) in fields.iter().enumerate() {
                if i > 0 {
                    text.push(',');
                }
                text.push_str(&format!("{name:?}:{value}"));
            }
            text.push_str(tail.as_deref().unwrap_or("}"));
            let bytes = text.as_bytes();
            prop_assert_eq!(decode_ref_owned(bytes), decode::<AccessEvent>(bytes));
        }

        #[test]
        fn arbitrary_json_objects_never_panic(
            fields in proptest::collection::btree_map("[a-z_]{1,8}", any::<i64>(), 0..12)
        ) {
            let bytes = serde_json::to_vec(&fields).unwrap();
            let _ = decode::<AccessEvent>(&bytes);
            let _ = decode::<PrewarmCommand>(&bytes);
        }
    }

    /// Found by fuzzing (fuzz/ target decode_prewarm_command): whatever `decode`
    /// accepts re-encodes within the limit, so it decodes again to the same value.
    #[test]
    fn accepted_messages_re_encode_within_the_limit() {
        let mut c = serde_json::to_value(command()).unwrap();
        let feature = serde_json::json!({"name": "f", "value": 0, "contribution": 0});
        c["reason"]["features"] = serde_json::Value::Array(vec![feature; 400]);
        let mut bytes = serde_json::to_vec(&c).unwrap();
        while bytes.len() > PrewarmCommand::MAX_BYTES {
            c["reason"]["features"].as_array_mut().unwrap().pop();
            bytes = serde_json::to_vec(&c).unwrap();
        }
        assert!(
            encode(&serde_json::from_slice::<PrewarmCommand>(&bytes).unwrap()).len()
                > PrewarmCommand::MAX_BYTES
        );
        assert!(matches!(
            decode::<PrewarmCommand>(&bytes),
            Err(DecodeError::TooLarge { .. })
        ));
        // An event whose only growth is the absent `bytes` field, right at the limit.
        let mut e = serde_json::to_value(event()).unwrap();
        e.as_object_mut().unwrap().remove("bytes");
        let base = serde_json::to_vec(&e).unwrap().len() - "/img/logo.png?v=2".len();
        let quotes = (AccessEvent::MAX_BYTES - base - 1) / 2;
        e["key"] = format!("/{}", "\"".repeat(quotes)).into();
        let bytes = serde_json::to_vec(&e).unwrap();
        assert!(bytes.len() <= AccessEvent::MAX_BYTES);
        match decode::<AccessEvent>(&bytes) {
            Ok(event) => assert_eq!(decode::<AccessEvent>(&encode(&event)).unwrap(), event),
            Err(err) => assert!(matches!(err, DecodeError::TooLarge { .. }), "{err}"),
        }
        // The ordinary ones are unaffected.
        assert_eq!(
            decode::<PrewarmCommand>(&encode(&command())).unwrap(),
            command()
        );
    }
}
