//! The partition a keyed message goes to, as producers choose it, and which of the
//! usual partitioners the producers of a topic really use.
//!
//! - `consistent_random`: librdkafka's default, the CRC-32 (IEEE: reflected polynomial
//!   `0xEDB88320`, as zlib and librdkafka's `rd_crc32`) of the key modulo the count;
//! - `murmur2_random`: the Java client's default (Kafka Streams, Connect, the console
//!   producer), Kafka's `Utils.murmur2` of the key, made positive, modulo the count;
//! - `fnv1a`: Sarama's default, 32-bit FNV-1a of the key as a signed integer, modulo
//!   the count, made positive.
//!
//! Keyless and random producers fit none of them. [`Ownership`] learns from the
//! (key, partition) pairs pulse consumes which one fits every pair: only then is a key
//! looked up in the partition(s) that own it, otherwise every partition is asked.

/// CRC-32 (IEEE) of `bytes`.
pub(crate) fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut bit = 0;
            while bit < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                bit += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = !0u32;
    for &b in bytes {
        crc = TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

/// Kafka's `Utils.murmur2` (MurmurHash2, seed `0x9747b28c`), as the Java client and
/// librdkafka's `murmur2` partitioners compute it.
pub(crate) fn murmur2(bytes: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ bytes.len() as u32;
    let mut chunks = bytes.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, &b) in tail.iter().enumerate().rev() {
            h ^= u32::from(b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

/// 32-bit FNV-1a.
pub(crate) fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// A producers' partitioner pulse can follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Partitioner {
    /// librdkafka's default: CRC-32.
    ConsistentRandom,
    /// The Java client's default: murmur2.
    Murmur2Random,
    /// Sarama's default: FNV-1a.
    Fnv1a,
}

impl Partitioner {
    /// Every partitioner pulse can follow.
    pub const ALL: [Partitioner; 3] = [
        Partitioner::ConsistentRandom,
        Partitioner::Murmur2Random,
        Partitioner::Fnv1a,
    ];

    /// The name in metrics and answers (librdkafka's `partitioner` values).
    pub fn as_str(self) -> &'static str {
        match self {
            Partitioner::ConsistentRandom => "consistent_random",
            Partitioner::Murmur2Random => "murmur2_random",
            Partitioner::Fnv1a => "fnv1a",
        }
    }

    /// The partition this partitioner picks for `key` on a topic of `count`
    /// partitions (at least 1).
    pub fn partition(self, key: &[u8], count: i32) -> i32 {
        let n = count.max(1);
        match self {
            Partitioner::ConsistentRandom => (crc32(key) % n as u32) as i32,
            Partitioner::Murmur2Random => ((murmur2(key) & 0x7fff_ffff) % n as u32) as i32,
            Partitioner::Fnv1a => ((fnv1a(key) as i32) % n).abs(),
        }
    }
}

/// The partition librdkafka's default partitioner picks for a message keyed `key` on
/// a topic of `partition_count` partitions (at least 1).
pub fn partition_for_key(key: &[u8], partition_count: i32) -> i32 {
    Partitioner::ConsistentRandom.partition(key, partition_count)
}

/// Pairs a partitioner must fit, all of them, before keys are routed by it: by chance
/// a wrong one fits a pair with probability 1/P, so 64 pairs leave at most 2^-64
/// (P = 2) of routing by a partitioner the producers do not use.
pub const MIN_PAIRS: u64 = 64;

/// Most partition counts a commit's metadata carries (a topic grows rarely; the
/// broker's `offset.metadata.max.bytes` is 4 KiB by default).
const MAX_HISTORY: usize = 16;

/// What the (key, partition) pairs consumed say about the producers' partitioner.
///
/// Invariants: a partitioner is [`fitting`](Ownership::fitting) only when it placed
/// every keyed pair seen, under one of the partition counts the topic has had while
/// pulse ran (keys produced before it grew stay where they were), and at least
/// [`MIN_PAIRS`] were seen; a key's [`route`](Ownership::route) is then its partition
/// under each of those counts, and otherwise `None`: ask every partition.
///
/// The counts the topic had before this instance knew it come from the group's
/// commits ([`history`](Ownership::history) is what each commit carries): a member
/// that joins after a growth routes keys where they lived before it too. An earlier
/// count is kept until no window holds its events ([`forget_ended_before`]).
///
/// [`forget_ended_before`]: Ownership::forget_ended_before
#[derive(Debug, Clone, Default)]
pub struct Ownership {
    /// The partition counts the topic has had, ascending (the current one last).
    counts: Vec<i32>,
    /// When each earlier count stopped being the topic's, ms since the Unix epoch.
    ended_ms: std::collections::BTreeMap<i32, u64>,
    /// Keyed pairs seen.
    pairs: u64,
    /// Pairs each of [`Partitioner::ALL`] placed.
    agreeing: [u64; 3],
}

impl Ownership {
    /// Records the topic's partition count; a new one is kept with the earlier ones.
    pub fn set_partition_count(&mut self, count: i32) {
        if count > 0 && !self.counts.contains(&count) {
            self.counts.push(count);
            self.counts.sort_unstable();
        }
    }

    /// The topic has `count` partitions as of `now_ms`: a count it had before ends
    /// then.
    pub fn grow(&mut self, count: i32, now_ms: u64) {
        self.set_partition_count(count);
        for &c in &self.counts {
            if c < count {
                self.ended_ms.entry(c).or_insert(now_ms);
            }
        }
    }

    /// A count the topic had until `ended_ms` (`None`: it has it still), as a commit
    /// of the group recorded it; of two ends for one count, the later is kept.
    pub fn learn(&mut self, count: i32, ended_ms: Option<u64>) {
        self.set_partition_count(count);
        if let Some(ms) = ended_ms {
            let end = self.ended_ms.entry(count).or_insert(ms);
            *end = (*end).max(ms);
        }
    }

    /// Forgets the counts that ended before `ms`: no window holds the events keyed
    /// under them any more.
    pub fn forget_ended_before(&mut self, ms: u64) {
        let ended = &self.ended_ms;
        self.counts
            .retain(|c| ended.get(c).is_none_or(|&end| end >= ms));
        self.ended_ms.retain(|_, end| *end >= ms);
    }

    /// The counts as a commit carries them: `3@1764470000000,5` (an earlier count
    /// with its end, then the current one); at most [`MAX_HISTORY`] of the newest.
    pub fn history(&self) -> String {
        let skip = self.counts.len().saturating_sub(MAX_HISTORY);
        let parts: Vec<String> = self.counts[skip..]
            .iter()
            .map(|c| match self.ended_ms.get(c) {
                Some(end) => format!("{c}@{end}"),
                None => c.to_string(),
            })
            .collect();
        parts.join(",")
    }

    /// Reads a [`history`](Ownership::history): each count with its end, if any;
    /// what does not parse (another client's metadata) gives nothing.
    pub fn parse_history(text: &str) -> Vec<(i32, Option<u64>)> {
        text.split(',')
            .take(MAX_HISTORY)
            .filter_map(|part| {
                let (count, end) = match part.split_once('@') {
                    Some((c, e)) => (c, Some(e.parse().ok()?)),
                    None => (part, None),
                };
                let count: i32 = count.parse().ok()?;
                (count > 0).then_some((count, end))
            })
            .collect()
    }

    /// One consumed message: `key` (its Kafka key) was on `partition`. Keyless
    /// messages say nothing about a key's owner.
    pub fn observe(&mut self, key: &[u8], partition: i32) {
        if key.is_empty() || self.counts.is_empty() {
            return;
        }
        self.pairs += 1;
        for (i, p) in Partitioner::ALL.iter().enumerate() {
            if self
                .counts
                .iter()
                .any(|&n| p.partition(key, n) == partition)
            {
                self.agreeing[i] += 1;
            }
        }
    }

    /// Keyed pairs seen.
    pub fn pairs(&self) -> u64 {
        self.pairs
    }

    /// Pairs each partitioner placed.
    pub fn agreeing(&self) -> impl Iterator<Item = (Partitioner, u64)> + '_ {
        Partitioner::ALL.into_iter().zip(self.agreeing)
    }

    /// The partitioner that placed every pair seen, once enough were.
    pub fn fitting(&self) -> Option<Partitioner> {
        if self.pairs < MIN_PAIRS {
            return None;
        }
        self.agreeing()
            .find(|&(_, n)| n == self.pairs)
            .map(|(p, _)| p)
    }

    /// The partitions that may hold `key`, ascending, when the partitioner is known;
    /// `None`: ask them all.
    pub fn route(&self, key: &[u8]) -> Option<Vec<i32>> {
        let p = self.fitting()?;
        let mut route: Vec<i32> = self.counts.iter().map(|&n| p.partition(key, n)).collect();
        route.sort_unstable();
        route.dedup();
        Some(route)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The standard check value of CRC-32/ISO-HDLC, and the empty input.
    #[test]
    fn crc32_is_the_ieee_one() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        assert_eq!(
            crc32(b"The quick brown fox jumps over the lazy dog"),
            0x414F_A339
        );
    }

    /// Kafka's own test values (`UtilsTest.testMurmur2`, as signed ints) and FNV-1a's
    /// reference ones.
    #[test]
    fn murmur2_and_fnv1a_are_kafkas_and_the_reference() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            (b"abc", 479470107),
        ];
        for (key, want) in cases {
            assert_eq!(
                murmur2(key) as i32,
                want,
                "{}",
                String::from_utf8_lossy(key)
            );
        }
        assert_eq!(fnv1a(b""), 0x811c_9dc5);
        assert_eq!(fnv1a(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn partitions_stay_in_range() {
        for n in [1, 3, 8, 1000] {
            for key in ["", "acme/img/logo.png", "globex/a"] {
                for p in Partitioner::ALL {
                    assert!((0..n).contains(&p.partition(key.as_bytes(), n)));
                }
            }
        }
        assert_eq!(partition_for_key(b"x", 0), 0);
    }

    fn keys() -> impl Iterator<Item = String> {
        (0..200).map(|i| format!("acme/k/{i}"))
    }

    /// One partitioner's pairs: it fits, and routes keys to their partition; before
    /// enough pairs nothing is routed.
    #[test]
    fn the_partitioner_that_placed_every_pair_routes() {
        for by in Partitioner::ALL {
            let mut o = Ownership::default();
            o.set_partition_count(8);
            for key in keys().take(MIN_PAIRS as usize - 1) {
                o.observe(key.as_bytes(), by.partition(key.as_bytes(), 8));
            }
            assert_eq!(o.fitting(), None, "{by:?}: too few pairs yet");
            for key in keys() {
                o.observe(key.as_bytes(), by.partition(key.as_bytes(), 8));
            }
            assert_eq!(o.fitting(), Some(by));
            assert_eq!(o.route(b"acme/x"), Some(vec![by.partition(b"acme/x", 8)]));
        }
    }

    /// Two partitioners at once (or a random producer): none fits, every partition is
    /// asked.
    #[test]
    fn mixed_producers_fit_no_partitioner() {
        let mut o = Ownership::default();
        o.set_partition_count(8);
        for (i, key) in keys().enumerate() {
            let by = Partitioner::ALL[i % 2];
            o.observe(key.as_bytes(), by.partition(key.as_bytes(), 8));
        }
        assert_eq!(o.fitting(), None);
        assert_eq!(o.route(b"acme/x"), None);
        // Keyless messages say nothing.
        o.observe(b"", 3);
        assert_eq!(o.pairs(), 200);
    }

    /// A topic that grew: keys produced before stay on their partition under the old
    /// count, later ones go by the new count; a key is looked up under both.
    #[test]
    fn a_grown_topic_routes_a_key_under_every_count_it_had() {
        let mut o = Ownership::default();
        let by = Partitioner::Murmur2Random;
        o.set_partition_count(4);
        for key in keys() {
            o.observe(key.as_bytes(), by.partition(key.as_bytes(), 4));
        }
        o.set_partition_count(8);
        for key in keys() {
            o.observe(key.as_bytes(), by.partition(key.as_bytes(), 8));
        }
        assert_eq!(o.fitting(), Some(by));
        let key = keys()
            .find(|k| by.partition(k.as_bytes(), 4) != by.partition(k.as_bytes(), 8))
            .unwrap();
        let mut both = vec![
            by.partition(key.as_bytes(), 4),
            by.partition(key.as_bytes(), 8),
        ];
        both.sort_unstable();
        assert_eq!(o.route(key.as_bytes()), Some(both));
    }

    /// A member that joins after a growth learns the earlier count from the group's
    /// commits and routes a key where it lived before too; an earlier count is
    /// forgotten once it ended before the replay window, never the current one.
    #[test]
    fn a_joiner_learns_the_counts_the_topic_had_from_the_commits() {
        let by = Partitioner::ConsistentRandom;
        let mut old = Ownership::default();
        old.set_partition_count(4);
        old.grow(6, 1_000);
        assert_eq!(old.history(), "4@1000,6");
        let mut joiner = Ownership::default();
        joiner.set_partition_count(6);
        for key in keys() {
            joiner.observe(key.as_bytes(), by.partition(key.as_bytes(), 6));
        }
        let key = keys()
            .find(|k| by.partition(k.as_bytes(), 4) != by.partition(k.as_bytes(), 6))
            .unwrap();
        assert_eq!(joiner.route(key.as_bytes()).unwrap().len(), 1);
        for (count, end) in Ownership::parse_history(&old.history()) {
            joiner.learn(count, end);
        }
        let mut both = vec![
            by.partition(key.as_bytes(), 4),
            by.partition(key.as_bytes(), 6),
        ];
        both.sort_unstable();
        assert_eq!(joiner.route(key.as_bytes()), Some(both));
        assert_eq!(joiner.history(), "4@1000,6");
        joiner.forget_ended_before(1_000);
        assert_eq!(joiner.history(), "4@1000,6", "not before its end");
        joiner.forget_ended_before(1_001);
        assert_eq!(joiner.history(), "6");
        assert_eq!(joiner.route(key.as_bytes()).unwrap().len(), 1);
        // Another client's metadata, or nonsense, says nothing.
        for other in ["", "owner=a", "x@1", "4@soon", "-3", "0"] {
            assert_eq!(Ownership::parse_history(other), [], "{other:?}");
        }
    }
}
