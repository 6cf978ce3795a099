//! `models::decode::<AccessEvent>` on arbitrary bytes: it never panics, and whatever
//! it accepts re-encodes to a message that decodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use models::{AccessEvent, Wire, decode, encode};

fuzz_target!(|data: &[u8]| {
    let Ok(event) = decode::<AccessEvent>(data) else {
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
