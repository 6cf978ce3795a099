//! What an HTTP/2 client broke, read from the connection: the error `GOAWAY` the
//! node writes (`h2` names the limit a client broke, rapid reset, CONTINUATION flood
//! …, only in that frame's debug data) and the connection errors hyper returns.

use crate::status::H2Abuse;

/// Frame boundaries in the bytes the node writes on an HTTP/2 connection, to read
/// the `GOAWAY`s it sends.
#[derive(Debug, Default)]
pub(super) struct FrameScan {
    head: [u8; 9],
    head_len: usize,
    payload_left: usize,
    /// The payload so far of a `GOAWAY` being written (its first bytes only).
    goaway: Option<Vec<u8>>,
}

impl FrameScan {
    /// Most of a `GOAWAY` payload kept: the codes and the start of the debug data.
    const KEEP: usize = 8 + 64;

    /// Follows `data`; returns the error code and debug data of a `GOAWAY` that
    /// ends in it.
    pub(super) fn scan(&mut self, mut data: &[u8]) -> Option<(u32, Vec<u8>)> {
        let mut found = None;
        while !data.is_empty() {
            if self.head_len < 9 {
                let take = (9 - self.head_len).min(data.len());
                self.head[self.head_len..self.head_len + take].copy_from_slice(&data[..take]);
                self.head_len += take;
                data = &data[take..];
                if self.head_len == 9 {
                    let [a, b, c, kind, ..] = self.head;
                    self.payload_left = u32::from_be_bytes([0, a, b, c]) as usize;
                    self.goaway = (kind == 0x7).then(Vec::new);
                }
            } else {
                let take = self.payload_left.min(data.len());
                if let Some(payload) = &mut self.goaway {
                    let keep = take.min(Self::KEEP.saturating_sub(payload.len()));
                    payload.extend_from_slice(&data[..keep]);
                }
                self.payload_left -= take;
                data = &data[take..];
            }
            if self.head_len == 9 && self.payload_left == 0 {
                self.head_len = 0;
                if let Some(payload) = self.goaway.take()
                    && payload.len() >= 8
                    && found.is_none()
                {
                    let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                    found = Some((code, payload[8..].to_vec()));
                }
            }
        }
        found
    }
}

/// The abuse a `GOAWAY` with this error code and debug data names (`h2` names its
/// `ENHANCE_YOUR_CALM` limits in the debug data); `None` for `NO_ERROR`.
pub(super) fn goaway_abuse(code: u32, debug_data: &[u8]) -> Option<H2Abuse> {
    for (name, abuse) in [
        (&b"too_many_resets"[..], H2Abuse::RapidReset),
        (b"too_many_internal_resets", H2Abuse::LocalErrorResets),
        (b"too_many_continuations", H2Abuse::ContinuationFlood),
        (b"header_list_way_too_large", H2Abuse::HeaderListTooLarge),
        (b"too_many_data_frames", H2Abuse::DataFrameFlood),
    ] {
        if debug_data == name {
            return Some(abuse);
        }
    }
    reason_abuse(h2::Reason::from(code))
}

fn reason_abuse(reason: h2::Reason) -> Option<H2Abuse> {
    Some(match reason {
        h2::Reason::NO_ERROR => return None,
        h2::Reason::ENHANCE_YOUR_CALM => H2Abuse::EnhanceYourCalm,
        h2::Reason::PROTOCOL_ERROR => H2Abuse::ProtocolError,
        h2::Reason::COMPRESSION_ERROR => H2Abuse::CompressionError,
        h2::Reason::FRAME_SIZE_ERROR => H2Abuse::FrameSizeError,
        h2::Reason::FLOW_CONTROL_ERROR => H2Abuse::FlowControlError,
        _ => H2Abuse::Other,
    })
}

/// The abuse an HTTP/2 connection error shows when no error `GOAWAY` went out
/// ([`ConnGuard::goaway_sent`] names it better): the reason of a `GOAWAY` `h2`
/// meant to send, hyper's keep-alive timeout. `None` for errors that are no
/// client's misbehaviour (I/O, the client's own `GOAWAY`, HTTP/1).
pub(crate) fn h2_abuse(error: &(dyn std::error::Error + 'static)) -> Option<H2Abuse> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(e) = e.downcast_ref::<h2::Error>() {
            return match e.reason() {
                Some(reason) if e.is_go_away() && e.is_library() => reason_abuse(reason),
                _ => None,
            };
        }
        if e.to_string() == "keep-alive timed out" {
            return Some(H2Abuse::KeepAliveTimeout);
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_error_goaway_written_names_the_abuse() {
        let mut scan = FrameScan::default();
        let settings = [0, 0, 6, 0x4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100];
        let mut goaway = vec![0, 0, 8 + 15, 0x7, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0xb];
        goaway.extend_from_slice(b"too_many_resets");
        let stream = [&settings[..], &goaway[..]].concat();
        // Split anywhere: the same GOAWAY.
        for split in 0..stream.len() {
            let mut scan = FrameScan::default();
            let first = scan.scan(&stream[..split]);
            let found = first.or(scan.scan(&stream[split..]));
            assert_eq!(found, Some((0xb, b"too_many_resets".to_vec())), "{split}");
        }
        assert_eq!(scan.scan(&settings), None);
        assert_eq!(
            goaway_abuse(0xb, b"too_many_resets"),
            Some(H2Abuse::RapidReset)
        );
        assert_eq!(goaway_abuse(0xb, b""), Some(H2Abuse::EnhanceYourCalm));
        assert_eq!(goaway_abuse(0x1, b""), Some(H2Abuse::ProtocolError));
        assert_eq!(goaway_abuse(0x0, b""), None);
    }
}
