//! Pre-warm command signatures: an HMAC-SHA256 over the exact payload bytes of a
//! message, named by the id of the key that made it, carried in the message header
//! [`SIGNATURE_HEADER`] as `KEY_ID:HEX` (64 lowercase hex digits).
//!
//! The MAC covers the bytes the consumer decodes, as they are on the wire: nothing is
//! re-encoded or put in a canonical form before it is checked, so a signed command
//! cannot be read two ways. The header leaves the command's schema as it is: a
//! consumer without keys reads signed commands as before.
//!
//! Keys come in a [`SigningKeys`] set (key id → secret), parsed from the text of a
//! key file ([`SigningKeys::parse`]; reading the file is the caller's): a verifier
//! holds every key valid now, two or more while a key is rolled; a [`Signer`] signs
//! with one of them, the current one.
//!
//! ```
//! use models::{SignatureError, SigningKeys};
//!
//! let keys = SigningKeys::parse(
//!     "# key id, then the secret in hex (at least 32 bytes)\n\
//!      k1 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n",
//! )?;
//! let signer = keys.signer("k1")?;
//! let payload = br#"{"v":1,"id":"pw-1"}"#;
//! let header = signer.sign(payload);
//! assert!(header.starts_with("k1:"));
//! assert_eq!(keys.verify(Some(header.as_bytes()), payload), Ok("k1"));
//! assert_eq!(keys.verify(Some(header.as_bytes()), b"{}"), Err(SignatureError::BadSignature));
//! assert_eq!(keys.verify(None, payload), Err(SignatureError::Unsigned));
//! # Ok::<(), models::KeyFileError>(())
//! ```

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The Kafka message header that carries a command's signature.
pub const SIGNATURE_HEADER: &str = "edge-pulse-sig";

/// The shortest secret a key may have, in bytes: SHA-256's output length, the least
/// RFC 2104 recommends.
pub const MIN_KEY_BYTES: usize = 32;

/// The longest secret a key may have, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;

/// The longest key id, in bytes.
pub const MAX_KEY_ID_LEN: usize = 64;

/// Length of the hex MAC in the header.
const MAC_HEX_LEN: usize = 64;

type HmacSha256 = Hmac<Sha256>;

/// Why a signature was refused. Each is a pre-warm rejection reason of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum SignatureError {
    /// The message has no signature header.
    #[error("unsigned")]
    Unsigned,
    /// The signature names a key id the verifier does not hold (an old key, removed,
    /// or one that was never issued).
    #[error("unknown signing key")]
    UnknownKey,
    /// The signature does not match the payload, is malformed, or the header appears
    /// more than once.
    #[error("bad signature")]
    BadSignature,
}

impl SignatureError {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            SignatureError::Unsigned => "unsigned",
            SignatureError::UnknownKey => "unknown_key",
            SignatureError::BadSignature => "bad_signature",
        }
    }
}

/// Why a key file was refused. The secret itself is never part of the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyFileError {
    /// One line is wrong.
    #[error("line {line}: {reason}")]
    Line {
        /// The line, counted from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The file holds no key.
    #[error("no key in the file (lines of `KEY_ID SECRET_HEX`)")]
    Empty,
    /// The signer's key id is not in the set.
    #[error("key id {0:?} is not in the key file")]
    NoSuchKey(String),
}

/// One key: its id and the HMAC already keyed with its secret (cloned per use, so
/// the secret is not hashed again for each message).
#[derive(Clone)]
struct Key {
    id: String,
    mac: HmacSha256,
}

/// The keys valid now: key id → secret.
#[derive(Clone)]
pub struct SigningKeys {
    keys: Vec<Key>,
}

impl std::fmt::Debug for SigningKeys {
    /// Key ids only: a secret never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKeys")
            .field("ids", &self.ids().collect::<Vec<_>>())
            .finish()
    }
}

