//! How a request was answered and why a pre-warm command was refused: the `x-cache`
//! header's name and values, [`CacheStatus`] for the header, the metric labels and the
//! access events alike, so the three never disagree, and [`RejectReason`] for the
//! pre-warm `reason` label, and [`H2Abuse`] for an HTTP/2 connection ended for
//! misbehaving. Each gives its labels (`as_str`) and lists every value (`ALL`), so the
//! metrics pre-create one series per value from the enum itself. (Why a request head
//! was refused, `RefusalReason`, lives beside the checks, in `request_head`.)

use models::{DecodeError, Outcome, SignatureError};
use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

/// The response header naming how a request was answered.
pub const X_CACHE: &str = "x-cache";

/// [`X_CACHE`] as a ready-made name: the hit path then neither parses nor hashes a
/// string to find it.
pub(crate) static X_CACHE_NAME: http::HeaderName = http::HeaderName::from_static(X_CACHE);

/// The `x-cache` value of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheStatus {
    /// Served from the node's cache while fresh.
    Hit,
    /// Not cached: this request led an origin fill (or hedged, or was not shareable).
    Miss,
    /// Served an expired entry within its grace window while one refresh runs.
    Stale,
    /// Joined a fill already in flight and shared its response.
    Collapsed,
    /// The first user hit on an entry that a pre-warm (background fill) stored.
    Prefetched,
    /// Not cacheable by request (method, credentials, a range beyond
    /// `cache.max_object_bytes`): passed to the origin.
    Bypass,
}

impl CacheStatus {
    /// Every status, in declaration order (metrics pre-create one series each).
    pub const ALL: [CacheStatus; 6] = [
        CacheStatus::Hit,
        CacheStatus::Miss,
        CacheStatus::Stale,
        CacheStatus::Collapsed,
        CacheStatus::Prefetched,
        CacheStatus::Bypass,
    ];

