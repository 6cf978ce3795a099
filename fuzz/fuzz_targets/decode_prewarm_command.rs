//! `models::decode::<PrewarmCommand>` on arbitrary bytes: it never panics, whatever it
//! accepts re-encodes to a message that decodes to the same value, and an accepted
//! command names a valid path (never a URL, never a `..` segment).
#![no_main]

use libfuzzer_sys::fuzz_target;
use models::{CacheKey, PrewarmCommand, Wire, decode, encode};

fuzz_target!(|data: &[u8]| {
    let Ok(command) = decode::<PrewarmCommand>(data) else {
        return;
    };
    assert!((0.0..=1.0).contains(&command.confidence));
    assert!(command.expires_at_ms > command.issued_at_ms);
    assert_eq!(
        CacheKey::new(command.key.as_str()).as_ref(),
        Ok(&command.key)
    );
    // No `..` segment, also not percent-encoded (`.%2e`, `%2E.`): origins decode them.
    let key = command.key.as_str();
    let path = key.split('?').next().unwrap_or(key);
    for segment in path.split('/') {
        let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
        assert_ne!(decoded, "..", "'..' segment in {key:?}");
    }
    let bytes = encode(&command);
    assert!(
        bytes.len() <= PrewarmCommand::MAX_BYTES,
        "re-encoding grew past the limit: {} bytes from {}",
        bytes.len(),
        data.len()
    );
    let again: PrewarmCommand = decode(&bytes).expect("a re-encoded command decodes");
    assert_eq!(again, command);
    assert_eq!(encode(&again), bytes, "encoding is not stable");
});
