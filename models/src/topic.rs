//! The Kafka side of the wire contract: the default topic names both services agree
//! on, and the message-key rule every producer of events and commands follows.
//!
//! A message is keyed `tenant` followed by the cache key (which starts with `/`), so
//! all of one key's events share a partition whatever the partitioner hashes, and the
//! key parses back unambiguously: a tenant id holds no `/`.

/// The default topic of access events (edge → pulse).
pub const EVENTS_TOPIC: &str = "edge-events";

/// The default topic of pre-warm commands (pulse → edges).
pub const PREWARM_TOPIC: &str = "prewarm";

/// The message key of `tenant`'s `key`: `tenant` then `key`, as in `acme/img/a.png`.
pub fn message_key(tenant: &str, key: &str) -> String {
    let mut out = String::with_capacity(tenant.len() + key.len());
    out.push_str(tenant);
    out.push_str(key);
    out
}

/// [`message_key`] written into `buf` (cleared first), for a producer that reuses its
/// buffer on the per-message path.
pub fn write_message_key(tenant: &str, key: &str, buf: &mut Vec<u8>) {
    buf.clear();
    buf.extend_from_slice(tenant.as_bytes());
    buf.extend_from_slice(key.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_the_tenant_then_the_path_and_both_forms_agree() {
        assert_eq!(message_key("acme", "/img/a.png"), "acme/img/a.png");
        let mut buf = b"left over".to_vec();
        write_message_key("acme", "/img/a.png", &mut buf);
        assert_eq!(buf, message_key("acme", "/img/a.png").into_bytes());
    }

    #[test]
    fn the_default_topic_names_are_valid_topic_names() {
        assert!(crate::is_topic_name(EVENTS_TOPIC));
        assert!(crate::is_topic_name(PREWARM_TOPIC));
    }
}
