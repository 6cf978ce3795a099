//! `models::decode::<AccessEvent>` on arbitrary bytes: it never panics, whatever it
//! accepts re-encodes to a message that decodes to the same value, and the zero-copy
//! `decode_event_ref` (a hand-written reader for the compact shape, serde_json for the
//! rest) accepts and refuses exactly the same, with the same errors.
#![no_main]

use libfuzzer_sys::fuzz_target;
use models::{AccessEvent, Wire, decode, decode_event_ref, encode};

fuzz_target!(|data: &[u8]| {
    let owned = decode::<AccessEvent>(data);
    let borrowed = decode_event_ref(data).map(|e| e.to_owned_event());
    assert_eq!(borrowed, owned, "the zero-copy decoder disagrees");
    let Ok(event) = owned else {
        return;
    };
    let bytes = encode(&event);
    assert!(
        bytes.len() <= AccessEvent::MAX_BYTES,
        "re-encoding grew past the limit: {} bytes",
        bytes.len()
    );
    let again: AccessEvent = decode(&bytes).expect("a re-encoded event decodes");
    assert_eq!(again, event);
    assert_eq!(encode(&again), bytes, "encoding is not stable");
});