/// Whether `id` is a key id: 1 to [`MAX_KEY_ID_LEN`] bytes of `A-Z a-z 0-9 . _ -`.
pub fn is_key_id(id: &str) -> bool {
    (1..=MAX_KEY_ID_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl SigningKeys {
    /// Parses a key file: one key a line, `KEY_ID SECRET_HEX` (any run of spaces or
    /// tabs between them); blank lines and lines starting with `#` are skipped. A
    /// secret is at least [`MIN_KEY_BYTES`] bytes (64 hex digits; `openssl rand -hex
    /// 32` makes one). Refused, naming the line: a bad key id, a secret that is not
    /// hex or too short or too long, an id that appears twice; and a file with no key.
    pub fn parse(text: &str) -> Result<SigningKeys, KeyFileError> {
        let mut keys: Vec<(usize, Key)> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line_no = n + 1;
            let bad = |reason: String| KeyFileError::Line {
                line: line_no,
                reason,
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split_ascii_whitespace();
            let (Some(id), Some(secret), None) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(bad("expected `KEY_ID SECRET_HEX`".into()));
            };
            if !is_key_id(id) {
                return Err(bad(format!(
                    "key id {id:?}: 1 to {MAX_KEY_ID_LEN} characters of A-Z a-z 0-9 . _ -"
                )));
            }
            let secret = decode_hex(secret)
                .ok_or_else(|| bad(format!("the secret of {id:?} is not hex")))?;
            if secret.len() < MIN_KEY_BYTES {
                return Err(bad(format!(
                    "the secret of {id:?} is {} bytes; at least {MIN_KEY_BYTES} are required",
                    secret.len()
                )));
            }
            if secret.len() > MAX_KEY_BYTES {
                return Err(bad(format!(
                    "the secret of {id:?} is {} bytes; at most {MAX_KEY_BYTES} are allowed",
                    secret.len()
                )));
            }
            if let Some((first, _)) = keys.iter().find(|(_, k)| k.id == id) {
                return Err(bad(format!(
                    "key id {id:?} appears twice (first on line {first})"
                )));
            }
            let mac = HmacSha256::new_from_slice(&secret).expect("HMAC takes a key of any length");
            keys.push((
                line_no,
                Key {
                    id: id.to_owned(),
                    mac,
                },
            ));
        }
        if keys.is_empty() {
            return Err(KeyFileError::Empty);
        }
        Ok(SigningKeys {
            keys: keys.into_iter().map(|(_, k)| k).collect(),
        })
    }

    /// The key ids, in file order.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.id.as_str())
    }

    /// How many keys the set holds (never zero).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Always false: a set holds at least one key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// A signer with the key `id`.
    pub fn signer(&self, id: &str) -> Result<Signer, KeyFileError> {
        self.key(id)
            .map(|key| Signer { key: key.clone() })
            .ok_or_else(|| KeyFileError::NoSuchKey(id.to_owned()))
    }

    fn key(&self, id: &str) -> Option<&Key> {
        self.keys.iter().find(|k| k.id == id)
    }

    /// Checks `signature` (the [`SIGNATURE_HEADER`] value, `None` without one) against
    /// `payload`, the exact bytes the consumer is about to decode; the id of the key
    /// that signed it. The MAC is compared in constant time.
    pub fn verify<'k>(
        &'k self,
        signature: Option<&[u8]>,
        payload: &[u8],
    ) -> Result<&'k str, SignatureError> {
        let signature = signature.ok_or(SignatureError::Unsigned)?;
        let colon = signature
            .iter()
            .position(|&b| b == b':')
            .ok_or(SignatureError::BadSignature)?;
        let (id, hex) = (&signature[..colon], &signature[colon + 1..]);
        let key = std::str::from_utf8(id)
            .ok()
            .and_then(|id| self.key(id))
            .ok_or(SignatureError::UnknownKey)?;
        if hex.len() != MAC_HEX_LEN {
            return Err(SignatureError::BadSignature);
        }
        let tag = std::str::from_utf8(hex)
            .ok()
            .and_then(decode_hex)
            .ok_or(SignatureError::BadSignature)?;
        key.mac
            .clone()
            .chain_update(payload)
            .verify_slice(&tag)
            .map_err(|_| SignatureError::BadSignature)?;
        Ok(&key.id)
    }
}

