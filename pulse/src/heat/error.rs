//! Why an event was not applied ([`ApplyError`], the per-message path) and why a
//! query could not be answered ([`QueryError`]).

/// Why an event was not applied. Small and `Copy`: this is the per-message path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ApplyError {
    /// The event is older than the longest window behind the watermark.
    #[error("event is older than the 60 s window")]
    TooOld,
    /// The event is stamped further ahead of the clock than `max_clock_skew_ms`.
    #[error("event is stamped ahead of the clock by more than the allowed skew")]
    FromFuture,
    /// The tenant is not on the allow-list.
    #[error("tenant is not on the allow-list")]
    UnknownTenant,
    /// A new tenant would pass `memory_budget_bytes`.
    #[error("memory budget reached")]
    MemoryBudget,
}

impl ApplyError {
    /// Every reason, in declaration order (for metrics that list all of them).
    pub const ALL: [ApplyError; 4] = [
        ApplyError::TooOld,
        ApplyError::FromFuture,
        ApplyError::UnknownTenant,
        ApplyError::MemoryBudget,
    ];

    /// The metric label `reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyError::TooOld => "too_old",
            ApplyError::FromFuture => "from_future",
            ApplyError::UnknownTenant => "unknown_tenant",
            ApplyError::MemoryBudget => "memory_budget",
        }
    }
}

/// Why a query could not be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// No event of this tenant has been seen (or it was evicted).
    #[error("unknown tenant {0:?}")]
    UnknownTenant(String),
    /// The tenant has no events from this region.
    #[error("unknown region {0:?} for this tenant")]
    UnknownRegion(String),
}
