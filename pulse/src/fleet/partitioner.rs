//! The partition a keyed message goes to, as producers choose it: librdkafka's default
//! partitioner, `consistent_random`, which for a message with a key is the CRC-32 of
//! the key bytes modulo the partition count (only keyless messages go to a random
//! partition). Pulse uses it to find the partition, and so the instance, that owns
//! `tenant/key`.
//!
//! The CRC is the IEEE one (reflected polynomial `0xEDB88320`, as zlib, `crc32fast`
//! and librdkafka's `rd_crc32` compute it), here as a small table so pulse needs no
//! crate for it.

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

/// The partition librdkafka's default partitioner picks for a message keyed `key` on
/// a topic of `partition_count` partitions (at least 1).
pub fn partition_for_key(key: &[u8], partition_count: i32) -> i32 {
    (crc32(key) % partition_count.max(1) as u32) as i32
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

    #[test]
    fn partitions_stay_in_range() {
        for n in [1, 3, 8, 1000] {
            for key in ["", "acme/img/logo.png", "globex/a"] {
                assert!((0..n).contains(&partition_for_key(key.as_bytes(), n)));
            }
        }
        assert_eq!(partition_for_key(b"x", 0), 0);
    }
}