/// Signs payloads with one key, the current one.
#[derive(Clone)]
pub struct Signer {
    key: Key,
}

impl std::fmt::Debug for Signer {
    /// The key id only: a secret never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("key_id", &self.key.id)
            .finish()
    }
}

impl Signer {
    /// The id of the key it signs with.
    pub fn key_id(&self) -> &str {
        &self.key.id
    }

    /// The [`SIGNATURE_HEADER`] value for `payload`: `KEY_ID:HEX`.
    pub fn sign(&self, payload: &[u8]) -> String {
        let tag = self.key.mac.clone().chain_update(payload).finalize();
        let mut out = String::with_capacity(self.key.id.len() + 1 + MAC_HEX_LEN);
        out.push_str(&self.key.id);
        out.push(':');
        for byte in tag.as_bytes().iter() {
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
        out
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Hex (either case, even length) to bytes; `None` if it is not.
fn decode_hex(text: &str) -> Option<Vec<u8>> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let bytes = text.as_bytes();
    if bytes.len() % 2 != 0 {
        return None;
    }
    bytes
        .chunks_exact(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const K2: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

    fn keys(text: &str) -> SigningKeys {
        SigningKeys::parse(text).unwrap()
    }

    fn line_error(text: &str) -> (usize, String) {
        match SigningKeys::parse(text) {
            Err(KeyFileError::Line { line, reason }) => (line, reason),
            other => panic!("expected a line error, got {other:?}"),
        }
    }

    /// The wire format is HMAC-SHA256 as RFC 4231 defines it (test case 6, a key
    /// longer than a block), so any other producer can sign with a stock library.
    #[test]
    fn the_mac_is_rfc_4231_hmac_sha256() {
        let secret = "aa".repeat(131);
        let signer = keys(&format!("rfc {secret}")).signer("rfc").unwrap();
        assert_eq!(
            signer.sign(b"Test Using Larger Than Block-Size Key - Hash Key First"),
            "rfc:60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    /// What a signer signs, a verifier holding the same key accepts, naming the key.
    #[test]
    fn a_signed_payload_verifies() {
        let keys = keys(&format!("k1 {K1}\n"));
        let signature = keys.signer("k1").unwrap().sign(b"payload");
        assert_eq!(
            keys.verify(Some(signature.as_bytes()), b"payload"),
            Ok("k1")
        );
        // Upper-case hex from another producer is the same MAC.
        let upper = format!("k1:{}", signature[3..].to_ascii_uppercase());
        assert_eq!(keys.verify(Some(upper.as_bytes()), b"payload"), Ok("k1"));
    }

    /// No header, an unknown key id, a changed payload, another secret under a known
    /// id, a cut or garbled MAC: each refused with its reason.
    #[test]
    fn unsigned_unknown_tampered_and_malformed_signatures_are_refused() {
        let keys = keys(&format!("k1 {K1}\n"));
        let good = keys.signer("k1").unwrap().sign(b"payload");
        let other = self::keys(&format!("k1 {K2}\nk9 {K2}\n"));
        let forged_same_id = other.signer("k1").unwrap().sign(b"payload");
        let unknown_id = other.signer("k9").unwrap().sign(b"payload");
        let not_hex = format!("k1:{}", "zz".repeat(32));
        type Case<'a> = (Option<&'a [u8]>, &'a [u8], SignatureError);
        let cases: [Case<'_>; 9] = [
            (None, b"payload", SignatureError::Unsigned),
            (
                Some(good.as_bytes()),
                b"payload ",
                SignatureError::BadSignature,
            ),
            (Some(good.as_bytes()), b"", SignatureError::BadSignature),
            (
                Some(forged_same_id.as_bytes()),
                b"payload",
                SignatureError::BadSignature,
            ),
            (
                Some(unknown_id.as_bytes()),
                b"payload",
                SignatureError::UnknownKey,
            ),
            (
                Some(&good.as_bytes()[..good.len() - 2]),
                b"payload",
                SignatureError::BadSignature,
            ),
            (Some(b"k1"), b"payload", SignatureError::BadSignature),
            (
                Some(not_hex.as_bytes()),
                b"payload",
                SignatureError::BadSignature,
            ),
            (Some(b""), b"payload", SignatureError::BadSignature),
        ];
        for (i, (signature, payload, want)) in cases.into_iter().enumerate() {
            assert_eq!(keys.verify(signature, payload), Err(want), "case {i}");
        }
    }

    /// A key roll: while both keys are in the verifier's set, commands signed with
    /// either verify; once the old one is removed, its commands are an unknown key.
    #[test]
    fn two_keys_are_valid_at_once_while_a_key_is_rolled() {
        let old = keys(&format!("k1 {K1}\n"));
        let both = keys(&format!("k1 {K1}\nk2 {K2}\n"));
        let new = keys(&format!("k2 {K2}\n"));
        let by_k1 = old.signer("k1").unwrap().sign(b"c");
        let by_k2 = both.signer("k2").unwrap().sign(b"c");
        assert_eq!(both.verify(Some(by_k1.as_bytes()), b"c"), Ok("k1"));
        assert_eq!(both.verify(Some(by_k2.as_bytes()), b"c"), Ok("k2"));
        assert_eq!(
            new.verify(Some(by_k1.as_bytes()), b"c"),
            Err(SignatureError::UnknownKey)
        );
        assert_eq!(new.verify(Some(by_k2.as_bytes()), b"c"), Ok("k2"));
        assert_eq!(both.ids().collect::<Vec<_>>(), ["k1", "k2"]);
    }

    /// Each bad line is refused, naming the line, and no message holds the secret.
    #[test]
    fn a_bad_key_file_is_refused_naming_the_line() {
        let short = "ab".repeat(16);
        let cases = [
            (format!("k1 {short}"), 1, "at least 32"),
            (
                format!("# c\n\nk1 {K1}\nk1 {K2}"),
                4,
                "appears twice (first on line 3)",
            ),
            (format!("k1 {}zz", &K1[2..]), 1, "not hex"),
            (format!("k1 {}", &K1[1..]), 1, "not hex"),
            (format!("k/1 {K1}"), 1, "key id"),
            (format!("k1 {K1} extra"), 1, "KEY_ID SECRET_HEX"),
            ("k1".to_owned(), 1, "KEY_ID SECRET_HEX"),
            (format!("k1 {}", "ab".repeat(1025)), 1, "at most 1024"),
        ];
        for (text, want_line, want) in cases {
            let (line, reason) = line_error(&text);
            assert_eq!(line, want_line, "{text}: {reason}");
            assert!(reason.contains(want), "{text}: {reason}");
            assert!(
                !reason.contains(&K1[4..]) && !reason.contains(&short),
                "{reason}"
            );
        }
        assert_eq!(
            SigningKeys::parse("# nothing\n\n").unwrap_err(),
            KeyFileError::Empty
        );
        assert_eq!(
            keys(&format!("k1 {K1}")).signer("k2").unwrap_err(),
            KeyFileError::NoSuchKey("k2".into())
        );
    }

    /// Neither a set nor a signer prints a secret.
    #[test]
    fn debug_shows_key_ids_not_secrets() {
        let keys = keys(&format!("k1 {K1}\n"));
        let text = format!("{keys:?} {:?}", keys.signer("k1").unwrap());
        assert!(text.contains("k1"), "{text}");
        assert!(!text.contains("0a0b") && !text.contains("10, 11"), "{text}");
    }
}
