//! What a commit of the ingest consumer carries and how a failed one is told: each
//! partition's offset comes with metadata for the next owner (the partition's
//! watermark, where its replay ends; the partition counts the topic has had, so a
//! member that joins after a growth looks keys up where they lived before), and a
//! commit that a rebalance refused is an expected event, not a fault.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};

use super::rebalance::describe;
use crate::partition::{PartitionState, Partitions};

/// The metadata's fields, `;`-separated: the partition's watermark (newest event time
/// applied), and the topic's partition counts (`Ownership::history`).
const WATERMARK: &str = "watermark_ms=";
const PARTITION_COUNTS: &str = "partition_counts=";

/// Adds `state`'s applied offset to `tpl`, with its watermark and the topic's
/// partition counts (as `partitions` knows them) as the commit's metadata.
pub(super) fn add_commit(
    tpl: &mut TopicPartitionList,
    topic: &str,
    state: &PartitionState,
    partitions: &Partitions,
) {
    let mut entry = tpl.add_partition(topic, state.partition);
    let _ = entry.set_offset(Offset::Offset(state.next_offset));
    entry.set_metadata(format!(
        "{WATERMARK}{};{PARTITION_COUNTS}{}",
        state.heat.now_ms(),
        partitions.ownership().history()
    ));
}

/// The field `name` of a commit's metadata, if it is one of ours.
fn field<'a>(metadata: &'a str, name: &str) -> Option<&'a str> {
    metadata.split(';').find_map(|f| f.strip_prefix(name))
}

/// The watermark a commit's metadata carries, if it is one of ours.
pub(super) fn committed_watermark(metadata: &str) -> Option<u64> {
    field(metadata, WATERMARK)?
        .parse()
        .ok()
        .filter(|&ms| ms > 0)
}

/// The partition counts a commit's metadata carries, if it is one of ours.
pub(super) fn committed_partition_counts(metadata: &str) -> Option<&str> {
    field(metadata, PARTITION_COUNTS)
}

/// Whether a commit was refused because the group is rebalancing: the member's
/// generation is over (`IllegalGeneration`) or a new one is being formed
/// (`RebalanceInProgress`). Expected in every rebalance of a healthy group; the
/// offsets are committed again by the next commit, or on revoke by this member of the
/// new generation.
fn refused_by_a_rebalance(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::IllegalGeneration | RDKafkaErrorCode::RebalanceInProgress)
    )
}

/// Logs a failed commit: at INFO when a rebalance refused it (nothing is wrong), else
/// at WARN.
pub(super) fn commit_failed(error: &KafkaError, offsets: &TopicPartitionList) {
    if refused_by_a_rebalance(error) {
        tracing::info!(error = %error, offsets = %describe(offsets), "commit refused during a rebalance; committed again later");
    } else {
        tracing::warn!(error = %error, offsets = %describe(offsets), "commit failed");
    }
}

/// The lines `f` logs at DEBUG and above, as text (tests).
#[cfg(test)]
pub(super) fn logged(f: impl FnOnce()) -> String {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A commit carries the partition's watermark and the topic's partition counts;
    /// the next owner reads them back, and anything else (another client's metadata,
    /// none, the watermark alone as earlier versions wrote it) gives what it has.
    #[test]
    fn a_commit_carries_the_watermark_and_the_partition_counts() {
        let mut heat = crate::heat::HeatMap::new(crate::heat::HeatConfig::default());
        heat.set_clock(u64::MAX);
        let mut partitions = Partitions::heat_only(2);
        partitions.grow(3, 1_000);
        partitions.assign(1, Some(heat), 0, 0);
        let state = partitions.states_mut().get_mut(&1).unwrap();
        state.next_offset = 42;
        let event = models::AccessEvent::new(
            1_764_470_000_123,
            models::TenantId::new("acme").unwrap(),
            models::CacheKey::new("/a").unwrap(),
            models::RegionId::new("eu-west").unwrap(),
            models::NodeId::new("edge-1").unwrap(),
            models::Outcome::Hit,
        );
        state.heat.apply(&event).unwrap();
        let mut tpl = TopicPartitionList::new();
        add_commit(&mut tpl, "events", &partitions.states()[&1], &partitions);
        let entry = tpl.find_partition("events", 1).unwrap();
        assert_eq!(entry.offset(), Offset::Offset(42));
        assert_eq!(
            committed_watermark(entry.metadata()),
            Some(1_764_470_000_123)
        );
        assert_eq!(
            committed_partition_counts(entry.metadata()),
            Some("2@1000,3")
        );
        assert_eq!(committed_watermark("watermark_ms=7"), Some(7));
        assert_eq!(committed_partition_counts("watermark_ms=7"), None);
        for other in [
            "",
            "watermark_ms=",
            "watermark_ms=soon",
            "owner=a",
            "watermark_ms=0",
        ] {
            assert_eq!(committed_watermark(other), None, "{other:?}");
        }
    }

    /// A commit refused because the group is rebalancing is an INFO line; any other
    /// failure still warns.
    #[test]
    fn a_commit_refused_by_a_rebalance_is_not_a_warning() {
        let mut offsets = TopicPartitionList::new();
        let _ = offsets.add_partition_offset("events", 3, Offset::Offset(7));
        for (code, level) in [
            (RDKafkaErrorCode::IllegalGeneration, " INFO "),
            (RDKafkaErrorCode::RebalanceInProgress, " INFO "),
            (RDKafkaErrorCode::UnknownMemberId, " WARN "),
            (RDKafkaErrorCode::OffsetMetadataTooLarge, " WARN "),
            (RDKafkaErrorCode::BrokerTransportFailure, " WARN "),
        ] {
            let lines = logged(|| commit_failed(&KafkaError::ConsumerCommit(code), &offsets));
            assert_eq!(lines.lines().count(), 1, "{code:?}: {lines}");
            assert!(lines.contains(level), "{code:?}: {lines}");
            assert!(lines.contains("events/3@7"), "{lines}");
        }
    }
}