    /// The header value, also the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Miss => "MISS",
            CacheStatus::Stale => "STALE",
            CacheStatus::Collapsed => "COLLAPSED",
            CacheStatus::Prefetched => "PREFETCHED",
            CacheStatus::Bypass => "BYPASS",
        }
    }

    /// Parses a header value (as a downstream node or a test reads it).
    pub fn parse(value: &str) -> Option<CacheStatus> {
        CacheStatus::ALL.into_iter().find(|s| s.as_str() == value)
    }

    /// The access-event outcome a user request with this status reports; `None` for
    /// requests that were never cacheable.
    pub fn outcome(self) -> Option<Outcome> {
        match self {
            CacheStatus::Hit => Some(Outcome::Hit),
            CacheStatus::Miss => Some(Outcome::Miss),
            CacheStatus::Stale => Some(Outcome::Stale),
            CacheStatus::Collapsed => Some(Outcome::Collapsed),
            CacheStatus::Prefetched => Some(Outcome::PrefetchUseful),
            CacheStatus::Bypass => None,
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl EncodeLabelValue for CacheStatus {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

/// Why a pre-warm command was not acted on: the `reason` label of
/// `prefetcher_prefetches_rejected_total`, in the order the consumer checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// Signing keys are configured and the message carries no signature.
    Unsigned,
    /// The signature names a key id this node does not hold.
    UnknownKey,
    /// The signature does not match the payload, or is malformed.
    BadSignature,
    /// Larger than a pre-warm command may be.
    TooLarge,
    /// Not a JSON object.
    Malformed,
    /// A field is missing, mistyped or invalid (the key too, once normalised).
    InvalidField,
    /// A schema version this build does not speak.
    UnsupportedVersion,
    /// Past its `expires_at_ms`.
    Expired,
    /// Its `regions` do not include this node's.
    OtherRegion,
    /// The tenant is not in this node's configuration.
    UnknownTenant,
    /// A command with this id was acted on and has not expired.
    Duplicate,
    /// Too many keys in flight.
    Full,
}

impl RejectReason {
    /// Every reason, in declaration order (metrics pre-create one series each).
    pub const ALL: [RejectReason; 12] = [
        RejectReason::Unsigned,
        RejectReason::UnknownKey,
        RejectReason::BadSignature,
        RejectReason::TooLarge,
        RejectReason::Malformed,
        RejectReason::InvalidField,
        RejectReason::UnsupportedVersion,
        RejectReason::Expired,
        RejectReason::OtherRegion,
        RejectReason::UnknownTenant,
        RejectReason::Duplicate,
        RejectReason::Full,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::Unsigned => "unsigned",
            RejectReason::UnknownKey => "unknown_key",
            RejectReason::BadSignature => "bad_signature",
            RejectReason::TooLarge => "too_large",
            RejectReason::Malformed => "malformed",
            RejectReason::InvalidField => "invalid_field",
            RejectReason::UnsupportedVersion => "unsupported_version",
            RejectReason::Expired => "expired",
            RejectReason::OtherRegion => "other_region",
            RejectReason::UnknownTenant => "unknown_tenant",
            RejectReason::Duplicate => "duplicate",
            RejectReason::Full => "full",
        }
    }

    /// The reason with this label.
    pub fn parse(label: &str) -> Option<RejectReason> {
        RejectReason::ALL.into_iter().find(|r| r.as_str() == label)
    }
}

impl From<&DecodeError> for RejectReason {
    /// Exhaustive on purpose: a new decode error must be given its reason here.
    fn from(error: &DecodeError) -> RejectReason {
        match error {
            DecodeError::TooLarge { .. } => RejectReason::TooLarge,
            DecodeError::Malformed(_) => RejectReason::Malformed,
            DecodeError::InvalidField(_) => RejectReason::InvalidField,
            DecodeError::UnsupportedVersion { .. } => RejectReason::UnsupportedVersion,
        }
    }
}

impl From<SignatureError> for RejectReason {
    fn from(error: SignatureError) -> RejectReason {
        match error {
            SignatureError::Unsigned => RejectReason::Unsigned,
            SignatureError::UnknownKey => RejectReason::UnknownKey,
            SignatureError::BadSignature => RejectReason::BadSignature,
        }
    }
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl EncodeLabelValue for RejectReason {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

/// Why an HTTP/2 connection was ended for misbehaving: the `reason` label of
/// `prefetcher_h2_connection_errors_total`. The first five are the `h2` crate's own
/// `ENHANCE_YOUR_CALM` limits, named by the debug data of its `GOAWAY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum H2Abuse {
    /// Too many streams the client reset before the server accepted them (rapid
    /// reset, CVE-2023-44487): `http2.max_pending_accept_reset_streams`.
    RapidReset,
    /// Too many streams the server had to reset for the client's errors:
    /// `http2.max_local_error_reset_streams`.
    LocalErrorResets,
    /// A header block in more `CONTINUATION` frames than its size allows
    /// (CONTINUATION flood, CVE-2024-27316).
    ContinuationFlood,
    /// A header block far over `http2.max_header_list_bytes`.
    HeaderListTooLarge,
    /// Too many small `DATA` frames.
    DataFrameFlood,
    /// Another `ENHANCE_YOUR_CALM`.
    EnhanceYourCalm,
    /// A protocol violation (bad frame, bad stream state, bad preface).
    ProtocolError,
    /// HPACK that does not decode.
    CompressionError,
    /// A frame of the wrong size.
    FrameSizeError,
    /// A flow-control window overflowed.
    FlowControlError,
    /// The client left response data unsent past `server.send_timeout_ms` (a zero
    /// flow-control window never updated; formerly `http2.send_stall_timeout_ms`).
    SendStall,
    /// The client did not answer a keep-alive `PING` in time.
    KeepAliveTimeout,
    /// Any other connection error the server detected.
    Other,
}

impl H2Abuse {
    /// Every reason, in declaration order (metrics pre-create one series each).
    pub const ALL: [H2Abuse; 13] = [
        H2Abuse::RapidReset,
        H2Abuse::LocalErrorResets,
        H2Abuse::ContinuationFlood,
        H2Abuse::HeaderListTooLarge,
        H2Abuse::DataFrameFlood,
        H2Abuse::EnhanceYourCalm,
        H2Abuse::ProtocolError,
        H2Abuse::CompressionError,
        H2Abuse::FrameSizeError,
        H2Abuse::FlowControlError,
        H2Abuse::SendStall,
        H2Abuse::KeepAliveTimeout,
        H2Abuse::Other,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            H2Abuse::RapidReset => "rapid_reset",
            H2Abuse::LocalErrorResets => "local_error_resets",
            H2Abuse::ContinuationFlood => "continuation_flood",
            H2Abuse::HeaderListTooLarge => "header_list_too_large",
            H2Abuse::DataFrameFlood => "data_frame_flood",
            H2Abuse::EnhanceYourCalm => "enhance_your_calm",
            H2Abuse::ProtocolError => "protocol_error",
            H2Abuse::CompressionError => "compression_error",
            H2Abuse::FrameSizeError => "frame_size_error",
            H2Abuse::FlowControlError => "flow_control_error",
            H2Abuse::SendStall => "send_stall",
            H2Abuse::KeepAliveTimeout => "keep_alive_timeout",
            H2Abuse::Other => "other",
        }
    }

    /// The reason with this label.
    pub fn parse(label: &str) -> Option<H2Abuse> {
        H2Abuse::ALL.into_iter().find(|r| r.as_str() == label)
    }

    /// Position in [`H2Abuse::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Which client limit acted: the `reason` label of `prefetcher_client_limits_total`
/// (the `[server]` section of the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientLimit {
    /// A request head did not arrive within `header_timeout_ms`: connection closed.
    HeaderTimeout,
    /// No request in flight for `idle_timeout_ms`: connection closed.
    IdleTimeout,
    /// The client took no response bytes for `send_timeout_ms`: connection closed.
    SendTimeout,
    /// A forwarded request body stalled for `body_timeout_ms`: 408, origin aborted.
    BodyTimeout,
    /// `max_connections` open: a new connection was closed at once.
    MaxConnections,
    /// `max_connections_per_address` open from its address: closed at once.
    AddressConnections,
    /// At one of those two limits, an unproven connection (no complete request head
    /// after a while) was dropped to admit a new one.
    Evicted,
    /// Its address past `requests_per_second_per_address`: 429.
    AddressRate,
    /// More than `max_headers` header fields: 431.
    TooManyHeaders,
    /// An HTTP/1.1 head the parser refused as too large (more than `max_headers`
    /// fields, or past the head buffer): 431 and closed.
    HeadTooLarge,
    /// `accept` failed (out of file descriptors and the like): the listener backs off.
    AcceptError,
    /// A forwarded request body not whole within `body_deadline_ms`: 408, origin
    /// aborted.
    BodyDeadline,
    /// `max_uploads` forwarded bodies in flight: 503.
    MaxUploads,
    /// `max_uploads_per_address` forwarded bodies in flight from its address: 429.
    AddressUploads,
    /// A request that would lead a fill past `max_fills_per_connection` of its
    /// connection's fills in flight: 429.
    ConnectionFills,
    /// A request that would lead a fill past `max_fills_per_address` of its address's
    /// fills in flight: 429.
    AddressFills,
    /// A connection cancelled more than `max_cancelled_fills_per_connection` of the
    /// fills it led, more than it saw answered: told to close (HTTP/2 `GOAWAY`), and
    /// it leads no more fills.
    CancelledFills,
}

impl ClientLimit {
    /// Every reason, in declaration order (metrics pre-create one series each).
    pub const ALL: [ClientLimit; 17] = [
        ClientLimit::HeaderTimeout,
        ClientLimit::IdleTimeout,
        ClientLimit::SendTimeout,
        ClientLimit::BodyTimeout,
        ClientLimit::MaxConnections,
        ClientLimit::AddressConnections,
        ClientLimit::Evicted,
        ClientLimit::AddressRate,
        ClientLimit::TooManyHeaders,
        ClientLimit::HeadTooLarge,
        ClientLimit::AcceptError,
        ClientLimit::BodyDeadline,
        ClientLimit::MaxUploads,
        ClientLimit::AddressUploads,
        ClientLimit::ConnectionFills,
        ClientLimit::AddressFills,
        ClientLimit::CancelledFills,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientLimit::HeaderTimeout => "header_timeout",
            ClientLimit::IdleTimeout => "idle_timeout",
            ClientLimit::SendTimeout => "send_timeout",
            ClientLimit::BodyTimeout => "body_timeout",
            ClientLimit::MaxConnections => "max_connections",
            ClientLimit::AddressConnections => "address_connections",
            ClientLimit::Evicted => "evicted",
            ClientLimit::AddressRate => "address_rate",
            ClientLimit::TooManyHeaders => "too_many_headers",
            ClientLimit::HeadTooLarge => "head_too_large",
            ClientLimit::AcceptError => "accept_error",
            ClientLimit::BodyDeadline => "body_deadline",
            ClientLimit::MaxUploads => "max_uploads",
            ClientLimit::AddressUploads => "address_uploads",
            ClientLimit::ConnectionFills => "connection_fills",
            ClientLimit::AddressFills => "address_fills",
            ClientLimit::CancelledFills => "cancelled_fills",
        }
    }

    /// The reason with this label.
    pub fn parse(label: &str) -> Option<ClientLimit> {
        ClientLimit::ALL.into_iter().find(|r| r.as_str() == label)
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl EncodeLabelValue for ClientLimit {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request_head::RefusalReason;

    #[test]
    fn header_values_round_trip_and_index_matches_order() {
        for (i, s) in CacheStatus::ALL.into_iter().enumerate() {
            assert_eq!(CacheStatus::parse(s.as_str()), Some(s));
            assert_eq!(s.index(), i);
        }
        assert_eq!(CacheStatus::parse("hit"), None);
        assert_eq!(
            CacheStatus::Prefetched.outcome(),
            Some(Outcome::PrefetchUseful)
        );
        assert_eq!(CacheStatus::Bypass.outcome(), None);
    }

    #[test]
    fn reject_reasons_keep_their_labels_and_match_the_codec() {
        // The labels are a metrics contract: dashboards and alerts query them.
        let labels: Vec<_> = RejectReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            labels,
            [
                "unsigned",
                "unknown_key",
                "bad_signature",
                "too_large",
                "malformed",
                "invalid_field",
                "unsupported_version",
                "expired",
                "other_region",
                "unknown_tenant",
                "duplicate",
                "full",
            ]
        );
        for reason in RejectReason::ALL {
            assert_eq!(RejectReason::parse(reason.as_str()), Some(reason));
        }
        assert_eq!(RejectReason::parse("Full"), None);
        for (i, reason) in RefusalReason::ALL.into_iter().enumerate() {
            assert_eq!(RefusalReason::parse(reason.as_str()), Some(reason));
            assert_eq!(reason.index(), i);
        }
        for (i, reason) in H2Abuse::ALL.into_iter().enumerate() {
            assert_eq!(H2Abuse::parse(reason.as_str()), Some(reason));
            assert_eq!(reason.index(), i);
        }
        for error in [
            DecodeError::TooLarge { len: 2, max: 1 },
            DecodeError::Malformed(String::new()),
            DecodeError::InvalidField(String::new()),
            DecodeError::UnsupportedVersion { found: 9 },
        ] {
            assert_eq!(RejectReason::from(&error).as_str(), error.reason());
        }
        for error in [
            SignatureError::Unsigned,
            SignatureError::UnknownKey,
            SignatureError::BadSignature,
        ] {
            assert_eq!(RejectReason::from(error).as_str(), error.as_str());
        }
    }

    #[test]
    fn client_limits_round_trip_and_index_matches_order() {
        for (i, limit) in ClientLimit::ALL.into_iter().enumerate() {
            assert_eq!(ClientLimit::parse(limit.as_str()), Some(limit));
            assert_eq!(limit.index(), i);
        }
        assert_eq!(ClientLimit::parse("HeaderTimeout"), None);
    }
}
