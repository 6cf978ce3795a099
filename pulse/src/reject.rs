//! Why ingest refuses a message, as one vocabulary for the ingest loop, the metrics
//! and the dead-letter header.

use models::{DecodeError, DecodeReason};

use crate::heat::ApplyError;

/// Why ingest refused a message: it did not decode, or the heat map would not take
/// the event. Counted in `pulse_events_rejected_total{reason}` and named in the
/// dead-letter header `pulse-reject-reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// The message is not a valid event.
    Decode(DecodeReason),
    /// The event is valid but the heat map refused it.
    Apply(ApplyError),
}

impl RejectReason {
    /// Every reason: each [`DecodeReason`], then each [`ApplyError`].
    pub const ALL: [RejectReason; DecodeReason::ALL.len() + ApplyError::ALL.len()] = {
        let mut all = [RejectReason::Apply(ApplyError::TooOld); _];
        let mut i = 0;
        while i < DecodeReason::ALL.len() {
            all[i] = RejectReason::Decode(DecodeReason::ALL[i]);
            i += 1;
        }
        let mut j = 0;
        while j < ApplyError::ALL.len() {
            all[i + j] = RejectReason::Apply(ApplyError::ALL[j]);
            j += 1;
        }
        all
    };

    /// The metric label `reason` (the same words as the inner reason's).
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::Decode(reason) => reason.as_str(),
            RejectReason::Apply(error) => error.as_str(),
        }
    }
}

impl From<&DecodeError> for RejectReason {
    fn from(error: &DecodeError) -> Self {
        RejectReason::Decode(error.kind())
    }
}

impl From<ApplyError> for RejectReason {
    fn from(error: ApplyError) -> Self {
        RejectReason::Apply(error)
    }
}
